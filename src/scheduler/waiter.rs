//! A queued task, and what a grant hands it.
//!
//! A [`Waiter`] is owned jointly by its queue and by whoever waits on it (a
//! blocked thread, or an async task through its future). Its state moves
//! from `WAITING` to `GRANTED` or `FAILED` exactly once, always under the
//! lock of the queue it sits in, so a timed-out waiter that takes that lock
//! and still sees `WAITING` can remove itself without racing a grant.
//!
//! Wakers are never called under a lock: the code that finishes a waiter
//! collects what to wake in a [`Wakeups`] and wakes after unlocking, so a
//! waker that re-enters the scheduler (or panics) cannot deadlock it or
//! leave it half-updated.

use crate::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;

use crate::few::Few;
use crate::priority::{Priority, LEVELS};
use crate::region::park::{Park, Parked};

pub(crate) const WAITING: u32 = 0;
pub(crate) const GRANTED: u32 = 1;
pub(crate) const FAILED: u32 = 2;

/// The slots a grant hands over at a scheduler's root, and the priority
/// they were taken at, packed in one word (a permit is two words, so it
/// travels in registers):
///
/// - `Counted(n)`: `n` units of an in-process count;
/// - `One(cell)`: one region cell (the common case), with
///   [`COUNTED`](super::shared::COUNTED) if it is counted in `held`;
/// - `Many(cells)`: several region cells (a weighted acquire), boxed.
///
/// Bits 0..57 hold the payload (a count, a cell, or the box's address:
/// Linux user-space addresses fit in 57 bits), 57..60 the priority, 60..62
/// the kind.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Slots(u64);

const PAYLOAD: u64 = (1 << 57) - 1;
const PRIO_SHIFT: u32 = 57;
const KIND_SHIFT: u32 = 60;
const KIND_COUNTED: u64 = 0;
const KIND_ONE: u64 = 1;
const KIND_MANY: u64 = 2;

/// A view of [`Slots`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SlotsView<'a> {
    /// Units of an in-process count.
    Counted(u32),
    /// One region cell number (maybe tagged `COUNTED`).
    One(u32),
    /// Several region cell numbers.
    Many(&'a [u32]),
}

impl Slots {
    /// `n` units of an in-process count.
    #[inline(always)]
    pub fn counted(n: u32) -> Slots {
        Slots((KIND_COUNTED << KIND_SHIFT) | u64::from(n))
    }

    /// One region cell.
    #[inline(always)]
    pub fn one(cell: u32) -> Slots {
        Slots((KIND_ONE << KIND_SHIFT) | u64::from(cell))
    }

    /// Several region cells; `None` only if the box's address does not fit
    /// the payload (never on Linux).
    pub fn many(cells: Vec<u32>) -> Option<Slots> {
        let ptr = Box::into_raw(Box::new(cells));
        let addr = ptr as usize as u64;
        if addr & !PAYLOAD != 0 {
            // SAFETY: `ptr` came from Box::into_raw just above and was not
            // shared; taking it back frees it exactly once.
            drop(unsafe { Box::from_raw(ptr) });
            return None;
        }
        Some(Slots((KIND_MANY << KIND_SHIFT) | addr))
    }

    #[inline(always)]
    fn kind(&self) -> u64 {
        (self.0 >> KIND_SHIFT) & 3
    }

    /// What the slots are.
    #[inline(always)]
    pub fn view(&self) -> SlotsView<'_> {
        match self.kind() {
            KIND_ONE => SlotsView::One(self.0 as u32),
            KIND_MANY => {
                // SAFETY: a Many word holds the address of a live
                // Box<Vec<u32>> that this Slots owns (see `many` and `Drop`).
                let v = unsafe { &*((self.0 & PAYLOAD) as usize as *const Vec<u32>) };
                SlotsView::Many(v)
            }
            _ => SlotsView::Counted(self.0 as u32),
        }
    }

    /// The cells of a weighted grant, to rewrite in place (`count_now`).
    pub fn many_mut(&mut self) -> Option<&mut Vec<u32>> {
        if self.kind() != KIND_MANY {
            return None;
        }
        // SAFETY: as in `view`; `&mut self` makes the access exclusive.
        Some(unsafe { &mut *((self.0 & PAYLOAD) as usize as *mut Vec<u32>) })
    }

    /// Rewrites a `One` cell number.
    pub fn set_one(&mut self, cell: u32) {
        if self.kind() == KIND_ONE {
            self.0 = (self.0 & !0xffff_ffff) | u64::from(cell);
        }
    }

    /// How many units these slots are.
    #[inline(always)]
    pub fn len(&self) -> u32 {
        match self.view() {
            SlotsView::Counted(n) => n,
            SlotsView::One(_) => 1,
            SlotsView::Many(c) => c.len() as u32,
        }
    }

    /// The same slots, marked as taken at `p`.
    #[inline(always)]
    pub fn at(mut self, p: Priority) -> Slots {
        self.0 = (self.0 & !(7 << PRIO_SHIFT)) | ((p.index() as u64) << PRIO_SHIFT);
        self
    }

    /// The priority they were taken at (see [`at`](Self::at)).
    pub fn priority(&self) -> Priority {
        Priority::from_index(((self.0 >> PRIO_SHIFT) & 7) as usize).unwrap_or(Priority::Normal)
    }
}

impl Drop for Slots {
    #[inline(always)]
    fn drop(&mut self) {
        if self.kind() == KIND_MANY {
            // SAFETY: the word holds the address of a Box<Vec<u32>> owned by
            // this Slots (see `many`), dropped exactly once here.
            drop(unsafe { Box::from_raw((self.0 & PAYLOAD) as usize as *mut Vec<u32>) });
        }
    }
}

/// Granted (or removed) waiters a queue keeps for reuse, at an in-process
/// level and at a shared root alike: a hand-off between a few threads or
/// tasks re-queues each one soon after its grant, so a handful of spare
/// waiters covers it without an allocation per wait.
pub(crate) const SPARE_WAITERS: usize = 8;

/// Spare waiters an enqueue looks at for one nobody holds any more (the
/// most recently granted last).
const SPARE_SCAN: usize = 4;

/// A spare waiter that nobody holds any more (its queue let go of it when
/// it left, its future or thread since, and no wake-up list holds it),
/// taken out of `spare` (under the queue's lock, which every clone of a
/// spare's `Arc` is made under) and made ready to queue again by `reset`;
/// the most recently granted are looked at last, the few oldest first.
///
/// Reuse is sound where a new allocation would be: nothing refers to a
/// waiter except through its `Arc` (the keeper role and the parking words
/// name it by address, as they would name a fresh waiter that the
/// allocator put at the same address), and a waiter whose `Arc` has no
/// other holder can be reached by nobody but the caller.
///
/// `Arc::get_mut` would make the same check with a locked compare-and-swap
/// (it guards against a `Weak` made meanwhile from another holder); with no
/// other holder and no `Weak` there is nothing to guard against, and the
/// swap was one of the locked instructions a contended async hand-off paid
/// beyond tokio's semaphore.
#[inline]
pub(crate) fn take_spare(
    spare: &mut Vec<Arc<Waiter>>,
    reset: impl FnOnce(&mut Waiter),
) -> Option<Arc<Waiter>> {
    let i = spare
        .iter()
        .take(SPARE_SCAN)
        .position(|w| Arc::strong_count(w) == 1 && Arc::weak_count(w) == 0)?;
    let w = spare.swap_remove(i);
    // The last other holder let go with a release decrement (an `Arc`'s
    // drop): this fence puts its accesses before the writes below, as
    // `Arc`'s own drop and `get_mut` do.
    std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
    // SAFETY: `w` is the waiter's only `Arc` (strong count 1) and no `Weak`
    // of it exists (weak count 0; the crate never downgrades a waiter).
    // Another handle could only be made from an existing one, and the only
    // one is `w`, which is not used while `m` lives: nothing else reads or
    // writes the waiter meanwhile, as under `Arc::get_mut`. `Arc::as_ptr`
    // keeps the allocation's write permission (the standard library writes
    // through it in `get_mut` after `Arc::from_raw`).
    let m = unsafe { &mut *Arc::as_ptr(&w).cast_mut() };
    reset(m);
    Some(w)
}

/// Per-priority queue counters of one scheduler handle (atomics: a shared
/// root's queue updates them for every handle of the process), one
/// [`TierCounters`] per tier.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub tiers: [TierCounters; LEVELS],
}

/// One tier's queue counters, side by side: a queued wait writes
/// `deferred` and then `completed` of its tier, so in a contended hand-off
/// between two threads one line moves between them, not two (as with one
/// array per counter).
#[derive(Debug, Default)]
#[repr(C)]
pub(crate) struct TierCounters {
    pub deferred: AtomicU64,
    pub completed: AtomicU64,
    pub cancelled: AtomicU64,
}

impl Counters {
    pub fn deferred(&self, tier: usize) {
        self.tiers[tier].deferred.fetch_add(1, Ordering::Relaxed);
    }

    pub fn left(&self, tier: usize, cancelled: bool) {
        let t = &self.tiers[tier];
        t.completed.fetch_add(1, Ordering::Relaxed);
        if cancelled {
            t.cancelled.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// [`deferred`](Self::deferred) by a writer that holds the one lock
    /// every writer of these counters holds: the counters of an in-process
    /// level, written only under its queue's lock (its enqueue and its
    /// waiters leaving). A load and a store, not a locked add: readers
    /// (stats) still see whole values.
    pub fn deferred_locked(&self, tier: usize) {
        add_under_lock(&self.tiers[tier].deferred, 1);
    }

    /// [`left`](Self::left) under the lock, as
    /// [`deferred_locked`](Self::deferred_locked).
    pub fn left_locked(&self, tier: usize, cancelled: bool) {
        let t = &self.tiers[tier];
        add_under_lock(&t.completed, 1);
        if cancelled {
            add_under_lock(&t.cancelled, 1);
        }
    }
}

/// Adds `d` to a counter whose writers all hold one lock (the lock orders
/// them): a load and a store, not a locked add; readers outside the lock
/// still see whole values. Returns the new value.
#[inline]
pub(crate) fn add_under_lock(c: &AtomicU64, d: i64) -> u64 {
    let v = c.load(Ordering::Relaxed).wrapping_add_signed(d);
    c.store(v, Ordering::Relaxed);
    v
}

/// One blocked acquire.
///
/// `repr(C)`, what every queued wait reads and writes first (the state, the
/// need, the priority, the counters), and last what only a shared root's
/// waiters use (the granted cells, the task, the parking words): an
/// in-process level's hand-off touches the first line or two only, and
/// its [`reuse`](Waiter::reuse) leaves the rest as built.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Waiter {
    /// `WAITING`, then `GRANTED` or `FAILED`; written under the queue's lock.
    pub state: AtomicU32,
    /// Units it needs (a weighted acquire needs more than one).
    pub need: u32,
    /// Its per-priority cap at the level it waits in.
    pub cap: u32,
    /// Its arrival ticket: region-wide per tier at a shared root (its futex
    /// wake bit comes from it), a local sequence number elsewhere.
    pub ticket: u32,
    /// The priority it queued at.
    pub priority: Priority,
    /// True for a waiter behind an async future (no thread sleeps on it).
    pub is_async: bool,
    /// The counters of the handle it came through.
    pub counters: std::sync::Arc<Counters>,
    /// The handle (node id) it came through, and the child nodes between
    /// the caller's scheduler and the level it waits in: disposing any of
    /// them fails it.
    pub via: Few<u64>,
    /// What the grant handed over at a shared root; set before `state`
    /// becomes `GRANTED`.
    pub slots: Mutex<Option<Slots>>,
    /// The task to wake on grant or failure (async waiters at a shared
    /// root; at an in-process level the task sits in the queue entry, under
    /// the level's lock, see `node::Queued`).
    pub waker: Mutex<Option<Waker>>,
    /// Where its thread sleeps at a shared root (see
    /// [`park`](crate::region::park)).
    pub park: Park,
}

impl Waiter {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        priority: Priority,
        need: u32,
        cap: u32,
        ticket: u32,
        via: Few<u64>,
        counters: std::sync::Arc<Counters>,
        is_async: bool,
    ) -> Waiter {
        Waiter {
            state: AtomicU32::new(WAITING),
            priority,
            need,
            cap,
            ticket,
            via,
            counters,
            is_async,
            slots: Mutex::new(None),
            waker: Mutex::new(None),
            park: Park::new(),
        }
    }

    pub fn tier(&self) -> usize {
        self.priority.index()
    }

    pub fn state(&self) -> u32 {
        self.state.load(Ordering::Acquire)
    }

    /// Records the task to wake (async waiters at a shared root).
    pub fn set_waker(&self, waker: &Waker) {
        let mut slot = self.waker.lock().unwrap_or_else(|p| p.into_inner());
        match &*slot {
            Some(w) if w.will_wake(waker) => {}
            _ => *slot = Some(waker.clone()),
        }
    }

    /// Drops the registered task (a shared root's waiter that was
    /// cancelled), outside its lock: a waker's drop is the task's code.
    pub fn drop_task(&self) {
        let task = self.waker.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(task);
    }

    /// Grants `slots` (under the queue's lock). The caller then adds the
    /// waiter to its [`Wakeups`].
    pub fn grant(&self, slots: Slots) {
        *self.slots.lock().unwrap_or_else(|p| p.into_inner()) = Some(slots);
        self.state.store(GRANTED, Ordering::Release);
    }

    /// Grants an in-process level's waiter its `need` units (under the
    /// level's lock): they are a count, so nothing is stored; whoever sees
    /// `GRANTED` makes them with [`Slots::counted`]`(need)`.
    #[inline]
    pub fn grant_counted(&self) {
        self.state.store(GRANTED, Ordering::Release);
    }

    /// Makes a waiter that nobody else holds (its queue and its waiter are
    /// done with it) ready to queue again at an in-process level, as
    /// [`Waiter::new`] would build it, without an allocation. The parts
    /// only a shared root uses (granted cells, task, parking words) are
    /// left alone: an in-process level never touches them, so they are
    /// still as built (a shared root calls
    /// [`reset_root_parts`](Waiter::reset_root_parts) as well).
    #[allow(clippy::too_many_arguments)]
    pub fn reuse(
        &mut self,
        priority: Priority,
        need: u32,
        cap: u32,
        ticket: u32,
        via: Few<u64>,
        counters: &std::sync::Arc<Counters>,
        is_async: bool,
    ) {
        // A store, not `get_mut`: the model checker's atomics have none.
        self.state.store(WAITING, Ordering::Relaxed);
        self.priority = priority;
        self.need = need;
        self.cap = cap;
        self.ticket = ticket;
        self.via = via;
        if !std::sync::Arc::ptr_eq(&self.counters, counters) {
            self.counters = counters.clone();
        }
        self.is_async = is_async;
    }

    /// With [`reuse`](Waiter::reuse), for a waiter of a shared root: the
    /// granted cells, the task and the parking words as built. Returns the
    /// task still registered, if any (never, by the rules of `set_waker`'s
    /// callers), for the caller to drop outside its lock.
    #[must_use = "a waker's drop is the task's code: drop it after the lock"]
    pub fn reset_root_parts(&mut self) -> Option<Waker> {
        *self.slots.get_mut().unwrap_or_else(|p| p.into_inner()) = None;
        self.park = Park::new();
        self.waker
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Fails the waiter (disposed; under the queue's lock). The caller then
    /// adds it to its [`Wakeups`].
    pub fn fail(&self) {
        self.state.store(FAILED, Ordering::Release);
    }

    /// The granted slots (after `GRANTED` was seen; once).
    pub fn take_slots(&self) -> Slots {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or(Slots::counted(0))
    }
}

impl Parked for Waiter {
    fn park(&self) -> &Park {
        &self.park
    }
    fn is_async(&self) -> bool {
        self.is_async
    }
    /// Its address: unique while it lives.
    fn id(&self) -> u64 {
        self as *const Waiter as usize as u64
    }
}

/// What to wake once the lock is released.
///
/// The first of each kind is inline and the rest in a box made only for a
/// second one, so that the common release (one task or one thread to wake)
/// allocates nothing and dropping the list is a few null checks: it is
/// built and dropped on every slow release and every enqueue.
#[derive(Debug, Default)]
pub(crate) struct Wakeups {
    /// The first async task.
    task: Option<Waker>,
    /// The first thread blocked at an in-process level (it sleeps on its
    /// waiter's state word).
    thread: Option<std::sync::Arc<Waiter>>,
    /// The first of this process's threads blocked at a shared root
    /// (parked: see [`park`](crate::region::park)).
    parked: Option<std::sync::Arc<Waiter>>,
    /// The process's helper thread must look again (the tiers it stands in
    /// for changed).
    pub helper: bool,
    /// The rest of each kind, in the order they were added.
    more: Option<Box<MoreWakeups>>,
}

/// What a [`Wakeups`] holds beyond the first of each kind.
#[derive(Debug, Default)]
struct MoreWakeups {
    tasks: Vec<Waker>,
    threads: Vec<std::sync::Arc<Waiter>>,
    parked: Vec<std::sync::Arc<Waiter>>,
}

impl Wakeups {
    fn more(&mut self) -> &mut MoreWakeups {
        self.more.get_or_insert_with(Box::default)
    }

    /// Adds a waiter of a shared root that was just granted or failed: its
    /// task (registered in the waiter), or its parked thread.
    #[inline]
    pub fn add_shared(&mut self, w: &std::sync::Arc<Waiter>) {
        if w.is_async {
            let t = w.waker.lock().unwrap_or_else(|p| p.into_inner()).take();
            self.add_task(t);
        } else {
            self.add_parked(w);
        }
    }

    /// Adds a waiter of an in-process level that was just granted or
    /// failed: `task`, the task its queue entry held (async waiters), or
    /// its thread.
    #[inline]
    pub fn add_local(&mut self, w: &std::sync::Arc<Waiter>, task: Option<Waker>) {
        if w.is_async {
            self.add_task(task);
        } else if self.thread.is_none() {
            self.thread = Some(w.clone());
        } else {
            self.more().threads.push(w.clone());
        }
    }

    #[inline]
    fn add_task(&mut self, t: Option<Waker>) {
        if let Some(t) = t {
            if self.task.is_none() {
                self.task = Some(t);
            } else {
                self.more().tasks.push(t);
            }
        }
    }

    /// Adds a thread blocked at a shared root to wake (granted, or it has a
    /// new role: its tier's front, the keeper), once: a waiter that became
    /// its tier's front and was then granted by the same serve is on the
    /// list already (and a second entry would allocate the overflow list).
    pub fn add_parked(&mut self, w: &std::sync::Arc<Waiter>) {
        if self.parked().any(|p| std::sync::Arc::ptr_eq(p, w)) {
            return;
        }
        if self.parked.is_none() {
            self.parked = Some(w.clone());
        } else {
            self.more().parked.push(w.clone());
        }
    }

    /// Takes `w` off the threads to wake at a shared root (its own thread
    /// is the caller: awake, it looks at its state before it sleeps).
    pub fn skip_parked(&mut self, w: &std::sync::Arc<Waiter>) {
        if self
            .parked
            .as_ref()
            .is_some_and(|p| std::sync::Arc::ptr_eq(p, w))
        {
            self.parked = self
                .more
                .as_mut()
                .and_then(|m| (!m.parked.is_empty()).then(|| m.parked.remove(0)));
        }
        if let Some(m) = self.more.as_mut() {
            m.parked.retain(|p| !std::sync::Arc::ptr_eq(p, w));
        }
    }

    /// True if a thread blocked at a shared root is to be woken.
    pub fn has_parked(&self) -> bool {
        self.parked.is_some()
    }

    /// The threads to wake at a shared root.
    pub fn parked(&self) -> impl Iterator<Item = &std::sync::Arc<Waiter>> + Clone {
        self.parked
            .iter()
            .chain(self.more.iter().flat_map(|m| m.parked.iter()))
    }

    /// Wakes the in-process threads and the tasks, and drops the list (the
    /// shared bits are not woken here: the root does that through the
    /// region).
    #[inline(always)]
    pub fn wake_local(self) {
        // An enqueue behind a busy level (a contended hand-off's every
        // enqueue) wakes nobody: a few null checks here, not a call.
        if self.task.is_none()
            && self.thread.is_none()
            && self.parked.is_none()
            && self.more.is_none()
        {
            std::mem::forget(self);
            return;
        }
        self.wake_local_slow();
    }

    #[inline(never)]
    fn wake_local_slow(mut self) {
        if let Some(w) = self.thread.take() {
            crate::sys::futex::futex_wake(&w.state, 1);
        }
        if let Some(m) = self.more.as_mut() {
            for w in m.threads.drain(..) {
                crate::sys::futex::futex_wake(&w.state, 1);
            }
        }
        self.wake_tasks();
        // Built and dropped on every enqueue and slow release: when the
        // list owns nothing any more (the common case), its drop glue (a
        // call per field) has nothing to do, so it is skipped.
        if self.parked.is_none() && self.more.is_none() {
            debug_assert!(self.task.is_none() && self.thread.is_none());
            std::mem::forget(self);
        }
    }

    /// Wakes the tasks; a waker that panics is caught (the scheduler's
    /// state is already consistent) and the rest are still woken.
    #[inline]
    pub fn wake_tasks(&mut self) {
        if let Some(t) = self.task.take() {
            wake_caught(t);
        }
        if let Some(m) = self.more.as_mut() {
            for t in m.tasks.drain(..) {
                wake_caught(t);
            }
        }
    }
}

/// Wakes `t`, catching a panic of its waker.
#[inline]
fn wake_caught(t: Waker) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.wake()));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter() -> std::sync::Arc<Waiter> {
        std::sync::Arc::new(Waiter::new(
            Priority::Normal,
            1,
            1,
            0,
            Few::default(),
            std::sync::Arc::default(),
            false,
        ))
    }

    #[test]
    fn a_parked_waiter_is_listed_once() {
        let (a, b) = (waiter(), waiter());
        let mut out = Wakeups::default();
        out.add_parked(&a);
        out.add_parked(&a);
        assert_eq!(out.parked().count(), 1);
        assert!(out.more.is_none(), "no overflow list for one waiter");
        out.add_shared(&a);
        out.add_parked(&b);
        out.add_parked(&b);
        assert_eq!(out.parked().count(), 2);
        out.skip_parked(&a);
        assert_eq!(out.parked().count(), 1);
        assert!(std::sync::Arc::ptr_eq(out.parked().next().unwrap(), &b));
    }
}
