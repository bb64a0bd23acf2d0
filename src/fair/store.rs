//! The ledger's state as plain fixed-size records, and the validated view
//! through which all ledger logic reads and writes them.
//!
//! # Layout
//!
//! The state is five flat parts: one [`MetaRec`]; one [`TenantRec`] per
//! tenant (constructor order); [`LeaseRec`] slots (a capacity fixed at
//! creation); hash buckets that find a live lease by (tenant, number); and
//! the live list, the slots of the live leases in no particular order.
//! Every record is `#[repr(C)]`, `Copy`, and holds only `u32`, `u64`, `f64`
//! and fixed byte arrays: no pointers and no heap, so the same bytes can
//! live in boxed slices (the in-process home) or in a mapped region (the
//! shared home, see `shared.rs`). Links between records are slot numbers
//! plus one (0 for none), so zeroed memory is an empty ledger. The
//! immutable configuration is a separate [`Params`] record.
//!
//! # Costs
//!
//! No operation scans the lease slots. A grant takes the last freed slot
//! (the free list threads through free records) or a never-used one, pushes
//! the slot on its hash chain (buckets are a power of two, at least twice
//! the capacity, indexed by a multiplicative hash of (tenant, number)) and
//! appends it to the live list; a release finds the lease through its hash
//! chain (about one record), unlinks it, moves the last live-list entry into
//! its place and frees the slot. Each writes a handful of records whatever
//! the number of leases held or ever held. Only `stats` (overrun leases),
//! reaping and a `guarantee_on_loan` refusal read the live list, and only
//! the live part of it.
//!
//! # Validation
//!
//! Another process with write access may scribble on a shared region, so the
//! view never hands out a reference into the arrays: [`View::tenant`] and
//! [`View::lease`] copy a record out, check every field (indices in range,
//! numbers finite and not negative, flags known) and return
//! [`FairError::Corrupt`] otherwise; chain walks are bounded by the
//! capacity, and a slot found on the wrong list is corrupt. Writes copy a
//! record (or one link word) back, through [`put`], which in a region
//! first saves the old bytes in the undo journal ([`Journal`]); a tenant
//! record is written (and saved) by its changing tail only, from
//! [`TENANT_STATE_OFF`], and its `want_open` word when that changes
//! ([`View::set_tenant`]): its id, weight and guarantee are never written
//! after creation. Nothing here panics on bad data.

use std::ptr;
use std::sync::atomic::{fence, AtomicU64, Ordering};

use super::config::MAX_TENANT_ID_BYTES;
use super::error::FairError;
use super::types::LeaseId;

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

/// Whether `v` is finite and not negative (`-0.0` included), on its bits:
/// below the exponent of infinity with the sign clear, or negative zero.
/// (Integer compares: cheaper here than two float compares per value.)
#[inline(always)]
fn finite_non_negative(v: f64) -> bool {
    let b = v.to_bits();
    (b < 0x7ff0_0000_0000_0000) | (b == 0x8000_0000_0000_0000)
}

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
    /// Leases released by the reaper, all tenants.
    pub reaped_total: u64,
    /// Lease slots `[0, fresh)` have been used at some time; slots from
    /// `fresh` on were never used (and are on no list).
    pub fresh: u32,
    /// First slot of the free list, plus one (0: empty). Freed slots are
    /// reused last-freed first.
    pub free_head: u32,
    /// Live leases: `live[0..live_count]` are their slots.
    pub live_count: u32,
    /// Reserved, zero.
    pub _pad: u32,
}

/// One tenant. `id`/`weight`/`guarantee` are fixed; the rest is the
/// tenant's ledger, including its want and deficit integration state.
/// (`Default` is all zeroes, not a valid tenant: a buffer to copy into.)
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
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

    /// Checks every field (the id's bytes are checked where they are read
    /// as text: [`id_str`](Self::id_str) answers `"?"` for invalid UTF-8).
    /// The common case is one branch-light test; only a bad record builds
    /// the message naming the field.
    #[inline]
    pub(crate) fn check(&self, i: usize) -> Result<(), FairError> {
        let sane = self.id_len != 0
            && self.id_len as usize <= MAX_TENANT_ID_BYTES
            && self.want_open <= 1
            && finite_non_negative(self.weight)
                & finite_non_negative(self.guarantee)
                & finite_non_negative(self.own_held)
                & finite_non_negative(self.lent)
                & finite_non_negative(self.borrowed)
                & finite_non_negative(self.want)
                & finite_non_negative(self.deficit_unit_ms)
                & finite_non_negative(self.granted_cost)
            && self.weight != 0.0
            && self.next_lease_no != 0
            && (self.next_lease_no
                | self.live_leases
                | self.granted_requests
                | self.reaped_leases
                | self.worst_reclaim_plus1)
                <= COUNTER_LIMIT;
        if sane {
            Ok(())
        } else {
            self.explain(i)
        }
    }

    /// The error naming what [`check`](Self::check) found wrong.
    #[cold]
    fn explain(&self, i: usize) -> Result<(), FairError> {
        let c = |m: String| Err(FairError::Corrupt(format!("tenant record {i}: {m}")));
        if self.id_len == 0 || self.id_len as usize > MAX_TENANT_ID_BYTES {
            return c(format!(
                "id length {} out of 1..={MAX_TENANT_ID_BYTES}",
                self.id_len
            ));
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
        c("a counter exceeds the limit".into())
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
    /// Live: the position of this slot in the live list.
    pub live_pos: u32,
    /// Live: the next slot (plus one, 0: none) of its hash chain. Free: the
    /// next slot (plus one, 0: none) of the free list.
    pub link: u32,
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
    /// Checks every field in use; as for tenants, the common case is one
    /// branch-light test and only a bad record builds the message.
    #[inline]
    fn check(&self, slot: usize, n_tenants: usize, cap: usize) -> Result<(), FairError> {
        let sane = match self.state {
            0 => self.link as usize <= cap,
            1 => {
                let n = self.n_slices as usize;
                self.link as usize <= cap
                    && (self.live_pos as usize) < cap
                    && (self.tenant as usize) < n_tenants
                    && n <= MAX_SLICES
                    && finite_non_negative(self.cost)
                        & finite_non_negative(self.charge)
                        & finite_non_negative(self.own)
                    && self.deadline_ms >= self.granted_ms
                    && self.no != 0
                    && self.slices[..n.min(MAX_SLICES)].iter().all(|s| {
                        (s.lender as usize) < n_tenants
                            && s.lender != self.tenant
                            && finite_non_negative(s.units)
                    })
            }
            _ => false,
        };
        if sane {
            Ok(())
        } else {
            self.explain(slot, n_tenants, cap)
        }
    }

    /// The error naming what [`check`](Self::check) found wrong.
    #[cold]
    fn explain(&self, slot: usize, n_tenants: usize, cap: usize) -> Result<(), FairError> {
        let c = |m: String| Err(FairError::Corrupt(format!("lease slot {slot}: {m}")));
        if self.state > 1 {
            return c(format!("state {} is not 0 or 1", self.state));
        }
        if self.link as usize > cap {
            return c(format!("link {} > capacity {cap}", self.link));
        }
        if self.state == 0 {
            return Ok(());
        }
        if self.live_pos as usize >= cap {
            return c(format!("live position {} >= capacity {cap}", self.live_pos));
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
        c("a field is out of range".into())
    }

    /// Copies every field of `src` in use into `self`: all but the
    /// slices past its `n_slices` (which are never read). A record is 208
    /// bytes, most of them slices a lease rarely has; the 80 bytes before
    /// them are one fixed-size copy (inline), then the slices in use.
    #[inline(always)]
    fn copy_used_from(&mut self, src: &LeaseRec) {
        const HEAD: usize = std::mem::offset_of!(LeaseRec, slices);
        // SAFETY: both are valid `LeaseRec`s (`#[repr(C)]` plain data, any
        // bit pattern valid); the first HEAD bytes are the fields before
        // `slices`; `self` is `&mut`, so the two do not overlap.
        unsafe {
            ptr::copy_nonoverlapping(
                src as *const LeaseRec as *const u8,
                self as *mut LeaseRec as *mut u8,
                HEAD,
            )
        };
        // The count as copied (one read of it), bounded.
        let n = (self.n_slices as usize).min(MAX_SLICES);
        if n > 0 {
            self.slices[..n].copy_from_slice(&src.slices[..n]);
        }
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

/// Hash buckets for `cap` lease slots: a power of two, at least twice the
/// capacity (chains stay about one record long).
pub(crate) fn bucket_count(cap: usize) -> usize {
    (cap.saturating_mul(2)).next_power_of_two().max(2)
}

/// The largest record, in bytes: the most one undo-journal entry holds.
pub(crate) const MAX_RECORD_BYTES: usize = {
    let (m, t, l) = (
        std::mem::size_of::<MetaRec>(),
        std::mem::size_of::<TenantRec>(),
        std::mem::size_of::<LeaseRec>(),
    );
    let x = if m > t { m } else { t };
    if x > l {
        x
    } else {
        l
    }
};

/// Undo-journal entries one update may use. The largest update (an acquire
/// borrowing from [`MAX_SLICES`] lenders, or a release repaying them)
/// writes the meta record, the holder's and every lender's tenant record,
/// the lease record, a hash bucket or chain link, a live-list entry and a
/// moved lease's live position: `MAX_SLICES + 7` entries at most.
pub(crate) const JOURNAL_ENTRIES: usize = 2 * MAX_SLICES + 16;

/// One undo-journal entry: `len` bytes at ledger offset `off` as they were
/// before the update wrote them.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct JournalEntry {
    /// Byte offset from the start of the ledger memory.
    pub off: u32,
    /// Bytes saved (at most [`MAX_RECORD_BYTES`]).
    pub len: u32,
    /// The old bytes.
    pub bytes: [u8; MAX_RECORD_BYTES],
}

/// What the first data write of an update does, for crash and stop tests.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WriteFault {
    /// Write half the record, then abort the process.
    Abort,
    /// Write half the record, call this (a test stops the process there),
    /// then finish the write and go on.
    Call(fn()),
    /// Abort the process when the update is about to make journal save
    /// number `k` (0-based): after `k` saves and their writes, complete.
    AbortBeforeSave(usize),
}

/// The undo journal of a ledger in shared memory (see `shared.rs`): every
/// write of the view first saves the bytes it overwrites, so an update cut
/// short is rolled back to the last committed state.
pub(crate) struct Journal<'a> {
    /// Start of the ledger memory (journal offsets are relative to it).
    pub base: *const u8,
    /// The journal's entries (in the ledger memory).
    pub entries: &'a mut [JournalEntry],
    /// Entries in use; stored with release ordering after each entry.
    pub used: &'a AtomicU64,
    /// The ledger's sequence word: odd while an update is in progress.
    pub seq: &'a AtomicU64,
    /// Whether this update has made `seq` odd yet.
    pub opened: bool,
    /// Entries this update has counted (the value of `used` it stored last:
    /// `used` is 0 when an update starts).
    pub count: usize,
    /// Test seam for the first write.
    pub fault: Option<WriteFault>,
}

impl Journal<'_> {
    /// Marks the update under way (`seq` odd) before its first write.
    #[inline]
    fn open(&mut self) {
        if !self.opened {
            // Readers that saw an even sequence retry from here on.
            let s = self.seq.load(Ordering::Relaxed);
            self.seq.store(s | 1, Ordering::Relaxed);
            fence(Ordering::Release);
            self.opened = true;
        }
    }

    /// Saves `len` bytes at `at` before they are overwritten (`len` 0:
    /// nothing to save, the update is only marked under way). Inlined: every
    /// caller's `len` is a constant (a record's size, or the part of it a
    /// call writes), so the copy is a few moves, not a `memcpy` call.
    #[inline(always)]
    fn save(&mut self, at: *const u8, len: usize) -> Result<(), FairError> {
        self.open();
        if len == 0 {
            return Ok(());
        }
        let n = self.count;
        let off = (at as usize).wrapping_sub(self.base as usize);
        let (Some(e), Ok(off32), true) = (
            self.entries.get_mut(n),
            u32::try_from(off),
            len <= MAX_RECORD_BYTES,
        ) else {
            return Err(journal_error(n, off, len));
        };
        e.off = off32;
        e.len = len as u32;
        // SAFETY: `at` points at `len` readable bytes of a record of this
        // view (the caller's `&mut T`), `len <= MAX_RECORD_BYTES`, and the
        // entry's buffer does not overlap a record.
        unsafe { ptr::copy_nonoverlapping(at, e.bytes.as_mut_ptr(), len) };
        // The entry is complete before it counts, and counts before the
        // record is written: a process killed anywhere leaves every written
        // byte covered by a counted entry; a reader that sees `used`
        // unchanged across its copy saw no write beyond these entries.
        self.count = n + 1;
        self.used.store(n as u64 + 1, Ordering::Release);
        fence(Ordering::Release);
        Ok(())
    }
}

impl Journal<'_> {
    /// Commits what was written so far: nothing is left to undo (the
    /// commit point is the store of `used = 0`), and `seq` is even again.
    pub fn commit(&mut self) {
        if self.opened {
            fence(Ordering::Release);
            self.used.store(0, Ordering::Release);
            let s = self.seq.load(Ordering::Relaxed);
            self.seq.store((s | 1).wrapping_add(1), Ordering::Release);
            self.opened = false;
            self.count = 0;
        }
    }
}

/// The error of a write the journal cannot take.
#[cold]
fn journal_error(n: usize, off: usize, len: usize) -> FairError {
    if n >= JOURNAL_ENTRIES {
        FairError::Corrupt(format!(
            "an update needed more than {JOURNAL_ENTRIES} undo-journal entries"
        ))
    } else {
        FairError::Corrupt(format!(
            "a write of {len} bytes at ledger offset {off} cannot be journaled"
        ))
    }
}

/// Writes `val` to `dst`, first saving the old bytes in `journal` (if any).
/// `val` is borrowed: a record is copied once, into `dst` (a record passed
/// by value cost a copy into the argument first).
#[inline(always)]
fn put<T: Copy>(journal: &mut Option<Journal<'_>>, dst: &mut T, val: &T) -> Result<(), FairError> {
    put_saving(journal, dst, val, std::mem::size_of::<T>())
}

/// Bytes of a lease record that matter while it is free: `state` … `link`
/// (a free slot is read only for its state and its free-list link).
const FREE_LEASE_BYTES: usize = std::mem::offset_of!(LeaseRec, link) + 4;

/// Like [`put`], saving only the first `saved` bytes of the old value (the
/// rest of it does not matter: a free lease record beyond its link).
#[inline(always)]
fn put_saving<T: Copy>(
    journal: &mut Option<Journal<'_>>,
    dst: &mut T,
    val: &T,
    saved: usize,
) -> Result<(), FairError> {
    let size = std::mem::size_of::<T>();
    if let Some(j) = journal {
        if j.fault.is_some() {
            // SAFETY: `dst` and `val` are valid, distinct `T`s of plain data
            // (any bit pattern valid); `size` bytes each.
            return unsafe {
                faulty_write(
                    j,
                    dst as *mut T as *mut u8,
                    val as *const T as *const u8,
                    saved.min(size),
                    size,
                )
            };
        }
        j.save(dst as *const T as *const u8, saved.min(size))?;
    }
    *dst = *val;
    Ok(())
}

/// A journaled write while a test's fault is armed: saves `saved` bytes at
/// `d`, then writes `len` bytes from `v` there, doing what the fault says
/// (a torn first write, then abort or a call; or abort before save `k`).
///
/// # Safety
///
/// `d` is valid for reads and writes of `len` bytes, `v` for reads of
/// `len`, they do not overlap, `saved <= len`, and any bytes are valid
/// there (plain data).
#[cold]
#[inline(never)]
unsafe fn faulty_write(
    j: &mut Journal<'_>,
    d: *mut u8,
    v: *const u8,
    saved: usize,
    len: usize,
) -> Result<(), FairError> {
    if let Some(WriteFault::AbortBeforeSave(k)) = j.fault {
        if j.count >= k {
            std::process::abort();
        }
        j.save(d, saved)?;
    } else {
        j.save(d, saved)?;
        if let Some(fault) = j.fault.take() {
            // SAFETY: the caller's contract; the first half of the bytes:
            // a torn record, which the entry saved above restores.
            unsafe { ptr::copy_nonoverlapping(v, d, len / 2) };
            match fault {
                WriteFault::Abort => std::process::abort(),
                WriteFault::Call(f) => f(),
                WriteFault::AbortBeforeSave(_) => {}
            }
        }
    }
    // SAFETY: the caller's contract.
    unsafe { ptr::copy_nonoverlapping(v, d, len) };
    Ok(())
}

/// Like [`put_saving`], changing `dst` in place with `f` (after saving its
/// first `saved` bytes) instead of copying a whole new value in: a write
/// of a few fields of a record, or of a record built from another one.
#[inline(always)]
fn update_saving<T: Copy>(
    journal: &mut Option<Journal<'_>>,
    dst: &mut T,
    saved: usize,
    f: impl FnOnce(&mut T),
) -> Result<(), FairError> {
    if journal.as_ref().is_some_and(|j| j.fault.is_some()) {
        // A test's torn first write: through a whole new value.
        let mut v = *dst;
        f(&mut v);
        return put_saving(journal, dst, &v, saved);
    }
    if let Some(j) = journal {
        j.save(
            dst as *const T as *const u8,
            saved.min(std::mem::size_of::<T>()),
        )?;
    }
    f(dst);
    Ok(())
}

/// Byte offset of the first field of a [`TenantRec`] after the fixed ones
/// (`id_len`, `id`, `weight`, `guarantee`): from here to the end is what
/// ledger calls change (with `want_open`, written on its own when it
/// changes; see [`View::set_tenant`]).
pub(crate) const TENANT_STATE_OFF: usize = std::mem::offset_of!(TenantRec, own_held);

/// Writes the bytes `[FROM, size_of::<T>())` of `val` into `dst`, first
/// saving the old ones in `journal` (if any): a record's changing tail,
/// journaled and copied without its fixed head.
#[inline(always)]
fn put_tail<T: Copy, const FROM: usize>(
    journal: &mut Option<Journal<'_>>,
    dst: &mut T,
    val: &T,
) -> Result<(), FairError> {
    const { assert!(FROM < std::mem::size_of::<T>()) };
    let n = std::mem::size_of::<T>() - FROM;
    // SAFETY: `FROM < size_of::<T>()` (checked at compile time), so both
    // pointers stay inside their (valid, distinct: `dst` is `&mut`) values.
    let (d, v) = unsafe {
        (
            (dst as *mut T as *mut u8).add(FROM),
            (val as *const T as *const u8).add(FROM),
        )
    };
    if let Some(j) = journal {
        if j.fault.is_some() {
            // SAFETY: as above: `n` bytes of two distinct, valid records of
            // plain data.
            return unsafe { faulty_write(j, d, v, n, n) };
        }
        j.save(d, n)?;
    }
    // SAFETY: as above; `T` is plain data (any bit pattern valid), so the
    // tail bytes of one valid `T` copied over another's leave a valid `T`.
    unsafe { ptr::copy_nonoverlapping(v, d, n) };
    Ok(())
}

/// Lease slot `slot`, for writing.
fn slot_mut(leases: &mut [LeaseRec], slot: usize) -> Result<&mut LeaseRec, FairError> {
    let cap = leases.len();
    leases
        .get_mut(slot)
        .ok_or_else(|| FairError::Corrupt(format!("lease slot {slot} >= capacity {cap}")))
}

/// The five parts of the ledger state a [`View`] reads and writes.
pub struct Parts<'a> {
    /// The meta record.
    pub meta: &'a mut MetaRec,
    /// One record per tenant.
    pub tenants: &'a mut [TenantRec],
    /// The lease slots.
    pub leases: &'a mut [LeaseRec],
    /// Hash buckets of live leases by (tenant, number): a slot plus one,
    /// or 0.
    pub buckets: &'a mut [u32],
    /// Slots of the live leases, `[0, meta.live_count)`.
    pub live: &'a mut [u32],
}

/// Where a live lease found by its (tenant, number) is. Its record is
/// not in here: the caller copies it out once ([`View::lease`]), where it
/// is used (a record is 208 bytes, and moving it through the layers of a
/// release cost a copy per layer).
#[derive(Debug, Clone, Copy)]
pub struct Found {
    /// Its slot.
    pub slot: usize,
    /// Its hash bucket.
    pub bucket: usize,
    /// The slot before it in that bucket's chain, if any.
    pub prev: Option<usize>,
}

/// A validated, mutable view over the ledger state. All ledger logic
/// (`admission.rs`) is written against this type only.
pub struct View<'a> {
    /// Immutable parameters, checked at construction (borrowed from the
    /// home: a view is built on every call, and a copy was eight words).
    pub p: &'a Params,
    /// In a region a `now` earlier than the last accepted one is taken as
    /// the last accepted one; in-process it is misuse.
    pub clamp_time: bool,
    meta: &'a mut MetaRec,
    tenants: &'a mut [TenantRec],
    leases: &'a mut [LeaseRec],
    buckets: &'a mut [u32],
    live: &'a mut [u32],
    bits: u32,
    journal: Option<Journal<'a>>,
}

impl<'a> View<'a> {
    /// Wraps the parts, checking that they agree with `p`. `p` must have
    /// passed [`Params::check`] (both homes check their private copy once,
    /// at construction or attach; it is not re-read from shared memory).
    #[cfg(test)]
    pub fn new(p: &'a Params, parts: Parts<'a>) -> Result<View<'a>, FairError> {
        let cap = p.lease_capacity as usize;
        if parts.tenants.len() != p.tenant_count as usize
            || parts.leases.len() != cap
            || parts.buckets.len() != bucket_count(cap)
            || parts.live.len() != cap
        {
            return Err(FairError::Corrupt(format!(
                "{} tenant records / {} lease slots / {} buckets / {} live entries do not match \
                 parameters {} / {cap}",
                parts.tenants.len(),
                parts.leases.len(),
                parts.buckets.len(),
                parts.live.len(),
                p.tenant_count,
            )));
        }
        Ok(View::from_parts(p, parts, None))
    }

    /// Wraps parts whose lengths agree with `p` by construction (the shared
    /// home builds them from the parameters it validated at attach, so the
    /// lengths are checked once, not on every call; and a
    /// view returned in a `Result` was copied into it and out again). Parts
    /// that do not agree cannot make it misbehave either: every access is
    /// bounds-checked, and the hash bits come from the buckets' own length.
    /// `journal`: `Some` for the shared home, whose views journal every
    /// write and clamp time (`clamp_time`); `None` in-process.
    #[inline(always)]
    pub(crate) fn from_parts(
        p: &'a Params,
        parts: Parts<'a>,
        journal: Option<Journal<'a>>,
    ) -> View<'a> {
        View {
            p,
            clamp_time: journal.is_some(),
            bits: parts.buckets.len().trailing_zeros(),
            meta: parts.meta,
            tenants: parts.tenants,
            leases: parts.leases,
            buckets: parts.buckets,
            live: parts.live,
            journal,
        }
    }

    /// The journal, once the update is over (to commit or roll back).
    pub(crate) fn journal(&mut self) -> Option<&mut Journal<'a>> {
        self.journal.as_mut()
    }

    /// Number of tenants.
    pub fn n(&self) -> usize {
        self.tenants.len()
    }

    /// Lease capacity.
    pub fn capacity(&self) -> usize {
        self.leases.len()
    }

    /// A validated copy of the meta record.
    #[inline(always)]
    pub fn meta(&self) -> Result<MetaRec, FairError> {
        let m = *self.meta;
        check_meta(&m, self.leases.len())?;
        Ok(m)
    }

    /// Writes the meta record.
    #[inline(always)]
    pub fn set_meta(&mut self, m: MetaRec) -> Result<(), FairError> {
        put(&mut self.journal, self.meta, &m)
    }

    /// A validated copy of tenant `i`.
    #[inline(always)]
    pub fn tenant(&self, i: usize) -> Result<TenantRec, FairError> {
        let mut t = std::mem::MaybeUninit::uninit();
        Ok(*self.tenant_into(i, &mut t)?)
    }

    /// [`tenant`](Self::tenant) into `out`: one copy of the record, where
    /// the caller keeps it (returned by value, a record was copied into the
    /// result and again out of it; and a zeroed buffer to copy into cost a
    /// `memset` of its 192 bytes first). The copy is checked, not the
    /// shared bytes, which another process may change meanwhile. Returns
    /// the initialised copy.
    #[inline(always)]
    pub fn tenant_into<'o>(
        &self,
        i: usize,
        out: &'o mut std::mem::MaybeUninit<TenantRec>,
    ) -> Result<&'o mut TenantRec, FairError> {
        let src = self.tenants.get(i).ok_or_else(|| {
            FairError::Corrupt(format!(
                "tenant index {i} >= tenant count {}",
                self.tenants.len()
            ))
        })?;
        let t = out.write(*src);
        t.check(i)?;
        Ok(t)
    }

    /// Writes tenant `i`'s changing fields from `t` (index checked by the
    /// caller's earlier read): its tail from [`TENANT_STATE_OFF`] on, and
    /// `want_open` when it differs from the stored one. The fixed fields
    /// (`id_len`, `id`, `weight`, `guarantee`) are never written after
    /// creation, so they are neither saved nor copied.
    #[inline]
    pub fn set_tenant(&mut self, i: usize, t: &TenantRec) -> Result<(), FairError> {
        let Some(slot) = self.tenants.get_mut(i) else {
            return Err(FairError::Corrupt(format!("tenant index {i} out of range")));
        };
        if slot.want_open != t.want_open {
            put(&mut self.journal, &mut slot.want_open, &t.want_open)?;
        }
        put_tail::<TenantRec, TENANT_STATE_OFF>(&mut self.journal, slot, t)
    }

    /// The index of the tenant with this id. Compares the stored bytes
    /// only: the caller then takes a validated copy of that one record
    /// ([`tenant`](Self::tenant)), so the record is copied once, where it
    /// is used.
    #[inline]
    pub fn find_tenant(&self, id: &str) -> Option<usize> {
        let b = id.as_bytes();
        self.tenants
            .iter()
            .position(|t| t.id_len as usize == b.len() && t.id.get(..b.len()) == Some(b))
    }

    /// A validated copy of lease slot `slot`.
    #[inline(always)]
    pub fn lease(&self, slot: usize) -> Result<LeaseRec, FairError> {
        let mut l = LeaseRec::default();
        self.lease_into(slot, &mut l)?;
        Ok(l)
    }

    /// [`lease`](Self::lease) into `out` (one copy, checked; see
    /// [`tenant_into`](Self::tenant_into)). On an error `out` is
    /// unspecified.
    #[inline(always)]
    pub fn lease_into(&self, slot: usize, out: &mut LeaseRec) -> Result<(), FairError> {
        out.copy_used_from(self.leases.get(slot).ok_or_else(|| {
            FairError::Corrupt(format!(
                "lease slot {slot} >= capacity {}",
                self.leases.len()
            ))
        })?);
        out.check(slot, self.n(), self.leases.len())
    }

    /// The display id of a lease (`${tenant}${no}`).
    pub fn lease_id(&self, l: &LeaseRec) -> Result<LeaseId, FairError> {
        let t = self.tenant(l.tenant as usize)?;
        LeaseId::new(t.id_str(), l.no)
            .ok_or_else(|| FairError::Corrupt(format!("tenant record {}: id too long", l.tenant)))
    }

    /// The (tenant, number) a lease id names, parsed strictly (issue 20,
    /// point 9): a tenant id followed by the number in plain decimal, no
    /// sign, no leading zero, no space, at most `u64::MAX`. Lease ids are
    /// unambiguous because no tenant id is another one followed by a
    /// digit (checked at construction).
    #[inline]
    pub fn parse_lease_id(&self, id: &str) -> Option<(usize, u64)> {
        let b = id.as_bytes();
        for (i, t) in self.tenants.iter().enumerate() {
            let n = t.id_len as usize;
            let Some(name) = t.id.get(..n) else { continue };
            let (Some(head), Some(digits)) = (b.get(..n), b.get(n..)) else {
                continue;
            };
            if n == 0 || head != name || digits.is_empty() || digits[0] == b'0' {
                continue;
            }
            let mut no: u64 = 0;
            let mut ok = true;
            for &d in digits {
                let v = match d {
                    b'0'..=b'9' => u64::from(d - b'0'),
                    _ => {
                        ok = false;
                        break;
                    }
                };
                match no.checked_mul(10).and_then(|x| x.checked_add(v)) {
                    Some(x) => no = x,
                    None => {
                        ok = false;
                        break;
                    }
                }
            }
            if ok {
                return Some((i, no));
            }
        }
        None
    }

    fn bucket_of(&self, tenant: u32, no: u64) -> usize {
        let k = (no ^ (u64::from(tenant) << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (k >> (64 - self.bits)) as usize
    }

    /// A link word (slot plus one, or 0), validated.
    fn link_slot(&self, link: u32, what: &str) -> Result<Option<usize>, FairError> {
        match link as usize {
            0 => Ok(None),
            n if n <= self.leases.len() => Ok(Some(n - 1)),
            n => Err(FairError::Corrupt(format!(
                "{what} {n} > lease capacity {}",
                self.leases.len()
            ))),
        }
    }

    /// The live lease `(tenant, no)`, by its hash chain: where it is (take
    /// its validated record with [`lease`](Self::lease)).
    #[inline]
    pub fn find_lease(&self, tenant: usize, no: u64) -> Result<Option<Found>, FairError> {
        let b = self.bucket_of(tenant as u32, no);
        let mut cur = self.link_slot(self.buckets[b], "hash bucket")?;
        let mut prev = None;
        let mut steps = 0usize;
        while let Some(slot) = cur {
            // Records on the chain are read for their key, state and link
            // only; the caller copies out and validates the match.
            let r = &self.leases[slot];
            let (state, t, n, link) = (r.state, r.tenant, r.no, r.link);
            if state != 1 {
                return Err(FairError::Corrupt(format!(
                    "lease slot {slot} (state {state}) is on hash chain {b}"
                )));
            }
            if t as usize == tenant && n == no {
                return Ok(Some(Found {
                    slot,
                    bucket: b,
                    prev,
                }));
            }
            steps += 1;
            if steps > self.leases.len() {
                return Err(FairError::Corrupt(format!("hash chain {b} loops")));
            }
            prev = Some(slot);
            cur = self.link_slot(link, "hash link")?;
        }
        Ok(None)
    }

    /// The slot the next lease will take, and the meta record after taking
    /// it (nothing is written): the last freed slot, else a never-used one.
    #[inline]
    pub fn take_slot(&self, mut m: MetaRec) -> Result<Option<(usize, MetaRec)>, FairError> {
        if let Some(slot) = self.link_slot(m.free_head, "free list head")? {
            // A free slot is read for its state and link only.
            let r = &self.leases[slot];
            let (state, link) = (r.state, r.link);
            if state != 0 || link as usize > self.leases.len() {
                return Err(FairError::Corrupt(format!(
                    "lease slot {slot} (state {state}, link {link}) is on the free list"
                )));
            }
            m.free_head = link;
            return Ok(Some((slot, m)));
        }
        if (m.fresh as usize) < self.leases.len() {
            let slot = m.fresh as usize;
            m.fresh += 1;
            return Ok(Some((slot, m)));
        }
        Ok(None)
    }

    /// Writes the new live lease `rec` into `slot` (taken by
    /// [`take_slot`](Self::take_slot)), links it into its hash chain and
    /// the live list. `m` is updated; the caller writes it.
    #[inline]
    pub fn insert_lease(
        &mut self,
        m: &mut MetaRec,
        slot: usize,
        rec: &LeaseRec,
    ) -> Result<(), FairError> {
        let b = self.bucket_of(rec.tenant, rec.no);
        let pos = m.live_count as usize;
        if pos >= self.live.len() {
            return Err(FairError::Corrupt(format!(
                "live count {pos} >= capacity {}",
                self.live.len()
            )));
        }
        let link = self.buckets[b];
        // The slot is free (take_slot checked): only its state and link
        // need saving.
        update_saving(
            &mut self.journal,
            slot_mut(self.leases, slot)?,
            FREE_LEASE_BYTES,
            |d| {
                d.copy_used_from(rec);
                d.state = 1;
                d.live_pos = pos as u32;
                d.link = link;
            },
        )?;
        put(&mut self.journal, &mut self.buckets[b], &(slot as u32 + 1))?;
        // Beyond the committed live count: not read after an undo (which
        // restores the count), so not saved.
        put_saving(&mut self.journal, &mut self.live[pos], &(slot as u32), 0)?;
        m.live_count += 1;
        Ok(())
    }

    /// Unlinks the live lease `f` (whose validated record is `rec`) from
    /// its hash chain and the live list and puts its slot on the free list.
    /// `m` is updated; the caller writes it.
    #[inline]
    pub fn remove_lease(
        &mut self,
        m: &mut MetaRec,
        f: &Found,
        rec: &LeaseRec,
    ) -> Result<(), FairError> {
        match f.prev {
            Some(p) => {
                let link = rec.link;
                put(
                    &mut self.journal,
                    &mut slot_mut(self.leases, p)?.link,
                    &link,
                )?;
            }
            None => put(&mut self.journal, &mut self.buckets[f.bucket], &rec.link)?,
        }
        let pos = rec.live_pos as usize;
        let last = (m.live_count as usize).checked_sub(1);
        if last.is_none_or(|l| pos > l) || self.live.get(pos) != Some(&(f.slot as u32)) {
            return Err(FairError::Corrupt(format!(
                "lease slot {} is not at live position {pos} (live count {})",
                f.slot, m.live_count
            )));
        }
        let last = last.unwrap_or(0);
        if pos != last {
            let moved = *self.live.get(last).ok_or_else(|| {
                FairError::Corrupt(format!("live count {} out of range", m.live_count))
            })?;
            if self.leases.get(moved as usize).map(|r| r.state) != Some(1) {
                return Err(FairError::Corrupt(format!(
                    "live list position {last} names slot {moved}, which is not live"
                )));
            }
            put(&mut self.journal, &mut self.live[pos], &moved)?;
            put(
                &mut self.journal,
                &mut slot_mut(self.leases, moved as usize)?.live_pos,
                &(pos as u32),
            )?;
        }
        m.live_count -= 1;
        // Freed: its state and its free-list link are all that is read of
        // it from now on (the other fields keep the old lease's values), so
        // only they are saved and written.
        let head = m.free_head;
        update_saving(
            &mut self.journal,
            slot_mut(self.leases, f.slot)?,
            FREE_LEASE_BYTES,
            |d| {
                d.state = 0;
                d.link = head;
            },
        )?;
        m.free_head = f.slot as u32 + 1;
        Ok(())
    }

    /// The live lease at position `pos` of the live list (validated: live,
    /// and recorded at that position).
    #[inline]
    pub fn live_lease(&self, pos: usize) -> Result<(usize, LeaseRec), FairError> {
        let slot = *self
            .live
            .get(pos)
            .ok_or_else(|| FairError::Corrupt(format!("live position {pos} out of range")))?
            as usize;
        let l = self.lease(slot)?;
        if l.state != 1 || l.live_pos as usize != pos {
            return Err(FairError::Corrupt(format!(
                "live position {pos} names slot {slot} (state {}, position {})",
                l.state, l.live_pos
            )));
        }
        Ok((slot, l))
    }
}

/// Checks a meta record against the lease capacity.
pub(crate) fn check_meta(m: &MetaRec, cap: usize) -> Result<(), FairError> {
    if m.next_seq > COUNTER_LIMIT || m.reaped_total > COUNTER_LIMIT {
        return Err(FairError::Corrupt(format!(
            "lease sequence {} / reaped total {} exceed {COUNTER_LIMIT}",
            m.next_seq, m.reaped_total
        )));
    }
    if m.fresh as usize > cap || m.free_head as usize > cap || m.live_count > m.fresh {
        return Err(FairError::Corrupt(format!(
            "lease slots used {} / free head {} / live {} out of range for capacity {cap}",
            m.fresh, m.free_head, m.live_count
        )));
    }
    Ok(())
}

/// Owned ledger state (the in-process home, and inspection snapshots).
#[derive(Debug, Clone)]
pub struct OwnedState {
    /// The meta record.
    pub meta: MetaRec,
    /// Tenant records.
    pub tenants: Box<[TenantRec]>,
    /// Lease slots.
    pub leases: Box<[LeaseRec]>,
    /// Hash buckets.
    pub buckets: Box<[u32]>,
    /// The live list.
    pub live: Box<[u32]>,
}

fn boxed<T: Clone>(n: usize, v: T, what: &str, size: usize) -> Result<Box<[T]>, FairError> {
    let mut x = Vec::new();
    x.try_reserve_exact(n).map_err(|e| {
        FairError::InvalidConfig(format!(
            "cannot allocate {n} {what} ({} bytes): {e}",
            n.saturating_mul(size)
        ))
    })?;
    x.resize(n, v);
    Ok(x.into_boxed_slice())
}

impl OwnedState {
    /// A fresh state: `meta`, `tenants`, and `cap` free lease slots. Memory
    /// the system cannot give is an error, never an abort.
    pub fn new(
        meta: MetaRec,
        tenants: Vec<TenantRec>,
        cap: usize,
    ) -> Result<OwnedState, FairError> {
        Ok(OwnedState {
            meta,
            tenants: tenants.into_boxed_slice(),
            leases: boxed(
                cap,
                LeaseRec::default(),
                "lease slots",
                std::mem::size_of::<LeaseRec>(),
            )?,
            buckets: boxed(bucket_count(cap), 0, "hash buckets", 4)?,
            live: boxed(cap, 0, "live-list entries", 4)?,
        })
    }

    /// A view over this state (no journal: in-process writes are final),
    /// its parts checked against `p`.
    #[cfg(test)]
    pub fn view<'s>(&'s mut self, p: &'s Params) -> Result<View<'s>, FairError> {
        View::new(
            p,
            Parts {
                meta: &mut self.meta,
                tenants: &mut self.tenants,
                leases: &mut self.leases,
                buckets: &mut self.buckets,
                live: &mut self.live,
            },
        )
    }

    /// A view over this state, whose parts were built for `p`
    /// ([`OwnedState::new`] with `p`'s tenants and capacity): their lengths
    /// are not checked again on every call (see [`View::from_parts`]).
    #[inline(always)]
    pub(crate) fn view_built<'s>(&'s mut self, p: &'s Params) -> View<'s> {
        View::from_parts(
            p,
            Parts {
                meta: &mut self.meta,
                tenants: &mut self.tenants,
                leases: &mut self.leases,
                buckets: &mut self.buckets,
                live: &mut self.live,
            },
            None,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(n: u32, cap: u32) -> &'static Params {
        Box::leak(Box::new(Params {
            ceiling: 100.0,
            total_weight: 2.0,
            unit: 0,
            flags: 0,
            reclaim_horizon_ms: 100,
            idle_after_ms: 1000,
            started_at_ms: 0,
            tenant_count: n,
            lease_capacity: cap,
        }))
    }

    fn state() -> OwnedState {
        let t = vec![
            TenantRec::new("a", 1.0, 50.0, 0).unwrap(),
            TenantRec::new("b", 1.0, 50.0, 0).unwrap(),
        ];
        OwnedState::new(MetaRec::default(), t, 4).unwrap()
    }

    #[test]
    fn records_are_plain_fixed_size() {
        assert_eq!(std::mem::size_of::<MetaRec>(), 40);
        assert_eq!(std::mem::size_of::<TenantRec>() % 8, 0);
        assert_eq!(std::mem::size_of::<LeaseRec>(), 208);
        assert_eq!(std::mem::size_of::<SliceRec>(), 16);
        assert_eq!(MAX_RECORD_BYTES, 208);
        assert_eq!(bucket_count(1), 2);
        assert_eq!(bucket_count(4096), 8192);
        assert_eq!(bucket_count(4097), 16384);
    }

    #[test]
    fn finite_non_negative_is_the_float_rule() {
        // Finite and not negative, `-0.0` included.
        let bits = |v: f64| v.is_finite() && v >= 0.0;
        for v in [
            0.0,
            -0.0,
            1.0,
            -1.0,
            f64::MIN_POSITIVE,
            f64::MIN_POSITIVE / 4.0,
            -f64::MIN_POSITIVE / 4.0,
            f64::MAX,
            f64::MIN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -f64::NAN,
            f64::from_bits(0x7ff0_0000_0000_0001),
            f64::from_bits(0xfff8_0000_0000_0000),
            f64::from_bits(0x8000_0000_0000_0001),
        ] {
            assert_eq!(
                finite_non_negative(v),
                bits(v),
                "{v:?} ({:#x})",
                v.to_bits()
            );
        }
    }

    #[test]
    fn corrupt_fields_are_errors() {
        let mut s = state();
        s.tenants[1].own_held = f64::NAN;
        s.tenants[0].id_len = 99;
        s.leases[0] = LeaseRec {
            state: 1,
            tenant: 7,
            no: 1,
            ..LeaseRec::default()
        };
        s.leases[1] = LeaseRec {
            state: 1,
            tenant: 0,
            n_slices: 1,
            no: 1,
            ..LeaseRec::default()
        };
        s.leases[1].slices[0].lender = 0; // lends to itself
        s.leases[2] = LeaseRec {
            state: 9,
            ..LeaseRec::default()
        };
        s.leases[3] = LeaseRec {
            state: 1,
            tenant: 1,
            no: 1,
            granted_ms: 5,
            deadline_ms: 4,
            ..LeaseRec::default()
        };
        s.meta.fresh = 4;
        s.meta.live_count = 4;
        let v = s.view(params(2, 4)).unwrap();
        for e in [
            v.tenant(0).unwrap_err(),
            v.tenant(1).unwrap_err(),
            v.tenant(2).unwrap_err(),
        ] {
            assert!(matches!(e, FairError::Corrupt(_)), "{e}");
        }
        for slot in 0..4 {
            assert!(
                matches!(v.lease(slot), Err(FairError::Corrupt(_))),
                "slot {slot}"
            );
        }
        assert!(v.live_lease(0).is_err());
        assert!(v.lease(4).is_err());
    }

    #[test]
    fn meta_and_params_are_checked() {
        let mut s = state();
        assert!(s.view(params(3, 4)).is_err(), "tenant count mismatch");
        let mut p = *params(2, 4);
        p.idle_after_ms = 100;
        assert!(p.check().is_err());
        p = *params(2, 4);
        p.unit = 5;
        assert!(p.check().is_err());
        s.meta.fresh = 5;
        let v = s.view(params(2, 4)).unwrap();
        assert!(v.meta().is_err());
    }

    #[test]
    fn lease_ids_parse_strictly() {
        let mut s = state();
        let v = s.view(params(2, 4)).unwrap();
        assert_eq!(v.parse_lease_id("a1"), Some((0, 1)));
        assert_eq!(
            v.parse_lease_id("b18446744073709551615"),
            Some((1, u64::MAX))
        );
        for bad in [
            "a+1",
            "a01",
            "a0",
            "a",
            "",
            "a1 ",
            "b18446744073709551616",
            "c1",
            "a-1",
        ] {
            assert_eq!(v.parse_lease_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn insert_find_remove_and_reuse() {
        let mut s = state();
        let mut v = s.view(params(2, 4)).unwrap();
        let mut m = v.meta().unwrap();
        let mut slots = Vec::new();
        for no in 1..=4u64 {
            let (slot, m2) = v.take_slot(m).unwrap().unwrap();
            m = m2;
            let rec = LeaseRec {
                tenant: (no % 2) as u32,
                no,
                ..LeaseRec::default()
            };
            v.insert_lease(&mut m, slot, &rec).unwrap();
            slots.push(slot);
        }
        assert_eq!(v.take_slot(m).unwrap(), None, "full");
        let f = v.find_lease(1, 1).unwrap().unwrap();
        assert_eq!(f.slot, slots[0]);
        let rec = v.lease(f.slot).unwrap();
        v.remove_lease(&mut m, &f, &rec).unwrap();
        assert!(v.find_lease(1, 1).unwrap().is_none());
        assert_eq!(m.live_count, 3);
        for pos in 0..3 {
            v.live_lease(pos).unwrap();
        }
        for (t, no) in [(0, 2), (1, 3), (0, 4)] {
            assert!(v.find_lease(t, no).unwrap().is_some(), "{t} {no}");
        }
        let (slot, _) = v.take_slot(m).unwrap().unwrap();
        assert_eq!(slot, slots[0], "the last freed slot is reused first");
    }
}
