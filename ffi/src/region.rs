//! `shmsched_region`: a shared file (named, under `/dev/shm` by default) or
//! an anonymous memfd that one object lives in.
//!
//! Anonymous regions and regions opened from a descriptor keep a
//! descriptor of their own (`fd`) so that `shmsched_region_dup_fd` can hand
//! one to a program the caller `exec`s (the library's `Region` takes its
//! liveness locks on open file descriptions of its own).

use std::ffi::c_char;
use std::fs::File;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

use shmsched::region::{Region, RegionOptions};
use shmsched::Error;

use crate::face::{self, close_box, ffi, new_handle, try_out, try_ref, try_text, Out};
use crate::status::{shmsched_status, Fail};
use crate::SHMSCHED_ABI_VERSION;

/// A region handle (opaque). Made by `shmsched_region_create`, `_open`,
/// `_open_or_create`, `_anonymous` or `_open_fd`; closed by
/// `shmsched_region_close`. Objects bound to it (schedulers, limiters,
/// fair shares) keep the mapping alive on their own: the region handle may
/// be closed before them.
///
/// Threads: every call may be made from any thread, concurrently (except
/// `_close`, which must be the last call on it). Fork: a region handle
/// works in a forked child, which registers in the region as a process of
/// its own when it binds an object (this is how a prefork master shares an
/// anonymous region with its workers).
pub struct shmsched_region {
    region: Region,
    /// Our own descriptor of the file, for anonymous and fd-opened regions.
    fd: Option<OwnedFd>,
}

/// What kind of object a region holds.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum shmsched_kind {
    /// Not initialised yet: the first object bound to it decides.
    None = 0,
    /// A Scheduler.
    Scheduler = 1,
    /// A Limiter.
    Limiter = 2,
    /// A FairShare ledger.
    FairShare = 3,
}

impl shmsched_region {
    fn new(region: Region, fd: Option<OwnedFd>) -> shmsched_region {
        shmsched_region { region, fd }
    }

    /// How messages name this region.
    fn label(&self) -> String {
        match (&self.fd, self.region.path()) {
            (Some(_), _) => "the anonymous region".into(),
            (None, Some(p)) => format!("region {}", p.display()),
            (None, None) => "the region".into(),
        }
    }

    /// Fails with `VersionMismatch` if the region was written with another
    /// layout version (other header problems surface when an object binds).
    fn check_version(&self) -> Result<(), Fail> {
        match self.region.info() {
            Err(e @ Error::VersionMismatch { .. }) => Err(self.fail(e)),
            _ => Ok(()),
        }
    }

    /// Binds an object with `f`; a wrong kind and another layout version
    /// come back as their own statuses (the library's typed errors).
    pub(crate) fn bind<T>(
        &self,
        f: impl FnOnce(&Region) -> shmsched::Result<T>,
    ) -> Result<T, Fail> {
        f(&self.region).map_err(|e| self.fail(e))
    }

    /// A library error as a status, naming this region and the C ABI
    /// version where the layout version is the problem.
    #[cold]
    fn fail(&self, e: Error) -> Fail {
        match e {
            Error::VersionMismatch { found, expected } => Fail::new(
                shmsched_status::VersionMismatch,
                format!(
                    "bad region: {} has layout version {found}, and this library (C ABI version \
                     {SHMSCHED_ABI_VERSION}) reads layout version {expected}",
                    self.label()
                ),
            ),
            e => Fail::from(e),
        }
    }
}

fn options(mode: u32, process_slots: u32) -> RegionOptions {
    let d = RegionOptions::default();
    RegionOptions {
        mode: if mode == 0 { d.mode } else { mode },
        process_slots: if process_slots == 0 {
            d.process_slots
        } else {
            process_slots
        },
    }
}

fn finish(region: Region, fd: Option<OwnedFd>, out: Out<*mut shmsched_region>) -> Result<(), Fail> {
    let r = shmsched_region::new(region, fd);
    r.check_version()?;
    new_handle(out, r)
}

/// Creates a new region file (it must not exist) and opens it.
///
/// `name` is a name (mapped to `/dev/shm/shmsched.<name>`) or a path (any
/// string containing `/`). `mode` is the file's permission bits (0 for the
/// default 0600; at most group access, never world-writable);
/// `process_slots` the size of its process table (0 for the default 128;
/// 1..=4096).
///
/// Errors: `NULL_ARGUMENT`, `INVALID_ARGUMENT`, `ALREADY_EXISTS`,
/// `NOT_FOUND` (a directory of the path does not exist), `IO`. Threads:
/// any. Fork: see `shmsched_region`.
///
/// # Safety
///
/// `name` must be NULL or a NUL-terminated string; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_region_create(
    name: *const c_char,
    mode: u32,
    process_slots: u32,
    out: *mut *mut shmsched_region,
) -> shmsched_status {
    ffi! {
        let (name, out) = (try_text!(name), try_out!(out));
        finish(Region::create_with(name, options(mode, process_slots))?, None, out)
    }
}

/// Opens an existing region file (see `shmsched_region_create` for
/// `name`). A region written with another layout version is refused here
/// (`SHMSCHED_STATUS_VERSION_MISMATCH`).
///
/// Errors: `NULL_ARGUMENT`, `INVALID_ARGUMENT`, `NOT_FOUND`,
/// `VERSION_MISMATCH`, `BAD_REGION` (the file is world-writable, or its
/// header is not a region's), `IO`. Threads: any. Fork: see
/// `shmsched_region`.
///
/// # Safety
///
/// `name` must be NULL or a NUL-terminated string; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_region_open(
    name: *const c_char,
    out: *mut *mut shmsched_region,
) -> shmsched_status {
    ffi! {
        let (name, out) = (try_text!(name), try_out!(out));
        finish(Region::open(name)?, None, out)
    }
}

/// Opens the region file, creating it with `mode` and `process_slots` (0
/// for the defaults, see `shmsched_region_create`) if it does not exist.
/// Race-free: every process may call this with the same name.
///
/// Errors: `NULL_ARGUMENT`, `INVALID_ARGUMENT`, `NOT_FOUND` (a directory
/// of the path does not exist), `VERSION_MISMATCH`, `BAD_REGION` (an
/// existing file is world-writable, or its header is not a region's),
/// `IO`. Threads: any. Fork: see `shmsched_region`.
///
/// # Safety
///
/// `name` must be NULL or a NUL-terminated string; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_region_open_or_create(
    name: *const c_char,
    mode: u32,
    process_slots: u32,
    out: *mut *mut shmsched_region,
) -> shmsched_status {
    ffi! {
        let (name, out) = (try_text!(name), try_out!(out));
        finish(Region::open_or_create_with(name, options(mode, process_slots))?, None, out)
    }
}

/// Creates an anonymous region (a memfd) with `process_slots` entries (0 for
/// the default 128). It has no name: a prefork master creates it before
/// forking its workers, which inherit the handle; a program started with
/// `exec` gets it through `shmsched_region_dup_fd` and
/// `shmsched_region_open_fd`.
///
/// Errors: `NULL_ARGUMENT`, `INVALID_ARGUMENT`, `IO`. Threads: any. Fork:
/// see `shmsched_region`.
///
/// # Safety
///
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_region_anonymous(
    process_slots: u32,
    out: *mut *mut shmsched_region,
) -> shmsched_status {
    ffi! {
        let out = try_out!(out);
        let region = Region::anonymous_with(options(0, process_slots))?;
        // Our own descriptor of the memfd, for `shmsched_region_dup_fd`.
        let fd = region.as_fd().try_clone_to_owned().map_err(|e| Fail::io("dup", e))?;
        finish(region, Some(fd), out)
    }
}

/// Opens the region behind the descriptor `fd` (from
/// `shmsched_region_dup_fd` in the process that started this one, or any
/// descriptor of a region file). The handle keeps its own duplicate: the
/// caller still owns `fd` and may close it after the call.
///
/// Errors: `INVALID_ARGUMENT` (negative, not open, not a regular file),
/// `NULL_ARGUMENT`, `VERSION_MISMATCH`, `IO`. Threads: any. Fork: see
/// `shmsched_region`.
///
/// # Safety
///
/// `out` must be NULL or writable. `fd` may be any integer.
#[no_mangle]
pub unsafe extern "C" fn shmsched_region_open_fd(
    fd: i32,
    out: *mut *mut shmsched_region,
) -> shmsched_status {
    ffi! {
        let out = try_out!(out);
        let own = dup_checked(fd)?;
        let keep = own.try_clone().map_err(|e| Fail::io("dup", e))?;
        finish(Region::from_fd(own)?, Some(keep), out)
    }
}

/// Duplicates a caller's descriptor after checking that it is an open
/// regular file (a memfd is one).
fn dup_checked(fd: RawFd) -> Result<OwnedFd, Fail> {
    if fd < 0 {
        return Err(Fail::invalid(format!(
            "descriptor {fd} is negative: expected an open descriptor of a region file"
        )));
    }
    // SAFETY: F_GETFD only reads the descriptor table; any integer is a
    // valid argument.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(Fail::invalid(format!(
            "descriptor {fd} is not open in this process"
        )));
    }
    // SAFETY: `fd` is open (checked just above); the borrow lasts only for
    // the duplication below. (Another thread closing it meanwhile would make
    // the dup fail, not read freed memory.)
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let own = borrowed
        .try_clone_to_owned()
        .map_err(|e| Fail::io("dup", e))?;
    let file = File::from(own);
    let meta = file.metadata().map_err(|e| Fail::io("fstat", e))?;
    if !meta.is_file() {
        return Err(Fail::invalid(format!(
            "descriptor {fd} is not a regular file (nor a memfd), so it cannot be a region"
        )));
    }
    Ok(OwnedFd::from(file))
}

/// Writes to `*out_fd` a new descriptor of an anonymous (or fd-opened)
/// region, without close-on-exec, owned by the caller: pass its number to a
/// program you `exec` (an argument or an environment variable), which opens
/// it with `shmsched_region_open_fd`; close it in the parent once the child
/// started. A named region has no such descriptor
/// (`SHMSCHED_STATUS_INVALID_ARGUMENT`): pass its name instead.
///
/// Errors: `NULL_ARGUMENT`, `INVALID_ARGUMENT`, `IO`. Threads: any (other
/// threads that `fork`+`exec` meanwhile inherit the descriptor too; close
/// it promptly). Fork: works in a forked child.
///
/// # Safety
///
/// `region` must be NULL or an open region handle; `out_fd` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_region_dup_fd(
    region: *const shmsched_region,
    out_fd: *mut i32,
) -> shmsched_status {
    ffi! {
        let (r, out) = (try_ref!(region), try_out!(out_fd));
        let Some(fd) = &r.fd else {
            return Err(Fail::invalid(format!(
                "{} is named: pass its name to the other program (shmsched_region_open) instead of a descriptor",
                r.label()
            )));
        };
        // SAFETY: F_DUPFD on a descriptor this handle owns; the result is a
        // new descriptor (without FD_CLOEXEC) that we hand to the caller.
        let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD, 0) };
        if dup < 0 {
            return Err(Fail::io("dup", std::io::Error::last_os_error()));
        }
        out.set(dup)
    }
}

/// Removes a named region's file (see `shmsched_region_create` for
/// `name`). Processes that have it open keep using it; later opens fail (or
/// create a new region).
///
/// Errors: `NULL_ARGUMENT`, `INVALID_ARGUMENT`, `NOT_FOUND`, `IO`. Threads:
/// any. Fork: no state.
///
/// # Safety
///
/// `name` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn shmsched_region_remove(name: *const c_char) -> shmsched_status {
    ffi!(Region::remove(try_text!(name))?)
}

/// What a region's header says. Before the call set `size` to
/// `sizeof(shmsched_region_info)`; on return it holds the bytes filled.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct shmsched_region_info {
    /// In: the caller's `sizeof`. Out: the bytes filled.
    pub size: u32,
    /// A `SHMSCHED_KIND_*` value; `SHMSCHED_KIND_NONE` if no object was
    /// created in it yet (then the other fields are 0).
    pub kind: u32,
    /// The region's layout version.
    pub layout_version: u32,
    /// Entries in its process table.
    pub process_slots: u32,
    /// Bytes of the whole file.
    pub total_size: u64,
    /// Wall-clock creation time, ms since the Unix epoch.
    pub created_at_unix_ms: u64,
    /// Pid of the process that initialised it (informational).
    pub created_pid: i32,
    /// Zero.
    pub reserved: u32,
}

const _: () = assert!(std::mem::size_of::<shmsched_region_info>() == 4 * 4 + 8 * 2 + 4 * 2);

/// Fills `*out` from the region's validated header (read under a shared
/// lock, so never half-written).
///
/// Errors: `NULL_ARGUMENT`, `INVALID_ARGUMENT` (`out->size` below 8),
/// `BAD_REGION`, `VERSION_MISMATCH`, `IO`. Threads: any. Fork: works in a
/// child.
///
/// # Safety
///
/// `region` must be NULL or an open region handle; `out` NULL or valid for
/// reads of its `size` field and writes of `out->size` bytes.
#[no_mangle]
pub unsafe extern "C" fn shmsched_region_get_info(
    region: *const shmsched_region,
    out: *mut shmsched_region_info,
) -> shmsched_status {
    ffi! {
        let r = try_ref!(region);
        let info = match r.region.info() {
            Ok(Some(h)) => shmsched_region_info {
                size: 0,
                kind: h.kind as u32,
                layout_version: h.layout_version,
                process_slots: h.process_slots,
                total_size: h.total_size,
                created_at_unix_ms: h.created_at_unix_ms,
                created_pid: h.created_pid,
                reserved: 0,
            },
            Ok(None) => shmsched_region_info::default(),
            Err(e) => return Err(r.fail(e)),
        };
        // SAFETY: the caller's contract; the struct has no padding.
        unsafe { face::write_sized(out, info, |i, n| i.size = n) }
    }
}

/// Closes the region handle. Objects bound through it keep working. NULL
/// does nothing.
///
/// Threads: must be the last call on the handle. Fork: closing in a child
/// closes the child's copy only.
///
/// # Safety
///
/// `region` must be NULL or an open region handle, not used again.
#[no_mangle]
pub unsafe extern "C" fn shmsched_region_close(region: *mut shmsched_region) {
    // SAFETY: the caller's contract: NULL or a handle from `finish`, not
    // used again.
    unsafe { close_box(region) }
}
