//! Values returned by the ledger: leases, refusals, stats, plans, reports.
//!
//! All of them are plain owned data with `Serialize`; numbers that are whole
//! serialize as JSON integers (`50`, not `50.0`) so call-log replays read
//! like the examples in `docs/fair-share.md`.

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use super::ser_num;

/// A slice of a lease borrowed from one lender's idle guarantee.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Slice {
    /// The lender's tenant id.
    pub lender: String,
    /// Units of the lender's guarantee committed to this lease.
    #[serde(serialize_with = "ser_num")]
    pub units: f64,
}

/// A granted lease. Release it with [`FairShare::release`](super::FairShare::release)
/// by its `id`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Lease {
    /// `${tenant}${n}` with a per-tenant counter from 1 (ruling Q12).
    pub id: String,
    /// The tenant holding the lease.
    pub tenant: String,
    /// The cost declared by the caller (always recorded).
    #[serde(serialize_with = "ser_num")]
    pub cost: f64,
    /// What counts against the ceiling: the cost, or 1 under `requests`.
    #[serde(serialize_with = "ser_num")]
    pub charge: f64,
    /// Units taken from the tenant's own guarantee.
    #[serde(serialize_with = "ser_num")]
    pub own: f64,
    /// Borrowed slices, largest lender first. Empty when wholly own.
    pub slices: Vec<Slice>,
    /// When the lease was granted.
    pub granted_at_ms: u64,
    /// `granted_at_ms + hold_ms`: the declared release deadline.
    pub deadline_ms: u64,
}

/// Why an acquire was refused. `as_str()` gives the seed's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    /// The request needs borrowed units and `hold_ms` exceeds the horizon.
    HoldExceedsReclaimHorizon,
    /// The request fits the tenant's guarantee, but part of it is on loan.
    GuaranteeOnLoan,
    /// The request needs borrowed units and idle lenders cannot cover them.
    NoLendableCapacity,
    /// The charge is larger than the whole ceiling.
    ExceedsCeiling,
}

impl RefusalReason {
    /// The seed's name of the reason, e.g. `"guarantee_on_loan"`.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::HoldExceedsReclaimHorizon => "hold_exceeds_reclaim_horizon",
            RefusalReason::GuaranteeOnLoan => "guarantee_on_loan",
            RefusalReason::NoLendableCapacity => "no_lendable_capacity",
            RefusalReason::ExceedsCeiling => "exceeds_ceiling",
        }
    }
}

impl std::fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for RefusalReason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A refused acquire: an answer, not an error.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Refusal {
    /// The named reason.
    pub reason: RefusalReason,
    /// When retrying unchanged can succeed, in ms from `now`. `None` when no
    /// time can be promised (a blocking lease is overrun, retrying is futile,
    /// or nothing is due back).
    pub retry_after_ms: Option<u64>,
    /// For `guarantee_on_loan`: the minimal earliest-deadline set of leases
    /// holding the tenant's units whose return frees enough (ruling Q6).
    pub blocking_leases: Vec<String>,
    /// A full sentence with the numbers, naming the configured unit.
    pub explanation: String,
}

/// One tenant's line in [`Stats`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TenantStats {
    /// Tenant id.
    pub id: String,
    /// `ceiling * weight / totalWeight`.
    #[serde(serialize_with = "ser_num")]
    pub guarantee: f64,
    /// Total held by the tenant's leases (own plus borrowed).
    #[serde(serialize_with = "ser_num")]
    pub held: f64,
    /// Part of `held` borrowed from other tenants.
    #[serde(serialize_with = "ser_num")]
    pub borrowed: f64,
    /// Units of this tenant's guarantee lent to other tenants' leases.
    #[serde(serialize_with = "ser_num")]
    pub lent: f64,
    /// Stated demand: the largest single refused charge outstanding (0 if none).
    #[serde(serialize_with = "ser_num")]
    pub want: f64,
    /// Integral of `min(guarantee, held + want) - held` over time while short,
    /// in unit × ms.
    #[serde(serialize_with = "ser_num")]
    pub deficit_unit_ms: f64,
    /// Longest wait that ended in a grant; `None` if no wait ended yet.
    pub worst_reclaim_ms: Option<u64>,
    /// Live leases held by the tenant.
    pub leases: u64,
    /// Leases of this tenant released by the reaper (their process died).
    pub reaped_leases: u64,
}

/// Snapshot returned by `stats(now)`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stats {
    /// The `now` of the snapshot.
    pub now_ms: u64,
    /// Per tenant, in constructor order (serialized as an object keyed by id).
    #[serde(serialize_with = "ser_keyed_stats")]
    pub tenants: Vec<TenantStats>,
    /// Live leases past their declared deadline, in creation order. They stay
    /// counted against the ceiling and are never freed by the ledger.
    pub overrun_leases: Vec<String>,
}

impl Stats {
    /// The line for tenant `id`.
    pub fn tenant(&self, id: &str) -> Option<&TenantStats> {
        self.tenants.iter().find(|t| t.id == id)
    }
}

/// One tenant's line in [`FairnessReport`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TenantShare {
    /// Tenant id.
    pub id: String,
    /// Share of the total cost of granted leases since start.
    #[serde(serialize_with = "ser_num")]
    pub cost_share: f64,
    /// Share of the number of granted leases since start.
    #[serde(serialize_with = "ser_num")]
    pub request_share: f64,
    /// Share in the configured unit divided by `weight / totalWeight`.
    #[serde(serialize_with = "ser_num")]
    pub skew: f64,
}

/// Returned by `fairness_report(now)`: both share vectors side by side.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FairnessReport {
    /// Per tenant, constructor order (serialized keyed by id).
    #[serde(serialize_with = "ser_keyed_shares")]
    pub tenants: Vec<TenantShare>,
    /// True when a tenant's two shares differ by more than 0.05 or the
    /// vectors rank two tenants in opposite orders (ruling Q13).
    pub units_disagree: bool,
}

impl FairnessReport {
    /// The line for tenant `id`.
    pub fn tenant(&self, id: &str) -> Option<&TenantShare> {
        self.tenants.iter().find(|t| t.id == id)
    }
}

/// One tenant's line in [`Plan`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanEntry {
    /// Tenant id.
    pub id: String,
    /// Current demand: held plus the outstanding want.
    #[serde(serialize_with = "ser_num")]
    pub demand: f64,
    /// The weighted max-min target for that demand.
    #[serde(serialize_with = "ser_num")]
    pub target: f64,
    /// What the tenant holds now; `held - target` is the drift.
    #[serde(serialize_with = "ser_num")]
    pub held: f64,
}

/// Returned by `plan(now)`: the yardstick, not the admission rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Per tenant, constructor order.
    pub tenants: Vec<PlanEntry>,
}

impl Plan {
    /// The target of tenant `id`.
    pub fn target(&self, id: &str) -> Option<f64> {
        self.tenants.iter().find(|t| t.id == id).map(|t| t.target)
    }
}

impl Serialize for Plan {
    /// An object keyed by tenant id.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.tenants.len()))?;
        for t in &self.tenants {
            m.serialize_entry(&t.id, t)?;
        }
        m.end()
    }
}

fn ser_keyed_stats<S: Serializer>(v: &[TenantStats], s: S) -> Result<S::Ok, S::Error> {
    let mut m = s.serialize_map(Some(v.len()))?;
    for t in v {
        m.serialize_entry(&t.id, t)?;
    }
    m.end()
}

fn ser_keyed_shares<S: Serializer>(v: &[TenantShare], s: S) -> Result<S::Ok, S::Error> {
    let mut m = s.serialize_map(Some(v.len()))?;
    for t in v {
        m.serialize_entry(&t.id, t)?;
    }
    m.end()
}
