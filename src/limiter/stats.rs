//! Limiter statistics: the seed's fields (the Scheduler's per-priority
//! gauges and counters, plus `tokens`, `tokens_per_second`, `forced` and
//! `stall`), and what a region knows.

use serde::Serialize;

use crate::priority::LEVELS;
use crate::scheduler::QueueStats;

/// One priority's queue in a limiter.
///
/// While the limiter is live, `deferred - completed == count`. A cancelled
/// wait (timeout) counts in `completed` and in `cancelled`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LimiterQueueStats {
    /// Gauge: consumes queued now at this priority.
    pub count: u64,
    /// Counter: consumes ever queued here (they could not go at once).
    pub deferred: u64,
    /// Counter: consumes that ever left this queue (charged or cancelled).
    pub completed: u64,
    /// Counter: the part of `completed` that was cancelled.
    pub cancelled: u64,
    /// Gauge: consecutive ~100 ms ticks this priority's front has been
    /// blocked on tokens (0 when the queue is empty). At
    /// [`STALL_TICKS`](super::STALL_TICKS) the front is forced through.
    /// For a shared limiter, the region's front of this priority (see
    /// [`SharedLimiterStats::stall`]), reported while this handle has a
    /// consume queued here.
    pub stall: u64,
    /// Counter: tokens charged at this priority through this handle at this
    /// level: at once, after waiting, forced through, by `try_consume_at`
    /// at this priority, or (at [`TRY_PRIORITY`](super::TRY_PRIORITY)) by
    /// `try_consume`. Together
    /// with `refunded`, `Δ(consumed − refunded) / Δt` is the rate this
    /// priority achieved. (A region's view reports the region's.)
    pub consumed: u64,
    /// Counter: tokens given back at this priority through this handle at
    /// this level (a consume that gave up after this level charged it, an
    /// I/O adapter's bytes charged and never moved).
    pub refunded: u64,
}

/// A snapshot of one limiter (one level of a chain).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LimiterStats {
    /// Gauge: the token balance now, negative while in debt.
    pub tokens: i64,
    /// The rate in force, tokens per second.
    pub tokens_per_second: u32,
    /// The bucket's capacity (burst) in force.
    pub capacity: u32,
    /// Gauge: consumes queued in this limiter.
    pub pending: u64,
    /// Counter: anti-starvation force-throughs into debt by this handle
    /// (including requests larger than the capacity admitted on a full
    /// bucket). Per process; see `shared.forced` for the region's total.
    pub forced: u64,
    /// Counter: tokens ever refilled since the bucket's creation (its
    /// virtual clock), plus its initial capacity minus its capacity now
    /// (capacity changes move it). `clock + capacity - tokens` bounds,
    /// exactly, everything ever consumed from the bucket.
    pub clock: u64,
    /// Roll-up of `queues` (`stall` is not summed: take the max).
    pub total: QueueStats,
    /// Per priority, index = priority + 3.
    pub queues: [LimiterQueueStats; LEVELS],
    /// Counter: nanoseconds during which at least one consume waited at this
    /// level (PSI "some"), kept exactly at transitions.
    pub stall_ns: u64,
    /// Counter: the sum of `queues[p].consumed`.
    pub consumed: u64,
    /// Counter: the sum of `queues[p].refunded`.
    pub refunded: u64,
    /// Region-wide figures, in shared mode only.
    pub shared: Option<SharedLimiterStats>,
}

/// What a limiter region knows about everyone sharing it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SharedLimiterStats {
    /// Counter: force-throughs into debt by all processes.
    pub forced: u64,
    /// Gauge: consumes waiting at the root, per priority (index = priority
    /// + 3), in every process that publishes waiters.
    pub waiters: [u64; LEVELS],
    /// Counter: consumes charged after waiting at the root, per priority,
    /// by all processes.
    pub completed: [u64; LEVELS],
    /// Gauge: per priority, consecutive ~100 ms ticks the region's front of
    /// that priority (in whichever process it waits) has been blocked, from
    /// its arrival or the priority's last progress, as an in-process
    /// level's `queues[p].stall` counts it; 0 where nobody waits. At
    /// [`STALL_TICKS`](super::STALL_TICKS) the front is forced through
    /// (unless the bucket is in debt).
    pub stall: [u64; LEVELS],
    /// Counter: tokens charged at the root per priority (index = priority +
    /// 3), by all processes (see [`LimiterQueueStats::consumed`]).
    pub consumed: [u64; LEVELS],
    /// Counter: tokens refunded to the root per priority, by all processes.
    pub refunded: [u64; LEVELS],
    /// Gauge: processes attached to the region and alive.
    pub processes: u32,
    /// Counter: nanoseconds during which at least one consume waited, in any
    /// process (PSI "some"), kept exactly at transitions.
    pub stall_ns: u64,
    /// Counter: futex wake-ups sent to a process's word that found a thread
    /// asleep there (a deferring drain or a pump), by any process. A wake
    /// with nobody asleep makes no syscall and is not counted.
    pub wakes: u64,
    /// Counter: processes passed over because they made no progress while
    /// the region waited for them (a front that could go and was not
    /// charged within the bound: a stopped or frozen process).
    pub passed_over: u64,
    /// The region's TSC calibration, which every process uses for its
    /// clock; `None` if the region uses `CLOCK_MONOTONIC`.
    pub tsc: Option<crate::sys::clock::TscClock>,
}
