//! Who "this process" is, for the C layer: a fork generation and a process
//! tag, both renewed in a forked child by a `pthread_atfork` handler.
//!
//! - The **fork generation** is bumped in every child. A scheduler or
//!   limiter handle records the generation it was made in; a handle used in
//!   a later generation belongs to an ancestor process and fails with
//!   `SHMSCHED_STATUS_FORKED` (the library would refuse most calls anyway;
//!   checking here makes every call, `try_` ones included, say so alike).
//! - The **process tag** is stamped into every permit this process hands
//!   out: the pid in the low 32 bits and a random nonce above, so a permit
//!   of another process (inherited across `fork`, or sent through a pipe)
//!   is told apart from this process's own, even across pid namespaces
//!   (where two live processes may share a pid). A child computes a fresh
//!   tag on first use.
//!
//! The child handler only stores atomics (async-signal-safe). It also lets
//! the permit table recover a lock that a thread of the parent held at the
//! moment of `fork` (see [`crate::permits`]).

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);
static PROCESS_TAG: AtomicU64 = AtomicU64::new(0);

/// 0: handler not installed; `DONE`: installed; any other value: the pid of
/// the process one of whose threads is installing it now. (Not a
/// `std::sync::Once`: a fork while another thread is inside `call_once`
/// would leave the child's `Once` running forever.)
static INSTALL_STATE: AtomicI32 = AtomicI32::new(0);
const DONE: i32 = -1;

extern "C" fn child_after_fork() {
    INSTALL_STATE.store(DONE, Ordering::SeqCst);
    FORK_GENERATION.fetch_add(1, Ordering::SeqCst);
    PROCESS_TAG.store(0, Ordering::SeqCst);
    crate::permits::after_fork_in_child();
    crate::pin::after_fork_in_child();
}

fn getpid() -> i32 {
    // SAFETY: getpid has no preconditions and cannot fail.
    unsafe { libc::getpid() }
}

/// Installs the child handler once per process. Called by every function
/// that creates a handle, so it runs before any permit exists.
pub(crate) fn install_fork_handler() -> Result<(), crate::status::Fail> {
    let me = getpid();
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
                // SAFETY: `child_after_fork` is an `extern "C" fn()` that
                // lives as long as the library and only stores atomics.
                let r = unsafe { libc::pthread_atfork(None, None, Some(child_after_fork)) };
                if r != 0 {
                    INSTALL_STATE.store(0, Ordering::SeqCst);
                    return Err(crate::status::Fail::new(
                        crate::status::shmsched_status::Io,
                        format!("pthread_atfork: {}", std::io::Error::from_raw_os_error(r)),
                    ));
                }
                INSTALL_STATE.store(DONE, Ordering::SeqCst);
                return Ok(());
            }
            pid if pid == me => std::thread::yield_now(),
            // A thread of a parent was installing when it forked: that
            // thread does not exist here, so start over.
            pid => {
                let _ = INSTALL_STATE.compare_exchange(pid, 0, Ordering::SeqCst, Ordering::SeqCst);
            }
        }
    }
}

/// The current fork generation.
#[inline(always)]
pub(crate) fn fork_generation() -> u64 {
    FORK_GENERATION.load(Ordering::Relaxed)
}

/// This process's tag (see the module docs).
#[inline(always)]
pub(crate) fn tag() -> u64 {
    match PROCESS_TAG.load(Ordering::Relaxed) {
        0 => new_tag(),
        t => t,
    }
}

/// This process's tag if it has one yet (made by the first [`tag`]), else
/// 0 (no token of this process exists then).
#[inline(always)]
pub(crate) fn tag_if_made() -> u64 {
    PROCESS_TAG.load(Ordering::Relaxed)
}

#[cold]
fn new_tag() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let pid = getpid() as u32;
    // RandomState is seeded from the OS's random source once per process
    // and then per instance; mixing in the pid and the time makes a
    // child's nonce differ from its parent's even if the seed was inherited.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(pid);
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    let nonce = (h.finish() as u32) | 1;
    let t = (u64::from(nonce) << 32) | u64::from(pid);
    match PROCESS_TAG.compare_exchange(0, t, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => t,
        Err(other) => other,
    }
}

/// The pid part of a tag.
pub(crate) fn pid_of(tag: u64) -> u32 {
    tag as u32
}
