//! `shmsched_fair`: a fair-share ceiling split between weighted tenants,
//! shared through a region. Every call takes an explicit `now` in
//! milliseconds (a recorded trace replays exactly), or reads
//! `CLOCK_MONOTONIC` under the ledger's lock in its `_now` variant.

use std::ffi::c_char;
use std::sync::{Mutex, MutexGuard};

use shmsched::fair::{
    FairConfig, FairShare, RefusalReason, SharedFairShare, DEFAULT_LEASE_CAPACITY,
};

use crate::face::{self, close_box, ffi, new_handle, try_opt_out, try_out, try_ref, try_text, Out};
use crate::region::shmsched_region;
use crate::status::{shmsched_status, Fail};

/// A fair-share handle (opaque). Made by `shmsched_fair_shared` or
/// `shmsched_fair_attach`; closed by `shmsched_fair_close`.
///
/// Threads: every call may be made from any thread; calls on one handle
/// are serialised by a lock of the handle (and every call, in any process,
/// by the ledger's robust process-shared mutex). Fork: a handle works in a
/// forked child, where its leases are the child's own (each lease records
/// the process that took it); do not fork while another thread is inside a
/// call on the same handle.
pub struct shmsched_fair {
    fair: Mutex<SharedFairShare>,
}

impl shmsched_fair {
    fn lock(&self) -> MutexGuard<'_, SharedFairShare> {
        // A panic inside a call left the Rust handle as it was (the ledger
        // itself commits or not, atomically), so a poisoned lock is usable.
        self.fair.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Why a fair-share acquire was refused (`reason` of
/// `shmsched_fair_outcome`); `shmsched_refusal_reason_name` gives the
/// seed's names.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum shmsched_refusal_reason {
    /// Granted: no refusal.
    None = 0,
    /// The request needs borrowed units and `hold_ms` exceeds the reclaim
    /// horizon.
    HoldExceedsReclaimHorizon = 1,
    /// The request fits the tenant's guarantee, but part of it is on loan.
    GuaranteeOnLoan = 2,
    /// The request needs borrowed units and idle lenders cannot cover them.
    NoLendableCapacity = 3,
    /// The charge is larger than the whole ceiling.
    ExceedsCeiling = 4,
}

fn reason_code(r: RefusalReason) -> shmsched_refusal_reason {
    match r {
        RefusalReason::HoldExceedsReclaimHorizon => {
            shmsched_refusal_reason::HoldExceedsReclaimHorizon
        }
        RefusalReason::GuaranteeOnLoan => shmsched_refusal_reason::GuaranteeOnLoan,
        RefusalReason::NoLendableCapacity => shmsched_refusal_reason::NoLendableCapacity,
        RefusalReason::ExceedsCeiling => shmsched_refusal_reason::ExceedsCeiling,
    }
}

/// The seed's name of a refusal reason (`"guarantee_on_loan"`, …), `"none"`
/// for `SHMSCHED_REFUSAL_REASON_NONE`, `"unknown"` for any other value. A
/// static string; never NULL.
///
/// Threads: any. Fork: no state.
#[no_mangle]
pub extern "C" fn shmsched_refusal_reason_name(reason: u32) -> *const c_char {
    let s: &'static std::ffi::CStr = match reason {
        0 => c"none",
        1 => c"hold_exceeds_reclaim_horizon",
        2 => c"guarantee_on_loan",
        3 => c"no_lendable_capacity",
        4 => c"exceeds_ceiling",
        _ => c"unknown",
    };
    s.as_ptr()
}

/// The longest lease id, in bytes with its NUL: a tenant id (at most 32
/// bytes) followed by a decimal counter.
pub const SHMSCHED_LEASE_ID_MAX: usize = 64;

/// The answer to a fair-share acquire: a lease, or a refusal (an answer,
/// not an error: the call returns `SHMSCHED_STATUS_OK` either way).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct shmsched_fair_outcome {
    /// True if granted: `lease_id` and `deadline_ms` are set.
    pub granted: bool,
    /// When refused, a `SHMSCHED_REFUSAL_REASON_*` value; else 0.
    pub reason: u32,
    /// When refused, the ms after `now` at which retrying unchanged can
    /// succeed, or -1 when no time can be promised.
    pub retry_after_ms: i64,
    /// When granted, `now + hold_ms`: the declared release deadline.
    pub deadline_ms: u64,
    /// When granted, the lease id (NUL-terminated) to release it by.
    pub lease_id: [c_char; SHMSCHED_LEASE_ID_MAX],
}

fn lease_id(id: &str) -> Result<[c_char; SHMSCHED_LEASE_ID_MAX], Fail> {
    if id.len() >= SHMSCHED_LEASE_ID_MAX {
        return Err(Fail::new(
            shmsched_status::Internal,
            format!("lease id {id:?} is longer than {SHMSCHED_LEASE_ID_MAX} bytes"),
        ));
    }
    let mut out = [0 as c_char; SHMSCHED_LEASE_ID_MAX];
    for (o, b) in out.iter_mut().zip(id.bytes()) {
        *o = b as c_char;
    }
    Ok(out)
}

/// Binds a fair-share ledger in `region` with the configuration
/// `config_json` (the JSON of the Rust `FairConfig`: `ceiling`,
/// `fairness_unit` ("cost" or "requests"), `tenants` ([{"id","weight"}]),
/// `reclaim_horizon_ms`, `idle_after_ms`, `started_at_ms`) and
/// `lease_capacity` lease slots (0 for the default 4096). A new region is
/// initialised with it; an existing one must hold the same (else
/// `SHMSCHED_STATUS_MISMATCH`, naming what differs).
///
/// Errors: `NULL_ARGUMENT`, `INVALID_ARGUMENT` (the message names the bad
/// value), `WRONG_KIND`, `MISMATCH`, `VERSION_MISMATCH`, `BAD_REGION`,
/// `PROCESS_TABLE_FULL`, `IO`. Threads: any. Fork: works in a child.
///
/// # Safety
///
/// `region` must be NULL or an open region handle; `config_json` NULL or a
/// NUL-terminated string; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_fair_shared(
    region: *const shmsched_region,
    config_json: *const c_char,
    lease_capacity: u32,
    out: *mut *mut shmsched_fair,
) -> shmsched_status {
    ffi! {
        let (r, json, out) = (try_ref!(region), try_text!(config_json), try_out!(out));
        let cfg = FairConfig::from_json(json)?;
        let cap = if lease_capacity == 0 {
            DEFAULT_LEASE_CAPACITY
        } else {
            lease_capacity as usize
        };
        make(r.bind(|region| FairShare::shared_with_capacity(region, &cfg, cap))?, out)
    }
}

/// Joins the fair-share ledger stored in `region`, whatever its
/// configuration.
///
/// Errors: `NULL_ARGUMENT`, `BAD_REGION` (not initialised), `WRONG_KIND`,
/// `VERSION_MISMATCH`, `PROCESS_TABLE_FULL`, `IO`. Threads: any. Fork:
/// works in a child.
///
/// # Safety
///
/// `region` must be NULL or an open region handle; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_fair_attach(
    region: *const shmsched_region,
    out: *mut *mut shmsched_fair,
) -> shmsched_status {
    ffi! {
        let (r, out) = (try_ref!(region), try_out!(out));
        make(r.bind(FairShare::attach)?, out)
    }
}

fn make(fair: SharedFairShare, out: Out<*mut shmsched_fair>) -> Result<(), Fail> {
    let fair = Mutex::new(fair);
    new_handle(out, shmsched_fair { fair })
}

/// The two acquires (`now_ms` None: at the clock), once `fair`, `tenant`
/// and `out` are checked.
///
/// # Safety
///
/// `explanation` must be NULL or valid for `explanation_len` bytes.
#[allow(clippy::too_many_arguments)]
unsafe fn acquire_at(
    h: &shmsched_fair,
    tenant: &str,
    cost: f64,
    hold_ms: u64,
    now_ms: Option<u64>,
    out: Out<shmsched_fair_outcome>,
    explanation: *mut c_char,
    explanation_len: usize,
) -> Result<(), Fail> {
    let answer = {
        let mut f = h.lock();
        match now_ms {
            Some(now) => f.acquire(tenant, cost, hold_ms, now),
            None => f.acquire_now(tenant, cost, hold_ms),
        }
    }?;
    let outcome = match answer {
        Ok(lease) => shmsched_fair_outcome {
            granted: true,
            reason: shmsched_refusal_reason::None as u32,
            retry_after_ms: -1,
            deadline_ms: lease.deadline_ms,
            lease_id: lease_id(&lease.id)?,
        },
        Err(refusal) => {
            // SAFETY: `explanation` is NULL or valid for `explanation_len`
            // bytes (the contract).
            unsafe { face::cut_into_raw(&refusal.explanation, explanation, explanation_len) };
            shmsched_fair_outcome {
                granted: false,
                reason: reason_code(refusal.reason) as u32,
                retry_after_ms: refusal
                    .retry_after_ms
                    .map_or(-1, |ms| i64::try_from(ms).unwrap_or(i64::MAX)),
                deadline_ms: 0,
                lease_id: [0; SHMSCHED_LEASE_ID_MAX],
            }
        }
    };
    out.set(outcome);
    Ok(())
}

/// Asks for `cost` (charged in the fairness unit) held for `hold_ms` on
/// behalf of `tenant` at `now_ms`. Writes a lease or a refusal to `*out`;
/// on a refusal, also writes the explanation (a full sentence with the
/// numbers) to `explanation` if it is not NULL, cut to
/// `explanation_len - 1` bytes and NUL-terminated.
///
/// Errors (misuse changes nothing): `NULL_ARGUMENT`, `UNKNOWN_TENANT`,
/// `INVALID_ARGUMENT` (bad cost, `hold_ms` 0),
/// `CAPACITY_EXHAUSTED`, `BAD_REGION`. Threads: any. Fork: works in a
/// child (the lease is the child's).
///
/// # Safety
///
/// `fair` must be NULL or an open fair-share handle; `tenant` NULL or a
/// NUL-terminated string; `out` NULL or writable; `explanation` NULL or
/// valid for `explanation_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn shmsched_fair_acquire(
    fair: *const shmsched_fair,
    tenant: *const c_char,
    cost: f64,
    hold_ms: u64,
    now_ms: u64,
    out: *mut shmsched_fair_outcome,
    explanation: *mut c_char,
    explanation_len: usize,
) -> shmsched_status {
    ffi! {
        let (h, tenant, out) = (try_ref!(fair), try_text!(tenant), try_out!(out));
        let (e, e_len) = (explanation, explanation_len);
        // SAFETY: the caller's contract on `explanation`.
        unsafe { acquire_at(h, tenant, cost, hold_ms, Some(now_ms), out, e, e_len) }
    }
}

/// `shmsched_fair_acquire` at `CLOCK_MONOTONIC` milliseconds, read under
/// the ledger's lock (so concurrent processes never go backwards). Do not
/// mix with explicit times on another scale in one region.
///
/// Errors: as `shmsched_fair_acquire`. Threads: any. Fork: works in a
/// child (the lease is the child's).
///
/// # Safety
///
/// As `shmsched_fair_acquire`.
#[no_mangle]
pub unsafe extern "C" fn shmsched_fair_acquire_now(
    fair: *const shmsched_fair,
    tenant: *const c_char,
    cost: f64,
    hold_ms: u64,
    out: *mut shmsched_fair_outcome,
    explanation: *mut c_char,
    explanation_len: usize,
) -> shmsched_status {
    ffi! {
        let (h, tenant, out) = (try_ref!(fair), try_text!(tenant), try_out!(out));
        let (e, e_len) = (explanation, explanation_len);
        // SAFETY: the caller's contract on `explanation`.
        unsafe { acquire_at(h, tenant, cost, hold_ms, None, out, e, e_len) }
    }
}

/// Releases the lease `lease_id` at `now_ms`.
///
/// Errors: `NULL_ARGUMENT`, `UNKNOWN_LEASE`, `ALREADY_RELEASED`,
/// `BAD_REGION`. Threads: any. Fork: any process
/// may release any lease by id (leases are the ledger's, not a process's).
///
/// # Safety
///
/// `fair` must be NULL or an open fair-share handle; `lease_id` NULL or a
/// NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn shmsched_fair_release(
    fair: *const shmsched_fair,
    lease_id: *const c_char,
    now_ms: u64,
) -> shmsched_status {
    ffi! {
        let (h, id) = (try_ref!(fair), try_text!(lease_id));
        h.lock().release(id, now_ms)?
    }
}

/// `shmsched_fair_release` at the clock, read under the ledger's lock.
///
/// Errors: as `shmsched_fair_release`. Threads: any. Fork: works in a
/// child.
///
/// # Safety
///
/// As `shmsched_fair_release`.
#[no_mangle]
pub unsafe extern "C" fn shmsched_fair_release_now(
    fair: *const shmsched_fair,
    lease_id: *const c_char,
) -> shmsched_status {
    ffi! {
        let (h, id) = (try_ref!(fair), try_text!(lease_id));
        h.lock().release_now(id)?
    }
}

/// Writes the ledger's stats at `now_ms` as JSON text (per tenant:
/// guarantee, held, borrowed, lent, want, deficit_unit_ms,
/// worst_reclaim_ms, leases, reaped_leases; and the overrun leases) into
/// `buf`, NUL-terminated, and its length to `*out_len`. Strings out as everywhere: `*out_len` is the length without
/// the NUL; `buf` NULL with `len` 0 asks for it (success); too small:
/// `SHMSCHED_STATUS_BUFFER_TOO_SMALL`, `buf` untouched, `*out_len` written.
/// (A call that only sized or did not fit still counted as a stats call at
/// `now_ms`.)
///
/// Errors: `NULL_ARGUMENT`, `BUFFER_TOO_SMALL`, `BAD_REGION`. Threads: any. Fork: works in a child.
///
/// # Safety
///
/// `fair` must be NULL or an open fair-share handle; `buf` NULL or valid
/// for `len` bytes; `out_len` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_fair_stats_json(
    fair: *const shmsched_fair,
    now_ms: u64,
    buf: *mut c_char,
    len: usize,
    out_len: *mut usize,
) -> shmsched_status {
    ffi! {
        let stats = try_ref!(fair).lock().stats(now_ms)?;
        let json = serde_json::to_string(&stats);
        // SAFETY: the caller's contract.
        unsafe { face::write_json(json, buf, len, out_len) }
    }
}

/// `shmsched_fair_stats_json` at the clock, read under the ledger's lock.
///
/// Errors: as `shmsched_fair_stats_json`. Threads: any. Fork: works in a
/// child.
///
/// # Safety
///
/// As `shmsched_fair_stats_json`.
#[no_mangle]
pub unsafe extern "C" fn shmsched_fair_stats_json_now(
    fair: *const shmsched_fair,
    buf: *mut c_char,
    len: usize,
    out_len: *mut usize,
) -> shmsched_status {
    ffi! {
        let stats = try_ref!(fair).lock().stats_now()?;
        let json = serde_json::to_string(&stats);
        // SAFETY: the caller's contract.
        unsafe { face::write_json(json, buf, len, out_len) }
    }
}

/// Releases the leases of dead processes now (also done by itself on the
/// acquire path when capacity is short). Writes the processes reaped and
/// the leases released to the optional outputs.
///
/// Errors: `NULL_ARGUMENT`, `BAD_REGION`, `IO`. Threads: any. Fork: works
/// in a child.
///
/// # Safety
///
/// `fair` must be NULL or an open fair-share handle; each output NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn shmsched_fair_reap(
    fair: *const shmsched_fair,
    out_processes: *mut u32,
    out_leases: *mut u64,
) -> shmsched_status {
    ffi! {
        let r = try_ref!(fair).lock().reap()?;
        try_opt_out!(out_processes).set(r.processes);
        try_opt_out!(out_leases).set(r.leases);
    }
}

/// Closes the handle. Leases taken through it stay in the ledger until
/// released (by id, through any handle) or reaped after this process
/// exits. NULL does nothing.
///
/// Threads: must be the last call on the handle. Fork: closing in a child
/// frees the child's copy.
///
/// # Safety
///
/// `fair` must be NULL or an open fair-share handle, not used again.
#[no_mangle]
pub unsafe extern "C" fn shmsched_fair_close(fair: *mut shmsched_fair) {
    // SAFETY: the caller's contract: NULL or a handle from `make`, not used
    // again.
    unsafe { close_box(fair) }
}
