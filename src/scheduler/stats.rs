//! Scheduler statistics: the seed's gauges and counters, plus what a region
//! knows exactly.

use serde::Serialize;

use crate::priority::LEVELS;

/// One priority's queue: a gauge and cumulative counters.
///
/// While the scheduler is live, `deferred - completed == count`. A wait that
/// is cancelled (timeout, dropped, disposed) leaves the queue too: it counts
/// in `completed` and also in `cancelled`, so the invariant holds and
/// `completed - cancelled` is the number dispatched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct QueueStats {
    /// Gauge: tasks queued now at this priority.
    pub count: u64,
    /// Counter: tasks ever queued here (they could not start at once).
    pub deferred: u64,
    /// Counter: tasks that ever left this queue (dispatched or cancelled).
    pub completed: u64,
    /// Counter: the part of `completed` that was cancelled, not dispatched.
    pub cancelled: u64,
}

impl QueueStats {
    pub(crate) fn add(&mut self, o: &QueueStats) {
        self.count = self.count.saturating_add(o.count);
        self.deferred = self.deferred.saturating_add(o.deferred);
        self.completed = self.completed.saturating_add(o.completed);
        self.cancelled = self.cancelled.saturating_add(o.cancelled);
    }
}

/// What the region knows about everyone sharing it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SharedStats {
    /// Gauge: slots held across all processes right now.
    pub running: u32,
    /// The region's global max (its number of slot cells).
    pub max: u32,
    /// The effective ceiling (≤ max): the most slots held at once now (see
    /// [`Scheduler::set_ceiling`](super::Scheduler::set_ceiling)).
    pub ceiling: u32,
    /// Gauge: tasks waiting in live processes, per priority (index = priority + 3).
    pub waiters: [u32; LEVELS],
    /// Gauge: processes attached to the region and alive.
    pub processes: u32,
    /// Counter: slots returned on behalf of processes that died holding them.
    pub reclaimed: u64,
    /// Counter: dead processes reaped.
    pub reaped_processes: u64,
    /// Counter: nanoseconds during which at least one task waited for a
    /// slot, in any process (PSI "some"), kept exactly at transitions.
    pub stall_ns: u64,
    /// Counter: tasks dispatched after waiting, in any process (the
    /// region's `completed - cancelled`; what pressure's *full* diffs for a
    /// shared scheduler, so a process that queues nothing itself reads the
    /// region's progress).
    pub served: u64,
    /// Counter: futex wake-ups sent to a waiting process that found a
    /// thread asleep there (one per hand-off to a sleeping waiter).
    pub wakes: u64,
    /// Counter: fairness hand-offs: times every fast path was closed so that
    /// a waiter overtaken for [`FAIR_AFTER`](super::FAIR_AFTER) got the next
    /// freed slot.
    pub fair_handoffs: u64,
    /// Counter: processes passed over because they made no progress while
    /// the region waited for them (a designee offered capacity that did not
    /// come within the bound: a stopped or frozen process).
    pub passed_over: u64,
}

/// A snapshot of one scheduler. Allocates nothing on the acquire path; built
/// on demand.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SchedulerStats {
    /// Gauge: permits held right now: from this scheduler in process mode;
    /// by this whole process in region mode (its schedulers share one
    /// registration).
    pub running: u64,
    /// The configured overall ceiling (`None` = unlimited).
    pub concurrency: Option<u32>,
    /// Gauge: tasks queued in this scheduler.
    pub pending: u64,
    /// Roll-up of `queues`.
    pub total: QueueStats,
    /// Per priority, index = priority + 3.
    pub queues: [QueueStats; LEVELS],
    /// Counter: nanoseconds during which at least one task waited in this
    /// scheduler (PSI "some"), kept exactly at transitions.
    pub stall_ns: u64,
    /// Region-wide figures, in shared mode only.
    pub shared: Option<SharedStats>,
}
