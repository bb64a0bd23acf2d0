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
use std::task::{Context, Poll};

use super::node::Node;
use super::waiter::{Slots, Waiter, FAILED, GRANTED, WAITING};
use super::{Permit, Scheduler};
use crate::error::{Error, Result};
use crate::few::Few;
use crate::priority::Priority;

/// The future returned by [`Scheduler::acquire_async`].
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub struct Acquire<'a> {
    sched: &'a Scheduler,
    priority: Priority,
    n: u32,
    /// The level being acquired (0 = the scheduler itself, then parents).
    level: usize,
    /// Ids of the levels already taken (for dispose of a child).
    via: Few<u64>,
    waiter: Option<Arc<Waiter>>,
    done: bool,
}

impl<'a> Acquire<'a> {
    pub(super) fn new(sched: &'a Scheduler, priority: Priority, n: u32) -> Acquire<'a> {
        Acquire {
            sched,
            priority,
            n,
            level: 0,
            via: Few::default(),
            waiter: None,
            done: false,
        }
    }

    fn node_at(&self, level: usize) -> &'a Arc<Node> {
        let mut n = &self.sched.node;
        for _ in 0..level {
            n = n.parent().expect("level within the chain");
        }
        n
    }

    /// Records units taken at the current level; returns the permit when
    /// that level is the root.
    fn advance(&mut self, slots: Slots) -> Option<Permit<'a>> {
        let node = self.node_at(self.level);
        if node.parent().is_none() {
            self.done = true;
            return Some(self.sched.permit(slots, self.priority));
        }
        self.via.push(node.id());
        self.level += 1;
        None
    }

    /// Releases the levels below the current one (all taken), leaf last.
    fn unwind(&mut self) {
        for i in (0..self.level).rev() {
            self.node_at(i).release_level(&Slots::counted(self.n));
        }
        self.level = 0;
        self.via.clear();
    }

    fn fail(&mut self, e: Error) -> Poll<Result<Permit<'a>>> {
        self.unwind();
        self.done = true;
        Poll::Ready(Err(e))
    }
}

impl<'a> Future for Acquire<'a> {
    type Output = Result<Permit<'a>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Every field is Unpin.
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(Err(Error::InvalidArgument(
                "acquire_async polled after completion".into(),
            )));
        }
        if this.n == 0 {
            return this.fail(Error::InvalidArgument(
                "acquire of 0 slots: n must be at least 1".into(),
            ));
        }
        loop {
            let node = this.node_at(this.level);
            if let Some(w) = &this.waiter {
                match w.state() {
                    GRANTED => {
                        let slots = node.granted_slots(w);
                        this.waiter = None;
                        node.waited_async();
                        if let Some(p) = this.advance(slots) {
                            return Poll::Ready(Ok(p));
                        }
                        continue;
                    }
                    FAILED => {
                        this.waiter = None;
                        node.waited_async();
                        return this.fail(Error::Disposed);
                    }
                    _ => {
                        w.set_waker(cx.waker());
                        // A grant between the check and the registration
                        // took the old waker (or none): look again.
                        if w.state() == WAITING {
                            return Poll::Pending;
                        }
                        continue;
                    }
                }
            }
            if let Err(e) = node.check_usable(this.n) {
                return this.fail(e);
            }
            if this.level == 0 {
                if let Err(e) = node.check_weight(this.priority, this.n) {
                    return this.fail(e);
                }
            }
            if let Some(s) = node.fast(this.priority, this.n) {
                if let Some(p) = this.advance(s) {
                    return Poll::Ready(Ok(p));
                }
                continue;
            }
            // An in-process level registers the task under its lock, before
            // the waiter is queued: still waiting after the enqueue, the
            // future is done for now (a grant since has the waker).
            let local = node.is_local();
            let waker = if local { Some(cx.waker()) } else { None };
            match node.enqueue(this.priority, this.n, this.via.clone(), true, waker) {
                Ok(w) => {
                    node.ensure_helper();
                    let pending = local && w.state() == WAITING;
                    this.waiter = Some(w);
                    if pending {
                        return Poll::Pending;
                    }
                }
                Err(e) => return this.fail(e),
            }
        }
    }
}

impl Drop for Acquire<'_> {
    fn drop(&mut self) {
        if self.done || self.sched.node.forked() {
            return;
        }
        if let Some(w) = self.waiter.take() {
            let node = self.node_at(self.level);
            // Granted just before the drop: give the units back.
            if let Ok(s) = node.cancel(&w) {
                node.release_level(&s);
            }
        }
        self.unwind();
    }
}
