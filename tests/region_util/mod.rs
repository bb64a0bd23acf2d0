//! Helpers for the cross-process region tests: fork, pipes, bounded waits,
//! a test object spec and unique names.
#![allow(dead_code)]

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use shmsched::region::{ObjectKind, ObjectSpec};

/// Bytes of the test object's state.
pub const OBJ_SIZE: usize = 256;

fn init_obj(b: &mut [u8]) {
    b[8..16].copy_from_slice(&0xabcd_ef01_2345_6789u64.to_ne_bytes());
}

/// A Scheduler-kind spec with `max` as its first parameter.
pub fn spec(max: u64) -> ObjectSpec<'static> {
    ObjectSpec {
        kind: ObjectKind::Scheduler,
        params: [max, 0, 0, 0, 0, 0, 0, 0],
        object_size: OBJ_SIZE,
        init: &init_obj,
    }
}

/// A region name unique to this process and call.
pub fn unique_name(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "test-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Removes the named region when dropped.
pub struct Cleanup(pub String);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = shmsched::region::Region::remove(&self.0);
    }
}

/// Forks; the child runs `f` and `_exit`s with its return value (101 on
/// panic). Returns the child's pid in the parent.
pub fn fork_child(f: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: test code; the child only runs `f` and then `_exit`s without
    // running the parent's destructors or atexit handlers.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(101);
        // SAFETY: terminates the child immediately.
        unsafe { libc::_exit(code) }
    }
    pid
}

/// How a child ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

/// Waits for `pid` at most `limit`; SIGKILLs it and panics on timeout.
pub fn wait_child(pid: libc::pid_t, limit: Duration) -> Exit {
    let deadline = Instant::now() + limit;
    loop {
        let mut status = 0;
        // SAFETY: plain syscall on our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(r >= 0, "waitpid failed");
        if r == pid {
            if libc::WIFEXITED(status) {
                return Exit::Code(libc::WEXITSTATUS(status));
            }
            return Exit::Signal(libc::WTERMSIG(status));
        }
        if Instant::now() > deadline {
            kill(pid);
            panic!("child {pid} did not finish within {limit:?}");
        }
        // A time bound, not synchronisation: the outcome is decided by the
        // child's exit status.
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// SIGKILLs `pid`.
pub fn kill(pid: libc::pid_t) {
    // SAFETY: plain syscall.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

/// A pipe, as (read end, write end) Files.
pub fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid 2-element array.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(r, 0);
    // SAFETY: fresh fds owned by nobody else.
    unsafe {
        (
            File::from(OwnedFd::from_raw_fd(fds[0])),
            File::from(OwnedFd::from_raw_fd(fds[1])),
        )
    }
}

/// Writes u32s to a pipe in ONE write (atomic for up to PIPE_BUF bytes, so
/// reports of concurrent children never interleave).
pub fn send(w: &mut File, vals: &[u32]) {
    let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_ne_bytes()).collect();
    assert!(bytes.len() <= 512);
    w.write_all(&bytes).unwrap();
}

/// Waits (at most `limit`) until `r` is readable; false on timeout.
fn readable(r: &File, limit: Duration) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: r.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // SAFETY: `p` is one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n > 0 {
            return true;
        }
        if n == 0 || Instant::now() >= deadline {
            return false;
        }
    }
}

/// Reads one u32 from a pipe; None on EOF or after 30 s without data.
///
/// Forked children inherit every fd of the (multi-threaded) test process,
/// so EOF cannot serve as a signal; all handshakes count bytes instead.
pub fn recv(r: &mut File) -> Option<u32> {
    let mut b = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        if !readable(r, Duration::from_secs(30)) {
            return None;
        }
        match r.read(&mut b[got..]) {
            Ok(0) | Err(_) => return None,
            Ok(n) => got += n,
        }
    }
    Some(u32::from_ne_bytes(b))
}

/// Releases `n` waiters blocked in [`wait_go`] on the other end.
pub fn go(w: &mut File, n: usize) {
    w.write_all(&vec![1u8; n]).unwrap();
}

/// Blocks until one "go" byte arrives (or 60 s pass: then returns false).
pub fn wait_go(r: &mut File) -> bool {
    let mut b = [0u8; 1];
    readable(r, Duration::from_secs(60)) && matches!(r.read(&mut b), Ok(1))
}

pub fn as_atomic_u32(p: *mut u8) -> &'static AtomicU32 {
    // SAFETY (test): `p` is a 4-aligned pointer into a mapping kept alive by
    // the caller for the duration of the test.
    unsafe { &*(p as *const AtomicU32) }
}
