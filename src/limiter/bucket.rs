//! The token bucket as one atomic word: GCRA on a virtual clock.
//!
//! # How it works
//!
//! A bucket of capacity `cap` (its burst; one second of rate unless set)
//! refilled at `rate` tokens per second is kept as a single number, `tat`
//! (the "theoretical arrival time" of the generic cell-rate algorithm),
//! measured in *token units* of a virtual clock
//!
//! ```text
//! v(now) = base_v + ⌊(now_ns − base_ns) · rate / 10⁹⌋  (tokens ever refilled)
//! tokens(now) = cap − max(0, tat − v(now))             (≤ cap; < 0 means debt)
//! ```
//!
//! `(base_ns, base_v)` is where the current rate took effect: a bucket
//! starts at `(epoch, V_BIAS)`, and a rate change at time `t` re-bases it
//! at `(t, v_old(t))`, so the virtual clock never jumps (see `params.rs`).
//!
//! **A capacity change keeps the balance, up to the new capacity**
//! ([`Gcra::recapped`]): `tokens' = min(tokens, cap')`, never more (no
//! tokens appear: 100 → 100,000 on a full bucket leaves 100) and never less
//! (no debt appears: 1,000 → 100 with 200 left leaves 100). With `tat` at
//! least `v` (a full bucket's word is raised to `v` first, which changes no
//! balance: a charge starts from `max(tat, v)`), the clock is re-based at
//! `(t, v_old(t) + cap − cap')`: `cap' − (tat − v')` is then `min(cap',
//! tokens)` in both directions. It is one write of the parameters, so
//! every process sees the old bucket or the new one, never a mix. The clock
//! so moves by the sum of the capacity changes, at most `2³¹` below where
//! it would be: a bucket starts at [`V_BIAS`] = 2³¹, so it never goes
//! below 0. `v − V_BIAS` ("clock" in the stats) is then what was refilled
//! plus the initial capacity minus the current one, and `clock + capacity −
//! tokens` bounds, exactly, everything ever consumed, across changes.
//!
//! `tat ≤ v` means the bucket is full; every charge of `n` tokens sets
//! `tat ← max(tat, v) + n` with one compare-and-swap. A normal charge is
//! allowed when the bucket holds at least `min(n, cap)` tokens (a request
//! larger than the capacity goes through only on a full bucket, into debt);
//! a forced charge (the anti-starvation force-through) is always allowed and
//! may leave `tokens` negative. A new bucket has `tat = 0 = v(epoch)`: it
//! starts full. Refill is continuous: nothing ever has to "add" tokens.
//!
//! # What it guarantees
//!
//! - **No token is created or lost by a race.** The whole state is one
//!   word and every charge is one CAS that adds exactly `n` to a value
//!   `≥ tat`, so for any set of successful charges `Σn ≤ tat_final`, i.e.
//!   `Σn ≤ cap + v(now) − tokens(now)` at every instant, exactly.
//! - **A process dying mid-update cannot corrupt it**: a CAS either happened
//!   or did not.
//! - **Integer exactness.** `v` is computed from absolute elapsed time
//!   (seconds · rate + ⌊nanos · rate / 10⁹⌋), so rounding never accumulates.
//!
//! # Bounds (overflow)
//!
//! `rate, cap ≤ 2³¹ − 1` and `n ≤ 2³¹ − 1` (the seed's Int32 rule). `v` is
//! saturated at [`V_MAX`] = 2⁶² tokens, which the clock reaches after
//! 2⁶²/rate seconds: at least 2³¹ s ≈ 68 years after the bucket's epoch at
//! the highest rate; at lower rates it stops 2⁶¹ ns (73 years) after its
//! base ([`E_MAX`]). `tat` may run ahead of `v` by at most `cap` plus
//! [`MAX_LEAD`] (2⁵⁰ tokens of debt); a word beyond that was scribbled on
//! and is reported as an error, never used. Legitimate use never gets near
//! it: a force-through is allowed only while the bucket is not in debt, so
//! debt stays below one request (2³¹). All sums stay below 2⁶³.

use crate::sync::atomic::{AtomicU64, Ordering};

/// Nanoseconds per second.
const NS: u64 = 1_000_000_000;

/// The virtual clock saturates here (see the module docs).
pub const V_MAX: u64 = 1 << 62;

/// The elapsed time since the clock's base that [`Gcra::v`] counts at
/// most: 2⁶¹ ns, about 73 years (the clock stops there, unless it reached
/// [`V_MAX`] before: after 68 years at the highest rate).
pub const E_MAX: u64 = 1 << 61;

/// Where a new bucket's virtual clock starts: room below it for the
/// capacity changes to move it down by (see the module docs).
pub const V_BIAS: u64 = 1 << 31;

/// How far `tat` may lead `v(now) + cap` (debt) before the word is taken
/// for corrupt.
pub const MAX_LEAD: u64 = 1 << 50;

/// How a charge treats a bucket without enough tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Needs `min(n, cap)` tokens; an oversize request may go into debt on a
    /// full bucket.
    Normal,
    /// Needs all `n` tokens; never goes into debt (`try_consume`).
    Exact,
    /// Always charges, into debt if need be (the force-through).
    Force,
}

/// Why a charge did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Not enough tokens; they will be there once `v` reaches this value
    /// (if nobody else charges meanwhile).
    Until(u64),
    /// The word holds `tat` while the clock is at `v`: scribbled.
    Corrupt {
        /// The stored word.
        tat: u64,
        /// The virtual clock now.
        v: u64,
    },
}

/// A successful charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Charged {
    /// The `tat` this charge stored.
    pub tat: u64,
    /// The charge left the bucket in debt (tokens < 0).
    pub debt: bool,
}

/// The arithmetic of one bucket: its rate, its capacity and the point its
/// virtual clock is based on. The state word lives elsewhere (process
/// memory or a region).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gcra {
    rate: u64,
    cap: u64,
    base_ns: u64,
    base_v: u64,
}

impl Gcra {
    /// `rate` and `cap` are validated by the caller (1..=2³¹−1); the clock
    /// starts at `epoch_ns` with 0 tokens ever refilled (at [`V_BIAS`]).
    pub fn new(rate: u32, cap: u32, epoch_ns: u64) -> Gcra {
        Gcra::based(rate, cap, epoch_ns, V_BIAS)
    }

    /// The stats' "clock" of a virtual clock reading `v`: tokens refilled
    /// since the bucket's creation, plus its initial capacity, minus its
    /// capacity now (see the module docs).
    pub fn refilled(v: u64) -> u64 {
        v.saturating_sub(V_BIAS)
    }

    /// The bucket from `now_ns` on with `rate` and `cap`, the balance kept
    /// up to the new capacity (see the module docs): the clock re-based at
    /// `now_ns` (moved by the capacity change), after raising `word` to the
    /// clock if the bucket is full. To be called by the parameters' one
    /// writer; a charge that read the old parameters and lands after the
    /// change is judged by the parameters it read, as for a rate change.
    pub fn recapped(&self, word: &AtomicU64, now_ns: u64, rate: u32, cap: u32) -> Gcra {
        let v = self.v(now_ns);
        let cap64 = u64::from(cap);
        if cap64 == self.cap {
            return Gcra::based(rate, cap, now_ns, v);
        }
        let mut t = word.load(Ordering::Acquire);
        while t < v {
            match word.compare_exchange_weak(t, v, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(cur) => t = cur,
            }
        }
        Gcra::based(rate, cap, now_ns, (v + self.cap).saturating_sub(cap64))
    }

    /// A bucket whose clock reads `base_v` at `base_ns`.
    #[inline]
    pub fn based(rate: u32, cap: u32, base_ns: u64, base_v: u64) -> Gcra {
        Gcra {
            rate: u64::from(rate),
            cap: u64::from(cap),
            base_ns,
            base_v: base_v.min(V_MAX),
        }
    }

    /// The refill rate, tokens per second.
    #[inline]
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// The capacity (burst).
    #[inline]
    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// The base of the virtual clock: `(base_ns, base_v)`.
    pub fn base(&self) -> (u64, u64) {
        (self.base_ns, self.base_v)
    }

    /// Tokens ever refilled at `now_ns`: `base_v + ⌊elapsed · rate / 10⁹⌋`,
    /// saturated at [`V_MAX`], the elapsed time at [`E_MAX`]. No 128-bit
    /// division: `secs · rate + ⌊nanos · rate / 10⁹⌋` with `nanos · rate <
    /// 2⁶¹`. With the elapsed time bounded, no sum can overflow (`secs <
    /// 2.31·10⁹`, `rate < 2³²`, `base_v ≤ 2⁶²`: below 1.5·10¹⁹ < 2⁶⁴), so
    /// the arithmetic needs no saturating steps (5 instructions a charge).
    #[inline]
    pub fn v(&self, now_ns: u64) -> u64 {
        let e = now_ns.saturating_sub(self.base_ns).min(E_MAX);
        let (s, ns) = (e / NS, e % NS);
        (s * self.rate + ns * self.rate / NS + self.base_v).min(V_MAX)
    }

    /// The earliest instant (ns) at which `v` reaches `target`.
    pub fn instant_of(&self, target: u64) -> u64 {
        let Some(d) = target.checked_sub(self.base_v) else {
            return self.base_ns;
        };
        // Smallest e with ⌊e·rate/10⁹⌋ ≥ d is ⌈d·10⁹/rate⌉.
        let e = (u128::from(d) * u128::from(NS)).div_ceil(u128::from(self.rate));
        self.base_ns
            .saturating_add(u64::try_from(e).unwrap_or(u64::MAX))
    }

    /// Tokens held given the word `tat` at clock `v` (negative in debt).
    #[inline]
    pub fn tokens(&self, tat: u64, v: u64) -> i64 {
        // Both below 2^63 once validated; saturate anyway.
        let lead = tat.saturating_sub(v).min(i64::MAX as u64) as i64;
        self.cap as i64 - lead
    }

    #[inline]
    fn corrupt(&self, tat: u64, v: u64) -> bool {
        tat > v + self.cap + MAX_LEAD
    }

    /// Charges `n` (≤ 2³¹−1) tokens at `now_ns` on the word `word`.
    #[inline]
    pub fn charge(
        &self,
        word: &AtomicU64,
        n: u64,
        now_ns: u64,
        mode: Mode,
    ) -> Result<Charged, Refused> {
        let v = self.v(now_ns);
        let limit = v + self.cap; // tat may reach this without debt
        let need = match mode {
            Mode::Normal => n.min(self.cap),
            Mode::Exact | Mode::Force => n,
        };
        let mut t = word.load(Ordering::Acquire);
        loop {
            if self.corrupt(t, v) {
                return Err(Refused::Corrupt { tat: t, v });
            }
            let base = t.max(v);
            if mode == Mode::Force {
                // Never into debt on top of debt: the balance must be
                // non-negative first (this bounds debt below one request).
                if t > limit {
                    return Err(Refused::Until(t - self.cap));
                }
            } else if base + need > limit {
                return Err(Refused::Until(base + need - self.cap));
            }
            let new = base + n;
            match word.compare_exchange_weak(t, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    return Ok(Charged {
                        tat: new,
                        debt: new > limit,
                    })
                }
                Err(cur) => t = cur,
            }
        }
    }

    /// Gives back `n` tokens charged earlier and not used (a wait cancelled
    /// after some levels of a chain were charged, a grant nobody took).
    /// Never creates tokens: the balance rises by at most `n` and never
    /// above the capacity.
    pub fn refund(&self, word: &AtomicU64, n: u64) {
        let mut t = word.load(Ordering::Acquire);
        loop {
            let new = t.saturating_sub(n);
            match word.compare_exchange_weak(t, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(cur) => t = cur,
            }
        }
    }

    /// `(tokens, v)` read from `word` at `now_ns`, or the corrupt word.
    pub fn read(&self, word: &AtomicU64, now_ns: u64) -> Result<(i64, u64), Refused> {
        let v = self.v(now_ns);
        let t = word.load(Ordering::Acquire);
        if self.corrupt(t, v) {
            return Err(Refused::Corrupt { tat: t, v });
        }
        Ok((self.tokens(t, v), v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_full_refills_continuously_and_caps() {
        let g = Gcra::new(1000, 1000, 5 * NS);
        let w = AtomicU64::new(0);
        assert_eq!(g.read(&w, 5 * NS).unwrap().0, 1000);
        g.charge(&w, 1000, 5 * NS, Mode::Normal).unwrap();
        assert_eq!(g.read(&w, 5 * NS).unwrap().0, 0);
        // 1 ms later: exactly one token.
        assert_eq!(g.read(&w, 5 * NS + 1_000_000).unwrap().0, 1);
        assert_eq!(g.read(&w, 5 * NS + 999_999).unwrap().0, 0);
        // Long idle: capped at capacity.
        assert_eq!(g.read(&w, 100 * NS).unwrap().0, 1000);
        // A charge on an over-full bucket starts from v, not from the old tat.
        g.charge(&w, 10, 100 * NS, Mode::Normal).unwrap();
        assert_eq!(g.read(&w, 100 * NS).unwrap().0, 990);
    }

    #[test]
    fn refusal_says_when() {
        let g = Gcra::new(1000, 1000, 0);
        let w = AtomicU64::new(0);
        g.charge(&w, 1000, 0, Mode::Normal).unwrap();
        let Err(Refused::Until(v)) = g.charge(&w, 10, 0, Mode::Normal) else {
            panic!()
        };
        assert_eq!(v, V_BIAS + 10);
        let at = g.instant_of(v);
        assert_eq!(at, 10_000_000);
        assert!(g.charge(&w, 10, at - 1, Mode::Normal).is_err());
        assert!(g.charge(&w, 10, at, Mode::Normal).is_ok());
    }

    #[test]
    fn oversize_only_on_full_bucket_into_debt() {
        let g = Gcra::new(100, 100, 0);
        let w = AtomicU64::new(0);
        assert!(g.charge(&w, 150, 0, Mode::Exact).is_err());
        let c = g.charge(&w, 150, 0, Mode::Normal).unwrap();
        assert!(c.debt);
        assert_eq!(g.read(&w, 0).unwrap().0, -50);
        // In debt: nothing normal drains until repaid and refilled.
        let Err(Refused::Until(v)) = g.charge(&w, 1, 0, Mode::Normal) else {
            panic!()
        };
        assert_eq!(v, V_BIAS + 51);
        // No force on top of debt: it waits until the debt is repaid.
        assert_eq!(
            g.charge(&w, 1, 0, Mode::Force),
            Err(Refused::Until(V_BIAS + 50))
        );
        let at = g.instant_of(V_BIAS + 50);
        let f = g.charge(&w, 1, at, Mode::Force).unwrap();
        assert!(f.debt);
        assert_eq!(g.read(&w, at).unwrap().0, -1);
    }

    #[test]
    fn rebased_clock_continues_and_burst_caps() {
        // 1000/s with a burst of 50; after 10 s the rate becomes 10/s.
        let g = Gcra::new(1000, 50, 0);
        let t = 10 * NS;
        let v = g.v(t);
        assert_eq!(v - V_BIAS, 10_000);
        let h = Gcra::based(10, 50, t, v);
        assert_eq!(h.v(t), v, "no jump at the change");
        assert_eq!(h.v(t + NS), v + 10);
        assert_eq!(h.instant_of(v + 10), t + NS);
        assert_eq!(h.instant_of(v - 5), t, "a target already reached is now");
        let w = AtomicU64::new(0);
        assert_eq!(h.read(&w, t).unwrap().0, 50, "full is the burst");
        h.charge(&w, 50, t, Mode::Normal).unwrap();
        assert!(h.charge(&w, 1, t, Mode::Normal).is_err());
    }

    #[test]
    fn capacity_changes_keep_the_balance_up_to_the_new_capacity() {
        // 1,000 → 100 with 200 left: 100, not -700.
        let g = Gcra::new(10, 1000, 0);
        let w = AtomicU64::new(0);
        g.charge(&w, 800, 0, Mode::Normal).unwrap();
        assert_eq!(g.read(&w, 0).unwrap().0, 200);
        let h = g.recapped(&w, 0, 10, 100);
        assert_eq!(h.read(&w, 0).unwrap().0, 100);
        // Back up to 1,000: still 100 (then it refills).
        let k = h.recapped(&w, 0, 10, 1000);
        assert_eq!(k.read(&w, 0).unwrap().0, 100);
        assert_eq!(k.read(&w, NS).unwrap().0, 110);
        // 100 → 100,000 on a full bucket: 100, not 100,000.
        let g = Gcra::new(100, 100, 0);
        let w = AtomicU64::new(0);
        let t = 50 * NS; // long full: the word lies far below the clock
        let h = g.recapped(&w, t, 100, 100_000);
        assert_eq!(h.read(&w, t).unwrap().0, 100);
        assert_eq!(h.read(&w, t + NS).unwrap().0, 200);
        // Down on a full bucket: the new capacity, and no debt.
        let k = h.recapped(&w, t + NS, 100, 50);
        assert_eq!(k.read(&w, t + NS).unwrap().0, 50);
        // In debt: the debt stays, whatever the change.
        let g = Gcra::new(100, 100, 0);
        let w = AtomicU64::new(0);
        g.charge(&w, 150, 0, Mode::Normal).unwrap();
        assert_eq!(g.read(&w, 0).unwrap().0, -50);
        let h = g.recapped(&w, 0, 100, 10);
        assert_eq!(h.read(&w, 0).unwrap().0, -50);
        let k = h.recapped(&w, 0, 100, 1000);
        assert_eq!(k.read(&w, 0).unwrap().0, -50);
        // The largest moves stay above 0 and below the clock's limit.
        let g = Gcra::new(1, 1, 0);
        let w = AtomicU64::new(0);
        let max = i32::MAX as u32;
        let h = g.recapped(&w, 0, 1, max);
        assert_eq!(h.read(&w, 0).unwrap().0, 1);
        assert!(h.base().1 > 0);
        let k = h.recapped(&w, 0, 1, 1);
        assert_eq!(k.read(&w, 0).unwrap().0, 1);
        assert_eq!(k.base().1, V_BIAS);
    }

    #[test]
    fn refund_never_overfills() {
        let g = Gcra::new(100, 100, 0);
        let w = AtomicU64::new(0);
        g.charge(&w, 30, 0, Mode::Normal).unwrap();
        g.refund(&w, 30);
        assert_eq!(g.read(&w, 0).unwrap().0, 100);
        g.refund(&w, 1_000);
        assert_eq!(g.read(&w, 0).unwrap().0, 100);
    }

    #[test]
    fn bounds_do_not_overflow() {
        let g = Gcra::new(i32::MAX as u32, i32::MAX as u32, 0);
        assert_eq!(g.v(u64::MAX), V_MAX);
        let w = AtomicU64::new(0);
        g.charge(&w, i32::MAX as u64, u64::MAX, Mode::Force)
            .unwrap();
        assert!(g.read(&w, u64::MAX).is_ok());
        // Half a second at the highest rate, exactly.
        assert_eq!(g.v(NS / 2) - V_BIAS, (i32::MAX as u64) / 2);
        assert_eq!(
            g.v(3 * NS + NS / 2) - V_BIAS,
            3 * (i32::MAX as u64) + (i32::MAX as u64) / 2
        );
    }

    /// `v` without saturating steps is the exact `⌊e · rate / 10⁹⌋` (in
    /// 128 bits) for any elapsed time up to [`E_MAX`], at any rate up to
    /// 2³² − 1, and stops there; it never goes back.
    #[test]
    fn v_is_exact_up_to_its_bound_and_stops_there() {
        for rate in [1u32, 7, 999_999_937, i32::MAX as u32, u32::MAX] {
            let g = Gcra::based(rate, 1, 5, V_BIAS);
            let exact = |e: u64| {
                let x = u128::from(e.min(E_MAX)) * u128::from(rate) / u128::from(NS);
                (u128::from(V_BIAS) + x).min(u128::from(V_MAX)) as u64
            };
            let mut last = 0;
            for e in [
                0,
                1,
                NS - 1,
                NS,
                NS + 1,
                3_600 * NS + 123_456_789,
                E_MAX / 3,
                E_MAX - 1,
                E_MAX,
                E_MAX + 1,
                u64::MAX - 5,
            ] {
                let v = g.v(e + 5);
                assert_eq!(v, exact(e), "rate {rate}, elapsed {e}");
                assert!(v >= last);
                last = v;
            }
        }
    }

    #[test]
    fn scribbled_word_is_an_error() {
        let g = Gcra::new(100, 100, 0);
        let w = AtomicU64::new(u64::MAX);
        assert!(matches!(g.read(&w, 0), Err(Refused::Corrupt { .. })));
        assert!(matches!(
            g.charge(&w, 1, 0, Mode::Force),
            Err(Refused::Corrupt { .. })
        ));
    }

    #[test]
    fn racing_threads_never_create_tokens() {
        let g = Gcra::new(1_000_000, 1_000_000, crate::sys::monotonic_ns());
        let w = std::sync::Arc::new(AtomicU64::new(0));
        let total: u64 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    let w = &w;
                    s.spawn(move || {
                        let mut got = 0;
                        let end = crate::sys::monotonic_ns() + 100_000_000;
                        while crate::sys::monotonic_ns() < end {
                            if g.charge(w, 7, crate::sys::monotonic_ns(), Mode::Normal)
                                .is_ok()
                            {
                                got += 7;
                            }
                        }
                        got
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        let now = crate::sys::monotonic_ns();
        let (tokens, v) = g.read(&w, now).unwrap();
        assert!(
            total as i64 <= 1_000_000 + v as i64 - tokens,
            "{total} {v} {tokens}"
        );
    }
}
