//! Status codes, the thread's last error message, and the panic boundary.
//!
//! Every fallible function of the C ABI returns a [`shmsched_status`]; `0`
//! ([`shmsched_status::Ok`]) is success. A failure also leaves a message in
//! a thread-local buffer ([`shmsched_last_error_message`]): the `Display`
//! text of the library's error (the same sentence a Rust caller sees), or
//! the C layer's own sentence for what only the C layer checks (NULL
//! pointers, permits, buffers).
//!
//! Inside the crate, functions compute a `Result<_, Fail>` and the exported
//! wrapper turns it into a status through the boundary of [`crate::face`],
//! which also catches any panic: a panic never unwinds into C (that would
//! be undefined behaviour); it becomes [`shmsched_status::Internal`].
//!
//! Panics are silent: this library (a cdylib or staticlib with its own copy
//! of std, so its panic hook is its own) installs a hook that prints
//! nothing and keeps the panic's message and location for the thread; the
//! boundary puts them in the last error message. Nothing reaches the host
//! program's stderr.

use std::borrow::Cow;
use std::cell::RefCell;
use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

use shmsched::fair::FairError;
use shmsched::Error;

use crate::face::cut_into_raw;

/// The result of every fallible call. `SHMSCHED_STATUS_OK` (0) is success;
/// every other value is a failure whose text is available from
/// `shmsched_last_error_message` on the same thread, and whose generic
/// description is `shmsched_strerror(code)`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum shmsched_status {
    /// Success.
    Ok = 0,
    /// A required pointer argument (a handle, a name, an output) was NULL.
    NullArgument = 1,
    /// An argument was out of range or malformed (a rate of 0, a mode with
    /// world-write, a name that is not UTF-8, …); the message names the
    /// value and the limit.
    InvalidArgument = 2,
    /// A priority outside `SHMSCHED_PRIORITY_LOWEST..=SHMSCHED_PRIORITY_HIGHEST`
    /// (-3..=3).
    InvalidPriority = 3,
    /// The region file does not exist.
    NotFound = 4,
    /// The region file already exists (`shmsched_region_create`).
    AlreadyExists = 5,
    /// Another operating-system error (permissions, no memory, not a
    /// regular file, …); the message names the operation and the file.
    Io = 6,
    /// The region's contents are not a valid shmsched region (bad magic,
    /// scribbled header, wrong size, not initialised, …).
    BadRegion = 7,
    /// The region was written with another layout version than the one
    /// this library reads (`shmsched_layout_version()`).
    VersionMismatch = 8,
    /// The region holds another kind of object (a limiter where a
    /// scheduler was asked for, …).
    WrongKind = 9,
    /// The region holds the same kind of object with other parameters (for
    /// example another `max`); use the `_attach` call to join whatever it
    /// holds.
    Mismatch = 10,
    /// The region's process table is full.
    ProcessTableFull = 11,
    /// The scheduler's concurrency is 0: nothing can ever be admitted, so a
    /// blocking call fails at once instead of hanging.
    ZeroConcurrency = 12,
    /// The scheduler was disposed (or its parent was).
    Disposed = 13,
    /// A timed wait expired; nothing was taken.
    Timeout = 14,
    /// A `try_` call found no capacity now; nothing was taken. Not an
    /// error so much as an answer.
    WouldBlock = 15,
    /// A scheduler or limiter handle was used in a process forked from the
    /// one that created it; create a new one from the region in the child.
    Forked = 16,
    /// The permit (or fair-share lease) was already released, or was never
    /// issued.
    AlreadyReleased = 17,
    /// The permit belongs to another process (for example one inherited
    /// across `fork`, or received through a pipe); only its owner can
    /// release it.
    ForeignPermit = 18,
    /// The caller's buffer is too small; `*out_len` holds the length needed
    /// (without the NUL: the buffer needs one byte more).
    BufferTooSmall = 19,
    /// A fair-share call named a tenant that is not configured.
    UnknownTenant = 20,
    /// A fair-share release named a lease id that was never issued.
    UnknownLease = 21,
    /// Retired: no call returns it any more (a shared ledger takes a `now`
    /// earlier than its last accepted one as that one, so time never goes
    /// back in a region). The code stays, so that no other status moves.
    TimeWentBackwards = 22,
    /// A fixed-capacity table is full (the fair-share lease table, or the
    /// permits this process holds through the C ABI).
    CapacityExhausted = 23,
    /// A panic inside the library was caught at the C boundary, or the
    /// library reported an error this ABI version has no code for. The
    /// message says which. Please report it.
    Internal = 24,
    /// A wait of a waitset was cancelled (`shmsched_waitset_cancel`);
    /// nothing is held.
    Cancelled = 25,
}

/// The largest status code this ABI version defines.
#[cfg(test)]
pub(crate) const SHMSCHED_STATUS_MAX: u32 = shmsched_status::Cancelled as u32;

impl shmsched_status {
    /// The generic, static description of a status code.
    pub(crate) fn describe(code: u32) -> &'static std::ffi::CStr {
        use shmsched_status as S;
        let all: [(S, &'static std::ffi::CStr); 26] = [
            (S::Ok, c"success"),
            (S::NullArgument, c"a required pointer argument was NULL"),
            (
                S::InvalidArgument,
                c"an argument was out of range or malformed",
            ),
            (S::InvalidPriority, c"the priority is not one of -3..=3"),
            (S::NotFound, c"the region file does not exist"),
            (S::AlreadyExists, c"the region file already exists"),
            (S::Io, c"an operating-system call failed"),
            (S::BadRegion, c"the region is not a valid shmsched region"),
            (
                S::VersionMismatch,
                c"the region has another layout version than this library",
            ),
            (S::WrongKind, c"the region holds another kind of object"),
            (
                S::Mismatch,
                c"the region holds this kind of object with other parameters",
            ),
            (S::ProcessTableFull, c"the region's process table is full"),
            (S::ZeroConcurrency, c"the scheduler's concurrency is 0"),
            (S::Disposed, c"the scheduler is disposed"),
            (S::Timeout, c"timed out waiting for capacity"),
            (S::WouldBlock, c"no capacity available now"),
            (
                S::Forked,
                c"the handle belongs to the process that created it, not to this forked child",
            ),
            (S::AlreadyReleased, c"already released, or never issued"),
            (S::ForeignPermit, c"the permit belongs to another process"),
            (S::BufferTooSmall, c"the buffer is too small"),
            (S::UnknownTenant, c"unknown fair-share tenant"),
            (S::UnknownLease, c"unknown fair-share lease"),
            (S::TimeWentBackwards, c"time went backwards"),
            (S::CapacityExhausted, c"a fixed-capacity table is full"),
            (
                S::Internal,
                c"internal error (a caught panic, or an error without a code)",
            ),
            (S::Cancelled, c"the wait was cancelled"),
        ];
        all.iter()
            .find(|(s, _)| *s as u32 == code)
            .map_or(c"unknown status code", |(_, d)| *d)
    }
}

/// A failure on its way to C: the status and the message left for
/// [`shmsched_last_error_message`].
#[derive(Debug)]
pub(crate) struct Fail {
    pub(crate) status: shmsched_status,
    pub(crate) message: Cow<'static, str>,
}

impl Fail {
    pub(crate) fn new(status: shmsched_status, message: impl Into<Cow<'static, str>>) -> Fail {
        Fail {
            status,
            message: message.into(),
        }
    }

    /// NULL where a pointer is required; names the parameter.
    pub(crate) fn null(param: &'static str) -> Fail {
        Fail::new(
            shmsched_status::NullArgument,
            format!("argument `{param}` is NULL"),
        )
    }

    pub(crate) fn invalid(message: impl Into<Cow<'static, str>>) -> Fail {
        Fail::new(shmsched_status::InvalidArgument, message)
    }

    /// An operating-system error of the C layer's own (`op` on no file).
    #[cold]
    pub(crate) fn io(op: &'static str, source: std::io::Error) -> Fail {
        Fail::from(Error::Io {
            op,
            path: None,
            source,
        })
    }

    /// Stores the message for this thread and returns the status.
    #[cold]
    pub(crate) fn report(self) -> shmsched_status {
        set_last_error(&self.message);
        self.status
    }
}

/// The status a library error maps to.
pub(crate) fn status_of(e: &Error) -> shmsched_status {
    use shmsched_status as S;
    match e {
        Error::Io { source, .. } => match source.kind() {
            std::io::ErrorKind::NotFound => S::NotFound,
            std::io::ErrorKind::AlreadyExists => S::AlreadyExists,
            _ => S::Io,
        },
        Error::InvalidArgument(_) => S::InvalidArgument,
        Error::BadRegion(_) => S::BadRegion,
        Error::Mismatch(_) => S::Mismatch,
        Error::WrongKind { .. } => S::WrongKind,
        Error::VersionMismatch { .. } => S::VersionMismatch,
        Error::ProcessTableFull { .. } => S::ProcessTableFull,
        Error::Disposed => S::Disposed,
        Error::ZeroConcurrency => S::ZeroConcurrency,
        Error::Timeout => S::Timeout,
        Error::Forked(_) => S::Forked,
        Error::AlreadyReleased { .. } => S::AlreadyReleased,
        _ => S::Internal,
    }
}

impl From<Error> for Fail {
    #[cold]
    fn from(e: Error) -> Fail {
        Fail::new(status_of(&e), e.to_string())
    }
}

impl From<FairError> for Fail {
    #[cold]
    fn from(e: FairError) -> Fail {
        use shmsched_status as S;
        let status = match &e {
            FairError::InvalidConfig(_) | FairError::InvalidCost(_) | FairError::InvalidHold(_) => {
                S::InvalidArgument
            }
            FairError::UnknownTenant(_) => S::UnknownTenant,
            FairError::UnknownLease(_) => S::UnknownLease,
            FairError::AlreadyReleased(_) => S::AlreadyReleased,
            FairError::TimeWentBackwards { .. } | FairError::BeforeStart { .. } => {
                S::TimeWentBackwards
            }
            FairError::CapacityExhausted { .. } => S::CapacityExhausted,
            FairError::Corrupt(_) | FairError::Lock(_) | FairError::Region(_) => S::BadRegion,
            _ => S::Internal,
        };
        Fail::new(status, e.to_string())
    }
}

thread_local! {
    /// The message of this thread's last failed call.
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
    /// What the panic hook saw of this thread's last panic (message and
    /// location), for the boundary that catches it.
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs (once per process) the silent panic hook: it records the
/// panic's message and location for the catching boundary and prints
/// nothing, so a caught panic never writes to the host's stderr.
#[inline(always)]
pub(crate) fn silence_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let what = payload_text(info.payload());
            let at = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            let _ = LAST_PANIC.try_with(|p| {
                if let Ok(mut p) = p.try_borrow_mut() {
                    *p = Some(format!("{what}{at}"));
                }
            });
        }));
    });
}

/// The text of a panic's payload.
fn payload_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-text payload".into())
}

fn set_last_error(message: &str) {
    // `try_with`: during thread teardown the slot may be gone; the status
    // still reaches the caller.
    let _ = LAST_ERROR.try_with(|m| {
        if let Ok(mut m) = m.try_borrow_mut() {
            m.clear();
            m.push_str(message);
        }
    });
}

#[cold]
pub(crate) fn panicked(payload: Box<dyn std::any::Any + Send>) -> shmsched_status {
    let recorded = LAST_PANIC
        .try_with(|p| p.try_borrow_mut().ok().and_then(|mut p| p.take()))
        .ok()
        .flatten();
    let what = recorded.unwrap_or_else(|| payload_text(&*payload));
    // Dropping a panic payload can itself panic; never let that escape.
    let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
    Fail::new(
        shmsched_status::Internal,
        format!(
            "internal error: the library panicked ({what}); the call had no effect past that point"
        ),
    )
    .report()
}

/// Copies this thread's last error message into `buf` (at most `len` bytes
/// including the terminating NUL; a longer message is cut at a UTF-8
/// character boundary) and returns the full message's length in bytes,
/// without the NUL, so `return value >= len` means it was cut. With `buf`
/// NULL or `len` 0 nothing is written and the length is returned.
///
/// The message is the `Display` text of the library's error, the same
/// sentence a Rust caller sees, naming the bad value and the limit. It
/// belongs to the last call on this thread that returned a status other
/// than `SHMSCHED_STATUS_OK`; successful calls leave it unchanged. Empty
/// ("") before any failure.
///
/// Threads: reads the calling thread's own message only. Fork: a child
/// starts with the forking thread's message.
///
/// # Safety
///
/// `buf` must be NULL or point to at least `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn shmsched_last_error_message(buf: *mut c_char, len: usize) -> usize {
    let copy = |m: &str| -> usize {
        // SAFETY: the caller guarantees `len` writable bytes at `buf` (or
        // NULL), and a Rust String cannot overlap them.
        unsafe { cut_into_raw(m, buf, len) };
        m.len()
    };
    catch_unwind(AssertUnwindSafe(|| {
        LAST_ERROR
            .try_with(|m| m.try_borrow().map_or(0, |m| copy(&m)))
            .unwrap_or(0)
    }))
    .unwrap_or(0)
}

/// A static, NUL-terminated English description of `status` ("timed out
/// waiting for capacity"); "unknown status code" for a value this ABI does
/// not define. Never NULL; the string lives as long as the library.
///
/// Threads: any thread. Fork: no state.
#[no_mangle]
pub extern "C" fn shmsched_strerror(status: u32) -> *const c_char {
    shmsched_status::describe(status).as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::face::boundary;

    #[test]
    fn every_code_has_a_description() {
        for code in 0..=SHMSCHED_STATUS_MAX {
            let d = shmsched_status::describe(code).to_str().unwrap();
            assert_ne!(d, "unknown status code", "code {code}");
        }
        assert_eq!(
            shmsched_status::describe(SHMSCHED_STATUS_MAX + 1)
                .to_str()
                .unwrap(),
            "unknown status code"
        );
    }

    #[test]
    fn boundary_reports_errors_and_catches_panics() {
        let st = boundary(|| Err(Fail::invalid("rate 0 is out of range 1..=9")));
        assert_eq!(st, shmsched_status::InvalidArgument);
        let mut buf = [0 as c_char; 64];
        // SAFETY: `buf` has 64 writable bytes.
        let n = unsafe { shmsched_last_error_message(buf.as_mut_ptr(), buf.len()) };
        assert_eq!(n, "rate 0 is out of range 1..=9".len());
        let st = boundary(|| panic!("boom"));
        assert_eq!(st, shmsched_status::Internal);
        // SAFETY: as above.
        let n = unsafe { shmsched_last_error_message(buf.as_mut_ptr(), 8) };
        assert!(n > 8);
        // SAFETY: the function NUL-terminated the first 8 bytes.
        let cut = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        assert_eq!(cut.to_str().unwrap(), "interna");
    }

    #[test]
    fn messages_are_cut_at_char_boundaries() {
        let st = boundary(|| Err(Fail::invalid("é")));
        assert_eq!(st, shmsched_status::InvalidArgument);
        let mut buf = [0x7f as c_char; 2];
        // SAFETY: `buf` has 2 writable bytes.
        let n = unsafe { shmsched_last_error_message(buf.as_mut_ptr(), 2) };
        assert_eq!(n, 2);
        assert_eq!(buf[0], 0, "a 2-byte character does not fit in 1 byte + NUL");
    }
}
