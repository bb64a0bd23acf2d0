//! The Scheduler's home in a region: a slot table whose cells record their
//! owner, written by the same CAS that takes the capacity, and an exact,
//! cheap running count beside it.
//!
//! **Layout** (object area of a `Scheduler` region, revision 4, all fixed
//! offsets): `[wait registry: 1,408 bytes][SchedHeader: 128][cells: max ×
//! u32]` (see [`registry`](crate::region::registry) for the first part).
//!
//! **Taking a slot** is one instruction: `CAS(cell, 0 → my owner id)` on a
//! free cell. The hard cap is the number of cells (no counter can be raced
//! past it) and ownership is recorded by the very instruction that takes
//! the capacity. **Giving it back** is `CAS(cell, my id → 0)`. A process
//! killed between any two instructions leaves each cell either free or
//! holding its id, so the reaper frees exactly the cells whose owner is the
//! dead process: no slot is leaked or freed twice.
//!
//! **Running.** Each process counts the cells it holds in a word of its own
//! process entry (`held`, written only by its own threads): `+n` *before*
//! it takes cells, `−n` *after* it gives them back. The region's running
//! count is the sum over the member processes, O(processes) and never
//! O(max). A process killed between the count and the cell leaves the sum
//! one too high (never too low) until it is reaped, when its entry and its
//! count go away together: right or repairable at reap, as the design asks.
//! Capped admissions take a small cap lock around "sum, compare, take", so
//! two of them never both see the same count; it is taken in bounded
//! slices, and a holder that makes no progress (dead, or stopped) is taken
//! over without losing that property (see [`SharedSlots::take_capped`]).
//!
//! **Counting only when asked.** Keeping `held` costs two locked
//! instructions per acquire and release. A region whose users set no
//! per-priority cap below the max never needs the sum, so counting starts
//! only when some policy first needs it (a capped admission, a capped
//! waiter to rank, a full table to detect): that caller sets the gate's
//! [`GATE_COUNTING`] bit, for good. A cell taken while counting carries
//! [`COUNTED`] (bit 31; owner ids are 31 bits) and its `+1` in `held`; one
//! taken before carries neither and is given back without touching `held`.
//! A taker that did not count re-reads the gate after its CAS and, if
//! counting started meanwhile, counts its cells then; the starter sets the
//! bit before it scans the cells. One of the two sees the other, so after
//! the first scan that finds no uncounted cell (recorded in the header) the
//! sum is exact; until then the uncounted cells are added from a scan.
//!
//! **Finding a free cell** starts at a per-process hint (the cell it last
//! gave back) and looks at a few cells; if they are taken it asks the
//! running count whether any cell is free before scanning further, so a
//! full table costs O(processes) per attempt, not O(max).

use crate::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::stats::SharedStats;
use super::waiter::{Slots, SlotsView};
use crate::error::{Error, Result};
use crate::region::registry::{bound_now_ns, Registry, GATE_COUNTING, OBJ_FREE, REGISTRY_SIZE};
use crate::region::{Mapping, ObjectKind, ObjectSpec, Region};

/// The largest global max a shared scheduler supports (one owner cell per slot).
pub const MAX_SHARED_SLOTS: u32 = 65_536;

/// Revision of this object's layout, stored in the header params.
pub(crate) const OBJECT_REV: u64 = 4;

/// A cap lock held this long by a holder whose acquisition did not change
/// (no progress) is taken over, even from a live holder (see
/// [`SharedSlots::take_capped`]). The critical section is a few hundred
/// nanoseconds when its holder runs; 2 ms is longer than a run queue's
/// usual wait and short against anything a caller notices, and being
/// robbed costs a holder only a retry.
const LOCK_TAKEOVER_NS: u64 = 2_000_000;

/// Process-entry word holding the cells this process holds (`held`).
const HELD: usize = OBJ_FREE;

/// Cells looked at from the hint before consulting the running count.
const NEAR_SCAN: usize = 8;

/// Cell bit (and bit of a cell number held by a permit): this cell is
/// counted in its owner's `held`.
pub(crate) const COUNTED: u32 = 1 << 31;

/// A cell taken out of service by the ceiling (not an owner id: its entry
/// index, 0xfffe, is beyond any process table).
pub(crate) const BLOCKED: u32 = 0x7fff_ffff;

/// The scheduler's own header, after the registry.
#[repr(C, align(128))]
pub(crate) struct SchedHeader {
    /// Global max; written once at initialisation.
    pub(crate) max: AtomicU32,
    /// Unused (revision 3's cap lock).
    _was_cap_lock: AtomicU32,
    /// Counter: cells freed on behalf of dead processes.
    pub(crate) reclaimed: AtomicU64,
    /// 1 once a scan after counting started found no uncounted cell.
    all_counted: AtomicU32,
    /// The ceiling + 1 (0: none, the ceiling is the max): see
    /// [`SharedSlots::set_ceiling`].
    ceiling: AtomicU32,
    /// Cells blocked by the ceiling, as last counted (a hint: every change
    /// of the ceiling recounts).
    blocked: AtomicU32,
    _pad0: AtomicU32,
    /// The cap lock: `generation << 32 | holder`, the holder the owner id of
    /// the process admitting a capped task (0: free); the generation
    /// changes with every acquisition (see [`SharedSlots::take_capped`]).
    cap_lock: AtomicU64,
    _pad: [u64; 11],
}

#[cfg(not(shuttle))]
const _: () = assert!(std::mem::size_of::<SchedHeader>() == 128);

impl SchedHeader {
    /// The effective ceiling of a region of `max` cells.
    pub(crate) fn ceiling(&self, max: u32) -> u32 {
        match self.ceiling.load(Ordering::Acquire) {
            0 => max,
            c => (c - 1).min(max),
        }
    }
}

pub(crate) const HEADER_OFF: usize = REGISTRY_SIZE;
pub(crate) const CELLS_OFF: usize = HEADER_OFF + std::mem::size_of::<SchedHeader>();

fn object_size(max: u32) -> usize {
    let cells = max as usize * std::mem::size_of::<AtomicU32>();
    CELLS_OFF + cells.div_ceil(128).max(1) * 128
}

fn spec_params(max: u32) -> [u64; 8] {
    [u64::from(max), OBJECT_REV, 0, 0, 0, 0, 0, 0]
}

/// The retain check of a scheduler mapping: does `me` hold a cell?
fn holds_cells(map: &Mapping, me: crate::region::ProcId) -> bool {
    let Some(max) = u32::try_from(map.header().params[0])
        .ok()
        .filter(|&m| m <= MAX_SHARED_SLOTS)
    else {
        return false;
    };
    if map.object_len() < object_size(max) {
        return false;
    }
    // SAFETY: `max` u32s at CELLS_OFF lie inside the object area (its length
    // was just checked against the layout), 4-aligned; atomics are valid for
    // any bits; the reference does not outlive `map`.
    let cells = unsafe {
        std::slice::from_raw_parts(
            map.object_ptr().add(CELLS_OFF) as *const AtomicU32,
            max as usize,
        )
    };
    cells
        .iter()
        .any(|c| c.load(Ordering::SeqCst) & !COUNTED == me.owner)
}

/// A bound shared slot table, as seen by one registered process.
#[derive(Debug)]
pub(crate) struct SharedSlots {
    reg: Registry,
    max: u32,
    base: *mut u8,
    /// Where this process starts looking for a free cell.
    hint: AtomicU32,
}

// SAFETY: `base` points into the mapping owned by the registry's `Arc`,
// which lives as long as `self`; every access through it is to atomics, so
// sharing across threads is sound.
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
                let init = move |b: &mut [u8]| {
                    // The area arrives zeroed: all cells free, no waiters.
                    // The max is stored through its atomic (under the model
                    // checker an atomic is more than its value's bytes).
                    assert!(b.len() >= HEADER_OFF + std::mem::size_of::<SchedHeader>());
                    // SAFETY: the header lies inside the area (asserted), at a
                    // multiple of 128 from its 128-aligned start; it is atomics
                    // and padding, valid for the area's zeroed bytes; the
                    // area is exclusively ours while it is initialised.
                    let h = unsafe { &*(b.as_ptr().add(HEADER_OFF) as *const SchedHeader) };
                    h.max.store(m, Ordering::Relaxed);
                };
                let spec = ObjectSpec {
                    kind: ObjectKind::Scheduler,
                    params: spec_params(m),
                    object_size: object_size(m),
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
        if map.object_len() < object_size(max) {
            return Err(Error::BadRegion(format!(
                "scheduler object area is {} bytes, max {max} needs {}",
                map.object_len(),
                object_size(max)
            )));
        }
        let base = map.object_ptr();
        let mut s = SharedSlots {
            reg: Registry::view(map)?,
            max,
            base,
            hint: AtomicU32::new(0),
        };
        let hmax = s.header().max.load(Ordering::Relaxed);
        if hmax != max {
            return Err(Error::BadRegion(format!(
                "scheduler header says max {hmax}; the region header says max {max}"
            )));
        }
        // Dead processes may still hold every entry: return what they held,
        // free their entries, and try again.
        let me = {
            let view = &s;
            let mut release = |idx: u32, owner: u32| {
                view.release_dead(idx, owner);
            };
            s.reg.mapping().me_reaping(&mut release)?
        };
        s.reg.join(me);
        // Slots belong to the process, not to a handle: if the last handle
        // goes while this process still holds cells (a forgotten permit),
        // its registration stays until the process exits.
        s.reg.mapping().set_retain_check(holds_cells);
        if max > 0 {
            s.hint
                .store(me.idx.wrapping_mul(7) % max, Ordering::Relaxed);
        }
        Ok(s)
    }

    fn header(&self) -> &SchedHeader {
        // SAFETY: the object area holds at least `object_size(max)` bytes
        // (checked in `from_mapping`), it is 128-aligned (the registry
        // checked it) so HEADER_OFF is too, and SchedHeader is only atomics
        // and padding, valid for any bits; the mapping outlives `self`.
        unsafe { &*(self.base.add(HEADER_OFF) as *const SchedHeader) }
    }

    #[inline]
    fn cells(&self) -> &[AtomicU32] {
        // SAFETY: `max` u32s at CELLS_OFF lie inside the checked object area,
        // 4-aligned; atomics are valid for any bits.
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(CELLS_OFF) as *const AtomicU32,
                self.max as usize,
            )
        }
    }

    /// The wait registry of this region.
    #[inline]
    pub fn reg(&self) -> &Registry {
        &self.reg
    }

    /// The region's global max.
    pub fn max(&self) -> u32 {
        self.max
    }

    /// This process's owner id in the region.
    pub fn owner(&self) -> u32 {
        self.reg.me().owner
    }

    /// The mapping this table lives in.
    pub fn mapping(&self) -> &Arc<Mapping> {
        self.reg.mapping()
    }

    #[inline]
    fn held(&self) -> &AtomicU64 {
        self.reg.my_word(HELD)
    }

    /// True once the region keeps an exact running count.
    #[inline]
    pub fn counting(&self) -> bool {
        self.reg.gate() & GATE_COUNTING != 0
    }

    /// Takes `n` cells (all or none) for this process. The slots carry
    /// [`COUNTED`] on each cell number if they are counted in `held`.
    #[inline]
    pub fn take(&self, n: u32) -> Option<Slots> {
        let counting = self.counting();
        let tag = if counting { COUNTED } else { 0 };
        let owner = self.owner() | tag;
        if counting {
            self.held().fetch_add(u64::from(n), Ordering::SeqCst);
        }
        #[cfg(shuttle)]
        self.mapping()
            .model_death_point("take: counted, no cell yet");
        let got = if n == 1 {
            self.take_cell(owner).map(|c| Slots::one(c | tag))
        } else {
            self.take_cells(owner, n).and_then(|mut cs| {
                cs.iter_mut().for_each(|c| *c |= tag);
                let back = cs.clone();
                Slots::many(cs).or_else(|| {
                    for c in back {
                        self.free_cell(c & !COUNTED, owner & !COUNTED, tag);
                    }
                    None
                })
            })
        };
        match got {
            None => {
                if counting {
                    self.held().fetch_sub(u64::from(n), Ordering::SeqCst);
                }
                None
            }
            // Counting started between the gate read and the CAS: count now
            // (see the module docs).
            Some(s) if !counting && self.counting() => Some(self.count_now(s)),
            Some(s) => Some(s),
        }
    }

    #[cold]
    fn count_now(&self, mut s: Slots) -> Slots {
        let owner = self.owner();
        self.held().fetch_add(u64::from(s.len()), Ordering::SeqCst);
        #[cfg(shuttle)]
        self.mapping()
            .model_death_point("count_now: counted, cell not marked");
        let mark = |c: u32| {
            if let Some(cell) = self.cells().get(c as usize) {
                let _ = cell.compare_exchange(
                    owner,
                    owner | COUNTED,
                    Ordering::SeqCst,
                    Ordering::Relaxed,
                );
            }
            c | COUNTED
        };
        if let SlotsView::One(c) = s.view() {
            s.set_one(mark(c));
        } else if let Some(cs) = s.many_mut() {
            cs.iter_mut().for_each(|c| *c = mark(*c));
        }
        s
    }

    #[cold]
    fn take_cells(&self, owner: u32, n: u32) -> Option<Vec<u32>> {
        // `owner` may carry COUNTED; cell numbers come back untagged.
        let mut got = Vec::with_capacity(n as usize);
        for i in 0..n {
            // A long take is progress: its designation (if it takes for one)
            // is not passed over while it runs (see `root.rs`).
            if i % 1024 == 1023 {
                self.reg.refresh_offer_if_taking();
            }
            match self.take_cell(owner) {
                Some(c) => got.push(c),
                None => {
                    for c in got {
                        self.free_cell(c, owner & !COUNTED, owner & COUNTED);
                    }
                    return None;
                }
            }
        }
        Some(got)
    }

    /// Takes `need` cells iff the running count plus `need` stays within
    /// `cap` (a per-priority cap below the max). Capped admissions take the
    /// region's cap lock, so two of them never both see the same count;
    /// uncapped takes do not need it (a capped admission that saw room is
    /// ordered before them).
    ///
    /// **Bounded.** A contender spins in slices; between slices it looks at
    /// the lock word. A holder that died is found dead and the lock taken
    /// over at once; a holder whose acquisition (the word, generation
    /// included) has not moved for [`LOCK_TAKEOVER_NS`] makes no progress
    /// (stopped, frozen, starved) and the lock is taken over from it too.
    /// That is safe because a holder checks, after its take, that the lock
    /// is still its own acquisition: if it was taken over, its decision may
    /// rest on a count the new holder did not see, so it gives the cells
    /// back and tries again. (Its take comes before its check; the takeover
    /// comes before the new holder's count. Either the check sees the
    /// takeover, or the new holder's count sees the take.) The critical
    /// section changes nothing that needs repair: `held` and the cells are
    /// exact on their own.
    pub fn take_capped(&self, need: u32, cap: u32) -> Option<Slots> {
        loop {
            let mine = self.lock_cap();
            #[cfg(shuttle)]
            self.mapping().model_death_point("cap lock held");
            let r = if self.running() + u64::from(need) <= u64::from(cap) {
                self.take(need)
            } else {
                None
            };
            // The check and the release are one CAS: it succeeds only if the
            // lock is still this acquisition (and never clobbers a takeover).
            if self
                .header()
                .cap_lock
                .compare_exchange(
                    mine,
                    mine & !u64::from(u32::MAX),
                    Ordering::SeqCst,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                return r;
            }
            // Taken over while this thread did not run: undo and retry.
            if let Some(s) = r {
                self.give(&s);
            }
        }
    }

    /// Acquires the cap lock (see [`take_capped`](Self::take_capped));
    /// returns the lock word this acquisition wrote.
    fn lock_cap(&self) -> u64 {
        let lock = &self.header().cap_lock;
        let me = u64::from(self.owner());
        let next = |w: u64| ((w >> 32).wrapping_add(1) << 32) | me;
        // The word a slice started with, and when it was first seen.
        let mut seen: Option<(u64, u64)> = None;
        let mut spins = 0u32;
        loop {
            let cur = lock.load(Ordering::SeqCst);
            let holder = cur as u32;
            if holder == 0 {
                if lock
                    .compare_exchange(cur, next(cur), Ordering::SeqCst, Ordering::Relaxed)
                    .is_ok()
                {
                    return next(cur);
                }
                continue;
            }
            spins += 1;
            if spins % 64 != 0 {
                crate::sync::spin();
                continue;
            }
            // End of a slice: does the holder get anywhere?
            let now = bound_now_ns();
            let stuck = match seen {
                Some((w, since)) if w == cur => {
                    now.saturating_sub(since) >= LOCK_TAKEOVER_NS
                        || (u64::from(holder) != me && !self.reg.owner_alive(holder))
                }
                _ => {
                    seen = Some((cur, now));
                    u64::from(holder) != me && !self.reg.owner_alive(holder)
                }
            };
            if stuck
                && lock
                    .compare_exchange(cur, next(cur), Ordering::SeqCst, Ordering::Relaxed)
                    .is_ok()
            {
                return next(cur);
            }
            crate::sync::yield_now();
        }
    }

    #[inline]
    fn take_cell(&self, owner: u32) -> Option<u32> {
        let cells = self.cells();
        let n = cells.len();
        let start = self.hint.load(Ordering::Relaxed) as usize;
        let start = if start < n { start } else { 0 };
        // The hint first: the cell this process gave back last.
        match cells.get(start) {
            Some(c)
                if c.load(Ordering::Relaxed) == 0
                    && c.compare_exchange(0, owner, Ordering::SeqCst, Ordering::Relaxed)
                        .is_ok() =>
            {
                Some(start as u32)
            }
            Some(_) => self.scan_for_cell(owner, start),
            None => None,
        }
    }

    #[inline(never)]
    fn scan_for_cell(&self, owner: u32, start: usize) -> Option<u32> {
        let cells = self.cells();
        let n = cells.len();
        let mut c = start;
        for k in 1..n {
            c += 1;
            if c == n {
                c = 0;
            }
            if k == NEAR_SCAN
                && self.running() + u64::from(self.header().blocked.load(Ordering::Relaxed))
                    >= u64::from(self.max)
            {
                return None; // full (or about to be): no O(max) scan
            }
            if cells[c].load(Ordering::Relaxed) == 0
                && cells[c]
                    .compare_exchange(0, owner, Ordering::SeqCst, Ordering::Relaxed)
                    .is_ok()
            {
                self.hint.store(c as u32, Ordering::Relaxed);
                return Some(c as u32);
            }
        }
        None
    }

    #[inline]
    fn free_cell(&self, cell: u32, owner: u32, tag: u32) {
        // A cell that is not ours (the region was scribbled on) is left alone.
        if let Some(c) = self.cells().get(cell as usize) {
            let _ = c.compare_exchange(owner | tag, 0, Ordering::SeqCst, Ordering::Relaxed);
        }
    }

    /// Gives back slots this process holds. The cell CAS is a SeqCst RMW:
    /// it orders the release before the caller's read of the gate.
    #[inline]
    pub fn give(&self, slots: &Slots) {
        let owner = self.owner();
        match slots.view() {
            SlotsView::One(c) => {
                let cell = c & !COUNTED;
                self.free_cell(cell, owner, c & COUNTED);
                #[cfg(shuttle)]
                self.mapping()
                    .model_death_point("give: cell freed, count not yet");
                self.hint.store(cell, Ordering::Relaxed);
                if c & COUNTED != 0 {
                    self.held().fetch_sub(1, Ordering::SeqCst);
                }
            }
            SlotsView::Many(cs) => {
                let mut counted = 0;
                for &c in cs.iter() {
                    self.free_cell(c & !COUNTED, owner, c & COUNTED);
                    counted += u64::from(c >> 31);
                }
                if counted > 0 {
                    self.held().fetch_sub(counted, Ordering::SeqCst);
                }
            }
            SlotsView::Counted(_) => {}
        }
    }

    /// Slots held across all processes: the sum of the members' `held`
    /// counts (O(processes); at worst one too high per process caught
    /// between its count and its cell). Starts counting if the region did
    /// not count yet; until every cell taken before that is given back, the
    /// uncounted ones are added from a scan (see the module docs).
    pub fn running(&self) -> u64 {
        if !self.counting() {
            self.reg.set_counting();
        }
        let counted = self.reg.sum_members(HELD);
        let h = self.header();
        if h.all_counted.load(Ordering::Acquire) != 0 {
            return counted;
        }
        let uncounted = self
            .cells()
            .iter()
            .filter(|c| {
                let v = c.load(Ordering::SeqCst);
                v != 0 && v & COUNTED == 0 && v != BLOCKED
            })
            .count() as u64;
        if uncounted == 0 {
            h.all_counted.store(1, Ordering::Release);
        }
        counted + uncounted
    }

    /// True if every cell is taken: from the running count once the region
    /// counts, else from a scan (so asking does not start counting).
    pub fn full(&self) -> bool {
        if self.counting() {
            self.running() >= u64::from(self.ceiling())
        } else {
            self.occupied() >= self.ceiling()
        }
    }

    /// Cells free under the ceiling now, counted as [`full`](Self::full)
    /// counts (asking does not start counting).
    pub fn free(&self) -> u64 {
        let taken = if self.counting() {
            self.running()
        } else {
            u64::from(self.occupied())
        };
        u64::from(self.ceiling()).saturating_sub(taken)
    }

    /// The effective ceiling: at most this many slots are held at once
    /// (≤ max; the max unless [`set_ceiling`](Self::set_ceiling) lowered it).
    pub fn ceiling(&self) -> u32 {
        self.header().ceiling(self.max)
    }

    /// Moves the effective ceiling to `target` (≤ max), for every process.
    ///
    /// The cells above the ceiling are taken out of service by marking free
    /// cells [`BLOCKED`] (one CAS each); the fast path needs no new check.
    /// Going down, cells still held are not revoked: their holders keep them,
    /// and each release while the region is short gives its cell to the
    /// ceiling instead of back to the pool ([`GATE_SHRINKING`]) until the
    /// target is reached. Going up unblocks cells. Returns whether the
    /// target is reached now.
    pub fn set_ceiling(&self, target: u32) -> Result<bool> {
        if target > self.max {
            return Err(Error::InvalidArgument(format!(
                "ceiling {target} is above the region's max {}",
                self.max
            )));
        }
        self.header().ceiling.store(target + 1, Ordering::SeqCst);
        Ok(self.rebalance())
    }

    /// Blocks or unblocks cells until `max − ceiling` are blocked (as far as
    /// free cells allow); keeps [`GATE_SHRINKING`] set while short. O(max):
    /// runs only when the ceiling moves and on releases while shrinking.
    pub fn rebalance(&self) -> bool {
        let want = self.max - self.ceiling();
        let cells = self.cells();
        let mut have = cells
            .iter()
            .filter(|c| c.load(Ordering::SeqCst) == BLOCKED)
            .count() as u32;
        for c in cells {
            if have == want {
                break;
            }
            if have < want {
                if c.compare_exchange(0, BLOCKED, Ordering::SeqCst, Ordering::Relaxed)
                    .is_ok()
                {
                    have += 1;
                }
            } else if c
                .compare_exchange(BLOCKED, 0, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                have -= 1;
            }
        }
        self.header().blocked.store(have, Ordering::Relaxed);
        // Re-read the target: another process may have moved it meanwhile.
        let done = have == self.max - self.ceiling();
        self.reg.set_shrinking(have < self.max - self.ceiling());
        if !done && have > self.max - self.ceiling() {
            return self.rebalance();
        }
        done
    }

    /// Occupied cells, counted one by one (O(max): stats and tools only).
    /// Cells blocked by the ceiling do not count.
    pub fn occupied(&self) -> u32 {
        self.cells()
            .iter()
            .filter(|c| {
                let v = c.load(Ordering::Relaxed);
                v != 0 && v != BLOCKED
            })
            .count() as u32
    }

    /// Cells held by `owner` now (for tests and the CLI; O(max)).
    pub fn held_by(&self, owner: u32) -> u32 {
        self.cells()
            .iter()
            .filter(|c| c.load(Ordering::Relaxed) & !COUNTED == owner)
            .count() as u32
    }

    /// Returns every slot of every dead process now. Returns (processes
    /// reaped, slots reclaimed).
    pub fn reap(&self) -> Result<(u32, u64)> {
        let mut slots = 0u64;
        let procs = self.reg.reap(&mut |idx, owner| {
            slots += self.release_dead(idx, owner);
        })?;
        if slots > 0 {
            self.header().reclaimed.fetch_add(slots, Ordering::Relaxed);
        }
        Ok((procs, slots))
    }

    /// Reaps if a scan is due (rate-limited region-wide).
    pub fn maybe_reap(&self) -> u64 {
        let mut slots = 0u64;
        let _ = self.reg.maybe_reap(&mut |idx, owner| {
            slots += self.release_dead(idx, owner);
        });
        if slots > 0 {
            self.header().reclaimed.fetch_add(slots, Ordering::Relaxed);
        }
        slots
    }

    /// Frees every cell owned by `owner` (a dead process). Idempotent per
    /// owner id (a CAS from that id to 0). Returns the number freed.
    fn release_dead(&self, _idx: u32, owner: u32) -> u64 {
        let mut n = 0;
        for cell in self.cells() {
            let v = cell.load(Ordering::SeqCst);
            if v != 0
                && v & !COUNTED == owner
                && cell
                    .compare_exchange(v, 0, Ordering::SeqCst, Ordering::Relaxed)
                    .is_ok()
            {
                n += 1;
            }
        }
        n
    }

    /// Region-wide figures.
    pub fn stats(&self) -> SharedStats {
        let mut processes = 0;
        if let Ok(procs) = self.mapping().live_processes() {
            processes = procs.iter().filter(|p| p.alive).count() as u32;
        }
        let w = self.reg.waiter_counts();
        SharedStats {
            running: self.occupied(),
            max: self.max,
            ceiling: self.ceiling(),
            waiters: w.map(|c| c.min(u64::from(u32::MAX)) as u32),
            processes,
            reclaimed: self.header().reclaimed.load(Ordering::Relaxed),
            reaped_processes: self.reg.reaped(),
            stall_ns: self.reg.stall_ns(),
            wakes: self.reg.wakes(),
            fair_handoffs: self.reg.strict_handoffs(),
            passed_over: self.reg.passes(),
        }
    }
}

/// What the model checker's tests look at (`--cfg shuttle`,
/// `tests/model.rs`): the region's raw state, read without side effects
/// (unlike [`SharedSlots::running`], reading it never starts counting).
#[cfg(shuttle)]
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelState {
    /// The gate word.
    pub gate: u64,
    /// The designee: (process entry, tier, ticket, lottery, notified,
    /// taking).
    pub designee: Option<(u32, usize, u32, bool, bool, bool)>,
    /// Per member process: (entry, owner id, its `held` word, cells it
    /// owns, of which counted).
    pub members: Vec<(u32, u32, u64, u32, u32)>,
    /// Occupied cells (blocked ones excluded).
    pub occupied: u32,
    /// Cells owned by no member (a dead process's, not yet reaped).
    pub orphaned: u32,
    /// The owner id holding the cap lock (0: free).
    pub cap_lock: u32,
}

#[cfg(shuttle)]
impl SharedSlots {
    /// The region's raw state (see [`ModelState`]).
    pub(crate) fn model_state(&self) -> ModelState {
        let reg = &self.reg;
        let designee = reg
            .designee()
            .map(|d| (d.idx, d.tier, d.ticket, d.lottery, d.notified, d.taking));
        let cells: Vec<u32> = self
            .cells()
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .collect();
        let mut owned_by_members = 0;
        let members = reg
            .members()
            .filter_map(|idx| {
                let e = self.mapping().proc_entry(idx).ok()?;
                let owner = crate::region::ProcId::encode(idx, e.generation());
                let held = e.obj[HELD].load(Ordering::SeqCst);
                let mine = cells.iter().filter(|&&v| v & !COUNTED == owner);
                let owned = mine.clone().count() as u32;
                let counted = mine.filter(|&&v| v & COUNTED != 0).count() as u32;
                owned_by_members += owned;
                Some((idx, owner, held, owned, counted))
            })
            .collect();
        let occupied = cells.iter().filter(|&&v| v != 0 && v != BLOCKED).count() as u32;
        ModelState {
            gate: reg.gate(),
            designee,
            members,
            occupied,
            orphaned: occupied - owned_by_members.min(occupied),
            cap_lock: self.header().cap_lock.load(Ordering::SeqCst) as u32,
        }
    }
}
