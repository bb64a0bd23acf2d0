//! The Limiter's home in a region: one bucket word, shared by every process.
//!
//! **Layout** (object area of a `Limiter` region, revision 3):
//! `[LimiterState: 128 bytes][waiting-process bitmap: 64 words]`. The state
//! line holds `tat` (the bucket, see [`bucket`](super::bucket)), `forced`, a
//! region-wide counter of force-throughs, the stall clock, `wakes` and the
//! region's clock (5 words at byte 40: a "TSC in use" flag, 0 or 1, then
//! `tsc0`, `ns0`, `mult`, `shift` of a [`TscClock`]); the
//! bitmap has bit `i` set while process `i` has consumes waiting (it covers
//! the largest process table; only the words the region's process slots
//! need are read, 2 for the default 128). The rate and the epoch are *not*
//! in the object area: the rate is the header's `params[0]` and the epoch is
//! the header's `clock_epoch_ns`, both written once by the initialiser and
//! covered by the header checksum, so a scribbler cannot change them without
//! the region failing validation.
//!
//! **One clock for all.** The bucket is exact only if every process
//! computes the same time, so the region's creator calibrates the TSC once
//! ([`calibrate`]) and stores the calibration; every process uses the
//! stored one. A region created without a reliable TSC stores "not in use"
//! and everyone reads `CLOCK_MONOTONIC`.
//!
//! **Validation.** `params[0]` must be a rate in `1..=2³¹−1`, `params[1]`
//! this layout's revision, the epoch not in the future of the shared clock,
//! the object area large enough for the state and the bitmap, and the
//! stored clock valid (flag 0 or 1; a TSC calibration passing
//! [`TscClock::validate`]); `tat` is checked on every read
//! (a word further ahead than any real debt is an error, see
//! [`MAX_LEAD`](super::bucket::MAX_LEAD)).
//!
//! **Processes.** Each process registers in the region's process table so
//! that its waiters per priority are visible to the others (`obj[tier]` of
//! its entry, adjusted with atomic adds by this process only) and to the
//! CLI. A dead process holds no tokens (a charge is final), so reaping only
//! frees its entry, which zeroes its waiter counts, and clears its waiting
//! bit.
//!
//! **Fast path closed while anyone waits.** A consume (or `try_consume`)
//! takes tokens directly only while the bitmap is all zero; otherwise it
//! queues and the drain decides, with its cross-process deferral rules.
//!
//! **Wake-ups across processes.** When a waiter leaves a queue (granted,
//! cancelled, failed), every other process with waiters is woken on its
//! futex word, so a drain deferring to this process's waiter looks again at
//! once. Threads sleeping on a process word count themselves in its entry's
//! `obj[SLEEPERS]`; a wake finding no sleeper makes no syscall.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::bucket::Gcra;
use super::stats::SharedLimiterStats;
use super::{check_rate, MAX_TOKENS_PER_SECOND};
use crate::error::{Error, Result};
use crate::priority::LEVELS;
use crate::region::{
    Mapping, ObjectKind, ObjectSpec, ProcId, ProcState, Region, Waiters, SLEEPERS,
};
use crate::stall::StallClock;
use crate::sys::clock::{calibrate, Clock, TscClock};
use std::time::Duration;

/// Revision of this object's layout, stored in the header params.
const OBJECT_REV: u64 = 3;

/// Process slots covered by the waiting-process bitmap (the region's limit).
const WAITING_BITS: usize = crate::region::layout::MAX_PROCESS_SLOTS as usize;
const WAITING_WORDS: usize = WAITING_BITS / 64;
/// Byte offset of the bitmap in the object area.
const WAITING_OFF: usize = std::mem::size_of::<LimiterState>();
/// Bytes of object area this layout needs.
const OBJECT_SIZE: usize = WAITING_OFF + WAITING_WORDS * 8;

// Waiter counts use obj[0..LEVELS]; the sleeper count sits above them.
const _: () = assert!(SLEEPERS >= LEVELS);

/// The limiter's state at the start of the object area.
#[repr(C, align(128))]
struct LimiterState {
    /// The bucket word. Written by any process, only by CAS.
    tat: AtomicU64,
    /// Counter: force-throughs into debt, by any process (`fetch_add`).
    forced: AtomicU64,
    /// Region-wide stall time: at least one consume waiting, in any process.
    stall: StallClock,
    /// Counter: futex wake-ups sent to a process word with a sleeper there.
    wakes: AtomicU64,
    /// The region's clock: "TSC in use" (0 or 1), `tsc0`, `ns0`, `mult`,
    /// `shift`. Written once by the creator, before the region is ready.
    clock: [AtomicU64; 5],
    _pad: [u64; 6],
}

const _: () = assert!(std::mem::size_of::<LimiterState>() == 128);
/// Byte offset of the stored clock in the object area.
const CLOCK_OFF: usize = std::mem::offset_of!(LimiterState, clock);
const _: () = assert!(CLOCK_OFF == 40);

/// A bound limiter region, as seen by one registered process.
#[derive(Debug)]
pub(crate) struct SharedBucket {
    map: Arc<Mapping>,
    me: ProcId,
    base: *const LimiterState,
    gcra: Gcra,
    /// Waiting-bitmap words in use: the region's process slots / 64.
    pwords: usize,
    /// The region's clock (stored by its creator).
    clock: Clock,
}

// SAFETY: `base` points into the mapping owned by `map`, which lives as long
// as `self`; every access through it is to atomics, which other threads and
// processes may mutate concurrently by design.
unsafe impl Send for SharedBucket {}
// SAFETY: as above: only atomic accesses through `base`.
unsafe impl Sync for SharedBucket {}

impl SharedBucket {
    /// Binds `region` as a limiter of `rate` tokens/s (creating it if the
    /// region is new), or joins whatever rate it has (`rate` None).
    pub fn bind(region: &Region, rate: Option<u64>) -> Result<SharedBucket> {
        let map = match rate {
            Some(r) => {
                let r = check_rate(r)?;
                // Zeroed area: tat = 0 = full. The creator calibrates the
                // clock every process will use.
                let init = |area: &mut [u8]| {
                    let words = match calibrate() {
                        Some(c) => [1, c.tsc0, c.ns0, c.mult, u64::from(c.shift)],
                        None => [0; 5],
                    };
                    for (i, w) in words.iter().enumerate() {
                        let at = CLOCK_OFF + i * 8;
                        area[at..at + 8].copy_from_slice(&w.to_ne_bytes());
                    }
                };
                let spec = ObjectSpec {
                    kind: ObjectKind::Limiter,
                    params: [u64::from(r), OBJECT_REV, 0, 0, 0, 0, 0, 0],
                    object_size: OBJECT_SIZE,
                    init: &init,
                };
                region.bind(ObjectKind::Limiter, Some(&spec))?
            }
            None => region.bind(ObjectKind::Limiter, None)?,
        };
        SharedBucket::from_mapping(map)
    }

    /// The mapping this bucket lives in.
    pub fn mapping(&self) -> &Arc<Mapping> {
        &self.map
    }

    fn from_mapping(map: Arc<Mapping>) -> Result<SharedBucket> {
        let h = map.header();
        if h.params[1] != OBJECT_REV {
            return Err(Error::BadRegion(format!(
                "limiter object revision {} is not the supported {OBJECT_REV}",
                h.params[1]
            )));
        }
        let rate = u32::try_from(h.params[0])
            .ok()
            .filter(|&r| r >= 1 && u64::from(r) <= MAX_TOKENS_PER_SECOND)
            .ok_or_else(|| {
                Error::BadRegion(format!(
                    "limiter rate {} is out of range 1..={MAX_TOKENS_PER_SECOND}",
                    h.params[0]
                ))
            })?;
        let now = crate::sys::monotonic_ns();
        if h.clock_epoch_ns > now {
            return Err(Error::BadRegion(format!(
                "limiter epoch {} ns is later than the shared clock's now ({now} ns)",
                h.clock_epoch_ns
            )));
        }
        if map.object_len() < OBJECT_SIZE {
            return Err(Error::BadRegion(format!(
                "limiter object area is {} bytes, it needs {OBJECT_SIZE}",
                map.object_len(),
            )));
        }
        let base = map.object_ptr() as *const LimiterState;
        if base as usize % 128 != 0 {
            return Err(Error::BadRegion(
                "limiter object area is not 128-byte aligned".into(),
            ));
        }
        let pwords = (map.process_slots() as usize)
            .div_ceil(64)
            .clamp(1, WAITING_WORDS);
        let mut s = SharedBucket {
            gcra: Gcra::new(rate, h.clock_epoch_ns),
            map,
            me: ProcId { idx: 0, owner: 0 },
            base,
            pwords,
            clock: Clock::Monotonic,
        };
        s.clock = s.load_clock()?;
        s.me = match s.map.me() {
            Err(Error::ProcessTableFull { .. }) => {
                // Entries of dead processes become free once reaped; a
                // limiter has nothing of theirs to give back but their
                // waiting state.
                s.map.reap_dead(&mut |idx, _| s.release_dead(idx))?;
                s.map.me()?
            }
            r => r?,
        };
        Ok(s)
    }

    /// Reads and validates the stored clock.
    fn load_clock(&self) -> Result<Clock> {
        let w: Vec<u64> = self
            .state()
            .clock
            .iter()
            .map(|x| x.load(Ordering::Acquire))
            .collect();
        match w[0] {
            0 => Ok(Clock::Monotonic),
            1 => {
                let c = TscClock {
                    tsc0: w[1],
                    ns0: w[2],
                    mult: w[3],
                    shift: u32::try_from(w[4]).unwrap_or(u32::MAX),
                };
                c.validate()
                    .map_err(|e| Error::BadRegion(format!("limiter clock: {e}")))?;
                Ok(Clock::Tsc(c))
            }
            f => Err(Error::BadRegion(format!(
                "limiter clock flag {f} is neither 0 (CLOCK_MONOTONIC) nor 1 (TSC)"
            ))),
        }
    }

    /// The region's clock, the same in every process.
    #[inline]
    pub fn clock(&self) -> Clock {
        self.clock
    }

    fn state(&self) -> &LimiterState {
        // SAFETY: `base` is 128-aligned and the object area holds at least a
        // LimiterState (both checked in `from_mapping`); LimiterState is only
        // atomics and padding, valid for every bit pattern and meant for
        // shared mutation through `&`; the mapping (kept by `self.map`)
        // outlives the returned reference.
        unsafe { &*self.base }
    }

    #[inline]
    fn waiting(&self) -> &[AtomicU64] {
        // SAFETY: `pwords` (≤ WAITING_WORDS) u64s at WAITING_OFF lie inside
        // the object area (at least OBJECT_SIZE bytes, checked in
        // `from_mapping`), 8-aligned; atomics only, valid for any bits.
        unsafe {
            std::slice::from_raw_parts(
                (self.base as *const u8).add(WAITING_OFF) as *const AtomicU64,
                self.pwords,
            )
        }
    }

    /// True if a consume waits in any process (this one included): the
    /// fast path is closed then. Reads only the bitmap words in use.
    #[inline]
    pub fn anyone_waiting(&self) -> bool {
        self.waiters().anyone()
    }

    fn waiters(&self) -> Waiters<'_> {
        Waiters::new(self.waiting())
    }

    /// The bucket's arithmetic.
    pub fn gcra(&self) -> Gcra {
        self.gcra
    }

    /// The bucket word.
    #[inline]
    pub fn tat(&self) -> &AtomicU64 {
        &self.state().tat
    }

    /// Counts a force-through region-wide.
    pub fn count_forced(&self) {
        self.state().forced.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `delta` to this process's waiter count at `tier` and keeps its
    /// waiting bit in step (the count is changed by a CAS, as several
    /// limiters of one process share its registration, and the bit is
    /// re-checked after a clear: a concurrent increment may have raced it).
    /// A waiter leaving (`delta < 0`) wakes every other waiting process.
    pub fn publish_waiting(&self, tier: usize, delta: i64) {
        let Ok(e) = self.map.proc_entry(self.me.idx) else {
            return;
        };
        let word = &e.obj[tier];
        let mut old = word.load(Ordering::SeqCst);
        loop {
            let new = if old > u64::from(u32::MAX) {
                // A scribbled count: start again from this change.
                delta.max(0) as u64
            } else {
                (old as i64 + delta).max(0) as u64
            };
            match word.compare_exchange_weak(old, new, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => break,
                Err(now) => old = now,
            }
        }
        let any = || {
            e.obj[..LEVELS]
                .iter()
                .any(|w| w.load(Ordering::SeqCst) != 0)
        };
        self.waiters().mark(self.me.idx, any);
        self.state().stall.update(|| self.anyone_waiting());
        if delta < 0 {
            self.wake_others();
        }
    }

    /// Wakes every other process with waiters (a deferring drain there may
    /// now go). No syscall for a process where nobody sleeps.
    fn wake_others(&self) {
        for idx in self.waiters().each().filter(|&i| i != self.me.idx) {
            self.wake_process(idx);
        }
    }

    /// The highest tier at which another live process has waiters, and that
    /// process's entry index. A dead process found there (its counts are
    /// stale) is reaped, which zeroes them, and the scan repeated once.
    pub fn best_waiting_elsewhere(&self) -> Option<(usize, u32)> {
        let best = self.scan_waiting_elsewhere()?;
        if self.map.is_alive(best.1).unwrap_or(false) {
            return Some(best);
        }
        let _ = self.reap();
        self.scan_waiting_elsewhere()
            .filter(|&(_, idx)| self.map.is_alive(idx).unwrap_or(false))
    }

    fn scan_waiting_elsewhere(&self) -> Option<(usize, u32)> {
        let mut best: Option<(usize, u32)> = None;
        for idx in 0..self.map.process_slots() {
            if idx == self.me.idx {
                continue;
            }
            let Ok(e) = self.map.proc_entry(idx) else {
                continue;
            };
            if !matches!(e.state(idx), Ok(ProcState::Live)) {
                continue;
            }
            for t in (best.map_or(0, |(bt, _)| bt + 1)..LEVELS).rev() {
                // A count above 2^32 can only be a scribble: ignore it.
                let c = e.obj[t].load(Ordering::SeqCst);
                if c > 0 && c <= u64::from(u32::MAX) {
                    best = Some((t, idx));
                    break;
                }
            }
            if best.is_some_and(|(t, _)| t + 1 == LEVELS) {
                break;
            }
        }
        best
    }

    /// Wakes the threads of process `idx` sleeping on its futex word (its
    /// pumps and its deferring fronts); no syscall when nobody sleeps there.
    pub fn wake_process(&self, idx: u32) {
        if self.map.wake_process(idx) {
            self.state().wakes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Wakes this process's threads sleeping on its futex word.
    pub fn wake_mine(&self) {
        self.wake_process(self.me.idx);
    }

    /// Sleeps on this process's futex word until woken or `nap` passes,
    /// unless the word moved past `seq` already.
    pub fn sleep(&self, seq: u32, nap: Duration) {
        self.map.sleep_on(self.me.idx, seq, nap);
    }

    /// This process's futex word (its pumps sleep on it).
    pub fn my_futex(&self) -> Option<&AtomicU32> {
        self.map.proc_entry(self.me.idx).ok().map(|e| &e.futex)
    }

    /// Frees the entries of dead processes. Returns how many.
    pub fn reap(&self) -> Result<u32> {
        let n = self.map.reap_dead(&mut |idx, _| self.release_dead(idx))?;
        if n > 0 {
            // The dead processes' waiter counts are gone.
            self.state().stall.update(|| self.anyone_waiting());
            // Waiters that deferred to them may go now.
            self.wake_others();
            self.wake_mine();
        }
        Ok(n)
    }

    /// Clears a dead process's waiting state (bit and counts).
    fn release_dead(&self, idx: u32) {
        self.waiters().clear(idx);
        if let Ok(e) = self.map.proc_entry(idx) {
            for w in &e.obj[..=SLEEPERS] {
                w.store(0, Ordering::SeqCst);
            }
        }
    }

    /// Region-wide figures.
    pub fn stats(&self) -> SharedLimiterStats {
        let mut waiters = [0u64; LEVELS];
        let mut processes = 0;
        if let Ok(procs) = self.map.live_processes() {
            for p in procs.iter().filter(|p| p.alive) {
                processes += 1;
                if let Ok(e) = self.map.proc_entry(p.idx) {
                    for (t, w) in waiters.iter_mut().enumerate() {
                        // A count above 2^32 can only be a scribble: ignore it.
                        let c = e.obj[t].load(Ordering::Relaxed);
                        if c <= u64::from(u32::MAX) {
                            *w += c;
                        }
                    }
                }
            }
        }
        SharedLimiterStats {
            forced: self.state().forced.load(Ordering::Relaxed),
            waiters,
            processes,
            stall_ns: self.state().stall.total_ns(),
            wakes: self.state().wakes.load(Ordering::Relaxed),
            tsc: self.clock.tsc(),
        }
    }
}
