//! The Limiter in one process: every validation rule and edge case of the
//! seed (0 tokens, oversize, debt, force-through counted once per stall,
//! per-priority order, child chains, timeouts, stats). Timing bounds are
//! loose (2 shared cores); counts are strict.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use shmsched::limiter::{parse_tokens, Limiter, MAX_CONSUME, STALL_TICKS};
use shmsched::{Error, Priority};

fn until(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "timed out waiting for {what}"
        );
        thread::sleep(Duration::from_millis(1));
    }
}

fn invalid(e: Error) -> String {
    match e {
        Error::InvalidArgument(m) => m,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn rate_validation_names_the_value() {
    for bad in [0u64, 2_147_483_648, u64::MAX] {
        let m = invalid(Limiter::new(bad).unwrap_err());
        assert!(
            m.contains(&bad.to_string()) && m.contains("2147483647"),
            "{m}"
        );
    }
    assert_eq!(Limiter::new(1).unwrap().tokens_per_second(), 1);
    assert_eq!(
        Limiter::new(2_147_483_647).unwrap().tokens_per_second(),
        i32::MAX as u32
    );
    let l = Limiter::new(10).unwrap();
    assert!(l.child(0).is_err());
}

#[test]
fn consume_validation_names_the_value() {
    let l = Limiter::new(1000).unwrap();
    for bad in [MAX_CONSUME + 1, u64::MAX] {
        let m = invalid(l.consume(bad, Priority::Normal).unwrap_err());
        assert!(
            m.contains(&bad.to_string()) && m.contains("2147483647"),
            "{m}"
        );
        assert!(l.try_consume(bad).is_err());
        assert!(l
            .consume_timeout(bad, Priority::Low, Duration::from_millis(1))
            .is_err());
    }
    // Nothing was charged by the refused calls.
    assert_eq!(l.tokens().unwrap(), 1000);
}

#[test]
fn parse_tokens_rejects_what_the_seed_rejects() {
    assert_eq!(parse_tokens("2147483647", true).unwrap(), i32::MAX as u32);
    assert_eq!(parse_tokens(" 0 ", false).unwrap(), 0);
    for bad in ["-1", "1.5", "NaN", "inf", "-inf", "2147483648", "x", ""] {
        let m = invalid(parse_tokens(bad, false).unwrap_err());
        assert!(m.contains(bad.trim()), "{bad}: {m}");
    }
    assert!(parse_tokens("0", true).is_err());
}

#[test]
fn starts_full_and_try_consume_never_goes_into_debt() {
    let l = Limiter::new(1000).unwrap();
    assert_eq!(l.tokens().unwrap(), 1000);
    assert!(!l.try_consume(1001).unwrap());
    assert!(l.try_consume(1000).unwrap());
    assert!(!l.try_consume(1).unwrap() || l.tokens().unwrap() >= 0);
    assert!(l.tokens().unwrap() >= 0);
    let s = l.stats();
    assert_eq!(s.forced, 0);
    assert_eq!(s.tokens_per_second, 1000);
    assert_eq!(s.total.deferred, 0);
}

#[test]
fn zero_tokens_go_at_once_only_when_nothing_is_queued() {
    let l = Limiter::new(100).unwrap();
    // Drain and go into debt: zero still goes at once while nothing queues.
    l.consume(150, Priority::Normal).unwrap();
    assert!(l.tokens().unwrap() < 0);
    let g = l.consume(0, Priority::Lowest).unwrap();
    assert!(g.immediate && !g.forced);
    assert!(l.try_consume(0).unwrap());

    // Something queued at High (waiting for repayment): a zero at Low queues,
    // but drains as soon as it is the front of its queue, in debt.
    let l2 = l.clone();
    let blocked = thread::spawn(move || l2.consume(50, Priority::High).unwrap());
    until("a queued consume", 5, || l.stats().pending == 1);
    assert!(
        !l.try_consume(0).unwrap(),
        "try_consume needs an empty queue"
    );
    let t = Instant::now();
    let g = l.consume(0, Priority::Low).unwrap();
    assert!(!g.immediate && !g.forced);
    assert!(
        t.elapsed() < Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
    assert!(l.tokens().unwrap() < 50);
    blocked.join().unwrap();
    let s = l.stats();
    assert_eq!(s.queues[Priority::Low.index()].completed, 1);
}

#[test]
fn oversize_goes_on_a_full_bucket_or_after_the_stall_guard() {
    let l = Limiter::new(100).unwrap();
    // Full bucket: admitted at once, into debt, counted.
    let g = l.consume(150, Priority::Normal).unwrap();
    assert!(g.immediate && g.forced);
    assert_eq!(l.stats().forced, 1);
    assert!(l.tokens().unwrap() <= -49);
    // Not full now: the stall guard (~1 s) comes before the bucket fills
    // (1.5 s), so it is forced through after about a second.
    let t = Instant::now();
    let g = l.consume(150, Priority::Normal).unwrap();
    let el = t.elapsed();
    assert!(!g.immediate && g.forced);
    assert!(
        el >= Duration::from_millis(900) && el < Duration::from_millis(1450),
        "{el:?}"
    );
    assert_eq!(l.stats().forced, 2);
}

#[test]
fn force_through_is_counted_once_per_stall_and_debt_is_repaid_first() {
    let l = Limiter::new(1000).unwrap();
    l.consume(1000, Priority::Normal).unwrap(); // empty
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // A high-priority stream of small consumes spends every refill first.
    let hog = {
        let (l, stop) = (l.clone(), stop.clone());
        thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                l.consume(5, Priority::High).unwrap();
                n += 5;
            }
            n
        })
    };
    let t = Instant::now();
    let g = l.consume(900, Priority::Low).unwrap();
    let el = t.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(g.forced && !g.immediate);
    assert!(
        el >= Duration::from_millis(900) && el < Duration::from_millis(2000),
        "{el:?}"
    );
    assert!(l.tokens().unwrap() < 0, "forced into debt");
    hog.join().unwrap();
    let s = l.stats();
    assert_eq!(s.forced, 1, "{s:?}");
    assert_eq!(s.queues[Priority::Low.index()].completed, 1);
    for q in s.queues {
        assert_eq!(q.deferred - q.completed, q.count);
    }
}

#[test]
fn priorities_drain_highest_first_and_fifo_within_one() {
    let l = Limiter::new(1000).unwrap();
    l.consume(1000, Priority::Normal).unwrap(); // empty: everything queues
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut hs = Vec::new();
    let plan = [
        ("low", Priority::Low),
        ("normal-a", Priority::Normal),
        ("high", Priority::High),
        ("normal-b", Priority::Normal),
    ];
    for (i, (name, p)) in plan.into_iter().enumerate() {
        let (l2, order) = (l.clone(), order.clone());
        hs.push(thread::spawn(move || {
            l2.consume(200, p).unwrap();
            order.lock().unwrap().push(name);
        }));
        // Queued so far, by the deferred counters (not the pending gauge,
        // which drops if "low" is served before the next one queues: a wait
        // for it would then never end). 200 tokens a waiter, 200 ms at
        // 1,000/s, leave the spawns a wide margin (and the last is served
        // at 800 ms, before the 1 s stall bound would force anyone).
        until("queued", 5, || {
            l.stats().queues.iter().map(|q| q.deferred).sum::<u64>() == i as u64 + 1
        });
    }
    for h in hs {
        h.join().unwrap();
    }
    let got = order.lock().unwrap().clone();
    // "low" queued first, at t≈0, and may catch the first 200 tokens before
    // the others queue; after that strict priority, FIFO within Normal.
    let rest: Vec<_> = got.iter().filter(|n| **n != "low").copied().collect();
    assert_eq!(rest, ["high", "normal-a", "normal-b"], "{got:?}");
    assert_eq!(l.stats().forced, 0);
}

#[test]
fn a_blocked_front_blocks_only_its_own_queue() {
    let l = Limiter::new(1000).unwrap();
    l.consume(1000, Priority::Normal).unwrap();
    let l2 = l.clone();
    let big = thread::spawn(move || l2.consume(800, Priority::High).unwrap());
    until("big queued", 5, || l.stats().pending == 1);
    let t = Instant::now();
    l.consume(50, Priority::Low).unwrap(); // 50 ms of refill, ahead of the 800
    assert!(
        t.elapsed() < Duration::from_millis(600),
        "{:?}",
        t.elapsed()
    );
    let g = big.join().unwrap();
    assert!(!g.immediate);
}

#[test]
fn child_chains_charge_every_level() {
    let parent = Limiter::new(1000).unwrap();
    let child = parent.child(500).unwrap();
    let g = child.consume(400, Priority::Normal).unwrap();
    assert!(g.immediate && !g.forced);
    let (pt, ct) = (parent.tokens().unwrap(), child.tokens().unwrap());
    assert!((600..=610).contains(&pt), "{pt}");
    assert!((100..=110).contains(&ct), "{ct}");
    // The child's try fails on its own bucket, charging nothing anywhere.
    assert!(!child.try_consume(300).unwrap());
    assert!(parent.tokens().unwrap() >= pt);
    // The parent's try fails when the parent is short, even if the child is full.
    let roomy = parent.child(100_000).unwrap();
    assert!(parent.try_consume(600).unwrap());
    assert!(!roomy.try_consume(500).unwrap());
    assert!(roomy.tokens().unwrap() >= 100_000 - 1, "undone exactly");
    // Nested: a grandchild is limited by the tightest level.
    let grand = child.child(1_000_000).unwrap();
    assert!(grand.parent().is_some());
    let t = Instant::now();
    for _ in 0..5 {
        grand.consume(100, Priority::Normal).unwrap();
    }
    // ~100 in the child now, 500 at 500/s: about 0.8 s.
    let el = t.elapsed();
    assert!(
        el >= Duration::from_millis(600) && el < Duration::from_millis(2000),
        "{el:?}"
    );
}

/// A consume through a chain whose first look charges the levels below
/// and then finds the root short waits at the root and is charged once
/// on each level (the rest of the walk starts at the root): in the
/// counters and in the buckets; and a first look at a child whose own
/// bucket is short charges nothing above it.
#[test]
fn a_chain_that_waits_at_its_root_is_charged_once_per_level() {
    let root = Limiter::new(1_000).unwrap();
    let child = root.child_with_capacity(10, 1_000).unwrap();
    // Both counters claimed, so the next consumes take the first look.
    child.consume(1, Priority::Normal).unwrap();
    assert!(root.try_consume(root.tokens().unwrap() as u64).unwrap());
    let t = Instant::now();
    let g = child.consume(100, Priority::High).unwrap();
    let el = t.elapsed();
    assert!(!g.immediate && !g.forced, "{g:?}");
    assert!(el >= Duration::from_millis(60), "{el:?}");
    // 1 + 100 charged on the child, which refills 10/s.
    let ct = child.tokens().unwrap();
    assert!((899..=905).contains(&ct), "{ct}");
    let cs = child.stats();
    assert_eq!(cs.consumed, 101);
    assert_eq!(cs.queues[Priority::High.index()].consumed, 100);
    assert_eq!(root.stats().queues[Priority::High.index()].consumed, 100);
    // The child's own bucket short: nothing charged at the root.
    let before = root.tokens().unwrap();
    let t = Instant::now();
    child
        .consume_timeout(950, Priority::Normal, Duration::from_millis(50))
        .unwrap_err();
    assert!(t.elapsed() >= Duration::from_millis(50));
    assert!(root.tokens().unwrap() >= before);
    assert_eq!(child.stats().consumed, 101);
}

#[test]
fn a_forced_item_is_charged_into_debt_on_the_whole_chain() {
    let parent = Limiter::new(100).unwrap();
    let child = parent.child(1000).unwrap();
    // 150 fits the child, exceeds the (full) parent: admitted into debt.
    let g = child.consume(150, Priority::Normal).unwrap();
    assert!(g.immediate && g.forced);
    assert!(parent.tokens().unwrap() <= -49);
    assert!((850..=860).contains(&child.tokens().unwrap()));
    // Counted by the bucket that went into debt (the grant says so for the
    // whole chain).
    assert_eq!(parent.stats().forced, 1);
    assert_eq!(child.stats().forced, 0);
}

#[test]
fn timeouts_leave_the_queue_and_count_as_cancelled() {
    let l = Limiter::new(10).unwrap();
    l.consume(10, Priority::Normal).unwrap();
    let t = Instant::now();
    let e = l
        .consume_timeout(5, Priority::Normal, Duration::from_millis(50))
        .unwrap_err();
    assert!(matches!(e, Error::Timeout), "{e:?}");
    assert!(t.elapsed() < Duration::from_millis(400));
    let s = l.stats();
    let q = s.queues[Priority::Normal.index()];
    assert_eq!(
        (q.count, q.deferred, q.completed, q.cancelled),
        (0, 1, 1, 1)
    );
    assert_eq!(s.pending, 0);
    // The 50 ms wait was a stall, and the interval closed with it.
    assert!(s.stall_ns >= 40_000_000, "stall {} ns", s.stall_ns);
    assert_eq!(l.stats().stall_ns, s.stall_ns);
    // A timeout long enough succeeds.
    let g = l
        .consume_timeout(1, Priority::Normal, Duration::from_secs(5))
        .unwrap();
    assert!(!g.forced);
}

#[test]
fn stall_gauge_ticks_while_the_front_is_blocked() {
    let l = Limiter::new(100).unwrap();
    l.consume(100, Priority::Normal).unwrap();
    let l2 = l.clone();
    let h = thread::spawn(move || l2.consume(90, Priority::Lower).unwrap());
    thread::sleep(Duration::from_millis(350));
    let s = l.stats();
    let q = s.queues[Priority::Lower.index()];
    assert_eq!(q.count, 1);
    assert!(q.stall >= 2 && q.stall < STALL_TICKS, "{q:?}");
    assert_eq!(s.total.count, 1);
    h.join().unwrap();
    let s = l.stats();
    assert_eq!(s.queues[Priority::Lower.index()].stall, 0);
    assert_eq!(s.total.completed, 1);
}

#[test]
fn long_run_rate_holds_with_many_threads() {
    let l = Limiter::new(50_000).unwrap();
    l.consume(50_000, Priority::Normal).unwrap();
    let t = Instant::now();
    let total: u64 = thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|i| {
                let l = &l;
                s.spawn(move || {
                    let mut n = 0;
                    while t.elapsed() < Duration::from_millis(800) {
                        l.consume(500, Priority::ALL[i * 2 % 7]).unwrap();
                        n += 500;
                    }
                    n
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let el = t.elapsed().as_secs_f64();
    let rate = total as f64 / el;
    assert!(rate > 50_000.0 * 0.8 && rate < 50_000.0 * 1.2, "{rate}");
    let s = l.stats();
    // Exact: nothing consumed beyond capacity + refill − balance.
    assert!(
        (total + 50_000) as i64 <= 50_000 + s.clock as i64 - s.tokens,
        "{total} {s:?}"
    );
}

#[test]
fn try_consume_at_counts_and_refunds_at_its_priority() {
    let (hi, no, lo) = (
        Priority::High.index(),
        Priority::Normal.index(),
        Priority::Low.index(),
    );
    // 1 token/s: nothing measurable refills while the test runs.
    let root = Limiter::with_capacity(1, 1000).unwrap();
    assert!(root.try_consume_at(300, Priority::High).unwrap());
    assert!(root.try_consume_at(200, Priority::Low).unwrap());
    assert!(root.try_consume(100).unwrap());
    let s = root.stats();
    assert_eq!(s.queues[hi].consumed, 300);
    assert_eq!(s.queues[lo].consumed, 200);
    assert_eq!(
        s.queues[no].consumed, 100,
        "try_consume still counts at Normal"
    );
    assert_eq!(s.consumed, 600);
    assert_eq!(s.refunded, 0);
    assert_eq!(s.total.deferred, 0, "never queued");
    // Never into debt: a refusal charges and counts nothing.
    assert!(!root.try_consume_at(401, Priority::High).unwrap());
    assert_eq!(root.stats().queues[hi].consumed, 300);
    // A chain that refuses at the root refunds the child at the priority.
    assert!(root.try_consume_at(400, Priority::Normal).unwrap());
    let child = root.child_with_capacity(1, 1000).unwrap();
    assert!(!child.try_consume_at(250, Priority::Low).unwrap());
    let c = child.stats();
    assert_eq!(c.queues[lo].consumed, 250);
    assert_eq!(c.queues[lo].refunded, 250);
    assert_eq!(c.refunded, 250, "refunded at Low only");
    assert!(child.tokens().unwrap() >= 1000, "undone exactly");
    let s = root.stats();
    assert_eq!((s.queues[lo].consumed, s.refunded), (200, 0));
    // Validation is try_consume's.
    let e = root
        .try_consume_at(MAX_CONSUME + 1, Priority::High)
        .unwrap_err();
    assert!(invalid(e).contains(&(MAX_CONSUME + 1).to_string()));
}

#[test]
fn try_consume_at_never_overtakes_a_waiter_of_any_priority() {
    let l = Arc::new(Limiter::with_capacity(100, 100).unwrap());
    assert!(l.try_consume(100).unwrap());
    let w = {
        let l = l.clone();
        thread::spawn(move || l.consume(100, Priority::Low).unwrap())
    };
    until("the Low consume queues", 5, || l.stats().pending == 1);
    // Even zero tokens at the highest priority refuse while a Low waits.
    assert!(!l.try_consume_at(0, Priority::Highest).unwrap());
    assert!(!l.try_consume_at(1, Priority::High).unwrap());
    assert_eq!(l.stats().queues[Priority::High.index()].consumed, 0);
    w.join().unwrap();
}

/// Threads consuming at once through one handle and its clones (which
/// share its counters: the first thread owns them, the others count on
/// shared words), then a thread started after every one of them exited,
/// the first owner included: the per-priority counters are exact, in
/// process and for a shared handle, at each level of a chain.
#[test]
fn counters_exact_across_threads_sharing_a_handle() {
    const THREADS: u64 = 4;
    const PER: u64 = 20_000;
    let region = shmsched::region::Region::anonymous().unwrap();
    let rate = i32::MAX as u64;
    let shared = Limiter::shared(&region, rate).unwrap();
    for lim in [
        Limiter::new(rate).unwrap(),
        shared.clone(),
        shared.child(rate).unwrap(),
    ] {
        let go = Arc::new(std::sync::Barrier::new(THREADS as usize));
        let hs: Vec<_> = (0..THREADS)
            .map(|i| {
                let (lim, go) = (lim.clone(), go.clone());
                thread::spawn(move || {
                    go.wait();
                    for k in 0..PER {
                        let p = if k % 2 == 0 {
                            Priority::High
                        } else {
                            Priority::Low
                        };
                        lim.consume(i + 1, p).unwrap();
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let each: u64 = (1..=THREADS).map(|i| i * PER / 2).sum();
        let s = lim.stats();
        assert_eq!(s.queues[Priority::High.index()].consumed, each);
        assert_eq!(s.queues[Priority::Low.index()].consumed, each);
        assert_eq!(s.consumed, 2 * each);
        // Every thread that counted has exited; a new one counts on.
        let l2 = lim.clone();
        thread::spawn(move || {
            for _ in 0..PER {
                l2.consume(1, Priority::High).unwrap();
            }
        })
        .join()
        .unwrap();
        lim.consume(3, Priority::High).unwrap();
        let s = lim.stats();
        assert_eq!(s.queues[Priority::High.index()].consumed, each + PER + 3);
        assert_eq!(s.consumed, 2 * each + PER + 3);
    }
}
