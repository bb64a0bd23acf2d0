//! Pipes, FIFOs and readiness for the shell front ends (`shmsched pipe`
//! and `shmsched jobserver`): `splice`, `FIONREAD`, `mkfifo`, the pipe
//! buffer size, `poll`, `epoll`, `eventfd` and `pidfd_open`.
//!
//! Each function is a thin wrapper that turns the C return convention into
//! an `io::Result`; none keeps state. Every descriptor created here is
//! `O_CLOEXEC` (a jobserver hands its client descriptors on explicitly).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Milliseconds for `poll`/`epoll_wait`: `None` waits for ever; a duration
/// is rounded up (a 100 µs wait must not become a busy 0).
fn timeout_ms(t: Option<Duration>) -> libc::c_int {
    match t {
        None => -1,
        Some(d) => {
            let ms = d.as_nanos().div_ceil(1_000_000);
            ms.min(i32::MAX as u128) as libc::c_int
        }
    }
}

/// Moves up to `len` bytes from `from` to `to` inside the kernel
/// (`splice(2)`, `SPLICE_F_MOVE`); one of them must be a pipe. Returns the
/// bytes moved (0 at end of input). `EINVAL` means this pair of files
/// cannot be spliced (the caller falls back to `read`/`write`).
pub fn splice(from: BorrowedFd<'_>, to: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    loop {
        // SAFETY: both descriptors are live for the borrows; null offsets
        // mean "the file position", which splice allows for any file.
        let r = unsafe {
            libc::splice(
                from.as_raw_fd(),
                std::ptr::null_mut(),
                to.as_raw_fd(),
                std::ptr::null_mut(),
                len,
                libc::SPLICE_F_MOVE,
            )
        };
        match cvt_size(r) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// The bytes that can be read from `fd` now without blocking (`FIONREAD`):
/// unread bytes of a pipe, FIFO, socket or terminal; the bytes after the
/// position of a regular file. `ENOTTY`/`EINVAL` for files that cannot tell
/// (a character device such as `/dev/zero`).
pub fn fionread(fd: BorrowedFd<'_>) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: `fd` is live; FIONREAD writes one int to the pointer, which
    // points at `n` for the duration of the call.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut n) })?;
    Ok(n.max(0) as usize)
}

/// Creates a FIFO at `path` with permission `mode` (`mkfifo(3)`; the umask
/// applies, so callers pass modes the umask does not narrow, like `0o600`).
pub fn mkfifo(path: &Path, mode: u32) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    cvt(unsafe { libc::mkfifo(c.as_ptr(), mode as libc::mode_t) }).map(|_| ())
}

/// How [`open_fifo`] opens a FIFO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FifoEnd {
    /// `O_RDONLY | O_NONBLOCK` (does not wait for a writer).
    ReadNonBlocking,
    /// `O_RDWR | O_NONBLOCK`: never waits, never sees end of file.
    ReadWriteNonBlocking,
    /// `O_RDONLY`, blocking reads (the open waits for a writer unless one
    /// exists, as an `O_RDWR` end does).
    Read,
    /// `O_WRONLY`, blocking writes (opened while a reader exists).
    Write,
}

/// Opens the FIFO at `path` (`O_CLOEXEC`, never following a symlink),
/// refusing anything that is not a FIFO.
pub fn open_fifo(path: &Path, end: FifoEnd) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    let flags = libc::O_CLOEXEC
        | libc::O_NOFOLLOW
        | match end {
            FifoEnd::ReadNonBlocking => libc::O_RDONLY | libc::O_NONBLOCK,
            FifoEnd::ReadWriteNonBlocking => libc::O_RDWR | libc::O_NONBLOCK,
            FifoEnd::Read => libc::O_RDONLY,
            FifoEnd::Write => libc::O_WRONLY,
        };
    // SAFETY: `c` is a valid path; `open` with these flags creates nothing.
    let fd = cvt(unsafe { libc::open(c.as_ptr(), flags) })?;
    // SAFETY: `open` returned a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if !is_fifo(std::os::fd::AsFd::as_fd(&fd))? {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a FIFO", path.display()),
        ));
    }
    Ok(fd)
}

/// Whether `fd` is a pipe or a FIFO (`S_ISFIFO`).
pub fn is_fifo(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `fd` is live; fstat fills the whole struct on success.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded, so the struct is initialised.
    let st = unsafe { st.assume_init() };
    Ok(st.st_mode & libc::S_IFMT == libc::S_IFIFO)
}

/// The buffer size of the pipe or FIFO `fd` (`F_GETPIPE_SZ`).
pub fn pipe_size(fd: BorrowedFd<'_>) -> io::Result<usize> {
    // SAFETY: `fd` is live; F_GETPIPE_SZ has no memory effects.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETPIPE_SZ) }).map(|n| n as usize)
}

/// Sets the buffer size of the pipe or FIFO `fd` (`F_SETPIPE_SZ`; the kernel
/// rounds up to a power-of-two number of pages, and refuses more than
/// `/proc/sys/fs/pipe-max-size` to an unprivileged process). Returns the
/// size in force.
pub fn set_pipe_size(fd: BorrowedFd<'_>, bytes: usize) -> io::Result<usize> {
    let b = bytes.min(i32::MAX as usize) as libc::c_int;
    // SAFETY: `fd` is live; F_SETPIPE_SZ has no memory effects.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, b) }).map(|n| n as usize)
}

/// Sets or clears `FD_CLOEXEC` on `fd`. Async-signal-safe (one `fcntl`), so
/// it may run in a child between `fork` and `exec`.
pub fn set_cloexec(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: F_GETFD/F_SETFD only read and write the descriptor's flags; an
    // invalid `fd` fails with EBADF.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    let new = if on {
        flags | libc::FD_CLOEXEC
    } else {
        flags & !libc::FD_CLOEXEC
    };
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFD, new) }).map(|_| ())
}

/// Reads into `buf` from `fd` once, retrying on `EINTR`. A non-blocking
/// descriptor with nothing to read gives `WouldBlock`.
pub fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is valid for `buf.len()` bytes of writes.
        let r = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        match cvt_size(r) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Writes `buf` to `fd` once (may be short), retrying on `EINTR`.
pub fn write(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is valid for `buf.len()` bytes of reads.
        let r = unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
        match cvt_size(r) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Waits until `fd` is readable (or at end of file, or in error) or
/// `timeout` passes; returns whether it is ready.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: `p` is one valid pollfd for the duration of the call.
        match cvt(unsafe { libc::poll(&mut p, 1, timeout_ms(timeout)) }) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
            Ok(n) => return Ok(n > 0),
        }
    }
}

/// Readiness a descriptor is watched for in an [`Epoll`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interest {
    /// Level-triggered "readable".
    Readable,
    /// Edge-triggered "readable": one event per change (for a pipe: per
    /// write into it, since Linux 5.x wakes epoll readers on every write).
    ReadableEdge,
    /// Level-triggered "writable" (for a pipe of one page: "empty").
    Writable,
}

impl Interest {
    fn bits(self) -> u32 {
        match self {
            Interest::Readable => libc::EPOLLIN as u32,
            Interest::ReadableEdge => (libc::EPOLLIN | libc::EPOLLET) as u32,
            Interest::Writable => libc::EPOLLOUT as u32,
        }
    }
}

/// An epoll instance: descriptors watched under a caller-chosen key.
#[derive(Debug)]
pub struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    /// A new epoll instance (`epoll_create1(EPOLL_CLOEXEC)`).
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: no pointers; returns a fresh descriptor or -1.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: a fresh descriptor that nothing else owns.
        Ok(Epoll {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn ctl(&self, op: libc::c_int, fd: BorrowedFd<'_>, key: u64, i: Interest) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: i.bits(),
            u64: key,
        };
        // SAFETY: `ev` is a valid epoll_event for the duration of the call;
        // both descriptors are live.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd.as_raw_fd(), &mut ev) })
            .map(|_| ())
    }

    /// Watches `fd` for `interest`, reported under `key`.
    pub fn add(&self, fd: BorrowedFd<'_>, key: u64, interest: Interest) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, key, interest)
    }

    /// Stops watching `fd`.
    pub fn remove(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: as in `ctl` (the event is ignored for EPOLL_CTL_DEL).
        cvt(unsafe {
            libc::epoll_ctl(
                self.fd.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd.as_raw_fd(),
                &mut ev,
            )
        })
        .map(|_| ())
    }

    /// Waits for events at most `timeout` (`None`: for ever) and returns
    /// the keys of the ready descriptors (empty on timeout or `EINTR`).
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<Vec<u64>> {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 16];
        // SAFETY: `evs` has room for the 16 events the call may write.
        let r = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                evs.as_mut_ptr(),
                evs.len() as libc::c_int,
                timeout_ms(timeout),
            )
        };
        match cvt(r) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Vec::new()),
            Err(e) => Err(e),
            Ok(n) => Ok(evs[..n as usize].iter().map(|e| e.u64).collect()),
        }
    }
}

/// A counter that one thread bumps and another waits on through
/// [`Epoll`] (`eventfd(EFD_CLOEXEC | EFD_NONBLOCK)`).
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// A new event counter at 0.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: no pointers; returns a fresh descriptor or -1.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        // SAFETY: a fresh descriptor that nothing else owns.
        Ok(EventFd {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Adds one (wakes a waiter).
    pub fn notify(&self) {
        // A write can only fail if the counter would overflow u64::MAX - 1,
        // which one notification per event cannot reach.
        let _ = write(self.fd(), &1u64.to_ne_bytes());
    }

    /// Resets the counter to 0 (after a wake).
    pub fn clear(&self) {
        let mut b = [0u8; 8];
        let _ = read(self.fd(), &mut b);
    }

    /// The descriptor, to watch in an [`Epoll`].
    pub fn fd(&self) -> BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.fd)
    }
}

/// A descriptor that becomes readable when process `pid` (a child of this
/// process) exits (`pidfd_open(2)`, Linux 5.3+).
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: the raw syscall takes a pid and flags and returns a fresh
    // descriptor or -1.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    #[test]
    fn fifo_fionread_and_one_page_emptiness() {
        let dir = std::env::temp_dir().join(format!("shmsched-sys-pipe-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("fifo");
        mkfifo(&path, 0o600).unwrap();
        let rw = open_fifo(&path, FifoEnd::ReadWriteNonBlocking).unwrap();
        assert!(is_fifo(rw.as_fd()).unwrap());
        assert_eq!(set_pipe_size(rw.as_fd(), 4096).unwrap(), 4096);
        let ep = Epoll::new().unwrap();
        ep.add(rw.as_fd(), 7, Interest::Writable).unwrap();
        // Empty: writable.
        assert_eq!(ep.wait(Some(Duration::ZERO)).unwrap(), vec![7]);
        write(rw.as_fd(), b"++").unwrap();
        assert_eq!(fionread(rw.as_fd()).unwrap(), 2);
        // One page, not empty: not writable (the slot is in use).
        assert!(ep.wait(Some(Duration::ZERO)).unwrap().is_empty());
        let mut b = [0u8; 2];
        assert_eq!(read(rw.as_fd(), &mut b).unwrap(), 2);
        assert_eq!(ep.wait(Some(Duration::ZERO)).unwrap(), vec![7]);
        let e = read(rw.as_fd(), &mut b).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        // Not a FIFO: refused.
        let file = dir.join("plain");
        std::fs::File::create(&file)
            .unwrap()
            .write_all(b"x")
            .unwrap();
        assert!(open_fifo(&file, FifoEnd::ReadNonBlocking).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn edge_triggered_reader_sees_every_write() {
        let dir = std::env::temp_dir().join(format!("shmsched-sys-edge-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("fifo");
        mkfifo(&path, 0o600).unwrap();
        let rw = open_fifo(&path, FifoEnd::ReadWriteNonBlocking).unwrap();
        let w = open_fifo(&path, FifoEnd::Write).unwrap();
        let ep = Epoll::new().unwrap();
        ep.add(rw.as_fd(), 1, Interest::ReadableEdge).unwrap();
        write(w.as_fd(), b"+").unwrap();
        assert_eq!(ep.wait(Some(Duration::ZERO)).unwrap(), vec![1]);
        assert!(ep.wait(Some(Duration::ZERO)).unwrap().is_empty());
        // A second write into a pipe that is not empty: still an event.
        write(w.as_fd(), b"+").unwrap();
        assert_eq!(ep.wait(Some(Duration::ZERO)).unwrap(), vec![1]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn eventfd_and_pidfd() {
        let ev = EventFd::new().unwrap();
        let ep = Epoll::new().unwrap();
        ep.add(ev.fd(), 3, Interest::Readable).unwrap();
        assert!(ep.wait(Some(Duration::ZERO)).unwrap().is_empty());
        ev.notify();
        assert_eq!(ep.wait(Some(Duration::ZERO)).unwrap(), vec![3]);
        ev.clear();
        assert!(ep.wait(Some(Duration::ZERO)).unwrap().is_empty());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pfd = pidfd_open(child.id()).unwrap();
        ep.add(pfd.as_fd(), 4, Interest::Readable).unwrap();
        assert_eq!(ep.wait(Some(Duration::from_secs(10))).unwrap(), vec![4]);
        child.wait().unwrap();
    }
}
