//! The permits this process holds through the C ABI: a table of entries
//! indexed by the token C receives, so that releasing twice, releasing a
//! permit of another process, or releasing garbage is an error, never
//! undefined behaviour, and never frees a slot that is not the caller's.
//!
//! # How it works
//!
//! A permit token ([`shmsched_permit`]) is `{process, serial}`: `process`
//! is this process's tag (pid and a random nonce, renewed in a forked
//! child, see [`crate::process`]); `serial` is an entry index (low 32 bits)
//! and the entry's generation (bits 62..32, 31 bits; bit 63 is clear: a
//! serial with bit 63 set is a cell token, see [`crate::pin`], which one-cell
//! permits of a shared root take instead of an entry).
//!
//! Each entry has one atomic state word, `generation << 2 | phase`, with the
//! phases `FREE`, `HELD` and `RELEASING`, plus the library's `Permit` and the
//! scheduler handle it came from.
//!
//! - **Acquire** takes a free entry from the calling thread's cache, writes
//!   the permit and the handle, and publishes `generation + 1 | HELD` with a
//!   Release store. The token carries that generation.
//! - **Release** checks the token's process tag (else
//!   [`ForeignPermit`](shmsched_status::ForeignPermit)), then moves the
//!   entry `generation | HELD → generation | RELEASING` with one CAS: exactly
//!   one caller wins it, so a second release of the same token (even racing
//!   on another thread) finds the phase or the generation changed and gets
//!   [`AlreadyReleased`](shmsched_status::AlreadyReleased). The winner drops
//!   the permit (the library gives the slot back) and only then stores
//!   `FREE`, so nothing that waits for an entry to be free can see it free
//!   while the drop still uses the handle.
//! - **Entries** live in chunks of `CHUNK` that are allocated once and
//!   never freed (a directory of `MAX_CHUNKS` pointers), so a token can
//!   always be looked up without a lock. Free indices sit in per-thread
//!   caches (no atomic read-modify-write on the fast path), which exchange
//!   batches with a process-wide pool under a small lock.
//!
//! The fast path costs one CAS more than the library's own release (the
//! claim), and no allocation. (One-slot permits of a shared root handle do
//! without it: they are cell tokens, see [`crate::pin`].)
//!
//! # Closing a scheduler while permits are out
//!
//! A permit refers to its scheduler handle, so a handle is freed only when
//! no entry refers to it: closing parks the handle on a list of closed
//! handles and sweeps the list, freeing every closed handle that no `HELD`
//! or `RELEASING` entry refers to (a scan of the table under the pool
//! lock). A release that finds its handle closed stores `FREE` under the
//! lock and sweeps again, so the last permit of a closed handle frees it.
//! (A release that read "not closed" just before a concurrent close leaves
//! the handle parked until the next sweep: a delay, never a use after free,
//! because the sweep frees only what it saw `FREE`, and `FREE` is stored
//! after the release's last use of the handle.) Cell tokens do not refer
//! to the handle but to its pin target ([`crate::pin`]): closing takes the
//! handle off its target, and the same sweep frees a target once no open
//! handle uses it and no cell token can reach it.
//!
//! # Fork
//!
//! A child inherits the table. Its entries still carry the parent's tokens,
//! which the child cannot release (another process tag), and the parent's
//! held entries stay held in the child's copy (a bounded leak: what was held
//! at the fork). If a thread of the parent held the pool lock at the fork,
//! the child's atfork handler resets the pool (dropping its free indices
//! and its lists of closed handles and pin targets, again a bounded leak)
//! and unlocks it.

use std::cell::{Cell, UnsafeCell};
use std::mem::MaybeUninit;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use shmsched::scheduler::{Permit, Scheduler};

use crate::pin;
use crate::process;
use crate::scheduler::shmsched_scheduler;
use crate::status::{shmsched_status, Fail};

/// A permit held by this process: the right to run one task, until it is
/// given back with `shmsched_permit_release`. A plain value (copy it
/// freely); only the process that acquired it can release it, and only
/// once.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct shmsched_permit {
    /// The tag of the process that holds it: its pid in the low 32 bits,
    /// a random nonce above.
    pub process: u64,
    /// Which permit of that process (an opaque serial number).
    pub serial: u64,
}

/// log2 of [`CHUNK`].
const CHUNK_BITS: u32 = 10;
/// Entries per chunk.
pub(crate) const CHUNK: usize = 1 << CHUNK_BITS;
/// Chunks in the directory.
pub(crate) const MAX_CHUNKS: usize = 4096;
/// The most permits one process can hold through the C ABI at once.
pub(crate) const MAX_PERMITS: usize = CHUNK * MAX_CHUNKS;

const FREE: u64 = 0;
const HELD: u64 = 1;
const RELEASING: u64 = 2;
const PHASE: u64 = 3;
/// The bits of an entry's generation a token carries (bit 63 of the serial
/// is the cell tokens').
const GENERATION: u32 = u32::MAX >> 1;

/// Free indices a thread's cache takes from or gives to the pool at once.
const BATCH: usize = 32;
/// A thread's cache gives a batch back above this many free indices.
const CACHE_MAX: usize = 2 * BATCH;

#[repr(align(64))]
struct Entry {
    /// `generation << 2 | phase`. Written FREE→HELD by the thread that took
    /// the entry from its cache (it owns it exclusively until then),
    /// HELD→RELEASING by the one CAS that wins a release, RELEASING→FREE by
    /// that winner.
    state: AtomicU64,
    /// The scheduler handle of the permit; written before the HELD store,
    /// read by the releaser and by sweeps (atomic so that a sweep's read of
    /// an entry being taken is not a data race).
    handle: AtomicPtr<shmsched_scheduler>,
    /// The library's permit (two words: the handle and the slots). Holds
    /// it while the phase is HELD or RELEASING. Written only by
    /// the thread that owns the FREE entry, before its HELD store
    /// (Release); read only by the winner of the HELD→RELEASING CAS
    /// (Acquire).
    slot: UnsafeCell<MaybeUninit<Permit<'static>>>,
}

impl Entry {
    fn new() -> Entry {
        Entry {
            state: AtomicU64::new(FREE),
            handle: AtomicPtr::new(ptr::null_mut()),
            slot: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }
}

/// Chunk `i` (its first entry), or null until allocated. A chunk is
/// allocated under the pool lock, published with a Release store and never
/// freed.
static DIRECTORY: [AtomicPtr<Entry>; MAX_CHUNKS] =
    [const { AtomicPtr::new(ptr::null_mut()) }; MAX_CHUNKS];

/// What the pool lock guards.
pub(crate) struct Pool {
    /// Free indices not in any thread's cache.
    free: Vec<u32>,
    /// Indices below this have been handed out at least once (and their
    /// chunks allocated).
    next: u32,
    /// Closed scheduler handles that permits may still refer to.
    closed: Vec<*mut shmsched_scheduler>,
    /// Pin targets not freed yet ([`crate::pin`]), published or not.
    pub(crate) targets: Vec<*mut pin::PinTarget>,
    /// Pin slots given back ([`crate::pin`]).
    pub(crate) slots_free: Vec<u32>,
    /// Pin slots below this have been handed out at least once.
    pub(crate) slots_next: u32,
}

struct PoolCell {
    /// 0 unlocked, 1 locked.
    locked: AtomicU32,
    pool: UnsafeCell<Pool>,
}

// SAFETY: `pool` is only accessed by the holder of `locked` (see
// `with_pool`), or by the atfork child handler while the child has one
// thread. The raw handle pointers it holds are owned by the pool once
// closed, and freed under the lock; so are the pin targets'.
unsafe impl Sync for PoolCell {}

static POOL: PoolCell = PoolCell {
    locked: AtomicU32::new(0),
    pool: UnsafeCell::new(Pool {
        free: Vec::new(),
        next: 0,
        closed: Vec::new(),
        targets: Vec::new(),
        slots_free: Vec::new(),
        slots_next: 0,
    }),
};

struct PoolGuard;

impl Drop for PoolGuard {
    fn drop(&mut self) {
        POOL.locked.store(0, Ordering::Release);
    }
}

/// Runs `f` under the pool lock. The lock is held for short bookkeeping (a
/// batch of indices, a chunk allocation, a sweep), so waiters spin and yield.
pub(crate) fn with_pool<R>(f: impl FnOnce(&mut Pool) -> R) -> R {
    let mut spins = 0u32;
    while POOL
        .locked
        .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
    let _unlock = PoolGuard;
    // SAFETY: we hold the lock, so no other reference to the pool exists.
    f(unsafe { &mut *POOL.pool.get() })
}

/// The atfork child handler's part: see the module docs. Only stores
/// (async-signal-safe): the old pool's vectors are leaked, not freed.
pub(crate) fn after_fork_in_child() {
    if POOL.locked.load(Ordering::SeqCst) != 0 {
        // SAFETY: the child has one thread (this one, inside fork), which is
        // not inside `with_pool` (fork is never called from within this
        // crate), so the lock's holder was a parent thread that does not
        // exist here: nobody else can touch the pool. `ptr::write` forgets
        // the old value instead of dropping it (it may be half-updated).
        unsafe {
            ptr::write(
                POOL.pool.get(),
                Pool {
                    free: Vec::new(),
                    next: (*POOL.pool.get()).next,
                    closed: Vec::new(),
                    targets: Vec::new(),
                    slots_free: Vec::new(),
                    slots_next: (*POOL.pool.get()).slots_next,
                },
            );
        }
        POOL.locked.store(0, Ordering::SeqCst);
    }
}

/// The entry at `index`, if its chunk exists.
#[inline(always)]
fn entry(index: u32) -> Option<&'static Entry> {
    let chunk = (index >> CHUNK_BITS) as usize;
    let base = DIRECTORY.get(chunk)?.load(Ordering::Acquire);
    if base.is_null() {
        return None;
    }
    // SAFETY: a non-null directory slot points to a chunk of CHUNK entries
    // that is never freed, and `index % CHUNK < CHUNK`.
    Some(unsafe { &*base.add(index as usize & (CHUNK - 1)) })
}

/// A thread's free indices: a small stack in plain thread-local memory (no
/// destructor, so no registration check on the fast path). Its contents go
/// back to the pool when the thread exits, through [`CacheFlush`], which is
/// registered by the first refill (before that the stack is empty).
struct Cache {
    len: Cell<usize>,
    items: [Cell<u32>; CACHE_MAX],
}

thread_local! {
    static CACHE: Cache = const {
        Cache {
            len: Cell::new(0),
            items: [const { Cell::new(0) }; CACHE_MAX],
        }
    };
    static FLUSH: CacheFlush = const { CacheFlush };
}

/// Gives a thread's cached indices back to the pool when the thread exits.
struct CacheFlush;

impl Drop for CacheFlush {
    fn drop(&mut self) {
        let _ = CACHE.try_with(|c| {
            let n = c.len.replace(0);
            if n > 0 {
                with_pool(|p| p.free.extend(c.items[..n].iter().map(Cell::get)));
            }
        });
    }
}

/// Takes a free index for this thread.
#[inline(always)]
fn take_index() -> Result<u32, Fail> {
    let cached = CACHE.try_with(|c| {
        let n = c.len.get();
        if n == 0 {
            return None;
        }
        c.len.set(n - 1);
        Some(c.items[n - 1].get())
    });
    match cached {
        Ok(Some(i)) => Ok(i),
        _ => refill(),
    }
}

/// Moves a batch of free indices from the pool (allocating a chunk when the
/// pool is empty) into this thread's cache, and returns one of them.
#[cold]
fn refill() -> Result<u32, Fail> {
    // Register the exit flush first, so nothing cached below can be lost
    // at thread exit. (Fails only while the thread is being torn down.)
    let flush = FLUSH.try_with(|_| ()).is_ok();
    with_pool(|p| -> Result<u32, Fail> {
        if p.free.is_empty() {
            grow(p)?;
        }
        let first = p.free.pop().expect("grow leaves at least one free index");
        if flush {
            let _ = CACHE.try_with(|c| {
                let mut n = c.len.get();
                while n < BATCH {
                    let Some(i) = p.free.pop() else { break };
                    c.items[n].set(i);
                    n += 1;
                }
                c.len.set(n);
            });
        }
        Ok(first)
    })
}

/// Allocates the next chunk and puts its indices in the pool.
fn grow(p: &mut Pool) -> Result<(), Fail> {
    let chunk = p.next as usize / CHUNK;
    if chunk >= MAX_CHUNKS {
        return Err(Fail::new(
            shmsched_status::CapacityExhausted,
            format!(
                "this process holds {MAX_PERMITS} permits through the C ABI, the most it can track"
            ),
        ));
    }
    let entries: Box<[Entry]> = (0..CHUNK).map(|_| Entry::new()).collect();
    let base = Box::into_raw(entries).cast::<Entry>();
    DIRECTORY[chunk].store(base, Ordering::Release);
    let start = p.next;
    p.next += CHUNK as u32;
    // Lowest indices on top of the stack, so a process that holds few
    // permits keeps reusing a few hot entries.
    p.free.extend((start..p.next).rev());
    Ok(())
}

/// Gives an index back to this thread's cache, moving a batch to the pool
/// when the cache is full (or the whole index when the thread has no cache
/// any more).
#[inline(always)]
fn give_index(index: u32) {
    let kept = CACHE.try_with(|c| {
        let n = c.len.get();
        if n < CACHE_MAX {
            c.items[n].set(index);
            c.len.set(n + 1);
            true
        } else {
            false
        }
    });
    if kept != Ok(true) {
        spill(index);
    }
}

#[cold]
fn spill(index: u32) {
    let flush = FLUSH.try_with(|_| ()).is_ok();
    with_pool(|p| {
        p.free.push(index);
        if flush {
            let _ = CACHE.try_with(|c| {
                let n = c.len.get();
                let keep = n.saturating_sub(BATCH);
                p.free.extend(c.items[keep..n].iter().map(Cell::get));
                c.len.set(keep);
            });
        }
    });
}

/// Acquires a permit through `handle` with `acquire` and records it;
/// returns its token.
///
/// The entry is taken first and the permit is written into it. If the
/// acquire fails, the entry goes back to the cache and the error is
/// returned; if no entry can be had, nothing is acquired.
#[inline(always)]
pub(crate) fn acquire_with<'h, E>(
    handle: &'h shmsched_scheduler,
    acquire: impl FnOnce(&'h Scheduler) -> Result<Permit<'h>, E>,
) -> Result<shmsched_permit, Fail>
where
    Fail: From<E>,
{
    let index = take_index()?;
    let e = entry(index).expect("an index from a cache has an allocated chunk");
    // The slot is declared with `'static`; lifetimes do not change layout,
    // so the same memory holds a `Permit<'h>`.
    let slot = e.slot.get().cast::<MaybeUninit<Permit<'h>>>();
    // Only the permit (two words) goes into the entry, not the library's
    // `Result`: copying the larger enum through the stack stalled on store
    // forwarding and cost a measurable part of a pair.
    let permit = match acquire(handle.scheduler()) {
        Ok(permit) => permit,
        Err(e) => {
            give_index(index);
            return Err(Fail::from(e));
        }
    };
    // SAFETY: this thread took the FREE entry from its own cache, so no
    // other thread reads or writes the slot until the Release store of
    // HELD below; the slot holds nothing initialised (FREE), so writing
    // over it drops nothing.
    unsafe { (*slot).write(permit) };
    // SAFETY (lifetime of the permit's borrow of `handle`): the handle is
    // freed only by a sweep that sees no HELD or RELEASING entry referring
    // to it (module docs), and this entry refers to it until its release
    // stores FREE after dropping the permit, so the borrow never dangles.
    e.handle.store(
        handle as *const shmsched_scheduler as *mut shmsched_scheduler,
        Ordering::Relaxed,
    );
    let cur = e.state.load(Ordering::Relaxed);
    debug_assert_eq!(cur & PHASE, FREE, "entry from a cache is free");
    let generation = (cur >> 2).wrapping_add(1) & (u64::MAX >> 2);
    e.state.store(generation << 2 | HELD, Ordering::Release);
    Ok(shmsched_permit {
        process: process::tag(),
        serial: u64::from(generation as u32 & GENERATION) << 32 | u64::from(index),
    })
}

/// Records `permit`, already acquired through `handle` (by a `try_`
/// call, whose answer is an `Option`), and returns its token. If no entry
/// can be had, the permit is dropped (its slot given back) and the error
/// returned.
pub(crate) fn insert<'h>(
    handle: &'h shmsched_scheduler,
    permit: Permit<'h>,
) -> Result<shmsched_permit, Fail> {
    acquire_with(handle, move |_| Ok::<_, Fail>(permit))
}

/// Releases the permit behind `token` (see the module docs).
#[inline(always)]
pub(crate) fn release(token: shmsched_permit) -> Result<(), Fail> {
    let me = process::tag();
    if token.process != me {
        return Err(not_ours(token, me));
    }
    let index = token.serial as u32;
    let generation = (token.serial >> 32) as u32 & GENERATION;
    let Some(e) = entry(index) else {
        return Err(not_held(token));
    };
    let cur = e.state.load(Ordering::Acquire);
    if cur & PHASE != HELD || (cur >> 2) as u32 & GENERATION != generation {
        return Err(not_held(token));
    }
    if e.state
        .compare_exchange(
            cur,
            (cur & !PHASE) | RELEASING,
            Ordering::Acquire,
            Ordering::Relaxed,
        )
        .is_err()
    {
        return Err(not_held(token));
    }
    let handle = e.handle.load(Ordering::Relaxed);
    // SAFETY: winning HELD→RELEASING makes this thread the only reader of
    // the slot, which the acquirer initialised (with its permit) before
    // its Release store of HELD, synchronised by the Acquire CAS; nobody
    // reads it again until a new acquire rewrites it. Dropping the permit
    // gives its slot back.
    drop(unsafe { (*e.slot.get()).assume_init_read() });
    let freed = (cur & !PHASE) | FREE;
    // SAFETY: the handle is alive: it is freed only by a sweep that saw no
    // HELD or RELEASING entry referring to it, and this entry is RELEASING.
    if unsafe { (*handle).is_closed() } {
        with_pool(|p| {
            e.state.store(freed, Ordering::Release);
            sweep(p);
        });
    } else {
        e.state.store(freed, Ordering::Release);
    }
    give_index(index);
    Ok(())
}

#[cold]
pub(crate) fn not_ours(token: shmsched_permit, me: u64) -> Fail {
    if token.process == 0 {
        return not_held(token);
    }
    Fail::new(
        shmsched_status::ForeignPermit,
        format!(
            "permit {{process {:#x}, serial {:#x}}} belongs to process {} (tag {:#x}), not to this one \
             (pid {}, tag {:#x}); only the process that acquired a permit can release it",
            token.process,
            token.serial,
            process::pid_of(token.process),
            token.process,
            process::pid_of(me),
            me
        ),
    )
}

#[cold]
pub(crate) fn not_held(token: shmsched_permit) -> Fail {
    Fail::new(
        shmsched_status::AlreadyReleased,
        format!(
            "permit {{process {:#x}, serial {:#x}}} is not held: it was already released, or never issued",
            token.process, token.serial
        ),
    )
}

/// Parks a closed handle (taking it off its pin target) and frees every
/// parked handle that no permit refers to any more, and every pin target
/// no cell token can reach any more.
///
/// # Safety
///
/// `handle` came from `Box::into_raw` in this crate, is not used by the
/// caller again (so no new permit is acquired through it), and is not
/// passed here twice.
pub(crate) unsafe fn retire(handle: *mut shmsched_scheduler) {
    with_pool(|p| {
        // SAFETY: the handle is alive (the contract) and only read here.
        let h = unsafe { &*handle };
        h.mark_closed();
        pin::leave(h);
        p.closed.push(handle);
        sweep(p);
    });
}

/// Takes an open handle off its pin target before it is freed without a
/// sweep (detach), freeing the target if the handle was its last
/// ([`pin::detach_target`]). False if a raw permit of this process is out
/// in its binding or a release through the target stays under way: then
/// the handle must be retired instead.
pub(crate) fn unpin(handle: *mut shmsched_scheduler) -> bool {
    // SAFETY: the caller's handle is alive, and only read here.
    let h = unsafe { &*handle };
    if h.pin_slot() == pin::NO_SLOT {
        return true;
    }
    with_pool(|p| pin::detach_target(p, h))
}

#[cfg(test)]
impl Pool {
    /// Whether `h` is parked (closed, not freed yet).
    pub(crate) fn closed_contains(&self, h: *mut shmsched_scheduler) -> bool {
        self.closed.contains(&h)
    }

    /// Parked handles of `sched`'s region binding.
    pub(crate) fn parked_of(&self, sched: &Scheduler) -> usize {
        let r = sched.raw_releaser().unwrap();
        self.closed
            .iter()
            // SAFETY: parked handles are alive.
            .filter(|&&h| r.same_root(unsafe { &*h }.scheduler()))
            .count()
    }

    /// Pin slots in use by `sched`'s region binding (its pin targets not
    /// freed yet).
    pub(crate) fn pin_slots_of(&self, sched: &Scheduler) -> usize {
        pin::targets_of(self, sched)
    }
}

/// Permits this process holds through `handle` now.
pub(crate) fn outstanding(handle: *const shmsched_scheduler) -> usize {
    with_pool(|p| {
        let mut n = 0;
        for_each_live(p, |h| {
            if ptr::eq(h, handle) {
                n += 1;
            }
        });
        n
    })
}

/// Calls `f` with the handle of every HELD or RELEASING entry.
fn for_each_live(p: &Pool, mut f: impl FnMut(*mut shmsched_scheduler)) {
    for index in 0..p.next {
        let Some(e) = entry(index) else { break };
        if e.state.load(Ordering::Acquire) & PHASE != FREE {
            f(e.handle.load(Ordering::Relaxed));
        }
    }
}

/// Frees the closed handles that no live entry refers to, then the pin
/// targets that no cell token can reach any more ([`pin::sweep_targets`]).
pub(crate) fn sweep(p: &mut Pool) {
    if !p.closed.is_empty() {
        let mut busy = Vec::new();
        for_each_live(p, |h| {
            if p.closed.contains(&h) && !busy.contains(&h) {
                busy.push(h);
            }
        });
        let mut freed = Vec::new();
        p.closed.retain(|&h| {
            let keep = busy.contains(&h);
            if !keep {
                freed.push(h);
            }
            keep
        });
        for h in freed {
            // SAFETY: `h` came from Box::into_raw (the contract of
            // `retire`), is closed (no new permits), no entry refers to it
            // (a FREE entry's releaser stored FREE after its last use of
            // the handle: Release; our loads are Acquire), and no cell
            // token reaches it (they reach its pin target, which it left
            // at close). It was removed from the list above, so it is
            // freed once.
            drop(unsafe { Box::from_raw(h) });
        }
    }
    pin::sweep_targets(p);
}

#[cfg(test)]
mod tests {
    use super::*;
    use shmsched::Priority;

    fn handle(max: u32) -> *mut shmsched_scheduler {
        Box::into_raw(Box::new(shmsched_scheduler::new(
            Scheduler::new(max).unwrap(),
        )))
    }

    #[test]
    fn release_once_then_already_released() {
        let h = handle(2);
        // SAFETY: `h` is a live handle until retired below.
        let hr = unsafe { &*h };
        let t = acquire_with(hr, |s| s.acquire(Priority::Normal)).unwrap();
        assert_eq!(hr.scheduler().stats().running, 1);
        release(t).unwrap();
        assert_eq!(hr.scheduler().stats().running, 0);
        let e = release(t).unwrap_err();
        assert_eq!(e.status, shmsched_status::AlreadyReleased);
        // The entry is reused with a new generation: the stale token still fails.
        let t2 = acquire_with(hr, |s| s.acquire(Priority::Normal)).unwrap();
        assert_eq!(t2.serial as u32, t.serial as u32, "hot entry reused");
        assert_eq!(
            release(t).unwrap_err().status,
            shmsched_status::AlreadyReleased
        );
        release(t2).unwrap();
        // SAFETY: closed once, no permit in flight.
        unsafe { retire(h) };
    }

    #[test]
    fn foreign_and_garbage_tokens() {
        let me = process::tag();
        let foreign = shmsched_permit {
            process: me ^ (1 << 40),
            serial: 0,
        };
        assert_eq!(
            release(foreign).unwrap_err().status,
            shmsched_status::ForeignPermit
        );
        let zero = shmsched_permit::default();
        assert_eq!(
            release(zero).unwrap_err().status,
            shmsched_status::AlreadyReleased
        );
        let huge = shmsched_permit {
            process: me,
            serial: u64::from(u32::MAX),
        };
        assert_eq!(
            release(huge).unwrap_err().status,
            shmsched_status::AlreadyReleased
        );
    }

    #[test]
    fn racing_double_releases_free_exactly_once() {
        let h = handle(1);
        // SAFETY: live until retired below.
        let hr = unsafe { &*h };
        for _ in 0..200 {
            let t = acquire_with(hr, |s| s.acquire(Priority::Normal)).unwrap();
            let wins: usize = std::thread::scope(|s| {
                let a = s.spawn(|| release(t).is_ok() as usize);
                let b = s.spawn(|| release(t).is_ok() as usize);
                a.join().unwrap() + b.join().unwrap()
            });
            assert_eq!(wins, 1);
            assert_eq!(hr.scheduler().stats().running, 0);
        }
        // SAFETY: as above.
        unsafe { retire(h) };
    }

    #[test]
    fn closed_handle_lives_until_its_last_permit() {
        let h = handle(3);
        // SAFETY: live; permits keep it alive after retire.
        let hr = unsafe { &*h };
        let a = acquire_with(hr, |s| s.acquire(Priority::Normal)).unwrap();
        let b = acquire_with(hr, |s| s.acquire(Priority::Normal)).unwrap();
        assert_eq!(outstanding(h), 2);
        // SAFETY: closed once; permits a and b still refer to it.
        unsafe { retire(h) };
        // Still parked: both permits release through it.
        release(a).unwrap();
        release(b).unwrap();
        assert!(
            with_pool(|p| !p.closed.contains(&h)),
            "freed by the last release"
        );
    }
}
