//! Ctrl-C (SIGINT) and SIGTERM as a flag that long-running programs (the
//! CLI's `demo` and `watch`) poll, so that they stop their workers, remove
//! their region and detach before exiting. The handler only stores to an atomic, which is
//! async-signal-safe.

use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Installs the handler for SIGINT and SIGTERM.
pub fn install_interrupt_flag() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: `on_signal` is an `extern "C"` function that only performs an
    // atomic store, which is async-signal-safe; `signal` has no other
    // preconditions.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

/// Ignores SIGINT (for worker processes whose master decides when they
/// stop, so that a Ctrl-C on the terminal's process group reaches only the
/// master).
pub fn ignore_interrupt() {
    // SAFETY: setting a signal's disposition to SIG_IGN has no preconditions.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
    }
}

/// True once SIGINT or SIGTERM arrived.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}
