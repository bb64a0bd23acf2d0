//! The C ABI of shmsched: `libshmsched.so` and `libshmsched.a`, described
//! by `include/shmsched.h` (generated from this crate by cbindgen, see
//! `cbindgen.toml`; a test regenerates it and fails on any difference).
//!
//! A thin face over the `shmsched` library, with no policy of its own:
//! every decision (admission, priorities, crash recovery, validation of the
//! region) is the library's. What this crate adds is what C needs:
//!
//! - **Opaque handles** (`shmsched_region`, `shmsched_scheduler`,
//!   `shmsched_limiter`, `shmsched_fair`) made by `_create`/`_open`/`_shared`/…
//!   calls and freed by `_close`.
//! - **Status codes** ([`status::shmsched_status`], 0 is success) from every
//!   fallible call; outputs are written only on success (one documented
//!   exception: the length needed on `BUFFER_TOO_SMALL`);
//!   `shmsched_strerror(code)` and the thread's
//!   `shmsched_last_error_message(buf, len)`, which holds the same text the
//!   Rust error gives.
//! - **Checked arguments**: NULL pointers, priorities outside -3..=3,
//!   strings that are not UTF-8 and out-of-range values are errors, never
//!   undefined behaviour.
//! - **A panic boundary** around every exported function: a panic becomes
//!   `SHMSCHED_STATUS_INTERNAL` and never unwinds into C.
//!
//! The marshalling (the boundary, the checks of arguments, outputs written
//! only on success, the string and struct outputs) is written once, in
//! [`face`]; every exported function is a few lines over it.
//! - **Permits as checked tokens** ([`permits`]): releasing twice, or
//!   releasing a permit of another process, is an error. A one-slot permit
//!   of a shared root handle is a *cell token* ([`pin`]): its check is the
//!   region cell's own give-back CAS, and the handle is found through a pin
//!   slot with an asymmetric-fence hazard pointer, so its release adds no
//!   read-modify-write to the library's pair; other permits (weighted,
//!   through a child) take an entry of the table.
//! - **Fork awareness** ([`process`]): a handle used in a forked child that
//!   cannot carry over says so (`SHMSCHED_STATUS_FORKED`).
//!
//! Every exported function documents, in the header, its errors, its
//! thread safety and its behaviour across `fork`.

#![allow(non_camel_case_types)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod face;
pub mod fair;
pub mod limiter;
pub mod permits;
pub mod pin;
pub mod process;
pub mod region;
pub mod scheduler;
pub mod status;
pub mod waiter;
pub mod waitset;

use face::boundary;
use status::shmsched_status;

/// The version of this C ABI: the header's declarations and struct layouts.
/// It changes when a signature or a struct changes incompatibly. Compare
/// `shmsched_abi_version()` with this constant of the header you compiled
/// against.
pub const SHMSCHED_ABI_VERSION: u32 = 1;

/// The region layout version this library reads and writes. Opening a
/// region written with another one fails with
/// `SHMSCHED_STATUS_VERSION_MISMATCH`.
pub const SHMSCHED_LAYOUT_VERSION: u32 = 2;

// The header states the layout version as a literal (cbindgen cannot read
// the library's constant); this keeps the two equal.
const _: () = assert!(SHMSCHED_LAYOUT_VERSION == shmsched::region::layout::LAYOUT_VERSION);

/// The scheduling priorities. Higher runs first. Functions take the value
/// as an `int32_t`, so that any integer can be checked:
/// `SHMSCHED_STATUS_INVALID_PRIORITY` outside -3..=3.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum shmsched_priority {
    /// -3
    Lowest = -3,
    /// -2
    Lower = -2,
    /// -1
    Low = -1,
    /// 0, the default.
    Normal = 0,
    /// 1
    High = 1,
    /// 2
    Higher = 2,
    /// 3
    Highest = 3,
}

/// The ABI version of the loaded library (`SHMSCHED_ABI_VERSION` when it
/// was built). A binding checks it once at load time.
///
/// Threads: any. Fork: no state.
#[no_mangle]
pub extern "C" fn shmsched_abi_version() -> u32 {
    SHMSCHED_ABI_VERSION
}

/// The region layout version the loaded library reads and writes.
///
/// Threads: any. Fork: no state.
#[no_mangle]
pub extern "C" fn shmsched_layout_version() -> u32 {
    SHMSCHED_LAYOUT_VERSION
}

/// `CLOCK_MONOTONIC` in milliseconds: the clock the fair-share `_now` calls
/// read, for callers that pass `now_ms` explicitly and want the same scale.
///
/// Threads: any. Fork: no state (the clock is the host's).
#[no_mangle]
pub extern "C" fn shmsched_monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the
    // call; CLOCK_MONOTONIC is supported by every Linux kernel.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1000)
        .saturating_add(ts.tv_nsec as u64 / 1_000_000)
}

/// For the tests of bindings: panics inside the library, which the panic
/// boundary turns into `SHMSCHED_STATUS_INTERNAL` with a message (nothing
/// is printed). Never needed otherwise.
///
/// Errors: `INTERNAL` (always). Threads: any. Fork: no state.
#[no_mangle]
pub extern "C" fn shmsched_debug_panic() -> shmsched_status {
    boundary(|| {
        panic!("shmsched_debug_panic was called (a deliberate panic, to test the boundary)")
    })
}
