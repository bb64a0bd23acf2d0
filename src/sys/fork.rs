//! What a forked child must not inherit: the parent's liveness locks.
//!
//! # How it works
//!
//! An OFD lock (and a `flock`) belongs to an open file description, and
//! `fork` copies fds that point at the *same* descriptions. A child would
//! therefore keep its parent's locks held (and the parent would look alive
//! after its death, for as long as the child lives). To prevent that, every
//! fd that holds (or will hold) such a lock is a [`LockFd`], recorded in a
//! small static table that a `pthread_atfork` child handler closes in the
//! child. Closing the child's copy does not release the lock (the parent's
//! fd still refers to the description); it only stops the child from
//! holding it up.
//!
//! **The fork gate.** Recording is not atomic with opening: a `fork` on
//! another thread between the `open` of a lock fd and its recording (or
//! between its removal from the table and its `close`) would give the child
//! an untracked copy. Both windows therefore run inside the *fork gate*: a
//! count of threads inside a window, which the `atfork` *prepare* handler
//! (run by the forking thread before `fork`) waits to fall to zero while
//! holding new entrants out. A window is a couple of syscalls long, so a
//! `fork` waits microseconds; the wait is bounded (5 s) so that a thread
//! stopped inside a window cannot block `fork` forever. [`LockFd::open`]
//! opens and records inside the gate, so the window is closed by
//! construction.
//!
//! The child handler runs in the child between `fork` and the return to the
//! caller, where only async-signal-safe operations are allowed: it uses
//! atomics and `close`, nothing else (no allocation, no locks). It also
//! bumps [`fork_generation`], so code that cached "who am I" can notice
//! cheaply that it now runs in a new process; [`process_token`] is derived
//! from it and, unlike a pid, is never the same for a process and any of its
//! descendants.
//!
//! **Thread ids.** [`thread_id`] names the calling thread with a number
//! from a process-wide counter, never reused; the child handler clears the
//! forking thread's (the one thread of the child), so no thread of a
//! forked child ever has an id that a thread had when its parent forked
//! (the child's counter is the parent's copy, past every id given so far).
//! A record that says "claimed by thread `id`" (the limiter's per-handle
//! counters, `limiter/tally.rs`) is thus never the caller's own in a child
//! that inherited it: seeing its own id there tells a thread, at no extra
//! cost, that the record was claimed in this process, after the last fork.
//!
//! Children created with `posix_spawn`/`exec` are covered by `O_CLOEXEC`.
//! A raw `clone`/`vfork` that skips the atfork handlers is not covered.

use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Capacity of the lock-fd table: how many liveness-lock fds one process may
/// hold at once (one per bound region, plus one per reaper or binder in
/// progress).
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

/// The fork gate: low bits count threads inside a window, the bits from
/// [`FORK_ONE`] up count forks waiting for the windows to close.
static GATE: AtomicU32 = AtomicU32::new(0);
const FORK_ONE: u32 = 1 << 16;
const IN_WINDOW: u32 = FORK_ONE - 1;
/// Longest a `fork` waits for the windows in progress to close.
const GATE_WAIT: Duration = Duration::from_secs(5);

/// Test seam: called inside the open-to-record window of [`LockFd::open`].
static WINDOW_HOOK: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());

extern "C" fn prepare_fork() {
    // Hold new windows out, then wait for the open ones to close.
    GATE.fetch_add(FORK_ONE, Ordering::SeqCst);
    let deadline = Instant::now() + GATE_WAIT;
    loop {
        let v = GATE.load(Ordering::SeqCst);
        if v & IN_WINDOW == 0 {
            return;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return; // a thread stopped inside a window: do not block fork forever
        }
        super::futex::os::futex_wait(&GATE, v, Some(left.min(Duration::from_millis(10))));
    }
}

extern "C" fn parent_after_fork() {
    GATE.fetch_sub(FORK_ONE, Ordering::SeqCst);
    super::futex::os::futex_wake(&GATE, i32::MAX);
}

extern "C" fn child_after_fork() {
    // This handler runs, so it is registered in the child too.
    INSTALL_STATE.store(DONE, Ordering::SeqCst);
    FORK_GENERATION.fetch_add(1, Ordering::SeqCst);
    // A fresh id at its next claim (see "Thread ids"): a store to a
    // const-initialised thread-local without a destructor, which is
    // async-signal-safe.
    #[cfg(not(shuttle))]
    THREAD_ID.with(|c| c.set(0));
    // Only the forking thread exists here, and it was not inside a window.
    GATE.store(0, Ordering::SeqCst);
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

/// Inside a fork-gate window: a `fork` on another thread waits until it is
/// dropped (see the module docs). Keep it for a few syscalls at most.
struct GateGuard(());

impl GateGuard {
    fn enter() -> std::io::Result<GateGuard> {
        install_atfork_handler()?;
        loop {
            let v = GATE.load(Ordering::SeqCst);
            if v >= FORK_ONE {
                // A fork is waiting for the open windows: let it go first.
                super::futex::os::futex_wait(&GATE, v, Some(Duration::from_millis(10)));
                continue;
            }
            if v & IN_WINDOW == IN_WINDOW {
                std::thread::yield_now(); // 65,535 windows open at once
                continue;
            }
            if GATE
                .compare_exchange(v, v + 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                return Ok(GateGuard(()));
            }
        }
    }
}

impl Drop for GateGuard {
    fn drop(&mut self) {
        let v = GATE.fetch_sub(1, Ordering::SeqCst);
        if v >= FORK_ONE && v & IN_WINDOW == 1 {
            super::futex::os::futex_wake(&GATE, i32::MAX);
        }
    }
}

/// Test seam: `hook` runs inside every open-to-record window of
/// [`LockFd::open`] (a fork on another thread must then wait); `None`
/// removes it. Never use it outside tests.
#[doc(hidden)]
pub fn set_window_hook(hook: Option<fn()>) {
    let p = hook.map_or(std::ptr::null_mut(), |f| f as *mut ());
    WINDOW_HOOK.store(p, Ordering::SeqCst);
}

fn run_window_hook() {
    let p = WINDOW_HOOK.load(Ordering::SeqCst);
    if !p.is_null() {
        // SAFETY: the pointer was stored by `set_window_hook` from a `fn()`,
        // and function pointers round-trip through `*mut ()` unchanged.
        let f: fn() = unsafe { std::mem::transmute::<*mut (), fn()>(p) };
        f();
    }
}

/// Installs the `pthread_atfork` handlers (the fork gate's prepare and
/// parent handlers, and the child handler), once per process. Cheap to call
/// repeatedly. A failure to install (ENOMEM) is reported.
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
                // SAFETY: the three handlers are `extern "C" fn()`s with static
                // lifetime; the child handler only performs async-signal-safe
                // work, and the prepare and parent handlers run in the forking
                // thread of the parent, in ordinary context.
                let r = unsafe {
                    libc::pthread_atfork(
                        Some(prepare_fork),
                        Some(parent_after_fork),
                        Some(child_after_fork),
                    )
                };
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

/// The next thread id (0 is "not assigned yet").
#[cfg(not(shuttle))]
static NEXT_THREAD_ID: AtomicU64 = AtomicU64::new(1);

#[cfg(not(shuttle))]
thread_local! {
    /// This thread's id, 0 until [`assign_thread_id`] (and again in a
    /// forked child, see "Thread ids"). Const-initialised and without a
    /// destructor: reading it is one load, at any point of the thread's
    /// life (also in other thread-locals' destructors and in the child
    /// handler).
    static THREAD_ID: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The calling thread's id (see "Thread ids" in the module docs), or 0 if
/// it has none yet ([`assign_thread_id`] gives it one). Not under the
/// model checker, whose threads share one OS thread.
#[cfg(not(shuttle))]
#[inline(always)]
pub fn thread_id() -> u64 {
    THREAD_ID.with(std::cell::Cell::get)
}

/// Gives the calling thread a new id, never any thread's before in this
/// process or its ancestors until their fork, and returns it.
#[cfg(not(shuttle))]
#[cold]
pub fn assign_thread_id() -> u64 {
    let id = NEXT_THREAD_ID.fetch_add(1, Ordering::Relaxed);
    THREAD_ID.with(|c| c.set(id));
    id
}

/// A non-zero token for "this process", for in-memory records that a forked
/// child inherits: every thread of one process gets the same token, and a
/// forked descendant (child, grandchild, ...) never gets its ancestor's,
/// because its [`fork_generation`] is strictly larger. (A pid does not have
/// that property: a grandchild may be given the pid of an ancestor that has
/// exited.) Installs the atfork handler first, so that any fork after a
/// token was recorded is counted; `None` if that fails.
pub fn process_token() -> Option<u32> {
    install_atfork_handler().ok()?;
    // 2^32 forks in one lineage would wrap; 0 is kept for "nobody".
    Some((fork_generation() as u32).wrapping_add(1).max(1))
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
    /// Opens an fd with `open` and records it in the fork table, both inside
    /// the fork gate, so that no `fork` can copy it unrecorded. Fails
    /// (closing the fd) if the table is full.
    pub fn open(open: impl FnOnce() -> std::io::Result<OwnedFd>) -> std::io::Result<LockFd> {
        let _gate = GateGuard::enter()?;
        let fd = open()?;
        run_window_hook();
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
        if !self.is_current_process() {
            return;
        }
        // Removing and closing is a window too: a fork in between would copy
        // an fd that the child handler no longer knows about.
        let gate = GateGuard::enter();
        if LOCK_FDS[self.slot]
            .compare_exchange(self.fd, -1, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            // SAFETY: the table entry proved this process still owns `fd` (the
            // CAS removed it, so nobody else will close it).
            unsafe {
                libc::close(self.fd);
            }
        }
        drop(gate);
    }
}
