//! One level of a scheduler tree: the policy, written once for every home.
//!
//! A [`Node`] is a root (in process memory, or a handle on a root shared
//! through a region) or a child that adds a local cap on top of its
//! parent. A chain (child → … → root) is acquired leaf first; each level is
//! released if a later level fails (timeout, dispose), so a failed acquire
//! leaves no count behind anywhere, and released leaf first.
//!
//! # An in-process level
//!
//! Its whole fast-path state is one word ([`LocalState`]): the running
//! count, a bit per tier with queued waiters, and a disposed bit. An
//! acquire at priority `p` is one CAS that checks "not disposed, nothing
//! queued at `p` or above, running + n ≤ cap\[p\]" and adds `n`; a release is
//! one CAS that subtracts, taken only while nothing is queued. Otherwise
//! the caller takes the level's lock: a waiter queues at `p` (FIFO) and sets
//! its tier's bit; a releaser keeps its units *in hand* and runs dispatch,
//! which draws the lottery ([`lottery`](super::lottery)) and hands units
//! straight to the picked tier's front waiter, so no fresh caller can take
//! a freed unit ahead of the lottery. Because the queued bits and the count
//! are one word, a releaser and an enqueuer always see each other: a
//! waiter is never left queued next to a free unit.
//!
//! # A shared root
//!
//! A handle on the process's [`SharedRoot`]: the fast path checks the
//! region's gate and takes cells; waiting, ordering and fairness across
//! processes are the root's (see `root.rs`).

use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Mutex, MutexGuard};
use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::task::Waker;
use std::time::Instant;

use super::lottery::Lottery;
use super::root::{above, SharedRoot};
use super::stats::{QueueStats, SchedulerStats};
use super::waiter::{
    add_under_lock, take_spare, Counters, Slots, SlotsView, Waiter, Wakeups, FAILED, GRANTED,
    SPARE_WAITERS, WAITING,
};
use crate::error::{Error, Result};
use crate::few::Few;
use crate::priority::{Priority, LEVELS};
use crate::region::registry::{GATE_LEASED, GATE_STRICT};
use crate::stall::StallClock;
use crate::sys::fork::fork_generation;
use crate::sys::futex::futex_wait;

/// Node ids, process-wide. A standard atomic even under the model checker:
/// an id counter is no part of a modelled protocol, and a checker atomic
/// cannot live in a static across executions.
static NEXT_NODE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

const RUNNING: u64 = 0xffff_ffff;
const QUEUED_SHIFT: u32 = 32;
const QUEUED_ALL: u64 = 0x7f << QUEUED_SHIFT;
const DISPOSED: u64 = 1 << 39;

/// How often an in-process waiter held back by its cap alone draws the
/// lottery while nothing is released (at a shared root the keeper of each
/// process draws on its backstop wake, every
/// [`BACKSTOP`](super::root::BACKSTOP) alike).
const LOTTERY_TICK: std::time::Duration = super::root::BACKSTOP;

/// Queued bits of tiers at or above `tier`, in the state word.
#[inline(always)]
const fn queued_from(tier: usize) -> u64 {
    QUEUED_ALL & !((1u64 << (QUEUED_SHIFT as usize + tier)) - 1)
}

/// An in-process level's fast-path word: running (bits 0..32), queued
/// tiers (32..39), disposed (39).
#[derive(Debug)]
pub(crate) struct LocalState {
    state: AtomicU64,
}

/// Where a level's slots come from.
#[derive(Debug)]
pub(crate) enum Level {
    /// A count in process memory, with queues in the node.
    Local(LocalState),
    /// A root shared through a region. Always a root: a node with this
    /// level has no parent (children are in-process levels), so a match on
    /// it needs no parent check.
    Shared(Arc<SharedRoot>),
}

/// A waiter in an in-process level's queue, with the task its grant (or
/// failure) wakes when it is async. The task is kept here, under the
/// level's lock that every grant already holds, rather than in the waiter
/// behind a lock of its own: that lock's lock and unlock were two locked
/// instructions on every contended async hand-off, which tokio's semaphore
/// (its waker under its queue's lock too) does not pay.
#[derive(Debug)]
struct Queued {
    waiter: Arc<Waiter>,
    task: Option<Waker>,
}

/// The queue's state under the node's lock. `repr(C)`, the fields an
/// enqueue and a dispatch write first, so that they share the lock's line
/// and the next (see [`Node`]).
#[derive(Debug)]
#[repr(C)]
struct Inner {
    next_seq: u32,
    lottery: Lottery,
    /// Granted waiters kept for reuse (at most [`SPARE_WAITERS`]): once
    /// their future or thread has let go of them, the next enqueue takes
    /// one back instead of allocating (see [`Node::enqueue`]).
    spare: Vec<Arc<Waiter>>,
    queues: [VecDeque<Queued>; LEVELS],
    children: Vec<Weak<Node>>,
}

impl Inner {
    fn backlogged(&self) -> u8 {
        let mut m = 0u8;
        for (i, q) in self.queues.iter().enumerate() {
            if !q.is_empty() {
                m |= 1 << i;
            }
        }
        m
    }
}

/// One level of a scheduler tree.
///
/// `repr(C)`, aligned to a line pair, with what a queued acquire and a
/// slow release write first (the state word, the waiting count, the
/// stall clock, the lock and the queue's head fields beside it): in a
/// contended hand-off between two threads these lines move between their
/// CPUs on every acquisition, and the fields the compiler would otherwise
/// spread over the node's ~400 bytes made more of them move (the async
/// hand-off against tokio's semaphore, criterion, three interleaved runs:
/// 1.12-1.17x -> 1.09-1.10x).
#[derive(Debug)]
#[repr(C, align(128))]
pub(crate) struct Node {
    level: Level,
    /// Waiters queued through this handle that have not left the queue
    /// (at an in-process level: written only under its lock, see
    /// `left_local`); the stall clock runs while it is above zero.
    waiting: AtomicU64,
    /// Time during which at least one task waited here (its waiters).
    stall: StallClock,
    disposed: AtomicBool,
    /// Whether a lottery ticker thread runs for this in-process level's
    /// async waiters (see [`Node::ensure_helper`]).
    ticker_running: AtomicBool,
    inner: Mutex<Inner>,
    id: u64,
    /// Resolved per-priority caps, each ≤ `max`.
    caps: [u32; LEVELS],
    /// Overall max at this level (`u32::MAX` = unlimited).
    max: u32,
    configured: Option<u32>,
    parent: Option<Arc<Node>>,
    fork_gen: u64,
    counters: Arc<Counters>,
}

impl Node {
    fn build(
        caps: [u32; LEVELS],
        max: u32,
        configured: Option<u32>,
        level: Level,
        parent: Option<Arc<Node>>,
        seed: u64,
    ) -> Node {
        Node {
            id: NEXT_NODE_ID.fetch_add(1, Ordering::Relaxed),
            caps: caps.map(|c| c.min(max)),
            max,
            configured,
            level,
            parent,
            disposed: AtomicBool::new(false),
            fork_gen: {
                // Without the handler, a fork would go unnoticed (ENOMEM only).
                let _ = crate::sys::fork::install_atfork_handler();
                fork_generation()
            },
            counters: Arc::new(Counters::default()),
            stall: StallClock::new(),
            waiting: AtomicU64::new(0),
            ticker_running: AtomicBool::new(false),
            inner: Mutex::new(Inner {
                queues: Default::default(),
                lottery: Lottery::new(seed),
                children: Vec::new(),
                next_seq: 0,
                spare: Vec::new(),
            }),
        }
    }

    /// An in-process level (a root, or a child when `parent` is given).
    pub fn local(
        caps: [u32; LEVELS],
        configured: Option<u32>,
        parent: Option<Arc<Node>>,
        seed: u64,
    ) -> Node {
        let max = configured.unwrap_or(u32::MAX);
        let level = Level::Local(LocalState {
            state: AtomicU64::new(0),
        });
        Node::build(caps, max, configured, level, parent, seed)
    }

    /// A handle on a shared root with this handle's caps.
    pub fn shared(root: Arc<SharedRoot>, caps: [u32; LEVELS], seed: u64) -> Node {
        let max = root.slots().max();
        Node::build(caps, max, Some(max), Level::Shared(root), None, seed)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing panics while holding this lock (wakers run after it); if
        // something ever did, the queues are still structurally valid.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn max(&self) -> u32 {
        self.max
    }

    pub fn parent(&self) -> Option<&Arc<Node>> {
        self.parent.as_ref()
    }

    pub fn level(&self) -> &Level {
        &self.level
    }

    pub fn is_disposed(&self) -> bool {
        self.disposed.load(Ordering::Acquire)
    }

    /// True when this handle was inherited across `fork`.
    #[inline(always)]
    pub fn forked(&self) -> bool {
        self.fork_gen != fork_generation()
    }

    pub fn add_child(&self, child: &Arc<Node>) -> Result<()> {
        let mut inner = self.lock();
        if self.is_disposed() {
            return Err(Error::Disposed);
        }
        inner.children.retain(|w| w.strong_count() > 0);
        inner.children.push(Arc::downgrade(child));
        Ok(())
    }

    /// Checks that this level can ever admit `n` units.
    #[inline(always)]
    pub fn check_usable(&self, n: u32) -> Result<()> {
        // One test on the hot path, the error built out of line.
        if self.forked() | self.is_disposed() | (n.wrapping_sub(1) >= self.max) {
            return self.unusable(n);
        }
        Ok(())
    }

    /// Why [`check_usable`](Self::check_usable) refused `n` units (`Ok`
    /// for `n = 0` on a usable level, as before the inline test: callers
    /// refuse 0 themselves, with their own message).
    #[cold]
    #[inline(never)]
    fn unusable(&self, n: u32) -> Result<()> {
        if self.forked() {
            return Err(Error::Forked(
                "a Scheduler belongs to the process that created it; in a forked child, \
                 create a new one from the Region (Scheduler::shared or Scheduler::attach)"
                    .into(),
            ));
        }
        if self.is_disposed() {
            return Err(Error::Disposed);
        }
        if self.max == 0 {
            return Err(Error::ZeroConcurrency);
        }
        if n > self.max {
            return Err(Error::InvalidArgument(format!(
                "acquire of {n} slots can never be admitted: the max is {}",
                self.max
            )));
        }
        Ok(())
    }

    /// Checks that a weighted acquire of `n` at `p` fits `p`'s cap on this
    /// (the leaf) level. A single unit may wait for a lottery pick however
    /// low the cap (a cap of 0 is served by the lottery alone, as the seed
    /// says); `n` units above a cap below the max could only ever come in
    /// that way, so they are refused at once instead of waiting for it.
    pub fn check_weight(&self, p: Priority, n: u32) -> Result<()> {
        let cap = self.caps[p.index()];
        if n > 1 && n > cap && cap < self.max {
            return Err(Error::InvalidArgument(format!(
                "acquire of {n} slots at {p} can never be admitted: the cap at {p} is {cap} \
                 (at most {cap} at once, counted against everything running here)"
            )));
        }
        Ok(())
    }

    // ---- fast paths ----------------------------------------------------------

    /// The fast path of a root-only acquire of one unit, inlined into the
    /// caller: `None` sends it to the slow path (always, for a child).
    ///
    /// An in-process root does not check for `fork` here: its state is
    /// process memory, which a forked child owns a copy of, so taking a free
    /// unit of that copy is the child's own business; only waiting (which
    /// could wait for a parent's thread that does not exist in the child)
    /// fails with [`Error::Forked`], on the slow path.
    #[inline(always)]
    pub fn fast_root(&self, p: Priority) -> Option<Slots> {
        match &self.level {
            Level::Local(st) if self.parent.is_none() => self.local_take(st, p.index(), 1),
            Level::Shared(root) if !self.forked() => self.shared_fast(root, p.index(), 1),
            _ => None,
        }
    }

    /// The fast path of a one-unit acquire on a shared root, with the root
    /// it took from: `None` (nothing taken) for any other level, in a
    /// forked child, or when the acquire must go slow. With `FIRST`, only
    /// its first look, which calls nothing out of line
    /// (`SharedSlots::take_first_look`): `None` also where the fast path
    /// would look further (waiters above, a hand-off or a lease in the
    /// gate, a cap below the max, the hint's cell taken).
    #[inline(always)]
    pub fn shared_fast_one<const FIRST: bool>(&self, p: Priority) -> Option<(&SharedRoot, Slots)> {
        match &self.level {
            Level::Shared(root) if !self.forked() => {
                Some((root, self.shared_fast_inline::<FIRST>(root, p.index(), 1)?))
            }
            _ => None,
        }
    }

    #[inline(always)]
    fn local_take(&self, st: &LocalState, tier: usize, n: u32) -> Option<Slots> {
        let block = DISPOSED | queued_from(tier);
        let cap = u64::from(self.caps[tier]);
        let mut s = st.state.load(Ordering::Relaxed);
        loop {
            if s & block != 0 || (s & RUNNING) + u64::from(n) > cap {
                return None;
            }
            match st.state.compare_exchange_weak(
                s,
                s + u64::from(n),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(Slots::counted(n)),
                Err(cur) => s = cur,
            }
        }
    }

    /// The fast path of a root-only release, inlined into the permit's drop:
    /// false sends it to the chain's release.
    #[inline(always)]
    pub fn release_fast(&self, slots: &Slots) -> bool {
        if self.parent.is_some() {
            return false;
        }
        match (&self.level, slots.view()) {
            (Level::Local(st), SlotsView::Counted(n)) => {
                let n = u64::from(n);
                let mut s = st.state.load(Ordering::Relaxed);
                while s & QUEUED_ALL == 0 {
                    match st.state.compare_exchange_weak(
                        s,
                        s - n,
                        Ordering::Release,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => return true,
                        Err(cur) => s = cur,
                    }
                }
                false
            }
            (Level::Shared(root), _) => {
                // In a forked child the units are the parent's: keep them.
                if !self.forked() {
                    root.release(slots);
                }
                true
            }
            _ => false,
        }
    }

    /// The fast path: no lock, no syscall. `None` means "go slow".
    #[inline(always)]
    pub fn fast(&self, p: Priority, n: u32) -> Option<Slots> {
        let tier = p.index();
        match &self.level {
            Level::Local(st) => self.local_take(st, tier, n),
            Level::Shared(root) => self.shared_fast(root, tier, n),
        }
    }

    #[inline(never)]
    fn shared_fast(&self, root: &SharedRoot, tier: usize, n: u32) -> Option<Slots> {
        self.shared_fast_inline::<false>(root, tier, n)
    }

    /// [`shared_fast`](Self::shared_fast) inlined, for a caller that makes
    /// it its whole fast path ([`shared_fast_one`](Self::shared_fast_one));
    /// with `FIRST`, its first look only.
    #[inline(always)]
    fn shared_fast_inline<const FIRST: bool>(
        &self,
        root: &SharedRoot,
        tier: usize,
        n: u32,
    ) -> Option<Slots> {
        // Barging within a tier is allowed (bounded: see root.rs); a
        // disposed handle goes the slow way, and so do waiters above or a
        // strict hand-off, unless they belong to processes that are passed
        // over or the hand-off lets this tier through (`root.rs`).
        if self.disposed.load(Ordering::Relaxed) {
            return None;
        }
        // A leased region (`GATE_LEASED`) is in the same one test; its
        // deadline is checked out of line (`SharedRoot::fast_gated`).
        if root.slots().reg().gate() & (GATE_STRICT | GATE_LEASED | above(tier)) != 0 {
            if FIRST {
                return None;
            }
            return root.fast_gated(tier, n, self.caps[tier]);
        }
        if FIRST {
            return root.take_first_look(n, self.caps[tier]);
        }
        root.take(n, self.caps[tier])
    }

    /// A non-blocking acquire at this level: respects queued work (here
    /// and, for a shared root, in every process).
    pub fn try_level(&self, p: Priority, n: u32) -> Option<Slots> {
        if self.check_usable(n).is_err() {
            return None;
        }
        match &self.level {
            Level::Local(_) => self.fast(p, n),
            Level::Shared(root) => root.try_take(p.index(), n, self.caps[p.index()]),
        }
    }

    /// Returns units taken at this level: straight to a queued waiter if
    /// there is one, else to the pool.
    #[inline(always)]
    pub fn release_level(&self, slots: &Slots) {
        match &self.level {
            Level::Local(st) => {
                let n = u64::from(slots.len());
                let mut s = st.state.load(Ordering::Relaxed);
                loop {
                    if s & QUEUED_ALL != 0 {
                        return self.release_slow(slots.len());
                    }
                    match st.state.compare_exchange_weak(
                        s,
                        s - n,
                        Ordering::Release,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => return,
                        Err(cur) => s = cur,
                    }
                }
            }
            Level::Shared(root) => root.release(slots),
        }
    }

    /// Takes `n` units of an in-process level on its fast path (nobody
    /// queued at or above `p`, room under its cap); false (nothing taken)
    /// for a shared level or when the caller must go slow.
    #[inline(always)]
    pub fn take_uncontended(&self, p: Priority, n: u32) -> bool {
        match &self.level {
            Level::Local(st) => self.local_take(st, p.index(), n).is_some(),
            Level::Shared(_) => false,
        }
    }

    /// The fast path of an in-process level (`Ok`: its answer), or
    /// `Err(())` for a shared one.
    #[inline(always)]
    pub fn local_fast(&self, p: Priority, n: u32) -> std::result::Result<Option<Slots>, ()> {
        match &self.level {
            Level::Local(st) => Ok(self.local_take(st, p.index(), n)),
            Level::Shared(_) => Err(()),
        }
    }

    /// Gives `n` units back to an in-process level's pool if nobody is
    /// queued there; false (nothing done) for a shared level or when a
    /// waiter must be served ([`release_level`](Self::release_level)).
    #[inline(always)]
    pub fn release_uncontended(&self, n: u32) -> bool {
        let Level::Local(st) = &self.level else {
            return false;
        };
        let n = u64::from(n);
        let mut s = st.state.load(Ordering::Relaxed);
        while s & QUEUED_ALL == 0 {
            match st
                .state
                .compare_exchange_weak(s, s - n, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(cur) => s = cur,
            }
        }
        false
    }

    /// [`release_level`](Self::release_level) after the caller's
    /// [`release_uncontended`](Self::release_uncontended) declined: at an
    /// in-process level (a queued tier) the units go straight to its
    /// dispatch (waiters first, the rest to the pool) without a second
    /// look at the state word; a shared root releases as `release_level`.
    #[inline]
    pub fn release_queued(&self, slots: &Slots) {
        if self.is_local() {
            self.release_slow(slots.len());
        } else {
            self.release_level(slots);
        }
    }

    #[cold]
    #[inline(never)]
    fn release_slow(&self, n: u32) {
        let mut out = Wakeups::default();
        {
            let mut inner = self.lock();
            self.dispatch_local(&mut inner, n, &mut out);
        }
        out.wake_local();
    }

    // ---- waiting -------------------------------------------------------------

    /// Blocking acquire at this level.
    pub fn acquire_level(
        &self,
        p: Priority,
        n: u32,
        deadline: Option<Instant>,
        via: Few<u64>,
    ) -> Result<Slots> {
        self.check_usable(n)?;
        if let Some(s) = self.fast(p, n) {
            return Ok(s);
        }
        let w = self.enqueue(p, n, via, false, None)?;
        self.wait(&w, deadline)
    }

    /// Queues a waiter at `p` and runs dispatch (which may grant it at once).
    /// `waker`: at an in-process level, an async waiter's task, registered
    /// before the waiter is queued (under the lock), so that its future
    /// needs no second registration; ignored at a shared root (the future
    /// registers it, [`Waiter::set_waker`]).
    pub fn enqueue(
        &self,
        p: Priority,
        n: u32,
        mut via: Few<u64>,
        is_async: bool,
        waker: Option<&Waker>,
    ) -> Result<Arc<Waiter>> {
        via.push(self.id);
        let tier = p.index();
        let cap = self.caps[tier];
        let w = match &self.level {
            Level::Shared(root) => {
                root.enqueue(&self.disposed, p, n, cap, via, &self.counters, is_async)?
            }
            Level::Local(st) => {
                let mut out = Wakeups::default();
                let w = {
                    let mut inner = self.lock();
                    if self.is_disposed() {
                        return Err(Error::Disposed);
                    }
                    let seq = inner.next_seq;
                    inner.next_seq = seq.wrapping_add(1);
                    let mut via = Some(via);
                    // A spare waiter nobody holds (see `take_spare`).
                    let reused = take_spare(&mut inner.spare, |m| {
                        let via = via.take().unwrap_or_default();
                        m.reuse(p, n, cap, seq, via, &self.counters, is_async);
                    });
                    let w = match reused {
                        Some(w) => w,
                        None => {
                            let via = via.take().unwrap_or_default();
                            let w =
                                Waiter::new(p, n, cap, seq, via, self.counters.clone(), is_async);
                            Arc::new(w)
                        }
                    };
                    inner.queues[tier].push_back(Queued {
                        waiter: w.clone(),
                        task: waker.cloned(),
                    });
                    self.counters.deferred_locked(tier);
                    // Counted under the lock, and uncounted by whatever
                    // takes it off the queue (`left_local`), also when
                    // this enqueue's own dispatch grants it below.
                    add_under_lock(&self.waiting, 1);
                    self.stall.update(|| true);
                    // The queued bits change only under this lock, so a
                    // load tells whether the tier's is set: behind a
                    // backlog (a contended hand-off) it is, and the locked
                    // instruction is skipped.
                    let bit = 1 << (QUEUED_SHIFT as usize + tier);
                    let mut s = st.state.load(Ordering::SeqCst);
                    if s & bit == 0 {
                        s = st.state.fetch_or(bit, Ordering::SeqCst) | bit;
                    }
                    // Every unit taken (a contended hand-off's every
                    // enqueue): dispatch could grant nothing, and with the
                    // bit set every release from here on takes this lock
                    // and dispatches, so the call is skipped.
                    if s & RUNNING < u64::from(self.max) {
                        self.dispatch_local(&mut inner, 0, &mut out);
                    }
                    w
                };
                out.wake_local();
                return Ok(w);
            }
        };
        self.waiting.fetch_add(1, Ordering::SeqCst);
        self.stall.update(|| true);
        Ok(w)
    }

    /// Registers `waker` as the task of `w`, an async waiter queued here
    /// whose future was polled again before its grant; returns true while
    /// it still waits (false: granted or failed since, look again). At an
    /// in-process level the task is in `w`'s queue entry, under the lock.
    pub fn register_task(&self, w: &Arc<Waiter>, waker: &Waker) -> bool {
        let Level::Local(_) = &self.level else {
            w.set_waker(waker);
            if w.state() == WAITING {
                return true;
            }
            // A grant (or failure) between the caller's check and the
            // registration took the old waker (or none), and nothing would
            // take this one: it goes now, outside any lock, not with the
            // waiter's reuse under the root's lock. The caller looks again.
            w.drop_task();
            return false;
        };
        let old = {
            let mut inner = self.lock();
            if w.state() != WAITING {
                return false;
            }
            let entry = inner.queues[w.tier()]
                .iter_mut()
                .find(|q| Arc::ptr_eq(&q.waiter, w));
            match entry {
                Some(Queued { task: Some(t), .. }) if t.will_wake(waker) => None,
                Some(q) => q.task.replace(waker.clone()),
                None => None, // still WAITING, so queued: never
            }
        };
        // A waker's drop is the task's code: never under the lock.
        drop(old);
        true
    }

    /// What a waiter queued here that was seen `GRANTED` was handed (once):
    /// at an in-process level its count (nothing is stored, see
    /// [`Waiter::grant_counted`]), at a shared root its cells.
    #[inline]
    pub fn granted_slots(&self, w: &Waiter) -> Slots {
        match &self.level {
            Level::Local(_) => Slots::counted(w.need),
            Level::Shared(_) => w.take_slots(),
        }
    }

    /// True for an in-process level (its queues are in this node).
    #[inline]
    pub fn is_local(&self) -> bool {
        matches!(self.level, Level::Local(_))
    }

    /// Book-keeping once an async waiter queued here is done (granted or
    /// failed, seen by its future).
    pub fn waited_async(&self) {
        self.waited();
    }

    /// Book-keeping once a waiter queued through this handle is done (at
    /// a shared root; at an in-process level `left_local` did it when the
    /// waiter left the queue).
    fn waited(&self) {
        if self.is_local() {
            return;
        }
        if self.waiting.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.stall
                .update(|| self.waiting.load(Ordering::SeqCst) > 0);
        }
    }

    /// Blocks until `w` is granted, failed, or `deadline` passes.
    pub fn wait(&self, w: &Arc<Waiter>, deadline: Option<Instant>) -> Result<Slots> {
        let r = match &self.level {
            Level::Shared(root) => root.wait(w, deadline),
            Level::Local(st) => loop {
                match w.state() {
                    GRANTED => break Ok(Slots::counted(w.need)),
                    FAILED => break Err(Error::Disposed),
                    _ => {}
                }
                let mut timeout = match deadline {
                    Some(d) => {
                        let now = Instant::now();
                        if now >= d {
                            break self.cancel_local(w);
                        }
                        Some(d - now)
                    }
                    None => None,
                };
                // Held back by its cap alone, with capacity free under the
                // max: only a lottery pick can admit it, and dispatch runs
                // on releases, which an idle scheduler has none of. Draw
                // every LOTTERY_TICK meanwhile (at a shared root each
                // process's keeper draws on its backstop wake alike).
                let cap_bound = self.held_by_cap_only(st, w);
                if cap_bound {
                    timeout = Some(timeout.map_or(LOTTERY_TICK, |t| t.min(LOTTERY_TICK)));
                }
                futex_wait(&w.state, WAITING, timeout);
                if cap_bound && w.state() == WAITING {
                    self.tick_lottery();
                }
            },
        };
        self.waited();
        r
    }

    /// Whether `w` waits only because of its priority's cap: what runs now
    /// plus what it needs fits the max but not the cap.
    fn held_by_cap_only(&self, st: &LocalState, w: &Waiter) -> bool {
        let running = st.state.load(Ordering::SeqCst) & RUNNING;
        self.cap_bound(running, w.need, w.tier())
    }

    /// Whether `need` more at `tier` fits the max but not the tier's cap,
    /// with `running` units taken.
    fn cap_bound(&self, running: u64, need: u32, tier: usize) -> bool {
        let after = running + u64::from(need);
        after <= u64::from(self.max) && after > u64::from(self.caps[tier])
    }

    /// Removes a waiter whose deadline passed (or whose future was
    /// dropped), unless a grant beat it: then its slots come back as `Ok`.
    pub fn cancel(&self, w: &Arc<Waiter>) -> Result<Slots> {
        let r = match &self.level {
            Level::Shared(root) => root.cancel(w),
            Level::Local(_) => self.cancel_local(w),
        };
        self.waited();
        r
    }

    fn cancel_local(&self, w: &Arc<Waiter>) -> Result<Slots> {
        let mut out = Wakeups::default();
        // Its entry, dropped after the lock (its task's waker with it).
        let mut left = None;
        let r = {
            let mut inner = self.lock();
            match w.state() {
                GRANTED => return Ok(Slots::counted(w.need)),
                FAILED => return Err(Error::Disposed),
                _ => {}
            }
            let tier = w.tier();
            if let Some(pos) = inner.queues[tier]
                .iter()
                .position(|x| Arc::ptr_eq(&x.waiter, w))
            {
                left = inner.queues[tier].remove(pos);
                self.left_local(&inner, w, true);
            }
            w.fail();
            // The waiter behind it may fit now (a weighted one left, say).
            self.dispatch_local(&mut inner, 0, &mut out);
            Err(Error::Timeout)
        };
        drop(left);
        out.wake_local();
        r
    }

    /// Book-keeping for a waiter just taken off this in-process level's
    /// queue (granted, cancelled or failed), under its lock: its tier's
    /// counters and queued bit, and the level's waiting count and stall
    /// clock (a waiter stops waiting when it leaves the queue).
    fn left_local(&self, inner: &Inner, w: &Waiter, cancelled: bool) {
        let tier = w.tier();
        w.counters.left_locked(tier, cancelled);
        if add_under_lock(&self.waiting, -1) == 0 {
            self.stall
                .update(|| self.waiting.load(Ordering::SeqCst) > 0);
        }
        if inner.queues[tier].is_empty() {
            if let Level::Local(st) = &self.level {
                st.state
                    .fetch_and(!(1 << (QUEUED_SHIFT as usize + tier)), Ordering::SeqCst);
            }
        }
    }

    /// Hands units to queued waiters by the lottery's picks. `in_hand`
    /// units are being released by the caller: they go to waiters first and
    /// only what is left returns to the count.
    fn dispatch_local(&self, inner: &mut Inner, mut in_hand: u32, out: &mut Wakeups) {
        let Level::Local(st) = &self.level else {
            return;
        };
        loop {
            // The queued bits of the state word are the backlogged tiers
            // (set and cleared under this lock with the queues themselves:
            // `enqueue`, `left_local`), so no queue needs a look to know.
            let s0 = st.state.load(Ordering::SeqCst);
            let backlogged = ((s0 & QUEUED_ALL) >> QUEUED_SHIFT) as u8;
            if backlogged == 0 {
                break;
            }
            let running = (s0 & RUNNING) - u64::from(in_hand);
            // Every unit taken: no pick could grant anything (a lottery
            // pick's limit is the max, every cap is at most the max), so no
            // draw either. This is an enqueue's dispatch behind a busy
            // scheduler, the common case of a contended hand-off.
            if running >= u64::from(self.max) {
                break;
            }
            let queues = &inner.queues;
            let caps = &self.caps;
            // Fronts are looked at highest tier first, only as far as the
            // pick needs (the same draw and decision as `Lottery::pick`).
            let Some(pick) = inner.lottery.pick_lazy(backlogged, |t| {
                queues[t]
                    .front()
                    .is_some_and(|f| running + u64::from(f.waiter.need) <= u64::from(caps[t]))
            }) else {
                break;
            };
            let Some(need) = inner.queues[pick.tier].front().map(|f| f.waiter.need) else {
                break; // a queued bit without a waiter: never (see above)
            };
            let limit = u64::from(if pick.lottery {
                self.max
            } else {
                self.caps[pick.tier]
            });
            let used = in_hand.min(need);
            let extra = u64::from(need - used);
            // Take what the in-hand units do not cover, against the limit.
            let mut s = st.state.load(Ordering::SeqCst);
            let took = loop {
                let now_running = (s & RUNNING) - u64::from(in_hand);
                if now_running + u64::from(need) > limit {
                    break false;
                }
                if extra == 0 {
                    break true;
                }
                match st.state.compare_exchange_weak(
                    s,
                    s + extra,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                ) {
                    Ok(_) => break true,
                    Err(cur) => s = cur,
                }
            };
            if !took {
                break;
            }
            in_hand -= used;
            let Queued { waiter: w, task } = inner.queues[pick.tier].pop_front().expect("a front");
            self.left_local(inner, &w, false);
            w.grant_counted();
            out.add_local(&w, task);
            // Kept for the next enqueue: its future (or thread) still holds
            // it and lets go once it has seen the grant.
            if inner.spare.len() < SPARE_WAITERS {
                inner.spare.push(w);
            }
        }
        if in_hand > 0 {
            st.state.fetch_sub(u64::from(in_hand), Ordering::SeqCst);
        }
    }

    /// Async waiters at a shared root need the process's helper thread.
    #[inline]
    pub fn ensure_helper(self: &Arc<Self>) {
        match &self.level {
            Level::Shared(root) => root.ensure_helper(),
            // A load first: on every async enqueue the ticker already runs,
            // and a read leaves the line shared between the workers.
            Level::Local(_) if self.ticker_running.load(Ordering::Acquire) => {}
            Level::Local(_) => self.ensure_lottery_ticker(),
        }
    }

    /// An async waiter cannot draw the lottery itself while it waits (a
    /// blocking one does, every [`LOTTERY_TICK`], when its cap alone holds
    /// it back): one thread per in-process level does it for them, while
    /// anything is queued there.
    fn ensure_lottery_ticker(self: &Arc<Self>) {
        // A load first: on every async enqueue the ticker already runs, and
        // a read leaves the line shared between the workers.
        if self.ticker_running.load(Ordering::Acquire)
            || self.ticker_running.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("shmsched-lottery".into())
            .spawn(move || lottery_ticker(weak));
        if spawned.is_err() {
            // No thread: the async waiters are still served by releases.
            self.ticker_running.store(false, Ordering::Release);
        }
    }

    /// True while anything is queued here.
    fn has_waiters(&self) -> bool {
        self.lock().backlogged() != 0
    }

    /// Draws the lottery if a front waiter is held back by its cap alone
    /// (capacity free under the max): the in-process twin of a shared
    /// root's backstop draw (its keeper's).
    fn tick_lottery(&self) {
        let Level::Local(st) = &self.level else {
            return;
        };
        let mut out = Wakeups::default();
        {
            let mut inner = self.lock();
            let running = st.state.load(Ordering::SeqCst) & RUNNING;
            let cap_bound = inner.queues.iter().enumerate().any(|(t, q)| {
                q.front()
                    .is_some_and(|f| self.cap_bound(running, f.waiter.need, t))
            });
            if cap_bound {
                self.dispatch_local(&mut inner, 0, &mut out);
            }
        }
        out.wake_local();
    }

    // ---- dispose, lottery, stats ------------------------------------------------

    /// Disposes this level and its descendants: queued waiters fail with
    /// [`Error::Disposed`], later calls fail at once. Units held by live
    /// permits stay held until those permits drop (the hard cap stays hard).
    pub fn dispose(self: &Arc<Node>) {
        if self.forked() || self.disposed.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Level::Local(st) = &self.level {
            st.state.fetch_or(DISPOSED, Ordering::SeqCst);
        }
        let children = std::mem::take(&mut self.lock().children);
        for c in children.iter().filter_map(Weak::upgrade) {
            c.dispose();
        }
        let id = self.id;
        self.fail_where(&|w: &Waiter| w.via.contains(&id));
        let mut up = self.parent.clone();
        while let Some(a) = up {
            a.fail_where(&|w: &Waiter| w.via.contains(&id));
            up = a.parent.clone();
        }
    }

    /// Fails and removes every queued waiter matching `pred`.
    fn fail_where(&self, pred: &dyn Fn(&Waiter) -> bool) {
        match &self.level {
            Level::Shared(root) => root.fail_where(pred),
            Level::Local(_) => {
                let mut out = Wakeups::default();
                {
                    let mut inner = self.lock();
                    for tier in 0..LEVELS {
                        let mut i = 0;
                        while i < inner.queues[tier].len() {
                            if !pred(&inner.queues[tier][i].waiter) {
                                i += 1;
                                continue;
                            }
                            let Queued { waiter: w, task } =
                                inner.queues[tier].remove(i).expect("index in range");
                            self.left_local(&inner, &w, true);
                            w.fail();
                            out.add_local(&w, task);
                        }
                    }
                    self.dispatch_local(&mut inner, 0, &mut out);
                }
                out.wake_local();
            }
        }
    }

    /// Reseeds the lottery, or switches it off (`enabled` false: strict
    /// priority within caps). A shared root's lottery is the region's.
    pub fn set_lottery(&self, seed: Option<u64>, enabled: bool) {
        if self.forked() {
            return;
        }
        match &self.level {
            Level::Shared(root) => root.slots().reg().set_lottery(seed, enabled),
            Level::Local(_) => {
                let mut inner = self.lock();
                if let Some(seed) = seed {
                    inner.lottery = Lottery::new(seed);
                }
                inner.lottery.enabled = enabled;
            }
        }
    }

    /// Units held at this level (in-process: the count; shared: this
    /// process's cells).
    pub fn running(&self) -> u64 {
        match &self.level {
            Level::Local(st) => st.state.load(Ordering::SeqCst) & RUNNING,
            Level::Shared(root) => u64::from(root.held_here()),
        }
    }

    pub fn stats(&self) -> SchedulerStats {
        let c = &self.counters;
        let mut queues = [QueueStats::default(); LEVELS];
        let mut total = QueueStats::default();
        for (t, q) in queues.iter_mut().enumerate() {
            let tc = &c.tiers[t];
            q.deferred = tc.deferred.load(Ordering::Relaxed);
            q.completed = tc.completed.load(Ordering::Relaxed);
            q.cancelled = tc.cancelled.load(Ordering::Relaxed);
            q.count = q.deferred.saturating_sub(q.completed);
            total.add(q);
        }
        let shared = match &self.level {
            Level::Shared(root) if !self.forked() => Some(root.slots().stats()),
            _ => None,
        };
        SchedulerStats {
            running: if self.forked() { 0 } else { self.running() },
            concurrency: self.configured,
            pending: total.count,
            total,
            stall_ns: self.stall.total_ns(),
            queues,
            shared,
        }
    }
}

/// The lottery ticker of an in-process level with async waiters: draws
/// every [`LOTTERY_TICK`] while anything is queued there, then exits.
fn lottery_ticker(weak: Weak<Node>) {
    loop {
        {
            let Some(node) = weak.upgrade() else { return };
            if node.forked() {
                return;
            }
            if !node.has_waiters() {
                node.ticker_running.store(false, Ordering::SeqCst);
                // A waiter may have queued between the check and the store.
                if !node.has_waiters() || node.ticker_running.swap(true, Ordering::SeqCst) {
                    return;
                }
            }
            node.tick_lottery();
        }
        std::thread::sleep(LOTTERY_TICK);
    }
}
