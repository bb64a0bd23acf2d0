//! Priorities across real processes sharing one limiter region: a
//! low-priority consume in one process must not take tokens on the fast
//! path while a higher-priority consume waits in another, and a process
//! deferring to another's waiter is woken (futex) when that waiter is
//! served, instead of polling.

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
fn fast_path_leaves_tokens_to_a_higher_waiter_in_another_process() {
    let (_c, _region, lim, mut b) = setup("limx-fast", 500);
    // Let some tokens refill: far fewer than the child's 500, enough for
    // this process's 10.
    until("tokens to refill", 10, || lim.tokens().unwrap() >= 50);
    assert_eq!(waiting(&lim), 1, "the child's waiter is still queued");
    let have = lim.tokens().unwrap();
    // The fast path is closed while the child waits.
    assert!(!lim.try_consume(10).unwrap());
    let t = Instant::now();
    let g = lim.consume(10, Priority::Lowest).unwrap();
    let took = t.elapsed();
    assert!(
        !g.immediate,
        "went on the fast path past the child's waiter"
    );
    assert!(!g.forced, "{g:?}");
    // The child's waiter left the queue before this grant...
    assert_eq!(waiting(&lim), 0, "granted while the child still waited");
    let line = b.expect_line("granted");
    assert_eq!(line, "false", "the child's consume had to wait");
    // ...and got its tokens first: this consume waited at least for the
    // child's missing tokens to refill (500 - have, at 1 token/ms).
    let need = Duration::from_millis((500 - have.min(500) as u64).saturating_sub(20));
    assert!(
        took >= need,
        "took {took:?}, the child needed {need:?} more"
    );
    b.send("bye");
    assert!(b.finish().success());
}

#[test]
fn a_deferring_process_is_woken_when_the_waiter_elsewhere_is_served() {
    let (_c, _region, lim, mut b) = setup("limx-wake", 300);
    let wakes0 = lim.stats().shared.unwrap().wakes;
    let t = Instant::now();
    // Queues (the child waits), defers to the child's higher waiter and
    // sleeps on this process's futex word until the child's grant wakes it.
    let g = lim.consume(1, Priority::Lowest).unwrap();
    let took = t.elapsed();
    assert!(!g.immediate && !g.forced, "{g:?}");
    b.expect_line("granted");
    let wakes = lim.stats().shared.unwrap().wakes - wakes0;
    assert!(
        wakes >= 1,
        "no futex wake reached the deferring process (took {took:?})"
    );
    // Loosely bounded: the child's ~300 ms of refill, then at once (well
    // below the 1 s force-through).
    assert!(took < Duration::from_millis(900), "took {took:?}");
    eprintln!("deferring consume took {took:?}, {wakes} process wake(s)");
    b.send("bye");
    assert!(b.finish().success());
}
