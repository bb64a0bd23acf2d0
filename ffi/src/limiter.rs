//! `shmsched_limiter`: a byte-rate (token-bucket) budget, shared through a
//! region.

use std::ffi::{c_char, c_void};
use std::time::Duration;

use shmsched::limiter::{Grant, Limiter, LimiterStats};

use crate::face::{
    self, close_box, ffi, new_handle, try_opt_out, try_out, try_priority, try_ref, Handle, Out,
};
use crate::process;
use crate::region::shmsched_region;
use crate::scheduler::shmsched_queue_stats;
use crate::status::{shmsched_status, Fail};
use crate::waiter;

/// A limiter handle (opaque). Made by `shmsched_limiter_shared`, `_attach`
/// or `_child`; closed by `shmsched_limiter_close`.
///
/// Threads: every call may be made from any thread, concurrently (except
/// `_close` and `_detach`, which must be the last call on it). Fork: a
/// handle belongs to the process that made it; in a forked child every
/// call on an inherited handle fails with `SHMSCHED_STATUS_FORKED` (close
/// it there, and make a new one from the region).
pub struct shmsched_limiter {
    lim: Limiter,
    fork_generation: u64,
}

impl Handle for shmsched_limiter {
    type Target = Limiter;
    const AFTER_FORK: &'static str =
        "handle used after fork: a Limiter belongs to the process that created it; in a forked \
         child, create a new one from the Region (shmsched_limiter_shared or \
         shmsched_limiter_attach)";

    #[inline(always)]
    fn parts(&self) -> (u64, &Limiter) {
        (self.fork_generation, &self.lim)
    }
}

/// How a consume went.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct shmsched_grant {
    /// True if it was charged at once, without queueing.
    pub immediate: bool,
    /// True if it left the bucket in debt (the anti-starvation
    /// force-through, or a request larger than the capacity admitted on a
    /// full bucket).
    pub forced: bool,
}

impl From<Grant> for shmsched_grant {
    fn from(g: Grant) -> Self {
        shmsched_grant {
            immediate: g.immediate,
            forced: g.forced,
        }
    }
}

fn make(lim: Limiter, out: Out<*mut shmsched_limiter>) -> Result<(), Fail> {
    let fork_generation = process::fork_generation();
    new_handle(
        out,
        shmsched_limiter {
            lim,
            fork_generation,
        },
    )
}

/// Binds a limiter shared through `region`: one bucket of
/// `tokens_per_second` (1..=2147483647, also the bucket's capacity; a new
/// bucket starts full) for every process that binds it. An existing region
/// must have the same rate (else `SHMSCHED_STATUS_MISMATCH`; use
/// `shmsched_limiter_attach` to join whatever it has).
///
/// Errors: `NULL_ARGUMENT`, `INVALID_ARGUMENT`, `WRONG_KIND`, `MISMATCH`,
/// `VERSION_MISMATCH`, `BAD_REGION`, `PROCESS_TABLE_FULL`, `IO`. Threads:
/// any. Fork: works in a forked child (it registers as its own process).
///
/// # Safety
///
/// `region` must be NULL or an open region handle; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_limiter_shared(
    region: *const shmsched_region,
    tokens_per_second: u64,
    out: *mut *mut shmsched_limiter,
) -> shmsched_status {
    ffi! {
        let (r, out) = (try_ref!(region), try_out!(out));
        make(r.bind(|region| Limiter::shared(region, tokens_per_second))?, out)
    }
}

/// Like `shmsched_limiter_shared`, with a bucket that holds at most
/// `capacity` tokens (its burst, 1..=2147483647) instead of one second of
/// rate. An existing region must have been created with the same rate and
/// capacity (else `SHMSCHED_STATUS_MISMATCH`).
///
/// Errors: as `shmsched_limiter_shared`. Threads: any. Fork: works in a
/// forked child (it registers as its own process).
///
/// # Safety
///
/// `region` must be NULL or an open region handle; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_limiter_shared_with_capacity(
    region: *const shmsched_region,
    tokens_per_second: u64,
    capacity: u64,
    out: *mut *mut shmsched_limiter,
) -> shmsched_status {
    ffi! {
        let (r, out) = (try_ref!(region), try_out!(out));
        let bind = |region: &_| Limiter::shared_with_capacity(region, tokens_per_second, capacity);
        make(r.bind(bind)?, out)
    }
}

/// Joins the limiter already initialised in `region`, whatever its rate.
///
/// Errors: `NULL_ARGUMENT`, `BAD_REGION`, `WRONG_KIND`,
/// `VERSION_MISMATCH`, `PROCESS_TABLE_FULL`, `IO`. Threads: any. Fork:
/// works in a forked child.
///
/// # Safety
///
/// `region` must be NULL or an open region handle; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_limiter_attach(
    region: *const shmsched_region,
    out: *mut *mut shmsched_limiter,
) -> shmsched_status {
    ffi! {
        let (r, out) = (try_ref!(region), try_out!(out));
        make(r.bind(Limiter::attach)?, out)
    }
}

/// A child limiter: its own in-process bucket of `tokens_per_second` on top
/// of `parent`. A consume through it is charged on every level.
///
/// Errors: `NULL_ARGUMENT`, `INVALID_ARGUMENT`, `FORKED`. Threads: any.
/// Fork: belongs to this process, like its parent.
///
/// # Safety
///
/// `parent` must be NULL or an open limiter handle; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_limiter_child(
    parent: *const shmsched_limiter,
    tokens_per_second: u64,
    out: *mut *mut shmsched_limiter,
) -> shmsched_status {
    ffi! {
        let (p, out) = (try_ref!(parent), try_out!(out));
        make(p.usable()?.child(tokens_per_second)?, out)
    }
}

/// Like `shmsched_limiter_child`, with a bucket of at most `capacity`
/// tokens (1..=2147483647).
///
/// Errors: `NULL_ARGUMENT`, `INVALID_ARGUMENT`, `FORKED`. Threads: any.
/// Fork: belongs to this process, like its parent.
///
/// # Safety
///
/// `parent` must be NULL or an open limiter handle; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_limiter_child_with_capacity(
    parent: *const shmsched_limiter,
    tokens_per_second: u64,
    capacity: u64,
    out: *mut *mut shmsched_limiter,
) -> shmsched_status {
    ffi! {
        let (p, out) = (try_ref!(parent), try_out!(out));
        make(p.usable()?.child_with_capacity(tokens_per_second, capacity)?, out)
    }
}

/// Consumes `n` tokens (0..=2147483647) at `priority` (a
/// `SHMSCHED_PRIORITY_*` value), blocking until they are charged. Writes
/// how it went to `*out_grant` if that is not NULL. Higher priorities drain
/// first, across processes; a request larger than the capacity is admitted
/// into debt once the bucket is full.
///
/// Errors: `NULL_ARGUMENT`, `INVALID_ARGUMENT`, `INVALID_PRIORITY`,
/// `FORKED`, `BAD_REGION`. Threads: any; waiting threads sleep. Fork: see
/// the handle.
///
/// # Safety
///
/// `lim` must be NULL or an open limiter handle; `out_grant` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_limiter_consume(
    lim: *const shmsched_limiter,
    n: u64,
    priority: i32,
    out_grant: *mut shmsched_grant,
) -> shmsched_status {
    ffi! {
        let (h, p) = (try_ref!(lim), try_priority!(priority));
        try_opt_out!(out_grant).set(h.usable()?.consume(n, p)?.into());
    }
}

/// Like `shmsched_limiter_consume`, giving up after `timeout_ns`
/// nanoseconds with `SHMSCHED_STATUS_TIMEOUT` (through a child, levels
/// already charged stay charged: tokens can be lost to a timeout, never
/// created).
///
/// Errors: as `shmsched_limiter_consume`, and `TIMEOUT`. Threads: any;
/// waiting threads sleep. Fork: see the handle.
///
/// # Safety
///
/// As `shmsched_limiter_consume`.
#[no_mangle]
pub unsafe extern "C" fn shmsched_limiter_consume_timeout(
    lim: *const shmsched_limiter,
    n: u64,
    priority: i32,
    timeout_ns: u64,
    out_grant: *mut shmsched_grant,
) -> shmsched_status {
    ffi! {
        let (h, p) = (try_ref!(lim), try_priority!(priority));
        let g = h.usable()?.consume_timeout(n, p, Duration::from_nanos(timeout_ns))?;
        try_opt_out!(out_grant).set(g.into());
    }
}

/// The completion of `shmsched_limiter_consume_async`: called exactly once,
/// from a thread of the library. On success `status` is
/// `SHMSCHED_STATUS_OK` and `grant` says how it went; on failure `message`
/// is the error's text (valid only during the call; NULL on success).
pub type shmsched_consume_callback = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        status: shmsched_status,
        grant: shmsched_grant,
        message: *const c_char,
    ),
>;

// The waiting thread reports through this type.
const _: fn(shmsched_consume_callback) -> waiter::Callback<shmsched_grant> = |c| c;

/// Starts a consume of `n` tokens at `priority` that waits on a thread of
/// its own and reports to `callback(ctx, …)` when charged, after
/// `timeout_ns` (`SHMSCHED_FOREVER` for no limit), or on failure. One OS
/// thread per pending wait: for many waits, use a waitset instead
/// (`shmsched_limiter_consume_start`, no thread per wait). Returns
/// `SHMSCHED_STATUS_OK` once the wait started (the callback then runs
/// exactly once); any other status means it did not start.
///
/// Errors (immediate): `NULL_ARGUMENT`, `INVALID_PRIORITY`, `FORKED`,
/// `IO`; through the callback: those of `shmsched_limiter_consume`. Threads: any; the callback
/// runs on another thread. The handle must stay open until the callback
/// has run. Fork: a pending wait does not exist in a forked child.
///
/// # Safety
///
/// `lim` must be NULL or an open limiter handle that stays open until the
/// callback ran; `callback` must be safe to call from any thread with
/// `ctx`.
#[no_mangle]
pub unsafe extern "C" fn shmsched_limiter_consume_async(
    lim: *const shmsched_limiter,
    n: u64,
    priority: i32,
    timeout_ns: u64,
    callback: shmsched_consume_callback,
    ctx: *mut c_void,
) -> shmsched_status {
    ffi! {
        let (h, p) = (try_ref!(lim), try_priority!(priority));
        // SAFETY: the caller's contract: the handle stays open until the
        // callback ran, which may be called from any thread with `ctx`.
        unsafe {
            waiter::start(h, timeout_ns, callback, ctx, move |h, timeout| {
                let g = match timeout {
                    None => h.lim.consume(n, p),
                    Some(t) => h.lim.consume_timeout(n, p, t),
                };
                Ok(g?.into())
            })
        }
    }
}

/// Consumes `n` tokens only if every level holds them now and nothing is
/// queued; never waits, never goes into debt. `SHMSCHED_STATUS_WOULD_BLOCK`
/// when not.
///
/// Errors: `WOULD_BLOCK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT`, `FORKED`.
/// Threads: any. Fork: see the handle.
///
/// # Safety
///
/// `lim` must be NULL or an open limiter handle.
#[no_mangle]
pub unsafe extern "C" fn shmsched_limiter_try_consume(
    lim: *const shmsched_limiter,
    n: u64,
) -> shmsched_status {
    ffi! {
        if !try_ref!(lim).usable()?.try_consume(n)? {
            return Err(Fail::new(
                shmsched_status::WouldBlock,
                "the bucket does not hold the tokens now (or consumes are queued)",
            ));
        }
    }
}

/// Like `shmsched_limiter_try_consume`, counted at `priority` (a
/// `SHMSCHED_PRIORITY_*` value) in the stats' `consumed` counters, and
/// refunded there on a chain that refuses part-way. The rule does not depend
/// on the priority: it refuses while anything is queued at any priority on
/// any level, so it never overtakes a waiter. For a first attempt before a
/// consume at the same priority.
///
/// Errors: `WOULD_BLOCK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT`,
/// `INVALID_PRIORITY`, `FORKED`. Threads: any. Fork: see the handle.
///
/// # Safety
///
/// `lim` must be NULL or an open limiter handle.
#[no_mangle]
pub unsafe extern "C" fn shmsched_limiter_try_consume_at(
    lim: *const shmsched_limiter,
    n: u64,
    priority: i32,
) -> shmsched_status {
    ffi! {
        let (h, p) = (try_ref!(lim), try_priority!(priority));
        if !h.usable()?.try_consume_at(n, p)? {
            return Err(Fail::new(
                shmsched_status::WouldBlock,
                "the bucket does not hold the tokens now (or consumes are queued)",
            ));
        }
    }
}

/// Writes the token balance now (negative while in debt).
///
/// Errors: `NULL_ARGUMENT`, `FORKED`, `BAD_REGION`. Threads: any. Fork: see
/// the handle.
///
/// # Safety
///
/// `lim` must be NULL or an open limiter handle; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_limiter_tokens(
    lim: *const shmsched_limiter,
    out: *mut i64,
) -> shmsched_status {
    ffi! {
        let (h, out) = (try_ref!(lim), try_out!(out));
        out.set(h.usable()?.tokens()?)
    }
}

/// Writes the rate in force (tokens per second; see also
/// `shmsched_limiter_capacity` and `shmsched_limiter_set_rate`).
///
/// Errors: `NULL_ARGUMENT`, `FORKED`. Threads: any. Fork: see the handle.
///
/// # Safety
///
/// `lim` must be NULL or an open limiter handle; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_limiter_tokens_per_second(
    lim: *const shmsched_limiter,
    out: *mut u32,
) -> shmsched_status {
    ffi! {
        let (h, out) = (try_ref!(lim), try_out!(out));
        out.set(h.usable()?.tokens_per_second())
    }
}

/// Writes the capacity (burst) in force, in tokens.
///
/// Errors: `NULL_ARGUMENT`, `FORKED`. Threads: any. Fork: see the handle.
///
/// # Safety
///
/// `lim` must be NULL or an open limiter handle; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_limiter_capacity(
    lim: *const shmsched_limiter,
    out: *mut u32,
) -> shmsched_status {
    ffi! {
        let (h, out) = (try_ref!(lim), try_out!(out));
        out.set(h.usable()?.capacity())
    }
}

/// Changes this level's rate to `tokens_per_second` (1..=2147483647) from
/// now on; for a shared limiter, for every process at once. Tokens already
/// refilled are kept (the bucket's clock is re-based, it does not jump).
///
/// Errors: `NULL_ARGUMENT`, `INVALID_ARGUMENT`, `FORKED`, `BAD_REGION`.
/// Threads: any. Fork: see the handle.
///
/// # Safety
///
/// `lim` must be NULL or an open limiter handle.
#[no_mangle]
pub unsafe extern "C" fn shmsched_limiter_set_rate(
    lim: *const shmsched_limiter,
    tokens_per_second: u64,
) -> shmsched_status {
    ffi!(try_ref!(lim).usable()?.set_rate(tokens_per_second)?)
}

/// Changes this level's capacity (burst) to `capacity` tokens
/// (1..=2147483647) from now on; for a shared limiter, for every process.
///
/// Errors: `NULL_ARGUMENT`, `INVALID_ARGUMENT`, `FORKED`, `BAD_REGION`.
/// Threads: any. Fork: see the handle.
///
/// # Safety
///
/// `lim` must be NULL or an open limiter handle.
#[no_mangle]
pub unsafe extern "C" fn shmsched_limiter_set_capacity(
    lim: *const shmsched_limiter,
    capacity: u64,
) -> shmsched_status {
    ffi!(try_ref!(lim).usable()?.set_capacity(capacity)?)
}

/// Frees the process-table entries of dead processes sharing the region (a
/// dead process holds no tokens; this makes room and corrects the waiter
/// gauges). Writes how many were reaped to `*out_processes` if not NULL.
///
/// Errors: `NULL_ARGUMENT`, `FORKED`, `BAD_REGION`, `IO`. Threads: any.
/// Fork: see the handle.
///
/// # Safety
///
/// `lim` must be NULL or an open limiter handle; `out_processes` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_limiter_reap(
    lim: *const shmsched_limiter,
    out_processes: *mut u32,
) -> shmsched_status {
    ffi! {
        let n = try_ref!(lim).usable()?.reap()?;
        try_opt_out!(out_processes).set(n);
    }
}

/// One priority's queue in a limiter.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct shmsched_limiter_queue_stats {
    /// Gauge: consumes queued now.
    pub count: u64,
    /// Counter: consumes ever queued.
    pub deferred: u64,
    /// Counter: consumes that ever left the queue (charged or cancelled).
    pub completed: u64,
    /// Counter: the part of `completed` that was cancelled.
    pub cancelled: u64,
    /// Gauge: consecutive ~100 ms ticks this priority's front has been
    /// blocked on tokens (forced through at 10).
    pub stall: u64,
}

/// What a limiter's region knows about everyone sharing it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct shmsched_limiter_region_stats {
    /// Counter: force-throughs into debt by all processes.
    pub forced: u64,
    /// Gauge: consumes waiting in live processes, per priority (index =
    /// priority + 3).
    pub waiters: [u64; 7],
    /// Gauge: processes attached and alive.
    pub processes: u32,
    /// 1 if the region's clock is a calibrated TSC, 0 for
    /// `CLOCK_MONOTONIC`.
    pub tsc_clock: u32,
    /// Counter: nanoseconds during which at least one consume waited, in
    /// any process.
    pub stall_ns: u64,
    /// Counter: futex wake-ups that found a thread asleep.
    pub wakes: u64,
    /// Counter: tokens charged at the root per priority (index = priority
    /// + 3), by all processes.
    pub consumed: [u64; 7],
    /// Counter: tokens refunded to the root per priority, by all processes
    /// (`consumed - refunded` is what the region's consumers kept).
    pub refunded: [u64; 7],
}

/// A snapshot of one limiter level. Before the call set `size` to
/// `sizeof(shmsched_limiter_stats)`; on return it holds the bytes filled.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct shmsched_limiter_stats {
    /// In: the caller's `sizeof`. Out: the bytes filled.
    pub size: u32,
    /// The configured rate, also the capacity.
    pub tokens_per_second: u32,
    /// Gauge: the balance now, negative while in debt.
    pub tokens: i64,
    /// Gauge: consumes queued in this limiter.
    pub pending: u64,
    /// Counter: force-throughs by this handle.
    pub forced: u64,
    /// Counter: tokens ever refilled since the bucket's creation;
    /// `clock + tokens_per_second - tokens` bounds everything ever consumed.
    pub clock: u64,
    /// Counter: nanoseconds during which at least one consume waited here.
    pub stall_ns: u64,
    /// Roll-up of `queues` (`stall` not summed).
    pub total: shmsched_queue_stats,
    /// Per priority, index = priority + 3.
    pub queues: [shmsched_limiter_queue_stats; 7],
    /// 1 when `region` is filled (a shared limiter), 0 otherwise.
    pub has_region: u32,
    /// Zero.
    pub reserved: u32,
    /// Region-wide figures when `has_region` is 1.
    pub region: shmsched_limiter_region_stats,
    // Fields added after the first release go here, at the end (the `size`
    // protocol: an older caller gets the prefix it knows).
    /// Counter: tokens charged per priority (index = priority + 3) through
    /// this handle at this level: at once, after waiting, forced through,
    /// or by `try_consume` (which counts at Normal, index 3).
    pub consumed: [u64; 7],
    /// Counter: tokens given back per priority through this handle at this
    /// level (a consume that gave up after this level charged it, a
    /// waitset completion cancelled before it was taken).
    /// `Δ(consumed - refunded) / Δt` is the rate a priority achieved.
    pub refunded: [u64; 7],
}

const _: () = assert!(
    std::mem::size_of::<shmsched_limiter_region_stats>() == 8 * 8 + 4 * 2 + 8 * 2 + 8 * 7 * 2
);
const _: () = assert!(
    std::mem::size_of::<shmsched_limiter_stats>()
        == 4 * 2
            + 8 * 5
            + 32
            + 40 * 7
            + 4 * 2
            + std::mem::size_of::<shmsched_limiter_region_stats>()
            + 8 * 7 * 2
);

impl From<&LimiterStats> for shmsched_limiter_stats {
    fn from(s: &LimiterStats) -> Self {
        let mut queues = [shmsched_limiter_queue_stats::default(); 7];
        for (q, src) in queues.iter_mut().zip(s.queues.iter()) {
            *q = shmsched_limiter_queue_stats {
                count: src.count,
                deferred: src.deferred,
                completed: src.completed,
                cancelled: src.cancelled,
                stall: src.stall,
            };
        }
        let (has_region, region) = match &s.shared {
            Some(r) => (
                1,
                shmsched_limiter_region_stats {
                    forced: r.forced,
                    waiters: r.waiters,
                    processes: r.processes,
                    tsc_clock: u32::from(r.tsc.is_some()),
                    stall_ns: r.stall_ns,
                    wakes: r.wakes,
                    consumed: r.consumed,
                    refunded: r.refunded,
                },
            ),
            None => (0, shmsched_limiter_region_stats::default()),
        };
        shmsched_limiter_stats {
            size: 0,
            tokens_per_second: s.tokens_per_second,
            tokens: s.tokens,
            pending: s.pending,
            forced: s.forced,
            clock: s.clock,
            stall_ns: s.stall_ns,
            total: (&s.total).into(),
            queues,
            has_region,
            reserved: 0,
            region,
            consumed: s.queues.map(|q| q.consumed),
            refunded: s.queues.map(|q| q.refunded),
        }
    }
}

/// Fills `*out` with a snapshot of this level's gauges and counters (see
/// `shmsched_limiter_stats` for the `size` protocol).
///
/// Errors: `NULL_ARGUMENT`, `INVALID_ARGUMENT` (`out->size` below 8),
/// `FORKED`. Threads: any. Fork: see the handle.
///
/// # Safety
///
/// `lim` must be NULL or an open limiter handle; `out` NULL or valid for
/// reads of its `size` field and writes of `out->size` bytes.
#[no_mangle]
pub unsafe extern "C" fn shmsched_limiter_get_stats(
    lim: *const shmsched_limiter,
    out: *mut shmsched_limiter_stats,
) -> shmsched_status {
    ffi! {
        let stats = shmsched_limiter_stats::from(&try_ref!(lim).usable()?.stats());
        // SAFETY: the caller's contract; the struct has no padding.
        unsafe { face::write_sized(out, stats, |s, n| s.size = n) }
    }
}

/// Writes this level's stats as one JSON object (the serde form of the Rust
/// `LimiterStats`) into `buf`, NUL-terminated, and its length to
/// `*out_len`. Strings out as everywhere: `*out_len` is the length without
/// the NUL; `buf` NULL with `len` 0 asks for it (success); too small:
/// `SHMSCHED_STATUS_BUFFER_TOO_SMALL`, `buf` untouched, `*out_len` written.
///
/// Errors: `NULL_ARGUMENT`, `BUFFER_TOO_SMALL`, `FORKED`. Threads: any.
/// Fork: see the handle.
///
/// # Safety
///
/// `lim` must be NULL or an open limiter handle; `buf` NULL or valid for
/// `len` bytes; `out_len` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_limiter_stats_json(
    lim: *const shmsched_limiter,
    buf: *mut c_char,
    len: usize,
    out_len: *mut usize,
) -> shmsched_status {
    ffi! {
        let json = serde_json::to_string(&try_ref!(lim).usable()?.stats());
        // SAFETY: the caller's contract.
        unsafe { face::write_json(json, buf, len, out_len) }
    }
}

/// Leaves the region now and closes the handle (frees this process's
/// process-table entry). The handle is closed whatever the status (except
/// `NULL_ARGUMENT`); on failure the process stays in the table: when
/// children or other objects of this process bound to the same region are
/// alive (`INVALID_ARGUMENT`), or in a forked child (`FORKED`).
///
/// Errors: `NULL_ARGUMENT`, `INVALID_ARGUMENT`, `FORKED`, `IO`. Threads:
/// must be the last call on the handle. Fork: see above.
///
/// # Safety
///
/// `lim` must be NULL or an open limiter handle, not used again.
#[no_mangle]
pub unsafe extern "C" fn shmsched_limiter_detach(lim: *mut shmsched_limiter) -> shmsched_status {
    ffi! {
        try_ref!(lim);
        // SAFETY: `lim` came from Box::into_raw in `make` and the caller
        // does not use it again.
        let owned = unsafe { Box::from_raw(lim) };
        owned.usable()?;
        owned.lim.detach()?
    }
}

/// Closes the handle. NULL does nothing. Does not leave the region's
/// process table (see `shmsched_limiter_detach`).
///
/// Threads: must be the last call on the handle. Fork: closing an inherited
/// handle in a child frees the child's copy.
///
/// # Safety
///
/// `lim` must be NULL or an open limiter handle, not used again.
#[no_mangle]
pub unsafe extern "C" fn shmsched_limiter_close(lim: *mut shmsched_limiter) {
    // SAFETY: the caller's contract: NULL or a handle from `make`, not used
    // again.
    unsafe { close_box(lim) }
}
