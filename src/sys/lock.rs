//! Liveness locks and whole-file locks.
//!
//! **OFD byte locks** (`F_OFD_SETLK`/`F_OFD_GETLK`) are owned by an *open
//! file description*, not by a process or an fd number. The kernel drops
//! them when the last fd referring to that description is closed, which
//! happens at the latest when the owning process dies, however it dies
//! (SIGKILL included). That makes "is byte N locked?" a kernel-backed
//! liveness test that pid reuse and pid namespaces cannot fool. Locks past
//! the end of the file are allowed and never touch data.
//!
//! **`flock`** locks the whole file, again per open file description; the
//! region uses it around initialisation (exclusive) and validation (shared).
//! OFD locks and `flock` locks are independent on Linux.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

fn byte_lock(kind: libc::c_short, offset: u64) -> io::Result<libc::flock> {
    let start = libc::off_t::try_from(offset).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("lock offset {offset} exceeds off_t"),
        )
    })?;
    // SAFETY: `flock` is a plain C struct of integers; all-zero is a valid
    // value (and l_pid must be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start;
    fl.l_len = 1;
    Ok(fl)
}

fn fcntl_lock(fd: BorrowedFd<'_>, cmd: libc::c_int, fl: &mut libc::flock) -> io::Result<()> {
    // SAFETY: `fd` is a live descriptor for the duration of the borrow and `fl`
    // is a valid, writable `flock` struct (F_OFD_GETLK writes into it).
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), cmd, fl as *mut libc::flock) };
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Tries to take an exclusive OFD lock on one byte at `offset`, without
/// blocking. `Ok(false)` if another open file description holds a
/// conflicting lock. The fd must be open for writing.
///
/// Locking a byte that this same open file description already holds
/// succeeds (it is not a conflict).
pub fn ofd_try_lock_byte(fd: BorrowedFd<'_>, offset: u64) -> io::Result<bool> {
    let mut fl = byte_lock(libc::F_WRLCK as libc::c_short, offset)?;
    match fcntl_lock(fd, libc::F_OFD_SETLK, &mut fl) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Releases this open file description's OFD lock on the byte at `offset`
/// (a no-op if it holds none).
pub fn ofd_unlock_byte(fd: BorrowedFd<'_>, offset: u64) -> io::Result<()> {
    let mut fl = byte_lock(libc::F_UNLCK as libc::c_short, offset)?;
    fcntl_lock(fd, libc::F_OFD_SETLK, &mut fl)
}

/// True if *another* open file description holds a lock on the byte at
/// `offset` (`F_OFD_GETLK`). Locks held through `fd`'s own open file
/// description do not count, so probe with a description that holds none.
pub fn ofd_is_locked_byte(fd: BorrowedFd<'_>, offset: u64) -> io::Result<bool> {
    let mut fl = byte_lock(libc::F_WRLCK as libc::c_short, offset)?;
    fcntl_lock(fd, libc::F_OFD_GETLK, &mut fl)?;
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

fn flock_op(fd: BorrowedFd<'_>, op: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: `fd` is a live descriptor for the borrow; flock has no
        // memory effects.
        let r = unsafe { libc::flock(fd.as_raw_fd(), op) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Takes an exclusive `flock` on the whole file (blocking, retried on
/// `EINTR`).
pub fn flock_exclusive(fd: BorrowedFd<'_>) -> io::Result<()> {
    flock_op(fd, libc::LOCK_EX)
}

/// Takes a shared `flock` on the whole file (blocking, retried on `EINTR`).
pub fn flock_shared(fd: BorrowedFd<'_>) -> io::Result<()> {
    flock_op(fd, libc::LOCK_SH)
}

/// Releases this open file description's `flock`.
pub fn flock_unlock(fd: BorrowedFd<'_>) -> io::Result<()> {
    flock_op(fd, libc::LOCK_UN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::file::{memfd_create, reopen_fd};
    use std::os::fd::AsFd;

    #[test]
    fn ofd_locks_conflict_between_descriptions_only() {
        let a = memfd_create("locktest").unwrap();
        let b = reopen_fd(a.as_fd()).unwrap();
        let probe = reopen_fd(a.as_fd()).unwrap();
        let off = 1u64 << 32;
        assert!(!ofd_is_locked_byte(probe.as_fd(), off).unwrap());
        assert!(ofd_try_lock_byte(a.as_fd(), off).unwrap());
        // Same description: no conflict.
        assert!(ofd_try_lock_byte(a.as_fd(), off).unwrap());
        assert!(!ofd_is_locked_byte(a.as_fd(), off).unwrap());
        // Other descriptions see it.
        assert!(!ofd_try_lock_byte(b.as_fd(), off).unwrap());
        assert!(ofd_is_locked_byte(probe.as_fd(), off).unwrap());
        // Neighbouring byte is free.
        assert!(!ofd_is_locked_byte(probe.as_fd(), off + 1).unwrap());
        ofd_unlock_byte(a.as_fd(), off).unwrap();
        assert!(!ofd_is_locked_byte(probe.as_fd(), off).unwrap());
        assert!(ofd_try_lock_byte(b.as_fd(), off).unwrap());
        drop(b); // closing the last fd of a description drops its locks
        assert!(!ofd_is_locked_byte(probe.as_fd(), off).unwrap());
    }

    #[test]
    fn flock_shared_and_exclusive() {
        let a = memfd_create("flocktest").unwrap();
        let b = reopen_fd(a.as_fd()).unwrap();
        flock_shared(a.as_fd()).unwrap();
        flock_shared(b.as_fd()).unwrap();
        flock_unlock(a.as_fd()).unwrap();
        flock_unlock(b.as_fd()).unwrap();
        flock_exclusive(a.as_fd()).unwrap();
        flock_unlock(a.as_fd()).unwrap();
    }
}
