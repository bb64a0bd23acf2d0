//! A shared limiter's figures read from a [`RegionView`]: no registration,
//! no lock, no write (see [`crate::region::RegionView`]).
//!
//! It reads the same `repr(C)` structures the limiter keeps in the region
//! (the wait registry, the state and counter lines, the parameter block)
//! through shared references, using only their loads, so the layout is
//! stated once, in `shared.rs`, `params.rs` and `registry.rs`.

use super::bucket::Refused;
use super::params::ParamBlock;
use super::root::{later_ms, stall_ticks};
use super::shared::{
    shared_stats, LimCounters, LimState, LimTotals, COUNTERS_OFF, OBJECT_REV, PARAMS_OFF,
    STATE_OFF, TOTALS_OFF,
};
use super::stats::{LimiterQueueStats, LimiterStats};
use super::MAX_TOKENS_PER_SECOND;
use crate::error::{Error, Result};
use crate::priority::LEVELS;
use crate::region::registry::RegistryArea;
use crate::region::{ObjectKind, RegionView};
use crate::scheduler::QueueStats;
use crate::sync::atomic::Ordering;
use crate::sys::clock::monotonic_ms;

impl RegionView {
    fn check_limiter(&self) -> Result<()> {
        let h = self.header();
        if h.kind != ObjectKind::Limiter {
            return Err(Error::WrongKind {
                found: h.kind,
                expected: ObjectKind::Limiter,
            });
        }
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
        Ok(())
    }

    /// A limiter region's figures, shaped as [`Limiter::stats`] gives them:
    /// the balance (`tokens`, negative in debt), the rate and capacity in
    /// force, the bucket's virtual clock, and the region's queues: `pending`
    /// and `queues[p].count` are the consumes waiting at the root in every
    /// process, `queues[p].completed` those charged after waiting, `forced`
    /// the region's force-throughs and `stall_ns` its stall time (an
    /// inspector has no queue of its own to report).
    ///
    /// [`Limiter::stats`]: super::Limiter::stats
    pub fn limiter_stats(&self) -> Result<LimiterStats> {
        self.check_limiter()?;
        let params = self.object_atomics::<ParamBlock>(PARAMS_OFF)?.load()?;
        let state = self.object_atomics::<LimState>(STATE_OFF)?;
        let counters = self.object_atomics::<LimCounters>(COUNTERS_OFF)?;
        let totals = self.object_atomics::<LimTotals>(TOTALS_OFF)?;
        let reg = self.object_atomics::<RegistryArea>(0)?;
        let (tokens, v) = params
            .gcra
            .read(&state.tat, params.clock.now_ns())
            .map_err(|r| match r {
                Refused::Corrupt { tat, v } => super::corrupt_error(tat, v),
                Refused::Until(v) => super::corrupt_error(u64::MAX, v),
            })?;
        let waiters = reg.waiter_counts(
            |idx| {
                self.entry(idx)
                    .ok()
                    .filter(|_| self.is_alive(idx).unwrap_or(false))
            },
            self.header().process_slots,
        );
        let (wakes, _, _) = reg.counters();
        // The region fronts' stall: the oldest published front of each tier
        // (the one with the most ticks), counted as the drain does.
        let now_ms = monotonic_ms() as u32;
        let mut stall = [0u64; LEVELS];
        reg.each_front(
            |idx| {
                self.entry(idx)
                    .ok()
                    .filter(|_| self.is_alive(idx).unwrap_or(false))
            },
            self.header().process_slots,
            |t, arrival| {
                let progress = state.progress_ms[t].load(Ordering::SeqCst);
                stall[t] = stall[t].max(stall_ticks(now_ms, later_ms(arrival, progress)));
            },
        );
        let shared = shared_stats(
            (state, counters, totals),
            waiters,
            stall,
            self.alive_processes()?,
            reg.stall_ns(),
            (wakes, reg.passes()),
            params.clock,
        );
        let mut queues = [LimiterQueueStats::default(); LEVELS];
        let mut total = QueueStats::default();
        // Region contents: saturate rather than overflow on a scribbled
        // counter.
        for (t, q) in queues.iter_mut().enumerate() {
            q.count = shared.waiters[t];
            q.completed = shared.completed[t];
            q.stall = if q.count > 0 { shared.stall[t] } else { 0 };
            q.consumed = shared.consumed[t];
            q.refunded = shared.refunded[t];
            q.deferred = q.count.saturating_add(q.completed);
            total.count = total.count.saturating_add(q.count);
            total.completed = total.completed.saturating_add(q.completed);
            total.deferred = total.deferred.saturating_add(q.deferred);
        }
        Ok(LimiterStats {
            tokens,
            tokens_per_second: params.gcra.rate() as u32,
            capacity: params.gcra.cap() as u32,
            pending: total.count,
            forced: shared.forced,
            clock: super::bucket::Gcra::refilled(v),
            total,
            queues,
            stall_ns: shared.stall_ns,
            consumed: shared
                .consumed
                .iter()
                .fold(0u64, |a, &b| a.saturating_add(b)),
            refunded: shared
                .refunded
                .iter()
                .fold(0u64, |a, &b| a.saturating_add(b)),
            shared: Some(shared),
        })
    }
}
