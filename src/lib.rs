//! # shmsched
//!
//! One concurrency budget, one byte-rate budget and one fair-share ceiling,
//! shared by many co-located OS processes through a memory-mapped region.
//!
//! Layers, lowest first (no module reaches upward):
//!
//! - [`sys`]: the only place with raw syscalls (futex, clock, liveness locks,
//!   robust mutex).
//! - [`region`]: mapping, versioned header, race-free creation, process table,
//!   reaping of dead processes.
//! - [`scheduler`], [`limiter`], [`fair`]: the objects; each object's logic is written once
//!   and runs in-process or inside a region.
//! - [`io`]: `Read`/`Write` adapters throttled by a [`limiter::Limiter`], and
//!   file operations gated by a [`scheduler::Scheduler`].
//! - [`pressure`]: a PSI-style stall signal computed from stats.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod error;
pub mod fair;
pub mod io;
pub mod limiter;
pub mod pressure;
pub mod priority;
pub mod region;
pub mod scheduler;
pub mod sys;

pub use error::{Error, Result};
pub use priority::Priority;
