//! `acquire_async` under two executors (tokio and `futures`' executor), its
//! cancellation, and a cross-process wake of an async waiter.

mod procs;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use procs::{say, spawn, until, wait_parent};
use shmsched::region::Region;
use shmsched::scheduler::Scheduler;
use shmsched::{Error, Priority};

/// Entry point of child processes (does nothing in a normal run).
#[test]
fn child_entry() {
    let Some((role, args)) = procs::role() else {
        return;
    };
    assert_eq!(role, "async-waiter");
    let region = Region::open(&args[0]).unwrap();
    let s = Scheduler::attach(&region).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        say("start");
        let _p = s.acquire_async(Priority::High).await.unwrap();
        say("got");
        wait_parent();
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_tasks_are_served_by_priority() {
    let s = Scheduler::with_seed(1, 5).unwrap();
    s.set_lottery(None, false);
    let hold = s.acquire(Priority::Normal).unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (k, p) in [Priority::Low, Priority::Highest, Priority::Normal]
        .into_iter()
        .enumerate()
    {
        let (s2, order) = (s.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = s2.acquire_async(p).await.unwrap();
            order.lock().unwrap().push(p);
        }));
        let s3 = s.clone();
        tokio::task::spawn_blocking(move || {
            until("queued", 10, || s3.stats().pending == k as u64 + 1)
        })
        .await
        .unwrap();
    }
    drop(hold);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        *order.lock().unwrap(),
        vec![Priority::Highest, Priority::Normal, Priority::Low]
    );
    assert_eq!(s.stats().running, 0);
}

#[test]
fn futures_executor_and_threads() {
    let s = Scheduler::new(2).unwrap();
    std::thread::scope(|sc| {
        for _ in 0..4 {
            sc.spawn(|| {
                for _ in 0..200 {
                    let p = futures::executor::block_on(s.acquire_async(Priority::Normal)).unwrap();
                    assert!(s.stats().running <= 2);
                    drop(p);
                }
            });
        }
    });
    let st = s.stats();
    assert_eq!((st.running, st.pending), (0, 0));
}

#[tokio::test]
async fn dropped_future_leaves_nothing_behind() {
    let root = Scheduler::new(1).unwrap();
    let child = root.child(3).unwrap();
    let hold = root.acquire(Priority::Normal).unwrap();
    // Times out while queued in the root, holding a child slot.
    let r = tokio::time::timeout(
        Duration::from_millis(20),
        child.acquire_async(Priority::High),
    )
    .await;
    assert!(r.is_err(), "must time out");
    assert_eq!(child.stats().running, 0, "child slot returned");
    let st = root.stats();
    assert_eq!(st.pending, 0);
    assert_eq!(st.queues[Priority::High.index()].cancelled, 1);
    drop(hold);
    assert!(
        root.try_acquire(Priority::Low).is_some(),
        "the slot is free again"
    );
}

#[tokio::test]
async fn dispose_fails_an_async_waiter() {
    let s = Scheduler::new(1).unwrap();
    let _hold = s.acquire(Priority::Normal).unwrap();
    let s2 = s.clone();
    let t = tokio::spawn(async move { s2.acquire_async(Priority::Low).await.map(|_| ()) });
    let s3 = s.clone();
    tokio::task::spawn_blocking(move || until("queued", 10, || s3.stats().pending == 1))
        .await
        .unwrap();
    s.dispose();
    assert!(matches!(t.await.unwrap(), Err(Error::Disposed)));
    assert!(matches!(
        s.acquire_async(Priority::Low).await,
        Err(Error::Disposed)
    ));
}

/// `acquire_owned_async`: the handle moves into the permit, which a
/// spawned task can keep (`'static`); queued owned acquires keep priority
/// and FIFO order with borrowed ones; one dropped while queued, or through
/// a child, leaves nothing behind; dispose and bad counts fail it as they
/// fail `acquire_async`, on a root in process and on a shared one.
#[test]
fn owned_acquires_move_the_handle_and_keep_the_rules() {
    use std::task::Poll;
    let path = format!("/dev/shm/shmsched-{}", procs::unique_name("owned"));
    let region = Region::create(&path).unwrap();
    let roots = [
        Scheduler::with_seed(1, 5).unwrap(),
        Scheduler::shared(&region, 1).unwrap(),
    ];
    for s in &roots {
        s.set_lottery(None, false);
        let local = s.stats().shared.is_none();
        let hold = s.acquire(Priority::Normal).unwrap();
        let mut low = s.clone().acquire_owned_async(Priority::Low);
        let mut first = s.clone().acquire_owned_async(Priority::Normal);
        let mut borrowed = s.acquire_async(Priority::Normal);
        let mut gone = s.clone().acquire_owned_async(Priority::High);
        let mut top = s.clone().acquire_many_owned_async(Priority::Highest, 1);
        for f in [&mut low, &mut first, &mut gone, &mut top] {
            assert!(poll_once(f).is_pending(), "local {local}: queued");
        }
        assert!(poll_once(&mut borrowed).is_pending());
        drop(gone);
        drop(hold);
        // Highest, then the two Normal ones in arrival order, then Low.
        let order = [&mut top, &mut first];
        for (i, f) in order.into_iter().enumerate() {
            let p = loop {
                match poll_once(f) {
                    Poll::Ready(r) => break r.unwrap(),
                    Poll::Pending => std::thread::yield_now(),
                }
            };
            assert_eq!(p.units(), 1);
            // Owned: it outlives every handle of this loop.
            let kept = std::thread::spawn(move || p.priority()).join().unwrap();
            assert_eq!(
                kept,
                [Priority::Highest, Priority::Normal][i],
                "local {local}"
            );
        }
        let p = loop {
            match poll_once(&mut borrowed) {
                Poll::Ready(r) => break r.unwrap(),
                Poll::Pending => std::thread::yield_now(),
            }
        };
        assert!(poll_once(&mut low).is_pending(), "local {local}: Low last");
        drop(p);
        let p_low = loop {
            match poll_once(&mut low) {
                Poll::Ready(r) => break r.unwrap(),
                Poll::Pending => std::thread::yield_now(),
            }
        };
        assert!(matches!(
            poll_once(&mut low),
            Poll::Ready(Err(Error::InvalidArgument(_)))
        ));
        assert_eq!(p_low.priority(), Priority::Low);
        drop(p_low);
        let st = s.stats();
        assert_eq!(st.pending, 0, "local {local}: {st:?}");
        assert_eq!(
            st.queues[Priority::High.index()].cancelled,
            1,
            "local {local}: the dropped one"
        );
        // Bad counts, as for the borrowed acquire.
        for n in [0, 2] {
            let mut f = s.clone().acquire_many_owned_async(Priority::Low, n);
            assert!(
                matches!(
                    poll_once(&mut f),
                    Poll::Ready(Err(Error::InvalidArgument(_)))
                ),
                "local {local}: n = {n}"
            );
        }
        assert!(
            s.try_acquire(Priority::Low).is_some(),
            "local {local}: free"
        );
    }

    // Through a child: a dropped owned acquire gives the child's unit back.
    let root = &roots[0];
    let child = root.child(3).unwrap();
    let hold = root.acquire(Priority::Normal).unwrap();
    let mut f = child.clone().acquire_owned_async(Priority::High);
    assert!(poll_once(&mut f).is_pending());
    assert_eq!(child.stats().running, 1, "the child's unit is taken");
    drop(f);
    assert_eq!(child.stats().running, 0, "and given back");
    assert_eq!(root.stats().pending, 0);

    // Dispose fails a queued owned acquire.
    let mut f = root.clone().acquire_owned_async(Priority::Low);
    assert!(poll_once(&mut f).is_pending());
    root.dispose();
    assert!(matches!(
        poll_once(&mut f),
        Poll::Ready(Err(Error::Disposed))
    ));
    drop(hold);
    Region::remove(&path).unwrap();
}

#[test]
fn async_waiter_in_another_process_is_woken_by_a_release() {
    let path = format!("/dev/shm/shmsched-{}", procs::unique_name("async"));
    let region = Region::create(&path).unwrap();
    let me = Scheduler::shared(&region, 1).unwrap();
    let hold = me.acquire(Priority::Normal).unwrap();
    let mut kid = spawn("child_entry", "async-waiter", std::slice::from_ref(&path));
    kid.expect_line("start");
    until("child queued", 10, || {
        me.stats().shared.unwrap().waiters[Priority::High.index()] == 1
    });
    drop(hold);
    kid.expect_line("got");
    assert_eq!(me.stats().shared.unwrap().running, 1);
    assert!(kid.finish().success());
    assert_eq!(me.stats().shared.unwrap().running, 0);
    Region::remove(&path).unwrap();
}

/// Polls `f` once with a waker that does nothing (the test drives every
/// poll itself, so nothing needs waking).
fn poll_once<F: std::future::Future + Unpin>(f: &mut F) -> std::task::Poll<F::Output> {
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    std::pin::Pin::new(f).poll(&mut cx)
}

/// A shared root reuses the waiters that left its queue (granted,
/// dropped, timed out) alike: over several rounds the reused ones queue at
/// their own priority, in FIFO order within a tier, and a future dropped
/// (or a blocking acquire timed out) while queued leaves nothing queued,
/// nothing published in the region, and counts as cancelled.
#[test]
fn shared_root_reused_waiters_keep_order_and_cancel_cleanly() {
    use std::task::Poll;
    let region = Region::anonymous().unwrap();
    let s = Scheduler::shared(&region, 2).unwrap();
    s.set_lottery(None, false);
    let mut cancelled_high = 0;
    for round in 0..4u32 {
        let hold = s.acquire_many(Priority::Normal, 2).unwrap();
        let mut first = s.acquire_async(Priority::Normal);
        let mut second = s.acquire_async(Priority::Normal);
        let mut top = s.acquire_async(Priority::Highest);
        let mut gone = s.acquire_async(Priority::High);
        for f in [&mut first, &mut second, &mut top, &mut gone] {
            assert!(poll_once(f).is_pending(), "round {round}: queued");
        }
        assert_eq!(s.stats().pending, 4, "round {round}");
        drop(gone);
        cancelled_high += 1;
        assert!(matches!(
            s.acquire_timeout(Priority::High, Duration::from_millis(1)),
            Err(Error::Timeout)
        ));
        cancelled_high += 1;
        let st = s.stats();
        assert_eq!(st.pending, 3, "round {round}: the dropped ones left");
        assert_eq!(
            st.queues[Priority::High.index()].cancelled,
            cancelled_high,
            "round {round}"
        );
        assert_eq!(st.queues[Priority::High.index()].count, 0);

        drop(hold);
        // Two cells free: Highest, then the first Normal.
        let Poll::Ready(Ok(p_top)) = poll_once(&mut top) else {
            panic!("round {round}: Highest first");
        };
        let Poll::Ready(Ok(p_first)) = poll_once(&mut first) else {
            panic!("round {round}: the first Normal next");
        };
        assert!(poll_once(&mut second).is_pending());
        drop(p_top);
        let Poll::Ready(Ok(p_second)) = poll_once(&mut second) else {
            panic!("round {round}: the second Normal");
        };
        assert_eq!(s.stats().running, 2);
        drop((p_first, p_second));
        let st = s.stats();
        assert_eq!((st.running, st.pending), (0, 0), "round {round}");
        assert_eq!(
            st.shared.map(|sh| sh.waiters),
            Some([0; shmsched::priority::LEVELS]),
            "round {round}: nothing published"
        );
    }
    assert!(s.try_acquire_many(Priority::Low, 2).is_some(), "all free");
}

/// An in-process level reuses the waiters of granted acquires: over
/// several rounds the reused ones must still queue at their own priority
/// and weight, in FIFO order within a tier, and a future dropped (or a
/// blocking acquire timed out) while queued on one must leave nothing
/// queued and count as cancelled.
#[test]
fn reused_waiters_keep_order_and_cancel_cleanly() {
    use std::task::Poll;
    let s = Scheduler::with_seed(2, 5).unwrap();
    s.set_lottery(None, false);
    let mut cancelled_high = 0;
    for round in 0..4u32 {
        let hold = s.acquire_many(Priority::Normal, 2).unwrap();
        // Two Normal waiters (FIFO between them), one weighted Low, one
        // Highest, one High that is dropped while queued.
        let mut first = s.acquire_async(Priority::Normal);
        let mut low = s.acquire_many_async(Priority::Low, 2);
        let mut second = s.acquire_async(Priority::Normal);
        let mut top = s.acquire_async(Priority::Highest);
        let mut gone = s.acquire_async(Priority::High);
        for f in [&mut first, &mut low, &mut second, &mut top, &mut gone] {
            assert!(poll_once(f).is_pending(), "round {round}: queued");
        }
        assert_eq!(s.stats().pending, 5, "round {round}");
        drop(gone);
        cancelled_high += 1;
        // A blocking acquire that times out while queued (the waiters of
        // earlier rounds are spare by now).
        assert!(matches!(
            s.acquire_timeout(Priority::High, Duration::from_millis(1)),
            Err(Error::Timeout)
        ));
        cancelled_high += 1;
        let st = s.stats();
        assert_eq!(st.pending, 4, "round {round}: the dropped ones left");
        assert_eq!(
            st.queues[Priority::High.index()].cancelled,
            cancelled_high,
            "round {round}"
        );
        assert_eq!(st.queues[Priority::High.index()].count, 0);

        drop(hold);
        // Two units free: Highest, then the first Normal.
        let Poll::Ready(Ok(p_top)) = poll_once(&mut top) else {
            panic!("round {round}: Highest first");
        };
        let Poll::Ready(Ok(p_first)) = poll_once(&mut first) else {
            panic!("round {round}: the first Normal next");
        };
        assert!(poll_once(&mut second).is_pending());
        assert!(poll_once(&mut low).is_pending());
        drop(p_top);
        let Poll::Ready(Ok(p_second)) = poll_once(&mut second) else {
            panic!("round {round}: the second Normal before the weighted Low");
        };
        assert!(poll_once(&mut low).is_pending(), "needs both units");
        drop(p_first);
        assert!(poll_once(&mut low).is_pending(), "still needs both units");
        drop(p_second);
        let Poll::Ready(Ok(p_low)) = poll_once(&mut low) else {
            panic!("round {round}: the weighted Low last, with both units");
        };
        assert_eq!(s.stats().running, 2);
        drop(p_low);
        let st = s.stats();
        assert_eq!((st.running, st.pending), (0, 0), "round {round}");
    }
    assert!(s.try_acquire_many(Priority::Low, 2).is_some(), "all free");
}

/// A contended hand-off at an in-process root (the `vs_tokio` bench's
/// shape, with more kinds of waiter): async tasks at three priorities on
/// two workers, each holding its permit across a yield, beside a blocking
/// thread whose acquires time out and tasks whose futures are dropped by a
/// timeout. The holders never exceed the max, and the queue's counters,
/// which are written under the queue's lock without a locked add, come
/// out exact: every deferred waiter completed, nothing left queued or held.
#[test]
fn contended_async_handoff_counts_exactly() {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
    const ROUNDS: u64 = 1_500;
    for max in [1u32, 2] {
        let s = Scheduler::with_seed(max, 11).unwrap();
        let holders = Arc::new(AtomicU32::new(0));
        let most = Arc::new(AtomicU32::new(0));
        let timed_out = Arc::new(AtomicU64::new(0));
        let hold = |holders: &AtomicU32, most: &AtomicU32| {
            let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        let blocking = {
            let (s, holders, most) = (s.clone(), holders.clone(), most.clone());
            let timed_out = timed_out.clone();
            std::thread::spawn(move || {
                for _ in 0..ROUNDS / 5 {
                    match s.acquire_timeout(Priority::High, Duration::from_micros(50)) {
                        Ok(p) => {
                            hold(&holders, &most);
                            std::thread::yield_now();
                            holders.fetch_sub(1, Ordering::SeqCst);
                            drop(p);
                        }
                        Err(Error::Timeout) => {
                            timed_out.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => panic!("blocking acquire: {e}"),
                    }
                }
            })
        };
        rt.block_on(async {
            let mut tasks = Vec::new();
            for (k, p) in [
                Priority::Normal,
                Priority::Normal,
                Priority::Low,
                Priority::Highest,
                Priority::Normal,
            ]
            .into_iter()
            .enumerate()
            {
                let (s, holders, most) = (s.clone(), holders.clone(), most.clone());
                let timed_out = timed_out.clone();
                tasks.push(tokio::spawn(async move {
                    for i in 0..ROUNDS {
                        // The last task drops every third future after a
                        // short wait: queued, or granted just before.
                        let permit = if k == 4 && i % 3 == 0 {
                            match tokio::time::timeout(
                                Duration::from_micros(20),
                                s.acquire_async(p),
                            )
                            .await
                            {
                                Ok(r) => r.unwrap(),
                                Err(_) => {
                                    timed_out.fetch_add(1, Ordering::SeqCst);
                                    continue;
                                }
                            }
                        } else if k == 1 {
                            // Owned, through a handle moved in each time.
                            let permit = s.clone().acquire_owned_async(p).await.unwrap();
                            hold(&holders, &most);
                            tokio::task::yield_now().await;
                            holders.fetch_sub(1, Ordering::SeqCst);
                            drop(permit);
                            continue;
                        } else {
                            s.acquire_async(p).await.unwrap()
                        };
                        hold(&holders, &most);
                        tokio::task::yield_now().await;
                        holders.fetch_sub(1, Ordering::SeqCst);
                        drop(permit);
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        });
        blocking.join().unwrap();
        let st = s.stats();
        assert!(
            most.load(Ordering::SeqCst) <= max,
            "max {max}: {} held at once",
            most.load(Ordering::SeqCst)
        );
        assert_eq!((st.running, st.pending), (0, 0), "max {max}: {st:?}");
        let mut deferred = 0;
        for q in &st.queues {
            assert_eq!(q.count, 0, "max {max}: {st:?}");
            assert_eq!(q.deferred, q.completed, "max {max}: {st:?}");
            assert!(q.cancelled <= q.completed, "max {max}: {st:?}");
            deferred += q.deferred;
        }
        let cancelled: u64 = st.queues.iter().map(|q| q.cancelled).sum();
        assert!(
            cancelled <= timed_out.load(Ordering::SeqCst),
            "max {max}: {cancelled} cancelled, {} timed out",
            timed_out.load(Ordering::SeqCst)
        );
        // Holding across a yield with five tasks and a thread: most
        // acquisitions queue (a count that proves the test contended).
        assert!(
            deferred >= ROUNDS,
            "max {max}: only {deferred} of {} acquisitions queued",
            5 * ROUNDS + ROUNDS / 5
        );
        // Nobody waits any more, so the stall clock is closed: its total
        // does not grow (a waiting count left above zero would keep it
        // open).
        let stalled = st.stall_ns;
        assert!(stalled > 0, "max {max}: the waits were timed");
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_millis(3) {
            std::hint::spin_loop();
        }
        assert_eq!(s.stats().stall_ns, stalled, "max {max}: stall clock closed");
        assert!(
            s.try_acquire_many(Priority::Low, max).is_some(),
            "max {max}: all free"
        );
    }
}

/// A task waker that counts its wakes (its `Arc`'s strong count tells how
/// many clones of it are still held somewhere).
struct CountingWake(std::sync::atomic::AtomicU32);

impl std::task::Wake for CountingWake {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

fn counting_waker() -> (Arc<CountingWake>, std::task::Waker) {
    let c = Arc::new(CountingWake(std::sync::atomic::AtomicU32::new(0)));
    (c.clone(), std::task::Waker::from(c))
}

fn poll_with<F: std::future::Future + Unpin>(
    f: &mut F,
    waker: &std::task::Waker,
) -> std::task::Poll<F::Output> {
    std::pin::Pin::new(f).poll(&mut std::task::Context::from_waker(waker))
}

/// A queued future polled again by another task (a task that moved, a
/// `select!` that re-polls) wakes the latest task on its grant, and the
/// earlier one not at all; polled again by the same task it keeps one
/// registration. No waker clone outlives the acquire: the scheduler keeps
/// none after the grant, the failure or the future's drop. In-process
/// (the task sits in the queue entry) and at a shared root (in the
/// waiter).
#[test]
fn a_repolled_waiter_wakes_its_latest_task_only() {
    use std::sync::atomic::Ordering::SeqCst;
    use std::task::Poll;
    let region = Region::anonymous().unwrap();
    let scheds = [
        ("in-process", Scheduler::with_seed(1, 3).unwrap()),
        ("shared", Scheduler::shared(&region, 1).unwrap()),
    ];
    for (home, s) in &scheds {
        // Granted: the latest task is woken once, the first never.
        let hold = s.acquire(Priority::Normal).unwrap();
        let (first, first_w) = counting_waker();
        let (latest, latest_w) = counting_waker();
        let mut f = s.acquire_async(Priority::Normal);
        assert!(poll_with(&mut f, &first_w).is_pending(), "{home}");
        assert!(poll_with(&mut f, &latest_w).is_pending(), "{home}");
        assert!(
            poll_with(&mut f, &latest_w).is_pending(),
            "{home}: same task"
        );
        drop(hold);
        assert_eq!(latest.0.load(SeqCst), 1, "{home}: the latest task woken");
        assert_eq!(first.0.load(SeqCst), 0, "{home}: the first task not woken");
        let Poll::Ready(Ok(p)) = poll_with(&mut f, &latest_w) else {
            panic!("{home}: granted");
        };
        drop((p, f));
        assert_eq!(
            Arc::strong_count(&first),
            2,
            "{home}: no clone of the first kept"
        );
        assert_eq!(
            Arc::strong_count(&latest),
            2,
            "{home}: no clone of the latest kept"
        );

        // Failed by dispose of a child: the latest task is woken, and the
        // future ends in `Disposed`.
        let child = s.child(1).unwrap();
        let hold = s.acquire(Priority::Normal).unwrap();
        let mut f = child.acquire_async(Priority::Normal);
        assert!(poll_with(&mut f, &first_w).is_pending(), "{home}");
        assert!(poll_with(&mut f, &latest_w).is_pending(), "{home}");
        child.dispose();
        assert_eq!(latest.0.load(SeqCst), 2, "{home}: woken by the dispose");
        assert_eq!(first.0.load(SeqCst), 0, "{home}");
        assert!(matches!(
            poll_with(&mut f, &latest_w),
            Poll::Ready(Err(Error::Disposed))
        ));
        drop(f);

        // Dropped while queued: its task's waker goes with it.
        let mut f = s.acquire_async(Priority::Normal);
        assert!(poll_with(&mut f, &first_w).is_pending(), "{home}");
        assert!(poll_with(&mut f, &latest_w).is_pending(), "{home}");
        drop(f);
        drop(hold);
        assert_eq!(
            latest.0.load(SeqCst),
            2,
            "{home}: a dropped future is not woken"
        );
        assert_eq!(Arc::strong_count(&first), 2, "{home}");
        assert_eq!(Arc::strong_count(&latest), 2, "{home}");
        let st = s.stats();
        assert_eq!((st.running, st.pending), (0, 0), "{home}: nothing left");
    }
}

/// Clones of `race_waker`'s waker alive outside the test's own handle.
static RACE_LIVE: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
/// Clones of it dropped (not woken) on the releasing thread.
static RACE_FOREIGN_DROPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
thread_local!(static RACE_RELEASER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });

fn race_waker() -> std::task::Waker {
    use std::sync::atomic::Ordering::SeqCst;
    use std::task::{RawWaker, RawWakerVTable};
    unsafe fn clone(_: *const ()) -> RawWaker {
        RACE_LIVE.fetch_add(1, SeqCst);
        RawWaker::new(std::ptr::null(), &VTABLE)
    }
    unsafe fn wake(_: *const ()) {
        RACE_LIVE.fetch_sub(1, SeqCst);
    }
    unsafe fn wake_by_ref(_: *const ()) {}
    unsafe fn drop_clone(_: *const ()) {
        RACE_LIVE.fetch_sub(1, SeqCst);
        if RACE_RELEASER.with(|r| r.get()) {
            RACE_FOREIGN_DROPS.fetch_add(1, SeqCst);
        }
    }
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, wake, wake_by_ref, drop_clone);
    // SAFETY: the vtable's functions ignore the (null) data pointer and
    // only count; the handle made here is never dropped through the
    // vtable (the test forgets it), so it is not counted.
    unsafe { std::task::Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) }
}

/// A grant that races the registration of a task (another thread's
/// release between the future's look and its registration) leaves no
/// waker behind. Before, at a shared root, the registered clone stayed in
/// the waiter after its grant, until an enqueue reused the waiter and
/// dropped it under the root's lock (this test failed 3 runs of 3 there).
/// After each grant, once the releasing thread (a blocking acquirer) has
/// queued again, no clone of the task's waker may be held anywhere; the
/// releasing thread may only wake clones, never drop them; and nothing is
/// left at the end. In-process and at a shared root.
#[test]
fn a_grant_racing_the_registration_leaves_no_waker_behind() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let region = Region::anonymous().unwrap();
    let homes = [
        ("in-process", Arc::new(Scheduler::with_seed(1, 3).unwrap())),
        ("shared", Arc::new(Scheduler::shared(&region, 1).unwrap())),
    ];
    for (home, s) in homes {
        RACE_FOREIGN_DROPS.store(0, SeqCst);
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let releaser = {
            let (s, stop, rounds) = (s.clone(), stop.clone(), rounds.clone());
            std::thread::spawn(move || {
                RACE_RELEASER.with(|r| r.set(true));
                while !stop.load(SeqCst) {
                    let p = s.acquire(Priority::Normal).unwrap();
                    for _ in 0..50 {
                        std::hint::spin_loop();
                    }
                    drop(p);
                    rounds.fetch_add(1, SeqCst);
                }
            })
        };
        let w = race_waker();
        // Until both sides have had many turns at the one slot (the race
        // is a grant landing between the future's look and its
        // registration), bounded in time.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut queued = 0u64;
        let mut acquired = 0u64;
        while acquired < 5_000 && std::time::Instant::now() < deadline {
            acquired += 1;
            let mut f = s.acquire_async(Priority::Normal);
            let p = loop {
                if let std::task::Poll::Ready(r) = poll_with(&mut f, &w) {
                    break r.unwrap();
                }
                queued += 1;
                assert!(std::time::Instant::now() < deadline, "{home}: stuck");
                std::hint::spin_loop();
            };
            drop(f);
            // Held until the releaser has queued behind it: its enqueue
            // then takes back a spare waiter (maybe the one this future
            // just left), on its own thread.
            while s.stats().pending == 0 && std::time::Instant::now() < deadline {
                std::hint::spin_loop();
            }
            // The releaser's release that granted this future (and its
            // wake) came before its enqueue: no clone may be held now, but
            // one being woken by the helper thread (a shared root's)
            // finishes its wake; a stale one would stay until the waiter's
            // reuse.
            let settle = std::time::Instant::now() + Duration::from_secs(2);
            while RACE_LIVE.load(SeqCst) != 0 && std::time::Instant::now() < settle {
                std::thread::yield_now();
            }
            assert_eq!(
                RACE_LIVE.load(SeqCst),
                0,
                "{home}: a clone of the task's waker is held after its grant"
            );
            drop(p);
        }
        stop.store(true, SeqCst);
        releaser.join().unwrap();
        let rounds = rounds.load(SeqCst);
        assert!(rounds > 0 && queued > 0, "{home}: no contention");
        assert_eq!(
            RACE_FOREIGN_DROPS.load(SeqCst),
            0,
            "{home}: the releasing thread dropped clones of the task's waker"
        );
        drop(s);
        // The test's own handle was made without a clone: not counted.
        std::mem::forget(w);
    }
    drop(region);
    assert_eq!(RACE_LIVE.load(SeqCst), 0, "waker clones left");
}
