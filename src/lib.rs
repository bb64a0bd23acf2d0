//! # shmsched
//!
//! One concurrency budget, one byte-rate budget and one fair-share ceiling,
//! shared by many co-located OS processes through a memory-mapped region.
//!
//! # A concurrency budget shared by processes
//!
//! ```
//! use shmsched::region::Region;
//! use shmsched::scheduler::{Concurrency, Scheduler};
//! use shmsched::Priority;
//!
//! # fn main() -> shmsched::Result<()> {
//! // A prefork master makes an anonymous region (a memfd) before forking;
//! // unrelated processes use a name instead: Region::open_or_create("pool").
//! let region = Region::anonymous()?;
//! // At most 4 at once across every process; `low` work at most 1.
//! let sched = Scheduler::shared(&region, Concurrency::max(4).low(1))?;
//! let permit = sched.acquire(Priority::High)?; // blocks; sleeps on a futex
//! assert_eq!(sched.global_running(), 1);
//! drop(permit); // released exactly once
//! # Ok(()) }
//! ```
//!
//! A process killed while holding permits gives them back: the next waiter
//! that finds the budget full reclaims them (or call
//! [`Scheduler::reap`](scheduler::Scheduler::reap), or `shmsched reap`).
//!
//! # A fair-share ceiling
//!
//! ```
//! use shmsched::fair::{FairConfig, FairShare, FairnessUnit};
//!
//! let mut fair = FairShare::new(FairConfig {
//!     ceiling: 100.0,
//!     fairness_unit: FairnessUnit::Cost,
//!     tenants: vec![("a".into(), 1.0), ("b".into(), 1.0)],
//!     reclaim_horizon_ms: 100,
//!     idle_after_ms: 1_000,
//!     started_at_ms: 0,
//! })?;
//! // b borrows a's idle half for at most the horizon...
//! let own = fair.acquire("b", 50.0, 1_000, 2_000)?.expect("own guarantee");
//! let loan = fair.acquire("b", 50.0, 100, 2_000)?.expect("borrowed from a");
//! // ...and a, back at t=2010, is told exactly when it is whole again.
//! let refusal = fair.acquire("a", 50.0, 100, 2_010)?.unwrap_err();
//! assert_eq!(refusal.reason.as_str(), "guarantee_on_loan");
//! assert_eq!(refusal.retry_after_ms, Some(90));
//! # let _ = (own, loan);
//! # Ok::<(), shmsched::fair::FairError>(())
//! ```
//!
//! The same ledger lives in a region with `FairShare::shared(&region, &cfg)`.
//!
//! # Layers
//!
//! Lowest first (no module reaches upward):
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
//! - [`pump`], [`jobserver`], [`child`]: the shell front ends' logic
//!   (`shmsched pipe`, `jobserver`, `run`): a byte pump charging a Limiter
//!   before it passes, a make jobserver backed by Scheduler slots, and a
//!   command that dies with the process holding its units.
//! - [`cluster`]: a cluster-wide budget leased from Redis by one agent per
//!   region, moving a shared Scheduler's ceiling or Limiter's rate.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

// Regions rely on memfd_create, OFD byte locks, shared futexes, robust
// process-shared mutexes and /proc/self/fd: say so once, up front, instead
// of a page of unresolved libc items.
#[cfg(not(target_os = "linux"))]
compile_error!(
    "shmsched supports Linux only: its regions rely on memfd_create, OFD byte locks \
     (F_OFD_SETLK), shared futexes, robust process-shared mutexes and /proc/self/fd \
     (see docs/operations.md, \"Platform\")"
);

pub mod child;
pub mod cluster;
pub mod error;
pub mod fair;
mod few;
pub mod io;
pub mod jobserver;
pub mod limiter;
pub mod pressure;
pub mod priority;
pub mod pump;
pub mod region;
pub mod scheduler;
#[doc(hidden)]
pub mod stall;
mod sync;
// The only module with syscalls: not part of the API (hidden from the docs,
// reachable for the crate's own tests; it may change in any release). The
// clock users need is [`clock`].
#[doc(hidden)]
pub mod sys;

/// Time as shmsched reads it: `CLOCK_MONOTONIC`, the clock every process of
/// a host shares (FairShare's `now` and `started_at_ms` are on it), and the
/// TSC calibration a limiter region may share.
pub mod clock {
    pub use crate::sys::clock::{monotonic_ms, monotonic_ns, TscClock};
}

pub use error::{Error, Result};
pub use priority::Priority;

/// The region layout this build reads and writes: the header's layout
/// version (the same as `region::layout::LAYOUT_VERSION`).
pub const LAYOUT_VERSION: u32 = region::layout::LAYOUT_VERSION;

/// The object revision this build reads and writes for each kind of
/// object (a region's object area changes shape with it while the header's
/// layout version stays the same). A region of another revision was made by
/// another version of shmsched and is refused when an object binds.
pub fn object_revision(kind: region::ObjectKind) -> u64 {
    match kind {
        region::ObjectKind::Scheduler => scheduler::OBJECT_REVISION,
        region::ObjectKind::Limiter => limiter::OBJECT_REVISION,
        region::ObjectKind::FairShare => fair::region::OBJECT_REVISION,
    }
}

/// The object revision a region's header records (its kind's revision
/// parameter), to compare with [`object_revision`].
pub fn region_object_revision(h: &region::HeaderInfo) -> u64 {
    match h.kind {
        region::ObjectKind::Scheduler | region::ObjectKind::Limiter => h.params[1],
        region::ObjectKind::FairShare => h.params[0],
    }
}

/// The README's Rust examples, compiled as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
