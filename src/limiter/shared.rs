//! The Limiter's home in a region: one bucket word and its parameters,
//! shared by every process, beside the wait registry.
//!
//! **Layout** (object area of a `Limiter` region, revision 9, fixed
//! offsets): `[wait registry: 1,408 bytes][LimState: 128][LimCounters:
//! 128][ParamBlock: 512][LimTotals: 128]`. The state line holds `tat` (the bucket, see
//! [`bucket`](super::bucket)) and, per tier, the ticket of the region front
//! last woken and the time (ms) the tier last made progress; the counters
//! line what every process adds up; the parameter block the rate, the
//! capacity, the clock's base and the clock (see [`params`](super::params));
//! the totals line the tokens consumed and refunded per priority, by every
//! process.
//!
//! The header's `params[0]` is the rate the region was created with (what
//! `Limiter::shared` compares against); the rate in force is the parameter
//! block's, which `set_rate` changes for everyone.

use crate::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::bucket::Gcra;
use super::params::{ParamBlock, Params};
use super::stats::SharedLimiterStats;
use super::{check_rate, MAX_TOKENS_PER_SECOND};
use crate::error::{Error, Result};
use crate::priority::LEVELS;
use crate::region::registry::{Registry, REGISTRY_SIZE};
use crate::region::{Mapping, ObjectKind, ObjectSpec, Region};
use crate::sys::clock::{calibrate, Clock};

/// Revision of this object's layout, stored in the header params (5: the
/// virtual clock starts at `V_BIAS`, so a capacity change can move it
/// down without going below 0, see [`bucket`](super::bucket); parameter
/// blocks of three slots published by CAS; `ready_ms` per tier; 6: the
/// registry's cluster line carries the lease's deadline and safe rate, and
/// the gate its `GATE_LEASED` bit; 7: the `LimTotals` line after the
/// parameter block, tokens consumed and refunded per priority; 8: the gate
/// carries the region's stall time in one word with its `GATE_CLOSING`
/// bit; 9: the consume fast path's virtual clock is computed from the raw
/// TSC ticks with one multiply, `Hot` in `bucket.rs`, derived from the
/// stored parameters and calibration, and every parameter slot stores
/// that derivation).
pub(crate) const OBJECT_REV: u64 = 9;

/// The limiter's shared state line.
#[repr(C, align(128))]
pub(crate) struct LimState {
    /// The bucket word. Written by any process, only by CAS.
    pub(crate) tat: AtomicU64,
    /// Counter: force-throughs into debt at the root, by any process.
    pub(crate) forced: AtomicU64,
    /// Per tier: the ticket + 1 of the region front last woken (0: none).
    pub(crate) notified: [AtomicU32; LEVELS],
    _pad0: AtomicU32,
    /// Per tier: CLOCK_MONOTONIC ms (mod 2³²) of the last charge or
    /// departure of a front; a front stalls from then (or its arrival).
    pub(crate) progress_ms: [AtomicU32; LEVELS],
    _pad1: AtomicU32,
    /// Per tier: when (ms of [`bound_now_ns`](crate::region::registry::bound_now_ns),
    /// mod 2³², never 0) another process first found the front last woken
    /// (`notified`) able to go; 0: not yet. A front that can go and is not
    /// charged within the bound is passed over.
    pub(crate) ready_ms: [AtomicU32; LEVELS],
    _pad2: AtomicU32,
    _pad: [u64; 2],
}

/// Counters every process adds to.
#[repr(C, align(128))]
pub(crate) struct LimCounters {
    /// Per tier: consumes charged after queueing at the root.
    pub(crate) completed: [AtomicU64; LEVELS],
    _pad: [u64; 9],
}

/// Token totals every process adds to (counters that only go up).
#[repr(C, align(128))]
pub(crate) struct LimTotals {
    /// Per tier: tokens charged at the root (at once, after waiting, forced
    /// by `try_consume_at` at its priority, or by `try_consume`, counted at
    /// [`TRY_PRIORITY`](super::TRY_PRIORITY)).
    pub(crate) consumed: [AtomicU64; LEVELS],
    /// Per tier: tokens given back to the root (a consume that gave up
    /// after it was charged, an I/O adapter's unused bytes).
    pub(crate) refunded: [AtomicU64; LEVELS],
    _pad: [u64; 2],
}

#[cfg(not(shuttle))]
const _: () = assert!(std::mem::size_of::<LimTotals>() == 128);
#[cfg(not(shuttle))]
const _: () = assert!(std::mem::size_of::<LimState>() == 128);
#[cfg(not(shuttle))]
const _: () = assert!(std::mem::size_of::<LimCounters>() == 128);

pub(crate) const STATE_OFF: usize = REGISTRY_SIZE;
pub(crate) const COUNTERS_OFF: usize = STATE_OFF + std::mem::size_of::<LimState>();
pub(crate) const PARAMS_OFF: usize = COUNTERS_OFF + std::mem::size_of::<LimCounters>();
pub(crate) const TOTALS_OFF: usize = PARAMS_OFF + std::mem::size_of::<ParamBlock>();
/// Bytes of object area this layout needs.
pub(crate) const OBJECT_SIZE: usize = TOTALS_OFF + std::mem::size_of::<LimTotals>();

/// A bound limiter region, as seen by one registered process.
#[derive(Debug)]
pub(crate) struct SharedBucket {
    reg: Registry,
    base: *const u8,
}

// SAFETY: `base` points into the mapping that the registry's `Arc` keeps
// alive as long as `self`; every access through it is an atomic, which
// other threads and processes may mutate concurrently by design.
unsafe impl Send for SharedBucket {}
// SAFETY: as above: only atomic accesses through `base`.
unsafe impl Sync for SharedBucket {}

impl SharedBucket {
    /// Binds `region` as a limiter of `rate` tokens/s and capacity `cap`
    /// (creating it if the region is new; it starts full), or joins
    /// whatever it has (`rate` None).
    pub fn bind(region: &Region, rate: Option<(u64, u64)>) -> Result<SharedBucket> {
        let map = match rate {
            Some((r, c)) => {
                let (r, c) = (check_rate(r)?, super::check_capacity(c)?);
                // The creator calibrates the clock every process will use.
                let init = move |area: &mut [u8]| {
                    #[cfg(not(shuttle))]
                    let clock = calibrate().map_or(Clock::Monotonic, Clock::Tsc);
                    // Under the model checker, once per run: calibrating
                    // sleeps 20 ms, which every execution would pay.
                    #[cfg(shuttle)]
                    let clock = {
                        static CLOCK: std::sync::OnceLock<Clock> = std::sync::OnceLock::new();
                        *CLOCK.get_or_init(|| calibrate().map_or(Clock::Monotonic, Clock::Tsc))
                    };
                    let epoch = clock.now_ns();
                    let block = area[PARAMS_OFF..].as_mut_ptr() as *const ParamBlock;
                    // SAFETY: the area is the zeroed object area being
                    // initialised under the creation lock, at least
                    // OBJECT_SIZE bytes and 128-aligned (PARAMS_OFF is a
                    // multiple of 128); ParamBlock is atomics only.
                    unsafe { &*block }.init(&Params {
                        gcra: Gcra::new(r, c, epoch),
                        clock,
                    });
                };
                let spec = ObjectSpec {
                    kind: ObjectKind::Limiter,
                    params: [u64::from(r), OBJECT_REV, u64::from(c), 0, 0, 0, 0, 0],
                    object_size: OBJECT_SIZE,
                    init: &init,
                };
                region.bind(ObjectKind::Limiter, Some(&spec))?
            }
            None => region.bind(ObjectKind::Limiter, None)?,
        };
        SharedBucket::from_mapping(map)
    }

    fn from_mapping(map: Arc<Mapping>) -> Result<SharedBucket> {
        let h = map.header();
        if h.params[1] != OBJECT_REV {
            return Err(Error::BadRegion(format!(
                "limiter object revision {} is not the supported {OBJECT_REV}",
                h.params[1]
            )));
        }
        if h.params[0] == 0 || h.params[0] > MAX_TOKENS_PER_SECOND {
            return Err(Error::BadRegion(format!(
                "limiter rate {} is out of range 1..={MAX_TOKENS_PER_SECOND}",
                h.params[0]
            )));
        }
        if map.object_len() < OBJECT_SIZE {
            return Err(Error::BadRegion(format!(
                "limiter object area is {} bytes, it needs {OBJECT_SIZE}",
                map.object_len(),
            )));
        }
        let base = map.object_ptr() as *const u8;
        let mut s = SharedBucket {
            reg: Registry::view(map)?,
            base,
        };
        // Validates the parameters (and the stored clock) before joining.
        let p = s.params().load()?;
        if let Clock::Tsc(c) = p.clock {
            c.check_form()
                .map_err(|e| Error::BadRegion(format!("limiter clock: {e}")))?;
            if c.check_agrees().is_err() {
                s.demote_clock();
            }
        }
        let me = s.reg.mapping().me_reaping(&mut |_, _| {})?;
        s.reg.join(me);
        Ok(s)
    }

    /// The wait registry.
    #[inline]
    pub fn reg(&self) -> &Registry {
        &self.reg
    }

    /// The mapping this bucket lives in.
    pub fn mapping(&self) -> &Arc<Mapping> {
        self.reg.mapping()
    }

    #[inline(always)]
    pub fn state(&self) -> &LimState {
        // SAFETY: STATE_OFF..+128 lies in the object area (at least
        // OBJECT_SIZE bytes, checked in `from_mapping`), 128-aligned (the
        // registry checked the area's alignment); LimState is atomics only,
        // valid for any bits; the mapping outlives `self`.
        unsafe { &*(self.base.add(STATE_OFF) as *const LimState) }
    }

    pub fn counters(&self) -> &LimCounters {
        // SAFETY: as in `state`, at COUNTERS_OFF.
        unsafe { &*(self.base.add(COUNTERS_OFF) as *const LimCounters) }
    }

    pub fn totals(&self) -> &LimTotals {
        // SAFETY: as in `state`, at TOTALS_OFF (a multiple of 128, inside
        // OBJECT_SIZE).
        unsafe { &*(self.base.add(TOTALS_OFF) as *const LimTotals) }
    }

    #[inline(always)]
    pub fn params(&self) -> &ParamBlock {
        // SAFETY: as in `state`, at PARAMS_OFF (a multiple of 128).
        unsafe { &*(self.base.add(PARAMS_OFF) as *const ParamBlock) }
    }

    /// Replaces the parameters for every process (see `params.rs`).
    pub fn update_params(&self, f: impl Fn(Params) -> Params) -> Result<Params> {
        self.params()
            .update(self.reg.me().owner, &|id| self.reg.owner_alive(id), f)
    }

    /// Moves the region to `CLOCK_MONOTONIC`, re-basing the virtual clock
    /// so that it continues from where the TSC left it.
    pub fn demote_clock(&self) {
        let _ = self.params().update(
            self.reg.me().owner.max(1),
            &|id| self.reg.owner_alive(id),
            super::params::demoted,
        );
    }

    /// Frees the entries of dead processes (a dead process holds no
    /// tokens; this clears its waiting state). Returns how many.
    pub fn reap(&self) -> Result<u32> {
        self.reg.reap(&mut |_, _| {})
    }

    /// Region-wide figures (`stall`: the region fronts' stall ticks).
    /// Reaps first if a scan is due (rate-limited region-wide): a dead
    /// waiter's stall ends when a reader notices its death.
    pub fn stats(&self, clock: Clock, stall: [u64; LEVELS]) -> SharedLimiterStats {
        let _ = self.reg.maybe_reap(&mut |_, _| {});
        let mut processes = 0;
        if let Ok(procs) = self.mapping().live_processes() {
            processes = procs.iter().filter(|p| p.alive).count() as u32;
        }
        shared_stats(
            (self.state(), self.counters(), self.totals()),
            self.reg.waiter_counts(),
            stall,
            processes,
            self.reg.stall_ns(),
            (self.reg.wakes(), self.reg.passes()),
            clock,
        )
    }
}

/// Region-wide figures from the region's structures (shared with the
/// read-only view).
pub(crate) fn shared_stats(
    (state, counters, totals): (&LimState, &LimCounters, &LimTotals),
    waiters: [u64; LEVELS],
    stall: [u64; LEVELS],
    processes: u32,
    stall_ns: u64,
    (wakes, passed_over): (u64, u64),
    clock: Clock,
) -> SharedLimiterStats {
    SharedLimiterStats {
        forced: state.forced.load(Ordering::Relaxed),
        waiters,
        completed: std::array::from_fn(|t| counters.completed[t].load(Ordering::Relaxed)),
        stall,
        consumed: std::array::from_fn(|t| totals.consumed[t].load(Ordering::Relaxed)),
        refunded: std::array::from_fn(|t| totals.refunded[t].load(Ordering::Relaxed)),
        processes,
        stall_ns,
        wakes,
        passed_over,
        tsc: clock.tsc(),
    }
}
