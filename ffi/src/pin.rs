//! Cell tokens: a one-cell permit of a shared root scheduler handed to C
//! as its region cell and a tag, so that releasing it needs no table entry
//! and no claiming CAS. The cell's own give-back CAS is the check against a
//! double, stale, forged or foreign release (see *Raw permits* in the
//! library's `scheduler/shared.rs`, and [`Permit::into_raw`]); what this
//! module adds is finding the scheduler handle from the token without a
//! read-modify-write, safely against the handle being closed and freed.
//!
//! # The token
//!
//! `shmsched_permit {process, serial}` as for table permits
//! ([`crate::permits`]); `serial` bit 63 tells them apart. A cell token has
//! bit 63 set, then the handle's *pin slot* (bits 62..49, 14 bits), the
//! cell's counted bit (48), the cell (47..32, up to 65,536 cells) and the
//! tag (31..0, never 0). A table token has bit 63 clear.
//!
//! - **Acquire** (a shared root handle with a pin slot). The common case
//!   takes the *lean path* ([`acquire_now`], run by
//!   `shmsched_scheduler_acquire` and `_try_acquire` before anything else):
//!   a handle of this process, a valid priority and an output, and the
//!   library's first look ([`Scheduler::acquire_raw_first_look`]) taking
//!   the cell at this process's hint and storing its tag, in code that
//!   calls nothing; where the first look declines, the rest of the
//!   library's fast path ([`Scheduler::acquire_raw_fast`]). Their tag is
//!   the cell's last one in this process plus one, from a random start
//!   per binding (no thread-local state). Anything else (a wait, a
//!   timeout, a callback, a refusal, an error) takes the general path, the
//!   library's acquire and then [`Permit::into_raw`] with the next tag of
//!   this thread (a plain thread-local counter started at a per-thread odd
//!   multiple of the golden ratio, so two threads' sequences differ; 0
//!   skipped). Either way the tag reaches the cell by one plain store (no
//!   RMW). Anything that does not become raw (a weighted permit, a child,
//!   a handle beyond [`MAX_SLOTS`]) takes the table path.
//! - **Release**: the process tag is checked as for a table token
//!   (`ForeignPermit`); the handle is found through its pin slot, *pinned*
//!   (below) and the library's raw release runs: its give-back CAS frees
//!   the cell only if the cell still holds `tag | owner | counted`. The
//!   lean path ([`release_now`]) does it for a cell token of this process
//!   whose slot names a handle, on a thread that has a hazard record,
//!   through the library's first look ([`Scheduler::release_raw_first_look`],
//!   which leaves serving the queue to a `Serve` the lean path drops while
//!   still pinned, and declines above a lowered ceiling); anything else
//!   goes the general way, [`release`] ([`Scheduler::release_raw`]). A
//!   stale token can only match a later permit of this process on the same
//!   cell with the very same tag: a lean tag repeats on its cell only
//!   after 2^32 − 1 lean takes of that cell, and a thread's tag only after
//!   2^32 of its own; a tag of one kind, or of another binding, meets one
//!   of the other by chance (one in 2^32 per reuse, the level of a table
//!   entry's generation).
//! - **Why first looks.** A locked instruction waits for every earlier
//!   store to leave the store buffer, and the registers a function saves
//!   on entry are stores. The lean paths are written so that nothing of
//!   their frame is live across a call on the common path (everything
//!   rarer finishes in a function of its own, called last with what it
//!   needs), so the exported functions save at most one or two registers
//!   before their CAS instead of six (measured in `benches/RESULTS.md`).
//!
//! # The pin: an asymmetric-fence hazard pointer
//!
//! `SLOTS[s]` holds the handle of pin slot `s` (null when none). Each
//! thread that releases owns one hazard record (registered once in a
//! global list, recycled at thread exit). A release does:
//!
//! 1. `h = SLOTS[s]` (Acquire); null: `AlreadyReleased`;
//! 2. `hazard = h` (a plain atomic store), then a compiler fence (a full
//!    fence until membarrier is known to work, see below);
//! 3. `SLOTS[s]` again: changed, clear the hazard, `AlreadyReleased`;
//! 4. `release_raw` through `h`; read `h.closed`; clear the hazard (Release);
//!    if the handle was closed, sweep (under the pool lock, below).
//!
//! A handle is freed only by a sweep (under the pool lock of
//! [`crate::permits`]): a closed handle with no table entry referring to it
//! and no raw permit of this process left in its region
//! ([`Scheduler::raw_permits_held`]) is unpublished (`SLOTS[s] = null`);
//! then `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` runs a full barrier
//! on every running thread of the process; then every hazard record is
//! read. A record holding `h` is waited for briefly (a release holds it for
//! nanoseconds); if it stays, `h` stays parked for the next sweep (a delay,
//! never a use after free). Otherwise `h` is freed and its slot recycled.
//!
//! **Why each interleaving is safe.** The releaser's step 2 store and step
//! 3 load, against the sweep's unpublishing store and hazard loads, is
//! Dekker's handshake; the releaser's side has only a compiler fence, and
//! the membarrier supplies the CPU barrier on its behalf: on the
//! releaser's CPU a full barrier runs at some point during the sweep's
//! membarrier call. If the releaser's hazard store came before that
//! barrier, it is visible to the sweep's hazard loads (which come after
//! the call returns): the sweep sees `h` and does not free it until the
//! releaser clears it (Release, after its last use of `h`; the sweep's
//! loads are Acquire). If the store came after the barrier, the releaser's
//! step 3 load comes after it too, so after the unpublishing store (made
//! before the call): it reads null or a later handle, not `h` (a handle at
//! the same address can be published only once `h` is freed, which this
//! sweep has not done), and the releaser backs off without touching `h`.
//! A release that read "not closed" just before a close leaves the sweep
//! to that close; a release that read "closed" sweeps itself after
//! clearing its hazard, so the last raw permit of a closed handle frees it.
//! A legitimately held raw permit keeps its handle published (the sweep
//! counts raw permits in the region first; the handle is closed, so no new
//! one can appear through it). The count is per region and process (a
//! cell records its owner and tag, not the handle): one-slot permits of
//! another open handle of this process on the same region keep a closed
//! handle parked too, until a sweep after they are all released (a delay,
//! and while it lasts the handle's memory and pin slot; past
//! [`MAX_SLOTS`] new handles use the table).
//!
//! Where membarrier is unavailable (an old kernel, a seccomp filter;
//! decided once per process, before the first handle is pinned) releasers
//! use a SeqCst fence instead of the compiler fence and the sweep a SeqCst
//! fence instead of the syscall: sound, one fence slower. A releaser that
//! finds it not decided yet (only possible in a forked child, whose
//! decision starts over) takes the SeqCst fence too: a full fence on the
//! releaser's side is sound against either heavy side.
//!
//! # Fork
//!
//! A child gets a new process tag, so its parent's tokens are foreign
//! (checked before the slot is read). The child handler clears every
//! hazard record (no thread of the child is inside a release: `fork` is
//! not called from one) and frees the records of the parent's other
//! threads, and makes the child decide about membarrier afresh. The slot
//! table and its free list are the pool's (see [`crate::permits`]).

use std::cell::Cell;
use std::num::NonZeroU32;
use std::ptr;
use std::sync::atomic::{compiler_fence, fence, AtomicBool, AtomicPtr, AtomicU32, Ordering};

use shmsched::scheduler::{Permit, RawPermit, RawRelease, Scheduler, Serve};
use shmsched::sys::membarrier;

use crate::face::{self, Handle};
use crate::permits::{self, shmsched_permit, Pool};
use crate::process;
use crate::scheduler::shmsched_scheduler;
use crate::status::{shmsched_status, Fail};

/// Pin slots: at most this many open shared root handles at once use
/// cell tokens (later ones use the table).
pub(crate) const MAX_SLOTS: usize = 1 << 14;

/// A handle's pin slot when it has none.
pub(crate) const NO_SLOT: u32 = u32::MAX;

const CELL_TOKEN: u64 = 1 << 63;
const SLOT_SHIFT: u32 = 49;
const COUNTED_BIT: u64 = 1 << 48;
const CELL_SHIFT: u32 = 32;

/// The handle of each pin slot, or null. Written under the pool lock
/// (publish, unpublish); read by releases without a lock.
static SLOTS: [AtomicPtr<shmsched_scheduler>; MAX_SLOTS] =
    [const { AtomicPtr::new(ptr::null_mut()) }; MAX_SLOTS];

/// One thread's hazard pointer: the handle it is releasing through (null
/// when none). Records are allocated once, never freed, and linked into
/// [`HAZARDS`]; a thread takes a free one (or a new one) on its first
/// release and gives it back at exit.
struct Hazard {
    ptr: AtomicPtr<shmsched_scheduler>,
    in_use: AtomicBool,
    /// The next record (set before the record is linked; never changes).
    next: *const Hazard,
}

// SAFETY: `next` is written once before the record is shared and then
// only read; the other fields are atomics.
unsafe impl Sync for Hazard {}

/// The head of the list of hazard records (push only).
static HAZARDS: AtomicPtr<Hazard> = AtomicPtr::new(ptr::null_mut());

/// Threads that have taken a tag seed (their ordinal).
static THREADS: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// This thread's hazard record (null until its first release).
    static MINE: Cell<*const Hazard> = const { Cell::new(ptr::null()) };
    /// Gives the record back at thread exit (registered with the record).
    static GIVE_BACK: HazardExit = const { HazardExit };
    /// The last tag this thread handed out (0: no seed yet).
    static TAG: Cell<u32> = const { Cell::new(0) };
}

/// Gives a thread's hazard record back when the thread exits.
struct HazardExit;

impl Drop for HazardExit {
    fn drop(&mut self) {
        let _ = MINE.try_with(|m| {
            let h = m.replace(ptr::null());
            if !h.is_null() {
                // SAFETY: records are never freed.
                let h = unsafe { &*h };
                h.ptr.store(ptr::null_mut(), Ordering::Release);
                h.in_use.store(false, Ordering::Release);
            }
        });
    }
}

/// This thread's hazard record.
#[inline(always)]
fn my_hazard() -> &'static Hazard {
    my_hazard_if_any().unwrap_or_else(register)
}

/// This thread's hazard record, if it has one yet.
#[inline(always)]
fn my_hazard_if_any() -> Option<&'static Hazard> {
    let h = MINE.try_with(Cell::get).unwrap_or(ptr::null());
    // SAFETY: records are never freed.
    unsafe { h.as_ref() }
}

/// Takes a free hazard record for this thread (or links a new one) and
/// arranges for it to be given back at thread exit.
#[cold]
fn register() -> &'static Hazard {
    let mut cur = HAZARDS.load(Ordering::Acquire);
    let rec: &'static Hazard = loop {
        if cur.is_null() {
            let new = Box::leak(Box::new(Hazard {
                ptr: AtomicPtr::new(ptr::null_mut()),
                in_use: AtomicBool::new(true),
                next: ptr::null(),
            }));
            let mut head = HAZARDS.load(Ordering::Acquire);
            loop {
                new.next = head;
                match HAZARDS.compare_exchange_weak(
                    head,
                    new as *mut Hazard,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break,
                    Err(h) => head = h,
                }
            }
            break new;
        }
        // SAFETY: records are never freed.
        let r = unsafe { &*cur };
        if r.in_use
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            break r;
        }
        cur = r.next as *mut Hazard;
    };
    // Registering the exit hook fails only while the thread is being torn
    // down (its hook may have run already): the record is cached anyway,
    // so the thread's later releases reuse it, but it is not given back
    // (one record per such thread stays in use, with a null hazard: it
    // never holds up a sweep).
    let _ = GIVE_BACK.try_with(|_| ());
    let _ = MINE.try_with(|m| m.set(rec));
    rec
}

/// Whether some thread's hazard pointer is `h` now.
fn hazard_on(h: *mut shmsched_scheduler) -> bool {
    let mut cur = HAZARDS.load(Ordering::Acquire);
    while !cur.is_null() {
        // SAFETY: records are never freed.
        let r = unsafe { &*cur };
        if r.ptr.load(Ordering::Acquire) == h {
            return true;
        }
        cur = r.next as *mut Hazard;
    }
    false
}

/// The child half of the fork handler (only atomic stores and loads):
/// see the module docs.
pub(crate) fn after_fork_in_child() {
    let mine = MINE.try_with(Cell::get).unwrap_or(ptr::null());
    let mut cur = HAZARDS.load(Ordering::SeqCst);
    while !cur.is_null() {
        // SAFETY: records are never freed.
        let r = unsafe { &*cur };
        r.ptr.store(ptr::null_mut(), Ordering::SeqCst);
        if !ptr::eq(r, mine) {
            r.in_use.store(false, Ordering::SeqCst);
        }
        cur = r.next as *mut Hazard;
    }
    membarrier::forget();
}

/// The next tag of this thread (never 0).
#[inline(always)]
fn next_tag() -> NonZeroU32 {
    let t = TAG
        .try_with(|c| {
            let mut t = c.get();
            if t == 0 {
                t = seed();
            }
            t = t.wrapping_add(1);
            if t == 0 {
                t = 1;
            }
            c.set(t);
            t
        })
        .unwrap_or_else(|_| seed());
    NonZeroU32::new(t).unwrap_or(NonZeroU32::MIN)
}

/// A thread's starting tag: its ordinal times an odd constant (the golden
/// ratio in 32 bits), so two threads' counters start far apart.
#[cold]
fn seed() -> u32 {
    let n = THREADS.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
    n.wrapping_mul(0x9e37_79b9) | 1
}

/// Gives `h` (a new shared root handle, not yet shared with any thread) a
/// pin slot, if one is free: its one-cell permits become cell tokens.
pub(crate) fn publish(h: *mut shmsched_scheduler) {
    // Decide about membarrier before the first token exists (releases read
    // the answer without deciding).
    let _ = membarrier::available();
    permits::with_pool(|p| {
        let slot = match p.slots_free.pop() {
            Some(s) => s,
            None if (p.slots_next as usize) < MAX_SLOTS => {
                p.slots_next += 1;
                p.slots_next - 1
            }
            None => return,
        };
        // SAFETY: `h` is live and not yet shared (the contract).
        unsafe { (*h).set_pin_slot(slot) };
        SLOTS[slot as usize].store(h, Ordering::Release);
    });
}

/// Acquires through `handle` with `acquire`: a cell token when the permit
/// is one cell of a shared root and the handle has a pin slot, else a
/// table token ([`permits::acquire_with`]).
#[inline(always)]
pub(crate) fn acquire_with<'h, E>(
    handle: &'h shmsched_scheduler,
    acquire: impl FnOnce(&'h Scheduler) -> Result<Permit<'h>, E>,
) -> Result<shmsched_permit, Fail>
where
    Fail: From<E>,
{
    let slot = handle.pin_slot();
    if slot == NO_SLOT {
        return permits::acquire_with(handle, acquire);
    }
    let permit = acquire(handle.scheduler()).map_err(Fail::from)?;
    match permit.into_raw(next_tag()) {
        Ok(raw) => Ok(cell_token(process::tag(), slot, raw)),
        Err(permit) => permits::insert(handle, permit),
    }
}

/// An exported acquire's general path (`shmsched_scheduler_acquire`'s or
/// `_try_acquire`'s), by its arguments.
pub(crate) type General =
    unsafe fn(*const shmsched_scheduler, i32, *mut shmsched_permit) -> shmsched_status;

/// The lean path of `shmsched_scheduler_acquire` and `_try_acquire` (see
/// [`crate::face::lean`]): a handle of this process with a pin slot, a
/// valid priority and output, and a process tag made already; then the
/// library's first look ([`Scheduler::acquire_raw_first_look`]) answers
/// with a cell token and `Ok` when it takes a cell, and [`acquire_rest`]
/// when it does not. `None` (nothing done) when a check fails, for the
/// caller's general path.
///
/// Nothing of this frame is live across a call on the common path (the
/// first look calls nothing out of line; `acquire_rest` is called last,
/// with the arguments), so the exported function saves only the registers
/// the take itself needs (two, against six with the whole fast path
/// inline): saved registers are stores, and the take's locked CAS waits
/// for them.
///
/// # Safety
///
/// As `shmsched_scheduler_acquire`: `sched` NULL or an open scheduler
/// handle, `out` NULL or writable; `general` safe to call with them.
#[inline(always)]
pub(crate) unsafe fn acquire_now(
    sched: *const shmsched_scheduler,
    priority: i32,
    out: *mut shmsched_permit,
    general: General,
) -> Option<shmsched_status> {
    // SAFETY: NULL or an open handle for the whole call (the contract).
    let h = unsafe { sched.as_ref() }?;
    if out.is_null() {
        return None;
    }
    let p = face::priority_of(priority)?;
    // The tag: 0 until the first token, made by the general path (which
    // may call out to make it).
    if h.pin_slot() == NO_SLOT || process::tag_if_made() == 0 || !h.made_here() {
        return None;
    }
    let Some(raw) = h.scheduler().acquire_raw_first_look(p) else {
        // SAFETY: forwarded contract.
        return Some(unsafe { acquire_rest(sched, priority, out, general) });
    };
    // The slot and the tag read again rather than kept across the take
    // (fewer registers to keep): both hold what they held (a pin slot is
    // set before the handle is shared; a tag once made changes only in a
    // forked child's handler).
    // SAFETY: `out` is non-null and writable (the contract).
    unsafe { out.write(cell_token(process::tag_if_made(), h.pin_slot(), raw)) };
    Some(shmsched_status::Ok)
}

/// The rest of [`acquire_now`] after a first look that took nothing: the
/// library's whole fast path ([`Scheduler::acquire_raw_fast`]), then
/// `general` if that takes nothing either.
///
/// # Safety
///
/// As [`acquire_now`], whose checks passed.
#[inline(never)]
unsafe fn acquire_rest(
    sched: *const shmsched_scheduler,
    priority: i32,
    out: *mut shmsched_permit,
    general: General,
) -> shmsched_status {
    // SAFETY: an open handle (the contract; checked non-NULL).
    let h = unsafe { &*sched };
    let raw = face::priority_of(priority).and_then(|p| h.scheduler().acquire_raw_fast(p));
    let Some(raw) = raw else {
        // SAFETY: forwarded contract.
        return unsafe { general(sched, priority, out) };
    };
    // SAFETY: `out` is non-null and writable (the contract).
    unsafe { out.write(cell_token(process::tag_if_made(), h.pin_slot(), raw)) };
    shmsched_status::Ok
}

/// The token of `raw`, a raw permit of the handle in pin slot `slot`, for
/// the process tagged `process`.
#[inline(always)]
fn cell_token(process: u64, slot: u32, raw: RawPermit) -> shmsched_permit {
    shmsched_permit {
        process,
        serial: CELL_TOKEN
            | u64::from(slot) << SLOT_SHIFT
            | if raw.counted() { COUNTED_BIT } else { 0 }
            | u64::from(raw.cell()) << CELL_SHIFT
            | u64::from(raw.tag().get()),
    }
}

/// Releases the permit behind `token`: a cell token here (module docs), a
/// table token in [`permits::release`].
#[inline(always)]
pub(crate) fn release(token: shmsched_permit) -> Result<(), Fail> {
    if token.serial & CELL_TOKEN == 0 {
        return permits::release(token);
    }
    let me = process::tag();
    if token.process != me {
        return Err(permits::not_ours(token, me));
    }
    let hazard = my_hazard();
    let Some((h, raw)) = pin(token.serial, hazard) else {
        return Err(permits::not_held(token));
    };
    // SAFETY: pinned (see `pin`) until `unpin`.
    let hr = unsafe { &*h };
    let r = hr.scheduler().release_raw(raw);
    if unpin(hazard, hr) {
        permits::with_pool(permits::sweep);
    }
    r.map_err(|e| raw_failure(token, e))
}

/// The lean path of `shmsched_permit_release` (see [`crate::face::lean`]):
/// a cell token of this process whose pin slot names a handle, on a thread
/// that has a hazard record, released through the library's first look
/// ([`Scheduler::release_raw_first_look`]) and answered exactly as
/// [`release`] would; anything else, and what the first look declines,
/// goes to `general` (which takes over from scratch: nothing was done),
/// or, before any call, to the caller (`None`).
///
/// Nothing of this frame is live across a call on the common path but one
/// word across the thread-local access of the hazard record (a call in
/// the shared object; the linker makes it two instructions in a static
/// one): the rarer outcomes finish in functions of their own, called last
/// with what they need. So the exported function keeps at most one saved
/// register: saved registers are stores, and the give-back's locked CAS
/// waits for them.
#[inline(always)]
pub(crate) fn release_now(
    token: shmsched_permit,
    general: fn(shmsched_permit) -> shmsched_status,
) -> Option<shmsched_status> {
    // 0 until this process made its first token: then `token` is not one
    // of its own, and the general path computes the tag to say so.
    let me = process::tag_if_made();
    if token.serial & CELL_TOKEN == 0 || me == 0 || token.process != me {
        return None;
    }
    // A thread without a hazard record yet takes the general path, which
    // registers one. Past the thread-local access `token.process` is read
    // again from `me`'s global where needed, which still holds it (only a
    // forked child's handler changes a tag once made): a word less to keep.
    let serial = token.serial;
    let ours = move || shmsched_permit {
        process: process::tag_if_made(),
        serial,
    };
    let Some(hazard) = my_hazard_if_any() else {
        return Some(general(ours()));
    };
    let Some((h, raw)) = pin(serial, hazard) else {
        return Some(general(ours()));
    };
    // SAFETY: pinned (see `pin`) until `unpin`.
    let hr = unsafe { &*h };
    Some(match hr.scheduler().release_raw_first_look(raw) {
        RawRelease::Released => {
            if unpin(hazard, hr) {
                return Some(swept(shmsched_status::Ok));
            }
            shmsched_status::Ok
        }
        RawRelease::Serve(serve) => served(serve, hazard, hr),
        RawRelease::NotHeld => {
            let closed = unpin(hazard, hr);
            not_held(ours(), closed)
        }
        RawRelease::Declined => {
            // Nothing done: the general path pins again.
            hazard.ptr.store(ptr::null_mut(), Ordering::Release);
            general(ours())
        }
    })
}

/// Sweeps (a release through a closed handle, see the module docs) and
/// answers `status`.
#[cold]
#[inline(never)]
fn swept(status: shmsched_status) -> shmsched_status {
    permits::with_pool(permits::sweep);
    status
}

/// The rest of a lean release whose freed cell must serve the queue:
/// serves (with `h` still pinned), unpins, sweeps if `h` is closed.
#[cold]
#[inline(never)]
fn served(serve: Serve<'_>, hazard: &Hazard, h: &shmsched_scheduler) -> shmsched_status {
    drop(serve);
    if unpin(hazard, h) {
        return swept(shmsched_status::Ok);
    }
    shmsched_status::Ok
}

/// The answer to a lean release whose token's cell does not hold it, once
/// unpinned (`closed`: sweep first), as [`release`] gives it.
#[cold]
#[inline(never)]
fn not_held(token: shmsched_permit, closed: bool) -> shmsched_status {
    if closed {
        permits::with_pool(permits::sweep);
    }
    permits::not_held(token).report()
}

/// Pins the handle that the cell token of `serial` (of this process) names
/// through its pin slot with this thread's `hazard` record (module docs,
/// steps 1-3): the handle, not freed until [`unpin`], and the raw permit;
/// or `None`, with nothing held, if the slot names none (or the token no
/// raw permit at all).
#[inline(always)]
fn pin(serial: u64, hazard: &Hazard) -> Option<(*mut shmsched_scheduler, RawPermit)> {
    let tag = NonZeroU32::new(serial as u32)?;
    let cell = (serial >> CELL_SHIFT) as u32 & 0xffff;
    let raw = RawPermit::from_parts(cell, serial & COUNTED_BIT != 0, tag)?;
    let slot = &SLOTS[(serial >> SLOT_SHIFT) as usize & (MAX_SLOTS - 1)];
    let h = slot.load(Ordering::Acquire);
    if h.is_null() {
        return None;
    }
    hazard.ptr.store(h, Ordering::Relaxed);
    // A full fence until membarrier is known to work: sound either way (a
    // sweep's heavy side is the syscall or a full fence of its own).
    if membarrier::known_available() {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
    if slot.load(Ordering::Acquire) != h {
        hazard.ptr.store(ptr::null_mut(), Ordering::Release);
        return None;
    }
    // `h` was published in its slot after our hazard store became visible
    // (the re-load above; see the module docs), so no sweep frees it until
    // the hazard is cleared ([`unpin`]).
    Some((h, raw))
}

/// Ends a [`pin`] once the release through `h` is done (module docs, step
/// 4): whether `h` is closed (then the caller sweeps), read before the
/// hazard is cleared.
#[inline(always)]
fn unpin(hazard: &Hazard, h: &shmsched_scheduler) -> bool {
    let closed = h.is_closed();
    hazard.ptr.store(ptr::null_mut(), Ordering::Release);
    closed
}

/// The failure of a cell token's release through its handle.
#[cold]
fn raw_failure(token: shmsched_permit, e: shmsched::Error) -> Fail {
    match e {
        shmsched::Error::AlreadyReleased { .. } => permits::not_held(token),
        e => Fail::from(e),
    }
}

/// Sweep step for a closed handle with a pin slot and nothing of the table
/// referring to it: unpublish it once no raw permit of this process is out
/// in its region. True if it was unpublished (now or before): it may be
/// freed once [`unpinned`] says no hazard holds it.
pub(crate) fn unpublish(h: *mut shmsched_scheduler) -> bool {
    // SAFETY: `h` is a parked handle, alive until the sweep frees it.
    let hr = unsafe { &*h };
    let slot = hr.pin_slot();
    if slot == NO_SLOT || hr.unpublished() {
        return true;
    }
    if hr.scheduler().raw_permits_held() > 0 {
        return false;
    }
    SLOTS[slot as usize].store(ptr::null_mut(), Ordering::SeqCst);
    hr.mark_unpublished();
    true
}

/// After one or more [`unpublish`]: the heavy side of the fence (every
/// thread's hazard store before it is visible after it). False if it could
/// not be done (then nothing may be freed on the strength of a hazard scan).
pub(crate) fn heavy_fence() -> bool {
    if membarrier::available() {
        membarrier::barrier()
    } else {
        fence(Ordering::SeqCst);
        true
    }
}

/// Whether an unpublished handle `h` may be freed: no thread's hazard holds
/// it (waiting briefly for one that does). Recycles its pin slot if so.
pub(crate) fn unpinned(p: &mut Pool, h: *mut shmsched_scheduler) -> bool {
    // SAFETY: as in `unpublish`.
    let slot = unsafe { (*h).pin_slot() };
    if slot != NO_SLOT {
        let mut spins = 0u32;
        while hazard_on(h) {
            spins += 1;
            if spins > 1000 {
                return false; // parked for the next sweep
            }
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        p.slots_free.push(slot);
    }
    true
}

/// Raw permits of this process in `h`'s region, for `detach`.
pub(crate) fn raw_outstanding(h: &shmsched_scheduler) -> u32 {
    if h.pin_slot() == NO_SLOT {
        0
    } else {
        h.scheduler().raw_permits_held()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler;
    use crate::status::shmsched_last_error_message;
    use shmsched::region::Region;
    use shmsched::Priority;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Barrier;

    /// A published shared root handle of a fresh region, and a second
    /// scheduler on that region to count with (it outlives the handle).
    fn root(max: u32) -> (*mut shmsched_scheduler, Scheduler) {
        let region = Region::anonymous().unwrap();
        let counter = Scheduler::shared(&region, max).unwrap();
        let h = Box::into_raw(Box::new(shmsched_scheduler::new(
            Scheduler::attach(&region).unwrap(),
        )));
        publish(h);
        (h, counter)
    }

    fn get(h: *mut shmsched_scheduler) -> Result<shmsched_permit, Fail> {
        // SAFETY: the tests keep `h` open while they acquire through it.
        acquire_with(unsafe { &*h }, |s| s.acquire(Priority::Normal))
    }

    fn status(r: Result<(), Fail>) -> shmsched_status {
        match r {
            Ok(()) => shmsched_status::Ok,
            Err(f) => f.status,
        }
    }

    fn parked(h: *mut shmsched_scheduler) -> bool {
        permits::with_pool(|p| p.closed_contains(h))
    }

    /// `shmsched_scheduler_acquire` (`try`: `_try_acquire`), which runs the
    /// lean path first.
    fn c_acquire(
        h: *const shmsched_scheduler,
        priority: i32,
        try_only: bool,
    ) -> (shmsched_status, shmsched_permit) {
        let mut out = shmsched_permit::default();
        // SAFETY: the tests pass NULL or an open handle, and a writable out.
        let st = unsafe {
            if try_only {
                scheduler::shmsched_scheduler_try_acquire(h, priority, &mut out)
            } else {
                scheduler::shmsched_scheduler_acquire(h, priority, &mut out)
            }
        };
        (st, out)
    }

    /// This thread's last error message.
    fn message() -> String {
        let mut buf = [0u8; 512];
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { shmsched_last_error_message(buf.as_mut_ptr().cast(), buf.len()) };
        String::from_utf8_lossy(&buf[..n.min(buf.len() - 1)]).into_owned()
    }

    /// Releases `t` through the C face (lean path first), wanting `want`,
    /// then again through the general path alone, which must answer what
    /// a second release answers (on a failure: the same status and
    /// message as the first).
    fn releases_alike(t: shmsched_permit, want: shmsched_status) {
        let lean = scheduler::shmsched_permit_release(t);
        let lean_msg = message();
        assert_eq!(lean, want, "{lean_msg}");
        match release(t) {
            Ok(()) => panic!("released twice"),
            Err(f) if lean == shmsched_status::Ok => {
                assert_eq!(f.status, shmsched_status::AlreadyReleased)
            }
            Err(f) => assert_eq!((f.status, f.message.into_owned()), (lean, lean_msg)),
        }
    }

    /// Tokens of the lean path and of the general one (a thread's tag
    /// instead of the cell's) name the same slot and cell, and each is
    /// released once, by either path, never freeing the other's cell.
    #[test]
    fn lean_and_general_cell_tokens_release_alike() {
        let (h, count) = root(1);
        let (st, lean) = c_acquire(h, 0, false);
        assert_eq!(st, shmsched_status::Ok);
        assert_ne!(lean.serial & CELL_TOKEN, 0, "a cell token");
        assert_eq!(lean.process, process::tag());
        assert_eq!(count.global_running(), 1);
        releases_alike(lean, shmsched_status::Ok);
        assert_eq!(count.global_running(), 0);
        releases_alike(lean, shmsched_status::AlreadyReleased);

        let general = get(h).unwrap();
        assert_eq!(general.serial >> CELL_SHIFT, lean.serial >> CELL_SHIFT);
        assert_ne!(general.serial as u32, lean.serial as u32, "another tag");
        releases_alike(lean, shmsched_status::AlreadyReleased);
        assert_eq!(
            count.global_running(),
            1,
            "the general token's cell is held"
        );
        assert_eq!(
            scheduler::shmsched_permit_release(general),
            shmsched_status::Ok
        );

        let (st, again) = c_acquire(h, 3, true);
        assert_eq!(st, shmsched_status::Ok);
        assert_eq!(again.serial >> CELL_SHIFT, lean.serial >> CELL_SHIFT);
        let next = NonZeroU32::new((lean.serial as u32).wrapping_add(1)).unwrap_or(NonZeroU32::MIN);
        assert_eq!(again.serial as u32, next.get(), "the cell's next tag");
        releases_alike(general, shmsched_status::AlreadyReleased);
        releases_alike(lean, shmsched_status::AlreadyReleased);
        assert_eq!(count.global_running(), 1);
        let (st, _) = c_acquire(h, 0, true);
        assert_eq!(st, shmsched_status::WouldBlock, "{}", message());
        releases_alike(again, shmsched_status::Ok);
        assert_eq!(count.global_running(), 0);
        // SAFETY: closed once; nothing held.
        unsafe { permits::retire(h) };
    }

    /// What the lean acquire does not answer, the general path answers,
    /// as it always did.
    #[test]
    fn lean_acquire_falls_back_with_the_general_status() {
        let (h, count) = root(2);
        let mut out = shmsched_permit::default();
        // SAFETY: NULL handle, writable out.
        let st = unsafe { scheduler::shmsched_scheduler_acquire(ptr::null(), 0, &mut out) };
        assert_eq!(st, shmsched_status::NullArgument);
        assert_eq!(message(), "argument `sched` is NULL");
        // SAFETY: an open handle, NULL out.
        let st = unsafe { scheduler::shmsched_scheduler_acquire(h, 0, ptr::null_mut()) };
        assert_eq!(st, shmsched_status::NullArgument);
        assert_eq!(message(), "argument `out` is NULL");
        for (p, want) in [
            (4, shmsched_status::InvalidPriority),
            (-4, shmsched_status::InvalidPriority),
        ] {
            let (st, t) = c_acquire(h, p, false);
            assert_eq!((st, t), (want, shmsched_permit::default()));
            assert!(message().contains(&p.to_string()), "{}", message());
        }
        assert_eq!(count.global_running(), 0);

        // A handle without a pin slot, and a child: table tokens.
        // SAFETY: `h` is open.
        let same = unsafe { &*h }.scheduler().clone();
        let unpinned = Box::into_raw(Box::new(shmsched_scheduler::new(same)));
        let (st, t) = c_acquire(unpinned, 0, false);
        assert_eq!(st, shmsched_status::Ok);
        assert_eq!(t.serial & CELL_TOKEN, 0, "no pin slot: the table");
        assert_eq!(scheduler::shmsched_permit_release(t), shmsched_status::Ok);
        let mut child = ptr::null_mut();
        // SAFETY: an open parent, a writable out.
        let st = unsafe { scheduler::shmsched_scheduler_child(h, 1, &mut child) };
        assert_eq!(st, shmsched_status::Ok);
        let (st, t) = c_acquire(child, 0, false);
        assert_eq!(st, shmsched_status::Ok);
        assert_eq!(t.serial & CELL_TOKEN, 0, "a child's permit: the table");
        assert_eq!(scheduler::shmsched_permit_release(t), shmsched_status::Ok);
        assert_eq!(count.global_running(), 0);

        // Disposed: DISPOSED, nothing taken.
        // SAFETY: an open handle.
        assert_eq!(
            unsafe { scheduler::shmsched_scheduler_dispose(h) },
            shmsched_status::Ok
        );
        for try_only in [false, true] {
            let (st, t) = c_acquire(h, 0, try_only);
            assert_eq!(
                (st, t),
                (shmsched_status::Disposed, shmsched_permit::default())
            );
        }
        assert_eq!(count.global_running(), 0);
        // SAFETY: closed once each; nothing held.
        unsafe {
            scheduler::shmsched_scheduler_close(child);
            permits::retire(unpinned);
            permits::retire(h);
        }

        // Max 0: ZERO_CONCURRENCY at once.
        let (z, _count) = root(0);
        for try_only in [false, true] {
            let (st, _) = c_acquire(z, 0, try_only);
            assert_eq!(st, shmsched_status::ZeroConcurrency, "{}", message());
        }
        // SAFETY: closed once; nothing held.
        unsafe { permits::retire(z) };
    }

    /// A thread's first release (no hazard record yet) goes the general
    /// way, which registers one; its later releases are lean. Both free
    /// the cell once.
    #[test]
    fn a_threads_first_release_registers_its_hazard_record() {
        let (h, count) = root(2);
        let (_, a) = c_acquire(h, 0, false);
        let (_, b) = c_acquire(h, 0, false);
        std::thread::spawn(move || {
            assert!(my_hazard_if_any().is_none(), "a new thread");
            assert_eq!(scheduler::shmsched_permit_release(a), shmsched_status::Ok);
            assert!(
                my_hazard_if_any().is_some(),
                "registered by the general path"
            );
            assert_eq!(
                scheduler::shmsched_permit_release(a),
                shmsched_status::AlreadyReleased
            );
            assert_eq!(scheduler::shmsched_permit_release(b), shmsched_status::Ok);
        })
        .join()
        .unwrap();
        assert_eq!(count.global_running(), 0);
        // SAFETY: closed once; nothing held.
        unsafe { permits::retire(h) };
    }

    /// A lean release whose freed cell must serve a waiter (the library's
    /// `Serve`) wakes it; one above a lowered ceiling (declined by the
    /// library's first look) goes the general way, which gives the cell to
    /// the ceiling. Each token is released once.
    #[test]
    fn lean_releases_serve_waiters_and_leave_a_ceiling_to_the_general_path() {
        let (h, count) = root(1);
        // Registers this thread's hazard record, so its releases are lean.
        let _ = my_hazard();
        let (_, a) = c_acquire(h, 0, false);
        let hp = h as usize;
        // SAFETY: `h` is open until the end of the test.
        let sched = unsafe { &*h }.scheduler();
        std::thread::scope(|s| {
            let w = s.spawn(move || c_acquire(hp as *const shmsched_scheduler, 1, false));
            while sched.stats().pending == 0 {
                std::thread::yield_now();
            }
            assert_eq!(scheduler::shmsched_permit_release(a), shmsched_status::Ok);
            let (st, t) = w.join().unwrap();
            assert_eq!(st, shmsched_status::Ok);
            assert_eq!(count.global_running(), 1, "the waiter holds the cell");
            assert_eq!(scheduler::shmsched_permit_release(t), shmsched_status::Ok);
        });
        releases_alike(a, shmsched_status::AlreadyReleased);
        assert_eq!(count.global_running(), 0);
        // SAFETY: closed once; nothing held.
        unsafe { permits::retire(h) };

        let (h, count) = root(2);
        let (_, a) = c_acquire(h, 0, false);
        let (_, b) = c_acquire(h, 0, false);
        assert!(!count.set_ceiling(1).unwrap(), "both held: not reached yet");
        releases_alike(a, shmsched_status::Ok);
        assert_eq!(count.ceiling(), 1, "a's cell went to the ceiling");
        assert_eq!(count.global_running(), 1);
        let (st, _) = c_acquire(h, 0, true);
        assert_eq!(st, shmsched_status::WouldBlock, "the ceiling is in use");
        releases_alike(b, shmsched_status::Ok);
        assert_eq!(count.global_running(), 0);
        count.set_ceiling(2).unwrap();
        // SAFETY: closed once; nothing held.
        unsafe { permits::retire(h) };
    }

    /// The lean release of a closed handle's last raw permit frees the
    /// handle, as the general one does.
    #[test]
    fn a_lean_release_after_close_frees_the_handle() {
        let (h, count) = root(3);
        let (_, a) = c_acquire(h, 0, false);
        let (_, b) = c_acquire(h, 0, false);
        // Registers this thread's hazard record, so the releases below are
        // lean.
        let _ = my_hazard();
        // SAFETY: closed once; a and b keep it parked.
        unsafe { permits::retire(h) };
        assert!(parked(h));
        assert_eq!(scheduler::shmsched_permit_release(a), shmsched_status::Ok);
        assert!(parked(h), "b still out");
        assert_eq!(scheduler::shmsched_permit_release(b), shmsched_status::Ok);
        assert!(!parked(h), "freed by the last release");
        assert_eq!(count.global_running(), 0);
        assert_eq!(
            scheduler::shmsched_permit_release(b),
            shmsched_status::AlreadyReleased
        );
    }

    #[test]
    fn one_cell_permits_are_cell_tokens_released_once() {
        let (h, count) = root(2);
        let t = get(h).unwrap();
        assert_ne!(t.serial & CELL_TOKEN, 0, "a cell token");
        assert_eq!(count.global_running(), 1);
        release(t).unwrap();
        assert_eq!(count.global_running(), 0);
        assert_eq!(status(release(t)), shmsched_status::AlreadyReleased);
        // The cell again, with another tag: the stale token frees nothing.
        let t2 = get(h).unwrap();
        let t3 = get(h).unwrap();
        assert_eq!(status(release(t)), shmsched_status::AlreadyReleased);
        assert_eq!(count.global_running(), 2);
        release(t2).unwrap();
        release(t3).unwrap();
        // Weighted: the table.
        // SAFETY: `h` is open.
        let many = acquire_with(unsafe { &*h }, |s| s.acquire_many(Priority::Normal, 2)).unwrap();
        assert_eq!(
            many.serial & CELL_TOKEN,
            0,
            "a weighted permit takes the table"
        );
        assert_eq!(count.global_running(), 2);
        release(many).unwrap();
        assert_eq!(status(release(many)), shmsched_status::AlreadyReleased);
        assert_eq!(count.global_running(), 0);
        // SAFETY: closed once; nothing held.
        unsafe { permits::retire(h) };
        assert!(!parked(h), "freed at once");
    }

    #[test]
    fn foreign_and_garbage_cell_tokens_free_nothing() {
        let (h, count) = root(4);
        let held = get(h).unwrap();
        let me = process::tag();
        let foreign = shmsched_permit {
            process: me ^ (1 << 40),
            serial: held.serial,
        };
        assert_eq!(status(release(foreign)), shmsched_status::ForeignPermit);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let serial = x | CELL_TOKEN;
            if serial == held.serial {
                continue;
            }
            let r = release(shmsched_permit {
                process: me,
                serial,
            });
            assert_eq!(status(r), shmsched_status::AlreadyReleased);
        }
        assert_eq!(count.global_running(), 1);
        release(held).unwrap();
        assert_eq!(count.global_running(), 0);
        // SAFETY: closed once; nothing held.
        unsafe { permits::retire(h) };
    }

    #[test]
    fn racing_releases_of_one_token_free_it_once() {
        let (h, count) = root(1);
        let hp = h as usize;
        let barrier = Barrier::new(3);
        for _ in 0..200 {
            let t = get(h).unwrap();
            let wins = AtomicUsize::new(0);
            let third = std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        barrier.wait();
                        if release(t).is_ok() {
                            wins.fetch_add(1, Ordering::SeqCst);
                        }
                    });
                }
                s.spawn(|| {
                    barrier.wait();
                    get(hp as *mut shmsched_scheduler).unwrap()
                })
                .join()
                .unwrap()
            });
            assert_eq!(wins.load(Ordering::SeqCst), 1);
            assert_eq!(count.global_running(), 1, "the third's cell is held");
            assert_eq!(status(release(t)), shmsched_status::AlreadyReleased);
            release(third).unwrap();
            assert_eq!(count.global_running(), 0);
        }
        // SAFETY: closed once; nothing held.
        unsafe { permits::retire(h) };
    }

    #[test]
    fn a_permit_released_after_close_frees_its_cell_then_the_handle() {
        let (h, count) = root(3);
        let a = get(h).unwrap();
        let b = get(h).unwrap();
        // SAFETY: closed once; a and b keep it parked.
        unsafe { permits::retire(h) };
        assert!(parked(h));
        release(a).unwrap();
        assert!(parked(h), "b still out");
        assert_eq!(count.global_running(), 1);
        release(b).unwrap();
        assert!(!parked(h), "freed by the last release");
        assert_eq!(count.global_running(), 0);
        assert_eq!(status(release(b)), shmsched_status::AlreadyReleased);
    }

    /// Raw permits are counted per region and process, not per handle: a
    /// closed handle stays parked while another handle of this process on
    /// its region has one-slot permits out, and the next sweep after they
    /// are released frees it (a delay, never a use after free).
    #[test]
    fn a_closed_handle_waits_for_the_one_slot_permits_of_its_region() {
        let region = Region::anonymous().unwrap();
        let count = Scheduler::shared(&region, 4).unwrap();
        let open = |r: &Region| {
            let h = Box::into_raw(Box::new(shmsched_scheduler::new(
                Scheduler::attach(r).unwrap(),
            )));
            publish(h);
            h
        };
        let (h1, h2) = (open(&region), open(&region));
        let other = get(h2).unwrap();
        // SAFETY: closed once; nothing held through it.
        unsafe { permits::retire(h1) };
        assert!(parked(h1), "a one-slot permit of its region is out");
        release(other).unwrap();
        assert_eq!(count.global_running(), 0);
        // SAFETY: closed once; nothing held. Its sweep frees both.
        unsafe { permits::retire(h2) };
        assert!(!parked(h1) && !parked(h2));
    }

    #[test]
    fn max_65536_round_trips_cell_65535() {
        let (h, count) = root(shmsched::scheduler::MAX_SHARED_SLOTS);
        let ts: Vec<_> = (0..shmsched::scheduler::MAX_SHARED_SLOTS)
            .map(|_| get(h).unwrap())
            .collect();
        let cell = |t: &shmsched_permit| (t.serial >> CELL_SHIFT) as u32 & 0xffff;
        let last = ts.iter().find(|t| cell(t) == 65_535).expect("cell 65535");
        assert_ne!(last.serial & CELL_TOKEN, 0);
        release(*last).unwrap();
        assert_eq!(status(release(*last)), shmsched_status::AlreadyReleased);
        for t in &ts {
            if cell(t) != 65_535 {
                release(*t).unwrap();
            }
        }
        assert_eq!(count.global_running(), 0);
        // SAFETY: closed once; nothing held.
        unsafe { permits::retire(h) };
    }

    /// Stale tokens (released ones, and ones of closed handles) released
    /// over and over by two threads while a third opens handles, takes and
    /// gives back permits and closes them: never a crash, never a wrong
    /// free (every permit the third holds is held throughout), and the
    /// count exact at the end. Bounded by iterations.
    #[test]
    fn stale_releases_race_close_and_reopen() {
        let region = Region::anonymous().unwrap();
        let count = Scheduler::shared(&region, 4).unwrap();
        let stale = std::sync::Mutex::new(Vec::<shmsched_permit>::new());
        let done = AtomicBool::new(false);
        let wrong = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let mut i = 0usize;
                    while !done.load(Ordering::Relaxed) {
                        let t = stale.lock().unwrap().get(i).copied();
                        i = i.wrapping_add(7);
                        if let Some(t) = t {
                            if release(t).is_ok() {
                                wrong.fetch_add(1, Ordering::SeqCst);
                            }
                        } else {
                            i = 0;
                            std::thread::yield_now();
                        }
                    }
                });
            }
            s.spawn(|| {
                for round in 0..2000 {
                    let h = Box::into_raw(Box::new(shmsched_scheduler::new(
                        Scheduler::attach(&region).unwrap(),
                    )));
                    publish(h);
                    let held: Vec<_> = (0..3).map(|_| get(h).unwrap()).collect();
                    assert_eq!(count.global_running(), 3, "round {round}");
                    let keep = held[round % 3];
                    for t in &held {
                        if *t != keep {
                            release(*t).unwrap();
                        }
                    }
                    if round % 2 == 0 {
                        // Closed with a permit out: released after.
                        // SAFETY: closed once; `keep` keeps it parked.
                        unsafe { permits::retire(h) };
                        release(keep).unwrap();
                    } else {
                        release(keep).unwrap();
                        // SAFETY: closed once; nothing held.
                        unsafe { permits::retire(h) };
                    }
                    let mut st = stale.lock().unwrap();
                    st.extend(held);
                    let n = st.len();
                    if n > 256 {
                        st.drain(..n - 256);
                    }
                }
                done.store(true, Ordering::Relaxed);
            });
        });
        assert_eq!(
            wrong.load(Ordering::SeqCst),
            0,
            "a stale token was released"
        );
        assert_eq!(count.global_running(), 0);
        assert_eq!(count.raw_permits_held(), 0);
    }
}
