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
//! Threads are named by a per-thread id from a process-wide counter,
//! assigned when a thread first tries to claim a counter, never reused (a TLS address
//! would be: a thread started later may get it), so an owner's words have
//! one writer ever. An owner that exits leaves its words as they are; later
//! threads count on the shared words. A forked child copies the counter
//! of ids with the rest, so its new threads get ids no thread had.
//!
//! Under `--cfg shuttle` the counter is one `fetch_add` word per tier: the
//! model checks the protocols, not this.

use crate::priority::LEVELS;

#[cfg(not(shuttle))]
mod imp {
    use super::LEVELS;
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// `owner` of a counter no thread has claimed (never a thread's id).
    const UNCLAIMED: u64 = u64::MAX;

    /// The next thread id (0 is "not assigned yet").
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);

    thread_local! {
        /// This thread's id, 0 until its first count. Const-initialised and
        /// without a destructor: reading it is one load, at any point of
        /// the thread's life (also in other thread-locals' destructors).
        static ID: Cell<u64> = const { Cell::new(0) };
    }

    /// This thread's id, or 0 if it has none yet.
    #[inline(always)]
    fn thread_id() -> u64 {
        ID.with(Cell::get)
    }

    /// Gives this thread its id.
    #[cold]
    fn assign_id() -> u64 {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        ID.with(|c| c.set(id));
        id
    }

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
        /// Counts `n` at `tier` (`tier < LEVELS`).
        #[inline(always)]
        pub fn add(&self, tier: usize, n: u64) {
            let me = thread_id();
            let owner = self.owner.load(Ordering::Relaxed);
            // `me` is 0 for a thread without an id and `owner` never is.
            if owner == me {
                let w = &self.own[tier];
                w.store(w.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
            } else if owner != UNCLAIMED {
                self.other[tier].fetch_add(n, Ordering::Relaxed);
            } else {
                self.claim(me, tier, n);
            }
        }

        /// [`add`](Self::add) while no thread owns the counter: claims it
        /// (giving this thread its id first), or, if another thread was
        /// quicker, counts on the shared words.
        #[cold]
        #[inline(never)]
        fn claim(&self, me: u64, tier: usize, n: u64) {
            let me = if me == 0 { assign_id() } else { me };
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
        /// Counts `n` at `tier` (`tier < LEVELS`).
        #[inline(always)]
        pub fn add(&self, tier: usize, n: u64) {
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
                        t.add((k % 2) as usize, i + 1);
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
        std::thread::spawn(move || (0..PER).for_each(|_| t2.add(3, 1)))
            .join()
            .unwrap();
        assert_eq!(t.get(3), PER);
        t.add(3, 5);
        assert_eq!(t.get(3), PER + 5);
    }
}
