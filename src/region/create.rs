//! Binding: race-free, crash-safe creation and validated opening.
//!
//! # How it works
//!
//! Every bind works on its own new open file description of the region
//! (a `/proc/self/fd` reopen, recorded in the fork table so that a child
//! forked meanwhile cannot keep its `flock` alive), so `flock` excludes
//! other threads of this process as well as other processes. Every `flock`
//! wait is bounded ([`BIND_LOCK_WAIT`]).
//!
//! 1. Under a shared `flock`, read the header with `pread` (no mapping yet,
//!    so a short file cannot raise `SIGBUS`). If it is ready, validate it
//!    completely (magic, version, sizes, offsets, checksum, kind, file size,
//!    and the spec's parameters), map it, done. The shared lock guarantees
//!    no initialiser is writing meanwhile, so a half-written header is never
//!    seen.
//! 2. Otherwise drop the shared lock and take the exclusive one, and look
//!    again (another process may have initialised it in between). If it is
//!    still not ready, it is ours to initialise only if it is **empty** or
//!    **carries our magic without the ready mark** (an initialiser died
//!    half-way: the `flock` died with it). Anything else is a foreign file
//!    and is never written. A file with our magic but live processes
//!    registered in it (its ready mark was scribbled) is refused too:
//!    re-initialising would wipe state that live processes use.
//! 3. Initialising writes the header (magic, no ready mark) *first*, then
//!    zeroes everything after it and sizes the file, runs the object's
//!    `init` on its area, and stores the ready word last with Release
//!    ordering. So at every instant the file is empty, or carries our magic:
//!    a creator killed at any point leaves a file the next binder recognises
//!    as its own and initialises again. An `init` that fails leaves the
//!    region without its ready mark (and the next binder tries again).
//!
//! Guarantees: concurrent binders end up with one initialised region; a
//! crashed initialiser is repaired by the next binder; a foreign file (not
//! empty and without our magic) is never modified; a named region file
//! that is world-writable is refused.

use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::layout::{
    self, HeaderInfo, HeaderState, ObjectKind, RawHeader, HEADER_SIZE, MAGIC, MAX_PROCESS_SLOTS,
    READY,
};
use super::mapping::Mapping;
use super::proc_table::LOCK_BASE;
use super::Region;
use crate::error::{Error, Result};
use crate::sys;
use crate::sys::fork::LockFd;

/// Longest a bind (or [`Region::info`]) waits for another process's
/// `flock` on the region file: an initialisation takes milliseconds, so a
/// lock held longer belongs to a stopped or hostile process, and the bind
/// fails with an error naming the file instead of hanging.
pub const BIND_LOCK_WAIT: Duration = Duration::from_secs(10);

/// How an object initialises its (zeroed) area in a new region. Any
/// `Fn(&mut [u8])` closure is one (it cannot fail); wrap a closure returning
/// a [`Result`] in [`TryInit`] to report a failure, which leaves the region
/// unmarked (not ready) and fails the bind with that error.
pub trait ObjectInit {
    /// Initialises `area`, which is zeroed and `object_size` bytes long.
    fn init(&self, area: &mut [u8]) -> Result<()>;
}

impl<F: Fn(&mut [u8])> ObjectInit for F {
    fn init(&self, area: &mut [u8]) -> Result<()> {
        self(area);
        Ok(())
    }
}

/// A fallible object initialiser (see [`ObjectInit`]).
pub struct TryInit<F>(pub F);

impl<F: Fn(&mut [u8]) -> Result<()>> ObjectInit for TryInit<F> {
    fn init(&self, area: &mut [u8]) -> Result<()> {
        (self.0)(area)
    }
}

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
    pub init: &'a dyn ObjectInit,
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

/// Test hook: 0 off; 1 abort after writing half the header; 2 abort after
/// the whole header (before sizing); 3 abort after sizing (before the
/// object's init); 4 abort after the object's init (before the ready mark).
static CRASH_HOOK: AtomicU32 = AtomicU32::new(0);

/// Test-only: makes this process abort half-way through writing the header
/// of the next region it initialises, to simulate a creator dying mid-way.
#[doc(hidden)]
pub fn test_crash_during_init() {
    CRASH_HOOK.store(1, Ordering::SeqCst);
}

/// Test-only: makes this process abort at `step` (1 to 4, see the source)
/// of the next initialisation.
#[doc(hidden)]
pub fn test_crash_during_init_at(step: u32) {
    CRASH_HOOK.store(step, Ordering::SeqCst);
}

fn crash_point(step: u32) {
    if CRASH_HOOK.load(Ordering::SeqCst) == step {
        std::process::abort();
    }
}

/// Releases a `flock` on drop (explicitly, so that the lock goes at once
/// even if the fd lives on a little).
struct FlockGuard<'a>(BorrowedFd<'a>);

impl Drop for FlockGuard<'_> {
    fn drop(&mut self) {
        let _ = sys::lock::flock_unlock(self.0);
    }
}

fn path_of(region: &Region) -> Option<PathBuf> {
    region.path().map(|p| p.to_path_buf())
}

/// A region's name for messages: its path, or "anonymous region".
pub(super) fn display_name(region: &Region) -> String {
    region.path().map_or_else(
        || "anonymous region".to_string(),
        |p| format!("region file {}", p.display()),
    )
}

/// Refuses a named region file that is world-writable (a memfd's mode means
/// nothing: only holders of its fd can reach it).
pub(super) fn check_mode(region: &Region, fd: BorrowedFd<'_>) -> Result<()> {
    let Some(path) = region.path() else {
        return Ok(());
    };
    let mode = sys::file::file_mode(fd).map_err(|e| Error::io("fstat", path_of(region), e))?;
    if mode & 0o002 != 0 {
        return Err(Error::BadRegion(format!(
            "region file {} has mode {mode:#o}, which is world-writable: any local user could \
             corrupt it or deny service to its processes; refusing it (at most group access, \
             0o660, is allowed: chmod o-w to use it)",
            path.display()
        )));
    }
    Ok(())
}

/// Opens a new open file description of the region for `flock`, recorded in
/// the fork table, and checks the file's mode through it.
fn lock_fd(region: &Region) -> Result<LockFd> {
    let fd = LockFd::open(|| sys::file::reopen_fd(region.fd()))
        .map_err(|e| Error::io("reopen region for flock", path_of(region), e))?;
    check_mode(region, fd.fd())?;
    Ok(fd)
}

/// Takes `flock` (shared or exclusive) within [`BIND_LOCK_WAIT`].
fn flock(region: &Region, fd: BorrowedFd<'_>, exclusive: bool) -> Result<()> {
    sys::lock::flock_wait(fd, exclusive, BIND_LOCK_WAIT).map_err(|e| {
        if e.kind() == std::io::ErrorKind::TimedOut {
            Error::BadRegion(format!(
                "{} is locked by another process for more than {} s (an initialisation \
                 that is stuck, or a process holding its flock): {e}",
                display_name(region),
                BIND_LOCK_WAIT.as_secs()
            ))
        } else {
            Error::io("flock", path_of(region), e)
        }
    })
}

/// The header bytes of a file that is not (or not yet) a ready region: is
/// it ours to initialise? Yes if they are a prefix of our magic (a header
/// write cut short) or carry our magic (an initialiser that died before the
/// ready mark).
fn carries_our_magic(bytes: &[u8]) -> bool {
    let magic = MAGIC.to_le_bytes();
    let n = bytes.len().min(magic.len());
    n > 0 && bytes[..n] == magic[..n]
}

/// Reads and validates the header (caller holds a `flock`).
pub(super) fn examine(region: &Region, fd: BorrowedFd<'_>) -> Result<HeaderState> {
    let size = sys::file::file_size(fd).map_err(|e| Error::io("fstat", path_of(region), e))?;
    if size == 0 {
        return Ok(HeaderState::Uninitialised);
    }
    let mut buf = [0u8; std::mem::size_of::<RawHeader>()];
    let n = (size.min(buf.len() as u64)) as usize;
    sys::file::read_exact_at(fd, &mut buf[..n], 0)
        .map_err(|e| Error::io("read header", path_of(region), e))?;
    if !carries_our_magic(&buf[..n]) {
        // Printed as `stat` prints it (the header's first word), so the same
        // file reads the same in every command.
        let first = match <[u8; 8]>::try_from(&buf[..n.min(8)]) {
            Ok(word) => format!("{:#018x}", u64::from_le_bytes(word)),
            Err(_) => buf[..n].iter().map(|b| format!("{b:02x}")).collect(),
        };
        return Err(Error::BadRegion(format!(
            "bad magic {first} (expected {:#018x}, \"SHMSCHED\"): {} is {size} bytes long and not a \
             shmsched region; refusing to touch it (only an empty file, or a region whose \
             initialisation was interrupted, is ever initialised)",
            super::layout::MAGIC,
            display_name(region)
        )));
    }
    if n < buf.len() {
        // Shorter than the header itself: a header write cut short, ours to
        // repair (a ready region is never this short).
        return Ok(HeaderState::Uninitialised);
    }
    layout::decode_and_validate(&buf, size)
}

/// Checks an initialised header against what the binder asked for.
pub(super) fn check_against(
    h: &HeaderInfo,
    kind: ObjectKind,
    spec: Option<&ObjectSpec<'_>>,
) -> Result<()> {
    if h.kind != kind {
        return Err(Error::WrongKind {
            found: h.kind,
            expected: kind,
        });
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
            "tokens per second at creation",
            "object revision",
            "capacity at creation",
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

/// The validated header of `region`, `None` if it is not initialised (see
/// [`Region::info`]).
pub(super) fn info(region: &Region) -> Result<Option<HeaderInfo>> {
    let lock = lock_fd(region)?;
    flock(region, lock.fd(), false)?;
    let _g = FlockGuard(lock.fd());
    match examine(region, lock.fd())? {
        HeaderState::Ready(h) => Ok(Some(h)),
        HeaderState::Uninitialised => Ok(None),
    }
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
    let lock = lock_fd(region)?;
    {
        flock(region, lock.fd(), false)?;
        let _g = FlockGuard(lock.fd());
        if let HeaderState::Ready(h) = examine(region, lock.fd())? {
            check_against(&h, kind, spec)?;
            return map_ready(region, h);
        }
    }
    let Some(spec) = spec else {
        return Err(Error::BadRegion(
            "not initialised: no object has been created in this region yet".into(),
        ));
    };
    flock(region, lock.fd(), true)?;
    let _g = FlockGuard(lock.fd());
    if let HeaderState::Ready(h) = examine(region, lock.fd())? {
        check_against(&h, kind, Some(spec))?;
        return map_ready(region, h);
    }
    initialise(region, lock.fd(), spec)
}

/// Initialises the region from scratch (caller holds the exclusive `flock`
/// and has checked that the file is empty or carries our magic without the
/// ready mark).
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
    let size = sys::file::file_size(fd).map_err(|e| Error::io("fstat", p(), e))?;
    if size > 0 {
        // Our magic without the ready mark. A dead initialiser's, unless live
        // processes are registered: then the mark was scribbled away and
        // re-initialising would wipe what they use. (Our own descriptions'
        // locks count too: `fd` holds none, so it can probe.)
        let live = sys::lock::ofd_is_locked_range(fd, LOCK_BASE, u64::from(MAX_PROCESS_SLOTS))
            .map_err(|e| Error::io("probe liveness locks", p(), e))?;
        if live {
            return Err(Error::BadRegion(format!(
                "{} carries no ready mark but live processes are registered in it (its header \
                 was overwritten); refusing to re-initialise a region in use",
                display_name(region)
            )));
        }
    }
    // The header first (magic, no ready mark): from here on the file always
    // carries our magic, so a crash anywhere below leaves it recognisable.
    let bytes = layout::encode(&h, 0);
    if CRASH_HOOK.load(Ordering::SeqCst) == 1 {
        let _ = sys::file::write_all_at(fd, &bytes[..bytes.len() / 2], 0);
        std::process::abort();
    }
    sys::file::write_all_at(fd, &bytes, 0).map_err(|e| Error::io("write header", p(), e))?;
    crash_point(2);
    // Zero everything after the header that an earlier attempt left, then
    // size the file (new bytes read as zero).
    let header_len = bytes.len() as u64;
    if size > header_len {
        match sys::file::ftruncate(fd, header_len) {
            Ok(()) => {}
            // A memfd sealed against shrinking: overwrite instead.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                if size > total_size {
                    return Err(Error::BadRegion(format!(
                        "{} is {size} bytes, sealed against shrinking, and cannot be \
                         re-initialised to {total_size} bytes",
                        display_name(region)
                    )));
                }
                sys::file::zero_range(fd, header_len, size)
                    .map_err(|e| Error::io("zero region", p(), e))?;
            }
            Err(e) => return Err(Error::io("ftruncate", p(), e)),
        }
    }
    sys::file::ftruncate(fd, total_size).map_err(|e| Error::io("ftruncate", p(), e))?;
    crash_point(3);
    let mapping = map_ready(region, h)?;
    // SAFETY: the object area [object_offset, object_offset + object_size) lies
    // inside the mapping (validated layout). The region is not ready, so no
    // other process uses it (binders wait on our exclusive flock, and nobody
    // can hold a mapping of a region that was never ready, nor is anyone
    // registered: checked above), and this mapping is not shared with any
    // other thread yet: the exclusive slice is unique.
    let obj = unsafe { std::slice::from_raw_parts_mut(mapping.object_ptr(), mapping.object_len()) };
    spec.init.init(obj)?;
    crash_point(4);
    // SAFETY: READY_OFFSET (152) is inside the header page of the mapping and
    // 4-aligned (the mapping is page aligned); AtomicU32 has the layout of u32
    // and the word is only ever accessed atomically or under the flock.
    let ready = unsafe { &*(mapping.header_ptr().add(layout::READY_OFFSET) as *const AtomicU32) };
    ready.store(READY, Ordering::Release);
    Ok(mapping)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_prefixes_are_ours_and_nothing_else() {
        let m = MAGIC.to_le_bytes();
        assert!(carries_our_magic(&m[..1]));
        assert!(carries_our_magic(&m[..5]));
        assert!(carries_our_magic(&[&m[..], &[0u8; 100][..]].concat()));
        assert!(!carries_our_magic(&[]));
        assert!(!carries_our_magic(&[0u8; 160]));
        assert!(!carries_our_magic(b"SHMSCHEX"));
        assert!(!carries_our_magic(b"XHMSCHED"));
    }

    #[test]
    fn fallible_init_reports_its_error() {
        let ok = |_: &mut [u8]| {};
        let bad = TryInit(|_: &mut [u8]| Err(Error::InvalidArgument("no".into())));
        let mut b = [0u8; 4];
        let inits: [&dyn ObjectInit; 2] = [&ok, &bad];
        assert!(inits[0].init(&mut b).is_ok());
        assert!(inits[1].init(&mut b).is_err());
    }
}
