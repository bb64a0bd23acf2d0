//! The only module with raw syscalls and `libc` calls.
//!
//! Everything above `sys` (the region, the objects) calls these small,
//! documented wrappers and never touches `libc` itself. One file per
//! concept:
//!
//! - [`futex`]: shared (cross-process) futex wait and wake.
//! - [`clock`]: `CLOCK_MONOTONIC`, the clock all processes of a host share.
//! - [`lock`]: liveness locks (OFD byte locks) and whole-file `flock`.
//! - [`file`](mod@file): opening, creating, sizing, reopening and mapping region files
//!   and memfds; `getpid`.
//! - [`fork`]: the `pthread_atfork` handlers that drop the library's
//!   liveness locks in a forked child, and the fork gate that keeps a lock
//!   fd from being copied before it is recorded.
//!
//! - [`pipe`]: `splice`, `FIONREAD`, FIFOs, pipe sizes, `poll`, `epoll`,
//!   `eventfd`, `pidfd_open` (the shell front ends).
//! - [`child`]: a child's death signal and signals forwarded to it.
//! - [`signal`]: SIGINT/SIGTERM as a flag for long-running programs.
//! - [`robust_mutex`]: a process-shared robust pthread mutex for the
//!   fair-share ledger (`EOWNERDEAD` recovery, bounded waits, repair of a
//!   corrupt lock word).
//! - [`proc`]: whether a thread id names a live thread, and whether its
//!   process maps a file (`/proc`).
//! - [`membarrier`]: `membarrier(2)` private expedited, the heavy side of
//!   an asymmetric fence (the C ABI's permit pin).
//! - [`event`]: one readiness descriptor for event loops (epoll over an
//!   eventfd doorbell and a timerfd deadline), for the C ABI's waitset.

pub mod child;
pub mod clock;
pub mod event;
pub mod file;
pub mod fork;
pub mod futex;
pub mod lock;
pub mod membarrier;
pub mod pipe;
pub mod proc;
pub mod robust_mutex;
pub mod signal;

pub use clock::{monotonic_ms, monotonic_ns};
pub use futex::{futex_wait, futex_wake, WaitResult};
