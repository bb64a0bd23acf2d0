//! A queued task: one per blocked `acquire`, owned jointly by the queue and
//! the waiting thread.
//!
//! The state word is also the futex word the waiting thread sleeps on in
//! process mode. It moves from `WAITING` to `GRANTED` or `FAILED` exactly
//! once, always under the owning node's lock, so a timed-out waiter that
//! takes the lock and still sees `WAITING` can remove itself without racing a
//! grant.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::priority::Priority;

pub(crate) const WAITING: u32 = 0;
pub(crate) const GRANTED: u32 = 1;
pub(crate) const FAILED: u32 = 2;

/// One blocked acquire.
#[derive(Debug)]
pub(crate) struct Waiter {
    /// `WAITING`, then `GRANTED` or `FAILED`; written under the node lock.
    pub state: AtomicU32,
    /// The slot ticket handed over with a grant (a cell index in a region).
    /// Written before `state` becomes `GRANTED` (Release), read after.
    pub ticket: AtomicU32,
    /// The priority it queued at.
    pub priority: Priority,
    /// Ids of the child nodes between the caller's scheduler and the node
    /// whose queue this waiter sits in; disposing any of them fails it.
    pub via: Vec<u64>,
}

impl Waiter {
    pub fn new(priority: Priority, via: Vec<u64>) -> Waiter {
        Waiter { state: AtomicU32::new(WAITING), ticket: AtomicU32::new(0), priority, via }
    }

    pub fn state(&self) -> u32 {
        self.state.load(Ordering::Acquire)
    }
}
