//! The dispatch policy: strict priority within caps, plus a starvation lottery.
//!
//! Each time a slot can be handed to a queued task, [`Lottery::pick`] decides
//! which priority tier gets it:
//!
//! - One draw in [`LOTTERY_ODDS`] is a *lottery draw*: a tier is chosen
//!   uniformly among the seven. If that tier is backlogged it is served, and
//!   the pick bypasses its per-priority cap (never the overall max) and, in a
//!   region, the deference to higher-priority waiters in other processes:
//!   it gets the next freed units it needs. It closes no tier above it (what
//!   is free beyond its need stays open to them), and a pick whose process
//!   does not come for them is passed over (`root.rs`).
//! - Otherwise, and when the lottery lands on an empty tier, the highest
//!   backlogged tier whose cap admits another task is served ("unused tiers
//!   never inflate lower-priority throughput").
//!
//! **Bound.** Under sustained saturation by higher priorities, a backlogged
//! tier is served on at least one dispatch in `LOTTERY_ODDS * 7` = 56 in
//! expectation (about 1.8%), whatever its cap and however much
//! higher-priority work arrives. `tests::lottery_bound_under_saturation`
//! measures it.
//!
//! The generator is xorshift64* with an explicit seed, so a test can replay a
//! sequence of decisions exactly. An in-process level keeps its own
//! [`Lottery`]; a root shared through a region draws from the region's
//! generator (one sequence for every process, advanced by CAS) and applies
//! the same rule, [`pick_tier`], to the region's backlog, so the bound holds
//! for a waiter in any process.

use crate::priority::LEVELS;

/// One draw in this many is a lottery draw.
pub const LOTTERY_ODDS: u64 = 8;

/// A dispatch decision: which tier, and whether it was a lottery win.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pick {
    /// Tier index (priority + 3).
    pub tier: usize,
    /// True if the lottery chose this tier; such a pick ignores the tier's
    /// per-priority cap (but never the overall max).
    pub lottery: bool,
}

/// Seeded xorshift64* generator plus the pick rule.
#[derive(Debug, Clone)]
pub(crate) struct Lottery {
    state: u64,
    /// Tests of strict priority switch the lottery off.
    pub enabled: bool,
}

impl Lottery {
    /// A lottery with a fixed seed (0 is remapped: xorshift needs a nonzero state).
    pub fn new(seed: u64) -> Lottery {
        Lottery {
            state: if seed == 0 {
                0x9E37_79B9_7F4A_7C15
            } else {
                seed
            },
            enabled: true,
        }
    }

    fn next(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Chooses a tier among `backlogged` (bit `i` = tier `i` has queued
    /// tasks); `admissible` has bit `i` set when tier `i`'s cap admits one
    /// more task now. Returns `None` when no tier may be served.
    #[cfg_attr(not(test), allow(dead_code))] // dispatch uses `pick_lazy`
    pub fn pick(&mut self, backlogged: u8, admissible: u8) -> Option<Pick> {
        if backlogged == 0 {
            return None;
        }
        let r = self.next();
        pick_tier(r, self.enabled, backlogged, admissible)
    }

    /// [`pick`](Self::pick) with admissibility asked per tier, highest
    /// backlogged first, and only as far as the pick needs: the same draw
    /// and the same decision as `pick(backlogged, mask of admits)`, without
    /// looking at every tier's front when the highest one is admitted
    /// (the common case of a dispatch).
    #[inline]
    pub fn pick_lazy(&mut self, backlogged: u8, admits: impl Fn(usize) -> bool) -> Option<Pick> {
        if backlogged == 0 {
            return None;
        }
        let r = self.next();
        if let Some(p) = lottery_hit(r, self.enabled, backlogged) {
            return Some(p);
        }
        let mut left = backlogged;
        while left != 0 {
            let tier = highest_bit(left);
            if admits(tier) {
                return Some(Pick {
                    tier,
                    lottery: false,
                });
            }
            left &= !(1 << tier);
        }
        None
    }
}

/// The lottery half of the pick rule: a hit on a backlogged tier, if draw
/// `r` is one.
#[inline(always)]
fn lottery_hit(r: u64, enabled: bool, backlogged: u8) -> Option<Pick> {
    if enabled && r % LOTTERY_ODDS == 0 {
        let tier = ((r >> 32) % LEVELS as u64) as usize;
        if backlogged & (1 << tier) != 0 {
            return Some(Pick {
                tier,
                lottery: true,
            });
        }
    }
    None
}

/// The pick rule for one random draw `r` (see the module docs).
pub(crate) fn pick_tier(r: u64, enabled: bool, backlogged: u8, admissible: u8) -> Option<Pick> {
    if backlogged == 0 {
        return None;
    }
    if let Some(p) = lottery_hit(r, enabled, backlogged) {
        return Some(p);
    }
    let eligible = backlogged & admissible;
    if eligible == 0 {
        return None;
    }
    Some(Pick {
        tier: highest_bit(eligible),
        lottery: false,
    })
}

/// Index of the highest set bit of a nonzero byte.
pub(crate) fn highest_bit(mask: u8) -> usize {
    7 - mask.leading_zeros() as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_priority_without_lottery_hits() {
        let mut l = Lottery::new(1);
        let mut lottery_wins = 0;
        for _ in 0..10_000 {
            let p = l.pick(0b000_0101, 0b111_1111).unwrap();
            if p.lottery {
                lottery_wins += 1;
            } else {
                assert_eq!(p.tier, 2, "highest backlogged tier is served");
            }
        }
        // Two backlogged tiers of seven: about 2/56 of draws are lottery wins.
        assert!((200..=500).contains(&lottery_wins), "{lottery_wins}");
    }

    #[test]
    fn nothing_backlogged_or_admissible() {
        let mut l = Lottery::new(7);
        assert_eq!(l.pick(0, 0xff), None);
        // Backlogged but capped: only lottery wins are served.
        let served = (0..5600).filter_map(|_| l.pick(0b1, 0)).count();
        assert!((50..=160).contains(&served), "{served}");
    }

    #[test]
    fn lottery_bound_under_saturation() {
        // Every tier backlogged; only the top tier is within its cap (the
        // others are capped). Each lower tier must still get about 1/56.
        let mut l = Lottery::new(0xDEAD_BEEF);
        let mut served = [0u32; LEVELS];
        let draws = 56_000;
        for _ in 0..draws {
            if let Some(p) = l.pick(0x7f, 0b100_0000) {
                served[p.tier] += 1;
            }
        }
        for (tier, &n) in served.iter().enumerate().take(6) {
            assert!(n >= 700, "tier {tier} got {n} of {draws} (bound is ~1000)");
        }
        assert!(served[6] >= 48_000);
    }

    #[test]
    fn lazy_pick_decides_as_pick() {
        // Same seed, every backlog and admissible mask: the same draws and
        // the same decisions, lottery on and off.
        for enabled in [true, false] {
            let mut a = Lottery::new(99);
            let mut b = Lottery::new(99);
            a.enabled = enabled;
            b.enabled = enabled;
            for round in 0..4 {
                for backlogged in 0..=0x7fu8 {
                    let admissible = backlogged.rotate_left(round) ^ (round as u8 * 0x25);
                    let admissible = admissible & 0x7f;
                    assert_eq!(
                        a.pick(backlogged, admissible),
                        b.pick_lazy(backlogged, |t| admissible & (1 << t) != 0),
                        "backlogged {backlogged:#x} admissible {admissible:#x}"
                    );
                }
            }
        }
    }

    #[test]
    fn same_seed_same_decisions() {
        let mut a = Lottery::new(42);
        let mut b = Lottery::new(42);
        for _ in 0..1000 {
            assert_eq!(a.pick(0x55, 0x0f), b.pick(0x55, 0x0f));
        }
    }
}
