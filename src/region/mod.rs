//! Regions: a shared, memory-mapped file that one object lives in.
//!
//! A [`Region`] is an opened, possibly still empty file: a named file
//! (by default under `/dev/shm`, which is tmpfs) or an anonymous memfd that
//! a prefork master creates before forking its workers. Objects
//! ([`Scheduler`](crate::scheduler), limiter, fair share) *bind* to it with
//! [`Region::bind`], which initialises the region on first use (race-free and
//! crash-safe, see [`create`]) or validates it, maps it, and gives a
//! [`Mapping`] with the header, the process table ([`proc_table`]) and the
//! object's area.
//!
//! Names: a name without `/` maps to `/dev/shm/shmsched.<name>`; anything
//! containing `/` is a path. Files are created `0600` unless
//! [`RegionOptions::mode`] asks for group access; world-writable modes are
//! refused, at creation and whenever an existing file is opened or bound
//! (a file `chmod`ed to `0666` later is refused, naming its mode). An
//! anonymous region's memfd gets the same mode (the kernel's default for
//! a memfd is `0777`), so another process can open it by its
//! `/proc/<pid>/fd/N` path.
//!
//! An anonymous region's memfd is sealed against shrinking
//! ([`sys::file::seal_against_shrinking`]); a named region file can be
//! truncated by anyone who can write it, and a process touching a mapped
//! page past the new end of file gets `SIGBUS` (see the README's
//! guarantees).

// The mechanism below the objects: not part of the API (hidden from the
// docs, reachable for the crate's own tests and tools; it may change in any
// release).
#[doc(hidden)]
pub mod create;
pub(crate) mod fork_lock;
#[doc(hidden)]
pub mod layout;
#[doc(hidden)]
pub mod mapping;
#[doc(hidden)]
pub mod park;
#[doc(hidden)]
pub mod proc_table;
#[doc(hidden)]
pub mod registry;
mod view;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use fork_lock::ForkSafeMutex;

#[doc(hidden)]
pub use create::{ObjectInit, ObjectSpec, TryInit, BIND_LOCK_WAIT};
pub use layout::{HeaderInfo, ObjectKind, LAYOUT_VERSION, MAX_PROCESS_SLOTS};
#[doc(hidden)]
pub use mapping::Mapping;
#[doc(hidden)]
pub use proc_table::{ObjectLock, ProcEntry, LOCK_BASE, OBJECT_LOCKS, OBJ_WORDS};
pub use proc_table::{ProcId, ProcState, ProcSummary};
pub use registry::Lease;
#[doc(hidden)]
pub use registry::SLEEPERS;
pub use view::{Probe, RegionView};

use crate::error::{Error, Result};
use crate::sys;
use crate::sys::file::OpenMode;

/// Directory where named regions live.
pub const SHM_DIR: &str = "/dev/shm";
/// Prefix of a named region's file name.
pub const NAME_PREFIX: &str = "shmsched.";
/// Longest accepted region name, in bytes.
pub const MAX_NAME_LEN: usize = 200;

/// How a region is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionOptions {
    /// Permission bits of a created file (default `0o600`). Must include
    /// owner read and write, must not be world-writable, only `0o777` bits.
    pub mode: u32,
    /// Number of process-table entries (default 128, `1..=4096`). Used when
    /// this process initialises the region; an existing region keeps its own.
    pub process_slots: u32,
}

impl Default for RegionOptions {
    fn default() -> Self {
        RegionOptions {
            mode: 0o600,
            process_slots: 128,
        }
    }
}

impl RegionOptions {
    fn validate(&self) -> Result<()> {
        if self.mode & !0o777 != 0 {
            return Err(Error::InvalidArgument(format!(
                "mode {:#o} has bits outside 0o777",
                self.mode
            )));
        }
        if self.mode & 0o002 != 0 {
            return Err(Error::InvalidArgument(format!(
                "mode {:#o} is world-writable; at most group access (0o660) is allowed",
                self.mode
            )));
        }
        if self.mode & 0o600 != 0o600 {
            return Err(Error::InvalidArgument(format!(
                "mode {:#o} lacks owner read/write (0o600), which every user of a region needs",
                self.mode
            )));
        }
        if self.process_slots == 0 || self.process_slots > MAX_PROCESS_SLOTS {
            return Err(Error::InvalidArgument(format!(
                "process_slots {} out of range 1..={MAX_PROCESS_SLOTS}",
                self.process_slots
            )));
        }
        Ok(())
    }
}

struct RegionInner {
    fd: OwnedFd,
    path: Option<PathBuf>,
    opts: RegionOptions,
    /// The mapping this process bound, shared by every object handle.
    bound: ForkSafeMutex<Weak<Mapping>>,
}

/// An opened region file (or memfd). Cheap to clone, `Send + Sync`.
#[derive(Clone)]
pub struct Region {
    inner: Arc<RegionInner>,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("path", &self.inner.path)
            .field("opts", &self.inner.opts)
            .finish_non_exhaustive()
    }
}

/// Maps a region name or path to the file path (see the module docs).
pub fn resolve_path(name_or_path: &str) -> Result<PathBuf> {
    if name_or_path.contains('\0') {
        return Err(Error::InvalidArgument(format!(
            "region name {name_or_path:?} contains a NUL byte"
        )));
    }
    if name_or_path.contains('/') {
        return Ok(PathBuf::from(name_or_path));
    }
    if name_or_path.is_empty() {
        return Err(Error::InvalidArgument("region name is empty".into()));
    }
    if name_or_path == "." || name_or_path == ".." {
        return Err(Error::InvalidArgument(format!(
            "region name {name_or_path:?} is not a file name"
        )));
    }
    if name_or_path.len() > MAX_NAME_LEN {
        return Err(Error::InvalidArgument(format!(
            "region name is {} bytes, longer than the limit of {MAX_NAME_LEN}",
            name_or_path.len()
        )));
    }
    Ok(Path::new(SHM_DIR).join(format!("{NAME_PREFIX}{name_or_path}")))
}

impl Region {
    fn from_parts(fd: OwnedFd, path: Option<PathBuf>, opts: RegionOptions) -> Region {
        Region {
            inner: Arc::new(RegionInner {
                fd,
                path,
                opts,
                bound: ForkSafeMutex::new(Weak::new()),
            }),
        }
    }

    /// Creates a new region file with default options; it must not exist.
    pub fn create(name_or_path: &str) -> Result<Region> {
        Region::create_with(name_or_path, RegionOptions::default())
    }

    /// Creates a new region file (`O_EXCL`) with `opts`; its mode is set
    /// exactly to `opts.mode` whatever the umask.
    pub fn create_with(name_or_path: &str, opts: RegionOptions) -> Result<Region> {
        opts.validate()?;
        let path = resolve_path(name_or_path)?;
        let fd = sys::file::open_file(&path, OpenMode::CreateNew, opts.mode)
            .map_err(|e| Error::io("create", Some(path.clone()), e))?;
        sys::file::fchmod(fd.as_fd(), opts.mode)
            .map_err(|e| Error::io("fchmod", Some(path.clone()), e))?;
        Ok(Region::from_parts(fd, Some(path), opts))
    }

    /// Opens an existing region file. A world-writable file is refused
    /// ([`Error::BadRegion`] naming the file and its mode).
    pub fn open(name_or_path: &str) -> Result<Region> {
        let path = resolve_path(name_or_path)?;
        let fd = sys::file::open_file(&path, OpenMode::Existing, 0)
            .map_err(|e| Error::io("open", Some(path.clone()), e))?;
        let r = Region::from_parts(fd, Some(path), RegionOptions::default());
        create::check_mode(&r, r.fd())?;
        Ok(r)
    }

    /// Opens the region file, creating it (with default options) if missing.
    pub fn open_or_create(name_or_path: &str) -> Result<Region> {
        Region::open_or_create_with(name_or_path, RegionOptions::default())
    }

    /// Opens the region file, creating it with `opts` if missing. Only a file
    /// this call created gets `opts.mode`.
    pub fn open_or_create_with(name_or_path: &str, opts: RegionOptions) -> Result<Region> {
        opts.validate()?;
        let path = resolve_path(name_or_path)?;
        // Create-or-open races with other creators and with `remove`; a few
        // rounds always settle it unless someone removes in a tight loop.
        let mut last = None;
        for _ in 0..16 {
            match sys::file::open_file(&path, OpenMode::CreateNew, opts.mode) {
                Ok(fd) => {
                    sys::file::fchmod(fd.as_fd(), opts.mode)
                        .map_err(|e| Error::io("fchmod", Some(path.clone()), e))?;
                    return Ok(Region::from_parts(fd, Some(path), opts));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(Error::io("create", Some(path), e)),
            }
            match sys::file::open_file(&path, OpenMode::Existing, 0) {
                Ok(fd) => {
                    let r = Region::from_parts(fd, Some(path), opts);
                    create::check_mode(&r, r.fd())?;
                    return Ok(r);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => last = Some(e),
                Err(e) => return Err(Error::io("open", Some(path), e)),
            }
        }
        Err(Error::io(
            "open or create",
            Some(path),
            last.unwrap_or_else(|| std::io::Error::other("file kept disappearing")),
        ))
    }

    /// An anonymous region (memfd) with default options. It has no name;
    /// share it by creating it before `fork`.
    pub fn anonymous() -> Result<Region> {
        Region::anonymous_with(RegionOptions::default())
    }

    /// An anonymous region with `opts`. The memfd gets `opts.mode` (`0600`
    /// by default; the kernel creates a memfd `0777`): only holders of its
    /// fd reach it, but a process that is handed its `/proc/<pid>/fd/N`
    /// path opens it by name, and a world-writable file is refused there
    /// as everywhere. The memfd is sealed against shrinking, so no process
    /// holding it can cut the mapping from under the others.
    pub fn anonymous_with(opts: RegionOptions) -> Result<Region> {
        opts.validate()?;
        let fd =
            sys::file::memfd_create("shmsched").map_err(|e| Error::io("memfd_create", None, e))?;
        sys::file::fchmod(fd.as_fd(), opts.mode).map_err(|e| Error::io("fchmod memfd", None, e))?;
        sys::file::seal_against_shrinking(fd.as_fd())
            .map_err(|e| Error::io("seal memfd", None, e))?;
        Ok(Region::from_parts(fd, None, opts))
    }

    /// Adopts a region descriptor handed over by another program, for
    /// example a parent that `exec`ed this one with the region's fd left
    /// open (see [`as_fd`](Region::as_fd)). The fd must be open for reading
    /// and writing on a region file or memfd; the region is then used as if
    /// opened by name (binding validates its header). Objects registered
    /// through it are this process's own: liveness locks are taken on new
    /// open file descriptions, never on the inherited one.
    ///
    /// ```no_run
    /// use std::os::fd::{FromRawFd, OwnedFd};
    /// # fn main() -> shmsched::Result<()> {
    /// // The parent passed its region's fd number in SHMSCHED_FD.
    /// let n: i32 = std::env::var("SHMSCHED_FD").unwrap().parse().unwrap();
    /// // SAFETY (for this example): the fd was inherited and nothing else owns it.
    /// let region = shmsched::region::Region::from_fd(unsafe { OwnedFd::from_raw_fd(n) })?;
    /// # let _ = region; Ok(()) }
    /// ```
    pub fn from_fd(fd: OwnedFd) -> Result<Region> {
        // An fd that is not open, or not open for reading and writing, is
        // refused now rather than at the first bind.
        let flags = sys::file::access_mode(fd.as_fd())
            .map_err(|e| Error::io("fcntl(F_GETFL) on the region fd", None, e))?;
        if flags != sys::file::AccessMode::ReadWrite {
            return Err(Error::InvalidArgument(format!(
                "the region fd is open {flags:?}; a region needs read and write access"
            )));
        }
        sys::file::file_size(fd.as_fd())
            .map_err(|e| Error::io("fstat on the region fd", None, e))?;
        Ok(Region::from_parts(fd, None, RegionOptions::default()))
    }

    /// The region's file descriptor, to hand to a program this process
    /// `exec`s (it is `O_CLOEXEC`: clear that flag in the child, between
    /// `fork` and `exec`, for the fd number it passes on), which adopts it
    /// with [`Region::from_fd`]. Never lock or close it yourself: the
    /// region's liveness locks are on other descriptions, but its `flock`s
    /// are taken on reopened copies of this one.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }

    /// Removes a named region's file. Processes that have it open keep
    /// using it; new opens fail (or create a new region).
    pub fn remove(name_or_path: &str) -> Result<()> {
        let path = resolve_path(name_or_path)?;
        sys::file::unlink(&path).map_err(|e| Error::io("unlink", Some(path), e))
    }

    /// The file's path, `None` for an anonymous region.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// The options this handle was opened with.
    pub fn options(&self) -> RegionOptions {
        self.inner.opts
    }

    /// The region's file descriptor (for `sys` calls).
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }

    /// The file's permission bits.
    pub fn mode(&self) -> Result<u32> {
        sys::file::file_mode(self.fd()).map_err(|e| Error::io("fstat", self.inner.path.clone(), e))
    }

    /// The validated header of an initialised region, `None` if no object
    /// has been created in it yet. Read under a shared lock, so never a
    /// half-written header.
    pub fn info(&self) -> Result<Option<HeaderInfo>> {
        create::info(self)
    }

    /// Maps the region and returns this process's [`Mapping`] for an object
    /// of `kind`.
    ///
    /// If the region is not (fully) initialised and `spec` is given, this
    /// initialises it under an exclusive `flock` (header first, then the
    /// zeroed process table and object area, then `spec.init`, marking it
    /// ready last), but only if the file is empty or carries our magic
    /// without the ready mark, and no live process is registered in it: a
    /// foreign file is never modified (see [`create`]). If it is
    /// initialised, validates magic, layout version, kind and sizes, and
    /// (with a spec) that the parameters and object size equal the spec's,
    /// else `Mismatch` naming both. Without a spec, an uninitialised region
    /// is `BadRegion("not initialised")`. A world-writable named file is
    /// refused; every `flock` wait is bounded by [`BIND_LOCK_WAIT`].
    ///
    /// All objects of one process bound through clones of one `Region` share
    /// one `Mapping` (one registration).
    ///
    /// Internal: objects bind through their own constructors
    /// (`Scheduler::shared`, `Limiter::shared`, `FairShare::shared`).
    #[doc(hidden)]
    pub fn bind(&self, kind: ObjectKind, spec: Option<&ObjectSpec<'_>>) -> Result<Arc<Mapping>> {
        let mut cache = self.inner.bound.lock();
        if let Some(m) = cache.upgrade() {
            create::check_against(&m.header(), kind, spec)?;
            return Ok(m);
        }
        let m = Arc::new(create::bind_new(self, kind, spec)?);
        *cache = Arc::downgrade(&m);
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_and_validate() {
        assert_eq!(
            resolve_path("pool").unwrap(),
            PathBuf::from("/dev/shm/shmsched.pool")
        );
        assert_eq!(resolve_path("/tmp/x").unwrap(), PathBuf::from("/tmp/x"));
        assert_eq!(resolve_path("./x").unwrap(), PathBuf::from("./x"));
        for bad in ["", ".", "..", "a\0b"] {
            let e = resolve_path(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{bad:?}: {e}");
        }
        assert!(resolve_path(&"a".repeat(200)).is_ok());
        let e = resolve_path(&"a".repeat(201)).unwrap_err().to_string();
        assert!(e.contains("201") && e.contains("200"), "{e}");
    }

    #[test]
    fn options_validate() {
        let ok = RegionOptions::default();
        assert!(ok.validate().is_ok());
        assert!(RegionOptions { mode: 0o660, ..ok }.validate().is_ok());
        for mode in [0o666, 0o602, 0o1600, 0o400, 0o200] {
            assert!(RegionOptions { mode, ..ok }.validate().is_err(), "{mode:o}");
        }
        for process_slots in [0, 4097] {
            assert!(RegionOptions {
                process_slots,
                ..ok
            }
            .validate()
            .is_err());
        }
    }
}
