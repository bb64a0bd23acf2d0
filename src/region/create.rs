//! Binding: race-free, crash-safe creation and validated opening.
//!
//! # How it works
//!
//! Every bind works on its own new open file description of the region
//! (a `/proc/self/fd` reopen), so `flock` excludes other threads of this
//! process as well as other processes.
//!
//! 1. Under a shared `flock`, read the header with `pread` (no mapping yet,
//!    so a short file cannot raise `SIGBUS`). If it is ready, validate it
//!    completely (magic, version, sizes, offsets, checksum, kind, file size,
//!    and the spec's parameters), map it, done. The shared lock guarantees
//!    no initialiser is writing meanwhile, so a half-written header is never
//!    seen.
//! 2. Otherwise drop the shared lock and take the exclusive one, and look
//!    again (another process may have initialised it in between). If it is
//!    still not ready, it is empty or its initialiser died half-way (the
//!    `flock` died with it): initialise it from scratch, `ftruncate` to 0
//!    and then to the full size (so every byte is zero), write the header
//!    without the ready mark, run the object's `init` on its area, and store
//!    the ready word last with Release ordering.
//!
//! Guarantees: concurrent binders end up with one initialised region; a
//! crashed initialiser is repaired by the next binder; a foreign file (not
//! empty, not zero, without our magic) is never overwritten.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use super::layout::{self, HeaderInfo, HeaderState, ObjectKind, RawHeader, HEADER_SIZE, READY};
use super::mapping::Mapping;
use super::Region;
use crate::error::{Error, Result};
use crate::sys;

/// What an object asks of a region it binds to.
pub struct ObjectSpec<'a> {
    /// The object's kind.
    pub kind: ObjectKind,
    /// The object's parameters, compared with an existing region's.
    pub params: [u64; 8],
    /// Bytes the object needs for its state.
    pub object_size: usize,
    /// Initialises the (zeroed) object area of a new region. Runs under the
    /// exclusive lock, before the region is marked ready.
    pub init: &'a dyn Fn(&mut [u8]),
}

impl std::fmt::Debug for ObjectSpec<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectSpec")
            .field("kind", &self.kind)
            .field("params", &self.params)
            .field("object_size", &self.object_size)
            .finish_non_exhaustive()
    }
}

/// Test hook: 0 off, 1 abort after writing half the header.
static CRASH_HOOK: AtomicU32 = AtomicU32::new(0);

/// Test-only: makes this process abort half-way through writing the header
/// of the next region it initialises, to simulate a creator dying mid-way.
#[doc(hidden)]
pub fn test_crash_during_init() {
    CRASH_HOOK.store(1, Ordering::SeqCst);
}

/// Releases a `flock` on drop (explicitly, so that a copy of the fd
/// inherited by a concurrently forked child cannot keep it held).
struct FlockGuard<'a>(BorrowedFd<'a>);

impl Drop for FlockGuard<'_> {
    fn drop(&mut self) {
        let _ = sys::lock::flock_unlock(self.0);
    }
}

fn path_of(region: &Region) -> Option<PathBuf> {
    region.path().map(|p| p.to_path_buf())
}

/// Reads and validates the header (caller holds a `flock`).
pub(super) fn examine(region: &Region, fd: BorrowedFd<'_>) -> Result<HeaderState> {
    let size = sys::file::file_size(fd).map_err(|e| Error::io("fstat", path_of(region), e))?;
    let mut buf = [0u8; std::mem::size_of::<RawHeader>()];
    if size < u64::from(HEADER_SIZE) {
        if size == 0 {
            return Ok(HeaderState::Uninitialised);
        }
        // Partly written: it is ours to repair only if it is zero or carries
        // our magic (decode_and_validate reports Uninitialised for those).
        let n = (size as usize).min(buf.len());
        sys::file::read_exact_at(fd, &mut buf[..n], 0)
            .map_err(|e| Error::io("read header", path_of(region), e))?;
        return match layout::decode_and_validate(&buf, size)? {
            HeaderState::Uninitialised => Ok(HeaderState::Uninitialised),
            HeaderState::Ready(_) => Err(Error::BadRegion(format!(
                "region file is {size} bytes, smaller than its {HEADER_SIZE}-byte header"
            ))),
        };
    }
    sys::file::read_exact_at(fd, &mut buf, 0)
        .map_err(|e| Error::io("read header", path_of(region), e))?;
    layout::decode_and_validate(&buf, size)
}

/// Checks an initialised header against what the binder asked for.
pub(super) fn check_against(
    h: &HeaderInfo,
    kind: ObjectKind,
    spec: Option<&ObjectSpec<'_>>,
) -> Result<()> {
    if h.kind != kind {
        return Err(Error::Mismatch(format!(
            "the region holds a {} but a {} was asked for",
            h.kind.name(),
            kind.name()
        )));
    }
    if let Some(s) = spec {
        if s.kind != kind {
            return Err(Error::InvalidArgument(format!(
                "spec kind {} differs from bind kind {}",
                s.kind.name(),
                kind.name()
            )));
        }
        if h.params != s.params {
            return Err(Error::Mismatch(format!(
                "the region's {} has {}",
                h.kind.name(),
                describe_params(kind, &h.params, &s.params)
            )));
        }
        if h.object_size != s.object_size as u64 {
            return Err(Error::Mismatch(format!(
                "the region's {} state is {} bytes but this build's is {} bytes",
                h.kind.name(),
                h.object_size,
                s.object_size
            )));
        }
    }
    Ok(())
}

/// What each of an object kind's eight header parameters means, for
/// messages.
fn param_names(kind: ObjectKind) -> [&'static str; 8] {
    const REST: &str = "reserved parameter";
    match kind {
        ObjectKind::Scheduler => ["max", "object revision", REST, REST, REST, REST, REST, REST],
        ObjectKind::Limiter => [
            "tokens per second",
            "object revision",
            REST,
            REST,
            REST,
            REST,
            REST,
            REST,
        ],
        ObjectKind::FairShare => [
            "object revision",
            "configuration hash",
            "tenants",
            "lease slots",
            "mutex layout tag",
            "mutex size",
            "libc flavour",
            "configuration length",
        ],
    }
}

/// "max 8, asked for 9" for each parameter that differs.
fn describe_params(kind: ObjectKind, have: &[u64; 8], want: &[u64; 8]) -> String {
    let names = param_names(kind);
    let diffs: Vec<String> = (0..8)
        .filter(|&i| have[i] != want[i])
        .map(|i| format!("{} {}, asked for {}", names[i], have[i], want[i]))
        .collect();
    let rev = names.iter().position(|n| *n == "object revision");
    let hint = if rev.is_some_and(|r| have[r] != want[r]) {
        "a region made by another version of shmsched: remove it, or use another name"
    } else {
        "join the region as it is with attach, or use another region name"
    };
    format!("{} ({hint})", diffs.join("; "))
}

fn map_ready(region: &Region, h: HeaderInfo) -> Result<Mapping> {
    let len = usize::try_from(h.total_size).map_err(|_| {
        Error::BadRegion(format!(
            "total size {} does not fit in memory",
            h.total_size
        ))
    })?;
    let map = sys::file::map_shared(region.fd(), len)
        .map_err(|e| Error::io("mmap", path_of(region), e))?;
    Mapping::new(region.clone(), map, h)
}

/// Maps `region` for an object of `kind`, initialising it from `spec` if it
/// is not initialised yet (see the module docs).
pub(super) fn bind_new(
    region: &Region,
    kind: ObjectKind,
    spec: Option<&ObjectSpec<'_>>,
) -> Result<Mapping> {
    if let Some(s) = spec {
        if s.kind != kind {
            return Err(Error::InvalidArgument(format!(
                "spec kind {} differs from bind kind {}",
                s.kind.name(),
                kind.name()
            )));
        }
    }
    let lock: OwnedFd = sys::file::reopen_fd(region.fd())
        .map_err(|e| Error::io("reopen region for flock", path_of(region), e))?;
    {
        sys::lock::flock_shared(lock.as_fd())
            .map_err(|e| Error::io("flock shared", path_of(region), e))?;
        let _g = FlockGuard(lock.as_fd());
        if let HeaderState::Ready(h) = examine(region, lock.as_fd())? {
            check_against(&h, kind, spec)?;
            return map_ready(region, h);
        }
    }
    let Some(spec) = spec else {
        return Err(Error::BadRegion(
            "not initialised: no object has been created in this region yet".into(),
        ));
    };
    sys::lock::flock_exclusive(lock.as_fd())
        .map_err(|e| Error::io("flock exclusive", path_of(region), e))?;
    let _g = FlockGuard(lock.as_fd());
    if let HeaderState::Ready(h) = examine(region, lock.as_fd())? {
        check_against(&h, kind, Some(spec))?;
        return map_ready(region, h);
    }
    initialise(region, lock.as_fd(), spec)
}

/// Initialises the region from scratch (caller holds the exclusive `flock`).
fn initialise(region: &Region, fd: BorrowedFd<'_>, spec: &ObjectSpec<'_>) -> Result<Mapping> {
    let slots = region.options().process_slots;
    let (object_offset, total_size) = layout::compute_layout(slots, spec.object_size as u64)?;
    let created_at_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let h = HeaderInfo {
        kind: spec.kind,
        layout_version: layout::LAYOUT_VERSION,
        header_size: HEADER_SIZE,
        process_slots: slots,
        proc_table_offset: u64::from(HEADER_SIZE),
        object_offset,
        object_size: spec.object_size as u64,
        total_size,
        params: spec.params,
        clock_epoch_ns: sys::monotonic_ns(),
        created_at_unix_ms,
        created_pid: sys::file::getpid(),
    };
    let p = || path_of(region);
    sys::file::ftruncate(fd, 0).map_err(|e| Error::io("ftruncate", p(), e))?;
    sys::file::ftruncate(fd, total_size).map_err(|e| Error::io("ftruncate", p(), e))?;
    let bytes = layout::encode(&h, 0);
    if CRASH_HOOK.load(Ordering::SeqCst) == 1 {
        let _ = sys::file::write_all_at(fd, &bytes[..bytes.len() / 2], 0);
        std::process::abort();
    }
    sys::file::write_all_at(fd, &bytes, 0).map_err(|e| Error::io("write header", p(), e))?;
    let mapping = map_ready(region, h)?;
    // SAFETY: the object area [object_offset, object_offset + object_size) lies
    // inside the mapping (validated layout). The region is not ready, so no
    // other process uses it (binders wait on our exclusive flock, and nobody
    // can hold a mapping of a region that was never ready), and this mapping
    // is not shared with any other thread yet: the exclusive slice is unique.
    let obj = unsafe { std::slice::from_raw_parts_mut(mapping.object_ptr(), mapping.object_len()) };
    (spec.init)(obj);
    // SAFETY: READY_OFFSET (152) is inside the header page of the mapping and
    // 4-aligned (the mapping is page aligned); AtomicU32 has the layout of u32
    // and the word is only ever accessed atomically or under the flock.
    let ready = unsafe { &*(mapping.header_ptr().add(layout::READY_OFFSET) as *const AtomicU32) };
    ready.store(READY, Ordering::Release);
    Ok(mapping)
}
