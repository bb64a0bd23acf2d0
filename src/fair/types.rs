//! Values returned by the ledger: leases, refusals, stats, plans, reports.
//!
//! All of them are plain owned data with `Serialize`; numbers that are whole
//! serialize as JSON integers (`50`, not `50.0`) so call-log replays read
//! like the examples in `docs/fair-share.md`.
//!
//! What a successful call returns holds no heap memory: tenant and lease
//! ids are short strings stored inline ([`TenantId`], [`LeaseId`], which
//! dereference to `str`), and a lease's borrowed slices are fixed arrays
//! ([`Slices`], lenders by tenant index). So an acquire, a release
//! and a [`stats_into`](super::FairShare::stats_into) of a fixed shape
//! allocate nothing. Refusals carry an explanation sentence (a `String`):
//! a refusal is not the success path.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::mem::MaybeUninit;
use std::ops::Deref;

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};

use super::config::MAX_TENANT_ID_BYTES;
use super::ser_num;
use super::store::MAX_SLICES;

/// Defines a string type of at most `$cap` bytes stored inline.
macro_rules! inline_str {
    ($(#[$doc:meta])* $name:ident, $cap:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        pub struct $name {
            len: u8,
            buf: [u8; $cap],
        }

        impl $name {
            /// The most bytes it holds.
            pub const CAPACITY: usize = $cap;

            /// The text.
            #[inline]
            pub fn as_str(&self) -> &str {
                let b = &self.buf[..(self.len as usize).min($cap)];
                // SAFETY: `buf[..len]` is only ever written by `push`, which
                // appends a whole `&str` (valid UTF-8) and moves `len` to its
                // end, and by `LeaseId::new`, which appends ASCII digits
                // after a `push`; the fields are private to this module, and
                // a fresh value is empty. A concatenation of valid UTF-8
                // strings is valid UTF-8.
                unsafe { std::str::from_utf8_unchecked(b) }
            }

            /// Appends `s` if it fits whole, else leaves `self` unchanged
            /// and returns false.
            pub(crate) fn push(&mut self, s: &str) -> bool {
                let at = self.len as usize;
                let Some(end) = at.checked_add(s.len()).filter(|&e| e <= $cap) else {
                    return false;
                };
                self.buf[at..end].copy_from_slice(s.as_bytes());
                self.len = end as u8;
                true
            }
        }

        impl Default for $name {
            fn default() -> Self {
                $name { len: 0, buf: [0; $cap] }
            }
        }

        impl Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                self.as_str()
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                self.as_str()
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                self.as_str()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(self.as_str(), f)
            }
        }

        impl PartialEq for $name {
            fn eq(&self, o: &$name) -> bool {
                self.as_str() == o.as_str()
            }
        }

        impl Eq for $name {}

        impl PartialOrd for $name {
            fn partial_cmp(&self, o: &$name) -> Option<std::cmp::Ordering> {
                Some(self.cmp(o))
            }
        }

        impl Ord for $name {
            fn cmp(&self, o: &$name) -> std::cmp::Ordering {
                self.as_str().cmp(o.as_str())
            }
        }

        impl Hash for $name {
            fn hash<H: Hasher>(&self, h: &mut H) {
                self.as_str().hash(h)
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, o: &str) -> bool {
                self.as_str() == o
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, o: &&str) -> bool {
                self.as_str() == *o
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, o: &String) -> bool {
                self.as_str() == o.as_str()
            }
        }

        impl PartialEq<$name> for str {
            fn eq(&self, o: &$name) -> bool {
                self == o.as_str()
            }
        }

        impl PartialEq<$name> for &str {
            fn eq(&self, o: &$name) -> bool {
                *self == o.as_str()
            }
        }

        impl PartialEq<$name> for String {
            fn eq(&self, o: &$name) -> bool {
                self.as_str() == o.as_str()
            }
        }

        impl From<$name> for String {
            fn from(s: $name) -> String {
                s.as_str().to_string()
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
    };
}

inline_str!(
    /// A tenant id (1 to [`MAX_TENANT_ID_BYTES`] bytes), stored inline: no
    /// heap. Dereferences to `str`; compares equal to `&str` and `String`.
    TenantId,
    MAX_TENANT_ID_BYTES
);

inline_str!(
    /// A lease id, `${tenant}${n}` (ruling Q12), stored inline: no heap.
    /// Dereferences to `str` (pass `&lease.id` where a `&str` is wanted);
    /// compares equal to `&str` and `String`.
    LeaseId,
    MAX_TENANT_ID_BYTES + 20
);

impl TenantId {
    /// `id` as a tenant id, or `None` when it is longer than
    /// [`MAX_TENANT_ID_BYTES`].
    pub fn new(id: &str) -> Option<TenantId> {
        let mut t = TenantId::default();
        t.push(id).then_some(t)
    }
}

impl LeaseId {
    /// The id of lease number `no` of `tenant`: the tenant id followed by
    /// `no` in decimal. `None` when `tenant` is longer than
    /// [`MAX_TENANT_ID_BYTES`].
    pub fn new(tenant: &str, no: u64) -> Option<LeaseId> {
        let mut id = LeaseId::default();
        if !id.push(tenant) {
            return None;
        }
        // The digits are written straight into the buffer, last first, two
        // at a time (no scratch array, no UTF-8 check: ASCII digits are
        // valid UTF-8).
        let at = id.len as usize;
        let digits = no.checked_ilog10().map_or(1, |d| d as usize + 1);
        // A tenant id is at most MAX_TENANT_ID_BYTES and a u64 at most 20
        // digits, which is the capacity; checked anyway, no panic.
        let end = at + digits;
        let buf = id.buf.get_mut(at..end)?;
        let mut n = no;
        let mut i = buf.len();
        while i >= 2 {
            let r = (n % 100) as usize * 2;
            n /= 100;
            i -= 2;
            buf[i..i + 2].copy_from_slice(&DIGIT_PAIRS[r..r + 2]);
        }
        if i == 1 {
            buf[0] = b'0' + (n % 10) as u8;
        }
        id.len = end as u8;
        Some(id)
    }
}

impl LeaseId {
    /// [`LeaseId::new`] for a tenant id already checked: the tenant's
    /// bytes and the digits are copied as fixed-size blocks (the tenant's
    /// whole buffer, then 20 bytes that start with the digits), with no
    /// variable-length copy, and the digits are counted as they are
    /// written (no logarithm).
    #[inline]
    pub(crate) fn of(tenant: &TenantId, no: u64) -> LeaseId {
        const _: () = assert!(MAX_TENANT_ID_BYTES + 20 == LeaseId::CAPACITY);
        // The digits end at d[20] (a u64 has at most 20), zeros after.
        let mut d = [0u8; 40];
        let mut i = 20;
        let mut n = no;
        while n >= 100 {
            let r = (n % 100) as usize * 2;
            n /= 100;
            i -= 2;
            d[i] = DIGIT_PAIRS[r];
            d[i + 1] = DIGIT_PAIRS[r + 1];
        }
        if n >= 10 {
            let r = n as usize * 2;
            i -= 2;
            d[i] = DIGIT_PAIRS[r];
            d[i + 1] = DIGIT_PAIRS[r + 1];
        } else {
            i -= 1;
            d[i] = b'0' + n as u8;
        }
        let mut id = LeaseId {
            len: 0,
            buf: [0; MAX_TENANT_ID_BYTES + 20],
        };
        let at = (tenant.len as usize).min(MAX_TENANT_ID_BYTES);
        id.buf[..MAX_TENANT_ID_BYTES].copy_from_slice(&tenant.buf);
        id.buf[at..at + 20].copy_from_slice(&d[i..i + 20]);
        // Bytes past `len` (zeros) are never read.
        id.len = (at + 20 - i) as u8;
        id
    }
}

/// "00" to "99", for writing numbers two digits at a time.
const DIGIT_PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// A slice of a lease borrowed from one lender's idle guarantee.
///
/// The lender is recorded by its index in the configuration's tenant list
/// ([`FairConfig::tenant_id`](crate::fair::FairConfig::tenant_id) gives its id): a lease stays small
/// (it is moved by value out of `acquire`), and its slices hold no text.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Slice {
    /// The lender's index in the configuration's tenants (constructor
    /// order).
    pub lender: u32,
    /// Units of the lender's guarantee committed to this lease.
    #[serde(serialize_with = "ser_num")]
    pub units: f64,
}

/// A lease's borrowed slices, largest lender first (at most
/// [`MAX_SLICES`]), stored inline: [`len`](Slices::len),
/// [`get`](Slices::get) and [`iter`](Slices::iter) give them as [`Slice`]
/// values.
#[derive(Clone, Copy)]
pub struct Slices {
    /// `units[..n]` and `lenders[..n]` are initialised (the rest are never
    /// read, so a lease without slices costs no initialisation of them).
    /// Two arrays, not one of `Slice` (which pads each lender to 8 bytes):
    /// a whole lease fits in 256 bytes, the most a copy moves in one go.
    units: [MaybeUninit<f64>; MAX_SLICES],
    lenders: [MaybeUninit<u32>; MAX_SLICES],
    n: u8,
}

impl Slices {
    /// No slices.
    pub fn new() -> Slices {
        Slices {
            units: [MaybeUninit::uninit(); MAX_SLICES],
            lenders: [MaybeUninit::uninit(); MAX_SLICES],
            n: 0,
        }
    }

    /// Appends a slice; false (and unchanged) when already full.
    pub(crate) fn push(&mut self, s: Slice) -> bool {
        let i = self.n as usize;
        match (self.units.get_mut(i), self.lenders.get_mut(i)) {
            (Some(u), Some(l)) => {
                u.write(s.units);
                l.write(s.lender);
                self.n += 1;
                true
            }
            _ => false,
        }
    }

    /// Number of slices.
    #[inline]
    pub fn len(&self) -> usize {
        (self.n as usize).min(MAX_SLICES)
    }

    /// True when the lease borrows nothing.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Slice `i`, if there is one.
    #[inline]
    pub fn get(&self, i: usize) -> Option<Slice> {
        if i >= self.len() {
            return None;
        }
        // SAFETY: `units[..n]` and `lenders[..n]` were initialised by
        // `push` (the only writer, which moves `n` past each item it
        // writes; fields are private), and `i < n`.
        unsafe {
            Some(Slice {
                lender: self.lenders[i].assume_init(),
                units: self.units[i].assume_init(),
            })
        }
    }

    /// The slices in order, largest lender first.
    pub fn iter(&self) -> SliceIter<'_> {
        SliceIter { s: self, i: 0 }
    }

    /// The slices as a vector (allocates).
    pub fn to_vec(&self) -> Vec<Slice> {
        self.iter().collect()
    }
}

/// Iterator over a lease's [`Slices`].
#[derive(Debug, Clone)]
pub struct SliceIter<'a> {
    s: &'a Slices,
    i: usize,
}

impl Iterator for SliceIter<'_> {
    type Item = Slice;
    fn next(&mut self) -> Option<Slice> {
        let x = self.s.get(self.i)?;
        self.i += 1;
        Some(x)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.s.len() - self.i.min(self.s.len());
        (n, Some(n))
    }
}

impl ExactSizeIterator for SliceIter<'_> {}

impl<'a> IntoIterator for &'a Slices {
    type Item = Slice;
    type IntoIter = SliceIter<'a>;
    fn into_iter(self) -> SliceIter<'a> {
        self.iter()
    }
}

impl Default for Slices {
    fn default() -> Slices {
        Slices::new()
    }
}

impl fmt::Debug for Slices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq for Slices {
    fn eq(&self, o: &Slices) -> bool {
        self.iter().eq(o.iter())
    }
}

impl Serialize for Slices {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.len()))?;
        for x in self.iter() {
            seq.serialize_element(&x)?;
        }
        seq.end()
    }
}

/// A granted lease. Release it with [`FairShare::release`](super::FairShare::release)
/// by its `id` (`fair.release(&lease.id, now)`). Plain data, no heap, at
/// most 256 bytes (it is returned by value; see `LEASE_BYTES` in the
/// tests).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Lease {
    /// `${tenant}${n}` with a per-tenant counter from 1 (ruling Q12).
    pub id: LeaseId,
    /// The tenant holding the lease.
    pub tenant: TenantId,
    /// The cost declared by the caller (always recorded).
    #[serde(serialize_with = "ser_num")]
    pub cost: f64,
    /// What counts against the ceiling: the cost, or 1 under `requests`.
    #[serde(serialize_with = "ser_num")]
    pub charge: f64,
    /// Units taken from the tenant's own guarantee.
    #[serde(serialize_with = "ser_num")]
    pub own: f64,
    /// Borrowed slices, largest lender first, lenders by tenant index.
    /// Empty when wholly own.
    pub slices: Slices,
    /// When the lease was granted (in a region, the `now` the ledger took:
    /// never earlier than the last accepted one).
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
    pub id: TenantId,
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

/// Snapshot returned by `stats(now)`. `Stats::default()` is an empty one
/// to fill with [`FairShare::stats_into`](super::FairShare::stats_into).
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct Stats {
    /// The `now` of the snapshot (in a region, the `now` the ledger took:
    /// never earlier than the last accepted one).
    pub now_ms: u64,
    /// Per tenant, in constructor order (serialized as an object keyed by id).
    #[serde(serialize_with = "ser_keyed_stats")]
    pub tenants: Vec<TenantStats>,
    /// Live leases past their declared deadline, in creation order. They stay
    /// counted against the ceiling and are never freed by the ledger.
    pub overrun_leases: Vec<LeaseId>,
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
    pub id: TenantId,
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
    pub id: TenantId,
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
            m.serialize_entry(t.id.as_str(), t)?;
        }
        m.end()
    }
}

fn ser_keyed_stats<S: Serializer>(v: &[TenantStats], s: S) -> Result<S::Ok, S::Error> {
    let mut m = s.serialize_map(Some(v.len()))?;
    for t in v {
        m.serialize_entry(t.id.as_str(), t)?;
    }
    m.end()
}

fn ser_keyed_shares<S: Serializer>(v: &[TenantShare], s: S) -> Result<S::Ok, S::Error> {
    let mut m = s.serialize_map(Some(v.len()))?;
    for t in v {
        m.serialize_entry(t.id.as_str(), t)?;
    }
    m.end()
}

#[cfg(test)]
mod tests {
    use super::{Lease, LeaseId, Slice, Slices, TenantId};
    use crate::fair::{AcquireResult, MAX_SLICES, MAX_TENANT_ID_BYTES};

    /// A lease is returned by value and moved again by the caller's
    /// `unwrap`s: it (and the whole answer) stays within the 256 bytes one
    /// copy moves in one go (it was 520 with the lenders' ids inline).
    #[test]
    fn a_lease_fits_in_256_bytes() {
        assert_eq!(std::mem::size_of::<Lease>(), 232);
        assert!(std::mem::size_of::<AcquireResult>() <= 256);
        assert!(std::mem::size_of::<Result<Lease, super::Refusal>>() <= 256);
    }

    #[test]
    fn slices_keep_their_order_and_bound() {
        let mut s = Slices::new();
        assert!(s.is_empty() && s.iter().next().is_none() && s.get(0).is_none());
        for i in 0..MAX_SLICES as u32 {
            assert!(s.push(Slice {
                lender: i + 1,
                units: f64::from(i) * 1.5,
            }));
        }
        assert!(!s.push(Slice {
            lender: 99,
            units: 1.0
        }));
        assert_eq!(s.len(), MAX_SLICES);
        let v = s.to_vec();
        assert_eq!(v.len(), MAX_SLICES);
        for (i, x) in v.iter().enumerate() {
            assert_eq!(x.lender, i as u32 + 1);
            assert_eq!(x.units, i as f64 * 1.5);
        }
        assert_eq!(s.iter().len(), MAX_SLICES);
        assert_eq!(s.get(MAX_SLICES), None);
        assert_eq!(s, s);
        assert_ne!(s, Slices::new());
        assert_eq!(
            serde_json::to_value(Slices::new()).unwrap(),
            serde_json::json!([])
        );
        let mut one = Slices::new();
        one.push(Slice {
            lender: 0,
            units: 50.0,
        });
        assert_eq!(
            serde_json::to_value(one).unwrap(),
            serde_json::json!([{"lender": 0, "units": 50}])
        );
    }

    #[test]
    fn lease_ids_are_the_tenant_then_the_number_in_decimal() {
        let mut n = 1u64;
        let mut cases = vec![0, u64::MAX, u64::MAX - 1];
        while let Some(m) = n.checked_mul(10) {
            cases.extend([n - 1, n, n + 1]);
            n = m;
        }
        cases.extend([n - 1, n, n + 1]);
        for no in cases {
            let id = LeaseId::new("acme", no).unwrap();
            assert_eq!(id.as_str(), format!("acme{no}"));
        }
        let longest = "t".repeat(MAX_TENANT_ID_BYTES);
        let id = LeaseId::new(&longest, u64::MAX).unwrap();
        assert_eq!(id.as_str(), format!("{longest}{}", u64::MAX));
        // Beyond the capacity (a tenant id longer than any configured one,
        // and the longest number): refused, not truncated.
        assert!(LeaseId::new(&format!("{longest}x"), u64::MAX).is_none());
        // The fixed-block builder gives the same ids.
        let mut nos = vec![0u64, 1, 9, 10, 11, 99, 100, 101, 20_000, u64::MAX];
        let mut p = 1u64;
        while let Some(q) = p.checked_mul(10) {
            nos.extend([q - 1, q, q + 1]);
            p = q;
        }
        for (t, no) in nos
            .iter()
            .flat_map(|&no| [("a", no), ("acme", no), (longest.as_str(), no)])
        {
            let tid = TenantId::new(t).unwrap();
            assert_eq!(LeaseId::of(&tid, no), LeaseId::new(t, no).unwrap());
            assert_eq!(LeaseId::of(&tid, no).as_str(), format!("{t}{no}"));
        }
        assert_eq!(TenantId::new("acme").unwrap(), "acme");
    }
}
