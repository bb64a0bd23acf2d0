//! Owned permits and weighted acquires, in one process, on an in-process
//! scheduler and on one shared through a region: owned permits move into
//! threads and tokio tasks and are released there exactly once; weighted
//! waiters never push the count above the max and never deadlock each
//! other. (Weighted acquires across processes: `xsched.rs`.)

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use shmsched::region::Region;
use shmsched::scheduler::{OwnedPermit, Scheduler};
use shmsched::Priority;

const MAX: u32 = 3;

/// Counts units held as the holders see them: raised after an acquire
/// returns, lowered before the permit drops, so it never exceeds what the
/// scheduler really lets run; the highest value is kept.
#[derive(Default)]
struct Held {
    now: AtomicU32,
    peak: AtomicU32,
}

impl Held {
    fn enter(&self, units: u32) {
        let now = self.now.fetch_add(units, Ordering::SeqCst) + units;
        self.peak.fetch_max(now, Ordering::SeqCst);
    }
    fn leave(&self, units: u32) {
        self.now.fetch_sub(units, Ordering::SeqCst);
    }
    fn peak(&self) -> u32 {
        self.peak.load(Ordering::SeqCst)
    }
}

/// An in-process scheduler of `MAX`, and one shared through an anonymous
/// region (kept alive beside it).
fn both() -> Vec<(&'static str, Scheduler, Option<Region>)> {
    let region = Region::anonymous().expect("anonymous region");
    let shared = Scheduler::shared(&region, MAX).expect("shared scheduler");
    vec![
        ("in-process", Scheduler::new(MAX).expect("scheduler"), None),
        ("shared", shared, Some(region)),
    ]
}

/// `acquire_owned` on this thread, the permit moved into a spawned thread
/// and dropped there: 24 threads through 3 slots; at most 3 held at once
/// (the owners count themselves), every slot back at the end.
#[test]
fn owned_permits_move_into_threads() {
    for (home, s, _region) in both() {
        let held = Arc::new(Held::default());
        let mut workers = Vec::new();
        for i in 0..24 {
            let permit: OwnedPermit = s
                .acquire_owned_timeout(Priority::Normal, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("{home}: acquire_owned #{i}: {e:?}"));
            assert_eq!(permit.units(), 1);
            held.enter(1);
            let held = held.clone();
            workers.push(thread::spawn(move || {
                thread::yield_now();
                held.leave(1);
                drop(permit);
            }));
        }
        for w in workers {
            w.join().expect("worker");
        }
        let st = s.stats();
        assert!(held.peak() <= MAX, "{home}: {} held at once", held.peak());
        assert_eq!(st.running, 0, "{home}: slots left held: {st:?}");
        // All three are free again, and no more.
        let p: Vec<_> = (0..MAX)
            .map(|_| s.try_acquire(Priority::Normal).expect("free slot"))
            .collect();
        assert!(
            s.try_acquire(Priority::Normal).is_none(),
            "{home}: a 4th slot"
        );
        drop(p);
    }
}

/// Owned permits in tokio tasks, both ways: acquired by the task itself
/// (`acquire_async(..).await` then `into_owned`, moved into a nested task)
/// and acquired outside and moved in. 64 tasks on a multi-thread runtime
/// through 3 slots.
#[test]
fn owned_permits_move_into_tokio_tasks() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    for (home, s, _region) in both() {
        let held = Arc::new(Held::default());
        rt.block_on(async {
            let mut tasks = Vec::new();
            for i in 0..32 {
                let (s, held) = (s.clone(), held.clone());
                tasks.push(tokio::spawn(async move {
                    let permit = s
                        .acquire_async(Priority::High)
                        .await
                        .unwrap_or_else(|e| panic!("task #{i}: {e:?}"))
                        .into_owned();
                    held.enter(1);
                    // The permit moves on into a task of its own.
                    tokio::spawn(async move {
                        tokio::task::yield_now().await;
                        held.leave(1);
                        drop(permit);
                    })
                    .await
                    .expect("inner task");
                }));
            }
            for i in 0..32 {
                let permit = loop {
                    // Acquired outside the task, without blocking the
                    // runtime's thread.
                    if let Some(p) = s.try_acquire_owned(Priority::Low) {
                        break p;
                    }
                    tokio::task::yield_now().await;
                };
                held.enter(1);
                let held = held.clone();
                tasks.push(tokio::spawn(async move {
                    tokio::task::yield_now().await;
                    held.leave(1);
                    assert_eq!(permit.priority(), Priority::Low, "#{i}");
                    drop(permit);
                }));
            }
            for t in tasks {
                t.await.expect("task");
            }
        });
        let st = s.stats();
        assert!(held.peak() <= MAX, "{home}: {} held at once", held.peak());
        assert_eq!(st.running, 0, "{home}: slots left held: {st:?}");
    }
}

/// Two weighted waiters that each need 2 of 3 units (so they can never
/// both hold) and a single-slot thread, 500 rounds each: none ever
/// waits 10 s (no deadlock: a weighted take is all or nothing, never a
/// partial hold), and the units held never exceed the max.
#[test]
fn weighted_waiters_never_deadlock_or_exceed_the_max() {
    for (home, s, _region) in both() {
        let held = Arc::new(Held::default());
        let start = Arc::new(Barrier::new(3));
        let workers: Vec<_> = [2u32, 2, 1]
            .into_iter()
            .map(|n| {
                let (s, held, start) = (s.clone(), held.clone(), start.clone());
                thread::spawn(move || {
                    start.wait();
                    for round in 0..500 {
                        let p = s
                            .acquire_many_timeout(Priority::Normal, n, Duration::from_secs(10))
                            .unwrap_or_else(|e| {
                                panic!("{home}: acquire_many({n}) #{round}: {e:?}")
                            });
                        assert_eq!(p.units(), n);
                        held.enter(n);
                        thread::yield_now();
                        held.leave(n);
                        drop(p);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("worker");
        }
        let st = s.stats();
        assert!(
            held.peak() <= MAX,
            "{home}: {} units held at once",
            held.peak()
        );
        assert_eq!(st.running, 0, "{home}: units left held: {st:?}");
        // More than the max can never be asked for.
        let e = s.acquire_many(Priority::Normal, MAX + 1).unwrap_err();
        assert!(
            e.to_string().contains(&format!("{}", MAX + 1)),
            "{home}: {e}"
        );
    }
}

/// A weighted acquire above its priority's cap (below the max) could only
/// come in through a lottery pick: it is refused at once, blocking, timed
/// and async, in both homes, naming n, the priority and the cap. At the cap
/// it is admitted; one unit at a cap of 0 still waits for the lottery (the
/// seed's rule), so it times out rather than being refused.
#[test]
fn weighted_acquire_above_its_priority_cap_is_refused_at_once() {
    use shmsched::scheduler::Concurrency;
    use shmsched::Error;
    let region = Region::anonymous().expect("anonymous region");
    let caps = || Concurrency::max(8).low(2).lowest(0);
    let homes = [
        ("in-process", Scheduler::new(caps()).expect("scheduler")),
        (
            "shared",
            Scheduler::shared(&region, caps()).expect("shared scheduler"),
        ),
    ];
    for (home, s) in homes {
        let refused = |r: shmsched::Result<u32>, how: &str| match r {
            Err(Error::InvalidArgument(m)) => {
                assert!(
                    m.contains("3 slots") && m.contains("low") && m.contains("cap at low is 2"),
                    "{home} {how}: {m}"
                );
            }
            other => panic!("{home} {how}: {other:?}"),
        };
        let t = std::time::Instant::now();
        refused(
            s.acquire_many(Priority::Low, 3).map(|p| p.units()),
            "blocking",
        );
        refused(
            s.acquire_many_timeout(Priority::Low, 3, Duration::from_secs(5))
                .map(|p| p.units()),
            "timed",
        );
        refused(
            futures::executor::block_on(s.acquire_many_async(Priority::Low, 3)).map(|p| p.units()),
            "async",
        );
        assert!(t.elapsed() < Duration::from_secs(2), "{home}: not at once");
        // At the cap: admitted.
        let p = s
            .acquire_many_timeout(Priority::Low, 2, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("{home}: 2 at a cap of 2: {e:?}"));
        assert_eq!(p.units(), 2);
        drop(p);
        // Higher priorities are not capped here: up to the max.
        drop(s.acquire_many(Priority::High, 8).expect("8 at high"));
        // One unit at a cap of 0: waits (lottery only), not refused.
        match s.acquire_many_timeout(Priority::Lowest, 1, Duration::from_millis(1)) {
            Ok(_) | Err(Error::Timeout) => {}
            other => panic!("{home}: one unit at a cap of 0: {other:?}"),
        }
        assert_eq!(s.stats().running, 0, "{home}");
    }
}
