//! The ledger's state as plain fixed-size records, and the validated view
//! through which all ledger logic reads and writes them.
//!
//! # Layout
//!
//! The state is three flat parts: one [`MetaRec`], one [`TenantRec`] per
//! tenant (constructor order) and [`LeaseRec`] slots (a fixed capacity chosen
//! at creation). Every record is `#[repr(C)]`, `Copy`, and holds only `u32`,
//! `u64`, `f64` and fixed byte arrays: no pointers and no heap, so the same
//! bytes can live in a `Box<[_]>` (the in-process home) or in a mapped region
//! (the shared home, see `shared.rs`). The immutable configuration is a
//! separate [`Params`] record.
//!
//! # Validation
//!
//! Another process with write access may scribble on a shared region, so the
//! view never hands out a reference into the arrays: [`View::tenant`] and
//! [`View::lease`] copy a record out, check every field (indices in range,
//! numbers finite and not negative, flags known) and return
//! [`FairError::Corrupt`] otherwise. Writes copy a whole record back.
//! Nothing here panics on bad data.

use super::config::MAX_TENANT_ID_BYTES;
use super::error::FairError;

/// Most lenders one lease can borrow from. Lenders are taken largest first,
/// so a loan rarely spans more than one or two; a loan that would need more
/// than this is treated as not coverable.
pub const MAX_SLICES: usize = 8;

/// Counters above this are corrupt (unreachable in practice: 2^62 calls);
/// the bound lets arithmetic on them never overflow.
pub(crate) const COUNTER_LIMIT: u64 = 1 << 62;

/// Flag in [`Params::flags`]: a refused acquire does not count as activity.
/// Test seam for trace T10 only; never set in production.
pub(crate) const FLAG_REFUSAL_NOT_ACTIVITY: u32 = 1;

/// Immutable parameters of one ledger.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Ceiling in the fairness unit.
    pub ceiling: f64,
    /// Sum of all weights.
    pub total_weight: f64,
    /// [`FairnessUnit`](super::FairnessUnit) code: 0 cost, 1 requests.
    pub unit: u32,
    /// Behaviour flags (test seams).
    pub flags: u32,
    /// Reclaim horizon.
    pub reclaim_horizon_ms: u64,
    /// Idle threshold.
    pub idle_after_ms: u64,
    /// Start instant.
    pub started_at_ms: u64,
    /// Number of tenant records.
    pub tenant_count: u32,
    /// Number of lease slots.
    pub lease_capacity: u32,
}

impl Params {
    /// Checks the parameters themselves (they may come from a region header).
    pub fn check(&self) -> Result<(), FairError> {
        let c = |m: String| Err(FairError::Corrupt(m));
        if !(self.ceiling.is_finite() && self.ceiling > 0.0) {
            return c(format!(
                "ceiling {} is not positive and finite",
                self.ceiling
            ));
        }
        if !(self.total_weight.is_finite() && self.total_weight > 0.0) {
            return c(format!(
                "total weight {} is not positive and finite",
                self.total_weight
            ));
        }
        if self.unit > 1 {
            return c(format!("fairness unit code {} is unknown", self.unit));
        }
        if self.idle_after_ms <= self.reclaim_horizon_ms {
            return c(format!(
                "idle_after_ms {} is not greater than reclaim_horizon_ms {}",
                self.idle_after_ms, self.reclaim_horizon_ms
            ));
        }
        if self.tenant_count == 0 || self.lease_capacity == 0 {
            return c(format!(
                "tenant count {} / lease capacity {} must be positive",
                self.tenant_count, self.lease_capacity
            ));
        }
        Ok(())
    }
}

/// Ledger-wide mutable words.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct MetaRec {
    /// Latest accepted `now` (ruling Q22).
    pub last_now_ms: u64,
    /// Creation sequence number for the next lease.
    pub next_seq: u64,
    /// Lease slots `[0, lease_hwm)` have ever been used; scans stop there.
    pub lease_hwm: u32,
    /// Reserved, zero.
    pub _pad: u32,
    /// Leases released by the reaper, all tenants.
    pub reaped_total: u64,
}

/// One tenant. `id`/`weight`/`guarantee` are fixed; the rest is the
/// tenant's ledger, including its want and deficit integration state.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TenantRec {
    /// Bytes of `id` in use.
    pub id_len: u32,
    /// 1 while a want is outstanding.
    pub want_open: u32,
    /// UTF-8 id, zero padded.
    pub id: [u8; MAX_TENANT_ID_BYTES],
    /// Configured weight.
    pub weight: f64,
    /// `ceiling * weight / totalWeight`.
    pub guarantee: f64,
    /// Units of the own guarantee used by own leases.
    pub own_held: f64,
    /// Units of the own guarantee lent to other tenants' leases.
    pub lent: f64,
    /// Units borrowed from others by own leases.
    pub borrowed: f64,
    /// Live leases of this tenant.
    pub live_leases: u64,
    /// Last acquire attempt or release (ruling Q1: starts at startedAt).
    pub last_activity_ms: u64,
    /// Last acquire attempt (want lapse is measured from here).
    pub last_ask_ms: u64,
    /// Largest single refused charge outstanding.
    pub want: f64,
    /// First refusal of the outstanding want.
    pub want_since_ms: u64,
    /// Integrated deficit, unit × ms.
    pub deficit_unit_ms: f64,
    /// The deficit is integrated up to here.
    pub integrated_to_ms: u64,
    /// Longest completed wait + 1 (0 = none yet).
    pub worst_reclaim_plus1: u64,
    /// Number the next lease of this tenant gets (starts at 1).
    pub next_lease_no: u64,
    /// Leases granted since start.
    pub granted_requests: u64,
    /// Cost of leases granted since start.
    pub granted_cost: f64,
    /// Leases released by the reaper.
    pub reaped_leases: u64,
}

impl TenantRec {
    pub(crate) fn new(
        id: &str,
        weight: f64,
        guarantee: f64,
        started_at_ms: u64,
    ) -> Result<TenantRec, FairError> {
        let b = id.as_bytes();
        if b.is_empty() || b.len() > MAX_TENANT_ID_BYTES {
            return Err(FairError::InvalidConfig(format!(
                "tenant id \"{id}\" must be 1 to {MAX_TENANT_ID_BYTES} bytes"
            )));
        }
        let mut idb = [0u8; MAX_TENANT_ID_BYTES];
        idb[..b.len()].copy_from_slice(b);
        Ok(TenantRec {
            id_len: b.len() as u32,
            want_open: 0,
            id: idb,
            weight,
            guarantee,
            own_held: 0.0,
            lent: 0.0,
            borrowed: 0.0,
            live_leases: 0,
            last_activity_ms: started_at_ms,
            last_ask_ms: started_at_ms,
            want: 0.0,
            want_since_ms: 0,
            deficit_unit_ms: 0.0,
            integrated_to_ms: started_at_ms,
            worst_reclaim_plus1: 0,
            next_lease_no: 1,
            granted_requests: 0,
            granted_cost: 0.0,
            reaped_leases: 0,
        })
    }

    /// The id as text (validated by [`View::tenant`]).
    pub fn id_str(&self) -> &str {
        let n = (self.id_len as usize).min(MAX_TENANT_ID_BYTES);
        std::str::from_utf8(&self.id[..n]).unwrap_or("?")
    }

    /// Held in total: own plus borrowed.
    pub fn held(&self) -> f64 {
        self.own_held + self.borrowed
    }

    fn check(&self, i: usize) -> Result<(), FairError> {
        let c = |m: String| Err(FairError::Corrupt(format!("tenant record {i}: {m}")));
        if self.id_len == 0 || self.id_len as usize > MAX_TENANT_ID_BYTES {
            return c(format!(
                "id length {} out of 1..={MAX_TENANT_ID_BYTES}",
                self.id_len
            ));
        }
        if std::str::from_utf8(&self.id[..self.id_len as usize]).is_err() {
            return c("id is not UTF-8".into());
        }
        if self.want_open > 1 {
            return c(format!("want flag {} is not 0 or 1", self.want_open));
        }
        for (name, v) in [
            ("weight", self.weight),
            ("guarantee", self.guarantee),
            ("own_held", self.own_held),
            ("lent", self.lent),
            ("borrowed", self.borrowed),
            ("want", self.want),
            ("deficit_unit_ms", self.deficit_unit_ms),
            ("granted_cost", self.granted_cost),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return c(format!("{name} {v} is not finite and non-negative"));
            }
        }
        if self.weight == 0.0 {
            return c("weight is 0".into());
        }
        if self.next_lease_no == 0 {
            return c("lease counter is 0".into());
        }
        for (name, v) in [
            ("next_lease_no", self.next_lease_no),
            ("live_leases", self.live_leases),
            ("granted_requests", self.granted_requests),
            ("reaped_leases", self.reaped_leases),
            ("worst_reclaim", self.worst_reclaim_plus1),
        ] {
            if v > COUNTER_LIMIT {
                return c(format!("{name} {v} exceeds {COUNTER_LIMIT}"));
            }
        }
        Ok(())
    }
}

/// One borrowed slice inside a [`LeaseRec`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SliceRec {
    /// Lender tenant index.
    pub lender: u32,
    /// Reserved, zero.
    pub _pad: u32,
    /// Units lent.
    pub units: f64,
}

/// One lease slot. `state` 0 is free, 1 is live.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LeaseRec {
    /// 0 free, 1 live.
    pub state: u32,
    /// Holder tenant index.
    pub tenant: u32,
    /// Owner id from the region's process table (0 in-process).
    pub owner: u32,
    /// Slices in use.
    pub n_slices: u32,
    /// Per-tenant lease number (the id is tenant id + this).
    pub no: u64,
    /// Global creation order (ties of equal deadlines, ruling Q22).
    pub seq: u64,
    /// Declared cost.
    pub cost: f64,
    /// Charge in the fairness unit.
    pub charge: f64,
    /// Part of the charge from the holder's own guarantee.
    pub own: f64,
    /// Grant instant.
    pub granted_ms: u64,
    /// Declared deadline.
    pub deadline_ms: u64,
    /// Borrowed slices.
    pub slices: [SliceRec; MAX_SLICES],
}

impl LeaseRec {
    fn check(&self, slot: usize, n_tenants: usize) -> Result<(), FairError> {
        let c = |m: String| Err(FairError::Corrupt(format!("lease slot {slot}: {m}")));
        if self.state > 1 {
            return c(format!("state {} is not 0 or 1", self.state));
        }
        if self.state == 0 {
            return Ok(());
        }
        if self.tenant as usize >= n_tenants {
            return c(format!(
                "tenant index {} >= tenant count {n_tenants}",
                self.tenant
            ));
        }
        if self.n_slices as usize > MAX_SLICES {
            return c(format!("{} slices > limit {MAX_SLICES}", self.n_slices));
        }
        for (name, v) in [
            ("cost", self.cost),
            ("charge", self.charge),
            ("own", self.own),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return c(format!("{name} {v} is not finite and non-negative"));
            }
        }
        for s in &self.slices[..self.n_slices as usize] {
            if s.lender as usize >= n_tenants || s.lender == self.tenant {
                return c(format!(
                    "lender index {} invalid (holder {})",
                    s.lender, self.tenant
                ));
            }
            if !(s.units.is_finite() && s.units >= 0.0) {
                return c(format!("slice units {} invalid", s.units));
            }
        }
        if self.deadline_ms < self.granted_ms || self.no == 0 {
            return c(format!(
                "deadline {} before grant {} or number {}",
                self.deadline_ms, self.granted_ms, self.no
            ));
        }
        Ok(())
    }

    /// Units borrowed from `lender` by this lease.
    pub fn units_from(&self, lender: u32) -> f64 {
        let n = (self.n_slices as usize).min(MAX_SLICES);
        self.slices[..n]
            .iter()
            .filter(|s| s.lender == lender)
            .map(|s| s.units)
            .sum()
    }

    /// Units borrowed in total.
    pub fn borrowed(&self) -> f64 {
        let n = (self.n_slices as usize).min(MAX_SLICES);
        self.slices[..n].iter().map(|s| s.units).sum()
    }
}

/// A validated, mutable view over one copy of the ledger state. All ledger
/// logic (`admission.rs`) is written against this type only.
pub struct View<'a> {
    /// Immutable parameters, checked at construction.
    pub p: Params,
    meta: &'a mut MetaRec,
    tenants: &'a mut [TenantRec],
    leases: &'a mut [LeaseRec],
}

impl<'a> View<'a> {
    /// Wraps the three parts, checking that they agree with `p`.
    pub fn new(
        p: Params,
        meta: &'a mut MetaRec,
        tenants: &'a mut [TenantRec],
        leases: &'a mut [LeaseRec],
    ) -> Result<View<'a>, FairError> {
        p.check()?;
        if tenants.len() != p.tenant_count as usize || leases.len() != p.lease_capacity as usize {
            return Err(FairError::Corrupt(format!(
                "{} tenant records / {} lease slots do not match parameters {} / {}",
                tenants.len(),
                leases.len(),
                p.tenant_count,
                p.lease_capacity
            )));
        }
        Ok(View {
            p,
            meta,
            tenants,
            leases,
        })
    }

    /// Number of tenants.
    pub fn n(&self) -> usize {
        self.tenants.len()
    }

    /// A validated copy of the meta record.
    pub fn meta(&self) -> Result<MetaRec, FairError> {
        let m = *self.meta;
        if m.next_seq > COUNTER_LIMIT || m.reaped_total > COUNTER_LIMIT {
            return Err(FairError::Corrupt(format!(
                "lease sequence {} / reaped total {} exceed {COUNTER_LIMIT}",
                m.next_seq, m.reaped_total
            )));
        }
        if m.lease_hwm as usize > self.leases.len() {
            return Err(FairError::Corrupt(format!(
                "lease high-water mark {} > capacity {}",
                m.lease_hwm,
                self.leases.len()
            )));
        }
        Ok(m)
    }

    /// Writes the meta record.
    pub fn set_meta(&mut self, m: MetaRec) {
        *self.meta = m;
    }

    /// A validated copy of tenant `i`.
    pub fn tenant(&self, i: usize) -> Result<TenantRec, FairError> {
        let t = *self.tenants.get(i).ok_or_else(|| {
            FairError::Corrupt(format!(
                "tenant index {i} >= tenant count {}",
                self.tenants.len()
            ))
        })?;
        t.check(i)?;
        Ok(t)
    }

    /// Writes tenant `i` (index checked by the caller's earlier read).
    pub fn set_tenant(&mut self, i: usize, t: TenantRec) {
        if let Some(slot) = self.tenants.get_mut(i) {
            *slot = t;
        }
    }

    /// All tenants, validated.
    pub fn all_tenants(&self) -> Result<Vec<TenantRec>, FairError> {
        (0..self.n()).map(|i| self.tenant(i)).collect()
    }

    /// Index of the tenant with this id.
    pub fn find_tenant(&self, id: &str) -> Result<Option<usize>, FairError> {
        for i in 0..self.n() {
            if self.tenant(i)?.id_str() == id {
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    /// A validated copy of lease slot `slot`.
    pub fn lease(&self, slot: usize) -> Result<LeaseRec, FairError> {
        let l = *self.leases.get(slot).ok_or_else(|| {
            FairError::Corrupt(format!(
                "lease slot {slot} >= capacity {}",
                self.leases.len()
            ))
        })?;
        l.check(slot, self.n())?;
        Ok(l)
    }

    /// Writes lease slot `slot`.
    pub fn set_lease(&mut self, slot: usize, l: LeaseRec) {
        if let Some(s) = self.leases.get_mut(slot) {
            *s = l;
        }
    }

    /// Live leases as `(slot, record)`, in slot order.
    pub fn live_leases(&self) -> Result<Vec<(usize, LeaseRec)>, FairError> {
        let hwm = self.meta()?.lease_hwm as usize;
        let mut v = Vec::new();
        for s in 0..hwm {
            let l = self.lease(s)?;
            if l.state == 1 {
                v.push((s, l));
            }
        }
        Ok(v)
    }

    /// A free slot, if any (lowest first).
    pub fn free_slot(&self) -> Result<Option<usize>, FairError> {
        let hwm = self.meta()?.lease_hwm as usize;
        for s in 0..hwm {
            if self.lease(s)?.state == 0 {
                return Ok(Some(s));
            }
        }
        Ok(if hwm < self.leases.len() {
            Some(hwm)
        } else {
            None
        })
    }

    /// Lease capacity.
    pub fn capacity(&self) -> usize {
        self.leases.len()
    }

    /// The display id of a lease (`${tenant}${no}`).
    pub fn lease_id(&self, l: &LeaseRec) -> Result<String, FairError> {
        Ok(format!(
            "{}{}",
            self.tenant(l.tenant as usize)?.id_str(),
            l.no
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(n: u32, cap: u32) -> Params {
        Params {
            ceiling: 100.0,
            total_weight: 2.0,
            unit: 0,
            flags: 0,
            reclaim_horizon_ms: 100,
            idle_after_ms: 1000,
            started_at_ms: 0,
            tenant_count: n,
            lease_capacity: cap,
        }
    }

    fn state() -> (MetaRec, Vec<TenantRec>, Vec<LeaseRec>) {
        let t = vec![
            TenantRec::new("a", 1.0, 50.0, 0).unwrap(),
            TenantRec::new("b", 1.0, 50.0, 0).unwrap(),
        ];
        (MetaRec::default(), t, vec![LeaseRec::default(); 4])
    }

    #[test]
    fn records_are_plain_fixed_size() {
        assert_eq!(std::mem::size_of::<MetaRec>() % 8, 0);
        assert_eq!(std::mem::size_of::<TenantRec>() % 8, 0);
        assert_eq!(std::mem::size_of::<LeaseRec>() % 8, 0);
        assert_eq!(std::mem::size_of::<SliceRec>(), 16);
    }

    #[test]
    fn corrupt_fields_are_errors() {
        let (mut m, mut t, mut l) = state();
        t[1].own_held = f64::NAN;
        t[0].id_len = 99;
        l[0] = LeaseRec {
            state: 1,
            tenant: 7,
            no: 1,
            ..LeaseRec::default()
        };
        l[1] = LeaseRec {
            state: 1,
            tenant: 0,
            n_slices: 1,
            no: 1,
            ..LeaseRec::default()
        };
        l[1].slices[0].lender = 0; // lends to itself
        l[2] = LeaseRec {
            state: 9,
            ..LeaseRec::default()
        };
        l[3] = LeaseRec {
            state: 1,
            tenant: 1,
            no: 1,
            granted_ms: 5,
            deadline_ms: 4,
            ..LeaseRec::default()
        };
        m.lease_hwm = 4;
        let v = View::new(params(2, 4), &mut m, &mut t, &mut l).unwrap();
        for e in [
            v.tenant(0).unwrap_err(),
            v.tenant(1).unwrap_err(),
            v.tenant(2).unwrap_err(),
        ] {
            assert!(matches!(e, FairError::Corrupt(_)), "{e}");
        }
        for s in 0..4 {
            assert!(matches!(v.lease(s), Err(FairError::Corrupt(_))), "slot {s}");
        }
        assert!(v.live_leases().is_err());
        assert!(v.lease(4).is_err());
    }

    #[test]
    fn meta_and_params_are_checked() {
        let (mut m, mut t, mut l) = state();
        assert!(
            View::new(params(3, 4), &mut m, &mut t, &mut l).is_err(),
            "tenant count mismatch"
        );
        let mut p = params(2, 4);
        p.idle_after_ms = 100;
        assert!(View::new(p, &mut m, &mut t, &mut l).is_err());
        p = params(2, 4);
        p.unit = 5;
        assert!(View::new(p, &mut m, &mut t, &mut l).is_err());
        m.lease_hwm = 5;
        let v = View::new(params(2, 4), &mut m, &mut t, &mut l).unwrap();
        assert!(v.meta().is_err());
        assert!(v.free_slot().is_err());
    }
}
