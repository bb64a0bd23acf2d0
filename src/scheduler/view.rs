//! A shared scheduler's figures read from a [`RegionView`]: no
//! registration, no lock, no write (see [`crate::region::RegionView`]).
//!
//! This file restates the offsets of the scheduler's object area (object
//! revision 2, see `shared.rs`) instead of borrowing its private types, so
//! that it stays self-contained; `tests/cli_readonly.rs` checks that what
//! it reads equals [`Scheduler::stats`](super::Scheduler::stats) on a live
//! region.

use std::sync::atomic::Ordering;

use super::shared::MAX_SHARED_SLOTS;
use super::stats::SharedStats;
use crate::error::{Error, Result};
use crate::priority::LEVELS;
use crate::region::{ObjectKind, ProcSummary, RegionView};
use crate::stall::StallClock;

/// The object revision whose layout this file reads.
const OBJECT_REV: u64 = 2;
/// Offsets in the scheduler's 128-byte header: `max` (u32), the counters of
/// slots reclaimed and processes reaped (u64), the stall clock.
const MAX_OFF: usize = 0;
const RECLAIMED_OFF: usize = 16;
const REAPED_OFF: usize = 24;
const STALL_OFF: usize = 40;
/// The owner cells (one u32 per slot) follow the header and the 64-word
/// waiting bitmap.
const OWNERS_OFF: usize = 128 + 512;

impl RegionView {
    /// The validated global max of a scheduler region.
    fn scheduler_max(&self) -> Result<u32> {
        let h = self.header();
        if h.kind != ObjectKind::Scheduler {
            return Err(Error::Mismatch(format!(
                "the region holds a {}, not a scheduler",
                h.kind.name()
            )));
        }
        if h.params[1] != OBJECT_REV {
            return Err(Error::BadRegion(format!(
                "scheduler object revision {} is not the supported {OBJECT_REV}",
                h.params[1]
            )));
        }
        let max = u32::try_from(h.params[0])
            .ok()
            .filter(|&m| m <= MAX_SHARED_SLOTS)
            .ok_or_else(|| {
                Error::BadRegion(format!(
                    "scheduler max {} is above the limit {MAX_SHARED_SLOTS}",
                    h.params[0]
                ))
            })?;
        let stored = self.load_u32(MAX_OFF)?;
        if stored != max {
            return Err(Error::BadRegion(format!(
                "scheduler header says max {stored}; the region header says max {max}"
            )));
        }
        Ok(max)
    }

    /// The owner id in every slot cell (0 = free).
    fn scheduler_cells(&self) -> Result<Vec<u32>> {
        let max = self.scheduler_max()? as usize;
        (0..max)
            .map(|c| self.load_u32(OWNERS_OFF + 4 * c))
            .collect()
    }

    /// Region-wide figures of a scheduler region, as
    /// [`SchedulerStats::shared`](super::SchedulerStats::shared) gives them
    /// to an attached process: running, max, waiters per priority of live
    /// processes, live processes, slots reclaimed, processes reaped, stall
    /// time.
    pub fn scheduler_stats(&self) -> Result<SharedStats> {
        let max = self.scheduler_max()?;
        let running = self.scheduler_cells()?.iter().filter(|&&c| c != 0).count() as u32;
        let mut waiters = [0u32; LEVELS];
        let mut processes = 0;
        for p in self.processes()?.iter().filter(|p| p.alive) {
            processes += 1;
            let e = self.entry(p.idx)?;
            for (t, w) in waiters.iter_mut().enumerate() {
                let word = e.obj[t].load(Ordering::SeqCst);
                *w = w.saturating_add((word & 0xffff_ffff) as u32);
            }
        }
        Ok(SharedStats {
            running,
            max,
            waiters,
            processes,
            reclaimed: self.load_u64(RECLAIMED_OFF)?,
            reaped_processes: self.load_u64(REAPED_OFF)?,
            stall_ns: self.object_atomics::<StallClock>(STALL_OFF)?.total_ns(),
        })
    }

    /// Every non-free process entry of a scheduler region with the number of
    /// slots its owner holds now (dead entries not yet reaped included).
    pub fn scheduler_processes(&self) -> Result<Vec<(ProcSummary, u32)>> {
        let cells = self.scheduler_cells()?;
        Ok(self
            .processes()?
            .into_iter()
            .map(|p| {
                let held = cells.iter().filter(|&&c| c == p.owner).count() as u32;
                (p, held)
            })
            .collect())
    }
}
