//! shmsched versus the alternatives a user would reach for, side by side in
//! one run (see DESIGN.md, "Measuring"). Compare rows by ratio, not by
//! absolute time: the machines are shared and noisy.
//!
//! Groups (names are fixed; the shmsched rows are added in each group's
//! `// shmsched rows go here` slot):
//!
//! - `acquire_release`: one uncontended acquire + release pair on a single
//!   thread. Throughput is 1 element per pair, so criterion prints pairs/s.
//! - `handoff_latency`: a release in one process wakes a waiter in another.
//!   A forked partner ping-pongs with the parent through two cap-1
//!   resources (three shared schedulers for shmsched, so that neither side
//!   can go on alone: see `ShmPingPong`); one criterion iteration is one one-way handoff (half a round
//!   trip), so the time shown is the one-way handoff latency. Parent and
//!   partner are pinned to two different CPUs (or to one CPU with
//!   `SHMSCHED_BENCH_SAME_CPU=1`) so every row of a run measures the same
//!   wakeup path; see `common::Placement`.
//!
//! - `vs_tokio`: the in-process scheduler against `tokio::sync::Semaphore`,
//!   which an in-process async Rust user would otherwise pick, both with
//!   [`PERMITS`] permits: `try_acquire` + drop; an uncontended async
//!   acquire + drop (awaited inside one `block_on` of a current-thread
//!   runtime); and a contended async hand-off: [`HANDOFF_TASKS`] tasks on a
//!   two-worker runtime share one permit, each holding it across a
//!   `yield_now`, so nearly every release hands the permit to a queued
//!   task (one element is one acquisition). Both take an owned permit the
//!   same way: a clone of the handle moved into the acquire and on into
//!   the permit (`acquire_owned_async`, tokio's `acquire_owned`).
//!
//! - `acquire_release/shmsched_queue_drain` is the one contended row: cap 1,
//!   [`DRAIN_WAITERS`] threads queued behind a held permit; the timer runs
//!   from the release of that permit until the last waiter has been admitted
//!   (and has released), so one element is one FIFO handoff from a releasing
//!   thread to a sleeping waiter (a futex wake plus the waiter's wakeup).
//!
//! Adding a row:
//!
//! - `acquire_release`: `g.bench_function("shmsched_…", |b| b.iter(|| { acquire; release }))`
//!   with the object built before `bench_function`.
//! - `handoff_latency`: `handoff_row(&mut g, "shmsched_…", make, child_side, parent_side)`:
//!   `make` builds the shared object(s) (before the fork), `child_side` is one
//!   "wait for the ping, send the pong" step run forever in the forked
//!   partner, `parent_side` is one "send the ping, wait for the pong" round
//!   trip. The fork, watchdog, kill and reap are handled by `handoff_row`.

mod common;

use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};

use common::{
    time_handoffs, Child, FlockFile, Placement, PosixNamedSem, SharedSemPair, SysvSemUndo,
};
use shmsched::region::Region;
use shmsched::scheduler::{Concurrency, Permit, Scheduler};
use shmsched::Priority;

/// Permits in the uncontended `acquire_release` rows.
const PERMITS: u32 = 8;

/// Local cap of each child in the `shmsched_child*` rows.
const CHILD_PERMITS: u32 = 4;

/// Threads queued behind the held permit in `shmsched_queue_drain`.
const DRAIN_WAITERS: usize = 8;

fn acquire_release(c: &mut Criterion) {
    let mut g = c.benchmark_group("acquire_release");
    g.throughput(Throughput::Elements(1));

    {
        let s = Scheduler::new(Concurrency::unlimited()).expect("scheduler");
        g.bench_function("shmsched_local_unlimited", |b| {
            b.iter(|| drop(black_box(s.acquire(Priority::Normal).expect("acquire"))))
        });
    }

    {
        let s = Scheduler::new(Concurrency::unlimited()).expect("scheduler");
        g.bench_function("shmsched_try_acquire", |b| {
            b.iter(|| drop(black_box(s.try_acquire(Priority::Normal).expect("free"))))
        });
    }

    {
        let region = Region::anonymous().expect("region");
        let s = Scheduler::shared(&region, PERMITS).expect("shared scheduler");
        g.bench_function("shmsched_shared", |b| {
            b.iter(|| drop(black_box(s.acquire(Priority::Normal).expect("acquire"))))
        });
    }

    {
        // The same pair on a region a cluster lease holds (armed a day
        // before its deadline, as an agent arms it): with GATE_LEASED the
        // only gate bit, the fast path reads the deadline and the coarse
        // clock, then takes as without a lease.
        let region = Region::anonymous().expect("region");
        let s = Scheduler::shared(&region, PERMITS).expect("shared scheduler");
        let until = Instant::now() + Duration::from_secs(24 * 3600);
        shmsched::cluster::lease_until(&s, u64::from(PERMITS), 1, until).expect("lease");
        g.bench_function("shmsched_shared_leased", |b| {
            b.iter(|| drop(black_box(s.acquire(Priority::Normal).expect("acquire"))))
        });
    }

    // How the shared pair scales with the region's max, uncapped and with a
    // cap on the acquiring priority (a capped pair takes its cells under the
    // region's cap lock, so it must not grow with the max either).
    for max in [1u32, 1024, 65_536] {
        let region = Region::anonymous().expect("region");
        let s = Scheduler::shared(&region, max).expect("shared scheduler");
        g.bench_function(format!("shmsched_shared_max{max}"), |b| {
            b.iter(|| drop(black_box(s.acquire(Priority::Normal).expect("acquire"))))
        });
    }
    for max in [2u32, 1024, 65_536] {
        let region = Region::anonymous().expect("region");
        let s = Scheduler::shared(&region, Concurrency::max(max).normal(max / 2))
            .expect("shared scheduler");
        g.bench_function(format!("shmsched_shared_capped_max{max}"), |b| {
            b.iter(|| drop(black_box(s.acquire(Priority::Normal).expect("acquire"))))
        });
    }

    {
        let root = Scheduler::new(PERMITS).expect("scheduler");
        let child1 = root.child(CHILD_PERMITS).expect("child");
        let child2 = child1.child(CHILD_PERMITS).expect("child");
        // The denominator of the child rows: the same root, acquired
        // directly (the seed's "parent only").
        g.bench_function("shmsched_parent_only", |b| {
            b.iter(|| drop(black_box(root.acquire(Priority::Normal).expect("acquire"))))
        });
        g.bench_function("shmsched_child1", |b| {
            b.iter(|| {
                drop(black_box(
                    child1.acquire(Priority::Normal).expect("acquire"),
                ))
            })
        });
        g.bench_function("shmsched_child2", |b| {
            b.iter(|| {
                drop(black_box(
                    child2.acquire(Priority::Normal).expect("acquire"),
                ))
            })
        });
    }

    queue_drain_row(&mut g);

    {
        let sem = PosixNamedSem::new(PERMITS).expect("sem_open");
        g.bench_function("posix_sem", |b| {
            b.iter(|| {
                sem.wait();
                sem.post();
            })
        });
    }

    {
        let sem = SysvSemUndo::new(PERMITS as i32).expect("semget");
        g.bench_function("sysv_sem_undo", |b| {
            b.iter(|| {
                sem.acquire();
                sem.release();
            })
        });
    }

    {
        let client = jobserver::Client::new(PERMITS as usize).expect("jobserver");
        g.bench_function("jobserver", |b| {
            b.iter(|| drop(black_box(client.acquire().expect("jobserver acquire"))))
        });
    }

    {
        let lock = FlockFile::new().expect("lock file");
        g.bench_function("flock", |b| {
            b.iter(|| {
                lock.lock();
                lock.unlock();
            })
        });
    }

    {
        let m = Mutex::new(0u64);
        g.bench_function("std_mutex", |b| {
            b.iter(|| {
                let mut guard = black_box(&m).lock().expect("poisoned");
                *guard += 1;
            })
        });
    }

    g.finish();
}

/// State shared by the drain row's coordinator and its worker threads.
struct Drain {
    sched: Scheduler,
    /// Round number; bumping it (under the lock) starts a round, `None`
    /// stops the workers.
    round: Mutex<Option<u64>>,
    start: Condvar,
    /// Waiters admitted in the current round.
    admitted: AtomicUsize,
    /// When the last waiter of the round was admitted (set by that waiter).
    end: Mutex<Option<Instant>>,
    finished: Condvar,
}

impl Drain {
    fn worker(&self) {
        let mut seen = 0;
        loop {
            {
                let mut round = self.round.lock().expect("poisoned");
                while *round == Some(seen) {
                    round = self.start.wait(round).expect("poisoned");
                }
                match *round {
                    Some(r) => seen = r,
                    None => return,
                }
            }
            drop(self.sched.acquire(Priority::Normal).expect("acquire"));
            if self.admitted.fetch_add(1, Ordering::SeqCst) + 1 == DRAIN_WAITERS {
                *self.end.lock().expect("poisoned") = Some(Instant::now());
                self.finished.notify_one();
            }
        }
    }

    /// One round: hold the only permit, let every worker queue behind it,
    /// release it and time until the last worker is through.
    fn round(&self) -> Duration {
        let gate = self.sched.acquire(Priority::Normal).expect("acquire");
        self.admitted.store(0, Ordering::SeqCst);
        *self.end.lock().expect("poisoned") = None;
        {
            let mut round = self.round.lock().expect("poisoned");
            *round = round.map(|r| r + 1);
            self.start.notify_all();
        }
        while self.sched.stats().pending < DRAIN_WAITERS as u64 {
            std::thread::sleep(Duration::from_micros(50));
        }
        let start = Instant::now();
        drop(gate);
        let mut end = self.end.lock().expect("poisoned");
        loop {
            if let Some(t) = *end {
                return t - start;
            }
            end = self.finished.wait(end).expect("poisoned");
        }
    }
}

/// `acquire_release/shmsched_queue_drain`: the time for a cap-1 in-process
/// scheduler to hand its slot through [`DRAIN_WAITERS`] queued threads,
/// reported per handoff. Only the drain is timed (not the queueing, not the
/// workers going back to sleep). The workers are joined before the row
/// returns, so the process is single-threaded again for the forking rows.
fn queue_drain_row(g: &mut BenchmarkGroup<'_, WallTime>) {
    let drain = Drain {
        sched: Scheduler::new(1).expect("scheduler"),
        round: Mutex::new(Some(0)),
        start: Condvar::new(),
        admitted: AtomicUsize::new(0),
        end: Mutex::new(None),
        finished: Condvar::new(),
    };
    std::thread::scope(|s| {
        let stop = || {
            *drain.round.lock().expect("poisoned") = None;
            drain.start.notify_all();
        };
        for _ in 0..DRAIN_WAITERS {
            s.spawn(|| drain.worker());
        }
        // Stop the workers even if a sample panics, so the scope can join.
        struct StopOnDrop<F: Fn()>(F);
        impl<F: Fn()> Drop for StopOnDrop<F> {
            fn drop(&mut self) {
                (self.0)()
            }
        }
        let _stop = StopOnDrop(stop);
        g.bench_function("shmsched_queue_drain", |b| {
            b.iter_custom(|iters| {
                let rounds = iters.div_ceil(DRAIN_WAITERS as u64).max(1);
                let total: Duration = (0..rounds).map(|_| drain.round()).sum();
                total.mul_f64(iters as f64 / (rounds * DRAIN_WAITERS as u64) as f64)
            })
        });
    });
}

/// A forked partner, the primitive it shares with the parent, and the
/// parent's own per-row state. `child` is declared first so it is killed and
/// reaped before `state` and `prim` are torn down. `_placement` (held for its
/// `Drop`) is last so the parent's CPU mask is restored after the child is
/// gone.
struct Partner<P, S> {
    child: Child,
    state: S,
    prim: P,
    _placement: Placement,
}

/// Adds a cross-process handoff row. See the module docs for the contract of
/// `make`, `child_side` and `parent_side`. The partner is forked lazily on
/// the first sample (so filtered-out rows fork nothing), reused for every
/// sample of this row, and killed and reaped when the row is done.
fn handoff_row<P>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    id: &str,
    make: impl FnOnce() -> P,
    child_side: fn(&P),
    parent_side: fn(&P),
) {
    handoff_row_stateful(
        g,
        id,
        make,
        |_| (),
        |p, _| child_side(p),
        |_| (),
        |p, _| parent_side(p),
    );
}

/// [`handoff_row`] for primitives whose sides keep state between round trips
/// (e.g. the permit each side holds). In the partner, `child_init` runs once
/// after the fork and `child_side` then runs forever on its state; in the
/// parent, `parent_init` runs once after the fork (it may wait for the
/// partner to be ready) and `parent_side` is one round trip on its state.
fn handoff_row_stateful<P, C, S>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    id: &str,
    make: impl FnOnce() -> P,
    child_init: impl Fn(&P) -> C,
    child_side: impl Fn(&P, &mut C),
    parent_init: impl Fn(&P) -> S,
    parent_side: impl Fn(&P, &mut S),
) {
    let mut make = Some(make);
    let mut partner: Option<Partner<P, S>> = None;
    g.bench_function(id, |b| {
        let p = partner.get_or_insert_with(|| {
            let placement = Placement::pin_parent().expect("cpu affinity");
            eprintln!("{id}: {}", placement.describe());
            let prim = (make.take().expect("made once"))();
            let child = Child::spawn(placement.child_cpu, || {
                let mut state = child_init(&prim);
                loop {
                    child_side(&prim, &mut state)
                }
            })
            .expect("fork");
            let state = parent_init(&prim);
            Partner {
                child,
                state,
                prim,
                _placement: placement,
            }
        });
        p.child.assert_alive();
        let (prim, state) = (&p.prim, &mut p.state);
        b.iter_custom(|iters| time_handoffs(iters, || parent_side(prim, state)))
    });
    drop(partner);
}

/// Exit code of a partner whose primitive failed; the parent then notices via
/// `assert_alive` (or the watchdog) instead of hanging.
fn partner_failed() -> ! {
    // SAFETY: _exit is async-signal-safe and skips the parent's atexit state.
    unsafe { libc::_exit(101) }
}

/// Two cap-1 jobservers (pipes with at most one token in flight), one per
/// direction: a single token pipe cannot force alternation, because the
/// releaser could read its own token back.
struct JobserverPingPong {
    ping: jobserver::Client,
    pong: jobserver::Client,
}

/// Three regions, each a shared scheduler with max 1. Each side always
/// holds a slot the other side needs next, so neither can go on alone, as
/// with the semaphores and the pipe, which only the other side posts: the
/// parent starts holding slots 0 and 1, the partner slot 2; the parent's
/// step `i` releases `i % 3` (which wakes the partner queued on it) and
/// waits for `(i + 2) % 3`; the partner's step `i` waits for `i % 3`, then
/// releases `(i + 2) % 3`, which wakes the parent.
///
/// With two schedulers (each side holding one slot) a side preempted right
/// after its release holds nothing the other needs: the other then runs
/// round trips alone for the rest of its time slice, which the parent's
/// timer counts as hand-off time (`examples/handoff_probe.rs`, mode `shm`:
/// on one CPU about 50 partner loops per parent round trip on average, in
/// bursts of a whole slice after one wake-up preemption in a thousand
/// hand-offs).
///
/// A [`Permit`] borrows its scheduler, and both sides keep permits across
/// round trips, so the schedulers are leaked (`&'static`): three small
/// regions per bench run, in the parent, and the partner's own handles in
/// the partner (which never exits normally).
struct ShmPingPong {
    regions: [Region; 3],
    /// The parent's handles, created before the fork.
    parent: [&'static Scheduler; 3],
    /// The slots the parent holds from `make` until its first round trips.
    first: Cell<[Option<Permit<'static>>; 2]>,
}

/// One side's state: the permits it holds and its step.
struct PingPongSide {
    scheds: [&'static Scheduler; 3],
    held: [Option<Permit<'static>>; 3],
    step: usize,
}

impl PingPongSide {
    /// Parent: release one slot, then wait for the one the partner holds.
    fn release_then_acquire(&mut self) {
        let (give, want) = (self.step % 3, (self.step + 2) % 3);
        drop(self.held[give].take());
        self.held[want] = Some(
            self.scheds[want]
                .acquire(Priority::Normal)
                .expect("shmsched acquire"),
        );
        self.step += 1;
    }

    /// Partner: wait for the slot the parent released, then release one.
    fn acquire_then_release(&mut self) {
        let (want, give) = (self.step % 3, (self.step + 2) % 3);
        let Ok(p) = self.scheds[want].acquire(Priority::Normal) else {
            partner_failed()
        };
        self.held[want] = Some(p);
        drop(self.held[give].take());
        self.step += 1;
    }
}

impl ShmPingPong {
    fn new() -> ShmPingPong {
        let regions = [0, 1, 2].map(|_| Region::anonymous().expect("region"));
        let parent = [0, 1, 2].map(|i| {
            &*Box::leak(Box::new(
                Scheduler::shared(&regions[i], 1).expect("shared scheduler"),
            ))
        });
        let first =
            Cell::new([0, 1].map(|i| Some(parent[i].acquire(Priority::Normal).expect("acquire"))));
        ShmPingPong {
            regions,
            parent,
            first,
        }
    }

    /// In the partner: own handles on the three regions (a Scheduler is not
    /// usable across fork), holding slot 2.
    fn partner(&self) -> PingPongSide {
        let scheds = [0, 1, 2].map(|i| match Scheduler::attach(&self.regions[i]) {
            Ok(s) => &*Box::leak(Box::new(s)),
            Err(_) => partner_failed(),
        });
        let Some(held) = scheds[2].try_acquire(Priority::Normal) else {
            partner_failed()
        };
        PingPongSide {
            scheds,
            held: [None, None, Some(held)],
            step: 0,
        }
    }

    /// In the parent, after the fork: holding slots 0 and 1; waits until the
    /// partner holds slot 2, so the first round trip starts from the steady
    /// state.
    fn parent(&self) -> PingPongSide {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.parent[2].global_running() == 0 {
            assert!(Instant::now() < deadline, "partner never took its slot");
            std::thread::sleep(Duration::from_millis(1));
        }
        let [a, b] = self.first.replace([None, None]);
        PingPongSide {
            scheds: self.parent,
            held: [a, b, None],
            step: 0,
        }
    }
}

fn handoff_latency(c: &mut Criterion) {
    let mut g = c.benchmark_group("handoff_latency");
    g.throughput(Throughput::Elements(1));

    handoff_row_stateful(
        &mut g,
        "shmsched_shared",
        ShmPingPong::new,
        ShmPingPong::partner,
        |_, side| side.acquire_then_release(),
        ShmPingPong::parent,
        |_, side| side.release_then_acquire(),
    );

    handoff_row(
        &mut g,
        "jobserver_pipe",
        || JobserverPingPong {
            ping: jobserver::Client::new(0).expect("jobserver"),
            pong: jobserver::Client::new(0).expect("jobserver"),
        },
        |j| {
            if j.ping.acquire_raw().is_err() || j.pong.release_raw().is_err() {
                partner_failed();
            }
        },
        |j| {
            j.ping.release_raw().expect("jobserver release");
            j.pong.acquire_raw().expect("jobserver acquire");
        },
    );

    handoff_row(
        &mut g,
        "posix_sem",
        || SharedSemPair::new().expect("shared semaphores"),
        |s| {
            s.wait(0);
            s.post(1);
        },
        |s| {
            s.post(0);
            s.wait(1);
        },
    );

    g.finish();
}

/// Tasks sharing one permit in `vs_tokio/*_async_handoff`.
const HANDOFF_TASKS: usize = 4;

/// `iters` acquisitions of one permit by [`HANDOFF_TASKS`] tasks on `rt`,
/// each holding it across a `yield_now` (see the module docs); `acquire`
/// makes one acquisition's future.
fn handoff_rounds<A, F, P>(rt: &tokio::runtime::Runtime, iters: u64, acquire: A) -> Duration
where
    A: Fn() -> F + Clone + Send + 'static,
    F: std::future::Future<Output = P> + Send,
    P: Send,
{
    let per = iters.div_ceil(HANDOFF_TASKS as u64).max(1);
    rt.block_on(async {
        let t = Instant::now();
        let tasks: Vec<_> = (0..HANDOFF_TASKS)
            .map(|_| {
                let acquire = acquire.clone();
                tokio::spawn(async move {
                    for _ in 0..per {
                        let p = acquire().await;
                        tokio::task::yield_now().await;
                        drop(p);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("task");
        }
        t.elapsed()
            .mul_f64(iters as f64 / (per * HANDOFF_TASKS as u64) as f64)
    })
}

/// `vs_tokio`: see the module docs.
fn vs_tokio(c: &mut Criterion) {
    use std::sync::Arc;
    let mut g = c.benchmark_group("vs_tokio");
    g.throughput(Throughput::Elements(1));

    let sched = Scheduler::new(Concurrency::max(PERMITS)).expect("scheduler");
    let sem = tokio::sync::Semaphore::new(PERMITS as usize);
    g.bench_function("shmsched_try_acquire", |b| {
        b.iter(|| {
            drop(black_box(
                sched.try_acquire(Priority::Normal).expect("free"),
            ))
        })
    });
    g.bench_function("tokio_try_acquire", |b| {
        b.iter(|| drop(black_box(sem.try_acquire().expect("free"))))
    });

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    g.bench_function("shmsched_async_acquire", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let t = Instant::now();
                for _ in 0..iters {
                    let p = sched
                        .acquire_async(Priority::Normal)
                        .await
                        .expect("acquire");
                    drop(black_box(p));
                }
                t.elapsed()
            })
        })
    });
    g.bench_function("tokio_async_acquire", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let t = Instant::now();
                for _ in 0..iters {
                    let p = sem.acquire().await.expect("acquire");
                    drop(black_box(p));
                }
                t.elapsed()
            })
        })
    });

    let mt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("runtime");
    let one = Scheduler::new(Concurrency::max(1)).expect("scheduler");
    let one_sem = Arc::new(tokio::sync::Semaphore::new(1));
    g.bench_function("shmsched_async_handoff", |b| {
        b.iter_custom(|iters| {
            let one = one.clone();
            handoff_rounds(&mt, iters, move || {
                let s = one.clone();
                async move {
                    s.acquire_owned_async(Priority::Normal)
                        .await
                        .expect("acquire")
                }
            })
        })
    });
    g.bench_function("tokio_async_handoff", |b| {
        b.iter_custom(|iters| {
            let sem = one_sem.clone();
            handoff_rounds(&mt, iters, move || {
                let s = sem.clone();
                async move { s.acquire_owned().await.expect("acquire") }
            })
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    targets = acquire_release, handoff_latency, vs_tokio
}
criterion_main!(benches);
