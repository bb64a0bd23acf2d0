//! Order across real processes sharing one limiter region: a consume in
//! one process never takes the fast path while a consume of its priority or
//! above waits in another; it queues, and the region's queues follow the
//! same rule as one process's (a front that cannot be charged yet holds
//! back no lower front that can); FIFO within a priority holds across
//! processes, and the next front is woken (futex) when the one ahead of it
//! is served, instead of polling.

mod procs;

use std::time::{Duration, Instant};

use procs::{say, spawn, until, wait_parent, Kid};
use shmsched::limiter::Limiter;
use shmsched::region::Region;
use shmsched::Priority;

const ENTRY: &str = "child_entry";
const RATE: u64 = 1000;

fn path_of(name: &str) -> String {
    format!("/dev/shm/shmsched.{name}")
}

/// Entry point of the child processes (does nothing in a normal test run).
#[test]
fn child_entry() {
    let Some((role, args)) = procs::role() else {
        return;
    };
    match role.as_str() {
        // Attach, wait for "go", consume `n` tokens at the highest priority
        // (blocking), report it, wait for the parent.
        "high" => {
            let region = Region::open(&args[0]).expect("open region");
            let lim = Limiter::attach(&region).expect("attach");
            let n: u64 = args[1].parse().unwrap();
            say("ready");
            wait_parent();
            let g = lim.consume(n, Priority::Highest).expect("consume");
            say(&format!("granted {}", g.immediate));
            wait_parent();
        }
        // Attach, wait for "go", then `k` charges at the highest rate
        // through the root and through a child of it (consume and
        // try_consume, every priority in turn, 1..=7 tokens), and report
        // the tokens charged at the root per priority.
        "burst" => {
            let region = Region::open(&args[0]).expect("open region");
            let lim = Limiter::attach(&region).expect("attach");
            let k: u64 = args[1].parse().unwrap();
            let kid = lim.child(MAX).expect("child");
            say("ready");
            wait_parent();
            let (sums, _) = charge_mix(&lim, &kid, k, 0);
            say(&format!("sums {}", sums.map(|x| x.to_string()).join(" ")));
            wait_parent();
        }
        other => panic!("unknown role {other}"),
    }
}

const MAX: u64 = i32::MAX as u64;

/// `k` charges through `root` and its child `kid` (consume and
/// try_consume, priority and size from `i + seed`), counting per priority
/// the tokens charged at the root, and those of them that went through
/// `kid`.
fn charge_mix(root: &Limiter, kid: &Limiter, k: u64, seed: u64) -> ([u64; 7], [u64; 7]) {
    let (mut sums, mut through_kid) = ([0u64; 7], [0u64; 7]);
    for i in 0..k {
        let x = i + seed;
        let pr = Priority::ALL[(x % 7) as usize];
        let n = 1 + (x / 7) % 7;
        let ok = match x % 4 {
            0 => root.consume(n, pr).is_ok(),
            1 => kid.consume(n, pr).is_ok(),
            2 => root.try_consume_at(n, pr).unwrap(),
            _ => kid.try_consume_at(n, pr).unwrap(),
        };
        if ok {
            sums[pr.index()] += n;
            if x % 2 == 1 {
                through_kid[pr.index()] += n;
            }
        }
    }
    (sums, through_kid)
}

struct Cleanup(String);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Region::remove(&self.0);
    }
}

fn waiting(lim: &Limiter) -> u64 {
    lim.stats()
        .shared
        .expect("shared stats")
        .waiters
        .iter()
        .sum()
}

/// A region with a drained bucket and a child whose `n`-token
/// highest-priority consume is queued on it.
fn setup(tag: &str, n: u64) -> (Cleanup, Region, Limiter, Kid) {
    let name = procs::unique_name(tag);
    let c = Cleanup(name.clone());
    let region = Region::create(&name).unwrap();
    let lim = Limiter::shared(&region, RATE).unwrap();
    let mut b = spawn(ENTRY, "high", &[path_of(&name), n.to_string()]);
    b.expect_line("ready");
    // Empty the (full) bucket.
    lim.consume(RATE, Priority::Highest).unwrap();
    b.send("go");
    until("the child's waiter to queue", 10, || waiting(&lim) == 1);
    (c, region, lim, b)
}

#[test]
fn a_low_consume_queues_behind_a_blocked_higher_one_and_goes_when_it_fits() {
    let (_c, _region, lim, mut b) = setup("limx-fast", 500);
    // Let some tokens refill: far fewer than the child's 500, enough for
    // this process's 10.
    until("tokens to refill", 10, || lim.tokens().unwrap() >= 50);
    assert_eq!(waiting(&lim), 1, "the child's waiter is still queued");
    let have = lim.tokens().unwrap();
    // The fast path is closed while the child waits: try_consume refuses.
    assert!(!lim.try_consume(10).unwrap());
    let t = Instant::now();
    let g = lim.consume(10, Priority::Lowest).unwrap();
    let took = t.elapsed();
    assert!(
        !g.immediate,
        "went on the fast path past the child's waiter"
    );
    assert!(!g.forced, "{g:?}");
    // The child's front could not be charged (it needs 500, the bucket held
    // `have`): this consume did not wait for it...
    assert!(
        took < Duration::from_millis((500 - have.min(500) as u64) / 2),
        "waited {took:?} for a front that could not go"
    );
    // ...and the child still waits, for its own tokens.
    assert_eq!(waiting(&lim), 1);
    let line = b.expect_line("granted");
    assert_eq!(line, "false", "the child's consume had to wait");
    assert_eq!(waiting(&lim), 0);
    b.send("bye");
    assert!(b.finish().success());
}

#[test]
fn fifo_within_a_priority_holds_across_processes_and_the_next_front_is_woken() {
    let (_c, _region, lim, mut b) = setup("limx-wake", 300);
    let wakes0 = lim.stats().shared.unwrap().wakes;
    let t = Instant::now();
    // Same priority as the child's older waiter: this one queues behind it
    // (its 1 token would fit long before the child's 300) and sleeps until
    // the child's process, having been served, wakes it as the new front.
    let g = lim.consume(1, Priority::Highest).unwrap();
    let took = t.elapsed();
    assert!(!g.immediate && !g.forced, "{g:?}");
    assert_eq!(b.expect_line("granted"), "false");
    // FIFO: the child's 300 tokens came first.
    assert!(
        took >= Duration::from_millis(150),
        "took {took:?}: overtook the older waiter"
    );
    let wakes = lim.stats().shared.unwrap().wakes - wakes0;
    assert!(
        wakes >= 1,
        "no futex wake reached this process (took {took:?})"
    );
    // Loosely bounded: the child's ~300 ms of refill, then at once (well
    // below the 1 s force-through).
    assert!(took < Duration::from_millis(900), "took {took:?}");
    eprintln!("the second front took {took:?}, {wakes} process wake(s)");
    b.send("bye");
    assert!(b.finish().success());
}

/// A consume through a child of the shared root charges the child and
/// then meets the root's gate like any other: with a waiter of its
/// priority queued in another process it does not take the root's fast
/// path (the child's one clock reading for the whole walk changes nothing
/// there), and a try_consume through the child refuses and gives the
/// child its tokens back.
#[test]
fn a_consume_through_a_child_does_not_pass_a_waiter_queued_in_another_process() {
    let (_c, _region, lim, mut b) = setup("limx-kid", 500);
    let kid = lim.child(MAX).unwrap();
    until("tokens to refill", 10, || lim.tokens().unwrap() >= 50);
    assert_eq!(waiting(&lim), 1, "the child process's waiter is queued");
    let kid_tokens = kid.tokens().unwrap();
    assert!(!kid.try_consume_at(10, Priority::Highest).unwrap());
    assert_eq!(kid.tokens().unwrap(), kid_tokens, "the child was refunded");
    // A zero goes at once only when nothing waits anywhere: it queues (and
    // drains at once as the front of its own, empty, tier).
    let g = lim.consume(0, Priority::Lowest).unwrap();
    assert!(!g.immediate && !g.forced, "{g:?}");
    assert!(!lim.try_consume(0).unwrap());
    let g = kid.consume(10, Priority::Highest).unwrap();
    assert!(
        !g.immediate,
        "went on the fast path past the other process's waiter"
    );
    // FIFO at the root: the other process's older 500 went first.
    assert_eq!(b.expect_line("granted"), "false");
    let st = lim.stats();
    let sh = st.shared.unwrap();
    assert_eq!(sh.consumed[Priority::Highest.index()], RATE + 500 + 10);
    // The child: charged 10 by the refused try (and refunded them), then
    // 10 by the consume.
    let q = kid.stats().queues[Priority::Highest.index()];
    assert_eq!((q.consumed, q.refunded), (20, 10));
    b.send("bye");
    assert!(b.finish().success());
}

/// Counters stay exact under concurrent fast-path charges from threads of
/// this process and from other processes, through the root and through
/// children: the region's per-priority totals are the sum of what every
/// caller was charged, each handle's are its own, and the bucket bounds
/// them all (`clock + capacity - tokens` bounds what was ever consumed).
#[test]
fn counters_are_exact_after_concurrent_consumes_from_threads_and_processes() {
    const K: u64 = 20_000;
    let name = procs::unique_name("limx-count");
    let _c = Cleanup(name.clone());
    let region = Region::create(&name).unwrap();
    let lim = Limiter::shared(&region, MAX).unwrap();
    let mut kids: Vec<Kid> = (0..2)
        .map(|_| spawn(ENTRY, "burst", &[path_of(&name), K.to_string()]))
        .collect();
    for b in &mut kids {
        b.expect_line("ready");
    }
    for b in &mut kids {
        b.send("go");
    }
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let (root, kid) = (lim.clone(), lim.child(MAX).unwrap());
            std::thread::spawn(move || {
                let (sums, through_kid) = charge_mix(&root, &kid, K, 1 + t);
                (sums, through_kid, kid.stats())
            })
        })
        .collect();
    let mut total = [0u64; 7];
    let mut mine = [0u64; 7];
    for th in threads {
        let (sums, through_kid, kid_stats) = th.join().unwrap();
        for t in 0..7 {
            total[t] += sums[t];
            mine[t] += sums[t];
            // A child's counters are exactly its own charges (each of
            // them reached the root too: at this rate nothing is refused
            // there, so nothing was refunded).
            assert_eq!(
                kid_stats.queues[t].consumed, through_kid[t],
                "child, tier {t}"
            );
            assert_eq!(kid_stats.queues[t].refunded, 0);
        }
    }
    for mut b in kids {
        let line = b.expect_line("sums");
        let v: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
        for t in 0..7 {
            total[t] += v[t];
        }
        b.send("bye");
        assert!(b.finish().success());
    }
    let st = lim.stats();
    let sh = st.shared.unwrap();
    assert_eq!(sh.consumed, total, "region totals per priority");
    assert_eq!(sh.refunded, [0; 7], "nothing was refused at the root");
    // This process's handle (the root, shared by its threads' clones)
    // counts this process's charges at the root.
    let handle: Vec<u64> = st.queues.iter().map(|q| q.consumed).collect();
    assert_eq!(handle, mine, "this handle's counters");
    let sum: u64 = total.iter().sum();
    let bound = st.clock + u64::from(st.capacity) - st.tokens.max(0) as u64;
    assert!(sum <= bound, "{sum} consumed, bound {bound}");
    assert!(sum > 0);
}
