//! A token-bucket rate limiter with seven priorities, debt force-through,
//! child limiters and stats — in one process, or shared by many processes
//! through a [`Region`].
//!
//! Tokens are usually bytes, but any integer unit works. The capacity of
//! the bucket equals its rate (tokens per second); refill is continuous from
//! elapsed time on `CLOCK_MONOTONIC` (the clock every process of a host
//! shares; read through a calibrated TSC where that is reliable, the same
//! calibration in every process of a region, see [`Clock`](crate::sys::clock::Clock)),
//! and a new bucket starts full. There is no timer thread: blocked
//! callers sleep until the instant the tokens they need will be there.
//!
//! ```
//! use shmsched::limiter::Limiter;
//! use shmsched::Priority;
//!
//! # fn main() -> shmsched::Result<()> {
//! let lim = Limiter::new(1_000_000)?;              // 1 MB/s, starts full
//! let g = lim.consume(64 * 1024, Priority::Normal)?; // blocks until charged
//! assert!(g.immediate);
//! assert!(lim.try_consume(1_000)?);                 // never blocks
//! assert!(!lim.try_consume(2_000_000)?);            // more than the capacity
//!
//! // A child caps this process's share on top of the parent's rate.
//! let mine = lim.child(250_000)?;
//! mine.consume(10_000, Priority::High)?;            // charged on both levels
//! assert_eq!(mine.stats().tokens_per_second, 250_000);
//!
//! // Invalid amounts are errors that name the value.
//! assert!(Limiter::new(0).is_err());
//! assert!(lim.consume(3_000_000_000, Priority::Low).is_err());
//! # Ok(()) }
//! ```
//!
//! # Rules (from the seed)
//!
//! - `tokens_per_second` is a positive integer up to 2,147,483,647; every
//!   consume is a non-negative integer up to the same bound.
//! - A consume goes at once (without queueing) when the bucket holds the
//!   tokens and nothing is queued at its priority or above; otherwise it
//!   queues at its priority (FIFO). Higher priorities drain first; a front
//!   blocked on tokens blocks only its own queue.
//! - `n == 0` consumes nothing and never waits on tokens: it goes at once
//!   when nothing is queued at all, otherwise it drains when it reaches the
//!   front of its queue, whatever the balance.
//! - `n` larger than the capacity is admitted once the bucket is full (into
//!   debt), or by the stall guard, whichever comes first, and counts in
//!   `forced`.
//! - Stall guard: a queue whose front makes no progress for
//!   [`STALL_TICKS`] × 100 ms (about 1 s) is forced through into debt on
//!   every level of the chain, counted once in `forced`; debt is repaid by
//!   the refill before anything else drains.
//! - In a region the bucket is exact across processes (see
//!   `bucket.rs`); queues and the stall guard are per process, as in the
//!   seed. Priorities hold across processes in the drain: a process does
//!   not charge refilled tokens to a queued waiter while another live
//!   process has a waiter queued at a higher priority (it wakes that
//!   process and sleeps on its own process's futex word, which the other
//!   process bumps when a waiter of its leaves the queue; it looks again
//!   at least every 50 ms, until its own stall guard forces its front
//!   through). The fast path (and `try_consume`) is closed while a consume
//!   waits in any process (a region-wide waiting-process bitmap), so the
//!   drain decides.
//! - [`Limiter::consume_async`] is the same consume as a future (no async
//!   runtime needed); a per-node pump thread, alive only while async
//!   waiters are queued, stands in for the sleeping thread.

mod bucket;
mod future;
mod node;
mod shared;
mod stats;
mod view;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

pub use future::Consume;
pub use stats::{LimiterQueueStats, LimiterStats, SharedLimiterStats};

use crate::error::{Error, Result};
use crate::priority::Priority;
use crate::region::Region;
use bucket::Gcra;
use node::{Home, Node};
use shared::SharedBucket;

/// The largest rate and the largest single consume: 2,147,483,647 (the
/// seed's signed 32-bit bound).
pub const MAX_TOKENS_PER_SECOND: u64 = i32::MAX as u64;

/// The largest single consume (same bound as the rate).
pub const MAX_CONSUME: u64 = i32::MAX as u64;

/// Length of one stall tick, in nanoseconds (100 ms).
pub const TICK_NS: u64 = 100_000_000;

/// Ticks without progress after which a queue's front is forced through
/// (10 × 100 ms ≈ 1 s).
pub const STALL_TICKS: u64 = 10;

/// Validates a rate: a positive integer up to [`MAX_TOKENS_PER_SECOND`].
pub(crate) fn check_rate(rate: u64) -> Result<u32> {
    if rate == 0 || rate > MAX_TOKENS_PER_SECOND {
        return Err(Error::InvalidArgument(format!(
            "tokens_per_second {rate} is out of range: must be a positive integer 1..={MAX_TOKENS_PER_SECOND}"
        )));
    }
    Ok(rate as u32)
}

#[inline]
fn check_consume(n: u64) -> Result<()> {
    if n > MAX_CONSUME {
        return Err(Error::InvalidArgument(format!(
            "consume of {n} tokens is out of range: must be a non-negative integer 0..={MAX_CONSUME}"
        )));
    }
    Ok(())
}

/// Parses a token count or rate given as text (CLI, config, FFI): a
/// non-negative integer up to 2,147,483,647, e.g. `"1000000"` or `"1e6"`.
/// Negative, fractional, NaN, infinite and too-large values are errors that
/// name the value. `positive` additionally rejects 0 (for a rate).
///
/// ```
/// use shmsched::limiter::parse_tokens;
/// assert_eq!(parse_tokens("1e6", true).unwrap(), 1_000_000);
/// assert!(parse_tokens("0", true).is_err());
/// assert!(parse_tokens("1.5", false).is_err());
/// assert!(parse_tokens("2147483648", false).is_err());
/// ```
pub fn parse_tokens(s: &str, positive: bool) -> Result<u32> {
    let t = s.trim();
    let x: f64 = t
        .parse()
        .map_err(|_| Error::InvalidArgument(format!("token count {s:?} is not a number")))?;
    let what = if positive {
        "a positive integer 1"
    } else {
        "a non-negative integer 0"
    };
    if !x.is_finite()
        || x.fract() != 0.0
        || x < 0.0
        || x > MAX_CONSUME as f64
        || (positive && x == 0.0)
    {
        return Err(Error::InvalidArgument(format!(
            "token count {s:?} is out of range: must be {what}..={MAX_CONSUME}"
        )));
    }
    Ok(x as u32)
}

/// How a consume went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// True if it was charged at once, without queueing (the seed's `true`
    /// return of `consume`).
    pub immediate: bool,
    /// True if it left the bucket in debt: a stall force-through, or a
    /// request larger than the capacity admitted on a full bucket.
    pub forced: bool,
}

/// A handle to a limiter (one level of a chain). Clones share it.
#[derive(Debug, Clone)]
pub struct Limiter {
    node: Arc<Node>,
}

impl Limiter {
    /// An in-process limiter of `tokens_per_second` (= capacity), full now.
    ///
    /// The first in-process limiter of a process calibrates the TSC (about
    /// 20 ms, once per process; see [`Clock::process`](crate::sys::clock::Clock::process)).
    pub fn new(tokens_per_second: u64) -> Result<Limiter> {
        let rate = check_rate(tokens_per_second)?;
        let gcra = Gcra::new(rate, crate::sys::clock::Clock::process().now_ns());
        Ok(Limiter {
            node: Arc::new(Node::new(gcra, Home::Local(AtomicU64::new(0)), None)),
        })
    }

    /// A limiter shared through `region`: one bucket for every process that
    /// binds it. A new region is initialised with `tokens_per_second` (and
    /// starts full); an existing one must have the same rate, else
    /// [`Error::Mismatch`]. Use [`attach`](Self::attach) to join whatever
    /// rate a region has.
    ///
    /// ```no_run
    /// use shmsched::limiter::Limiter;
    /// use shmsched::region::Region;
    /// use shmsched::Priority;
    /// # fn main() -> shmsched::Result<()> {
    /// let region = Region::open_or_create("bytes")?;
    /// let lim = Limiter::shared(&region, 16_000_000)?; // 16 MB/s for all processes
    /// lim.consume(8192, Priority::Normal)?;
    /// # Ok(()) }
    /// ```
    pub fn shared(region: &Region, tokens_per_second: u64) -> Result<Limiter> {
        Limiter::from_shared(SharedBucket::bind(region, Some(tokens_per_second))?)
    }

    /// Joins the limiter already initialised in `region`, whatever its rate.
    pub fn attach(region: &Region) -> Result<Limiter> {
        Limiter::from_shared(SharedBucket::bind(region, None)?)
    }

    fn from_shared(s: SharedBucket) -> Result<Limiter> {
        let gcra = s.gcra();
        Ok(Limiter {
            node: Arc::new(Node::new(gcra, Home::Shared(Box::new(s)), None)),
        })
    }

    /// A child limiter: its own bucket of `tokens_per_second` on top of this
    /// one. A consume through the child is charged on every level of the
    /// chain and goes only when every level has the tokens (a forced one is
    /// charged into debt on every level). The child is in-process, starts
    /// full, and has its own queues and stall guard. Children nest.
    pub fn child(&self, tokens_per_second: u64) -> Result<Limiter> {
        self.node.check_usable()?;
        let rate = check_rate(tokens_per_second)?;
        let gcra = Gcra::new(rate, self.node.now());
        Ok(Limiter {
            node: Arc::new(Node::new(
                gcra,
                Home::Local(AtomicU64::new(0)),
                Some(self.node.clone()),
            )),
        })
    }

    /// Consumes `n` tokens at `priority`, blocking until they are charged.
    ///
    /// Errors: [`Error::InvalidArgument`] if `n` exceeds [`MAX_CONSUME`];
    /// [`Error::Forked`] in a forked child; [`Error::BadRegion`] if the
    /// shared bucket word was overwritten.
    #[inline]
    pub fn consume(&self, n: u64, priority: Priority) -> Result<Grant> {
        check_consume(n)?;
        self.node.consume(n, priority, None)
    }

    /// Like [`consume`](Self::consume), giving up with [`Error::Timeout`]
    /// after `timeout`. A timed-out wait leaves the queue; through a chain,
    /// levels it was already charged on stay charged (tokens can be lost to
    /// a timeout, never created).
    pub fn consume_timeout(&self, n: u64, priority: Priority, timeout: Duration) -> Result<Grant> {
        check_consume(n)?;
        let deadline = self
            .node
            .now()
            .saturating_add(u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX));
        self.node.consume(n, priority, Some(deadline))
    }

    /// Consumes `n` tokens at `priority` without blocking a thread: the
    /// returned future completes when they are charged (same rules as
    /// [`consume`](Self::consume)). It needs no particular async runtime.
    ///
    /// Dropping the future while it waits removes its queued place; levels
    /// of a chain it was already charged on stay charged (tokens are lost to
    /// a cancellation, never created). Wrap it in your runtime's timeout for
    /// a deadline.
    ///
    /// ```
    /// use shmsched::limiter::Limiter;
    /// use shmsched::Priority;
    /// # fn main() -> shmsched::Result<()> {
    /// let lim = Limiter::new(1_000)?;
    /// let g = futures::executor::block_on(lim.consume_async(1_000, Priority::Normal))?;
    /// assert!(g.immediate);
    /// // The bucket is empty now: this one waits about 100 ms for the refill.
    /// let g = futures::executor::block_on(lim.consume_async(100, Priority::High))?;
    /// assert!(!g.immediate);
    /// # Ok(()) }
    /// ```
    pub fn consume_async(&self, n: u64, priority: Priority) -> Consume {
        Consume::new(self.node.clone(), n, priority, check_consume(n).err())
    }

    /// Consumes `n` only if every level of the chain holds `n` tokens now and
    /// nothing is queued in this limiter; never queues, never goes into debt
    /// (so `n` above the capacity is always `false`).
    #[inline]
    pub fn try_consume(&self, n: u64) -> Result<bool> {
        check_consume(n)?;
        self.node.try_consume(n)
    }

    /// The configured rate, which is also the capacity.
    pub fn tokens_per_second(&self) -> u32 {
        self.node.gcra().cap() as u32
    }

    /// The balance now (negative while in debt).
    pub fn tokens(&self) -> Result<i64> {
        self.node.tokens()
    }

    /// The parent limiter's handle, if this is a child.
    pub fn parent(&self) -> Option<Limiter> {
        self.node.parent().map(|p| Limiter { node: p.clone() })
    }

    /// Frees the process-table entries of dead processes sharing this
    /// limiter's region (a dead process holds no tokens; this only makes
    /// room and corrects the waiter gauges). Returns how many were reaped;
    /// 0 for an in-process limiter.
    pub fn reap(&self) -> Result<u32> {
        let mut n = &self.node;
        while let Some(p) = n.parent() {
            n = p;
        }
        match n.home() {
            Home::Shared(s) => s.reap(),
            Home::Local(_) => Ok(0),
        }
    }

    /// Leaves the region now: frees this process's entry in its process
    /// table (a dead or exited process's entry is otherwise reaped later).
    /// Refused while clones or children of this handle are alive, or while
    /// another object of this process is bound through the same `Region`.
    /// An in-process limiter has nothing to leave.
    pub fn detach(self) -> Result<()> {
        if std::sync::Arc::strong_count(&self.node) > 1 {
            return Err(Error::InvalidArgument(
                "cannot detach: other handles (clones or children) of this limiter are alive"
                    .into(),
            ));
        }
        let Home::Shared(s) = self.node.home() else {
            return Ok(());
        };
        if std::sync::Arc::strong_count(s.mapping()) > 1 {
            return Err(Error::InvalidArgument(
                "cannot detach: another object of this process is bound to the same region".into(),
            ));
        }
        s.mapping().deregister()
    }

    /// A snapshot of this level's gauges and counters.
    pub fn stats(&self) -> LimiterStats {
        self.node.stats()
    }
}
