//! Read-only access to a region, for inspectors (`shmsched stat`, `watch`,
//! `ls`, `serve`).
//!
//! # How it works
//!
//! A [`RegionView`] opens the region file `O_RDONLY`, reads its header with
//! `pread` under a *shared* `flock` (so it never sees a header an
//! initialiser is half-way through writing) and validates it exactly as a
//! binder does ([`layout::decode_and_validate`]). It then maps the file
//! `PROT_READ` and reads the process table and the object area only through
//! atomic loads (an atomic load never writes, so it works on a read-only
//! mapping on the platforms this crate builds for).
//!
//! # What it guarantees
//!
//! - **It writes nothing and takes no entry.** It never registers in the
//!   process table, never takes a liveness or exclusive lock, never reaps.
//!   It works with read permission alone (a group member of a `0640`
//!   region) and on a region whose process table is full.
//! - **Liveness is the kernel's word.** A process entry is alive while some
//!   open file description holds its byte lock; `F_OFD_GETLK` answers that
//!   on a read-only descriptor too (it asks, it does not lock).
//! - **Everything read is validated** as by the library's own handles: the
//!   header by [`layout::decode_and_validate`], entry states against the
//!   known values, indices against the table size.
//!
//! Figures read this way are a snapshot taken one word at a time: under
//! churn two words may come from different instants, as with any gauge.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::layout::{self, HeaderInfo, HeaderState, RawHeader, HEADER_SIZE};
use super::proc_table::{ProcEntry, ProcId, ProcState, ProcSummary, LOCK_BASE};
use super::resolve_path;
use crate::error::{Error, Result};
use crate::sys;

/// A region mapped read-only: its validated header, its process table and
/// its object area, read through atomic loads only.
#[derive(Debug)]
pub struct RegionView {
    path: PathBuf,
    /// Read-only descriptor; it holds no lock, so it can probe liveness.
    fd: OwnedFd,
    map: memmap2::Mmap,
    header: HeaderInfo,
}

/// What [`RegionView::probe`] found in a file.
#[derive(Debug)]
pub enum Probe {
    /// An initialised shmsched region.
    Region(Box<RegionView>),
    /// A shmsched file that no object was created in yet (empty, zero, or
    /// its initialiser died half-way); the next binder initialises it.
    Uninitialised,
}

/// Releases a shared `flock` on drop.
struct SharedFlock<'a>(std::os::fd::BorrowedFd<'a>);

impl Drop for SharedFlock<'_> {
    fn drop(&mut self) {
        let _ = sys::lock::flock_unlock(self.0);
    }
}

impl RegionView {
    /// Opens the region `name_or_path` (a name maps to
    /// `/dev/shm/shmsched.NAME`, see [`resolve_path`]) read-only. An
    /// uninitialised region is [`Error::BadRegion`].
    pub fn open(name_or_path: &str) -> Result<RegionView> {
        let path = resolve_path(name_or_path)?;
        match RegionView::probe(&path)? {
            Probe::Region(v) => Ok(*v),
            Probe::Uninitialised => Err(Error::BadRegion(
                "not initialised: no object has been created in this region yet".into(),
            )),
        }
    }

    /// Opens the file at `path` read-only and tells what it holds: a
    /// validated region, an uninitialised one, or an error (a foreign file
    /// is [`Error::BadRegion`] naming what does not match).
    pub fn probe(path: &Path) -> Result<Probe> {
        let io = |op, e| Error::io(op, Some(path.to_path_buf()), e);
        let fd = sys::file::open_read_only(path).map_err(|e| io("open", e))?;
        let header = {
            sys::lock::flock_wait(fd.as_fd(), false, super::create::BIND_LOCK_WAIT)
                .map_err(|e| io("flock shared", e))?;
            let _unlock = SharedFlock(fd.as_fd());
            let size = sys::file::file_size(fd.as_fd()).map_err(|e| io("fstat", e))?;
            if size == 0 {
                // An empty file is what a creator makes first: the next
                // binder initialises it.
                return Ok(Probe::Uninitialised);
            }
            let mut buf = [0u8; std::mem::size_of::<RawHeader>()];
            let n = usize::try_from(size).map_or(buf.len(), |s| s.min(buf.len()));
            sys::file::read_exact_at(fd.as_fd(), &mut buf[..n], 0)
                .map_err(|e| io("read header", e))?;
            match layout::decode_and_validate(&buf, size)? {
                HeaderState::Uninitialised => return Ok(Probe::Uninitialised),
                HeaderState::Ready(_) if size < u64::from(HEADER_SIZE) => {
                    return Err(Error::BadRegion(format!(
                        "region file is {size} bytes, smaller than its {HEADER_SIZE}-byte header"
                    )))
                }
                HeaderState::Ready(h) => h,
            }
        };
        let len = usize::try_from(header.total_size).map_err(|_| {
            Error::BadRegion(format!(
                "total size {} does not fit in memory",
                header.total_size
            ))
        })?;
        // The size was validated against the file's size under the flock;
        // only an initialiser changes it, and only before the region is ready.
        let map = sys::file::map_shared_read_only(fd.as_fd(), len).map_err(|e| io("mmap", e))?;
        if map.len() < len {
            return Err(Error::BadRegion(format!(
                "mapping is {} bytes but the region needs {len}",
                map.len()
            )));
        }
        Ok(Probe::Region(Box::new(RegionView {
            path: path.to_path_buf(),
            fd,
            map,
            header,
        })))
    }

    /// The region file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The header, as validated when the view was opened.
    pub fn header(&self) -> HeaderInfo {
        self.header
    }

    /// The file's permission bits (`st_mode & 0o7777`).
    pub fn mode(&self) -> Result<u32> {
        sys::file::file_mode(self.fd.as_fd())
            .map_err(|e| Error::io("fstat", Some(self.path.clone()), e))
    }

    /// Entry `idx` of the process table, or `BadRegion` if out of range.
    pub(crate) fn entry(&self, idx: u32) -> Result<&ProcEntry> {
        if idx >= self.header.process_slots {
            return Err(Error::BadRegion(format!(
                "process entry index {idx} out of range (the table has {} entries)",
                self.header.process_slots
            )));
        }
        let off = self.header.proc_table_offset as usize
            + idx as usize * std::mem::size_of::<ProcEntry>();
        // SAFETY: the process table lies inside the mapping (validated
        // layout: proc_table_offset + process_slots * 256 <= object_offset <=
        // total_size <= map.len()); the mapping is page aligned and entries
        // are 256 bytes, so the pointer is aligned for ProcEntry. ProcEntry
        // is only atomics, valid for every bit pattern, and this module only
        // ever loads through them (a load does not write, so the read-only
        // mapping does not fault). The reference cannot outlive `self`,
        // which keeps the mapping alive.
        Ok(unsafe { &*(self.map.as_ptr().add(off) as *const ProcEntry) })
    }

    /// Start of the object area (128-byte aligned, [`object_len`] bytes).
    /// Read-only memory that other processes write: read it only through
    /// atomic loads.
    ///
    /// [`object_len`]: RegionView::object_len
    pub(crate) fn object_ptr(&self) -> *const u8 {
        // Inside the mapping: object_offset + object_size <= total_size <= len.
        self.map
            .as_ptr()
            .wrapping_add(self.header.object_offset as usize)
    }

    /// Size of the object area in bytes.
    pub(crate) fn object_len(&self) -> usize {
        self.header.object_size as usize
    }

    /// Checks that `[off, off + size)` lies in the object area and `off` is
    /// `size`-aligned, and returns the word's address.
    fn object_word(&self, off: usize, size: usize) -> Result<*const u8> {
        if off % size != 0
            || off
                .checked_add(size)
                .is_none_or(|end| end > self.object_len())
        {
            return Err(Error::BadRegion(format!(
                "{size}-byte word at object offset {off} is outside the {}-byte object area or misaligned",
                self.object_len()
            )));
        }
        Ok(self.object_ptr().wrapping_add(off))
    }

    /// Loads the `u64` at byte `off` of the object area (SeqCst).
    pub(crate) fn load_u64(&self, off: usize) -> Result<u64> {
        let p = self.object_word(off, 8)?;
        // SAFETY: `p` is 8-aligned (checked by `object_word`) and the 8
        // bytes lie inside the live mapping (checked above). An atomic load
        // only reads, which a PROT_READ mapping allows; every bit pattern is
        // a valid u64.
        Ok(unsafe { &*(p as *const std::sync::atomic::AtomicU64) }
            .load(std::sync::atomic::Ordering::SeqCst))
    }

    /// A `T` made only of atomics at byte `off` of the object area (for
    /// example a [`StallClock`](crate::stall::StallClock)), to be read
    /// through its loading methods only.
    pub(crate) fn object_atomics<T>(&self, off: usize) -> Result<&T> {
        let p = self.object_word(off, std::mem::align_of::<T>())?;
        if off + std::mem::size_of::<T>() > self.object_len() {
            return Err(Error::BadRegion(format!(
                "{} bytes at object offset {off} run past the {}-byte object area",
                std::mem::size_of::<T>(),
                self.object_len()
            )));
        }
        // SAFETY: in bounds and aligned (checked above); callers pass only
        // types made of atomics (valid for every bit pattern) and call only
        // methods that load. The reference lives no longer than `self`.
        Ok(unsafe { &*(p as *const T) })
    }

    /// Whether the process of entry `idx` is alive: the entry is live and
    /// some open file description holds its byte lock.
    pub fn is_alive(&self, idx: u32) -> Result<bool> {
        if self.entry(idx)?.state_raw() != super::proc_table::LIVE {
            return Ok(false);
        }
        sys::lock::ofd_is_locked_byte(self.fd.as_fd(), LOCK_BASE + u64::from(idx))
            .map_err(|e| Error::io("probe liveness lock", Some(self.path.clone()), e))
    }

    /// Every non-free entry of the process table with its liveness, in
    /// table order (dead entries not yet reaped included).
    pub fn processes(&self) -> Result<Vec<ProcSummary>> {
        let mut out = Vec::new();
        for idx in 0..self.header.process_slots {
            let e = self.entry(idx)?;
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

    /// Number of live processes attached.
    pub fn alive_processes(&self) -> Result<u32> {
        Ok(self.processes()?.iter().filter(|p| p.alive).count() as u32)
    }
}
