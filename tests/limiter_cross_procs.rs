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
        other => panic!("unknown role {other}"),
    }
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
