//! A limiter root shared through a region: the process side.
//!
//! Every process keeps its consumes waiting at the shared root in its own
//! per-tier FIFO queues ([`LimRoot`], one per process and region, shared by
//! its handles) and publishes each tier's count, oldest ticket, the oldest
//! one's size and arrival in the region's [wait
//! registry](crate::region::registry). Only consumes waiting *at the root*
//! are published: a consume still waiting at a child limiter of its own
//! process defers nobody.
//!
//! # One order for everyone
//!
//! The region's front of tier `t` is the oldest published waiter of `t` in
//! any process. Tiers are visited from the highest down, as the seed's
//! drain does, and the rule is the same in every process
//! ([`step`]/[`could_go`]): a front that can go now (the bucket holds its
//! tokens, or it has stalled for a second and the bucket is not in debt)
//! goes before anything below it; a front that cannot blocks only its own
//! tier. So a process charges its own front only when every higher front,
//! wherever it waits, is blocked; if a higher front elsewhere can go, the
//! process wakes that front's process and waits for it. Two processes
//! never wait for each other: each waits only for a front that can go.
//!
//! That wait is bounded: a front that another process has found able to go
//! (`ready_ms[t]`) and that is still not charged
//! [`PASS_AFTER_NS`] later has a
//! process that does not run (stopped, frozen, starved). It is passed over
//! (see the registry's *Progress*): the region's order skips that process
//! until it runs again, so the tiers below, and the next front of its own
//! tier, go on at the bucket's rate; its front keeps its place and is
//! charged (or forced through) by its own process once it runs.
//!
//! # Waking
//!
//! A front is woken once when it becomes the region's front of its tier
//! (`notified[t]` holds the ticket last woken), so that it computes the
//! instant its tokens will be there and sleeps until then; the process that
//! charges a front moves on to the next one and wakes it in turn, and a
//! drain that defers to a front that can go wakes it (its turn). A rate or
//! capacity change, a refund or a clock change wakes every front again
//! (their instants moved). Threads sleep as [`park`](crate::region::park)
//! says: nothing sleeps on a timer but a front with an instant to wait for
//! (its tokens, its force-through, the bound on a front it defers to), a
//! deadline, and one keeper per process on the backstop. A front whose
//! process is dead is reaped before it is woken; after that a front is
//! probed at most once per reap interval region-wide (at once for a caller
//! that cannot wait, such as `try_consume`), so a dead front never holds
//! its tier back for longer than that.
//!
//! # Force-through, region-wide
//!
//! A front stalls from its arrival or from the last progress of its tier
//! (`progress_ms[t]`, region-wide), whichever is later, whatever holds it
//! back: the bucket, or fronts of other processes above it (a wait for a
//! front elsewhere is bounded, so a stalled front always comes to its own
//! process's drain). Because a tier has one front in the whole region and
//! the stall restarts with each progress, at most one consume per tier per
//! second goes through into debt, however many processes and child
//! limiters there are; and none goes into debt on top of debt.

use crate::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use crate::sync::{Mutex, MutexGuard};
use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::bucket::Hot;
use super::params::{ParamCache, Params};
use super::shared::SharedBucket;
use super::waiter::{
    could_go, step, Step, Waiter, Wakeups, CANCELLED, CORRUPT, GRANTED, GRANTED_FORCED, WAITING,
};
use crate::error::{Error, Result};
use crate::priority::LEVELS;
use crate::region::park::{wake_parked, Fronts, Keeps};
use crate::region::registry::{
    bound_now_ns, tier_bit, Registry, GATE_LEASED, GATE_TIERS, HELPER_BIT, PASS_AFTER_NS,
    REAP_INTERVAL_MS,
};
use crate::region::Region;
use crate::sys::clock::{monotonic_ms, Clock};
use crate::sys::fork::fork_generation;
use crate::sys::futex::WaitResult;

/// The process's keeper (and its helper) wakes at least this often to look
/// for dead processes (see [`park`](crate::region::park)).
#[cfg(not(shuttle))]
const BACKSTOP: Duration = Duration::from_millis(REAP_INTERVAL_MS);
/// Under the model checker the reap interval is 0; the keeper still sleeps
/// between drains (a zero nap would make its wait loop spin).
#[cfg(shuttle)]
const BACKSTOP: Duration = Duration::from_millis(1);

/// [`PASS_AFTER_NS`] in the ms of the `ready_ms` stamps.
const PASS_AFTER_MS: u32 = (PASS_AFTER_NS / 1_000_000) as u32;

/// The bound clock in ms, mod 2³², never 0 (0 marks "not yet").
fn bound_ms() -> u32 {
    ((bound_now_ns() / 1_000_000) as u32).max(1)
}

/// What one drain found for this process's fronts.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Drained {
    /// Per tier: the instant (ns, region clock) this process's region front
    /// of that tier may go, if it is the region's front and blocked.
    pub until: [Option<u64>; LEVELS],
    /// A higher front in another process can go and goes first: this
    /// process's fronts below it wait for it until this instant
    /// ([`bound_now_ns`]), when it is passed over if it has not been charged.
    pub defer_until: Option<u64>,
}

#[derive(Debug, Default)]
struct Queues {
    tiers: [VecDeque<Arc<Waiter>>; LEVELS],
    /// Arrival (ms, mod 2³²) of each queued waiter's front-time, by ticket
    /// order: the front's is published.
    arrivals: [VecDeque<u32>; LEVELS],
}

/// This process's side of a shared limiter root.
#[derive(Debug)]
pub(crate) struct LimRoot {
    bucket: SharedBucket,
    queues: Mutex<Queues>,
    async_waiting: AtomicU32,
    helper_running: AtomicBool,
    fork_gen: u64,
    /// This process's validated copy of the region's parameters (the
    /// consume fast path's read, see [`ParamCache`]).
    params_cache: ParamCache,
    /// Parking: the fronts' marks, which are async, the keeper (see
    /// [`park`](crate::region::park)).
    fronts: Fronts,
}

impl LimRoot {
    /// The process's root for `region`, binding it first if needed
    /// (`rate`: see [`SharedBucket::bind`]).
    pub fn bind(region: &Region, rate: Option<(u64, u64)>) -> Result<Arc<LimRoot>> {
        let bucket = SharedBucket::bind(region, rate)?;
        let map = bucket.mapping().clone();
        let mut cache = map.object_state();
        if let Some(root) = cache
            .as_ref()
            .and_then(Weak::upgrade)
            .and_then(|a| a.downcast::<LimRoot>().ok())
        {
            if root.fork_gen == fork_generation() {
                return Ok(root);
            }
        }
        let root = Arc::new(LimRoot {
            bucket,
            queues: Mutex::new(Queues::default()),
            async_waiting: AtomicU32::new(0),
            helper_running: AtomicBool::new(false),
            fork_gen: {
                let _ = crate::sys::fork::install_atfork_handler();
                fork_generation()
            },
            params_cache: ParamCache::default(),
            fronts: Fronts::default(),
        });
        let any: Arc<dyn std::any::Any + Send + Sync> = root.clone();
        *cache = Some(Arc::downgrade(&any));
        Ok(root)
    }

    /// The region's parameters now in the fast path's form, validated,
    /// through this process's copy (the fast paths' read).
    #[inline(always)]
    pub fn hot_params(&self) -> Result<Hot> {
        self.params_cache.hot(self.bucket.params())
    }

    /// The consume's first look at the region's parameters, for a charge
    /// of `n`: `(v, top)` at TSC reading `tick` through this process's
    /// copy, calling nothing; `None` where [`hot_params`](Self::hot_params)
    /// would read the block, and where `ParamCache::look` declines.
    #[inline(always)]
    pub fn look_params(&self, tick: u64, n: u64) -> Option<(u64, u64)> {
        self.params_cache.look(self.bucket.params(), tick, n)
    }

    /// The region side.
    #[inline(always)]
    pub fn bucket(&self) -> &SharedBucket {
        &self.bucket
    }

    #[inline]
    fn reg(&self) -> &Registry {
        self.bucket.reg()
    }

    fn lock(&self) -> MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True when this root was bound before a fork (it belongs to the parent).
    pub fn forked(&self) -> bool {
        self.fork_gen != fork_generation()
    }

    /// True if nobody waits at all, anywhere.
    #[inline(always)]
    pub fn nobody_waits(&self) -> bool {
        self.reg().gate() & GATE_TIERS == 0
    }

    // ---- queueing ------------------------------------------------------------

    /// Queues a consume of `n` at `tier` and drains (it may be charged at
    /// once).
    pub fn enqueue(&self, n: u64, tier: usize, is_async: bool) -> Arc<Waiter> {
        let mut out = Wakeups::default();
        let w = {
            let mut q = self.lock();
            let ticket = self.reg().take_ticket(tier);
            let w = Arc::new(Waiter::new(n, tier, ticket, is_async));
            if is_async {
                self.async_waiting.fetch_add(1, Ordering::SeqCst);
            }
            q.tiers[tier].push_back(w.clone());
            q.arrivals[tier].push_back(monotonic_ms() as u32);
            self.republish(&q, tier, &mut out);
            self.drain(&mut q, &mut out, false);
            w
        };
        self.wake(out);
        w
    }

    /// Publishes `tier`'s count and front (under the lock) and keeps the
    /// front's parking mark in step (see the scheduler's twin in
    /// `scheduler/root.rs`): a new front is woken to move to the region
    /// word, the helper told when an async waiter becomes a front.
    fn republish(&self, q: &Queues, tier: usize, out: &mut Wakeups) {
        match (q.tiers[tier].front(), q.arrivals[tier].front()) {
            (Some(w), Some(&at)) => self.reg().publish(
                tier,
                q.tiers[tier].len() as u32,
                w.ticket,
                at,
                w.n.min(u64::from(u32::MAX)) as u32,
                None,
            ),
            _ => self.reg().publish(tier, 0, 0, 0, 0, None),
        }
        let to = self.fronts.front_is(tier, q.tiers[tier].front());
        if let Some(w) = to.waiter {
            out.parked.push(w.clone());
        }
        out.helper |= to.helper;
    }

    /// Takes the waiter at `pos` of `tier`'s queue out (under the lock):
    /// publication, the new front's mark, the keeper role (handed to another
    /// front: the new front of this tier is woken anyway; else the highest
    /// other one is).
    fn take_out(
        &self,
        q: &mut Queues,
        tier: usize,
        pos: usize,
        out: &mut Wakeups,
    ) -> Option<Arc<Waiter>> {
        let w = q.tiers[tier].remove(pos)?;
        q.arrivals[tier].remove(pos);
        if w.is_async {
            self.async_waiting.fetch_sub(1, Ordering::SeqCst);
        }
        self.republish(q, tier, out);
        let fronts = std::array::from_fn(|t| q.tiers[t].front());
        if let Some(f) = self.fronts.left(&w, tier, fronts) {
            out.parked.push(f.clone());
        }
        Some(w)
    }

    /// `w` claimed the keeper role after it had left its queue (see
    /// [`Fronts::keeps`]): hands the role on, under the lock.
    #[cold]
    fn lapse_keeper(&self, w: &Arc<Waiter>) {
        let mut out = Wakeups::default();
        {
            let q = self.lock();
            let fronts = std::array::from_fn(|t| q.tiers[t].front());
            if let Some(f) = self.fronts.lapse(w, fronts) {
                out.parked.push(f.clone());
            }
        }
        self.wake(out);
    }

    fn pop_front(&self, q: &mut Queues, tier: usize, out: &mut Wakeups) -> Option<Arc<Waiter>> {
        self.take_out(q, tier, 0, out)
    }

    /// Blocks until `w` is charged (`Ok(forced)`), the bucket is found
    /// corrupt, or the deadline passes (its place is removed).
    ///
    /// The thread sleeps where [`park`](crate::region::park) says, without a
    /// timeout unless it has an instant to wait for: as the region's front
    /// of its tier, the instant its tokens are there (or it is forced
    /// through), or the instant a higher front elsewhere that can go is
    /// passed over if not charged by then; its deadline; and, for the one
    /// keeper per process, the backstop.
    pub fn wait(&self, w: &Arc<Waiter>, deadline: Option<Instant>) -> Result<bool> {
        let reg = self.reg();
        loop {
            let seqs = w.park.seqs(reg);
            if let Some(r) = self.outcome(w) {
                return r;
            }
            let mut nap: Option<Duration> = None;
            let at_most = |nap: &mut Option<Duration>, d: Duration| {
                *nap = Some(nap.map_or(d, |n| n.min(d)));
            };
            if let Some(d) = deadline {
                let now = Instant::now();
                if now >= d {
                    return self.cancel(w);
                }
                at_most(&mut nap, d - now);
            }
            let (drained, clock) = self.drain_now();
            if w.state() != WAITING {
                continue;
            }
            if w.park.is_front() && self.is_my_region_front(w) {
                if let Some(until) = drained.until[w.tier] {
                    at_most(
                        &mut nap,
                        Duration::from_nanos(until.saturating_sub(clock.now_ns())),
                    );
                } else if let Some(d) = drained.defer_until {
                    at_most(
                        &mut nap,
                        Duration::from_nanos(d.saturating_sub(bound_now_ns())),
                    );
                }
            }
            let keeper = match self.fronts.keeps(w) {
                Keeps::Yes => true,
                Keeps::No => false,
                Keeps::Lapsed => {
                    self.lapse_keeper(w);
                    continue;
                }
            };
            let backstop = keeper && nap.is_none_or(|n| n > BACKSTOP);
            if backstop {
                nap = Some(BACKSTOP);
            }
            if nap.is_some_and(|n| n.is_zero()) {
                continue;
            }
            if let Clock::Tsc(c) = clock {
                self.check_clock(&c);
            }
            if w.park.sleep(reg, seqs, w.tier, nap) == WaitResult::TimedOut && backstop {
                let _ = reg.maybe_reap(&mut |_, _| {});
            }
        }
    }

    /// Per tier, the region's front's stall in ~100 ms ticks, as the
    /// in-process levels count it: from the front's arrival or the tier's
    /// last progress (`progress_ms`, region-wide), whichever is later, the
    /// instant the drain's force-through rule measures from (0 where no
    /// process publishes a front).
    pub fn front_stall_ticks(&self) -> [u64; LEVELS] {
        let reg = self.reg();
        let st = self.bucket.state();
        let now_ms = monotonic_ms() as u32;
        std::array::from_fn(|tier| {
            reg.front(tier, |_| true).map_or(0, |f| {
                let progress = st.progress_ms[tier].load(Ordering::SeqCst);
                stall_ticks(now_ms, later_ms(f.cap, progress))
            })
        })
    }

    fn is_my_region_front(&self, w: &Waiter) -> bool {
        self.reg()
            .front(w.tier, |_| true)
            .is_some_and(|f| f.idx == self.reg().me().idx && f.ticket == w.ticket)
    }

    /// The result of a finished waiter.
    pub fn outcome(&self, w: &Waiter) -> Option<Result<bool>> {
        match w.state() {
            WAITING => None,
            GRANTED => Some(Ok(false)),
            GRANTED_FORCED => Some(Ok(true)),
            CANCELLED => Some(Err(Error::Timeout)),
            _ => Some(Err(super::corrupt_error(
                w.corrupt[0].load(Ordering::Relaxed),
                w.corrupt[1].load(Ordering::Relaxed),
            ))),
        }
    }

    /// Removes a waiter (timeout, dropped future) and passes its turn on,
    /// unless it was charged first: then `Ok(forced)`.
    pub fn cancel(&self, w: &Arc<Waiter>) -> Result<bool> {
        let mut out = Wakeups::default();
        let r = {
            let mut q = self.lock();
            if let Some(r) = self.outcome(w) {
                return r;
            }
            let tier = w.tier;
            if let Some(pos) = q.tiers[tier].iter().position(|x| Arc::ptr_eq(x, w)) {
                self.take_out(&mut q, tier, pos, &mut out);
                if pos == 0 {
                    // The tier's front left: the next one starts afresh.
                    self.bucket.state().progress_ms[tier]
                        .store(monotonic_ms() as u32, Ordering::SeqCst);
                }
            }
            w.state.store(CANCELLED, Ordering::Release);
            self.drain(&mut q, &mut out, false);
            Err(Error::Timeout)
        };
        self.wake(out);
        r
    }

    // ---- draining ------------------------------------------------------------

    /// Drains under the lock and wakes what it served. Returns what it found
    /// for this process's fronts and the clock it read.
    pub fn drain_now(&self) -> (Drained, Clock) {
        self.drain_with(false)
    }

    /// Like [`drain_now`](Self::drain_now), checking the liveness of every
    /// other process's front it meets (for a caller that cannot wait).
    pub fn drain_eager(&self) -> (Drained, Clock) {
        self.drain_with(true)
    }

    fn drain_with(&self, eager: bool) -> (Drained, Clock) {
        let mut out = Wakeups::default();
        let r = {
            let mut q = self.lock();
            self.drain(&mut q, &mut out, eager)
        };
        self.wake(out);
        r
    }

    fn wake(&self, mut out: Wakeups) {
        let reg = self.reg();
        if !out.parked.is_empty() {
            wake_parked(reg, out.parked.iter().map(|w| (&w.park, w.tier)));
        }
        if out.helper {
            reg.wake(reg.me().idx, HELPER_BIT);
        }
        out.wake_local();
    }

    /// A cluster lease's deadline has passed ([`Registry::lapse_due`]): the
    /// rate and burst come down to the safe ones if they are above (one
    /// parameter change, the balance kept up to the safe burst), and every
    /// front's instant is recomputed. Idempotent; cold (called only while
    /// the gate has `GATE_LEASED`).
    #[cold]
    #[inline(never)]
    pub fn lapse_if_due(&self) {
        let Some((safe, burst)) = self.reg().lapse_due() else {
            return;
        };
        let max = u64::from(u32::MAX).min(super::MAX_TOKENS_PER_SECOND);
        let safe = safe.clamp(1, max) as u32;
        let burst = burst.clamp(1, max) as u32;
        let Ok(p) = self.bucket.params().load() else {
            return;
        };
        if p.gcra.rate() <= u64::from(safe) && p.gcra.cap() <= u64::from(burst) {
            return;
        }
        let tat = &self.bucket.state().tat;
        // The deadline is read again on every attempt to publish: a renewal
        // or the lease's end publishes its own parameters after moving the
        // deadline, so an attempt that loses the race to them runs again,
        // finds the lease no longer due and leaves their level alone.
        let _ = self.bucket.update_params(|p| {
            if self.reg().lapse_due().is_none() {
                return p;
            }
            Params {
                gcra: p.gcra.recapped(
                    tat,
                    p.clock.now_ns(),
                    (p.gcra.rate() as u32).min(safe),
                    (p.gcra.cap() as u32).min(burst),
                ),
                ..p
            }
        });
        self.fronts_moved();
        let reg = self.reg();
        for idx in reg.waiting_processes().filter(|&i| i != reg.me().idx) {
            reg.wake(idx, crate::sys::futex::BITSET_ALL);
        }
    }

    /// The fast path's gate test failed (`g`: the gate it read; `mask`: the
    /// tiers it may not pass): checks a lease's deadline if the region is
    /// leased; true if no tier of `mask` waits.
    #[cold]
    #[inline(never)]
    pub fn open_slow(&self, g: u64, mask: u64) -> bool {
        // A deadline clearly ahead (by the coarse clock) needs no precise
        // clock read; near or past it, the lapse check reads one.
        if g & GATE_LEASED != 0 && !self.reg().lease_clearly_in_force() {
            self.lapse_if_due();
        }
        g & mask == 0
    }

    /// `try_consume`'s gate test failed (`g`: the gate it read): checks a
    /// lease's deadline if the region is leased, and if anything waits,
    /// drains eagerly (a caller that cannot wait reaps a dead front at
    /// once); true if nothing waits after that.
    #[cold]
    #[inline(never)]
    pub fn try_open_slow(&self, g: u64) -> bool {
        if g & GATE_LEASED != 0 {
            self.open_slow(g, 0);
        }
        if !self.nobody_waits() {
            self.drain_eager();
        }
        self.nobody_waits()
    }

    /// The gate word.
    #[inline(always)]
    pub fn gate(&self) -> u64 {
        self.reg().gate()
    }

    /// The bucket or its parameters changed under the fronts (a rate or
    /// capacity change, a refund): every region front's instant may have
    /// moved, so each is woken again by the next drain to compute its own.
    pub fn fronts_moved(&self) {
        for n in &self.bucket.state().notified {
            n.store(0, Ordering::SeqCst);
        }
    }

    /// The region-wide drain (see the module docs).
    fn drain(&self, q: &mut Queues, out: &mut Wakeups, eager: bool) -> (Drained, Clock) {
        let mut found = Drained::default();
        if self.reg().gate() & GATE_LEASED != 0 {
            self.lapse_if_due();
        }
        let params = match self.bucket.params().load() {
            Ok(p) => p,
            Err(_) => {
                // A scribbled parameter block: fail this process's waiters
                // rather than leave them waiting on garbage.
                for tier in 0..LEVELS {
                    while let Some(w) = self.pop_front(q, tier, out) {
                        w.corrupt[0].store(u64::MAX, Ordering::Relaxed);
                        w.finish(CORRUPT, out, true);
                    }
                }
                return (found, Clock::Monotonic);
            }
        };
        let (g, clock) = (params.gcra, params.clock);
        let st = self.bucket.state();
        let reg = self.reg();
        let me = reg.me().idx;
        reg.progress();
        'tiers: for tier in (0..LEVELS).rev() {
            for _ in 0..1024 {
                if reg.gate() & (1 << tier) == 0 {
                    continue 'tiers;
                }
                let Some(f) = reg.front(tier, |_| true) else {
                    // A bit nobody's publication backs: recompute it.
                    reg.refresh_tier(tier);
                    continue 'tiers;
                };
                let now = clock.now_ns();
                let now_ms = monotonic_ms() as u32;
                let progress = st.progress_ms[tier].load(Ordering::SeqCst);
                // `cap` carries the front's arrival (ms) for a limiter.
                let since_ms = later_ms(f.cap, progress);
                let stalled_ns = u64::from(now_ms.wrapping_sub(since_ms).min(1 << 30)) * 1_000_000;
                let since = now.saturating_sub(stalled_ns);
                if f.idx == me {
                    let Some(w) = q.tiers[tier]
                        .front()
                        .filter(|w| w.ticket == f.ticket)
                        .cloned()
                    else {
                        self.republish(q, tier, out); // our publication lagged
                        continue;
                    };
                    match step(&g, &st.tat, w.n, now, since) {
                        Step::Charged(forced) => {
                            self.pop_front(q, tier, out);
                            st.progress_ms[tier].store(now_ms, Ordering::SeqCst);
                            self.bucket.counters().completed[tier].fetch_add(1, Ordering::Relaxed);
                            if forced {
                                st.forced.fetch_add(1, Ordering::Relaxed);
                            }
                            let state = if forced { GRANTED_FORCED } else { GRANTED };
                            w.finish(state, out, true);
                        }
                        Step::Wait(until) => {
                            found.until[tier] = Some(until);
                            // A new front of ours: wake its thread (once) so
                            // that it sleeps until its own instant.
                            let tag = f.ticket.wrapping_add(1);
                            if st.notified[tier].swap(tag, Ordering::SeqCst) != tag {
                                out.add(&w, true);
                            }
                            continue 'tiers; // blocked: blocks only its own tier
                        }
                        Step::Corrupt(tat, v) => {
                            self.pop_front(q, tier, out);
                            w.corrupt[0].store(tat, Ordering::Relaxed);
                            w.corrupt[1].store(v, Ordering::Relaxed);
                            w.finish(CORRUPT, out, true);
                        }
                    }
                    continue;
                }
                // Another process's front: trusted only while its process
                // lives (checked when it first becomes the front, when the
                // caller cannot wait, and at most once per reap interval
                // otherwise).
                let goes = could_go(&g, &st.tat, u64::from(f.need), now, since);
                let tag = f.ticket.wrapping_add(1);
                let first = st.notified[tier].load(Ordering::SeqCst) != tag;
                if (first || eager || reg.probe_due(REAP_INTERVAL_MS * 1_000_000))
                    && !reg.alive(f.idx)
                {
                    let _ = reg.reap(&mut |_, _| {});
                    continue;
                }
                if first {
                    st.ready_ms[tier].store(0, Ordering::SeqCst);
                    st.notified[tier].store(tag, Ordering::SeqCst);
                    reg.wake(f.idx, tier_bit(tier));
                }
                if goes {
                    // It goes before everything below it, within the bound:
                    // a front that could go for that long and was not
                    // charged is passed over (alive is not progress); its
                    // process keeps its place and charges it when it runs.
                    let now_ms = bound_ms();
                    let since = match st.ready_ms[tier].load(Ordering::SeqCst) {
                        0 => match st.ready_ms[tier].compare_exchange(
                            0,
                            now_ms,
                            Ordering::SeqCst,
                            Ordering::SeqCst,
                        ) {
                            Ok(_) => now_ms,
                            Err(cur) => cur,
                        },
                        t => t,
                    };
                    let waited = now_ms.wrapping_sub(since);
                    if (PASS_AFTER_MS..(1 << 31)).contains(&waited) {
                        reg.pass_over(f.idx);
                        reg.wake_fronts(f.idx);
                        continue; // the next front of this tier, in order
                    }
                    if !first {
                        // Its turn: make sure its process looks (a wake to a
                        // process that is not running is only a word bump).
                        reg.wake(f.idx, tier_bit(tier));
                    }
                    found.defer_until = Some(
                        bound_now_ns()
                            + u64::from(PASS_AFTER_MS - waited.min(PASS_AFTER_MS)) * 1_000_000,
                    );
                    break 'tiers;
                }
                continue 'tiers;
            }
        }
        (found, clock)
    }

    /// At most every 100 ms per process: if the region's TSC calibration no
    /// longer agrees with `CLOCK_MONOTONIC`, move the region to it.
    fn check_clock(&self, c: &crate::sys::clock::TscClock) {
        if super::params::clock_check_due() && c.check_agrees().is_err() {
            self.bucket.demote_clock();
            self.fronts_moved();
        }
    }

    // ---- async -------------------------------------------------------------

    /// Makes sure the helper thread runs while async consumes wait here.
    pub fn ensure_helper(self: &Arc<Self>) {
        if self.helper_running.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("shmsched-lim-helper".into())
            .spawn(move || helper(weak));
        if spawned.is_err() {
            self.helper_running.store(false, Ordering::Release);
        }
    }
}

/// Whole ~100 ms ticks from `since_ms` to `now_ms` (both mod 2³²); a stamp
/// ahead of `now_ms` (another process's clock read a little later) is 0.
pub(crate) fn stall_ticks(now_ms: u32, since_ms: u32) -> u64 {
    let d = now_ms.wrapping_sub(since_ms);
    if d >= 1 << 31 {
        0
    } else {
        u64::from(d) * 1_000_000 / super::TICK_NS
    }
}

/// The later of two ms stamps taken mod 2³² (within 24 days of each other).
pub(crate) fn later_ms(a: u32, b: u32) -> u32 {
    if b.wrapping_sub(a) < (1 << 31) {
        b
    } else {
        a
    }
}

/// The helper loop: drains until no async consume waits here, sleeping on
/// the process's futex word until the next instant one of them may go.
fn helper(weak: Weak<LimRoot>) {
    loop {
        let Some(root) = weak.upgrade() else { return };
        if root.forked() {
            return;
        }
        if root.async_waiting.load(Ordering::SeqCst) == 0 {
            root.helper_running.store(false, Ordering::SeqCst);
            if root.async_waiting.load(Ordering::SeqCst) == 0
                || root.helper_running.swap(true, Ordering::SeqCst)
            {
                return;
            }
        }
        let reg = root.reg();
        let seq = reg.my_seq();
        let (d, clock) = root.drain_now();
        // The instants of the async fronts it stands in for, and of a
        // deferral; its own backstop otherwise.
        let bits = root.fronts.helper_bits();
        let now = clock.now_ns();
        let mut nap = BACKSTOP;
        for (t, u) in d.until.iter().enumerate() {
            if let Some(u) = u.filter(|_| root.fronts.async_at(1 << t)) {
                nap = nap.min(Duration::from_nanos(u.saturating_sub(now)));
            }
        }
        if let Some(u) = d.defer_until.filter(|_| root.fronts.async_at(u32::MAX)) {
            nap = nap.min(Duration::from_nanos(u.saturating_sub(bound_now_ns())));
        }
        if let Clock::Tsc(c) = clock {
            root.check_clock(&c);
        }
        if !nap.is_zero()
            && reg.sleep(seq, Some(nap), bits) == WaitResult::TimedOut
            && nap == BACKSTOP
        {
            let _ = reg.maybe_reap(&mut |_, _| {});
        }
    }
}
