//! Construction-time configuration and its validation.
//!
//! Tenants and weights are fixed at construction (the seed has no add,
//! remove or reweight). The fairness unit has no default: the struct field is
//! not optional, and the deserializer refuses a missing `fairness_unit` and
//! any value other than `"cost"` or `"requests"`.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

use super::error::FairError;

/// Longest tenant id, in bytes. Ids live in fixed-size records so that the
/// same ledger can be stored in shared memory.
pub const MAX_TENANT_ID_BYTES: usize = 32;

/// Lease capacity used by [`FairShare::new`](super::FairShare::new).
pub const DEFAULT_LEASE_CAPACITY: usize = 4096;

/// The largest lease capacity a ledger accepts, in-process or in a region
/// (2^20 slots, about 200 MB of lease records): a capacity read from a
/// config line or a call log never makes the process allocate more.
pub const MAX_LEASE_CAPACITY: usize = 1 << 20;

/// What a lease is charged in, and therefore what fairness is measured in.
///
/// Cost is always recorded; this only selects which quantity the ceiling,
/// the guarantees and the admission rule count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FairnessUnit {
    /// Each lease is charged its cost (protects, say, a token budget).
    Cost,
    /// Each lease is charged 1 (protects, say, a connection pool).
    Requests,
}

impl FairnessUnit {
    /// The name used in configs and call logs: `"cost"` or `"requests"`.
    pub fn as_str(self) -> &'static str {
        match self {
            FairnessUnit::Cost => "cost",
            FairnessUnit::Requests => "requests",
        }
    }

    /// How explanations name a quantity of this unit (ruling Q16).
    pub fn noun(self) -> &'static str {
        match self {
            FairnessUnit::Cost => "cost units",
            FairnessUnit::Requests => "requests",
        }
    }

    pub(crate) fn code(self) -> u32 {
        match self {
            FairnessUnit::Cost => 0,
            FairnessUnit::Requests => 1,
        }
    }

    pub(crate) fn from_code(c: u32) -> Option<FairnessUnit> {
        match c {
            0 => Some(FairnessUnit::Cost),
            1 => Some(FairnessUnit::Requests),
            _ => None,
        }
    }
}

impl fmt::Display for FairnessUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FairnessUnit {
    type Err = FairError;
    fn from_str(s: &str) -> Result<FairnessUnit, FairError> {
        match s {
            "cost" => Ok(FairnessUnit::Cost),
            "requests" => Ok(FairnessUnit::Requests),
            other => Err(FairError::InvalidConfig(format!(
                "fairness unit \"{other}\" is not supported; it must be \"cost\" or \"requests\" (there is no default)"
            ))),
        }
    }
}

/// Configuration of a fair-share ceiling.
///
/// ```
/// use shmsched::fair::{FairConfig, FairnessUnit};
/// let cfg = FairConfig {
///     ceiling: 100_000.0,
///     fairness_unit: FairnessUnit::Cost,
///     tenants: vec![("acme".into(), 3.0), ("globex".into(), 1.0)],
///     reclaim_horizon_ms: 250,
///     idle_after_ms: 1_000,
///     started_at_ms: 0,
/// };
/// assert!(cfg.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FairConfig {
    /// Total capacity held concurrently, in the fairness unit. Positive, finite.
    pub ceiling: f64,
    /// Required; see [`FairnessUnit`].
    pub fairness_unit: FairnessUnit,
    /// `(id, weight)` in constructor order; ids unique, non-empty, at most
    /// [`MAX_TENANT_ID_BYTES`] bytes; weights positive and finite.
    #[serde(serialize_with = "ser_tenants", deserialize_with = "de_tenants")]
    pub tenants: Vec<(String, f64)>,
    /// The longest a loan may be committed for, and so the longest a
    /// returning lender waits.
    pub reclaim_horizon_ms: u64,
    /// Quiet time after which a tenant counts as gone and becomes a lender.
    /// Must be strictly greater than `reclaim_horizon_ms`.
    pub idle_after_ms: u64,
    /// Every tenant's last activity starts here (ruling Q1).
    pub started_at_ms: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantSpec {
    id: String,
    weight: f64,
}

fn ser_tenants<S: Serializer>(t: &[(String, f64)], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(t.len()))?;
    for (id, w) in t {
        seq.serialize_element(&serde_json::json!({"id": id, "weight": super::num_value(*w)}))?;
    }
    seq.end()
}

fn de_tenants<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, f64)>, D::Error> {
    let v: Vec<TenantSpec> = Vec::deserialize(d)?;
    Ok(v.into_iter().map(|t| (t.id, t.weight)).collect())
}

impl FairConfig {
    /// Checks every rule of construction; the error names the offending
    /// values.
    pub fn validate(&self) -> Result<(), FairError> {
        let bad = |m: String| Err(FairError::InvalidConfig(m));
        if !(self.ceiling.is_finite() && self.ceiling > 0.0) {
            return bad(format!(
                "ceiling {} must be positive and finite",
                self.ceiling
            ));
        }
        if self.idle_after_ms <= self.reclaim_horizon_ms {
            return bad(format!(
                "idle_after_ms ({}) must be strictly greater than reclaim_horizon_ms ({}): the freeze must still hold \
                 at the instant the worst loan (taken at the ask, for the full horizon) expires",
                self.idle_after_ms, self.reclaim_horizon_ms
            ));
        }
        if self.tenants.is_empty() {
            return bad("at least one tenant is required".into());
        }
        if self.tenants.len() > u32::MAX as usize / 2 {
            return bad(format!("{} tenants is too many", self.tenants.len()));
        }
        for (i, (id, w)) in self.tenants.iter().enumerate() {
            if id.is_empty() {
                return bad(format!("tenant #{i} has an empty id"));
            }
            if id.len() > MAX_TENANT_ID_BYTES {
                return bad(format!(
                    "tenant id \"{id}\" is {} bytes long; the limit is {MAX_TENANT_ID_BYTES}",
                    id.len()
                ));
            }
            if !(w.is_finite() && *w > 0.0) {
                return bad(format!(
                    "tenant \"{id}\" has weight {w}; weights must be positive and finite"
                ));
            }
            for (other, _) in &self.tenants[..i] {
                if other == id {
                    return bad(format!("tenant id \"{id}\" appears more than once"));
                }
                // Lease ids are `${tenant}${n}` (ruling Q12); "a" and "a1" would
                // both display lease "a11", so such pairs are refused.
                for (x, y) in [(other.as_str(), id.as_str()), (id.as_str(), other.as_str())] {
                    if let Some(rest) = y.strip_prefix(x) {
                        if rest.starts_with(|c: char| c.is_ascii_digit()) {
                            return bad(format!(
                                "tenant ids \"{x}\" and \"{y}\" would make lease ids ambiguous (lease ids are the \
                                 tenant id followed by a number)"
                            ));
                        }
                    }
                }
            }
        }
        let total: f64 = self.tenants.iter().map(|t| t.1).sum();
        if !total.is_finite() {
            return bad(format!("the total weight {total} is not finite"));
        }
        Ok(())
    }

    /// Parses a JSON configuration (the `config` line of a call log, without
    /// `op`), refusing a missing or unknown fairness unit.
    pub fn from_json(s: &str) -> Result<FairConfig, FairError> {
        let cfg: FairConfig =
            serde_json::from_str(s).map_err(|e| FairError::InvalidConfig(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The id of tenant `i` (constructor order), as a lease's
    /// [`Slice::lender`](crate::fair::Slice::lender) names it; `None` past
    /// the last tenant.
    ///
    /// ```
    /// # use shmsched::fair::{FairConfig, FairnessUnit};
    /// let cfg = FairConfig {
    ///     ceiling: 10.0,
    ///     fairness_unit: FairnessUnit::Cost,
    ///     tenants: vec![("a".into(), 1.0), ("b".into(), 1.0)],
    ///     reclaim_horizon_ms: 100,
    ///     idle_after_ms: 1_000,
    ///     started_at_ms: 0,
    /// };
    /// assert_eq!(cfg.tenant_id(1), Some("b"));
    /// assert_eq!(cfg.tenant_id(2), None);
    /// ```
    pub fn tenant_id(&self, i: u32) -> Option<&str> {
        self.tenants.get(i as usize).map(|t| t.0.as_str())
    }

    /// The guarantee of tenant `i`: `ceiling * weight / totalWeight`.
    pub fn guarantee(&self, i: usize) -> Option<f64> {
        let total: f64 = self.tenants.iter().map(|t| t.1).sum();
        self.tenants.get(i).map(|t| self.ceiling * t.1 / total)
    }
}
