//! A shared scheduler's figures read from a [`RegionView`]: no
//! registration, no lock, no write (see [`crate::region::RegionView`]).
//!
//! It reads the same `repr(C)` structures the scheduler keeps in the region
//! (the wait registry, [`SchedHeader`], the cells) through shared
//! references, using only their loads, so the layout is stated once, in
//! `shared.rs` and `registry.rs`.

use crate::sync::atomic::Ordering;

use super::shared::{
    out_of_service, value, SchedHeader, CELLS_OFF, COUNTED, HEADER_OFF, MAX_SHARED_SLOTS,
    OBJECT_REV,
};
use super::stats::SharedStats;
use crate::error::{Error, Result};
use crate::region::registry::RegistryArea;
use crate::region::{ObjectKind, ProcSummary, RegionView};

impl RegionView {
    /// The validated global max of a scheduler region.
    fn scheduler_max(&self) -> Result<u32> {
        let h = self.header();
        if h.kind != ObjectKind::Scheduler {
            return Err(Error::WrongKind {
                found: h.kind,
                expected: ObjectKind::Scheduler,
            });
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
        let stored = self.sched_header()?.max.load(Ordering::Relaxed);
        if stored != max {
            return Err(Error::BadRegion(format!(
                "scheduler header says max {stored}; the region header says max {max}"
            )));
        }
        Ok(max)
    }

    fn sched_header(&self) -> Result<&SchedHeader> {
        self.object_atomics::<SchedHeader>(HEADER_OFF)
    }

    /// The owner id in every slot cell (0 = free), without the counted bit
    /// (the value half of each 64-bit cell, without a raw permit's tag).
    fn scheduler_cells(&self) -> Result<Vec<u32>> {
        let max = self.scheduler_max()? as usize;
        (0..max)
            .map(|c| {
                self.load_u64(CELLS_OFF + 8 * c)
                    .map(|v| value(v) & !COUNTED)
            })
            .collect()
    }

    /// Region-wide figures of a scheduler region, as
    /// [`SchedulerStats::shared`](super::SchedulerStats::shared) gives them
    /// to an attached process.
    pub fn scheduler_stats(&self) -> Result<SharedStats> {
        let max = self.scheduler_max()?;
        let running = self
            .scheduler_cells()?
            .iter()
            .filter(|&&c| c != 0 && !out_of_service(c))
            .count() as u32;
        let reg = self.object_atomics::<RegistryArea>(0)?;
        let waiters = reg.waiter_counts(
            |idx| {
                self.entry(idx)
                    .ok()
                    .filter(|_| self.is_alive(idx).unwrap_or(false))
            },
            self.header().process_slots,
        );
        let (wakes, reaped, strict) = reg.counters();
        Ok(SharedStats {
            running,
            max,
            ceiling: self.sched_header()?.ceiling(max),
            waiters: waiters.map(|c| c.min(u64::from(u32::MAX)) as u32),
            processes: self.alive_processes()?,
            reclaimed: self.sched_header()?.reclaimed.load(Ordering::Relaxed),
            reaped_processes: reaped,
            stall_ns: reg.stall_ns(),
            served: reg.served(),
            wakes,
            fair_handoffs: strict,
            passed_over: reg.passes(),
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
