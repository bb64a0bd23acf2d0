//! The Limiter's home in a region: one bucket word, shared by every process.
//!
//! **Layout** (object area of a `Limiter` region, one 128-byte line):
//! `tat` (the bucket, see [`bucket`](super::bucket)), then `forced`, a
//! region-wide counter of force-throughs. The rate and the epoch are *not*
//! in the object area: the rate is the header's `params[0]` and the epoch is
//! the header's `clock_epoch_ns`, both written once by the initialiser and
//! covered by the header checksum, so a scribbler cannot change them without
//! the region failing validation.
//!
//! **Validation.** `params[0]` must be a rate in `1..=2³¹−1`, `params[1]`
//! this layout's revision, the epoch not in the future of the shared clock,
//! and the object area large enough; `tat` is checked on every read
//! (a word further ahead than any real debt is an error, see
//! [`MAX_LEAD`](super::bucket::MAX_LEAD)).
//!
//! **Processes.** Each process registers in the region's process table so
//! that its waiters per priority are visible to the others (`obj[tier]` of
//! its entry, adjusted with atomic adds by this process only) and to the
//! CLI. A dead process holds no tokens (a charge is final), so reaping only
//! frees its entry, which zeroes its waiter counts.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::bucket::Gcra;
use super::stats::SharedLimiterStats;
use super::{check_rate, MAX_TOKENS_PER_SECOND};
use crate::error::{Error, Result};
use crate::priority::LEVELS;
use crate::region::{Mapping, ObjectKind, ObjectSpec, ProcId, ProcState, Region};
use crate::stall::StallClock;
use crate::sys::futex::futex_wake;

/// Revision of this object's layout, stored in the header params.
const OBJECT_REV: u64 = 1;

/// The limiter's state at the start of the object area.
#[repr(C, align(128))]
struct LimiterState {
    /// The bucket word. Written by any process, only by CAS.
    tat: AtomicU64,
    /// Counter: force-throughs into debt, by any process (`fetch_add`).
    forced: AtomicU64,
    /// Region-wide stall time: at least one consume waiting, in any process.
    stall: StallClock,
    _pad: [u64; 12],
}

const _: () = assert!(std::mem::size_of::<LimiterState>() == 128);

/// A bound limiter region, as seen by one registered process.
#[derive(Debug)]
pub(crate) struct SharedBucket {
    map: Arc<Mapping>,
    me: ProcId,
    base: *const LimiterState,
    gcra: Gcra,
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
                let init = |_: &mut [u8]| {}; // zeroed area: tat = 0 = full
                let spec = ObjectSpec {
                    kind: ObjectKind::Limiter,
                    params: [u64::from(r), OBJECT_REV, 0, 0, 0, 0, 0, 0],
                    object_size: std::mem::size_of::<LimiterState>(),
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
        if map.object_len() < std::mem::size_of::<LimiterState>() {
            return Err(Error::BadRegion(format!(
                "limiter object area is {} bytes, it needs {}",
                map.object_len(),
                std::mem::size_of::<LimiterState>()
            )));
        }
        let base = map.object_ptr() as *const LimiterState;
        if base as usize % 128 != 0 {
            return Err(Error::BadRegion(
                "limiter object area is not 128-byte aligned".into(),
            ));
        }
        let me = match map.me() {
            Err(Error::ProcessTableFull { .. }) => {
                // Entries of dead processes become free once reaped; a
                // limiter has nothing of theirs to give back.
                map.reap_dead(&mut |_, _| {})?;
                map.me()?
            }
            r => r?,
        };
        Ok(SharedBucket {
            gcra: Gcra::new(rate, h.clock_epoch_ns),
            map,
            me,
            base,
        })
    }

    fn state(&self) -> &LimiterState {
        // SAFETY: `base` is 128-aligned and the object area holds at least a
        // LimiterState (both checked in `from_mapping`); LimiterState is only
        // atomics and padding, valid for every bit pattern and meant for
        // shared mutation through `&`; the mapping (kept by `self.map`)
        // outlives the returned reference.
        unsafe { &*self.base }
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

    /// Adds `delta` to this process's waiter count at `tier`.
    pub fn publish_waiting(&self, tier: usize, delta: i64) {
        if let Ok(e) = self.map.proc_entry(self.me.idx) {
            if delta >= 0 {
                e.obj[tier].fetch_add(delta as u64, Ordering::SeqCst);
            } else {
                e.obj[tier].fetch_sub(delta.unsigned_abs(), Ordering::SeqCst);
            }
        }
        self.state().stall.update(|| self.anyone_waiting());
    }

    /// True if a consume waits in any registered process (this one too).
    fn anyone_waiting(&self) -> bool {
        (0..self.map.process_slots()).any(|idx| {
            self.map.proc_entry(idx).is_ok_and(|e| {
                e.obj[..LEVELS].iter().any(|w| {
                    let c = w.load(Ordering::SeqCst);
                    c != 0 && c <= u64::from(u32::MAX)
                })
            })
        })
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

    /// Wakes process `idx`'s pumps (bumps its futex word).
    pub fn wake_process(&self, idx: u32) {
        if let Ok(e) = self.map.proc_entry(idx) {
            e.futex.fetch_add(1, Ordering::SeqCst);
            futex_wake(&e.futex, i32::MAX);
        }
    }

    /// This process's futex word (its pumps sleep on it).
    pub fn my_futex(&self) -> Option<&AtomicU32> {
        self.map.proc_entry(self.me.idx).ok().map(|e| &e.futex)
    }

    /// Frees the entries of dead processes. Returns how many.
    pub fn reap(&self) -> Result<u32> {
        let n = self.map.reap_dead(&mut |_, _| {})?;
        if n > 0 {
            // The dead processes' waiter counts are gone.
            self.state().stall.update(|| self.anyone_waiting());
        }
        Ok(n)
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
        }
    }
}
