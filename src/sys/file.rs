//! Region files and memfds: open, create, size, reopen, map.
//!
//! Every descriptor is opened `O_CLOEXEC`: it survives `fork` (a prefork
//! master hands its region to its workers that way) but never leaks into an
//! `exec`ed program, which could otherwise keep a liveness lock alive.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// How [`open_file`] treats a missing or existing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// The file must exist.
    Existing,
    /// The file must not exist; it is created (`O_CREAT | O_EXCL`).
    CreateNew,
}

/// Opens `path` read-write with `O_CLOEXEC` (and `O_NOFOLLOW` on creation).
/// `mode` is the permission passed to `open` on creation; the caller fixes it
/// with [`fchmod`] afterwards because the umask may have narrowed it.
pub fn open_file(path: &Path, how: OpenMode, mode: u32) -> io::Result<OwnedFd> {
    let mut o = OpenOptions::new();
    o.read(true).write(true);
    if how == OpenMode::CreateNew {
        o.create_new(true).mode(mode).custom_flags(libc::O_NOFOLLOW);
    }
    // std always adds O_CLOEXEC.
    o.open(path).map(OwnedFd::from)
}

/// Opens an existing `path` read-only with `O_CLOEXEC`, for inspectors that
/// may read a region but not write it.
pub fn open_read_only(path: &Path) -> io::Result<OwnedFd> {
    OpenOptions::new().read(true).open(path).map(OwnedFd::from)
}

/// How a descriptor was opened (its `O_ACCMODE` bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessMode {
    /// `O_RDONLY`.
    ReadOnly,
    /// `O_WRONLY`.
    WriteOnly,
    /// `O_RDWR`.
    ReadWrite,
}

/// The access mode of `fd` (`fcntl(F_GETFL) & O_ACCMODE`); fails with
/// `EBADF` for a descriptor that is not open.
pub fn access_mode(fd: BorrowedFd<'_>) -> io::Result<AccessMode> {
    // SAFETY: `fd` is live for the borrow; F_GETFL has no memory effects.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(match r & libc::O_ACCMODE {
        libc::O_RDONLY => AccessMode::ReadOnly,
        libc::O_WRONLY => AccessMode::WriteOnly,
        _ => AccessMode::ReadWrite,
    })
}

/// Creates an anonymous memory file (`memfd_create`, `MFD_CLOEXEC |
/// MFD_ALLOW_SEALING`).
///
/// It is inherited across `fork` and closed on `exec`.
pub fn memfd_create(name: &str) -> io::Result<OwnedFd> {
    let c = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "memfd name contains NUL"))?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call; the
    // flags are a valid combination.
    let fd = unsafe { libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Seals a memfd against shrinking, and its seals against change
/// (`F_ADD_SEALS`, `F_SEAL_SHRINK | F_SEAL_SEAL`): from then on no process,
/// whatever fds it holds, can cut the file under a mapping (which would
/// raise `SIGBUS` in every process touching the lost pages), or add a write
/// seal that would stop new processes from mapping it. Growing stays allowed.
pub fn seal_against_shrinking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: `fd` is live for the borrow; F_ADD_SEALS takes an int argument
    // and has no memory effects.
    let r = unsafe {
        libc::fcntl(
            fd.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Writes zeros over `[start, end)` (64 KiB at a time), without changing
/// the file's size (the range must lie inside it).
pub fn zero_range(fd: BorrowedFd<'_>, start: u64, end: u64) -> io::Result<()> {
    let zeros = vec![0u8; 64 * 1024];
    let mut at = start;
    while at < end {
        let n = (end - at).min(zeros.len() as u64) as usize;
        write_all_at(fd, &zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// The file's `(st_dev, st_ino)`: its identity on this host for as long as
/// some fd keeps it open.
pub fn file_identity(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    with_file(fd, |f| f.metadata().map(|m| (m.dev(), m.ino())))
}

/// Opens `/proc/self/fd/N` for `fd`, which yields a NEW open file description
/// of the same file (unlike `dup`, which shares the description). Works for
/// regular files, tmpfs files and memfds. Each process that registers in a
/// region needs its own description so that it owns its OFD locks alone.
///
/// Allocates nothing (the path is written into a stack buffer): a waiter's
/// backstop reap reopens the region this way, and a waiting acquire
/// allocates nothing once its queue has a spare waiter.
pub fn reopen_fd(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let path = proc_fd_path(fd.as_raw_fd());
    // SAFETY: `path` is NUL-terminated (proc_fd_path) and lives across the
    // call; `open` returns a new descriptor that nothing else owns, or -1.
    let raw = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// `/proc/self/fd/N` for `fd`, NUL-terminated, in a stack buffer (the
/// longest, for a negative i32, is 26 bytes with the NUL).
fn proc_fd_path(fd: i32) -> [u8; 32] {
    const PREFIX: &[u8] = b"/proc/self/fd/";
    let mut out = [0u8; 32];
    out[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut digits = [0u8; 11];
    let mut n = i64::from(fd).unsigned_abs();
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let mut at = PREFIX.len();
    if fd < 0 {
        out[at] = b'-';
        at += 1;
    }
    for d in digits[..len].iter().rev() {
        out[at] = *d;
        at += 1;
    }
    out
}

fn with_file<R>(fd: BorrowedFd<'_>, f: impl FnOnce(&File) -> R) -> R {
    // SAFETY: the raw fd is live for the borrow. The File is wrapped in
    // ManuallyDrop so it never closes a descriptor it does not own.
    let file = std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(fd.as_raw_fd()) });
    f(&file)
}

/// Sets the file's size (`ftruncate`); new bytes read as zero.
pub fn ftruncate(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    with_file(fd, |f| f.set_len(len))
}

/// The file's current size (`fstat`).
pub fn file_size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    with_file(fd, |f| f.metadata().map(|m| m.len()))
}

/// The file's permission bits (`fstat`, `st_mode & 0o7777`).
pub fn file_mode(fd: BorrowedFd<'_>) -> io::Result<u32> {
    use std::os::unix::fs::PermissionsExt;
    with_file(fd, |f| {
        f.metadata().map(|m| m.permissions().mode() & 0o7777)
    })
}

/// Sets the file's permission bits exactly (`fchmod`), regardless of umask.
pub fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    // SAFETY: `fd` is live for the borrow; fchmod has no memory effects.
    let r = unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Reads exactly `buf.len()` bytes at `offset` (`pread`). Fails with
/// `UnexpectedEof` if the file is shorter.
pub fn read_exact_at(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> io::Result<()> {
    with_file(fd, |f| f.read_exact_at(buf, offset))
}

/// Writes all of `buf` at `offset` (`pwrite`).
pub fn write_all_at(fd: BorrowedFd<'_>, buf: &[u8], offset: u64) -> io::Result<()> {
    with_file(fd, |f| f.write_all_at(buf, offset))
}

/// Maps `len` bytes of the file `MAP_SHARED`, read-write.
///
/// The caller must have checked that the file is at least `len` bytes long:
/// touching a mapped page past end-of-file raises `SIGBUS`.
pub fn map_shared(fd: BorrowedFd<'_>, len: usize) -> io::Result<memmap2::MmapRaw> {
    memmap2::MmapOptions::new().len(len).map_raw(&fd)
}

/// Maps `len` bytes of the file `MAP_SHARED`, read-only (`PROT_READ`): the
/// pages other processes write are seen, and nothing can be written through
/// this mapping (a write faults). The fd may be read-only.
///
/// As for [`map_shared`], the caller must have checked the file's size.
pub fn map_shared_read_only(fd: BorrowedFd<'_>, len: usize) -> io::Result<memmap2::Mmap> {
    // SAFETY: memmap2 marks `map` unsafe because the file may change under
    // the mapping; a region is shared memory that other processes write by
    // design, and this mapping is only ever read through atomic loads (the
    // caller, `region::view`, never forms a plain reference to bytes that
    // others mutate).
    unsafe { memmap2::MmapOptions::new().len(len).map(&fd) }
}

/// Removes a file name (`unlink`).
pub fn unlink(path: &Path) -> io::Result<()> {
    std::fs::remove_file(path)
}

/// This process's id (`getpid`).
pub fn getpid() -> i32 {
    std::process::id() as i32
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn text(p: &[u8; 32]) -> &str {
        let end = p.iter().position(|&b| b == 0).expect("NUL-terminated");
        std::str::from_utf8(&p[..end]).unwrap()
    }

    #[test]
    fn proc_fd_paths_for_every_width() {
        for fd in [0, 7, 10, 99, 1_000, 65_535, i32::MAX, -1, i32::MIN] {
            assert_eq!(text(&proc_fd_path(fd)), format!("/proc/self/fd/{fd}"));
        }
    }

    #[test]
    fn reopen_is_a_new_description_of_the_same_file() {
        let f = tempfile_in_shm();
        let again = reopen_fd(f.as_fd()).expect("reopen");
        assert_eq!(
            file_identity(f.as_fd()).unwrap(),
            file_identity(again.as_fd()).unwrap()
        );
        // A new description: its offset is its own.
        use std::io::{Seek, SeekFrom};
        let mut a = File::from(f);
        let mut b = File::from(again);
        a.seek(SeekFrom::Start(5)).unwrap();
        assert_eq!(b.stream_position().unwrap(), 0);
        // SAFETY: F_GETFD on a descriptor this test owns.
        let flags = unsafe { libc::fcntl(b.as_raw_fd(), libc::F_GETFD) };
        assert_ne!(flags & libc::FD_CLOEXEC, 0, "O_CLOEXEC");
    }

    fn tempfile_in_shm() -> OwnedFd {
        let path = format!("/dev/shm/shmsched-file-test-{}", std::process::id());
        let fd = open_file(Path::new(&path), OpenMode::CreateNew, 0o600).unwrap();
        let _ = std::fs::remove_file(&path);
        fd
    }
}
