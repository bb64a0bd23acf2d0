//! Waiting across processes, the mechanism both shared objects use.
//!
//! - A *waiting-process bitmap* (bit `i` set while process `i` has waiters)
//!   lives in the object's area; [`Waiters`] is a view over it. A process
//!   sets or clears only its own bit, from its own counts, and re-checks
//!   after a clear, because another thread of the same process (sharing its
//!   registration) may have added a waiter in between.
//! - Each process sleeps on the `futex` word of its own process-table entry
//!   ([`Mapping::sleep_on`]) and is woken through it
//!   ([`Mapping::wake_process`]). Sleepers count themselves in
//!   `obj[SLEEPERS]` before re-checking the word and the waker bumps the word
//!   before reading the count (both SeqCst), so one of the two always sees
//!   the other, and a wake that finds nobody asleep makes no syscall.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::Mapping;
use crate::sys::futex::{futex_wait, futex_wake};

/// The process-entry object word that counts the process's threads asleep
/// on its futex word. Objects that use [`Waiters`] keep their own per-process
/// words below it.
pub const SLEEPERS: usize = 7;

/// A view over a waiting-process bitmap in an object area.
#[derive(Debug, Clone, Copy)]
pub struct Waiters<'a> {
    bits: &'a [AtomicU64],
}

impl<'a> Waiters<'a> {
    /// Views `bits` (one bit per process-table entry; only the words the
    /// region's process slots need).
    pub fn new(bits: &'a [AtomicU64]) -> Waiters<'a> {
        Waiters { bits }
    }

    /// True if any process has waiters.
    #[inline]
    pub fn anyone(&self) -> bool {
        self.bits.iter().any(|w| w.load(Ordering::SeqCst) != 0)
    }

    /// Sets or clears process `idx`'s bit to match `has_waiters()`; after a
    /// clear, looks again and sets it back if a waiter arrived meanwhile.
    pub fn mark(&self, idx: u32, has_waiters: impl Fn() -> bool) {
        let Some(word) = self.bits.get(idx as usize / 64) else {
            return;
        };
        let bit = 1u64 << (idx % 64);
        if has_waiters() {
            word.fetch_or(bit, Ordering::SeqCst);
        } else {
            word.fetch_and(!bit, Ordering::SeqCst);
            if has_waiters() {
                word.fetch_or(bit, Ordering::SeqCst);
            }
        }
    }

    /// Clears process `idx`'s bit (a dead process being reaped).
    pub fn clear(&self, idx: u32) {
        if let Some(word) = self.bits.get(idx as usize / 64) {
            word.fetch_and(!(1u64 << (idx % 64)), Ordering::SeqCst);
        }
    }

    /// The processes whose bit is set now, lowest entry first.
    pub fn each(&self) -> impl Iterator<Item = u32> + 'a {
        self.bits.iter().enumerate().flat_map(|(w, word)| {
            let mut v = word.load(Ordering::SeqCst);
            std::iter::from_fn(move || {
                if v == 0 {
                    return None;
                }
                let b = v.trailing_zeros();
                v &= v - 1;
                Some(w as u32 * 64 + b)
            })
        })
    }
}

impl Mapping {
    /// Wakes every thread of process `idx` asleep on its futex word. Returns
    /// true if it made the syscall (someone slept there).
    pub fn wake_process(&self, idx: u32) -> bool {
        let Ok(e) = self.proc_entry(idx) else {
            return false;
        };
        e.futex.fetch_add(1, Ordering::SeqCst);
        if e.obj[SLEEPERS].load(Ordering::SeqCst) == 0 {
            return false;
        }
        futex_wake(&e.futex, i32::MAX);
        true
    }

    /// Sleeps on process `idx`'s futex word (the caller's own) until woken
    /// or `nap` passes, unless the word moved past `seq` already.
    pub fn sleep_on(&self, idx: u32, seq: u32, nap: Duration) {
        let Ok(e) = self.proc_entry(idx) else {
            std::thread::sleep(nap);
            return;
        };
        e.obj[SLEEPERS].fetch_add(1, Ordering::SeqCst);
        futex_wait(&e.futex, seq, Some(nap));
        e.obj[SLEEPERS].fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mark_clear_and_each() {
        let words: Vec<AtomicU64> = (0..2).map(|_| AtomicU64::new(0)).collect();
        let w = Waiters::new(&words);
        assert!(!w.anyone());
        w.mark(3, || true);
        w.mark(70, || true);
        assert_eq!(w.each().collect::<Vec<_>>(), vec![3, 70]);
        w.mark(3, || false);
        w.clear(70);
        w.clear(500); // out of range: ignored
        assert!(!w.anyone());
    }
}
