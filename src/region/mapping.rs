//! A region mapped into this process, bound to one object.
//!
//! # Registrations belong to the process
//!
//! A process registers in the region's process table once per mapping
//! ([`Mapping::me`]), and its liveness lock lives in the registration. What
//! the process holds in the object (slots, leases) belongs to the process
//! until it exits, not to the mapping: when the last handle of a mapping is
//! dropped while the object says the process still holds something (the
//! object's *retain check*, [`Mapping::set_retain_check`]), the
//! registration is not dropped but *parked* in a process-wide table, keyed
//! by the region file's identity (device and inode), with its lock held. So
//! the entry stays alive, and nothing the process holds is reaped, for as
//! long as the process lives; the next mapping of the same file in this
//! process adopts the parked registration (same entry, same owner id)
//! instead of registering anew. A forked child never adopts its parent's
//! parked registrations (their lock fds are closed in the child).
//!
//! Without a retain check (or when it says nothing is held) dropping the
//! last handle drops the registration: the entry looks like a dead
//! process's and is reaped, as if the process had exited.

use std::os::fd::AsFd;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::fork_lock::ForkSafeMutex;
use super::layout::HeaderInfo;
use super::proc_table::{ProcEntry, ProcId};
use super::Region;
use crate::error::{Error, Result};
use crate::sys;
use crate::sys::fork::LockFd;

/// Longest [`Mapping::me`] waits for process-table entries that are being
/// reaped (or registered) by other processes to settle, when no entry is
/// free.
pub const REGISTER_WAIT: Duration = Duration::from_secs(5);

/// Decides, when the last handle of a mapping is dropped, whether the
/// process still holds something in the object under `id` (then the
/// registration is parked, not dropped; see the module docs). Errors should
/// answer `true`.
pub type RetainCheck = fn(&Mapping, ProcId) -> bool;

/// A registration kept alive past its mapping.
#[derive(Debug)]
struct Parked {
    /// `(st_dev, st_ino)` of the region file.
    identity: (u64, u64),
    reg: Registration,
}

/// Registrations parked by dropped mappings (see the module docs). A
/// [`ForkSafeMutex`]: a child that inherits it locked takes it over and
/// starts empty.
#[cfg(not(shuttle))]
static PARKED: ForkSafeMutex<Vec<Parked>> = ForkSafeMutex::new(Vec::new());

// Under the model checker the lock's word is the checker's atomic, which
// must be created inside an execution: one table per execution (dropped,
// with the liveness locks it holds, when the execution ends).
#[cfg(shuttle)]
shuttle::lazy_static! {
    static ref PARKED: ForkSafeMutex<Vec<Parked>> = ForkSafeMutex::new(Vec::new());
}

/// Takes this process's parked registration for the file `identity`, if
/// any. Registrations inherited across fork are dropped (which does nothing
/// to the parent's).
fn unpark(identity: (u64, u64)) -> Option<Registration> {
    let mut parked = PARKED.lock();
    let gen = sys::fork::fork_generation();
    parked.retain(|p| p.reg.fork_generation == gen && p.reg.lock.is_current_process());
    let i = parked.iter().position(|p| p.identity == identity)?;
    Some(parked.swap_remove(i).reg)
}

/// This process's registration in the process table.
#[derive(Debug)]
pub(super) struct Registration {
    pub(super) id: ProcId,
    /// Holds the entry's byte lock; recorded in the fork table.
    pub(super) lock: LockFd,
    /// [`sys::fork::fork_generation`] when registered.
    pub(super) fork_generation: u64,
}

/// A bound region: the shared mapping, the validated header, and this
/// process's registration. `Send + Sync`; objects hold it in an `Arc`, and
/// the mapping stays valid as long as any `Arc` does.
///
/// # After `fork`
///
/// A child that inherits a `Mapping` keeps a valid mapping of the same
/// shared memory, but not its parent's identity: the library's `atfork`
/// handler closes the child's copies of the liveness-lock fds, and the
/// child's first [`me`](Mapping::me) registers it as a new process with a
/// new entry and owner id. The parent's entry stays the parent's, alive
/// exactly as long as the parent is.
///
/// # Drop
///
/// Dropping the last `Arc<Mapping>` unmaps the region. If the object's
/// retain check ([`set_retain_check`](Mapping::set_retain_check)) says the
/// process still holds something, the registration (entry and liveness
/// lock) is parked until the process exits or maps the file again (see the
/// module docs). Otherwise the liveness-lock fd is closed but the entry is
/// not freed: it then looks like a dead process's and the next
/// [`reap_dead`](Mapping::reap_dead) gives back whatever the object recorded
/// in it. An object that knows it holds nothing calls
/// [`deregister`](Mapping::deregister) first for a clean exit.
#[derive(Debug)]
pub struct Mapping {
    region: Region,
    map: memmap2::MmapRaw,
    header: HeaderInfo,
    /// An open file description that never holds locks, for `F_OFD_GETLK`.
    probe: OwnedFd,
    reg: ForkSafeMutex<Option<Registration>>,
    /// Fast path of `me()`: `(fork_generation as u32) << 32 | owner`, 0 when
    /// unregistered. Owner ids are never 0.
    fast: AtomicU64,
    /// The object's per-process state, shared by the process's handles (a
    /// weak reference: the handles own it).
    object: ForkSafeMutex<Option<ObjectState>>,
    /// The region file's `(st_dev, st_ino)`.
    identity: (u64, u64),
    /// The object's retain check, if it set one.
    retain: OnceLock<RetainCheck>,
}

/// A weak reference to an object's per-process state.
pub(crate) type ObjectState = std::sync::Weak<dyn std::any::Any + Send + Sync>;

impl Mapping {
    /// Wraps a freshly validated mapping. `map.len()` must be at least
    /// `header.total_size` (the caller checked the file size).
    pub(super) fn new(
        region: Region,
        map: memmap2::MmapRaw,
        header: HeaderInfo,
    ) -> Result<Mapping> {
        if (map.len() as u64) < header.total_size {
            return Err(Error::BadRegion(format!(
                "mapping is {} bytes but the region needs {}",
                map.len(),
                header.total_size
            )));
        }
        let path = || region.path().map(|p| p.to_path_buf());
        let probe = sys::file::reopen_fd(region.fd())
            .map_err(|e| Error::io("reopen region for probing", path(), e))?;
        let identity = sys::file::file_identity(region.fd())
            .map_err(|e| Error::io("fstat region", path(), e))?;
        // The futex model keys the words of this mapping on (file, offset),
        // as the kernel does (see `sys::futex::model`).
        #[cfg(shuttle)]
        sys::futex::model::map_range(map.as_ptr() as usize, map.len(), identity);
        Ok(Mapping {
            region,
            map,
            header,
            probe,
            reg: ForkSafeMutex::new(None),
            fast: AtomicU64::new(0),
            object: ForkSafeMutex::new(None),
            identity,
            retain: OnceLock::new(),
        })
    }

    /// The region file's `(st_dev, st_ino)`: its identity on this host.
    pub fn file_identity(&self) -> (u64, u64) {
        self.identity
    }

    /// Sets the object's retain check (once; later calls are ignored): when
    /// the last handle of this mapping is dropped, `check` says whether the
    /// process still holds something in the object, and if so its
    /// registration (and liveness lock) is kept until the process exits
    /// (see the module docs).
    pub fn set_retain_check(&self, check: RetainCheck) {
        let _ = self.retain.set(check);
    }

    /// The object's per-process state slot (one object per region).
    pub(crate) fn object_state(&self) -> super::fork_lock::ForkSafeGuard<'_, Option<ObjectState>> {
        self.object.lock()
    }

    /// The region this mapping belongs to.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// Start of the mapping (the header page).
    pub(super) fn header_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    pub(super) fn probe_fd(&self) -> BorrowedFd<'_> {
        self.probe.as_fd()
    }

    /// A copy of the header as validated when the region was bound. Offsets
    /// and sizes come from this copy, never from the (writable) region again.
    pub fn header(&self) -> HeaderInfo {
        self.header
    }

    /// Start of the object area (128-byte aligned, `object_len()` bytes,
    /// valid while `self` lives). Shared with other processes: access it only
    /// through atomics (or under the object's own lock).
    pub fn object_ptr(&self) -> *mut u8 {
        // `object_offset + object_size <= total_size <= map.len()` was
        // validated, so this stays inside the mapping.
        self.map
            .as_mut_ptr()
            .wrapping_add(self.header.object_offset as usize)
    }

    /// Size of the object area in bytes (as the object asked for it).
    pub fn object_len(&self) -> usize {
        self.header.object_size as usize
    }

    /// Number of process-table entries.
    pub fn process_slots(&self) -> u32 {
        self.header.process_slots
    }

    /// Entry `idx` of the process table, or `BadRegion` if `idx` is out of
    /// range (for example an index decoded from a scribbled owner id).
    pub fn proc_entry(&self, idx: u32) -> Result<&ProcEntry> {
        if idx >= self.header.process_slots {
            return Err(Error::BadRegion(format!(
                "process entry index {idx} out of range (the table has {} entries)",
                self.header.process_slots
            )));
        }
        Ok(self.entry(idx))
    }

    /// Entry `idx`; `idx < process_slots` is the caller's promise.
    pub(super) fn entry(&self, idx: u32) -> &ProcEntry {
        assert!(
            idx < self.header.process_slots,
            "internal: entry index checked by callers"
        );
        let off = self.header.proc_table_offset as usize
            + idx as usize * std::mem::size_of::<ProcEntry>();
        // SAFETY: the process table lies inside the mapping (validated layout:
        // proc_table_offset + process_slots * 128 <= object_offset <= len),
        // the mapping is page aligned and offsets are multiples of 256, so the
        // pointer is aligned for ProcEntry. ProcEntry consists only of atomics,
        // for which every bit pattern is valid and shared mutation (by this
        // and other processes) is allowed through `&`. The reference cannot
        // outlive `self`, which keeps the mapping alive.
        unsafe { &*(self.map.as_ptr().add(off) as *const ProcEntry) }
    }

    /// This process's registration, registering lazily on first use.
    ///
    /// After `fork` (detected through the atfork handler's fork generation,
    /// and the pid), the child registers afresh as a NEW process (new entry,
    /// new owner id): it never reuses its parent's identity.
    ///
    /// When no entry is free but some are being reaped (or registered) by
    /// other processes, waits for them to settle, at most
    /// [`REGISTER_WAIT`]. `ProcessTableFull` if no entry is free otherwise:
    /// entries of dead processes become free when reaped
    /// ([`reap_dead`](Mapping::reap_dead)), so an object should reap and
    /// retry ([`me_reaping`](Mapping::me_reaping) does).
    pub fn me(&self) -> Result<ProcId> {
        let fast = self.fast.load(Ordering::Acquire);
        let owner = fast as u32;
        if owner != 0 && (fast >> 32) as u32 == sys::fork::fork_generation() as u32 {
            return ProcId::decode(owner, self.header.process_slots);
        }
        self.me_slow()
    }

    /// The fast path of [`me`](Mapping::me), for a call that runs on every
    /// operation: this process's owner id when it is registered in the
    /// current fork generation (what `me` would answer without
    /// registering), else `None`, and then `me` sorts it out. Two loads
    /// and a few compares, no `Result` to build.
    #[inline(always)]
    pub fn me_registered(&self) -> Option<u32> {
        let fast = self.fast.load(Ordering::Acquire);
        let owner = fast as u32;
        // What `me` checks, `ProcId::decode`'s rule included.
        ((fast >> 32) as u32 == sys::fork::fork_generation() as u32
            && ProcId::is_valid(owner, self.header.process_slots))
        .then_some(owner)
    }

    /// Like [`me`](Mapping::me), but while the table is full, reaps dead
    /// processes (calling `release` for each, see
    /// [`reap_dead`](Mapping::reap_dead)) and tries again, for at most
    /// [`REGISTER_WAIT`]. Fails with `ProcessTableFull` only when live
    /// processes hold every entry.
    pub fn me_reaping(&self, release: &mut dyn FnMut(u32, u32)) -> Result<ProcId> {
        let deadline = Instant::now() + REGISTER_WAIT;
        loop {
            match self.me() {
                Err(Error::ProcessTableFull { .. }) if Instant::now() < deadline => {
                    if self.reap_dead(release)? == 0 {
                        // Nothing dead to take: me() already waited for
                        // entries in transit, so live processes fill it.
                        return self.me();
                    }
                }
                r => return r,
            }
        }
    }

    fn me_slow(&self) -> Result<ProcId> {
        let mut g = self.reg.lock();
        let gen = sys::fork::fork_generation();
        if let Some(r) = g.as_ref() {
            if r.fork_generation == gen && r.lock.is_current_process() {
                return Ok(r.id);
            }
        }
        // Either never registered, or a registration inherited across fork:
        // drop it (LockFd does not close in a child; the handler did) and
        // register this process on its own.
        self.fast.store(0, Ordering::Release);
        *g = None;
        let r = match unpark(self.identity).filter(|r| self.still_ours(r)) {
            Some(r) => r,
            None => self.register()?,
        };
        let id = r.id;
        self.fast.store(
            (u64::from(r.fork_generation as u32) << 32) | u64::from(id.owner),
            Ordering::Release,
        );
        *g = Some(r);
        Ok(id)
    }

    /// True if a parked registration's entry is still as we left it (not
    /// scribbled): live, with the owner id's generation.
    fn still_ours(&self, r: &Registration) -> bool {
        self.proc_entry(r.id.idx).is_ok_and(|e| {
            e.state_raw() == super::proc_table::LIVE
                && super::proc_table::ProcId::encode(r.id.idx, e.generation()) == r.id.owner
        })
    }

    /// Deregisters this process cleanly: frees its entry (bumping the
    /// generation) and drops its liveness lock. The object calls this only
    /// when the process holds nothing in the object; otherwise it lets the
    /// entry die with the process (or the last handle) and be reaped. A later
    /// [`me`](Mapping::me) registers again with a new owner id.
    pub fn deregister(&self) -> Result<()> {
        let mut g = self.reg.lock();
        self.fast.store(0, Ordering::Release);
        let Some(r) = g.take() else { return Ok(()) };
        if r.fork_generation != sys::fork::fork_generation() || !r.lock.is_current_process() {
            return Ok(()); // inherited; the parent's entry is not ours to free
        }
        let res = self.free_own_entry(r.id);
        drop(r); // closes the lock fd after the entry is FREE
        res
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        #[cfg(shuttle)]
        sys::futex::model::unmap_range(self.map.as_ptr() as usize);
        let Some(r) = self.reg.lock().take() else {
            return;
        };
        if r.fork_generation != sys::fork::fork_generation() || !r.lock.is_current_process() {
            return; // inherited across fork: the parent's, nothing to keep
        }
        let holds = self.retain.get().is_some_and(|check| check(self, r.id));
        if holds {
            // The process still holds something: keep its entry alive (and
            // its holdings unreaped) until it exits or re-binds the file.
            PARKED.lock().push(Parked {
                identity: self.identity,
                reg: r,
            });
        }
        // Otherwise `r` drops here: its lock fd closes and the entry is
        // reaped like a dead process's.
    }
}

/// A model-checker hook (`--cfg shuttle`, `tests/model.rs`): the death of
/// the process that owns this mapping.
#[cfg(shuttle)]
impl Mapping {
    /// This process's threads asleep in the futex model on words of this
    /// mapping.
    #[doc(hidden)]
    pub fn model_sleepers(&self) -> usize {
        sys::futex::model::sleeping_in(self.map.as_ptr() as usize)
    }

    /// Kills this mapping's process now if exactly `threads` of its threads
    /// sleep in the futex model (all the threads it has left; 0 once they
    /// have all returned): those threads never act again (they unwind with
    /// [`sys::futex::model::Died`]), and its registration is dropped
    /// without being parked, which closes its liveness lock: from then on
    /// the kernel says it is dead, and whatever it held or published is
    /// left for a reaper. The caller must drop its handles of the process
    /// afterwards without using them. True if it died.
    #[doc(hidden)]
    pub fn model_die_if_parked(&self, threads: usize) -> bool {
        if !sys::futex::model::kill_parked(self.map.as_ptr() as usize, threads) {
            return false;
        }
        self.model_drop_liveness();
        true
    }

    /// Arms the death point named `point` for this mapping's process: the
    /// first of its threads that reaches it (see
    /// [`model_death_point`](Self::model_death_point)) kills the process
    /// there. For processes with one thread (another running thread would
    /// go on acting).
    #[doc(hidden)]
    pub fn model_arm_death(&self, point: &'static str) {
        sys::futex::model::arm_death(self.map.as_ptr() as usize, point);
    }

    /// A death point in the protocol code: if `point` is armed for this
    /// process, it dies here (its sleeping threads never act again, its
    /// liveness lock is dropped) and the calling thread unwinds with
    /// [`sys::futex::model::Died`] without acting again either.
    #[doc(hidden)]
    pub fn model_death_point(&self, point: &'static str) {
        let base = self.map.as_ptr() as usize;
        if sys::futex::model::death_point(base, point) {
            sys::futex::model::kill_all(base);
            self.model_drop_liveness();
            sys::futex::model::die();
        }
        sys::futex::model::stop_point(base, point);
    }

    /// Arms a stop of this mapping's process at the named step `point` (a
    /// death point's name): the first of its threads to pass it stops the
    /// process there, until [`model_cont`](Self::model_cont).
    #[doc(hidden)]
    pub fn model_arm_stop(&self, point: &'static str) {
        sys::futex::model::arm_stop(self.map.as_ptr() as usize, point);
    }

    /// Whether this mapping's process is stopped (see
    /// [`model_stop`](Self::model_stop)).
    #[doc(hidden)]
    pub fn model_is_stopped(&self) -> bool {
        sys::futex::model::is_stopped(self.map.as_ptr() as usize)
    }

    /// Records the calling model thread as one of this mapping's process's
    /// threads (for stops and deaths; see `sys::futex::model`).
    #[doc(hidden)]
    pub fn model_join(&self) {
        sys::futex::model::join_process(self.map.as_ptr() as usize);
    }

    /// Stops this mapping's process: its threads are not scheduled from
    /// their next step until [`model_cont`](Self::model_cont). It stays
    /// alive (its liveness lock held).
    #[doc(hidden)]
    pub fn model_stop(&self) {
        sys::futex::model::stop(self.map.as_ptr() as usize);
    }

    /// Continues this mapping's process after [`model_stop`](Self::model_stop).
    #[doc(hidden)]
    pub fn model_cont(&self) {
        sys::futex::model::cont(self.map.as_ptr() as usize);
    }

    /// Drops the registration without parking it: its liveness lock
    /// closes, and the kernel says the process is dead.
    fn model_drop_liveness(&self) {
        self.fast.store(0, Ordering::Release);
        let reg = self.reg.lock().take();
        drop(reg);
    }
}
