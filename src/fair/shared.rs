//! The shared-memory home of the ledger: the same records and the same
//! algorithms as [`FairShare`](super::FairShare), kept crash-consistent in
//! memory mapped by many processes.
//!
//! # Layout
//!
//! ```text
//! [ SharedHeader | copy 0: MetaRec, TenantRec × n, LeaseRec × cap | copy 1: same ]
//! ```
//!
//! The header holds a magic number, the layout version, the robust mutex's
//! layout tag ([`MUTEX_LAYOUT_TAG`]), the total size, the immutable
//! parameters (`Params`), the `committed` index (0 or 1) and the mutex. Everything is
//! `#[repr(C)]` plain integers and floats at fixed offsets; no pointers.
//!
//! # Commit protocol (crash consistency, rule 8)
//!
//! Every call, including `stats`, runs:
//!
//! 1. lock the robust mutex, waiting at most [`LEDGER_LOCK_WAIT`] for a
//!    live holder (see [`RobustMutex::lock_bounded`]). On `OwnerDied` the
//!    previous holder died somewhere below; whatever it did, it only wrote
//!    the *scratch* copy (or had already flipped the index, making its
//!    finished update the committed one), so the committed copy is intact:
//!    count a recovery and mark the mutex consistent. A *corrupt* mutex (a
//!    lock word no live thread can release, a scribbled type word, a
//!    not-recoverable state) is re-initialised, in a region, under the
//!    region's repair lock ([`REPAIR_LOCK`]); by the same argument the
//!    committed copy is intact, so nothing else needs repair. Without a
//!    region (raw memory) it is an error;
//! 2. read `committed` (validated: 0 or 1) and copy the committed copy's
//!    used bytes (meta, tenants, leases below the high-water mark) onto the
//!    other copy, the scratch;
//! 3. run the ledger operation on a validated view of the scratch;
//! 4. on success, publish with a single atomic store of the scratch's index
//!    into `committed` (release ordering); on a misuse error or a corrupt
//!    record, skip the store, so the call changes nothing;
//! 5. write back the mutex's type word and list pointers as they were at
//!    lock time (glibc writes through the list pointers on unlock, and the
//!    region is writable by others), and unlock.
//!
//! A process killed at any point before step 4 leaves the committed copy as
//! it was; killed after it, its update is complete. Slots above the
//! high-water mark in the scratch may hold an aborted update's bytes; they
//! are never read (a slot is read only below the high-water mark, and a new
//! slot is written whole before the mark covers it).
//!
//! The region layer (process table, liveness, reaping) is bound on top of
//! this type by [`SharedFairShare`](super::SharedFairShare): each lease
//! records the owner id of the process that took it, and
//! [`SharedLedger::reap_owner`] releases a dead owner's leases, counted in
//! `reaped_leases`. This raw type works on any caller-provided memory
//! (tests use an anonymous `MAP_SHARED` mapping).
//!
//! Calls with `now` = `None` inside the crate (the `*_now` calls of
//! [`SharedFairShare`](super::SharedFairShare)) read `CLOCK_MONOTONIC` after
//! taking the lock (ruling Q22).

use std::mem::{align_of, size_of};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::admission;
use super::store::{LeaseRec, MetaRec, Params, TenantRec, View, FLAG_REFUSAL_NOT_ACTIVITY};
use super::{
    initial_state, AcquireResult, FairConfig, FairError, FairLedger, FairnessReport, Lease, Plan,
    Refusal, Stats,
};
use crate::region::Mapping;
use crate::sys::clock::monotonic_ms;
use crate::sys::robust_mutex::{Bounded, Held, LockState, LockWait, RobustMutex, MUTEX_LAYOUT_TAG};

/// Longest a call waits for the ledger's lock while a live thread holds it
/// (a ledger call holds it for microseconds; a holder stopped longer than
/// this makes calls fail with [`FairError::Lock`] instead of hanging).
pub const LEDGER_LOCK_WAIT: Duration = Duration::from_secs(5);

/// The region object lock ([`Mapping::lock_object_byte`]) under which a
/// corrupt ledger mutex is re-initialised.
pub const REPAIR_LOCK: u32 = 0;

/// Repairs of a corrupt mutex in one call before giving up (a writer that
/// keeps scribbling on the lock denies service; it cannot hang a caller).
const MAX_REPAIRS_PER_CALL: u32 = 3;

/// Magic number at offset 0 of a shared ledger: `"SHMFAIR1"`.
pub const SHARED_MAGIC: u64 = u64::from_le_bytes(*b"SHMFAIR1");

/// Layout version of [`SharedLedger`] memory.
pub const SHARED_LAYOUT_VERSION: u32 = 1;

/// Most tenants a shared ledger accepts (bounds the size arithmetic).
pub const MAX_SHARED_TENANTS: usize = 4096;

/// Most lease slots a shared ledger accepts (the same bound as in-process,
/// [`MAX_LEASE_CAPACITY`](super::MAX_LEASE_CAPACITY)).
pub const MAX_SHARED_LEASES: usize = super::MAX_LEASE_CAPACITY;

/// The fixed header at the start of a shared ledger.
///
/// `magic`…`params` are written once by the creator before any other
/// process can see the memory and are read-only afterwards. `committed` is
/// written only under the mutex, by one atomic store per commit; counters
/// likewise.
#[repr(C)]
struct SharedHeader {
    magic: u64,
    version: u32,
    _pad: u32,
    mutex_layout_tag: u64,
    total_size: u64,
    params: Params,
    committed: AtomicU32,
    _pad2: u32,
    commits: AtomicU64,
    recoveries: AtomicU64,
    mutex: RobustMutex,
    /// Times a corrupt mutex was re-initialised (in what was padding before;
    /// zero in a new ledger).
    repairs: AtomicU64,
}

// The offsets region tests scribble at; the header's rounded size.
const _: () = assert!(std::mem::offset_of!(SharedHeader, committed) == 88);
const _: () = assert!(std::mem::offset_of!(SharedHeader, mutex) == 112);
const _: () = assert!(size_of::<SharedHeader>() <= 192);

fn round_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

fn header_size() -> usize {
    round_up(size_of::<SharedHeader>(), 64)
}

fn copy_size(n: usize, cap: usize) -> usize {
    size_of::<MetaRec>() + n * size_of::<TenantRec>() + cap * size_of::<LeaseRec>()
}

/// Where an update may be made to die, for crash tests.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CrashPoint {
    /// Right after taking the lock.
    AfterLock,
    /// Half-way through copying committed → scratch.
    MidCopy,
    /// After the operation mutated the scratch, before the flip.
    BeforeFlip,
    /// After the flip, before unlocking.
    AfterFlip,
}

/// A fair-share ledger stored in shared memory (see the module docs).
///
/// The handle is a pointer into memory the caller keeps mapped; it does not
/// own the mapping.
#[derive(Debug)]
pub struct SharedLedger {
    base: NonNull<u8>,
    n: usize,
    cap: usize,
    params: Params,
    owner: u32,
    flags_override: Option<u32>,
    crash: Option<(u64, CrashPoint)>,
    ops: u64,
    /// The region the ledger lives in, if any: for the maps check of a lock
    /// holder and the repair lock.
    region: Option<Arc<Mapping>>,
    /// Test seam: runs while the lock is held.
    while_locked: Option<fn()>,
}

// SAFETY: the handle only refers to shared memory whose mutable parts are
// accessed under the process-shared mutex or through atomics.
unsafe impl Send for SharedLedger {}

impl SharedLedger {
    /// Bytes of memory needed for `cfg` with `lease_capacity` slots.
    pub fn required_size(cfg: &FairConfig, lease_capacity: usize) -> Result<usize, FairError> {
        cfg.validate()?;
        Self::size_for(cfg.tenants.len(), lease_capacity)
    }

    /// Bytes for `n` tenants and `cap` lease slots.
    pub(crate) fn size_for_counts(n: usize, cap: usize) -> Result<usize, FairError> {
        Self::size_for(n, cap)
    }

    fn size_for(n: usize, cap: usize) -> Result<usize, FairError> {
        if n == 0 || n > MAX_SHARED_TENANTS || cap == 0 || cap > MAX_SHARED_LEASES {
            return Err(FairError::InvalidConfig(format!(
                "{n} tenants / {cap} lease slots out of range for a shared ledger (1..={MAX_SHARED_TENANTS} / \
                 1..={MAX_SHARED_LEASES})"
            )));
        }
        Ok(header_size() + 2 * copy_size(n, cap))
    }

    fn check_mem(mem: *mut u8, len: usize, need: usize) -> Result<NonNull<u8>, FairError> {
        let base =
            NonNull::new(mem).ok_or_else(|| FairError::InvalidConfig("null memory".into()))?;
        if (mem as usize) % align_of::<SharedHeader>() != 0 {
            return Err(FairError::InvalidConfig(format!(
                "memory at {mem:p} is not aligned to {}",
                align_of::<SharedHeader>()
            )));
        }
        if len < need {
            return Err(FairError::InvalidConfig(format!(
                "memory of {len} bytes is smaller than the {need} needed"
            )));
        }
        Ok(base)
    }

    /// Initialises a shared ledger in `mem`.
    ///
    /// # Safety
    ///
    /// `mem` must be valid for reads and writes of `len` bytes for as long
    /// as this handle and any handle from [`SharedLedger::attach`] is used,
    /// and no other process may use these bytes until this call returns.
    pub unsafe fn create(
        mem: *mut u8,
        len: usize,
        cfg: &FairConfig,
        lease_capacity: usize,
    ) -> Result<SharedLedger, FairError> {
        let (params, meta, tenants) = initial_state(cfg, lease_capacity)?;
        let need = Self::size_for(tenants.len(), lease_capacity)?;
        let base = Self::check_mem(mem, len, need)?;
        let h = mem as *mut SharedHeader;
        // SAFETY: `mem` is valid, aligned and exclusively ours (caller
        // contract); zeroing gives every record its free/empty state.
        unsafe { ptr::write_bytes(mem, 0, need) };
        for copy in 0..2 {
            let (m, t, _) = Self::copy_ptrs(mem, tenants.len(), lease_capacity, copy);
            // SAFETY: pointers are inside the zeroed area and aligned to 8
            // (all record sizes are multiples of 8, the header is padded).
            unsafe {
                ptr::write(m, meta);
                ptr::copy_nonoverlapping(tenants.as_ptr(), t, tenants.len());
            }
        }
        // SAFETY: `h` points at the zeroed header; the fields are plain data
        // and atomics (zero is a valid atomic), written before publication.
        unsafe {
            ptr::addr_of_mut!((*h).version).write(SHARED_LAYOUT_VERSION);
            ptr::addr_of_mut!((*h).mutex_layout_tag).write(MUTEX_LAYOUT_TAG);
            ptr::addr_of_mut!((*h).total_size).write(need as u64);
            ptr::addr_of_mut!((*h).params).write(params);
            RobustMutex::init_in_place(ptr::addr_of_mut!((*h).mutex))
                .map_err(|e| FairError::Lock(e.to_string()))?;
            // The magic goes last: an opener that sees it sees the rest.
            (*(ptr::addr_of!((*h).magic) as *const AtomicU64))
                .store(SHARED_MAGIC, Ordering::Release);
        }
        Ok(SharedLedger {
            base,
            n: tenants.len(),
            cap: lease_capacity,
            params,
            owner: 0,
            flags_override: None,
            crash: None,
            ops: 0,
            region: None,
            while_locked: None,
        })
    }

    /// Attaches to a shared ledger created by [`SharedLedger::create`],
    /// validating the header (magic, version, mutex layout, sizes,
    /// parameters).
    ///
    /// # Safety
    ///
    /// `mem` must be valid for reads and writes of `len` bytes for as long
    /// as the handle is used.
    pub unsafe fn attach(mem: *mut u8, len: usize) -> Result<SharedLedger, FairError> {
        let base = Self::check_mem(mem, len, header_size())?;
        let h = mem as *const SharedHeader;
        let bad = |m: String| Err(FairError::Corrupt(m));
        // SAFETY: the header lies within `len` bytes (checked); its fields
        // are plain integers for which every bit pattern is valid.
        let (magic, version, tag, total, params) = unsafe {
            (
                (*(ptr::addr_of!((*h).magic) as *const AtomicU64)).load(Ordering::Acquire),
                ptr::addr_of!((*h).version).read(),
                ptr::addr_of!((*h).mutex_layout_tag).read(),
                ptr::addr_of!((*h).total_size).read(),
                ptr::addr_of!((*h).params).read(),
            )
        };
        if magic != SHARED_MAGIC {
            return bad(format!(
                "magic {magic:#x} is not a fair-share ledger ({SHARED_MAGIC:#x})"
            ));
        }
        if version != SHARED_LAYOUT_VERSION {
            return bad(format!(
                "layout version {version}, this build reads {SHARED_LAYOUT_VERSION}"
            ));
        }
        if tag != MUTEX_LAYOUT_TAG {
            return bad(format!(
                "mutex layout tag {tag:#x} differs from this build's {MUTEX_LAYOUT_TAG:#x} (another libc or architecture)"
            ));
        }
        params.check()?;
        let (n, cap) = (params.tenant_count as usize, params.lease_capacity as usize);
        let need = Self::size_for(n, cap).map_err(|e| FairError::Corrupt(e.to_string()))?;
        if total != need as u64 || len < need {
            return bad(format!(
                "size {total} recorded, {need} computed, {len} mapped"
            ));
        }
        Ok(SharedLedger {
            base,
            n,
            cap,
            params,
            owner: 0,
            flags_override: None,
            crash: None,
            ops: 0,
            region: None,
            while_locked: None,
        })
    }

    /// Binds the handle to the region mapping the ledger lives in: a lock
    /// holder whose process does not map the region file is then known to
    /// be bogus, and a corrupt mutex is repaired under the region's
    /// [`REPAIR_LOCK`].
    pub(crate) fn set_region(&mut self, map: Arc<Mapping>) {
        self.region = Some(map);
    }

    /// Test seam: `f` runs inside every call while the ledger's lock is
    /// held. Never use it outside tests.
    #[doc(hidden)]
    pub fn test_while_locked(&mut self, f: Option<fn()>) {
        self.while_locked = f;
    }

    /// Times a corrupt ledger mutex was re-initialised.
    pub fn repairs(&self) -> u64 {
        self.header().repairs.load(Ordering::Relaxed)
    }

    /// Sets the owner id (from the region's process table) recorded in
    /// leases this handle takes.
    pub fn set_owner(&mut self, owner: u32) {
        self.owner = owner;
    }

    /// Times a holder died mid-call and the next caller recovered.
    pub fn recoveries(&self) -> u64 {
        self.header().recoveries.load(Ordering::Relaxed)
    }

    /// Test seam for trace T10 (see [`FairShare`](super::FairShare)); local
    /// to this handle.
    #[doc(hidden)]
    pub fn set_refusal_counts_as_activity(&mut self, yes: bool) {
        let f = self.params.flags & !FLAG_REFUSAL_NOT_ACTIVITY;
        self.flags_override = Some(if yes {
            f
        } else {
            f | FLAG_REFUSAL_NOT_ACTIVITY
        });
    }

    /// Crash test hook: the `nth` call (0-based) made through this handle
    /// aborts the process at `point`.
    #[doc(hidden)]
    pub fn crash_at(&mut self, nth: u64, point: CrashPoint) {
        self.crash = Some((nth, point));
    }

    fn header(&self) -> &SharedHeader {
        // SAFETY: `base` points at a header validated at create/attach and
        // kept mapped by the caller's contract; shared parts are atomics or
        // the mutex, and the rest is read-only after creation.
        unsafe { &*(self.base.as_ptr() as *const SharedHeader) }
    }

    fn copy_ptrs(
        base: *mut u8,
        n: usize,
        cap: usize,
        copy: usize,
    ) -> (*mut MetaRec, *mut TenantRec, *mut LeaseRec) {
        let start = header_size() + copy * copy_size(n, cap);
        // SAFETY (for callers): offsets stay within `size_for(n, cap)`.
        let m = base.wrapping_add(start);
        let t = m.wrapping_add(size_of::<MetaRec>());
        let l = t.wrapping_add(n * size_of::<TenantRec>());
        (m as *mut MetaRec, t as *mut TenantRec, l as *mut LeaseRec)
    }

    fn maybe_crash(&self, nth: u64, at: CrashPoint) {
        if self.crash == Some((nth, at)) {
            std::process::abort();
        }
    }

    /// Takes the ledger's lock (bounded), repairing a corrupt mutex when the
    /// ledger lives in a region (see the module docs).
    fn lock(&self) -> Result<(LockState, Held), FairError> {
        let h = self.header();
        let file = self.region.as_ref().map(|m| m.file_identity());
        // In a region, only a process that holds a process-table entry (as
        // its live owner, or as the reaper at work on it) ever holds the
        // lock: every call registers its process first, and a reaper records
        // itself in the entry it reaps.
        let registered = |pid: i32| {
            self.region.as_ref().is_none_or(|m| {
                (0..m.process_slots()).any(|idx| {
                    m.proc_entry(idx).is_ok_and(|e| e.pid() == pid)
                        && m.entry_holder(idx).map_or(true, |h| h == Some(pid))
                })
            })
        };
        let wait = LockWait {
            timeout: LEDGER_LOCK_WAIT,
            file,
            may_hold: self
                .region
                .as_ref()
                .map(|_| &registered as &dyn Fn(i32) -> bool),
        };
        let mut repairs = 0;
        loop {
            let c = match h.mutex.lock_bounded(&wait) {
                Ok(Bounded::Locked(state, held)) => return Ok((state, held)),
                Ok(Bounded::Corrupt(c)) => c,
                Err(e) => return Err(FairError::Lock(e.to_string())),
            };
            let Some(map) = self
                .region
                .as_ref()
                .filter(|_| repairs < MAX_REPAIRS_PER_CALL)
            else {
                return Err(FairError::Lock(format!(
                    "the ledger's mutex is corrupt ({c}); {}",
                    if self.region.is_some() {
                        "it was repaired and corrupted again"
                    } else {
                        "no region to repair it under"
                    }
                )));
            };
            let _g = map
                .lock_object_byte(REPAIR_LOCK, LEDGER_LOCK_WAIT)
                .map_err(|e| FairError::Lock(format!("repairing a corrupt mutex ({c}): {e}")))?;
            // SAFETY: every repairer of this ledger's mutex holds the region's
            // REPAIR_LOCK (taken above), and this thread does not hold the
            // mutex (lock_bounded reported it corrupt without locking it).
            let fixed = unsafe { h.mutex.reinit_if_still(&c, &wait) }
                .map_err(|e| FairError::Lock(format!("repairing a corrupt mutex ({c}): {e}")))?;
            if fixed {
                h.repairs.fetch_add(1, Ordering::Relaxed);
            }
            repairs += 1;
        }
    }

    /// Runs `f` on a scratch copy under the lock and commits it on success.
    fn with_view<R>(
        &mut self,
        f: impl FnOnce(&mut View<'_>) -> Result<R, FairError>,
    ) -> Result<R, FairError> {
        self.with_view_at(Some(0), |v, _| f(v).map(|r| (r, true)))
    }

    /// The general form of [`with_view`](Self::with_view): `at` is the
    /// caller's `now`, or `None` to read `CLOCK_MONOTONIC` *after* taking the
    /// lock (ruling Q22: concurrent processes then never go backwards); `f`
    /// gets the resolved `now` and returns whether to commit.
    fn with_view_at<R>(
        &mut self,
        at: Option<u64>,
        f: impl FnOnce(&mut View<'_>, u64) -> Result<(R, bool), FairError>,
    ) -> Result<R, FairError> {
        let nth = self.ops;
        self.ops += 1;
        let (state, held) = self.lock()?;
        let h = self.header();
        let guard = Unlock(&h.mutex, held);
        if let Some(f) = self.while_locked {
            f();
        }
        if state == LockState::OwnerDied {
            // The committed copy is intact whatever the dead holder did;
            // the scratch is rebuilt below from the committed copy.
            h.recoveries.fetch_add(1, Ordering::Relaxed);
            h.mutex
                .consistent()
                .map_err(|e| FairError::Lock(e.to_string()))?;
        }
        let now = match at {
            Some(t) => t,
            None => monotonic_ms(),
        };
        self.maybe_crash(nth, CrashPoint::AfterLock);
        let committed = h.committed.load(Ordering::Acquire);
        if committed > 1 {
            return Err(FairError::Corrupt(format!(
                "committed index {committed} is not 0 or 1"
            )));
        }
        let scratch = 1 - committed as usize;
        let base = self.base.as_ptr();
        let (cm, ct, cl) = Self::copy_ptrs(base, self.n, self.cap, committed as usize);
        let (sm, st, sl) = Self::copy_ptrs(base, self.n, self.cap, scratch);
        // SAFETY: both copies lie within the validated size; every bit
        // pattern is a valid MetaRec; we hold the mutex, so no well-behaved
        // process writes either copy concurrently.
        let hwm = unsafe { ptr::read(cm) }.lease_hwm as usize;
        if hwm > self.cap {
            return Err(FairError::Corrupt(format!(
                "lease high-water mark {hwm} > capacity {}",
                self.cap
            )));
        }
        let half = hwm / 2;
        // SAFETY: as above; the copies do not overlap (distinct ranges).
        unsafe {
            ptr::copy_nonoverlapping(cm, sm, 1);
            ptr::copy_nonoverlapping(ct, st, self.n);
            ptr::copy_nonoverlapping(cl, sl, half);
        }
        self.maybe_crash(nth, CrashPoint::MidCopy);
        // SAFETY: as above.
        unsafe { ptr::copy_nonoverlapping(cl.add(half), sl.add(half), hwm - half) };
        let mut params = self.params;
        if let Some(f) = self.flags_override {
            params.flags = f;
        }
        // SAFETY: the scratch copy is ours under the lock; the records are
        // plain data (any bit pattern valid, checked on read by the view);
        // the slices cover exactly the scratch copy's arrays.
        let (meta, tenants, leases) = unsafe {
            (
                &mut *sm,
                std::slice::from_raw_parts_mut(st, self.n),
                std::slice::from_raw_parts_mut(sl, self.cap),
            )
        };
        let mut view = View::new(params, meta, tenants, leases)?;
        let (r, commit) = f(&mut view, now)?;
        if !commit {
            return Ok(r);
        }
        self.maybe_crash(nth, CrashPoint::BeforeFlip);
        h.committed.store(scratch as u32, Ordering::Release);
        h.commits.fetch_add(1, Ordering::Relaxed);
        self.maybe_crash(nth, CrashPoint::AfterFlip);
        drop(guard);
        Ok(r)
    }

    /// See [`FairLedger::acquire`].
    pub fn acquire(&mut self, tenant: &str, cost: f64, hold_ms: u64, now_ms: u64) -> AcquireResult {
        let owner = self.owner;
        self.with_view(|v| admission::acquire(v, owner, tenant, cost, hold_ms, now_ms))
    }

    /// Acquire on behalf of `owner` at `at` (`None`: the clock, read under
    /// the lock). With `commit_refusal` false a refusal is answered
    /// `Ok(None)` and not committed (nothing changes), so the caller can
    /// reap dead processes and ask again without recording a refusal twice.
    pub(crate) fn acquire_as(
        &mut self,
        owner: u32,
        tenant: &str,
        cost: f64,
        hold_ms: u64,
        at: Option<u64>,
        commit_refusal: bool,
    ) -> Result<Option<Result<Lease, Refusal>>, FairError> {
        self.with_view_at(at, |v, now| {
            let r = admission::acquire(v, owner, tenant, cost, hold_ms, now)?;
            Ok(match r {
                Ok(l) => (Some(Ok(l)), true),
                Err(refusal) if commit_refusal => (Some(Err(refusal)), true),
                Err(_) => (None, false),
            })
        })
    }

    /// See [`FairLedger::release`].
    pub fn release(&mut self, lease_id: &str, now_ms: u64) -> Result<(), FairError> {
        self.with_view(|v| admission::release(v, lease_id, now_ms))
    }

    /// Whether any live lease is recorded under `owner` (read-only: nothing
    /// is committed).
    pub(crate) fn owner_holds(&mut self, owner: u32) -> Result<bool, FairError> {
        self.with_view_at(Some(0), |v, _| {
            let any = v.live_leases()?.iter().any(|(_, l)| l.owner == owner);
            Ok((any, false))
        })
    }

    /// Releases every lease taken under `owner` (a process found dead);
    /// returns how many. Counted per tenant in `reaped_leases`; not activity.
    pub fn reap_owner(&mut self, owner: u32, now_ms: u64) -> Result<u64, FairError> {
        self.with_view(|v| admission::reap_owner(v, owner, now_ms))
    }

    /// Like [`reap_owner`](Self::reap_owner), at `max(at, last accepted
    /// now)`: reaping never moves the ledger's time backwards or fails
    /// because another process's call got in first.
    pub(crate) fn reap_owner_latest(&mut self, owner: u32, at: u64) -> Result<u64, FairError> {
        self.with_view_at(Some(at), |v, at| {
            let now = at.max(v.meta()?.last_now_ms).max(v.p.started_at_ms);
            admission::reap_owner(v, owner, now).map(|n| (n, true))
        })
    }

    /// Releases `lease_id` at `at` (`None`: the clock, read under the lock).
    pub(crate) fn release_at(&mut self, lease_id: &str, at: Option<u64>) -> Result<(), FairError> {
        self.with_view_at(at, |v, now| {
            admission::release(v, lease_id, now).map(|r| (r, true))
        })
    }

    /// Stats at `at` (`None`: the clock, read under the lock).
    pub(crate) fn stats_at(&mut self, at: Option<u64>) -> Result<Stats, FairError> {
        self.with_view_at(at, |v, now| admission::stats(v, now).map(|r| (r, true)))
    }

    /// Plan at `at` (`None`: the clock, read under the lock).
    pub(crate) fn plan_at(&mut self, at: Option<u64>) -> Result<Plan, FairError> {
        self.with_view_at(at, |v, now| admission::plan(v, now).map(|r| (r, true)))
    }

    /// Report at `at` (`None`: the clock, read under the lock).
    pub(crate) fn report_at(&mut self, at: Option<u64>) -> Result<FairnessReport, FairError> {
        self.with_view_at(at, |v, now| admission::report(v, now).map(|r| (r, true)))
    }

    /// Tenant records and lease slots of this ledger.
    pub(crate) fn capacities(&self) -> (usize, usize) {
        (self.n, self.cap)
    }

    /// The immutable parameters read from the header at create/attach.
    pub(crate) fn params(&self) -> Params {
        self.params
    }

    /// See [`FairLedger::stats`].
    pub fn stats(&mut self, now_ms: u64) -> Result<Stats, FairError> {
        self.with_view(|v| admission::stats(v, now_ms))
    }

    /// See [`FairLedger::plan`].
    pub fn plan(&mut self, now_ms: u64) -> Result<Plan, FairError> {
        self.with_view(|v| admission::plan(v, now_ms))
    }

    /// See [`FairLedger::fairness_report`].
    pub fn fairness_report(&mut self, now_ms: u64) -> Result<FairnessReport, FairError> {
        self.with_view(|v| admission::report(v, now_ms))
    }
}

/// Unlocks on every exit path of `with_view` (errors included), writing
/// back what glibc will read on unlock first.
struct Unlock<'a>(&'a RobustMutex, Held);

impl Drop for Unlock<'_> {
    fn drop(&mut self) {
        // An unlock error here means we no longer hold the lock (the lock
        // word was scribbled while we held it); the next caller finds the
        // mutex corrupt and repairs it. There is nothing better to do here.
        let _ = self.0.unlock_held(&self.1);
    }
}

impl FairLedger for SharedLedger {
    fn acquire(&mut self, tenant: &str, cost: f64, hold_ms: u64, now_ms: u64) -> AcquireResult {
        SharedLedger::acquire(self, tenant, cost, hold_ms, now_ms)
    }
    fn release(&mut self, lease_id: &str, now_ms: u64) -> Result<(), FairError> {
        SharedLedger::release(self, lease_id, now_ms)
    }
    fn stats(&mut self, now_ms: u64) -> Result<Stats, FairError> {
        SharedLedger::stats(self, now_ms)
    }
    fn plan(&mut self, now_ms: u64) -> Result<Plan, FairError> {
        SharedLedger::plan(self, now_ms)
    }
    fn fairness_report(&mut self, now_ms: u64) -> Result<FairnessReport, FairError> {
        SharedLedger::fairness_report(self, now_ms)
    }
}
