//! The scheduling policy, written once for every home.
//!
//! A [`Node`] is one level of a scheduler tree: the root (in process memory
//! or in a region) or a child that adds a local cap on top of its parent.
//! Each level has a slot [`Pool`], seven FIFO queues and a [`Lottery`].
//!
//! **Admission at one level.** A task at priority `p` takes the fast path
//! (one CAS, no lock, no syscall) only when nothing is queued at `p` in this
//! level, nobody waits in another process (region mode), and fewer than
//! `cap[p]` tasks run. Otherwise it queues at `p` and sleeps.
//!
//! **Dispatch.** Whenever a slot may have become usable (a release, an
//! enqueue, a wake-up in region mode) the level's lock is taken and the
//! lottery picks a backlogged tier; the front waiter of that tier gets a slot
//! taken on its behalf and is woken already holding it (a hand-off: nobody
//! can steal it between the wake and the run). In a region, a non-lottery
//! pick first defers to a higher-priority waiter in another process whose
//! cap admits it: that process is woken instead, so priorities hold across
//! processes.
//!
//! **A chain** (child → … → root) is acquired leaf first; each level is
//! released if a later level fails (timeout, dispose), so a failed acquire
//! leaves no count behind anywhere.
//!
//! **Ordering.** A releaser returns its slot (SeqCst RMW) and then reads the
//! queued mask (SeqCst); an enqueuer sets the mask (SeqCst RMW) and then
//! tries to take a slot. One of the two sees the other, so a waiter is never
//! left queued next to a free slot.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use super::lottery::Lottery;
use super::pool::LocalSlots;
use super::shared::SharedSlots;
use super::stats::{QueueStats, SchedulerStats};
use super::waiter::{Waiter, FAILED, GRANTED, WAITING};
use crate::error::{Error, Result};
use crate::priority::{Priority, LEVELS};
use crate::stall::StallClock;
use crate::sys::fork::fork_generation;
use crate::sys::futex::{futex_wait, futex_wake, WaitResult};

/// In region mode a sleeping waiter wakes at least this often to run
/// dispatch itself and, if the budget is full, to look for dead holders.
pub(crate) const BACKSTOP: Duration = Duration::from_millis(50);

static NEXT_NODE_ID: AtomicU64 = AtomicU64::new(1);

/// The pump loop (see [`Node::ensure_pump`]).
fn pump(weak: Weak<Node>) {
    loop {
        let Some(node) = weak.upgrade() else { return };
        let Pool::Shared(s) = &node.pool else { return };
        if node.async_waiting.load(Ordering::SeqCst) == 0 || node.is_disposed() {
            node.pump_running.store(false, Ordering::SeqCst);
            // A waiter may have queued between the check and the store.
            if node.async_waiting.load(Ordering::SeqCst) == 0
                || node.pump_running.swap(true, Ordering::SeqCst)
            {
                return;
            }
        }
        let seq = s.my_futex().load(Ordering::SeqCst);
        node.dispatch(None);
        if s.running() >= node.max {
            s.maybe_reap();
        }
        s.sleep(seq, BACKSTOP);
    }
}

/// Where a level's slots come from.
#[derive(Debug)]
pub(crate) enum Pool {
    /// A counter in process memory.
    Local(LocalSlots),
    /// The slot table of a region.
    Shared(Box<SharedSlots>),
}

impl Pool {
    #[inline]
    fn try_take(&self, limit: u32) -> Option<u32> {
        match self {
            Pool::Local(l) => l.try_take(limit).then_some(0),
            Pool::Shared(s) => s.try_take(limit),
        }
    }

    #[inline]
    fn give(&self, ticket: u32) {
        match self {
            Pool::Local(l) => l.give(),
            Pool::Shared(s) => s.give(ticket),
        }
    }

    #[inline]
    fn running(&self) -> u32 {
        match self {
            Pool::Local(l) => l.running(),
            Pool::Shared(s) => s.running(),
        }
    }

    #[inline]
    fn anyone_waiting(&self) -> bool {
        match self {
            Pool::Local(_) => false,
            Pool::Shared(s) => s.anyone_waiting(),
        }
    }
}

#[derive(Debug)]
struct Inner {
    queues: [VecDeque<Arc<Waiter>>; LEVELS],
    counters: [QueueStats; LEVELS],
    lottery: Lottery,
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
#[derive(Debug)]
pub(crate) struct Node {
    id: u64,
    /// Resolved per-priority caps, each ≤ `max`.
    caps: [u32; LEVELS],
    /// Overall max at this level (`u32::MAX` = unlimited).
    max: u32,
    configured: Option<u32>,
    pool: Pool,
    parent: Option<Arc<Node>>,
    /// Bit `i` set while tier `i`'s queue is non-empty (read on the fast path).
    queued: AtomicU32,
    disposed: AtomicBool,
    /// Time during which at least one task waited here.
    stall: StallClock,
    /// Async waiters queued here (region mode: the pump runs while > 0).
    async_waiting: AtomicU32,
    /// True while this node's pump thread runs.
    pump_running: AtomicBool,
    fork_gen: u64,
    inner: Mutex<Inner>,
}

impl Node {
    pub fn new(
        caps: [u32; LEVELS],
        configured: Option<u32>,
        pool: Pool,
        parent: Option<Arc<Node>>,
        seed: u64,
    ) -> Node {
        let max = match &pool {
            Pool::Shared(s) => s.max().min(configured.unwrap_or(u32::MAX)),
            Pool::Local(_) => configured.unwrap_or(u32::MAX),
        };
        Node {
            id: NEXT_NODE_ID.fetch_add(1, Ordering::Relaxed),
            caps: caps.map(|c| c.min(max)),
            max,
            configured,
            pool,
            parent,
            queued: AtomicU32::new(0),
            disposed: AtomicBool::new(false),
            stall: StallClock::new(),
            async_waiting: AtomicU32::new(0),
            pump_running: AtomicBool::new(false),
            fork_gen: {
                // Without the handler, a fork would go unnoticed (ENOMEM only).
                let _ = crate::sys::fork::install_atfork_handler();
                fork_generation()
            },
            inner: Mutex::new(Inner {
                queues: Default::default(),
                counters: Default::default(),
                lottery: Lottery::new(seed),
                children: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing panics while holding this lock; if a panic ever did, the
        // queues are still structurally valid, so keep going.
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

    pub fn pool_running(&self) -> u32 {
        self.pool.running()
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn is_disposed(&self) -> bool {
        self.disposed.load(Ordering::Acquire)
    }

    /// True when this handle was inherited across `fork`.
    #[inline]
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

    /// Checks that this level can ever admit anything.
    pub fn check_usable(&self) -> Result<()> {
        if self.is_disposed() {
            return Err(Error::Disposed);
        }
        if self.forked() {
            return Err(Error::Forked(
                "a Scheduler belongs to the process that created it; in a forked child, \
                 create a new one from the Region (Scheduler::shared or Scheduler::attach)"
                    .into(),
            ));
        }
        if self.max == 0 {
            return Err(Error::ZeroConcurrency);
        }
        Ok(())
    }

    #[inline]
    fn take(&self, limit: u32) -> Option<u32> {
        self.pool.try_take(limit)
    }

    /// The fast path: no lock, no syscall. `None` means "go slow".
    #[inline]
    pub fn try_fast(&self, p: Priority) -> Option<u32> {
        if self.is_disposed()
            || self.queued.load(Ordering::SeqCst) & (1 << p.index()) != 0
            || self.pool.anyone_waiting()
        {
            return None;
        }
        self.take(self.caps[p.index()])
    }

    /// A non-blocking acquire that respects queued work and, in a region,
    /// higher-priority waiters elsewhere.
    pub fn try_level(&self, p: Priority) -> Option<u32> {
        if let Some(t) = self.try_fast(p) {
            return Some(t);
        }
        let inner = self.lock();
        if self.is_disposed() || !inner.queues[p.index()].is_empty() {
            return None;
        }
        if let Pool::Shared(s) = &self.pool {
            if s.defer_to(p.index(), s.running()).is_some() {
                return None;
            }
        }
        self.take(self.caps[p.index()])
    }

    /// Blocking acquire at this level.
    pub fn acquire_level(
        &self,
        p: Priority,
        deadline: Option<Instant>,
        via: Vec<u64>,
    ) -> Result<u32> {
        self.check_usable()?;
        if let Some(t) = self.try_fast(p) {
            return Ok(t);
        }
        let waiter = self.enqueue(p, via, false)?;
        self.wait(&waiter, deadline)
    }

    /// Queues a waiter at `p` and runs dispatch (which may grant it at once).
    pub fn enqueue(&self, p: Priority, via: Vec<u64>, is_async: bool) -> Result<Arc<Waiter>> {
        let waiter = Arc::new(Waiter::new(p, via, is_async));
        let target = {
            let mut inner = self.lock();
            if self.is_disposed() {
                return Err(Error::Disposed);
            }
            let tier = p.index();
            inner.queues[tier].push_back(waiter.clone());
            inner.counters[tier].deferred += 1;
            if is_async {
                self.async_waiting.fetch_add(1, Ordering::SeqCst);
            }
            self.queued.fetch_or(1 << tier, Ordering::SeqCst);
            self.stall.update(|| true);
            if let Pool::Shared(s) = &self.pool {
                s.publish_waiting(tier, 1, self.caps[tier]);
            }
            self.dispatch_locked(&mut inner, None).0
        };
        self.wake_remote(target);
        Ok(waiter)
    }

    fn wake_remote(&self, target: Option<u32>) {
        if let (Some(idx), Pool::Shared(s)) = (target, &self.pool) {
            s.wake_process(idx);
        }
    }

    /// Hands free slots to queued waiters, by the lottery's picks.
    ///
    /// `in_hand` is a slot a releaser passes straight on: it is never put
    /// back in the pool while someone waits, so a fresh fast-path caller
    /// cannot take it ahead of the lottery. Returns a process to wake when a
    /// higher-priority waiter elsewhere should get a slot instead, and the
    /// in-hand slot if nobody here could use it.
    fn dispatch_locked(
        &self,
        inner: &mut Inner,
        mut in_hand: Option<u32>,
    ) -> (Option<u32>, Option<u32>) {
        let mut granted_shared = false;
        let mut defer = None;
        loop {
            let backlogged = inner.backlogged();
            if backlogged == 0 {
                break;
            }
            // The in-hand slot is being freed: it does not count as running.
            let running = self
                .pool
                .running()
                .saturating_sub(u32::from(in_hand.is_some()));
            let mut admissible = 0u8;
            for (i, &cap) in self.caps.iter().enumerate() {
                if running < cap {
                    admissible |= 1 << i;
                }
            }
            let Some(pick) = inner.lottery.pick(backlogged, admissible) else {
                break;
            };
            if let (false, Pool::Shared(s)) = (pick.lottery, &self.pool) {
                if let Some(idx) = s.defer_to(pick.tier, running) {
                    defer = Some(idx);
                    break;
                }
            }
            let ticket = match in_hand.take() {
                Some(t) => t,
                None => {
                    let limit = if pick.lottery {
                        self.max
                    } else {
                        self.caps[pick.tier]
                    };
                    match self.take(limit) {
                        Some(t) => t,
                        None => break,
                    }
                }
            };
            let w = inner.queues[pick.tier]
                .pop_front()
                .expect("tier is backlogged");
            self.leave_queue(inner, &w, false);
            w.ticket.store(ticket, Ordering::Relaxed);
            w.state.store(GRANTED, Ordering::Release);
            self.notify(&w, &mut granted_shared);
        }
        if granted_shared {
            if let Pool::Shared(s) = &self.pool {
                s.notify_mine();
            }
        }
        (defer, in_hand)
    }

    /// Runs dispatch under the lock and acts on its answer.
    fn dispatch(&self, in_hand: Option<u32>) {
        let (target, leftover) = {
            let mut inner = self.lock();
            self.dispatch_locked(&mut inner, in_hand)
        };
        if let Some(t) = leftover {
            self.give(t);
        }
        self.wake_remote(target);
    }

    /// Puts one slot back in the pool.
    #[inline]
    fn give(&self, ticket: u32) {
        self.pool.give(ticket);
    }

    /// Wakes whoever waits on `w`: its task, or its thread (in a region,
    /// threads sleep on the process's futex word: `batch` asks the caller
    /// to wake it once after the loop).
    fn notify(&self, w: &Waiter, batch: &mut bool) {
        if w.is_async {
            w.wake_task();
            return;
        }
        match &self.pool {
            Pool::Local(_) => {
                futex_wake(&w.state, 1);
            }
            Pool::Shared(_) => *batch = true,
        }
    }

    /// Book-keeping for a waiter that just left its tier's queue.
    fn leave_queue(&self, inner: &mut Inner, w: &Waiter, cancelled: bool) {
        let tier = w.priority.index();
        if w.is_async {
            self.async_waiting.fetch_sub(1, Ordering::SeqCst);
        }
        inner.counters[tier].completed += 1;
        if cancelled {
            inner.counters[tier].cancelled += 1;
        }
        if inner.queues[tier].is_empty() {
            self.queued.fetch_and(!(1 << tier), Ordering::SeqCst);
            let backlogged = inner.backlogged() != 0;
            self.stall.update(|| backlogged);
        }
        if let Pool::Shared(s) = &self.pool {
            s.publish_waiting(tier, -1, self.caps[tier]);
        }
    }

    fn wait(&self, w: &Arc<Waiter>, deadline: Option<Instant>) -> Result<u32> {
        loop {
            match w.state() {
                GRANTED => return Ok(w.ticket.load(Ordering::Relaxed)),
                FAILED => return Err(Error::Disposed),
                _ => {}
            }
            let remaining = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return self.cancel(w);
                    }
                    Some(d - now)
                }
                None => None,
            };
            match &self.pool {
                Pool::Local(_) => {
                    // Wake now and then to run dispatch: a tier capped below
                    // the running count gets lottery draws even when nothing
                    // else happens.
                    let nap = remaining.map_or(BACKSTOP, |r| r.min(BACKSTOP));
                    if futex_wait(&w.state, WAITING, Some(nap)) == WaitResult::TimedOut {
                        self.dispatch(None);
                    }
                }
                Pool::Shared(s) => {
                    let seq = s.my_futex().load(Ordering::SeqCst);
                    self.dispatch(None);
                    if w.state() != WAITING {
                        continue;
                    }
                    if s.running() >= self.max {
                        s.maybe_reap();
                    }
                    let nap = remaining.map_or(BACKSTOP, |r| r.min(BACKSTOP));
                    s.sleep(seq, nap);
                }
            }
        }
    }

    /// Removes a waiter whose deadline passed (or whose future was
    /// dropped), unless a grant beat it: then the slot is returned as `Ok`.
    pub fn cancel(&self, w: &Arc<Waiter>) -> Result<u32> {
        let mut inner = self.lock();
        match w.state() {
            GRANTED => return Ok(w.ticket.load(Ordering::Relaxed)),
            FAILED => return Err(Error::Disposed),
            _ => {}
        }
        let tier = w.priority.index();
        if let Some(pos) = inner.queues[tier].iter().position(|x| Arc::ptr_eq(x, w)) {
            inner.queues[tier].remove(pos);
            self.leave_queue(&mut inner, w, true);
        }
        w.state.store(FAILED, Ordering::Release);
        drop(inner);
        Err(Error::Timeout)
    }

    /// Returns one slot taken at this level: straight to a queued waiter if
    /// there is one, else to the pool.
    #[inline]
    pub fn release_level(&self, ticket: u32) {
        if self.queued.load(Ordering::SeqCst) != 0 {
            self.dispatch(Some(ticket));
        } else {
            self.give(ticket);
            // A waiter may have queued between the check and the give; it
            // set the mask before trying to take, so one of us sees the other.
            if self.queued.load(Ordering::SeqCst) != 0 {
                self.dispatch(None);
            }
        }
        if let Pool::Shared(s) = &self.pool {
            s.wake_after_release();
        }
    }

    /// Disposes this level and its descendants: queued waiters fail with
    /// [`Error::Disposed`], later calls fail at once. Slots held by live
    /// permits stay held until those permits drop (the hard cap stays hard).
    pub fn dispose(self: &Arc<Node>) {
        if self.disposed.swap(true, Ordering::AcqRel) {
            return;
        }
        let children = std::mem::take(&mut self.lock().children);
        for c in children.iter().filter_map(Weak::upgrade) {
            c.dispose();
        }
        self.fail_where(|_| true);
        let mut up = self.parent.clone();
        while let Some(a) = up {
            a.fail_where(|w| w.via.contains(&self.id));
            up = a.parent.clone();
        }
    }

    /// Fails and removes every queued waiter matching `pred`.
    fn fail_where(&self, pred: impl Fn(&Waiter) -> bool) {
        let mut inner = self.lock();
        let mut failed_shared = false;
        for tier in 0..LEVELS {
            let mut i = 0;
            while i < inner.queues[tier].len() {
                if !pred(&inner.queues[tier][i]) {
                    i += 1;
                    continue;
                }
                let w = inner.queues[tier].remove(i).expect("index in range");
                self.leave_queue(&mut inner, &w, true);
                w.state.store(FAILED, Ordering::Release);
                self.notify(&w, &mut failed_shared);
            }
        }
        drop(inner);
        if let (true, Pool::Shared(s)) = (failed_shared, &self.pool) {
            s.notify_mine();
        }
    }

    /// In region mode, async waiters have no thread of their own to notice
    /// a release in another process: one pump thread per node and process
    /// sleeps on the process's futex word while async waiters are queued,
    /// and runs dispatch when woken (which wakes the granted tasks).
    pub fn ensure_pump(self: &Arc<Node>) {
        if !matches!(self.pool, Pool::Shared(_)) || self.pump_running.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("shmsched-pump".into())
            .spawn(move || pump(weak));
        if spawned.is_err() {
            // No thread: async waiters still get slots handed over by local
            // releases; cross-process wakes wait for the next local event.
            self.pump_running.store(false, Ordering::Release);
        }
    }

    /// Reseeds the lottery, or switches it off (`enabled` false: strict
    /// priority within caps).
    pub fn set_lottery(&self, seed: Option<u64>, enabled: bool) {
        let mut inner = self.lock();
        if let Some(seed) = seed {
            inner.lottery = Lottery::new(seed);
        }
        inner.lottery.enabled = enabled;
    }

    pub fn stats(&self) -> SchedulerStats {
        let inner = self.lock();
        let mut queues = inner.counters;
        let mut total = QueueStats::default();
        for (q, queue) in queues.iter_mut().zip(inner.queues.iter()) {
            q.count = queue.len() as u64;
            total.add(q);
        }
        drop(inner);
        let (running, shared) = match &self.pool {
            Pool::Local(l) => (l.running() as u64, None),
            // Cells this process owns (one scan; stats are not a hot path).
            Pool::Shared(s) => (u64::from(s.held_by(s.owner())), Some(s.stats())),
        };
        SchedulerStats {
            running,
            concurrency: self.configured.or(match &self.pool {
                Pool::Shared(s) => Some(s.max()),
                Pool::Local(_) => None,
            }),
            pending: total.count,
            total,
            stall_ns: self.stall.total_ns(),
            queues,
            shared,
        }
    }
}
