//! Fork detection without a syscall on the fast path.
//!
//! `getpid()` is a real syscall on current glibc, too slow for every acquire.
//! Instead a `pthread_atfork` child handler bumps a process-global counter;
//! an object records the counter when it is created and compares on use. A
//! different value means the object was inherited across `fork`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);
static REGISTER: Once = Once::new();

extern "C" fn bump_in_child() {
    // Async-signal-safe: one atomic add, no allocation, no locks.
    FORK_GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// The number of `fork`s between the first call in this process lineage and
/// now. Equal values mean "same process"; the first call registers the
/// handler.
pub fn fork_generation() -> u64 {
    REGISTER.call_once(|| {
        // SAFETY: `bump_in_child` is a plain `extern "C"` function with no
        // captured state that only does an atomic add, which is safe to run
        // in a freshly forked child (async-signal-safe).
        let rc = unsafe { libc::pthread_atfork(None, None, Some(bump_in_child)) };
        debug_assert_eq!(rc, 0, "pthread_atfork can only fail with ENOMEM");
    });
    FORK_GENERATION.load(Ordering::Relaxed)
}
