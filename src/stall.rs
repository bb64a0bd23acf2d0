//! An exact cumulative stall-time counter, kept at state transitions.
//!
//! PSI's "some" for a budget: the total time during which at least one task
//! waited for capacity. It is not sampled: whoever moves the backlog from
//! empty to non-empty stamps `since`; whoever moves it back to empty adds
//! `now - since` to `total`. A reader adds the open interval. All words are
//! atomics of fixed size, so the counter can live in a region (no pointers).
//!
//! Transitions race across processes (one process's last waiter leaves while
//! another's first arrives); each closer re-checks the backlog after closing
//! and reopens the interval if it is not empty, so an interval is never lost
//! for longer than that race.

use crate::sync::atomic::{AtomicU64, Ordering};

use crate::sys::monotonic_ns;

/// The counter. `#[repr(C)]`, 16 bytes, zero = never stalled.
#[repr(C)]
#[derive(Debug, Default)]
pub struct StallClock {
    /// Monotonic ns when the current stall began; 0 when not stalled.
    since: AtomicU64,
    /// Nanoseconds of closed stall intervals.
    total: AtomicU64,
}

// Fixed, except under the model checker (whose atomics are larger).
#[cfg(not(shuttle))]
const _: () = assert!(std::mem::size_of::<StallClock>() == 16);

impl StallClock {
    /// A counter that has never stalled.
    pub const fn new() -> StallClock {
        StallClock {
            since: AtomicU64::new(0),
            total: AtomicU64::new(0),
        }
    }

    /// Records a possible transition; `backlogged` says whether anyone
    /// waits now. Cheap when nothing changes.
    pub fn update(&self, backlogged: impl Fn() -> bool) {
        if backlogged() {
            if self.since.load(Ordering::SeqCst) == 0 {
                let _ = self.since.compare_exchange(
                    0,
                    monotonic_ns().max(1),
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
            }
            return;
        }
        let since = self.since.swap(0, Ordering::SeqCst);
        if since != 0 {
            self.total
                .fetch_add(monotonic_ns().saturating_sub(since), Ordering::SeqCst);
            // Someone may have started waiting while we closed the interval.
            if backlogged() {
                let _ = self.since.compare_exchange(
                    0,
                    monotonic_ns().max(1),
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
            }
        }
    }

    /// Total stall time so far, the open interval included, in ns.
    pub fn total_ns(&self) -> u64 {
        let total = self.total.load(Ordering::SeqCst);
        match self.since.load(Ordering::SeqCst) {
            0 => total,
            // A scribbled `since` in the future counts as 0, never negative.
            s => total.saturating_add(monotonic_ns().saturating_sub(s)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn counts_only_backlogged_time() {
        let c = StallClock::new();
        let waiting = Cell::new(false);
        c.update(|| waiting.get());
        assert_eq!(c.total_ns(), 0);
        waiting.set(true);
        c.update(|| waiting.get());
        let t0 = monotonic_ns();
        while monotonic_ns() - t0 < 2_000_000 {
            std::hint::spin_loop();
        }
        waiting.set(false);
        c.update(|| waiting.get());
        let closed = c.total_ns();
        assert!(closed >= 2_000_000, "{closed}");
        // Closed: no longer grows.
        let t1 = monotonic_ns();
        while monotonic_ns() - t1 < 1_000_000 {
            std::hint::spin_loop();
        }
        assert_eq!(c.total_ns(), closed);
    }
}
