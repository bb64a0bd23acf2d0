//! Cell tokens: a one-cell permit of a shared root scheduler handed to C
//! as its region cell and a tag, so that releasing it needs no table entry
//! and no claiming CAS. The cell's own give-back CAS is the check against a
//! double, stale, forged or foreign release (see *Raw permits* in the
//! library's `scheduler/shared.rs`, and [`Permit::into_raw`]); what this
//! module adds is finding the region binding the token was taken in
//! without a read-modify-write, safely against it being freed.
//!
//! # The token
//!
//! `shmsched_permit {process, serial}` as for table permits
//! ([`crate::permits`]); `serial` bit 63 tells them apart. A cell token has
//! bit 63 set, then the *pin slot* of the handle's pin target (bits
//! 62..49, 14 bits; below), the cell's counted bit (48), the cell (47..32,
//! up to 65,536 cells) and the tag (31..0, never 0). A table token has bit
//! 63 clear.
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
//!   a handle without a pin slot: past [`MAX_SLOTS`] targets) takes the
//!   table path.
//! - **Release**: the process tag is checked as for a table token
//!   (`ForeignPermit`); the pin target is found through its slot, *pinned*
//!   (below) and the library's raw release runs through its
//!   [`RawReleaser`]: its give-back CAS frees the cell only if the cell
//!   still holds `tag | owner | counted`. The lean path ([`release_now`])
//!   does it for a cell token of this process whose slot names a target,
//!   on a thread that has a hazard record, through the library's first
//!   look ([`RawReleaser::release_raw_first_look`], which leaves serving
//!   the queue to a `Serve` the lean path drops while still pinned, and
//!   declines above a lowered ceiling); anything else goes the general
//!   way, [`release`] ([`RawReleaser::release_raw`]). A stale token can
//!   only match a later permit of this process on the same cell with the
//!   very same tag: a lean tag repeats on its cell only after 2^32 − 1
//!   lean takes of that cell, and a thread's tag only after 2^32 of its
//!   own; a tag of one kind, or of another binding (a recycled slot), meets
//!   one of the other by chance (one in 2^32 per reuse, the level of a
//!   table entry's generation).
//! - **Why first looks.** A locked instruction waits for every earlier
//!   store to leave the store buffer, and the registers a function saves
//!   on entry are stores. The lean paths are written so that nothing of
//!   their frame is live across a call on the common path (everything
//!   rarer finishes in a function of its own, called last with what it
//!   needs), so the exported functions save at most one or two registers
//!   before their CAS instead of six (measured in `benches/RESULTS.md`).
//!
//! # Pin targets
//!
//! Releasing a cell token needs the region binding it was taken in, not
//! the handle: the library's [`RawReleaser`], the shared root that every
//! handle of this process on that binding shares. So a pin slot names a
//! [`PinTarget`], one per binding: the releaser, `open` (the open handles
//! using it) and whether its slot still names it, those two written under
//! the pool lock of [`crate::permits`]. [`publish`] gives a new shared
//! root handle the published target of its binding if there is one
//! (`open` + 1), else a new target with a new slot; the handle keeps a copy
//! of the slot for the lean acquire. Closing a handle
//! ([`permits::retire`]) takes one from its target's `open`; the handle
//! itself then waits only for its table entries (weighted and child
//! permits), never for cell tokens, which need only the target. A target
//! whose `open` is 0 is freed by a sweep once no raw permit of this
//! process is out in its binding (below). So at most one target (one pin
//! slot) is in use per binding with an open handle or a raw permit out,
//! plus targets unpublished but not freed yet (a hazard held them at a
//! sweep): handles opened and closed beside a handle whose one-slot
//! permits are always out share its target and park nothing, and a token
//! of a closed handle is released through the target while the binding
//! has another open handle or raw permit.
//!
//! # The pin: an asymmetric-fence hazard pointer
//!
//! `SLOTS[s]` holds the target of pin slot `s` (null when none). Each
//! thread that releases owns one hazard record (registered once in a
//! global list, recycled at thread exit). A release does:
//!
//! 1. `t = SLOTS[s]` (Acquire); null: `AlreadyReleased`;
//! 2. `hazard = t` (a plain atomic store), then a compiler fence (a full
//!    fence until membarrier is known to work, see below);
//! 3. `SLOTS[s]` again: changed, clear the hazard, `AlreadyReleased`;
//! 4. the raw release through `t`; read `t.open` (SeqCst); clear the hazard
//!    (Release); if `open` was 0, sweep (under the pool lock, below).
//!
//! A target is freed only by a sweep (under the pool lock), and only when
//! its `open` is 0: (a) if its slot still names it, the raw permits of
//! this process in its binding are counted
//! ([`RawReleaser::raw_permits_held`]); any: it stays as it is; none: it is
//! unpublished (`SLOTS[s] = null`, SeqCst) and marked so; (b)
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` runs a full barrier on
//! every running thread of the process; (c) every hazard record is read;
//! one holding `t` is waited for briefly (a release holds it for
//! nanoseconds); if it stays, `t` stays unpublished for the next sweep (a
//! delay, never a use after free); (d) otherwise `t` is freed and its slot
//! recycled. A target is published once, under the pool lock, before any
//! token names it, and never again once unpublished: [`publish`] shares
//! only a target whose slot still names it.
//!
//! **Why each interleaving is safe.** The releaser's step 2 store and step
//! 3 load, against the sweep's unpublishing store (a) and hazard loads
//! (c), is Dekker's handshake; the releaser's side has only a compiler
//! fence, and the membarrier (b) supplies the CPU barrier on its behalf:
//! on the releaser's CPU a full barrier runs at some point during the
//! call. If the releaser's hazard store came before that barrier, it is
//! visible to the sweep's hazard loads (which come after the call
//! returns): the sweep sees `t` and does not free it until the releaser
//! clears it (Release, after its last use of `t`; the sweep's loads are
//! Acquire). If the store came after the barrier, the releaser's step 3
//! load comes after it too, so after the unpublishing store (made before
//! the call): it reads null (the releaser backs off without touching `t`)
//! or a target published later. That one may sit at `t`'s address only if
//! `t` was freed meanwhile; the releaser then holds a hazard on the new
//! target, stored before its step 3 load saw the target published, which
//! is interleaving one for that target's own sweep (it is unpublished
//! after that load, so its membarrier comes after the hazard store): the
//! new target is pinned, and the token is released through it as any
//! stale token of a recycled slot is (the give-back CAS decides; its cell
//! would have to hold the very tag). A release whose step 1 comes after
//! (a) reads null or a later target, the same case.
//!
//! Why a pinned release of a live raw permit never finds its target
//! unpublished: a raw permit is taken only through an open handle (while
//! its target's `open` is above 0, so no sweep touches the target), and
//! while it is held the count (a) reads its cell (a cell records its owner
//! and tag, so the count is per binding and process: raw permits taken
//! through every handle of the binding keep its one published target).
//! Why an idle target is swept: a release that read `open` 0 sweeps
//! itself after clearing its hazard, so the last raw permit of an idle
//! target frees it. A release that read `open` above 0 just before the
//! last handle closed leaves the sweep to that close: the release's cell
//! CAS and `open` load and the close's decrement and cell loads are all
//! SeqCst, one total order, so either the release reads 0 or the close's
//! count finds the cell free (on x86 the CAS and the decrement are locked
//! instructions, the loads plain ones). A handle opened on an idle target
//! whose slot still names it takes it back (`open` 1), cancelling the
//! sweep.
//!
//! Where membarrier is unavailable (an old kernel, a seccomp filter;
//! decided once per process, before the first target is published)
//! releasers use a SeqCst fence instead of the compiler fence and the
//! sweep a SeqCst fence instead of the syscall: sound, one fence slower. A
//! releaser that finds it not decided yet (only possible in a forked
//! child, whose decision starts over) takes the SeqCst fence too: a full
//! fence on the releaser's side is sound against either heavy side.
//!
//! # Detach
//!
//! A handle's target keeps its binding (and so the process's entry in
//! the region's process table) alive, as another handle would, so the
//! library's detach would refuse. `shmsched_scheduler_detach` of a
//! target's last open handle, with no raw permit out, first frees the
//! target as a sweep would (unpublish, heavy fence, hazard scan:
//! [`detach_target`]); with other open handles on the target the handle
//! just leaves it, and the library refuses as it always did.
//!
//! # Fork
//!
//! A child gets a new process tag, so its parent's tokens are foreign
//! (checked before the slot is read), and its own handles bind afresh
//! (a new shared root, so new targets: a parent's target never names a
//! child's binding). The child handler clears every hazard record (no
//! thread of the child is inside a release: `fork` is not called from
//! one) and frees the records of the parent's other threads, and makes
//! the child decide about membarrier afresh. The slot table and its free
//! list are the pool's (see [`crate::permits`]).

use std::cell::Cell;
use std::num::NonZeroU32;
use std::ptr;
use std::sync::atomic::{compiler_fence, fence, AtomicBool, AtomicPtr, AtomicU32, Ordering};

use shmsched::scheduler::{Permit, RawPermit, RawRelease, RawReleaser, Scheduler, Serve};
use shmsched::sys::membarrier;

use crate::face::{self, Handle};
use crate::permits::{self, shmsched_permit, Pool};
use crate::process;
use crate::scheduler::shmsched_scheduler;
use crate::status::{shmsched_status, Fail};

/// Pin slots: at most this many pin targets (region bindings) at once
/// have cell tokens (handles of later ones use the table).
pub(crate) const MAX_SLOTS: usize = 1 << 14;

/// A handle's pin slot when it has none.
pub(crate) const NO_SLOT: u32 = u32::MAX;

const CELL_TOKEN: u64 = 1 << 63;
const SLOT_SHIFT: u32 = 49;
const COUNTED_BIT: u64 = 1 << 48;
const CELL_SHIFT: u32 = 32;

/// The target of each pin slot, or null. Written under the pool lock
/// (publish, unpublish); read by releases without a lock.
static SLOTS: [AtomicPtr<PinTarget>; MAX_SLOTS] =
    [const { AtomicPtr::new(ptr::null_mut()) }; MAX_SLOTS];

/// What a pin slot names: one region binding of this process (see *Pin
/// targets* in the module docs). Made by [`publish`], freed by a sweep
/// ([`sweep_targets`]) or by [`detach_target`], both under the pool lock;
/// a release reaches it through its slot, pinned.
pub(crate) struct PinTarget {
    /// The binding's raw release (all a cell token's release needs).
    releaser: RawReleaser,
    /// The open handles using it. Changed under the pool lock (SeqCst
    /// RMWs); read by releases (SeqCst: see the module docs) to know
    /// whether they may have to sweep.
    open: AtomicU32,
    /// Its pin slot, for life (recycled once it is freed).
    slot: u32,
    /// Set under the pool lock once its slot no longer names it (then
    /// never published again); read under the lock.
    unpublished: AtomicBool,
}

/// One thread's hazard pointer: the target it is releasing through (null
/// when none). Records are allocated once, never freed, and linked into
/// [`HAZARDS`]; a thread takes a free one (or a new one) on its first
/// release and gives it back at exit.
struct Hazard {
    ptr: AtomicPtr<PinTarget>,
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
fn hazard_on(h: *mut PinTarget) -> bool {
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

/// Gives `h` (a new shared root handle, not yet shared with any thread) the
/// pin target of its region binding: the published one if there is one,
/// else a new one with a pin slot, if one is free. Its one-cell permits
/// then become cell tokens.
pub(crate) fn publish(h: *mut shmsched_scheduler) {
    // Decide about membarrier before the first token exists (releases read
    // the answer without deciding).
    let _ = membarrier::available();
    // SAFETY: `h` is live and not yet shared (the contract).
    let hr = unsafe { &*h };
    let Some(releaser) = hr.scheduler().raw_releaser() else {
        return;
    };
    permits::with_pool(|p| {
        let published = p.targets.iter().copied().find(|&t| {
            // SAFETY: the pool's targets are alive while listed (freed
            // only under the lock, after they leave the list).
            let t = unsafe { &*t };
            !t.unpublished.load(Ordering::Relaxed) && t.releaser.same_root(hr.scheduler())
        });
        let t = match published {
            Some(t) => t,
            None => {
                let slot = match p.slots_free.pop() {
                    Some(s) => s,
                    None if (p.slots_next as usize) < MAX_SLOTS => {
                        p.slots_next += 1;
                        p.slots_next - 1
                    }
                    None => return,
                };
                let t = Box::into_raw(Box::new(PinTarget {
                    releaser,
                    open: AtomicU32::new(0),
                    slot,
                    unpublished: AtomicBool::new(false),
                }));
                p.targets.push(t);
                SLOTS[slot as usize].store(t, Ordering::Release);
                t
            }
        };
        // SAFETY: listed, so alive (as above).
        let tr = unsafe { &*t };
        tr.open.fetch_add(1, Ordering::SeqCst);
        hr.set_target(t, tr.slot);
    });
}

/// Takes the handle `h`, being closed (or detached), off its pin target,
/// under the pool lock, before the sweep that may free the target.
pub(crate) fn leave(h: &shmsched_scheduler) {
    let t = h.target();
    if !t.is_null() {
        // SAFETY: an open handle's target is alive (its `open` counts it,
        // so no sweep frees it).
        unsafe { &*t }.open.fetch_sub(1, Ordering::SeqCst);
        h.clear_target();
    }
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
    let Some((t, raw)) = pin(token.serial, hazard) else {
        return Err(permits::not_held(token));
    };
    // SAFETY: pinned (see `pin`) until `unpin`.
    let tr = unsafe { &*t };
    let r = tr.releaser.release_raw(raw);
    if unpin(hazard, tr) {
        permits::with_pool(permits::sweep);
    }
    r.map_err(|e| raw_failure(token, e))
}

/// The lean path of `shmsched_permit_release` (see [`crate::face::lean`]):
/// a cell token of this process whose pin slot names a target, on a
/// thread that has a hazard record, released through the library's first
/// look ([`RawReleaser::release_raw_first_look`]) and answered exactly as
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
    let Some((t, raw)) = pin(serial, hazard) else {
        return Some(general(ours()));
    };
    // SAFETY: pinned (see `pin`) until `unpin`.
    let tr = unsafe { &*t };
    Some(match tr.releaser.release_raw_first_look(raw) {
        RawRelease::Released => {
            if unpin(hazard, tr) {
                return Some(swept(shmsched_status::Ok));
            }
            shmsched_status::Ok
        }
        RawRelease::Serve(serve) => served(serve, hazard, tr),
        RawRelease::NotHeld => {
            let idle = unpin(hazard, tr);
            not_held(ours(), idle)
        }
        RawRelease::Declined => {
            // Nothing done: the general path pins again.
            hazard.ptr.store(ptr::null_mut(), Ordering::Release);
            general(ours())
        }
    })
}

/// Sweeps (a release through a target without an open handle, see the
/// module docs) and answers `status`.
#[cold]
#[inline(never)]
fn swept(status: shmsched_status) -> shmsched_status {
    permits::with_pool(permits::sweep);
    status
}

/// The rest of a lean release whose freed cell must serve the queue:
/// serves (with `t` still pinned), unpins, sweeps if `t` has no open
/// handle.
#[cold]
#[inline(never)]
fn served(serve: Serve<'_>, hazard: &Hazard, t: &PinTarget) -> shmsched_status {
    drop(serve);
    if unpin(hazard, t) {
        return swept(shmsched_status::Ok);
    }
    shmsched_status::Ok
}

/// The answer to a lean release whose token's cell does not hold it, once
/// unpinned (`idle`: its target has no open handle, sweep first), as
/// [`release`] gives it.
#[cold]
#[inline(never)]
fn not_held(token: shmsched_permit, idle: bool) -> shmsched_status {
    if idle {
        permits::with_pool(permits::sweep);
    }
    permits::not_held(token).report()
}

/// Pins the target that the cell token of `serial` (of this process)
/// names through its pin slot with this thread's `hazard` record (module
/// docs, steps 1-3): the target, not freed until [`unpin`], and the raw
/// permit; or `None`, with nothing held, if the slot names none (or the
/// token no raw permit at all).
#[inline(always)]
fn pin(serial: u64, hazard: &Hazard) -> Option<(*mut PinTarget, RawPermit)> {
    let tag = NonZeroU32::new(serial as u32)?;
    let cell = (serial >> CELL_SHIFT) as u32 & 0xffff;
    let raw = RawPermit::from_parts(cell, serial & COUNTED_BIT != 0, tag)?;
    let slot = &SLOTS[(serial >> SLOT_SHIFT) as usize & (MAX_SLOTS - 1)];
    let t = slot.load(Ordering::Acquire);
    if t.is_null() {
        return None;
    }
    hazard.ptr.store(t, Ordering::Relaxed);
    // A full fence until membarrier is known to work: sound either way (a
    // sweep's heavy side is the syscall or a full fence of its own).
    if membarrier::known_available() {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
    if slot.load(Ordering::Acquire) != t {
        hazard.ptr.store(ptr::null_mut(), Ordering::Release);
        return None;
    }
    // `t` was published in its slot after our hazard store became visible
    // (the re-load above; see the module docs), so no sweep frees it until
    // the hazard is cleared ([`unpin`]).
    Some((t, raw))
}

/// Ends a [`pin`] once the release through `t` is done (module docs, step
/// 4): whether `t` has no open handle (then the caller sweeps), read
/// before the hazard is cleared. SeqCst, against the last close's
/// decrement and count (module docs); a plain load on x86.
#[inline(always)]
fn unpin(hazard: &Hazard, t: &PinTarget) -> bool {
    let idle = t.open.load(Ordering::SeqCst) == 0;
    hazard.ptr.store(ptr::null_mut(), Ordering::Release);
    idle
}

/// The failure of a cell token's release through its target.
#[cold]
fn raw_failure(token: shmsched_permit, e: shmsched::Error) -> Fail {
    match e {
        shmsched::Error::AlreadyReleased { .. } => permits::not_held(token),
        e => Fail::from(e),
    }
}

/// The targets' part of a sweep (module docs, (a) to (d)): frees every
/// target without an open handle that no cell token can reach any more
/// (unpublished once no raw permit of this process is out in its binding,
/// then no hazard pointer on it after the heavy fence), recycling its
/// slot. What cannot be freed yet stays listed for a later sweep.
pub(crate) fn sweep_targets(p: &mut Pool) {
    let candidates: Vec<*mut PinTarget> = p
        .targets
        .iter()
        .copied()
        // SAFETY: listed targets are alive (freed only below, unlisted
        // first, under the lock we hold).
        .filter(|&t| unpublish(unsafe { &*t }))
        .collect();
    if candidates.is_empty() || !heavy_fence() {
        return; // nothing to free, or nothing proven: they stay listed
    }
    for t in candidates {
        if unpinned(t) {
            free(p, t);
        }
    }
}

/// Sweep step (a) for `t`: true if it has no open handle and is
/// unpublished (now, or before), so that it may be freed once no hazard
/// holds it.
fn unpublish(t: &PinTarget) -> bool {
    if t.open.load(Ordering::SeqCst) != 0 {
        return false;
    }
    if t.unpublished.load(Ordering::Relaxed) {
        return true;
    }
    if t.releaser.raw_permits_held() > 0 {
        return false;
    }
    SLOTS[t.slot as usize].store(ptr::null_mut(), Ordering::SeqCst);
    t.unpublished.store(true, Ordering::Relaxed);
    true
}

/// After one or more [`unpublish`]: the heavy side of the fence (every
/// thread's hazard store before it is visible after it). False if it could
/// not be done (then nothing may be freed on the strength of a hazard scan).
fn heavy_fence() -> bool {
    if membarrier::available() {
        membarrier::barrier()
    } else {
        fence(Ordering::SeqCst);
        true
    }
}

/// Whether an unpublished target `t` may be freed: no thread's hazard holds
/// it (waiting briefly for one that does).
fn unpinned(t: *mut PinTarget) -> bool {
    let mut spins = 0u32;
    while hazard_on(t) {
        spins += 1;
        if spins > 1000 {
            return false; // kept for the next sweep
        }
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
    true
}

/// Frees the unpublished, unpinned target `t` and recycles its slot.
fn free(p: &mut Pool, t: *mut PinTarget) {
    p.targets.retain(|&x| x != t);
    // SAFETY: `t` came from Box::into_raw in `publish`; no open handle uses
    // it, no slot names it and no hazard pointer holds it after the heavy
    // fence (module docs), so no release can reach it; it was unlisted
    // above, under the lock, so it is freed once.
    let t = unsafe { Box::from_raw(t) };
    p.slots_free.push(t.slot);
}

/// Takes the open handle `h`, being detached, off its pin target, under
/// the pool lock (module docs, *Detach*): if it is the target's last open
/// handle, the target is unpublished and freed first, so that the
/// binding it keeps does not refuse the detach. False, with the handle
/// still on its target, if a raw permit of this process is out in the
/// binding or a release through the target stays under way: then the
/// handle must be retired (closed) instead, and a sweep frees the target.
pub(crate) fn detach_target(p: &mut Pool, h: &shmsched_scheduler) -> bool {
    let t = h.target();
    if t.is_null() {
        return true;
    }
    // SAFETY: an open handle's target is alive (as in `leave`).
    let tr = unsafe { &*t };
    if tr.open.load(Ordering::SeqCst) > 1 {
        leave(h); // others use it: the library's detach decides
        return true;
    }
    if !tr.unpublished.load(Ordering::Relaxed) {
        if tr.releaser.raw_permits_held() > 0 {
            return false;
        }
        SLOTS[tr.slot as usize].store(ptr::null_mut(), Ordering::SeqCst);
        tr.unpublished.store(true, Ordering::Relaxed);
    }
    if !heavy_fence() {
        return false;
    }
    let free_now = (0..100).any(|_| {
        let done = unpinned(t);
        if !done {
            std::thread::yield_now();
        }
        done
    });
    if !free_now {
        return false;
    }
    leave(h);
    free(p, t);
    true
}

/// Raw permits of this process in `h`'s region binding, for `detach`.
pub(crate) fn raw_outstanding(h: &shmsched_scheduler) -> u32 {
    if h.pin_slot() == NO_SLOT {
        0
    } else {
        h.scheduler().raw_permits_held()
    }
}

/// Pin targets of `sched`'s region binding (tests): each holds a pin
/// slot until it is freed.
#[cfg(test)]
pub(crate) fn targets_of(p: &Pool, sched: &Scheduler) -> usize {
    p.targets
        .iter()
        // SAFETY: listed targets are alive (the pool lock is held).
        .filter(|&&t| unsafe { &*t }.releaser.same_root(sched))
        .count()
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

    /// Pin targets (so pin slots) in use by `sched`'s binding.
    fn targets(sched: &Scheduler) -> usize {
        permits::with_pool(|p| p.pin_slots_of(sched))
    }

    /// A published shared root handle on `region`.
    fn open(region: &Region) -> *mut shmsched_scheduler {
        let h = Box::into_raw(Box::new(shmsched_scheduler::new(
            Scheduler::attach(region).unwrap(),
        )));
        publish(h);
        h
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

    /// A closed handle is freed at once though its cell tokens are out:
    /// they need only its pin target, which the lean release of the last
    /// of them frees, as the general one does.
    #[test]
    fn a_lean_release_after_close_frees_the_target() {
        let (h, count) = root(3);
        let (_, a) = c_acquire(h, 0, false);
        let (_, b) = c_acquire(h, 0, false);
        // Registers this thread's hazard record, so the releases below are
        // lean.
        let _ = my_hazard();
        // SAFETY: closed once; a and b are released below.
        unsafe { permits::retire(h) };
        assert!(!parked(h), "no table entry: freed at once");
        assert_eq!(targets(&count), 1, "a and b keep the target");
        assert_eq!(scheduler::shmsched_permit_release(a), shmsched_status::Ok);
        assert_eq!(targets(&count), 1, "b still out");
        assert_eq!(scheduler::shmsched_permit_release(b), shmsched_status::Ok);
        assert_eq!(targets(&count), 0, "freed by the last release");
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

    /// Handles of one binding share one pin target: a token taken through
    /// a handle that was closed is released through the target (OK, cell
    /// freed) while another handle is open, and after the last handle is
    /// closed, until the last raw permit is released; then the target is
    /// freed, its slot recycled, and a stale token answers
    /// ALREADY_RELEASED, also once a new target of the binding exists.
    #[test]
    fn a_token_of_a_closed_handle_is_released_through_its_target() {
        let region = Region::anonymous().unwrap();
        let count = Scheduler::shared(&region, 4).unwrap();
        let (h1, h2) = (open(&region), open(&region));
        // SAFETY: open handles.
        let slot = unsafe { (*h1).pin_slot() };
        assert_ne!(slot, NO_SLOT);
        // SAFETY: open handles.
        assert_eq!(unsafe { (*h2).pin_slot() }, slot, "one target");
        // SAFETY: open.
        let t = unsafe { (*h1).target() };
        assert_eq!(targets(&count), 1);
        let a = get(h1).unwrap();
        let (_, lean) = c_acquire(h1, 0, false);
        assert_eq!((a.serial >> SLOT_SHIFT) as u32 & 0x3fff, slot);
        // SAFETY: closed once; its tokens need only the target.
        unsafe { permits::retire(h1) };
        assert!(!parked(h1), "freed at once");
        assert_eq!(status(release(a)), shmsched_status::Ok);
        assert_eq!(status(release(a)), shmsched_status::AlreadyReleased);
        releases_alike(lean, shmsched_status::Ok);
        assert_eq!(count.global_running(), 0);
        assert_eq!(targets(&count), 1, "h2 uses it");

        let b = get(h2).unwrap();
        // SAFETY: closed once; b is released below.
        unsafe { permits::retire(h2) };
        assert!(!parked(h2));
        assert_eq!(targets(&count), 1, "b keeps it");
        assert_eq!(SLOTS[slot as usize].load(Ordering::Acquire), t, "published");
        release(b).unwrap();
        assert_eq!(count.global_running(), 0);
        let recycled = permits::with_pool(|p| {
            let named = SLOTS[slot as usize].load(Ordering::Acquire);
            (p.slots_free.contains(&slot) || !named.is_null()) && named != t
        });
        assert!(
            recycled,
            "the target freed by the last release, its slot recycled"
        );
        assert_eq!(targets(&count), 0);
        assert_eq!(status(release(b)), shmsched_status::AlreadyReleased);
        // A new target of the binding (perhaps in the same slot): the stale
        // tokens still free nothing.
        let h3 = open(&region);
        let c = get(h3).unwrap();
        for stale in [a, b, lean] {
            releases_alike(stale, shmsched_status::AlreadyReleased);
        }
        assert_eq!(count.global_running(), 1);
        release(c).unwrap();
        // SAFETY: closed once; nothing held.
        unsafe { permits::retire(h3) };
        assert_eq!(targets(&count), 0);
    }

    /// Handles of two regions, or of two bindings of one region (the
    /// region opened twice), never share a pin target: each token is
    /// released in its own binding, and one binding's target outlives
    /// another's.
    #[test]
    fn two_regions_never_share_a_target() {
        let (ra, rb) = (Region::anonymous().unwrap(), Region::anonymous().unwrap());
        let ca = Scheduler::shared(&ra, 2).unwrap();
        let cb = Scheduler::shared(&rb, 2).unwrap();
        let ra2 = Region::from_fd(ra.as_fd().try_clone_to_owned().unwrap()).unwrap();
        let ca2 = Scheduler::attach(&ra2).unwrap();
        let (ha, hb, ha2) = (open(&ra), open(&rb), open(&ra2));
        // SAFETY: open handles.
        let slots = unsafe { [(*ha).pin_slot(), (*hb).pin_slot(), (*ha2).pin_slot()] };
        assert!(slots[0] != slots[1] && slots[0] != slots[2] && slots[1] != slots[2]);
        assert_eq!((targets(&ca), targets(&cb), targets(&ca2)), (1, 1, 1));
        let (a, b, a2) = (get(ha).unwrap(), get(hb).unwrap(), get(ha2).unwrap());
        assert_eq!(ca.global_running(), 2, "a and a2: one region");
        assert_eq!(cb.global_running(), 1);
        // SAFETY: closed once each; their tokens are released below.
        unsafe {
            permits::retire(ha);
            permits::retire(hb);
        }
        release(b).unwrap();
        assert_eq!(targets(&cb), 0, "b's target freed");
        assert_eq!((targets(&ca), targets(&ca2)), (1, 1), "the others live");
        assert_eq!(cb.global_running(), 0);
        assert_eq!(ca.global_running(), 2);
        release(a).unwrap();
        assert_eq!((targets(&ca), targets(&ca2)), (0, 1));
        release(a2).unwrap();
        assert_eq!(ca.global_running(), 0);
        // SAFETY: closed once; nothing held.
        unsafe { permits::retire(ha2) };
        assert_eq!(targets(&ca2), 0);
    }

    /// `shmsched_scheduler_detach` of a binding's last handle with no raw
    /// permit out: OK, the target is freed first and the process leaves
    /// the region's table. With a raw permit out, or with another open
    /// handle on the binding: refused as before (INVALID_ARGUMENT, the
    /// handle closed); the permit is released through the target after.
    #[test]
    fn detach_frees_the_last_handles_target_or_refuses_as_before() {
        let region = Region::anonymous().unwrap();
        let _init = Scheduler::shared(&region, 4).unwrap().detach();
        // The process table seen through a binding of its own (another
        // entry of this process).
        let seer_region = Region::from_fd(region.as_fd().try_clone_to_owned().unwrap()).unwrap();
        let seer = Scheduler::attach(&seer_region).unwrap();
        let entries = || seer.processes().unwrap().len();
        let detach = |h: *mut shmsched_scheduler| {
            // SAFETY: an open handle, not used again.
            let st = unsafe { scheduler::shmsched_scheduler_detach(h) };
            (st, message())
        };

        // The last handle, nothing out.
        let h = open(&region);
        assert_eq!(entries(), 2);
        let (_, a) = c_acquire(h, 0, false);
        releases_alike(a, shmsched_status::Ok);
        // SAFETY: open.
        let t = unsafe { (*h).target() };
        assert_eq!(detach(h).0, shmsched_status::Ok, "{}", message());
        assert_eq!(entries(), 1, "the process left the table");
        assert!(permits::with_pool(|p| !p.targets.contains(&t)), "freed");
        releases_alike(a, shmsched_status::AlreadyReleased);

        // A raw permit out: refused, the permit still released once.
        let h = open(&region);
        let (_, a) = c_acquire(h, 0, false);
        let (st, msg) = detach(h);
        assert_eq!(st, shmsched_status::InvalidArgument);
        assert!(msg.contains("holds 1 permit"), "{msg}");
        assert_eq!(entries(), 2, "stays in the table");
        assert_eq!(seer.global_running(), 1);
        releases_alike(a, shmsched_status::Ok);
        assert_eq!(seer.global_running(), 0);

        // Another open handle on the binding: refused by the library (its
        // message), the other handle unharmed; then it detaches. (The
        // refused detach above left its entry: a binding of its own, as
        // these two handles have.)
        let before = entries();
        let (h1, h2) = (open(&region), open(&region));
        assert_eq!(entries(), before + 1, "one binding");
        let (st, msg) = detach(h1);
        assert_eq!(st, shmsched_status::InvalidArgument);
        assert!(msg.contains("shares the region"), "{msg}");
        let (st, b) = c_acquire(h2, 0, false);
        assert_eq!(st, shmsched_status::Ok);
        releases_alike(b, shmsched_status::Ok);
        assert_eq!(detach(h2).0, shmsched_status::Ok, "{}", message());
        assert_eq!(entries(), before, "the binding left with its last handle");
        assert_eq!(seer.global_running(), 0);
    }

    /// A C program that keeps one handle busy with one-slot permits the
    /// whole time while it opens and closes other handles on the same
    /// region: the closed handles and the pin slots they use stay bounded
    /// (one pin target for the binding, no closed handle left parked for
    /// want of a raw permit), whether a closed handle's own permit is
    /// released before or after its close.
    #[test]
    fn handle_churn_beside_a_busy_handle_stays_bounded() {
        let region = Region::anonymous().unwrap();
        let count = Scheduler::shared(&region, 4).unwrap();
        let open = || open(&region);
        let busy = open();
        let mut held = get(busy).unwrap();
        assert_ne!(held.serial & CELL_TOKEN, 0, "a cell token");
        let bounds = || permits::with_pool(|p| (p.pin_slots_of(&count), p.parked_of(&count)));
        for round in 0..3000 {
            let h = open();
            // SAFETY: open handles.
            let (sh, sb) = unsafe { ((*h).pin_slot(), (*busy).pin_slot()) };
            assert_eq!(sh, sb, "round {round}: one target");
            let t = get(h).unwrap();
            assert_ne!(t.serial & CELL_TOKEN, 0, "round {round}: a cell token");
            // The busy handle gives its permit back after taking the next:
            // one of its one-slot permits is out at every moment.
            let next = get(busy).unwrap();
            release(held).unwrap();
            held = next;
            if round % 2 == 0 {
                release(t).unwrap();
                // SAFETY: closed once; nothing held through it.
                unsafe { permits::retire(h) };
            } else {
                // SAFETY: closed once; `t` is released below.
                unsafe { permits::retire(h) };
                release(t).unwrap();
            }
            let (slots, parked) = bounds();
            assert!(
                slots <= 1 && parked == 0,
                "round {round}: {slots} pin slots, {parked} parked handles of the region"
            );
            assert_eq!(count.global_running(), 1, "round {round}");
        }
        release(held).unwrap();
        // SAFETY: closed once; nothing held.
        unsafe { permits::retire(busy) };
        assert_eq!(bounds(), (0, 0), "all freed");
        assert_eq!(count.global_running(), 0);
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

    /// Tokens of a binding (lean and general) released by two racing
    /// threads while the binding's last handle closes and a new handle
    /// opens on it (sharing the target while its slot still names it,
    /// else making a new one), 2,000 rounds: each token is freed exactly
    /// once, the counts are exact every round, the binding never has more
    /// than a target left over, and none once everything is released.
    #[test]
    fn releases_race_the_last_close_and_new_handles() {
        let region = Region::anonymous().unwrap();
        let count = Scheduler::shared(&region, 8).unwrap();
        let barrier = Barrier::new(3);
        for round in 0..2000 {
            let h = open(&region);
            let toks: Vec<_> = (0..4)
                .map(|i| {
                    if i % 2 == 0 {
                        get(h).unwrap()
                    } else {
                        c_acquire(h, 0, false).1
                    }
                })
                .collect();
            assert_eq!(count.global_running(), 4, "round {round}");
            let wins: Vec<AtomicUsize> = (0..4).map(|_| AtomicUsize::new(0)).collect();
            let later = std::thread::scope(|s| {
                for backwards in [false, true] {
                    let (toks, wins, barrier) = (&toks, &wins, &barrier);
                    s.spawn(move || {
                        barrier.wait();
                        for k in 0..4 {
                            let k = if backwards { 3 - k } else { k };
                            match scheduler::shmsched_permit_release(toks[k]) {
                                shmsched_status::Ok => {
                                    wins[k].fetch_add(1, Ordering::SeqCst);
                                }
                                st => assert_eq!(st, shmsched_status::AlreadyReleased),
                            }
                        }
                    });
                }
                barrier.wait();
                // SAFETY: closed once; its tokens are the threads' to release.
                unsafe { permits::retire(h) };
                let h2 = open(&region);
                let t2 = get(h2).unwrap();
                release(t2).unwrap();
                if round % 2 == 0 {
                    // SAFETY: closed once; nothing held through it.
                    unsafe { permits::retire(h2) };
                    None
                } else {
                    Some(h2) // closed once the threads are done
                }
            });
            if let Some(h2) = later {
                // SAFETY: closed once; nothing held through it.
                unsafe { permits::retire(h2) };
            }
            for (k, w) in wins.iter().enumerate() {
                assert_eq!(w.load(Ordering::SeqCst), 1, "round {round}: token {k}");
            }
            assert_eq!(count.global_running(), 0, "round {round}");
            assert_eq!(count.raw_permits_held(), 0, "round {round}");
            // Freed by the last release or close, unless a hazard held it
            // at that sweep (then a later sweep frees it).
            assert!(targets(&count) <= 1, "round {round}: {}", targets(&count));
        }
        permits::with_pool(permits::sweep);
        assert_eq!(targets(&count), 0);
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
