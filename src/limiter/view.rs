//! A shared limiter's figures read from a [`RegionView`]: no registration,
//! no lock, no write (see [`crate::region::RegionView`]).
//!
//! This file restates the offsets of the limiter's object area (object
//! revision 3, see `shared.rs`) instead of borrowing its private types, so
//! that it stays self-contained; `tests/cli_readonly.rs` checks what it
//! reads against an attached [`Limiter`](super::Limiter).

use std::sync::atomic::{AtomicU64, Ordering};

use super::bucket::{Gcra, Refused};
use super::stats::{LimiterStats, SharedLimiterStats};
use super::MAX_TOKENS_PER_SECOND;
use crate::error::{Error, Result};
use crate::priority::LEVELS;
use crate::region::{ObjectKind, RegionView};
use crate::stall::StallClock;
use crate::sys::clock::{Clock, TscClock};

/// The object revision whose layout this file reads.
const OBJECT_REV: u64 = 3;
/// Offsets in the limiter's 128-byte state line.
const TAT_OFF: usize = 0;
const FORCED_OFF: usize = 8;
const STALL_OFF: usize = 16;
const WAKES_OFF: usize = 32;
const CLOCK_OFF: usize = 40;

impl RegionView {
    /// The validated rate of a limiter region.
    fn limiter_rate(&self) -> Result<u32> {
        let h = self.header();
        if h.kind != ObjectKind::Limiter {
            return Err(Error::Mismatch(format!(
                "the region holds a {}, not a limiter",
                h.kind.name()
            )));
        }
        if h.params[1] != OBJECT_REV {
            return Err(Error::BadRegion(format!(
                "limiter object revision {} is not the supported {OBJECT_REV}",
                h.params[1]
            )));
        }
        u32::try_from(h.params[0])
            .ok()
            .filter(|&r| r >= 1 && u64::from(r) <= MAX_TOKENS_PER_SECOND)
            .ok_or_else(|| {
                Error::BadRegion(format!(
                    "limiter rate {} is out of range 1..={MAX_TOKENS_PER_SECOND}",
                    h.params[0]
                ))
            })
    }

    /// The clock the region's processes share, as its creator stored it.
    fn limiter_clock(&self) -> Result<Clock> {
        let w = |i: usize| self.load_u64(CLOCK_OFF + 8 * i);
        match w(0)? {
            0 => Ok(Clock::Monotonic),
            1 => {
                let c = TscClock {
                    tsc0: w(1)?,
                    ns0: w(2)?,
                    mult: w(3)?,
                    shift: u32::try_from(w(4)?).unwrap_or(u32::MAX),
                };
                c.validate()
                    .map_err(|e| Error::BadRegion(format!("limiter clock: {e}")))?;
                Ok(Clock::Tsc(c))
            }
            f => Err(Error::BadRegion(format!(
                "limiter clock flag {f} is neither 0 (CLOCK_MONOTONIC) nor 1 (TSC)"
            ))),
        }
    }

    /// A limiter region's figures, shaped as [`Limiter::stats`] gives them
    /// to an attached process that has nothing queued itself: the balance
    /// (`tokens`, negative in debt), the rate, the bucket's virtual clock,
    /// and the region-wide part in `shared`. The per-handle fields
    /// (`pending`, `forced`, `queues`, `stall_ns`) are 0: an inspector has
    /// no queue.
    ///
    /// [`Limiter::stats`]: super::Limiter::stats
    pub fn limiter_stats(&self) -> Result<LimiterStats> {
        let rate = self.limiter_rate()?;
        let clock = self.limiter_clock()?;
        let gcra = Gcra::new(rate, self.header().clock_epoch_ns);
        let tat = self.object_atomics::<AtomicU64>(TAT_OFF)?;
        let (tokens, v) = gcra.read(tat, clock.now_ns()).map_err(|r| match r {
            Refused::Corrupt { tat, v } => Error::BadRegion(format!(
                "limiter bucket word {tat} is further ahead of the clock ({v}) than any debt allows"
            )),
            Refused::Until(v) => Error::BadRegion(format!("limiter bucket unreadable at {v}")),
        })?;
        let mut waiters = [0u64; LEVELS];
        let mut processes = 0;
        for p in self.processes()?.iter().filter(|p| p.alive) {
            processes += 1;
            let e = self.entry(p.idx)?;
            for (t, w) in waiters.iter_mut().enumerate() {
                // A count above 2^32 can only be a scribble: ignore it.
                let c = e.obj[t].load(Ordering::SeqCst);
                if c <= u64::from(u32::MAX) {
                    *w += c;
                }
            }
        }
        Ok(LimiterStats {
            tokens,
            tokens_per_second: rate,
            clock: v,
            shared: Some(SharedLimiterStats {
                forced: self.load_u64(FORCED_OFF)?,
                waiters,
                processes,
                stall_ns: self.object_atomics::<StallClock>(STALL_OFF)?.total_ns(),
                wakes: self.load_u64(WAKES_OFF)?,
                tsc: clock.tsc(),
            }),
            ..LimiterStats::default()
        })
    }
}
