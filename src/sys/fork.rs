//! What a forked child must not inherit: the parent's liveness locks.
//!
//! An OFD lock belongs to an open file description, and `fork` copies fds
//! that point at the *same* descriptions. A child would therefore keep its
//! parent's liveness lock held (and the parent would look alive after its
//! death, for as long as the child lives). To prevent that, every fd that
//! holds a liveness lock is recorded in a small static table, and a
//! `pthread_atfork` child handler closes all of them in the child. Closing
//! the child's copy does not release the lock (the parent's fd still refers
//! to the description); it only stops the child from holding it up.
//!
//! The handler runs in the child between `fork` and the return to the
//! caller, where only async-signal-safe operations are allowed: it uses
//! atomics and `close`, nothing else (no allocation, no locks). It also
//! bumps [`fork_generation`], so code that cached "who am I" can notice
//! cheaply that it now runs in a new process.
//!
//! Children created with `posix_spawn`/`exec` are covered by `O_CLOEXEC`.
//! A raw `clone`/`vfork` that skips the atfork handlers is not covered.

use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

/// Capacity of the lock-fd table: how many liveness-lock fds one process may
/// hold at once (one per bound region, plus one per reaper in progress).
pub const LOCK_FD_CAPACITY: usize = 256;

// An array-repeat of a const is the way to build a static array of atomics;
// each element is a distinct atomic, which is exactly what we want here.
#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: AtomicI32 = AtomicI32::new(-1);
static LOCK_FDS: [AtomicI32; LOCK_FD_CAPACITY] = [EMPTY; LOCK_FD_CAPACITY];
static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);
/// 0: handler not installed; `DONE`: installed; any other value: the pid of
/// the process one of whose threads is installing it right now. Not a
/// `std::sync::Once`: a fork while another thread is inside `call_once`
/// would leave the child's `Once` "running" forever, and the child's first
/// registration would hang. A pid tag lets the child tell that the installer
/// does not exist in its process, and start over.
static INSTALL_STATE: AtomicI32 = AtomicI32::new(0);
const DONE: i32 = -1;

extern "C" fn child_after_fork() {
    // This handler runs, so it is registered in the child too.
    INSTALL_STATE.store(DONE, Ordering::SeqCst);
    FORK_GENERATION.fetch_add(1, Ordering::SeqCst);
    for slot in LOCK_FDS.iter() {
        let fd = slot.swap(-1, Ordering::SeqCst);
        if fd >= 0 {
            // SAFETY: `fd` was registered by a `LockFd` of the parent and is a
            // copy the child inherited; nobody in the child closes it except
            // through the table (see `LockFd::drop`), and the swap above gives
            // this handler sole ownership. close is async-signal-safe.
            unsafe {
                libc::close(fd);
            }
        }
    }
}

/// Installs the `pthread_atfork` child handler, once per process. Cheap to
/// call repeatedly. A failure to install (ENOMEM) is reported.
pub fn install_atfork_handler() -> std::io::Result<()> {
    let me = super::file::getpid();
    loop {
        match INSTALL_STATE.load(Ordering::SeqCst) {
            DONE => return Ok(()),
            0 => {
                if INSTALL_STATE
                    .compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst)
                    .is_err()
                {
                    continue;
                }
                // SAFETY: `child_after_fork` is an `extern "C" fn()` with static
                // lifetime that only performs async-signal-safe work.
                let r = unsafe { libc::pthread_atfork(None, None, Some(child_after_fork)) };
                if r != 0 {
                    INSTALL_STATE.store(0, Ordering::SeqCst);
                    return Err(std::io::Error::from_raw_os_error(r));
                }
                INSTALL_STATE.store(DONE, Ordering::SeqCst);
                return Ok(());
            }
            pid if pid != me => {
                // Inherited mid-install from a parent whose handler did not
                // run in this child: not registered here. Start over.
                let _ = INSTALL_STATE.compare_exchange(pid, 0, Ordering::SeqCst, Ordering::SeqCst);
            }
            _ => std::thread::yield_now(), // another thread is installing (a few µs)
        }
    }
}

/// How many times this process's lineage has forked into the current
/// process: 0 in a process that was never a fork child (since the handler was
/// installed), bumped in each child. Compare a cached value to detect that
/// you are now in a forked child.
#[inline]
pub fn fork_generation() -> u64 {
    FORK_GENERATION.load(Ordering::SeqCst)
}

/// An fd that holds liveness locks, recorded in the fork table so that a
/// forked child closes its copy. Dropping it in the process that created it
/// closes the fd (releasing its locks); dropping it in a forked child does
/// nothing (the handler already closed the child's copy).
#[derive(Debug)]
pub struct LockFd {
    slot: usize,
    fd: i32,
    pid: i32,
}

impl LockFd {
    /// Takes ownership of `fd` and records it in the fork table. Installs the
    /// atfork handler first. Fails (closing `fd`) if the table is full.
    pub fn new(fd: OwnedFd) -> std::io::Result<LockFd> {
        install_atfork_handler()?;
        let raw = fd.as_raw_fd();
        for (i, slot) in LOCK_FDS.iter().enumerate() {
            if slot
                .compare_exchange(-1, raw, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                let raw = fd.into_raw_fd();
                return Ok(LockFd {
                    slot: i,
                    fd: raw,
                    pid: super::file::getpid(),
                });
            }
        }
        Err(std::io::Error::other(format!(
            "more than {LOCK_FD_CAPACITY} liveness-lock fds open in one process"
        )))
    }

    /// The fd, borrowed. Only meaningful in the process that created it.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: in the creating process the fd stays open until `drop`, which
        // cannot run while this borrow of `self` lives. In a forked child the
        // number may be closed or reused; the library only calls `fd()` in
        // the creating process (registration and reaping create and use their
        // LockFd without an intervening fork of this thread, and deregistering
        // checks `is_current_process` first). Even a stale number would only
        // make fcntl fail with EBADF or lock an unrelated file's byte range far
        // past its end; it cannot corrupt memory.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.fd) }
    }

    /// True if this is the process that created the fd (not a forked child).
    pub fn is_current_process(&self) -> bool {
        self.pid == super::file::getpid()
    }
}

impl Drop for LockFd {
    fn drop(&mut self) {
        // Close only if the table still says the fd is ours: in a forked child
        // the handler has emptied the slot (and the number may since have been
        // reused by an unrelated open).
        // The pid test comes first: in a child the slot may already hold a
        // NEW registration that reused both the slot and the fd number.
        if self.is_current_process()
            && LOCK_FDS[self.slot]
                .compare_exchange(self.fd, -1, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            // SAFETY: the table entry proved this process still owns `fd` (the
            // CAS removed it, so nobody else will close it).
            unsafe {
                libc::close(self.fd);
            }
        }
    }
}
