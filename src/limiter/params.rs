//! A limiter's parameters: rate, capacity, the base of its virtual clock
//! and the clock itself, changeable at run time and seen the same way by
//! every thread and process.
//!
//! # How it works
//!
//! The parameters live in three slots of a [`ParamBlock`] (in process
//! memory or in a region) and an `active` word names the current slot and
//! its generation. A writer claims a slot that is not active (one CAS of
//! the slot's claim word to its owner id), fills it completely, marking it
//! invalid first and stamping the next generation last, then publishes it
//! with one CAS of `active` from the value it started from; if another
//! writer published meanwhile, it starts again from that writer's
//! parameters (so no change is lost), and it gives its claim back.
//! A reader loads `active`, the slot's fields, and then checks that the
//! slot still carries `active`'s generation and that `active` did not
//! move: a seqlock, so a reader never mixes two writes.
//!
//! There is no lock for a stopped writer to hold: a writer that stops (or
//! dies) half-way keeps only its own slot, which is not active, and the
//! other writers use the third slot; a dead writer's claim is taken over.
//! Only two writers stopped at the same time hold a third back, until one
//! of them runs again.
//!
//! Changing the rate re-bases the virtual clock at the moment of the
//! change (`base = (now, v_old(now))`), so tokens neither appear nor vanish;
//! moving to `CLOCK_MONOTONIC` (a TSC that stopped or jumped) re-bases it
//! the same way. Changing the capacity re-bases it moved by the change
//! (`Gcra::recapped`, see `bucket.rs`), so the balance becomes
//! `min(tokens, capacity)`; the writer computes that under its lock, and
//! publishes it with the one flip of `active`.

use crate::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};

use super::bucket::{Gcra, Hot, HotWord};
use crate::error::{Error, Result};
use crate::sys::clock::{Clock, TscClock};

const INVALID: u64 = u64::MAX;

/// One set of parameters.
#[repr(C, align(128))]
#[derive(Debug, Default)]
pub(crate) struct ParamSlot {
    gen: AtomicU64,
    rate: AtomicU64,
    cap: AtomicU64,
    base_ns: AtomicU64,
    base_v: AtomicU64,
    /// 0: `CLOCK_MONOTONIC`; 1: the TSC with the calibration that follows.
    tsc_on: AtomicU64,
    tsc: [AtomicU64; 4],
    /// The fast path's clock derived from the words above ([`Hot`]):
    /// `base_tick`, `k`, `s`, `e_max`, written with them (in a region
    /// only this process's copy is used, derived again from the validated
    /// words, see [`ParamCache`]).
    hot: [AtomicU64; 4],
    _pad: [u64; 2],
}

/// Parameter slots in a block: the active one, and one spare for each of
/// two writers at once.
const SLOTS: usize = 3;

/// Three slots and the word naming the active one. Zeroed memory is not a
/// valid block: [`ParamBlock::init`] writes the first parameters.
#[repr(C, align(128))]
#[derive(Debug, Default)]
pub(crate) struct ParamBlock {
    /// `generation << 2 | slot`.
    active: AtomicU64,
    /// Per slot: 0, or the id of the writer filling it (an owner id in a
    /// region, 1 in-process).
    claims: [AtomicU32; SLOTS],
    _pad0: u32,
    _pad: [u64; 13],
    slots: [ParamSlot; SLOTS],
}

#[cfg(not(shuttle))]
const _: () = assert!(std::mem::size_of::<ParamSlot>() == 128);
#[cfg(not(shuttle))]
const _: () = assert!(std::mem::size_of::<ParamBlock>() == 512);

/// Generations are stored above the slot index (2 bits).
const GEN_MASK: u64 = INVALID >> 3;

/// A consistent snapshot of the parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Params {
    /// The bucket's arithmetic.
    pub gcra: Gcra,
    /// The clock `now` is read from.
    pub clock: Clock,
}

impl ParamSlot {
    fn write(&self, gen: u64, p: &Params) {
        self.gen.store(INVALID, Ordering::Relaxed);
        fence(Ordering::Release);
        let (base_ns, base_v) = p.gcra.base();
        self.rate.store(p.gcra.rate(), Ordering::Relaxed);
        self.cap.store(p.gcra.cap(), Ordering::Relaxed);
        self.base_ns.store(base_ns, Ordering::Relaxed);
        self.base_v.store(base_v, Ordering::Relaxed);
        match p.clock {
            Clock::Tsc(c) => {
                self.tsc_on.store(1, Ordering::Relaxed);
                for (w, x) in self
                    .tsc
                    .iter()
                    .zip([c.tsc0, c.ns0, c.mult, u64::from(c.shift)])
                {
                    w.store(x, Ordering::Relaxed);
                }
            }
            Clock::Monotonic => self.tsc_on.store(0, Ordering::Relaxed),
        }
        let h = p.gcra.hot(&p.clock);
        for (w, x) in self
            .hot
            .iter()
            .zip([h.base_tick, h.k, u64::from(h.s), h.e_max])
        {
            w.store(x, Ordering::Relaxed);
        }
        self.gen.store(gen, Ordering::Release);
    }
}

impl ParamBlock {
    /// Writes the first parameters (before anyone else can see the block).
    pub fn init(&self, p: &Params) {
        self.slots[0].write(0, p);
        self.active.store(0, Ordering::Release);
    }

    /// A writer that never stops half-way (see the module docs) keeps only
    /// its own slot: with one writer stopped while claiming a spare, another
    /// still gets through.
    #[cfg(test)]
    fn claim_for_test(&self, me: u32) -> usize {
        self.claim(me, &|_| true)
    }

    /// The current parameters, validated: a scribbled block is `BadRegion`.
    #[inline]
    pub fn load(&self) -> Result<Params> {
        self.with(|p| *p)
    }

    /// Runs `f` on the current parameters, validated (a scribbled block is
    /// `BadRegion`). The hot path's form: the parameters stay in registers
    /// instead of travelling through a `Result<Params>`.
    #[inline(always)]
    pub fn with<R>(&self, f: impl FnOnce(&Params) -> R) -> Result<R> {
        self.with_active(|_, p| f(p))
    }

    /// The fast path's form ([`Hot`]) of the current parameters of a
    /// block in process memory, which only this crate's code writes, with
    /// parameters it validated: one attempt of the seqlock read inline,
    /// six words, without the range checks, so they stay in registers on
    /// the consume fast path; a read that raced a writer goes to the full
    /// read, out of line.
    ///
    /// # Safety
    ///
    /// The block is in process memory (never a region's, which another
    /// process may scribble on): its `active` word then names a slot
    /// below `SLOTS`, which is not checked.
    #[inline(always)]
    pub unsafe fn hot_trusted(&self) -> Result<Hot> {
        let a = self.active.load(Ordering::Acquire);
        let i = (a & 3) as usize;
        debug_assert!(i < SLOTS, "in-process active word {a}");
        {
            // SAFETY: `i < SLOTS`: the block is in process memory (the
            // caller's contract), where `active` is written only by `init`
            // (slot 0) and `update` (a slot index from `claim`, below
            // `SLOTS`), never by anything else (the bounds check cost 2
            // instructions a consume).
            let slot = unsafe { self.slots.get_unchecked(i) };
            let cap = slot.cap.load(Ordering::Relaxed);
            let base_v = slot.base_v.load(Ordering::Relaxed);
            let base_tick = slot.hot[0].load(Ordering::Relaxed);
            let k = slot.hot[1].load(Ordering::Relaxed);
            let sh = slot.hot[2].load(Ordering::Relaxed);
            let e_max = slot.hot[3].load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            // `active` unmoved is enough here, without the slot's
            // generation (4 instructions): in process memory no claim is
            // ever taken over (the writer id is always 1, see `update`),
            // so a slot is written only by the writer that claimed it
            // while it was not active, and published after it is written;
            // a writer can claim the slot read here only once `active` has
            // moved off it, and `active` never takes a value twice (its
            // generation).
            if self.active.load(Ordering::Relaxed) == a {
                // Written by `ParamSlot::write` from a validated `Params`.
                return Ok(Hot {
                    cap,
                    base_tick,
                    base_v,
                    k,
                    s: sh as u32,
                    e_max,
                });
            }
        }
        self.load_cold().map(|p| p.gcra.hot(&p.clock))
    }

    /// The consume's *first look* at a block in process memory, for a
    /// charge of `n`: `(v, top)` at TSC reading `tick` ([`Hot::look`])
    /// from one attempt of the seqlock read, calling nothing; `None`, with
    /// nothing decided, if that raced a writer or [`Hot::look`] declines.
    ///
    /// # Safety
    ///
    /// As [`hot_trusted`](Self::hot_trusted).
    #[inline(always)]
    pub unsafe fn look_trusted(&self, tick: u64, n: u64) -> Option<(u64, u64)> {
        let a = self.active.load(Ordering::Acquire);
        // SAFETY: `a & 3 < SLOTS` in process memory (the caller's
        // contract), as in `hot_trusted`.
        let slot = unsafe { self.slots.get_unchecked((a & 3) as usize) };
        let got = Hot::look(tick, n, |w| {
            match w {
                HotWord::Cap => &slot.cap,
                HotWord::BaseV => &slot.base_v,
                HotWord::BaseTick => &slot.hot[0],
                HotWord::K => &slot.hot[1],
                HotWord::S => &slot.hot[2],
                HotWord::EMax => &slot.hot[3],
            }
            .load(Ordering::Relaxed)
        })?;
        fence(Ordering::Acquire);
        // `active` unmoved: the words are the slot's (see `hot_trusted`).
        (self.active.load(Ordering::Relaxed) == a).then_some(got)
    }

    /// [`hot_trusted`](Self::hot_trusted)'s cold side: the full read, with its
    /// retries and its error naming what is wrong.
    #[cold]
    #[inline(never)]
    fn load_cold(&self) -> Result<Params> {
        self.load()
    }

    /// [`with`](Self::with), also handing `f` the `active` word the
    /// parameters were read under.
    #[inline(always)]
    fn with_active<R>(&self, f: impl FnOnce(u64, &Params) -> R) -> Result<R> {
        for _ in 0..64 {
            let a = self.active.load(Ordering::Acquire);
            let Some(slot) = self.slots.get((a & 3) as usize) else {
                break;
            };
            let rate = slot.rate.load(Ordering::Relaxed);
            let cap = slot.cap.load(Ordering::Relaxed);
            let base_ns = slot.base_ns.load(Ordering::Relaxed);
            let base_v = slot.base_v.load(Ordering::Relaxed);
            let tsc_on = slot.tsc_on.load(Ordering::Relaxed);
            let tsc = [
                slot.tsc[0].load(Ordering::Relaxed),
                slot.tsc[1].load(Ordering::Relaxed),
                slot.tsc[2].load(Ordering::Relaxed),
                slot.tsc[3].load(Ordering::Relaxed),
            ];
            fence(Ordering::Acquire);
            if slot.gen.load(Ordering::Relaxed) != a >> 2
                || self.active.load(Ordering::Relaxed) != a
            {
                crate::sync::spin();
                continue;
            }
            return match validate(rate, cap, base_ns, base_v, tsc_on, tsc) {
                Some(p) => Ok(f(a, &p)),
                None => Err(invalid(rate, cap, base_v, tsc_on, tsc)),
            };
        }
        Err(Error::BadRegion(
            "limiter parameters kept changing or never matched their generation: overwritten"
                .into(),
        ))
    }

    /// Replaces the parameters by `f(current)` (see the module docs: `f`
    /// runs again on the newer parameters if another writer published
    /// first). `me` is the writer's id (nonzero), `alive` tells whether a
    /// recorded writer still lives.
    pub fn update(
        &self,
        me: u32,
        alive: &dyn Fn(u32) -> bool,
        f: impl Fn(Params) -> Params,
    ) -> Result<Params> {
        let idx = self.claim(me, alive);
        let r = loop {
            let (a, cur) = match self.with_active(|a, p| (a, *p)) {
                Ok(v) => v,
                Err(e) => break Err(e),
            };
            let next = f(cur);
            let gen = ((a >> 2).wrapping_add(1)) & GEN_MASK;
            self.slots[idx].write(gen, &next);
            if self
                .active
                .compare_exchange(
                    a,
                    (gen << 2) | idx as u64,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
            {
                break Ok(next);
            }
            crate::sync::spin();
        };
        let _ = self.claims[idx].compare_exchange(me, 0, Ordering::Release, Ordering::Relaxed);
        r
    }

    /// Claims a slot that is not active for writer `me`: a free one, or one
    /// whose writer is dead. Both spares claimed by live writers (two
    /// writers at work, or stopped, at once): waits, in slices, for one of
    /// them to finish.
    fn claim(&self, me: u32, alive: &dyn Fn(u32) -> bool) -> usize {
        let mut round = 0u32;
        loop {
            let act = (self.active.load(Ordering::Acquire) & 3) as usize;
            for i in (0..SLOTS).filter(|&i| i != act) {
                let c = self.claims[i].load(Ordering::Acquire);
                if (c == 0 || (c != me && !alive(c)))
                    && self.claims[i]
                        .compare_exchange(c, me, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                {
                    // Published and given back between the two reads? Then
                    // it is active now: not ours to write.
                    if (self.active.load(Ordering::Acquire) & 3) as usize != i {
                        return i;
                    }
                    let _ = self.claims[i].compare_exchange(
                        me,
                        0,
                        Ordering::Release,
                        Ordering::Relaxed,
                    );
                }
            }
            round += 1;
            if round < 64 {
                crate::sync::spin();
            } else if round < 128 {
                crate::sync::yield_now();
            } else {
                // Two writers hold the spares and neither finishes: they are
                // stopped (or starved); sleep between looks, costing nothing.
                #[cfg(not(shuttle))]
                std::thread::sleep(std::time::Duration::from_millis(1));
                #[cfg(shuttle)]
                crate::sync::yield_now();
            }
        }
    }
}

/// No `active` word: [`ParamCache`] empty (an `active` word is at most
/// `GEN_MASK << 2 | 3`, below this).
const NO_KEY: u64 = u64::MAX;

/// A process's copy of a region's parameters in the fast path's form
/// ([`Hot`]), derived from the block's words validated once per change of
/// its `active` word, for the consume fast path: while `active` reads what
/// the copy was made under, the copy is those parameters (a published slot
/// is never written while active, and every publication moves the
/// generation), so a hit costs no range checks, no generation check of the
/// slot and no derivation.
///
/// The copy is itself a seqlock with one filler at a time (`filling`):
/// `key` is [`NO_KEY`] while the words are rewritten. Every value in it
/// was derived here ([`Gcra::hot`]) from words that passed [`validate`]
/// (never from the slot's stored derivation, which any process could
/// have scribbled), so a reader never computes with unchecked words; a
/// scribble of the live slot after the copy was made is seen by the paths
/// that read the block itself (the drain, the stats, a new handle) and by
/// the copy at the next change.
#[derive(Debug)]
pub(crate) struct ParamCache {
    key: AtomicU64,
    filling: AtomicBool,
    /// cap, base_tick, base_v, k, s, e_max (see [`Hot`]).
    words: [AtomicU64; 6],
}

impl Default for ParamCache {
    fn default() -> ParamCache {
        ParamCache {
            key: AtomicU64::new(NO_KEY),
            filling: AtomicBool::new(false),
            words: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl ParamCache {
    /// `block`'s parameters now in the fast path's form, validated: from
    /// the copy while `block`'s `active` word has not moved, else read
    /// from `block` (out of line), derived and copied.
    #[inline(always)]
    pub fn hot(&self, block: &ParamBlock) -> Result<Hot> {
        let k = self.key.load(Ordering::Acquire);
        if k == block.active.load(Ordering::Acquire) {
            let w = &self.words;
            let cap = w[0].load(Ordering::Relaxed);
            let base_tick = w[1].load(Ordering::Relaxed);
            let base_v = w[2].load(Ordering::Relaxed);
            let mul = w[3].load(Ordering::Relaxed);
            let sh = w[4].load(Ordering::Relaxed);
            let e_max = w[5].load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if self.key.load(Ordering::Relaxed) == k {
                // Derived from a validated `Params` (see `refill`).
                return Ok(Hot {
                    cap,
                    base_tick,
                    base_v,
                    k: mul,
                    s: sh as u32,
                    e_max,
                });
            }
        }
        self.refill(block)
    }

    /// The consume's *first look* through the copy, for a charge of `n`:
    /// `(v, top)` at TSC reading `tick` ([`Hot::look`]), calling nothing;
    /// `None`, with nothing decided, on a miss, a copy being rewritten, or
    /// where [`Hot::look`] declines.
    #[inline(always)]
    pub fn look(&self, block: &ParamBlock, tick: u64, n: u64) -> Option<(u64, u64)> {
        let k = self.key.load(Ordering::Acquire);
        if k != block.active.load(Ordering::Acquire) {
            return None;
        }
        let got = Hot::look(tick, n, |w| self.words[w as usize].load(Ordering::Relaxed))?;
        fence(Ordering::Acquire);
        // Derived from a validated `Params` (see `refill`).
        (self.key.load(Ordering::Relaxed) == k).then_some(got)
    }

    /// The miss: the full read of `block` (validated, errors naming what is
    /// wrong), derived, and copied unless another thread is copying now.
    #[cold]
    #[inline(never)]
    fn refill(&self, block: &ParamBlock) -> Result<Hot> {
        let (a, p) = block.with_active(|a, p| (a, *p))?;
        let h = p.gcra.hot(&p.clock);
        if self
            .filling
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            self.key.store(NO_KEY, Ordering::Relaxed);
            fence(Ordering::Release);
            let vals = [h.cap, h.base_tick, h.base_v, h.k, u64::from(h.s), h.e_max];
            for (w, v) in self.words.iter().zip(vals) {
                w.store(v, Ordering::Relaxed);
            }
            self.key.store(a, Ordering::Release);
            self.filling.store(false, Ordering::Release);
        }
        Ok(h)
    }
}

/// True at most once per 100 ms in this process: when a slow path may
/// check that a TSC clock still agrees with `CLOCK_MONOTONIC`.
pub(crate) fn clock_check_due() -> bool {
    // A standard atomic even under the model checker: a process-local rate
    // limit, no part of a modelled protocol (and a checker atomic cannot
    // live in a static across executions).
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = crate::sys::clock::monotonic_ns();
    let last = LAST.load(Ordering::Relaxed);
    now.saturating_sub(last) >= 100_000_000
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

/// The same parameters on `CLOCK_MONOTONIC`, the virtual clock re-based
/// so that it goes on from the value the old clock gives now.
pub(crate) fn demoted(p: Params) -> Params {
    let Clock::Tsc(_) = p.clock else { return p };
    let v = p.gcra.v(p.clock.now_ns());
    let now = crate::sys::clock::monotonic_ns();
    Params {
        gcra: Gcra::based(p.gcra.rate() as u32, p.gcra.cap() as u32, now, v),
        clock: Clock::Monotonic,
    }
}

#[inline(always)]
fn validate(
    rate: u64,
    cap: u64,
    base_ns: u64,
    base_v: u64,
    tsc_on: u64,
    tsc: [u64; 4],
) -> Option<Params> {
    // Inline and branch-light: this runs on every consume. The messages are
    // built out of line ([`invalid`]), only for a scribbled block.
    let max = super::MAX_TOKENS_PER_SECOND;
    let in_range = rate != 0 && rate <= max && cap != 0 && cap <= max;
    let clock = match tsc_on {
        0 => Clock::Monotonic,
        // What the arithmetic needs to stay sound (no panic, no UB); the
        // full form check (a 1 MHz..100 GHz counter) runs at attach.
        1 if tsc[3] <= 63 && tsc[2] != 0 && cfg!(target_arch = "x86_64") => Clock::Tsc(TscClock {
            tsc0: tsc[0],
            ns0: tsc[1],
            mult: tsc[2],
            shift: tsc[3] as u32,
        }),
        _ => return None,
    };
    (in_range && base_v <= super::bucket::V_MAX).then(|| Params {
        gcra: Gcra::based(rate as u32, cap as u32, base_ns, base_v),
        clock,
    })
}

/// What is wrong with a parameter block [`validate`] refused.
#[cold]
#[inline(never)]
fn invalid(rate: u64, cap: u64, base_v: u64, tsc_on: u64, tsc: [u64; 4]) -> Error {
    let max = super::MAX_TOKENS_PER_SECOND;
    if rate == 0 || rate > max || cap == 0 || cap > max {
        return Error::BadRegion(format!(
            "limiter rate {rate} or capacity {cap} is out of range 1..={max}"
        ));
    }
    if base_v > super::bucket::V_MAX {
        return Error::BadRegion(format!(
            "limiter clock base {base_v} tokens is beyond the virtual clock's limit"
        ));
    }
    match tsc_on {
        1 => Error::BadRegion(format!(
            "limiter clock: TSC calibration shift {} / multiplier {} is unusable",
            tsc[3], tsc[2]
        )),
        f => Error::BadRegion(format!(
            "limiter clock flag {f} is neither 0 (CLOCK_MONOTONIC) nor 1 (TSC)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::bucket::tick_rate;
    use super::*;

    fn hot(p: Params) -> Hot {
        p.gcra.hot(&p.clock)
    }

    fn params(rate: u32) -> Params {
        Params {
            gcra: Gcra::new(rate, rate, 5),
            clock: Clock::Monotonic,
        }
    }

    #[test]
    fn load_update_and_scribbles() {
        let b = Box::<ParamBlock>::default();
        b.init(&params(100));
        assert_eq!(b.load().unwrap(), params(100));
        let next = b
            .update(1, &|_| true, |p| Params {
                gcra: Gcra::based(7, p.gcra.cap() as u32, 9, 11),
                ..p
            })
            .unwrap();
        assert_eq!(b.load().unwrap(), next);
        assert_eq!(next.gcra.rate(), 7);
        // Dead writers' claims on both spares are taken over; a live
        // writer's claim holds only its own slot.
        b.claims[0].store(42, Ordering::Relaxed);
        b.claims[2].store(43, Ordering::Relaxed);
        b.update(1, &|id| id != 42 && id != 43, |p| p).unwrap();
        b.claims[2].store(44, Ordering::Relaxed);
        b.update(1, &|_| true, |p| p).unwrap();
        assert_eq!(b.claims[2].load(Ordering::Relaxed), 44);
        b.claims[2].store(0, Ordering::Relaxed);
        // Garbage is an error, never a panic or a hang.
        for s in &b.slots {
            s.rate.store(0, Ordering::Relaxed);
        }
        assert!(b.load().is_err());
        b.active.store(12345, Ordering::Relaxed);
        assert!(b.load().is_err());
        b.active.store(3, Ordering::Relaxed);
        assert!(b.load().is_err());
    }

    #[test]
    fn a_writer_stopped_with_a_claim_holds_nobody_back() {
        let b = Box::<ParamBlock>::default();
        b.init(&params(100));
        // Writer 7 claimed a spare and stopped there.
        let held = b.claim_for_test(7);
        assert_ne!(held, 0, "slot 0 is the active one");
        for r in 1..10u32 {
            let next = b
                .update(9, &|_| true, |p| Params {
                    gcra: Gcra::based(r, p.gcra.cap() as u32, 1, 1),
                    ..p
                })
                .unwrap();
            assert_eq!(b.load().unwrap(), next);
            assert_eq!(b.claims[held].load(Ordering::Relaxed), 7);
        }
    }

    #[test]
    fn the_cache_follows_every_change_and_reports_a_scribbled_block() {
        let b = Box::<ParamBlock>::default();
        b.init(&params(100));
        let c = ParamCache::default();
        assert_eq!(c.hot(&b).unwrap(), hot(params(100)));
        assert_eq!(
            c.key.load(Ordering::Relaxed),
            b.active.load(Ordering::Relaxed)
        );
        // A hit, then every change seen at the next read.
        assert_eq!(c.hot(&b).unwrap(), hot(params(100)));
        for r in 1..5u32 {
            let next = b
                .update(1, &|_| true, |p| Params {
                    gcra: Gcra::based(r, 9, 3, 4),
                    ..p
                })
                .unwrap();
            assert_eq!(c.hot(&b).unwrap(), hot(next));
        }
        // A TSC clock travels through the copy whole.
        let tsc = Clock::Tsc(TscClock {
            tsc0: 11,
            ns0: 12,
            mult: 13,
            shift: 14,
        });
        let next = b
            .update(1, &|_| true, |p| Params { clock: tsc, ..p })
            .unwrap();
        assert_eq!(c.hot(&b).unwrap(), hot(next));
        // A scribbled block published under a new word is an error, not a
        // stale copy.
        let a = b.active.load(Ordering::Relaxed);
        let slot = ((a & 3) + 1) % 3;
        let s = &b.slots[slot as usize];
        s.rate.store(0, Ordering::Relaxed);
        s.gen.store((a >> 2) + 1, Ordering::Relaxed);
        b.active
            .store((((a >> 2) + 1) << 2) | slot, Ordering::Relaxed);
        assert!(c.hot(&b).is_err());
    }

    #[test]
    fn cache_readers_never_mix_two_writes() {
        let b = std::sync::Arc::new(ParamBlock::default());
        b.init(&Params {
            gcra: Gcra::based(1, 1, 1, 1),
            clock: Clock::Monotonic,
        });
        let c = std::sync::Arc::new(ParamCache::default());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (w, end) = (b.clone(), stop.clone());
        let writer = std::thread::spawn(move || {
            for r in 1..20_000u32 {
                w.update(1, &|_| true, |_| Params {
                    gcra: Gcra::based(r, r, u64::from(r), u64::from(r)),
                    clock: Clock::Monotonic,
                })
                .unwrap();
            }
            end.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (b, c, stop) = (b.clone(), c.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut last = 0;
                    loop {
                        let done = stop.load(std::sync::atomic::Ordering::SeqCst);
                        let h = c.hot(&b).unwrap();
                        let (ns, v) = (h.base_tick, h.base_v);
                        assert!(h.cap == ns && ns == v, "{h:?}");
                        assert_eq!((h.k, h.s), tick_rate(h.cap, &Clock::Monotonic));
                        // Never older than a value this thread saw.
                        assert!(ns >= last, "{ns} after {last}");
                        last = ns;
                        if done {
                            break;
                        }
                    }
                })
            })
            .collect();
        writer.join().unwrap();
        for r in readers {
            r.join().unwrap();
        }
        assert_eq!(c.hot(&b).unwrap().cap, 19_999);
    }

    /// The first looks (the in-process block's and the copy's) never mix
    /// two writes while a writer keeps publishing, and never go back: on
    /// a TSC clock read at the base tick, `v` is `base_v` and `top` is
    /// `base_v + cap − n`, and every write has `base_v = cap`.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn first_looks_never_mix_two_writes() {
        let clock = Clock::Tsc(TscClock {
            tsc0: 1_000,
            ns0: 7_000,
            mult: 1 << 32,
            shift: 32,
        });
        let at = move |r: u32| Params {
            gcra: Gcra::based(r, r, 7_000, u64::from(r)),
            clock,
        };
        let b = std::sync::Arc::new(ParamBlock::default());
        b.init(&at(1));
        let c = ParamCache::default();
        let w = b.clone();
        let writer = std::thread::spawn(move || {
            for r in 2..20_000u32 {
                w.update(1, &|_| true, |_| at(r)).unwrap();
            }
        });
        let (mut last, mut seen) = ([0; 2], [0u32; 2]);
        let mut check = |i: usize, got: Option<(u64, u64)>| {
            if let Some((v, top)) = got {
                assert_eq!(top, 2 * v - 1, "{v} {top}");
                assert!(v >= last[i], "{v} after {}", last[i]);
                (last[i], seen[i]) = (v, seen[i] + 1);
            }
        };
        while !writer.is_finished() {
            // SAFETY: `b` is in process memory.
            check(0, unsafe { b.look_trusted(1_000, 1) });
            // A miss refills the copy (as the general path does).
            let got = c.look(&b, 1_000, 1);
            if got.is_none() {
                let _ = c.hot(&b);
            }
            check(1, got);
        }
        writer.join().unwrap();
        // SAFETY: `b` is in process memory.
        check(0, unsafe { b.look_trusted(1_000, 1) });
        let _ = c.hot(&b);
        check(1, c.look(&b, 1_000, 1));
        assert_eq!(last, [19_999; 2]);
        assert!(seen.iter().all(|&k| k > 0), "{seen:?}");
    }

    /// Both reads (the full one, and the in-process fast path's, which
    /// checks only that `active` did not move, without the slot's
    /// generation) never mix two writes, and never go back, while a writer
    /// keeps publishing.
    #[test]
    fn readers_never_mix_two_writes() {
        let b = std::sync::Arc::new(ParamBlock::default());
        b.init(&Params {
            gcra: Gcra::based(1, 1, 1, 1),
            clock: Clock::Monotonic,
        });
        let w = b.clone();
        let writer = std::thread::spawn(move || {
            for r in 1..20_000u32 {
                w.update(1, &|_| true, |_| Params {
                    gcra: Gcra::based(r, r, u64::from(r), u64::from(r)),
                    clock: Clock::Monotonic,
                })
                .unwrap();
            }
        });
        let mut last = 0;
        while !writer.is_finished() {
            let p = b.load().unwrap();
            let (ns, v) = p.gcra.base();
            assert!(p.gcra.rate() == p.gcra.cap() && ns == v && ns == p.gcra.rate());
            assert!(ns >= last, "{ns} after {last}");
            last = ns;
            // SAFETY: `b` is in process memory.
            let h = unsafe { b.hot_trusted() }.unwrap();
            assert!(h.cap == h.base_tick && h.base_tick == h.base_v, "{h:?}");
            assert_eq!((h.k, h.s), tick_rate(h.cap, &Clock::Monotonic));
            assert!(h.cap >= last, "{} after {last}", h.cap);
            last = h.cap;
        }
        writer.join().unwrap();
        // SAFETY: `b` is in process memory.
        assert_eq!(unsafe { b.hot_trusted() }.unwrap().cap, 19_999);
    }
}
