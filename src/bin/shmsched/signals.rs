//! SIGINT and SIGTERM as a flag that long-running commands poll (`demo`,
//! `watch`, `serve`), so they stop their workers, remove their region and
//! exit cleanly. The handler (installed by `signal-hook`) only stores the
//! signal number.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use signal_hook::consts::{SIGINT, SIGTERM};

fn flag() -> &'static Arc<AtomicUsize> {
    static FLAG: OnceLock<Arc<AtomicUsize>> = OnceLock::new();
    FLAG.get_or_init(|| Arc::new(AtomicUsize::new(0)))
}

/// Installs the handlers for SIGINT and SIGTERM. Idempotent.
pub fn install() {
    for sig in [SIGINT, SIGTERM] {
        // Registering can only fail for a forbidden signal (SIGKILL, …).
        let _ = signal_hook::flag::register_usize(sig, Arc::clone(flag()), sig as usize);
    }
}

/// Makes SIGINT harmless (for demo workers, whose master decides when they
/// stop: a Ctrl-C on the terminal's process group must reach only the
/// master). The signal is caught and forgotten.
pub fn ignore_interrupt() {
    let _ = signal_hook::flag::register_usize(SIGINT, Arc::new(AtomicUsize::new(0)), 1);
}

/// The signal that arrived since [`install`], if any.
pub fn caught() -> Option<i32> {
    match flag().load(Ordering::SeqCst) {
        0 => None,
        s => i32::try_from(s).ok(),
    }
}

/// The conventional exit status for a run cut short by `sig`: 128 + sig
/// (130 for SIGINT, 143 for SIGTERM).
pub fn exit_status(sig: i32) -> u8 {
    u8::try_from(128 + sig).unwrap_or(1)
}
