//! A `MAP_SHARED | MAP_ANONYMOUS` mapping for shared-ledger tests, and a
//! `FairLedger` wrapper that keeps it alive. (The region layer will provide
//! real mappings; this stands in for it.)

#![allow(dead_code)]

use shmsched::fair::shared::SharedLedger;
use shmsched::fair::{
    AcquireResult, FairConfig, FairError, FairLedger, FairnessReport, Plan, Stats,
};

pub struct Mapping {
    pub ptr: *mut u8,
    pub len: usize,
}

impl Mapping {
    pub fn new(len: usize) -> Mapping {
        // SAFETY: a fresh anonymous shared mapping; arguments are valid.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap failed");
        Mapping {
            ptr: p as *mut u8,
            len,
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: created by `new` with this length; handles are dropped first.
        unsafe { libc::munmap(self.ptr as *mut _, self.len) };
    }
}

/// A shared ledger plus the mapping it lives in (dropped after it).
pub struct TestShared {
    pub ledger: SharedLedger,
    pub map: Mapping,
}

impl TestShared {
    pub fn create(cfg: &FairConfig, cap: usize) -> Result<TestShared, FairError> {
        let len = SharedLedger::required_size(cfg, cap)?;
        let map = Mapping::new(len);
        // SAFETY: the mapping is fresh, large enough and outlives the ledger.
        let ledger = unsafe { SharedLedger::create(map.ptr, map.len, cfg, cap)? };
        Ok(TestShared { ledger, map })
    }

    /// Another handle on the same memory (as another process would open it).
    pub fn attach(&self) -> Result<SharedLedger, FairError> {
        // SAFETY: the mapping outlives the returned handle in every test.
        unsafe { SharedLedger::attach(self.map.ptr, self.map.len) }
    }
}

impl FairLedger for TestShared {
    fn acquire(&mut self, tenant: &str, cost: f64, hold_ms: u64, now_ms: u64) -> AcquireResult {
        self.ledger.acquire(tenant, cost, hold_ms, now_ms)
    }
    fn release(&mut self, lease_id: &str, now_ms: u64) -> Result<(), FairError> {
        self.ledger.release(lease_id, now_ms)
    }
    fn stats(&mut self, now_ms: u64) -> Result<Stats, FairError> {
        self.ledger.stats(now_ms)
    }
    fn plan(&mut self, now_ms: u64) -> Result<Plan, FairError> {
        self.ledger.plan(now_ms)
    }
    fn fairness_report(&mut self, now_ms: u64) -> Result<FairnessReport, FairError> {
        self.ledger.fairness_report(now_ms)
    }
}
