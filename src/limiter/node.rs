//! One level of a limiter chain: an in-process bucket with its queues, or a
//! handle on a root shared through a region (see `root.rs`).
//!
//! **Fast path.** A consume of `n > 0` at priority `p` is charged at once
//! (one CAS, no lock, no syscall beyond the clock) when nothing waits at
//! `p` or above at this level (for a shared root: in any process); `n == 0`
//! goes at once only when nothing waits at all. Anything else queues at
//! `p`, at this level.
//!
//! **First look.** A consume's common case (a root, or every level of a
//! chain, charged at once within its capacity on the TSC clock, by a
//! usable handle whose counter a thread claimed) is [`Node::first_look`]:
//! code that calls nothing, so that a caller can keep its frame small; it
//! declines everything else with nothing done, and the general path
//! below decides as it always did.
//!
//! **A chain** (child → … → root) is charged level by level, leaf first: a
//! consume that a level cannot charge waits *at that level*, so a consume
//! held back by its own child limiter never defers anyone at the root. If
//! it gives up (timeout, dropped future) the levels already charged are
//! refunded, exactly: nothing charged and unused is lost. The levels charged
//! at once in one walk share one reading of the clock ([`Now`]): a TSC
//! read costs a VM about 10 ns, as much as the rest of a level's charge.
//!
//! **Draining an in-process level.** Under the level's lock, tiers are
//! visited from the highest down; each drains from its front while the
//! front can go ([`step`]): a blocked front blocks only its own tier, and a
//! front stalled for [`STALL_TICKS`](super::STALL_TICKS) × 100 ms is
//! forced through into debt (never on top of debt).
//!
//! **Sleeping, no timer thread per level.** A blocked thread sleeps on its
//! waiter's word, a queue's front until the instant it may go; whoever
//! drains wakes the waiters it charged and any new fronts. Async waiters
//! at an in-process level are woken at their instant by the process's one
//! limiter timer (`timer.rs`); at a shared root, by the process's helper.

use crate::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use crate::sync::{Mutex, MutexGuard};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bucket::{charge_within, Gcra, Hot, Mode, Refused};
use super::params::{ParamBlock, Params};
use super::root::LimRoot;
use super::stats::{LimiterQueueStats, LimiterStats};
use super::tally::Tally;
use super::waiter::{
    step, Step, Waiter, Wakeups, CANCELLED, CORRUPT, GRANTED, GRANTED_FORCED, WAITING,
};
use super::{corrupt_error, TICK_NS};
use crate::error::{Error, Result};
use crate::priority::{Priority, LEVELS};
use crate::region::registry::{GATE_LEASED, GATE_TIERS};
use crate::scheduler::QueueStats;
use crate::stall::StallClock;
use crate::sys::clock::{monotonic_ns, read_tsc, Clock};
use crate::sys::fork::fork_generation;
use crate::sys::futex::futex_wait;

/// One reading of the clock for a walk up a chain: the TSC (or
/// `CLOCK_MONOTONIC`, for a level without one) is read at most once, at
/// the first level that needs it, and every level maps that raw reading
/// to its own virtual clock ([`Hot::v`](super::bucket::Hot::v)). A
/// reading a few ns old at the upper levels only makes them see slightly
/// less refill; on a VM a TSC read costs about as much as the rest of a
/// level's charge.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Now {
    tsc: Option<u64>,
    mono: Option<u64>,
}

impl Now {
    /// The raw reading for a level of `hot`'s clock: TSC ticks, or
    /// nanoseconds of `CLOCK_MONOTONIC`.
    #[inline(always)]
    pub fn tick(&mut self, hot: &Hot) -> u64 {
        if hot.tsc() {
            *self.tsc.get_or_insert_with(read_tsc)
        } else {
            *self.mono.get_or_insert_with(monotonic_ns)
        }
    }
}

/// What a consume's first look at a level did ([`Node::first_look`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Look {
    /// Charged and counted (never into debt: the first look charges only
    /// within the capacity).
    Charged,
    /// Nothing charged: the bucket holds too few tokens, or (in-process)
    /// a consume waits ahead; a consume queues, a `try_consume` refuses.
    Refused,
    /// Nothing done: the general path decides (a waiter or a lease in the
    /// region's gate, parameters not in this process's copy or being
    /// changed, a clock that is not the TSC or a reading it must clamp, a
    /// request above the capacity).
    Declined,
    /// The bucket's word holds `tat` while the clock is at `v`: scribbled.
    Corrupt {
        /// The stored word.
        tat: u64,
        /// The virtual clock now.
        v: u64,
    },
}

/// An in-process level's bucket and queues.
#[derive(Debug)]
pub(crate) struct LocalBucket {
    params: ParamBlock,
    tat: AtomicU64,
    /// Bit `t` set while tier `t` has queued waiters (read on the fast path).
    queued: AtomicU32,
    inner: Mutex<LocalQueues>,
    async_waiting: AtomicU32,
}

#[derive(Debug, Default)]
struct LocalQueues {
    tiers: [VecDeque<Arc<Waiter>>; LEVELS],
    /// When each tier's current front became the front (or last made
    /// progress), ns.
    front_since: [u64; LEVELS],
    next_seq: u32,
}

/// Where a level's bucket lives.
///
/// The in-process bucket is inline, not boxed: every handle lives in an
/// `Arc<Node>` already, and the box's pointer was one more dependent load
/// on the consume fast path (3 instructions a consume in-process, 4
/// through a child); a shared handle's node so carries 900 unused bytes.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Home {
    /// Process memory.
    Local(LocalBucket),
    /// A region (this process's side of it).
    Shared(Arc<LimRoot>),
}

/// Per-priority counters of one limiter handle.
#[derive(Debug, Default)]
struct Counters {
    deferred: [AtomicU64; LEVELS],
    completed: [AtomicU64; LEVELS],
    cancelled: [AtomicU64; LEVELS],
    /// Tokens charged at this level, per tier (cheap for the handle's
    /// main thread, see `tally.rs`).
    consumed: Tally,
    /// Tokens refunded at this level, per tier.
    refunded: [AtomicU64; LEVELS],
}

/// One level of a limiter chain.
#[derive(Debug)]
pub(crate) struct Node {
    home: Home,
    parent: Option<Arc<Node>>,
    fork_gen: u64,
    /// Counter: consumes through this handle that went into debt here.
    forced: AtomicU64,
    counters: Counters,
    /// Time during which at least one consume waited here.
    stall: StallClock,
    waiting: AtomicU64,
    /// This node (for the timer, which holds levels weakly).
    this: std::sync::Weak<Node>,
}

impl Node {
    /// An in-process level of `rate` tokens/s and capacity `cap`, full now.
    pub fn local(rate: u32, cap: u32, parent: Option<Arc<Node>>) -> Arc<Node> {
        let clock = match &parent {
            Some(p) => p.clock_hint(),
            None => Clock::process(),
        };
        let params = ParamBlock::default();
        params.init(&Params {
            gcra: Gcra::new(rate, cap, clock.now_ns()),
            clock,
        });
        Node::with_home(
            Home::Local(LocalBucket {
                params,
                tat: AtomicU64::new(0),
                queued: AtomicU32::new(0),
                inner: Mutex::new(LocalQueues::default()),
                async_waiting: AtomicU32::new(0),
            }),
            parent,
        )
    }

    /// A handle on a shared root.
    pub fn shared(root: Arc<LimRoot>) -> Arc<Node> {
        Node::with_home(Home::Shared(root), None)
    }

    fn with_home(home: Home, parent: Option<Arc<Node>>) -> Arc<Node> {
        Arc::new_cyclic(|this| Node {
            this: this.clone(),
            home,
            parent,
            fork_gen: {
                // Without the handler a fork would go unnoticed (ENOMEM only).
                let _ = crate::sys::fork::install_atfork_handler();
                fork_generation()
            },
            forced: AtomicU64::new(0),
            counters: Counters::default(),
            stall: StallClock::new(),
            waiting: AtomicU64::new(0),
        })
    }

    /// The clock this level reads (a child uses its parent's, so one `now`
    /// serves a chain).
    fn clock_hint(&self) -> Clock {
        self.params().map(|p| p.clock).unwrap_or(Clock::Monotonic)
    }

    pub fn parent(&self) -> Option<&Arc<Node>> {
        self.parent.as_ref()
    }

    pub fn home(&self) -> &Home {
        &self.home
    }

    #[inline(always)]
    fn block(&self) -> &ParamBlock {
        match &self.home {
            Home::Local(b) => &b.params,
            Home::Shared(r) => r.bucket().params(),
        }
    }

    /// This level's parameters now.
    #[inline(always)]
    pub fn params(&self) -> Result<Params> {
        self.block().load()
    }

    #[inline(always)]
    fn tat(&self) -> &AtomicU64 {
        match &self.home {
            Home::Local(b) => &b.tat,
            Home::Shared(r) => &r.bucket().state().tat,
        }
    }

    /// Whether the calling thread owns this level's `consumed` counter
    /// (`tally.rs`): then the handle is usable (no fork since the claim),
    /// and [`fast`](Self::fast) and [`try_level`](Self::try_level) may be
    /// told so, skipping [`check_usable`](Self::check_usable).
    #[inline(always)]
    pub fn owned_here(&self) -> bool {
        self.counters.consumed.owned_here()
    }

    /// The calling thread's first look at this level ([`first_look`](
    /// Self::first_look)) at TSC reading `tick`, counted as this level's
    /// counter says: by its owner (whose ownership is the fork test, see
    /// `tally.rs`) on its own words, by another thread with a `fetch_add`
    /// (after the fork test, where `fork_test`: the leaf of a walk; every
    /// level of a chain was made in the leaf's generation). A counter no
    /// thread claimed yet, and a forked child, are the general path's
    /// ([`Look::Declined`]), which claims the counter.
    #[inline(always)]
    pub fn look(&self, tick: u64, n: u64, tier: usize, mode: Mode, fork_test: bool) -> Look {
        match self.counters.consumed.owner_is_me() {
            Some(true) => self.first_look::<true>(tick, n, tier, mode),
            Some(false) if !fork_test || self.usable() => {
                self.first_look::<false>(tick, n, tier, mode)
            }
            _ => Look::Declined,
        }
    }

    /// Fails in a forked child (the handle is its parent's). Inline, the
    /// error built out of line: this runs on every consume that
    /// [`owned_here`](Self::owned_here) does not vouch for.
    #[inline(always)]
    pub fn check_usable(&self) -> Result<()> {
        if !self.usable() {
            return Err(forked_error());
        }
        Ok(())
    }

    /// False in a forked child (the handle is its parent's): the test of
    /// [`check_usable`](Self::check_usable), without its error.
    #[inline(always)]
    pub fn usable(&self) -> bool {
        self.fork_gen == fork_generation()
    }

    /// Replaces this level's rate and/or capacity, re-basing its clock at
    /// now (every process sees it for a shared root). The balance is kept,
    /// up to a new capacity ([`Gcra::recapped`]).
    pub fn set_params(&self, rate: Option<u32>, cap: Option<u32>) -> Result<Params> {
        let f = |p: Params| Params {
            gcra: p.gcra.recapped(
                self.tat(),
                p.clock.now_ns(),
                rate.unwrap_or(p.gcra.rate() as u32),
                cap.unwrap_or(p.gcra.cap() as u32),
            ),
            ..p
        };
        let r = match &self.home {
            Home::Local(b) => b.params.update(1, &|_| true, f),
            Home::Shared(root) => {
                let r = root.bucket().update_params(f);
                root.fronts_moved();
                r
            }
        };
        // Waiters may go sooner (or later) now: here, and in every other
        // process with waiters (they sleep until the instant the old
        // parameters gave).
        self.drain_now();
        if let Home::Shared(root) = &self.home {
            let reg = root.bucket().reg();
            for idx in reg.waiting_processes().filter(|&i| i != reg.me().idx) {
                reg.wake(idx, crate::sys::futex::BITSET_ALL);
            }
        }
        r
    }

    /// On slow paths, at most every 100 ms per process: if this level's
    /// clock is a TSC that no longer agrees with `CLOCK_MONOTONIC` (it
    /// stopped, or jumped: a VM restore, a resume), move the level to
    /// `CLOCK_MONOTONIC` (for a shared root: the whole region), so refills
    /// and the stall guard never freeze.
    pub fn check_clock(&self) {
        if !super::params::clock_check_due() {
            return;
        }
        let Ok(Params {
            clock: Clock::Tsc(c),
            ..
        }) = self.params()
        else {
            return;
        };
        if c.check_agrees().is_ok() {
            return;
        }
        match &self.home {
            Home::Shared(r) => {
                r.bucket().demote_clock();
                r.fronts_moved();
            }
            Home::Local(b) => {
                let _ = b.params.update(1, &|_| true, super::params::demoted);
            }
        }
    }

    // ---- fast paths ----------------------------------------------------------

    /// Charges `n` at this level if nothing waits ahead of it here: `Ok(Some(
    /// debt))` if charged, `Ok(None)` to queue. `now` is the walk's one
    /// reading of the clock (see [`Now`]); `owned` is what
    /// [`owned_here`](Self::owned_here) said (the count is then one add to
    /// the owner's word), false if not asked. The caller has checked the
    /// handle is usable, or seen `owned`.
    ///
    /// One dispatch on the home, and each arm is the whole path: its
    /// queue test, its parameters, its charge and its counters (matching
    /// on the home again for each of them cost about 10 instructions a
    /// consume, and the parameters travelled through memory).
    #[inline(always)]
    pub fn fast(&self, n: u64, p: Priority, now: &mut Now, owned: bool) -> Result<Option<bool>> {
        if n == 0 {
            return Ok(self.fast_zero());
        }
        let tier = p.index();
        match &self.home {
            Home::Local(b) => {
                if b.queued.load(Ordering::SeqCst) >> tier != 0 {
                    return Ok(None);
                }
                // SAFETY: a `LocalBucket` is in process memory (inline in
                // its `Node`).
                let hot = unsafe { b.params.hot_trusted() }?;
                let t = now.tick(&hot);
                match hot.charge(&b.tat, n, t, Mode::Normal) {
                    Ok(c) => {
                        if c.debt {
                            self.forced.fetch_add(1, Ordering::Relaxed);
                        }
                        self.count_consumed(tier, n, owned);
                        Ok(Some(c.debt))
                    }
                    Err(Refused::Until(_)) => Ok(None),
                    Err(Refused::Corrupt { tat, v }) => Err(corrupt_error(tat, v)),
                }
            }
            Home::Shared(r) => {
                // One test, as without leases: a leased region
                // (`GATE_LEASED`) checks its lease's deadline on the cold
                // side.
                let mask = GATE_TIERS & !((1u64 << tier) - 1);
                let g = r.gate();
                if g & (mask | GATE_LEASED) != 0 && !r.open_slow(g, mask) {
                    return Ok(None);
                }
                let hot = r.hot_params()?;
                let bucket = r.bucket();
                let t = now.tick(&hot);
                match hot.charge(&bucket.state().tat, n, t, Mode::Normal) {
                    Ok(c) => {
                        if c.debt {
                            self.count_forced();
                        }
                        self.count_consumed(tier, n, owned);
                        bucket.totals().consumed[tier].fetch_add(n, Ordering::Relaxed);
                        Ok(Some(c.debt))
                    }
                    Err(Refused::Until(_)) => Ok(None),
                    Err(Refused::Corrupt { tat, v }) => Err(corrupt_error(tat, v)),
                }
            }
        }
    }

    /// A consume's *first look* at this level: the common case of
    /// [`fast`](Self::fast) (`Mode::Normal`) or
    /// [`try_level`](Self::try_level) (`Mode::Exact`), for `n` in
    /// `1..=MAX_CONSUME` and within the capacity, at TSC reading `tick`,
    /// in code that calls nothing out of line; the count on the owner's
    /// words (`OWNED`) or with a `fetch_add` on the others' (see
    /// [`look`](Self::look), which makes the fork test). Everything rarer
    /// is [`Look::Declined`] with nothing done, for the general path.
    ///
    /// Why: a locked instruction waits for every earlier store to drain,
    /// and the registers a function saves on entry, and the values it
    /// spills around a call, are stores. A function that inlines this and
    /// calls out only for the rarer outcomes, last, with what they need
    /// (`Limiter::consume`), keeps little live across those calls (its
    /// arguments and its result's address), so out of line it saves one
    /// or two registers before the bucket's CAS, where the general fast
    /// path saved six and spilled two values more (measured: four more
    /// saved registers before `try_consume`'s CAS took it from 1.29× to
    /// 1.34× `governor`'s time). (LLVM makes no tail
    /// call from a function that returns its result through memory on
    /// x86-64: the result's address is kept across the call.)
    #[inline(always)]
    pub fn first_look<const OWNED: bool>(
        &self,
        tick: u64,
        n: u64,
        tier: usize,
        mode: Mode,
    ) -> Look {
        match &self.home {
            Home::Local(b) => {
                // As `fast` and `try_level`: a consume queues behind a
                // waiter at its tier or above, a try refuses behind any.
                let q = b.queued.load(Ordering::SeqCst);
                if (if mode == Mode::Exact { q } else { q >> tier }) != 0 {
                    return Look::Refused;
                }
                // SAFETY: a `LocalBucket` is in process memory (inline in
                // its `Node`).
                let Some((v, top)) = (unsafe { b.params.look_trusted(tick, n) }) else {
                    return Look::Declined;
                };
                self.look_charge::<OWNED>(&b.tat, n, v, top, tier, None)
            }
            Home::Shared(r) => {
                // A waiter ahead, a try behind any waiter (which the
                // general path reaps first if dead) and a lease (whose
                // deadline it checks) are the general path's.
                let mask = if mode == Mode::Exact {
                    GATE_TIERS
                } else {
                    GATE_TIERS & !((1u64 << tier) - 1)
                };
                if r.gate() & (mask | GATE_LEASED) != 0 {
                    return Look::Declined;
                }
                let Some((v, top)) = r.look_params(tick, n) else {
                    return Look::Declined;
                };
                let bucket = r.bucket();
                let total = &bucket.totals().consumed[tier];
                self.look_charge::<OWNED>(&bucket.state().tat, n, v, top, tier, Some(total))
            }
        }
    }

    /// [`first_look`](Self::first_look)'s charge of `n` on `word`
    /// ([`charge_within`]: `n` is within the capacity, so a normal and an
    /// exact charge are the same), counted at `tier` (`owned` as `fast`
    /// takes it) and on `total` (a region's).
    #[inline(always)]
    fn look_charge<const OWNED: bool>(
        &self,
        word: &AtomicU64,
        n: u64,
        v: u64,
        top: u64,
        tier: usize,
        total: Option<&AtomicU64>,
    ) -> Look {
        match charge_within(word, n, v, top) {
            Ok(()) => {
                if OWNED {
                    self.counters.consumed.add_owned(tier, n);
                } else {
                    self.counters.consumed.add_other(tier, n);
                }
                if let Some(t) = total {
                    t.fetch_add(n, Ordering::Relaxed);
                }
                Look::Charged
            }
            Err(Refused::Until(_)) => Look::Refused,
            Err(Refused::Corrupt { tat, v }) => Look::Corrupt { tat, v },
        }
    }

    /// Counts `n` tokens charged at `tier` in this handle's `consumed`
    /// (`owned`: as [`fast`](Self::fast) takes it).
    #[inline(always)]
    fn count_consumed(&self, tier: usize, n: u64, owned: bool) {
        if owned {
            self.counters.consumed.add_owned(tier, n);
        } else {
            self.counters.consumed.add(tier, n, self.fork_gen);
        }
    }

    /// Counts `n` tokens charged at `tier` at this level (and at the
    /// region's root, for a shared one).
    pub fn charged(&self, tier: usize, n: u64) {
        if n == 0 || tier >= LEVELS {
            return;
        }
        self.counters.consumed.add(tier, n, self.fork_gen);
        if let Home::Shared(r) = &self.home {
            r.bucket().totals().consumed[tier].fetch_add(n, Ordering::Relaxed);
        }
    }

    #[cold]
    fn count_forced(&self) {
        self.forced.fetch_add(1, Ordering::Relaxed);
        if let Home::Shared(r) = &self.home {
            r.bucket().state().forced.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// [`fast`](Self::fast) for `n == 0`, out of line (the fast path then
    /// tests one mask known where it is inlined, 5 instructions fewer): it
    /// goes at once only if nothing waits at all, at any priority.
    #[cold]
    #[inline(never)]
    fn fast_zero(&self) -> Option<bool> {
        let open = match &self.home {
            Home::Local(b) => b.queued.load(Ordering::SeqCst) == 0,
            Home::Shared(r) => {
                let g = r.gate();
                g & (GATE_TIERS | GATE_LEASED) == 0 || r.open_slow(g, GATE_TIERS)
            }
        };
        open.then_some(false)
    }

    /// `try_consume_at` at this level: charges exactly `n` (never into
    /// debt) only if nothing waits here (in any process, for a shared root,
    /// after reaping dead waiters), and counts it at `tier`. One dispatch
    /// on the home, as in [`fast`](Self::fast) (and `owned` as there).
    #[inline(always)]
    pub fn try_level(&self, n: u64, tier: usize, now: &mut Now, owned: bool) -> Result<bool> {
        match &self.home {
            Home::Local(b) => {
                if b.queued.load(Ordering::SeqCst) != 0 {
                    return Ok(false);
                }
                if n == 0 {
                    return Ok(true);
                }
                // SAFETY: a `LocalBucket` is in process memory (inline in
                // its `Node`).
                let hot = unsafe { b.params.hot_trusted() }?;
                let t = now.tick(&hot);
                match hot.charge(&b.tat, n, t, Mode::Exact) {
                    Ok(_) => {
                        self.count_consumed(tier, n, owned);
                        Ok(true)
                    }
                    Err(Refused::Until(_)) => Ok(false),
                    Err(Refused::Corrupt { tat, v }) => Err(corrupt_error(tat, v)),
                }
            }
            Home::Shared(r) => {
                // A lease's deadline, as on the consume fast path: the
                // precise clock only near or past it; waiters of dead
                // processes are reaped by the drain.
                let g = r.gate();
                if g & (GATE_TIERS | GATE_LEASED) != 0 && !r.try_open_slow(g) {
                    return Ok(false);
                }
                if n == 0 {
                    return Ok(true);
                }
                let hot = r.hot_params()?;
                let bucket = r.bucket();
                let t = now.tick(&hot);
                match hot.charge(&bucket.state().tat, n, t, Mode::Exact) {
                    Ok(_) => {
                        self.count_consumed(tier, n, owned);
                        bucket.totals().consumed[tier].fetch_add(n, Ordering::Relaxed);
                        Ok(true)
                    }
                    Err(Refused::Until(_)) => Ok(false),
                    Err(Refused::Corrupt { tat, v }) => Err(corrupt_error(tat, v)),
                }
            }
        }
    }

    /// Gives back `n` tokens charged at this level at `tier` and not used.
    pub fn refund(&self, n: u64, tier: usize) {
        if n == 0 || self.fork_gen != fork_generation() {
            return;
        }
        if tier < LEVELS {
            self.counters.refunded[tier].fetch_add(n, Ordering::Relaxed);
            if let Home::Shared(r) = &self.home {
                r.bucket().totals().refunded[tier].fetch_add(n, Ordering::Relaxed);
            }
        }
        if let Ok(p) = self.params() {
            p.gcra.refund(self.tat(), n);
        }
        if let Home::Shared(root) = &self.home {
            root.fronts_moved();
        }
        self.drain_now();
    }

    // ---- queueing and waiting ---------------------------------------------------

    /// Queues a consume of `n` at `p` at this level and drains (it may be
    /// charged at once).
    pub fn enqueue(self: &Arc<Self>, n: u64, p: Priority, is_async: bool) -> Arc<Waiter> {
        let tier = p.index();
        self.counters.deferred[tier].fetch_add(1, Ordering::Relaxed);
        self.waiting.fetch_add(1, Ordering::SeqCst);
        self.stall.update(|| true);
        match &self.home {
            Home::Shared(r) => {
                let w = r.enqueue(n, tier, is_async);
                if is_async {
                    r.ensure_helper();
                }
                w
            }
            Home::Local(b) => {
                let mut out = Wakeups::default();
                let w = {
                    let mut q = self.lock(b);
                    let seq = q.next_seq;
                    q.next_seq = seq.wrapping_add(1);
                    let w = Arc::new(Waiter::new(n, tier, seq, is_async));
                    if q.tiers[tier].is_empty() {
                        q.front_since[tier] = self.now_or_zero();
                    }
                    q.tiers[tier].push_back(w.clone());
                    if is_async {
                        b.async_waiting.fetch_add(1, Ordering::SeqCst);
                    }
                    b.queued.fetch_or(1 << tier, Ordering::SeqCst);
                    let next = self.drain_local(b, &mut q, &mut out);
                    if is_async {
                        self.arm_timer(next);
                    }
                    w
                };
                out.wake_local();
                w
            }
        }
    }

    fn lock<'a>(&self, b: &'a LocalBucket) -> MutexGuard<'a, LocalQueues> {
        // Nothing panics under this lock (wakers run after it).
        b.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_or_zero(&self) -> u64 {
        self.params().map(|p| p.clock.now_ns()).unwrap_or(0)
    }

    /// Book-keeping once a waiter queued here is done.
    pub fn waited(&self, tier: usize, cancelled: bool) {
        self.counters.completed[tier].fetch_add(1, Ordering::Relaxed);
        if cancelled {
            self.counters.cancelled[tier].fetch_add(1, Ordering::Relaxed);
        }
        if self.waiting.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.stall
                .update(|| self.waiting.load(Ordering::SeqCst) > 0);
        }
    }

    /// Blocks until `w` is charged (`Ok(debt)`), or fails, or the deadline
    /// passes (`Error::Timeout`; its place is removed).
    pub fn wait(&self, w: &Arc<Waiter>, deadline: Option<Instant>) -> Result<bool> {
        let r = match &self.home {
            Home::Shared(root) => root.wait(w, deadline),
            Home::Local(b) => loop {
                let seq = w.wake.load(Ordering::SeqCst);
                if let Some(r) = outcome(w) {
                    break r;
                }
                let mut timeout = None;
                if let Some(d) = deadline {
                    let now = Instant::now();
                    if now >= d {
                        break self.cancel_local(b, w);
                    }
                    timeout = Some(d - now);
                }
                let (next, front) = {
                    let mut out = Wakeups::default();
                    let r = {
                        let mut q = self.lock(b);
                        let next = self.drain_local(b, &mut q, &mut out);
                        let front = q.tiers[w.tier].front().is_some_and(|f| Arc::ptr_eq(f, w));
                        (next, front)
                    };
                    out.wake_local();
                    r
                };
                if w.state() != WAITING {
                    continue;
                }
                if front {
                    if let (Some(until), Ok(p)) = (next[w.tier], self.params()) {
                        let left = Duration::from_nanos(until.saturating_sub(p.clock.now_ns()));
                        timeout = Some(timeout.map_or(left, |t| t.min(left)));
                    }
                }
                if timeout.is_some_and(|t| t.is_zero()) {
                    continue;
                }
                self.check_clock();
                futex_wait(&w.wake, seq, timeout);
            },
        };
        self.waited(w.tier, matches!(r, Err(Error::Timeout)));
        if r.is_ok() {
            self.charged(w.tier, w.n);
        }
        r
    }

    /// Removes a waiter (dropped future) unless it was charged first: then
    /// `Ok(debt)`.
    pub fn cancel(&self, w: &Arc<Waiter>) -> Result<bool> {
        let r = match &self.home {
            Home::Shared(root) => root.cancel(w),
            Home::Local(b) => self.cancel_local(b, w),
        };
        self.waited(w.tier, matches!(r, Err(Error::Timeout)));
        if r.is_ok() {
            self.charged(w.tier, w.n);
        }
        r
    }

    fn cancel_local(&self, b: &LocalBucket, w: &Arc<Waiter>) -> Result<bool> {
        let mut out = Wakeups::default();
        let r = {
            let mut q = self.lock(b);
            if let Some(r) = outcome(w) {
                return r;
            }
            let tier = w.tier;
            if let Some(pos) = q.tiers[tier].iter().position(|x| Arc::ptr_eq(x, w)) {
                q.tiers[tier].remove(pos);
                self.popped(b, &q, w);
                if pos == 0 {
                    q.front_since[tier] = self.now_or_zero();
                    if let Some(f) = q.tiers[tier].front() {
                        out.add(f, false);
                    }
                }
            }
            w.state.store(CANCELLED, Ordering::Release);
            self.drain_local(b, &mut q, &mut out);
            Err(Error::Timeout)
        };
        out.wake_local();
        r
    }

    fn popped(&self, b: &LocalBucket, q: &LocalQueues, w: &Waiter) {
        if w.is_async {
            b.async_waiting.fetch_sub(1, Ordering::SeqCst);
        }
        if q.tiers[w.tier].is_empty() {
            b.queued.fetch_and(!(1 << w.tier), Ordering::SeqCst);
        }
    }

    /// Drains this level now (after a rate change, a refund, a timer).
    pub fn drain_now(&self) {
        match &self.home {
            Home::Shared(r) => {
                r.drain_now();
            }
            Home::Local(b) => {
                let mut out = Wakeups::default();
                {
                    let mut q = self.lock(b);
                    let next = self.drain_local(b, &mut q, &mut out);
                    if b.async_waiting.load(Ordering::SeqCst) > 0 {
                        self.arm_timer(next);
                    }
                }
                out.wake_local();
            }
        }
    }

    /// Serves what can go now (see the module docs). Returns, per tier, the
    /// instant its blocked front may go.
    fn drain_local(
        &self,
        b: &LocalBucket,
        q: &mut LocalQueues,
        out: &mut Wakeups,
    ) -> [Option<u64>; LEVELS] {
        let mut next = [None; LEVELS];
        let params = match b.params.load() {
            Ok(p) => p,
            Err(_) => return next, // in process memory: cannot be scribbled
        };
        let now = params.clock.now_ns();
        for tier in (0..LEVELS).rev() {
            let mut progressed = false;
            while let Some(w) = q.tiers[tier].front().cloned() {
                let state = match step(&params.gcra, &b.tat, w.n, now, q.front_since[tier]) {
                    Step::Charged(false) => GRANTED,
                    Step::Charged(true) => {
                        self.forced.fetch_add(1, Ordering::Relaxed);
                        GRANTED_FORCED
                    }
                    Step::Wait(until) => {
                        next[tier] = Some(until);
                        break;
                    }
                    Step::Corrupt(tat, v) => {
                        w.corrupt[0].store(tat, Ordering::Relaxed);
                        w.corrupt[1].store(v, Ordering::Relaxed);
                        CORRUPT
                    }
                };
                q.tiers[tier].pop_front();
                self.popped(b, q, &w);
                q.front_since[tier] = now;
                progressed = true;
                w.finish(state, out, false);
            }
            if progressed {
                // The new front computes its own instant.
                if let Some(f) = q.tiers[tier].front() {
                    out.add(f, false);
                }
            }
        }
        next
    }

    /// Registers this level with the process's limiter timer for its
    /// earliest instant (async waiters have no thread to sleep until it).
    fn arm_timer(&self, next: [Option<u64>; LEVELS]) {
        let Some(at) = next.iter().flatten().min().copied() else {
            return;
        };
        if let (Ok(p), Some(me)) = (self.params(), self.this.upgrade()) {
            let left = Duration::from_nanos(at.saturating_sub(p.clock.now_ns()));
            super::timer::schedule(&me, Instant::now() + left);
        }
    }

    /// The timer's call-back.
    pub(crate) fn on_timer(&self) {
        if self.fork_gen == fork_generation() {
            self.check_clock();
            self.drain_now();
        }
    }

    /// Counts a force-through seen by a consume through this handle that
    /// waited at a shared root (the root counted it region-wide).
    pub fn note_forced(&self) {
        self.forced.fetch_add(1, Ordering::Relaxed);
    }

    pub fn outcome(&self, w: &Waiter) -> Option<Result<bool>> {
        outcome(w)
    }

    pub fn ensure_helper(&self) {
        if let Home::Shared(r) = &self.home {
            r.ensure_helper();
        }
    }

    // ---- stats -------------------------------------------------------------

    /// Current balance, or the corrupt-word error.
    pub fn tokens(&self) -> Result<i64> {
        let p = self.params()?;
        p.gcra
            .read(self.tat(), p.clock.now_ns())
            .map(|(t, _)| t)
            .map_err(|r| match r {
                Refused::Corrupt { tat, v } => corrupt_error(tat, v),
                Refused::Until(v) => corrupt_error(u64::MAX, v),
            })
    }

    pub fn stats(&self) -> LimiterStats {
        let params = self.params().ok();
        let now = params.map_or(0, |p| p.clock.now_ns());
        let mut queues = [LimiterQueueStats::default(); LEVELS];
        let mut total = QueueStats::default();
        let fronts: [u64; LEVELS] = match &self.home {
            // In a forked child the lock may be held by a thread that does
            // not exist there: do not take it.
            Home::Local(_) if self.fork_gen != fork_generation() => [0; LEVELS],
            Home::Local(b) => {
                let q = self.lock(b);
                std::array::from_fn(|t| {
                    if q.tiers[t].is_empty() {
                        0
                    } else {
                        now.saturating_sub(q.front_since[t]) / TICK_NS
                    }
                })
            }
            Home::Shared(_) if self.fork_gen != fork_generation() => [0; LEVELS],
            Home::Shared(r) => r.front_stall_ticks(),
        };
        let c = &self.counters;
        let (mut consumed, mut refunded) = (0u64, 0u64);
        for (t, q) in queues.iter_mut().enumerate() {
            q.deferred = c.deferred[t].load(Ordering::Relaxed);
            q.completed = c.completed[t].load(Ordering::Relaxed);
            q.cancelled = c.cancelled[t].load(Ordering::Relaxed);
            q.consumed = c.consumed.get(t);
            q.refunded = c.refunded[t].load(Ordering::Relaxed);
            consumed += q.consumed;
            refunded += q.refunded;
            q.count = q.deferred.saturating_sub(q.completed);
            q.stall = if q.count > 0 { fronts[t] } else { 0 };
            total.count += q.count;
            total.deferred += q.deferred;
            total.completed += q.completed;
            total.cancelled += q.cancelled;
        }
        // A corrupt word reads as neither tokens nor clock; report 0 and let
        // the next consume return the error.
        let (tokens, clock) = params
            .and_then(|p| p.gcra.read(self.tat(), now).ok())
            .unwrap_or((0, 0));
        LimiterStats {
            tokens,
            tokens_per_second: params.map_or(0, |p| p.gcra.rate() as u32),
            capacity: params.map_or(0, |p| p.gcra.cap() as u32),
            pending: total.count,
            forced: self.forced.load(Ordering::Relaxed),
            clock: Gcra::refilled(clock),
            total,
            queues,
            stall_ns: self.stall.total_ns(),
            consumed,
            refunded,
            shared: match &self.home {
                Home::Shared(r) if self.fork_gen == fork_generation() => Some(
                    r.bucket()
                        .stats(params.map_or(Clock::Monotonic, |p| p.clock), fronts),
                ),
                _ => None,
            },
        }
    }
}

fn outcome(w: &Waiter) -> Option<Result<bool>> {
    match w.state() {
        WAITING => None,
        GRANTED => Some(Ok(false)),
        GRANTED_FORCED => Some(Ok(true)),
        CANCELLED => Some(Err(Error::Timeout)),
        _ => Some(Err(corrupt_error(
            w.corrupt[0].load(Ordering::Relaxed),
            w.corrupt[1].load(Ordering::Relaxed),
        ))),
    }
}

/// The error of a limiter handle used in a forked child.
#[cold]
#[inline(never)]
fn forked_error() -> Error {
    Error::Forked(
        "a Limiter belongs to the process that created it; in a forked child, \
         create a new one from the Region (Limiter::shared or Limiter::attach)"
            .into(),
    )
}
