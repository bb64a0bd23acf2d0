//! A process-shared, robust pthread mutex that lives inside shared memory.
//!
//! # How it works
//!
//! [`RobustMutex`] is a `#[repr(C)]` slot holding one `pthread_mutex_t`.
//! [`RobustMutex::init_in_place`] initialises it where it lies (in a mapped
//! region) with `PTHREAD_PROCESS_SHARED`, so any process that maps the same
//! bytes can use it, and `PTHREAD_MUTEX_ROBUST`, so the kernel and libc
//! cooperate to notice a holder that dies: the next lock succeeds with
//! `EOWNERDEAD` and reports [`LockState::OwnerDied`]. The new holder owns
//! the lock, must repair the protected data, then call
//! [`RobustMutex::consistent`] before unlocking; unlocking without it marks
//! the mutex permanently unusable, after which `lock` fails with
//! `ENOTRECOVERABLE`.
//!
//! # The mutex is region contents too
//!
//! Anyone who can write the region can write the mutex. A lock word naming
//! a thread that does not exist (or whose process does not map the region)
//! would make every `pthread_mutex_lock` sleep forever: the kernel only
//! marks a robust mutex "owner died" when the thread named in it exits, and
//! that thread never held it. And glibc, on unlock, *writes through the
//! list pointers stored in the mutex* (the robust list). So
//! [`RobustMutex::lock_bounded`] never sleeps unboundedly:
//!
//! 1. it checks the mutex's type word against the one `init_in_place`
//!    writes (a scribbled type would send glibc down another code path);
//! 2. it takes the lock in slices of [`LOCK_SLICE`] on `CLOCK_MONOTONIC`
//!    (`pthread_mutex_clocklock`, or `pthread_mutex_timedlock` on a libc
//!    without it);
//! 3. after a slice times out it reads the holder's thread id from the lock
//!    word and asks `/proc` ([`super::proc`]) whether that thread exists
//!    and its process maps the region file. If not (or the id is the
//!    caller's own, which does not hold it), and the word has not moved
//!    meanwhile, no thread can ever release it: the lock is *corrupt*, and
//!    the caller gets a [`Corruption`] (a snapshot of the words) to repair
//!    with [`RobustMutex::reinit_if_still`] under a lock of its own;
//! 4. a real holder is waited for up to the caller's timeout, then the call
//!    fails with an error naming the thread and the time.
//!
//! While it holds the lock, the caller keeps a [`Held`] record of the type
//! word and the list pointers the lock stored (predicted from this
//! thread's own robust-list head, `get_robust_list`, not read back from the
//! shared memory), and [`RobustMutex::unlock_held`] writes them back before
//! unlocking, so a scribble made while the lock was held cannot redirect
//! glibc's writes.
//! (A scribble landing in the few instructions between that restore and
//! glibc's read is not excluded; see the README's guarantees.)
//!
//! The field-level checks need glibc's layout of `pthread_mutex_t` on a
//! 64-bit Linux (checked at first use against a mutex initialised
//! locally); elsewhere only the bounded wait applies, and a lock that stays
//! held is reported as an error after the timeout.
//!
//! # Layout
//!
//! `pthread_mutex_t` differs between libcs and architectures, so two
//! processes built against different libcs must not share one. A region
//! header stores [`MUTEX_LAYOUT_TAG`] (flavour and size) and compares it on
//! open; see [`LIBC_FLAVOUR`] and [`MUTEX_BYTES`].
//!
//! The mutex must not be moved once initialised and must not be initialised
//! twice while in use; both are the caller's obligations (hence the
//! `unsafe` on [`RobustMutex::init_in_place`] and
//! [`RobustMutex::reinit_if_still`]).

use std::cell::UnsafeCell;
use std::io;
use std::mem;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::proc::{self, Answer};
use crate::error::Error;

/// How long one slice of a bounded lock sleeps before the holder is
/// examined.
pub const LOCK_SLICE: Duration = Duration::from_millis(20);

/// Size in bytes of `pthread_mutex_t` in this build.
pub const MUTEX_BYTES: usize = mem::size_of::<libc::pthread_mutex_t>();

/// Alignment of `pthread_mutex_t` in this build.
pub const MUTEX_ALIGN: usize = mem::align_of::<libc::pthread_mutex_t>();

/// The libc this build links against: `"gnu"`, `"musl"` or `"other"`.
pub const LIBC_FLAVOUR: &str = if cfg!(target_env = "gnu") {
    "gnu"
} else if cfg!(target_env = "musl") {
    "musl"
} else {
    "other"
};

const FLAVOUR_CODE: u64 = if cfg!(target_env = "gnu") {
    1
} else if cfg!(target_env = "musl") {
    2
} else {
    3
};

/// One word a region header stores to refuse a region whose mutex was laid
/// out by another libc or architecture: flavour code (1 gnu, 2 musl,
/// 3 other) in the high 32 bits, [`MUTEX_BYTES`] in the low 32.
pub const MUTEX_LAYOUT_TAG: u64 = (FLAVOUR_CODE << 32) | MUTEX_BYTES as u64;

/// What [`RobustMutex::lock`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockState {
    /// Locked normally; the protected data is as the last holder left it.
    Locked,
    /// Locked, but the previous holder died holding it. Repair the data,
    /// then call [`RobustMutex::consistent`] before unlocking.
    OwnerDied,
}

/// How to wait in [`RobustMutex::lock_bounded`].
#[derive(Clone, Copy)]
pub struct LockWait<'a> {
    /// Longest wait for a live holder.
    pub timeout: Duration,
    /// `(st_dev, st_ino)` of the file mapped where the mutex lies, if any:
    /// a holder whose process does not map it cannot be real.
    pub file: Option<(u64, u64)>,
    /// Whether the process with this pid may hold the mutex (for a region:
    /// it is registered, alive, in its process table), if the caller knows:
    /// a holder whose process may not cannot be real.
    pub may_hold: Option<&'a dyn Fn(i32) -> bool>,
}

impl std::fmt::Debug for LockWait<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockWait")
            .field("timeout", &self.timeout)
            .field("file", &self.file)
            .field("may_hold", &self.may_hold.is_some())
            .finish()
    }
}

/// What [`RobustMutex::lock_bounded`] found.
#[derive(Debug)]
pub enum Bounded {
    /// Locked; keep the [`Held`] for [`RobustMutex::unlock_held`].
    Locked(LockState, Held),
    /// Not locked: the mutex is corrupt and no thread can release it.
    Corrupt(Corruption),
}

/// The type word and list pointers as they must be while the lock is held:
/// `(kind, prev, next)`.
#[derive(Debug, Clone, Copy)]
pub struct Held {
    words: Option<(i32, u64, u64)>,
}

impl Held {
    /// Nothing recorded yet (a place for [`RobustMutex::try_lock_into`]
    /// to write to; unlocking with it writes nothing back).
    pub const NONE: Held = Held { words: None };
}

/// A corrupt mutex, as seen: the words, and why they cannot be a real
/// holder's.
#[derive(Debug, Clone)]
pub struct Corruption {
    words: Words,
    why: String,
}

impl std::fmt::Display for Corruption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

/// The words of a glibc mutex that matter here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Words {
    lock: i32,
    owner: i32,
    kind: i32,
    prev: u64,
    next: u64,
}

/// The thread-id bits of a robust lock word (the others are
/// `FUTEX_WAITERS` and `FUTEX_OWNER_DIED`).
const TID_MASK: i32 = 0x3fff_ffff;

/// Byte offsets of glibc's `struct __pthread_mutex_s` fields on 64-bit
/// Linux, and the type word `init_in_place` writes.
#[derive(Debug)]
struct GlibcLayout {
    lock: usize,
    owner: usize,
    kind: usize,
    prev: usize,
    next: usize,
    expected_kind: i32,
    /// A lock stores this thread's robust-list head in the list's `prev`
    /// and the head's previous `list` word in `next` (checked at first
    /// use), so [`expected_links`] predicts them exactly.
    links_known: bool,
}

/// This thread's robust-list head, as glibc registered it with the kernel
/// (`get_robust_list`; its address never changes for a thread, a forked
/// child's thread included), cached per thread.
fn robust_head() -> Option<usize> {
    thread_local! {
        static HEAD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }
    let cached = HEAD.with(|h| h.get());
    if cached != 0 {
        return Some(cached);
    }
    let mut head: usize = 0;
    let mut len: libc::size_t = 0;
    // SAFETY: get_robust_list(0, ...) reads this thread's registration into
    // the two valid, writable locals.
    let r = unsafe {
        libc::syscall(
            libc::SYS_get_robust_list,
            0,
            &mut head as *mut usize,
            &mut len as *mut libc::size_t,
        )
    };
    if r != 0 || head == 0 {
        return None;
    }
    HEAD.with(|h| h.set(head));
    Some(head)
}

/// What the next robust lock by this thread will store in the mutex's
/// `(prev, next)`: the head's address, and the list pointer it holds now.
fn expected_links() -> Option<(u64, u64)> {
    let head = robust_head()?;
    // SAFETY: `head` is this thread's `struct robust_list_head` in its own
    // thread control block, registered by glibc and alive as long as the
    // thread; its first word is the list pointer, which only this thread
    // (and the kernel, at its exit) touches. A volatile read of it is sound.
    let list = unsafe { std::ptr::read_volatile(head as *const usize) };
    Some((head as u64, list as u64))
}

/// glibc's layout if this build uses it and a local mutex confirms it:
/// after `init_in_place` everything but the type word is zero, and after a
/// lock the lock and owner words hold our thread id and the list pointers
/// are set.
fn glibc_layout() -> Option<&'static GlibcLayout> {
    static L: OnceLock<Option<GlibcLayout>> = OnceLock::new();
    L.get_or_init(|| {
        if !(cfg!(all(
            target_os = "linux",
            target_env = "gnu",
            target_pointer_width = "64"
        )) && MUTEX_BYTES >= 40)
        {
            return None;
        }
        let mut g = GlibcLayout {
            lock: 0,
            owner: 8,
            kind: 16,
            prev: 24,
            next: 32,
            expected_kind: 0,
            links_known: false,
        };
        let slot = Box::new(mem::MaybeUninit::<RobustMutex>::zeroed());
        let m = Box::into_raw(slot) as *mut RobustMutex;
        // SAFETY: a fresh, zeroed, private allocation of the right type and
        // alignment, used by this thread only and freed below.
        let ok = unsafe {
            RobustMutex::init_in_place(m).is_ok() && {
                let m = &*m;
                let w0 = m.words(&g);
                g.expected_kind = w0.kind;
                let fresh = w0.lock == 0 && w0.owner == 0 && w0.prev == 0 && w0.next == 0;
                let links = expected_links();
                let locked = m.lock().is_ok();
                let w1 = m.words(&g);
                g.links_known = links == Some((w1.prev, w1.next));
                let me = proc::gettid();
                let ok = fresh
                    && locked
                    && w1.lock & TID_MASK == me
                    && w1.owner == me
                    && w1.prev != 0
                    && w1.next != 0
                    && w1.kind == w0.kind;
                if locked {
                    let _ = m.unlock();
                }
                libc::pthread_mutex_destroy(m.raw());
                ok
            }
        };
        // SAFETY: `m` came from Box::into_raw above and is not used again.
        drop(unsafe { Box::from_raw(m as *mut mem::MaybeUninit<RobustMutex>) });
        ok.then_some(g)
    })
    .as_ref()
}

type ClockLock = unsafe extern "C" fn(
    *mut libc::pthread_mutex_t,
    libc::clockid_t,
    *const libc::timespec,
) -> libc::c_int;

/// glibc's `pthread_mutex_clocklock` (2.30+), looked up at run time so that
/// the library also loads on an older libc.
fn clocklock() -> Option<ClockLock> {
    static F: OnceLock<Option<ClockLock>> = OnceLock::new();
    *F.get_or_init(|| {
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name has no
        // other preconditions.
        let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"pthread_mutex_clocklock".as_ptr()) };
        // SAFETY: the symbol, when present, is glibc's function with exactly
        // this signature.
        (!p.is_null()).then(|| unsafe { mem::transmute::<*mut libc::c_void, ClockLock>(p) })
    })
}

/// An absolute deadline `d` from now on `clock`.
fn deadline_on(clock: libc::clockid_t, d: Duration) -> libc::timespec {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; both clocks exist.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    let nsec = ts.tv_nsec as u64 + u64::from(d.subsec_nanos());
    let secs = (d.as_secs() + nsec / 1_000_000_000).min(i32::MAX as u64);
    libc::timespec {
        tv_sec: ts.tv_sec.saturating_add(secs as libc::time_t),
        tv_nsec: (nsec % 1_000_000_000) as libc::c_long,
    }
}

fn lock_result(rc: libc::c_int) -> Result<LockState, Error> {
    match rc {
        0 => Ok(LockState::Locked),
        libc::EOWNERDEAD => Ok(LockState::OwnerDied),
        other => Err(lock_error(other)),
    }
}

/// The error of a lock call that returned `rc` (neither 0 nor `EOWNERDEAD`),
/// as [`RobustMutex::try_lock_into`] reports it.
#[cold]
pub fn lock_error_of(rc: libc::c_int) -> Error {
    lock_error(rc)
}

/// The error of a lock call that returned `rc` (neither 0 nor `EOWNERDEAD`).
#[cold]
fn lock_error(rc: libc::c_int) -> Error {
    match rc {
        libc::ENOTRECOVERABLE => Error::BadRegion(
            "the region's robust mutex is not recoverable: a holder died and the next holder released it \
             without marking the data consistent; recreate the region"
                .into(),
        ),
        other => Error::io(
            "pthread_mutex_lock",
            None,
            io::Error::from_raw_os_error(other),
        ),
    }
}

fn is_not_recoverable(e: &Error) -> bool {
    matches!(e, Error::BadRegion(m) if m.contains("not recoverable"))
}

/// A robust, process-shared mutex slot for shared memory.
#[repr(C)]
pub struct RobustMutex {
    inner: UnsafeCell<libc::pthread_mutex_t>,
}

// SAFETY: the pthread mutex is designed to be used concurrently from many
// threads and processes; all access goes through pthread calls, which do
// their own synchronisation.
unsafe impl Sync for RobustMutex {}
// SAFETY: the mutex holds no thread-local state; a robust process-shared
// mutex is identified by its address, not by the creating thread.
unsafe impl Send for RobustMutex {}

fn check(op: &'static str, rc: libc::c_int) -> Result<(), Error> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::io(op, None, io::Error::from_raw_os_error(rc)))
    }
}

impl RobustMutex {
    /// Initialises a robust, process-shared mutex at `slot`.
    ///
    /// # Safety
    ///
    /// `slot` must be valid for writes of `size_of::<RobustMutex>()` bytes,
    /// aligned to [`MUTEX_ALIGN`], and no process may be using a mutex at
    /// that address (locked or waiting) during or before this call. The
    /// mutex must stay at this address for as long as it is used.
    pub unsafe fn init_in_place(slot: *mut RobustMutex) -> Result<(), Error> {
        let mut attr = mem::MaybeUninit::<libc::pthread_mutexattr_t>::uninit();
        // SAFETY: `attr` is local storage of the right type; init writes it.
        check("pthread_mutexattr_init", unsafe {
            libc::pthread_mutexattr_init(attr.as_mut_ptr())
        })?;
        let attr_ptr = attr.as_mut_ptr();
        let result = (|| {
            // SAFETY: `attr_ptr` was initialised just above.
            check("pthread_mutexattr_setpshared", unsafe {
                libc::pthread_mutexattr_setpshared(attr_ptr, libc::PTHREAD_PROCESS_SHARED)
            })?;
            // SAFETY: as above.
            check("pthread_mutexattr_setrobust", unsafe {
                libc::pthread_mutexattr_setrobust(attr_ptr, libc::PTHREAD_MUTEX_ROBUST)
            })?;
            // SAFETY: the caller guarantees `slot` is writable, aligned and
            // not in use; `UnsafeCell::raw_get` yields the inner pointer
            // without creating a reference to uninitialised memory.
            check("pthread_mutex_init", unsafe {
                libc::pthread_mutex_init(
                    UnsafeCell::raw_get(std::ptr::addr_of!((*slot).inner)),
                    attr_ptr,
                )
            })
        })();
        // SAFETY: `attr_ptr` is initialised and no longer needed.
        unsafe { libc::pthread_mutexattr_destroy(attr_ptr) };
        result
    }

    fn raw(&self) -> *mut libc::pthread_mutex_t {
        self.inner.get()
    }

    /// Locks, sleeping while another thread or process holds the mutex, for
    /// as long as it takes. Prefer [`lock_bounded`](Self::lock_bounded) on
    /// memory other processes can write.
    ///
    /// Returns [`LockState::OwnerDied`] when the previous holder died with
    /// it locked (the caller now holds it). `ENOTRECOVERABLE` (a previous
    /// owner-died recovery unlocked without [`RobustMutex::consistent`]) and
    /// any other failure are errors.
    pub fn lock(&self) -> Result<LockState, Error> {
        // SAFETY: `self` was initialised by `init_in_place` (a `RobustMutex`
        // is only reachable through memory its creator initialised) and the
        // pointer is valid for the lifetime of `&self`.
        lock_result(unsafe { libc::pthread_mutex_lock(self.raw()) })
    }

    /// Locks within `wait.timeout`, never sleeping on a lock word that can
    /// never be released (see the module docs). `Ok(Bounded::Corrupt)` when
    /// the mutex is corrupt: nothing is locked, and the caller may repair it
    /// with [`reinit_if_still`](Self::reinit_if_still).
    pub fn lock_bounded(&self, wait: &LockWait) -> Result<Bounded, Error> {
        if let Some(r) = self.try_lock() {
            return r.map(|(state, held)| Bounded::Locked(state, held));
        }
        let glibc = glibc_layout();
        // The clock starts at the first attempt that finds the lock taken:
        // the uncontended path reads no clock (one trylock).
        let mut start: Option<Instant> = None;
        loop {
            if let Some(g) = glibc {
                if let Some(c) = self.corrupt_type(g) {
                    return Ok(Bounded::Corrupt(c));
                }
            }
            let slice = match start {
                None => Duration::ZERO,
                Some(t) => wait.timeout.saturating_sub(t.elapsed()).min(LOCK_SLICE),
            };
            // Read before the attempt: the lock itself changes the head.
            let links = glibc
                .filter(|g| g.links_known)
                .and_then(|_| expected_links());
            match self.timed_lock(slice) {
                Ok(Some(state)) => {
                    let held = self.held(glibc, links);
                    // A scribble between the lock and now is undone at once.
                    self.write_back(&held);
                    return Ok(Bounded::Locked(state, held));
                }
                Ok(None) if start.is_none() => {
                    start = Some(Instant::now());
                    continue;
                }
                Ok(None) => {}
                Err(e) if is_not_recoverable(&e) => {
                    if let Some(g) = glibc {
                        // Nobody holds a not-recoverable mutex: repairable.
                        return Ok(Bounded::Corrupt(
                            self.corruption(
                                g,
                                "the mutex is not recoverable (a holder died and the next one \
                             unlocked it without marking it consistent)"
                                    .into(),
                            ),
                        ));
                    }
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
            // The slice timed out: who holds it?
            if let Some(g) = glibc {
                if let Some(c) = self.examine_holder(g, wait) {
                    return Ok(Bounded::Corrupt(c));
                }
            }
            if start.is_some_and(|t| t.elapsed() >= wait.timeout) {
                let holder = glibc.map_or(0, |g| self.words(g).lock & TID_MASK);
                return Err(Error::BadRegion(format!(
                    "the region's robust mutex has been held for more than {} ms by thread {} \
                     of a live process that maps the region (stopped, or stuck); giving up",
                    wait.timeout.as_millis(),
                    holder
                )));
            }
        }
    }

    /// The uncontended path of [`lock_bounded`](Self::lock_bounded): one
    /// attempt, no waiting, no clock, nothing to build. `Some` when it took
    /// the lock (or failed for a reason no wait can change); `None` when
    /// the mutex is held, not recoverable or has a scribbled type word,
    /// which `lock_bounded` sorts out.
    ///
    /// The type word is checked before the attempt (a scribbled type would
    /// send glibc down another code path); the list pointers are predicted
    /// here and written back by [`unlock_held`](Self::unlock_held) just
    /// before glibc reads them (unlock is the only time it does), so they
    /// are checked once per lock pair, not also right after the lock: a
    /// scribble can land at any time during the hold, and the write-back
    /// at unlock is the one that undoes it.
    #[inline(always)]
    pub fn try_lock(&self) -> Option<Result<(LockState, Held), Error>> {
        let mut held = Held::NONE;
        match self.try_lock_into(&mut held) {
            Ok(state) => Some(Ok((state, held))),
            Err(0) => None,
            Err(rc) => Some(Err(lock_error(rc))),
        }
    }

    /// [`try_lock`](Self::try_lock) with the [`Held`] written to `held`
    /// and nothing but a code to return (no `Error` built or moved on the
    /// way): `Ok` when it took the lock; `Err(0)` when the mutex is held,
    /// not recoverable or has a scribbled type word (for
    /// [`lock_bounded`](Self::lock_bounded) to sort out); `Err(rc)` when
    /// `pthread_mutex_trylock` failed with `rc` (see
    /// [`lock_error_of`]).
    #[inline(always)]
    pub fn try_lock_into(&self, held: &mut Held) -> Result<LockState, libc::c_int> {
        let glibc = glibc_layout();
        // Read before the attempt: the lock itself changes the head.
        let links = match glibc {
            Some(g) if self.kind_word(g) != g.expected_kind => return Err(0),
            Some(g) if g.links_known => expected_links(),
            _ => None,
        };
        // SAFETY: as in `lock`.
        let rc = unsafe { libc::pthread_mutex_trylock(self.raw()) };
        let state = match rc {
            0 => LockState::Locked,
            libc::EOWNERDEAD => LockState::OwnerDied,
            libc::EBUSY | libc::ENOTRECOVERABLE => return Err(0),
            other => return Err(other),
        };
        *held = self.held(glibc, links);
        Ok(state)
    }

    /// One attempt that sleeps at most `slice`: `Ok(None)` on timeout.
    fn timed_lock(&self, slice: Duration) -> Result<Option<LockState>, Error> {
        // SAFETY: as in `lock`.
        let rc = unsafe { libc::pthread_mutex_trylock(self.raw()) };
        if rc != libc::EBUSY {
            return lock_result(rc).map(Some);
        }
        if slice.is_zero() {
            return Ok(None);
        }
        let rc = match clocklock() {
            Some(f) => {
                let at = deadline_on(libc::CLOCK_MONOTONIC, slice);
                // SAFETY: as in `lock`; `at` is a valid timespec that outlives
                // the call, and `f` is glibc's pthread_mutex_clocklock.
                unsafe { f(self.raw(), libc::CLOCK_MONOTONIC, &at) }
            }
            None => {
                let at = deadline_on(libc::CLOCK_REALTIME, slice);
                // SAFETY: as in `lock`; `at` is a valid timespec.
                unsafe { libc::pthread_mutex_timedlock(self.raw(), &at) }
            }
        };
        if rc == libc::ETIMEDOUT {
            return Ok(None);
        }
        lock_result(rc).map(Some)
    }

    /// The words of the mutex (glibc layout), read atomically one by one.
    fn words(&self, g: &GlibcLayout) -> Words {
        let base = self.raw() as *const u8;
        // SAFETY: the offsets come from the checked glibc layout and lie
        // inside the mutex (MUTEX_BYTES >= 40); each is aligned for its
        // width within the 8-aligned mutex; other processes access these
        // words concurrently, so they are read through atomics.
        unsafe {
            let i32_at = |o: usize| (*(base.add(o) as *const AtomicI32)).load(Ordering::SeqCst);
            let u64_at = |o: usize| (*(base.add(o) as *const AtomicU64)).load(Ordering::SeqCst);
            Words {
                lock: i32_at(g.lock),
                owner: i32_at(g.owner),
                kind: i32_at(g.kind),
                prev: u64_at(g.prev),
                next: u64_at(g.next),
            }
        }
    }

    fn corruption(&self, g: &GlibcLayout, why: String) -> Corruption {
        Corruption {
            words: self.words(g),
            why,
        }
    }

    /// The type word (one atomic load).
    fn kind_word(&self, g: &GlibcLayout) -> i32 {
        // SAFETY: as in `words`.
        unsafe {
            (*((self.raw() as *const u8).add(g.kind) as *const AtomicI32)).load(Ordering::SeqCst)
        }
    }

    /// The list pointers (two atomic loads).
    fn links(&self, g: &GlibcLayout) -> (u64, u64) {
        let base = self.raw() as *const u8;
        // SAFETY: as in `words`.
        unsafe {
            (
                (*(base.add(g.prev) as *const AtomicU64)).load(Ordering::SeqCst),
                (*(base.add(g.next) as *const AtomicU64)).load(Ordering::SeqCst),
            )
        }
    }

    /// A type word other than the one `init_in_place` wrote.
    fn corrupt_type(&self, g: &GlibcLayout) -> Option<Corruption> {
        if self.kind_word(g) == g.expected_kind {
            return None;
        }
        let w = self.words(g);
        (w.kind != g.expected_kind).then(|| {
            self.corruption(
                g,
                format!(
                    "the mutex's type word is {:#x}, not the robust process-shared type {:#x}",
                    w.kind, g.expected_kind
                ),
            )
        })
    }

    /// After a timed-out slice: `Some` if the lock word names no thread that
    /// could release it (and did not move while we looked).
    fn examine_holder(&self, g: &GlibcLayout, wait: &LockWait<'_>) -> Option<Corruption> {
        let before = self.words(g);
        let tid = before.lock & TID_MASK;
        if tid == 0 {
            return None; // released meanwhile (or owner-died: the next try takes it)
        }
        let why = if tid == proc::gettid() {
            Some(format!(
                "the lock word names thread {tid}, the caller, which does not hold it"
            ))
        } else if proc::thread_exists(tid) == Answer::No {
            Some(format!(
                "the lock word ({:#x}) names thread {tid}, which does not exist",
                before.lock
            ))
        } else if wait
            .file
            .is_some_and(|f| proc::thread_maps_file(tid, f) == Answer::No)
        {
            Some(format!(
                "the lock word ({:#x}) names thread {tid}, whose process does not map the region",
                before.lock
            ))
        } else if let (Some(may), Some(pid)) = (wait.may_hold, proc::thread_group(tid)) {
            (!may(pid)).then(|| {
                format!(
                    "the lock word ({:#x}) names thread {tid} of process {pid}, which is not \
                     registered in the region",
                    before.lock
                )
            })
        } else {
            None
        }?;
        // A word that moved belongs to a lock in use: look again later.
        (self.words(g) == before).then_some(Corruption { words: before, why })
    }

    /// What this thread must find in the mutex while it holds it (glibc
    /// only): the type `init_in_place` wrote, and the list pointers the lock
    /// stored, predicted from this thread's robust-list head when possible
    /// (so a scribble racing the lock cannot be recorded as the truth).
    fn held(&self, g: Option<&GlibcLayout>, links: Option<(u64, u64)>) -> Held {
        Held {
            words: g.map(|g| {
                let (prev, next) = links.unwrap_or_else(|| self.links(g));
                (g.expected_kind, prev, next)
            }),
        }
    }

    /// Writes the type word and list pointers of `held` back if they differ.
    fn write_back(&self, held: &Held) {
        if let (Some(g), Some((kind, prev, next))) = (glibc_layout(), held.words) {
            if self.kind_word(g) != kind || self.links(g) != (prev, next) {
                let base = self.raw() as *const u8;
                // SAFETY: as in `words`; the caller holds the lock, so the
                // only other writers are scribblers, whose writes we undo.
                unsafe {
                    (*(base.add(g.kind) as *const AtomicI32)).store(kind, Ordering::SeqCst);
                    (*(base.add(g.prev) as *const AtomicU64)).store(prev, Ordering::SeqCst);
                    (*(base.add(g.next) as *const AtomicU64)).store(next, Ordering::SeqCst);
                }
            }
        }
    }

    /// Re-examines the mutex and, if it is still corrupt exactly as `seen`
    /// (same words, same verdict), initialises it afresh. Returns whether it
    /// did. Waiters asleep on the old word wake at their next slice.
    ///
    /// # Safety
    ///
    /// The caller must hold a lock that every other repairer of this mutex
    /// takes too (so two repairs never interleave), and must not hold the
    /// mutex itself.
    pub unsafe fn reinit_if_still(
        &self,
        seen: &Corruption,
        wait: &LockWait<'_>,
    ) -> Result<bool, Error> {
        let Some(g) = glibc_layout() else {
            return Ok(false);
        };
        let now = self
            .corrupt_type(g)
            .or_else(|| self.examine_holder(g, wait))
            .or_else(|| {
                // Not recoverable: nobody holds it.
                // SAFETY: as in `lock`; a trylock on a not-recoverable mutex
                // fails without taking it.
                let rc = unsafe { libc::pthread_mutex_trylock(self.raw()) };
                match rc {
                    libc::ENOTRECOVERABLE => Some(self.corruption(g, String::new())),
                    0 | libc::EOWNERDEAD => {
                        // It works: give it back (consistent first, so an
                        // owner-died state is not turned into a broken one).
                        // SAFETY: we hold it (trylock succeeded).
                        unsafe {
                            if rc == libc::EOWNERDEAD {
                                libc::pthread_mutex_consistent(self.raw());
                            }
                            libc::pthread_mutex_unlock(self.raw());
                        }
                        None
                    }
                    _ => None,
                }
            });
        match now {
            Some(c) if c.words == seen.words => {
                // SAFETY: the caller serialises repairs and does not hold the
                // mutex; the words prove nobody holds it (a corrupt word no
                // live thread can release, or a not-recoverable state), so no
                // thread is inside a critical section. The slot is valid,
                // aligned and stays in place (init_in_place's contract, which
                // the original creator met).
                unsafe {
                    std::ptr::write_bytes(self.raw() as *mut u8, 0, MUTEX_BYTES);
                    RobustMutex::init_in_place(self as *const RobustMutex as *mut RobustMutex)?;
                }
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Writes back the type word and list pointers recorded at lock time
    /// (see the module docs), then unlocks.
    pub fn unlock_held(&self, held: &Held) -> Result<(), Error> {
        self.write_back(held);
        self.unlock()
    }

    /// Marks the protected data consistent after [`LockState::OwnerDied`].
    /// Call it while holding the lock, after repairing the data.
    pub fn consistent(&self) -> Result<(), Error> {
        // SAFETY: as in `lock`; pthread checks that we are the owner and
        // that the mutex is in the owner-died state (EINVAL otherwise).
        check("pthread_mutex_consistent", unsafe {
            libc::pthread_mutex_consistent(self.inner.get())
        })
    }

    /// Unlocks. Fails with `EPERM` if the caller does not hold the lock.
    pub fn unlock(&self) -> Result<(), Error> {
        // SAFETY: as in `lock`; a robust mutex checks ownership on unlock
        // and returns EPERM instead of corrupting state.
        check("pthread_mutex_unlock", unsafe {
            libc::pthread_mutex_unlock(self.inner.get())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ptr;
    use std::time::{Duration, Instant};

    /// A `MAP_SHARED | MAP_ANONYMOUS` page shared with forked children.
    struct SharedPage(*mut u8, usize);

    impl SharedPage {
        fn new(len: usize) -> SharedPage {
            // SAFETY: a fresh anonymous mapping; arguments are valid.
            let p = unsafe {
                libc::mmap(
                    ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            SharedPage(p as *mut u8, len)
        }
    }

    impl Drop for SharedPage {
        fn drop(&mut self) {
            // SAFETY: the mapping was created by `new` with this length.
            unsafe { libc::munmap(self.0 as *mut _, self.1) };
        }
    }

    fn setup() -> (
        SharedPage,
        &'static RobustMutex,
        &'static std::sync::atomic::AtomicU32,
    ) {
        let page = SharedPage::new(4096);
        let m = page.0 as *mut RobustMutex;
        // SAFETY: fresh page-aligned zeroed mapping, nobody uses it yet.
        unsafe { RobustMutex::init_in_place(m).unwrap() };
        // SAFETY: initialised above; the page outlives the test body (the
        // 'static here is confined to the test, which drops `page` last).
        let m: &'static RobustMutex = unsafe { &*m };
        // SAFETY: the flag lives after the mutex in the same page, aligned.
        let flag = unsafe { &*(page.0.add(1024) as *const std::sync::atomic::AtomicU32) };
        (page, m, flag)
    }

    /// Forks a child that takes the lock, raises `flag` and waits to be killed.
    fn child_dies_holding(m: &RobustMutex, flag: &std::sync::atomic::AtomicU32) {
        use std::sync::atomic::Ordering;
        // SAFETY: the child only locks, stores, sleeps and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let _ = m.lock();
            flag.store(1, Ordering::SeqCst);
            loop {
                // SAFETY: pause is async-signal-safe; SIGKILL ends it.
                unsafe { libc::pause() };
            }
        }
        let start = Instant::now();
        while flag.load(Ordering::SeqCst) == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "child never locked"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // SAFETY: `pid` is our child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            let mut st = 0;
            libc::waitpid(pid, &mut st, 0);
        }
    }

    #[test]
    fn layout_constants() {
        assert_eq!(MUTEX_LAYOUT_TAG & 0xffff_ffff, MUTEX_BYTES as u64);
        const _: () = assert!(MUTEX_BYTES >= 24);
        assert!(["gnu", "musl", "other"].contains(&LIBC_FLAVOUR));
    }

    #[test]
    fn lock_unlock_and_eperm() {
        let (_page, m, _) = setup();
        assert_eq!(m.lock().unwrap(), LockState::Locked);
        m.unlock().unwrap();
        assert!(m.unlock().is_err(), "unlock without holding is EPERM");
    }

    #[test]
    fn owner_killed_gives_owner_died_then_recovers() {
        let (_page, m, flag) = setup();
        child_dies_holding(m, flag);
        assert_eq!(m.lock().unwrap(), LockState::OwnerDied);
        m.consistent().unwrap();
        m.unlock().unwrap();
        assert_eq!(m.lock().unwrap(), LockState::Locked);
        m.unlock().unwrap();
    }

    #[test]
    fn unlock_without_consistent_is_not_recoverable() {
        let (_page, m, flag) = setup();
        child_dies_holding(m, flag);
        assert_eq!(m.lock().unwrap(), LockState::OwnerDied);
        m.unlock().unwrap();
        let e = m.lock().unwrap_err();
        assert!(e.to_string().contains("not recoverable"), "{e}");
    }

    fn lock_word(m: &RobustMutex) -> &std::sync::atomic::AtomicI32 {
        // SAFETY: the lock word is the mutex's first 4 bytes (checked glibc
        // layout), aligned, and accessed atomically by everyone.
        unsafe { &*(m.raw() as *const std::sync::atomic::AtomicI32) }
    }

    fn wait(ms: u64) -> LockWait<'static> {
        LockWait {
            timeout: Duration::from_millis(ms),
            file: None,
            may_hold: None,
        }
    }

    #[test]
    fn a_word_naming_no_live_thread_is_corrupt_and_repairable() {
        if glibc_layout().is_none() {
            return;
        }
        let (_page, m, _) = setup();
        // 0x3fff_fff0 is above any thread id Linux hands out.
        lock_word(m).store(0x3fff_fff0, std::sync::atomic::Ordering::SeqCst);
        let t = Instant::now();
        let Bounded::Corrupt(c) = m.lock_bounded(&wait(5_000)).unwrap() else {
            panic!("a dead holder's word was taken for a live one");
        };
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert!(c.to_string().contains("does not exist"), "{c}");
        // SAFETY: this test is the only repairer and does not hold the mutex.
        assert!(unsafe { m.reinit_if_still(&c, &wait(0)) }.unwrap());
        let Bounded::Locked(LockState::Locked, held) = m.lock_bounded(&wait(1_000)).unwrap() else {
            panic!("not locked after the repair");
        };
        m.unlock_held(&held).unwrap();
        // A stale report does not repair a healthy mutex again.
        // SAFETY: as above.
        assert!(!unsafe { m.reinit_if_still(&c, &wait(0)) }.unwrap());
    }

    #[test]
    fn own_thread_id_and_scribbled_type_are_corrupt() {
        if glibc_layout().is_none() {
            return;
        }
        let (_page, m, _) = setup();
        lock_word(m).store(proc::gettid(), std::sync::atomic::Ordering::SeqCst);
        let Bounded::Corrupt(c) = m.lock_bounded(&wait(5_000)).unwrap() else {
            panic!("our own id in the word, not held by us, must be corrupt");
        };
        assert!(c.to_string().contains("the caller"), "{c}");
        // SAFETY: sole repairer, not holding the mutex.
        assert!(unsafe { m.reinit_if_still(&c, &wait(0)) }.unwrap());
        let kind = glibc_layout().unwrap().kind;
        // SAFETY: the type word lies inside the mutex, 4-aligned.
        let k =
            unsafe { &*((m.raw() as *const u8).add(kind) as *const std::sync::atomic::AtomicI32) };
        k.store(0x7f, std::sync::atomic::Ordering::SeqCst);
        let Bounded::Corrupt(c) = m.lock_bounded(&wait(5_000)).unwrap() else {
            panic!("a scribbled type word must be corrupt");
        };
        assert!(c.to_string().contains("type word"), "{c}");
        // SAFETY: as above.
        assert!(unsafe { m.reinit_if_still(&c, &wait(0)) }.unwrap());
        assert!(matches!(
            m.lock_bounded(&wait(1_000)).unwrap(),
            Bounded::Locked(..)
        ));
    }

    #[test]
    fn not_recoverable_is_corrupt_and_repairable() {
        if glibc_layout().is_none() {
            return;
        }
        let (_page, m, flag) = setup();
        child_dies_holding(m, flag);
        assert_eq!(m.lock().unwrap(), LockState::OwnerDied);
        m.unlock().unwrap(); // without consistent: not recoverable
        let Bounded::Corrupt(c) = m.lock_bounded(&wait(1_000)).unwrap() else {
            panic!("a not-recoverable mutex cannot be locked");
        };
        // SAFETY: sole repairer, not holding the mutex.
        assert!(unsafe { m.reinit_if_still(&c, &wait(0)) }.unwrap());
        assert!(matches!(
            m.lock_bounded(&wait(1_000)).unwrap(),
            Bounded::Locked(LockState::Locked, _)
        ));
    }

    #[test]
    fn the_list_links_a_lock_stores_are_predicted() {
        let Some(g) = glibc_layout() else {
            return;
        };
        assert!(g.links_known, "glibc stores head and old list in prev/next");
        let (_page, m, _) = setup();
        let Bounded::Locked(_, held) = m.lock_bounded(&wait(1_000)).unwrap() else {
            panic!("not locked");
        };
        let w = m.words(g);
        assert_eq!(held.words, Some((w.kind, w.prev, w.next)));
        m.unlock_held(&held).unwrap();
    }

    #[test]
    fn a_holder_outside_the_allowed_processes_is_corrupt() {
        if glibc_layout().is_none() {
            return;
        }
        let (_page, m, _) = setup();
        // Thread 1 (init) exists; it may not hold this mutex.
        lock_word(m).store(1, std::sync::atomic::Ordering::SeqCst);
        let me = std::process::id() as i32;
        let only_me = move |pid: i32| pid == me;
        let w = LockWait {
            may_hold: Some(&only_me),
            ..wait(5_000)
        };
        let t = Instant::now();
        let Bounded::Corrupt(c) = m.lock_bounded(&w).unwrap() else {
            panic!("init was taken for a holder");
        };
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert!(c.to_string().contains("not registered"), "{c}");
        // SAFETY: sole repairer, not holding the mutex.
        assert!(unsafe { m.reinit_if_still(&c, &w) }.unwrap());
    }

    #[test]
    fn a_live_holder_is_waited_for_then_named_in_an_error() {
        let (_page, m, _) = setup();
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            assert_eq!(m.lock().unwrap(), LockState::Locked);
            locked_tx.send(proc::gettid()).unwrap();
            let _ = done_rx.recv();
            m.unlock().unwrap();
        });
        let tid = locked_rx.recv().unwrap();
        let t = Instant::now();
        let e = m.lock_bounded(&wait(150)).unwrap_err().to_string();
        assert!(
            t.elapsed() >= Duration::from_millis(150),
            "{:?}",
            t.elapsed()
        );
        if glibc_layout().is_some() {
            assert!(e.contains(&tid.to_string()) && e.contains("150 ms"), "{e}");
        }
        done_tx.send(()).unwrap();
        holder.join().unwrap();
        let Bounded::Locked(_, held) = m.lock_bounded(&wait(5_000)).unwrap() else {
            panic!("released, yet not lockable");
        };
        m.unlock_held(&held).unwrap();
    }
}
