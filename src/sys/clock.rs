//! `CLOCK_MONOTONIC`: the shared clock, and a calibrated TSC reading of it.
//!
//! All processes of one host read the same `CLOCK_MONOTONIC`, so a
//! timestamp written into a region by one process can be compared with
//! "now" in another. It never jumps with wall-clock changes, and it does not
//! advance during suspend (which is what a rate limiter wants).
//!
//! **The TSC clock.** Reading `CLOCK_MONOTONIC` costs a vDSO call (about
//! 18 ns on a VM), which is a large part of a limiter's uncontended consume;
//! `rdtsc` alone costs about half of that. A [`TscClock`] turns TSC ticks
//! into nanoseconds of `CLOCK_MONOTONIC`'s scale with one linear
//! calibration, `ns = ns0 + ((tsc − tsc0) · mult) >> shift` (128-bit
//! product). It is only used when the TSC is *reliable*
//! ([`tsc_reliable`]): the kernel itself uses it as its clocksource (so it
//! has checked that it is synchronised across CPUs) and the CPU flags
//! `constant_tsc` (fixed rate) and `nonstop_tsc` (runs in idle states). On
//! other architectures, or without those guarantees, [`calibrate`] gives
//! `None` and callers use [`monotonic_ns`].
//!
//! A shared bucket stays exact only if every process computes the *same*
//! time from the same instant, so a region's creator calibrates once and
//! stores the calibration in the region; every process then uses that
//! stored [`TscClock`] (never its own), and all of them agree. The TSC
//! clock drifts from `CLOCK_MONOTONIC` by the calibration error and NTP's
//! slewing (parts per million), which only changes the effective rate by as
//! much; readers check the agreement when they load a stored calibration.

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

/// How far `CLOCK_MONOTONIC_COARSE` may lag `CLOCK_MONOTONIC`, with margin:
/// the coarse clock is the time of the last timekeeping update, made on a
/// tick (4 ms apart at `HZ=250`, 10 ms at the slowest common `HZ=100`;
/// measured here: 2.3 to 6.3 ms behind at `HZ=250`). If the CPU that keeps
/// time stalls (a vCPU the hypervisor does not run), another takes over
/// after 5 stalled ticks (`MAX_STALLED_JIFFIES`, Linux 6.4+): 50 ms at
/// `HZ=100`. Twice that: a reading of the coarse clock plus this is later
/// than the precise clock read at the same moment.
pub const COARSE_SLACK_NS: u64 = 100_000_000;

/// Nanoseconds of `CLOCK_MONOTONIC_COARSE`: the same timebase as
/// [`monotonic_ns`], at the last tick (behind it by less than
/// [`COARSE_SLACK_NS`]), for a few ns (the vDSO reads two words, no TSC).
/// For checks that only need to know they are well before an instant.
#[inline]
pub fn monotonic_coarse_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: as in `monotonic_ns`: a valid, writable `timespec` and a
    // clock id every Linux kernel since 2.6.32 supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    if rc != 0 {
        // Not reachable on Linux; the caller then takes its precise path.
        return u64::MAX;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Milliseconds of `CLOCK_MONOTONIC` (see [`monotonic_ns`]).
pub fn monotonic_ms() -> u64 {
    monotonic_ns() / 1_000_000
}

/// Reads the TSC (not serialised: a reading may be a few cycles early,
/// which only makes a limiter see slightly less refill).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn read_tsc() -> u64 {
    // SAFETY: `rdtsc` is available on every x86_64 CPU and has no memory
    // effects.
    #[allow(unused_unsafe)]
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
}

/// Reads the TSC: there is none on this architecture (0; no [`TscClock`]
/// is ever made or accepted here).
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub fn read_tsc() -> u64 {
    0
}

/// Nanoseconds per TSC tick must lie in `[1/100, 1000]` (a 1 MHz to
/// 100 GHz counter) for a calibration to be accepted.
const MIN_TICKS_PER_US: u128 = 1;
const MAX_TICKS_PER_US: u128 = 100_000;

/// A linear map from TSC ticks to nanoseconds of `CLOCK_MONOTONIC`:
/// `ns = ns0 + ((tsc − tsc0) · mult) >> shift` (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct TscClock {
    /// TSC at the calibration's start.
    pub tsc0: u64,
    /// `CLOCK_MONOTONIC` ns at `tsc0`.
    pub ns0: u64,
    /// Nanoseconds per tick, scaled by `2^shift`.
    pub mult: u64,
    /// The scale of `mult` (at most 63).
    pub shift: u32,
}

impl TscClock {
    /// Nanoseconds at TSC reading `tsc` (saturating; a reading before
    /// `tsc0` maps to `ns0`). The shift is taken mod 64: every calibration
    /// in use passed [`check_form`](Self::check_form) (`shift ≤ 63`), and
    /// the mask spares the consume fast path the 128-bit shift's handling
    /// of amounts from 64 up (4 instructions a clock read).
    #[inline(always)]
    pub fn ns_at(&self, tsc: u64) -> u64 {
        let d = (u128::from(tsc.saturating_sub(self.tsc0)) * u128::from(self.mult))
            >> (self.shift & 63);
        self.ns0
            .saturating_add(u64::try_from(d).unwrap_or(u64::MAX))
    }

    /// The first TSC reading whose exact (unrounded) time is at or after
    /// `ns`: `tsc0 + ⌈(ns − ns0) · 2^shift / mult⌉` (`tsc0` for an `ns`
    /// before `ns0`, saturating). [`ns_at`](Self::ns_at) of it is at
    /// least `ns`, less than a tick more. Needs `mult` non-zero (0:
    /// `u64::MAX`).
    pub fn tick_at_or_after(&self, ns: u64) -> u64 {
        let d = u128::from(ns.saturating_sub(self.ns0)) << (self.shift & 63);
        let t = d.checked_div(u128::from(self.mult)).map_or(u128::MAX, |q| {
            q + u128::from(q * u128::from(self.mult) != d)
        });
        self.tsc0
            .saturating_add(u64::try_from(t).unwrap_or(u64::MAX))
    }

    /// Nanoseconds now.
    #[inline(always)]
    pub fn now_ns(&self) -> u64 {
        self.ns_at(read_tsc())
    }

    /// Checks a calibration (typically one read from a region): `shift ≤
    /// 63`, `mult` non-zero and giving a 1 MHz–100 GHz counter, `tsc0` and
    /// `ns0` not in the future, and the clock agreeing with
    /// `CLOCK_MONOTONIC` now within 100 ms + 0.1 % of the time since
    /// `ns0`. Not valid on a machine without a TSC.
    pub fn validate(&self) -> Result<(), String> {
        self.check_form()?;
        self.check_agrees()
    }

    /// The checks of [`validate`](Self::validate) that need no clock read:
    /// the architecture, the shift and the multiplier's range.
    pub fn check_form(&self) -> Result<(), String> {
        if !cfg!(target_arch = "x86_64") {
            return Err("a TSC clock is not available on this architecture".into());
        }
        if self.shift > 63 {
            return Err(format!("TSC clock shift {} is above 63", self.shift));
        }
        // ns per tick = mult / 2^shift, in [1/100, 1000]: ticks per µs in
        // [1, 100 000].
        let m = u128::from(self.mult) * MAX_TICKS_PER_US;
        let one_us = 1000u128 << self.shift;
        if self.mult == 0 || m < one_us || u128::from(self.mult) * MIN_TICKS_PER_US > one_us {
            return Err(format!(
                "TSC clock multiplier {} (shift {}) is not a 1 MHz..100 GHz counter",
                self.mult, self.shift
            ));
        }
        Ok(())
    }

    /// Whether the calibration still agrees with `CLOCK_MONOTONIC` now: its
    /// origin is not in the future, and it reads within 100 ms + 0.1 % of
    /// the time since its origin. A TSC that stopped or jumped (a VM
    /// restore, a suspend on a TSC that does not survive it) fails this.
    pub fn check_agrees(&self) -> Result<(), String> {
        let tsc = read_tsc();
        let mono = monotonic_ns();
        if self.tsc0 > tsc || self.ns0 > mono {
            return Err(format!(
                "TSC clock origin (tsc {}, {} ns) is in the future (tsc {tsc}, {mono} ns)",
                self.tsc0, self.ns0
            ));
        }
        let mine = self.ns_at(tsc);
        let slack = 100_000_000 + (mono - self.ns0) / 1000;
        if mine.abs_diff(mono) > slack {
            return Err(format!(
                "TSC clock reads {mine} ns while CLOCK_MONOTONIC reads {mono} ns \
                 (more than {slack} ns apart)"
            ));
        }
        Ok(())
    }
}

/// True if the TSC can stand in for `CLOCK_MONOTONIC` in every process of
/// this host: x86_64, the kernel's current clocksource is `tsc` (Linux
/// only uses it when it is synchronised across CPUs), and the CPU has
/// `constant_tsc` and `nonstop_tsc`.
pub fn tsc_reliable() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    let src =
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .unwrap_or_default();
    if src.trim() != "tsc" {
        return false;
    }
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return false;
    };
    let Some(flags) = info.lines().find(|l| l.starts_with("flags")) else {
        return false;
    };
    let has = |f: &str| flags.split_whitespace().any(|x| x == f);
    has("constant_tsc") && has("nonstop_tsc")
}

/// One tightly bracketed `(tsc, CLOCK_MONOTONIC ns)` pair: the best of a
/// few tries (the TSC read on each side of the clock read closest together).
fn sample_pair() -> (u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..32 {
        let a = read_tsc();
        let ns = monotonic_ns();
        let b = read_tsc();
        if b >= a && b - a < best.0 {
            best = (b - a, a + (b - a) / 2, ns);
        }
    }
    (best.1, best.2)
}

/// Calibrates the TSC against `CLOCK_MONOTONIC` over about 20 ms (the
/// thread sleeps meanwhile), or `None` if the TSC is not reliable
/// ([`tsc_reliable`]) or the result fails [`TscClock::validate`].
pub fn calibrate() -> Option<TscClock> {
    if !tsc_reliable() {
        return None;
    }
    calibrate_over(std::time::Duration::from_millis(20))
}

/// Calibrates over `interval` without checking [`tsc_reliable`] (x86_64
/// only; `None` elsewhere or if the samples are unusable).
pub fn calibrate_over(interval: std::time::Duration) -> Option<TscClock> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    const SHIFT: u32 = 32;
    let (t0, n0) = sample_pair();
    std::thread::sleep(interval);
    let (t1, n1) = sample_pair();
    let (dt, dn) = (t1.checked_sub(t0)?, n1.checked_sub(n0)?);
    if dt == 0 || dn == 0 {
        return None;
    }
    let mult = ((u128::from(dn) << SHIFT) + u128::from(dt) / 2) / u128::from(dt);
    let c = TscClock {
        tsc0: t0,
        ns0: n0,
        mult: u64::try_from(mult).ok()?,
        shift: SHIFT,
    };
    c.validate().ok()?;
    Some(c)
}

/// The time source of one process's view of a bucket: a calibrated TSC, or
/// `CLOCK_MONOTONIC`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// [`monotonic_ns`].
    Monotonic,
    /// A calibrated TSC.
    Tsc(TscClock),
}

impl Clock {
    /// Nanoseconds now, on `CLOCK_MONOTONIC`'s scale.
    #[inline(always)]
    pub fn now_ns(&self) -> u64 {
        match self {
            Clock::Tsc(c) => c.now_ns(),
            Clock::Monotonic => monotonic_ns(),
        }
    }

    /// This process's clock: the TSC calibrated once (about 20 ms, on first
    /// use) if reliable, else `CLOCK_MONOTONIC`.
    pub fn process() -> Clock {
        static CLOCK: std::sync::OnceLock<Clock> = std::sync::OnceLock::new();
        *CLOCK.get_or_init(|| calibrate().map_or(Clock::Monotonic, Clock::Tsc))
    }

    /// The calibration, if this is a TSC clock.
    pub fn tsc(&self) -> Option<TscClock> {
        match self {
            Clock::Tsc(c) => Some(*c),
            Clock::Monotonic => None,
        }
    }
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

    #[test]
    fn tsc_clock_agrees_with_monotonic() {
        let Some(c) = calibrate_over(std::time::Duration::from_millis(20)) else {
            assert!(!tsc_reliable() || !cfg!(target_arch = "x86_64"));
            return;
        };
        c.validate().unwrap();
        let end = monotonic_ns() + 100_000_000;
        let mut last = c.now_ns();
        loop {
            let m0 = monotonic_ns();
            let t = c.now_ns();
            let m1 = monotonic_ns();
            assert!(t >= last, "TSC clock went back: {last} -> {t}");
            last = t;
            // Loose: 1 ms either side (calibration error over 100 ms is µs).
            assert!(t + 1_000_000 >= m0 && t <= m1 + 1_000_000, "{m0} {t} {m1}");
            if m1 >= end {
                break;
            }
        }
    }

    /// `tick_at_or_after` is the first tick whose exact time is at or
    /// after the instant asked for.
    #[test]
    fn tick_at_or_after_rounds_up() {
        for mult in [(1u64 << 32) / 3, 1 << 32, 0x1_8a3d_70a3, 1_000 << 32] {
            let c = TscClock {
                tsc0: 500,
                ns0: 1_000,
                mult,
                shift: 32,
            };
            assert_eq!(c.tick_at_or_after(0), 500);
            assert_eq!(c.tick_at_or_after(1_000), 500);
            for ns in [
                1_001,
                1_002,
                1_003,
                12_345,
                1 << 40,
                (1 << 40) + 1,
                u64::MAX / 4,
            ] {
                let t = c.tick_at_or_after(ns);
                // exact ns of tick t: ns0 + (t − tsc0) · mult / 2³²
                let at = |t: u64| u128::from(t - 500) * u128::from(mult);
                let want = u128::from(ns - 1_000) << 32;
                assert!(at(t) >= want, "{mult} {ns}: {t}");
                assert!(at(t - 1) < want, "{mult} {ns}: {t}");
                let tick_ns = mult.div_ceil(1 << 32);
                assert!(
                    c.ns_at(t) >= ns && c.ns_at(t) < ns + tick_ns,
                    "{mult} {ns}: {t}"
                );
            }
        }
    }

    #[test]
    fn bad_calibrations_are_refused() {
        let Some(c) = calibrate_over(std::time::Duration::from_millis(5)) else {
            return;
        };
        for bad in [
            TscClock { shift: 64, ..c },
            TscClock { mult: 0, ..c },
            TscClock {
                mult: u64::MAX,
                shift: 0,
                ..c
            },
            TscClock {
                tsc0: u64::MAX,
                ..c
            },
            TscClock { ns0: u64::MAX, ..c },
            TscClock {
                ns0: c.ns0 / 2,
                ..c
            },
            TscClock {
                tsc0: c.tsc0 / 2,
                ..c
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        assert_eq!(Clock::Tsc(c).tsc(), Some(c));
        let p = Clock::process();
        assert!(p.now_ns() > 0);
    }
}
