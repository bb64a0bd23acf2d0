//! A small mutex that a forked child can always take.
//!
//! A `std::sync::Mutex` held by another thread at the moment of `fork` stays
//! locked forever in the child (the thread that would unlock it does not
//! exist there). The region keeps per-process bookkeeping (the bound-mapping
//! cache, the registration) behind locks that a forked child must be able to
//! take, so it uses this lock instead: the lock word holds the holder's
//! *process token* ([`sys::fork::process_token`]), not its pid. A child that
//! finds the word holding a token other than its own knows the holder was a
//! thread of an ancestor, *steals* the lock, and resets the protected value
//! to its default without reading or dropping it (it may be half-written).
//! That is sound for the values kept here, because everything they record
//! belongs to the ancestor and a child starts over anyway.
//!
//! A pid would not do: a grandchild can be given the pid of its grandparent
//! once that has exited, and would then take the grandparent's lock for one
//! held by a thread of its own, and wait forever. A token is derived from
//! the fork generation, which every fork increments in the child, so no
//! descendant ever has its ancestor's token.
//!
//! Threads of one process wait for each other on the word with a futex (the
//! critical sections are a few syscalls long).

use crate::sync::atomic::{AtomicU32, Ordering};
use std::cell::UnsafeCell;
use std::time::Duration;

use crate::sys;

/// A mutex whose lock a forked child can take over (see the module docs).
pub(crate) struct ForkSafeMutex<T: Default> {
    holder: AtomicU32,
    value: UnsafeCell<T>,
}

// SAFETY: access to `value` is serialised by `holder` (one guard at a time
// per process); a value is only moved between threads through the guard, so
// `T: Send` suffices, as for `std::sync::Mutex`.
unsafe impl<T: Default + Send> Sync for ForkSafeMutex<T> {}
// SAFETY: as above.
unsafe impl<T: Default + Send> Send for ForkSafeMutex<T> {}

impl<T: Default> std::fmt::Debug for ForkSafeMutex<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForkSafeMutex")
            .field("holder", &self.holder.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Exclusive access to a [`ForkSafeMutex`]'s value.
pub(crate) struct ForkSafeGuard<'a, T: Default> {
    lock: &'a ForkSafeMutex<T>,
}

impl<T: Default> ForkSafeMutex<T> {
    /// A new unlocked mutex.
    pub(crate) const fn new(value: T) -> Self {
        ForkSafeMutex {
            holder: AtomicU32::new(0),
            value: UnsafeCell::new(value),
        }
    }

    /// Locks, waiting for other threads of this process; takes the lock over
    /// (resetting the value) if a thread of a parent process held it at fork.
    pub(crate) fn lock(&self) -> ForkSafeGuard<'_, T> {
        // Without the atfork handler a fork would not change the token; the
        // pid (never 0 for a process) is the best that is left then.
        let me = sys::fork::process_token().unwrap_or(sys::file::getpid() as u32);
        loop {
            let cur = self.holder.load(Ordering::Acquire);
            if cur == 0 {
                if self
                    .holder
                    .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return ForkSafeGuard { lock: self };
                }
            } else if cur != me {
                if self
                    .holder
                    .compare_exchange(cur, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    // SAFETY: we now hold the lock; no other thread of this
                    // process can hold a guard (the word held a foreign token).
                    // The old value may be torn, so it is overwritten without
                    // being read or dropped (leaking whatever it owned, which
                    // belonged to the parent).
                    unsafe { std::ptr::write(self.value.get(), T::default()) };
                    return ForkSafeGuard { lock: self };
                }
            } else {
                // Another thread of this process holds it; the timeout only
                // bounds the cost of a missed wake, which cannot happen here.
                sys::futex_wait(&self.holder, cur, Some(Duration::from_millis(50)));
            }
        }
    }
}

impl<T: Default> std::ops::Deref for ForkSafeGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves exclusive access within this process.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T: Default> std::ops::DerefMut for ForkSafeGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves exclusive access within this process.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T: Default> Drop for ForkSafeGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.holder.store(0, Ordering::Release);
        sys::futex_wake(&self.lock.holder, i32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn excludes_threads() {
        let m = Arc::new(ForkSafeMutex::new(0u64));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        let mut g = m.lock();
                        let v = *g;
                        std::hint::black_box(());
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(*m.lock(), 8000);
    }

    #[test]
    fn foreign_holder_is_taken_over() {
        let m = ForkSafeMutex::new(5u32);
        // Simulate a lock inherited from a parent whose thread held it.
        let me = sys::fork::process_token().unwrap();
        m.holder.store(me.wrapping_add(7), Ordering::SeqCst);
        let g = m.lock();
        assert_eq!(*g, 0, "value reset on takeover");
    }

    /// A lock held by a thread of an ancestor at fork time is taken over in
    /// a child and in a grandchild, even when the grandchild's pid is the
    /// one the ancestor had (simulated: the word is set to this process's
    /// pid, which is what the old pid-based lock recorded and what a reused
    /// pid would look like).
    #[test]
    fn lock_held_at_fork_is_taken_over_by_descendants() {
        let m = Arc::new(ForkSafeMutex::new(5u32));
        let (m2, held) = (m.clone(), Arc::new(std::sync::Barrier::new(2)));
        let (h2, done) = (held.clone(), Arc::new(std::sync::Barrier::new(2)));
        let d2 = done.clone();
        let t = std::thread::spawn(move || {
            let _g = m2.lock();
            h2.wait(); // held while the main thread forks
            d2.wait();
        });
        held.wait();
        // SAFETY: the child only locks the mutex (atomics and futex calls),
        // forks once more and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let ok_child = *m.lock() == 0;
            // The grandchild inherits a word that names a pid equal to its own.
            // SAFETY: as above.
            let g = unsafe { libc::fork() };
            if g == 0 {
                m.holder.store(sys::file::getpid() as u32, Ordering::SeqCst);
                let code = i32::from(*m.lock() != 0);
                // SAFETY: leave without running the test harness's destructors.
                unsafe { libc::_exit(code) };
            }
            let code = wait_exit(g, 10).map_or(3, |c| c + i32::from(!ok_child) * 2);
            // SAFETY: as above.
            unsafe { libc::_exit(code) };
        }
        done.wait();
        t.join().unwrap();
        assert_eq!(wait_exit(pid, 20), Some(0));
    }

    /// The exit code of child `pid`, or `None` (after killing it) if it has
    /// not exited within `secs`.
    fn wait_exit(pid: libc::pid_t, secs: u64) -> Option<i32> {
        let deadline = std::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let mut st = 0;
            // SAFETY: waitpid on our own child with a valid status pointer.
            let r = unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) };
            if r == pid {
                return libc::WIFEXITED(st).then(|| libc::WEXITSTATUS(st));
            }
            if std::time::Instant::now() > deadline {
                // SAFETY: plain kill of our own child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}
