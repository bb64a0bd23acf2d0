//! Errors of the fair-share ledger.
//!
//! A [`FairError`] is misuse or a broken ledger, never an answer about
//! capacity: refusals are [`Refusal`](super::Refusal) values. Per ruling Q17 a
//! call that fails with a `FairError` changes nothing and does not count as
//! activity. Every message names the bad value and the limit it broke.

use std::fmt;

/// Misuse of the ledger, an invalid configuration or corrupt ledger state.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum FairError {
    /// The configuration was refused; the message names the values.
    InvalidConfig(String),
    /// `acquire` named a tenant that was not configured.
    UnknownTenant(String),
    /// `release` named a lease id that was never issued.
    UnknownLease(String),
    /// `release` named a lease that was issued and already released.
    AlreadyReleased(String),
    /// `now` is earlier than the last accepted `now`.
    TimeWentBackwards {
        /// The `now` passed to the call.
        now_ms: u64,
        /// The latest `now` accepted so far.
        last_ms: u64,
    },
    /// `now` is earlier than the configured `started_at_ms`.
    BeforeStart {
        /// The `now` passed to the call.
        now_ms: u64,
        /// The configured start.
        started_at_ms: u64,
    },
    /// The cost is negative, NaN or infinite.
    InvalidCost(f64),
    /// `hold_ms` is 0 (every lease must declare a positive hold), or so
    /// large that `now_ms + hold_ms` does not fit in a `u64`.
    InvalidHold(u64),
    /// A fixed-capacity table is full.
    CapacityExhausted {
        /// Which table ("lease table").
        what: &'static str,
        /// Its capacity, chosen at creation.
        limit: usize,
    },
    /// The ledger's stored state failed validation (rule 3 of the design:
    /// a value read from the ledger's records was out of range).
    Corrupt(String),
    /// The shared ledger's lock could not be taken or is unrecoverable.
    Lock(String),
    /// The region under a shared ledger failed (registration in the process
    /// table, reaping); the message is the region error's.
    Region(String),
}

impl fmt::Display for FairError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FairError::InvalidConfig(m) => write!(f, "invalid fair-share configuration: {m}"),
            FairError::UnknownTenant(t) => write!(
                f,
                "unknown tenant \"{t}\": tenants are fixed at construction and \"{t}\" is not one of them"
            ),
            FairError::UnknownLease(l) => write!(f, "unknown lease \"{l}\": no lease with this id was ever issued"),
            FairError::AlreadyReleased(l) => write!(f, "lease \"{l}\" was already released"),
            FairError::TimeWentBackwards { now_ms, last_ms } => write!(
                f,
                "now_ms {now_ms} is earlier than the last accepted now_ms {last_ms}; time may not go backwards"
            ),
            FairError::BeforeStart { now_ms, started_at_ms } => write!(
                f,
                "now_ms {now_ms} is earlier than the ledger's started_at_ms {started_at_ms}"
            ),
            FairError::InvalidCost(c) => write!(
                f,
                "cost {} is invalid: it must be finite and not negative",
                super::admission::fmt_num(*c)
            ),
            FairError::InvalidHold(0) => write!(f, "hold_ms 0 is invalid: it must be at least 1"),
            FairError::InvalidHold(h) => write!(
                f,
                "hold_ms {h} is too large: the lease's deadline, now_ms + hold_ms, must be at most {} ms",
                u64::MAX
            ),
            FairError::CapacityExhausted { what, limit } => write!(
                f,
                "capacity exhausted: the {what} is full ({limit} entries); create the ledger with a larger capacity"
            ),
            FairError::Corrupt(m) => write!(f, "corrupt fair-share ledger: {m}"),
            FairError::Lock(m) => write!(f, "fair-share ledger lock: {m}"),
            FairError::Region(m) => write!(f, "fair-share region: {m}"),
        }
    }
}

impl std::error::Error for FairError {}

impl From<FairError> for crate::Error {
    fn from(e: FairError) -> crate::Error {
        match e {
            FairError::Corrupt(m) | FairError::Region(m) => crate::Error::BadRegion(m),
            other => crate::Error::InvalidArgument(other.to_string()),
        }
    }
}
