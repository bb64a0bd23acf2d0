//! The Scheduler's home in a region: a slot table whose cells record their
//! owner, written by the same CAS that takes the capacity.
//!
//! **Layout** (object area of a `Scheduler` region, all fixed offsets):
//! `[SchedHeader][occupancy bitmap: ⌈max/64⌉ words][waiting-process bitmap:
//! 64 words][owner cells: max × u32]`, each part 128-byte aligned.
//!
//! **Taking a slot.** A free cell `c` (occupancy bit clear) is claimed by
//! `CAS(owner[c], 0 → my owner id)`; only then is its occupancy bit set. So
//! the hard cap is the number of cells (no counter can be raced past it) and
//! ownership is recorded by the very instruction that takes the capacity.
//! Invariant: bit `c` set ⇒ `owner[c]` is the holder.
//!
//! **Releasing** clears the bit first, then the owner. A process that dies
//! between any two steps leaves either `owner[c]` = its id with the bit set
//! or clear; both are unambiguous, so the reaper frees exactly the cells
//! whose owner is the dead process (clearing the bit, then the owner). No
//! slot is leaked or freed twice.
//!
//! **Running** is the population count of the bitmap: exact at quiescence,
//! never above `max`. Per-priority caps are checked against it before and
//! after the claim; two racing claimers can both see the cap reached and
//! both back off, never both stay above it.
//!
//! **Waiting across processes.** Each process entry's `obj[t]` word holds its
//! waiter count at tier `t` (low 32 bits) and its cap for that tier (high 32
//! bits), written only by that process under its scheduler lock; a
//! waiting-process bitmap has bit `i` set while process `i` has waiters. A
//! releaser wakes the process holding the highest-priority admissible
//! waiter, on that process's own futex word. A dispatching process defers to
//! such a waiter elsewhere instead of serving its own lower tier (lottery
//! picks aside). The fast path is closed while anyone waits anywhere.
//!
//! **Dead processes** are found by the region's kernel-backed liveness locks
//! when a waiter finds the budget full or naps without progress (at most one
//! scan per [`REAP_INTERVAL_MS`] region-wide), or by an explicit reap.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::stats::SharedStats;
use crate::error::{Error, Result};
use crate::priority::LEVELS;
use crate::region::{Mapping, ObjectKind, ObjectSpec, ProcId, Region};
use crate::sys::clock::monotonic_ms;
use crate::sys::futex::futex_wake;

/// The largest global max a shared scheduler supports (one owner cell per slot).
pub const MAX_SHARED_SLOTS: u32 = 65_536;

/// Revision of this object's layout, stored in the header params.
const OBJECT_REV: u64 = 1;

/// Process slots covered by the waiting-process bitmap (the region's limit).
const WAITING_BITS: usize = 4096;
const WAITING_WORDS: usize = WAITING_BITS / 64;

/// Minimum time between two scans for dead processes, region-wide.
pub const REAP_INTERVAL_MS: u64 = 20;

/// The scheduler's own header at the start of the object area.
#[repr(C, align(128))]
struct SchedHeader {
    /// Global max; written once at initialisation.
    max: AtomicU32,
    /// Bitmap words; written once at initialisation.
    words: AtomicU32,
    _pad0: [u32; 2],
    /// Counter: cells freed on behalf of dead processes.
    reclaimed: AtomicU64,
    /// Counter: dead processes reaped.
    reaped: AtomicU64,
    /// Monotonic ms of the last dead-process scan (rate limit).
    last_reap_ms: AtomicU64,
    _pad1: [u64; 11],
}

const _: () = assert!(std::mem::size_of::<SchedHeader>() == 128);

fn round128(n: usize) -> usize {
    n.div_ceil(128) * 128
}

#[derive(Debug, Clone, Copy)]
struct Layout {
    words: usize,
    bitmap_off: usize,
    waiting_off: usize,
    owners_off: usize,
    size: usize,
}

fn layout(max: u32) -> Layout {
    let words = (max as usize).div_ceil(64).max(1);
    let bitmap_off = 128;
    let waiting_off = bitmap_off + round128(words * 8);
    let owners_off = waiting_off + round128(WAITING_WORDS * 8);
    let size = owners_off + round128(max as usize * 4).max(128);
    Layout { words, bitmap_off, waiting_off, owners_off, size }
}

fn spec_params(max: u32) -> [u64; 8] {
    [u64::from(max), OBJECT_REV, 0, 0, 0, 0, 0, 0]
}

fn init_object(max: u32, bytes: &mut [u8]) {
    // The area arrives zeroed: all cells free, no waiters, counters 0.
    let l = layout(max);
    bytes[0..4].copy_from_slice(&max.to_ne_bytes());
    bytes[4..8].copy_from_slice(&(l.words as u32).to_ne_bytes());
}

/// A bound shared slot table, as seen by one registered process.
#[derive(Debug)]
pub(crate) struct SharedSlots {
    map: Arc<Mapping>,
    me: ProcId,
    max: u32,
    words: usize,
    base: *mut u8,
    layout: Layout,
    /// Where this process starts looking for a free cell (spreads contention).
    hint: AtomicU32,
}

// SAFETY: `base` points into the mapping owned by `map`, which lives as long
// as `self`; every access through it is to atomics, so sharing across
// threads is sound.
unsafe impl Send for SharedSlots {}
// SAFETY: as above: only atomic accesses through `base`.
unsafe impl Sync for SharedSlots {}

impl SharedSlots {
    /// Binds `region` as a scheduler with global max `max` (creating it if
    /// the region is new), or attaches to whatever max it has (`max` None).
    pub fn bind(region: &Region, max: Option<u32>) -> Result<SharedSlots> {
        if let Some(m) = max {
            if m > MAX_SHARED_SLOTS {
                return Err(Error::InvalidArgument(format!(
                    "a shared scheduler's max {m} is above the limit {MAX_SHARED_SLOTS} (one owner cell per slot)"
                )));
            }
        }
        let map = match max {
            Some(m) => {
                let init = move |b: &mut [u8]| init_object(m, b);
                let spec = ObjectSpec {
                    kind: ObjectKind::Scheduler,
                    params: spec_params(m),
                    object_size: layout(m).size,
                    init: &init,
                };
                region.bind(ObjectKind::Scheduler, Some(&spec))?
            }
            None => region.bind(ObjectKind::Scheduler, None)?,
        };
        SharedSlots::from_mapping(map)
    }

    fn from_mapping(map: Arc<Mapping>) -> Result<SharedSlots> {
        let params = map.header().params;
        if params[1] != OBJECT_REV {
            return Err(Error::BadRegion(format!(
                "scheduler object revision {} is not the supported {OBJECT_REV}",
                params[1]
            )));
        }
        let max = u32::try_from(params[0])
            .ok()
            .filter(|&m| m <= MAX_SHARED_SLOTS)
            .ok_or_else(|| {
                Error::BadRegion(format!("scheduler max {} is above the limit {MAX_SHARED_SLOTS}", params[0]))
            })?;
        let l = layout(max);
        if map.object_len() < l.size {
            return Err(Error::BadRegion(format!(
                "scheduler object area is {} bytes, max {max} needs {}",
                map.object_len(),
                l.size
            )));
        }
        let base = map.object_ptr();
        if base as usize % 128 != 0 {
            return Err(Error::BadRegion("scheduler object area is not 128-byte aligned".into()));
        }
        let mut s = SharedSlots {
            map,
            me: ProcId { idx: 0, owner: 0 },
            max,
            words: l.words,
            base,
            layout: l,
            hint: AtomicU32::new(0),
        };
        s.me = match s.map.me() {
            Err(Error::ProcessTableFull { .. }) => {
                // Dead processes may still hold entries: return what they
                // held, free their entries, and try once more.
                s.reap()?;
                s.map.me()?
            }
            r => r?,
        };
        let (hmax, hwords) = (s.header().max.load(Ordering::Relaxed), s.header().words.load(Ordering::Relaxed));
        if hmax != max || hwords as usize != l.words {
            return Err(Error::BadRegion(format!(
                "scheduler header says max {hmax} with {hwords} bitmap words; the region header says max {max} ({} words)",
                l.words
            )));
        }
        s.hint.store(s.me.idx % l.words as u32, Ordering::Relaxed);
        Ok(s)
    }

    fn header(&self) -> &SchedHeader {
        // SAFETY: `base` is 128-aligned, the object area is at least
        // `layout.size` bytes (checked in `from_mapping`) and starts with a
        // SchedHeader made only of atomics and padding; the mapping outlives
        // `self`.
        unsafe { &*(self.base as *const SchedHeader) }
    }

    fn bitmap(&self) -> &[AtomicU64] {
        // SAFETY: `words` u64s at `bitmap_off` lie inside the checked object
        // area, 8-aligned (offset multiple of 128); AtomicU64 has u64's layout.
        unsafe { std::slice::from_raw_parts(self.base.add(self.layout.bitmap_off) as *const AtomicU64, self.words) }
    }

    fn waiting(&self) -> &[AtomicU64] {
        // SAFETY: WAITING_WORDS u64s at `waiting_off` lie inside the checked
        // object area, 8-aligned.
        unsafe {
            std::slice::from_raw_parts(self.base.add(self.layout.waiting_off) as *const AtomicU64, WAITING_WORDS)
        }
    }

    fn owners(&self) -> &[AtomicU32] {
        // SAFETY: `max` u32s at `owners_off` lie inside the checked object
        // area, 4-aligned.
        unsafe {
            std::slice::from_raw_parts(self.base.add(self.layout.owners_off) as *const AtomicU32, self.max as usize)
        }
    }

    /// Bits of word `w` that are real cells.
    #[inline]
    fn valid_mask(&self, w: usize) -> u64 {
        let bits = self.max as usize - w * 64;
        if bits >= 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        }
    }

    /// The region's global max.
    pub fn max(&self) -> u32 {
        self.max
    }

    /// This process's owner id in the region.
    pub fn owner(&self) -> u32 {
        self.me.owner
    }

    /// The mapping this table lives in.
    pub fn mapping(&self) -> &Arc<Mapping> {
        &self.map
    }

    /// Slots held across all processes.
    #[inline]
    pub fn running(&self) -> u32 {
        let mut n = 0;
        for (w, word) in self.bitmap().iter().enumerate() {
            n += (word.load(Ordering::SeqCst) & self.valid_mask(w)).count_ones();
        }
        n
    }

    /// Claims a free cell iff fewer than `limit` slots are held.
    #[inline]
    pub fn try_take(&self, limit: u32) -> Option<u32> {
        if self.running() >= limit {
            return None;
        }
        let owners = self.owners();
        let bitmap = self.bitmap();
        let start = self.hint.load(Ordering::Relaxed) as usize;
        for k in 0..self.words {
            let w = (start + k) % self.words;
            let mut free = !bitmap[w].load(Ordering::SeqCst) & self.valid_mask(w);
            while free != 0 {
                let bit = free.trailing_zeros() as usize;
                let c = w * 64 + bit;
                if owners[c].compare_exchange(0, self.me.owner, Ordering::SeqCst, Ordering::Relaxed).is_ok() {
                    bitmap[w].fetch_or(1 << bit, Ordering::SeqCst);
                    if limit < self.max && self.running() > limit {
                        // Raced past a per-priority cap: back off.
                        self.give(c as u32);
                        return None;
                    }
                    return Some(c as u32);
                }
                free &= !(1 << bit);
            }
        }
        None
    }

    /// Frees cell `cell`, which this process holds.
    #[inline]
    pub fn give(&self, cell: u32) {
        let c = cell as usize;
        if c >= self.max as usize {
            debug_assert!(false, "cell {c} out of range");
            return;
        }
        self.bitmap()[c / 64].fetch_and(!(1u64 << (c % 64)), Ordering::SeqCst);
        // A failed CAS means the cell was already reclaimed (this process was
        // wrongly taken for dead, or the region was scribbled on): never free
        // a cell that is not ours.
        let _ = self.owners()[c].compare_exchange(self.me.owner, 0, Ordering::SeqCst, Ordering::Relaxed);
    }

    /// True if a process other than this one has waiters.
    #[inline]
    pub fn others_waiting(&self) -> bool {
        let (my_w, my_b) = (self.me.idx as usize / 64, self.me.idx as usize % 64);
        self.waiting().iter().enumerate().any(|(w, word)| {
            let mut v = word.load(Ordering::SeqCst);
            if w == my_w {
                v &= !(1 << my_b);
            }
            v != 0
        })
    }

    /// Publishes a change of this process's waiter count at `tier`.
    /// Called under the owning scheduler's lock.
    pub fn publish_waiting(&self, tier: usize, delta: i32, cap: u32) {
        let Ok(entry) = self.map.proc_entry(self.me.idx) else { return };
        let word = &entry.obj[tier];
        let old = word.load(Ordering::Relaxed);
        let count = ((old & 0xffff_ffff) as i64 + i64::from(delta)).max(0) as u64;
        word.store((u64::from(cap) << 32) | count, Ordering::SeqCst);
        let any = entry.obj[..LEVELS].iter().any(|w| w.load(Ordering::Relaxed) & 0xffff_ffff != 0);
        let (w, b) = (self.me.idx as usize / 64, self.me.idx as usize % 64);
        if any {
            self.waiting()[w].fetch_or(1 << b, Ordering::SeqCst);
        } else {
            self.waiting()[w].fetch_and(!(1 << b), Ordering::SeqCst);
        }
    }

    /// The other process holding the best waiter above `tier` that its cap
    /// admits at `running`, if any (`tier` None: any tier).
    fn best_waiting(&self, above: Option<usize>, running: u32) -> Option<u32> {
        let mut best: Option<(usize, u32)> = None;
        let slots = self.map.process_slots() as usize;
        for (w, word) in self.waiting().iter().enumerate() {
            let mut v = word.load(Ordering::SeqCst);
            while v != 0 {
                let b = v.trailing_zeros() as usize;
                v &= !(1 << b);
                let idx = w * 64 + b;
                if idx == self.me.idx as usize || idx >= slots {
                    continue;
                }
                let Ok(entry) = self.map.proc_entry(idx as u32) else { continue };
                let from = above.map_or(0, |t| t + 1);
                for t in (from..LEVELS).rev() {
                    let x = entry.obj[t].load(Ordering::SeqCst);
                    let (count, cap) = (x & 0xffff_ffff, (x >> 32) as u32);
                    if count > 0 && running < cap {
                        if best.is_none_or(|(bt, _)| t > bt) {
                            best = Some((t, idx as u32));
                        }
                        break;
                    }
                }
            }
        }
        best.map(|(_, idx)| idx)
    }

    /// Another process whose waiter should get a slot before this process's
    /// waiter at `tier`.
    pub fn defer_to(&self, tier: usize, running: u32) -> Option<u32> {
        if !self.others_waiting() {
            return None;
        }
        self.best_waiting(Some(tier), running)
    }

    /// After a release: wake the process with the best admissible waiter.
    #[inline]
    pub fn wake_after_release(&self) {
        if !self.others_waiting() {
            return;
        }
        if let Some(idx) = self.best_waiting(None, self.running()) {
            self.wake_process(idx);
        }
    }

    /// Wakes every waiter of process `idx` (they re-run dispatch).
    pub fn wake_process(&self, idx: u32) {
        if let Ok(entry) = self.map.proc_entry(idx) {
            entry.futex.fetch_add(1, Ordering::SeqCst);
            futex_wake(&entry.futex, i32::MAX);
        }
    }

    /// The futex word this process's waiters sleep on.
    pub fn my_futex(&self) -> &AtomicU32 {
        match self.map.proc_entry(self.me.idx) {
            Ok(e) => &e.futex,
            // `me.idx` was validated at registration; unreachable in practice.
            Err(_) => &self.header().max,
        }
    }

    /// Wakes this process's own waiters (after a local grant).
    pub fn notify_mine(&self) {
        self.wake_process(self.me.idx);
    }

    /// Scans for dead processes unless another scan ran within
    /// [`REAP_INTERVAL_MS`].
    pub fn maybe_reap(&self) {
        let now = monotonic_ms();
        let h = self.header();
        let last = h.last_reap_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) < REAP_INTERVAL_MS {
            return;
        }
        if h.last_reap_ms.compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            let _ = self.reap();
        }
    }

    /// Returns every slot of every dead process now. Returns (processes
    /// reaped, slots reclaimed).
    pub fn reap(&self) -> Result<(u32, u64)> {
        let mut slots = 0u64;
        let procs = self.map.reap_dead(&mut |idx, owner| {
            slots += self.release_dead(idx, owner);
        })?;
        if procs > 0 {
            let h = self.header();
            h.reaped.fetch_add(u64::from(procs), Ordering::Relaxed);
            h.reclaimed.fetch_add(slots, Ordering::Relaxed);
            // Freed slots and vanished waiters: let every waiting process
            // re-run its dispatch.
            for (w, word) in self.waiting().iter().enumerate() {
                let mut v = word.load(Ordering::SeqCst);
                while v != 0 {
                    let b = v.trailing_zeros();
                    v &= !(1 << b);
                    self.wake_process(w as u32 * 64 + b);
                }
            }
            self.notify_mine();
        }
        Ok((procs, slots))
    }

    /// Frees every cell owned by `owner` (a dead process) and clears its
    /// waiting state. Returns the number of cells freed.
    fn release_dead(&self, idx: u32, owner: u32) -> u64 {
        let mut n = 0;
        let bitmap = self.bitmap();
        for (c, cell) in self.owners().iter().enumerate() {
            if cell.load(Ordering::SeqCst) == owner {
                bitmap[c / 64].fetch_and(!(1u64 << (c % 64)), Ordering::SeqCst);
                if cell.compare_exchange(owner, 0, Ordering::SeqCst, Ordering::Relaxed).is_ok() {
                    n += 1;
                }
            }
        }
        if (idx as usize) < WAITING_BITS {
            self.waiting()[idx as usize / 64].fetch_and(!(1u64 << (idx % 64)), Ordering::SeqCst);
        }
        if let Ok(entry) = self.map.proc_entry(idx) {
            for w in &entry.obj[..LEVELS] {
                w.store(0, Ordering::SeqCst);
            }
        }
        n
    }

    /// Cells held by `owner` now (for tests and the CLI).
    pub fn held_by(&self, owner: u32) -> u32 {
        self.owners().iter().filter(|c| c.load(Ordering::Relaxed) == owner).count() as u32
    }

    /// Region-wide figures.
    pub fn stats(&self) -> SharedStats {
        let h = self.header();
        let mut waiters = [0u32; LEVELS];
        let mut processes = 0;
        if let Ok(procs) = self.map.live_processes() {
            for p in procs.iter().filter(|p| p.alive) {
                processes += 1;
                if let Ok(entry) = self.map.proc_entry(p.idx) {
                    for (t, w) in waiters.iter_mut().enumerate() {
                        *w += (entry.obj[t].load(Ordering::Relaxed) & 0xffff_ffff) as u32;
                    }
                }
            }
        }
        SharedStats {
            running: self.running(),
            max: self.max,
            waiters,
            processes,
            reclaimed: h.reclaimed.load(Ordering::Relaxed),
            reaped_processes: h.reaped.load(Ordering::Relaxed),
        }
    }
}
