//! `Limiter::consume_async` under tokio and `futures::executor::block_on`,
//! in one process and across real processes; and priorities across
//! processes for the shared limiter (a low waiter in one process defers to a
//! high waiter in another).

mod procs;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::executor::block_on;
use procs::{say, spawn, until, wait_parent, Kid};
use shmsched::limiter::{Limiter, LimiterStats};
use shmsched::region::Region;
use shmsched::Priority;

const ENTRY: &str = "child_entry";

fn tier(p: Priority) -> usize {
    (p as i32 + 3) as usize
}

/// The stats invariants: every queued item completed or is still counted,
/// cancellations are completions, and the gauges match.
fn check_invariants(s: &LimiterStats) {
    assert_eq!(s.total.deferred, s.total.completed + s.total.count, "{s:?}");
    assert!(s.total.cancelled <= s.total.completed, "{s:?}");
    assert_eq!(s.pending, s.total.count, "{s:?}");
    let sum: u64 = s.queues.iter().map(|q| q.count).sum();
    assert_eq!(sum, s.pending, "{s:?}");
}

/// Entry point of the child processes (does nothing in a normal test run).
#[test]
fn child_entry() {
    let Some((role, args)) = procs::role() else {
        return;
    };
    let region = Region::open(&args[0]).expect("open region");
    let lim = Limiter::attach(&region).expect("attach");
    match role.as_str() {
        // Wait for "go", then consume `n` at `prio` (async under block_on,
        // or blocking); report the elapsed time.
        "one" => {
            let n: u64 = args[1].parse().unwrap();
            let p = Priority::ALL[args[2].parse::<usize>().unwrap()];
            let is_async = args[3] == "async";
            say("ready");
            wait_parent();
            let start = Instant::now();
            let g = if is_async {
                block_on(lim.consume_async(n, p))
            } else {
                lim.consume(n, p)
            }
            .expect("consume");
            say(&format!(
                "done {} {}{}",
                start.elapsed().as_millis(),
                g.immediate,
                if g.forced { " forced" } else { "" }
            ));
            let s = lim.stats();
            check_invariants(&s);
            assert_eq!(s.pending, 0);
            wait_parent();
        }
        // Consume small chunks until told to stop.
        "hog" => {
            say("ready");
            wait_parent();
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let s2 = stop.clone();
            std::thread::spawn(move || {
                wait_parent();
                s2.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            let mut total = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                lim.consume(50, Priority::Normal).expect("consume");
                total += 50;
            }
            say(&format!("hogged {total}"));
        }
        other => panic!("unknown role {other}"),
    }
}

struct Cleanup(String);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Region::remove(&self.0);
    }
}

#[test]
fn block_on_immediate_then_waits_for_the_refill() {
    let lim = Limiter::new(1_000).unwrap();
    let g = block_on(lim.consume_async(1_000, Priority::Normal)).unwrap();
    assert!(g.immediate && !g.forced);
    let t = Instant::now();
    let g = block_on(lim.consume_async(200, Priority::Normal)).unwrap();
    let e = t.elapsed();
    assert!(!g.immediate);
    assert!(e >= Duration::from_millis(150), "{e:?}");
    assert!(e < Duration::from_millis(700), "{e:?}");
    // Zero and argument errors.
    assert!(block_on(lim.consume_async(0, Priority::Low)).is_ok());
    assert!(block_on(lim.consume_async(3_000_000_000, Priority::Low)).is_err());
    // Larger than the capacity: admitted on a full bucket, into debt.
    let g = block_on(lim.consume_async(1_500, Priority::High)).unwrap();
    assert!(g.forced);
    let s = lim.stats();
    check_invariants(&s);
    assert_eq!(s.pending, 0);
}

#[test]
fn block_on_through_a_child_chain() {
    let root = Limiter::new(10_000).unwrap();
    let child = root.child(1_000).unwrap();
    block_on(child.consume_async(1_000, Priority::Normal)).unwrap();
    let t = Instant::now();
    let g = block_on(child.consume_async(300, Priority::Normal)).unwrap();
    assert!(!g.immediate);
    assert!(t.elapsed() >= Duration::from_millis(250));
    check_invariants(&child.stats());
    assert_eq!(child.stats().pending, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_grants_in_priority_order() {
    let lim = Limiter::new(1_000).unwrap();
    lim.consume(1_000, Priority::Normal).unwrap(); // drained
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for p in [
        Priority::Low,
        Priority::Normal,
        Priority::Lowest,
        Priority::High,
    ] {
        let (l, o) = (lim.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = l.consume_async(100, p).await.unwrap();
            assert!(!g.immediate);
            o.lock().unwrap().push(p);
        }));
        // Queue them in this order.
        let want = tasks.len() as u64;
        while lim.stats().pending < want {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        *order.lock().unwrap(),
        vec![
            Priority::High,
            Priority::Normal,
            Priority::Low,
            Priority::Lowest
        ]
    );
    let s = lim.stats();
    check_invariants(&s);
    assert_eq!(s.pending, 0);
}

#[tokio::test]
async fn tokio_current_thread_waiter_is_woken_by_the_pump() {
    let lim = Limiter::new(2_000).unwrap();
    lim.consume(2_000, Priority::Normal).unwrap();
    let t = Instant::now();
    lim.consume_async(500, Priority::Normal).await.unwrap();
    let e = t.elapsed();
    assert!(
        e >= Duration::from_millis(200) && e < Duration::from_millis(800),
        "{e:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_by_timeout_leaves_nothing_behind() {
    let name = procs::unique_name("lim-acancel");
    let _c = Cleanup(name.clone());
    let region = Region::create(&name).unwrap();
    let lim = Limiter::shared(&region, 1_000).unwrap();
    lim.consume(1_000, Priority::Normal).unwrap();
    let before = lim.tokens().unwrap();
    let t0 = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_millis(50),
        lim.consume_async(900, Priority::High),
    )
    .await;
    assert!(r.is_err(), "should time out");
    // A second one, queued behind a blocking consumer in another task.
    let l2 = lim.clone();
    let r = tokio::time::timeout(Duration::from_millis(30), async move {
        let f1 = l2.consume_async(900, Priority::Low);
        let f2 = l2.consume_async(10, Priority::Low);
        futures::future::join(f1, f2).await
    })
    .await;
    assert!(r.is_err());
    let s = lim.stats();
    check_invariants(&s);
    assert_eq!(s.pending, 0);
    // Dropping the first of the pair lets the drain charge the second (10
    // tokens were there) before it is dropped in turn: those are lost.
    assert!(s.total.cancelled >= 2, "{s:?}");
    assert_eq!(s.total.completed, 3, "{s:?}");
    assert_eq!(s.shared.unwrap().waiters, [0; 7]);
    // No tokens were created: the balance is at most what the refill gave.
    let refill = (t0.elapsed().as_millis() as i64 + 5) * 1_000 / 1_000;
    assert!(lim.tokens().unwrap() <= before + refill);
    // And the limiter still works.
    lim.consume_async(50, Priority::Normal).await.unwrap();
    check_invariants(&lim.stats());
}

#[test]
fn dropping_an_unpolled_or_finished_future_is_harmless() {
    let lim = Limiter::new(1_000).unwrap();
    drop(lim.consume_async(5_000, Priority::Normal));
    let mut f = lim.consume_async(10, Priority::Normal);
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    assert!(std::pin::Pin::new(&mut f).poll(&mut cx).is_ready());
    // Polled after completion: an error, not a second charge.
    assert!(matches!(
        std::pin::Pin::new(&mut f).poll(&mut cx),
        std::task::Poll::Ready(Err(_))
    ));
    drop(f);
    let s = lim.stats();
    check_invariants(&s);
    assert_eq!(s.total.deferred, 0);
}

use std::future::Future;

fn spawn_one(region: &str, n: u64, p: Priority, how: &str) -> Kid {
    let mut k = spawn(
        ENTRY,
        "one",
        &[
            region.to_string(),
            n.to_string(),
            tier(p).to_string(),
            how.to_string(),
        ],
    );
    k.expect_line("ready");
    k
}

#[test]
fn async_waiter_in_one_process_admitted_while_another_consumes() {
    let name = procs::unique_name("lim-axp");
    let _c = Cleanup(name.clone());
    let region = Region::create(&name).unwrap();
    let lim = Limiter::shared(&region, 10_000).unwrap();
    let mut hog = spawn(ENTRY, "hog", std::slice::from_ref(&name));
    hog.expect_line("ready");
    let mut waiter = spawn_one(&name, 3_000, Priority::High, "async");
    hog.send("go");
    std::thread::sleep(Duration::from_millis(100));
    waiter.send("go");
    let done = waiter.expect_line("done");
    let ms: u64 = done.split(' ').next().unwrap().parse().unwrap();
    // Admitted by a refill or the stall guard, well before a hang.
    assert!(ms < 3_000, "{done}");
    hog.send("stop");
    let hogged = hog.expect_line("hogged");
    assert!(hogged.parse::<u64>().unwrap() > 0);
    assert!(waiter.finish().success());
    assert!(hog.finish().success());
    assert_eq!(lim.stats().shared.unwrap().waiters, [0; 7]);
}

/// Low waiter queued in A, then a high waiter of the same size in B, bucket
/// drained: when the refill covers one of them, the high one goes first,
/// although the low one queued earlier (priority across processes).
fn high_elsewhere_goes_first(a_how: &str, b_how: &str) {
    let name = procs::unique_name(&format!("lim-xprio-{a_how}-{b_how}"));
    let _c = Cleanup(name.clone());
    let region = Region::create(&name).unwrap();
    let lim = Limiter::shared(&region, 1_000).unwrap();
    let mut a = spawn_one(&name, 500, Priority::Low, a_how);
    let mut b = spawn_one(&name, 500, Priority::High, b_how);
    lim.consume(1_000, Priority::Normal).unwrap(); // drained
    let waiters = || lim.stats().shared.unwrap().waiters;
    a.send("go");
    until("A queued", 5, || waiters()[tier(Priority::Low)] == 1);
    b.send("go");
    until("B queued", 5, || waiters()[tier(Priority::High)] == 1);
    // Who leaves first?
    let start = Instant::now();
    let first = loop {
        let w = waiters();
        let (lo, hi) = (w[tier(Priority::Low)], w[tier(Priority::High)]);
        if hi == 0 && lo == 1 {
            break "high";
        }
        if lo == 0 {
            break if hi == 0 { "both" } else { "low" };
        }
        assert!(start.elapsed() < Duration::from_secs(5), "nobody admitted");
        std::thread::sleep(Duration::from_micros(200));
    };
    assert_eq!(first, "high");
    let da = a.expect_line("done");
    let db = b.expect_line("done");
    let ms = |d: &str| d.split(' ').next().unwrap().parse::<u64>().unwrap();
    assert!(ms(&db) < ms(&da) + 50, "A {da}, B {db}");
    assert!(a.finish().success());
    assert!(b.finish().success());
    let s = lim.stats();
    assert_eq!(s.shared.unwrap().waiters, [0; 7]);
}

/// The same rule as inside one process: a higher front elsewhere that the
/// bucket cannot serve yet holds back nobody; a lower front that fits goes
/// (and the big one goes when its tokens are there, not by force).
#[test]
fn a_blocked_high_front_elsewhere_does_not_hold_back_a_low_one_that_fits() {
    let name = procs::unique_name("lim-xblocked");
    let _c = Cleanup(name.clone());
    let region = Region::create(&name).unwrap();
    let lim = Limiter::shared(&region, 1_000).unwrap();
    let mut a = spawn_one(&name, 300, Priority::Low, "sync");
    let mut b = spawn_one(&name, 600, Priority::High, "sync");
    lim.consume(1_000, Priority::Normal).unwrap(); // drained
    let waiters = || lim.stats().shared.unwrap().waiters;
    b.send("go");
    until("B queued", 5, || waiters()[tier(Priority::High)] == 1);
    a.send("go");
    let da = a.expect_line("done");
    let db = b.expect_line("done");
    let ms = |d: &str| d.split(' ').next().unwrap().parse::<u64>().unwrap();
    let forced = |d: &str| d.contains("forced");
    // A's 300 fit long before B's 600: A did not wait for B.
    assert!(ms(&da) < 700, "A {da}, B {db}");
    assert!(!forced(&da) && !forced(&db), "A {da}, B {db}");
    assert!(a.finish().success());
    assert!(b.finish().success());
    assert_eq!(lim.stats().shared.unwrap().waiters, [0; 7]);
}

#[test]
fn priorities_hold_across_processes_blocking() {
    high_elsewhere_goes_first("sync", "sync");
}

#[test]
fn priorities_hold_across_processes_async_low() {
    high_elsewhere_goes_first("async", "sync");
}

#[test]
fn priorities_hold_across_processes_async_high() {
    high_elsewhere_goes_first("sync", "async");
}

/// A process killed while its high waiter was queued leaves a stale count;
/// the drain here must not defer to it (it is reaped), so the low waiter
/// goes at its refill instant, not after the stall guard.
#[test]
fn a_dead_process_high_waiter_is_not_deferred_to() {
    let name = procs::unique_name("lim-xdead");
    let _c = Cleanup(name.clone());
    let region = Region::create(&name).unwrap();
    let lim = Limiter::shared(&region, 1_000).unwrap();
    let mut b = spawn_one(&name, 900, Priority::Highest, "sync");
    lim.consume(1_000, Priority::Normal).unwrap(); // drained
    let t = Instant::now();
    b.send("go");
    until("B queued", 5, || {
        lim.stats().shared.unwrap().waiters[tier(Priority::Highest)] == 1
    });
    b.kill();
    let g = block_on(lim.consume_async(300, Priority::Low)).unwrap();
    let e = t.elapsed();
    assert!(!g.forced, "went by the stall guard after {e:?}");
    assert!(e < Duration::from_millis(800), "{e:?}");
    assert_eq!(lim.stats().shared.unwrap().waiters, [0; 7]);
}
