//! An exact cumulative stall-time counter, kept at state transitions.
//!
//! PSI's "some" for a budget: the total time during which at least one task
//! waited for capacity. It is not sampled: whoever moves the backlog from
//! empty to non-empty opens the interval; whoever moves it back to empty
//! closes it. A reader adds the open interval.
//!
//! # How it works
//!
//! One word, so that a reading is consistent: bit 63 says the interval is
//! open, bit 62 that a close is half-done, and the low 62 bits (ns, wrapping
//! mod 2^62: 146 years) are the total of the closed intervals while it is
//! closed, the *virtual start* `v = now - total` while it is open (the total
//! is then `now - v`). Opening is one CAS from a clock read before it.
//! Closing takes two: the first marks the close half-done (keeping `v`); the
//! closer then reads the clock and writes `now - v`. Anyone who finds a close
//! half-done finishes it (a reader included). A reader loads the word, reads
//! the clock and loads the word again, and uses the clock only if the word
//! did not change: an opener's clock precedes its CAS, which precedes the
//! reader's first load, which precedes the reader's clock, which precedes
//! the reader's second load, which precedes a closer's first step, which
//! precedes the closer's clock. So a reading is never lower than an earlier
//! one.
//!
//! Transitions race (one thread's last waiter leaves while another's first
//! arrives); each closer re-checks the backlog after closing and reopens the
//! interval if it is not empty, so an interval is never lost for longer than
//! that race.

use crate::sync::atomic::{AtomicU64, Ordering};

use crate::sys::monotonic_ns;

const OPEN: u64 = 1 << 63;
const CLOSING: u64 = 1 << 62;
const FIELD: u64 = CLOSING - 1;
/// How many times a reader retries while the word changes under it.
const READ_TRIES: u32 = 1024;

/// The counter. `#[repr(C)]`, 8 bytes, zero = never stalled.
#[repr(C)]
#[derive(Debug, Default)]
pub struct StallClock {
    /// `OPEN | CLOSING | total or virtual start` (see the module docs).
    word: AtomicU64,
}

// Fixed, except under the model checker (whose atomics are larger).
#[cfg(not(shuttle))]
const _: () = assert!(std::mem::size_of::<StallClock>() == 8);

impl StallClock {
    /// A counter that has never stalled.
    pub const fn new() -> StallClock {
        StallClock {
            word: AtomicU64::new(0),
        }
    }

    /// Records a possible transition; `backlogged` says whether anyone
    /// waits now. Cheap when nothing changes.
    pub fn update(&self, backlogged: impl Fn() -> bool) {
        if backlogged() {
            self.open();
            return;
        }
        if self.close() && backlogged() {
            // Someone may have started waiting while we closed the interval.
            self.open();
        }
    }

    /// Opens the interval if it is closed (a half-done close is reverted:
    /// the interval goes on). True if this call changed the word.
    fn open(&self) -> bool {
        let mut old = self.word.load(Ordering::SeqCst);
        loop {
            let new = if old & OPEN != 0 {
                return false;
            } else if old & CLOSING != 0 {
                OPEN | (old & FIELD)
            } else {
                OPEN | (monotonic_ns().wrapping_sub(old & FIELD) & FIELD)
            };
            match self
                .word
                .compare_exchange_weak(old, new, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return true,
                Err(cur) => old = cur,
            }
        }
    }

    /// Closes the interval if it is open. True if this call closed it.
    fn close(&self) -> bool {
        let mut old = self.word.load(Ordering::SeqCst);
        loop {
            if old & OPEN == 0 {
                self.finish();
                return false;
            }
            let new = CLOSING | (old & FIELD);
            match self
                .word
                .compare_exchange_weak(old, new, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => break,
                Err(cur) => old = cur,
            }
        }
        self.finish();
        true
    }

    /// Finishes a half-done close: the total at a clock read after the load
    /// that found it half-done.
    fn finish(&self) {
        let mut old = self.word.load(Ordering::SeqCst);
        while old & (OPEN | CLOSING) == CLOSING {
            let total = monotonic_ns().wrapping_sub(old & FIELD) & FIELD;
            match self
                .word
                .compare_exchange_weak(old, total, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return,
                Err(cur) => old = cur,
            }
        }
    }

    /// Total stall time so far, the open interval included, in ns. Never
    /// lower than a reading taken before it.
    pub fn total_ns(&self) -> u64 {
        let mut bound = 0;
        for _ in 0..READ_TRIES {
            let w0 = self.word.load(Ordering::SeqCst);
            if w0 & OPEN == 0 {
                if w0 & CLOSING == 0 {
                    return w0 & FIELD;
                }
                self.finish();
                continue;
            }
            let now = monotonic_ns();
            bound = now.wrapping_sub(w0 & FIELD) & FIELD;
            if self.word.load(Ordering::SeqCst) == w0 {
                return bound;
            }
        }
        bound
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
