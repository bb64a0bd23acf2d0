//! The synchronisation primitives of the crate's protocols: the standard
//! library's, or, when the crate is built with `--cfg shuttle`, the
//! `shuttle` model checker's, so that the shipped code of the cross-process
//! protocols (the wait registry, the scheduler's slots and dispatch, the
//! limiter's drain) runs under the checker unchanged (`tests/model.rs`).
//!
//! Under `--cfg shuttle` the futex calls of [`crate::sys::futex`] are
//! modelled too; everything else (files, OFD locks, mappings) is real.

#[cfg(not(shuttle))]
pub(crate) use std::sync::{atomic, Mutex, MutexGuard};

#[cfg(shuttle)]
pub(crate) use shuttle::sync::{atomic, Mutex, MutexGuard};

/// The body of a spin-wait loop: a CPU hint, or, under the model checker, a
/// point where it may run another thread (a spinning thread would never let
/// the thread it waits for progress otherwise).
#[inline(always)]
pub(crate) fn spin() {
    #[cfg(not(shuttle))]
    std::hint::spin_loop();
    #[cfg(shuttle)]
    shuttle::thread::yield_now();
}

/// Yields the CPU (the model checker's yield under `--cfg shuttle`).
#[inline]
pub(crate) fn yield_now() {
    #[cfg(not(shuttle))]
    std::thread::yield_now();
    #[cfg(shuttle)]
    shuttle::thread::yield_now();
}
