//! `consume_async`: a runtime-agnostic future for a charge.
//!
//! The future walks the chain leaf → root like the blocking consume: at
//! each level the fast path, else an *async* waiter at that level, whose
//! result wakes the task. Nobody sleeps for an async waiter: an in-process
//! level registers its next refill instant with the process's limiter timer
//! (`timer.rs`); a shared root has the process's helper thread.
//!
//! **Cancellation.** Dropping the future before it completes removes its
//! queued place, and every level it was charged on is refunded, exactly
//! (also when a charge raced the drop): tokens are never lost to a
//! cancellation, and never created.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::node::{Home, Node, Now};
use super::waiter::Waiter;
use super::Grant;
use crate::error::{Error, Result};
use crate::priority::Priority;

/// The future returned by [`Limiter::consume_async`](super::Limiter::consume_async).
///
/// It owns a handle to the limiter (no borrow), so it can be stored, e.g. in
/// an I/O adapter, and moved between tasks.
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub struct Consume {
    leaf: Arc<Node>,
    n: u64,
    priority: Priority,
    /// An argument error to report on the first poll.
    error: Option<Error>,
    /// The level being charged (0 = the limiter itself, then parents).
    level: usize,
    waiter: Option<Arc<Waiter>>,
    immediate: bool,
    forced: bool,
    done: bool,
}

impl Consume {
    pub(super) fn new(leaf: Arc<Node>, n: u64, priority: Priority, error: Option<Error>) -> Self {
        Consume {
            leaf,
            n,
            priority,
            error,
            level: 0,
            waiter: None,
            immediate: true,
            forced: false,
            done: false,
        }
    }

    /// The number of tokens this future charges.
    pub fn tokens(&self) -> u64 {
        self.n
    }

    /// The priority it waits at.
    pub fn priority(&self) -> Priority {
        self.priority
    }

    fn node_at(&self, level: usize) -> Arc<Node> {
        let mut n = &self.leaf;
        for _ in 0..level {
            n = n.parent().expect("level within the chain");
        }
        n.clone()
    }

    /// Refunds the levels below the current one (all charged).
    fn refund_charged(&mut self) {
        for i in 0..self.level {
            self.node_at(i).refund(self.n, self.priority.index());
        }
        self.level = 0;
    }

    fn fail(&mut self, e: Error) -> Poll<Result<Grant>> {
        self.refund_charged();
        self.done = true;
        Poll::Ready(Err(e))
    }

    /// Records a charge at the current level; the grant if that was the root.
    fn advance(&mut self, node: &Node, debt: bool) -> Option<Grant> {
        self.forced |= debt;
        if node.parent().is_none() {
            self.done = true;
            return Some(Grant {
                immediate: self.immediate,
                forced: self.forced,
            });
        }
        self.level += 1;
        None
    }
}

impl Future for Consume {
    type Output = Result<Grant>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Every field is Unpin.
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(Err(Error::InvalidArgument(
                "consume_async polled after completion".into(),
            )));
        }
        if let Some(e) = this.error.take() {
            this.done = true;
            return Poll::Ready(Err(e));
        }
        // One reading of the clock for the levels this poll charges.
        let mut now = Now::default();
        loop {
            let node = this.node_at(this.level);
            if let Some(w) = this.waiter.clone() {
                match node.outcome(&w) {
                    Some(Ok(debt)) => {
                        this.waiter = None;
                        node.waited(w.tier, false);
                        node.charged(w.tier, w.n);
                        if debt && matches!(node.home(), Home::Shared(_)) {
                            node.note_forced();
                        }
                        if let Some(g) = this.advance(&node, debt) {
                            return Poll::Ready(Ok(g));
                        }
                        continue;
                    }
                    Some(Err(e)) => {
                        this.waiter = None;
                        node.waited(w.tier, matches!(e, Error::Timeout));
                        return this.fail(e);
                    }
                    None => {
                        w.set_waker(cx.waker());
                        // A result between the check and the registration
                        // took the old waker (or none): look again.
                        if node.outcome(&w).is_none() {
                            return Poll::Pending;
                        }
                        continue;
                    }
                }
            }
            if let Err(e) = node.check_usable() {
                return this.fail(e);
            }
            match node.fast(this.n, this.priority, &mut now, false) {
                Ok(Some(debt)) => {
                    if let Some(g) = this.advance(&node, debt) {
                        return Poll::Ready(Ok(g));
                    }
                }
                Ok(None) => {
                    this.immediate = false;
                    let w = node.enqueue(this.n, this.priority, true);
                    node.ensure_helper();
                    this.waiter = Some(w);
                }
                Err(e) => return this.fail(e),
            }
        }
    }
}

impl Drop for Consume {
    fn drop(&mut self) {
        if self.done || self.leaf.check_usable().is_err() {
            return;
        }
        if let Some(w) = self.waiter.take() {
            let node = self.node_at(self.level);
            // Charged just before the drop: that level is refunded too.
            if node.cancel(&w).is_ok() {
                self.level += 1;
            }
        }
        self.refund_charged();
    }
}
