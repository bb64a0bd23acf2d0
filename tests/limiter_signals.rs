//! Signals you can steer by (issue 20): the limiter's pressure follows the
//! seed's rule (a front blocked for ≥ 10 ticks, or debt — not throttling),
//! a region limiter counts its fronts' stall ticks as an in-process one
//! does, and the consumed/refunded tokens per priority are exact counters,
//! region-wide in a region.

mod procs;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use procs::{say, spawn, wait_parent, Gone};
use shmsched::limiter::Limiter;
use shmsched::pressure::{Pressure, PressureConfig, Sample};
use shmsched::region::{Region, RegionView};
use shmsched::sys::monotonic_ns;
use shmsched::Priority;

const ENTRY: &str = "child_entry";
const NORMAL: usize = Priority::Normal.index();

fn name(tag: &str) -> String {
    use std::sync::atomic::AtomicU32;
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "test-sig-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Entry point of the child processes (does nothing in a normal test run).
#[test]
fn child_entry() {
    let Some((role, args)) = procs::role() else {
        return;
    };
    let region = Region::open(&args[0]).expect("open region");
    let lim = Limiter::attach(&region).expect("attach");
    say("ready");
    wait_parent();
    match role.as_str() {
        // One consume of `n` at Normal (it waits for the refill).
        "wait" => {
            let n: u64 = args[1].parse().unwrap();
            lim.consume(n, Priority::Normal).expect("consume");
        }
        other => panic!("unknown role {other}"),
    }
    say("done");
    wait_parent();
}

/// Samples `lim`'s pressure every 5 ms (pacing, not synchronisation) while
/// `work` runs in another thread; returns the *some* average at the end.
fn some_while(lim: &Limiter, tau_ns: u64, work: impl FnOnce() + Send + 'static) -> f64 {
    let mut p = Pressure::new(PressureConfig {
        tau_ns,
        ..PressureConfig::default()
    })
    .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let t = std::thread::spawn(move || {
        work();
        d.store(true, Ordering::SeqCst);
    });
    let start = Instant::now();
    while !done.load(Ordering::SeqCst) {
        assert!(start.elapsed() < Duration::from_secs(30), "work hung");
        p.update(Sample::from_limiter(&lim.stats()), monotonic_ns());
        std::thread::sleep(Duration::from_millis(5));
    }
    t.join().unwrap();
    p.update(Sample::from_limiter(&lim.stats()), monotonic_ns());
    p.some()
}

/// A stream throttled at exactly its rate waits for nearly every refill
/// (its wait counter runs ~100 % of the time) and reads *some* < 0.1: it
/// is throttled, not stalled. A stream whose requests go through into debt
/// (a real stall) still reads high. `make(rate, cap)` builds the limiter.
fn throttling_is_not_pressure(make: impl Fn(u64, u64) -> Limiter) {
    // Throttled: 100,000/s, bucket emptied, then 10 × 10,000 (~100 ms each).
    let lim = make(100_000, 100_000);
    lim.consume(100_000, Priority::Normal).unwrap();
    let (t0, s0) = (monotonic_ns(), lim.stats().stall_ns);
    let l = lim.clone();
    let some = some_while(&lim, 500_000_000, move || {
        for _ in 0..10 {
            l.consume(10_000, Priority::Normal).unwrap();
        }
    });
    let waited = (lim.stats().stall_ns - s0) as f64 / (monotonic_ns() - t0) as f64;
    eprintln!("throttled: some {some:.3}, waited {waited:.3} of the time");
    assert!(waited > 0.7, "the stream waited {waited:.2} of the time");
    assert!(
        some < 0.1,
        "pressure some {some:.2} for a stream throttled at its rate (waiting {waited:.2})"
    );
    assert_eq!(lim.stats().forced, 0);

    // Stalled: each consume of 1,000 on a bucket of 100 at 1,000/s goes
    // through into 900 tokens of debt, repaid for 0.9 s of every second.
    let lim = make(1_000, 100);
    let l = lim.clone();
    let some = some_while(&lim, 500_000_000, move || {
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(2_000) {
            assert!(l.consume(1_000, Priority::Normal).unwrap().forced);
        }
    });
    eprintln!("in debt: some {some:.3}");
    assert!(some > 0.5, "pressure some {some:.2} for a limiter in debt");
}

#[test]
fn a_throttled_stream_is_not_pressure_in_process() {
    throttling_is_not_pressure(|r, c| Limiter::with_capacity(r, c).unwrap());
}

#[test]
fn a_throttled_stream_is_not_pressure_in_a_region() {
    let names = std::sync::Mutex::new(Vec::new());
    throttling_is_not_pressure(|r, c| {
        let n = name("thr");
        let region = Region::create(&n).unwrap();
        names.lock().unwrap().push(Gone(n));
        Limiter::shared_with_capacity(&region, r, c).unwrap()
    });
}

/// The most stall ticks `read` reports while `busy` holds.
fn max_stall(busy: impl Fn() -> bool, read: impl Fn() -> u64) -> u64 {
    let start = Instant::now();
    let mut max = 0;
    while busy() {
        assert!(start.elapsed() < Duration::from_secs(30), "the wait hung");
        max = max.max(read());
        std::thread::yield_now();
    }
    max
}

/// A consume that waits 0.8 s for the refill: an in-process limiter's
/// front counts 7 ticks (of 100 ms) before it goes. A region's front waiting
/// in another process reads the same, within one tick, through the
/// region-wide gauge, the read-only view and a waiting process's own
/// `queues[p].stall` (on main a region read 0 ticks).
#[test]
fn a_region_front_counts_its_stall_ticks_as_in_process() {
    // In process: the consume waits in a thread.
    let lim = Limiter::new(1_000).unwrap();
    lim.consume(1_000, Priority::Normal).unwrap();
    let l = lim.clone();
    let t = std::thread::spawn(move || l.consume(800, Priority::Normal).unwrap());
    procs::until("the consume queued", 10, || lim.stats().pending == 1);
    let local = max_stall(
        || lim.stats().pending > 0,
        || lim.stats().queues[NORMAL].stall,
    );
    t.join().unwrap();
    assert!((6..=9).contains(&local), "in process: {local} ticks");

    // In a region: the consume waits in a child process.
    let n = name("ticks");
    let _gone = Gone(n.clone());
    let region = Region::create(&n).unwrap();
    let lim = Limiter::shared(&region, 1_000).unwrap();
    let mut kid = spawn(ENTRY, "wait", &[n.clone(), "800".into()]);
    kid.expect_line("ready");
    lim.consume(1_000, Priority::Normal).unwrap(); // empty the bucket
    let view = RegionView::open(&n).unwrap();
    kid.send("go");
    let waiting = || lim.stats().shared.unwrap().waiters[NORMAL] > 0;
    procs::until("the child's consume queued", 10, waiting);
    // `stat` shows the blocked front (if the wait outlasted the command,
    // it was there while `stat` read the region) and Prometheus its gauge.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shmsched"))
        .args(["stat", &n])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    if waiting() {
        assert!(text.contains("blocked     normal "), "{text}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shmsched"))
        .args(["stat", &n, "--prometheus"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("shmsched_limiter_front_stall_ticks{region=")
            && text.contains("priority=\"normal\""),
        "{text}"
    );
    let (mut region_max, mut view_max) = (0, 0);
    let start = Instant::now();
    while waiting() {
        assert!(start.elapsed() < Duration::from_secs(30), "the wait hung");
        region_max = region_max.max(lim.stats().shared.unwrap().stall[NORMAL]);
        view_max = view_max.max(view.limiter_stats().unwrap().queues[NORMAL].stall);
        std::thread::yield_now();
    }
    kid.expect_line("done");
    kid.send("exit");
    assert!(kid.finish().success());
    eprintln!("stall ticks: in process {local}, region {region_max}, view {view_max}");
    assert!(
        region_max.abs_diff(local) <= 1 && view_max.abs_diff(local) <= 1,
        "region {region_max}, view {view_max}, in process {local} ticks"
    );

    // A region handle with a consume of its own queued reports its front.
    let l = lim.clone();
    let t = std::thread::spawn(move || l.consume(800, Priority::Normal).unwrap());
    procs::until("the consume queued", 10, || lim.stats().pending == 1);
    let own = max_stall(
        || lim.stats().pending > 0,
        || lim.stats().queues[NORMAL].stall,
    );
    t.join().unwrap();
    eprintln!("stall ticks: a region handle's own front {own}");
    assert!(own.abs_diff(local) <= 1, "own {own}, in process {local}");
}
