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
//! - **The fast path's clock is never ahead.** The consume fast path
//!   computes `v` from the raw clock reading (TSC ticks) with one multiply
//!   ([`Hot`]), every rounding down, so it never runs ahead of the exact
//!   (rational) clock that this one also never passes, and lags it by less
//!   than two tokens and a tick's refill: whichever path charged, the
//!   bound above holds against the exact clock, and the long-run rate
//!   never exceeds the configured one.
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
use crate::sys::clock::Clock;

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
        charge_at(self.cap, word, n, self.v(now_ns), mode)
    }

    /// The fast path's form of this bucket on `clock` ([`Hot`]): the
    /// virtual clock as a function of the clock's raw reading, `base_v +
    /// ⌊(tick − base_tick) · k / 2^s⌋`, never ahead of [`v`](Self::v)'s
    /// exact rational value (see [`Hot`]).
    pub fn hot(&self, clock: &Clock) -> Hot {
        let (k, s) = tick_rate(self.rate, clock);
        let base_tick = match clock {
            Clock::Monotonic => self.base_ns,
            Clock::Tsc(c) => c.tick_at_or_after(self.base_ns),
        };
        // The largest elapsed time with (e · k) >> s ≤ V_MAX − base_v.
        let room = u128::from(V_MAX - self.base_v.min(V_MAX)) + 1;
        let e_max = ((room << s) - 1)
            .checked_div(u128::from(k))
            .map_or(u64::MAX, |e| u64::try_from(e).unwrap_or(u64::MAX));
        Hot {
            cap: self.cap,
            base_tick,
            base_v: self.base_v.min(V_MAX),
            k,
            s: s | if matches!(clock, Clock::Tsc(_)) {
                HOT_TSC
            } else {
                0
            },
            e_max,
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

/// Charges `n` tokens on `word` with the virtual clock at `v`, for a
/// bucket of capacity `cap` (see the module docs): one CAS.
#[inline(always)]
fn charge_at(cap: u64, word: &AtomicU64, n: u64, v: u64, mode: Mode) -> Result<Charged, Refused> {
    let limit = v + cap; // tat may reach this without debt
    let need = match mode {
        Mode::Normal => n.min(cap),
        Mode::Exact | Mode::Force => n,
    };
    // The highest start `max(tat, v)` a normal or exact charge may have:
    // `base + need ≤ limit`, tested as `base ≤ top` with `top` computed
    // once, outside the CAS loop and without a saturating add in it (a
    // normal charge's `need ≤ cap`, so its `top ≥ v`; an exact charge
    // larger than `limit` has none and is refused whatever the word).
    let top = match mode {
        Mode::Normal => Some(v + (cap - need)),
        Mode::Exact | Mode::Force => limit.checked_sub(need),
    };
    let mut t = word.load(Ordering::Acquire);
    loop {
        let base = t.max(v);
        // Force: never into debt on top of debt, the balance must be
        // non-negative first (this bounds debt below one request).
        let go = if mode == Mode::Force {
            t <= limit
        } else {
            top.is_some_and(|top| base <= top)
        };
        if !go {
            // A scribbled word can only be refused (it is above `limit`):
            // the check costs the charge nothing.
            if t > limit + MAX_LEAD {
                return Err(Refused::Corrupt { tat: t, v });
            }
            return Err(Refused::Until(if mode == Mode::Force {
                t - cap
            } else {
                base + need - cap
            }));
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

/// [`charge_at`] for a request within the capacity (`n ≤ cap`), given
/// `top = v + cap − n` instead of `cap`: a normal and an exact charge are
/// then the same (both need all `n` tokens), and neither can go into debt
/// (a charge from at most `top` ends at most at `v + cap`). So the
/// consume's first look keeps two values for the bucket (`v`, `top`)
/// where `charge_at` keeps three. Refusals are `charge_at`'s, to the
/// value: `v + cap` is `top + n`, and `base + n − cap` is `base − top + v`.
#[inline(always)]
pub(crate) fn charge_within(word: &AtomicU64, n: u64, v: u64, top: u64) -> Result<(), Refused> {
    let mut t = word.load(Ordering::Acquire);
    loop {
        let base = t.max(v);
        if base > top {
            if t > top + n + MAX_LEAD {
                return Err(Refused::Corrupt { tat: t, v });
            }
            return Err(Refused::Until(base - top + v));
        }
        match word.compare_exchange_weak(t, base + n, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(()),
            Err(cur) => t = cur,
        }
    }
}

/// The bit of [`Hot`]'s `s` word that says the clock is the TSC (clear:
/// `CLOCK_MONOTONIC`).
pub(crate) const HOT_TSC: u32 = 1 << 8;

/// A bucket as its consume fast path sees it: the virtual clock computed
/// from the raw reading of its clock (TSC ticks, or nanoseconds of
/// `CLOCK_MONOTONIC`) with one multiply,
///
/// ```text
/// v(tick) = base_v + ⌊(tick − base_tick) · k / 2^s⌋    (64 × 64 → 128 bits)
/// ```
///
/// where `k / 2^s` is the bucket's tokens per tick, rounded down, with 63
/// or 64 significant bits ([`tick_rate`]), and `base_tick` is the first
/// tick at or after the clock's base instant (`base_ns`, mapped with the
/// calibration, rounded up). Derived from a [`Gcra`] and its [`Clock`] by
/// [`Gcra::hot`], once per change of the parameters, by every process
/// from the same stored words (a region's calibration is the one its
/// creator stored), so every process computes the same function.
///
/// **It never runs ahead of the exact clock.** Let `V(t)` be the exact
/// (rational) virtual clock `base_v + (ns(t) − base_ns) · rate / 10⁹`,
/// with `ns(t) = ns0 + (t − tsc0) · mult / 2^shift` the calibration
/// without its rounding. Both rounding steps go down: `ns(base_tick) ≥
/// base_ns`, and `k / 2^s ≤` the exact tokens per tick, so `v(t) ≤ V(t)`
/// at every tick; [`Gcra::v`] (the slow paths' clock, through the rounded
/// nanoseconds) is `≤ V(t)` too. The bucket's bound `Σn ≤ cap + V(now) −
/// tokens(now)` so holds whichever path charged, and the long-run rate
/// never exceeds the configured one. It lags `V` by less than two tokens
/// plus one tick's refill, never accumulating: the tick's for `base_tick`
/// rounded up (below a token on any clock at least as fast as the rate:
/// a TSC of a GHz or more), one for the final rounding, and `e · (r −
/// k/2^s) < e · 2⁻ˢ` for `k`'s, below one token while `e · 2⁻ˢ < 1` (`s =
/// 63` below a token per tick: 2⁶³ ticks, a century at 3 GHz; else `k ≥
/// 2⁶³`, a relative error below 2⁻⁶³ of the refill). A change of the
/// parameters re-bases the clock on the slow path's reading, which is not
/// ahead of `V` either, so no change creates tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hot {
    /// The capacity (burst).
    pub cap: u64,
    /// The clock reading (TSC ticks, or ns) at which `v` is `base_v`.
    pub base_tick: u64,
    /// The virtual clock at `base_tick`.
    pub base_v: u64,
    /// Tokens per tick, scaled by `2^s`.
    pub k: u64,
    /// The scale of `k` (bits 0..=5, at most 63) and [`HOT_TSC`].
    pub s: u32,
    /// The elapsed ticks at which `v` reaches [`V_MAX`] (and stops).
    pub e_max: u64,
}

impl Hot {
    /// Whether the clock read is the TSC (else `CLOCK_MONOTONIC` ns).
    #[inline(always)]
    pub fn tsc(&self) -> bool {
        self.s & HOT_TSC != 0
    }

    /// The virtual clock at clock reading `tick` (saturated at [`V_MAX`]:
    /// the elapsed ticks stop at `e_max`; a reading before `base_tick` is
    /// `base_v`). One 64 × 64 → 128-bit multiply and a shift, and no
    /// saturating step after it: with `e ≤ e_max`, `(e · k) >> s ≤ V_MAX −
    /// base_v` (so its low word is all of it, and the sum is at most
    /// `V_MAX`).
    ///
    /// The elapsed ticks are bounded by branches, not clamped: a reading
    /// before `base_tick` (its difference wraps to 2⁶³ or more) or past
    /// `e_max` takes the cold side ([`hot_v_clamped`]). Clamping put two
    /// conditional moves between the TSC read and the CAS, on the fast
    /// path's one dependency chain; predicted branches are off it.
    #[inline(always)]
    pub fn v(&self, tick: u64) -> u64 {
        let e = tick.wrapping_sub(self.base_tick);
        // One compare for both ends: a wrapped difference is at least
        // 2⁶³, and the bound's own clamp depends on no reading.
        if e > self.e_max.min(i64::MAX as u64) {
            return hot_v_clamped(
                tick,
                self.base_tick,
                self.e_max,
                self.k,
                self.s,
                self.base_v,
            );
        }
        tick_v(e, self.k, self.s.into(), self.base_v)
    }

    /// The consume's *first look* at the virtual clock, for a charge of
    /// `n`: `(v, top)` at TSC reading `tick`, with `top = v + cap − n`
    /// the highest start such a charge may have ([`charge_within`]); the
    /// words of the fast path's form are read through `word` one at a
    /// time, each used as soon as it is read, so that few are live at once
    /// (the first look keeps its values in registers the caller need not
    /// save). `None`, with nothing decided, where the clock is not the
    /// TSC, the reading needs [`v`](Self::v)'s clamp, or `n` is above the
    /// capacity (a charge that may go into debt).
    ///
    /// The words may be a torn read: checking that they belong together is
    /// the caller's, after this (a seqlock's second look), and a torn read
    /// only declines here or is thrown away there (so the arithmetic
    /// wraps instead of assuming validated words).
    #[inline(always)]
    pub fn look(tick: u64, n: u64, word: impl Fn(HotWord) -> u64) -> Option<(u64, u64)> {
        if word(HotWord::S) & u64::from(HOT_TSC) == 0 {
            return None;
        }
        // As in `v`, a reading before the base (its difference wraps to
        // 2⁶³ or more) or past `e_max` declines: two predicted branches,
        // which need no register for `v`'s bound of 2⁶³ − 1.
        let e = tick.wrapping_sub(word(HotWord::BaseTick));
        if (e as i64) < 0 || e > word(HotWord::EMax) {
            return None;
        }
        // `s` read again where the shift needs it rather than kept across
        // the multiply (one register less there).
        let v = tick_v(e, word(HotWord::K), word(HotWord::S), word(HotWord::BaseV));
        let room = word(HotWord::Cap).checked_sub(n)?;
        Some((v, v.wrapping_add(room)))
    }

    /// Charges `n` (≤ 2³¹−1) tokens at clock reading `tick` on `word`, as
    /// [`Gcra::charge`] does at the matching instant.
    #[inline(always)]
    pub fn charge(
        &self,
        word: &AtomicU64,
        n: u64,
        tick: u64,
        mode: Mode,
    ) -> Result<Charged, Refused> {
        charge_at(self.cap, word, n, self.v(tick), mode)
    }
}

/// A word of [`Hot`], as [`Hot::look`] asks for it (numbered in the
/// order of the words of `params.rs`'s copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HotWord {
    /// [`Hot::cap`].
    Cap = 0,
    /// [`Hot::base_tick`].
    BaseTick = 1,
    /// [`Hot::base_v`].
    BaseV = 2,
    /// [`Hot::k`].
    K = 3,
    /// [`Hot::s`].
    S = 4,
    /// [`Hot::e_max`].
    EMax = 5,
}

/// The virtual clock `e` ticks past its base: `base_v + ⌊e · k / 2^s⌋`
/// (no overflow for `e ≤ e_max`, see [`Hot::v`]; wrapping, for a torn
/// read's words, see [`Hot::look`]).
#[inline(always)]
fn tick_v(e: u64, k: u64, s: u64, base_v: u64) -> u64 {
    let d = (u128::from(e) * u128::from(k)) >> (s & 63);
    (d as u64).wrapping_add(base_v)
}

/// [`Hot::v`] with the elapsed ticks clamped to `0..=e_max`, out of line
/// and on values (a `&Hot` would make the fast path keep the struct in
/// memory).
#[cold]
#[inline(never)]
fn hot_v_clamped(tick: u64, base_tick: u64, e_max: u64, k: u64, s: u32, base_v: u64) -> u64 {
    let e = tick.saturating_sub(base_tick).min(e_max);
    tick_v(e, k, s.into(), base_v)
}

/// Tokens per tick of `clock` at `rate` tokens per second, as `(k, s)`:
/// `k / 2^s`, rounded down, the largest `s ≤ 63` with `k < 2⁶⁴` (64
/// significant bits from a token per tick up; below, `s = 63`). The
/// exact rate per tick is `rate · mult / (10⁹ · 2^shift)` on a TSC clock
/// and `rate / 10⁹` on `CLOCK_MONOTONIC`.
pub(crate) fn tick_rate(rate: u64, clock: &Clock) -> (u64, u32) {
    let (x, d) = match clock {
        // rate < 2³², mult < 2⁶⁴, shift ≤ 63: x < 2⁹⁶, d < 2⁹³.
        Clock::Tsc(c) => (
            u128::from(rate) * u128::from(c.mult),
            u128::from(NS) << (c.shift & 63),
        ),
        Clock::Monotonic => (u128::from(rate), u128::from(NS)),
    };
    let q = x / d;
    // Tokens per tick below 2^b: k = ⌊x · 2^s / d⌋ < 2^(b + s) ≤ 2⁶⁴.
    let b = 128 - q.leading_zeros();
    if b > 64 {
        // Not a clock any check accepts: as fast as can be represented.
        return (u64::MAX, 0);
    }
    let s = 63.min(64 - b);
    // The fraction's first s bits by long division, at most 32 bits a
    // step (rem < d < 2⁹⁴, so rem · 2³² < 2¹²⁶).
    let (mut rem, mut f, mut left) = (x % d, 0u128, s);
    while left > 0 {
        let c = left.min(32);
        rem <<= c;
        f = (f << c) | (rem / d);
        rem %= d;
        left -= c;
    }
    let k = (q << s) | f;
    (u64::try_from(k).unwrap_or(u64::MAX), s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::clock::TscClock;

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

    /// A TSC calibration of a `ghz` GHz counter (shift 32), based at
    /// `tsc0 = 1_000`, `ns0 = 7_000`.
    fn tsc_clock(mhz: u64) -> Clock {
        Clock::Tsc(TscClock {
            tsc0: 1_000,
            ns0: 7_000,
            mult: ((1000u128 << 32) / u128::from(mhz)) as u64,
            shift: 32,
        })
    }

    /// The exact (rational) virtual clock of `g` on `clock` at raw reading
    /// `tick`, rounded down (see [`Hot`]): what no path may run ahead of.
    fn exact_v(g: &Gcra, clock: &Clock, tick: u64) -> u64 {
        let (base_ns, base_v) = g.base();
        let num = match clock {
            Clock::Monotonic => (
                u128::from(tick.saturating_sub(base_ns)) * u128::from(g.rate()),
                u128::from(NS),
            ),
            Clock::Tsc(c) => {
                let here = u128::from(tick - c.tsc0) * u128::from(c.mult);
                let base = u128::from(base_ns - c.ns0) << c.shift;
                (
                    here.saturating_sub(base) * u128::from(g.rate()),
                    u128::from(NS) << c.shift,
                )
            }
        };
        base_v + u64::try_from(num.0 / num.1).unwrap()
    }

    /// The fast path's clock never runs ahead of the exact clock and lags
    /// it by less than two tokens, at rates where the rounding bites (1
    /// token/s, 10⁹/s, rates that divide no tick frequency) and on clocks
    /// of several frequencies, over elapsed times up to years; and it
    /// never goes back.
    #[test]
    fn hot_clock_rounds_down_by_less_than_two_tokens() {
        let rates = [
            1u32,
            7,
            1_000_000_000,
            999_999_937,
            123_456_789,
            i32::MAX as u32,
        ];
        let clocks = [
            Clock::Monotonic,
            tsc_clock(2_600),
            tsc_clock(2_999),
            tsc_clock(1_000),
            tsc_clock(3_333),
            tsc_clock(1),
        ];
        for clock in clocks {
            for rate in rates {
                for (base_ns, base_v) in
                    [(7_000, V_BIAS), (7_001, V_BIAS + 5), (123_456_789_123, 3)]
                {
                    let g = Gcra::based(rate, 1_000, base_ns, base_v);
                    let h = g.hot(&clock);
                    let start = match clock {
                        Clock::Monotonic => base_ns,
                        Clock::Tsc(c) => c.tsc0,
                    };
                    let mut last = 0;
                    let mut e = 0u64;
                    while e < 1 << 52 {
                        for tick in [start + e, start + e + 1, start + e * 3 / 2 + 7] {
                            let (fast, exact) = (h.v(tick), exact_v(&g, &clock, tick));
                            if exact > V_MAX - (1 << 12) {
                                // Saturated (see `hot_clock_saturates`).
                                assert!(fast <= V_MAX);
                                continue;
                            }
                            // Less than two tokens, plus the tick that
                            // `base_tick` rounds up by.
                            let tick_worth = (h.k >> (h.s & 63)) + 1;
                            assert!(
                                fast <= exact && fast + 2 + tick_worth > exact,
                                "rate {rate}, {clock:?}, base {base_ns}: tick {tick}: \
                                 {fast} against {exact}"
                            );
                            // The slow path's clock (through the rounded
                            // nanoseconds) is not ahead either.
                            let ns = match clock {
                                Clock::Tsc(c) => c.ns_at(tick),
                                Clock::Monotonic => tick,
                            };
                            assert!(g.v(ns) <= exact);
                        }
                        let v = h.v(start + e);
                        assert!(v >= last);
                        last = v;
                        e = e * 2 + 1;
                    }
                }
            }
        }
    }

    /// Charging as fast as the bucket allows through the fast path gets,
    /// over any span, no more than the capacity plus the exact refill, at
    /// 1 token/s, 10⁹/s and a rate that divides no tick frequency; and no
    /// fewer than two tokens less.
    #[test]
    fn hot_charges_never_exceed_the_configured_rate() {
        for (rate, clock) in [
            (1u32, tsc_clock(2_600)),
            (1_000_000_000, tsc_clock(2_600)),
            (999_999_937, tsc_clock(2_999)),
            (7, tsc_clock(3_333)),
            (999_999_937, Clock::Monotonic),
            (1, Clock::Monotonic),
        ] {
            // Never full within the run, so no refill is capped away.
            let cap = i32::MAX as u32;
            let base_ns = 1_000_000;
            let g = Gcra::new(rate, cap, base_ns);
            let h = g.hot(&clock);
            let w = AtomicU64::new(0);
            let start = h.base_tick;
            let mut got = 0u64;
            // Steps that share no factor with the rate or the frequency.
            let (mut tick, step) = (start, 1 + h.k % 9_973);
            let take = |tick: u64, got: &mut u64| {
                for b in (0..31).rev() {
                    while h.charge(&w, 1 << b, tick, Mode::Exact).is_ok() {
                        *got += 1 << b;
                    }
                }
            };
            for _ in 0..20_000 {
                take(tick, &mut got);
                let refill = exact_v(&g, &clock, tick) - V_BIAS;
                assert!(
                    got <= u64::from(cap) + refill,
                    "{rate}: {got} > {cap} + {refill}"
                );
                assert!(
                    got + 2 > u64::from(cap) + refill,
                    "{rate}: {got} ≪ {cap} + {refill}"
                );
                tick += step * (1 + tick % 7);
            }
            // A year later.
            let year = match clock {
                Clock::Monotonic => 365 * 86_400 * NS,
                Clock::Tsc(_) => 365 * 86_400 * 3_333_000_000,
            };
            let tick = tick + year;
            let before = got;
            take(tick, &mut got);
            let refill = exact_v(&g, &clock, tick) - V_BIAS;
            let want = (before + u64::from(cap)).min(u64::from(cap) + refill);
            assert!(
                got <= want && got + 2 > want,
                "{rate}: a year: {got}, {want}"
            );
        }
    }

    /// The fast path's clock saturates at [`V_MAX`] without overflowing,
    /// at the highest rate on the fastest and the slowest clocks.
    #[test]
    fn hot_clock_saturates() {
        for clock in [Clock::Monotonic, tsc_clock(1), tsc_clock(100_000)] {
            for base_v in [0, V_BIAS, V_MAX - 1, V_MAX] {
                let g = Gcra::based(i32::MAX as u32, 1, 0, base_v);
                let h = g.hot(&clock);
                // e_max rounds down: less than a tick's refill short
                // (a 100 GHz counter wraps first, after 5.8 years).
                let top = h.v(u64::MAX);
                assert!(top <= V_MAX, "{clock:?} {base_v}: {top}");
                if clock != tsc_clock(100_000) {
                    assert!(top + (1 << 12) > V_MAX, "{clock:?} {base_v}: {top}");
                }
                assert!(h.v(h.base_tick.saturating_add(h.e_max)) <= V_MAX);
                assert_eq!(h.v(0), base_v);
                let w = AtomicU64::new(0);
                assert!(h.charge(&w, i32::MAX as u64, u64::MAX, Mode::Force).is_ok());
            }
        }
    }

    /// The first look's clock is the fast path's wherever it answers,
    /// with `top = v + cap − n`, and it declines exactly where the fast
    /// path clamps, on `CLOCK_MONOTONIC` and above the capacity.
    #[test]
    fn first_look_is_the_fast_path_where_it_answers() {
        for clock in [
            Clock::Monotonic,
            tsc_clock(2_600),
            tsc_clock(1),
            tsc_clock(100_000),
        ] {
            for (rate, cap) in [
                (1u32, 1u32),
                (1_000, 500),
                (i32::MAX as u32, i32::MAX as u32),
            ] {
                for base_v in [0, V_BIAS, V_MAX - 1] {
                    let h = Gcra::based(rate, cap, 7_000_000, base_v).hot(&clock);
                    let word = |w: HotWord| match w {
                        HotWord::Cap => h.cap,
                        HotWord::BaseTick => h.base_tick,
                        HotWord::BaseV => h.base_v,
                        HotWord::K => h.k,
                        HotWord::S => u64::from(h.s),
                        HotWord::EMax => h.e_max,
                    };
                    let b = h.base_tick;
                    let ticks = [
                        0,
                        b.wrapping_sub(1),
                        b,
                        b + 1,
                        b + 12_345_678,
                        b.saturating_add(h.e_max),
                        b.saturating_add(h.e_max).saturating_add(1),
                        u64::MAX,
                    ];
                    for tick in ticks {
                        for n in [
                            1,
                            u64::from(cap / 2).max(1),
                            u64::from(cap),
                            u64::from(cap) + 1,
                        ] {
                            let e = tick.wrapping_sub(b);
                            let answers =
                                h.tsc() && e <= h.e_max.min(i64::MAX as u64) && n <= h.cap;
                            let want = answers.then(|| (h.v(tick), h.v(tick) + h.cap - n));
                            assert_eq!(
                                Hot::look(tick, n, word),
                                want,
                                "{clock:?} rate {rate} cap {cap} base {base_v}: tick {tick}, n {n}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Within the capacity, `charge_within` is `charge_at`, normal or
    /// exact (both need all `n` tokens there), to the refusal's value and
    /// the word it leaves: on full, partly spent, empty, indebted and
    /// scribbled words.
    #[test]
    fn charge_within_is_charge_at_within_the_capacity() {
        for cap in [1u64, 7, 1_000, i32::MAX as u64] {
            for v in [0, V_BIAS, V_MAX] {
                for n in [1, (cap / 2).max(1), cap] {
                    let top = v + cap - n;
                    let words = [
                        0,
                        v.saturating_sub(1),
                        v,
                        v + 1,
                        top,
                        top + 1,
                        v + cap,
                        v + cap + 5,
                        v + cap + MAX_LEAD,
                        v + cap + MAX_LEAD + 1,
                        u64::MAX,
                    ];
                    for t in words {
                        for mode in [Mode::Normal, Mode::Exact] {
                            let (a, b) = (AtomicU64::new(t), AtomicU64::new(t));
                            let want = charge_at(cap, &a, n, v, mode).map(|c| {
                                assert!(!c.debt, "{cap} {v} {n} {t}");
                            });
                            assert_eq!(
                                charge_within(&b, n, v, top),
                                want,
                                "cap {cap}, v {v}, n {n}, word {t}, {mode:?}"
                            );
                            assert_eq!(a.load(Ordering::Relaxed), b.load(Ordering::Relaxed));
                        }
                    }
                }
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
