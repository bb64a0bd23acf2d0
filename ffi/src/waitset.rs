//! `shmsched_waitset`: many pending waits without a thread each, for event
//! loops (Python's asyncio, Node.js) and any program that multiplexes.
//!
//! # How it works
//!
//! A waitset holds the library's own futures (`Scheduler::acquire_async`,
//! `Limiter::consume_async`), which are runtime-agnostic: a future's
//! waiter is queued in the region like a blocking one (so priorities, FIFO
//! and the lottery hold across processes), and a grant wakes its *waker*
//! instead of a thread. The library wakes them from the one helper thread
//! it keeps per process and region while async waiters are queued (and its
//! one limiter timer thread for in-process limiters); the waitset adds no
//! thread at all.
//!
//! Each pending wait has a waker that records the wait's id in the
//! `woken` list and rings the doorbell of a [`ReadyFd`] (an epoll fd over
//! an eventfd and a timerfd armed at the earliest deadline). The fd is
//! what an event loop watches; `shmsched_waitset_wait` blocks a thread on
//! it for bindings that can only block (one thread serves every pending
//! wait). `shmsched_waitset_take`, on the caller's thread, then polls the
//! woken futures (a future that is done yields its completion; one that
//! moved a level up a chain of child schedulers is pending again), times
//! out the waits whose deadline passed, and hands out completions.
//!
//! A wait is polled once when it starts, so it is queued in the region at
//! once; a wait that is granted right then completes at once (its
//! completion is kept, with what it holds, until taken).
//!
//! **Nothing is ever left held.** A pending wait that is cancelled, timed
//! out or closed is dropped, and the library's futures cancel cleanly on
//! drop: the queued place is removed, a grant that raced the drop is given
//! back, a consume's charged levels are refunded. A completion that was
//! ready but not yet taken when it is cancelled (or the waitset closed)
//! gives back its permit or its tokens.
//!
//! **Lost wake-ups.** Every change to the lists happens before the doorbell
//! rings, and a waiter clears the doorbell before it re-checks the lists,
//! so a ring that lands between the check and the clear is seen on the
//! re-check.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::ffi::c_char;
use std::future::Future;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use shmsched::limiter::{Consume, Grant, Limiter};
use shmsched::scheduler::{Acquire, Permit};
use shmsched::sys::event::ReadyFd;
use shmsched::sys::monotonic_ns;

use crate::face::{self, ffi, new_handle, try_out, try_priority, try_ref, Handle};
use crate::limiter::{shmsched_grant, shmsched_limiter};
use crate::permits::{self, shmsched_permit};
use crate::process;
use crate::scheduler::shmsched_scheduler;
use crate::status::{shmsched_status, Fail};
use crate::waiter::SHMSCHED_FOREVER;

/// `shmsched_completion.kind` of a scheduler acquire.
pub const SHMSCHED_WAIT_ACQUIRE: u32 = 1;
/// `shmsched_completion.kind` of a limiter consume.
pub const SHMSCHED_WAIT_CONSUME: u32 = 2;
/// Bytes of `shmsched_completion.message`, NUL included.
pub const SHMSCHED_COMPLETION_MESSAGE_MAX: usize = 128;

/// One finished wait, as `shmsched_waitset_take` hands it out.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct shmsched_completion {
    /// The caller's tag given to the `_start` call.
    pub tag: u64,
    /// The wait's id (as written by the `_start` call).
    pub id: u64,
    /// For a granted acquire: the permit, now the caller's to release with
    /// `shmsched_permit_release`. Zero otherwise.
    pub permit: shmsched_permit,
    /// `SHMSCHED_STATUS_OK`, or why the wait ended without a grant:
    /// `TIMEOUT`, `CANCELLED`, `DISPOSED`, `ZERO_CONCURRENCY`,
    /// `INVALID_ARGUMENT` (units above a cap), `CAPACITY_EXHAUSTED`,
    /// `BAD_REGION`, `INTERNAL`.
    pub status: shmsched_status,
    /// `SHMSCHED_WAIT_ACQUIRE` or `SHMSCHED_WAIT_CONSUME`.
    pub kind: u32,
    /// For a granted consume: how it went. Zero otherwise.
    pub grant: shmsched_grant,
    /// Zero.
    pub reserved: [u8; 6],
    /// On failure, the library's message (as `shmsched_last_error_message`
    /// would give it, cut at a character boundary), NUL-terminated; "" on
    /// success.
    pub message: [c_char; SHMSCHED_COMPLETION_MESSAGE_MAX],
}

// No implicit padding: completions are copied to C whole.
const _: () = assert!(
    std::mem::size_of::<shmsched_completion>()
        == 8 * 2 + 16 + 4 * 2 + 2 + 6 + SHMSCHED_COMPLETION_MESSAGE_MAX
);

/// A waitset handle (opaque): made by `shmsched_waitset_create`, closed by
/// `shmsched_waitset_close`.
///
/// Threads: every call may be made from any thread, concurrently (except
/// `_close`, which must be the last call on it): for example one thread
/// blocked in `shmsched_waitset_wait` while another starts, cancels and
/// takes. Fork: a waitset belongs to the process that made it (its waits
/// are this process's waiters); in a forked child every call fails with
/// `SHMSCHED_STATUS_FORKED` and `_close` frees only the child's memory.
pub struct shmsched_waitset {
    inner: Arc<Inner>,
}

impl Handle for shmsched_waitset {
    type Target = Arc<Inner>;
    const AFTER_FORK: &'static str =
        "waitset used after fork: its waits belong to the process that created it; in \
         a forked child, create a new waitset";

    #[inline(always)]
    fn parts(&self) -> (u64, &Arc<Inner>) {
        (self.inner.fork_generation, &self.inner)
    }
}

/// The scheduler handle of an acquire, carried to the waitset's lock.
struct SchedPtr(*const shmsched_scheduler);

// SAFETY: a scheduler handle may be used from any thread (its contract);
// the caller keeps it open while a wait started on it is pending.
unsafe impl Send for SchedPtr {}

enum Work {
    Acquire {
        sched: SchedPtr,
        /// Borrows the handle's scheduler: `'static` stands for "while the
        /// handle is open", which the caller guarantees until the wait is
        /// taken, cancelled or the waitset closed.
        fut: Pin<Box<Acquire<'static>>>,
    },
    Consume {
        lim: Limiter,
        fut: Consume,
    },
}

struct Entry {
    tag: u64,
    deadline: Option<u64>,
    work: Work,
    waker: Waker,
}

/// What a finished wait holds until it is taken.
enum Outcome {
    Permit(shmsched_permit),
    Grant(Grant, Limiter, u64, shmsched::Priority),
    Fail(Fail),
}

struct Done {
    tag: u64,
    id: u64,
    kind: u32,
    outcome: Outcome,
}

impl Done {
    /// Gives back what the completion holds (it will never be taken).
    fn give_back(&mut self) {
        match std::mem::replace(&mut self.outcome, Outcome::Fail(cancelled(self.id))) {
            Outcome::Permit(p) => {
                let _ = permits::release(p);
            }
            Outcome::Grant(_, lim, n, p) => lim.refund(n, p),
            Outcome::Fail(f) => self.outcome = Outcome::Fail(f),
        }
    }

    fn into_completion(self) -> shmsched_completion {
        let mut out = blank(self.tag, self.id, self.kind);
        match self.outcome {
            Outcome::Permit(p) => out.permit = p,
            Outcome::Grant(g, _, _, _) => out.grant = g.into(),
            Outcome::Fail(f) => {
                out.status = f.status;
                face::cut_into(&f.message, &mut out.message);
            }
        }
        out
    }
}

fn blank(tag: u64, id: u64, kind: u32) -> shmsched_completion {
    shmsched_completion {
        tag,
        id,
        permit: shmsched_permit {
            process: 0,
            serial: 0,
        },
        status: shmsched_status::Ok,
        kind,
        grant: shmsched_grant::default(),
        reserved: [0; 6],
        message: [0; SHMSCHED_COMPLETION_MESSAGE_MAX],
    }
}

#[cold]
fn cancelled(id: u64) -> Fail {
    Fail::new(
        shmsched_status::Cancelled,
        format!("wait {id} was cancelled; nothing is held"),
    )
}

#[cold]
fn timed_out() -> Fail {
    Fail::from(shmsched::Error::Timeout)
}

#[derive(Default)]
struct State {
    next_id: u64,
    entries: HashMap<u64, Entry>,
    /// (deadline in CLOCK_MONOTONIC ns, id) of the pending waits that have
    /// one.
    deadlines: BTreeSet<(u64, u64)>,
    /// Completions ready to hand out, oldest first.
    done: VecDeque<Done>,
}

/// A waitset's state (what a handle shares with the wakers of its waits).
pub(crate) struct Inner {
    fd: ReadyFd,
    /// Ids whose waker ran since the last take (may repeat, may name waits
    /// that are gone: both are ignored).
    woken: Mutex<Vec<u64>>,
    interrupted: AtomicBool,
    state: Mutex<State>,
    fork_generation: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock (caught at the boundary) leaves the
    // lists consistent: every update is a single push, pop or removal.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The waker of one wait.
struct EntryWaker {
    inner: Weak<Inner>,
    id: u64,
}

impl Wake for EntryWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(inner) = self.inner.upgrade() {
            lock(&inner.woken).push(self.id);
            inner.fd.signal();
        }
    }
}

/// What polling a wait gave.
enum Polled {
    Pending,
    Ready(Outcome),
}

impl Entry {
    fn kind(&self) -> u32 {
        match self.work {
            Work::Acquire { .. } => SHMSCHED_WAIT_ACQUIRE,
            Work::Consume { .. } => SHMSCHED_WAIT_CONSUME,
        }
    }

    fn poll(&mut self) -> Polled {
        let mut cx = Context::from_waker(&self.waker);
        match &mut self.work {
            Work::Acquire { sched, fut } => match fut.as_mut().poll(&mut cx) {
                Poll::Pending => Polled::Pending,
                Poll::Ready(Err(e)) => Polled::Ready(Outcome::Fail(Fail::from(e))),
                Poll::Ready(Ok(permit)) => {
                    // SAFETY: the handle is open while its wait is pending
                    // (the caller's contract), and the permit borrows it.
                    let h = unsafe { &*sched.0 };
                    let permit: Permit<'_> = permit;
                    match permits::insert(h, permit) {
                        Ok(token) => Polled::Ready(Outcome::Permit(token)),
                        Err(f) => Polled::Ready(Outcome::Fail(f)),
                    }
                }
            },
            Work::Consume { lim, fut } => {
                let (n, p) = (fut.tokens(), fut.priority());
                match Pin::new(fut).poll(&mut cx) {
                    Poll::Pending => Polled::Pending,
                    Poll::Ready(Ok(g)) => Polled::Ready(Outcome::Grant(g, lim.clone(), n, p)),
                    Poll::Ready(Err(e)) => Polled::Ready(Outcome::Fail(Fail::from(e))),
                }
            }
        }
    }
}

impl Inner {
    /// Re-arms the timer at the earliest deadline (or disarms it).
    fn arm(&self, st: &State) {
        self.fd.arm(st.deadlines.first().map(|(d, _)| *d));
    }

    /// Starts a wait: polls it once (so it is queued in the region now)
    /// and keeps it, or its completion.
    fn start(self: &Arc<Self>, tag: u64, timeout_ns: u64, work: impl FnOnce() -> Work) -> u64 {
        let mut st = lock(&self.state);
        st.next_id += 1;
        let id = st.next_id;
        let deadline =
            (timeout_ns != SHMSCHED_FOREVER).then(|| monotonic_ns().saturating_add(timeout_ns));
        let waker = Waker::from(Arc::new(EntryWaker {
            inner: Arc::downgrade(self),
            id,
        }));
        let mut e = Entry {
            tag,
            deadline,
            work: work(),
            waker,
        };
        match e.poll() {
            Polled::Ready(outcome) => {
                st.done.push_back(Done {
                    tag,
                    id,
                    kind: e.kind(),
                    outcome,
                });
                self.fd.signal();
            }
            Polled::Pending => {
                if let Some(d) = deadline {
                    st.deadlines.insert((d, id));
                    if st.deadlines.first() == Some(&(d, id)) {
                        self.arm(&st);
                    }
                }
                st.entries.insert(id, e);
            }
        }
        id
    }

    /// Removes a pending wait (dropping its future cancels it cleanly).
    fn remove(st: &mut State, id: u64) -> Option<Entry> {
        let e = st.entries.remove(&id)?;
        if let Some(d) = e.deadline {
            st.deadlines.remove(&(d, id));
        }
        Some(e)
    }

    fn cancel(&self, id: u64) -> Result<(), Fail> {
        let mut st = lock(&self.state);
        if let Some(e) = Inner::remove(&mut st, id) {
            let (tag, kind) = (e.tag, e.kind());
            drop(e);
            st.done.push_back(Done {
                tag,
                id,
                kind,
                outcome: Outcome::Fail(cancelled(id)),
            });
            self.arm(&st);
            self.fd.signal();
            return Ok(());
        }
        if let Some(d) = st.done.iter_mut().find(|d| d.id == id) {
            if !matches!(d.outcome, Outcome::Fail(_)) {
                d.give_back();
            }
            return Ok(());
        }
        Err(Fail::new(
            shmsched_status::AlreadyReleased,
            format!(
                "no wait {id} to cancel in this waitset: it was already taken, or never started"
            ),
        ))
    }

    /// Hands out up to `out.len()` completions (see the module docs).
    fn take(&self, out: &mut [MaybeUninit<shmsched_completion>]) -> usize {
        self.fd.clear();
        let mut st = lock(&self.state);
        let mut n = 0;
        while n < out.len() {
            let Some(d) = st.done.pop_front() else { break };
            out[n].write(d.into_completion());
            n += 1;
        }
        // Waits past their deadline: one last poll (a grant that came in
        // time wins), else a timeout.
        let now = monotonic_ns();
        while n < out.len() {
            let Some(&(d, id)) = st.deadlines.first() else {
                break;
            };
            if d > now {
                break;
            }
            let Some(mut e) = Inner::remove(&mut st, id) else {
                continue;
            };
            let outcome = match e.poll() {
                Polled::Ready(o) => o,
                Polled::Pending => Outcome::Fail(timed_out()),
            };
            let (tag, kind) = (e.tag, e.kind());
            drop(e);
            out[n].write(
                Done {
                    tag,
                    id,
                    kind,
                    outcome,
                }
                .into_completion(),
            );
            n += 1;
        }
        let woken = std::mem::take(&mut *lock(&self.woken));
        let mut rest = woken.into_iter();
        while n < out.len() {
            let Some(id) = rest.next() else { break };
            let Some(e) = st.entries.get_mut(&id) else {
                continue;
            };
            if let Polled::Ready(outcome) = e.poll() {
                let e = Inner::remove(&mut st, id).expect("the entry just polled");
                let kind = e.kind();
                out[n].write(
                    Done {
                        tag: e.tag,
                        id,
                        kind,
                        outcome,
                    }
                    .into_completion(),
                );
                n += 1;
            }
        }
        let left: Vec<u64> = rest.collect();
        let more = !left.is_empty() || !st.done.is_empty() || self.expired(&st, now);
        if !left.is_empty() {
            lock(&self.woken).extend(left);
        }
        self.arm(&st);
        if more {
            self.fd.signal();
        }
        n
    }

    fn expired(&self, st: &State, now: u64) -> bool {
        st.deadlines.first().is_some_and(|(d, _)| *d <= now)
    }

    /// Waits with work to collect now: completions, woken waits, waits past
    /// their deadline.
    fn ready(&self) -> usize {
        let st = lock(&self.state);
        let now = monotonic_ns();
        let expired = st.deadlines.range(..(now, u64::MAX)).count();
        let woken = lock(&self.woken).len();
        st.done.len() + expired + woken.min(st.entries.len())
    }

    fn wait(&self, timeout_ns: u64) -> Result<usize, Fail> {
        let deadline =
            (timeout_ns != SHMSCHED_FOREVER).then(|| monotonic_ns().saturating_add(timeout_ns));
        loop {
            if self.interrupted.swap(false, Ordering::AcqRel) {
                return Ok(self.ready());
            }
            let n = self.ready();
            if n > 0 {
                return Ok(n);
            }
            // Nothing to collect: clear the doorbell (and a fired timer),
            // then look again before sleeping, so a ring between the look
            // and the clear is not lost.
            self.fd.clear();
            self.arm(&lock(&self.state));
            if self.interrupted.load(Ordering::Acquire) {
                continue;
            }
            let n = self.ready();
            if n > 0 {
                return Ok(n);
            }
            let left = match deadline {
                None => None,
                Some(d) => {
                    let now = monotonic_ns();
                    if now >= d {
                        return Err(Fail::from(shmsched::Error::Timeout));
                    }
                    Some(Duration::from_nanos(d - now))
                }
            };
            self.fd.wait(left);
        }
    }

    fn interrupt(&self) {
        self.interrupted.store(true, Ordering::Release);
        self.fd.signal();
    }

    fn pending(&self) -> usize {
        let st = lock(&self.state);
        st.entries.len() + st.done.len()
    }

    /// Cancels everything (close): pending waits are dropped, untaken
    /// completions give back what they hold.
    fn close(&self) {
        let mut st = lock(&self.state);
        let entries = std::mem::take(&mut st.entries);
        st.deadlines.clear();
        drop(entries);
        for mut d in std::mem::take(&mut st.done) {
            d.give_back();
        }
        self.fd.arm(None);
    }
}

/// Creates an empty waitset and writes it to `*out`.
///
/// Errors: `NULL_ARGUMENT`, `IO` (no descriptor could be made). Threads:
/// any. Fork: see `shmsched_waitset`.
///
/// # Safety
///
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_waitset_create(
    out: *mut *mut shmsched_waitset,
) -> shmsched_status {
    ffi! {
        let out = try_out!(out);
        process::install_fork_handler()?;
        let fd = ReadyFd::new().map_err(|e| Fail::io("create the waitset's descriptors", e))?;
        let inner = Arc::new(Inner {
            fd,
            woken: Mutex::new(Vec::new()),
            interrupted: AtomicBool::new(false),
            state: Mutex::new(State::default()),
            fork_generation: process::fork_generation(),
        });
        new_handle(out, shmsched_waitset { inner })
    }
}

/// Writes to `*out_fd` the waitset's descriptor: readable while it has
/// completions to take (a grant, a failure, a cancellation, a deadline
/// passed). For event loops: watch it for reading (asyncio's
/// `loop.add_reader`, libuv's `uv_poll_start`) and call
/// `shmsched_waitset_take` when it is readable; `take` makes it unreadable
/// again unless completions remain. The descriptor stays the waitset's:
/// never close it, and stop watching it before `shmsched_waitset_close`.
/// Use either this descriptor or `shmsched_waitset_wait` on one waitset,
/// not both.
///
/// Errors: `NULL_ARGUMENT`, `FORKED`. Threads: any. Fork: see
/// `shmsched_waitset`.
///
/// # Safety
///
/// `ws` must be NULL or an open waitset handle; `out_fd` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_waitset_fd(
    ws: *const shmsched_waitset,
    out_fd: *mut i32,
) -> shmsched_status {
    ffi! {
        let out = try_out!(out_fd);
        out.set(try_ref!(ws).usable()?.fd.fd())
    }
}

/// Starts an acquire of `n_units` slots (1 for a plain acquire, more for
/// `acquire_many`: all or none) at `priority` on `sched`, waiting in `ws`,
/// and writes the wait's id to `*out_id`. The wait is queued in the region
/// at once, as a real waiter at its priority (so it is served in the
/// region's order across processes, like a blocking acquire), without a
/// thread: its completion (with `tag`) comes out of
/// `shmsched_waitset_take`, with the permit on success. `timeout_ns` bounds
/// the wait (`SHMSCHED_FOREVER`: no limit; the completion is then
/// `SHMSCHED_STATUS_TIMEOUT`, holding nothing). Failures found while
/// waiting (`DISPOSED`, `ZERO_CONCURRENCY`, units above the priority's
/// cap: `INVALID_ARGUMENT`) come as completions too.
///
/// Errors (immediate; no wait started): `NULL_ARGUMENT`,
/// `INVALID_PRIORITY`, `INVALID_ARGUMENT` (`n_units` 0), `FORKED`.
/// Threads: any. The scheduler handle must stay open until the wait is
/// taken, cancelled, or the waitset closed. Fork: see `shmsched_waitset`.
///
/// # Safety
///
/// `sched` must be NULL or an open scheduler handle (kept open as above);
/// `ws` NULL or an open waitset handle; `out_id` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_acquire_start(
    sched: *const shmsched_scheduler,
    priority: i32,
    n_units: u32,
    timeout_ns: u64,
    ws: *const shmsched_waitset,
    tag: u64,
    out_id: *mut u64,
) -> shmsched_status {
    ffi! {
        let (h, out) = (try_ref!(sched), try_out!(out_id));
        let p = try_priority!(priority);
        if n_units == 0 {
            return Err(Fail::invalid("n_units 0: an acquire takes at least 1 unit"));
        }
        let s = h.usable()?;
        let w = try_ref!(ws).usable()?;
        let id = w.start(tag, timeout_ns, || {
            let fut = if n_units == 1 {
                s.acquire_async(p)
            } else {
                s.acquire_many_async(p, n_units)
            };
            // SAFETY (lifetime only; same type): the future borrows the
            // handle's scheduler, which the caller keeps open until the
            // wait is taken, cancelled or the waitset closed, and the
            // waitset drops the future by then.
            let fut: Acquire<'static> = unsafe { std::mem::transmute(fut) };
            Work::Acquire {
                sched: SchedPtr(sched),
                fut: Box::pin(fut),
            }
        });
        out.set(id)
    }
}

/// Starts a consume of `n` tokens at `priority` on `lim`, waiting in `ws`,
/// and writes the wait's id to `*out_id`: the asynchronous
/// `shmsched_limiter_consume`, without a thread. Its completion (with
/// `tag`) carries the grant. `timeout_ns` as in
/// `shmsched_scheduler_acquire_start`; a consume that times out or is
/// cancelled gets back every level it was charged on.
///
/// Errors (immediate; no wait started): `NULL_ARGUMENT`,
/// `INVALID_PRIORITY`, `FORKED`. (`n` out of range comes as a completion
/// with `INVALID_ARGUMENT`.) Threads: any. The limiter handle may be
/// closed while the wait is pending. Fork: see `shmsched_waitset`.
///
/// # Safety
///
/// `lim` must be NULL or an open limiter handle; `ws` NULL or an open
/// waitset handle; `out_id` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_limiter_consume_start(
    lim: *const shmsched_limiter,
    n: u64,
    priority: i32,
    timeout_ns: u64,
    ws: *const shmsched_waitset,
    tag: u64,
    out_id: *mut u64,
) -> shmsched_status {
    ffi! {
        let (h, out) = (try_ref!(lim), try_out!(out_id));
        let p = try_priority!(priority);
        let l = h.usable()?.clone();
        let w = try_ref!(ws).usable()?;
        let id = w.start(tag, timeout_ns, || Work::Consume {
            fut: l.consume_async(n, p),
            lim: l,
        });
        out.set(id)
    }
}

/// Cancels the wait `id` of `ws`: a wait not yet taken completes as
/// `SHMSCHED_STATUS_CANCELLED` (its completion still comes out of
/// `shmsched_waitset_take`) and nothing stays held: its queued place is
/// removed, a grant that raced the cancel is given back, a completion
/// already ready gives back its permit or tokens.
///
/// Errors: `NULL_ARGUMENT`, `ALREADY_RELEASED` (no such wait: already
/// taken, or never started), `FORKED`. Threads: any. Fork: see
/// `shmsched_waitset`.
///
/// # Safety
///
/// `ws` must be NULL or an open waitset handle.
#[no_mangle]
pub unsafe extern "C" fn shmsched_waitset_cancel(
    ws: *const shmsched_waitset,
    id: u64,
) -> shmsched_status {
    ffi!(try_ref!(ws).usable()?.cancel(id))
}

/// Takes up to `cap` completions into `buf[0..*out_n]`, without blocking
/// (`*out_n` may be 0). Polls the waits that were woken (on this thread)
/// and times out those past their deadline. After it, the waitset's
/// descriptor is readable only if completions remain (more than `cap`).
/// A granted acquire's permit and a consume's tokens are the caller's
/// from here on.
///
/// Errors: `NULL_ARGUMENT` (`buf` NULL with `cap` above 0, or `out_n`
/// NULL), `FORKED`. Threads: any. Fork: see `shmsched_waitset`.
///
/// # Safety
///
/// `ws` must be NULL or an open waitset handle; `buf` NULL or valid for
/// writes of `cap` completions; `out_n` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_waitset_take(
    ws: *const shmsched_waitset,
    buf: *mut shmsched_completion,
    cap: usize,
    out_n: *mut usize,
) -> shmsched_status {
    ffi! {
        let out = try_out!(out_n);
        if buf.is_null() && cap > 0 {
            return Err(Fail::null("buf"));
        }
        let w = try_ref!(ws).usable()?;
        // (`cap` 0 only checks the handle: a take would clear the doorbell.)
        out.set(match cap {
            0 => 0,
            // SAFETY: `buf` is valid for writes of `cap` completions (the
            // caller's contract); `take` initialises the first `n` it
            // reports, and the caller reads only those.
            _ => w.take(unsafe { std::slice::from_raw_parts_mut(buf.cast(), cap) }),
        })
    }
}

/// Blocks until the waitset has something to take (a completion, a woken
/// wait, a deadline passed), `timeout_ns` passes (`SHMSCHED_FOREVER`: no
/// limit), or `shmsched_waitset_interrupt` is called; writes to
/// `*out_ready` how many waits have something to collect (an upper bound:
/// a woken wait of a child scheduler may still be pending after `take`).
/// For bindings that can only block: one thread waiting here serves every
/// pending wait of the waitset. Use either this or the descriptor of
/// `shmsched_waitset_fd` on one waitset, not both.
///
/// Errors: `NULL_ARGUMENT`, `TIMEOUT` (nothing came within `timeout_ns`),
/// `FORKED`. An interrupt is not an error: the status is OK, and
/// `*out_ready` may be 0. Threads: any (typically one waiting thread while
/// others start, cancel and take). Fork: see `shmsched_waitset`.
///
/// # Safety
///
/// `ws` must be NULL or an open waitset handle; `out_ready` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_waitset_wait(
    ws: *const shmsched_waitset,
    timeout_ns: u64,
    out_ready: *mut usize,
) -> shmsched_status {
    ffi! {
        let out = try_out!(out_ready);
        out.set(try_ref!(ws).usable()?.wait(timeout_ns)?)
    }
}

/// Makes a `shmsched_waitset_wait` in progress (or the next one) return at
/// once with `SHMSCHED_STATUS_OK`, for example to stop the waiting thread
/// before closing the waitset.
///
/// Errors: `NULL_ARGUMENT`, `FORKED`. Threads: any; async-signal-unsafe.
/// Fork: see `shmsched_waitset`.
///
/// # Safety
///
/// `ws` must be NULL or an open waitset handle.
#[no_mangle]
pub unsafe extern "C" fn shmsched_waitset_interrupt(
    ws: *const shmsched_waitset,
) -> shmsched_status {
    ffi!(try_ref!(ws).usable()?.interrupt())
}

/// Writes the number of waits started on `ws` and not yet taken (pending,
/// or complete and waiting for `take`).
///
/// Errors: `NULL_ARGUMENT`, `FORKED`. Threads: any. Fork: see
/// `shmsched_waitset`.
///
/// # Safety
///
/// `ws` must be NULL or an open waitset handle; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_waitset_pending(
    ws: *const shmsched_waitset,
    out: *mut usize,
) -> shmsched_status {
    ffi! {
        let out = try_out!(out);
        out.set(try_ref!(ws).usable()?.pending())
    }
}

/// Closes the waitset: every pending wait is cancelled (nothing stays
/// held), completions not taken give back their permits and tokens, and
/// the descriptor is closed (stop watching it first; no thread may be in
/// `shmsched_waitset_wait`: interrupt it and let it return). NULL does
/// nothing.
///
/// Threads: must be the last call on the handle. Fork: in a forked child,
/// frees only the child's memory (the waits are the parent's).
///
/// # Safety
///
/// `ws` must be NULL or an open waitset handle, not used again.
#[no_mangle]
pub unsafe extern "C" fn shmsched_waitset_close(ws: *mut shmsched_waitset) {
    // SAFETY: the caller's contract: NULL or a handle from
    // `shmsched_waitset_create`, not used again; only its box refers to it.
    unsafe {
        face::close(ws, |ws| {
            let w = Box::from_raw(ws);
            match w.usable() {
                Ok(inner) => inner.close(),
                // A forked child: the futures are the parent's waiters;
                // dropping them here would act on the parent's queue. Leak
                // them.
                Err(_) => std::mem::forget(std::mem::take(&mut *lock(&w.inner.state))),
            }
        })
    }
}
