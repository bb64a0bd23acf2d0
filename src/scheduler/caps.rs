//! Concurrency configuration and per-priority cap resolution.
//!
//! The rule, applied literally:
//!
//! 1. every cap is clamped to `max`;
//! 2. priorities above the topmost explicit cap get `max`;
//! 3. an unspecified `lowest` takes the bottommost explicit cap;
//! 4. any other unspecified priority inherits the cap of the priority just
//!    below it (caps propagate upward from below, never downward).
//!
//! `{max:100, low:20, lowest:5}` → lowest=lower=5, low=20, normal…highest=100.
//! `{max:100, high:50, low:10}` → lowest…normal=10, high=50, higher=highest=100.
//!
//! A cap compares against the *total* running count of the scheduler, not a
//! per-priority count: a task at priority `p` starts on the fast path only
//! while fewer than `cap[p]` tasks run in all.

use crate::error::Error;
use crate::priority::{Priority, LEVELS};

/// The largest concurrency the seed accepts (the counter is an `Int32`).
pub const MAX_CONCURRENCY: u32 = i32::MAX as u32;

/// How many tasks may run at once, overall and per priority.
///
/// A cap compares against the *total* running count (a task at `low` with
/// `low(20)` starts only while fewer than 20 tasks of any priority run),
/// and the caps you leave unset are filled in this way:
///
/// 1. every cap is clamped to `max`;
/// 2. priorities above the topmost explicit cap get `max`;
/// 3. an unset `lowest` takes the bottommost explicit cap;
/// 4. any other unset priority takes the cap of the priority just below it.
///
/// So `max(100).low(20).lowest(5)` gives lowest = lower = 5, low = 20 and
/// normal … highest = 100; `max(100).high(50).low(10)` gives lowest … normal
/// = 10, high = 50, higher = highest = 100. The starvation lottery may let
/// a queued task past its cap (never past `max`).
///
/// ```
/// use shmsched::scheduler::Concurrency;
/// use shmsched::Priority;
/// // At most 100 in all; background work held to a small share.
/// let c = Concurrency::max(100).low(20).lowest(5);
/// let caps = c.resolve().unwrap();
/// assert_eq!(caps[Priority::Lower.index()], 5);
/// assert_eq!(caps[Priority::Normal.index()], 100);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concurrency {
    max: Option<u32>,
    caps: [Option<u32>; LEVELS],
}

impl Default for Concurrency {
    fn default() -> Self {
        Concurrency::unlimited()
    }
}

impl From<u32> for Concurrency {
    fn from(max: u32) -> Self {
        Concurrency::max(max)
    }
}

impl Concurrency {
    /// At most `max` tasks at once (0 admits nothing: blocking calls then
    /// fail at once with [`Error::ZeroConcurrency`]).
    pub const fn max(max: u32) -> Concurrency {
        Concurrency {
            max: Some(max),
            caps: [None; LEVELS],
        }
    }

    /// No overall limit (only per-priority caps, if any, and a parent's).
    pub const fn unlimited() -> Concurrency {
        Concurrency {
            max: None,
            caps: [None; LEVELS],
        }
    }

    /// The overall maximum, `None` when unlimited.
    pub const fn overall(&self) -> Option<u32> {
        self.max
    }

    /// Sets the cap of one priority.
    pub const fn cap(mut self, priority: Priority, cap: u32) -> Concurrency {
        self.caps[priority.index()] = Some(cap);
        self
    }

    /// The explicit cap of `priority`, if one was set.
    pub const fn explicit_cap(&self, priority: Priority) -> Option<u32> {
        self.caps[priority.index()]
    }

    /// Sets the `lowest` cap.
    pub const fn lowest(self, cap: u32) -> Concurrency {
        self.cap(Priority::Lowest, cap)
    }
    /// Sets the `lower` cap.
    pub const fn lower(self, cap: u32) -> Concurrency {
        self.cap(Priority::Lower, cap)
    }
    /// Sets the `low` cap.
    pub const fn low(self, cap: u32) -> Concurrency {
        self.cap(Priority::Low, cap)
    }
    /// Sets the `normal` cap.
    pub const fn normal(self, cap: u32) -> Concurrency {
        self.cap(Priority::Normal, cap)
    }
    /// Sets the `high` cap.
    pub const fn high(self, cap: u32) -> Concurrency {
        self.cap(Priority::High, cap)
    }
    /// Sets the `higher` cap.
    pub const fn higher(self, cap: u32) -> Concurrency {
        self.cap(Priority::Higher, cap)
    }
    /// Sets the `highest` cap.
    pub const fn highest(self, cap: u32) -> Concurrency {
        self.cap(Priority::Highest, cap)
    }

    /// Returns a copy whose overall max is `max` (used when the max comes
    /// from a shared region and the caps from the caller).
    pub const fn with_max(mut self, max: Option<u32>) -> Concurrency {
        self.max = max;
        self
    }

    /// Checks every value against [`MAX_CONCURRENCY`].
    pub fn validate(&self) -> Result<(), Error> {
        if let Some(m) = self.max {
            if m > MAX_CONCURRENCY {
                return Err(Error::InvalidArgument(format!(
                    "concurrency max {m} is above the limit {MAX_CONCURRENCY}"
                )));
            }
        }
        for p in Priority::ALL {
            if let Some(c) = self.caps[p.index()] {
                if c > MAX_CONCURRENCY {
                    return Err(Error::InvalidArgument(format!(
                        "concurrency cap {c} for priority {p} is above the limit {MAX_CONCURRENCY}"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Resolves the per-priority caps (index = priority + 3). Unlimited is
    /// `u32::MAX`.
    pub fn resolve(&self) -> Result<[u32; LEVELS], Error> {
        self.validate()?;
        let max = self.max.unwrap_or(u32::MAX);
        let mut out = [max; LEVELS];
        let Some(top) = (0..LEVELS).rev().find(|&i| self.caps[i].is_some()) else {
            return Ok(out);
        };
        let bottom = (0..LEVELS).find(|&i| self.caps[i].is_some()).unwrap_or(top);
        let mut below = self.caps[bottom].unwrap_or(max);
        for (i, slot) in out.iter_mut().enumerate().take(top + 1) {
            let cap = self.caps[i].unwrap_or(below);
            *slot = cap.min(max);
            below = cap;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(c: [u32; LEVELS]) -> Vec<u32> {
        c.to_vec()
    }

    #[test]
    fn seed_example_low_lowest() {
        let c = Concurrency::max(100).low(20).lowest(5).resolve().unwrap();
        assert_eq!(names(c), vec![5, 5, 20, 100, 100, 100, 100]);
    }

    #[test]
    fn seed_example_high_low() {
        let c = Concurrency::max(100).high(50).low(10).resolve().unwrap();
        assert_eq!(names(c), vec![10, 10, 10, 10, 50, 100, 100]);
    }

    #[test]
    fn caps_are_clamped_to_max() {
        let c = Concurrency::max(8).high(50).resolve().unwrap();
        assert_eq!(names(c), vec![8; 7]);
    }

    #[test]
    fn no_caps_means_max_everywhere_and_unlimited_is_u32_max() {
        assert_eq!(names(Concurrency::max(3).resolve().unwrap()), vec![3; 7]);
        assert_eq!(
            names(Concurrency::unlimited().resolve().unwrap()),
            vec![u32::MAX; 7]
        );
        let c = Concurrency::unlimited().low(2).resolve().unwrap();
        assert_eq!(
            names(c),
            vec![2, 2, 2, u32::MAX, u32::MAX, u32::MAX, u32::MAX]
        );
    }

    #[test]
    fn only_highest_explicit_seeds_everything_below() {
        let c = Concurrency::max(10).highest(4).resolve().unwrap();
        assert_eq!(names(c), vec![4; 7]);
    }

    #[test]
    fn out_of_range_values_name_value_and_limit() {
        let e = Concurrency::max(u32::MAX)
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(e.contains("4294967295") && e.contains("2147483647"), "{e}");
        let e = Concurrency::max(4)
            .low(u32::MAX)
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(e.contains("low") && e.contains("2147483647"), "{e}");
    }
}
