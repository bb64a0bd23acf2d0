//! A queued consume, and the one rule that decides what a queue's front
//! may do now (written once: the in-process levels and the region's root
//! both apply it).

use crate::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use crate::sync::Mutex;
use std::sync::Arc;
use std::task::Waker;

use super::bucket::{Gcra, Mode, Refused};
use super::{STALL_TICKS, TICK_NS};
use crate::few::Few;
use crate::region::park::{Park, Parked};

pub(crate) const WAITING: u32 = 0;
pub(crate) const GRANTED: u32 = 1;
pub(crate) const GRANTED_FORCED: u32 = 2;
pub(crate) const CORRUPT: u32 = 3;
pub(crate) const CANCELLED: u32 = 4;

/// How long a front may make no progress before it is forced through.
pub(crate) const STALL_NS: u64 = STALL_TICKS * TICK_NS;

/// One blocked consume, queued at one level of a chain.
#[derive(Debug)]
pub(crate) struct Waiter {
    pub n: u64,
    pub tier: usize,
    /// Arrival ticket: region-wide per tier at a shared root, a local
    /// sequence number elsewhere.
    pub ticket: u32,
    /// `WAITING`, then a result; written under the queue's lock.
    pub state: AtomicU32,
    /// Futex word of a thread waiting at an in-process level: bumped on
    /// every wake-up meant for it.
    pub wake: AtomicU32,
    /// `(tat, v)` of a corrupt bucket word, for the error.
    pub corrupt: [AtomicU64; 2],
    /// True for a waiter behind an async future (no thread sleeps on it).
    pub is_async: bool,
    /// The task to wake on a result (async waiters only).
    pub waker: Mutex<Option<Waker>>,
    /// Where its thread sleeps at a shared root (see
    /// [`park`](crate::region::park)).
    pub park: Park,
}

impl Waiter {
    pub fn new(n: u64, tier: usize, ticket: u32, is_async: bool) -> Waiter {
        Waiter {
            n,
            tier,
            ticket,
            state: AtomicU32::new(WAITING),
            wake: AtomicU32::new(0),
            corrupt: [AtomicU64::new(0), AtomicU64::new(0)],
            is_async,
            waker: Mutex::new(None),
            park: Park::new(),
        }
    }

    pub fn state(&self) -> u32 {
        self.state.load(Ordering::Acquire)
    }

    /// Records the task to wake (async waiters only).
    pub fn set_waker(&self, waker: &Waker) {
        let mut slot = self.waker.lock().unwrap_or_else(|p| p.into_inner());
        match &*slot {
            Some(w) if w.will_wake(waker) => {}
            _ => *slot = Some(waker.clone()),
        }
    }

    /// Sets the result (under the queue's lock); the wake-up goes to `out`.
    pub fn finish(self: &Arc<Self>, state: u32, out: &mut Wakeups, shared: bool) {
        self.state.store(state, Ordering::Release);
        out.add(self, shared);
    }
}

impl Parked for Waiter {
    fn park(&self) -> &Park {
        &self.park
    }
    fn is_async(&self) -> bool {
        self.is_async
    }
    /// Its address: unique while it lives.
    fn id(&self) -> u64 {
        self as *const Waiter as usize as u64
    }
}

/// What to wake once the lock is released (wakers never run under it).
#[derive(Debug, Default)]
pub(crate) struct Wakeups {
    /// Async tasks (the first without an allocation, as every list here).
    tasks: Few<Waker>,
    /// This process's threads at a shared root (parked: see
    /// [`park`](crate::region::park)).
    pub parked: Few<Arc<Waiter>>,
    /// The process's helper thread must look again (the tiers it stands in
    /// for changed).
    pub helper: bool,
    threads: Few<Arc<Waiter>>,
}

impl Wakeups {
    /// Adds a waiter to wake: its task, its thread at a shared root
    /// (`shared`: a bit of the process's futex word), or its thread at an
    /// in-process level (its own word).
    pub fn add(&mut self, w: &Arc<Waiter>, shared: bool) {
        if w.is_async {
            let t = w.waker.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(t) = t {
                self.tasks.push(t);
            }
        } else if shared {
            self.parked.push(w.clone());
        } else {
            self.threads.push(w.clone());
        }
    }

    /// Wakes the in-process threads and the tasks; a waker that panics is
    /// caught and the rest are still woken.
    pub fn wake_local(&mut self) {
        for w in self.threads.drain() {
            w.wake.fetch_add(1, Ordering::SeqCst);
            crate::sys::futex::futex_wake(&w.wake, 1);
        }
        for t in self.tasks.drain() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.wake()));
        }
    }
}

/// What a queue's front did or must wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Charged; `true` if into debt (a force-through, or a request larger
    /// than the capacity on a full bucket).
    Charged(bool),
    /// Nothing can change before this instant (ns): its refill instant, or
    /// the instant it is due to be forced through.
    Wait(u64),
    /// The bucket word is corrupt: `(tat, v)`.
    Corrupt(u64, u64),
}

/// The front rule: a front of `n` tokens that has made no progress since
/// `stalled_since` (ns) is charged if the bucket holds `min(n, cap)`
/// tokens; once it has stalled for [`STALL_NS`] it is forced through into
/// debt, but never on top of debt (the debt is repaid first). `n == 0`
/// always goes.
pub(crate) fn step(g: &Gcra, word: &AtomicU64, n: u64, now: u64, stalled_since: u64) -> Step {
    if n == 0 {
        return Step::Charged(false);
    }
    let force_at = stalled_since.saturating_add(STALL_NS);
    let mode = if now >= force_at {
        Mode::Force
    } else {
        Mode::Normal
    };
    match g.charge(word, n, now, Mode::Normal) {
        Ok(c) => Step::Charged(c.debt),
        Err(Refused::Corrupt { tat, v }) => Step::Corrupt(tat, v),
        Err(Refused::Until(_)) if mode == Mode::Force => {
            match g.charge(word, n, now, Mode::Force) {
                Ok(_) => Step::Charged(true),
                Err(Refused::Until(v)) => Step::Wait(g.instant_of(v)),
                Err(Refused::Corrupt { tat, v }) => Step::Corrupt(tat, v),
            }
        }
        Err(Refused::Until(v)) => Step::Wait(g.instant_of(v).min(force_at)),
    }
}

/// Whether a front of `n` stalled since `stalled_since` could go now (the
/// same rule as [`step`], without charging): for deciding whether another
/// process's front goes first.
pub(crate) fn could_go(g: &Gcra, word: &AtomicU64, n: u64, now: u64, stalled_since: u64) -> bool {
    if n == 0 {
        return true;
    }
    match g.read(word, now) {
        Ok((tokens, _)) => {
            tokens >= n.min(g.cap()) as i64
                || (now >= stalled_since.saturating_add(STALL_NS) && tokens >= 0)
        }
        Err(_) => true, // let its own process meet the corrupt word
    }
}
