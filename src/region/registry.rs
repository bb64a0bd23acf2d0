//! The cross-process wait registry: who waits where, in what order, and
//! whom to wake. The Scheduler and the Limiter both keep their waiting
//! state here and keep only their policy (slots and a lottery; a bucket and
//! a force-through) to themselves.
//!
//! # What lives in the region
//!
//! An object area starts with a [`RegistryArea`] (1,408 bytes, fixed
//! offsets, atomics only):
//!
//! - the **gate** word, read by every fast path: bit `t` is set while a
//!   waiter of tier `t` is published by some process, [`GATE_STRICT`] while
//!   a fairness hand-off is in progress (fast paths closed), and the
//!   region's stall time in µs above that (see *Stall time*);
//! - a region-wide **arrival ticket** counter per tier: a waiter takes the
//!   next ticket when it queues, so tickets order waiters of one tier
//!   across processes (FIFO);
//! - the **designee** word (the one waiter, in any process, that the next
//!   freed capacity is for) with the time it was designated and the time
//!   it was last offered capacity, and the lottery's generator, for
//!   policies that use them;
//! - the region's link to a cluster-wide budget: which process is its
//!   agent (an owner id, taken over when that process is found dead) and the
//!   lease it holds, under a seqlock;
//! - a bitmap of processes with published waiters and one of processes
//!   bound to the object (members), so scans visit only those.
//!
//! Each process publishes, in its own process-table entry, per tier: how
//! many waiters it has there and the ticket of its oldest (one word,
//! `obj[t]`), that oldest waiter's cap and need (`obj[14 + t]`), and an
//! *alternate* (one word, `obj[8..12]` and `obj[22..25]`): the policy's
//! choice of a later waiter that may be admitted when the oldest is not
//! (the scheduler's: the oldest of those whose cap, net of their need, is
//! the largest, if larger than the oldest's), with its ticket and that net
//! cap; and its progress count (`obj[12]`). Only the process itself writes
//! those words (under its own lock), and a reaper after its death; the one
//! word another process writes is its passed-over mark (`obj[13]`, see
//! *Progress*). So the region's queue of tier `t` is the merge of every
//! process's local queue, in ticket order, and its front is the process
//! whose published oldest ticket is the oldest (among those not passed
//! over); the oldest waiter that a policy admits is found among the oldest
//! and the alternates, so a waiter queued behind one its process's other
//! handle caps is not hidden from the region.
//!
//! # Ordering and liveness
//!
//! - Publishing sets the tier's gate bit *after* the count (SeqCst), and a
//!   releaser reads the gate *after* freeing capacity (SeqCst): one of the
//!   two sees the other, so a waiter is never left queued beside free
//!   capacity. A process that empties its last waiter of a tier clears the
//!   bit and then rescans the others, setting it again if one still
//!   waits: the bit is never clear while someone waits.
//! - A published waiter is trusted only while its process lives. Before a
//!   waiter of another process is designated, woken or deferred to, the
//!   caller checks that process's kernel liveness lock
//!   ([`Mapping::is_alive`]); a dead one is reaped on the spot, which
//!   clears its publication, its bits and a designation naming it.
//! - Reaping frees nothing of the object by itself: the object passes a
//!   `release` callback (the scheduler frees the dead process's cells).
//!
//! # Progress, not liveness
//!
//! A process can be alive and not run (SIGSTOP, a debugger, a cgroup
//! freezer, swap, a CPU quota), so no wait on another process's action is
//! unbounded. Each process counts its own progress: every serve or drain of
//! its threads bumps `obj[12]` ([`Registry::progress`]). A process that
//! waited [`PASS_AFTER_NS`] (20 ms, one reap interval) for another's action
//! (a designation offered and not taken, a Limiter front that can go and is
//! not charged) and found it alive passes it over
//! ([`Registry::pass_over`]): it writes `obj[13] = FLAG | progress`, and
//! until that process makes progress again the region's order
//! ([`Registry::front`]) skips it. Its waiters keep their tickets: when it
//! runs again its first serve bumps the count, which lifts the mark, and
//! its waiters are back in their places. "Not running" is never read from
//! `/proc` (a frozen cgroup shows `S` or `D`, not `T`): no progress within
//! the bound is what counts. A stopped process loses the time it is
//! stopped; nobody else does. The bound is measured on [`bound_now_ns`]
//! (the model checker's own clock under `--cfg shuttle`).
//!
//! # Waking
//!
//! A process's waiters sleep as [`park`](super::park) says: its front of
//! each tier on the futex word of its process's entry under its tier's bit
//! ([`tier_bit`], `FUTEX_WAIT_BITSET`), its other waiters on words of their
//! own, its helper thread under [`HELPER_BIT`] and the bits of the tiers
//! whose front is async. A waker bumps the word and wakes the bits it means,
//! so a designation or a grant wakes one thread, not the process. Sleepers
//! on the region word count themselves in `obj[SLEEPERS]` before
//! re-checking, and a waker bumps the word before reading the count (both
//! SeqCst): a wake that finds nobody asleep makes no syscall, and none is
//! lost.
//!
//! # Stall time
//!
//! The gate word also carries the region's stall time (some tier
//! backlogged), in µs of `CLOCK_MONOTONIC` in its top 52 bits, so that one
//! load reads it consistently: while no tier bit is set, those bits are the
//! total of the closed intervals; while one is, they are the stall's
//! *virtual start* `v = now - total` (mod 2^52), so the total then is
//! `now - v`. The change that sets the first tier bit turns the total into
//! `v` in the same CAS. Closing takes two steps: the change that clears the
//! last tier bit sets [`GATE_CLOSING`] and keeps `v` (same CAS); the closer
//! then reads the clock and replaces `v` by `now - v`, clearing the bit.
//! Anyone who finds the bit set (a writer of the gate, a reader that can
//! write) finishes the close in the closer's place, so a closer that dies
//! between its steps loses nothing. A reader loads the gate, reads the
//! clock, and loads the gate again: it uses the clock only if the stall
//! bits did not change in between, and waits (or helps) while a close is
//! half-done. So a reading is never lower than an earlier one: an opener's
//! clock precedes its CAS, which precedes a reader's first load, which
//! precedes the reader's clock; the reader's clock precedes its second load,
//! which precedes a closer's first step, which precedes the closer's clock.
//! An interval therefore opens and closes exactly with the backlog bits,
//! whatever the interleaving of processes.

use crate::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::mapping::Mapping;
use super::proc_table::{ProcEntry, ProcId};
use crate::error::{Error, Result};
use crate::priority::LEVELS;
use crate::sys::clock::{monotonic_ms, monotonic_ns};
use crate::sys::futex::{futex_wait_bitset, futex_wake_bitset, WaitResult, BITSET_ALL};

/// Process-entry word counting the process's threads asleep on its futex
/// word.
pub const SLEEPERS: usize = 7;
/// Process-entry word: the process's progress count, bumped by its own
/// threads each time one of them moves the region's queue (see
/// [`Registry::progress`]).
const PROGRESS: usize = 12;
/// Process-entry word: [`PASSED_FLAG`]` | p` once another process passed
/// this one over while its progress count read `p` (0: never).
const PASSED: usize = 13;
const PASSED_FLAG: u64 = 1 << 63;
/// First process-entry word of the per-tier `cap << 32 | need` words.
const FRONT_WORDS: usize = 14;
/// The process-entry word free for the object's own use (the scheduler's
/// count of cells held); `obj[25..28]` are the object's too.
pub const OBJ_FREE: usize = FRONT_WORDS + LEVELS;
/// The process-entry word of each tier's alternate (see the module docs):
/// four words of the entry's first line (`obj[12..14]` are the progress
/// count and the passed-over mark)
/// and three after [`OBJ_FREE`]. `valid << 63 | net cap << 32 | ticket`.
const ALT_WORDS: [usize; LEVELS] = [8, 9, 10, 11, 22, 23, 24];

const _: () = assert!(SLEEPERS >= LEVELS && SLEEPERS < ALT_WORDS[0]);
const _: () = assert!(ALT_WORDS[3] < PROGRESS && ALT_WORDS[4] > OBJ_FREE);
const _: () = assert!(SLEEPERS < PROGRESS && PROGRESS < PASSED && PASSED < FRONT_WORDS);
const _: () = assert!(ALT_WORDS[LEVELS - 1] < crate::region::OBJ_WORDS);

/// An alternate's valid bit.
const ALT_VALID: u64 = 1 << 63;
/// An alternate's net cap that stands for "no cap" (`u32::MAX`).
const ALT_UNCAPPED: u32 = 0x7fff_ffff;

/// Gate bits of the tiers with published waiters.
pub const GATE_TIERS: u64 = (1 << LEVELS) - 1;
/// Gate bit: a fairness hand-off is in progress; every fast path is closed.
pub const GATE_STRICT: u64 = 1 << LEVELS;
/// Gate bit: the object keeps an exact running count (its policy needed
/// one); set once, never cleared. What it means is the object's.
pub const GATE_COUNTING: u64 = 1 << (LEVELS + 1);
/// Gate bit: the object is moving its capacity down and wants freed
/// capacity back on the release path (the scheduler's run-time ceiling).
pub const GATE_SHRINKING: u64 = 1 << (LEVELS + 2);
/// Gate bit: a cluster lease may hold the object above its safe level (see
/// the `cluster` module): admissions leave the fast path and check the
/// lease's deadline ([`Registry::lapse_due`]) first. Set by the agent before
/// it raises the level, cleared only when an agent restores the object's own
/// level ([`Registry::disarm_lease`]).
pub const GATE_LEASED: u64 = 1 << (LEVELS + 3);
/// Gate bit: the last tier bit was just cleared and the stall time above
/// the gate bits is still the stall's virtual start (see *Stall time* in
/// the module docs); whoever sees it finishes the close.
pub const GATE_CLOSING: u64 = 1 << (LEVELS + 4);
/// The stall time (µs, see the module docs) sits above this many gate bits.
const STALL_SHIFT: u32 = LEVELS as u32 + 5;
/// The gate bits below the stall time.
const GATE_BITS: u64 = (1 << STALL_SHIFT) - 1;
/// The stall time's field (52 bits of µs: 142 years), unshifted.
const STALL_MASK: u64 = (1 << (64 - STALL_SHIFT)) - 1;
/// How many times a reader of the stall time retries while a close is
/// half-done or the gate changes under it, before it settles for a bound.
const STALL_READ_TRIES: u32 = 1024;

/// Bitmap words covering the largest process table.
const MAP_WORDS: usize = crate::region::MAX_PROCESS_SLOTS as usize / 64;

/// Minimum time between two scans for dead processes, region-wide.
#[cfg(not(shuttle))]
pub const REAP_INTERVAL_MS: u64 = 20;
/// Under the model checker, no rate limit: a scan runs whenever one is
/// asked for (a time-based limit would make which scans run depend on the
/// host's speed, not on the schedule).
#[cfg(shuttle)]
pub const REAP_INTERVAL_MS: u64 = 0;

/// How long a wait on another process's action may last before the region
/// moves on without it: a designation notified and not taken, a Limiter
/// front that can go and is not charged. One reap interval (20 ms): a
/// stopped process then costs the others no more than a dead one, and the
/// bound is a hundred times a wake-up's latency on an idle machine, so a
/// process that runs is passed over only when it has been denied the CPU
/// for that long (it keeps its place; see [`Registry::pass_over`]).
pub const PASS_AFTER_NS: u64 = 20_000_000;

/// The clock the bounds on other processes' progress are measured on:
/// `CLOCK_MONOTONIC` (ns), or, under the model checker, the model's clock,
/// which moves only when a test says time passes (a stopped process is
/// stopped "for a while").
#[inline]
pub fn bound_now_ns() -> u64 {
    #[cfg(shuttle)]
    return crate::sys::futex::model::now_ns();
    #[cfg(not(shuttle))]
    monotonic_ns()
}

/// The futex bit of a process's front waiter of `tier` (see
/// [`park`](super::park)): the one thread of the process a designation or a
/// Limiter front's turn at that tier wakes.
#[inline]
pub fn tier_bit(tier: usize) -> u32 {
    1 << tier
}

/// The futex bit of a process's helper thread (it stands in for the
/// process's async waiters).
pub const HELPER_BIT: u32 = 1 << 30;

#[repr(C, align(128))]
struct GateLine {
    gate: AtomicU64,
    _pad: [u64; 15],
}

#[repr(C, align(128))]
struct DispatchLine {
    /// The packed [`Designee`], 0 when none.
    designee: AtomicU64,
    /// `CLOCK_MONOTONIC` ns when the designee was designated.
    designated_ns: AtomicU64,
    /// The lottery's xorshift state (advanced by CAS).
    rng: AtomicU64,
    /// Bit 0: lottery switched off.
    flags: AtomicU64,
    /// Region-wide arrival tickets, one counter per tier.
    tickets: [AtomicU32; 8],
    /// Counter: waiters served (granted after waiting), region-wide.
    served: AtomicU64,
    /// Monotonic ms of the last scan for dead processes.
    last_reap_ms: AtomicU64,
    /// Counter: futex wakes that found a sleeper.
    wakes: AtomicU64,
    /// Counter: dead processes reaped.
    reaped: AtomicU64,
    /// Counter: fairness hand-offs (fast paths closed for a designee).
    strict: AtomicU64,
    /// Monotonic ns of the last liveness probe of a stalled designee.
    last_probe_ns: AtomicU64,
    /// [`bound_now_ns`] when the designee was last offered capacity
    /// (notified) or started taking it: a designation not taken within
    /// [`PASS_AFTER_NS`] of it is passed over.
    offered_ns: AtomicU64,
    /// Counter: processes passed over (see [`Registry::pass_over`]).
    passes: AtomicU64,
}

/// The region's link to a cluster-wide budget (see the `cluster` module):
/// which process is the region's agent, and the lease it holds.
#[repr(C, align(128))]
struct ClusterLine {
    /// 0, or the owner id of the process acting as the region's agent.
    agent: AtomicU32,
    _pad0: AtomicU32,
    /// Seqlock over the lease words: odd while the agent writes them.
    seq: AtomicU64,
    /// The lease: granted units, deadline (Unix ms), fencing token, mode,
    /// safe capacity, renewals, failures.
    lease: [AtomicU64; 7],
    /// The lease's enforcement, read by every process's admission slow path
    /// while [`GATE_LEASED`] is set: `CLOCK_MONOTONIC` ns from which the
    /// object must run at its safe level (0: no lease in force).
    fall_ns: AtomicU64,
    /// The safe level (a scheduler's ceiling, a limiter's rate).
    safe_level: AtomicU64,
    /// A limiter's burst at its safe rate (0 for a scheduler).
    safe_burst: AtomicU64,
    /// The object's own level + 1, recorded by the first agent (0: none):
    /// what a leaving agent (or `shmsched cluster release`) restores.
    own_level: AtomicU64,
    /// A limiter's own burst.
    own_burst: AtomicU64,
    /// The pid of the agent that last armed the lease.
    armed_by: AtomicU64,
    /// `CLOCK_MONOTONIC` ns of a standby agent's last look at the region.
    standby_ns: AtomicU64,
}

/// The registry's part of an object area. Zeroed memory is a valid empty
/// registry.
#[repr(C)]
pub struct RegistryArea {
    gate: GateLine,
    dispatch: DispatchLine,
    cluster: ClusterLine,
    waiting: [AtomicU64; MAP_WORDS],
    members: [AtomicU64; MAP_WORDS],
}

/// Bytes of object area the registry takes (at its start).
pub const REGISTRY_SIZE: usize = std::mem::size_of::<RegistryArea>();
// The layout is fixed, except under the model checker (whose atomics are
// larger: the layout then follows their sizes).
#[cfg(not(shuttle))]
const _: () = assert!(std::mem::size_of::<GateLine>() == 128);
#[cfg(not(shuttle))]
const _: () = assert!(std::mem::size_of::<DispatchLine>() == 128);
#[cfg(not(shuttle))]
const _: () = assert!(std::mem::size_of::<ClusterLine>() == 128);
#[cfg(not(shuttle))]
const _: () = assert!(REGISTRY_SIZE == 1408);

/// A region's cluster lease, as its agent last recorded it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Lease {
    /// Units of the cluster budget granted to this host.
    pub grant: u64,
    /// When the grant lapses without renewal (Unix ms).
    pub deadline_unix_ms: u64,
    /// The fencing token the agent must present on its next renewal.
    pub token: u64,
    /// The lease's mode (the cluster module's meaning: normal, learning,
    /// lapsed to the safe capacity, ...).
    pub mode: u64,
    /// The capacity the host falls back to when the lease lapses.
    pub safe: u64,
    /// Counter: successful renewals.
    pub renewals: u64,
    /// Counter: failed renewal attempts.
    pub failures: u64,
}
const _: () = assert!(std::mem::align_of::<RegistryArea>() == 128);

/// How a region's cluster lease is enforced (the words beside the lease).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LeaseGuard {
    /// [`GATE_LEASED`] is set: admissions check the deadline.
    pub armed: bool,
    /// `CLOCK_MONOTONIC` ns from which the object runs at its safe level
    /// (0: no lease in force).
    pub fall_ns: u64,
    /// The safe level.
    pub safe_level: u64,
    /// A limiter's burst at the safe rate.
    pub safe_burst: u64,
    /// The object's own level, if an agent recorded it.
    pub own_level: Option<u64>,
    /// A limiter's own burst.
    pub own_burst: u64,
    /// The pid of the agent that last armed the lease (0: none).
    pub armed_by: u64,
}

impl LeaseGuard {
    /// True while a lease holds the object above its safe level: armed, and
    /// the deadline is in the future.
    pub fn in_force(&self, now_ns: u64) -> bool {
        self.armed && self.fall_ns != 0 && now_ns < self.fall_ns
    }
}

impl RegistryArea {
    /// The gate word.
    pub fn gate(&self) -> u64 {
        self.gate.gate.load(Ordering::SeqCst)
    }

    /// Total stall time (some tier backlogged), open interval included, ns
    /// (µs resolution). A consistent reading: never lower than one taken
    /// before it (see *Stall time* in the module docs). Writes nothing (it
    /// works on a read-only mapping): if a close stays half-done for as
    /// long as [`STALL_READ_TRIES`] retries, it returns the closing
    /// interval measured up to now.
    pub fn stall_ns(&self) -> u64 {
        self.stall_read(&|| crate::sync::yield_now())
    }

    /// [`stall_ns`](Self::stall_ns), calling `half_done` each time a close
    /// is found half-done (a writer finishes it there).
    fn stall_read(&self, half_done: &dyn Fn()) -> u64 {
        let open = |g: u64| g & GATE_TIERS != 0;
        let closing = |g: u64| !open(g) && g & GATE_CLOSING != 0;
        // The stall bits: the field and the state.
        let key = |g: u64| (g & !GATE_BITS) | u64::from(open(g)) | (u64::from(closing(g)) << 1);
        let since = |v: u64, now_us: u64| now_us.wrapping_sub(v) & STALL_MASK;
        let mut bound = 0;
        for _ in 0..STALL_READ_TRIES {
            let g0 = self.gate();
            let field = g0 >> STALL_SHIFT;
            if closing(g0) {
                bound = since(field, monotonic_ns() / 1000).saturating_mul(1000);
                half_done();
                continue;
            }
            if !open(g0) {
                return field.saturating_mul(1000);
            }
            let now_us = monotonic_ns() / 1000;
            let g1 = self.gate();
            bound = since(field, now_us).saturating_mul(1000);
            if key(g1) == key(g0) {
                return bound;
            }
        }
        bound
    }

    /// Counter: waiters served (granted after waiting) in any process.
    pub fn served(&self) -> u64 {
        self.dispatch.served.load(Ordering::Relaxed)
    }

    /// Counters: (futex wakes that found a sleeper, dead processes reaped,
    /// fairness hand-offs).
    pub fn counters(&self) -> (u64, u64, u64) {
        let d = &self.dispatch;
        (
            d.wakes.load(Ordering::Relaxed),
            d.reaped.load(Ordering::Relaxed),
            d.strict.load(Ordering::Relaxed),
        )
    }

    /// Counter: processes passed over because they made no progress while
    /// the region waited for them (a stopped or frozen process).
    pub fn passes(&self) -> u64 {
        self.dispatch.passes.load(Ordering::Relaxed)
    }

    /// The region's cluster lease, as its agent last recorded it (a
    /// consistent copy; `None` if it kept changing).
    pub fn lease(&self) -> Option<Lease> {
        let c = &self.cluster;
        for _ in 0..64 {
            let s0 = c.seq.load(Ordering::Acquire);
            if s0 & 1 == 1 {
                crate::sync::spin();
                continue;
            }
            let w: [u64; 7] = std::array::from_fn(|i| c.lease[i].load(Ordering::Relaxed));
            std::sync::atomic::fence(Ordering::Acquire);
            if c.seq.load(Ordering::Relaxed) == s0 {
                return Some(Lease {
                    grant: w[0],
                    deadline_unix_ms: w[1],
                    token: w[2],
                    mode: w[3],
                    safe: w[4],
                    renewals: w[5],
                    failures: w[6],
                });
            }
        }
        None
    }

    /// The owner id of the region's agent (0: none).
    pub fn agent_owner(&self) -> u32 {
        self.cluster.agent.load(Ordering::SeqCst)
    }

    /// How the lease is enforced (see [`LeaseGuard`]).
    pub fn lease_guard(&self) -> LeaseGuard {
        let c = &self.cluster;
        let own = c.own_level.load(Ordering::SeqCst);
        LeaseGuard {
            armed: self.gate() & GATE_LEASED != 0,
            fall_ns: c.fall_ns.load(Ordering::SeqCst),
            safe_level: c.safe_level.load(Ordering::SeqCst),
            safe_burst: c.safe_burst.load(Ordering::SeqCst),
            own_level: own.checked_sub(1),
            own_burst: c.own_burst.load(Ordering::SeqCst),
            armed_by: c.armed_by.load(Ordering::SeqCst),
        }
    }

    /// Calls `f` with the entry of every process `entries` yields whose
    /// waiting bit is set (within the first `process_slots`).
    fn each_waiting<'a>(
        &self,
        entries: impl Fn(u32) -> Option<&'a ProcEntry>,
        process_slots: u32,
        mut f: impl FnMut(&ProcEntry),
    ) {
        let words = (process_slots as usize).div_ceil(64).clamp(1, MAP_WORDS);
        for (w, word) in self.waiting[..words].iter().enumerate() {
            let mut v = word.load(Ordering::SeqCst);
            while v != 0 {
                let idx = w as u32 * 64 + v.trailing_zeros();
                v &= v - 1;
                if let Some(e) = entries(idx) {
                    f(e);
                }
            }
        }
    }

    /// Waiters published per tier by the processes `entries` yields (a
    /// process's words are read only if its waiting bit is set).
    pub fn waiter_counts<'a>(
        &self,
        entries: impl Fn(u32) -> Option<&'a ProcEntry>,
        process_slots: u32,
    ) -> [u64; LEVELS] {
        let mut out = [0u64; LEVELS];
        self.each_waiting(entries, process_slots, |e| {
            for (t, o) in out.iter_mut().enumerate() {
                *o += e.obj[t].load(Ordering::Relaxed) >> 32;
            }
        });
        out
    }

    /// Calls `f(tier, cap)` for every front published by the processes
    /// `entries` yields (a process's words are read only if its waiting bit
    /// is set): the front's `cap` word, which a limiter uses for its
    /// arrival (ms). For readers without a registered [`Registry`].
    pub fn each_front<'a>(
        &self,
        entries: impl Fn(u32) -> Option<&'a ProcEntry>,
        process_slots: u32,
        mut f: impl FnMut(usize, u32),
    ) {
        self.each_waiting(entries, process_slots, |e| {
            for t in 0..LEVELS {
                if e.obj[t].load(Ordering::SeqCst) >> 32 != 0 {
                    let cn = e.obj[FRONT_WORDS + t].load(Ordering::SeqCst);
                    f(t, (cn >> 32) as u32);
                }
            }
        });
    }
}

/// One waiter of the region, named by where it waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Designee {
    /// Its process's entry.
    pub idx: u32,
    /// Its tier (priority index).
    pub tier: usize,
    /// Its arrival ticket in that tier.
    pub ticket: u32,
    /// Chosen by the lottery (the policy may then bypass a cap).
    pub lottery: bool,
    /// Its process has been woken for it since it was designated (or since
    /// it last went back to sleep).
    pub notified: bool,
    /// Its process is taking capacity for it now; only that process ends
    /// this state (or a reaper, after its death).
    pub taking: bool,
}

const D_TICKET_BITS: u32 = 32;
const D_IDX_SHIFT: u32 = 32; // 13 bits: idx + 1 (0 means "none")
const D_TIER_SHIFT: u32 = 45; // 3 bits
const D_LOTTERY: u64 = 1 << 48;
const D_NOTIFIED: u64 = 1 << 49;
const D_TAKING: u64 = 1 << 50;

impl Designee {
    fn pack(&self) -> u64 {
        u64::from(self.ticket)
            | (u64::from(self.idx + 1) << D_IDX_SHIFT)
            | ((self.tier as u64) << D_TIER_SHIFT)
            | if self.lottery { D_LOTTERY } else { 0 }
            | if self.notified { D_NOTIFIED } else { 0 }
            | if self.taking { D_TAKING } else { 0 }
    }

    fn unpack(w: u64) -> Option<Designee> {
        let idx1 = ((w >> D_IDX_SHIFT) & 0x1fff) as u32;
        let tier = ((w >> D_TIER_SHIFT) & 7) as usize;
        if idx1 == 0 || tier >= LEVELS {
            return None;
        }
        Some(Designee {
            idx: idx1 - 1,
            tier,
            ticket: (w & ((1 << D_TICKET_BITS) - 1)) as u32,
            lottery: w & D_LOTTERY != 0,
            notified: w & D_NOTIFIED != 0,
            taking: w & D_TAKING != 0,
        })
    }
}

/// A process's published oldest waiter of one tier, or its alternate (a
/// later waiter of the tier, see the module docs: then `cap` is its cap net
/// of its need, `u32::MAX` for none, and `need` is 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Front {
    /// The process's entry.
    pub idx: u32,
    /// The waiter's arrival ticket.
    pub ticket: u32,
    /// Waiters this process has at the tier.
    pub count: u32,
    /// The waiter's cap (the policy's meaning; the scheduler's per-priority
    /// cap).
    pub cap: u32,
    /// What the waiter needs (slots, tokens).
    pub need: u32,
}

/// A bound registry, as seen by one registered process. Cheap to share
/// (`Send + Sync`); objects keep one in their shared state.
#[derive(Debug)]
pub struct Registry {
    map: Arc<Mapping>,
    area: *const RegistryArea,
    me: ProcId,
    /// This process's entry (set by `join`; null before).
    mine: *const ProcEntry,
    /// Bitmap words in use (the region's process slots / 64).
    words: usize,
}

// SAFETY: `area` points into the mapping that `map` keeps alive for as long
// as `self` lives; every access through it is an atomic, which other
// threads and processes may mutate concurrently by design.
unsafe impl Send for Registry {}
// SAFETY: as above: only atomic accesses through `area`.
unsafe impl Sync for Registry {}

impl Registry {
    /// Views the registry at the start of `map`'s object area, not yet as a
    /// member (only [`reap`](Self::reap) may be used before
    /// [`join`](Self::join)).
    pub fn view(map: Arc<Mapping>) -> Result<Registry> {
        if map.object_len() < REGISTRY_SIZE {
            return Err(Error::BadRegion(format!(
                "object area is {} bytes, the wait registry alone needs {REGISTRY_SIZE}",
                map.object_len()
            )));
        }
        let area = map.object_ptr() as *const RegistryArea;
        if area as usize % 128 != 0 {
            return Err(Error::BadRegion(
                "object area is not 128-byte aligned".into(),
            ));
        }
        let words = (map.process_slots() as usize)
            .div_ceil(64)
            .clamp(1, MAP_WORDS);
        Ok(Registry {
            map,
            area,
            me: ProcId {
                idx: u32::MAX,
                owner: 0,
            },
            mine: std::ptr::null(),
            words,
        })
    }

    /// Joins as `me` (registered in the process table): marks this process
    /// a member.
    pub fn join(&mut self, me: ProcId) {
        self.me = me;
        self.mine = self
            .map
            .proc_entry(me.idx)
            .map_or(std::ptr::null(), |e| e as *const ProcEntry);
        self.set_bit(&self.area().members, me.idx, true);
    }

    /// True if `owner` (an owner id read from the region) names a process
    /// that is registered now and alive: its entry still carries that id
    /// and its liveness lock is held.
    pub fn owner_alive(&self, owner: u32) -> bool {
        let Ok(id) = ProcId::decode(owner, self.map.process_slots()) else {
            return false;
        };
        let Some(e) = self.entry(id.idx) else {
            return false;
        };
        ProcId::encode(id.idx, e.generation()) == owner && self.alive(id.idx)
    }

    #[inline(always)]
    fn area(&self) -> &RegistryArea {
        // SAFETY: `area` is 128-aligned and the object area holds at least
        // REGISTRY_SIZE bytes (both checked in `join`); RegistryArea is only
        // atomics and padding, valid for any bits and meant for shared
        // mutation through `&`; the mapping outlives the reference.
        unsafe { &*self.area }
    }

    fn d(&self) -> &DispatchLine {
        &self.area().dispatch
    }

    /// This process's registration.
    #[inline]
    pub fn me(&self) -> ProcId {
        self.me
    }

    /// The mapping the registry lives in.
    pub fn mapping(&self) -> &Arc<Mapping> {
        &self.map
    }

    fn entry(&self, idx: u32) -> Option<&ProcEntry> {
        self.map.proc_entry(idx).ok()
    }

    #[inline]
    fn my_entry(&self) -> &ProcEntry {
        assert!(!self.mine.is_null(), "internal: registry used before join");
        // SAFETY: `mine` was taken from `proc_entry(me.idx)` of the mapping
        // that `self.map` keeps alive, so it points to a live, aligned
        // ProcEntry (atomics only) for as long as `self` lives.
        unsafe { &*self.mine }
    }

    /// The object's word `i` (≥ [`OBJ_FREE`]) of this process's entry.
    #[inline]
    pub fn my_word(&self, i: usize) -> &AtomicU64 {
        &self.my_entry().obj[i]
    }

    // ---- bitmaps -------------------------------------------------------

    fn set_bit(&self, map: &[AtomicU64; MAP_WORDS], idx: u32, on: bool) {
        let Some(w) = map.get(idx as usize / 64) else {
            return;
        };
        let bit = 1u64 << (idx % 64);
        if on {
            w.fetch_or(bit, Ordering::SeqCst);
        } else {
            w.fetch_and(!bit, Ordering::SeqCst);
        }
    }

    fn each_in<'a>(&'a self, map: &'a [AtomicU64; MAP_WORDS]) -> impl Iterator<Item = u32> + 'a {
        map[..self.words].iter().enumerate().flat_map(|(w, word)| {
            let mut v = word.load(Ordering::SeqCst);
            std::iter::from_fn(move || {
                if v == 0 {
                    return None;
                }
                let b = v.trailing_zeros();
                v &= v - 1;
                Some(w as u32 * 64 + b)
            })
        })
    }

    /// The processes bound to the object (members), lowest entry first.
    pub fn members(&self) -> impl Iterator<Item = u32> + '_ {
        self.each_in(&self.area().members)
    }

    /// The processes with published waiters.
    pub fn waiting_processes(&self) -> impl Iterator<Item = u32> + '_ {
        self.each_in(&self.area().waiting)
    }

    /// Σ over members of entry word `i` (values above `u32::MAX` count as
    /// 0: only a scribble makes one). O(members). A plain loop over the
    /// member words, not an iterator chain: a capped take asks it on every
    /// acquire, and the chain's fold was left out of line by some builds
    /// (43 more instructions a capped pair).
    #[inline]
    pub fn sum_members(&self, i: usize) -> u64 {
        let mut sum = 0;
        let members = &self.area().members;
        // An index loop: the iterator forms compiled to 10 to 16 more
        // instructions a capped pair.
        #[allow(clippy::needless_range_loop)]
        for w in 0..self.words.min(MAP_WORDS) {
            let mut v = members[w].load(Ordering::SeqCst);
            while v != 0 {
                let idx = w as u32 * 64 + v.trailing_zeros();
                v &= v - 1;
                if let Some(e) = self.entry(idx) {
                    let x = e.obj[i].load(Ordering::SeqCst);
                    if x <= u64::from(u32::MAX) {
                        sum += x;
                    }
                }
            }
        }
        sum
    }

    // ---- the gate ------------------------------------------------------

    /// The gate word (SeqCst).
    #[inline(always)]
    pub fn gate(&self) -> u64 {
        self.area().gate.gate.load(Ordering::SeqCst)
    }

    /// Applies `f` to the gate's bits (without [`GATE_CLOSING`] and the
    /// stall time, which follow from the tier bits: see *Stall time* in the
    /// module docs).
    fn update_gate(&self, f: impl Fn(u64) -> u64) {
        let g = &self.area().gate.gate;
        let mut old = g.load(Ordering::SeqCst);
        let half_done = loop {
            let field = old >> STALL_SHIFT;
            let bits = f(old & GATE_BITS & !GATE_CLOSING) & GATE_BITS & !GATE_CLOSING;
            let was = old & GATE_TIERS != 0;
            let closing = !was && old & GATE_CLOSING != 0;
            let field = match (was || closing, bits & GATE_TIERS != 0) {
                // Open (or a close reverted before it completed): the same
                // virtual start, the same running total.
                (true, true) => field,
                // Opens: the closed total becomes the virtual start, from a
                // clock read after the load (and so before the CAS).
                (false, true) => (monotonic_ns() / 1000).wrapping_sub(field) & STALL_MASK,
                (_, false) => field,
            };
            let mut new = bits | (field << STALL_SHIFT);
            if (was || closing) && bits & GATE_TIERS == 0 {
                // The close's first step (or one still to finish).
                new |= GATE_CLOSING;
            }
            if new == old {
                break closing;
            }
            match g.compare_exchange_weak(old, new, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => break new & GATE_CLOSING != 0,
                Err(cur) => old = cur,
            }
        };
        if half_done {
            self.finish_close();
        }
    }

    /// Finishes a half-done close (see *Stall time* in the module docs): the
    /// virtual start becomes the total at a clock read after the load that
    /// found the close half-done.
    fn finish_close(&self) {
        let g = &self.area().gate.gate;
        let mut old = g.load(Ordering::SeqCst);
        while old & GATE_CLOSING != 0 && old & GATE_TIERS == 0 {
            let now_us = monotonic_ns() / 1000;
            let total = now_us.wrapping_sub(old >> STALL_SHIFT) & STALL_MASK;
            let new = (old & GATE_BITS & !GATE_CLOSING) | (total << STALL_SHIFT);
            match g.compare_exchange_weak(old, new, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return,
                Err(cur) => old = cur,
            }
        }
    }

    /// Closes every fast path until [`clear_strict`](Self::clear_strict).
    pub fn set_strict(&self) -> bool {
        let before = self
            .area()
            .gate
            .gate
            .fetch_or(GATE_STRICT, Ordering::SeqCst);
        if before & GATE_STRICT == 0 {
            self.d().strict.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Sets [`GATE_COUNTING`] (once; returns true if this call set it).
    pub fn set_counting(&self) -> bool {
        self.area()
            .gate
            .gate
            .fetch_or(GATE_COUNTING, Ordering::SeqCst)
            & GATE_COUNTING
            == 0
    }

    /// Sets or clears [`GATE_SHRINKING`].
    pub fn set_shrinking(&self, on: bool) {
        let g = &self.area().gate.gate;
        if on {
            g.fetch_or(GATE_SHRINKING, Ordering::SeqCst);
        } else if g.load(Ordering::SeqCst) & GATE_SHRINKING != 0 {
            g.fetch_and(!GATE_SHRINKING, Ordering::SeqCst);
        }
    }

    /// Reopens the fast paths closed by [`set_strict`](Self::set_strict).
    pub fn clear_strict(&self) {
        if self.gate() & GATE_STRICT != 0 {
            self.area()
                .gate
                .gate
                .fetch_and(!GATE_STRICT, Ordering::SeqCst);
        }
    }

    /// Total stall time (some tier backlogged), open interval included, ns:
    /// [`RegistryArea::stall_ns`], finishing a half-done close it finds.
    pub fn stall_ns(&self) -> u64 {
        self.area().stall_read(&|| self.finish_close())
    }

    /// Counts a waiter served (granted after waiting), region-wide.
    pub fn count_served(&self) {
        self.d().served.fetch_add(1, Ordering::Relaxed);
    }

    /// Counter: waiters served in any process.
    pub fn served(&self) -> u64 {
        self.area().served()
    }

    // ---- publication ---------------------------------------------------

    /// The next arrival ticket of `tier`.
    pub fn take_ticket(&self, tier: usize) -> u32 {
        self.d().tickets[tier].fetch_add(1, Ordering::SeqCst)
    }

    /// How long ago (in tickets) `ticket` was taken at `tier`; larger is
    /// older. Works across the counter's wrap-around.
    pub fn age(&self, tier: usize, ticket: u32) -> u32 {
        self.d().tickets[tier]
            .load(Ordering::SeqCst)
            .wrapping_sub(ticket)
    }

    /// Publishes this process's waiters of `tier`: `count` of them, the
    /// oldest with `ticket`, `cap` and `need`, and the alternate `alt`
    /// (its ticket and cap net of its need, `u32::MAX` for none; see the
    /// module docs). The caller serialises its process's publications (its
    /// own lock). Keeps the waiting bit and the gate bit in step.
    pub fn publish(
        &self,
        tier: usize,
        count: u32,
        ticket: u32,
        cap: u32,
        need: u32,
        alt: Option<(u32, u32)>,
    ) {
        let e = self.my_entry();
        if count > 0 {
            e.obj[FRONT_WORDS + tier]
                .store((u64::from(cap) << 32) | u64::from(need), Ordering::SeqCst);
        }
        let alt = alt.filter(|_| count > 1).map_or(0, |(t, net)| {
            ALT_VALID | (u64::from(net.min(ALT_UNCAPPED)) << 32) | u64::from(t)
        });
        if e.obj[ALT_WORDS[tier]].load(Ordering::Relaxed) != alt {
            e.obj[ALT_WORDS[tier]].store(alt, Ordering::SeqCst);
        }
        e.obj[tier].store(
            (u64::from(count) << 32) | u64::from(ticket),
            Ordering::SeqCst,
        );
        if count > 0 {
            self.set_bit(&self.area().waiting, self.me.idx, true);
            #[cfg(shuttle)]
            self.map.model_death_point("publish: count, no gate bit");
            if self.gate() & (1 << tier) == 0 {
                self.update_gate(|g| g | (1 << tier));
            }
        } else {
            if e.obj[..LEVELS]
                .iter()
                .all(|w| w.load(Ordering::SeqCst) >> 32 == 0)
            {
                self.set_bit(&self.area().waiting, self.me.idx, false);
            }
            self.refresh_tier(tier);
        }
    }

    /// Clears `tier`'s gate bit if no process publishes waiters there, then
    /// looks again and sets it back if one does (see the module docs). Also
    /// heals a bit that nobody's publication backs (a scribbled gate).
    pub fn refresh_tier(&self, tier: usize) {
        if self.gate() & (1 << tier) == 0 {
            return;
        }
        if self.anyone_at(tier) {
            return;
        }
        self.update_gate(|g| g & !(1 << tier));
        if self.anyone_at(tier) {
            self.update_gate(|g| g | (1 << tier));
        }
    }

    fn anyone_at(&self, tier: usize) -> bool {
        self.waiting_processes()
            .filter_map(|idx| self.entry(idx))
            .any(|e| e.obj[tier].load(Ordering::SeqCst) >> 32 != 0)
    }

    /// Process `idx`'s published front of `tier`, if it has waiters there.
    pub fn front_of(&self, idx: u32, tier: usize) -> Option<Front> {
        let e = self.entry(idx)?;
        let w = e.obj[tier].load(Ordering::SeqCst);
        let count = (w >> 32) as u32;
        if count == 0 {
            return None;
        }
        let cn = e.obj[FRONT_WORDS + tier].load(Ordering::SeqCst);
        Some(Front {
            idx,
            ticket: w as u32,
            count,
            cap: (cn >> 32) as u32,
            need: cn as u32,
        })
    }

    /// Process `idx`'s published alternate of `tier` (see the module docs),
    /// if it has one.
    pub fn alt_of(&self, idx: u32, tier: usize) -> Option<Front> {
        let f = self.front_of(idx, tier)?;
        let a = self.entry(idx)?.obj[ALT_WORDS[tier]].load(Ordering::SeqCst);
        if a & ALT_VALID == 0 || a as u32 == f.ticket {
            return None;
        }
        let net = ((a >> 32) as u32) & ALT_UNCAPPED;
        Some(Front {
            ticket: a as u32,
            cap: if net == ALT_UNCAPPED { u32::MAX } else { net },
            need: 0,
            ..f
        })
    }

    /// Process `idx`'s published waiter of `tier` with `ticket` (its front
    /// or its alternate), if it still publishes it.
    pub fn published(&self, idx: u32, tier: usize, ticket: u32) -> Option<Front> {
        self.front_of(idx, tier)
            .filter(|f| f.ticket == ticket)
            .or_else(|| self.alt_of(idx, tier).filter(|f| f.ticket == ticket))
    }

    /// The region's front of `tier` among waiters that `admit` accepts: the
    /// oldest such published waiter (a front or an alternate), in any
    /// process that is not passed over (see [`pass_over`](Self::pass_over)).
    /// Dead processes are not filtered here (see [`alive`](Self::alive)).
    pub fn front(&self, tier: usize, admit: impl Fn(&Front) -> bool) -> Option<Front> {
        let mut best: Option<(u32, Front)> = None;
        for idx in self.waiting_processes() {
            let Some(f) = self.front_of(idx, tier) else {
                continue;
            };
            if self.passed(idx) {
                continue;
            }
            let f = if admit(&f) {
                f
            } else {
                match self.alt_of(idx, tier).filter(|a| admit(a)) {
                    Some(a) => a,
                    None => continue,
                }
            };
            let age = self.age(tier, f.ticket);
            if best.is_none_or(|(a, _)| age > a) {
                best = Some((age, f));
            }
        }
        best.map(|(_, f)| f)
    }

    /// The tiers of `tiers` (gate bits) where a waiter of a process that is
    /// not passed over waits: what a caller at those tiers defers to.
    pub fn unpassed_tiers(&self, tiers: u64) -> u64 {
        let mut out = 0;
        let mut t = tiers & GATE_TIERS;
        while t != 0 {
            let tier = t.trailing_zeros() as usize;
            t &= t - 1;
            if self.front(tier, |_| true).is_some() {
                out |= 1 << tier;
            }
        }
        out
    }

    /// Waiters published per tier, summed over the live processes that
    /// publish (a dead process's words stay until it is reaped; its waiters
    /// are not waiting). One liveness probe per publishing process.
    pub fn waiter_counts(&self) -> [u64; LEVELS] {
        self.area().waiter_counts(
            |idx| self.entry(idx).filter(|_| self.alive(idx)),
            self.map.process_slots(),
        )
    }

    // ---- designation ---------------------------------------------------

    /// The current designee, if any.
    #[inline]
    pub fn designee(&self) -> Option<Designee> {
        Designee::unpack(self.d().designee.load(Ordering::SeqCst))
    }

    /// When the current designee was designated (ns).
    pub fn designated_ns(&self) -> u64 {
        self.d().designated_ns.load(Ordering::SeqCst)
    }

    /// Designates `d` if nobody is designated (a word that names nobody
    /// valid, a scribble, counts as nobody and is replaced). True on
    /// success.
    pub fn designate(&self, d: Designee) -> bool {
        self.designate_at(d, monotonic_ns())
    }

    /// [`designate`](Self::designate) with the caller's reading of
    /// `CLOCK_MONOTONIC` (ns), taken before this call (one reading shared
    /// by the steps of one serve).
    pub fn designate_at(&self, d: Designee, now_ns: u64) -> bool {
        let w = &self.d().designee;
        let cur = w.load(Ordering::SeqCst);
        if Designee::unpack(cur).is_some() {
            return false;
        }
        let ok = w
            .compare_exchange(cur, d.pack(), Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
        if ok {
            self.d().designated_ns.store(now_ns, Ordering::SeqCst);
        }
        ok
    }

    /// Records that the designee is offered capacity now (it is about to be
    /// notified, or its process starts taking): the start of the bound on
    /// its coming (see [`offer_overdue`](Self::offer_overdue)). Written
    /// before the designation word changes, so that whoever sees the new
    /// state sees this time or a later one.
    pub fn offer(&self) {
        self.offer_at(bound_now_ns());
    }

    /// [`offer`](Self::offer) at `now_ns`, a reading of [`bound_now_ns`]
    /// taken before this call.
    pub fn offer_at(&self, now_ns: u64) {
        self.d().offered_ns.store(now_ns, Ordering::SeqCst);
    }

    /// Renews the offer while this process takes for its designee (a take
    /// of many cells lasts a while: it makes progress all along). Nothing
    /// if the designation is not this process's, taking.
    pub fn refresh_offer_if_taking(&self) {
        if self
            .designee()
            .is_some_and(|d| d.taking && d.idx == self.me.idx)
        {
            self.offer();
        }
    }

    /// True once the designee has been offered capacity [`PASS_AFTER_NS`]
    /// ago or more without taking it.
    pub fn offer_overdue(&self) -> bool {
        self.offer_overdue_at(bound_now_ns())
    }

    /// [`offer_overdue`](Self::offer_overdue) at `now_ns`, a reading of
    /// [`bound_now_ns`] (an earlier reading only makes the answer later).
    pub fn offer_overdue_at(&self, now_ns: u64) -> bool {
        now_ns.saturating_sub(self.d().offered_ns.load(Ordering::SeqCst)) >= PASS_AFTER_NS
    }

    /// Replaces designee `from` (exactly as read) by `to` (`None`: nobody).
    pub fn swap_designee(&self, from: &Designee, to: Option<&Designee>) -> bool {
        self.d()
            .designee
            .compare_exchange(
                from.pack(),
                to.map_or(0, Designee::pack),
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok()
    }

    /// True while `d` is still published by its process (its front or its
    /// alternate of its tier: the waiter has not left).
    pub fn still_front(&self, d: &Designee) -> bool {
        self.published(d.idx, d.tier, d.ticket).is_some()
    }

    // ---- progress, not liveness ----------------------------------------

    /// Records that this process makes progress: one of its threads is
    /// moving the region's queue (every serve or drain starts here). Returns
    /// true if another process had passed it over since its last progress
    /// (it ran again after a stop): its waiters are back in the region's
    /// order from now on.
    pub fn progress(&self) -> bool {
        let e = self.my_entry();
        let p = e.obj[PROGRESS].fetch_add(1, Ordering::SeqCst);
        e.obj[PASSED].load(Ordering::SeqCst) == PASSED_FLAG | p
    }

    /// True if process `idx` was passed over and has made no progress since
    /// (never this process).
    pub fn passed(&self, idx: u32) -> bool {
        if idx == self.me.idx {
            return false;
        }
        let Some(e) = self.entry(idx) else {
            return false;
        };
        let m = e.obj[PASSED].load(Ordering::SeqCst);
        m & PASSED_FLAG != 0 && m == PASSED_FLAG | e.obj[PROGRESS].load(Ordering::SeqCst)
    }

    /// Passes process `idx` over: it was waited for (its designation, its
    /// Limiter front) for [`PASS_AFTER_NS`] and made no progress. Until it
    /// makes progress again, the region's order ([`front`](Self::front))
    /// skips its waiters; they keep their tickets, so once it runs again
    /// they are served in their place. The caller then wakes its fronts
    /// ([`wake_fronts`](Self::wake_fronts)), so that it looks at the region
    /// as soon as it runs (a wake sent while it is stopped still moves its
    /// futex word, which a stopped sleeper finds changed when its wait
    /// restarts).
    pub fn pass_over(&self, idx: u32) {
        if self.mark_passed(idx).is_some() {
            self.count_pass();
        }
    }

    /// The mark of [`pass_over`](Self::pass_over) without the count:
    /// returns the word written (for [`unmark_passed`](Self::unmark_passed)),
    /// `None` for this process or an entry out of range.
    pub fn mark_passed(&self, idx: u32) -> Option<u64> {
        if idx == self.me.idx {
            return None;
        }
        let e = self.entry(idx)?;
        let p = e.obj[PROGRESS].load(Ordering::SeqCst);
        let mark = PASSED_FLAG | p;
        e.obj[PASSED].store(mark, Ordering::SeqCst);
        Some(mark)
    }

    /// Takes back a mark of [`mark_passed`](Self::mark_passed) that turned
    /// out to rest on a stale read (if it is still the word there).
    pub fn unmark_passed(&self, idx: u32, mark: u64) {
        if let Some(e) = self.entry(idx) {
            let _ = e.obj[PASSED].compare_exchange(mark, 0, Ordering::SeqCst, Ordering::Relaxed);
        }
    }

    /// Counts one process passed over (the [`passes`](Self::passes) total).
    pub fn count_pass(&self) {
        self.d().passes.fetch_add(1, Ordering::Relaxed);
    }

    /// Wakes every front of process `idx` (all tier bits and its helper
    /// thread): after a pass, whichever of its threads runs first lifts the
    /// mark, whatever tier it waits at (waking only the tier passed over
    /// would leave the mark on a process whose waiter there was served
    /// meanwhile, its other waiters skipped and asleep).
    pub fn wake_fronts(&self, idx: u32) {
        self.wake(idx, GATE_TIERS as u32 | HELPER_BIT);
    }

    /// Counter: processes passed over.
    pub fn passes(&self) -> u64 {
        self.area().passes()
    }

    // ---- lottery -------------------------------------------------------

    /// Draws the next number of the region's lottery generator (xorshift64*,
    /// advanced by CAS, so every draw in any process is a step of one
    /// sequence).
    pub fn draw(&self) -> u64 {
        let rng = &self.d().rng;
        let mut x = rng.load(Ordering::Relaxed);
        loop {
            let mut y = if x == 0 { 0x9E37_79B9_7F4A_7C15 } else { x };
            y ^= y >> 12;
            y ^= y << 25;
            y ^= y >> 27;
            match rng.compare_exchange_weak(x, y, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return y.wrapping_mul(0x2545_F491_4F6C_DD1D),
                Err(cur) => x = cur,
            }
        }
    }

    /// Reseeds the region's lottery and switches it on or off for every
    /// process.
    pub fn set_lottery(&self, seed: Option<u64>, enabled: bool) {
        if let Some(s) = seed {
            self.d().rng.store(s, Ordering::Relaxed);
        }
        if enabled {
            self.d().flags.fetch_and(!1, Ordering::SeqCst);
        } else {
            self.d().flags.fetch_or(1, Ordering::SeqCst);
        }
    }

    /// Whether the lottery is on.
    pub fn lottery_enabled(&self) -> bool {
        self.d().flags.load(Ordering::Relaxed) & 1 == 0
    }

    // ---- waking and sleeping -------------------------------------------

    /// This process's futex word's current value (read before looking at
    /// the state one then sleeps on).
    #[inline]
    pub fn my_seq(&self) -> u32 {
        self.my_entry().futex.load(Ordering::SeqCst)
    }

    /// Wakes the sleepers of process `idx` tagged with a bit of `bits`
    /// ([`tier_bit`], [`HELPER_BIT`], or [`BITSET_ALL`]): bumps its futex
    /// word, then wakes. No syscall when nobody sleeps there.
    pub fn wake(&self, idx: u32, bits: u32) {
        let Some(e) = self.entry(idx) else { return };
        e.futex.fetch_add(1, Ordering::SeqCst);
        self.wake_bumped(e, bits);
    }

    /// Bumps this process's futex word (a waker of its own threads, before
    /// it reads where they sleep: see [`park`](super::park)).
    pub fn bump_mine(&self) {
        self.my_entry().futex.fetch_add(1, Ordering::SeqCst);
    }

    /// Wakes this process's sleepers under `bits`, the word already bumped
    /// ([`bump_mine`](Self::bump_mine)).
    pub fn wake_mine(&self, bits: u32) {
        self.wake_bumped(self.my_entry(), bits);
    }

    fn wake_bumped(&self, e: &ProcEntry, bits: u32) {
        if e.obj[SLEEPERS].load(Ordering::SeqCst) == 0 {
            return;
        }
        if futex_wake_bitset(&e.futex, i32::MAX, bits) > 0 {
            self.d().wakes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Sleeps on this process's futex word, tagged `bits`, until woken or
    /// `timeout` (none: until woken), unless the word moved past `seq`
    /// already.
    pub fn sleep(&self, seq: u32, timeout: Option<Duration>, bits: u32) -> WaitResult {
        let e = self.my_entry();
        e.obj[SLEEPERS].fetch_add(1, Ordering::SeqCst);
        let r = futex_wait_bitset(&e.futex, seq, timeout, bits);
        e.obj[SLEEPERS].fetch_sub(1, Ordering::SeqCst);
        r
    }

    // ---- the cluster agent ----------------------------------------------

    /// Becomes the region's agent if there is none, or if the recorded one
    /// is no longer alive (kernel liveness, like every ownership here).
    /// True if this process is the agent now.
    pub fn try_become_agent(&self) -> bool {
        let a = &self.area().cluster.agent;
        let me = self.me.owner;
        let cur = a.load(Ordering::SeqCst);
        if cur == me {
            return true;
        }
        if cur != 0 && self.owner_alive(cur) {
            return false;
        }
        a.compare_exchange(cur, me, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Stops being the region's agent (if it is).
    pub fn resign_agent(&self) {
        let _ = self.area().cluster.agent.compare_exchange(
            self.me.owner,
            0,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }

    /// The region's cluster lease (see [`RegistryArea::lease`]).
    pub fn lease(&self) -> Option<Lease> {
        self.area().lease()
    }

    /// The owner id of the region's agent (0: none).
    pub fn agent_owner(&self) -> u32 {
        self.area().agent_owner()
    }

    /// Records the lease (the agent only: writes are serialised by being
    /// the agent; a reader never sees a half-written lease).
    pub fn set_lease(&self, l: &Lease) {
        let c = &self.area().cluster;
        let s0 = c.seq.load(Ordering::Relaxed);
        // Even before: make it odd while writing.
        let odd = (s0 | 1).wrapping_add(if s0 & 1 == 1 { 2 } else { 0 });
        c.seq.store(odd, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        for (w, v) in c.lease.iter().zip([
            l.grant,
            l.deadline_unix_ms,
            l.token,
            l.mode,
            l.safe,
            l.renewals,
            l.failures,
        ]) {
            w.store(v, Ordering::Relaxed);
        }
        c.seq.store(odd.wrapping_add(1), Ordering::Release);
    }

    /// How the lease is enforced (see [`LeaseGuard`]).
    pub fn lease_guard(&self) -> LeaseGuard {
        self.area().lease_guard()
    }

    /// Arms the lease before its agent raises the object above its safe
    /// level: the safe level (and a limiter's burst at it), then the
    /// deadline (`CLOCK_MONOTONIC` ns), then [`GATE_LEASED`], all SeqCst, so
    /// an admission that sees the raised level sees the deadline.
    pub fn arm_lease(&self, fall_ns: u64, safe_level: u64, safe_burst: u64) {
        let c = &self.area().cluster;
        c.safe_level.store(safe_level, Ordering::SeqCst);
        c.safe_burst.store(safe_burst, Ordering::SeqCst);
        c.armed_by
            .store(u64::from(std::process::id()), Ordering::SeqCst);
        c.fall_ns.store(fall_ns.max(1), Ordering::SeqCst);
        if self.gate() & GATE_LEASED == 0 {
            self.area()
                .gate
                .gate
                .fetch_or(GATE_LEASED, Ordering::SeqCst);
        }
    }

    /// True if a lease is in force and its deadline is clearly ahead: more
    /// than [`COARSE_SLACK_NS`](crate::sys::clock::COARSE_SLACK_NS) beyond
    /// the coarse clock, so beyond the precise one. The fast paths' test
    /// while [`GATE_LEASED`] is the gate's only bit: one load and a coarse
    /// clock read, then the same take as without a lease; near or past the
    /// deadline (and during an arm or disarm, deadline 0) they take the
    /// cold path, which reads the precise clock ([`lapse_due`](Self::lapse_due)).
    #[inline]
    pub fn lease_clearly_in_force(&self) -> bool {
        let fall = self.area().cluster.fall_ns.load(Ordering::Acquire);
        fall != 0
            && crate::sys::clock::monotonic_coarse_ns()
                .saturating_add(crate::sys::clock::COARSE_SLACK_NS)
                < fall
    }

    /// The lease's deadline has passed (or its words are scribbled): the
    /// safe level and burst the object must run at now. `None` while the
    /// lease is in force or there is none: a deadline of 0 with the gate's
    /// bit set is no lease (an arm stores its deadline, at least 1, before
    /// the bit; a disarm clears the deadline first; a scribbled gate whose
    /// bit no lease backs must not close the region). One load and, while a lease is
    /// recorded, one `CLOCK_MONOTONIC` read (vDSO). Callers look only while
    /// [`GATE_LEASED`] is set. Lowering on this answer is idempotent: every
    /// process that sees it may lower, none needs another to have done so
    /// (a process stopped half-way through lowering holds nobody back).
    #[cold]
    pub fn lapse_due(&self) -> Option<(u64, u64)> {
        let c = &self.area().cluster;
        let fall = c.fall_ns.load(Ordering::SeqCst);
        if fall == 0 || monotonic_ns() < fall {
            return None;
        }
        Some((
            c.safe_level.load(Ordering::SeqCst),
            c.safe_burst.load(Ordering::SeqCst),
        ))
    }

    /// Records the object's own level (and a limiter's burst) unless one
    /// is recorded already (an earlier agent's, which crashed: the first
    /// record is the region's own).
    pub fn record_own(&self, level: u64, burst: u64) {
        let c = &self.area().cluster;
        if c.own_level.load(Ordering::SeqCst) == 0 {
            c.own_burst.store(burst, Ordering::SeqCst);
            let _ = c.own_level.compare_exchange(
                0,
                level.saturating_add(1),
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        }
    }

    /// Ends the lease's hold on the object, once its own level is back:
    /// no deadline, [`GATE_LEASED`] cleared, the own level forgotten.
    pub fn disarm_lease(&self) {
        let c = &self.area().cluster;
        c.fall_ns.store(0, Ordering::SeqCst);
        self.area()
            .gate
            .gate
            .fetch_and(!GATE_LEASED, Ordering::SeqCst);
        c.own_level.store(0, Ordering::SeqCst);
        c.own_burst.store(0, Ordering::SeqCst);
        c.armed_by.store(0, Ordering::SeqCst);
    }

    /// A standby agent looked at the region (see
    /// [`standby_seen_within`](Self::standby_seen_within)).
    pub fn standby_beat(&self) {
        self.area()
            .cluster
            .standby_ns
            .store(monotonic_ns(), Ordering::SeqCst);
    }

    /// True if a standby agent looked at the region within `ns`.
    pub fn standby_seen_within(&self, ns: u64) -> bool {
        let t = self.area().cluster.standby_ns.load(Ordering::SeqCst);
        t != 0 && monotonic_ns().saturating_sub(t) < ns
    }

    /// Counter: wakes that found a sleeper.
    pub fn wakes(&self) -> u64 {
        self.d().wakes.load(Ordering::Relaxed)
    }

    /// Counter: fairness hand-offs.
    pub fn strict_handoffs(&self) -> u64 {
        self.d().strict.load(Ordering::Relaxed)
    }

    // ---- liveness and reaping ------------------------------------------

    /// Whether process `idx` is alive (kernel liveness lock; a syscall).
    /// This process is always alive.
    pub fn alive(&self, idx: u32) -> bool {
        idx == self.me.idx || self.map.is_alive(idx).unwrap_or(false)
    }

    /// Returns true at most once per `interval_ns` region-wide (for rate
    /// limiting liveness probes of a stalled designee).
    pub fn probe_due(&self, interval_ns: u64) -> bool {
        self.probe_due_at(interval_ns, monotonic_ns())
    }

    /// [`probe_due`](Self::probe_due) at `now`, a reading of
    /// `CLOCK_MONOTONIC` (ns) taken before this call.
    pub fn probe_due_at(&self, interval_ns: u64, now: u64) -> bool {
        let last = self.d().last_probe_ns.load(Ordering::Relaxed);
        now.saturating_sub(last) >= interval_ns
            && self
                .d()
                .last_probe_ns
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Reaps every dead process: `release(idx, owner)` returns what it held
    /// in the object, then its waiting state is cleared (publications, bits,
    /// a designation naming it) and the gate recomputed. Returns the number
    /// of processes reaped.
    pub fn reap(&self, release: &mut dyn FnMut(u32, u32)) -> Result<u32> {
        let n = self.map.reap_dead(&mut |idx, owner| {
            release(idx, owner);
            self.forget(idx);
        })?;
        if n > 0 {
            self.d().reaped.fetch_add(u64::from(n), Ordering::Relaxed);
            for t in 0..LEVELS {
                self.refresh_tier(t);
            }
        }
        Ok(n)
    }

    /// Reaps unless a scan ran within [`REAP_INTERVAL_MS`] (region-wide).
    // Under the model checker the interval is 0: the test always passes.
    #[cfg_attr(shuttle, allow(clippy::absurd_extreme_comparisons))]
    pub fn maybe_reap(&self, release: &mut dyn FnMut(u32, u32)) -> Result<u32> {
        let now = monotonic_ms();
        let last = self.d().last_reap_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) < REAP_INTERVAL_MS
            || self
                .d()
                .last_reap_ms
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return Ok(0);
        }
        self.reap(release)
    }

    /// Counter: dead processes reaped.
    pub fn reaped(&self) -> u64 {
        self.d().reaped.load(Ordering::Relaxed)
    }

    /// Clears a dead process's waiting state (under its reaper's claim).
    fn forget(&self, idx: u32) {
        self.set_bit(&self.area().waiting, idx, false);
        self.set_bit(&self.area().members, idx, false);
        if let Some(e) = self.entry(idx) {
            for w in &e.obj[..LEVELS] {
                w.store(0, Ordering::SeqCst);
            }
        }
        if let Some(d) = self.designee() {
            if d.idx == idx && self.swap_designee(&d, None) {
                self.clear_strict();
            }
        }
    }

    /// Leaves the member set (a clean detach; the entry itself is freed by
    /// the mapping).
    pub fn leave(&self) {
        self.set_bit(&self.area().members, self.me.idx, false);
    }
}

/// Wakes every sleeper of process `idx` (for tests and tools).
pub fn wake_all(reg: &Registry, idx: u32) {
    reg.wake(idx, BITSET_ALL);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn designee_roundtrips() {
        for d in [
            Designee {
                idx: 0,
                tier: 0,
                ticket: 0,
                lottery: false,
                notified: false,
                taking: false,
            },
            Designee {
                idx: 4095,
                tier: 6,
                ticket: u32::MAX,
                lottery: true,
                notified: true,
                taking: true,
            },
        ] {
            assert_ne!(d.pack(), 0);
            assert_eq!(Designee::unpack(d.pack()), Some(d));
        }
        assert_eq!(Designee::unpack(0), None);
        // A scribbled tier is no designee.
        assert_eq!(
            Designee::unpack((1 << D_IDX_SHIFT) | (7 << D_TIER_SHIFT)),
            None
        );
    }

    #[test]
    fn tier_bits_and_the_helper_bit_are_distinct() {
        let all = (0..LEVELS).fold(0, |m, t| m | tier_bit(t));
        assert_eq!(all.count_ones() as usize, LEVELS);
        assert_eq!(all & HELPER_BIT, 0);
    }
}
