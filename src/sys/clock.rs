//! `CLOCK_MONOTONIC`: the shared clock.
//!
//! All processes of one host read the same `CLOCK_MONOTONIC`, so a
//! timestamp written into a region by one process can be compared with
//! "now" in another. It never jumps with wall-clock changes, and it does not
//! advance during suspend (which is what a rate limiter wants).

/// Nanoseconds of `CLOCK_MONOTONIC`.
///
/// The value is only meaningful relative to other readings on the same host
/// (its origin is boot time on Linux).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable `timespec` that lives across the call,
    // and CLOCK_MONOTONIC is a clock id every Linux kernel supports, so the
    // only possible failure (EINVAL/EFAULT) cannot happen.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    debug_assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    // tv_sec and tv_nsec are non-negative for CLOCK_MONOTONIC.
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Milliseconds of `CLOCK_MONOTONIC` (see [`monotonic_ns`]).
pub fn monotonic_ms() -> u64 {
    monotonic_ns() / 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_never_goes_back_and_agrees_across_units() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(b >= a);
        let ms = monotonic_ms();
        assert!(ms >= a / 1_000_000);
        assert!(ms <= monotonic_ns() / 1_000_000);
    }
}
