//! The C face, written once: the boundary every exported function runs in,
//! and the `try_*` helpers that check and borrow its arguments.
//!
//! The shape is rustls-ffi's (`ffi_panic_boundary!`, `try_ref_from_ptr!`,
//! …): an exported function is its signature, its doc comment and a few
//! lines over these helpers, and everything it decides is the library's.
//!
//! - [`ffi!`] runs a body inside [`boundary`]: a body that ends in `Err`
//!   returns that status and leaves the message for the thread; a panic
//!   returns `SHMSCHED_STATUS_INTERNAL`, silently (the message goes to the
//!   thread's last error, nothing to stderr); anything else is
//!   `SHMSCHED_STATUS_OK`. The body ends in `()` or in a
//!   `Result<(), Fail>` ([`Completes`]), and may use `?`.
//! - `try_ref!(p)`, `try_mut!(p)`, `try_out!(p)`, `try_opt_out!(p)` and
//!   `try_text!(p)` check a pointer parameter (NULL is `NULL_ARGUMENT`,
//!   naming the parameter; a string that is not UTF-8 is
//!   `INVALID_ARGUMENT`) and borrow it; [`Handle::usable`] adds the fork
//!   check of a handle (`FORKED` in a child that inherited it);
//!   `try_priority!(p)` checks a priority (`INVALID_PRIORITY`).
//! - Outputs are [`Out`]s and [`OptOut`]s, set once at the end of a body,
//!   so only on success. Strings go out through [`write_text`] and
//!   [`write_json`] (the `snprintf` convention, the one place it is
//!   written), size-prefixed structs through [`write_sized`], cut text
//!   through [`cut_into`].
//! - Handles are made by [`new_handle`] and freed by [`close`] or
//!   [`close_box`].
//! - A call whose common case is worth a few nanoseconds (the C acquire and
//!   release of a cell token, see [`crate::pin`]) first runs a *lean path*
//!   in [`lean`]: it answers only what it can answer exactly as the
//!   general path would, and otherwise hands over, having done nothing, to
//!   the general path, an [`ffi!`] body out of line.
//!
//! The order of the checks is what a caller sees (the first failing one
//! gives the status and the message), so each function keeps its own:
//! mostly handles and outputs, then the other arguments, then whether the
//! handle is this process's.
//!
//! # Safety of the macros
//!
//! The pointer macros (`try_ref!`, `try_mut!`, `try_out!`, `try_opt_out!`,
//! `try_text!`) dereference a raw pointer in an `unsafe` block of their
//! own. They are used only on the pointer parameters of this crate's
//! exported `unsafe extern "C"` functions, whose `# Safety` sections require
//! each such pointer to be NULL or valid as that function documents (a
//! handle: open, of its type, for the whole call; an output: writable; a
//! string: NUL-terminated and unchanged during the call). That contract is
//! what every one of those blocks rests on.

use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

use shmsched::Priority;

use crate::process;
use crate::status::{panicked, shmsched_status, silence_panics, Fail};

/// Runs the body of an exported function in [`boundary`] (see the module
/// docs): `ffi! { let h = try_ref!(sched); h.usable()?.dispose() }`.
macro_rules! ffi {
    ($($body:tt)*) => {
        $crate::face::boundary(|| -> ::core::result::Result<(), $crate::status::Fail> {
            $crate::face::Completes::completes({ $($body)* })
        })
    };
}
pub(crate) use ffi;

/// Borrows the object behind a handle parameter: `NULL_ARGUMENT` naming it
/// when NULL. See "Safety of the macros".
macro_rules! try_ref {
    ($p:ident) => {
        // SAFETY: `$p` is a pointer parameter of an exported function: NULL
        // or a live object of its type for the whole call (the function's
        // `# Safety` contract; see face's "Safety of the macros").
        unsafe { $crate::face::nonnull_ref($p, stringify!($p)) }?
    };
}
pub(crate) use try_ref;

/// Borrows a caller's struct for writing in place: `NULL_ARGUMENT` naming it
/// when NULL. See "Safety of the macros".
macro_rules! try_mut {
    ($p:ident) => {
        // SAFETY: `$p` is a pointer parameter of an exported function: NULL
        // or valid for reads and writes and not aliased during the call
        // (the function's `# Safety` contract).
        match unsafe { $p.as_mut() } {
            Some(r) => r,
            None => return Err($crate::status::Fail::null(stringify!($p))),
        }
    };
}
pub(crate) use try_mut;

/// A required output parameter: `NULL_ARGUMENT` naming it when NULL. See
/// "Safety of the macros".
macro_rules! try_out {
    ($p:ident) => {
        // SAFETY: `$p` is an output parameter of an exported function: NULL
        // or valid for a write of its type until the call returns (the
        // function's `# Safety` contract).
        unsafe { $crate::face::Out::new($p, stringify!($p)) }?
    };
}
pub(crate) use try_out;

/// An optional output parameter (NULL: not wanted). See "Safety of the
/// macros".
macro_rules! try_opt_out {
    ($p:ident) => {
        // SAFETY: as for `try_out!`: NULL or valid for a write until the
        // call returns.
        unsafe { $crate::face::OptOut::new($p) }
    };
}
pub(crate) use try_opt_out;

/// A NUL-terminated UTF-8 string parameter: `NULL_ARGUMENT` when NULL,
/// `INVALID_ARGUMENT` when not UTF-8, naming it. See "Safety of the
/// macros".
macro_rules! try_text {
    ($p:ident) => {
        // SAFETY: `$p` is a string parameter of an exported function: NULL
        // or NUL-terminated, valid and unchanged during the call (the
        // function's `# Safety` contract).
        unsafe { $crate::face::text($p, stringify!($p)) }?
    };
}
pub(crate) use try_text;

/// A priority parameter (`SHMSCHED_PRIORITY_*`, -3..=3):
/// `INVALID_PRIORITY` naming the value otherwise.
macro_rules! try_priority {
    ($p:ident) => {
        $crate::face::priority($p)?
    };
}
pub(crate) use try_priority;

/// What an [`ffi!`] body may end with: `()` (success) or a `Result`.
pub(crate) trait Completes {
    /// The body's outcome.
    fn completes(self) -> Result<(), Fail>;
}

impl Completes for () {
    #[inline(always)]
    fn completes(self) -> Result<(), Fail> {
        Ok(())
    }
}

impl Completes for Result<(), Fail> {
    #[inline(always)]
    fn completes(self) -> Result<(), Fail> {
        self
    }
}

/// Runs the body of an exported function: maps `Err` to its status (leaving
/// the message for this thread) and a panic to [`shmsched_status::Internal`].
#[inline(always)]
pub(crate) fn boundary(body: impl FnOnce() -> Result<(), Fail>) -> shmsched_status {
    silence_panics();
    // AssertUnwindSafe: after a caught panic the caller only gets a status;
    // no state observed half-updated by the panicking code is read by this
    // call again (library handles guard their own invariants with locks
    // that recover from poisoning).
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => shmsched_status::Ok,
        Ok(Err(fail)) => fail.report(),
        Err(payload) => panicked(payload),
    }
}

/// Runs the lean path of an exported function: `Some(status)` is its
/// answer, `None` sends the caller to its general path (an [`ffi!`] body
/// doing the whole job), which the lean path must leave as it found it.
/// A lean path answers only what it can answer exactly as the general path
/// would (the same status, the same message, the same effects); past its
/// first call it may also end by calling the general path itself, having
/// done nothing (so that nothing of its frame is live across that call).
///
/// A panic is caught as in [`boundary`]. The hook that keeps it silent is
/// installed already: the lean paths run on a handle or a permit, and
/// every handle (every permit comes from one) was made in a [`boundary`],
/// which installs it first (process-wide, for good, inherited by `fork`).
#[inline(always)]
pub(crate) fn lean(body: impl FnOnce() -> Option<shmsched_status>) -> Option<shmsched_status> {
    // AssertUnwindSafe: as in `boundary`.
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(answer) => answer,
        Err(payload) => Some(panicked(payload)),
    }
}

/// A handle of this ABI that belongs to the process that made it: used in
/// a forked child it fails with `SHMSCHED_STATUS_FORKED` (the library would
/// refuse most calls anyway; checking here makes every call, `try_` ones
/// included, say so alike).
pub(crate) trait Handle {
    /// What the handle gives access to.
    type Target: ?Sized;
    /// The message of `FORKED`: what the handle is and what to do instead.
    const AFTER_FORK: &'static str;
    /// The fork generation the handle was made in, and what it holds.
    fn parts(&self) -> (u64, &Self::Target);

    /// What the handle holds, unless it was inherited across `fork`.
    #[inline(always)]
    fn usable(&self) -> Result<&Self::Target, Fail> {
        if !self.made_here() {
            return Err(forked(Self::AFTER_FORK));
        }
        Ok(self.parts().1)
    }

    /// Whether the handle was made in this process (not inherited across
    /// `fork`): what [`usable`](Self::usable) checks.
    #[inline(always)]
    fn made_here(&self) -> bool {
        self.parts().0 == process::fork_generation()
    }
}

#[cold]
fn forked(message: &'static str) -> Fail {
    Fail::new(shmsched_status::Forked, message)
}

/// Boxes a new handle and writes it to `out`, once the fork handler is
/// installed (so it runs before any permit exists).
pub(crate) fn new_handle<T>(out: Out<*mut T>, value: T) -> Result<(), Fail> {
    process::install_fork_handler()?;
    out.set(Box::into_raw(Box::new(value)));
    Ok(())
}

/// The `_close` calls: NULL does nothing; otherwise `finish` gets the
/// handle, inside the boundary (close returns nothing, so a panic there is
/// caught and dropped).
///
/// # Safety
///
/// `p` must be NULL or a handle of `T` that the caller does not use again.
pub(crate) unsafe fn close<T>(p: *mut T, finish: impl FnOnce(*mut T)) {
    if p.is_null() {
        return;
    }
    let _ = boundary(|| {
        finish(p);
        Ok(())
    });
}

/// [`close`] for a handle that only its own box refers to: frees it.
///
/// # Safety
///
/// `p` must be NULL or a handle made by [`new_handle`] for a `T`, not used
/// again by the caller.
pub(crate) unsafe fn close_box<T>(p: *mut T) {
    // SAFETY: a non-NULL `p` came from Box::into_raw in `new_handle` and
    // the caller gives it up (the contract).
    unsafe { close(p, |p| drop(Box::from_raw(p))) }
}

/// Borrows the object behind a handle (the body of `try_ref!`).
///
/// # Safety
///
/// `p` must be NULL or a pointer to a live `T` that outlives `'a`.
#[inline(always)]
pub(crate) unsafe fn nonnull_ref<'a, T>(p: *const T, param: &'static str) -> Result<&'a T, Fail> {
    // SAFETY: non-null `p` points to a live `T` (the caller's contract).
    unsafe { p.as_ref() }.ok_or_else(|| Fail::null(param))
}

/// A checked, non-NULL output pointer. Writing never reads or drops what
/// the caller's memory held before (it may be uninitialised).
pub(crate) struct Out<T>(NonNull<T>);

impl<T> Out<T> {
    /// Checks an output pointer (the body of `try_out!`).
    ///
    /// # Safety
    ///
    /// `p` must be NULL or valid for a write of one `T` (alignment
    /// included) until the output is written.
    #[inline(always)]
    pub(crate) unsafe fn new(p: *mut T, param: &'static str) -> Result<Out<T>, Fail> {
        NonNull::new(p).map(Out).ok_or_else(|| Fail::null(param))
    }

    /// Writes the output (call only once everything else succeeded: outputs
    /// are written only on success).
    #[inline(always)]
    pub(crate) fn set(self, v: T) {
        // SAFETY: the pointer is non-null and valid for a write of one `T`
        // (the contract of `new`); `write` does not drop the old contents.
        unsafe { self.0.as_ptr().write(v) }
    }
}

/// An optional output pointer: NULL means "not wanted".
pub(crate) struct OptOut<T>(Option<Out<T>>);

impl<T> OptOut<T> {
    /// Takes an optional output pointer (the body of `try_opt_out!`).
    ///
    /// # Safety
    ///
    /// As for [`Out::new`].
    #[inline(always)]
    pub(crate) unsafe fn new(p: *mut T) -> OptOut<T> {
        OptOut(NonNull::new(p).map(Out))
    }

    /// Writes the output if it was wanted (only on success, as [`Out::set`]).
    #[inline(always)]
    pub(crate) fn set(self, v: T) {
        if let Some(out) = self.0 {
            out.set(v);
        }
    }
}

/// Borrows a NUL-terminated UTF-8 string (the body of `try_text!`).
///
/// # Safety
///
/// `p` must be NULL or point to a NUL-terminated string that stays valid
/// and unchanged for `'a`.
pub(crate) unsafe fn text<'a>(p: *const c_char, param: &'static str) -> Result<&'a str, Fail> {
    if p.is_null() {
        return Err(Fail::null(param));
    }
    // SAFETY: non-null and NUL-terminated (the caller's contract).
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str().map_err(|e| {
        Fail::invalid(format!(
            "argument `{param}` is not valid UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        ))
    })
}

/// A priority from its integer value (`SHMSCHED_PRIORITY_*`, -3..=3).
#[inline(always)]
pub(crate) fn priority(value: i32) -> Result<Priority, Fail> {
    priority_of(value).ok_or_else(|| bad_priority(value))
}

/// The priority of a `SHMSCHED_PRIORITY_*` value, if it is one.
#[inline(always)]
pub(crate) fn priority_of(value: i32) -> Option<Priority> {
    match value {
        -3 => Some(Priority::Lowest),
        -2 => Some(Priority::Lower),
        -1 => Some(Priority::Low),
        0 => Some(Priority::Normal),
        1 => Some(Priority::High),
        2 => Some(Priority::Higher),
        3 => Some(Priority::Highest),
        _ => None,
    }
}

#[cold]
fn bad_priority(value: i32) -> Fail {
    let text = match Priority::from_value(i64::from(value)) {
        Err(e) => e.to_string(),
        Ok(_) => format!("priority {value} is out of range"),
    };
    Fail::new(shmsched_status::InvalidPriority, text)
}

/// Copies as much of `text` as fits in `dst` with a NUL after it (cut at a
/// UTF-8 character boundary) and returns the bytes copied, without the NUL.
/// An empty `dst` gets nothing.
pub(crate) fn cut_into(text: &str, dst: &mut [c_char]) -> usize {
    let Some(room) = dst.len().checked_sub(1) else {
        return 0;
    };
    let mut n = text.len().min(room);
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    for (d, s) in dst.iter_mut().zip(&text.as_bytes()[..n]) {
        *d = *s as c_char;
    }
    dst[n] = 0;
    n
}

/// [`cut_into`] a caller's buffer; NULL or `len` 0 gets nothing.
///
/// # Safety
///
/// `buf` must be NULL or valid for `len` bytes of writes.
pub(crate) unsafe fn cut_into_raw(text: &str, buf: *mut c_char, len: usize) {
    if buf.is_null() || len == 0 {
        return;
    }
    // SAFETY: `buf` is valid for `len` bytes of writes (the caller's
    // contract), and nothing else refers to them during the call.
    cut_into(text, unsafe { std::slice::from_raw_parts_mut(buf, len) });
}

/// Copies `text` and a NUL into a caller's buffer, `snprintf`-style, with
/// the ABI's one convention for string outputs: `*out_len` is the text's
/// length in bytes **without** the NUL (so the buffer needs `*out_len + 1`).
///
/// - `buf` NULL and `len` 0: a size query; writes the length to `out_len`
///   and succeeds.
/// - The text and its NUL fit: copies them, writes the length, succeeds.
/// - They do not fit: writes nothing to `buf`, stores the length in
///   `out_len` and fails with [`shmsched_status::BufferTooSmall`] (the one
///   failure after which an output is written, so the caller can retry).
/// - `buf` NULL with `len` > 0, or `out_len` NULL: `NullArgument`.
///
/// # Safety
///
/// `buf` must be NULL or valid for `len` bytes of writes; `out_len` must be
/// NULL or valid for a write of a `usize`.
pub(crate) unsafe fn write_text(
    text: &str,
    buf: *mut c_char,
    len: usize,
    out_len: *mut usize,
) -> Result<(), Fail> {
    // SAFETY: forwarded contract.
    let out_len = unsafe { Out::new(out_len, "out_len") }?;
    if buf.is_null() {
        if len == 0 {
            out_len.set(text.len());
            return Ok(());
        }
        return Err(Fail::null("buf"));
    }
    if text.len() >= len {
        out_len.set(text.len());
        return Err(Fail::new(
            shmsched_status::BufferTooSmall,
            format!(
                "the text is {} bytes plus a NUL, and the buffer holds {len}",
                text.len()
            ),
        ));
    }
    // SAFETY: `buf` has `len > text.len()` writable bytes (caller's
    // contract and the check above); the source is a Rust string that
    // cannot overlap the caller's buffer.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
        *buf.add(text.len()) = 0;
    }
    out_len.set(text.len());
    Ok(())
}

/// [`write_text`] of a JSON text (`serde_json::to_string` of a stats
/// value, which fails only on a serialiser bug: `INTERNAL`).
///
/// # Safety
///
/// As for [`write_text`].
pub(crate) unsafe fn write_json(
    json: serde_json::Result<String>,
    buf: *mut c_char,
    len: usize,
    out_len: *mut usize,
) -> Result<(), Fail> {
    let json = json.map_err(|e| Fail::new(shmsched_status::Internal, e.to_string()))?;
    // SAFETY: forwarded contract.
    unsafe { write_text(&json, buf, len, out_len) }
}

/// The smallest `size` a caller may pass for a size-prefixed struct: the
/// `size` field and the word after it.
pub(crate) const MIN_SIZED: usize = 8;

/// Copies a size-prefixed struct (first field `size: u32`) to the caller:
/// at most the caller's `out->size` bytes, and sets `size` in the copy to
/// the number of bytes written. A caller built against an older, smaller
/// version of the struct gets the prefix it knows; a caller built against
/// a newer one learns from `size` which fields were filled.
///
/// # Safety
///
/// `out` must be NULL or valid for a read of its first 4 bytes and for
/// writes of `out->size` bytes (or of `size_of::<T>()` if smaller). `T` must
/// have no padding bytes (each struct asserts it), so that every byte
/// copied is initialised.
pub(crate) unsafe fn write_sized<T: Copy>(
    out: *mut T,
    mut value: T,
    set_size: impl FnOnce(&mut T, u32),
) -> Result<(), Fail> {
    if out.is_null() {
        return Err(Fail::null("out"));
    }
    // SAFETY: the caller guarantees the first 4 bytes are readable; a u32
    // read needs 4-byte alignment, which a pointer to `T` (whose first field
    // is a u32) has.
    let want = unsafe { out.cast::<u32>().read() } as usize;
    if want < MIN_SIZED {
        return Err(Fail::invalid(format!(
            "out->size is {want}: set it to sizeof the struct ({} in this library) before the call",
            std::mem::size_of::<T>()
        )));
    }
    let n = want.min(std::mem::size_of::<T>());
    set_size(&mut value, n as u32);
    // SAFETY: `value` is a `T` without padding, so its `n <= size_of::<T>()`
    // first bytes are initialised; `out` is valid for `n` bytes of writes
    // (caller's contract) and cannot overlap a local.
    unsafe {
        std::ptr::copy_nonoverlapping((&value as *const T).cast::<u8>(), out.cast::<u8>(), n)
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_into_keeps_characters_whole() {
        let mut b = [0x7f as c_char; 3];
        assert_eq!(cut_into("aé", &mut b), 1, "é does not fit with its NUL");
        assert_eq!(b[..2], [b'a' as c_char, 0]);
        assert_eq!(cut_into("xyz", &mut b), 2);
        assert_eq!(b, [b'x' as c_char, b'y' as c_char, 0]);
        assert_eq!(cut_into("xy", &mut b), 2, "fits with its NUL");
        assert_eq!(cut_into("xyz", &mut []), 0);
    }
}
