//! Where a waiter of a shared object sleeps, and who wakes it.
//!
//! # How it works
//!
//! A process's waiters of a region's object sleep in one of two places:
//!
//! - its **front** of each tier (the oldest waiter it has there: the only
//!   one of its waiters the region may designate, or wake as its tier's
//!   front) sleeps on the process's futex word in the region, tagged with
//!   its tier's bit ([`tier_bit`]), so that another process wakes exactly
//!   that thread (`FUTEX_WAKE_BITSET`);
//! - every other waiter sleeps on a word of its own in process memory
//!   ([`Park`]), which only its own process wakes: when it is granted, or
//!   when it becomes the front of its tier (it then moves to the region
//!   word).
//!
//! The process's helper thread (standing in for its async waiters) sleeps
//! on the region word tagged [`HELPER_BIT`] and the bits of the tiers whose
//! front is async. So a grant wakes the thread it is for, and the helper
//! only when an async waiter is the one.
//!
//! **No lost wake-up.** A sleeper reads both words before it looks at its
//! state, records where it goes to sleep (`at`, SeqCst), and the kernel
//! puts it to sleep only if the word has not moved. A waker changes the
//! state, bumps both words, then reads `at` and wakes that word. If the
//! waker read `at` before the sleeper wrote it, the sleeper's wait comes
//! after the waker's bumps and returns at once; otherwise the waker wakes
//! the word the sleeper sleeps (or is about to sleep) on.
//!
//! # Timers
//!
//! Waiting costs nothing while nothing changes: a waiter sleeps without a
//! timeout (its own deadline aside). What still needs a clock, the safety
//! net (reaping dead processes, passing over a process that makes no
//! progress, the lottery's draws for waiters only a lottery pick can
//! admit), runs on one thread per process and object, the **keeper**
//! (the `keeper` word of [`Fronts`]): a front waiter that claims the role
//! sleeps with the backstop timeout and does the rounds when it fires. When the keeper
//! leaves the queue the role is handed on (the new front of its tier is
//! woken anyway; otherwise another waiter is). The helper thread, when
//! there is one, keeps its own timer.

use crate::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use super::registry::Registry;
pub use super::registry::{tier_bit, HELPER_BIT};
use crate::priority::LEVELS;
use crate::sys::futex::{futex_wait, futex_wake, WaitResult};

const AWAKE: u32 = 0;
const AT_REGION: u32 = 1;
const AT_OWN: u32 = 2;

/// A waiter's parking place (see the module docs). Lives in the waiter,
/// in process memory.
#[derive(Debug, Default)]
pub struct Park {
    /// The waiter's own futex word, bumped by every wake meant for it.
    own: AtomicU32,
    /// Where its thread sleeps now: `AWAKE`, `AT_REGION`, `AT_OWN`.
    at: AtomicU32,
    /// True while it is its process's front of its tier (written under the
    /// queue's lock).
    front: AtomicBool,
    /// Both words as its queue read them when it was queued, before that
    /// queue change served (see [`note`](Self::note)): region word in the
    /// high half, own word in the low.
    noted: AtomicU64,
    /// True while `noted` holds a reading its thread has not used yet.
    has_note: AtomicBool,
}

/// The two futex words' values, read before a sleeper looks at its state.
#[derive(Debug, Clone, Copy)]
pub struct Seqs {
    region: u32,
    own: u32,
}

impl Park {
    /// A waiter that is not (yet) a front.
    pub fn new() -> Park {
        Park::default()
    }

    /// Reads both words (call before looking at the waiter's state).
    #[inline]
    pub fn seqs(&self, reg: &Registry) -> Seqs {
        Seqs {
            region: reg.my_seq(),
            own: self.own.load(Ordering::SeqCst),
        }
    }

    /// Notes both words for the waiter's thread (under the queue's lock,
    /// when it is queued, before the serve of that change): its first
    /// sleep may use them instead of reading the words and serving again.
    /// Every change after this point that the thread must act on (a
    /// designation, a grant, a new role) bumps one of them, so that sleep
    /// returns at once and the thread looks again.
    pub fn note(&self, reg: &Registry) {
        let s = self.seqs(reg);
        self.noted.store(
            (u64::from(s.region) << 32) | u64::from(s.own),
            Ordering::SeqCst,
        );
        self.has_note.store(true, Ordering::SeqCst);
    }

    /// The words noted when the waiter was queued, once (see
    /// [`note`](Self::note)).
    #[inline]
    pub fn take_note(&self) -> Option<Seqs> {
        if !self.has_note.swap(false, Ordering::SeqCst) {
            return None;
        }
        let v = self.noted.load(Ordering::SeqCst);
        Some(Seqs {
            region: (v >> 32) as u32,
            own: v as u32,
        })
    }

    /// Marks the waiter as its process's front of its tier, or not (under
    /// the queue's lock). True if it just became the front: its thread must
    /// then be woken ([`wake`](Self::wake)) to move to the region word.
    pub fn set_front(&self, on: bool) -> bool {
        self.front.swap(on, Ordering::SeqCst) != on && on
    }

    /// Whether the waiter is its process's front of its tier.
    #[inline]
    pub fn is_front(&self) -> bool {
        self.front.load(Ordering::SeqCst)
    }

    /// Sleeps until woken or `timeout` (`None`: until woken), unless a word
    /// moved since `seqs` was read: on the region word tagged with
    /// `tier`'s bit if the waiter is a front, else on its own word.
    pub fn sleep(
        &self,
        reg: &Registry,
        seqs: Seqs,
        tier: usize,
        timeout: Option<Duration>,
    ) -> WaitResult {
        let r = if self.is_front() {
            self.at.store(AT_REGION, Ordering::SeqCst);
            reg.sleep(seqs.region, timeout, tier_bit(tier))
        } else {
            self.at.store(AT_OWN, Ordering::SeqCst);
            futex_wait(&self.own, seqs.own, timeout)
        };
        self.at.store(AWAKE, Ordering::SeqCst);
        r
    }

    /// Wakes this waiter's thread wherever it sleeps (after its state, its
    /// front mark or the keeper changed). Bumps this process's region word
    /// as well (see the module docs).
    pub fn wake(&self, reg: &Registry, tier: usize) {
        wake_parked(reg, std::iter::once((self, tier)));
    }
}

/// Wakes the threads of several waiters of this process (after their
/// state changed): one bump of the region word, one syscall for all those
/// asleep there, one per waiter asleep on its own word.
pub fn wake_parked<'a>(reg: &Registry, parks: impl Iterator<Item = (&'a Park, usize)> + Clone) {
    for (p, _) in parks.clone() {
        p.own.fetch_add(1, Ordering::SeqCst);
    }
    reg.bump_mine();
    let mut bits = 0;
    for (p, tier) in parks {
        match p.at.load(Ordering::SeqCst) {
            AT_REGION => bits |= tier_bit(tier),
            AT_OWN => {
                futex_wake(&p.own, 1);
            }
            _ => {}
        }
    }
    if bits != 0 {
        reg.wake_mine(bits);
    }
}

/// A waiter of a process's queue, as its parking sees it.
pub trait Parked {
    /// Its parking place.
    fn park(&self) -> &Park;
    /// True for an async waiter (no thread sleeps for it: the helper
    /// stands in).
    fn is_async(&self) -> bool;
    /// Its id for the keeper role (nonzero, unique while it lives).
    fn id(&self) -> u64;
}

impl<T: Parked> Parked for std::sync::Arc<T> {
    fn park(&self) -> &Park {
        (**self).park()
    }
    fn is_async(&self) -> bool {
        (**self).is_async()
    }
    fn id(&self) -> u64 {
        (**self).id()
    }
}

/// The parking state of one process's queue of a shared object (the
/// Scheduler's and the Limiter's root keep one each): which tiers' fronts
/// are async, and the keeper role (see the module docs). Its methods run
/// under the queue's lock.
#[derive(Debug, Default)]
pub struct Fronts {
    /// 0, or the id of the front that keeps the backstop timer.
    keeper: AtomicU64,
    /// Bit `t` set while the front of tier `t` is async.
    async_fronts: AtomicU32,
}

/// What [`Fronts::keeps`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keeps {
    /// The waiter keeps the backstop timer.
    Yes,
    /// Another waiter keeps it, or this one is not a front.
    No,
    /// The waiter claimed the role but had left its queue meanwhile: the
    /// caller hands it on with [`Fronts::lapse`] under the queue's lock.
    Lapsed,
}

/// What a change of the queue asks to be woken (after the lock).
#[derive(Debug)]
pub struct ToWake<'a, W> {
    /// A blocking waiter that just became its tier's front, or was handed
    /// the keeper role: it must move to the region word (or claim).
    pub waiter: Option<&'a W>,
    /// The helper must look again: the tiers it stands in for grew.
    pub helper: bool,
}

impl Fronts {
    /// Tier `tier`'s front is now `front` (it was published): marks it,
    /// and says whom to wake.
    pub fn front_is<'a, W: Parked>(&self, tier: usize, front: Option<&'a W>) -> ToWake<'a, W> {
        let bit = 1u32 << tier;
        let mut to = ToWake {
            waiter: None,
            helper: false,
        };
        match front {
            Some(w) if w.is_async() => {
                w.park().set_front(true);
                to.helper = self.async_fronts.fetch_or(bit, Ordering::SeqCst) & bit == 0;
            }
            Some(w) => {
                if w.park().set_front(true) {
                    to.waiter = Some(w);
                }
                self.async_fronts.fetch_and(!bit, Ordering::SeqCst);
            }
            None => {
                self.async_fronts.fetch_and(!bit, Ordering::SeqCst);
            }
        }
        to
    }

    /// Waiter `w` left the queue of `tier` (the tier already republished:
    /// `fronts` are the process's fronts per tier now): unmarks it and, if
    /// it was the keeper, names the waiter to wake to take the role on:
    /// nobody if its tier has a new blocking front (woken anyway as the new
    /// front, it claims the role when it next sleeps), else the highest
    /// other blocking front, if any.
    pub fn left<'a, W: Parked>(
        &self,
        w: &W,
        tier: usize,
        fronts: [Option<&'a W>; LEVELS],
    ) -> Option<&'a W> {
        w.park().set_front(false);
        if self
            .keeper
            .compare_exchange(w.id(), 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return None;
        }
        let blocking = fronts.map(|f| f.filter(|f| !f.is_async()));
        if blocking[tier].is_some() {
            return None;
        }
        blocking.into_iter().rev().flatten().next()
    }

    /// Whether waiter `w`, about to sleep, keeps the backstop timer: a
    /// blocking front claims the role if nobody has it.
    ///
    /// It runs without the queue's lock, so `w` may leave the queue (a
    /// grant) between its front test and its claim: [`left`](Self::left)
    /// then found no keeper to hand on, and the role would stay with a
    /// waiter that has gone, leaving the process without a backstop for as
    /// long as that waiter is not queued again. So a claim is checked
    /// against the front mark once more: `w`'s [`left`](Self::left) clears
    /// the mark before it looks at the role, so either this second look
    /// sees the mark cleared ([`Keeps::Lapsed`]: the caller hands the role
    /// on with [`lapse`](Self::lapse), under the lock), or that `left`
    /// sees the claim and hands the role on itself.
    pub fn keeps<W: Parked>(&self, w: &W) -> Keeps {
        if !w.park().is_front() {
            return Keeps::No;
        }
        let id = w.id();
        match self
            .keeper
            .compare_exchange(0, id, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) if w.park().is_front() => Keeps::Yes,
            Ok(_) => Keeps::Lapsed,
            Err(cur) if cur == id => Keeps::Yes,
            Err(_) => Keeps::No,
        }
    }

    /// Gives up the role that `w` claimed after it had left its queue
    /// ([`Keeps::Lapsed`]), under the queue's lock (`fronts` are the
    /// process's fronts per tier now): if the role is still `w`'s, names
    /// the highest blocking front to wake to take it on (one may have gone
    /// to sleep without it while `w` held it).
    pub fn lapse<'a, W: Parked>(&self, w: &W, fronts: [Option<&'a W>; LEVELS]) -> Option<&'a W> {
        if self
            .keeper
            .compare_exchange(w.id(), 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return None;
        }
        fronts.into_iter().rev().flatten().find(|f| !f.is_async())
    }

    /// The id of the waiter that keeps the backstop timer (0: none), for
    /// the model checker's end-of-run checks.
    #[cfg(shuttle)]
    pub fn keeper_id(&self) -> u64 {
        self.keeper.load(Ordering::SeqCst)
    }

    /// The bits the helper sleeps under: its own and the tiers whose front
    /// is async.
    pub fn helper_bits(&self) -> u32 {
        self.async_fronts.load(Ordering::SeqCst) | HELPER_BIT
    }

    /// Whether the front of any of `tiers` (bits) is async.
    pub fn async_at(&self, tiers: u32) -> bool {
        self.async_fronts.load(Ordering::SeqCst) & tiers != 0
    }
}
