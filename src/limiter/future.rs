//! `consume_async`: a runtime-agnostic future for a charge.
//!
//! The first poll tries the fast path; otherwise it queues an *async*
//! waiter, whose result wakes the task instead of a thread. Nobody sleeps
//! for an async waiter: the limiter node's pump thread (one per node and
//! process, alive only while async waiters are queued there) sleeps until
//! the next refill or force-through instant, on the process's futex word in
//! a region, and runs the drain, which wakes the tasks it served.
//!
//! **Cancellation.** Dropping the future before it completes removes its
//! queued place and every count it added (queue gauges, the process's
//! published waiter count), unless the charge raced the drop. Levels of a
//! chain it was already charged on stay charged: tokens can be lost to a
//! cancellation, never created. There are no timers in here: wrap the
//! future in your runtime's timeout.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::node::{AsyncWaiter, Node};
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
    node: Arc<Node>,
    n: u64,
    priority: Priority,
    /// An argument error to report on the first poll.
    error: Option<Error>,
    waiter: Option<AsyncWaiter>,
    done: bool,
}

impl Consume {
    pub(super) fn new(node: Arc<Node>, n: u64, priority: Priority, error: Option<Error>) -> Self {
        Consume {
            node,
            n,
            priority,
            error,
            waiter: None,
            done: false,
        }
    }

    /// The number of tokens this future charges.
    pub fn tokens(&self) -> u64 {
        self.n
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
        let r = this
            .node
            .poll_async(this.n, this.priority, &mut this.waiter, cx.waker());
        if r.is_ready() {
            this.done = true;
        }
        r
    }
}

impl Drop for Consume {
    fn drop(&mut self) {
        if let Some(w) = self.waiter.take() {
            self.node.cancel_async(w);
        }
    }
}
