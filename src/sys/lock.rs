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
//!
//! Every wait here is bounded: another process can hold a lock on a file it
//! can open for as long as it likes, so [`flock_wait`] and
//! [`ofd_lock_byte_wait`] poll a non-blocking attempt with a growing nap
//! (1 ms up to 32 ms) until a deadline, and report `TimedOut` after it.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

fn range_lock(kind: libc::c_short, offset: u64, len: u64) -> io::Result<libc::flock> {
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
    fl.l_len = libc::off_t::try_from(len).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("lock length {len} exceeds off_t"),
        )
    })?;
    Ok(fl)
}

fn byte_lock(kind: libc::c_short, offset: u64) -> io::Result<libc::flock> {
    range_lock(kind, offset, 1)
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

/// True if another open file description holds a lock on any byte of
/// `[offset, offset + len)` (`F_OFD_GETLK` over the range; one syscall).
pub fn ofd_is_locked_range(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<bool> {
    let mut fl = range_lock(libc::F_WRLCK as libc::c_short, offset, len)?;
    fcntl_lock(fd, libc::F_OFD_GETLK, &mut fl)?;
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

/// Polls `attempt` (which returns `Ok(true)` once it holds the lock) with
/// naps growing from 1 ms to 32 ms until `timeout` has passed; then fails
/// with `TimedOut`, naming `what`.
fn wait_for(
    what: &str,
    timeout: Duration,
    mut attempt: impl FnMut() -> io::Result<bool>,
) -> io::Result<()> {
    let start = Instant::now();
    let mut nap = Duration::from_millis(1);
    loop {
        if attempt()? {
            return Ok(());
        }
        let spent = start.elapsed();
        if spent >= timeout {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{what} held by another process for more than {} ms",
                    timeout.as_millis()
                ),
            ));
        }
        std::thread::sleep(nap.min(timeout - spent));
        nap = (nap * 2).min(Duration::from_millis(32));
    }
}

/// Takes an exclusive OFD lock on the byte at `offset`, waiting at most
/// `timeout` for another open file description to release it
/// (`TimedOut` after that).
pub fn ofd_lock_byte_wait(fd: BorrowedFd<'_>, offset: u64, timeout: Duration) -> io::Result<()> {
    wait_for("a byte lock", timeout, || ofd_try_lock_byte(fd, offset))
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

/// Takes a `flock` on the whole file, exclusive or shared, waiting at most
/// `timeout` for conflicting holders (`TimedOut` after that).
pub fn flock_wait(fd: BorrowedFd<'_>, exclusive: bool, timeout: Duration) -> io::Result<()> {
    let op = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    } | libc::LOCK_NB;
    let what = if exclusive {
        "an exclusive flock"
    } else {
        "a conflicting flock"
    };
    wait_for(what, timeout, || match flock_op(fd, op) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Ok(false),
        Err(e) => Err(e),
    })
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
    fn flock_shared_and_exclusive_and_bounded() {
        let t = Duration::from_secs(5);
        let a = memfd_create("flocktest").unwrap();
        let b = reopen_fd(a.as_fd()).unwrap();
        flock_wait(a.as_fd(), false, t).unwrap();
        flock_wait(b.as_fd(), false, t).unwrap();
        // An exclusive lock waits for the shared holders, then gives up.
        let e = flock_wait(a.as_fd(), true, Duration::from_millis(20)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(e.to_string().contains("20 ms"), "{e}");
        flock_unlock(b.as_fd()).unwrap();
        flock_wait(a.as_fd(), true, t).unwrap();
        flock_unlock(a.as_fd()).unwrap();
    }

    #[test]
    fn range_probe_and_bounded_byte_lock() {
        let a = memfd_create("rangetest").unwrap();
        let b = reopen_fd(a.as_fd()).unwrap();
        let probe = reopen_fd(a.as_fd()).unwrap();
        let base = 1u64 << 32;
        assert!(!ofd_is_locked_range(probe.as_fd(), base, 4096).unwrap());
        assert!(ofd_try_lock_byte(a.as_fd(), base + 4000).unwrap());
        assert!(ofd_is_locked_range(probe.as_fd(), base, 4096).unwrap());
        assert!(!ofd_is_locked_range(probe.as_fd(), base, 4000).unwrap());
        let e = ofd_lock_byte_wait(b.as_fd(), base + 4000, Duration::from_millis(10)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        drop(a);
        ofd_lock_byte_wait(b.as_fd(), base + 4000, Duration::from_secs(5)).unwrap();
    }
}
