//! The limiter's queueing policy, written once for every home.
//!
//! A [`Node`] is one level of a limiter chain: a root (bucket word in
//! process memory or in a region) or a child whose own bucket is charged
//! together with every ancestor's. Each level has seven FIFO queues.
//!
//! **Fast path.** A consume of `n > 0` at priority `p` charges the chain
//! directly (one CAS per level, no lock, no syscall beyond the clock) when
//! nothing is queued at `p` or above in this level and, for a chain rooted
//! in a region, no consume waits in any process (the region's
//! waiting-process bitmap is zero; the drain's deferral rules decide
//! otherwise). `n == 0` goes at once
//! only when nothing is queued at all. Anything else queues at `p`.
//!
//! **Draining.** Under the level's lock, queues are visited from the highest
//! priority down; each queue drains from its front while its front can be
//! charged (a 0-token front always can), and a blocked front blocks only its
//! own queue, so a different, unblocked priority can drain sooner (the
//! seed's rule). A chain is charged leaf first; levels already charged stay
//! charged (recorded in the waiter), so no charge is ever undone.
//!
//! **Force-through.** A front that has made no progress for
//! [`STALL_TICKS`](super::STALL_TICKS) × 100 ms (about 1 s) is charged into
//! debt on every remaining level of the chain and counted in `forced`.
//! Debt is repaid before anything else drains, because a normal charge needs
//! a non-negative balance afterwards. At most one item per queue per second
//! goes through this way.
//!
//! **Sleeping, no timer thread.** Each queue's front sleeps (futex wait on
//! its own word) until the earliest instant anything can change: the
//! refill instant of some blocked front, or some front's force instant. The
//! first front to wake drains for everyone and wakes the waiters it
//! charged and any new fronts. Other waiters sleep until woken (or their
//! deadline). A waiter reads its word's sequence number before looking at
//! the queues, so a wake between the look and the sleep is never lost. In a
//! region, other processes only ever *take* tokens, so a computed refill
//! instant is never too late; waking early just recomputes.
//!
//! **Async waiters** have no thread: the node's pump (one thread per node
//! and process, alive while async waiters are queued) sleeps until the
//! earliest instant, on the process's futex word in a region, and drains.
//!
//! **Across processes** (a region): before charging a queued waiter at
//! tier `t`, the drain looks up the published per-process waiter counts;
//! if another live process has a waiter above `t`, this tier waits (the
//! other process is woken), unless its front is due for force-through. The
//! deferring front sleeps on its process's futex word, which any process
//! bumps when one of its waiters leaves a queue; `DEFER_POLL_NS` (50 ms)
//! bounds the sleep in case a wake-up is missed (a process died, say).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::Waker;
use std::time::Duration;

use super::bucket::{Gcra, Mode, Refused};
use super::shared::SharedBucket;
use super::stats::{LimiterQueueStats, LimiterStats};
use super::{Grant, STALL_TICKS, TICK_NS};
use crate::error::{Error, Result};
use crate::priority::{Priority, LEVELS};
use crate::scheduler::QueueStats;
use crate::stall::StallClock;
use crate::sys::clock::Clock;
use crate::sys::fork::fork_generation;
use crate::sys::futex::{futex_wait, futex_wake};

const WAITING: u32 = 0;
const GRANTED: u32 = 1;
const GRANTED_FORCED: u32 = 2;
const CORRUPT: u32 = 3;
const CANCELLED: u32 = 4;

/// A pump with nothing to wait for still wakes this often (to notice a
/// stale wake-up or a disposed chain).
const PUMP_BACKSTOP: Duration = Duration::from_millis(100);

/// While a waiter defers to a higher-priority waiter in another process, it
/// sleeps on its process's futex word (woken when a waiter elsewhere leaves
/// its queue) and looks again at least this often.
const DEFER_POLL_NS: u64 = 50_000_000;

/// Where a level's bucket word lives.
#[derive(Debug)]
pub(crate) enum Home {
    /// Process memory.
    Local(AtomicU64),
    /// A region.
    Shared(Box<SharedBucket>),
}

/// One blocked consume.
#[derive(Debug)]
struct Waiter {
    n: u64,
    tier: usize,
    /// `WAITING`, then a result; written under the level's lock.
    state: AtomicU32,
    /// Futex word: bumped on every wake-up meant for this waiter.
    wake: AtomicU32,
    /// Levels of the chain already charged (leaf first); under the lock.
    paid: AtomicU32,
    /// `(tat, v)` of a corrupt bucket word, for the error.
    corrupt: [AtomicU64; 2],
    /// True while this waiter's thread sleeps on its process's futex word
    /// (a deferring front) instead of `wake`: a poke then bumps that word
    /// too.
    on_proc: AtomicBool,
    /// True for a waiter behind an async future (no thread sleeps on it:
    /// the node's pump computes its refill instant).
    is_async: bool,
    /// The task to wake on a result (async waiters only).
    waker: Mutex<Option<Waker>>,
}

impl Waiter {
    fn new(n: u64, tier: usize, paid: u32, is_async: bool) -> Waiter {
        Waiter {
            n,
            tier,
            state: AtomicU32::new(WAITING),
            wake: AtomicU32::new(0),
            paid: AtomicU32::new(paid),
            corrupt: [AtomicU64::new(0), AtomicU64::new(0)],
            on_proc: AtomicBool::new(false),
            is_async,
            waker: Mutex::new(None),
        }
    }

    /// Wakes this waiter's thread. `proc`: the chain's region, whose
    /// process word the thread may be asleep on instead (it sets `on_proc`
    /// before re-checking `wake`, and this bumps `wake` before reading
    /// `on_proc`, both SeqCst, so one of the two sees the other).
    fn poke(&self, proc: Option<&SharedBucket>) {
        self.wake.fetch_add(1, Ordering::SeqCst);
        futex_wake(&self.wake, 1);
        if self.on_proc.load(Ordering::SeqCst) {
            if let Some(s) = proc {
                s.wake_mine();
            }
        }
    }

    fn finish(&self, state: u32, proc: Option<&SharedBucket>) {
        self.state.store(state, Ordering::Release);
        if self.is_async {
            let w = self.waker.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(w) = w {
                w.wake();
            }
        } else {
            self.poke(proc);
        }
    }

    /// Records the task to wake (async waiters only).
    fn set_waker(&self, waker: &Waker) {
        let mut slot = self.waker.lock().unwrap_or_else(|p| p.into_inner());
        match &*slot {
            Some(w) if w.will_wake(waker) => {}
            _ => *slot = Some(waker.clone()),
        }
    }
}

/// A queued async consume (see [`Node::poll_async`]).
#[derive(Debug)]
pub(crate) struct AsyncWaiter(Arc<Waiter>);

/// The pump loop (see [`Node::ensure_pump`]).
fn pump(weak: Weak<Node>) {
    loop {
        let Some(node) = weak.upgrade() else { return };
        if node.async_waiting.load(Ordering::SeqCst) == 0 {
            node.pump_running.store(false, Ordering::SeqCst);
            // A waiter may have queued between the check and the store.
            if node.async_waiting.load(Ordering::SeqCst) == 0
                || node.pump_running.swap(true, Ordering::SeqCst)
            {
                return;
            }
        }
        let word = node.pump_word();
        let seq = word.load(Ordering::SeqCst);
        let now = node.now();
        let next = {
            let mut inner = node.lock();
            node.dispatch_locked(&mut inner, now)
        };
        let nap = next.map_or(PUMP_BACKSTOP, |u| {
            Duration::from_nanos(u.saturating_sub(now)).min(PUMP_BACKSTOP)
        });
        if !nap.is_zero() {
            match node.shared_root() {
                // Counted as a sleeper, so that other processes' wakes
                // reach it.
                Some(s) if s.my_futex().is_some() => s.sleep(seq, nap),
                _ => {
                    futex_wait(word, seq, Some(nap));
                }
            }
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    queues: [VecDeque<Arc<Waiter>>; LEVELS],
    counters: [LimiterQueueStats; LEVELS],
    /// When each queue's current front became the front (or last
    /// progressed), ns.
    front_since: [u64; LEVELS],
    /// Set by the last drain if some tier deferred to another process.
    deferring: bool,
}

/// One level of a limiter chain.
#[derive(Debug)]
pub(crate) struct Node {
    gcra: Gcra,
    home: Home,
    parent: Option<Arc<Node>>,
    /// Bit `i` set while tier `i`'s queue is non-empty (read on the fast path).
    queued: AtomicU32,
    /// Counter: force-throughs by this level's consumers.
    forced: AtomicU64,
    fork_gen: u64,
    inner: Mutex<Inner>,
    /// Async waiters queued here (the pump runs while > 0).
    async_waiting: AtomicU32,
    /// Time during which at least one consume waited at this level.
    stall: StallClock,
    /// True while this node's pump thread runs.
    pump_running: AtomicBool,
    /// The pump's wake word when the chain is in process memory (in a
    /// region it sleeps on the process's futex word instead).
    pump_word: AtomicU32,
    /// The chain's clock: a region's stored one at a shared root (the same
    /// in every process), else this process's; children inherit their
    /// parent's, so one `now` serves every level of a chain.
    clock: Clock,
}

#[cold]
fn corrupt_error(tat: u64, v: u64, cap: u64) -> Error {
    Error::BadRegion(format!(
        "limiter bucket word {tat} is more than {} tokens ahead of the clock {v} \
         (capacity {cap}): it was overwritten",
        super::bucket::MAX_LEAD
    ))
}

impl Node {
    pub fn new(gcra: Gcra, home: Home, parent: Option<Arc<Node>>) -> Node {
        let clock = match (&parent, &home) {
            (Some(p), _) => p.clock,
            (None, Home::Shared(s)) => s.clock(),
            (None, Home::Local(_)) => Clock::process(),
        };
        Node {
            clock,
            gcra,
            home,
            parent,
            queued: AtomicU32::new(0),
            forced: AtomicU64::new(0),
            fork_gen: {
                // Without the handler a fork would go unnoticed (ENOMEM only).
                let _ = crate::sys::fork::install_atfork_handler();
                fork_generation()
            },
            inner: Mutex::new(Inner::default()),
            async_waiting: AtomicU32::new(0),
            stall: StallClock::new(),
            pump_running: AtomicBool::new(false),
            pump_word: AtomicU32::new(0),
        }
    }

    /// Nanoseconds now on this chain's clock (see [`Clock`]).
    #[inline(always)]
    pub fn now(&self) -> u64 {
        self.clock.now_ns()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing panics under this lock; the queues stay valid regardless.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[inline]
    fn tat(&self) -> &AtomicU64 {
        match &self.home {
            Home::Local(w) => w,
            Home::Shared(s) => s.tat(),
        }
    }

    pub fn gcra(&self) -> Gcra {
        self.gcra
    }

    pub fn parent(&self) -> Option<&Arc<Node>> {
        self.parent.as_ref()
    }

    pub fn home(&self) -> &Home {
        &self.home
    }

    /// The shared bucket at the root of this chain, if any.
    fn shared_root(&self) -> Option<&SharedBucket> {
        let mut n = self;
        while let Some(p) = n.parent.as_deref() {
            n = p;
        }
        match &n.home {
            Home::Shared(s) => Some(s),
            Home::Local(_) => None,
        }
    }

    #[inline]
    pub fn check_usable(&self) -> Result<()> {
        if self.fork_gen != fork_generation() {
            return Err(Error::Forked(
                "a Limiter belongs to the process that created it; in a forked child, \
                 create a new one from the Region (Limiter::shared or Limiter::attach)"
                    .into(),
            ));
        }
        Ok(())
    }

    fn count_forced(&self) {
        self.forced.fetch_add(1, Ordering::Relaxed);
        if let Some(s) = self.shared_root() {
            s.count_forced();
        }
    }

    /// Charges levels `from..` of the chain (leaf = level 0). On success
    /// returns whether any level went into debt; on refusal, the number of
    /// levels now charged and why the next one refused.
    #[inline]
    fn charge_chain(
        &self,
        from: u32,
        n: u64,
        now: u64,
        mode: Mode,
    ) -> std::result::Result<bool, (u32, Refused, Gcra)> {
        let mut debt = false;
        let mut k = 0u32;
        let mut cur = Some(self);
        while let Some(node) = cur {
            if k >= from {
                match node.gcra.charge(node.tat(), n, now, mode) {
                    Ok(c) => debt |= c.debt,
                    Err(r) => return Err((k, r, node.gcra)),
                }
            }
            k += 1;
            cur = node.parent.as_deref();
        }
        Ok(debt)
    }

    /// Blocking consume; `deadline` in ns of this chain's clock ([`Node::now`]).
    #[inline]
    pub fn consume(&self, n: u64, p: Priority, deadline: Option<u64>) -> Result<Grant> {
        self.check_usable()?;
        match self.fast(n, p)? {
            Ok(g) => Ok(g),
            Err(paid) => self.enqueue_and_wait(n, p, paid, deadline),
        }
    }

    /// The fast path: `Ok(grant)` if it went at once, else `Err(levels
    /// already charged)` for the waiter to record.
    #[inline(always)]
    fn fast(&self, n: u64, p: Priority) -> Result<std::result::Result<Grant, u32>> {
        let mask = self.queued.load(Ordering::SeqCst);
        if n == 0 {
            if mask == 0 {
                return Ok(Ok(Grant {
                    immediate: true,
                    forced: false,
                }));
            }
        } else if mask >> p.index() == 0 {
            if self.closed_by_region() {
                return Ok(Err(0));
            }
            if self.parent.is_none() {
                // A root: one charge, nothing to record on failure.
                return match self.gcra.charge(self.tat(), n, self.now(), Mode::Normal) {
                    Ok(c) => {
                        if c.debt {
                            self.count_forced();
                        }
                        Ok(Ok(Grant {
                            immediate: true,
                            forced: c.debt,
                        }))
                    }
                    Err(Refused::Corrupt { tat, v }) => Err(corrupt_error(tat, v, self.gcra.cap())),
                    Err(Refused::Until(_)) => Ok(Err(0)),
                };
            }
            match self.charge_chain(0, n, self.now(), Mode::Normal) {
                Ok(debt) => {
                    if debt {
                        self.count_forced();
                    }
                    return Ok(Ok(Grant {
                        immediate: true,
                        forced: debt,
                    }));
                }
                Err((_, Refused::Corrupt { tat, v }, g)) => {
                    return Err(corrupt_error(tat, v, g.cap()))
                }
                Err((k, Refused::Until(_), _)) => return Ok(Err(k)),
            }
        }
        Ok(Err(0))
    }

    /// True if the chain's root is in a region where a consume waits in
    /// some process: the fast path is closed (the drain decides).
    #[inline(always)]
    fn closed_by_region(&self) -> bool {
        let mut n = self;
        while let Some(p) = n.parent.as_deref() {
            n = p;
        }
        match &n.home {
            Home::Shared(s) => s.anyone_waiting(),
            Home::Local(_) => false,
        }
    }

    #[inline]
    /// Non-blocking: charges `n` only if nothing is queued here (nor, in a
    /// region, anywhere) and every level holds `n` tokens now. Never goes
    /// into debt, never queues.
    pub fn try_consume(&self, n: u64) -> Result<bool> {
        self.check_usable()?;
        if self.queued.load(Ordering::SeqCst) != 0 {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
        if self.closed_by_region() {
            return Ok(false);
        }
        let now = self.now();
        let mut done = Vec::new();
        let mut cur = Some(self);
        while let Some(node) = cur {
            match node.gcra.charge(node.tat(), n, now, Mode::Exact) {
                Ok(c) => {
                    if node.parent.is_some() {
                        done.push((node, c));
                    }
                }
                Err(r) => {
                    // Undo the lower levels (exactly, or not at all: tokens
                    // may be lost to a race, never created).
                    for (d, c) in done.into_iter().rev() {
                        d.gcra.undo(d.tat(), n, c);
                    }
                    return match r {
                        Refused::Until(_) => Ok(false),
                        Refused::Corrupt { tat, v } => Err(corrupt_error(tat, v, node.gcra.cap())),
                    };
                }
            }
            cur = node.parent.as_deref();
        }
        Ok(true)
    }

    #[cold]
    #[inline(never)]
    fn enqueue_and_wait(
        &self,
        n: u64,
        p: Priority,
        paid: u32,
        deadline: Option<u64>,
    ) -> Result<Grant> {
        let w = self.enqueue(n, p, paid, false);
        let r = self.wait(&w, deadline);
        r.map(|forced| Grant {
            immediate: false,
            forced,
        })
    }

    /// Queues a waiter at `p` that has been charged on `paid` levels.
    fn enqueue(&self, n: u64, p: Priority, paid: u32, is_async: bool) -> Arc<Waiter> {
        let tier = p.index();
        let w = Arc::new(Waiter::new(n, tier, paid, is_async));
        let mut inner = self.lock();
        if inner.queues[tier].is_empty() {
            inner.front_since[tier] = self.now();
        }
        inner.queues[tier].push_back(w.clone());
        inner.counters[tier].deferred += 1;
        if is_async {
            self.async_waiting.fetch_add(1, Ordering::SeqCst);
        }
        self.queued.fetch_or(1 << tier, Ordering::SeqCst);
        self.stall.update(|| true);
        if let Some(s) = self.shared_root() {
            s.publish_waiting(tier, 1);
        }
        w
    }

    /// One poll of an async consume: the fast path, else a queued async
    /// waiter (kept in `slot`) whose result wakes the task.
    pub fn poll_async(
        self: &Arc<Node>,
        n: u64,
        p: Priority,
        slot: &mut Option<AsyncWaiter>,
        waker: &Waker,
    ) -> std::task::Poll<Result<Grant>> {
        use std::task::Poll;
        let w = match slot {
            Some(AsyncWaiter(w)) => w.clone(),
            None => {
                if let Err(e) = self.check_usable() {
                    return Poll::Ready(Err(e));
                }
                let paid = match self.fast(n, p) {
                    Err(e) => return Poll::Ready(Err(e)),
                    Ok(Ok(g)) => return Poll::Ready(Ok(g)),
                    Ok(Err(paid)) => paid,
                };
                let w = self.enqueue(n, p, paid, true);
                w.set_waker(waker);
                *slot = Some(AsyncWaiter(w.clone()));
                {
                    let mut inner = self.lock();
                    self.dispatch_locked(&mut inner, self.now());
                }
                if w.state.load(Ordering::Acquire) == WAITING {
                    self.ensure_pump();
                    self.wake_pump();
                }
                w
            }
        };
        if w.state.load(Ordering::Acquire) == WAITING {
            w.set_waker(waker);
            // A result between the check and the registration took the old
            // waker (or none): look again.
            if w.state.load(Ordering::Acquire) == WAITING {
                return Poll::Pending;
            }
        }
        *slot = None;
        match self.outcome(&w) {
            Some(r) => Poll::Ready(r.map(|forced| Grant {
                immediate: false,
                forced,
            })),
            None => unreachable!("state checked above"),
        }
    }

    /// Drops a pending async consume: removes its queued place (and every
    /// count it added) unless a result beat it. Levels it was already
    /// charged on stay charged: tokens are lost, never created.
    pub fn cancel_async(&self, slot: AsyncWaiter) {
        if self.fork_gen != fork_generation() {
            // The lock may have been held by a thread that did not survive
            // the fork; the queue belongs to the parent anyway.
            return;
        }
        let _ = self.cancel(&slot.0, self.now());
    }

    /// The word this node's pump sleeps on: the process's futex word in a
    /// region (so other processes can wake it), else the node's own.
    fn pump_word(&self) -> &AtomicU32 {
        match self.shared_root() {
            Some(s) => s.my_futex().unwrap_or(&self.pump_word),
            None => &self.pump_word,
        }
    }

    fn wake_pump(&self) {
        let w = self.pump_word();
        w.fetch_add(1, Ordering::SeqCst);
        futex_wake(w, i32::MAX);
    }

    /// Async waiters have no thread of their own to sleep until their
    /// refill (or force-through) instant: one pump thread per node and
    /// process does, alive only while async waiters are queued here. It
    /// sleeps on [`pump_word`](Self::pump_word) with a timeout of the next
    /// instant, and runs the drain, which wakes the tasks it serves.
    pub fn ensure_pump(self: &Arc<Node>) {
        if self.pump_running.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("shmsched-lim-pump".into())
            .spawn(move || pump(weak));
        if spawned.is_err() {
            // No thread: async waiters are still served by the drains of
            // blocking callers and of later polls.
            self.pump_running.store(false, Ordering::Release);
        }
    }

    /// Wakes the thread (or the pump) in charge of a new queue front.
    fn poke_front(&self, f: &Waiter) {
        if f.is_async {
            self.wake_pump();
        } else {
            f.poke(self.shared_root());
        }
    }

    fn wait(&self, w: &Arc<Waiter>, deadline: Option<u64>) -> Result<bool> {
        let shared = self.shared_root();
        loop {
            let seq = w.wake.load(Ordering::SeqCst);
            // Read before the drain looks at other processes' counts, so a
            // wake sent after that look is never lost.
            let pseq = shared
                .and_then(|s| s.my_futex())
                .map(|f| f.load(Ordering::SeqCst));
            if let Some(r) = self.outcome(w) {
                return r;
            }
            let now = self.now();
            if deadline.is_some_and(|d| now >= d) {
                return self.cancel(w, now);
            }
            let (next, front, deferring) = {
                let mut inner = self.lock();
                let next = self.dispatch_locked(&mut inner, now);
                let front = inner.queues[w.tier]
                    .front()
                    .is_some_and(|f| Arc::ptr_eq(f, w));
                (next, front, inner.deferring)
            };
            if w.state.load(Ordering::Acquire) != WAITING {
                continue;
            }
            let mut until = if front { next } else { None };
            if let Some(d) = deadline {
                until = Some(until.map_or(d, |u| u.min(d)));
            }
            let timeout = until.map(|u| std::time::Duration::from_nanos(u.saturating_sub(now)));
            match (shared, pseq, timeout) {
                (Some(s), Some(ps), Some(t)) if front && deferring => {
                    // Deferring to another process: sleep where its wake
                    // lands (see `Waiter::poke` for the local wakes).
                    w.on_proc.store(true, Ordering::SeqCst);
                    if w.wake.load(Ordering::SeqCst) == seq {
                        s.sleep(ps, t);
                    }
                    w.on_proc.store(false, Ordering::SeqCst);
                }
                _ => {
                    futex_wait(&w.wake, seq, timeout);
                }
            }
        }
    }

    fn outcome(&self, w: &Waiter) -> Option<Result<bool>> {
        match w.state.load(Ordering::Acquire) {
            WAITING => None,
            GRANTED => Some(Ok(false)),
            GRANTED_FORCED => Some(Ok(true)),
            CANCELLED => Some(Err(Error::Timeout)),
            _ => Some(Err(corrupt_error(
                w.corrupt[0].load(Ordering::Relaxed),
                w.corrupt[1].load(Ordering::Relaxed),
                self.gcra.cap(),
            ))),
        }
    }

    /// Removes a waiter whose deadline passed, unless a grant beat it.
    /// Levels it had already been charged stay charged.
    fn cancel(&self, w: &Arc<Waiter>, now: u64) -> Result<bool> {
        let mut inner = self.lock();
        if let Some(r) = self.outcome(w) {
            return r;
        }
        let tier = w.tier;
        if let Some(pos) = inner.queues[tier].iter().position(|x| Arc::ptr_eq(x, w)) {
            inner.queues[tier].remove(pos);
            inner.counters[tier].completed += 1;
            inner.counters[tier].cancelled += 1;
            self.left_queue(&mut inner, w);
            if pos == 0 {
                inner.front_since[tier] = now;
                if let Some(f) = inner.queues[tier].front() {
                    self.poke_front(f);
                }
            }
        }
        w.state.store(CANCELLED, Ordering::Release);
        self.dispatch_locked(&mut inner, now);
        Err(Error::Timeout)
    }

    fn left_queue(&self, inner: &mut Inner, w: &Waiter) {
        let tier = w.tier;
        // The last async waiter gone: let the pump see it and exit now.
        if w.is_async && self.async_waiting.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.wake_pump();
        }
        if inner.queues[tier].is_empty() {
            self.queued.fetch_and(!(1 << tier), Ordering::SeqCst);
            let backlogged = inner.queues.iter().any(|q| !q.is_empty());
            self.stall.update(|| backlogged);
        }
        if let Some(s) = self.shared_root() {
            s.publish_waiting(tier, -1);
        }
    }

    /// Drains what can go now (see the module docs). Returns the earliest
    /// instant (ns) at which a blocked front may be able to go.
    fn dispatch_locked(&self, inner: &mut Inner, now: u64) -> Option<u64> {
        let mut next: Option<u64> = None;
        let shared = self.shared_root();
        // The best waiter queued in another process, looked up once.
        let mut elsewhere: Option<Option<(usize, u32)>> = None;
        let mut woke = false;
        inner.deferring = false;
        for tier in (0..LEVELS).rev() {
            let mut progressed = false;
            while let Some(w) = inner.queues[tier].front().cloned() {
                if let (Some(s), true) = (shared, w.n > 0 && tier + 1 < LEVELS) {
                    let best = *elsewhere.get_or_insert_with(|| s.best_waiting_elsewhere());
                    let force_at = inner.front_since[tier] + STALL_TICKS * TICK_NS;
                    if let Some((_, idx)) = best.filter(|&(bt, _)| bt > tier) {
                        if now < force_at {
                            // Priorities hold across processes: leave the
                            // tokens to that process's waiter and wake it.
                            if !woke {
                                s.wake_process(idx);
                                woke = true;
                            }
                            inner.deferring = true;
                            let at = (now + DEFER_POLL_NS).min(force_at);
                            next = Some(next.map_or(at, |x| x.min(at)));
                            break;
                        }
                    }
                }
                let state = if w.n == 0 {
                    GRANTED
                } else {
                    let paid = w.paid.load(Ordering::Relaxed);
                    match self.charge_chain(paid, w.n, now, Mode::Normal) {
                        Ok(false) => GRANTED,
                        Ok(true) => GRANTED_FORCED,
                        Err((k, Refused::Until(v), g)) => {
                            w.paid.store(k, Ordering::Relaxed);
                            let force_at = inner.front_since[tier] + STALL_TICKS * TICK_NS;
                            if now >= force_at {
                                match self.charge_chain(k, w.n, now, Mode::Force) {
                                    Ok(_) => GRANTED_FORCED,
                                    // A forced charge is refused only for a
                                    // corrupt word.
                                    Err((_, r, _)) => {
                                        let (tat, v) = match r {
                                            Refused::Corrupt { tat, v } => (tat, v),
                                            Refused::Until(v) => (u64::MAX, v),
                                        };
                                        w.corrupt[0].store(tat, Ordering::Relaxed);
                                        w.corrupt[1].store(v, Ordering::Relaxed);
                                        CORRUPT
                                    }
                                }
                            } else {
                                let at = g.instant_of(v).min(force_at);
                                next = Some(next.map_or(at, |x| x.min(at)));
                                break;
                            }
                        }
                        Err((_, Refused::Corrupt { tat, v }, _)) => {
                            w.corrupt[0].store(tat, Ordering::Relaxed);
                            w.corrupt[1].store(v, Ordering::Relaxed);
                            CORRUPT
                        }
                    }
                };
                inner.queues[tier].pop_front();
                inner.counters[tier].completed += 1;
                if state == GRANTED_FORCED {
                    self.count_forced();
                }
                self.left_queue(inner, &w);
                inner.front_since[tier] = now;
                progressed = true;
                w.finish(state, shared);
            }
            if progressed {
                if let Some(f) = inner.queues[tier].front() {
                    self.poke_front(f);
                }
            }
        }
        next
    }

    /// Current balance, or the corrupt-word error.
    pub fn tokens(&self) -> Result<i64> {
        self.gcra
            .read(self.tat(), self.now())
            .map(|(t, _)| t)
            .map_err(|r| match r {
                Refused::Corrupt { tat, v } => corrupt_error(tat, v, self.gcra.cap()),
                // Reads are refused only for a corrupt word.
                Refused::Until(v) => corrupt_error(u64::MAX, v, self.gcra.cap()),
            })
    }

    pub fn stats(&self) -> LimiterStats {
        let now = self.now();
        let inner = self.lock();
        let mut queues = inner.counters;
        let mut total = QueueStats::default();
        for (i, q) in queues.iter_mut().enumerate() {
            q.count = inner.queues[i].len() as u64;
            q.stall = if q.count > 0 {
                now.saturating_sub(inner.front_since[i]) / TICK_NS
            } else {
                0
            };
            total.count += q.count;
            total.deferred += q.deferred;
            total.completed += q.completed;
            total.cancelled += q.cancelled;
        }
        drop(inner);
        // A corrupt word reads as neither tokens nor clock; report 0 and let
        // the next consume return the error.
        let (tokens, clock) = self.gcra.read(self.tat(), now).unwrap_or((0, 0));
        LimiterStats {
            tokens,
            tokens_per_second: self.gcra.cap() as u32,
            pending: total.count,
            forced: self.forced.load(Ordering::Relaxed),
            clock,
            total,
            queues,
            stall_ns: self.stall.total_ns(),
            shared: match &self.home {
                Home::Shared(s) => Some(s.stats()),
                Home::Local(_) => None,
            },
        }
    }
}
