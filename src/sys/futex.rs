//! Shared futex wait and wake.
//!
//! The futex words live in a `MAP_SHARED` mapping used by several
//! processes, so these calls use the *shared* futex operations (no
//! `FUTEX_PRIVATE_FLAG`): the kernel keys the wait queue on the underlying
//! page (inode + offset), not on this process's address space, so a waiter in
//! one process is woken by a waker in another even though the word sits at
//! different virtual addresses in each.
//!
//! The timeout of `FUTEX_WAIT` is relative and measured on
//! `CLOCK_MONOTONIC`, so wall-clock changes do not stretch or cut a wait.

use crate::sync::atomic::AtomicU32;
use std::time::Duration;

/// How a [`futex_wait`] ended. Every outcome may be spurious from the
/// caller's point of view: callers re-check their condition in a loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitResult {
    /// Woken by a [`futex_wake`] (or spuriously).
    Woken,
    /// The timeout elapsed.
    TimedOut,
    /// The word did not hold `expected` when the kernel looked, so the call
    /// returned at once (`EAGAIN`).
    Mismatch,
    /// A signal interrupted the wait (`EINTR`).
    Interrupted,
}

/// Sleeps while `word == expected`, at most `timeout` (relative,
/// `CLOCK_MONOTONIC`) if given.
///
/// The check of the word and the going to sleep are atomic with respect to
/// [`futex_wake`]: a wake issued after the word changed cannot be missed.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> WaitResult {
    let ts = timeout.map(|d| libc::timespec {
        // Saturate absurdly long timeouts instead of wrapping to negative.
        tv_sec: d.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let ts_ptr: *const libc::timespec = match &ts {
        Some(t) => t,
        None => std::ptr::null(),
    };
    // SAFETY: `word.as_ptr()` points to a live, aligned u32 for the whole call
    // (we hold a shared reference to it); the kernel only reads it. `ts_ptr` is
    // null or points to `ts`, which outlives the call. FUTEX_WAIT (shared) has
    // no other memory effects.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            ts_ptr,
        )
    };
    if r == 0 {
        return WaitResult::Woken;
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ETIMEDOUT) => WaitResult::TimedOut,
        Some(libc::EAGAIN) => WaitResult::Mismatch,
        Some(libc::EINTR) => WaitResult::Interrupted,
        e => {
            // EFAULT/EINVAL/ENOSYS cannot happen with a valid reference and a
            // normalised timespec; callers loop anyway, so report it as an
            // interruption in release builds.
            debug_assert!(false, "unexpected futex wait error {e:?}");
            WaitResult::Interrupted
        }
    }
}

/// Wakes up to `n` waiters sleeping on `word` (in any process that maps the
/// same page). Returns how many were woken.
///
/// `FUTEX_WAKE` never reads or writes the word itself; it only uses the
/// address as a key. That is why a wake on memory that another process has
/// just unmapped is harmless, and why `EFAULT` (which can only arise if the
/// page went away under us) can be ignored: there is nobody to wake on a
/// mapping that no longer exists.
pub fn futex_wake(word: &AtomicU32, n: i32) -> usize {
    // SAFETY: `word.as_ptr()` is a live, aligned u32 for the whole call; the
    // kernel uses the address only to find the wait queue and does not write
    // through it.
    let r = unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, n) };
    if r < 0 {
        // Only EFAULT (harmless, see above) or EINVAL (n < 0 is not an error
        // for FUTEX_WAKE, so none) are possible.
        debug_assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EFAULT)
        );
        return 0;
    }
    r as usize
}

/// Every bit: a waiter sleeping with this mask is woken by any
/// [`futex_wake_bitset`], and a wake with it reaches every sleeper.
pub const BITSET_ALL: u32 = u32::MAX;

/// Like [`futex_wait`], but the sleeper is tagged with `bitset` (nonzero):
/// only a [`futex_wake_bitset`] whose mask shares a bit with it wakes it
/// (a plain [`futex_wake`] wakes it too). Lets many threads sleep on one
/// shared word while a waker picks which of them to wake.
///
/// The timeout is relative on `CLOCK_MONOTONIC`, like [`futex_wait`]'s (the
/// kernel's `FUTEX_WAIT_BITSET` takes an absolute time; this converts).
pub fn futex_wait_bitset(
    word: &AtomicU32,
    expected: u32,
    timeout: Option<Duration>,
    bitset: u32,
) -> WaitResult {
    let ts = timeout.map(|d| {
        let now = super::clock::monotonic_ns();
        let until = u128::from(now) + d.as_nanos();
        // Saturate absurdly long timeouts instead of wrapping.
        let secs = (until / 1_000_000_000).min(libc::time_t::MAX as u128);
        libc::timespec {
            tv_sec: secs as libc::time_t,
            tv_nsec: (until % 1_000_000_000) as libc::c_long,
        }
    });
    let ts_ptr: *const libc::timespec = match &ts {
        Some(t) => t,
        None => std::ptr::null(),
    };
    // SAFETY: as in `futex_wait`: `word` is a live aligned u32 for the call,
    // the kernel only reads it; `ts_ptr` is null or points to `ts`, which
    // outlives the call; `uaddr2` is unused by FUTEX_WAIT_BITSET (null).
    // A zero bitset would be EINVAL, so it is forced to at least one bit.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT_BITSET,
            expected,
            ts_ptr,
            std::ptr::null::<u32>(),
            bitset.max(1),
        )
    };
    if r == 0 {
        return WaitResult::Woken;
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ETIMEDOUT) => WaitResult::TimedOut,
        Some(libc::EAGAIN) => WaitResult::Mismatch,
        Some(libc::EINTR) => WaitResult::Interrupted,
        e => {
            debug_assert!(false, "unexpected futex wait error {e:?}");
            WaitResult::Interrupted
        }
    }
}

/// Wakes up to `n` sleepers on `word` whose [`futex_wait_bitset`] mask
/// shares a bit with `bitset` (sleepers of a plain [`futex_wait`] match
/// every mask). Returns how many were woken. Harmless on unmapped memory,
/// like [`futex_wake`].
pub fn futex_wake_bitset(word: &AtomicU32, n: i32, bitset: u32) -> usize {
    // SAFETY: the address is used only as a key; the kernel neither reads nor
    // writes through it for a wake. `uaddr2` and `val2` are unused.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE_BITSET,
            n,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            bitset.max(1),
        )
    };
    if r < 0 {
        debug_assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EFAULT)
        );
        return 0;
    }
    r as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn wait_times_out() {
        let w = AtomicU32::new(7);
        let t = Instant::now();
        assert_eq!(
            futex_wait(&w, 7, Some(Duration::from_millis(30))),
            WaitResult::TimedOut
        );
        assert!(t.elapsed() >= Duration::from_millis(25));
    }

    #[test]
    fn wait_on_changed_word_returns_mismatch() {
        let w = AtomicU32::new(1);
        assert_eq!(
            futex_wait(&w, 2, Some(Duration::from_secs(5))),
            WaitResult::Mismatch
        );
    }

    #[test]
    fn wake_with_no_waiters_wakes_none() {
        let w = AtomicU32::new(0);
        assert_eq!(futex_wake(&w, i32::MAX), 0);
    }

    #[test]
    fn bitset_wake_picks_its_sleeper() {
        let w = Arc::new(AtomicU32::new(0));
        let woke = Arc::new(AtomicU32::new(0));
        let sleeper = |bits: u32| {
            let (w, woke) = (w.clone(), woke.clone());
            std::thread::spawn(move || {
                while woke.load(Ordering::SeqCst) & bits == 0 {
                    futex_wait_bitset(&w, 0, Some(Duration::from_secs(10)), bits);
                }
            })
        };
        let a = sleeper(0b01);
        let b = sleeper(0b10);
        // Wake only b's bit until b has left; a must still be asleep then.
        woke.fetch_or(0b10, Ordering::SeqCst);
        while !b.is_finished() {
            futex_wake_bitset(&w, i32::MAX, 0b10);
            std::thread::yield_now();
        }
        assert!(!a.is_finished());
        woke.fetch_or(0b01, Ordering::SeqCst);
        while !a.is_finished() {
            futex_wake_bitset(&w, i32::MAX, BITSET_ALL);
            std::thread::yield_now();
        }
        a.join().unwrap();
        b.join().unwrap();
    }

    #[test]
    fn bitset_wait_times_out() {
        let w = AtomicU32::new(3);
        let t = Instant::now();
        assert_eq!(
            futex_wait_bitset(&w, 3, Some(Duration::from_millis(20)), 1),
            WaitResult::TimedOut
        );
        assert!(t.elapsed() >= Duration::from_millis(15));
    }

    #[test]
    fn wake_wakes_a_thread() {
        let w = Arc::new(AtomicU32::new(0));
        let w2 = w.clone();
        let h = std::thread::spawn(move || {
            while w2.load(Ordering::Acquire) == 0 {
                futex_wait(&w2, 0, Some(Duration::from_secs(10)));
            }
        });
        w.store(1, Ordering::Release);
        futex_wake(&w, 1);
        h.join().unwrap();
    }
}
