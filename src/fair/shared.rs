//! The shared-memory home of the ledger: the same records and the same
//! algorithms as [`FairShare`](super::FairShare), kept crash-consistent in
//! memory mapped by many processes, and readable without its lock.
//!
//! # Layout
//!
//! ```text
//! [ SharedHeader | undo journal | MetaRec | TenantRec × n | LeaseRec × cap | buckets | live list ]
//! ```
//!
//! The header holds a magic number, the layout version, the robust mutex's
//! layout tag ([`MUTEX_LAYOUT_TAG`]), the total size, the immutable
//! parameters (`Params`), the sequence word `seq`, the journal's entry count
//! `used`, counters and the mutex. The state after the journal is one copy
//! of the five parts described in `store.rs`. Everything is `#[repr(C)]`
//! plain integers and floats at fixed offsets; no pointers.
//!
//! # Commit protocol (crash consistency, rule 8)
//!
//! The ledger is updated in place under a process-shared robust mutex, with
//! an undo journal: before a call writes a record (or one link word) it
//! saves the bytes it overwrites in the next journal entry and counts the
//! entry (`used`, release ordering); only then does it write. Committing is
//! one store: `used = 0`. So a call touches the few records it changes (an
//! acquire or a release writes about six), whatever the number of leases,
//! instead of copying the ledger:
//!
//! 1. lock the robust mutex, waiting at most [`LEDGER_LOCK_WAIT`] for a
//!    live holder (see [`RobustMutex::lock_bounded`]). `OwnerDied` (the
//!    previous holder died somewhere below) is counted as a recovery and the
//!    mutex marked consistent; a *corrupt* mutex (a lock word no live
//!    thread can release, a scribbled type word, a not-recoverable state) is
//!    re-initialised, in a region, under the region's repair lock
//!    ([`REPAIR_LOCK`]); without a region (raw memory) it is an error;
//! 2. if `used` is not 0, an update was cut short (its process died, or a
//!    scribble): undo it, entry by entry from the last, restoring the saved
//!    bytes (the last committed state), then set `used = 0` and make `seq`
//!    even. Undoing twice restores the same bytes, so a death during the
//!    undo is undone by the next locker;
//! 3. run the ledger operation on a validated view of the state; the first
//!    write makes `seq` odd (readers, below, then know an update is under
//!    way), every write is journaled first;
//! 4. on success, commit: `used = 0` (the commit point), then `seq` even;
//!    on a misuse error or a corrupt record, undo what was written (as in
//!    2), so the call changes nothing. A call that wrote nothing (a misuse
//!    error found before any write) leaves `seq` alone;
//! 5. write back the mutex's type word and list pointers as they were at
//!    lock time (glibc writes through the list pointers on unlock, and the
//!    region is writable by others), and unlock.
//!
//! A process killed at any point before the commit store leaves every byte
//! it wrote covered by a counted entry (an entry is complete before it
//! counts, and counts before the write), so step 2 restores the last
//! committed state; killed after it, its update is complete. Reaping a dead
//! process's leases commits after each lease, so the journal needs room for
//! one lease's release at most (32 entries).
//!
//! # Reading without the lock
//!
//! `seq` is also a seqlock: a reader (`read_snapshot`, behind
//! [`RegionView::fair_share`](crate::region::RegionView::fair_share))
//! copies the state it needs
//! (meta, tenants, live list, the live leases' headers) between two reads of
//! `seq`; equal and even, the copy is a committed state. When `seq` is odd
//! an update is under way, perhaps by a process that is stopped (SIGSTOP, a
//! debugger) holding the lock: the reader then also copies the counted
//! journal entries and applies them to its copy, which gives the last
//! committed state, provided `seq` and `used` did not move while it copied
//! (every byte the writer changed is covered by a counted entry). So an
//! inspector takes no lock, writes nothing, and is not held up by a stopped
//! application. Under heavy churn it retries; if the state keeps changing
//! for its whole time budget it reads the tenants consistently and the
//! overrun leases lease by lease.
//!
//! The region layer (process table, liveness, reaping) is bound on top of
//! this type by [`SharedFairShare`](super::SharedFairShare): each lease
//! records the owner id of the process that took it, and
//! [`SharedLedger::reap_owner`] releases a dead owner's leases, counted in
//! `reaped_leases`. This raw type works on any caller-provided memory
//! (tests use an anonymous `MAP_SHARED` mapping).
//!
//! # Time
//!
//! The view is built with `clamp_time` (see `admission.rs`): a `now`
//! earlier than the last accepted one is taken as the last accepted one,
//! so processes racing for the lock never fail with `TimeWentBackwards`.
//! Calls with `now` = `None` inside the crate (the `*_now` calls of
//! [`SharedFairShare`](super::SharedFairShare)) read `CLOCK_MONOTONIC` after
//! taking the lock.

use std::mem::{align_of, size_of};
use std::ptr::{self, NonNull};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::admission;
use super::store::{
    bucket_count, check_meta, Journal, JournalEntry, LeaseRec, MetaRec, Params, Parts, TenantRec,
    View, WriteFault, FLAG_REFUSAL_NOT_ACTIVITY, JOURNAL_ENTRIES, MAX_RECORD_BYTES,
};
use super::{
    initial_state, AcquireResult, FairConfig, FairError, FairLedger, FairnessReport, Lease, Plan,
    Stats,
};
use crate::region::Mapping;
use crate::sys::clock::monotonic_ms;
use crate::sys::robust_mutex::{
    lock_error_of, Bounded, Held, LockState, LockWait, RobustMutex, MUTEX_LAYOUT_TAG,
};

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

/// Layout version of [`SharedLedger`] memory (2: one copy, updated in place
/// under an undo journal, with hash buckets and a live list).
pub const SHARED_LAYOUT_VERSION: u32 = 2;

/// Most tenants a shared ledger accepts (bounds the size arithmetic).
pub const MAX_SHARED_TENANTS: usize = 4096;

/// Most lease slots a shared ledger accepts (the same bound as in-process,
/// [`MAX_LEASE_CAPACITY`](super::MAX_LEASE_CAPACITY)).
pub const MAX_SHARED_LEASES: usize = super::MAX_LEASE_CAPACITY;

/// How long a lock-free read of the ledger (see the module docs) keeps
/// trying for a consistent copy.
pub const SNAPSHOT_BUDGET: Duration = Duration::from_millis(200);

/// The fixed header at the start of a shared ledger.
///
/// `magic`…`params` are written once by the creator before any other
/// process can see the memory and are read-only afterwards. `seq`, `used`
/// and the counters are written only by the lock holder.
#[repr(C)]
struct SharedHeader {
    magic: u64,
    version: u32,
    _pad: u32,
    mutex_layout_tag: u64,
    total_size: u64,
    params: Params,
    /// Even: the state is committed. Odd: an update is under way (or was
    /// cut short). Advanced by two per committed update.
    seq: AtomicU64,
    /// Undo-journal entries in use (0: nothing to undo).
    used: AtomicU64,
    /// Times a holder died mid-call and the next caller recovered.
    recoveries: AtomicU64,
    mutex: RobustMutex,
    /// Times a corrupt mutex was re-initialised.
    repairs: AtomicU64,
}

// The offsets region tests scribble at; the header's rounded size.
const _: () = assert!(std::mem::offset_of!(SharedHeader, seq) == 88);
const _: () = assert!(std::mem::offset_of!(SharedHeader, used) == 96);
const _: () = assert!(std::mem::offset_of!(SharedHeader, mutex) == 112);
const _: () = assert!(size_of::<SharedHeader>() <= 192);

fn round_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

/// Byte offsets of the parts of a ledger of `n` tenants and `cap` slots.
#[derive(Debug, Clone, Copy)]
struct Offsets {
    journal: usize,
    meta: usize,
    tenants: usize,
    leases: usize,
    buckets: usize,
    live: usize,
    total: usize,
}

fn offsets(n: usize, cap: usize) -> Offsets {
    let journal = round_up(size_of::<SharedHeader>(), 64);
    let meta = journal + JOURNAL_ENTRIES * size_of::<JournalEntry>();
    let tenants = meta + size_of::<MetaRec>();
    let leases = tenants + n * size_of::<TenantRec>();
    let buckets = leases + cap * size_of::<LeaseRec>();
    let live = buckets + bucket_count(cap) * 4;
    let total = round_up(live + cap * 4, 8);
    Offsets {
        journal,
        meta,
        tenants,
        leases,
        buckets,
        live,
        total,
    }
}

const _: () = assert!(size_of::<JournalEntry>() % 8 == 0);

/// Where an update may be made to die (or a test hook run), for crash and
/// stop tests.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CrashPoint {
    /// Right after taking the lock, before any repair.
    AfterLock,
    /// In the middle of the update's first write: the entry is journaled
    /// and half of the record written (a torn record).
    MidWrite,
    /// Just before the update's journal save number `k` (0-based): `k`
    /// entries saved and their writes complete, the rest not begun (as a
    /// crash point only; `test_hook_at` ignores it).
    BeforeSave(usize),
    /// After the update wrote everything, before the commit store.
    BeforeCommit,
    /// After the commit store, before `seq` is even again.
    AfterCommit,
    /// After the commit, before unlocking.
    BeforeUnlock,
    /// Undoing a cut-short update (the next locker's repair): after the
    /// last entry was restored, before the others.
    MidUndo,
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
    at: Offsets,
    /// `bucket_count(cap)`, computed once.
    nbuckets: usize,
    owner: u32,
    /// The parameters views are built with: `params`, with the flags of
    /// [`set_refusal_counts_as_activity`](Self::set_refusal_counts_as_activity)
    /// if a test set them.
    view_params: Params,
    crash: Option<(u64, CrashPoint)>,
    hook: Option<(CrashPoint, fn())>,
    /// Whether `crash` or `hook` is set: one test per seam on every call.
    armed: bool,
    ops: u64,
    /// Sorts the overrun leases of `stats` (kept: no allocation).
    scratch: Vec<(u64, u32)>,
    /// The last call's `now` as taken, and its place in the ledger's order
    /// (see [`SharedLedger::last_taken`]).
    taken: (u64, u64),
    /// The region the ledger lives in, if any: for the maps check of a lock
    /// holder and the repair lock.
    region: Option<Arc<Mapping>>,
    /// Test seam: runs while the lock is held.
    while_locked: Option<fn()>,
}

// SAFETY: the handle only refers to shared memory whose mutable parts are
// accessed under the process-shared mutex or through atomics.
unsafe impl Send for SharedLedger {}

/// Validated header fields of a ledger in memory.
struct HeaderFields {
    params: Params,
    n: usize,
    cap: usize,
}

/// Reads and validates the header at `mem` (reads only).
///
/// # Safety
///
/// `mem` must be valid for reads of `len` bytes and aligned for the header.
unsafe fn read_header(mem: *const u8, len: usize) -> Result<HeaderFields, FairError> {
    if len < round_up(size_of::<SharedHeader>(), 64) {
        return Err(FairError::InvalidConfig(format!(
            "memory of {len} bytes is smaller than the ledger's header"
        )));
    }
    let h = mem as *const SharedHeader;
    let bad = |m: String| Err(FairError::Corrupt(m));
    // SAFETY: the header lies within `len` bytes (checked); its fields are
    // plain integers for which every bit pattern is valid; the magic is read
    // atomically (it is published last by the creator).
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
    let need = SharedLedger::size_for(n, cap).map_err(|e| FairError::Corrupt(e.to_string()))?;
    if total != need as u64 || len < need {
        return bad(format!(
            "size {total} recorded, {need} computed, {len} mapped"
        ));
    }
    Ok(HeaderFields { params, n, cap })
}

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
        Ok(offsets(n, cap).total)
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

    fn handle(base: NonNull<u8>, params: Params, n: usize, cap: usize) -> SharedLedger {
        SharedLedger {
            base,
            n,
            cap,
            params,
            at: offsets(n, cap),
            nbuckets: bucket_count(cap),
            owner: 0,
            view_params: params,
            crash: None,
            hook: None,
            armed: false,
            ops: 0,
            scratch: Vec::new(),
            taken: (0, 0),
            region: None,
            while_locked: None,
        }
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
        let at = offsets(tenants.len(), lease_capacity);
        let h = mem as *mut SharedHeader;
        // SAFETY: `mem` is valid, aligned and exclusively ours (caller
        // contract); zeroing gives every record, bucket and link its empty
        // state; the meta and tenant offsets are 8-aligned (record sizes
        // are multiples of 8, the header is padded to 64).
        unsafe {
            ptr::write_bytes(mem, 0, need);
            ptr::write(mem.add(at.meta) as *mut MetaRec, meta);
            ptr::copy_nonoverlapping(
                tenants.as_ptr(),
                mem.add(at.tenants) as *mut TenantRec,
                tenants.len(),
            );
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
        Ok(Self::handle(base, params, tenants.len(), lease_capacity))
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
        let base = Self::check_mem(mem, len, round_up(size_of::<SharedHeader>(), 64))?;
        // SAFETY: valid for reads of `len` bytes (caller contract), aligned
        // (checked).
        let f = unsafe { read_header(mem, len) }?;
        Ok(Self::handle(base, f.params, f.n, f.cap))
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

    /// Test seam: `f` runs at `point` of every call through this handle
    /// (at [`CrashPoint::MidWrite`], with a torn record in place; the write
    /// is finished when `f` returns). Never use it outside tests.
    #[doc(hidden)]
    pub fn test_hook_at(&mut self, point: CrashPoint, f: Option<fn()>) {
        self.hook = f.map(|f| (point, f));
        self.armed = self.crash.is_some() || self.hook.is_some();
    }

    /// Times a corrupt ledger mutex was re-initialised.
    pub fn repairs(&self) -> u64 {
        self.header().repairs.load(Ordering::Relaxed)
    }

    /// Committed updates since creation (half the sequence word).
    pub fn commits(&self) -> u64 {
        self.header().seq.load(Ordering::Relaxed) / 2
    }

    /// Sets the owner id (from the region's process table) recorded in
    /// leases this handle takes.
    pub fn set_owner(&mut self, owner: u32) {
        self.owner = owner;
    }

    /// The last call's `now` as the ledger took it (a `now` earlier than
    /// the last accepted one is taken as that one), and its place in the
    /// ledger's order: `2c` for the call that made commit `c`, `2c + 1` for
    /// a call that changed nothing after commit `c`. Sorting calls of
    /// several handles by it orders them as the ledger ran them.
    pub fn last_taken(&self) -> (u64, u64) {
        self.taken
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
        self.view_params.flags = if yes {
            f
        } else {
            f | FLAG_REFUSAL_NOT_ACTIVITY
        };
    }

    /// Crash test hook: the `nth` call (0-based) made through this handle
    /// aborts the process at `point`.
    #[doc(hidden)]
    pub fn crash_at(&mut self, nth: u64, point: CrashPoint) {
        self.crash = Some((nth, point));
        self.armed = true;
    }

    fn header(&self) -> &SharedHeader {
        // SAFETY: `base` points at a header validated at create/attach and
        // kept mapped by the caller's contract; shared parts are atomics or
        // the mutex, and the rest is read-only after creation.
        unsafe { &*(self.base.as_ptr() as *const SharedHeader) }
    }

    /// Runs the test seams of `point` for call `nth` (none are armed
    /// outside tests: one test of the `armed` flag).
    #[inline(always)]
    fn point(&self, nth: u64, at: CrashPoint) {
        if !self.armed {
            return;
        }
        self.point_armed(nth, at);
    }

    #[cold]
    fn point_armed(&self, nth: u64, at: CrashPoint) {
        if self.crash == Some((nth, at)) {
            std::process::abort();
        }
        if let Some((p, f)) = self.hook {
            if p == at {
                f();
            }
        }
    }

    /// The first write's fault for call `nth`, if a test asked for one.
    #[inline(always)]
    fn write_fault(&self, nth: u64) -> Option<WriteFault> {
        if !self.armed {
            return None;
        }
        match self.crash {
            Some((n, CrashPoint::MidWrite)) if n == nth => return Some(WriteFault::Abort),
            Some((n, CrashPoint::BeforeSave(k))) if n == nth => {
                return Some(WriteFault::AbortBeforeSave(k))
            }
            _ => {}
        }
        match self.hook {
            Some((CrashPoint::MidWrite, f)) => Some(WriteFault::Call(f)),
            _ => None,
        }
    }

    /// Takes the ledger's lock (bounded), repairing a corrupt mutex when the
    /// ledger lives in a region (see the module docs).
    /// The [`Held`] record goes to `held` (a small answer: the lock's
    /// state, moved through no `Result` of a record).
    #[inline(always)]
    fn lock(&self, held: &mut Held) -> Result<LockState, FairError> {
        // Uncontended: one attempt, nothing built.
        match self.header().mutex.try_lock_into(held) {
            Ok(state) => Ok(state),
            Err(0) => self.lock_slow(held),
            Err(rc) => Err(lock_failed(lock_error_of(rc))),
        }
    }

    /// [`lock`](Self::lock) when one attempt did not take the lock: the
    /// bounded wait, and the repair of a corrupt mutex.
    #[cold]
    #[inline(never)]
    fn lock_slow(&self, held: &mut Held) -> Result<LockState, FairError> {
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
                Ok(Bounded::Locked(state, h)) => {
                    *held = h;
                    return Ok(state);
                }
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

    /// A view of the state that journals every write (see the module docs).
    ///
    /// # Safety
    ///
    /// The caller holds the ledger's lock (no other well-behaved process
    /// writes the state meanwhile) and uses the view before unlocking.
    #[inline(always)]
    unsafe fn view(&self, nth: u64) -> View<'_> {
        let base = self.base.as_ptr();
        let at = self.at;
        let h = self.header();
        // SAFETY: every part lies inside the validated size (`offsets`), is
        // aligned for its type (8-byte records after a 64-byte header, u32
        // arrays after them), and the parts do not overlap; records are
        // plain data (any bit pattern valid, checked on read by the view);
        // under the lock no well-behaved process writes them concurrently
        // (lock-free readers only read).
        let (parts, entries) = unsafe {
            (
                Parts {
                    meta: &mut *(base.add(at.meta) as *mut MetaRec),
                    tenants: std::slice::from_raw_parts_mut(
                        base.add(at.tenants) as *mut TenantRec,
                        self.n,
                    ),
                    leases: std::slice::from_raw_parts_mut(
                        base.add(at.leases) as *mut LeaseRec,
                        self.cap,
                    ),
                    buckets: std::slice::from_raw_parts_mut(
                        base.add(at.buckets) as *mut u32,
                        self.nbuckets,
                    ),
                    live: std::slice::from_raw_parts_mut(base.add(at.live) as *mut u32, self.cap),
                },
                std::slice::from_raw_parts_mut(
                    base.add(at.journal) as *mut JournalEntry,
                    JOURNAL_ENTRIES,
                ),
            )
        };
        // The parts' lengths are the validated parameters' (`handle`), so
        // they are not checked again here; a journaled view clamps time.
        View::from_parts(
            &self.view_params,
            parts,
            Some(Journal {
                base,
                entries,
                used: &h.used,
                seq: &h.seq,
                opened: false,
                count: 0,
                fault: self.write_fault(nth),
            }),
        )
    }

    /// Undoes the counted journal entries, last first, empties the journal
    /// and makes `seq` even: the state is the last committed one again.
    ///
    /// # Safety
    ///
    /// The caller holds the ledger's lock.
    #[inline(always)]
    unsafe fn undo(&self, nth: u64) -> Result<(), FairError> {
        let h = self.header();
        if h.used.load(Ordering::Acquire) == 0 {
            // Nothing to undo, the case of every call after a committed
            // one: only `seq` may be left odd (by an update that changed
            // nothing, or died between its commit store and this).
            let s = h.seq.load(Ordering::Relaxed);
            if s & 1 == 1 {
                h.seq.store(s.wrapping_add(1), Ordering::Release);
            }
            return Ok(());
        }
        // SAFETY: the caller's contract.
        unsafe { self.undo_entries(nth) }
    }

    /// [`undo`](Self::undo) when the journal counts entries.
    ///
    /// # Safety
    ///
    /// The caller holds the ledger's lock.
    #[inline(never)]
    unsafe fn undo_entries(&self, nth: u64) -> Result<(), FairError> {
        let h = self.header();
        let used = h.used.load(Ordering::Acquire);
        if used > JOURNAL_ENTRIES as u64 {
            return Err(FairError::Corrupt(format!(
                "the undo journal counts {used} entries, more than its {JOURNAL_ENTRIES}"
            )));
        }
        let base = self.base.as_ptr();
        for k in (0..used as usize).rev() {
            // SAFETY: entry `k` lies inside the journal area (k < JOURNAL_ENTRIES);
            // entries are plain data; we hold the lock.
            let e = unsafe {
                ptr::read(base.add(self.at.journal + k * size_of::<JournalEntry>())
                    as *const JournalEntry)
            };
            let (off, len) = (e.off as usize, e.len as usize);
            if len > MAX_RECORD_BYTES || off < self.at.meta || off + len > self.at.total {
                return Err(FairError::Corrupt(format!(
                    "undo journal entry {k}: {len} bytes at ledger offset {off} lie outside the \
                     state ({}..{})",
                    self.at.meta, self.at.total
                )));
            }
            // SAFETY: [off, off + len) lies inside the state (checked), the
            // entry's bytes are a separate copy; we hold the lock.
            unsafe { ptr::copy_nonoverlapping(e.bytes.as_ptr(), base.add(off), len) };
            if k + 1 == used as usize {
                self.point(nth, CrashPoint::MidUndo);
            }
        }
        fence(Ordering::Release);
        h.used.store(0, Ordering::Release);
        let s = h.seq.load(Ordering::Relaxed);
        if s & 1 == 1 {
            h.seq.store(s.wrapping_add(1), Ordering::Release);
        }
        Ok(())
    }

    /// Runs `f` on the state under the lock and commits it if `f` says so
    /// (see the module docs). `at` is the caller's `now`, or `None` to read
    /// `CLOCK_MONOTONIC` *after* taking the lock; `f` gets the `now` and
    /// returns its answer and whether to commit.
    fn with_view_at<R>(
        &mut self,
        at: Option<u64>,
        f: impl FnOnce(&mut View<'_>, u64) -> Result<(R, bool), FairError>,
    ) -> Result<R, FairError> {
        let nth = self.ops;
        self.ops += 1;
        let mut held = Held::NONE;
        let state = self.lock(&mut held)?;
        // SAFETY: as in `header`; a reference of its own (not a borrow of
        // `self`), valid while the caller keeps the memory mapped, which
        // outlasts this call.
        let h = unsafe { &*(self.base.as_ptr() as *const SharedHeader) };
        let _guard = Unlock(&h.mutex, held);
        if let Some(f) = self.while_locked {
            f();
        }
        if state == LockState::OwnerDied {
            // The journal holds whatever the dead holder had not committed;
            // it is undone below.
            h.recoveries.fetch_add(1, Ordering::Relaxed);
            h.mutex
                .consistent()
                .map_err(|e| FairError::Lock(e.to_string()))?;
        }
        self.point(nth, CrashPoint::AfterLock);
        // SAFETY: we hold the lock.
        unsafe { self.undo(nth) }?;
        let now = at.unwrap_or_else(monotonic_ms);
        let (r, opened) = {
            // SAFETY: we hold the lock until `_guard` drops, after the view.
            let mut view = unsafe { self.view(nth) };
            let r = f(&mut view, now);
            (r, view.journal().is_some_and(|j| j.opened))
        };
        // The instant the call was taken at: the view clamps `now` to the
        // last accepted one, which an accepted call then leaves at the
        // instant it took (and a refused one, undone, leaves as it was).
        // SAFETY: the meta record lies inside the validated size; we hold
        // the lock; a `u64` read of plain data.
        let last = unsafe { ptr::read(self.base.as_ptr().add(self.at.meta) as *const MetaRec) }
            .last_now_ms;
        let now = now.max(last).max(self.params.started_at_ms);
        let done = h.seq.load(Ordering::Relaxed) / 2;
        let wrote = matches!(r, Ok((_, true))) && opened;
        // (The sequence word is region contents: wrapping arithmetic, so a
        // scribbled word gives a wrong order, never a panic.)
        self.taken = (
            now,
            if wrote {
                done.wrapping_add(1).wrapping_mul(2)
            } else {
                done.wrapping_mul(2) | 1
            },
        );
        match r {
            Ok((r, true)) => {
                if opened {
                    self.point(nth, CrashPoint::BeforeCommit);
                    // The commit point: nothing is left to undo.
                    fence(Ordering::Release);
                    h.used.store(0, Ordering::Release);
                    self.point(nth, CrashPoint::AfterCommit);
                    let s = h.seq.load(Ordering::Relaxed);
                    h.seq.store((s | 1).wrapping_add(1), Ordering::Release);
                }
                self.point(nth, CrashPoint::BeforeUnlock);
                Ok(r)
            }
            Ok((r, false)) => {
                // SAFETY: we hold the lock.
                unsafe { self.undo(nth) }?;
                Ok(r)
            }
            Err(e) => {
                // SAFETY: we hold the lock. An undo that fails leaves the
                // journal for the next locker; the caller sees its own error.
                let _ = unsafe { self.undo(nth) };
                Err(e)
            }
        }
    }

    /// See [`FairLedger::acquire`].
    pub fn acquire(&mut self, tenant: &str, cost: f64, hold_ms: u64, now_ms: u64) -> AcquireResult {
        let owner = self.owner;
        let mut out = std::mem::MaybeUninit::uninit();
        self.acquire_as(
            owner,
            tenant,
            cost,
            hold_ms,
            Some(now_ms),
            &mut || false,
            &mut out,
        )?
        .into_result(&out)
    }

    /// Acquire on behalf of `owner` at `at` (`None`: the clock, read under
    /// the lock); a grant is written to `out`. When the answer would be a
    /// refusal or a full table and `defer()` (asked under the lock) says
    /// so, nothing is written and the answer is `Deferred`, so the caller
    /// can reap dead processes and ask again without recording a refusal
    /// twice.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn acquire_as(
        &mut self,
        owner: u32,
        tenant: &str,
        cost: f64,
        hold_ms: u64,
        at: Option<u64>,
        defer: &mut dyn FnMut() -> bool,
        out: &mut std::mem::MaybeUninit<Lease>,
    ) -> Result<admission::Answer, FairError> {
        self.with_view_at(at, |v, now| {
            admission::acquire(v, owner, tenant, cost, hold_ms, now, defer, out).map(|r| (r, true))
        })
    }

    /// See [`FairLedger::release`].
    pub fn release(&mut self, lease_id: &str, now_ms: u64) -> Result<(), FairError> {
        self.release_at(lease_id, Some(now_ms))
    }

    /// Releases `lease_id` at `at` (`None`: the clock, read under the lock).
    #[inline]
    pub(crate) fn release_at(&mut self, lease_id: &str, at: Option<u64>) -> Result<(), FairError> {
        self.with_view_at(at, |v, now| {
            admission::release(v, lease_id, now).map(|r| (r, true))
        })
    }

    /// Releases every lease taken under `owner` (a process found dead) at
    /// `now_ms` (or the last accepted `now`, if later: reaping never moves
    /// the ledger's time backwards); returns how many. Each release is
    /// committed on its own. Counted per tenant in `reaped_leases`; not
    /// activity.
    pub fn reap_owner(&mut self, owner: u32, now_ms: u64) -> Result<u64, FairError> {
        self.with_view_at(Some(now_ms), |v, now| {
            let mut commit = |v: &mut View<'_>| {
                if let Some(j) = v.journal() {
                    j.commit();
                }
                Ok(())
            };
            admission::reap_owner(v, owner, now, &mut commit).map(|n| (n, true))
        })
    }

    /// Whether any live lease is recorded under `owner`, read without the
    /// lock (a consistent snapshot).
    pub(crate) fn owner_holds(&self, owner: u32) -> Result<bool, FairError> {
        // SAFETY: the handle's memory is valid for its validated size.
        let snap = unsafe { read_snapshot(self.base.as_ptr(), self.at.total, SNAPSHOT_BUDGET) }?;
        Ok(snap.leases.iter().any(|l| l.owner == owner))
    }

    /// Stats at `at` (`None`: the clock, read under the lock) into `out`.
    pub(crate) fn stats_into_at(
        &mut self,
        at: Option<u64>,
        out: &mut Stats,
    ) -> Result<(), FairError> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let r = self.with_view_at(at, |v, now| {
            admission::stats_into(v, now, out, &mut scratch).map(|r| (r, true))
        });
        self.scratch = scratch;
        r
    }

    /// Stats at `at` (`None`: the clock, read under the lock).
    pub(crate) fn stats_at(&mut self, at: Option<u64>) -> Result<Stats, FairError> {
        let mut out = Stats::default();
        self.stats_into_at(at, &mut out)?;
        Ok(out)
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
        self.stats_at(Some(now_ms))
    }

    /// [`stats`](Self::stats) into `out`, reusing its vectors (see
    /// [`FairShare::stats_into`](super::FairShare::stats_into)).
    pub fn stats_into(&mut self, now_ms: u64, out: &mut Stats) -> Result<(), FairError> {
        self.stats_into_at(Some(now_ms), out)
    }

    /// See [`FairLedger::plan`].
    pub fn plan(&mut self, now_ms: u64) -> Result<Plan, FairError> {
        self.plan_at(Some(now_ms))
    }

    /// See [`FairLedger::fairness_report`].
    pub fn fairness_report(&mut self, now_ms: u64) -> Result<FairnessReport, FairError> {
        self.report_at(Some(now_ms))
    }
}

/// The ledger's error for a lock call that failed.
#[cold]
fn lock_failed(e: crate::error::Error) -> FairError {
    FairError::Lock(e.to_string())
}

/// Unlocks on every exit path of `with_view_at` (errors included), writing
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

/// Bytes of a lease record a snapshot copies: every field up to and
/// including `deadline_ms` (not the slices).
const HEAD_BYTES: usize = std::mem::offset_of!(LeaseRec, deadline_ms) + 8;

/// A live lease as a snapshot holds it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LeaseHead {
    /// Its slot.
    pub slot: u32,
    /// Holder tenant index.
    pub tenant: u32,
    /// Owner id of the process that took it.
    pub owner: u32,
    /// Per-tenant lease number.
    pub no: u64,
    /// Creation order.
    pub seq: u64,
    /// Declared deadline.
    pub deadline_ms: u64,
}

/// A committed state of a shared ledger, copied without its lock.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    /// The immutable parameters.
    pub params: Params,
    /// The meta record.
    pub meta: MetaRec,
    /// The tenant records (validated).
    pub tenants: Vec<TenantRec>,
    /// The live leases.
    pub leases: Vec<LeaseHead>,
    /// False when the ledger kept changing for the whole budget: then meta
    /// and tenants are one committed state and the leases were read one at
    /// a time (each was live at the instant it was read).
    pub leases_consistent: bool,
    /// Committed updates since creation.
    pub commits: u64,
}

/// Copies `dst.len()` bytes (a multiple of 4) from `src` (4-aligned) with
/// atomic loads: the memory may be written by other processes meanwhile.
///
/// # Safety
///
/// `src` must be valid for reads of `dst.len()` bytes.
unsafe fn load_bytes(src: *const u8, dst: &mut [u8]) {
    let mut i = 0;
    while i + 8 <= dst.len() && (src as usize + i) % 8 == 0 {
        // SAFETY: in bounds (caller contract), 8-aligned (checked); an
        // atomic load only reads, which a read-only mapping allows.
        let w = unsafe { (*(src.add(i) as *const AtomicU64)).load(Ordering::Relaxed) };
        dst[i..i + 8].copy_from_slice(&w.to_ne_bytes());
        i += 8;
    }
    while i + 4 <= dst.len() {
        // SAFETY: as above, 4-aligned (the start is, and i is a multiple of 4).
        let w = unsafe { (*(src.add(i) as *const AtomicU32)).load(Ordering::Relaxed) };
        dst[i..i + 4].copy_from_slice(&w.to_ne_bytes());
        i += 4;
    }
}

/// One lock-free copy attempt's bookkeeping: the sequence and journal
/// count seen at the start, and the counted journal entries.
struct Copier<'a> {
    base: *const u8,
    at: Offsets,
    seq: &'a AtomicU64,
    used: &'a AtomicU64,
    entries: Vec<(u32, u32, [u8; MAX_RECORD_BYTES])>,
    s1: u64,
    c1: u64,
}

impl Copier<'_> {
    /// Starts an attempt.
    fn begin(&mut self) -> Result<(), FairError> {
        self.s1 = self.seq.load(Ordering::Acquire);
        self.c1 = if self.s1 & 1 == 1 {
            self.used.load(Ordering::Acquire)
        } else {
            0
        };
        self.entries.clear();
        if self.c1 > JOURNAL_ENTRIES as u64 {
            return Err(FairError::Corrupt(format!(
                "the undo journal counts {} entries, more than its {JOURNAL_ENTRIES}",
                self.c1
            )));
        }
        let mut e = vec![0u8; size_of::<JournalEntry>()];
        for k in 0..self.c1 as usize {
            // SAFETY: entry k lies inside the journal area of the validated
            // ledger memory.
            unsafe {
                load_bytes(
                    self.base
                        .add(self.at.journal + k * size_of::<JournalEntry>()),
                    &mut e,
                )
            };
            let off = u32::from_ne_bytes([e[0], e[1], e[2], e[3]]);
            let len = u32::from_ne_bytes([e[4], e[5], e[6], e[7]]);
            let mut bytes = [0u8; MAX_RECORD_BYTES];
            bytes.copy_from_slice(&e[8..8 + MAX_RECORD_BYTES]);
            self.entries.push((off, len, bytes));
        }
        Ok(())
    }

    /// Copies `dst.len()` bytes at ledger offset `off` into `dst`, then
    /// applies the counted journal entries to the copy (last first, so the
    /// oldest saved bytes win): the committed bytes, if the attempt ends
    /// consistent.
    fn copy(&self, off: usize, dst: &mut [u8]) {
        if off + dst.len() > self.at.total {
            return;
        }
        // SAFETY: in bounds of the validated ledger memory (checked).
        unsafe { load_bytes(self.base.add(off), dst) };
        for (eoff, elen, bytes) in self.entries.iter().rev() {
            let (eoff, elen) = (*eoff as usize, (*elen as usize).min(MAX_RECORD_BYTES));
            let lo = eoff.max(off);
            let hi = (eoff + elen).min(off + dst.len());
            if lo < hi {
                dst[lo - off..hi - off].copy_from_slice(&bytes[lo - eoff..hi - eoff]);
            }
        }
    }

    /// Whether nothing moved since [`begin`](Self::begin).
    fn consistent(&self) -> bool {
        fence(Ordering::Acquire);
        let s2 = self.seq.load(Ordering::Relaxed);
        let c2 = if self.s1 & 1 == 1 {
            self.used.load(Ordering::Relaxed)
        } else {
            0
        };
        s2 == self.s1 && c2 == self.c1
    }
}

/// A plain-data record from its bytes.
fn record<T: Copy + Default>(b: &[u8]) -> T {
    let mut x = T::default();
    let n = b.len().min(size_of::<T>());
    // SAFETY: `x` is a valid `T` of plain data (every bit pattern of its
    // integer and float fields is valid); we overwrite at most its size.
    unsafe { ptr::copy_nonoverlapping(b.as_ptr(), &mut x as *mut T as *mut u8, n) };
    x
}

fn head_of(slot: u32, b: &[u8]) -> LeaseRec {
    let _ = slot;
    record::<LeaseRec>(&b[..HEAD_BYTES])
}

/// Reads a committed state of the ledger at `mem` without its lock and
/// without writing a byte (see the module docs), trying for at most
/// `budget`.
///
/// # Safety
///
/// `mem` must be valid for reads of `len` bytes and 8-aligned.
pub(crate) unsafe fn read_snapshot(
    mem: *const u8,
    len: usize,
    budget: Duration,
) -> Result<Snapshot, FairError> {
    // SAFETY: the caller's contract.
    let f = unsafe { read_header(mem, len) }?;
    let at = offsets(f.n, f.cap);
    // SAFETY: the header was validated; its atomics are only loaded.
    let h = unsafe { &*(mem as *const SharedHeader) };
    let mut c = Copier {
        base: mem,
        at,
        seq: &h.seq,
        used: &h.used,
        entries: Vec::with_capacity(JOURNAL_ENTRIES),
        s1: 0,
        c1: 0,
    };
    let deadline = Instant::now() + budget;
    let mut meta_b = [0u8; size_of::<MetaRec>()];
    let mut tenants_b = vec![0u8; f.n * size_of::<TenantRec>()];
    let mut live_b = Vec::new();
    let mut heads_b = Vec::new();
    let tenants = |b: &[u8]| -> Result<Vec<TenantRec>, FairError> {
        b.chunks_exact(size_of::<TenantRec>())
            .enumerate()
            .map(|(i, x)| {
                let t: TenantRec = record(x);
                t.check(i).map(|_| t)
            })
            .collect()
    };
    let mut tries = 0u32;
    // Whole copies first.
    while Instant::now() < deadline || tries < 2 {
        tries += 1;
        if tries > 8 {
            std::thread::yield_now();
        }
        c.begin()?;
        c.copy(at.meta, &mut meta_b);
        c.copy(at.tenants, &mut tenants_b);
        let meta: MetaRec = record(&meta_b);
        let lc = (meta.live_count as usize).min(f.cap);
        live_b.resize(lc * 4, 0);
        c.copy(at.live, &mut live_b);
        heads_b.resize(lc * HEAD_BYTES, 0);
        let mut bad_slot = None;
        for (k, s) in live_b.chunks_exact(4).enumerate() {
            let slot = u32::from_ne_bytes([s[0], s[1], s[2], s[3]]) as usize;
            if slot >= f.cap {
                bad_slot = Some(slot);
                break;
            }
            c.copy(
                at.leases + slot * size_of::<LeaseRec>(),
                &mut heads_b[k * HEAD_BYTES..(k + 1) * HEAD_BYTES],
            );
        }
        if !c.consistent() {
            continue;
        }
        check_meta(&meta, f.cap)?;
        if let Some(slot) = bad_slot {
            return Err(FairError::Corrupt(format!(
                "the live list names slot {slot}, beyond the capacity {}",
                f.cap
            )));
        }
        let mut leases = Vec::with_capacity(lc);
        for (k, s) in live_b.chunks_exact(4).enumerate() {
            let slot = u32::from_ne_bytes([s[0], s[1], s[2], s[3]]);
            let l = head_of(slot, &heads_b[k * HEAD_BYTES..(k + 1) * HEAD_BYTES]);
            leases.push(live_head(slot, &l, k, f.n)?);
        }
        return Ok(Snapshot {
            params: f.params,
            meta,
            tenants: tenants(&tenants_b)?,
            leases,
            leases_consistent: true,
            commits: c.s1 / 2,
        });
    }
    // The ledger kept changing: the (small) meta and tenants alone, then the
    // leases one at a time.
    let stop = deadline + budget;
    let meta = loop {
        c.begin()?;
        c.copy(at.meta, &mut meta_b);
        c.copy(at.tenants, &mut tenants_b);
        if c.consistent() {
            let m: MetaRec = record(&meta_b);
            check_meta(&m, f.cap)?;
            break m;
        }
        if Instant::now() > stop {
            return Err(FairError::Lock(format!(
                "the ledger changed during every read for {:?}",
                budget * 2
            )));
        }
        std::thread::yield_now();
    };
    let commits = c.s1 / 2;
    let mut leases = Vec::new();
    let mut head = [0u8; HEAD_BYTES];
    for slot in 0..meta.fresh {
        for _ in 0..64 {
            c.begin()?;
            c.copy(at.leases + slot as usize * size_of::<LeaseRec>(), &mut head);
            if c.consistent() {
                let l = head_of(slot, &head);
                if l.state == 1 {
                    leases.push(live_head(slot, &l, l.live_pos as usize, f.n)?);
                }
                break;
            }
            std::hint::spin_loop();
        }
    }
    Ok(Snapshot {
        params: f.params,
        meta,
        tenants: tenants(&tenants_b)?,
        leases,
        leases_consistent: false,
        commits,
    })
}

/// Validates the head of the live lease at live position `pos`.
fn live_head(slot: u32, l: &LeaseRec, pos: usize, n: usize) -> Result<LeaseHead, FairError> {
    if l.state != 1
        || l.live_pos as usize != pos
        || l.tenant as usize >= n
        || l.no == 0
        || l.deadline_ms < l.granted_ms
    {
        return Err(FairError::Corrupt(format!(
            "live lease slot {slot}: state {}, position {} (expected {pos}), tenant {}, number {}, \
             deadline {} before grant {}",
            l.state, l.live_pos, l.tenant, l.no, l.deadline_ms, l.granted_ms
        )));
    }
    Ok(LeaseHead {
        slot,
        tenant: l.tenant,
        owner: l.owner,
        no: l.no,
        seq: l.seq,
        deadline_ms: l.deadline_ms,
    })
}
