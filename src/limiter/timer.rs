//! The process's one limiter timer: wakes async consumes waiting at
//! in-process limiter levels at the instant their tokens will be there.
//!
//! A blocked thread sleeps until its own refill instant; an async consume
//! has no thread, so each in-process level with async waiters registers its
//! earliest instant here, and one thread per process (started on first
//! use, gone when nothing is registered) sleeps until the earliest of all
//! and drains the levels that are due. Levels are held weakly: a dropped
//! limiter unregisters itself. After `fork` the child starts its own
//! thread (the lock is a [`ForkSafeMutex`]).

use crate::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use super::node::Node;
use crate::region::fork_lock::ForkSafeMutex;
use crate::sys::futex::{futex_wait, futex_wake};

#[derive(Debug, Default)]
struct Timers {
    due: Vec<(Instant, Weak<Node>)>,
    /// Pid of the process whose thread serves `due` (0: none).
    thread_pid: i32,
}

fn timers() -> &'static ForkSafeMutex<Timers> {
    static T: OnceLock<ForkSafeMutex<Timers>> = OnceLock::new();
    T.get_or_init(|| ForkSafeMutex::new(Timers::default()))
}

/// Bumped on every change; the timer thread sleeps on it.
static WORD: AtomicU32 = AtomicU32::new(0);

/// Asks for `node` to be drained at `at` (or sooner, if it already asked).
pub(crate) fn schedule(node: &Arc<Node>, at: Instant) {
    let me = crate::sys::file::getpid();
    {
        let mut t = timers().lock();
        t.due.retain(|(_, w)| w.strong_count() > 0);
        match t
            .due
            .iter_mut()
            .find(|(_, w)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(node)))
        {
            Some(e) => e.0 = e.0.min(at),
            None => t.due.push((at, Arc::downgrade(node))),
        }
        if t.thread_pid != me {
            let spawned = std::thread::Builder::new()
                .name("shmsched-lim-timer".into())
                .spawn(run);
            if spawned.is_ok() {
                t.thread_pid = me;
            }
        }
    }
    WORD.fetch_add(1, Ordering::SeqCst);
    futex_wake(&WORD, 1);
}

fn run() {
    loop {
        let seq = WORD.load(Ordering::SeqCst);
        let now = Instant::now();
        let (fire, next) = {
            let mut t = timers().lock();
            let mut fire = Vec::new();
            t.due.retain(|(at, w)| {
                if *at <= now {
                    fire.push(w.clone());
                    false
                } else {
                    w.strong_count() > 0
                }
            });
            let next = t.due.iter().map(|(at, _)| *at).min();
            if fire.is_empty() && next.is_none() {
                t.thread_pid = 0;
                return;
            }
            (fire, next)
        };
        for n in fire.iter().filter_map(Weak::upgrade) {
            n.on_timer();
        }
        if fire.is_empty() {
            let nap = next.map_or(Duration::from_secs(1), |at| {
                at.saturating_duration_since(now)
            });
            futex_wait(&WORD, seq, Some(nap));
        }
    }
}
