//! The waiting threads of the `_async` callback calls: each pending wait
//! blocks one thread of its own inside the library (so it is a real waiter
//! in the region, queued at its priority like any other), then reports
//! once to the caller's callback. Kept for compatibility; the waitset
//! (`waitset.rs`) waits without a thread per wait.

use std::ffi::{c_char, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use crate::face::Handle;
use crate::status::{shmsched_status, Fail};

/// `timeout_ns` meaning "no limit" in the `_async` and `_start` calls.
pub const SHMSCHED_FOREVER: u64 = u64::MAX;

/// Stack of a waiting thread: it only runs the library's wait and the
/// callback (which, for Node, hands over to the main thread).
const STACK: usize = 256 * 1024;

/// The timeout of an `_async` call, `None` for [`SHMSCHED_FOREVER`].
fn timeout(ns: u64) -> Option<Duration> {
    (ns != SHMSCHED_FOREVER).then(|| Duration::from_nanos(ns))
}

/// The completion callback of an `_async` call, with the value `T` it
/// reports (`shmsched_acquire_callback`, `shmsched_consume_callback`).
pub(crate) type Callback<T> =
    Option<unsafe extern "C" fn(*mut c_void, shmsched_status, T, *const c_char)>;

/// The handle and the context of an `_async` call, carried to its thread.
struct Carried<H>(*const H, *mut c_void);

// SAFETY: the pointers are the caller's (a handle that stays open until the
// callback ran, and an opaque context), passed to another thread as the C
// contract of the `_async` calls allows.
unsafe impl<H> Send for Carried<H> {}

/// Starts the wait of an `_async` call: checks `callback` (NULL:
/// `NULL_ARGUMENT`) and that `h` is this process's, then runs `wait(h,
/// timeout)` on a thread of its own, and calls `callback(ctx, …)` once with
/// its outcome (`T::default()` on failure).
///
/// # Safety
///
/// `h` must stay open until the callback has run; `callback` must be safe
/// to call from any thread with `ctx`.
pub(crate) unsafe fn start<H: Handle + Sync + 'static, T: Default + 'static>(
    h: &H,
    timeout_ns: u64,
    callback: Callback<T>,
    ctx: *mut c_void,
    wait: impl FnOnce(&H, Option<Duration>) -> Result<T, Fail> + Send + 'static,
) -> Result<(), Fail> {
    let cb = callback.ok_or_else(|| Fail::null("callback"))?;
    h.usable()?;
    let carried = Carried(h as *const H, ctx);
    std::thread::Builder::new()
        .name("shmsched-wait".into())
        .stack_size(STACK)
        .spawn(move || {
            let carried = carried;
            // SAFETY: the caller keeps the handle open until the callback ran.
            let h = unsafe { &*carried.0 };
            report(
                || wait(h, timeout(timeout_ns)),
                T::default(),
                // SAFETY: the caller's callback contract.
                |status, value, msg| unsafe { cb(carried.1, status, value, msg) },
            );
        })
        .map(drop)
        .map_err(|e| Fail::io("start a waiting thread", e))
}

/// Calls `callback(status, value, message)` once with the outcome of a
/// wait (computed by `outcome`, with any panic turned into
/// [`shmsched_status::Internal`]); `zero` is the value passed on failure.
fn report<T>(
    outcome: impl FnOnce() -> Result<T, Fail>,
    zero: T,
    callback: impl FnOnce(shmsched_status, T, *const c_char),
) {
    let outcome = catch_unwind(AssertUnwindSafe(outcome)).unwrap_or_else(|_| {
        Err(Fail::new(
            shmsched_status::Internal,
            "internal error: the library panicked in a waiting thread",
        ))
    });
    match outcome {
        Ok(v) => callback(shmsched_status::Ok, v, std::ptr::null()),
        Err(fail) => {
            let text = CString::new(fail.message.replace('\0', " ")).unwrap_or_default();
            callback(fail.status, zero, text.as_ptr());
        }
    }
}
