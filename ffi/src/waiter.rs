//! The waiting threads of the `_async` callback calls: each pending wait
//! blocks one thread of its own inside the library (so it is a real waiter
//! in the region, queued at its priority like any other), then reports
//! once to the caller's callback. Kept for compatibility; the waitset
//! (`waitset.rs`) waits without a thread per wait.

use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use crate::status::{shmsched_status, Fail};

/// `timeout_ns` meaning "no limit" in the `_async` and `_start` calls.
pub const SHMSCHED_FOREVER: u64 = u64::MAX;

/// Stack of a waiting thread: it only runs the library's wait and the
/// callback (which, for Node, hands over to the main thread).
const STACK: usize = 256 * 1024;

/// The timeout of an `_async` call, `None` for [`SHMSCHED_FOREVER`].
pub(crate) fn timeout(ns: u64) -> Option<Duration> {
    (ns != SHMSCHED_FOREVER).then(|| Duration::from_nanos(ns))
}

/// Starts a waiting thread running `wait`.
pub(crate) fn spawn(wait: impl FnOnce() + Send + 'static) -> Result<(), Fail> {
    std::thread::Builder::new()
        .name("shmsched-wait".into())
        .stack_size(STACK)
        .spawn(wait)
        .map(drop)
        .map_err(|e| {
            Fail::from(shmsched::Error::Io {
                op: "start a waiting thread",
                path: None,
                source: e,
            })
        })
}

/// Calls `callback(status, value, message)` once with the outcome of a
/// wait (computed by `outcome`, with any panic turned into
/// [`shmsched_status::Internal`]); `zero` is the value passed on failure.
pub(crate) fn report<T>(
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
