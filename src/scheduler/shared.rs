//! The Scheduler's home in a region: a slot table whose cells record their
//! owner, written by the same CAS that takes the capacity.
//!
//! **Layout** (object area of a `Scheduler` region, all fixed offsets):
//! `[SchedHeader][waiting-process bitmap: 64 words][owner cells: max × u32]`,
//! each part 128-byte aligned.
//!
//! **Taking a slot** is one instruction: `CAS(owner[c], 0 → my owner id)` on
//! a free cell. The hard cap is the number of cells (no counter can be raced
//! past it) and ownership is recorded by the very instruction that takes
//! the capacity.
//!
//! **Releasing** is one instruction too: `CAS(owner[c], my id → 0)` (an RMW,
//! so it is also the full barrier that orders it before the release's read
//! of the waiting bitmap). A process that dies at any point leaves each of
//! its cells either free or holding its id, never anything ambiguous, so the
//! reaper frees exactly the cells whose owner is the dead process. No slot
//! is leaked or freed twice.
//!
//! **Running** is the number of non-zero cells: exact at quiescence, never
//! above `max`. It is counted only where a per-priority cap below `max`
//! needs it (before and after a claim: two racing claimers can both see the
//! cap reached and both back off, never both stay above it), in dispatch
//! and in stats; an uncapped fast path never counts.
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
use crate::region::{Mapping, ObjectKind, ObjectSpec, ProcId, Region, Waiters};
use crate::stall::StallClock;
use crate::sys::clock::monotonic_ms;
use std::time::Duration;

/// The largest global max a shared scheduler supports (one owner cell per slot).
pub const MAX_SHARED_SLOTS: u32 = 65_536;

/// Revision of this object's layout, stored in the header params.
const OBJECT_REV: u64 = 2;

/// Process slots covered by the waiting-process bitmap (the region's limit).
const WAITING_BITS: usize = 4096;
const WAITING_WORDS: usize = WAITING_BITS / 64;

// Waiter counts use obj[0..LEVELS]; the sleeper count sits above them.
const _: () = assert!(crate::region::SLEEPERS >= LEVELS);

/// Minimum time between two scans for dead processes, region-wide.
pub const REAP_INTERVAL_MS: u64 = 20;

/// The scheduler's own header at the start of the object area.
#[repr(C, align(128))]
struct SchedHeader {
    /// Global max; written once at initialisation.
    max: AtomicU32,
    /// Reserved (0).
    _reserved: AtomicU32,
    _pad0: [u32; 2],
    /// Counter: cells freed on behalf of dead processes.
    reclaimed: AtomicU64,
    /// Counter: dead processes reaped.
    reaped: AtomicU64,
    /// Monotonic ms of the last dead-process scan (rate limit).
    last_reap_ms: AtomicU64,
    /// Region-wide stall time: at least one task waiting, in any process.
    stall: StallClock,
    _pad1: [u64; 9],
}

const _: () = assert!(std::mem::size_of::<SchedHeader>() == 128);

fn round128(n: usize) -> usize {
    n.div_ceil(128) * 128
}

#[derive(Debug, Clone, Copy)]
struct Layout {
    waiting_off: usize,
    owners_off: usize,
    size: usize,
}

fn layout(max: u32) -> Layout {
    let waiting_off = 128;
    let owners_off = waiting_off + round128(WAITING_WORDS * 8);
    let size = owners_off + round128(max as usize * 4).max(128);
    Layout {
        waiting_off,
        owners_off,
        size,
    }
}

fn spec_params(max: u32) -> [u64; 8] {
    [u64::from(max), OBJECT_REV, 0, 0, 0, 0, 0, 0]
}

fn init_object(max: u32, bytes: &mut [u8]) {
    // The area arrives zeroed: all cells free, no waiters, counters 0.
    bytes[0..4].copy_from_slice(&max.to_ne_bytes());
}

/// A bound shared slot table, as seen by one registered process.
#[derive(Debug)]
pub(crate) struct SharedSlots {
    map: Arc<Mapping>,
    me: ProcId,
    max: u32,
    base: *mut u8,
    layout: Layout,
    /// Waiting-bitmap words in use: the region's process slots / 64, so a
    /// fast path reads 2 words for the default 128 processes, not 64.
    pwords: usize,
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
                Error::BadRegion(format!(
                    "scheduler max {} is above the limit {MAX_SHARED_SLOTS}",
                    params[0]
                ))
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
            return Err(Error::BadRegion(
                "scheduler object area is not 128-byte aligned".into(),
            ));
        }
        let mut s = SharedSlots {
            map,
            me: ProcId { idx: 0, owner: 0 },
            max,
            base,
            layout: l,
            pwords: WAITING_WORDS,
            hint: AtomicU32::new(0),
        };
        s.pwords = (s.map.process_slots() as usize)
            .div_ceil(64)
            .clamp(1, WAITING_WORDS);
        s.me = match s.map.me() {
            Err(Error::ProcessTableFull { .. }) => {
                // Dead processes may still hold entries: return what they
                // held, free their entries, and try once more.
                s.reap()?;
                s.map.me()?
            }
            r => r?,
        };
        let hmax = s.header().max.load(Ordering::Relaxed);
        if hmax != max {
            return Err(Error::BadRegion(format!(
                "scheduler header says max {hmax}; the region header says max {max}"
            )));
        }
        if max > 0 {
            s.hint
                .store(s.me.idx.wrapping_mul(7) % max, Ordering::Relaxed);
        }
        Ok(s)
    }

    fn header(&self) -> &SchedHeader {
        // SAFETY: `base` is 128-aligned, the object area is at least
        // `layout.size` bytes (checked in `from_mapping`) and starts with a
        // SchedHeader made only of atomics and padding; the mapping outlives
        // `self`.
        unsafe { &*(self.base as *const SchedHeader) }
    }

    fn waiting(&self) -> &[AtomicU64] {
        // SAFETY: `pwords` (≤ WAITING_WORDS) u64s at `waiting_off` lie inside
        // the checked object area, 8-aligned.
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(self.layout.waiting_off) as *const AtomicU64,
                self.pwords,
            )
        }
    }

    fn owners(&self) -> &[AtomicU32] {
        // SAFETY: `max` u32s at `owners_off` lie inside the checked object
        // area, 4-aligned.
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(self.layout.owners_off) as *const AtomicU32,
                self.max as usize,
            )
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

    /// Slots held across all processes (counts the non-zero cells).
    #[inline]
    pub fn running(&self) -> u32 {
        self.owners()
            .iter()
            .filter(|c| c.load(Ordering::SeqCst) != 0)
            .count() as u32
    }

    /// Claims a free cell iff fewer than `limit` slots are held.
    #[inline]
    pub fn try_take(&self, limit: u32) -> Option<u32> {
        let capped = limit < self.max;
        if capped && self.running() >= limit {
            return None;
        }
        let owners = self.owners();
        let n = owners.len();
        let start = self.hint.load(Ordering::Relaxed) as usize;
        for k in 0..n {
            let c = (start + k) % n;
            if owners[c].load(Ordering::Relaxed) != 0 {
                continue;
            }
            if owners[c]
                .compare_exchange(0, self.me.owner, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                if capped && self.running() > limit {
                    // Raced past a per-priority cap: back off.
                    self.give(c as u32);
                    return None;
                }
                // A released cell is the likeliest free one next time.
                self.hint.store(c as u32, Ordering::Relaxed);
                return Some(c as u32);
            }
        }
        None
    }

    /// Frees cell `cell`, which this process holds. One RMW: it also orders
    /// the release before the caller's read of the waiting bitmap. A cell
    /// that is not ours (the region was scribbled on) is left alone.
    #[inline]
    pub fn give(&self, cell: u32) {
        let Some(owner) = self.owners().get(cell as usize) else {
            debug_assert!(false, "cell {cell} out of range");
            return;
        };
        let _ = owner.compare_exchange(self.me.owner, 0, Ordering::SeqCst, Ordering::Relaxed);
    }

    /// True if anyone waits, in any process (this one included: several
    /// schedulers of one process share its registration).
    #[inline]
    pub fn anyone_waiting(&self) -> bool {
        self.waiters().anyone()
    }

    fn waiters(&self) -> Waiters<'_> {
        Waiters::new(self.waiting())
    }

    /// Publishes a change of this process's waiter count at `tier`.
    ///
    /// All schedulers of a process bound through one `Region` share one
    /// registration, so the word is updated with a CAS, and the waiting bit
    /// is re-checked after a clear (a concurrent increment may have raced
    /// it).
    pub fn publish_waiting(&self, tier: usize, delta: i32, cap: u32) {
        let Ok(entry) = self.map.proc_entry(self.me.idx) else {
            return;
        };
        let word = &entry.obj[tier];
        let mut old = word.load(Ordering::SeqCst);
        loop {
            let count = ((old & 0xffff_ffff) as i64 + i64::from(delta)).max(0) as u64;
            let new = (u64::from(cap) << 32) | count;
            match word.compare_exchange_weak(old, new, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => break,
                Err(now) => old = now,
            }
        }
        let any = || {
            entry.obj[..LEVELS]
                .iter()
                .any(|w| w.load(Ordering::SeqCst) & 0xffff_ffff != 0)
        };
        self.waiters().mark(self.me.idx, any);
        self.header().stall.update(|| self.anyone_waiting());
    }

    /// The other process holding the best waiter above `tier` that its cap
    /// admits at `running`, if any (`tier` None: any tier).
    fn best_waiting(&self, above: Option<usize>, running: u32) -> Option<u32> {
        let mut best: Option<(usize, u32)> = None;
        for idx in self.waiters().each().filter(|&i| i != self.me.idx) {
            // `proc_entry` refuses an index beyond the process table.
            let Ok(entry) = self.map.proc_entry(idx) else {
                continue;
            };
            let from = above.map_or(0, |t| t + 1);
            for t in (from..LEVELS).rev() {
                let x = entry.obj[t].load(Ordering::SeqCst);
                let (count, cap) = (x & 0xffff_ffff, (x >> 32) as u32);
                if count > 0 && running < cap {
                    if best.is_none_or(|(bt, _)| t > bt) {
                        best = Some((t, idx));
                    }
                    break;
                }
            }
        }
        best.map(|(_, idx)| idx)
    }

    /// Another process whose waiter should get a slot before this process's
    /// waiter at `tier`.
    pub fn defer_to(&self, tier: usize, running: u32) -> Option<u32> {
        if !self.anyone_waiting() {
            return None;
        }
        self.best_waiting(Some(tier), running)
    }

    /// After a release: wake the process with the best admissible waiter
    /// (this process too, for its other schedulers' waiters).
    #[inline]
    pub fn wake_after_release(&self) {
        if !self.anyone_waiting() {
            return;
        }
        let running = self.running();
        match self.best_waiting(None, running) {
            Some(idx) => self.wake_process(idx),
            None => {
                if self.mine_waiting(running) {
                    self.notify_mine();
                }
            }
        }
    }

    /// True if this process has an admissible waiter (another scheduler
    /// handle of this process may be the one that can use a freed slot).
    fn mine_waiting(&self, running: u32) -> bool {
        let Ok(entry) = self.map.proc_entry(self.me.idx) else {
            return false;
        };
        entry.obj[..LEVELS].iter().any(|w| {
            let x = w.load(Ordering::SeqCst);
            x & 0xffff_ffff != 0 && running < (x >> 32) as u32
        })
    }

    /// Wakes every waiter of process `idx` (they re-run dispatch); no
    /// syscall when nobody sleeps there.
    pub fn wake_process(&self, idx: u32) {
        self.map.wake_process(idx);
    }

    /// Sleeps on this process's futex word until woken or `nap` passes,
    /// unless the word moved past `seq` already.
    pub fn sleep(&self, seq: u32, nap: Duration) {
        self.map.sleep_on(self.me.idx, seq, nap);
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
        if h.last_reap_ms
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
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
            for idx in self.waiters().each() {
                self.wake_process(idx);
            }
            self.notify_mine();
        }
        Ok((procs, slots))
    }

    /// Frees every cell owned by `owner` (a dead process) and clears its
    /// waiting state. Returns the number of cells freed.
    fn release_dead(&self, idx: u32, owner: u32) -> u64 {
        let mut n = 0;
        for cell in self.owners() {
            if cell
                .compare_exchange(owner, 0, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                n += 1;
            }
        }
        self.waiters().clear(idx);
        if let Ok(entry) = self.map.proc_entry(idx) {
            for w in &entry.obj[..LEVELS] {
                w.store(0, Ordering::SeqCst);
            }
        }
        self.header().stall.update(|| self.anyone_waiting());
        n
    }

    /// Cells held by `owner` now (for tests and the CLI).
    pub fn held_by(&self, owner: u32) -> u32 {
        self.owners()
            .iter()
            .filter(|c| c.load(Ordering::Relaxed) == owner)
            .count() as u32
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
            stall_ns: h.stall.total_ns(),
        }
    }
}
