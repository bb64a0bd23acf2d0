//! Where a scheduler level gets its slots: a counter in process memory, or
//! the slot table of a region. The policy in `node.rs` is written once over
//! this enum; only the mechanism differs.

use std::sync::atomic::{AtomicU32, Ordering};


/// An in-process slot counter: `running` never exceeds the limit passed to
/// [`LocalSlots::try_take`], because the increment is a CAS against it.
#[derive(Debug)]
pub(crate) struct LocalSlots {
    running: AtomicU32,
}

impl LocalSlots {
    pub fn new() -> LocalSlots {
        LocalSlots { running: AtomicU32::new(0) }
    }

    /// Takes one slot iff fewer than `limit` are taken.
    #[inline]
    pub fn try_take(&self, limit: u32) -> bool {
        let mut cur = self.running.load(Ordering::Relaxed);
        loop {
            if cur >= limit {
                return false;
            }
            match self.running.compare_exchange_weak(cur, cur + 1, Ordering::SeqCst, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// Returns one slot.
    #[inline]
    pub fn give(&self) {
        let prev = self.running.fetch_sub(1, Ordering::SeqCst);
        debug_assert!(prev > 0, "slot released twice");
    }

    #[inline]
    pub fn running(&self) -> u32 {
        self.running.load(Ordering::SeqCst)
    }
}
