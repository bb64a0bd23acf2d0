//! A handle's per-tier token counter, cheap for the first thread that
//! counts through it.
//!
//! A locked add costs even uncontended: 4.5 ns of an in-process consume's
//! 27.3 here (`examples/consume_cost.rs`). Most handles are used by one
//! thread, so the counter has an *owner*: the first thread that counts
//! through it claims it with one CAS, and from then on adds to its own
//! words with a plain load and store (only it writes them, so nothing is
//! lost); every other thread adds to the second words with `fetch_add`.
//! A reader sums both, each word read whole.
//!
//! Threads are named by a per-thread id from a process-wide counter
//! ([`thread_id`](crate::sys::fork::thread_id)), assigned when a thread
//! first tries to claim a counter, never reused (a TLS address would be: a
//! thread started later may get it), so an owner's words have one writer
//! ever. An owner that exits leaves its words as they are; later threads
//! count on the shared words.
//!
//! **The owner test is the fork test.** A forked child's one thread loses
//! its id at the fork and gets a new one, past every id the parent had
//! given; a counter is claimed only while its handle's fork generation is
//! the process's. So a thread that finds its own id as the owner
//! ([`Tally::owned_here`]) knows the handle was usable when it claimed it
//! and that no fork happened since: the consume fast path skips the fork
//! generation's load and compare for the owner (4 instructions), and
//! every other thread makes it.
//!
//! Under `--cfg shuttle` the counter is one `fetch_add` word per tier: the
//! model checks the protocols, not this.

use crate::priority::LEVELS;

#[cfg(not(shuttle))]
mod imp {
    use super::LEVELS;
    use crate::sys::fork::{assign_thread_id, fork_generation, thread_id};
    use std::sync::atomic::{AtomicU64, Ordering};

    /// `owner` of a counter no thread has claimed (never a thread's id).
    const UNCLAIMED: u64 = u64::MAX;

    /// Tokens per tier, see the module docs.
    #[derive(Debug)]
    pub(crate) struct Tally {
        /// The id of the thread that writes `own`, or [`UNCLAIMED`].
        owner: AtomicU64,
        /// Written only by the owner, with a load and a store.
        own: [AtomicU64; LEVELS],
        /// Every other thread's counts, `fetch_add`.
        other: [AtomicU64; LEVELS],
    }

    impl Default for Tally {
        fn default() -> Tally {
            Tally {
                owner: AtomicU64::new(UNCLAIMED),
                own: Default::default(),
                other: Default::default(),
            }
        }
    }

    impl Tally {
        /// Whether the calling thread owns this counter: only if it
        /// claimed it, in this process after its last fork (see the module
        /// docs), so the caller's handle was usable when the claim was
        /// made and no fork has happened since.
        #[inline(always)]
        pub fn owned_here(&self) -> bool {
            // `thread_id` is 0 for a thread without an id and `owner` never
            // is; only this thread ever stores its own id there, so a
            // relaxed load sees it if it did.
            self.owner.load(Ordering::Relaxed) == thread_id()
        }

        /// Who owns this counter: `Some(true)` the calling thread (as
        /// [`owned_here`](Self::owned_here)), `Some(false)` another
        /// thread, `None` no thread yet. For a caller that counts without
        /// calling out of line: [`add_owned`](Self::add_owned) or
        /// [`add_other`](Self::add_other), and [`add`](Self::add) (which
        /// may claim) for `None`.
        #[inline(always)]
        pub fn owner_is_me(&self) -> Option<bool> {
            let o = self.owner.load(Ordering::Relaxed);
            if o == thread_id() {
                Some(true)
            } else if o != UNCLAIMED {
                Some(false)
            } else {
                None
            }
        }

        /// Counts `n` at `tier` (`tier < LEVELS`) for the counter's owner:
        /// the caller has seen [`owned_here`](Self::owned_here) true.
        #[inline(always)]
        pub fn add_owned(&self, tier: usize, n: u64) {
            let w = &self.own[tier];
            w.store(w.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
        }

        /// Counts `n` at `tier` (`tier < LEVELS`) for a thread that does
        /// not own the counter: the caller has seen
        /// [`owner_is_me`](Self::owner_is_me) say `Some(false)`.
        #[inline(always)]
        pub fn add_other(&self, tier: usize, n: u64) {
            self.other[tier].fetch_add(n, Ordering::Relaxed);
        }

        /// Counts `n` at `tier` (`tier < LEVELS`) for a handle made in fork
        /// generation `gen` (the counter is claimed only while that is the
        /// process's: see [`owned_here`](Self::owned_here)).
        #[inline(always)]
        pub fn add(&self, tier: usize, n: u64, gen: u64) {
            let me = thread_id();
            let owner = self.owner.load(Ordering::Relaxed);
            // `me` is 0 for a thread without an id and `owner` never is.
            if owner == me {
                self.add_owned(tier, n);
            } else if owner != UNCLAIMED {
                self.add_other(tier, n);
            } else {
                self.claim(me, tier, n, gen);
            }
        }

        /// [`add`](Self::add) while no thread owns the counter: claims it
        /// (giving this thread its id first), or, if another thread was
        /// quicker or the handle is a forked parent's, counts on the shared
        /// words.
        #[cold]
        #[inline(never)]
        fn claim(&self, me: u64, tier: usize, n: u64, gen: u64) {
            if gen != fork_generation() {
                self.other[tier].fetch_add(n, Ordering::Relaxed);
                return;
            }
            let me = if me == 0 { assign_thread_id() } else { me };
            if self
                .owner
                .compare_exchange(UNCLAIMED, me, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                // Ours now: no other thread writes `own`.
                let w = &self.own[tier];
                w.store(w.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
            } else {
                self.other[tier].fetch_add(n, Ordering::Relaxed);
            }
        }

        /// The tokens counted at `tier`.
        pub fn get(&self, tier: usize) -> u64 {
            self.own[tier]
                .load(Ordering::Relaxed)
                .wrapping_add(self.other[tier].load(Ordering::Relaxed))
        }
    }
}

#[cfg(shuttle)]
mod imp {
    use super::LEVELS;
    use crate::sync::atomic::{AtomicU64, Ordering};

    /// Tokens per tier: one `fetch_add` word each under the model checker.
    #[derive(Debug, Default)]
    pub(crate) struct Tally {
        words: [AtomicU64; LEVELS],
    }

    impl Tally {
        /// Never: the model checks the fork test on every consume.
        #[inline(always)]
        pub fn owned_here(&self) -> bool {
            false
        }

        /// Always another thread (nothing is owned here): every count is
        /// a `fetch_add`.
        #[inline(always)]
        pub fn owner_is_me(&self) -> Option<bool> {
            Some(false)
        }

        /// Counts `n` at `tier` (`tier < LEVELS`).
        #[inline(always)]
        pub fn add_other(&self, tier: usize, n: u64) {
            self.add(tier, n, 0);
        }

        /// Counts `n` at `tier` (`tier < LEVELS`); not reached (nothing is
        /// owned here).
        #[inline(always)]
        pub fn add_owned(&self, tier: usize, n: u64) {
            self.add(tier, n, 0);
        }

        /// Counts `n` at `tier` (`tier < LEVELS`).
        #[inline(always)]
        pub fn add(&self, tier: usize, n: u64, _gen: u64) {
            self.words[tier].fetch_add(n, Ordering::Relaxed);
        }

        /// The tokens counted at `tier`.
        pub fn get(&self, tier: usize) -> u64 {
            self.words[tier].load(Ordering::Relaxed)
        }
    }
}

pub(crate) use imp::Tally;

#[cfg(all(test, not(shuttle)))]
mod tests {
    use super::*;
    use crate::sys::fork::fork_generation;
    use std::sync::{Arc, Barrier};

    /// Threads counting through one tally, the owner among them, then one
    /// started after the owner exited: the sums are exact.
    #[test]
    fn many_threads_exact() {
        const THREADS: u64 = 4;
        const PER: u64 = 200_000;
        let t = Arc::new(Tally::default());
        let go = Arc::new(Barrier::new(THREADS as usize));
        let hs: Vec<_> = (0..THREADS)
            .map(|i| {
                let (t, go) = (t.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    for k in 0..PER {
                        t.add((k % 2) as usize, i + 1, fork_generation());
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let want: u64 = (1..=THREADS).map(|i| i * PER).sum();
        assert_eq!(t.get(0) + t.get(1), want);
        assert_eq!(t.get(0), want / 2);
        // The owner has exited; a new thread counts on.
        let t2 = t.clone();
        std::thread::spawn(move || (0..PER).for_each(|_| t2.add(3, 1, fork_generation())))
            .join()
            .unwrap();
        assert_eq!(t.get(3), PER);
        t.add(3, 5, fork_generation());
        assert_eq!(t.get(3), PER + 5);
    }

    /// The claiming thread owns the counter, another thread does not, a
    /// handle of another fork generation is never claimed, and the counts
    /// are exact either way.
    #[test]
    fn ownership() {
        let t = Tally::default();
        assert!(!t.owned_here(), "unclaimed");
        t.add(2, 5, fork_generation());
        assert!(t.owned_here());
        t.add_owned(2, 1);
        std::thread::scope(|s| {
            s.spawn(|| {
                assert!(!t.owned_here());
                t.add(2, 10, fork_generation());
            });
        });
        assert_eq!(t.get(2), 16);
        let old = Tally::default();
        old.add(0, 3, fork_generation().wrapping_add(1));
        assert!(!old.owned_here());
        assert_eq!(old.get(0), 3);
    }
}
