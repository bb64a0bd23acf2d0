//! A PSI-style pressure signal reconstructed from
//! [`Scheduler`](crate::scheduler::Scheduler) and
//! [`Limiter`](crate::limiter::Limiter) stats, for backoff decisions (the seed's "Monitoring"
//! recipe).
//!
//! # How it works
//!
//! Utilisation is the wrong trigger: a scheduler whose slots are all busy
//! but whose queue keeps draining is healthy. Pressure asks instead whether
//! work is *stalled*. Each time you feed a stats snapshot (from a loop you
//! already run; the library adds no timer) [`Pressure::update`] measures,
//! over the interval since the previous snapshot:
//!
//! - **some** — the fraction of the interval during which at least one
//!   task waited for capacity. For a scheduler it comes from the *exact*
//!   cumulative stall counter the stats carry (`stall_ns`, kept at state
//!   transitions, and region-wide for a shared object): `Δstall_ns / Δt`.
//!   It does not depend on whether anyone happens to wait at the sampling
//!   instant, so a budget stalled 90 % of the time reads 0.9 even when
//!   every sample lands in the gaps. A [`Sample`] without a counter uses
//!   the instant's predicate: for a limiter that is the seed's rule, a
//!   front blocked for ≥ [`STALL_TICKS`](crate::limiter::STALL_TICKS)
//!   ticks (≈ 1 s) or a balance in debt — waiting for the refill at the
//!   configured rate is throttling, not pressure (see
//!   [`Sample::from_limiter`]).
//! - **full** — the fraction during which nothing made progress: the
//!   *some* fraction of an interval with zero completions (a counter diff,
//!   never a gauge: region-wide for a shared object, so a process that only
//!   watches reads what the workers read), and for a limiter also debt or a
//!   fresh force-through (Δ`forced` > 0); 0 for an interval in which
//!   something completed.
//!
//! Each fraction feeds an exponentially weighted moving average with time
//! constant `tau` and a gain that depends on the real time between samples
//! (`1 − e^(−Δt/τ)`), so a jittery loop keeps the time constant honest. Two
//! Schmitt triggers (engage above `hi`, release below `lo`) turn the
//! averages into latched flags: [`shed`](Pressure::shed) (drop
//! discretionary work) from *some*, [`paused`](Pressure::paused) (stop
//! producing) from *full*.
//!
//! # What it guarantees
//!
//! A busy-but-draining scheduler scores 0 (nobody waits, so the stall
//! counter does not move); stall time between samples is never missed; a
//! one-sample blip cannot trip a flag unless `hi` is below the one-step gain;
//! a brief recovery cannot release it before the average falls below `lo`.
//! Time is explicit (`now_ns` on every call), so the signal replays
//! deterministically in tests.
//!
//! ```
//! use shmsched::pressure::{Pressure, PressureConfig, Sample};
//! use shmsched::scheduler::Scheduler;
//! use shmsched::Priority;
//!
//! # fn main() -> shmsched::Result<()> {
//! let sched = Scheduler::new(1)?;
//! let mut p = Pressure::new(PressureConfig::default())?;
//! let _busy = sched.acquire(Priority::Normal)?; // saturated, but nothing waits
//! for tick in 0..100u64 {
//!     p.update(Sample::from_scheduler(&sched.stats()), tick * 200_000_000);
//! }
//! assert_eq!(p.some(), 0.0);     // 100% utilised, 0% pressure
//! assert!(!p.shed() && !p.paused());
//! # Ok(()) }
//! ```

use serde::Serialize;

use crate::error::{Error, Result};
use crate::limiter::LimiterStats;
use crate::scheduler::SchedulerStats;

/// Time constant, thresholds and stall length of a [`Pressure`] signal.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PressureConfig {
    /// EWMA time constant in ns (default 10 s, PSI's avg10).
    pub tau_ns: u64,
    /// Engage `shed` when the *some* average rises above this (default 0.5).
    pub some_hi: f64,
    /// Release `shed` when it falls below this (default 0.2).
    pub some_lo: f64,
    /// Engage `paused` when the *full* average rises above this (default 0.3).
    pub full_hi: f64,
    /// Release `paused` when it falls below this (default 0.1).
    pub full_lo: f64,
}

impl Default for PressureConfig {
    fn default() -> Self {
        PressureConfig {
            tau_ns: 10_000_000_000,
            some_hi: 0.5,
            some_lo: 0.2,
            full_hi: 0.3,
            full_lo: 0.1,
        }
    }
}

impl PressureConfig {
    fn validate(&self) -> Result<()> {
        if self.tau_ns == 0 {
            return Err(Error::InvalidArgument(
                "pressure tau_ns 0 is out of range: must be at least 1 ns".into(),
            ));
        }
        for (name, lo, hi) in [
            ("some", self.some_lo, self.some_hi),
            ("full", self.full_lo, self.full_hi),
        ] {
            if !(0.0..=1.0).contains(&lo) || !(0.0..=1.0).contains(&hi) || lo > hi {
                return Err(Error::InvalidArgument(format!(
                    "pressure {name} thresholds lo {lo} / hi {hi} are out of range: \
                     need 0 <= lo <= hi <= 1"
                )));
            }
        }
        Ok(())
    }
}

/// One stats snapshot reduced to what the pressure signal needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Sample {
    /// Counter: nanoseconds during which at least one task waited, exact
    /// (the stats' `stall_ns`). When two consecutive samples carry it, the
    /// *some* fraction of the interval is its increase over the elapsed
    /// time; `None` falls back to `some_now`.
    pub stall_ns: Option<u64>,
    /// Is at least one task delayed right now? (Used only without
    /// `stall_ns`.)
    pub some_now: bool,
    /// Counter: items ever dispatched (`total.completed - total.cancelled`).
    pub completed: u64,
    /// Counter: force-throughs (limiter; 0 for a scheduler).
    pub forced: u64,
    /// The limiter's balance is negative.
    pub in_debt: bool,
    /// The sample comes from a limiter (full then also needs debt or a
    /// fresh force-through).
    pub limiter: bool,
}

impl Sample {
    /// From a scheduler's stats: the stall counter and the completions are
    /// the region's (any process waiting, any process's waiter served) for
    /// a shared scheduler, so every process attached reads the same
    /// pressure, one that queues nothing itself included; this scheduler's
    /// otherwise. `some_now` = a backlog (here, or waiters in other
    /// processes of a region) and no free slot.
    pub fn from_scheduler(s: &SchedulerStats) -> Sample {
        let own = s.total.completed - s.total.cancelled.min(s.total.completed);
        let (saturated, elsewhere, stall_ns, completed) = match &s.shared {
            Some(sh) => (
                sh.running >= sh.max,
                sh.waiters.iter().any(|&w| w > 0),
                sh.stall_ns,
                sh.served,
            ),
            None => (
                s.concurrency.is_some_and(|c| s.running >= u64::from(c)),
                false,
                s.stall_ns,
                own,
            ),
        };
        Sample {
            stall_ns: Some(stall_ns),
            some_now: saturated && (s.pending > 0 || elsewhere),
            completed,
            forced: 0,
            in_debt: false,
            limiter: false,
        }
    }

    /// From a limiter's stats, by the seed's rule: *some* is a priority
    /// whose front has been blocked for at least
    /// [`STALL_TICKS`](crate::limiter::STALL_TICKS) (≈ 1 s, the engine's
    /// own force-through threshold) while it has a consume queued, or the
    /// balance in debt (a force-through being repaid holds everyone up).
    /// For a shared limiter the region's fronts count too
    /// ([`SharedLimiterStats::stall`](crate::limiter::SharedLimiterStats::stall)
    /// where the region has waiters), so any process, even one that does
    /// not consume, reads the region's pressure.
    ///
    /// Ordinary throttling is not pressure: a stream consuming at exactly
    /// its rate waits for every refill yet never stalls for a second nor
    /// goes into debt, and reads 0. So the limiter's sample carries no
    /// stall counter (its `stall_ns` counts every wait, throttling
    /// included): the instant's predicate is the signal. A long stall ends
    /// in a force-through into debt, which the following samples see.
    /// For a shared limiter the completions and force-throughs are the
    /// region's (any process's), so every process attached reads the same
    /// *full*.
    pub fn from_limiter(l: &LimiterStats) -> Sample {
        let ticks = crate::limiter::STALL_TICKS;
        let mut front_stalled = l.queues.iter().any(|q| q.count > 0 && q.stall >= ticks);
        if let Some(sh) = &l.shared {
            front_stalled |= sh
                .stall
                .iter()
                .zip(sh.waiters.iter())
                .any(|(&s, &w)| w > 0 && s >= ticks);
        }
        let own = l.total.completed - l.total.cancelled.min(l.total.completed);
        let (completed, forced) = l.shared.as_ref().map_or((own, l.forced), |sh| {
            let done = sh.completed.iter().fold(0u64, |a, &c| a.saturating_add(c));
            (done, sh.forced)
        });
        Sample {
            stall_ns: None,
            some_now: front_stalled || l.tokens < 0,
            completed,
            forced,
            in_debt: l.tokens < 0,
            limiter: true,
        }
    }
}

/// A smoothed, latched pressure signal (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pressure {
    cfg: PressureConfig,
    some: f64,
    full: f64,
    shed: bool,
    paused: bool,
    /// The previous sample and its time.
    prev: Option<(Sample, u64)>,
}

impl Pressure {
    /// A signal at rest (both averages 0, no flag set).
    pub fn new(cfg: PressureConfig) -> Result<Pressure> {
        cfg.validate()?;
        Ok(Pressure {
            cfg,
            some: 0.0,
            full: 0.0,
            shed: false,
            paused: false,
            prev: None,
        })
    }

    /// Feeds one sample taken at `now_ns` (any monotonic ns clock, the one
    /// the stall counters use for exact fractions: `CLOCK_MONOTONIC`). The
    /// first sample only sets the baseline for the counter diffs. A sample
    /// not later than the previous one changes nothing.
    pub fn update(&mut self, s: Sample, now_ns: u64) {
        let Some((prev, last)) = self.prev else {
            self.prev = Some((s, now_ns));
            return;
        };
        if now_ns <= last {
            return;
        }
        let dt = (now_ns - last) as f64;
        let some = match (s.stall_ns, prev.stall_ns) {
            // A counter that went back (another handle, a reset) says
            // nothing about this interval: count it as no stall.
            (Some(now), Some(then)) => (now.saturating_sub(then) as f64 / dt).clamp(0.0, 1.0),
            _ => f64::from(u8::from(s.some_now)),
        };
        let progressed = s.completed > prev.completed;
        let stuck = !progressed && (!s.limiter || s.in_debt || s.forced > prev.forced);
        let full = if stuck { some } else { 0.0 };
        let a = 1.0 - (-dt / self.cfg.tau_ns as f64).exp();
        self.some += a * (some - self.some);
        self.full += a * (full - self.full);
        self.prev = Some((s, now_ns));
        if !self.shed && self.some > self.cfg.some_hi {
            self.shed = true;
        } else if self.shed && self.some < self.cfg.some_lo {
            self.shed = false;
        }
        if !self.paused && self.full > self.cfg.full_hi {
            self.paused = true;
        } else if self.paused && self.full < self.cfg.full_lo {
            self.paused = false;
        }
    }

    /// The *some* average: the recent fraction of time with a delayed task.
    pub fn some(&self) -> f64 {
        self.some
    }

    /// The *full* average: the recent fraction of time with no progress.
    pub fn full(&self) -> f64 {
        self.full
    }

    /// Latched: shed discretionary work.
    pub fn shed(&self) -> bool {
        self.shed
    }

    /// Latched: pause the producer.
    pub fn paused(&self) -> bool {
        self.paused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: u64 = 200_000_000;

    fn stalled(completed: u64) -> Sample {
        Sample {
            some_now: true,
            completed,
            ..Sample::default()
        }
    }

    #[test]
    fn config_is_validated() {
        let ok = PressureConfig::default();
        assert!(Pressure::new(ok).is_ok());
        assert!(Pressure::new(PressureConfig { tau_ns: 0, ..ok }).is_err());
        let e = Pressure::new(PressureConfig { some_lo: 0.6, ..ok }).unwrap_err();
        assert!(e.to_string().contains("0.6"), "{e}");
        assert!(Pressure::new(PressureConfig { full_hi: 1.5, ..ok }).is_err());
    }

    #[test]
    fn sustained_stall_engages_then_hysteresis_releases_late() {
        let mut p = Pressure::new(PressureConfig::default()).unwrap();
        let mut t = 0;
        // Stalled but progressing: some rises, full stays 0.
        let mut engaged_at = None;
        for i in 0..200u64 {
            t += TICK;
            p.update(stalled(i), t);
            if p.shed() && engaged_at.is_none() {
                engaged_at = Some(t);
            }
        }
        // 0.5 is crossed after tau * ln 2 ≈ 6.9 s.
        let at = engaged_at.expect("shed engaged") as f64 / 1e9;
        assert!((6.5..7.5).contains(&at), "{at}");
        assert_eq!(p.full(), 0.0);
        assert!(!p.paused());
        // Recovery: released only below 0.2, well after falling below 0.5.
        let mut released_at = None;
        for i in 0..200u64 {
            t += TICK;
            p.update(
                Sample {
                    completed: 1000 + i,
                    ..Sample::default()
                },
                t,
            );
            if !p.shed() && released_at.is_none() {
                released_at = Some(t);
            }
        }
        assert!(released_at.is_some());
    }

    #[test]
    fn the_counter_gives_the_stalled_fraction_whatever_the_instant() {
        // Stalled 90 % of every 200 ms interval, never at a sampling instant.
        let mut p = Pressure::new(PressureConfig::default()).unwrap();
        for i in 0..400u64 {
            let s = Sample {
                stall_ns: Some(i * TICK * 9 / 10),
                some_now: false,
                completed: i,
                ..Sample::default()
            };
            p.update(s, i * TICK);
        }
        assert!((p.some() - 0.9).abs() < 1e-3, "{}", p.some());
        assert!(p.shed());
        assert_eq!(p.full(), 0.0, "progress every interval");
        // Nothing completes any more: the stalled fraction is "full" too.
        for i in 400..800u64 {
            let s = Sample {
                stall_ns: Some(i * TICK * 9 / 10),
                completed: 400,
                ..Sample::default()
            };
            p.update(s, i * TICK);
        }
        assert!((p.full() - 0.9).abs() < 1e-3, "{}", p.full());
        assert!(p.paused());
        // A counter that goes back counts as no stall, never negative.
        p.update(
            Sample {
                stall_ns: Some(0),
                completed: 401,
                ..Sample::default()
            },
            801 * TICK,
        );
        assert!(p.some() < 0.9 && p.some() > 0.0);
    }

    #[test]
    fn full_needs_no_progress_and_for_a_limiter_debt() {
        let mut p = Pressure::new(PressureConfig::default()).unwrap();
        for i in 0..100u64 {
            p.update(stalled(5), i * TICK);
        }
        assert!(p.paused() && p.full() > 0.3);
        // A limiter stalled without debt or force-through is not "full".
        let mut q = Pressure::new(PressureConfig::default()).unwrap();
        for i in 0..100u64 {
            let s = Sample {
                limiter: true,
                ..stalled(5)
            };
            q.update(s, i * TICK);
        }
        assert_eq!(q.full(), 0.0);
        assert!(q.shed());
    }

    #[test]
    fn a_limiter_sample_follows_the_seeds_rule() {
        use crate::limiter::{LimiterStats, SharedLimiterStats, STALL_TICKS};
        let mut l = LimiterStats::default();
        l.queues[3].count = 1;
        l.queues[3].stall = STALL_TICKS - 1; // throttled, not stalled
        let s = Sample::from_limiter(&l);
        assert_eq!(s.stall_ns, None, "the wait counter includes throttling");
        assert!(!s.some_now);
        l.queues[3].stall = STALL_TICKS;
        assert!(Sample::from_limiter(&l).some_now);
        l.queues[3].count = 0; // a stall figure without a queued consume
        assert!(!Sample::from_limiter(&l).some_now);
        l.tokens = -1;
        assert!(Sample::from_limiter(&l).some_now, "debt");
        l.tokens = 0;
        let mut sh = SharedLimiterStats::default();
        sh.stall[0] = STALL_TICKS;
        l.shared = Some(sh.clone());
        assert!(!Sample::from_limiter(&l).some_now, "no waiter there");
        sh.waiters[0] = 1;
        l.shared = Some(sh);
        assert!(Sample::from_limiter(&l).some_now, "the region's front");
    }
}
