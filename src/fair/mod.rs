//! FairShare: one capacity ceiling shared by weighted tenants, lending what
//! idle tenants are not using and getting it back within a bounded horizon.
//!
//! Its conventions (guarantees, lending, the reclaim horizon, the order in
//! which an acquire is decided, the statistics) and the call-log format are
//! described in `docs/fair-share.md`. Every entry point takes an explicit `now`
//! (milliseconds): there are no timers and no background sweeps, so a stall
//! can be replayed exactly from a recorded call log ([`replay()`]).
//!
//! ```
//! use shmsched::fair::{FairConfig, FairShare, FairnessUnit};
//!
//! let mut fair = FairShare::new(FairConfig {
//!     ceiling: 100_000.0,
//!     fairness_unit: FairnessUnit::Cost,
//!     tenants: vec![("acme".into(), 3.0), ("globex".into(), 1.0)],
//!     reclaim_horizon_ms: 250,
//!     idle_after_ms: 1_000,
//!     started_at_ms: 0,
//! })?;
//! match fair.acquire("acme", 4_200.0, 200, 0)? {
//!     Ok(lease) => {
//!         // ... call the model ...
//!         fair.release(&lease.id, 150)?;
//!     }
//!     Err(refusal) => eprintln!("{} {:?} {}", refusal.reason, refusal.retry_after_ms, refusal.explanation),
//! }
//! let stats = fair.stats(150)?;
//! assert_eq!(stats.tenant("acme").unwrap().guarantee, 75_000.0);
//! # Ok::<(), shmsched::fair::FairError>(())
//! ```
//!
//! Misuse (unknown tenant or lease, double release, time going backwards,
//! bad cost, `hold_ms` 0) is a [`FairError`] and changes nothing; a refusal
//! is an answer, `Ok(Err(Refusal))`.
//!
//! # Two homes
//!
//! The ledger's logic is written once (`admission.rs`) over fixed-size
//! `#[repr(C)]` records (`store.rs`), and runs in either home:
//!
//! - **In-process**, [`FairShare`]: the records in boxed slices of this
//!   process. For tests, single-process users and exact replays.
//! - **In a region**, [`SharedFairShare`]: the same records in a
//!   memory-mapped [`Region`](crate::region::Region) shared by many
//!   processes, two copies under a robust process-shared mutex, each call
//!   committed by flipping one index ([`shared`]), so a process killed
//!   mid-call leaves the last committed state. [`FairShare::shared`] creates
//!   the ledger (or validates an existing one: another configuration is
//!   [`Error::Mismatch`](crate::Error::Mismatch) naming what differs), and
//!   [`FairShare::attach`] joins whatever configuration a region stores.
//!   Leases record the process that took them; a process that dies has its
//!   leases released when its death is noticed ([`SharedFairShare::reap`],
//!   and on the acquire path when capacity is short), counted as
//!   `reaped_leases`.
//!
//! ```
//! use shmsched::fair::{FairConfig, FairShare, FairnessUnit};
//! use shmsched::region::Region;
//!
//! let cfg = FairConfig {
//!     ceiling: 100.0,
//!     fairness_unit: FairnessUnit::Cost,
//!     tenants: vec![("a".into(), 1.0), ("b".into(), 1.0)],
//!     reclaim_horizon_ms: 100,
//!     idle_after_ms: 1_000,
//!     started_at_ms: 0,
//! };
//! // A prefork master creates the region before forking its workers
//! // (or every process opens the same name with `Region::open_or_create`).
//! let region = Region::anonymous()?;
//! let mut fair = FairShare::shared(&region, &cfg)?;
//! // Times in a region are CLOCK_MONOTONIC ms, shared by every process;
//! // the `*_now` calls read it while holding the ledger's lock.
//! if let Ok(lease) = fair.acquire_now("a", 30.0, 50)? {
//!     fair.release_now(&lease.id)?;
//! }
//! // Another process (or thread) joins whatever the region holds.
//! let mut other = FairShare::attach(&region)?;
//! assert_eq!(other.config(), &cfg);
//! assert_eq!(other.stats_now()?.tenant("a").unwrap().held, 0.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The [`FairLedger`] trait is implemented by [`FairShare`],
//! [`SharedFairShare`] and the raw [`shared::SharedLedger`], and the
//! conformance traces in `tests/common` run against each.

mod admission;
mod config;
mod error;
mod plan;
pub mod region;
pub mod replay;
pub mod shared;
mod store;
mod types;

pub use admission::TOLERANCE;
pub use config::{
    FairConfig, FairnessUnit, DEFAULT_LEASE_CAPACITY, MAX_LEASE_CAPACITY, MAX_TENANT_ID_BYTES,
};
pub use error::FairError;
pub use plan::plan_allocation;
pub use region::{FairInspection, ReapOutcome, SharedFairShare};
pub use replay::{replay, ReplaySummary};
pub use store::MAX_SLICES;
pub use types::{
    FairnessReport, Lease, LeaseId, Plan, PlanEntry, Refusal, RefusalReason, Slice, SliceIter,
    Slices, Stats, TenantId, TenantShare, TenantStats,
};

use crate::sys::clock::monotonic_ms;
use serde::Serializer;
use store::{MetaRec, OwnedState, Params, TenantRec, View, FLAG_REFUSAL_NOT_ACTIVITY};

/// The result of an acquire: misuse is the outer `Err`; a refusal is
/// `Ok(Err(Refusal))`; a grant is `Ok(Ok(Lease))`.
pub type AcquireResult = Result<Result<Lease, Refusal>, FairError>;

/// The operations of a fair-share ledger, whichever home holds its state.
/// The conformance traces are written against this trait.
pub trait FairLedger {
    /// Asks for `cost` (charged in the fairness unit) held for `hold_ms`.
    fn acquire(&mut self, tenant: &str, cost: f64, hold_ms: u64, now_ms: u64) -> AcquireResult;
    /// Gives back a lease by id.
    fn release(&mut self, lease_id: &str, now_ms: u64) -> Result<(), FairError>;
    /// Per-tenant guarantee, held, borrowed, lent, want, deficit and worst
    /// reclaim, and the overrun leases.
    fn stats(&mut self, now_ms: u64) -> Result<Stats, FairError>;
    /// Weighted max-min targets for current demand.
    fn plan(&mut self, now_ms: u64) -> Result<Plan, FairError>;
    /// Cost and request shares side by side.
    fn fairness_report(&mut self, now_ms: u64) -> Result<FairnessReport, FairError>;
}

/// Serializes whole numbers as JSON integers, others as floats.
pub(crate) fn ser_num<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    if x.is_finite() && x.fract() == 0.0 && x.abs() < 9.0e15 {
        s.serialize_i64(*x as i64)
    } else {
        s.serialize_f64(*x)
    }
}

/// A number as a JSON value, whole numbers as integers.
pub(crate) fn num_value(x: f64) -> serde_json::Value {
    if x.is_finite() && x.fract() == 0.0 && x.abs() < 9.0e15 {
        serde_json::Value::from(x as i64)
    } else {
        serde_json::Value::from(x)
    }
}

/// Validates `cfg` and builds the parameters and initial records.
pub(crate) fn initial_state(
    cfg: &FairConfig,
    lease_capacity: usize,
) -> Result<(Params, MetaRec, Vec<TenantRec>), FairError> {
    cfg.validate()?;
    if lease_capacity == 0 || lease_capacity > MAX_LEASE_CAPACITY {
        return Err(FairError::InvalidConfig(format!(
            "lease capacity {lease_capacity} is out of range: it must be between 1 and \
             {MAX_LEASE_CAPACITY}"
        )));
    }
    let total: f64 = cfg.tenants.iter().map(|t| t.1).sum();
    let params = Params {
        ceiling: cfg.ceiling,
        total_weight: total,
        unit: cfg.fairness_unit.code(),
        flags: 0,
        reclaim_horizon_ms: cfg.reclaim_horizon_ms,
        idle_after_ms: cfg.idle_after_ms,
        started_at_ms: cfg.started_at_ms,
        tenant_count: cfg.tenants.len() as u32,
        lease_capacity: lease_capacity as u32,
    };
    let tenants = cfg
        .tenants
        .iter()
        .map(|(id, w)| TenantRec::new(id, *w, cfg.ceiling * w / total, cfg.started_at_ms))
        .collect::<Result<Vec<_>, _>>()?;
    let meta = MetaRec {
        last_now_ms: cfg.started_at_ms,
        ..MetaRec::default()
    };
    Ok((params, meta, tenants))
}

/// The in-process fair-share ledger.
///
/// State lives in fixed-capacity boxed slices of the same records the shared
/// home uses. Methods take `&mut self`; wrap it in a `Mutex` to share it
/// between threads.
#[derive(Debug)]
pub struct FairShare {
    cfg: FairConfig,
    params: Params,
    state: OwnedState,
    /// Sorts the overrun leases of `stats` (kept, so that a `stats_into`
    /// of a fixed shape allocates nothing).
    scratch: Vec<(u64, u32)>,
    log: Option<Vec<String>>,
}

impl FairShare {
    /// Validates `cfg` and builds a ledger with [`DEFAULT_LEASE_CAPACITY`]
    /// lease slots.
    pub fn new(cfg: FairConfig) -> Result<FairShare, FairError> {
        FairShare::with_capacity(cfg, DEFAULT_LEASE_CAPACITY)
    }

    /// Like [`FairShare::new`] with `lease_capacity` slots (at most
    /// [`MAX_LEASE_CAPACITY`]); a grant that finds the table full fails with
    /// [`FairError::CapacityExhausted`]. Memory the system cannot give is
    /// an error too, never an abort.
    pub fn with_capacity(cfg: FairConfig, lease_capacity: usize) -> Result<FairShare, FairError> {
        let (params, meta, tenants) = initial_state(&cfg, lease_capacity)?;
        Ok(FairShare {
            cfg,
            params,
            state: OwnedState::new(meta, tenants, lease_capacity)?,
            scratch: Vec::new(),
            log: None,
        })
    }

    /// Like [`FairShare::with_capacity`], recording every call from
    /// construction on in the call-log format (see [`replay()`]).
    pub fn recording(cfg: FairConfig, lease_capacity: usize) -> Result<FairShare, FairError> {
        let mut f = FairShare::with_capacity(cfg, lease_capacity)?;
        let mut line =
            serde_json::to_value(&f.cfg).map_err(|e| FairError::InvalidConfig(e.to_string()))?;
        if let Some(o) = line.as_object_mut() {
            o.insert("op".into(), "config".into());
            o.insert("lease_capacity".into(), lease_capacity.into());
        }
        f.log = Some(vec![line.to_string()]);
        Ok(f)
    }

    /// The recorded call log (one JSON line per call, config first), if
    /// this ledger was built with [`FairShare::recording`].
    pub fn call_log(&self) -> Option<&[String]> {
        self.log.as_deref()
    }

    /// The configuration this ledger was built from.
    pub fn config(&self) -> &FairConfig {
        &self.cfg
    }

    /// Test seam for trace T10: when `false`, a refused acquire no longer
    /// marks the tenant active (disabling the reclaim freeze). Never use it
    /// outside tests.
    #[doc(hidden)]
    pub fn set_refusal_counts_as_activity(&mut self, yes: bool) {
        if yes {
            self.params.flags &= !FLAG_REFUSAL_NOT_ACTIVITY;
        } else {
            self.params.flags |= FLAG_REFUSAL_NOT_ACTIVITY;
        }
    }

    /// A view of the state: its parts were built for `self.params` (in
    /// `with_capacity`, and never replaced), so their lengths are not
    /// checked again on every call.
    #[inline(always)]
    fn view(&mut self) -> Result<View<'_>, FairError> {
        Ok(self.state.view_built(&self.params))
    }

    /// Appends a call-log line; the line is only built when recording.
    #[inline(always)]
    fn record(&mut self, v: impl FnOnce() -> serde_json::Value) {
        if self.log.is_some() {
            self.record_line(v);
        }
    }

    /// The recording part of [`record`](Self::record), out of the call's
    /// way (a call that does not record pays one test).
    #[cold]
    fn record_line(&mut self, v: impl FnOnce() -> serde_json::Value) {
        if let Some(log) = &mut self.log {
            log.push(v().to_string());
        }
    }

    /// Asks for `cost` held for `hold_ms` on behalf of `tenant` at `now_ms`.
    /// See the module docs for the decision order.
    #[inline]
    pub fn acquire(&mut self, tenant: &str, cost: f64, hold_ms: u64, now_ms: u64) -> AcquireResult {
        self.record(|| serde_json::json!({"op":"acquire","tenant":tenant,"cost":num_value(cost),"hold_ms":hold_ms,"now_ms":now_ms}));
        let mut out = std::mem::MaybeUninit::uninit();
        let answer = admission::acquire(
            &mut self.view()?,
            0,
            tenant,
            cost,
            hold_ms,
            now_ms,
            &mut || false,
            &mut out,
        )?;
        answer.into_result(&out)
    }

    /// Releases the lease `lease_id` at `now_ms` (activity of its holder).
    #[inline]
    pub fn release(&mut self, lease_id: &str, now_ms: u64) -> Result<(), FairError> {
        self.record(|| serde_json::json!({"op":"release","lease":lease_id,"now_ms":now_ms}));
        admission::release(&mut self.view()?, lease_id, now_ms)
    }

    /// Stats at `now_ms` (integrates deficits up to `now_ms`).
    pub fn stats(&mut self, now_ms: u64) -> Result<Stats, FairError> {
        let mut out = Stats::default();
        self.stats_into(now_ms, &mut out)?;
        Ok(out)
    }

    /// [`stats`](Self::stats) into `out`, reusing its vectors: with the
    /// same tenants and no more overrun leases than last time, nothing is
    /// allocated (recording aside). On an error `out` is unspecified.
    pub fn stats_into(&mut self, now_ms: u64, out: &mut Stats) -> Result<(), FairError> {
        self.record(|| serde_json::json!({"op":"stats","now_ms":now_ms}));
        let mut scratch = std::mem::take(&mut self.scratch);
        let r = admission::stats_into(&mut self.view()?, now_ms, out, &mut scratch);
        self.scratch = scratch;
        r
    }

    /// The weighted max-min plan for current demand at `now_ms`.
    pub fn plan(&mut self, now_ms: u64) -> Result<Plan, FairError> {
        self.record(|| serde_json::json!({"op":"plan","now_ms":now_ms}));
        admission::plan(&mut self.view()?, now_ms)
    }

    /// Cost and request shares of granted leases since start.
    pub fn fairness_report(&mut self, now_ms: u64) -> Result<FairnessReport, FairError> {
        self.record(|| serde_json::json!({"op":"report","now_ms":now_ms}));
        admission::report(&mut self.view()?, now_ms)
    }

    /// [`acquire`](Self::acquire) at `CLOCK_MONOTONIC` milliseconds (the
    /// clock a region's processes share; read while `&mut self` excludes
    /// every other call, so time never goes backwards).
    pub fn acquire_now(&mut self, tenant: &str, cost: f64, hold_ms: u64) -> AcquireResult {
        self.acquire(tenant, cost, hold_ms, monotonic_ms())
    }

    /// [`release`](Self::release) at the clock.
    pub fn release_now(&mut self, lease_id: &str) -> Result<(), FairError> {
        self.release(lease_id, monotonic_ms())
    }

    /// [`stats`](Self::stats) at the clock.
    pub fn stats_now(&mut self) -> Result<Stats, FairError> {
        self.stats(monotonic_ms())
    }

    /// [`stats_into`](Self::stats_into) at the clock.
    pub fn stats_into_now(&mut self, out: &mut Stats) -> Result<(), FairError> {
        self.stats_into(monotonic_ms(), out)
    }

    /// [`plan`](Self::plan) at the clock.
    pub fn plan_now(&mut self) -> Result<Plan, FairError> {
        self.plan(monotonic_ms())
    }

    /// [`fairness_report`](Self::fairness_report) at the clock.
    pub fn fairness_report_now(&mut self) -> Result<FairnessReport, FairError> {
        self.fairness_report(monotonic_ms())
    }
}

impl FairLedger for FairShare {
    fn acquire(&mut self, tenant: &str, cost: f64, hold_ms: u64, now_ms: u64) -> AcquireResult {
        FairShare::acquire(self, tenant, cost, hold_ms, now_ms)
    }
    fn release(&mut self, lease_id: &str, now_ms: u64) -> Result<(), FairError> {
        FairShare::release(self, lease_id, now_ms)
    }
    fn stats(&mut self, now_ms: u64) -> Result<Stats, FairError> {
        FairShare::stats(self, now_ms)
    }
    fn plan(&mut self, now_ms: u64) -> Result<Plan, FairError> {
        FairShare::plan(self, now_ms)
    }
    fn fairness_report(&mut self, now_ms: u64) -> Result<FairnessReport, FairError> {
        FairShare::fairness_report(self, now_ms)
    }
}
