//! A process-shared, robust pthread mutex that lives inside shared memory.
//!
//! # How it works
//!
//! [`RobustMutex`] is a `#[repr(C)]` slot holding one `pthread_mutex_t`.
//! [`RobustMutex::init_in_place`] initialises it where it lies (in a mapped
//! region) with `PTHREAD_PROCESS_SHARED`, so any process that maps the same
//! bytes can use it, and `PTHREAD_MUTEX_ROBUST`, so the kernel and libc
//! cooperate to notice a holder that dies: the next [`RobustMutex::lock`]
//! succeeds with `EOWNERDEAD` and reports [`LockState::OwnerDied`]. The new
//! holder owns the lock, must repair the protected data, then call
//! [`RobustMutex::consistent`] before unlocking; unlocking without it marks
//! the mutex permanently unusable, after which `lock` fails with
//! `ENOTRECOVERABLE` (reported as an error, never a hang).
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
//! `unsafe` on [`RobustMutex::init_in_place`]).

use std::cell::UnsafeCell;
use std::io;
use std::mem;

use crate::error::Error;

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

    /// Locks, sleeping while another thread or process holds the mutex.
    ///
    /// Returns [`LockState::OwnerDied`] when the previous holder died with
    /// it locked (the caller now holds it). `ENOTRECOVERABLE` (a previous
    /// owner-died recovery unlocked without [`RobustMutex::consistent`]) and
    /// any other failure are errors.
    pub fn lock(&self) -> Result<LockState, Error> {
        // SAFETY: `self` was initialised by `init_in_place` (a `RobustMutex`
        // is only reachable through memory its creator initialised) and the
        // pointer is valid for the lifetime of `&self`.
        let rc = unsafe { libc::pthread_mutex_lock(self.inner.get()) };
        match rc {
            0 => Ok(LockState::Locked),
            libc::EOWNERDEAD => Ok(LockState::OwnerDied),
            libc::ENOTRECOVERABLE => Err(Error::BadRegion(
                "the region's robust mutex is not recoverable: a holder died and the next holder released it \
                 without marking the data consistent; recreate the region"
                    .into(),
            )),
            other => Err(Error::io("pthread_mutex_lock", None, io::Error::from_raw_os_error(other))),
        }
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
}
