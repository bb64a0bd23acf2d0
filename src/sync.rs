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
pub(crate) use shuttle::sync::MutexGuard;

/// Under the model checker, the checker's mutex, whose `lock` is a step
/// where a stopped process's thread stops (see [`atomic`]).
#[cfg(shuttle)]
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(shuttle::sync::Mutex<T>);

#[cfg(shuttle)]
impl<T> Mutex<T> {
    pub(crate) fn new(t: T) -> Mutex<T> {
        Mutex(shuttle::sync::Mutex::new(t))
    }

    pub(crate) fn lock(&self) -> std::sync::LockResult<MutexGuard<'_, T>> {
        crate::sys::futex::model::stop_gate();
        self.0.lock()
    }
}

/// Under the model checker, the checker's atomics, each operation first a
/// point where the thread stops if the model has stopped its process
/// (`sys::futex::model::stop`): a stopped process's threads are simply not
/// scheduled until it is continued, between any two of its steps.
#[cfg(shuttle)]
pub(crate) mod atomic {
    use crate::sys::futex::model::stop_gate;
    pub use shuttle::sync::atomic::Ordering;

    /// A memory fence (a step like any other).
    pub fn fence(order: Ordering) {
        stop_gate();
        shuttle::sync::atomic::fence(order)
    }

    /// Methods that are a stopping point, then the checker's operation.
    macro_rules! gated_methods {
        ($($f:ident($($a:ident: $ty:ty),*) -> $r:ty;)*) => {
            $(
                pub fn $f(&self, $($a: $ty),*) -> $r {
                    stop_gate();
                    self.0.$f($($a),*)
                }
            )*
        };
    }

    macro_rules! gated {
        ($name:ident, $t:ty) => {
            #[derive(Debug, Default)]
            #[repr(transparent)]
            pub struct $name(shuttle::sync::atomic::$name);

            #[allow(dead_code)]
            impl $name {
                pub const fn new(v: $t) -> $name {
                    $name(shuttle::sync::atomic::$name::new(v))
                }
                /// A load that is not a stopping point (for the model of
                /// the kernel, which reads a futex word for a sleeper).
                pub(crate) fn load_ungated(&self, o: Ordering) -> $t {
                    self.0.load(o)
                }
                gated_methods! {
                    load(o: Ordering) -> $t;
                    store(v: $t, o: Ordering) -> ();
                    swap(v: $t, o: Ordering) -> $t;
                    compare_exchange(c: $t, n: $t, s: Ordering, f: Ordering) -> Result<$t, $t>;
                    compare_exchange_weak(c: $t, n: $t, s: Ordering, f: Ordering) -> Result<$t, $t>;
                    fetch_or(v: $t, o: Ordering) -> $t;
                    fetch_and(v: $t, o: Ordering) -> $t;
                }
            }
        };
    }

    macro_rules! gated_int {
        ($name:ident, $t:ty) => {
            gated!($name, $t);

            #[allow(dead_code)]
            impl $name {
                gated_methods! {
                    fetch_add(v: $t, o: Ordering) -> $t;
                    fetch_sub(v: $t, o: Ordering) -> $t;
                }
            }
        };
    }

    gated!(AtomicBool, bool);
    gated_int!(AtomicI32, i32);
    gated_int!(AtomicU32, u32);
    gated_int!(AtomicU64, u64);
}

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
