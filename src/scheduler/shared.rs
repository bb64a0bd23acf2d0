//! The Scheduler's home in a region: a slot table whose cells record their
//! owner, written by the same CAS that takes the capacity, and an exact,
//! cheap running count beside it.
//!
//! **Layout** (object area of a `Scheduler` region, revision 8, all fixed
//! offsets): `[wait registry: 1,408 bytes][SchedHeader: 128][cells: max ×
//! u64]` (see [`registry`](crate::region::registry) for the first part).
//! A cell's low 32 bits are its *value*: `0` (free), [`FREE_COUNTED`]
//! (free, see *Counting*), an owner id (taken), an owner id with
//! [`COUNTED`] (taken and counted), or [`BLOCKED`] (out of service under
//! the ceiling). Its high 32 bits are the holder's *tag* (see *Raw
//! permits*): 0 for every permit but a raw one, and always 0 in a free
//! cell, so a free cell is the canonical `0` or `FREE_COUNTED` in all 64
//! bits. Everything that asks whose a cell is compares the low 32 bits,
//! and every CAS starts from the whole 64-bit value it read.
//!
//! **Raw permits.** A held cell is written only by its holder: the take
//! that claimed it (and its own late [`COUNTED`] mark, `count_now`), its
//! give-back, or its move to the ceiling. The reaper touches only a dead
//! owner's cells, the ceiling only free and out-of-service ones, and the
//! counting scans only free ones. So the holder of a one-cell permit can
//! turn it into a *raw* permit by a plain store of `tag << 32 | value` into
//! its cell ([`SharedSlots::tag_cell`], no read-modify-write), and the
//! raw permit's give-back is the CAS `tag << 32 | value → free`
//! ([`SharedSlots::give_raw`]): it succeeds once, and a second release of
//! the same raw permit (or one with a wrong tag or cell) finds another
//! value and changes nothing. The C face uses that as its check against a
//! double or foreign release; a stale raw permit can only match a later raw
//! permit of this process on the same cell with the very same tag.
//!
//! **Taking a slot** is one instruction: `CAS(cell, free → my owner id)`.
//! The hard cap is the number of cells (no counter can be raced past it)
//! and ownership is recorded by the very instruction that takes the
//! capacity. **Giving it back** is `CAS(cell, my id → free)`. A process
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
//! The sum is read one process after the other, not at one instant: a
//! cell held throughout the read is always in it, while a take and a
//! give-back in other processes during the read may each be seen or not
//! (so a capped admission racing with both can be let in one task early;
//! the hard max, the cells, is exact regardless).
//! Capped admissions take a small cap lock around "sum, compare, take", so
//! two of them never both see the same count; it is taken in bounded
//! slices, and a holder that makes no progress (dead, or stopped) is taken
//! over without losing that property (see [`SharedSlots::take_capped`]).
//!
//! **A take never counts itself as taken.** A take adds its `n` to `held`
//! before it looks for cells, so the running count it reads while it looks
//! includes that provisional `n`; it subtracts what it has not taken yet
//! before it compares the count against the table. Other takers' provisional
//! shares can still make a count look full for a moment: a take that gave
//! up on such a count, once it has given its own share back, looks at the
//! count again and, if it now shows room, scans the whole table once. So of
//! two takers racing for the last free cell one gets it, and a lone taker
//! with `n` cells free always finds them.
//!
//! **A stopped process cannot hide a free cell.** A process caught between
//! its count and its cell (a take's provisional `n`, or a cell taken before
//! counting started and counted late) keeps the count one too high for as
//! long as it does not run: for ever if it is stopped. A take that the
//! count alone refused therefore scans the whole table anyway, at most once
//! per [`EXHAUSTIVE_SCAN_INTERVAL_NS`] per process, so a waiter (which
//! tries again on every wake and timeout round) and a poller find the cell
//! within that interval, and a full table still costs O(processes) per
//! attempt, plus one O(max) scan per interval (found by the model checker:
//! `stop_anywhere_uncapped`, a process stopped in the middle of counting a
//! cell it had taken before counting started).
//!
//! **Counting only when asked.** Keeping `held` costs two locked
//! instructions per acquire and release. A region whose users set no
//! per-priority cap below the max never needs the sum, so counting starts
//! only when some policy first needs it (a capped admission, a capped
//! waiter to rank, a full table to detect, a ceiling): that caller sets the
//! gate's [`GATE_COUNTING`] bit, for good. A cell taken while counting
//! carries [`COUNTED`] and its `+1` in `held`; one taken before carries
//! neither and is given back without touching `held`. Until a scan finds
//! none of those uncounted cells left, the running count adds them from a
//! scan (recorded in the header once the scan comes back clean).
//!
//! The difficulty is a taker that read "not counting" just before counting
//! started: its CAS may come after the scan passed that cell, and its late
//! `+1` (it re-reads the gate after its CAS and counts then) after a capped
//! admission read the sum, which then missed a cell that was held
//! throughout: the capped admission could exceed its cap by one (shown by
//! the model checker on the old code, `counting_starts_under_a_late_take`).
//! So a free cell is written in two ways: `0` before counting and
//! [`FREE_COUNTED`] after. A taker that did not count takes only `0`
//! cells; a counted one takes either. The scans of the starting period
//! turn every `0` they pass into `FREE_COUNTED`, and everything that frees
//! a cell once counting is on writes `FREE_COUNTED` (a counted cell, a
//! cell coming back from the ceiling, which starts counting itself; only
//! an uncounted cell given back by its taker becomes `0` again, and that
//! cell was seen held by every scan that passed it). A late uncounted
//! taker can therefore take only a cell the current scan has not reached
//! yet (the scan then sees it taken) or a cell whose previous holder the
//! scan counted; after the first clean scan it finds no `0` cell at all,
//! fails, sees the counting bit and takes again, counted. The running
//! count is the scan *followed by* the sum of `held`, so a counted taker
//! that the scan missed is in the sum. One way or the other every cell
//! held throughout a read of the count is in it.
//!
//! **Finding a free cell** starts at a per-process hint (the cell it last
//! gave back) and looks at a few cells; if they are taken it asks the
//! running count whether any cell is free before scanning further, so a
//! full table costs O(processes) per attempt, not O(max).
//!
//! **The ceiling** ([`SharedSlots::set_ceiling`]) takes cells out of
//! service by marking free ones [`BLOCKED`]. The number of blocked cells is
//! kept exactly in the header, changed only under the region's ceiling
//! lock together with the cells it counts, so two processes moving cells
//! in and out of service at once never both act on one count. While the
//! region is above a lowered ceiling, a release gives its cell straight to
//! the ceiling (O(1), no scan) until the ceiling is reached, so exactly
//! `ceiling` cells are in service afterwards, whatever the releases that
//! race.
//!
//! **The ceiling lock behind a stopped holder.** The lock is taken in
//! slices, like the cap lock: a holder that died, or whose lock word and
//! blocked count have not moved for [`LOCK_TAKEOVER_NS`] (stopped, frozen,
//! starved), is taken over. Unlike the cap lock's, this critical section
//! writes shared state, so a holder taken over must not be able to write
//! it when it runs again:
//!
//! - the lock word carries a generation, bumped by every acquisition, and
//!   the two words it guards (the blocked count and the ceiling) carry the
//!   generation of their last writer: a write is a CAS that is refused once
//!   a later generation has written the word ([`fenced`]). A taker stamps
//!   both words first, so from then on nothing of the holder it robbed
//!   lands (what landed before counts as done while it held the lock);
//! - a cell is never moved and counted in one step, so it moves through a
//!   pending value: blocking is `free → PENDING_BLOCK`, count +1,
//!   `PENDING_BLOCK → BLOCKED`; unblocking is `BLOCKED → PENDING_FREE`,
//!   count −1, `PENDING_FREE → free`. A mover whose count CAS is refused
//!   (robbed) puts the cell back with a CAS from the pending value;
//! - the taker recounts after its stamps: every pending cell it finds it
//!   turns into `BLOCKED` and counts, every `BLOCKED` cell it counts, and
//!   it writes the count. A pending cell is thus either taken by the
//!   recount (counted; the robbed mover's undo CAS then fails) or put back
//!   by its mover (not counted: the recount had not reached it, or its
//!   mover's count CAS failed after the stamp). Never both, never neither
//!   once the mover has run.
//!
//! A robbed mover that is stopped again between its pending CAS and its
//! undo leaves one pending cell out of service and uncounted until the next
//! holder's scan meets it (any pending cell a holder did not set itself is
//! a robbed one's: it recounts) or the mover runs. Every operation under
//! the lock that finds itself robbed takes the lock again and starts over
//! (a release that was giving its cells to the ceiling gives the rest back
//! to the pool and rebalances), so the region reaches its ceiling whoever
//! stops where.

use crate::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::hash::BuildHasher;
use std::num::NonZeroU32;
use std::sync::Arc;

use super::stats::SharedStats;
use super::waiter::{Slots, SlotsView};
use crate::error::{Error, Result};
use crate::region::registry::{
    bound_now_ns, Registry, GATE_COUNTING, GATE_SHRINKING, OBJ_FREE, REGISTRY_SIZE,
};
use crate::region::{Mapping, ObjectKind, ObjectSpec, Region};

/// The largest global max a shared scheduler supports (one owner cell per slot).
pub const MAX_SHARED_SLOTS: u32 = 65_536;

/// Revision of this object's layout, stored in the header params (4: free
/// cells of the counting era are [`FREE_COUNTED`], the header's blocked
/// count is exact under its ceiling lock, the cap lock is a 64-bit word
/// with a generation; 5: the registry's cluster line carries the lease's
/// deadline and safe level, and the gate its `GATE_LEASED` bit; 6: the gate
/// carries the region's stall time in one word with its `GATE_CLOSING` bit,
/// and the registry's dispatch line the region's count of waiters served;
/// 7: the ceiling lock is a 64-bit word with a generation, the blocked
/// count and the ceiling are fenced words, cells have two pending states;
/// 8: cells are 64-bit, the high half the holder's raw-permit tag).
pub(crate) const OBJECT_REV: u64 = 8;

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
#[cfg(not(shuttle))]
const NEAR_SCAN: usize = 8;
/// Under the model checker the running count is consulted after the first
/// cell (its tables are small: the early exit must be in play).
#[cfg(shuttle)]
const NEAR_SCAN: usize = 1;

/// Cell bit (and bit of a cell number held by a permit): this cell is
/// counted in its owner's `held`.
pub(crate) const COUNTED: u32 = 1 << 31;

/// A free cell once the region counts (owner 0 with [`COUNTED`]): only a
/// counted take takes it (see the module docs).
pub(crate) const FREE_COUNTED: u32 = COUNTED;

/// A cell taken out of service by the ceiling (not an owner id: its entry
/// index, 0xfffe, is beyond any process table).
pub(crate) const BLOCKED: u32 = 0x7fff_ffff;

/// A cell on its way out of service under the ceiling lock (from free, or
/// from its holder giving it to the ceiling): not in the blocked count
/// until its mover's count moves (see *The ceiling*). Entry index 0xfffd,
/// beyond any process table.
pub(crate) const PENDING_BLOCK: u32 = 0x7fff_fffe;

/// A blocked cell on its way back into service: still in the blocked count
/// until its mover's count moves. Entry index 0xfffc.
pub(crate) const PENDING_FREE: u32 = 0x7fff_fffd;

/// True for a cell value out of service: [`BLOCKED`], or on its way in or
/// out.
#[inline(always)]
pub(crate) fn out_of_service(v: u32) -> bool {
    (PENDING_FREE..=BLOCKED).contains(&v)
}

/// The value half of a cell (its low 32 bits: free, an owner id with or
/// without [`COUNTED`], or out of service); the high half is a raw
/// permit's tag.
#[inline(always)]
pub(crate) fn value(cell: u64) -> u32 {
    cell as u32
}

/// The cell word of a raw permit: `tag` above the holder's value.
#[inline(always)]
fn tagged(v: u32, tag: u32) -> u64 {
    u64::from(tag) << 32 | u64::from(v)
}

/// The scheduler's own header, after the registry.
#[repr(C, align(128))]
pub(crate) struct SchedHeader {
    /// Global max; written once at initialisation.
    pub(crate) max: AtomicU32,
    /// 1 once a scan after counting started found no uncounted cell.
    all_counted: AtomicU32,
    /// Counter: cells freed on behalf of dead processes.
    pub(crate) reclaimed: AtomicU64,
    /// The cap lock: `generation << 32 | holder`, the holder the owner id of
    /// the process admitting a capped task (0: free); the generation
    /// changes with every acquisition (see [`SharedSlots::take_capped`]).
    cap_lock: AtomicU64,
    /// The ceiling lock: `generation << 32 | holder`, the holder the owner
    /// id of the process moving cells in or out of service (0: free); the
    /// generation changes with every acquisition (see *The ceiling* in the
    /// module docs).
    ceiling_lock: AtomicU64,
    /// Cells blocked by the ceiling, exactly: `stamp << 32 | count`, the
    /// stamp the ceiling lock's generation that last wrote it (a fenced
    /// word: see [`fenced`]).
    blocked: AtomicU64,
    /// The ceiling: `stamp << 32 | (ceiling + 1)` (0 + 1: none, the ceiling
    /// is the max), fenced like `blocked`; see [`SharedSlots::set_ceiling`].
    ceiling: AtomicU64,
    _pad: [u64; 10],
}

#[cfg(not(shuttle))]
const _: () = assert!(std::mem::size_of::<SchedHeader>() == 128);

impl SchedHeader {
    /// The effective ceiling of a region of `max` cells.
    pub(crate) fn ceiling(&self, max: u32) -> u32 {
        match self.ceiling.load(Ordering::Acquire) as u32 {
            0 => max,
            c => (c - 1).min(max),
        }
    }

    /// The count of cells blocked by the ceiling.
    #[inline]
    pub(crate) fn blocked(&self) -> u32 {
        self.blocked.load(Ordering::SeqCst) as u32
    }
}

/// The holder of the ceiling lock was taken over (see *The ceiling* in the
/// module docs): what it did under the lock stands as far as its fenced
/// writes got; to go on it takes the lock again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lost;

/// Applies `f` to the value half of a fenced word (`stamp << 32 | value`,
/// written only under the ceiling lock) as the lock's acquisition `gen`,
/// and stamps it with `gen`: refused ([`Lost`]) once an acquisition later
/// than `gen` has written the word, so a holder that was taken over (and
/// runs again later) can never overwrite what its successors wrote.
/// Generations compare by serial-number arithmetic (they wrap at 2^32).
fn fenced(word: &AtomicU64, gen: u32, f: impl Fn(u32) -> u32) -> Result<u32, Lost> {
    let mut cur = word.load(Ordering::SeqCst);
    loop {
        let stamp = (cur >> 32) as u32;
        if stamp != gen && (gen.wrapping_sub(stamp) as i32) <= 0 {
            return Err(Lost);
        }
        let v = f(cur as u32);
        match word.compare_exchange(
            cur,
            (u64::from(gen) << 32) | u64::from(v),
            Ordering::SeqCst,
            Ordering::SeqCst,
        ) {
            Ok(_) => return Ok(v),
            Err(now) => cur = now,
        }
    }
}

pub(crate) const HEADER_OFF: usize = REGISTRY_SIZE;
pub(crate) const CELLS_OFF: usize = HEADER_OFF + std::mem::size_of::<SchedHeader>();

fn object_size(max: u32) -> usize {
    let cells = max as usize * std::mem::size_of::<AtomicU64>();
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
    // SAFETY: `max` u64s at CELLS_OFF lie inside the object area (its length
    // was just checked against the layout), 8-aligned (CELLS_OFF is a
    // multiple of 128 from the 128-aligned area); atomics are valid for any
    // bits; the reference does not outlive `map`.
    let cells = unsafe {
        std::slice::from_raw_parts(
            map.object_ptr().add(CELLS_OFF) as *const AtomicU64,
            max as usize,
        )
    };
    cells
        .iter()
        .any(|c| value(c.load(Ordering::SeqCst)) & !COUNTED == me.owner)
}

/// The ceiling lock, held: acquisition `word` (`generation << 32 |
/// owner`). Released on drop, unless it was taken over meanwhile.
struct CeilingLock<'a> {
    lock: &'a AtomicU64,
    word: u64,
}

impl CeilingLock<'_> {
    /// This acquisition's generation: the stamp of its fenced writes.
    fn gen(&self) -> u32 {
        (self.word >> 32) as u32
    }

    /// Whether the lock is still this acquisition (not taken over).
    fn held(&self) -> bool {
        self.lock.load(Ordering::SeqCst) == self.word
    }
}

impl Drop for CeilingLock<'_> {
    fn drop(&mut self) {
        // Under the model checker a process dies by unwinding: a killed
        // process lets go of nothing.
        #[cfg(shuttle)]
        if crate::sys::futex::model::my_process_dead() {
            return;
        }
        // A CAS, not a store: a takeover's acquisition must stand.
        let _ = self.lock.compare_exchange(
            self.word,
            self.word & !u64::from(u32::MAX),
            Ordering::Release,
            Ordering::Relaxed,
        );
    }
}

/// What a cell move under the ceiling lock did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Move {
    /// Moved and counted: the blocked count after it.
    Done(u32),
    /// The cell was not in the starting state: nothing done.
    Untouched,
    /// The cell left its starting state, but another holder's late undo
    /// moved it on before this move's last step (an ABA on the pending
    /// value): the count was taken back, the cell is where that undo put it.
    Gone,
}

/// A cell move under the ceiling lock that found the lock taken over.
#[derive(Debug, Clone, Copy)]
struct MoveLost {
    /// The cell left its starting value: it was put back where the move
    /// undoes to, or a recount took it out of service (counted either way).
    moved: bool,
}

/// A bound shared slot table, as seen by one registered process.
#[derive(Debug)]
pub(crate) struct SharedSlots {
    reg: Registry,
    max: u32,
    base: *mut u8,
    /// Where this process starts looking for a free cell.
    hint: AtomicU32,
    /// When this process last scanned the whole table against a count that
    /// said full (see the module docs, *A stopped process cannot hide a
    /// free cell*).
    last_exhaustive_ns: AtomicU64,
    /// Per cell, the tag of this process's last raw permit there made by
    /// [`next_tag`](Self::next_tag) (process memory, not the region's).
    tags: Box<[AtomicU32]>,
}

/// How often a process may scan the whole table when the running count
/// says there is no room (the count can be too high for as long as a
/// process caught between its count and its cell is stopped).
#[cfg(not(shuttle))]
pub(crate) const EXHAUSTIVE_SCAN_INTERVAL_NS: u64 = 1_000_000;
/// Under the model checker every refused take looks (model time only moves
/// when a test moves it).
#[cfg(shuttle)]
pub(crate) const EXHAUSTIVE_SCAN_INTERVAL_NS: u64 = 0;

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
            last_exhaustive_ns: AtomicU64::new(0),
            tags: {
                // A random start per binding: a raw permit of an earlier
                // binding (of this process, on this region) matches one of
                // this binding's tags by chance only.
                let start = std::collections::hash_map::RandomState::new().hash_one(base as usize);
                (0..max).map(|_| AtomicU32::new(start as u32)).collect()
            },
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
    fn cells(&self) -> &[AtomicU64] {
        // SAFETY: `max` u64s at CELLS_OFF lie inside the checked object area,
        // 8-aligned (a multiple of 128 from the 128-aligned area); atomics
        // are valid for any bits.
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(CELLS_OFF) as *const AtomicU64,
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
    #[inline(always)]
    pub fn take(&self, n: u32) -> Option<Slots> {
        self.take_looking::<false>(n)
    }

    /// [`take`](Self::take)'s *first look*: one cell at the process's hint,
    /// in code that calls nothing out of line (no scan, no second look, no
    /// weighted take); `None`, with nothing taken, where `take` would look
    /// further. For callers that keep their own frame free of saved
    /// registers (see `Scheduler::acquire_raw_first_look`).
    #[inline(always)]
    pub fn take_first_look(&self, n: u32) -> Option<Slots> {
        self.take_looking::<true>(n)
    }

    /// [`take`](Self::take), or only its first look (`FIRST`).
    #[inline(always)]
    fn take_looking<const FIRST: bool>(&self, n: u32) -> Option<Slots> {
        if FIRST && n != 1 {
            return None;
        }
        let counting = self.counting();
        match self.take_as::<FIRST>(n, counting, true) {
            Some(s) => Some(s),
            None if FIRST => None,
            None => self.take_again(n, counting),
        }
    }

    /// One attempt of [`take`](Self::take), counted or not (`counting`, as
    /// read from the gate), the scan cut short by the running count or not
    /// (`early_exit`); with `FIRST`, one look at the hint's cell and no
    /// call out of line ([`take_first_look`](Self::take_first_look)).
    #[inline(always)]
    fn take_as<const FIRST: bool>(
        &self,
        n: u32,
        counting: bool,
        early_exit: bool,
    ) -> Option<Slots> {
        let tag = if counting { COUNTED } else { 0 };
        let owner = self.owner() | tag;
        if counting {
            self.held().fetch_add(u64::from(n), Ordering::SeqCst);
        }
        #[cfg(shuttle)]
        self.mapping()
            .model_death_point("take: counted, no cell yet");
        if FIRST {
            // One cell (`take_looking` saw to it), as below, but kept as a
            // number until the end: no `Slots` is alive where the first
            // look could panic (so it needs no cleanup), and the late count
            // is inline. (The general path keeps its own shape: written as
            // this one, the Rust fast path saved a register more.)
            let provisional = u64::from(counting);
            return match self.take_cell::<true>(owner, provisional, early_exit) {
                None => {
                    if counting {
                        self.held().fetch_sub(u64::from(n), Ordering::SeqCst);
                    }
                    None
                }
                Some(c) if !counting && self.counting() => Some(Slots::one(self.count_one_now(c))),
                Some(c) => Some(Slots::one(c | tag)),
            };
        }
        let got = if n == 1 {
            let provisional = u64::from(counting);
            self.take_cell::<false>(owner, provisional, early_exit)
                .map(|c| Slots::one(c | tag))
        } else {
            self.take_cells(owner, n, early_exit).and_then(|mut cs| {
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

    /// A take found no room: look again where the first look may have been
    /// wrong (see the module docs). An uncounted take that failed while
    /// counting started (the free cells are [`FREE_COUNTED`] now) takes
    /// again, counted; a counted take whose scan was cut short by a count
    /// that other takers' provisional shares inflated scans the whole table
    /// once if, its own share given back, the count shows room for `n`.
    #[cold]
    #[inline(never)]
    fn take_again(&self, n: u32, counted: bool) -> Option<Slots> {
        if !self.counting() {
            return None; // never counting: the scan was the whole table
        }
        if !counted {
            if let Some(s) = self.take_as::<false>(n, true, true) {
                return Some(s);
            }
        }
        if self.room() < u64::from(n) && !self.exhaustive_scan_due() {
            return None;
        }
        self.take_as::<false>(n, true, false)
    }

    /// Whether a take the running count refused should scan the whole
    /// table anyway (at most once per [`EXHAUSTIVE_SCAN_INTERVAL_NS`] per
    /// process; see the module docs).
    fn exhaustive_scan_due(&self) -> bool {
        if EXHAUSTIVE_SCAN_INTERVAL_NS == 0 {
            return true;
        }
        let now = crate::sys::clock::monotonic_ns();
        let last = self.last_exhaustive_ns.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < EXHAUSTIVE_SCAN_INTERVAL_NS {
            return false;
        }
        // One thread of the process scans per interval.
        self.last_exhaustive_ns
            .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Cells neither blocked nor counted as held, by the running count (at
    /// worst too low while takes or gives are half-way).
    fn room(&self) -> u64 {
        let blocked = u64::from(self.header().blocked());
        u64::from(self.max)
            .saturating_sub(blocked)
            .saturating_sub(self.running())
    }

    #[cold]
    fn count_now(&self, mut s: Slots) -> Slots {
        self.held().fetch_add(u64::from(s.len()), Ordering::SeqCst);
        #[cfg(shuttle)]
        self.mapping()
            .model_death_point("count_now: counted, cell not marked");
        if let SlotsView::One(c) = s.view() {
            s.set_one(self.mark_counted(c));
        } else if let Some(cs) = s.many_mut() {
            cs.iter_mut().for_each(|c| *c = self.mark_counted(*c));
        }
        s
    }

    /// [`count_now`](Self::count_now) for one cell `c`, inline (for the
    /// first look, which calls nothing out of line).
    #[inline(always)]
    fn count_one_now(&self, c: u32) -> u32 {
        self.held().fetch_add(1, Ordering::SeqCst);
        #[cfg(shuttle)]
        self.mapping()
            .model_death_point("count_now: counted, cell not marked");
        self.mark_counted(c)
    }

    /// Marks this process's uncounted cell `c` counted (a CAS: the cell is
    /// left alone if it holds anything else); returns `c | COUNTED`.
    #[inline(always)]
    fn mark_counted(&self, c: u32) -> u32 {
        let owner = self.owner();
        if let Some(cell) = self.cells().get(c as usize) {
            let _ = cell.compare_exchange(
                u64::from(owner),
                u64::from(owner | COUNTED),
                Ordering::SeqCst,
                Ordering::Relaxed,
            );
        }
        c | COUNTED
    }

    #[cold]
    fn take_cells(&self, owner: u32, n: u32, early_exit: bool) -> Option<Vec<u32>> {
        // `owner` may carry COUNTED; cell numbers come back untagged. Of a
        // counted take's `n` in `held`, what it has not taken yet is its
        // provisional share.
        let counted = u64::from(owner >> 31);
        let mut got = Vec::with_capacity(n as usize);
        for i in 0..n {
            let provisional = counted * u64::from(n - i);
            // A long take is progress: its designation (if it takes for one)
            // is not passed over while it runs (see `root.rs`).
            if i % 1024 == 1023 {
                self.reg.refresh_offer_if_taking();
            }
            match self.take_cell::<false>(owner, provisional, early_exit) {
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
            #[cfg(shuttle)]
            let watch = self.model_watch_held();
            let running = self.running();
            #[cfg(shuttle)]
            self.model_check_count(watch, running);
            #[cfg(shuttle)]
            self.mapping()
                .model_death_point("cap lock held, count read");
            let r = if running + u64::from(need) <= u64::from(cap) {
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

    /// Claims `cell` for `owner` if it is free for it: a counted owner
    /// takes `0` or [`FREE_COUNTED`], an uncounted one only `0`.
    #[inline(always)]
    fn claim(&self, cell: &AtomicU64, owner: u32) -> bool {
        let v = cell.load(Ordering::Relaxed);
        // 0, or FREE_COUNTED for a counted owner: `v` within the owner's
        // counted bit (all 64 bits: a free cell carries no tag).
        let tag = u64::from(owner & COUNTED);
        let ok = v | tag == tag
            && cell
                .compare_exchange(v, u64::from(owner), Ordering::SeqCst, Ordering::Relaxed)
                .is_ok();
        #[cfg(shuttle)]
        if ok {
            self.model_held(cell, 1);
        }
        ok
    }

    /// One cell for `owner`. `provisional`: what this take has counted in
    /// `held` beyond the cells it holds (left out of the early exit).
    /// With `FIRST`, the hint's cell only.
    #[inline(always)]
    fn take_cell<const FIRST: bool>(
        &self,
        owner: u32,
        provisional: u64,
        early_exit: bool,
    ) -> Option<u32> {
        let cells = self.cells();
        let n = cells.len();
        let start = self.hint.load(Ordering::Relaxed) as usize;
        let start = if start < n { start } else { 0 };
        // The hint first: the cell this process gave back last.
        match cells.get(start) {
            Some(c) if self.claim(c, owner) => Some(start as u32),
            Some(_) if FIRST => None,
            Some(_) => self.scan_for_cell(owner, start, provisional, early_exit),
            None => None,
        }
    }

    #[inline(never)]
    fn scan_for_cell(
        &self,
        owner: u32,
        start: usize,
        provisional: u64,
        early_exit: bool,
    ) -> Option<u32> {
        let cells = self.cells();
        let n = cells.len();
        let mut c = start;
        for k in 1..n {
            c += 1;
            if c == n {
                c = 0;
            }
            if early_exit
                && k == NEAR_SCAN
                && self.running().saturating_sub(provisional) + u64::from(self.header().blocked())
                    >= u64::from(self.max)
            {
                return None; // full (or about to be): no O(max) scan
            }
            if self.claim(&cells[c], owner) {
                self.hint.store(c as u32, Ordering::Relaxed);
                return Some(c as u32);
            }
        }
        None
    }

    /// The value a cell of `tag` (its [`COUNTED`] bit) is freed to.
    #[inline(always)]
    fn free_value(tag: u32) -> u32 {
        if tag != 0 {
            FREE_COUNTED
        } else {
            0
        }
    }

    /// Frees `cell` if it holds `owner | tag` (`tag` its [`COUNTED`] bit;
    /// no raw-permit tag): a cell that is not ours (the region was
    /// scribbled on) is left alone.
    #[inline]
    fn free_cell(&self, cell: u32, owner: u32, tag: u32) {
        if let Some(c) = self.cells().get(cell as usize) {
            #[cfg(shuttle)]
            self.model_held(c, -1);
            let _freed = c
                .compare_exchange(
                    u64::from(owner | tag),
                    u64::from(Self::free_value(tag)),
                    Ordering::SeqCst,
                    Ordering::Relaxed,
                )
                .is_ok();
            #[cfg(shuttle)]
            if !_freed {
                self.model_held(c, 1);
            }
        }
    }

    /// Frees `cell` if it holds exactly `raw << 32 | v` (`v` the holder's
    /// value, `raw` its raw-permit tag or 0): the one CAS of a give-back.
    /// Whether it was freed; a cell that holds anything else (the region
    /// was scribbled on, or a raw permit released twice) is left alone.
    #[inline(always)]
    fn free_tagged(&self, cell: u32, v: u32, raw: u32) -> bool {
        let Some(c) = self.cells().get(cell as usize) else {
            return false;
        };
        #[cfg(shuttle)]
        self.model_held(c, -1);
        let freed = c
            .compare_exchange(
                tagged(v, raw),
                u64::from(Self::free_value(v & COUNTED)),
                Ordering::SeqCst,
                Ordering::Relaxed,
            )
            .is_ok();
        #[cfg(shuttle)]
        if !freed {
            self.model_held(c, 1);
        }
        freed
    }

    /// Gives back slots this process holds. The cell CAS is a SeqCst RMW:
    /// it orders the release before the caller's read of the gate.
    #[inline]
    pub fn give(&self, slots: &Slots) {
        let owner = self.owner();
        match slots.view() {
            SlotsView::One(c) => {
                // Not `give_raw`'s checked path: a permit's own cell is
                // freed unconditionally (no branch on the CAS). The two
                // eras apart, each with its constants (one path computing
                // the free value from the counted bit costs more).
                if c & COUNTED != 0 {
                    self.free_cell(c & !COUNTED, owner, COUNTED);
                } else {
                    self.free_cell(c, owner, 0);
                }
                self.freed_one(c);
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

    /// What follows the give-back CAS of one cell `c` (its number, with
    /// [`COUNTED`] if counted): the hint and, if counted, `held −1`.
    #[inline(always)]
    fn freed_one(&self, c: u32) {
        #[cfg(shuttle)]
        self.mapping()
            .model_death_point("give: cell freed, count not yet");
        self.hint.store(c & !COUNTED, Ordering::Relaxed);
        if c & COUNTED != 0 {
            self.held().fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Turns the one cell `c` (its number, with [`COUNTED`] if counted)
    /// that this process holds into a raw permit tagged `tag`: a plain
    /// store of `tag << 32 | value` (see *Raw permits* in the module docs:
    /// nobody but the holder writes a held cell). The caller holds the cell
    /// and gives up its slots without giving them back.
    #[inline(always)]
    pub fn tag_cell(&self, c: u32, tag: u32) {
        if let Some(x) = self.cells().get((c & !COUNTED) as usize) {
            x.store(tagged(self.owner() | (c & COUNTED), tag), Ordering::Release);
        }
    }

    /// A tag for a raw permit on the cell `c` (its number, with [`COUNTED`]
    /// if counted) that this process holds: the last one this gave on that
    /// cell plus one (0 skipped), from a random start per binding. So a
    /// stale raw permit with such a tag can match a later one on its cell
    /// only once this process has made 2^32 − 1 more there, or by chance
    /// (one in 2^32 per take) against a tag chosen otherwise or by an
    /// earlier binding. Only a cell's holder calls it, so the load and the
    /// store do not race: a cell has one holder at a time, and the take of
    /// a later holder comes after the give-back of the earlier one in the
    /// cell's order (a CAS that takes reads the value a CAS that gave back
    /// wrote, directly or through other CASes), which carries the store.
    #[inline(always)]
    pub fn next_tag(&self, c: u32) -> NonZeroU32 {
        let Some(last) = self.tags.get((c & !COUNTED) as usize) else {
            return NonZeroU32::MIN; // no such cell: the tag store ignores it too
        };
        let t = last.load(Ordering::Relaxed).wrapping_add(1);
        let t = NonZeroU32::new(t).unwrap_or(NonZeroU32::MIN);
        last.store(t.get(), Ordering::Relaxed);
        t
    }

    /// Gives back the raw permit `tag` on cell `c` (as
    /// [`tag_cell`](Self::tag_cell) made it): its give-back CAS is the
    /// check, so only one release of a raw permit ever frees the cell;
    /// false (nothing done) if the cell does not hold it.
    #[inline(always)]
    pub fn give_raw(&self, c: u32, tag: u32) -> bool {
        if !self.free_tagged(c & !COUNTED, self.owner() | (c & COUNTED), tag) {
            return false;
        }
        self.freed_one(c);
        true
    }

    /// The cold half of a raw permit's release while the region is above
    /// a lowered ceiling: the check is a CAS that takes the tag off (`tag
    /// << 32 | value → value`), after which the cell is an ordinary held
    /// cell for [`give_to_ceiling`](Self::give_to_ceiling). False (nothing
    /// done) if the cell does not hold the raw permit.
    #[cold]
    pub fn untag_raw(&self, c: u32, tag: u32) -> bool {
        let v = self.owner() | (c & COUNTED);
        self.cells().get((c & !COUNTED) as usize).is_some_and(|x| {
            x.compare_exchange(
                tagged(v, tag),
                u64::from(v),
                Ordering::SeqCst,
                Ordering::Relaxed,
            )
            .is_ok()
        })
    }

    /// Gives back slots while the region is above a lowered ceiling
    /// ([`GATE_SHRINKING`]): as many cells as it is short go to the ceiling
    /// (each `my id → PENDING_BLOCK → BLOCKED` under the ceiling lock, the
    /// blocked count bumped between the two), the rest back to the pool.
    /// O(cells given). Behind a holder of the lock that makes no progress
    /// the lock is taken over (see *The ceiling*); if this process is
    /// taken over itself while it gives, the cells not yet given go back to
    /// the pool and it rebalances with the lock taken again.
    #[cold]
    #[inline(never)]
    pub fn give_to_ceiling(&self, slots: &Slots) {
        let owner = self.owner();
        let h = self.header();
        let cells: Vec<u32> = match slots.view() {
            SlotsView::One(c) => vec![c],
            SlotsView::Many(cs) => cs.to_vec(),
            SlotsView::Counted(_) => return,
        };
        let lock = self.ceiling_lock();
        let mut lost = false;
        let mut counted = 0u64;
        for c in cells {
            let (cell, tag) = (c & !COUNTED, c & COUNTED);
            counted += u64::from(tag >> 31);
            let short = !lost && h.blocked() < self.max - self.ceiling();
            let given = short
                && self.cells().get(cell as usize).is_some_and(|x| {
                    #[cfg(shuttle)]
                    self.model_held(x, -1);
                    match self.block_cell(x, owner | tag, Self::free_value(tag), &lock) {
                        Ok(Move::Done(_) | Move::Gone) => true,
                        Ok(Move::Untouched) => {
                            #[cfg(shuttle)]
                            self.model_held(x, 1);
                            false
                        }
                        Err(l) => {
                            lost = true;
                            #[cfg(shuttle)]
                            if !l.moved {
                                self.model_held(x, 1);
                            }
                            l.moved
                        }
                    }
                });
            if !given {
                self.free_cell(cell, owner, tag);
                self.hint.store(cell, Ordering::Relaxed);
            }
        }
        if counted > 0 {
            self.held().fetch_sub(counted, Ordering::SeqCst);
        }
        if !lost {
            self.reg
                .set_shrinking(h.blocked() < self.max - self.ceiling());
            if lock.held() {
                return;
            }
            // Taken over around the clear: shrinking again, to be safe.
            self.reg.set_shrinking(true);
        }
        drop(lock);
        self.rebalance(false);
    }

    /// Moves `cell` out of service under the ceiling lock: `from →
    /// PENDING_BLOCK`, the blocked count +1, `PENDING_BLOCK → BLOCKED`.
    /// Taken over: the cell goes back to `undo` (unless a recount took it
    /// out of service first: then it is blocked, counted).
    fn block_cell(
        &self,
        cell: &AtomicU64,
        from: u32,
        undo: u32,
        lock: &CeilingLock<'_>,
    ) -> Result<Move, MoveLost> {
        self.move_cell(cell, [from, PENDING_BLOCK, BLOCKED, undo], true, lock)
    }

    /// Puts a blocked cell back into service under the ceiling lock:
    /// `BLOCKED → PENDING_FREE`, the blocked count −1, `PENDING_FREE →
    /// FREE_COUNTED`; as [`block_cell`](Self::block_cell) the other way.
    fn unblock_cell(&self, cell: &AtomicU64, lock: &CeilingLock<'_>) -> Result<Move, MoveLost> {
        self.move_cell(
            cell,
            [BLOCKED, PENDING_FREE, FREE_COUNTED, BLOCKED],
            false,
            lock,
        )
    }

    /// One cell move under the ceiling lock, `[from, pending, to, undo]`:
    /// `from → pending`, the blocked count +1 (`blocking`) or −1, `pending →
    /// to`. Robbed before the count moved: `pending → undo` (a CAS: a
    /// recount may have taken the cell already). Another holder's late undo
    /// or finish can move the cell between the count and the last step (an
    /// ABA on the pending value): if that left the cell blocked when this
    /// move unblocks, or not blocked when it blocks, the count is taken back.
    fn move_cell(
        &self,
        cell: &AtomicU64,
        [from, pending, to, undo]: [u32; 4],
        blocking: bool,
        lock: &CeilingLock<'_>,
    ) -> Result<Move, MoveLost> {
        if !lock.held() {
            return Err(MoveLost { moved: false });
        }
        // Every value here is untagged (a raw permit's tag comes off before
        // its cell goes to the ceiling), so the 64-bit cell is the value.
        let [from, pending, to, undo] = [from, pending, to, undo].map(u64::from);
        if cell
            .compare_exchange(from, pending, Ordering::SeqCst, Ordering::Relaxed)
            .is_err()
        {
            return Ok(Move::Untouched);
        }
        #[cfg(shuttle)]
        self.mapping().model_death_point(if blocking {
            "ceiling: cell pending, not counted"
        } else {
            "ceiling: cell pending free, still counted"
        });
        let blocked = &self.header().blocked;
        let step = |c: u32, up: bool| {
            if up {
                c.saturating_add(1)
            } else {
                c.saturating_sub(1)
            }
        };
        match fenced(blocked, lock.gen(), |c| step(c, blocking)) {
            Ok(n) => {
                if cell
                    .compare_exchange(pending, to, Ordering::SeqCst, Ordering::SeqCst)
                    .is_err_and(|v| (v == u64::from(BLOCKED)) != blocking)
                {
                    return match fenced(blocked, lock.gen(), |c| step(c, !blocking)) {
                        Ok(_) => Ok(Move::Gone),
                        Err(Lost) => Err(MoveLost { moved: true }),
                    };
                }
                Ok(Move::Done(n))
            }
            Err(Lost) => {
                let _ = cell.compare_exchange(pending, undo, Ordering::SeqCst, Ordering::Relaxed);
                Err(MoveLost { moved: true })
            }
        }
    }

    /// Slots held across all processes: the sum of the members' `held`
    /// counts (O(processes); at worst one too high per process caught
    /// between its count and its cell). Starts counting if the region did
    /// not count yet; until a scan finds no uncounted cell, the uncounted
    /// ones are added from a scan, which turns the free `0` cells it passes
    /// into [`FREE_COUNTED`] (see the module docs).
    pub fn running(&self) -> u64 {
        if !self.counting() {
            self.reg.set_counting();
        }
        let h = self.header();
        if h.all_counted.load(Ordering::Acquire) != 0 {
            return self.reg.sum_members(HELD);
        }
        let mut uncounted = 0u64;
        for c in self.cells() {
            let mut v = c.load(Ordering::SeqCst);
            if v == 0 {
                match c.compare_exchange(
                    0,
                    u64::from(FREE_COUNTED),
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                ) {
                    Ok(_) => continue,
                    Err(now) => v = now,
                }
            }
            let v = value(v);
            if v & COUNTED == 0 && !out_of_service(v) {
                uncounted += 1;
            }
        }
        // The scan first, then the sum: a counted take the scan missed has
        // counted itself before its CAS, so before this read.
        let counted = self.reg.sum_members(HELD);
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

    /// True if fewer than `n` cells are free now (0 or `FREE_COUNTED`),
    /// counted on the cells themselves (SeqCst loads, early exit): a take
    /// of `n` made now would fail. The running count is not used (a dead
    /// holder may leave it high while a cell is free).
    pub fn fewer_free_cells_than(&self, n: u32) -> bool {
        if n == 0 {
            return false;
        }
        let mut left = n;
        for c in self.cells() {
            if value(c.load(Ordering::SeqCst)) & !COUNTED == 0 {
                left -= 1;
                if left == 0 {
                    return false;
                }
            }
        }
        left > 0
    }

    /// The effective ceiling: at most this many slots are held at once
    /// (≤ max; the max unless [`set_ceiling`](Self::set_ceiling) lowered it).
    pub fn ceiling(&self) -> u32 {
        self.header().ceiling(self.max)
    }

    /// Moves the effective ceiling to `target` (≤ max), for every process.
    ///
    /// The cells above the ceiling are taken out of service by marking free
    /// cells [`BLOCKED`] (one CAS each, under the ceiling lock, counted in
    /// the header); the fast path needs no new check. Going down, cells
    /// still held are not revoked: their holders keep them, and each
    /// release while the region is short gives its cell to the ceiling
    /// instead of back to the pool ([`GATE_SHRINKING`]) until the target is
    /// reached. Going up unblocks cells. A ceiling starts the running count
    /// (cells come back from it as [`FREE_COUNTED`]). Returns whether the
    /// target is reached now.
    pub fn set_ceiling(&self, target: u32) -> Result<bool> {
        if target > self.max {
            return Err(Error::InvalidArgument(format!(
                "ceiling {target} is above the region's max {}",
                self.max
            )));
        }
        // Stored under the ceiling lock, where a lapsing lease re-checks its
        // deadline (`lapse_if_due`) and a lease ends (`end_lease`): a
        // lowering decided on a deadline read before a renewal or an end
        // cannot land after it.
        loop {
            let lock = self.ceiling_lock();
            if let Ok(done) = self.move_ceiling(target, &lock) {
                return Ok(done);
            }
        }
    }

    /// Stores the ceiling `target` (≤ max) and moves cells to it, with the
    /// ceiling lock held; starts the running count. Whether it is reached.
    fn move_ceiling(&self, target: u32, lock: &CeilingLock<'_>) -> Result<bool, Lost> {
        self.reg.set_counting();
        fenced(&self.header().ceiling, lock.gen(), |_| target + 1)?;
        self.rebalance_locked(true, lock)
    }

    /// Ends a cluster lease's hold on the region (see
    /// [`Registry::disarm_lease`]) and, with `restore`, moves the ceiling
    /// to that level (clamped to the max), both under the ceiling lock: a
    /// process that read the deadline as passed before this call re-reads
    /// it under the lock and leaves the restored ceiling alone. Returns
    /// whether the ceiling is reached now.
    pub fn end_lease(&self, restore: Option<u32>) -> bool {
        loop {
            let lock = self.ceiling_lock();
            self.reg.disarm_lease();
            let Some(level) = restore else {
                return true;
            };
            if let Ok(done) = self.move_ceiling(level.min(self.max), &lock) {
                return done;
            }
        }
    }

    /// A cluster lease's deadline has passed ([`Registry::lapse_due`]): the
    /// ceiling comes down to the safe level if it is above it. Returns the
    /// safe level when lapsed (`None` while the lease is in force). Cold:
    /// only admissions of a region whose gate has `GATE_LEASED` call it.
    #[cold]
    #[inline(never)]
    pub fn lapse_if_due(&self) -> Option<u32> {
        let (safe, _) = self.reg.lapse_due()?;
        let safe = u32::try_from(safe).unwrap_or(u32::MAX).min(self.max);
        // Lowered under the ceiling lock with the deadline read again there:
        // a renewal or the lease's end may have come since the read above,
        // and its level must stand.
        while self.ceiling() > safe {
            let lock = self.ceiling_lock();
            if self.reg.lapse_due().is_none() || self.ceiling() <= safe {
                break;
            }
            if self.move_ceiling(safe, &lock).is_ok() {
                break;
            }
        }
        Some(safe)
    }

    /// Blocks or unblocks cells until `max − ceiling` are blocked (as far as
    /// free cells allow), under the ceiling lock; keeps [`GATE_SHRINKING`]
    /// set while short. Nothing to move costs nothing. `scan`: look for free
    /// cells to block through the whole table (a ceiling change); otherwise
    /// (a release, a reap) the cell this process freed last first, and the
    /// table only if the running count says a cell is free. False if short.
    pub fn rebalance(&self, scan: bool) -> bool {
        loop {
            let lock = self.ceiling_lock();
            if let Ok(done) = self.rebalance_locked(scan, &lock) {
                return done;
            }
        }
    }

    /// [`rebalance`](Self::rebalance) with the ceiling lock held. A cell
    /// found pending that this holder did not set is a taken-over holder's
    /// (stopped between two of its steps): a recount settles it.
    fn rebalance_locked(&self, scan: bool, lock: &CeilingLock<'_>) -> Result<bool, Lost> {
        let h = self.header();
        let cells = self.cells();
        let lost = |_: MoveLost| Lost;
        // A free cell out of service, if it still is free.
        let block = |c: &AtomicU64| -> Result<Move, Lost> {
            // Only a free cell (canonical in all 64 bits: no tag).
            let v = c.load(Ordering::Relaxed);
            if v & !u64::from(COUNTED) != 0 {
                return Ok(Move::Untouched);
            }
            self.block_cell(c, v as u32, v as u32, lock).map_err(lost)
        };
        let pending = |c: &AtomicU64| {
            let v = c.load(Ordering::Relaxed);
            v == u64::from(PENDING_BLOCK) || v == u64::from(PENDING_FREE)
        };
        for _ in 0..4 {
            let want = self.max - self.ceiling();
            let mut have = h.blocked();
            let mut stale = false;
            if have < want {
                // Shrinking before the scan: a release that frees a cell the
                // scan has passed sees the bit, and gives its cell here.
                self.reg.set_shrinking(true);
                let hint = self.hint.load(Ordering::Relaxed) as usize;
                if let Move::Done(n) = cells.get(hint).map_or(Ok(Move::Untouched), block)? {
                    have = n;
                }
                if have < want && (scan || self.room() > 0) {
                    for c in cells {
                        if have >= want {
                            break;
                        }
                        match block(c)? {
                            Move::Done(n) => have = n,
                            Move::Untouched => stale |= pending(c),
                            Move::Gone => {}
                        }
                    }
                }
            } else if have > want {
                for c in cells {
                    if have <= want {
                        break;
                    }
                    match self.unblock_cell(c, lock).map_err(lost)? {
                        Move::Done(n) => have = n,
                        Move::Untouched => stale |= pending(c),
                        Move::Gone => {}
                    }
                }
            }
            if stale {
                self.recount(lock)?;
                continue;
            }
            // Re-read the target: another process may have moved it meanwhile.
            let want = self.max - self.ceiling();
            if have <= want {
                self.reg.set_shrinking(have < want);
                if !lock.held() {
                    // Taken over around the clear: shrinking again, to be safe.
                    self.reg.set_shrinking(true);
                    return Err(Lost);
                }
                return Ok(have == want);
            }
        }
        Ok(false)
    }

    /// Takes the region's ceiling lock. While another process holds it,
    /// waits in slices; between slices it looks at the lock word and the
    /// blocked count (a holder at work moves one or the other). A holder
    /// that died is taken over at once, and so is one whose lock word and
    /// count have not moved for [`LOCK_TAKEOVER_NS`] (stopped, frozen,
    /// starved); either way the taker recounts (see [`recount`](Self::recount)).
    fn ceiling_lock(&self) -> CeilingLock<'_> {
        let h = self.header();
        let lock = &h.ceiling_lock;
        let me = self.owner();
        let next = |w: u64| (u64::from(((w >> 32) as u32).wrapping_add(1)) << 32) | u64::from(me);
        // The lock word and count a slice started with, and when first seen.
        let mut seen: Option<(u64, u64, u64)> = None;
        let mut spins = 0u32;
        loop {
            let cur = lock.load(Ordering::SeqCst);
            let holder = cur as u32;
            if holder == 0 {
                if lock
                    .compare_exchange(cur, next(cur), Ordering::SeqCst, Ordering::Relaxed)
                    .is_ok()
                {
                    return CeilingLock {
                        lock,
                        word: next(cur),
                    };
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
            let count = h.blocked.load(Ordering::SeqCst);
            let dead = holder != me && !self.reg.owner_alive(holder);
            let stuck = dead
                || match seen {
                    Some((w, b, since)) if w == cur && b == count => {
                        now.saturating_sub(since) >= LOCK_TAKEOVER_NS
                    }
                    _ => {
                        seen = Some((cur, count, now));
                        false
                    }
                };
            if stuck
                && lock
                    .compare_exchange(cur, next(cur), Ordering::SeqCst, Ordering::Relaxed)
                    .is_ok()
            {
                let taken = CeilingLock {
                    lock,
                    word: next(cur),
                };
                if self.recount(&taken).is_ok() {
                    return taken;
                }
                // Taken over in turn while recounting: wait again.
                seen = None;
                continue;
            }
            crate::sync::yield_now();
        }
    }

    /// After a takeover (or a pending cell left by an earlier holder): stamps
    /// the fenced words, so no earlier acquisition's write lands after this
    /// point, then counts the blocked cells afresh, taking every pending
    /// cell out of service (counted). An earlier holder whose count move
    /// the stamp refused puts its cell back only if it is still pending
    /// (its undo CAS), so each pending cell ends counted or back where it
    /// came from, never both.
    fn recount(&self, lock: &CeilingLock<'_>) -> Result<(), Lost> {
        let h = self.header();
        fenced(&h.blocked, lock.gen(), |c| c)?;
        fenced(&h.ceiling, lock.gen(), |c| c)?;
        let mut blocked = 0u32;
        for c in self.cells() {
            // Out-of-service values are untagged: the 64-bit cell is the value.
            let (pb, pf, b) = (
                u64::from(PENDING_BLOCK),
                u64::from(PENDING_FREE),
                u64::from(BLOCKED),
            );
            let mut v = c.load(Ordering::SeqCst);
            while v == pb || v == pf {
                match c.compare_exchange(v, b, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(_) => v = b,
                    Err(now) => v = now,
                }
            }
            blocked += u32::from(v == b);
        }
        fenced(&h.blocked, lock.gen(), |_| blocked)?;
        Ok(())
    }

    /// Occupied cells, counted one by one (O(max): stats and tools only).
    /// Cells blocked by the ceiling do not count.
    pub fn occupied(&self) -> u32 {
        self.cells()
            .iter()
            .filter(|c| {
                let v = value(c.load(Ordering::Relaxed));
                v & !COUNTED != 0 && !out_of_service(v)
            })
            .count() as u32
    }

    /// Cells held by `owner` now (for tests and the CLI; O(max)).
    pub fn held_by(&self, owner: u32) -> u32 {
        self.cells()
            .iter()
            .filter(|c| value(c.load(Ordering::Relaxed)) & !COUNTED == owner)
            .count() as u32
    }

    /// Raw permits this process holds now: its cells that carry a tag
    /// (O(max): for closing a handle, tests and tools).
    pub fn raw_held(&self) -> u32 {
        let me = self.owner();
        self.cells()
            .iter()
            .filter(|c| {
                let v = c.load(Ordering::SeqCst);
                v >> 32 != 0 && value(v) & !COUNTED == me
            })
            .count() as u32
    }

    /// Returns every slot of every dead process now. Returns (processes
    /// reaped, slots reclaimed).
    pub fn reap(&self) -> Result<(u32, u64)> {
        let mut slots = 0u64;
        let procs = self.reg.reap(&mut |idx, owner| {
            slots += self.release_dead(idx, owner);
        })?;
        self.reclaimed(slots);
        Ok((procs, slots))
    }

    /// Reaps if a scan is due (rate-limited region-wide).
    pub fn maybe_reap(&self) -> u64 {
        let mut slots = 0u64;
        let _ = self.reg.maybe_reap(&mut |idx, owner| {
            slots += self.release_dead(idx, owner);
        });
        self.reclaimed(slots);
        slots
    }

    /// Counts `slots` freed for dead processes; while the region is above
    /// its ceiling they go to the ceiling.
    fn reclaimed(&self, slots: u64) {
        if slots > 0 {
            self.header().reclaimed.fetch_add(slots, Ordering::Relaxed);
            if self.reg.gate() & GATE_SHRINKING != 0 {
                self.rebalance(false);
            }
        }
    }

    /// Frees every cell owned by `owner` (a dead process). Idempotent per
    /// owner id (a CAS from that id to free). Returns the number freed.
    fn release_dead(&self, _idx: u32, owner: u32) -> u64 {
        let counting = self.counting();
        let mut n = 0;
        for cell in self.cells() {
            // Whose it is by the value half; the CAS from the whole word (a
            // dead holder's raw permit carries a tag).
            let v = cell.load(Ordering::SeqCst);
            if value(v) & !COUNTED != owner {
                continue;
            }
            // Free as the era wants it (an uncounted cell freed to 0 while
            // counting starts was seen held by every scan that passed it).
            let free = u64::from(if counting {
                FREE_COUNTED
            } else {
                Self::free_value(value(v) & COUNTED)
            });
            #[cfg(shuttle)]
            self.model_held(cell, -1);
            if cell
                .compare_exchange(v, free, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                n += 1;
            } else {
                #[cfg(shuttle)]
                self.model_held(cell, 1);
            }
        }
        n
    }

    /// Region-wide figures. Reaps first if a scan is due (rate-limited
    /// region-wide, [`REAP_INTERVAL_MS`](crate::region::registry::REAP_INTERVAL_MS)):
    /// a dead waiter's stall ends when a reader notices its death, not only
    /// when someone acquires.
    pub fn stats(&self) -> SharedStats {
        self.maybe_reap();
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
            served: self.reg.served(),
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
    /// Cells blocked by the ceiling.
    pub blocked: u32,
    /// Cells on their way in or out of service (a mover between its steps).
    pub pending: u32,
    /// The header's count of blocked cells.
    pub blocked_count: u32,
    /// The effective ceiling.
    pub ceiling: u32,
    /// The owner id holding the cap lock (0: free).
    pub cap_lock: u32,
    /// The owner id holding the ceiling lock (0: free).
    pub ceiling_lock: u32,
}

#[cfg(shuttle)]
impl SharedSlots {
    /// Model checker: `cell` taken (+1, just after the CAS) or about to be
    /// freed (−1, just before), so the model knows, cell by cell, a lower
    /// bound of what is held at every step.
    fn model_held(&self, cell: &AtomicU64, delta: i64) {
        crate::sys::futex::model::ghost_add(cell as *const AtomicU64 as usize, delta);
    }

    /// Model checker: starts watching the cells held now, for as long as
    /// each stays held (see [`model_check_count`](Self::model_check_count)).
    fn model_watch_held(&self) -> usize {
        let cells = self.cells();
        crate::sys::futex::model::ghost_watch(cells.as_ptr() as usize, std::mem::size_of_val(cells))
    }

    /// Model checker: a running count read since `watch` must include every
    /// cell held throughout the read (a capped admission against a lower
    /// count could exceed its cap). Cells taken or freed while the count is
    /// read may be in it or not: the count is a sum over processes read one
    /// after the other, not one instant's snapshot (see the module docs).
    fn model_check_count(&self, watch: usize, running: u64) {
        let least = crate::sys::futex::model::ghost_unwatch(watch);
        assert!(
            running as i64 >= least,
            "a running count of {running} missed a cell: at least {least} were held \
             throughout its read"
        );
    }

    /// The region's raw state (see [`ModelState`]).
    pub(crate) fn model_state(&self) -> ModelState {
        let reg = &self.reg;
        let designee = reg
            .designee()
            .map(|d| (d.idx, d.tier, d.ticket, d.lottery, d.notified, d.taking));
        let cells: Vec<u32> = self
            .cells()
            .iter()
            .map(|c| value(c.load(Ordering::SeqCst)))
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
        let occupied = cells
            .iter()
            .filter(|&&v| v & !COUNTED != 0 && !out_of_service(v))
            .count() as u32;
        ModelState {
            gate: reg.gate(),
            designee,
            members,
            occupied,
            orphaned: occupied - owned_by_members.min(occupied),
            blocked: cells.iter().filter(|&&v| v == BLOCKED).count() as u32,
            pending: cells
                .iter()
                .filter(|&&v| v == PENDING_BLOCK || v == PENDING_FREE)
                .count() as u32,
            blocked_count: self.header().blocked(),
            ceiling: self.ceiling(),
            cap_lock: self.header().cap_lock.load(Ordering::SeqCst) as u32,
            ceiling_lock: self.header().ceiling_lock.load(Ordering::SeqCst) as u32,
        }
    }
}

#[cfg(all(test, not(shuttle)))]
mod tests {
    use super::*;

    /// `fewer_free_cells_than` answers on the cells: true exactly when a
    /// take of that many would fail, with counting on or off.
    #[test]
    fn fewer_free_cells_than_matches_what_a_take_gets() {
        let region = Region::anonymous().unwrap();
        let s = SharedSlots::bind(&region, Some(3)).unwrap();
        assert!(!s.fewer_free_cells_than(0));
        assert!(!s.fewer_free_cells_than(3));
        assert!(s.fewer_free_cells_than(4));
        let a = s.take(2).unwrap();
        assert!(!s.fewer_free_cells_than(1));
        assert!(s.fewer_free_cells_than(2));
        assert!(s.take(2).is_none());
        let _ = s.running(); // counting on: cells carry COUNTED
        let b = s.take(1).unwrap();
        assert!(s.fewer_free_cells_than(1));
        assert!(s.take(1).is_none());
        s.give(&b);
        assert!(!s.fewer_free_cells_than(1));
        s.give(&a);
        assert!(!s.fewer_free_cells_than(3));
        assert_eq!(s.take(3).map(|t| t.len()), Some(3));
    }
}
