//! `shmsched_scheduler`: a concurrency budget, shared through a region.

use std::ffi::{c_char, c_void};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};
use std::time::Duration;

use shmsched::priority::LEVELS;
use shmsched::scheduler::{Concurrency, Permit, QueueStats, Scheduler, SchedulerStats};
use shmsched::Priority;

use crate::face::{
    self, close, ffi, new_handle, try_mut, try_opt_out, try_out, try_priority, try_ref, Handle, Out,
};
use crate::permits::{self, shmsched_permit};
use crate::pin;
use crate::process;
use crate::region::shmsched_region;
use crate::status::{shmsched_status, Fail};
use crate::waiter;

/// `max` (or a reported concurrency) meaning "no overall limit".
pub const SHMSCHED_UNLIMITED: u32 = u32::MAX;

/// A per-priority cap that is not set (it inherits from the priority below;
/// see `shmsched_concurrency`).
pub const SHMSCHED_CAP_UNSET: u32 = u32::MAX;

/// A scheduler handle (opaque). Made by `shmsched_scheduler_shared`,
/// `_shared_with`, `_attach` or `_child`; closed by
/// `shmsched_scheduler_close`.
///
/// Threads: every call on a handle may be made from any thread,
/// concurrently (except `_close` and `_detach`, which must be the last call
/// on it). Fork: a handle belongs to the process that made it; in a forked
/// child every call on an inherited handle fails with
/// `SHMSCHED_STATUS_FORKED` (close it there, and make a new one from the
/// region).
pub struct shmsched_scheduler {
    sched: Scheduler,
    /// Set (under the permit pool's lock) when the handle is closed; read by
    /// releases to know whether they may have to free it.
    closed: AtomicBool,
    /// The fork generation the handle was made in.
    fork_generation: u64,
    /// Its pin target's slot ([`crate::pin`]), or `pin::NO_SLOT`: set once
    /// before the handle is shared (a copy, so that the lean acquire reads
    /// it from the handle).
    pin_slot: AtomicU32,
    /// Its pin target, or null: set before the handle is shared, cleared
    /// (under the pool lock) when the handle leaves it at close or detach.
    target: AtomicPtr<pin::PinTarget>,
}

impl shmsched_scheduler {
    pub(crate) fn new(sched: Scheduler) -> shmsched_scheduler {
        shmsched_scheduler {
            sched,
            closed: AtomicBool::new(false),
            fork_generation: process::fork_generation(),
            pin_slot: AtomicU32::new(pin::NO_SLOT),
            target: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// Its pin target's slot, or `pin::NO_SLOT`.
    #[inline(always)]
    pub(crate) fn pin_slot(&self) -> u32 {
        self.pin_slot.load(Ordering::Relaxed)
    }

    /// Its pin target (null when none, or once it left it).
    pub(crate) fn target(&self) -> *mut pin::PinTarget {
        self.target.load(Ordering::Relaxed)
    }

    /// Puts the handle on pin target `t`, whose slot is `slot` (before the
    /// handle is shared, under the pool lock).
    pub(crate) fn set_target(&self, t: *mut pin::PinTarget, slot: u32) {
        self.target.store(t, Ordering::Relaxed);
        self.pin_slot.store(slot, Ordering::Relaxed);
    }

    /// Forgets its pin target once it left it (under the pool lock). The
    /// slot stays: nothing acquires through the handle any more.
    pub(crate) fn clear_target(&self) {
        self.target.store(ptr::null_mut(), Ordering::Relaxed);
    }

    #[inline(always)]
    pub(crate) fn scheduler(&self) -> &Scheduler {
        &self.sched
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(crate) fn mark_closed(&self) {
        self.closed.store(true, Ordering::Release);
    }
}

impl Handle for shmsched_scheduler {
    type Target = Scheduler;
    const AFTER_FORK: &'static str =
        "handle used after fork: a Scheduler belongs to the process that created it; in a \
         forked child, create a new one from the Region (shmsched_scheduler_shared or \
         shmsched_scheduler_attach)";

    #[inline(always)]
    fn parts(&self) -> (u64, &Scheduler) {
        (self.fork_generation, &self.sched)
    }
}

/// How many tasks may run at once, overall and per priority.
///
/// Start from `shmsched_concurrency_max(max)` and set caps with
/// `shmsched_concurrency_set_cap`. Cap resolution follows the seed's rule:
/// every cap is clamped to `max`; priorities above the topmost explicit cap
/// get `max`; an unset `lowest` takes the bottommost explicit cap; any other
/// unset priority inherits the cap of the priority just below it. A cap
/// compares against the total running count of the scheduler.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct shmsched_concurrency {
    /// Overall ceiling (0..=2147483647), or `SHMSCHED_UNLIMITED` (only for
    /// a child). 0 admits nothing: blocking calls then fail at once with
    /// `SHMSCHED_STATUS_ZERO_CONCURRENCY`.
    pub max: u32,
    /// Explicit per-priority caps, indexed by priority + 3
    /// (`caps[SHMSCHED_PRIORITY_LOW + 3]`), or `SHMSCHED_CAP_UNSET`.
    pub caps: [u32; 7],
}

const _: () = assert!(LEVELS == 7);

impl shmsched_concurrency {
    fn to_library(self) -> Concurrency {
        let mut c = if self.max == SHMSCHED_UNLIMITED {
            Concurrency::unlimited()
        } else {
            Concurrency::max(self.max)
        };
        for p in Priority::ALL {
            let cap = self.caps[p.index()];
            if cap != SHMSCHED_CAP_UNSET {
                c = c.cap(p, cap);
            }
        }
        c
    }
}

/// A concurrency of `max` with no per-priority caps.
///
/// Threads: any. Fork: no state.
#[no_mangle]
pub extern "C" fn shmsched_concurrency_max(max: u32) -> shmsched_concurrency {
    shmsched_concurrency {
        max,
        caps: [SHMSCHED_CAP_UNSET; 7],
    }
}

/// Sets the cap of `priority` (a `SHMSCHED_PRIORITY_*` value) in `*c`; `cap`
/// may be `SHMSCHED_CAP_UNSET` to clear it. Values are checked when the
/// concurrency is used.
///
/// Errors: `NULL_ARGUMENT`, `INVALID_PRIORITY`. Threads: any (the struct is
/// the caller's). Fork: no state.
///
/// # Safety
///
/// `c` must be NULL or point to a writable `shmsched_concurrency`.
#[no_mangle]
pub unsafe extern "C" fn shmsched_concurrency_set_cap(
    c: *mut shmsched_concurrency,
    priority: i32,
    cap: u32,
) -> shmsched_status {
    ffi! {
        let c = try_mut!(c);
        c.caps[try_priority!(priority).index()] = cap;
    }
}

fn make(sched: Scheduler, out: Out<*mut shmsched_scheduler>) -> Result<(), Fail> {
    new_handle(out, shmsched_scheduler::new(sched))
}

/// [`make`] for a shared root handle: it gets the pin target of its region
/// binding (one with a new pin slot, if it has none and one is free), so
/// its one-cell permits are cell tokens ([`crate::pin`]).
fn make_root(sched: Scheduler, out: Out<*mut shmsched_scheduler>) -> Result<(), Fail> {
    process::install_fork_handler()?;
    let h = Box::into_raw(Box::new(shmsched_scheduler::new(sched)));
    pin::publish(h);
    out.set(h);
    Ok(())
}

/// Binds a scheduler shared through `region` with at most `max` tasks at
/// once across every process (0..=65536). A new region is initialised with
/// `max`; an existing one must have the same max (else
/// `SHMSCHED_STATUS_MISMATCH`; use `shmsched_scheduler_attach` to join
/// whatever it has). On success `*out` is a new handle.
///
/// Errors: `NULL_ARGUMENT`, `INVALID_ARGUMENT` (max too large),
/// `WRONG_KIND`, `MISMATCH`, `VERSION_MISMATCH`, `BAD_REGION`,
/// `PROCESS_TABLE_FULL`, `IO`. Threads: any. Fork: works in a forked child
/// (the child registers as a process of its own).
///
/// # Safety
///
/// `region` must be NULL or an open region handle; `out` must be NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_shared(
    region: *const shmsched_region,
    max: u32,
    out: *mut *mut shmsched_scheduler,
) -> shmsched_status {
    // SAFETY: forwarded contract.
    unsafe { shmsched_scheduler_shared_with(region, &shmsched_concurrency_max(max), out) }
}

/// Like `shmsched_scheduler_shared`, with per-priority caps: the region's
/// max is `c->max` (required, not `SHMSCHED_UNLIMITED`); the caps apply to
/// this handle's tasks and compare against the global running count.
///
/// Errors: as `shmsched_scheduler_shared`. Threads: any. Fork: works in a
/// forked child (the child registers as a process of its own).
///
/// # Safety
///
/// `region` must be NULL or an open region handle; `c` NULL or readable;
/// `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_shared_with(
    region: *const shmsched_region,
    c: *const shmsched_concurrency,
    out: *mut *mut shmsched_scheduler,
) -> shmsched_status {
    ffi! {
        let (r, c, out) = (try_ref!(region), try_ref!(c), try_out!(out));
        make_root(r.bind(|region| Scheduler::shared(region, c.to_library()))?, out)
    }
}

/// Joins the scheduler already initialised in `region`, whatever its max.
///
/// Errors: `NULL_ARGUMENT`, `BAD_REGION` (not initialised), `WRONG_KIND`,
/// `VERSION_MISMATCH`, `PROCESS_TABLE_FULL`, `IO`. Threads: any. Fork:
/// works in a forked child.
///
/// # Safety
///
/// `region` must be NULL or an open region handle; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_attach(
    region: *const shmsched_region,
    out: *mut *mut shmsched_scheduler,
) -> shmsched_status {
    ffi! {
        let (r, out) = (try_ref!(region), try_out!(out));
        make_root(r.bind(Scheduler::attach)?, out)
    }
}

/// A child scheduler: an extra local cap of `max` (or `SHMSCHED_UNLIMITED`)
/// on top of `parent`, in this process. A task through the child runs only
/// when every level admits it. The parent handle may be closed before the
/// child.
///
/// Errors: `NULL_ARGUMENT`, `INVALID_ARGUMENT`, `DISPOSED`, `FORKED`.
/// Threads: any. Fork: the child handle belongs to this process, like its
/// parent.
///
/// # Safety
///
/// `parent` must be NULL or an open scheduler handle; `out` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_child(
    parent: *const shmsched_scheduler,
    max: u32,
    out: *mut *mut shmsched_scheduler,
) -> shmsched_status {
    // SAFETY: forwarded contract.
    unsafe { shmsched_scheduler_child_with(parent, &shmsched_concurrency_max(max), out) }
}

/// Like `shmsched_scheduler_child`, with per-priority caps.
///
/// Errors: as `shmsched_scheduler_child`. Threads: any. Fork: the child
/// handle belongs to this process, like its parent.
///
/// # Safety
///
/// `parent` must be NULL or an open scheduler handle; `c` NULL or
/// readable; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_child_with(
    parent: *const shmsched_scheduler,
    c: *const shmsched_concurrency,
    out: *mut *mut shmsched_scheduler,
) -> shmsched_status {
    ffi! {
        let (p, c, out) = (try_ref!(parent), try_ref!(c), try_out!(out));
        make(p.usable()?.child(c.to_library())?, out)
    }
}

/// Blocks until a slot is free at `priority` (a `SHMSCHED_PRIORITY_*`
/// value), then writes the permit to `*out`. Release it with
/// `shmsched_permit_release`. A freed slot goes to the highest-priority
/// waiter in any process sharing the region (a starvation lottery aside).
///
/// Errors: `NULL_ARGUMENT`, `INVALID_PRIORITY`, `ZERO_CONCURRENCY` (at
/// once), `DISPOSED` (at once, or when disposed while waiting), `FORKED`,
/// `CAPACITY_EXHAUSTED` (this process holds 4194304 permits).
/// Threads: any; waiting threads sleep on a futex. Fork: see the handle.
///
/// # Safety
///
/// `sched` must be NULL or an open scheduler handle; `out` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_acquire(
    sched: *const shmsched_scheduler,
    priority: i32,
    out: *mut shmsched_permit,
) -> shmsched_status {
    let lean = move || {
        // SAFETY: forwarded contract.
        unsafe { pin::acquire_now(sched, priority, out, acquire_general) }
    };
    if let Some(status) = face::lean(lean) {
        return status;
    }
    // SAFETY: forwarded contract.
    unsafe { acquire_general(sched, priority, out) }
}

/// `shmsched_scheduler_acquire` but for its lean path ([`face::lean`]): out
/// of line, arguments by value, so that the lean path calls it as a tail.
///
/// # Safety
///
/// As `shmsched_scheduler_acquire`.
#[inline(never)]
unsafe fn acquire_general(
    sched: *const shmsched_scheduler,
    priority: i32,
    out: *mut shmsched_permit,
) -> shmsched_status {
    ffi! { acquire(try_ref!(sched), try_out!(out), priority, |s, p| s.acquire(p)) }
}

/// Like `shmsched_scheduler_acquire`, giving up after `timeout_ns`
/// nanoseconds with `SHMSCHED_STATUS_TIMEOUT` (a timed-out wait leaves no
/// count behind).
///
/// Errors: as `shmsched_scheduler_acquire`, and `TIMEOUT`. Threads: any;
/// waiting threads sleep. Fork: see the handle.
///
/// # Safety
///
/// As `shmsched_scheduler_acquire`.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_acquire_timeout(
    sched: *const shmsched_scheduler,
    priority: i32,
    timeout_ns: u64,
    out: *mut shmsched_permit,
) -> shmsched_status {
    let timeout = Duration::from_nanos(timeout_ns);
    ffi! {
        acquire(try_ref!(sched), try_out!(out), priority, |s, p| {
            s.acquire_timeout(p, timeout)
        })
    }
}

/// The completion of `shmsched_scheduler_acquire_async`: called exactly
/// once, from a thread of the library, with the outcome. On success
/// `status` is `SHMSCHED_STATUS_OK` and `permit` the permit (now the
/// caller's to release); on failure `permit` is zeroed and `message` is the
/// error's text (valid only during the call; NULL on success).
pub type shmsched_acquire_callback = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        status: shmsched_status,
        permit: shmsched_permit,
        message: *const c_char,
    ),
>;

// The waiting thread reports through this type.
const _: fn(shmsched_acquire_callback) -> waiter::Callback<shmsched_permit> = |c| c;

/// Starts an acquire at `priority` that waits on a thread of its own and
/// reports to `callback(ctx, …)` when it is granted, times out after
/// `timeout_ns` (`SHMSCHED_FOREVER` for no limit), or fails. For bindings
/// whose callers must not block (Node.js): the waiting thread is a real
/// waiter in the region, so priorities hold across processes exactly as
/// for `shmsched_scheduler_acquire`. One OS thread per pending wait: for
/// many waits, use a waitset instead (`shmsched_scheduler_acquire_start`,
/// no thread per wait). Returns `SHMSCHED_STATUS_OK` once the wait started
/// (the callback then runs exactly once); any other status means it did
/// not start and the callback will not run.
///
/// Errors (immediate): `NULL_ARGUMENT` (also for a NULL callback),
/// `INVALID_PRIORITY`, `FORKED`, `IO` (no thread could be started).
/// Threads: any; the callback runs on another thread. The handle must stay
/// open until the callback has run. Fork: a pending wait does not exist in
/// a forked child (threads are not forked).
///
/// # Safety
///
/// `sched` must be NULL or an open scheduler handle that stays open until
/// the callback ran; `callback` must be safe to call from any thread with
/// `ctx`.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_acquire_async(
    sched: *const shmsched_scheduler,
    priority: i32,
    timeout_ns: u64,
    callback: shmsched_acquire_callback,
    ctx: *mut c_void,
) -> shmsched_status {
    ffi! {
        let h = try_ref!(sched);
        let p = try_priority!(priority);
        // SAFETY: the caller's contract: the handle stays open until the
        // callback ran, which may be called from any thread with `ctx`.
        unsafe {
            waiter::start(h, timeout_ns, callback, ctx, move |h, timeout| {
                pin::acquire_with(h, |s| match timeout {
                    None => s.acquire(p),
                    Some(t) => s.acquire_timeout(p, t),
                })
            })
        }
    }
}

/// Takes a slot only if one is free at `priority` now and nothing is queued
/// at that priority; never waits. `SHMSCHED_STATUS_WOULD_BLOCK` when not.
///
/// Errors: `WOULD_BLOCK`, `NULL_ARGUMENT`, `INVALID_PRIORITY`,
/// `ZERO_CONCURRENCY`, `DISPOSED`, `FORKED`, `CAPACITY_EXHAUSTED`.
/// Threads: any. Fork: see the handle.
///
/// # Safety
///
/// As `shmsched_scheduler_acquire`.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_try_acquire(
    sched: *const shmsched_scheduler,
    priority: i32,
    out: *mut shmsched_permit,
) -> shmsched_status {
    // The lean path is the fast path of `try_acquire` as much as of
    // `acquire` (both start with it). Written out in each function rather
    // than shared: a shared body is one closure type, whose two callers
    // made the compiler stop inlining it (48 instructions more a pair).
    let lean = move || {
        // SAFETY: forwarded contract.
        unsafe { pin::acquire_now(sched, priority, out, try_acquire_general) }
    };
    if let Some(status) = face::lean(lean) {
        return status;
    }
    // SAFETY: forwarded contract.
    unsafe { try_acquire_general(sched, priority, out) }
}

/// `shmsched_scheduler_try_acquire` but for its lean path (as
/// [`acquire_general`]).
///
/// # Safety
///
/// As `shmsched_scheduler_acquire`.
#[inline(never)]
unsafe fn try_acquire_general(
    sched: *const shmsched_scheduler,
    priority: i32,
    out: *mut shmsched_permit,
) -> shmsched_status {
    ffi! {
        acquire(try_ref!(sched), try_out!(out), priority, |s, p| {
            s.try_acquire(p).ok_or_else(|| why_not(s))
        })
    }
}

/// A weighted acquire: blocks until `n` units of the budget are free at
/// `priority` and takes them all at once (never some of them; two weighted
/// waiters cannot deadlock), then writes one permit for the `n` units to
/// `*out` (one `shmsched_permit_release` gives them all back). `n` must be
/// 1..=max, and at most `priority`'s cap when that cap is below the max.
///
/// Errors: as `shmsched_scheduler_acquire`, and `INVALID_ARGUMENT` (`n` 0,
/// above the max or above the priority's cap; the message names both).
/// Threads: any; waiting threads sleep on a futex. Fork: see the handle.
///
/// # Safety
///
/// As `shmsched_scheduler_acquire`.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_acquire_many(
    sched: *const shmsched_scheduler,
    priority: i32,
    n: u32,
    out: *mut shmsched_permit,
) -> shmsched_status {
    ffi! { acquire(try_ref!(sched), try_out!(out), priority, |s, p| s.acquire_many(p, n)) }
}

/// Like `shmsched_scheduler_acquire_many`, giving up after `timeout_ns`
/// nanoseconds with `SHMSCHED_STATUS_TIMEOUT` (nothing taken, no count left
/// behind).
///
/// Errors: as `shmsched_scheduler_acquire_many`, and `TIMEOUT`. Threads:
/// any; waiting threads sleep. Fork: see the handle.
///
/// # Safety
///
/// As `shmsched_scheduler_acquire`.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_acquire_many_timeout(
    sched: *const shmsched_scheduler,
    priority: i32,
    n: u32,
    timeout_ns: u64,
    out: *mut shmsched_permit,
) -> shmsched_status {
    let timeout = Duration::from_nanos(timeout_ns);
    ffi! {
        acquire(try_ref!(sched), try_out!(out), priority, |s, p| {
            s.acquire_many_timeout(p, n, timeout)
        })
    }
}

/// Every acquire but the `_async` one: once the handle, `out` and the
/// priority are checked and the handle is this process's, `take` runs and
/// its permit is recorded and written to `*out`.
#[inline(always)]
fn acquire<'h, E>(
    h: &'h shmsched_scheduler,
    out: Out<shmsched_permit>,
    priority: i32,
    take: impl FnOnce(&'h Scheduler, Priority) -> Result<Permit<'h>, E>,
) -> Result<(), Fail>
where
    Fail: From<E>,
{
    let p = try_priority!(priority);
    h.usable()?;
    out.set(pin::acquire_with(h, |s| take(s, p))?);
    Ok(())
}

/// Takes `n` units only if they are all free at `priority` now and nothing
/// waits at that priority or above; never waits.
/// `SHMSCHED_STATUS_WOULD_BLOCK` when not.
///
/// Errors: `WOULD_BLOCK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (`n` 0),
/// `INVALID_PRIORITY`, `ZERO_CONCURRENCY`, `DISPOSED`, `FORKED`,
/// `CAPACITY_EXHAUSTED`. Threads: any. Fork: see the handle.
///
/// # Safety
///
/// As `shmsched_scheduler_acquire`.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_try_acquire_many(
    sched: *const shmsched_scheduler,
    priority: i32,
    n: u32,
    out: *mut shmsched_permit,
) -> shmsched_status {
    ffi! {
        acquire(try_ref!(sched), try_out!(out), priority, |s, p| {
            if n == 0 {
                return Err(Fail::invalid("try_acquire_many of 0 slots: n must be at least 1"));
            }
            s.try_acquire_many(p, n).ok_or_else(|| why_not(s))
        })
    }
}

/// Why a `try_acquire` took nothing.
#[cold]
fn why_not(s: &Scheduler) -> Fail {
    if s.is_disposed() {
        return Fail::from(shmsched::Error::Disposed);
    }
    if s.concurrency() == Some(0) {
        return Fail::from(shmsched::Error::ZeroConcurrency);
    }
    Fail::new(
        shmsched_status::WouldBlock,
        "no slot is free at this priority now (or others wait at it)",
    )
}

/// Gives the permit's slot back, exactly once. The permit must have been
/// acquired by this process (`SHMSCHED_STATUS_FOREIGN_PERMIT` otherwise:
/// another process's permit, including one inherited across `fork`, whose
/// slot stays its owner's) and not released yet
/// (`SHMSCHED_STATUS_ALREADY_RELEASED`, also for a permit never issued).
/// The scheduler handle it came from may have been closed meanwhile.
///
/// The check costs no atomic read-modify-write of its own for a one-slot
/// permit of a shared (not child) handle: that permit's token names its
/// region slot and a tag stored in it, and the slot's own give-back
/// compare-and-swap is the check (a stale token could only be taken for a
/// later permit of this process on the same slot with the same 32-bit tag).
/// Other permits (weighted, or through a child) are checked through a table
/// entry.
///
/// Errors: `FOREIGN_PERMIT`, `ALREADY_RELEASED`. Threads: any thread of the
/// owning process (not only the acquiring one); two racing releases of one
/// permit free it once. Fork: see above.
#[no_mangle]
pub extern "C" fn shmsched_permit_release(permit: shmsched_permit) -> shmsched_status {
    if let Some(status) = face::lean(move || pin::release_now(permit, release_general)) {
        return status;
    }
    release_general(permit)
}

/// `shmsched_permit_release` but for its lean path (as [`acquire_general`]).
#[inline(never)]
fn release_general(permit: shmsched_permit) -> shmsched_status {
    ffi!(pin::release(permit))
}

/// Disposes the scheduler and its children: queued waiters get
/// `SHMSCHED_STATUS_DISPOSED`, later acquires fail at once. Permits still
/// held keep their slots until released, so the cap is never exceeded.
/// Disposing a shared scheduler disposes this process's handle (and its
/// clones and children), not the region's budget.
///
/// Errors: `NULL_ARGUMENT`, `FORKED`. Threads: any. Fork: see the handle.
///
/// # Safety
///
/// `sched` must be NULL or an open scheduler handle.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_dispose(
    sched: *const shmsched_scheduler,
) -> shmsched_status {
    ffi!(try_ref!(sched).usable()?.dispose())
}

/// Writes whether the scheduler (or a parent of it) is disposed.
///
/// Errors: `NULL_ARGUMENT`, `FORKED`. Threads: any. Fork: see the handle.
///
/// # Safety
///
/// `sched` must be NULL or an open scheduler handle; `out` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_is_disposed(
    sched: *const shmsched_scheduler,
    out: *mut bool,
) -> shmsched_status {
    ffi! {
        let (h, out) = (try_ref!(sched), try_out!(out));
        out.set(h.usable()?.is_disposed())
    }
}

/// Gives back now every slot held by dead processes sharing the region
/// (waiters also do this by themselves, at a bounded rate). Writes the
/// number of processes reaped and of slots reclaimed to the optional
/// outputs.
///
/// Errors: `NULL_ARGUMENT`, `FORKED`, `BAD_REGION`, `IO`. Threads: any.
/// Fork: see the handle.
///
/// # Safety
///
/// `sched` must be NULL or an open scheduler handle; each output NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_reap(
    sched: *const shmsched_scheduler,
    out_processes: *mut u32,
    out_slots: *mut u64,
) -> shmsched_status {
    ffi! {
        let (processes, slots) = try_ref!(sched).usable()?.reap()?;
        try_opt_out!(out_processes).set(processes);
        try_opt_out!(out_slots).set(slots);
    }
}

/// Writes the number of slots held right now across every process sharing
/// the scheduler's root (no syscall).
///
/// Errors: `NULL_ARGUMENT`, `FORKED`. Threads: any. Fork: see the handle.
///
/// # Safety
///
/// `sched` must be NULL or an open scheduler handle; `out` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_global_running(
    sched: *const shmsched_scheduler,
    out: *mut u32,
) -> shmsched_status {
    ffi! {
        let (h, out) = (try_ref!(sched), try_out!(out));
        out.set(h.usable()?.global_running())
    }
}

/// Writes this level's overall ceiling, `SHMSCHED_UNLIMITED` when none.
///
/// Errors: `NULL_ARGUMENT`, `FORKED`. Threads: any. Fork: see the handle.
///
/// # Safety
///
/// `sched` must be NULL or an open scheduler handle; `out` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_concurrency(
    sched: *const shmsched_scheduler,
    out: *mut u32,
) -> shmsched_status {
    ffi! {
        let (h, out) = (try_ref!(sched), try_out!(out));
        out.set(h.usable()?.concurrency().unwrap_or(SHMSCHED_UNLIMITED))
    }
}

/// Reseeds this level's starvation lottery with `seed` (0 keeps the current
/// generator), or switches it off (`enabled` false: strict priority within
/// caps, so starvation becomes possible). For tests and replays.
///
/// Errors: `NULL_ARGUMENT`, `FORKED`. Threads: any. Fork: see the handle.
///
/// # Safety
///
/// `sched` must be NULL or an open scheduler handle.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_set_lottery(
    sched: *const shmsched_scheduler,
    seed: u64,
    enabled: bool,
) -> shmsched_status {
    ffi! {
        let lottery = (seed != 0).then_some(seed);
        try_ref!(sched).usable()?.set_lottery(lottery, enabled)
    }
}

/// Moves the effective ceiling of a shared scheduler to `target` (at most
/// the region's max), for every process sharing it: at most `target` slots
/// are held at once from then on. Lowering it revokes nothing (holders keep
/// their slots; releases go to the ceiling until it is reached); raising it
/// serves waiters at once. Writes to the optional `*out_reached` whether the
/// ceiling holds now (false while more than `target` slots are still held).
///
/// Through a child handle it moves the ceiling of the region the child's
/// root is shared through.
///
/// Errors: `NULL_ARGUMENT`, `INVALID_ARGUMENT` (`target` above the region's
/// max), `FORKED`. Threads: any. Fork: see the handle.
///
/// # Safety
///
/// `sched` must be NULL or an open scheduler handle; `out_reached` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_set_ceiling(
    sched: *const shmsched_scheduler,
    target: u32,
    out_reached: *mut bool,
) -> shmsched_status {
    ffi! {
        let reached = try_ref!(sched).usable()?.set_ceiling(target)?;
        try_opt_out!(out_reached).set(reached);
    }
}

/// Writes the effective ceiling of the region the scheduler (or its root,
/// for a child) is shared through: its max unless moved by
/// `shmsched_scheduler_set_ceiling`.
///
/// Errors: `NULL_ARGUMENT`, `FORKED`. Threads: any. Fork: see the handle.
///
/// # Safety
///
/// `sched` must be NULL or an open scheduler handle; `out` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_ceiling(
    sched: *const shmsched_scheduler,
    out: *mut u32,
) -> shmsched_status {
    ffi! {
        let (h, out) = (try_ref!(sched), try_out!(out));
        out.set(h.usable()?.ceiling())
    }
}

/// One priority's queue: a gauge and cumulative counters. While the
/// scheduler lives, `deferred - completed == count`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct shmsched_queue_stats {
    /// Gauge: tasks queued now.
    pub count: u64,
    /// Counter: tasks ever queued (they could not start at once).
    pub deferred: u64,
    /// Counter: tasks that ever left the queue (dispatched or cancelled).
    pub completed: u64,
    /// Counter: the part of `completed` that was cancelled (timeout,
    /// dispose).
    pub cancelled: u64,
}

impl From<&QueueStats> for shmsched_queue_stats {
    fn from(q: &QueueStats) -> Self {
        shmsched_queue_stats {
            count: q.count,
            deferred: q.deferred,
            completed: q.completed,
            cancelled: q.cancelled,
        }
    }
}

/// What the region knows about everyone sharing a scheduler.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct shmsched_scheduler_region_stats {
    /// Gauge: slots held across all processes now.
    pub running: u32,
    /// The region's global max.
    pub max: u32,
    /// Gauge: processes attached and alive.
    pub processes: u32,
    /// Gauge: tasks waiting in live processes, per priority (index =
    /// priority + 3).
    pub waiters: [u32; 7],
    /// Counter: slots given back on behalf of processes that died holding
    /// them.
    pub reclaimed: u64,
    /// Counter: dead processes reaped.
    pub reaped_processes: u64,
    /// Counter: nanoseconds during which at least one task waited, in any
    /// process.
    pub stall_ns: u64,
}

/// A snapshot of one scheduler. Before the call set `size` to
/// `sizeof(shmsched_scheduler_stats)`; the library fills at most that many
/// bytes (so a program built against an older, smaller struct keeps
/// working) and sets `size` to the number of bytes it filled.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct shmsched_scheduler_stats {
    /// In: the caller's `sizeof`. Out: the bytes filled.
    pub size: u32,
    /// This level's overall ceiling, `SHMSCHED_UNLIMITED` when none.
    pub concurrency: u32,
    /// Gauge: permits held now (by this scheduler in-process; by this whole
    /// process for a shared one).
    pub running: u64,
    /// Gauge: tasks queued in this scheduler.
    pub pending: u64,
    /// Counter: nanoseconds during which at least one task waited here.
    pub stall_ns: u64,
    /// Roll-up of `queues`.
    pub total: shmsched_queue_stats,
    /// Per priority, index = priority + 3.
    pub queues: [shmsched_queue_stats; 7],
    /// 1 when `region` is filled (a shared scheduler or a child of one), 0
    /// otherwise.
    pub has_region: u32,
    /// Zero.
    pub reserved: u32,
    /// Region-wide figures when `has_region` is 1.
    pub region: shmsched_scheduler_region_stats,
}

// No implicit padding: the struct is copied to C byte by byte.
const _: () = assert!(std::mem::size_of::<shmsched_scheduler_region_stats>() == 4 * 10 + 8 * 3);
const _: () = assert!(
    std::mem::size_of::<shmsched_scheduler_stats>()
        == 4 * 2 + 8 * 3 + 32 * 8 + 4 * 2 + std::mem::size_of::<shmsched_scheduler_region_stats>()
);

impl From<&SchedulerStats> for shmsched_scheduler_stats {
    fn from(s: &SchedulerStats) -> Self {
        let mut queues = [shmsched_queue_stats::default(); 7];
        for (q, src) in queues.iter_mut().zip(s.queues.iter()) {
            *q = src.into();
        }
        let (has_region, region) = match &s.shared {
            Some(r) => (
                1,
                shmsched_scheduler_region_stats {
                    running: r.running,
                    max: r.max,
                    processes: r.processes,
                    waiters: r.waiters,
                    reclaimed: r.reclaimed,
                    reaped_processes: r.reaped_processes,
                    stall_ns: r.stall_ns,
                },
            ),
            None => (0, shmsched_scheduler_region_stats::default()),
        };
        shmsched_scheduler_stats {
            size: 0,
            concurrency: s.concurrency.unwrap_or(SHMSCHED_UNLIMITED),
            running: s.running,
            pending: s.pending,
            stall_ns: s.stall_ns,
            total: (&s.total).into(),
            queues,
            has_region,
            reserved: 0,
            region,
        }
    }
}

/// Fills `*out` with a snapshot of the scheduler's gauges and counters (see
/// `shmsched_scheduler_stats` for the `size` protocol).
///
/// Errors: `NULL_ARGUMENT`, `INVALID_ARGUMENT` (`out->size` below 8),
/// `FORKED`. Threads: any. Fork: see the handle.
///
/// # Safety
///
/// `sched` must be NULL or an open scheduler handle; `out` NULL or valid
/// for reads of its `size` field and writes of `out->size` bytes.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_get_stats(
    sched: *const shmsched_scheduler,
    out: *mut shmsched_scheduler_stats,
) -> shmsched_status {
    ffi! {
        let stats = shmsched_scheduler_stats::from(&try_ref!(sched).usable()?.stats());
        // SAFETY: the caller's contract; the struct has no padding.
        unsafe { face::write_sized(out, stats, |s, n| s.size = n) }
    }
}

/// Writes the scheduler's stats as one JSON object (the serde form of the
/// Rust `SchedulerStats`: `running`, `concurrency`, `pending`, `total`,
/// `queues`, `stall_ns`, `shared`) into `buf`, NUL-terminated, and its
/// length to `*out_len`. Strings out as everywhere: `*out_len` is the length without
/// the NUL; `buf` NULL with `len` 0 asks for it (success); too small:
/// `SHMSCHED_STATUS_BUFFER_TOO_SMALL`, `buf` untouched, `*out_len` written.
///
/// Errors: `NULL_ARGUMENT`, `BUFFER_TOO_SMALL`, `FORKED`. Threads: any.
/// Fork: see the handle.
///
/// # Safety
///
/// `sched` must be NULL or an open scheduler handle; `buf` NULL or valid
/// for `len` bytes; `out_len` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_stats_json(
    sched: *const shmsched_scheduler,
    buf: *mut c_char,
    len: usize,
    out_len: *mut usize,
) -> shmsched_status {
    ffi! {
        let json = serde_json::to_string(&try_ref!(sched).usable()?.stats());
        // SAFETY: the caller's contract.
        unsafe { face::write_json(json, buf, len, out_len) }
    }
}

/// Leaves the region now and closes the handle: frees this process's entry
/// in the region's process table (instead of leaving it to be reaped after
/// the process exits). The handle is closed whatever the status (except
/// `NULL_ARGUMENT`); on failure the process stays in the table: while this
/// process holds permits acquired through the handle (`INVALID_ARGUMENT`;
/// the permits stay valid), when another object of this process is bound
/// to the same region or children of this handle are alive
/// (`INVALID_ARGUMENT`), or in a forked child (`FORKED`).
///
/// Errors: `NULL_ARGUMENT`, `INVALID_ARGUMENT`, `FORKED`, `IO`. Threads:
/// must be the last call on the handle. Fork: see above.
///
/// # Safety
///
/// `sched` must be NULL or an open scheduler handle, not used again.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_detach(
    sched: *mut shmsched_scheduler,
) -> shmsched_status {
    ffi! {
        let h = try_ref!(sched);
        let usable = h.usable().map(|_| ());
        let held = permits::outstanding(sched);
        let raw = if usable.is_ok() { pin::raw_outstanding(h) } else { 0 };
        if usable.is_err() || held > 0 || raw > 0 || !permits::unpin(sched) {
            // SAFETY: `sched` came from Box::into_raw in `make` and the
            // caller does not use it again; permits still refer to it, so
            // it is parked until they are released.
            unsafe { permits::retire(sched) };
            usable?;
            let held = held + raw as usize;
            return Err(Fail::invalid(if held > 0 {
                format!(
                    "cannot detach: this process holds {held} permit(s) acquired through this \
                     handle (one-slot permits: through any handle of its region); the handle \
                     is closed and the process stays in the region's table"
                )
            } else {
                "cannot detach: a release of a one-slot permit of its region is under way; the \
                 handle is closed and the process stays in the region's table"
                    .to_string()
            }));
        }
        // SAFETY: `sched` came from Box::into_raw in `make`, no permit
        // refers to it (checked above; cell tokens reach its pin target,
        // which it left, freeing it if it was the last), and the caller
        // does not use it again.
        let owned = unsafe { Box::from_raw(sched) };
        owned.sched.detach()?
    }
}

/// Closes the handle. Permits acquired through it stay valid and can still
/// be released; the handle's memory is freed once none of them needs it:
/// weighted and child permits need the handle until they are released,
/// one-slot permits of a shared handle only this process's binding of the
/// region (shared by its handles on it), which stays until the last of
/// them is released.
/// Closing NULL does nothing. Does not leave the region's process table
/// (see `shmsched_scheduler_detach`): the entry is reaped after the
/// process exits.
///
/// Threads: must be the last call on the handle (other threads may still
/// release permits acquired through it). Fork: closing an inherited handle
/// in a child is allowed and frees the child's copy.
///
/// # Safety
///
/// `sched` must be NULL or an open scheduler handle, not used again.
#[no_mangle]
pub unsafe extern "C" fn shmsched_scheduler_close(sched: *mut shmsched_scheduler) {
    // SAFETY: the caller's contract: NULL or a handle from `make`, not used
    // again; `retire` parks it until no permit refers to it.
    unsafe { close(sched, |h| permits::retire(h)) }
}
