//! `acquire_async`: a runtime-agnostic future for a permit.
//!
//! The future walks the chain leaf → root like the blocking acquire. At each
//! level it tries the fast path, else queues an *async* waiter whose grant
//! wakes the task instead of a thread. At a root shared through a region, a
//! release in another process is noticed by the process's helper thread
//! (one per process and region, alive only while async waiters are queued
//! there), which moves the queue on and wakes the task.
//!
//! **Cancellation.** Dropping the future before it completes removes its
//! queued place (or, if a grant raced the drop, returns the granted units)
//! and releases the levels it already holds, so nothing is left behind.
//! There are no timers in here: wrap the future in your runtime's timeout.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, RawWakerVTable, Waker};

use super::node::Node;
use super::waiter::{Slots, Waiter, FAILED, GRANTED, WAITING};
use super::{OwnedPermit, Permit, Scheduler};
use crate::error::{Error, Result};
use crate::few::Few;
use crate::priority::Priority;

/// The future returned by [`Scheduler::acquire_async`].
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub struct Acquire<'a> {
    sched: &'a Scheduler,
    walk: Walk,
}

/// The future returned by [`Scheduler::acquire_owned_async`]: the same
/// walk as [`Acquire`], holding the scheduler handle it was given and
/// moving it into the [`OwnedPermit`] it completes with.
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub struct AcquireOwned {
    /// `None` once the permit has it.
    sched: Option<Scheduler>,
    walk: Walk,
}

/// An acquire's progress along the chain, leaf to root: the state both
/// futures share, each step given the scheduler it walks.
#[derive(Debug)]
struct Walk {
    priority: Priority,
    n: u32,
    /// The level being acquired (0 = the scheduler itself, then parents).
    level: usize,
    /// Ids of the levels already taken (for dispose of a child).
    via: Few<u64>,
    waiter: Option<Arc<Waiter>>,
    /// The task registered for `waiter`, as [`Waker::will_wake`] tells
    /// tasks apart (its waker's data and vtable addresses), so a re-poll
    /// by the same task (a `join!` or `select!` polling every branch)
    /// takes no lock. The registered waker is held by the queue while the
    /// waiter waits, so no other task's waker can have these addresses.
    task: Option<TaskId>,
    done: bool,
}

/// A waker's identity as [`Waker::will_wake`] compares it: its data and
/// vtable addresses (as numbers: the future stays `Send`).
type TaskId = (usize, usize);

fn task_id(w: &Waker) -> TaskId {
    (
        w.data() as usize,
        w.vtable() as *const RawWakerVTable as usize,
    )
}

impl<'a> Acquire<'a> {
    pub(super) fn new(sched: &'a Scheduler, priority: Priority, n: u32) -> Acquire<'a> {
        Acquire {
            sched,
            walk: Walk::new(priority, n),
        }
    }
}

impl AcquireOwned {
    pub(super) fn new(sched: Scheduler, priority: Priority, n: u32) -> AcquireOwned {
        AcquireOwned {
            sched: Some(sched),
            walk: Walk::new(priority, n),
        }
    }
}

impl Walk {
    fn new(priority: Priority, n: u32) -> Walk {
        Walk {
            priority,
            n,
            level: 0,
            via: Few::default(),
            waiter: None,
            task: None,
            done: false,
        }
    }

    fn node_at(sched: &Scheduler, level: usize) -> &Arc<Node> {
        let mut n = &sched.node;
        for _ in 0..level {
            n = n.parent().expect("level within the chain");
        }
        n
    }

    /// Records units taken at the current level; returns the root's units
    /// when that level is the root.
    fn advance(&mut self, sched: &Scheduler, slots: Slots) -> Option<Slots> {
        let node = Walk::node_at(sched, self.level);
        if node.parent().is_none() {
            self.done = true;
            return Some(slots);
        }
        self.via.push(node.id());
        self.level += 1;
        None
    }

    /// Releases the levels below the current one (all taken), leaf last.
    fn unwind(&mut self, sched: &Scheduler) {
        for i in (0..self.level).rev() {
            Walk::node_at(sched, i).release_level(&Slots::counted(self.n));
        }
        self.level = 0;
        self.via.clear();
    }

    /// Ends the walk with `e`, giving back what it took.
    fn failed<T>(&mut self, sched: &Scheduler, e: Error) -> Poll<Result<T>> {
        self.unwind(sched);
        self.done = true;
        Poll::Ready(Err(e))
    }

    /// One poll of the walk: `finish` of the root's units (marked with the
    /// priority) once every level is taken. Inlined into each future's
    /// `poll`, with `finish` making its output in place: a result built
    /// here and converted by the caller went through memory, which cost
    /// the uncontended async acquire a fifth of its time.
    #[inline(always)]
    fn poll<T>(
        &mut self,
        sched: &Scheduler,
        cx: &mut Context<'_>,
        finish: impl FnOnce(Slots) -> T,
    ) -> Poll<Result<T>> {
        if self.done {
            return Poll::Ready(Err(Error::InvalidArgument(
                "acquire_async polled after completion".into(),
            )));
        }
        if self.n == 0 {
            return self.failed(
                sched,
                Error::InvalidArgument("acquire of 0 slots: n must be at least 1".into()),
            );
        }
        loop {
            let node = Walk::node_at(sched, self.level);
            if let Some(w) = &self.waiter {
                match w.state() {
                    GRANTED => {
                        let slots = node.granted_slots(w);
                        self.waiter = None;
                        node.waited_async();
                        if let Some(s) = self.advance(sched, slots) {
                            return Poll::Ready(Ok(finish(s.at(self.priority))));
                        }
                        continue;
                    }
                    FAILED => {
                        self.waiter = None;
                        node.waited_async();
                        return self.failed(sched, Error::Disposed);
                    }
                    _ => {
                        // Polled again before the grant. The same task:
                        // its waker is registered (a grant since wakes it).
                        let id = task_id(cx.waker());
                        if self.task == Some(id) {
                            if w.state() == WAITING {
                                return Poll::Pending;
                            }
                            continue;
                        }
                        // Another task (it moved, or the first look at a
                        // shared root); false: granted or failed since,
                        // look again.
                        if node.register_task(w, cx.waker()) {
                            self.task = Some(id);
                            return Poll::Pending;
                        }
                        continue;
                    }
                }
            }
            if let Err(e) = node.check_usable(self.n) {
                return self.failed(sched, e);
            }
            if self.level == 0 {
                if let Err(e) = node.check_weight(self.priority, self.n) {
                    return self.failed(sched, e);
                }
            }
            if let Some(s) = node.fast(self.priority, self.n) {
                if let Some(s) = self.advance(sched, s) {
                    return Poll::Ready(Ok(finish(s.at(self.priority))));
                }
                continue;
            }
            // An in-process level registers the task under its lock, before
            // the waiter is queued: still waiting after the enqueue, the
            // future is done for now (a grant since has the waker).
            let local = node.is_local();
            let waker = if local { Some(cx.waker()) } else { None };
            match node.enqueue(self.priority, self.n, self.via.clone(), true, waker) {
                Ok(w) => {
                    node.ensure_helper();
                    let pending = local && w.state() == WAITING;
                    self.task = if local {
                        Some(task_id(cx.waker()))
                    } else {
                        None
                    };
                    self.waiter = Some(w);
                    if pending {
                        return Poll::Pending;
                    }
                }
                Err(e) => return self.failed(sched, e),
            }
        }
    }

    /// A future dropped before it completed: its queued place goes (or
    /// the units a grant raced the drop with come back), and the levels
    /// it took are released.
    fn abandon(&mut self, sched: &Scheduler) {
        if self.done || sched.node.forked() {
            return;
        }
        if let Some(w) = self.waiter.take() {
            let node = Walk::node_at(sched, self.level);
            // Granted just before the drop: give the units back.
            if let Ok(s) = node.cancel(&w) {
                node.release_level(&s);
            }
        }
        self.unwind(sched);
    }
}

impl<'a> Future for Acquire<'a> {
    type Output = Result<Permit<'a>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Every field is Unpin.
        let this = self.get_mut();
        let sched = this.sched;
        this.walk.poll(sched, cx, |slots| Permit { sched, slots })
    }
}

impl Drop for Acquire<'_> {
    fn drop(&mut self) {
        self.walk.abandon(self.sched);
    }
}

impl Future for AcquireOwned {
    type Output = Result<OwnedPermit>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Every field is Unpin.
        let this = self.get_mut();
        let Some(sched) = this.sched.as_ref() else {
            return Poll::Ready(Err(Error::InvalidArgument(
                "acquire_owned_async polled after completion".into(),
            )));
        };
        match this.walk.poll(sched, cx, |slots| slots) {
            Poll::Ready(Ok(slots)) => {
                let sched = this.sched.take().expect("checked above");
                Poll::Ready(Ok(OwnedPermit::new(sched, slots)))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for AcquireOwned {
    fn drop(&mut self) {
        if let Some(sched) = self.sched.take() {
            self.walk.abandon(&sched);
        }
    }
}
