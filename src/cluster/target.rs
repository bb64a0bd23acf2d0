//! What an agent moves: a shared Scheduler's ceiling or a shared Limiter's
//! rate, and what it measures there (what the host may hold, what it uses
//! and what waits).

use crate::limiter::Limiter;
use crate::priority::{Priority, LEVELS};
use crate::region::registry::Registry;
use crate::scheduler::Scheduler;

use super::client::BANDS;
use super::ClusterError;

/// The object whose budget an [`Agent`](super::Agent) leases: a Scheduler
/// or a Limiter shared through a region (its root; the agent holds a clone
/// of the handle).
#[derive(Debug, Clone)]
pub enum Target {
    /// A shared scheduler: the lease moves its ceiling (units are slots).
    Scheduler(Scheduler),
    /// A shared limiter: the lease moves its rate (units are tokens per
    /// second; the bucket stays local, its burst scaled with the rate).
    Limiter(Limiter),
}

impl From<&Scheduler> for Target {
    fn from(s: &Scheduler) -> Self {
        Target::Scheduler(s.clone())
    }
}

impl From<Scheduler> for Target {
    fn from(s: Scheduler) -> Self {
        Target::Scheduler(s)
    }
}

impl From<&Limiter> for Target {
    fn from(l: &Limiter) -> Self {
        Target::Limiter(l.clone())
    }
}

impl From<Limiter> for Target {
    fn from(l: Limiter) -> Self {
        Target::Limiter(l)
    }
}

/// One reading of the region.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Sample {
    /// The level in force: the ceiling, or the rate.
    pub level: u64,
    /// Units held now (slots; 0 for a limiter).
    pub running: u64,
    /// Tokens consumed so far (a limiter's running total; 0 for a
    /// scheduler).
    pub consumed: u64,
    /// Waiters per priority index (priority + 3).
    pub waiters: [u64; LEVELS],
}

impl Target {
    /// The region's registry (the agent line), or an error if the handle is
    /// not shared through a region (or is a forked child's).
    pub(crate) fn registry(&self) -> Result<&Registry, ClusterError> {
        let r = match self {
            Target::Scheduler(s) => s.shared_registry(),
            Target::Limiter(l) => l.shared_registry(),
        };
        r.ok_or_else(|| {
            ClusterError::Config(
                "an agent needs a Scheduler or Limiter shared through a region, in the process \
                 that made the handle"
                    .into(),
            )
        })
    }

    /// The most units this host can use: the region's max (a scheduler) or
    /// the largest rate (a limiter).
    pub(crate) fn max_units(&self) -> u64 {
        match self {
            Target::Scheduler(s) => s.stats().shared.map_or(0, |sh| u64::from(sh.max)),
            Target::Limiter(_) => crate::limiter::MAX_TOKENS_PER_SECOND,
        }
    }

    /// The smallest level the object can be set to (a rate is at least 1).
    pub(crate) fn min_units(&self) -> u64 {
        match self {
            Target::Scheduler(_) => 0,
            Target::Limiter(_) => 1,
        }
    }

    /// A limiter's burst as a multiple of its rate (1 for a scheduler).
    pub(crate) fn burst_ratio(&self) -> f64 {
        match self {
            Target::Scheduler(_) => 1.0,
            Target::Limiter(l) => {
                let r = l.tokens_per_second();
                if r == 0 {
                    1.0
                } else {
                    f64::from(l.capacity()) / f64::from(r)
                }
            }
        }
    }

    /// Moves the region to `units` (clamped to what the object accepts).
    pub(crate) fn apply(&self, units: u64, burst_ratio: f64) -> Result<(), ClusterError> {
        let units = units.clamp(self.min_units(), self.max_units());
        match self {
            Target::Scheduler(s) => {
                if u64::from(s.ceiling()) != units {
                    s.set_ceiling(units as u32)?;
                }
            }
            Target::Limiter(l) => {
                if u64::from(l.tokens_per_second()) != units {
                    let cap = ((units as f64 * burst_ratio).round() as u64)
                        .clamp(1, crate::limiter::MAX_TOKENS_PER_SECOND);
                    // Lower the burst first when going down, the rate first
                    // when going up: never a moment of both high.
                    if units < u64::from(l.tokens_per_second()) {
                        l.set_capacity(cap)?;
                        l.set_rate(units)?;
                    } else {
                        l.set_rate(units)?;
                        l.set_capacity(cap)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The burst (a limiter's capacity) that goes with `units` at `burst_ratio`
    /// (0 for a scheduler).
    pub(crate) fn burst_at(&self, units: u64, burst_ratio: f64) -> u64 {
        match self {
            Target::Scheduler(_) => 0,
            Target::Limiter(_) => ((units as f64 * burst_ratio).round() as u64)
                .clamp(1, crate::limiter::MAX_TOKENS_PER_SECOND),
        }
    }

    /// The level and burst in force now (burst 0 for a scheduler).
    pub(crate) fn own(&self) -> (u64, u64) {
        match self {
            Target::Scheduler(s) => (u64::from(s.ceiling()), 0),
            Target::Limiter(l) => (u64::from(l.tokens_per_second()), u64::from(l.capacity())),
        }
    }

    /// Moves the region back to its own level and burst (what the first
    /// agent found), lowering first whichever goes down.
    pub(crate) fn restore(&self, level: u64, burst: u64) -> Result<(), ClusterError> {
        match self {
            Target::Scheduler(_) => self.apply(level, 1.0),
            Target::Limiter(l) => {
                let level = level.clamp(1, crate::limiter::MAX_TOKENS_PER_SECOND);
                let burst = burst.clamp(1, crate::limiter::MAX_TOKENS_PER_SECOND);
                if level < u64::from(l.tokens_per_second()) {
                    l.set_capacity(burst)?;
                    l.set_rate(level)?;
                } else {
                    l.set_rate(level)?;
                    l.set_capacity(burst)?;
                }
                Ok(())
            }
        }
    }

    /// Ends a lease's hold on the region (the deadline and `GATE_LEASED`
    /// cleared) and, with `restore` (level, burst), moves the object back
    /// to it, so that no process's lapse decided before the end lowers the
    /// object after it: a scheduler does both under its ceiling lock, where
    /// a lapse re-reads the deadline; a limiter's lapse re-reads it on each
    /// attempt to publish its parameters, so disarming first is enough.
    pub(crate) fn end_lease(&self, restore: Option<(u64, u64)>) -> Result<(), ClusterError> {
        match self {
            Target::Scheduler(s) => {
                let level = restore.map(|(l, _)| l.min(self.max_units()) as u32);
                s.end_lease(level);
                Ok(())
            }
            Target::Limiter(_) => {
                self.registry()?.disarm_lease();
                match restore {
                    Some((level, burst)) => self.restore(level, burst),
                    None => Ok(()),
                }
            }
        }
    }

    /// Reads the region now.
    pub(crate) fn sample(&self) -> Sample {
        match self {
            Target::Scheduler(s) => {
                let sh = s.stats().shared.unwrap_or_default();
                Sample {
                    level: u64::from(sh.ceiling),
                    running: u64::from(sh.running),
                    consumed: 0,
                    waiters: sh.waiters.map(u64::from),
                }
            }
            Target::Limiter(l) => {
                let st = l.stats();
                let waiters = st.shared.as_ref().map_or([0; LEVELS], |sh| sh.waiters);
                Sample {
                    level: u64::from(st.tokens_per_second),
                    running: 0,
                    consumed: (st.clock as i128 - i128::from(st.tokens)).max(0) as u64,
                    waiters,
                }
            }
        }
    }

    /// True if the handle is the region's root (a child has no region-wide
    /// figures of its own).
    pub(crate) fn is_root(&self) -> bool {
        match self {
            Target::Scheduler(s) => s.stats().shared.is_some(),
            Target::Limiter(l) => l.parent().is_none() && l.stats().shared.is_some(),
        }
    }

    /// True for a limiter.
    pub(crate) fn is_limiter(&self) -> bool {
        matches!(self, Target::Limiter(_))
    }
}

/// Wants per band (highest priority first) from what a host used recently
/// and what waits now, in pool units: the safe capacity covers the
/// highest bands first, and the total is capped at what the host can use.
///
/// A region does not record the priority of running holders, so recent use
/// counts in the band of [`Priority::Normal`]; queued demand counts in its
/// own band. For a limiter, a band with waiters wants the current rate
/// once more (its backlog is unknown in tokens), so a starved host asks
/// for twice its rate at each renewal until it has its share.
pub(crate) fn wants(
    use_units: u64,
    waiters: &[u64; LEVELS],
    level: u64,
    limiter: bool,
    safe: u64,
    max_units: u64,
) -> [u64; BANDS] {
    let mut w = [0u64; BANDS];
    for p in Priority::ALL {
        // Band 0 is the highest priority.
        let band = LEVELS - 1 - p.index();
        let q = waiters[p.index()];
        w[band] = if limiter {
            if q > 0 {
                level.max(1)
            } else {
                0
            }
        } else {
            q
        };
    }
    w[LEVELS - 1 - Priority::Normal.index()] += use_units;
    // Cap the total at what the host can use.
    let mut room = max_units;
    for x in &mut w {
        *x = (*x).min(room);
        room -= *x;
    }
    // The safe capacity serves the highest bands first.
    let mut s = safe;
    for x in &mut w {
        let d = s.min(*x);
        *x -= d;
        s -= d;
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wants_put_use_at_normal_and_safe_on_top() {
        let mut q = [0u64; LEVELS];
        q[Priority::High.index()] = 3;
        q[Priority::Low.index()] = 5;
        let w = wants(4, &q, 10, false, 0, 100);
        let band = |p: Priority| LEVELS - 1 - p.index();
        assert_eq!(w[band(Priority::High)], 3);
        assert_eq!(w[band(Priority::Normal)], 4);
        assert_eq!(w[band(Priority::Low)], 5);
        // Safe 5 covers high (3) then 2 of normal.
        let w = wants(4, &q, 10, false, 5, 100);
        assert_eq!(w.iter().sum::<u64>(), 7);
        assert_eq!(w[band(Priority::High)], 0);
        assert_eq!(w[band(Priority::Normal)], 2);
        // Capped at what the host can use: 10 in all, high first.
        let w = wants(4, &q, 10, false, 0, 10);
        assert_eq!(w.iter().sum::<u64>(), 10);
        assert_eq!(w[band(Priority::Low)], 3);
        // A limiter with a backlog asks for its rate once more.
        let w = wants(100, &q, 100, true, 0, 1000);
        assert_eq!(w[band(Priority::High)], 100);
        assert_eq!(w[band(Priority::Normal)], 100);
    }
}
