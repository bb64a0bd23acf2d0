//! The process table: registration, kernel-backed liveness, and reaping.
//!
//! # How it works
//!
//! The table is an array of [`ProcEntry`] (256 bytes each: two 128-byte
//! lines, so no entry shares a line with another process's). Entry `i` is guarded by an OFD write lock on byte
//! [`LOCK_BASE`]` + i` of the region file (far past its end, so no data is
//! involved). An OFD lock belongs to an open file description, and the
//! kernel drops it when the last fd of that description is closed, at the
//! latest when its process dies. So "byte `i` is locked" means "some live
//! process holds entry `i`", whatever pids say.
//!
//! **Registering.** A process opens its own open file description of the
//! region (`/proc/self/fd/N` reopen), then for each candidate entry: takes
//! the byte lock *first* (non-blocking; failure means the entry is in use,
//! try the next), then CASes the state `FREE → LIVE`, records its pid and
//! zeroes the object words. Holding the byte before touching the entry means
//! two registrants never race for one entry, and a reaper (which also needs
//! the byte, see below) can never reap an entry that is being registered.
//! If the CAS fails the entry belongs to a dead, not yet reaped process (or
//! a crashed reaper): the registrant unlocks and moves on.
//!
//! **Reaping.** A reaper opens a transient open file description and, for
//! every entry not `FREE`, tries the entry's byte lock. Success proves the
//! owner is dead (a live owner holds the byte) and at the same time makes
//! this reaper the only process that can touch the entry: no other reaper
//! and no registrant can take the byte until it is released. The reaper then
//! marks the entry `REAPING`, calls the object's `release(idx, owner_id)` so
//! the object takes back what the dead process held, zeroes the object
//! words, bumps the generation and stores `FREE`, then unlocks. Hence
//! `release` runs exactly once per death among concurrent reapers. If a
//! reaper itself dies half-way, its byte lock dies with it and the entry
//! stays `REAPING`; the next reaper redoes the release, so `release` must be
//! idempotent for one owner id (a CAS from owner id to free is). A release
//! that fails ([`Mapping::reap_dead_checked`]) leaves the entry `REAPING`
//! with its owner id, so a later reaper tries again: an entry is freed only
//! once what its process held has been given back.
//!
//! **A full table** is not final while entries are in transit: a registrant
//! that finds no free entry but some being reaped (or registered) by other
//! processes waits for them (bounded) and looks again, so a bind fails with
//! `ProcessTableFull` only when live processes (or dead ones nobody has
//! reaped yet, which the object then reaps) fill the table.
//!
//! **Owner ids** are `(idx + 1) | (generation << 16)`, 31 bits (bit 31 is
//! left to objects that tag ownership records): never zero, and
//! different for each reuse of an entry (modulo 2^15 generations), so an
//! ownership record left in the object by a previous occupant of the entry
//! is never mistaken for the current one's.
//!
//! **Fork.** A forked child shares its parent's open file descriptions and
//! would keep the parent's byte locked. The library records every lock fd in
//! a static table that a `pthread_atfork` child handler closes (see
//! [`crate::sys::fork`]); the child's [`Mapping::me`] notices the fork and
//! registers the child as a new process with a new description and owner id.

use crate::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use serde::Serialize;

use super::mapping::{Mapping, Registration};
use crate::error::{Error, Result};
use crate::sys;
use crate::sys::fork::LockFd;

/// Offset of the first liveness-lock byte: entry `i` is locked at
/// `LOCK_BASE + i`, past the end of any region file.
pub const LOCK_BASE: u64 = 1 << 32;

/// First of the bytes objects may OFD-lock for their own purposes (byte
/// `OBJECT_LOCKS + n`): past every process entry's liveness byte.
pub const OBJECT_LOCKS: u64 = LOCK_BASE + 0x1_0000;

/// Entry state: unused.
pub const FREE: u32 = 0;
/// Entry state: held by a registered process (alive while its byte is
/// locked).
pub const LIVE: u32 = 1;
/// Entry state: a reaper is returning a dead process's holdings.
pub const REAPING: u32 = 2;

/// Number of object-specific words per process entry: `obj[0..14]` share the
/// entry's first 128-byte line with the futex word other processes bump to
/// wake it; `obj[14..28]` lie in its second line (for words only the process
/// itself writes often).
pub const OBJ_WORDS: usize = 28;

/// One process's entry in the region's process table.
///
/// `state`, `generation` and `pid` are written only by the process holding
/// the entry's byte lock (the registrant, the owner, or a reaper, which
/// records its own pid while it reaps). `futex`
/// and `obj` belong to the object built on the region; they are zero when the
/// entry is handed to a new process.
#[repr(C, align(256))]
#[derive(Debug)]
pub struct ProcEntry {
    state: AtomicU32,
    generation: AtomicU32,
    pid: AtomicI32,
    /// Wake word for this process's waiters (the object decides its
    /// protocol; it is never reset, so it can serve as a sequence number).
    pub futex: AtomicU32,
    /// Object-specific per-process words; zero at registration.
    pub obj: [AtomicU64; OBJ_WORDS],
    registered_ns: AtomicU64,
    reserved: AtomicU64,
}

#[cfg(not(shuttle))]
const _: () = assert!(std::mem::size_of::<ProcEntry>() == 256);
const _: () = assert!(std::mem::align_of::<ProcEntry>() == 256);
#[cfg(not(shuttle))]
const _: () = assert!(std::mem::offset_of!(ProcEntry, obj) == 16);

impl ProcEntry {
    /// Raw state word (`FREE`, `LIVE`, `REAPING`, or garbage if scribbled).
    pub fn state_raw(&self) -> u32 {
        self.state.load(Ordering::Acquire)
    }

    /// The validated state, or `BadRegion` naming the value.
    pub fn state(&self, idx: u32) -> Result<ProcState> {
        match self.state_raw() {
            FREE => Ok(ProcState::Free),
            LIVE => Ok(ProcState::Live),
            REAPING => Ok(ProcState::Reaping),
            v => Err(Error::BadRegion(format!(
                "process entry {idx} has state {v} (known: 0 free, 1 live, 2 reaping)"
            ))),
        }
    }

    /// The generation (bumped every time the entry is freed).
    pub fn generation(&self) -> u32 {
        self.generation.load(Ordering::Acquire)
    }

    /// The pid recorded at registration (informational only; never used to
    /// decide liveness).
    pub fn pid(&self) -> i32 {
        self.pid.load(Ordering::Relaxed)
    }

    /// `CLOCK_MONOTONIC` at registration (ns).
    pub fn registered_ns(&self) -> u64 {
        self.registered_ns.load(Ordering::Relaxed)
    }

    fn zero_obj(&self) {
        for w in &self.obj {
            w.store(0, Ordering::Relaxed);
        }
    }
}

/// A process-table entry's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ProcState {
    /// Unused.
    Free,
    /// Registered.
    Live,
    /// Being reaped.
    Reaping,
}

/// A registered process: its table index and its owner id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct ProcId {
    /// Index in the process table.
    pub idx: u32,
    /// `(idx + 1) | (generation << 16)`, bit 31 clear: non-zero, unique over
    /// reuses of the entry (modulo 2^15 generations).
    pub owner: u32,
}

impl ProcId {
    /// The owner id of entry `idx` at `generation`. `idx` must be below
    /// [`MAX_PROCESS_SLOTS`](super::layout::MAX_PROCESS_SLOTS) (which keeps it
    /// in 16 bits).
    pub fn encode(idx: u32, generation: u32) -> u32 {
        debug_assert!(idx < super::layout::MAX_PROCESS_SLOTS);
        ((idx & 0xffff) + 1) | ((generation & 0x7fff) << 16)
    }

    /// Whether [`decode`](Self::decode) accepts `owner`: 31 bits, naming an
    /// entry of a table of `process_slots`.
    #[inline(always)]
    pub fn is_valid(owner: u32, process_slots: u32) -> bool {
        let low = owner & 0xffff;
        owner >> 31 == 0 && low != 0 && low <= process_slots
    }

    /// Splits an owner id read from the region, validating its index against
    /// `process_slots`.
    pub fn decode(owner: u32, process_slots: u32) -> Result<ProcId> {
        let low = owner & 0xffff;
        if owner >> 31 != 0 {
            return Err(Error::BadRegion(format!(
                "owner id {owner:#x} has bit 31 set (owner ids are 31 bits)"
            )));
        }
        if low == 0 || low > process_slots {
            return Err(Error::BadRegion(format!(
                "owner id {owner:#x} names process entry {} but the table has {process_slots} entries",
                i64::from(low) - 1
            )));
        }
        Ok(ProcId {
            idx: low - 1,
            owner,
        })
    }

    /// The generation bits of the owner id.
    pub fn generation(&self) -> u32 {
        self.owner >> 16
    }
}

/// One non-free process-table entry, for stats and the CLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ProcSummary {
    /// Index in the table.
    pub idx: u32,
    /// Recorded pid (informational).
    pub pid: i32,
    /// Current owner id.
    pub owner: u32,
    /// Entry state.
    pub state: ProcState,
    /// Whether the kernel says its owner is alive (byte lock held).
    pub alive: bool,
}

/// An object lock of [`Mapping::lock_object_byte`]; released on drop.
#[derive(Debug)]
pub struct ObjectLock {
    _fd: LockFd,
}

/// What one registration pass found.
enum Scan {
    /// Took this entry.
    Took(ProcId),
    /// None free, but some are being reaped or registered right now.
    InTransit,
    /// Every entry is held by a live process or by a dead, unreaped one.
    Full,
}

fn io_err(m: &Mapping, op: &'static str, e: std::io::Error) -> Error {
    Error::io(op, m.region().path().map(|p| p.to_path_buf()), e)
}

impl Mapping {
    /// Registers this process in a free entry (see the module docs). When
    /// no entry is free but some are in transit (being reaped, or being
    /// registered, by another process: their byte is locked and their state
    /// is not `LIVE`), waits for them, at most
    /// [`REGISTER_WAIT`](super::mapping::REGISTER_WAIT).
    pub(super) fn register(&self) -> Result<Registration> {
        let lock = LockFd::open(|| sys::file::reopen_fd(self.region().fd()))
            .map_err(|e| io_err(self, "reopen region for liveness lock", e))?;
        let deadline = std::time::Instant::now() + super::mapping::REGISTER_WAIT;
        let mut nap = std::time::Duration::from_millis(1);
        loop {
            match self.try_register(&lock)? {
                Scan::Took(id) => {
                    return Ok(Registration {
                        id,
                        lock,
                        fork_generation: sys::fork::fork_generation(),
                    })
                }
                Scan::InTransit if std::time::Instant::now() < deadline => {
                    std::thread::sleep(nap);
                    nap = (nap * 2).min(std::time::Duration::from_millis(16));
                }
                _ => {
                    return Err(Error::ProcessTableFull {
                        slots: self.process_slots(),
                    })
                }
            }
        }
    }

    /// One pass over the table: takes a free entry, or says why none was.
    fn try_register(&self, lock: &LockFd) -> Result<Scan> {
        let slots = self.process_slots();
        let pid = sys::file::getpid();
        let mut in_transit = false;
        // Start at a pid-dependent entry so that simultaneous registrants
        // rarely contend for the same byte.
        #[cfg(not(shuttle))]
        let start = (pid as u32) % slots;
        // Under the model checker, at entry 0: which entries a run's
        // processes get must not depend on the pid, or a failing schedule
        // would not replay in another run.
        #[cfg(shuttle)]
        let start = 0;
        for k in 0..slots {
            let idx = (start + k) % slots;
            let off = LOCK_BASE + u64::from(idx);
            let e = self.entry(idx);
            if !sys::lock::ofd_try_lock_byte(lock.fd(), off)
                .map_err(|e| io_err(self, "lock process entry", e))?
            {
                // Held by a live owner, or by a reaper or registrant at work:
                // those finish in a moment.
                in_transit |= e.state_raw() != LIVE;
                continue;
            }
            if e.state
                .compare_exchange(FREE, LIVE, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                // A dead owner not yet reaped: leave it to a reaper.
                sys::lock::ofd_unlock_byte(lock.fd(), off)
                    .map_err(|e| io_err(self, "unlock process entry", e))?;
                continue;
            }
            e.pid.store(pid, Ordering::Relaxed);
            e.registered_ns
                .store(sys::monotonic_ns(), Ordering::Relaxed);
            e.zero_obj();
            let generation = e.generation();
            std::sync::atomic::fence(Ordering::Release);
            return Ok(Scan::Took(ProcId {
                idx,
                owner: ProcId::encode(idx, generation),
            }));
        }
        Ok(if in_transit {
            Scan::InTransit
        } else {
            Scan::Full
        })
    }

    /// Frees this process's own entry (owner still holds the byte lock).
    pub(super) fn free_own_entry(&self, id: ProcId) -> Result<()> {
        let e = self.entry(id.idx);
        if let Err(v) = e
            .state
            .compare_exchange(LIVE, REAPING, Ordering::AcqRel, Ordering::Acquire)
        {
            return Err(Error::BadRegion(format!(
                "own process entry {} has state {v} instead of 1 (live)",
                id.idx
            )));
        }
        self.finish_free(e);
        Ok(())
    }

    fn finish_free(&self, e: &ProcEntry) {
        e.zero_obj();
        e.pid.store(0, Ordering::Relaxed);
        let g = e.generation.load(Ordering::Relaxed);
        e.generation.store(g.wrapping_add(1), Ordering::Release);
        e.state.store(FREE, Ordering::Release);
    }

    /// Whether entry `idx` is held right now by a live process, as its
    /// registered owner (`LIVE`) or as the reaper at work on it
    /// (`REAPING`), and that process's pid (the entry's pid word names the
    /// holder in both cases). `None` if nobody holds it.
    pub fn entry_holder(&self, idx: u32) -> Result<Option<i32>> {
        let e = self.proc_entry(idx)?;
        let st = e.state_raw();
        if st != LIVE && st != REAPING {
            return Ok(None);
        }
        let held = sys::lock::ofd_is_locked_byte(self.probe_fd(), LOCK_BASE + u64::from(idx))
            .map_err(|e| io_err(self, "probe liveness lock", e))?;
        Ok(held.then(|| e.pid()))
    }

    /// Whether the process registered at `idx` is alive: the entry is `LIVE`
    /// and some open file description holds its byte lock (kernel-backed; a
    /// dead process's lock is gone). `BadRegion` if `idx` is out of range.
    pub fn is_alive(&self, idx: u32) -> Result<bool> {
        let e = self.proc_entry(idx)?;
        if e.state_raw() != LIVE {
            return Ok(false);
        }
        sys::lock::ofd_is_locked_byte(self.probe_fd(), LOCK_BASE + u64::from(idx))
            .map_err(|e| io_err(self, "probe liveness lock", e))
    }

    /// Finds entries whose process is dead, claims each exactly once (the
    /// entry's byte lock excludes other reapers and registrants), calls
    /// `release(idx, owner_id)` so the object returns what that process held,
    /// then frees the entry (bumping its generation). Returns how many
    /// processes were reaped.
    ///
    /// `release` runs while the claim is held; if this reaper dies inside it,
    /// a later reaper calls it again for the same owner id, so it must be
    /// idempotent per owner id. Entries with a scribbled state are reaped too
    /// if nobody holds them, and reported as `BadRegion` after the scan.
    pub fn reap_dead(&self, release: &mut dyn FnMut(u32, u32)) -> Result<u32> {
        self.reap_dead_checked(&mut |idx, owner| {
            release(idx, owner);
            Ok(())
        })
    }

    /// Like [`reap_dead`](Mapping::reap_dead), for a `release` that can
    /// fail: an entry whose `release` fails is *not* freed (it stays
    /// `REAPING`, unclaimed, with its owner id), so that a later reaper
    /// tries again and nothing the dead process held is orphaned. The first
    /// such error is returned after the scan.
    pub fn reap_dead_checked(
        &self,
        release: &mut dyn FnMut(u32, u32) -> Result<()>,
    ) -> Result<u32> {
        let claim = LockFd::open(|| sys::file::reopen_fd(self.region().fd()))
            .map_err(|e| io_err(self, "reopen region for reaping", e))?;
        let mut reaped = 0;
        let mut bad: Option<Error> = None;
        for idx in 0..self.process_slots() {
            let e = self.entry(idx);
            if e.state_raw() == FREE {
                continue;
            }
            let off = LOCK_BASE + u64::from(idx);
            if !sys::lock::ofd_try_lock_byte(claim.fd(), off)
                .map_err(|e| io_err(self, "claim process entry", e))?
            {
                continue; // alive, registering, or being reaped by someone else
            }
            // We hold the byte: the owner is dead and nobody else may touch
            // the entry until we unlock.
            let st = e.state_raw();
            if st != FREE {
                if st != LIVE && st != REAPING && bad.is_none() {
                    bad = Some(Error::BadRegion(format!(
                        "process entry {idx} had state {st} (known: 0 free, 1 live, 2 reaping); reaped it"
                    )));
                }
                e.state.store(REAPING, Ordering::Release);
                // While it holds the claim, the entry names the reaper: an
                // object lock taken inside `release` then belongs to a
                // process the table knows (see `holds_entry`).
                e.pid.store(sys::file::getpid(), Ordering::Relaxed);
                let owner = ProcId::encode(idx, e.generation());
                match release(idx, owner) {
                    Ok(()) => {
                        self.finish_free(e);
                        reaped += 1;
                    }
                    Err(err) => {
                        // Keep the entry (and the owner id its holdings carry)
                        // for a later reaper.
                        bad.get_or_insert(err);
                    }
                }
            }
            sys::lock::ofd_unlock_byte(claim.fd(), off)
                .map_err(|e| io_err(self, "release process entry", e))?;
        }
        drop(claim);
        match bad {
            Some(e) => Err(e),
            None => Ok(reaped),
        }
    }

    /// Takes the object lock `n` (an OFD lock on byte [`OBJECT_LOCKS`]` +
    /// n` of the region file, through a new open file description), waiting
    /// at most `timeout`; released when the guard drops or the process
    /// dies. For rare region-wide critical sections, such as repairing a
    /// corrupt in-region lock.
    pub fn lock_object_byte(&self, n: u32, timeout: std::time::Duration) -> Result<ObjectLock> {
        let fd = LockFd::open(|| sys::file::reopen_fd(self.region().fd()))
            .map_err(|e| io_err(self, "reopen region for an object lock", e))?;
        sys::lock::ofd_lock_byte_wait(fd.fd(), OBJECT_LOCKS + u64::from(n), timeout)
            .map_err(|e| io_err(self, "object lock", e))?;
        Ok(ObjectLock { _fd: fd })
    }

    /// Every non-free entry with its liveness, for stats and the CLI.
    pub fn live_processes(&self) -> Result<Vec<ProcSummary>> {
        let mut out = Vec::new();
        for idx in 0..self.process_slots() {
            let e = self.entry(idx);
            let state = e.state(idx)?;
            if state == ProcState::Free {
                continue;
            }
            out.push(ProcSummary {
                idx,
                pid: e.pid(),
                owner: ProcId::encode(idx, e.generation()),
                state,
                alive: self.is_alive(idx)?,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_ids_roundtrip_and_validate() {
        for idx in [0u32, 1, 127, 4095] {
            for gen in [0u32, 1, 0xffff, 0x1_0000, 0xdead_beef] {
                let o = ProcId::encode(idx, gen);
                assert_ne!(o, 0);
                let p = ProcId::decode(o, 4096).unwrap();
                assert_eq!(p.idx, idx);
                assert_eq!(p.generation(), gen & 0x7fff);
            }
        }
        assert_ne!(ProcId::encode(3, 0), ProcId::encode(3, 1));
        assert!(ProcId::decode(0, 128).is_err());
        assert!(ProcId::decode(129, 128).is_err());
        assert!(ProcId::decode(0xffff_ffff, 4096).is_err());
    }
}
