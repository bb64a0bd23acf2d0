//! A token-bucket rate limiter with seven priorities, debt force-through,
//! child limiters and stats — in one process, or shared by many processes
//! through a [`Region`].
//!
//! Tokens are usually bytes, but any integer unit works. The capacity
//! (burst) of the bucket is one second of its rate unless set otherwise
//! ([`Limiter::with_capacity`], [`Limiter::set_capacity`]); refill is continuous from
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
//!   consume is a non-negative integer up to the same bound. The capacity
//!   (burst) is one second of rate unless set
//!   ([`Limiter::with_capacity`]); rate and capacity can change at run
//!   time ([`Limiter::set_rate`]), for every process sharing the bucket.
//! - A consume goes at once (without queueing) when the bucket holds the
//!   tokens and nothing waits at its priority or above; otherwise it
//!   queues at its priority (FIFO). Higher priorities drain first; a front
//!   blocked on tokens blocks only its own queue.
//! - `n == 0` consumes nothing and never waits on tokens: it goes at once
//!   when nothing waits at all, otherwise it drains when it reaches the
//!   front of its queue, whatever the balance.
//! - `n` larger than the capacity is admitted once the bucket is full (into
//!   debt), or by the stall guard, whichever comes first, and counts in
//!   `forced`.
//! - Stall guard: a queue whose front makes no progress for
//!   [`STALL_TICKS`] × 100 ms (about 1 s) is forced through into debt,
//!   counted in `forced`; debt is repaid by the refill before anything else
//!   drains, and nothing is forced on top of debt (so debt stays below one
//!   request).
//! - A chain (child → … → root) is charged level by level; a consume waits
//!   at the level that cannot charge it yet; if it gives up, the levels
//!   already charged are refunded.
//! - In a region the bucket is exact across processes (see `bucket.rs`),
//!   and so are the queues: priorities, FIFO order within a priority and
//!   the stall guard hold region-wide (see `root.rs`). A process charges
//!   its own waiter only when no higher waiter anywhere can go now; it
//!   never waits for a waiter that cannot.
//! - [`Limiter::consume_async`] is the same consume as a future (no async
//!   runtime needed).

mod bucket;
mod future;
mod node;
mod params;
mod root;
mod shared;

/// The revision of this kind's object area that this build reads and
/// writes (see [`crate::object_revision`]).
pub const OBJECT_REVISION: u64 = shared::OBJECT_REV;
mod stats;
mod tally;
mod timer;
mod view;
mod waiter;

use std::sync::Arc;
use std::time::Duration;

pub use future::Consume;
pub use stats::{LimiterQueueStats, LimiterStats, SharedLimiterStats};

use crate::error::{Error, Result};
use crate::priority::Priority;
use crate::region::Region;
use crate::sys::clock::read_tsc;
use bucket::Mode;
use node::{Home, Look, Node, Now};
use root::LimRoot;

/// The largest rate, capacity and single consume: 2,147,483,647 (the
/// seed's signed 32-bit bound).
pub const MAX_TOKENS_PER_SECOND: u64 = i32::MAX as u64;

/// The largest single consume (same bound as the rate).
pub const MAX_CONSUME: u64 = i32::MAX as u64;

/// The priority a [`Limiter::try_consume`] (which has none) is counted at
/// in the stats' `consumed` and `refunded` counters: the default one.
pub const TRY_PRIORITY: Priority = Priority::Normal;

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

/// Validates a capacity (burst): a positive integer up to
/// [`MAX_TOKENS_PER_SECOND`].
pub(crate) fn check_capacity(cap: u64) -> Result<u32> {
    if cap == 0 || cap > MAX_TOKENS_PER_SECOND {
        return Err(Error::InvalidArgument(format!(
            "capacity {cap} is out of range: must be a positive integer 1..={MAX_TOKENS_PER_SECOND}"
        )));
    }
    Ok(cap as u32)
}

#[cold]
pub(crate) fn corrupt_error(tat: u64, v: u64) -> Error {
    Error::BadRegion(format!(
        "limiter bucket word {tat} is more than {} tokens ahead of the clock {v}: it was overwritten",
        bucket::MAX_LEAD
    ))
}

/// The corrupt-word error as a consume's result, out of line: the first
/// looks call it last.
#[cold]
#[inline(never)]
fn corrupt_result<T>(tat: u64, v: u64) -> Result<T> {
    Err(corrupt_error(tat, v))
}

#[inline(always)]
fn check_consume(n: u64) -> Result<()> {
    if n > MAX_CONSUME {
        return Err(consume_range_error(n));
    }
    Ok(())
}

/// [`check_consume`]'s error, built out of line: the formatting inlined
/// into every consume cost it stack space and saved registers.
#[cold]
#[inline(never)]
fn consume_range_error(n: u64) -> Error {
    Error::InvalidArgument(format!(
        "consume of {n} tokens is out of range: must be a non-negative integer 0..={MAX_CONSUME}"
    ))
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

/// A grant charged at once, not into debt. Consumes return it (and
/// [`FORCED_AT_ONCE`]) as a constant rather than a `Grant` built from a
/// flag, so that it is written as one 16-bit store: written as two bytes,
/// it was read back by the caller as one word, which no store can forward
/// (measured: an in-process `consume` out of line took 1.16×
/// `governor`'s time with its grant stored as two bytes, 1.00× as one).
const AT_ONCE: Grant = Grant {
    immediate: true,
    forced: false,
};

/// A grant charged at once, into debt (see [`AT_ONCE`]).
const FORCED_AT_ONCE: Grant = Grant {
    immediate: true,
    forced: true,
};

/// A handle to a limiter (one level of a chain). Clones share it.
#[derive(Debug, Clone)]
pub struct Limiter {
    node: Arc<Node>,
}

impl Limiter {
    /// An in-process limiter of `tokens_per_second`, with a capacity of one
    /// second of rate, full now.
    ///
    /// The first in-process limiter of a process calibrates the TSC (about
    /// 20 ms, once per process; see [`Clock::process`](crate::sys::clock::Clock::process)).
    pub fn new(tokens_per_second: u64) -> Result<Limiter> {
        Limiter::with_capacity(tokens_per_second, tokens_per_second)
    }

    /// An in-process limiter of `tokens_per_second` whose bucket holds at
    /// most `capacity` tokens (its burst), full now.
    ///
    /// ```
    /// use shmsched::limiter::Limiter;
    /// # fn main() -> shmsched::Result<()> {
    /// let lim = Limiter::with_capacity(1_000, 100)?; // 1000/s, bursts of 100
    /// assert!(lim.try_consume(100)?);
    /// assert!(!lim.try_consume(1)?); // the burst is spent
    /// # Ok(()) }
    /// ```
    pub fn with_capacity(tokens_per_second: u64, capacity: u64) -> Result<Limiter> {
        let rate = check_rate(tokens_per_second)?;
        let cap = check_capacity(capacity)?;
        Ok(Limiter {
            node: Node::local(rate, cap, None),
        })
    }

    /// A limiter shared through `region`: one bucket for every process that
    /// binds it, with a capacity of one second of rate. A new region is
    /// initialised with `tokens_per_second` (and starts full); an existing
    /// one must have been created with the same rate and a capacity of one
    /// second of it, else [`Error::Mismatch`] naming what differs (its rate
    /// and capacity in force may have changed since, see
    /// [`set_rate`](Self::set_rate): the check is against what the region
    /// was created with). Use [`attach`](Self::attach) to join whatever
    /// rate and capacity a region has.
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
        Limiter::shared_with_capacity(region, tokens_per_second, tokens_per_second)
    }

    /// Like [`shared`](Self::shared), with a capacity (burst) of `capacity`
    /// tokens; an existing region must have been created with the same
    /// rate and capacity.
    pub fn shared_with_capacity(
        region: &Region,
        tokens_per_second: u64,
        capacity: u64,
    ) -> Result<Limiter> {
        Limiter::from_root(LimRoot::bind(region, Some((tokens_per_second, capacity)))?)
    }

    /// Joins the limiter already initialised in `region`, whatever its rate.
    pub fn attach(region: &Region) -> Result<Limiter> {
        Limiter::from_root(LimRoot::bind(region, None)?)
    }

    fn from_root(root: Arc<LimRoot>) -> Result<Limiter> {
        Ok(Limiter {
            node: Node::shared(root),
        })
    }

    /// A child limiter: its own bucket of `tokens_per_second` (capacity one
    /// second of rate) on top of this one. A consume through the child is
    /// charged on every level of the chain; it waits at any level that
    /// cannot charge it yet. The child is in-process, starts full, and has
    /// its own queues and stall guard. Children nest.
    pub fn child(&self, tokens_per_second: u64) -> Result<Limiter> {
        self.child_with_capacity(tokens_per_second, tokens_per_second)
    }

    /// Like [`child`](Self::child), with a capacity of `capacity` tokens.
    pub fn child_with_capacity(&self, tokens_per_second: u64, capacity: u64) -> Result<Limiter> {
        self.node.check_usable()?;
        let rate = check_rate(tokens_per_second)?;
        let cap = check_capacity(capacity)?;
        Ok(Limiter {
            node: Node::local(rate, cap, Some(self.node.clone())),
        })
    }

    /// Consumes `n` tokens at `priority`, blocking until they are charged
    /// on every level of the chain.
    ///
    /// Errors: [`Error::InvalidArgument`] if `n` exceeds [`MAX_CONSUME`];
    /// [`Error::Forked`] in a forked child; [`Error::BadRegion`] if the
    /// shared bucket was overwritten.
    #[inline]
    pub fn consume(&self, n: u64, priority: Priority) -> Result<Grant> {
        // The first look (`Node::first_look`): 1..=MAX_CONSUME tokens (one
        // test for both bounds) at a root, in code that calls nothing;
        // every other outcome is finished by a function called last, with
        // what it needs. Out of line (where the compiler does not inline
        // this into its caller), this then saves one or two registers
        // before the bucket's CAS, which waits for every store before it
        // (the general fast path saved six). The functions called take
        // the priority's index (`tier`), which the first look needs too:
        // one register less to keep.
        let tier = priority.index();
        if n.wrapping_sub(1) < MAX_CONSUME {
            if self.node.parent().is_some() {
                return self.consume_chain_look(n, tier);
            }
            match self.node.look(read_tsc(), n, tier, Mode::Normal, true) {
                Look::Charged => return Ok(AT_ONCE),
                Look::Refused => return self.consume_walk(n, tier),
                Look::Corrupt { tat, v } => return corrupt_result(tat, v),
                Look::Declined => {}
            }
        }
        self.consume_general(n, tier)
    }

    /// [`consume`](Self::consume) but for its first look, at priority
    /// index `tier`: the fast path at a root (the owner thread without the
    /// fork test, another with it and counting on the shared words), then
    /// the chain and the queue.
    #[inline(never)]
    fn consume_general(&self, n: u64, tier: usize) -> Result<Grant> {
        let priority = Priority::ALL[tier];
        if n.wrapping_sub(1) < MAX_CONSUME {
            if self.node.parent().is_none() {
                let charged = if self.node.owned_here() {
                    self.node.fast(n, priority, &mut Now::default(), true)?
                } else {
                    self.node.check_usable()?;
                    self.node.fast(n, priority, &mut Now::default(), false)?
                };
                // One constant each (see `AT_ONCE`).
                match charged {
                    Some(false) => return Ok(AT_ONCE),
                    Some(true) => return Ok(FORCED_AT_ONCE),
                    None => {}
                }
            }
            return self.consume_chain(n, priority, None);
        }
        check_consume(n)?;
        self.consume_chain(n, priority, None)
    }

    /// [`consume`](Self::consume) through a chain (`n` in range, at
    /// priority index `tier`): the first look at every level, leaf first,
    /// with one reading of the TSC, in code that calls nothing; at the
    /// first level it does not charge, the rest of the walk from that
    /// level ([`consume_walk_from`](Self::consume_walk_from)), the levels
    /// below it charged. The fork test once, at the leaf (its counter's
    /// owner, or the test itself): every level of a chain was made in the
    /// leaf's generation.
    #[inline(never)]
    fn consume_chain_look(&self, n: u64, tier: usize) -> Result<Grant> {
        let tick = read_tsc();
        let mut level = &*self.node;
        let mut leaf = true;
        loop {
            let look = level.look(tick, n, tier, Mode::Normal, leaf);
            leaf = false;
            if look != Look::Charged {
                // Queued, declined or corrupt here: the general walk from
                // this level decides (and refunds the levels below if it
                // fails).
                return self.consume_walk_from(level, n, tier);
            }
            match level.parent() {
                Some(p) => level = p,
                None => return Ok(AT_ONCE),
            }
        }
    }

    /// Like [`consume`](Self::consume), giving up with [`Error::Timeout`]
    /// after `timeout` (any `Duration`; one too long to represent waits
    /// forever). A timed-out consume leaves its queue, and the levels of a
    /// chain it was already charged on are refunded.
    pub fn consume_timeout(&self, n: u64, priority: Priority, timeout: Duration) -> Result<Grant> {
        check_consume(n)?;
        self.consume_chain(n, priority, std::time::Instant::now().checked_add(timeout))
    }

    /// The chain, level by level from the leaf: one walk, one reading of
    /// the clock for the levels charged at once (read afresh after a
    /// wait), the fork checked once (every level of a chain was made in
    /// the generation of the leaf: a child is made only from a usable
    /// handle). `n` is in range (the caller checked).
    #[inline(never)]
    fn consume_chain(
        &self,
        n: u64,
        priority: Priority,
        deadline: Option<std::time::Instant>,
    ) -> Result<Grant> {
        self.node.check_usable()?;
        self.walk_from(&self.node, n, priority, deadline)
    }

    /// [`consume_chain`](Self::consume_chain)'s walk from `from`, a level
    /// of this handle's chain whose levels below were charged `n` at once
    /// (by a first look), at priority index `tier`, without a deadline.
    /// The handle is usable (the first look checked).
    #[inline(never)]
    fn consume_walk_from(&self, from: &Node, n: u64, tier: usize) -> Result<Grant> {
        self.walk_from(from, n, Priority::ALL[tier], None)
    }

    /// [`consume_chain`](Self::consume_chain)'s walk for a root whose
    /// first look found its bucket short of tokens (or, in-process, a
    /// waiter ahead), at priority index `tier`. (Not `consume_walk_from`
    /// with the root: a call that passes only what the caller has kept.)
    #[inline(never)]
    fn consume_walk(&self, n: u64, tier: usize) -> Result<Grant> {
        self.walk_from(&self.node, n, Priority::ALL[tier], None)
    }

    /// The walk of [`consume_chain`](Self::consume_chain) from `from` (the
    /// leaf, or a level whose levels below were charged `n` at once), on a
    /// usable handle.
    #[inline(always)]
    fn walk_from(
        &self,
        from: &Node,
        n: u64,
        priority: Priority,
        deadline: Option<std::time::Instant>,
    ) -> Result<Grant> {
        let mut grant = Grant {
            immediate: true,
            forced: false,
        };
        let mut now = Now::default();
        let mut node = from;
        loop {
            let r = match node.fast(n, priority, &mut now, false) {
                Ok(Some(debt)) => Ok(debt),
                Ok(None) => {
                    grant.immediate = false;
                    now = Now::default();
                    let arc = self.level_arc(node);
                    let w = arc.enqueue(n, priority, false);
                    arc.wait(&w, deadline).inspect(|&debt| {
                        if debt && matches!(node.home(), Home::Shared(_)) {
                            node.note_forced();
                        }
                    })
                }
                Err(e) => Err(e),
            };
            match r {
                Ok(debt) => {
                    grant.forced |= debt;
                    match node.parent() {
                        None => return Ok(grant),
                        Some(p) => node = p,
                    }
                }
                Err(e) => {
                    // Nothing charged and unused is lost.
                    self.refund_below(node, n, priority);
                    return Err(e);
                }
            }
        }
    }

    /// The `Arc` of a level of this handle's chain.
    fn level_arc(&self, level: &Node) -> Arc<Node> {
        let mut n = &self.node;
        while !std::ptr::eq(&**n, level) {
            n = n.parent().expect("the level is in this chain");
        }
        n.clone()
    }

    /// Consumes `n` tokens at `priority` without blocking a thread: the
    /// returned future completes when they are charged (same rules as
    /// [`consume`](Self::consume)). It needs no particular async runtime.
    ///
    /// Dropping the future while it waits removes its queued place and
    /// refunds the levels it was already charged on.
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
    /// nothing waits at any level (in any process, for a shared root);
    /// never queues, never goes into debt (so `n` above the capacity is
    /// always `false`). Counted at [`TRY_PRIORITY`]; see
    /// [`try_consume_at`](Self::try_consume_at) to count at another.
    #[inline]
    pub fn try_consume(&self, n: u64) -> Result<bool> {
        self.try_consume_at(n, TRY_PRIORITY)
    }

    /// [`try_consume`](Self::try_consume), counted at `priority` in the
    /// stats' `consumed` counters (and, on a chain that refuses part-way,
    /// the levels already charged are refunded at `priority`). The rule is
    /// the same whatever the priority: it refuses if anything waits at any
    /// priority on any level of the chain, so it never overtakes a waiter.
    /// For a first attempt that queues with [`consume`](Self::consume) at
    /// the same priority only if this refuses.
    ///
    /// ```
    /// use shmsched::limiter::Limiter;
    /// use shmsched::Priority;
    /// # fn main() -> shmsched::Result<()> {
    /// let lim = Limiter::with_capacity(1_000, 100)?;
    /// assert!(lim.try_consume_at(60, Priority::High)?);
    /// assert!(!lim.try_consume_at(60, Priority::Low)?); // 40 left
    /// let st = lim.stats();
    /// assert_eq!(st.queues[Priority::High.index()].consumed, 60);
    /// assert_eq!(st.queues[Priority::Low.index()].consumed, 0);
    /// # Ok(()) }
    /// ```
    ///
    /// Errors: as [`try_consume`](Self::try_consume).
    #[inline]
    pub fn try_consume_at(&self, n: u64, priority: Priority) -> Result<bool> {
        // As in `consume`: the first look at a root, in code that calls
        // nothing; everything else out of line, called last.
        let tier = priority.index();
        if n.wrapping_sub(1) < MAX_CONSUME && self.node.parent().is_none() {
            match self.node.look(read_tsc(), n, tier, Mode::Exact, true) {
                Look::Charged => return Ok(true),
                Look::Refused => return Ok(false),
                Look::Corrupt { tat, v } => return corrupt_result(tat, v),
                Look::Declined => {}
            }
        }
        self.try_slow(n, tier)
    }

    /// [`try_consume_at`](Self::try_consume_at) but for its first look, at
    /// priority index `tier`: the range and fork tests, then one level or
    /// the chain.
    #[inline(never)]
    fn try_slow(&self, n: u64, tier: usize) -> Result<bool> {
        let priority = Priority::ALL[tier];
        check_consume(n)?;
        self.node.check_usable()?;
        if self.node.parent().is_none() {
            return self
                .node
                .try_level(n, priority.index(), &mut Now::default(), false);
        }
        self.try_chain(n, priority)
    }

    /// [`try_consume_at`](Self::try_consume_at) through a chain: one walk,
    /// one reading of the clock; a refusal or an error part-way refunds
    /// the levels already charged.
    #[inline(never)]
    fn try_chain(&self, n: u64, priority: Priority) -> Result<bool> {
        let mut now = Now::default();
        let mut node = &*self.node;
        loop {
            match node.try_level(n, priority.index(), &mut now, false) {
                Ok(true) => {}
                r => {
                    self.refund_below(node, n, priority);
                    return r;
                }
            }
            match node.parent() {
                None => return Ok(true),
                Some(p) => node = p,
            }
        }
    }

    /// Gives back `n` tokens that a completed consume of `n` through this
    /// handle was charged and will not use (for example an async wait whose
    /// grant raced its cancellation): every level of the chain is refunded,
    /// as a consume that gives up is, and the region's queue moves on.
    /// Tokens are given back only up to what the levels hold at most; a
    /// refund of more than was charged is the caller's error (it creates
    /// capacity). `priority` is the consume's: the refund counts in that
    /// priority's `refunded` counter at every level. For the crate's I/O
    /// adapters (bytes charged that never moved) and the C ABI's waitset;
    /// hidden, because a refund the caller was not charged for creates
    /// tokens.
    #[doc(hidden)]
    pub fn refund(&self, n: u64, priority: Priority) {
        let mut c = &*self.node;
        loop {
            c.refund(n, priority.index());
            match c.parent() {
                Some(p) => c = p,
                None => break,
            }
        }
    }

    /// Refunds `n` at the levels of this handle's chain below `level` (the
    /// ones a consume that stopped at `level` was charged on): no list is
    /// kept, they are the chain from the leaf up to `level`.
    #[cold]
    fn refund_below(&self, level: &Node, n: u64, priority: Priority) {
        let mut c = &*self.node;
        while !std::ptr::eq(c, level) {
            c.refund(n, priority.index());
            let Some(p) = c.parent() else { break };
            c = p;
        }
    }

    /// The largest single charge the throttled I/O adapters make: a quarter
    /// of the smallest rate or capacity along the chain (at least 1), so no
    /// charge needs more than a quarter of any level's burst, nor waits for
    /// more than a quarter second of any level's refill.
    pub(crate) fn io_chunk(&self) -> u64 {
        let mut least = u64::MAX;
        let mut node = Some(&self.node);
        while let Some(n) = node {
            if let Ok(p) = n.params() {
                least = least.min(p.gcra.rate()).min(p.gcra.cap());
            }
            node = n.parent();
        }
        (least / 4).max(1)
    }

    /// The rate in force (tokens per second).
    pub fn tokens_per_second(&self) -> u32 {
        self.node.params().map_or(0, |p| p.gcra.rate() as u32)
    }

    /// The capacity (burst) in force, in tokens.
    pub fn capacity(&self) -> u32 {
        self.node.params().map_or(0, |p| p.gcra.cap() as u32)
    }

    /// Changes this level's rate from now on. For a shared limiter every
    /// process sees the new rate at once; tokens already refilled are kept
    /// (the bucket's clock is re-based, it does not jump).
    pub fn set_rate(&self, tokens_per_second: u64) -> Result<()> {
        self.node.check_usable()?;
        let rate = check_rate(tokens_per_second)?;
        self.node.set_params(Some(rate), None).map(|_| ())
    }

    /// Changes this level's capacity (burst) from now on; for a shared
    /// limiter, for every process. The tokens already there are kept, up to
    /// the new capacity: the balance becomes `min(tokens, capacity)`, so a
    /// change never creates tokens (raising it on a full bucket leaves the
    /// bucket as it was, to refill at the rate) nor debt (lowering it drops
    /// only what is above the new capacity).
    pub fn set_capacity(&self, capacity: u64) -> Result<()> {
        self.node.check_usable()?;
        let cap = check_capacity(capacity)?;
        self.node.set_params(None, Some(cap)).map(|_| ())
    }

    /// The wait registry of the region this limiter's root is shared
    /// through (for crate modules that work on the region: the cluster
    /// agent).
    #[allow(dead_code)]
    pub(crate) fn shared_registry(&self) -> Option<&crate::region::registry::Registry> {
        let mut n = &self.node;
        while let Some(p) = n.parent() {
            n = p;
        }
        match n.home() {
            Home::Shared(r) if !r.forked() => Some(r.bucket().reg()),
            _ => None,
        }
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
    /// limiter's region (a dead process holds no tokens; this clears its
    /// waiting state and makes room). Returns how many were reaped; 0 for
    /// an in-process limiter.
    pub fn reap(&self) -> Result<u32> {
        let mut n = &self.node;
        while let Some(p) = n.parent() {
            n = p;
        }
        match n.home() {
            Home::Shared(r) => {
                let k = r.bucket().reap()?;
                r.drain_now();
                Ok(k)
            }
            Home::Local(_) => Ok(0),
        }
    }

    /// Leaves the region now: frees this process's entry in its process
    /// table (a dead or exited process's entry is otherwise reaped later).
    /// Refused while clones or children of this handle are alive, or while
    /// another object or handle of this process is bound through the same
    /// `Region`. An in-process limiter has nothing to leave.
    pub fn detach(self) -> Result<()> {
        if Arc::strong_count(&self.node) > 1 {
            return Err(Error::InvalidArgument(
                "cannot detach: other handles (clones or children) of this limiter are alive"
                    .into(),
            ));
        }
        let Home::Shared(root) = self.node.home() else {
            return Ok(());
        };
        if Arc::strong_count(root) > 1 {
            return Err(Error::InvalidArgument(
                "cannot detach: another limiter handle of this process shares the region".into(),
            ));
        }
        let map = root.bucket().mapping();
        if Arc::strong_count(map) > 1 {
            return Err(Error::InvalidArgument(
                "cannot detach: another object of this process is bound to the same region".into(),
            ));
        }
        root.bucket().reg().leave();
        map.deregister()
    }

    /// A snapshot of this level's gauges and counters.
    pub fn stats(&self) -> LimiterStats {
        self.node.stats()
    }
}
