//! Beyond one host: a cluster-wide budget leased from Redis, with local
//! acquires unchanged.
//!
//! A service running on many hosts often needs one budget for the fleet
//! (connections to a shared database, calls to a rate-limited API, a
//! licence count). Here each host keeps its region exactly as before —
//! acquires and consumes stay local, with no Redis on their path — and one
//! process per region, the **agent**, leases a block of the cluster budget
//! from Redis and moves the region to it: a [`Scheduler`]'s run-time
//! ceiling ([`Scheduler::set_ceiling`]) or a [`Limiter`]'s rate
//! ([`Limiter::set_rate`]; the bucket stays local).
//!
//! ```no_run
//! use shmsched::cluster::{Agent, AgentConfig};
//! use shmsched::region::Region;
//! use shmsched::scheduler::Scheduler;
//! use shmsched::Priority;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let region = Region::open_or_create("db-pool")?;
//! let sched = Scheduler::shared(&region, 64)?; // at most 64 on this host
//! // 100 connections for the whole fleet; this host takes its share.
//! let agent = Agent::start(&sched, AgentConfig::new("redis://127.0.0.1/", "db", 100))?;
//! let permit = sched.acquire(Priority::High)?; // local, as fast as ever
//! # drop(permit); drop(agent);
//! # Ok(()) }
//! ```
//!
//! # The protocol
//!
//! - **Who renews.** Every process of a host may run an [`Agent`] on the
//!   region; the one holding the region's agent lock (an owner id taken by
//!   CAS, taken over when that process is dead by kernel liveness) renews,
//!   the others stand by, take over when it dies, and act as a watchdog: a
//!   lease left past its deadline by a stuck agent is lowered to the safe
//!   capacity by a standby.
//! - **Every renew period R** (default 1 s) the agent sends one script
//!   call (`lease.lua`, under one hash tag, time from Redis' `TIME` only):
//!   its *wants* per priority band (recent peak use plus queued demand),
//!   what it *has* (what it may hold now), its weight, its safe capacity and
//!   its fencing token. The script water-fills the pool over the hosts'
//!   wants and answers with a grant, a deadline and the token. The grant
//!   becomes the region's ceiling (safe + grant).
//! - **Fencing.** Registering takes a new token (`HINCRBY`); a renewal with
//!   any other token than the record's is refused, and the agent registers
//!   again. A takeover always registers anew.
//! - **Sequencing.** Every request carries a number that grows per request
//!   of a client (at least the wall clock in µs, so a takeover starts above
//!   the old agent); the script refuses one not above the last it accepted
//!   for the host ([`ClusterError::OutOfSequence`]): a renewal delayed in
//!   the network never overwrites a later one.
//! - **Acknowledged grants.** Every request also carries the number of the
//!   last reply its client read. A request showing that the previous reply
//!   was never read (a timed-out call drops its connection, and the agent
//!   never has two requests in flight) caps the host's grant at what it
//!   reports it has: a grant the host did not learn returns to the others
//!   at its next request, within one renew period R (or when its record
//!   expires, one TTL, if no request arrives).
//! - **Cost.** One renewal is O(log hosts) in Redis: per-band aggregates
//!   and one sorted set per band (hosts by want/weight) give the water
//!   level; the boundary of saturated hosts moves at most 32 hosts per call
//!   and at most 64 expired records are dropped per call. Keys:
//!   `{shmsched:NAME}:meta`, `:hosts`, `:dl`, `:band:1..7`, one hash tag.
//! - **Lapses.** The lease is valid for the TTL (default 10 R) from the
//!   instant the host *sent* the request (its own monotonic clock, so
//!   clock differences between hosts and Redis do not matter). Without a
//!   renewal, the agent lowers the region to its safe capacity a drain
//!   time (default TTL/4) before that deadline, so that holders of the
//!   lapsing units have time to release before Redis gives them away.
//! - **The region enforces the lapse**, whether or not any agent lives.
//!   Before it raises the level, the agent records in the region a
//!   `CLOCK_MONOTONIC` deadline (the lease's deadline minus the drain time)
//!   and the safe level, and sets the gate's `GATE_LEASED` bit. The fast
//!   paths already test the gate word once; the bit joins the mask of that
//!   one test (no new load, no clock read for a region without a lease).
//!   With the bit set, a fast path reads the deadline and
//!   `CLOCK_MONOTONIC_COARSE` (a few ns, no TSC) and takes as without a
//!   lease while the deadline is more than
//!   [`COARSE_SLACK_NS`](crate::sys::clock::COARSE_SLACK_NS) (100 ms, more
//!   than the coarse clock's lag at any common `HZ`, a stalled timekeeping
//!   CPU included) ahead; nearer,
//!   admissions go to the cold side, which reads the
//!   precise clock and, once the deadline has passed, lowers the
//!   ceiling or rate to the safe level (idempotent: every process may do
//!   it; a scheduler's take is then capped by the ceiling against the exact
//!   count). A lapse and a lease's end are ordered: a scheduler's lapse
//!   lowers under the region's ceiling lock after reading the deadline
//!   again there, where [`release`] and a leaving agent disarm and restore;
//!   a limiter's lapse reads the deadline again on each attempt to publish
//!   its parameters. A SIGKILLed or SIGSTOPped lone agent therefore costs nothing:
//!   the host is at its safe capacity by the deadline. An agent leaving
//!   without a standby restores the region's own level (recorded by the
//!   first agent); after a crash, [`release`] (`shmsched cluster release`)
//!   or `shmsched set` does.
//! - **Learning mode.** When Redis lost its state (restart, failover to an
//!   empty replica: the epoch key is missing) the script grants, for one
//!   TTL, only what each host reports it has, so nobody grows while the
//!   picture rebuilds; every lease from before the loss has lapsed or been
//!   renewed by then.
//!
//! # What it guarantees
//!
//! Let C be the budget's capacity and S its safe reserve; the pool P = C −
//! S is leased, and each host's safe capacity comes out of S (configure
//! them so that they fit: the script refuses a host whose safe capacity
//! would make the live hosts' sum exceed S).
//!
//! - **Σ what hosts may hold ≤ C.** In Redis, the sum over hosts of
//!   max(grant, has) never exceeds P: a host being shrunk keeps min(has,
//!   target) until its holders release, and its surplus goes to others only
//!   after it reports the release. On the hosts, a ceiling is safe + grant
//!   while leased and safe after a lapse; safe capacities fit in S. The one
//!   exception is a holder that keeps a unit past its host's lapse by more
//!   than the drain time: nothing is revoked, and Redis cannot know.
//! - **An efficiency limiter after a failover.** A Redis failover to a
//!   replica that lags can hand out grants from a stale picture: at most
//!   one TTL of stale grants, since every host renews (and reports what it
//!   has) within R and every lease lapses within a TTL. A failover to an
//!   empty replica is a loss of state: learning mode.
//! - **Redis down or stopped.** Hosts keep their grants until their
//!   deadlines, then run on their safe capacities (default 0: fail closed)
//!   until Redis answers again.
//! - **A host that dies** stops renewing; its record expires after one TTL
//!   and its units return to the pool.
//!
//! Limiters lease shares of the rate the same way; cross-host FairShare is
//! out of scope for now.
//!
//! [`Scheduler`]: crate::scheduler::Scheduler
//! [`Scheduler::set_ceiling`]: crate::scheduler::Scheduler::set_ceiling
//! [`Limiter`]: crate::limiter::Limiter
//! [`Limiter::set_rate`]: crate::limiter::Limiter::set_rate

mod agent;
mod client;
mod config;
mod target;
mod view;

pub use agent::{Agent, AgentStatus, Role};
#[doc(hidden)]
pub use client::use_lease_script;
pub use client::{BudgetClient, BudgetState, HostRecord, RenewReply, RenewRequest, BANDS};
pub use config::AgentConfig;
pub use target::Target;
pub use view::ClusterView;

pub use crate::region::registry::Lease;

use std::fmt;

/// Holds a region at `level` until `until`, after which every process of
/// the host runs it at `safe` (a scheduler's ceiling, a limiter's rate; a
/// limiter's burst scales with the rate), with no thread and no agent
/// needed: the region's admissions read the deadline. What an [`Agent`]
/// does on each renewal, for callers that lease from elsewhere (and for
/// tests). The level is clamped to what the object accepts; `safe` must
/// not be above `level`.
///
/// Errors: a handle not shared through a region, `safe` above `level`, a
/// level the object refuses.
pub fn lease_until(
    target: impl Into<Target>,
    level: u64,
    safe: u64,
    until: std::time::Instant,
) -> Result<(), ClusterError> {
    let target = target.into();
    if safe > level {
        return Err(ClusterError::Config(format!(
            "safe level {safe} is above the leased level {level}"
        )));
    }
    let reg = target.registry()?;
    let ratio = target.burst_ratio();
    if !reg.lease_guard().armed {
        let (own, burst) = target.own();
        reg.record_own(own, burst);
    }
    let now = std::time::Instant::now();
    let left = until.saturating_duration_since(now);
    let fall_ns = crate::sys::clock::monotonic_ns()
        .saturating_add(left.as_nanos().min(u128::from(u64::MAX / 2)) as u64)
        .max(1);
    reg.arm_lease(fall_ns, safe, target.burst_at(safe, ratio));
    target.apply(level, ratio)
}

/// What [`release`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Released {
    /// A lease was armed on the region (its deadline and safe level).
    pub was_armed: bool,
    /// The level (ceiling or rate) the region is at now, if this call moved
    /// it back to the region's own level.
    pub restored: Option<u64>,
}

/// Ends a lease's hold on a region whose agent is gone (it crashed, or was
/// SIGKILLed): with `restore`, moves the object back to its own level
/// recorded by the first agent (`shmsched cluster release`); without,
/// leaves the level as the caller set it (`shmsched set`). Either way the
/// deadline and `GATE_LEASED` are cleared (the fast paths open again) and
/// the recorded lease reads mode `none`.
///
/// Errors: a live agent holds the region (its pid named: stop it first; it
/// restores the region itself on a clean exit), a handle not shared
/// through a region.
pub fn release(target: impl Into<Target>, restore: bool) -> Result<Released, ClusterError> {
    let target = target.into();
    let reg = target.registry()?;
    if !reg.try_become_agent() {
        return Err(ClusterError::Config(format!(
            "a live agent (owner id {}) holds this region: stop it (SIGTERM) and it restores              the region's own level itself",
            reg.agent_owner()
        )));
    }
    // Resign whatever happens below: an error must not leave the region
    // with an agent nobody runs (a standby would wait for it for ever).
    struct Resign<'a>(&'a crate::region::registry::Registry);
    impl Drop for Resign<'_> {
        fn drop(&mut self) {
            self.0.resign_agent();
        }
    }
    let _resign = Resign(reg);
    let g = reg.lease_guard();
    let restore = g
        .own_level
        .filter(|_| restore)
        .map(|own| (own, g.own_burst));
    target.end_lease(restore)?;
    let restored = restore.map(|_| target.own().0);
    let mut l = reg.lease().unwrap_or_default();
    l.grant = 0;
    l.deadline_unix_ms = 0;
    l.mode = LeaseMode::None.to_word();
    reg.set_lease(&l);
    Ok(Released {
        was_armed: g.armed,
        restored,
    })
}

/// The mode of a lease, as recorded in the region ([`Lease::mode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseMode {
    /// No lease yet: the region runs on its safe capacity.
    None,
    /// Leased: the region runs on safe + grant.
    Normal,
    /// Leased while Redis relearns its state: the grant is what the host
    /// had.
    Learning,
    /// The lease lapsed (or the agent stopped): the region runs on its safe
    /// capacity.
    Lapsed,
}

impl LeaseMode {
    /// The word stored in the region.
    pub fn to_word(self) -> u64 {
        match self {
            LeaseMode::None => 0,
            LeaseMode::Normal => 1,
            LeaseMode::Learning => 2,
            LeaseMode::Lapsed => 3,
        }
    }

    /// The mode a stored word means (an unknown word is an error naming it).
    pub fn from_word(w: u64) -> Result<LeaseMode, ClusterError> {
        Ok(match w {
            0 => LeaseMode::None,
            1 => LeaseMode::Normal,
            2 => LeaseMode::Learning,
            3 => LeaseMode::Lapsed,
            w => {
                return Err(ClusterError::BadRegion(format!(
                    "lease mode word {w} is not one of 0..=3"
                )))
            }
        })
    }

    /// Its name (`none`, `normal`, `learning`, `lapsed`).
    pub fn name(self) -> &'static str {
        match self {
            LeaseMode::None => "none",
            LeaseMode::Normal => "normal",
            LeaseMode::Learning => "learning",
            LeaseMode::Lapsed => "lapsed",
        }
    }

    /// True while a grant is in force.
    pub fn leased(self) -> bool {
        matches!(self, LeaseMode::Normal | LeaseMode::Learning)
    }
}

/// What can go wrong in the cluster tier. Messages name the bad value and
/// the limit.
#[derive(Debug)]
#[non_exhaustive]
pub enum ClusterError {
    /// A configuration value is out of range or malformed.
    Config(String),
    /// Redis could not be reached or answered with an error.
    Redis(String),
    /// Redis answered something the script never sends (a bad reply is an
    /// error, never a panic).
    BadReply(String),
    /// The budget in Redis has another capacity or reserve than this agent.
    Mismatch {
        /// The budget's name.
        budget: String,
        /// What Redis holds: (capacity, reserve).
        stored: (u64, u64),
        /// What this agent was configured with: (capacity, reserve).
        ours: (u64, u64),
    },
    /// The live hosts' safe capacities would exceed the budget's reserve.
    SafeOverReserve {
        /// The sum of the live hosts' safe capacities, this host included.
        sum: u64,
        /// The budget's safe reserve.
        reserve: u64,
    },
    /// The script refused a request whose sequence number is not above the
    /// last one it accepted for the host (a request delayed in the network,
    /// or another client of the host ahead of this one). The client moves
    /// past it; the next renewal is accepted.
    OutOfSequence {
        /// This request's number.
        seq: u64,
        /// The last number accepted for the host.
        last: u64,
    },
    /// The region (or its handle) cannot carry an agent.
    Region(crate::Error),
    /// The lease words in a region are not valid.
    BadRegion(String),
}

impl fmt::Display for ClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterError::Config(m) => write!(f, "cluster config: {m}"),
            ClusterError::Redis(m) => write!(f, "redis: {m}"),
            ClusterError::BadReply(m) => write!(f, "bad reply from the lease script: {m}"),
            ClusterError::Mismatch {
                budget,
                stored,
                ours,
            } => write!(
                f,
                "budget {budget:?} has capacity {} and safe reserve {} in Redis; this agent says \
                 capacity {} and reserve {} (every agent of a budget must agree; to change it, \
                 stop the agents and delete the budget's keys)",
                stored.0, stored.1, ours.0, ours.1
            ),
            ClusterError::SafeOverReserve { sum, reserve } => write!(
                f,
                "the live hosts' safe capacities add up to {sum}, above the budget's safe reserve \
                 {reserve}: lower safe_capacity or raise safe_reserve"
            ),
            ClusterError::OutOfSequence { seq, last } => write!(
                f,
                "renewal {seq} refused: the budget already accepted renewal {last} of this host \
                 (only numbers above it are accepted)"
            ),
            ClusterError::Region(e) => write!(f, "region: {e}"),
            ClusterError::BadRegion(m) => write!(f, "bad region: {m}"),
        }
    }
}

impl std::error::Error for ClusterError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClusterError::Region(e) => Some(e),
            _ => None,
        }
    }
}

impl From<crate::Error> for ClusterError {
    fn from(e: crate::Error) -> Self {
        ClusterError::Region(e)
    }
}

impl From<redis::RedisError> for ClusterError {
    fn from(e: redis::RedisError) -> Self {
        ClusterError::Redis(e.to_string())
    }
}
