//! STUB until the region layer lands.
#![allow(dead_code, missing_docs)]
use std::sync::atomic::AtomicU32;

use super::stats::SharedStats;

#[derive(Debug)]
pub(crate) struct SharedSlots {
    futex: AtomicU32,
}

impl SharedSlots {
    pub fn max(&self) -> u32 { 0 }
    pub fn try_take(&self, _limit: u32) -> Option<u32> { None }
    pub fn give(&self, _cell: u32) {}
    pub fn running(&self) -> u32 { 0 }
    pub fn others_waiting(&self) -> bool { false }
    pub fn defer_to(&self, _tier: usize, _running: u32) -> Option<u32> { None }
    pub fn publish_waiting(&self, _tier: usize, _delta: i32, _cap: u32) {}
    pub fn wake_after_release(&self) {}
    pub fn wake_process(&self, _idx: u32) {}
    pub fn my_futex(&self) -> &AtomicU32 { &self.futex }
    pub fn notify_mine(&self) {}
    pub fn maybe_reap(&self) {}
    pub fn reap(&self) -> crate::Result<(u32, u64)> { Ok((0, 0)) }
    pub fn owner(&self) -> u32 { 0 }
    pub fn stats(&self) -> SharedStats { SharedStats::default() }
}
