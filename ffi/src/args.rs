//! Checked conversions of C arguments: handles, output pointers, strings,
//! priorities. NULL is an error ([`shmsched_status::NullArgument`] naming
//! the parameter), never undefined behaviour; so are a string that is not
//! UTF-8 and a priority outside -3..=3.

use std::ffi::{c_char, CStr};
use std::ptr::NonNull;

use shmsched::Priority;

use crate::status::{shmsched_status, Fail};

/// Borrows the object behind a handle.
///
/// # Safety
///
/// `p` must be NULL or a pointer this library returned for a `T` that has
/// not been closed, and the object must outlive `'a`.
#[inline(always)]
pub(crate) unsafe fn handle<'a, T>(p: *const T, param: &'static str) -> Result<&'a T, Fail> {
    // SAFETY: non-null `p` points to a live `T` (the caller's contract).
    unsafe { p.as_ref() }.ok_or_else(|| Fail::null(param))
}

/// A checked, non-NULL output pointer. Writing never reads or drops what
/// the caller's memory held before (it may be uninitialised).
pub(crate) struct Out<T>(NonNull<T>);

impl<T> Out<T> {
    /// Checks an output pointer.
    ///
    /// # Safety
    ///
    /// `p` must be NULL or valid for a write of one `T` (alignment
    /// included) until the output is written.
    #[inline(always)]
    pub(crate) unsafe fn new(p: *mut T, param: &'static str) -> Result<Out<T>, Fail> {
        NonNull::new(p).map(Out).ok_or_else(|| Fail::null(param))
    }

    /// Checks an optional output pointer: NULL means "not wanted".
    ///
    /// # Safety
    ///
    /// As for [`Out::new`].
    #[inline(always)]
    pub(crate) unsafe fn optional(p: *mut T) -> Option<Out<T>> {
        NonNull::new(p).map(Out)
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

/// Borrows a NUL-terminated UTF-8 string.
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
    match value {
        -3 => Ok(Priority::Lowest),
        -2 => Ok(Priority::Lower),
        -1 => Ok(Priority::Low),
        0 => Ok(Priority::Normal),
        1 => Ok(Priority::High),
        2 => Ok(Priority::Higher),
        3 => Ok(Priority::Highest),
        _ => Err(bad_priority(value)),
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
