//! A scheduler root shared through a region: the process side.
//!
//! Every process keeps its waiters of the shared root in its own per-tier
//! FIFO queues ([`SharedRoot`], one per process and region, shared by all
//! the process's handles) and publishes each tier's count and oldest ticket
//! in the region's [wait registry](crate::region::registry). The region's
//! queue is the merge of those, in ticket order.
//!
//! # Who gets freed capacity
//!
//! One waiter at a time, in any process, is the **designee**: the waiter
//! the next freed capacity is for. Whoever moves the queue forward (a
//! releaser, a new waiter, a waiter that wakes up: [`SharedRoot::serve`])
//! designates one when there is none, by the seed's policy applied to the
//! whole region: a lottery draw ([`lottery`](super::lottery)) over the
//! tiers backlogged anywhere picks the tier, then the tier's oldest waiter
//! (the smallest ticket) whose cap admits it is designated; a lottery pick
//! bypasses the cap, never the max. A designee of another process is
//! checked alive first, and woken (once) on its ticket's futex bit. Only
//! the designee's own process takes capacity for it: it marks the
//! designation `taking`, takes the cells, grants its waiter, clears the
//! designation, and designates the next one: one grant, one wake, passed on
//! down the queue. A waiter that leaves (timeout, drop, dispose) while
//! designated clears the designation and passes it on the same way.
//!
//! A non-lottery designee is replaced when a waiter of a higher tier that
//! its cap admits shows up (priority first), unless it is already taking.
//! A lottery pick is not: the lottery gives its tier a turn at the next
//! freed units it needs. It does not close the tiers above it: under a
//! strict hand-off a caller above the pick still takes what is free beyond
//! the pick's need, and a pick that does not come is passed over like any
//! designee (below).
//!
//! # Alive is not progress
//!
//! A designee of another process that was offered capacity (woken, or
//! taking) and has not taken it within
//! [`PASS_AFTER_NS`](crate::region::registry::PASS_AFTER_NS) (20 ms, one
//! reap interval), while what it needs is free, is passed over: if its
//! process is dead it is reaped; if it is alive (stopped, frozen, starved
//! of CPU) its process is marked passed over, the designation goes to the
//! next waiter in the region's order, and its waiter keeps its ticket. A
//! long weighted take renews the offer as it goes, so a take that runs is
//! never passed over. When that process runs again, its first serve lifts
//! the mark and ends a designation that went to a younger waiter of the
//! tier meanwhile, so its waiter is served in its place. Waiters of a
//! process passed over close neither `try_acquire` nor the fast path of the
//! tiers below them. Whoever moves the queue checks (releases on the same
//! turns as the fairness check below, waiters and `try_acquire` on every
//! serve, each process's keeper on its backstop).
//!
//! # Waiting costs nothing
//!
//! A blocked thread sleeps without a timeout (its deadline aside) where
//! [`park`](crate::region::park) says: its process's front of its tier on
//! the region word under its tier's bit (a designation wakes exactly it),
//! any other waiter on its own word (a grant by its own process wakes
//! exactly it, and it moves to the region word when it becomes the front).
//! One front per process, the keeper, sleeps with the backstop and does the
//! rounds: reaping, passing over, the lottery's draws for waiters only a
//! pick can admit. The helper thread wakes only for the tiers whose front
//! is async.
//!
//! # Barging, bounded (eventual fairness)
//!
//! A fresh acquire at priority `p` takes the fast path (one CAS on a free
//! cell) while no waiter above `p` waits anywhere and the gate is not
//! strict, even if waiters of `p` or below wait: like `parking_lot`'s
//! mutex, a releaser may take its slot straight back while the designee is
//! still waking up, which keeps a saturated pool running at the speed of
//! its fast path. The bound: once a designee has waited
//! [`FAIR_AFTER`] since it was designated, every fast path closes
//! ([`GATE_STRICT`]) until that designee is served. The designee closes
//! them itself when it wakes and finds its slot taken; a releaser looks at
//! the clock on one slow release in [`FAIR_CHECK_EVERY`] per thread, which
//! catches a woken designee that has not run yet without a clock read on
//! every release of a busy pool. So a waiter is overtaken by fresh
//! arrivals of its own or a lower priority for at most `FAIR_AFTER` (plus
//! its own wake-up, or a few releases) per designation ahead of it;
//! priority across tiers and the lottery's bound are kept.
//!
//! # Death
//!
//! A designee whose process died is found by the liveness check before any
//! designation, by a probe when it has been woken but has not come for free
//! capacity within [`PROBE_AFTER`] (at once for `try_acquire`), when it is
//! due to be passed over, and by the backstop wake of each process's keeper
//! ([`BACKSTOP`] = [`REAP_INTERVAL_MS`]), which reaps whether or not the
//! table is full: a dead process may hold a waiter back without filling it
//! (a designation it was taking for, a running count it left one too high
//! for a capped waiter). Reaping it clears its publication and its
//! designation, so nobody waits on a dead waiter for more than one reap
//! interval. A failed `try_acquire` is a slow path of the same kind: it
//! reaps (rate-limited region-wide, [`REAP_INTERVAL_MS`]), so a process
//! that only polls gets back what dead holders left within one reap
//! interval of its first failed try.
//!
//! # Waiters of several handles
//!
//! A process's handles may have different caps at one priority. Its queue
//! of a tier is one FIFO; what it publishes is its oldest waiter and, when
//! a later one has more room under its cap (its cap net of its need is
//! larger), the oldest of those with the most: its *alternate* (see the
//! registry). A designation may name either; the process then grants the
//! oldest of its waiters up to the one named whose cap admits it now, so a
//! waiter queued behind a capped one of another handle is served when its
//! own cap admits it, as it would be in another process.

use crate::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use crate::sync::{Mutex, MutexGuard};
use std::any::Any;
use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::lottery::pick_tier;
use super::shared::SharedSlots;
use super::waiter::{
    take_spare, Counters, Slots, Waiter, Wakeups, FAILED, GRANTED, SPARE_WAITERS, WAITING,
};
use super::{RawRelease, Serve};
use crate::error::{Error, Result};
use crate::few::Few;
use crate::priority::{Priority, LEVELS};
use crate::region::park::{wake_parked, Fronts, Keeps};
#[cfg(shuttle)]
use crate::region::registry::bound_now_ns;
use crate::region::registry::{
    tier_bit, Designee, Front, Registry, GATE_LEASED, GATE_SHRINKING, GATE_STRICT, GATE_TIERS,
    HELPER_BIT, REAP_INTERVAL_MS,
};
use crate::region::Region;
use crate::sys::clock::monotonic_ns;
use crate::sys::fork::fork_generation;
use crate::sys::futex::WaitResult;

/// The process's keeper (and its helper thread) wakes at least this often
/// to look for dead processes and designees that do not come (see
/// [`park`](crate::region::park)).
pub const BACKSTOP: Duration = Duration::from_millis(REAP_INTERVAL_MS);

/// How long a designee may be overtaken by fresh arrivals before every
/// fast path closes for it.
#[cfg(not(shuttle))]
pub const FAIR_AFTER: Duration = Duration::from_millis(1);

/// A woken designee that has not taken free capacity for this long is
/// checked for liveness.
#[cfg(not(shuttle))]
pub const PROBE_AFTER: Duration = Duration::from_millis(1);

/// Minimum time between two liveness probes of a stalled designee,
/// region-wide.
#[cfg(not(shuttle))]
const PROBE_INTERVAL_NS: u64 = 200_000;

// Under the model checker these delays are 0, so that what they decide
// depends on the schedule alone (not on how fast the host runs the model)
// and every decision they guard is taken as early as it can be.

/// How long a designee may be overtaken by fresh arrivals before every
/// fast path closes for it (model checker: at once).
#[cfg(shuttle)]
pub const FAIR_AFTER: Duration = Duration::ZERO;

/// A woken designee that has not taken free capacity for this long is
/// checked for liveness (model checker: at once).
#[cfg(shuttle)]
pub const PROBE_AFTER: Duration = Duration::ZERO;

/// Minimum time between two liveness probes of a stalled designee,
/// region-wide (model checker: none).
#[cfg(shuttle)]
const PROBE_INTERVAL_NS: u64 = 0;

/// Serve rounds per call: each round designates, grants or clears one
/// designation, so this bounds the work one caller does for others.
const SERVE_ROUNDS: usize = 64;

/// Tiers strictly above `tier`.
#[inline(always)]
pub fn above(tier: usize) -> u64 {
    GATE_TIERS & !((2u64 << tier) - 1)
}

/// Tiers at or above `tier`.
#[inline(always)]
pub fn at_or_above(tier: usize) -> u64 {
    GATE_TIERS & !((1u64 << tier) - 1)
}

#[derive(Debug, Default)]
struct RootQueues {
    tiers: [VecDeque<Arc<Waiter>>; LEVELS],
    /// Per tier: the distinct nets ([`net`]) of its waiters, each with how
    /// many waiters have it (a handful: one per cap and weight in use), so
    /// that a tier whose waiters all have one net publishes in O(1).
    nets: [Vec<(u32, u32)>; LEVELS],
    /// Waiters that left the queue, kept for reuse (at most
    /// [`SPARE_WAITERS`]): once their thread or future has let go of them,
    /// the next enqueue takes one back instead of allocating (see
    /// [`take_spare`]).
    spare: Vec<Arc<Waiter>>,
}

/// A waiter's cap net of its need: the most that may run beside it for it
/// to be admitted (`u32::MAX`: no cap below the max).
fn net(w: &Waiter, max: u32) -> u32 {
    if w.cap >= max {
        u32::MAX
    } else {
        w.cap.saturating_sub(w.need)
    }
}

impl RootQueues {
    fn count_net(&mut self, tier: usize, net: u32, add: bool) {
        let nets = &mut self.nets[tier];
        match nets.iter().position(|&(n, _)| n == net) {
            Some(i) if add => nets[i].1 += 1,
            Some(i) => {
                nets[i].1 -= 1;
                if nets[i].1 == 0 {
                    nets.swap_remove(i);
                }
            }
            None if add => nets.push((net, 1)),
            None => {}
        }
    }

    /// Queues `w` at the back of its tier.
    fn push(&mut self, w: Arc<Waiter>, max: u32) {
        let tier = w.tier();
        self.count_net(tier, net(&w, max), true);
        self.tiers[tier].push_back(w);
    }

    /// Takes the waiter at `pos` of `tier` out of its queue.
    fn take_at(&mut self, tier: usize, pos: usize, max: u32) -> Option<Arc<Waiter>> {
        let w = self.tiers[tier].remove(pos)?;
        self.count_net(tier, net(&w, max), false);
        Some(w)
    }

    /// The alternate `tier` publishes (see the registry's module docs): the
    /// oldest waiter of the largest net, if that net is larger than the
    /// front's; its ticket and net.
    fn alt(&self, tier: usize, max: u32) -> Option<(u32, u32)> {
        let dq = &self.tiers[tier];
        let front = net(dq.front()?, max);
        let best = self.nets[tier].iter().map(|&(n, _)| n).max()?;
        if best <= front {
            return None;
        }
        dq.iter()
            .find(|w| net(w, max) == best)
            .map(|w| (w.ticket, best))
    }
}

/// This process's side of a shared scheduler root (see the module docs).
#[derive(Debug)]
pub(crate) struct SharedRoot {
    slots: SharedSlots,
    queues: Mutex<RootQueues>,
    /// Async waiters queued here (the helper thread runs while > 0).
    async_waiting: AtomicU32,
    /// True while the helper thread runs.
    helper_running: AtomicBool,
    fork_gen: u64,
    /// Parking: the fronts' marks, which are async (the helper sleeps under
    /// their tiers' bits), the keeper (see [`park`](crate::region::park)).
    fronts: Fronts,
}

impl SharedRoot {
    /// The process's root for `region` (shared by every handle of this
    /// process bound through clones of one `Region`), binding it first if
    /// needed. `max`: see [`SharedSlots::bind`].
    pub fn bind(region: &Region, max: Option<u32>) -> Result<Arc<SharedRoot>> {
        let slots = SharedSlots::bind(region, max)?;
        let map = slots.mapping().clone();
        let mut cache = map.object_state();
        if let Some(root) = cache
            .as_ref()
            .and_then(Weak::upgrade)
            .and_then(|a: Arc<dyn Any + Send + Sync>| a.downcast::<SharedRoot>().ok())
        {
            if root.fork_gen == fork_generation() {
                return Ok(root);
            }
        }
        let root = Arc::new(SharedRoot {
            slots,
            queues: Mutex::new(RootQueues::default()),
            async_waiting: AtomicU32::new(0),
            helper_running: AtomicBool::new(false),
            fork_gen: {
                let _ = crate::sys::fork::install_atfork_handler();
                fork_generation()
            },
            fronts: Fronts::default(),
        });
        let any: Arc<dyn Any + Send + Sync> = root.clone();
        *cache = Some(Arc::downgrade(&any));
        Ok(root)
    }

    /// The region side.
    #[inline]
    pub fn slots(&self) -> &SharedSlots {
        &self.slots
    }

    #[inline]
    fn reg(&self) -> &Registry {
        self.slots.reg()
    }

    fn lock(&self) -> MutexGuard<'_, RootQueues> {
        // Nothing panics under this lock (wakers run after it); if something
        // ever did, the queues are still structurally valid.
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    // ---- taking and giving ----------------------------------------------

    /// Takes `need` cells if a waiter of `cap` at this moment may run:
    /// uncapped (cap ≥ max) with one CAS per cell; capped under the cap
    /// lock, against the exact running count.
    #[inline]
    pub fn take(&self, need: u32, cap: u32) -> Option<Slots> {
        if cap >= self.slots.max() {
            self.slots.take(need)
        } else {
            self.slots.take_capped(need, cap)
        }
    }

    /// [`take`](Self::take)'s first look (`SharedSlots::take_first_look`):
    /// uncapped only, calling nothing out of line; `None`, with nothing
    /// taken, where `take` would do more.
    #[inline(always)]
    pub fn take_first_look(&self, need: u32, cap: u32) -> Option<Slots> {
        if cap >= self.slots.max() {
            self.slots.take_first_look(need)
        } else {
            None
        }
    }

    /// [`take`](Self::take) on a slow path: while a cluster lease may hold
    /// the region above its safe level (`GATE_LEASED`), its deadline is
    /// checked first (by the coarse clock while it is clearly ahead, else
    /// by the precise one); past it the ceiling comes down to the safe
    /// level, and the take is capped by the ceiling against the exact
    /// running count (so a lowering that another process left half-done,
    /// stopped while it blocked cells, does not let anyone past the safe
    /// level).
    #[inline]
    pub fn admit(&self, need: u32, cap: u32) -> Option<Slots> {
        if self.reg().gate() & GATE_LEASED != 0 {
            return self.admit_leased(need, cap);
        }
        self.take(need, cap)
    }

    /// [`admit`](Self::admit) while `GATE_LEASED` is set (cold: the
    /// unleased paths stay as they were).
    #[cold]
    #[inline(never)]
    fn admit_leased(&self, need: u32, cap: u32) -> Option<Slots> {
        if !self.reg().lease_clearly_in_force() {
            if let Some(safe) = self.slots.lapse_if_due() {
                return self.take(need, cap.min(safe));
            }
        }
        self.take(need, cap)
    }

    /// Gives slots back and, if anyone waits, moves the queue on. While
    /// the region is above a lowered ceiling the cells go to the ceiling.
    #[inline]
    pub fn release(&self, slots: &Slots) {
        // Under the model checker a process dies by unwinding its threads,
        // which drops what they hold: a killed process gives nothing back
        // (its cells are the reaper's).
        #[cfg(shuttle)]
        if crate::sys::futex::model::my_process_dead() {
            return;
        }
        if self.reg().gate() & GATE_SHRINKING != 0 {
            self.slots.give_to_ceiling(slots);
        } else {
            self.slots.give(slots);
        }
        self.after_release();
    }

    /// Gives back the raw permit `tag` on cell `c` (see *Raw permits* in
    /// [`shared`](super::shared)) and, if that freed it, moves the queue on
    /// as [`release`](Self::release) does. The check is the give-back CAS
    /// itself (above a lowered ceiling, the CAS that takes the tag off
    /// before the cell goes to the ceiling): false, with nothing else done
    /// (no count, no wake), if the cell does not hold that raw permit.
    #[inline(always)]
    pub fn release_raw(&self, c: u32, tag: u32) -> bool {
        match self.release_raw_first_look(c, tag) {
            RawRelease::Released => true,
            RawRelease::Serve(serve) => {
                drop(serve);
                true
            }
            RawRelease::NotHeld => false,
            RawRelease::Declined => self.release_raw_to_ceiling(c, tag),
        }
    }

    /// [`release_raw`](Self::release_raw) but for what calls out of line:
    /// above a lowered ceiling it does nothing (`Declined`), and serving
    /// the queue is left to the [`Serve`] it hands back (see
    /// `Scheduler::release_raw_first_look`).
    #[inline(always)]
    pub fn release_raw_first_look(&self, c: u32, tag: u32) -> RawRelease<'_> {
        #[cfg(shuttle)]
        if crate::sys::futex::model::my_process_dead() {
            return RawRelease::Released;
        }
        if self.reg().gate() & GATE_SHRINKING != 0 {
            return RawRelease::Declined;
        }
        if !self.slots.give_raw(c, tag) {
            return RawRelease::NotHeld;
        }
        #[cfg(shuttle)]
        self.slots
            .mapping()
            .model_death_point("release: freed, nobody served yet");
        if self.serving_needed() {
            return RawRelease::Serve(Serve { root: self });
        }
        RawRelease::Released
    }

    /// A raw release while the region is above a lowered ceiling: the CAS
    /// that takes the tag off is the check, then the cell goes to the
    /// ceiling.
    #[cold]
    #[inline(never)]
    fn release_raw_to_ceiling(&self, c: u32, tag: u32) -> bool {
        if !self.slots.untag_raw(c, tag) {
            return false;
        }
        self.slots.give_to_ceiling(&Slots::one(c));
        self.after_release();
        true
    }

    /// What every release does once its cells are free: serve the queue
    /// (and the ceiling) if the gate says anyone may need it.
    #[inline(always)]
    fn after_release(&self) {
        #[cfg(shuttle)]
        self.slots
            .mapping()
            .model_death_point("release: freed, nobody served yet");
        if self.serving_needed() {
            self.release_slow();
        }
    }

    /// Whether a release whose cells are free now must serve the queue (or
    /// the ceiling): read after the cells are freed (see *Ordering and
    /// liveness* in the registry).
    #[inline(always)]
    fn serving_needed(&self) -> bool {
        self.reg().gate() & (GATE_TIERS | GATE_STRICT | GATE_SHRINKING) != 0
    }

    #[cold]
    #[inline(never)]
    pub(crate) fn release_slow(&self) {
        let reg = self.reg();
        if reg.gate() & GATE_SHRINKING != 0 {
            // The ceiling came down after this release read the gate: the
            // freed cell goes to it (if nobody took it meanwhile).
            self.slots.rebalance(false);
        }
        if let Some(d) = reg.designee() {
            // Someone is already at it, or a remote designee has been woken
            // and is not yet due for a fairness hand-off: nothing to do. The
            // clock (20 ns, as much as the whole pair) is read on one slow
            // release in FAIR_CHECK_EVERY per thread: a designee that finds
            // its slot taken closes the fast paths itself once it is due,
            // and this catches one that has not run since it was woken.
            // On the same turns it looks whether a designee that was
            // notified has come within the bound (a stopped process).
            if d.taking
                || (d.idx != reg.me().idx
                    && d.notified
                    && reg.gate() & GATE_STRICT == 0
                    && !(fair_check_turn() && (fair_due(reg) || reg.offer_overdue())))
            {
                return;
            }
        }
        self.serve_now(false);
    }

    // ---- queueing --------------------------------------------------------

    /// Queues a waiter (all checks done by the caller except `disposed`,
    /// which is tested under the lock) and moves the queue on; the waiter
    /// may come back already granted.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue(
        &self,
        disposed: &AtomicBool,
        priority: Priority,
        need: u32,
        cap: u32,
        via: Few<u64>,
        counters: &Arc<Counters>,
        is_async: bool,
    ) -> Result<Arc<Waiter>> {
        let tier = priority.index();
        let mut out = Wakeups::default();
        // A task a reused waiter still named, dropped after the lock.
        let mut stale_task = None;
        let w = {
            let mut q = self.lock();
            if disposed.load(Ordering::Acquire) {
                return Err(Error::Disposed);
            }
            let ticket = self.reg().take_ticket(tier);
            // A spare waiter nobody holds (see `take_spare`), else a new one.
            let mut via = Some(via);
            let reused = take_spare(&mut q.spare, |m| {
                let via = via.take().unwrap_or_default();
                m.reuse(priority, need, cap, ticket, via, counters, is_async);
                stale_task = m.reset_root_parts();
            });
            let w = match reused {
                Some(w) => w,
                None => Arc::new(Waiter::new(
                    priority,
                    need,
                    cap,
                    ticket,
                    via.take().unwrap_or_default(),
                    counters.clone(),
                    is_async,
                )),
            };
            w.counters.deferred(tier);
            if is_async {
                self.async_waiting.fetch_add(1, Ordering::SeqCst);
            }
            q.push(w.clone(), self.slots.max());
            if !is_async {
                // Its thread's first sleep uses these (see `wait`): the
                // serve below is the look before that sleep.
                w.park.note(self.reg());
            }
            self.republish(&q, tier, &mut out);
            self.serve(&mut q, &mut out, false);
            if !is_async {
                // Its thread is the caller, awake: it reads its state and
                // its front mark before it sleeps.
                out.skip_parked(&w);
            }
            w
        };
        drop(stale_task);
        self.wake(out);
        Ok(w)
    }

    /// Blocks until `w` is granted (its slots), failed (disposed) or the
    /// deadline passes (timeout; its place is removed).
    ///
    /// The thread sleeps without a timeout (its deadline aside) where
    /// [`park`](crate::region::park) says: on the region word as its tier's
    /// front, else on its own word. One front per process, the keeper,
    /// sleeps with the backstop instead and does the rounds when it fires.
    ///
    /// The first round uses the words noted when `w` was queued, before
    /// the serve of its enqueue: that serve was this round's look, and any
    /// change since that this thread must act on moved a word (its sleep
    /// returns at once, and the next round serves).
    pub fn wait(&self, w: &Arc<Waiter>, deadline: Option<Instant>) -> Result<Slots> {
        let reg = self.reg();
        let mut noted = w.park.take_note();
        loop {
            let first = noted.take();
            let served = first.is_some();
            let seqs = first.unwrap_or_else(|| w.park.seqs(reg));
            match w.state() {
                GRANTED => return Ok(w.take_slots()),
                FAILED => return Err(Error::Disposed),
                _ => {}
            }
            let left = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return self.cancel(w);
                    }
                    Some(d - now)
                }
                None => None,
            };
            if !served {
                self.serve_now(false);
                if w.state() != WAITING {
                    continue;
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
            let backstop = keeper && left.is_none_or(|l| l > BACKSTOP);
            let nap = if backstop { Some(BACKSTOP) } else { left };
            if w.park.sleep(reg, seqs, w.tier(), nap) == WaitResult::TimedOut && backstop {
                self.on_backstop();
            }
        }
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
                out.add_parked(f);
            }
        }
        self.wake(out);
    }

    /// The id of the waiter that keeps this process's backstop timer (0:
    /// none), for the model checker.
    #[cfg(shuttle)]
    pub fn model_keeper(&self) -> u64 {
        self.fronts.keeper_id()
    }

    /// A backstop wake: the keeper (or the helper) slept a whole backstop
    /// period, and what holds the queue back may be a dead process's: cells
    /// it held (a full table), a running count it left one too high (it died
    /// between its count and its cell: capped waiters are refused while the
    /// table is not full), or a designation it was taking for (which no
    /// other process ends). So reap, whether the table is full or not (at
    /// most once per reap interval, region-wide). A designee that was
    /// offered capacity and has not come is passed over by the serve that
    /// follows.
    fn on_backstop(&self) {
        if self.slots.maybe_reap() > 0 {
            self.serve_now(false);
        }
    }

    /// Removes a waiter whose deadline passed (or whose future was dropped)
    /// and passes its turn on, unless a grant beat it: then its slots come
    /// back as `Ok`.
    pub fn cancel(&self, w: &Arc<Waiter>) -> Result<Slots> {
        let mut out = Wakeups::default();
        let r = {
            let mut q = self.lock();
            match w.state() {
                GRANTED => return Ok(w.take_slots()),
                FAILED => return Err(Error::Disposed),
                _ => {}
            }
            self.remove(&mut q, w, true, &mut out);
            w.fail();
            self.serve(&mut q, &mut out, false);
            Err(Error::Timeout)
        };
        self.wake(out);
        // Its task's waker goes now, not when the spare waiter is next
        // reused (a waker holds its task alive). Nobody reuses the waiter
        // while the caller holds it.
        w.drop_task();
        r
    }

    /// Takes `w` out of its queue (under the lock): counters, publication,
    /// and a designation naming it.
    fn remove(&self, q: &mut RootQueues, w: &Arc<Waiter>, cancelled: bool, out: &mut Wakeups) {
        let tier = w.tier();
        let Some(pos) = q.tiers[tier].iter().position(|x| Arc::ptr_eq(x, w)) else {
            return;
        };
        self.take_out(q, tier, pos, cancelled, out);
        let reg = self.reg();
        if let Some(d) = reg.designee() {
            if d.idx == reg.me().idx && d.tier == tier && d.ticket == w.ticket && !d.taking {
                self.end_designation(&d);
            }
        }
    }

    /// Fails every queued waiter matching `pred` (dispose).
    pub fn fail_where(&self, pred: impl Fn(&Waiter) -> bool) {
        let mut out = Wakeups::default();
        {
            let mut q = self.lock();
            for tier in 0..LEVELS {
                let doomed: Vec<Arc<Waiter>> =
                    q.tiers[tier].iter().filter(|w| pred(w)).cloned().collect();
                for w in doomed {
                    self.remove(&mut q, &w, true, &mut out);
                    w.fail();
                    out.add_shared(&w);
                }
            }
            self.serve(&mut q, &mut out, false);
        }
        self.wake(out);
    }

    /// Takes the waiter at `pos` of `tier`'s queue out (under the lock):
    /// counters, publication, the new front's mark, the keeper role.
    fn take_out(
        &self,
        q: &mut RootQueues,
        tier: usize,
        pos: usize,
        cancelled: bool,
        out: &mut Wakeups,
    ) -> Option<Arc<Waiter>> {
        let w = q.take_at(tier, pos, self.slots.max())?;
        w.counters.left(tier, cancelled);
        if !cancelled {
            self.reg().count_served();
        }
        if w.is_async {
            self.async_waiting.fetch_sub(1, Ordering::SeqCst);
        }
        self.republish(q, tier, out);
        let fronts = std::array::from_fn(|t| q.tiers[t].front());
        if let Some(f) = self.fronts.left(&w, tier, fronts) {
            out.add_parked(f);
        }
        // Kept for a later enqueue: its thread or future still holds it and
        // lets go once it has seen its grant or failure.
        if q.spare.len() < SPARE_WAITERS {
            q.spare.push(w.clone());
        }
        Some(w)
    }

    /// Publishes `tier`'s count and front (under the lock) and keeps the
    /// front's parking mark in step: a waiter that just became the front is
    /// woken to move to the region word; the helper is told when an async
    /// waiter becomes a front.
    fn republish(&self, q: &RootQueues, tier: usize, out: &mut Wakeups) {
        let dq = &q.tiers[tier];
        match dq.front() {
            Some(w) => self.reg().publish(
                tier,
                dq.len() as u32,
                w.ticket,
                w.cap,
                w.need,
                q.alt(tier, self.slots.max()),
            ),
            None => self.reg().publish(tier, 0, 0, 0, 0, None),
        }
        let to = self.fronts.front_is(tier, dq.front());
        if let Some(w) = to.waiter {
            out.add_parked(w);
        }
        out.helper |= to.helper;
    }

    // ---- serving -----------------------------------------------------------

    /// Runs [`serve`](Self::serve) under the lock and wakes what it granted.
    pub fn serve_now(&self, eager_probe: bool) {
        let mut out = Wakeups::default();
        {
            let mut q = self.lock();
            self.serve(&mut q, &mut out, eager_probe);
        }
        self.wake(out);
    }

    fn wake(&self, mut out: Wakeups) {
        let reg = self.reg();
        if out.has_parked() {
            wake_parked(reg, out.parked().map(|w| (&w.park, w.tier())));
        }
        if out.helper {
            reg.wake(reg.me().idx, HELPER_BIT);
        }
        out.wake_tasks();
    }

    /// Passes over the designee `d` of another process: it was offered
    /// capacity [`PASS_AFTER_NS`](crate::region::registry::PASS_AFTER_NS)
    /// ago, its process is alive and has not come for it (stopped, frozen,
    /// starved of CPU). Its process is skipped by the region's order until
    /// it makes progress again; its waiter keeps its ticket, so it is
    /// served in its place once it runs again.
    ///
    /// Only a designation that still stands is passed over: `d` may be a
    /// read from before this thread was preempted, its waiter served since.
    /// Marking its process then (found by the model checker,
    /// `take_give_dispatch_max2_*`) left the mark on a process that had made
    /// progress, its other waiters skipped and asleep on other tiers' bits
    /// until its keeper's backstop. The mark comes first, so that nobody
    /// re-designates the stopped waiter in between, and is taken back if
    /// the designation moved.
    fn pass(&self, d: &Designee) {
        let reg = self.reg();
        let Some(mark) = reg.mark_passed(d.idx) else {
            return;
        };
        if !reg.swap_designee(d, None) {
            reg.unmark_passed(d.idx, mark);
            return;
        }
        reg.count_pass();
        reg.clear_strict();
        reg.wake_fronts(d.idx);
    }

    /// Whether free capacity would let designee `d` (its published front
    /// `f`) in now: what is free covers its need and, unless it is a
    /// lottery pick, its cap admits it.
    fn room_for(&self, d: &Designee, f: &Front) -> bool {
        self.slots.free() >= u64::from(f.need)
            && (d.lottery || f.cap >= self.slots.max() || (self.fits())(f.need, f.cap))
    }

    /// True if a take of `need` for a designee of this process would fail
    /// now for want of free cells (see
    /// [`fewer_free_cells_than`](SharedSlots::fewer_free_cells_than)),
    /// while no cluster lease is armed (a take then applies a due lapse)
    /// and no lowering of the ceiling is in progress. Asked only of tables
    /// of at most [`CANNOT_TAKE_MAX_CELLS`] cells: the answer reads every
    /// cell of a full table, where a take asks the running count
    /// (O(processes)); a larger table goes the take's way.
    fn cannot_take(&self, need: u32) -> bool {
        self.slots.max() <= CANNOT_TAKE_MAX_CELLS
            && self.reg().gate() & (GATE_LEASED | GATE_SHRINKING) == 0
            && self.slots.fewer_free_cells_than(need)
    }

    /// This process ran again after being passed over: a designation that
    /// went meanwhile to a younger waiter of a tier where this process has
    /// an older one goes back to the region's order (so that this process's
    /// waiter is served in its place). Lottery picks and takes in progress
    /// are left alone; higher tiers outrank as always.
    fn reclaim_place(&self, q: &RootQueues) {
        let reg = self.reg();
        let Some(d) = reg.designee() else { return };
        if d.taking || d.lottery || d.idx == reg.me().idx {
            return;
        }
        let fits = self.fits();
        let older = q.tiers[d.tier].front().is_some_and(|w| {
            reg.age(d.tier, w.ticket) > reg.age(d.tier, d.ticket) && fits(w.need, w.cap)
        });
        if older {
            self.end_designation(&d);
        }
    }

    fn end_designation(&self, d: &Designee) {
        if self.reg().swap_designee(d, None) {
            self.reg().clear_strict();
        }
    }

    /// Moves the region's queue forward as far as this process can (see the
    /// module docs). `eager_probe`: check a woken-but-absent designee's
    /// liveness at once (a non-blocking caller cannot wait for the probe).
    fn serve(&self, q: &mut RootQueues, out: &mut Wakeups, eager_probe: bool) {
        let reg = self.reg();
        let me = reg.me().idx;
        let now = Now::default();
        if reg.progress() {
            self.reclaim_place(q);
        }
        for _ in 0..SERVE_ROUNDS {
            let designee = reg.designee();
            // (Traces print only what was read: a read of the region is a
            // step of the model, which would change the replayed schedule.)
            #[cfg(shuttle)]
            crate::sys::futex::model::trace(format_args!("serve: designee {designee:?}"));
            let Some(d) = designee else {
                if reg.gate() & GATE_TIERS == 0 {
                    reg.clear_strict();
                    return;
                }
                let Some(d) = self.choose() else {
                    reg.clear_strict();
                    return;
                };
                if d.idx != me && !reg.alive(d.idx) {
                    let _ = self.slots.reap();
                    now.forget();
                    continue;
                }
                if reg.designate_at(d, now.ns()) && !reg.still_front(&d) {
                    // It left between the look and the designation.
                    self.end_designation(&d);
                }
                continue;
            };
            if d.taking {
                // Its process is taking cells for it now; unless that process
                // died in the middle (then it is reaped, which frees what it
                // took and clears the designation), or stopped in the middle
                // for longer than the bound while capacity it could use is
                // free, or after its waiter left (granted, the designation
                // not ended yet): then it is passed over (if it took cells,
                // it grants them when it runs again).
                if d.idx != me {
                    if (eager_probe || reg.probe_due_at(PROBE_INTERVAL_NS, now.ns()))
                        && !reg.alive(d.idx)
                    {
                        let _ = self.slots.reap();
                        now.forget();
                        continue;
                    }
                    if reg.offer_overdue_at(now.bound_ns())
                        && reg
                            .front_of(d.idx, d.tier)
                            .is_none_or(|f| f.ticket != d.ticket || self.room_for(&d, &f))
                    {
                        self.pass(&d);
                        continue;
                    }
                }
                return;
            }
            if !d.lottery && self.outranked(&d) {
                self.end_designation(&d);
                continue;
            }
            if d.idx == me {
                let dq = &q.tiers[d.tier];
                let Some(named) = dq.iter().position(|w| w.ticket == d.ticket) else {
                    // Our waiter left (or our publication is stale): pass on.
                    self.end_designation(&d);
                    self.republish(q, d.tier, out);
                    continue;
                };
                // A lottery pick is the waiter named. Otherwise the oldest
                // of ours up to the one named whose cap admits it now: the
                // one named (our front, or our alternate when the front's
                // cap held it back), or one older than it that its cap
                // admits by now.
                let fits = self.fits();
                let pos = if d.lottery {
                    Some(named)
                } else {
                    dq.iter().take(named + 1).position(|w| fits(w.need, w.cap))
                };
                let Some(pos) = pos else {
                    // Its cap does not admit it now (units freed since it was
                    // designated went to others): the designation goes to the
                    // oldest waiter whose cap does; it is designated again
                    // when its cap admits it.
                    self.end_designation(&d);
                    continue;
                };
                let w = dq[pos].clone();
                let cap = if d.lottery { u32::MAX } else { w.cap };
                if self.cannot_take(w.need) {
                    // No free cell for it: a take would fail (the common
                    // case right after this waiter queued behind a holder).
                    // Stay designated, not notified, as a failed take below
                    // leaves it, without the offer, the `taking` swaps and
                    // the scans. A release that read the designation as
                    // notified woke nobody; it freed before that read, and
                    // this looks at the cells after the swap: one sees the
                    // other. Not notified, nothing is swapped: a release
                    // that frees after the look above reads this
                    // designation, not notified, and serves it.
                    if d.notified {
                        let back = Designee {
                            notified: false,
                            ..d
                        };
                        if !reg.swap_designee(&d, Some(&back)) {
                            continue;
                        }
                    }
                    if fair_due_at(reg, now.ns()) {
                        reg.set_strict();
                    }
                    if d.notified
                        && !self.slots.fewer_free_cells_than(w.need)
                        && self.fits()(w.need, cap)
                    {
                        continue;
                    }
                    return;
                }
                let taking = Designee { taking: true, ..d };
                reg.offer_at(now.bound_ns());
                if !reg.swap_designee(&d, Some(&taking)) {
                    continue;
                }
                #[cfg(shuttle)]
                self.slots.mapping().model_death_point("designee taking");
                match self.admit(w.need, cap) {
                    Some(slots) => {
                        #[cfg(shuttle)]
                        self.slots
                            .mapping()
                            .model_death_point("taken for a waiter, not granted");
                        self.take_out(q, d.tier, pos, false, out);
                        w.grant(slots);
                        out.add_shared(&w);
                        self.end_designation(&taking);
                        continue;
                    }
                    None => {
                        // No room now (taken by a fresh arrival, or capped):
                        // stay designated, and let the next release wake us.
                        let back = Designee {
                            taking: false,
                            notified: false,
                            ..d
                        };
                        let back_in = reg.swap_designee(&taking, Some(&back));
                        if fair_due_at(reg, now.ns()) {
                            reg.set_strict();
                        }
                        // A release that read the designation while it was
                        // taking left what it freed to this take and woke
                        // nobody; if it freed after the take looked, that
                        // room is there now. The release frees before it
                        // reads the designation, and this looks after the
                        // swap above: one of the two sees the other, so
                        // either that release serves the designee or this
                        // takes again.
                        if back_in
                            && self.slots.free() >= u64::from(w.need)
                            && self.fits()(w.need, cap)
                        {
                            continue;
                        }
                        return;
                    }
                }
            }
            // Another process's designee.
            let Some(front) = reg.published(d.idx, d.tier, d.ticket) else {
                self.end_designation(&d);
                continue;
            };
            if !d.lottery && front.cap < self.slots.max() && !(self.fits())(front.need, front.cap) {
                // Its cap does not admit it now: pass the designation on.
                self.end_designation(&d);
                continue;
            }
            let waited = now.ns().saturating_sub(reg.designated_ns());
            if d.notified
                && (eager_probe || waited >= PROBE_AFTER.as_nanos() as u64)
                && !self.slots.full()
                && reg.probe_due_at(PROBE_INTERVAL_NS, now.ns())
                && !reg.alive(d.idx)
            {
                let _ = self.slots.reap();
                now.forget();
                continue;
            }
            // Alive is not progress: offered capacity it could use and not
            // come within the bound, it is passed over (dead: reaped).
            #[cfg(shuttle)]
            crate::sys::futex::model::trace(format_args!("serve: remote front {front:?}"));
            if d.notified && reg.offer_overdue_at(now.bound_ns()) && self.room_for(&d, &front) {
                if !reg.alive(d.idx) {
                    let _ = self.slots.reap();
                    now.forget();
                } else {
                    self.pass(&d);
                }
                continue;
            }
            if waited >= fair_after_ns() {
                reg.set_strict();
            }
            if !d.notified {
                let n = Designee {
                    notified: true,
                    ..d
                };
                reg.offer_at(now.bound_ns());
                if !reg.swap_designee(&d, Some(&n)) {
                    continue;
                }
                reg.wake(d.idx, tier_bit(d.tier));
            }
            return;
        }
    }

    /// The next designee by the region-wide policy, if any waiter could run
    /// now: lottery over the backlogged tiers, then the oldest admissible
    /// front of the picked tier.
    fn choose(&self) -> Option<Designee> {
        let reg = self.reg();
        let backlog = (reg.gate() & GATE_TIERS) as u8;
        if backlog == 0 {
            return None;
        }
        let fits = self.fits();
        let mut admissible = 0u8;
        let mut fronts = [None; LEVELS];
        for (t, slot) in fronts.iter_mut().enumerate() {
            if backlog & (1 << t) != 0 {
                *slot = reg.front(t, |f| fits(f.need, f.cap));
                if slot.is_some() {
                    admissible |= 1 << t;
                } else if reg.front(t, |_| true).is_none() {
                    // A tier bit nobody's publication backs (a waiter just
                    // left, or a scribbled gate): recompute it.
                    reg.refresh_tier(t);
                }
            }
        }
        let pick = pick_tier(reg.draw(), reg.lottery_enabled(), backlog, admissible)?;
        let f = if pick.lottery {
            reg.front(pick.tier, |f| fits(f.need, u32::MAX))?
        } else {
            fronts[pick.tier]?
        };
        Some(Designee {
            idx: f.idx,
            tier: pick.tier,
            ticket: f.ticket,
            lottery: pick.lottery,
            notified: false,
            taking: false,
        })
    }

    /// True if a waiter above `d`'s tier, admissible now, waits somewhere.
    fn outranked(&self, d: &Designee) -> bool {
        let reg = self.reg();
        let higher = reg.gate() & above(d.tier);
        if higher == 0 {
            return false;
        }
        let fits = self.fits();
        (d.tier + 1..LEVELS)
            .filter(|t| higher & (1 << t) != 0)
            .any(|t| reg.front(t, |f| fits(f.need, f.cap)).is_some())
    }

    /// Whether a waiter needing `need` under `cap` may be designated now. An
    /// uncapped one always may (its take waits for free cells); a capped one
    /// only if the running count leaves room under its cap, which makes
    /// the region count (see `shared.rs`). The count is read once per use.
    fn fits(&self) -> impl Fn(u32, u32) -> bool + '_ {
        let max = self.slots.max();
        let running = std::cell::OnceCell::new();
        move |need: u32, cap: u32| {
            if cap >= max {
                return true;
            }
            let r = *running.get_or_init(|| self.slots.running());
            r + u64::from(need) <= u64::from(cap)
        }
    }

    // ---- non-blocking ------------------------------------------------------

    /// `try_acquire` at the root: takes `need` only if no waiter at `tier` or
    /// above waits anywhere (after reaping dead ones; waiters of processes
    /// passed over do not count) and capacity is free. A take that finds no
    /// room reaps dead holders (if a scan is due, region-wide) and takes
    /// again if that freed anything.
    pub fn try_take(&self, tier: usize, need: u32, cap: u32) -> Option<Slots> {
        let blocked = || {
            let g = self.reg().gate();
            let waiting = g & at_or_above(tier);
            (waiting != 0 && self.reg().unpassed_tiers(waiting) != 0)
                || (g & GATE_STRICT != 0 && !self.strict_lets_through(tier, need))
        };
        if blocked() {
            self.serve_now(true);
            if blocked() {
                return None;
            }
        }
        let mut got = self.admit(need, cap);
        if got.is_none() && self.slots.maybe_reap() > 0 {
            // A failed try is a slow path: a poller gets back what dead
            // holders left within one reap interval of its first failure.
            got = self.admit(need, cap);
        }
        if got.is_none() && self.slots.counting() && self.reg().gate() & GATE_TIERS != 0 {
            self.pass_on_after_backoff();
        }
        got
    }

    /// The fast path of an acquire at `tier` when the gate is not clear:
    /// with a lease alone, its deadline clearly ahead (one load and a
    /// coarse clock read), the take as without it; otherwise
    /// [`fast_beside_waiters`](Self::fast_beside_waiters). Out of line, so
    /// that the unleased fast path stays a leaf; not cold, so that the
    /// leased one is compiled for speed.
    #[inline(never)]
    pub fn fast_gated(&self, tier: usize, need: u32, cap: u32) -> Option<Slots> {
        let reg = self.reg();
        if reg.gate() & (GATE_STRICT | above(tier)) == 0 && reg.lease_clearly_in_force() {
            return self.take(need, cap);
        }
        self.fast_beside_waiters(tier, need, cap)
    }

    /// The fast path of an acquire at `tier` when waiters above it are
    /// published or a hand-off is strict (cold): it goes on only if every
    /// waiter above belongs to a process passed over (a stopped process
    /// holds nobody back), and a strict hand-off lets `tier` through.
    #[cold]
    #[inline(never)]
    pub fn fast_beside_waiters(&self, tier: usize, need: u32, cap: u32) -> Option<Slots> {
        let reg = self.reg();
        let g = reg.gate();
        let waiting = g & above(tier);
        if waiting != 0 && reg.unpassed_tiers(waiting) != 0 {
            return None;
        }
        if g & GATE_STRICT != 0 && !self.strict_lets_through(tier, need) {
            return None;
        }
        self.admit(need, cap)
    }

    /// Under a strict hand-off (fast paths closed for the designee), whether
    /// a caller at `tier` needing `need` may take all the same: only above
    /// the designee's tier, and past a lottery pick only from what is free
    /// beyond the pick's own need. A lottery pick gives its tier a turn at
    /// the next freed units it needs; it does not close the tiers above it.
    fn strict_lets_through(&self, tier: usize, need: u32) -> bool {
        let reg = self.reg();
        let Some(d) = reg.designee() else {
            return false; // a stale strict bit: the slow path clears it
        };
        if d.tier >= tier {
            return false;
        }
        if !d.lottery {
            return true;
        }
        let theirs = reg
            .front_of(d.idx, d.tier)
            .filter(|f| f.ticket == d.ticket)
            .map_or(0, |f| f.need);
        self.slots.free() >= u64::from(theirs) + u64::from(need)
    }

    /// A take that failed after counting itself in `held` gave the count
    /// back; meanwhile a capped waiter elsewhere may have been judged
    /// against the higher count and left undesignated, and nobody else will
    /// look again (a blocking caller's enqueue serves; a `try_acquire` does
    /// not). The back-off passes the turn on, as a release does.
    #[cold]
    fn pass_on_after_backoff(&self) {
        self.serve_now(false);
    }

    // ---- async -------------------------------------------------------------

    /// Makes sure the helper thread runs: it stands in for a sleeping thread
    /// while async waiters are queued (one per process and region).
    pub fn ensure_helper(self: &Arc<Self>) {
        if self.helper_running.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("shmsched-helper".into())
            .spawn(move || helper(weak));
        if spawned.is_err() {
            // No thread: async waiters are still served by this process's
            // releases and by other processes' wakes of blocked threads.
            self.helper_running.store(false, Ordering::Release);
        }
    }

    /// Moves the region's effective ceiling (see
    /// [`SharedSlots::set_ceiling`]); waiters are served if it went up.
    pub fn set_ceiling(&self, target: u32) -> Result<bool> {
        let done = self.slots.set_ceiling(target)?;
        self.serve_now(false);
        Ok(done)
    }

    /// Ends a cluster lease's hold on the region, restoring a ceiling (see
    /// [`SharedSlots::end_lease`]); waiters are served if it went up.
    pub fn end_lease(&self, restore: Option<u32>) -> bool {
        let done = self.slots.end_lease(restore);
        self.serve_now(false);
        done
    }

    /// Cells held by this process.
    pub fn held_here(&self) -> u32 {
        self.slots.held_by(self.slots.owner())
    }

    /// True when this root was bound before a fork (it belongs to the parent).
    #[inline]
    pub fn forked(&self) -> bool {
        self.fork_gen != fork_generation()
    }
}

/// Slow releases per thread between two looks at the clock for a fairness
/// hand-off (see [`SharedRoot::release`]): the bound grows by at most this
/// many releases of the barging process.
#[cfg_attr(shuttle, allow(dead_code))] // the model checks on every release
const FAIR_CHECK_EVERY: u32 = 16;

/// True on one call in [`FAIR_CHECK_EVERY`] on this thread (on every call
/// under the model checker, whose replays must not depend on a counter
/// that outlives an execution).
#[cfg(shuttle)]
fn fair_check_turn() -> bool {
    true
}

/// True on one call in [`FAIR_CHECK_EVERY`] on this thread.
#[cfg(not(shuttle))]
#[inline]
fn fair_check_turn() -> bool {
    std::thread_local!(static SLOW_RELEASES: std::cell::Cell<u32> = const { std::cell::Cell::new(0) });
    SLOW_RELEASES.with(|c| {
        let n = c.get().wrapping_add(1);
        c.set(n);
        n % FAIR_CHECK_EVERY == 0
    })
}

/// True once the current designee has been overtaken for [`FAIR_AFTER`].
fn fair_due(reg: &Registry) -> bool {
    fair_due_at(reg, monotonic_ns())
}

/// [`fair_due`] at `now_ns`, a reading of `CLOCK_MONOTONIC` taken before
/// this call (an earlier reading only makes the answer later).
fn fair_due_at(reg: &Registry, now_ns: u64) -> bool {
    now_ns.saturating_sub(reg.designated_ns()) >= fair_after_ns()
}

/// The largest table whose free cells a serve counts before it tries a
/// take for its own designee ([`SharedRoot::cannot_take`]): 64 cells are
/// two lines of the table, fewer loads than a failing take's own work.
const CANNOT_TAKE_MAX_CELLS: u32 = 64;

/// One reading of the clock shared by the steps of one serve (a serve runs
/// under the process's queue lock, for microseconds): read at its first
/// use, read again after a reap (a scan of the process table, which may
/// take longer). Stamps written from it (a designation's time, an offer's)
/// are at most that early, which moves a bound's end earlier by as much;
/// checks against it (fairness, probes, the pass-over bound) answer at
/// most that late, and the next serve reads the clock afresh.
#[derive(Default)]
struct Now(std::cell::Cell<u64>);

impl Now {
    /// `CLOCK_MONOTONIC` (ns), read once.
    #[inline]
    fn ns(&self) -> u64 {
        let v = self.0.get();
        if v != 0 {
            return v;
        }
        let v = monotonic_ns().max(1);
        self.0.set(v);
        v
    }

    /// The clock of the bounds on other processes' progress
    /// ([`bound_now_ns`](crate::region::registry::bound_now_ns)): the same reading, or under the model checker
    /// the model's clock, read each time.
    #[inline]
    fn bound_ns(&self) -> u64 {
        #[cfg(shuttle)]
        return bound_now_ns();
        #[cfg(not(shuttle))]
        self.ns()
    }

    /// Reads the clock afresh at the next use.
    fn forget(&self) {
        self.0.set(0);
    }
}

/// [`FAIR_AFTER`] in ns; under the model checker an execution may ask for
/// never instead (0 and never are the two ends the checker can explore
/// without depending on the host's speed).
#[inline]
fn fair_after_ns() -> u64 {
    #[cfg(shuttle)]
    if crate::sys::futex::model::never_fair() {
        return u64::MAX;
    }
    FAIR_AFTER.as_nanos() as u64
}

/// The helper loop (see [`SharedRoot::ensure_helper`]).
fn helper(weak: Weak<SharedRoot>) {
    loop {
        let Some(root) = weak.upgrade() else { return };
        if root.forked() {
            return;
        }
        if root.async_waiting.load(Ordering::SeqCst) == 0 {
            root.helper_running.store(false, Ordering::SeqCst);
            // A waiter may have queued between the check and the store.
            if root.async_waiting.load(Ordering::SeqCst) == 0
                || root.helper_running.swap(true, Ordering::SeqCst)
            {
                return;
            }
        }
        let reg = root.reg();
        let seq = reg.my_seq();
        root.serve_now(false);
        // Woken under its own bit, and for the tiers whose front is async
        // (a designation there is for a task it stands in for).
        if reg.sleep(seq, Some(BACKSTOP), root.fronts.helper_bits()) == WaitResult::TimedOut {
            root.on_backstop();
        }
    }
}
