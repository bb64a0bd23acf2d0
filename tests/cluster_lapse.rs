//! The region enforces a cluster lease's lapse, with no agent and no
//! Redis: one process leases the region a level until a deadline and exits;
//! after the deadline no other process can hold (a scheduler) or consume
//! (a limiter) more than the safe level allows, because every admission of
//! a leased region reads the deadline.

mod procs;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use procs::{role, say, spawn, unique_name, wait_parent};
use shmsched::cluster;
use shmsched::limiter::Limiter;
use shmsched::region::Region;
use shmsched::scheduler::Scheduler;
use shmsched::Priority;

const MAX: u32 = 8;
const SAFE: u64 = 2;
const LEASE_MS: u64 = 300;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Waits until the Unix instant `at` (a time-based property: what is
/// checked is what holds after the deadline, not an ordering of events).
fn until_unix(at: u64) {
    let now = unix_ms();
    if at > now {
        std::thread::sleep(Duration::from_millis(at - now));
    }
}

#[test]
fn child_role() {
    let Some((r, a)) = role() else { return };
    let region = Region::open(&a[0]).unwrap();
    match r.as_str() {
        // Leases the region, says until when, and exits (no thread stays).
        "lessor" => {
            let until = Instant::now() + Duration::from_millis(LEASE_MS);
            let at = unix_ms() + LEASE_MS;
            if a[1] == "limiter" {
                let lim = Limiter::attach(&region).unwrap();
                cluster::lease_until(&lim, 10_000, 10, until).unwrap();
            } else {
                let sched = Scheduler::attach(&region).unwrap();
                cluster::lease_until(&sched, u64::from(MAX), SAFE, until).unwrap();
            }
            say(&format!("until {at}"));
        }
        "holder" => {
            let at: u64 = a[1].parse().unwrap();
            let sched = Scheduler::attach(&region).unwrap();
            let mut held = vec![];
            while let Some(p) = sched.try_acquire_owned(Priority::Normal) {
                held.push(p);
            }
            say(&format!("before {}", held.len()));
            held.clear();
            until_unix(at + 5);
            let end = Instant::now() + Duration::from_millis(400);
            let mut most = 0;
            let mut turn = 0u32;
            while Instant::now() < end {
                while let Some(p) = sched.try_acquire_owned(Priority::High) {
                    held.push(p);
                }
                if let Ok(p) =
                    sched.acquire_owned_timeout(Priority::Highest, Duration::from_millis(2))
                {
                    held.push(p);
                }
                most = most.max(held.len());
                turn += 1;
                if turn % 3 == 0 {
                    held.pop();
                }
            }
            say(&format!("after {most}"));
            wait_parent();
        }
        "consumer" => {
            let at: u64 = a[1].parse().unwrap();
            let lim = Limiter::attach(&region).unwrap();
            let t0 = Instant::now();
            let mut before = 0u64;
            while t0.elapsed() < Duration::from_millis(50) && unix_ms() + 100 < at {
                before += u64::from(lim.try_consume(1).unwrap());
            }
            say(&format!("before {before}"));
            until_unix(at + 5);
            let t1 = Instant::now();
            let mut after = 0u64;
            while t1.elapsed() < Duration::from_millis(1000) {
                after += u64::from(lim.try_consume(1).unwrap());
                if lim
                    .consume_timeout(1, Priority::High, Duration::from_millis(5))
                    .is_ok()
                {
                    after += 1;
                }
            }
            say(&format!("after {after} rate {}", lim.tokens_per_second()));
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

fn num(line: &str) -> u64 {
    line.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn a_lapsed_scheduler_lease_holds_every_process_at_the_safe_ceiling() {
    if role().is_some() {
        return;
    }
    let name = unique_name("lapse-s");
    let _c = Cleanup(name.clone());
    let region = Region::create(&name).unwrap();
    let sched = Scheduler::shared(&region, MAX).unwrap();
    sched.set_ceiling(1).unwrap();
    let mut lessor = spawn("child_role", "lessor", &[name.clone(), "scheduler".into()]);
    let at = lessor.expect_line("until ");
    assert!(lessor.finish().success());
    let mut holder = spawn("child_role", "holder", &[name.clone(), at]);
    let before = num(&holder.expect_line("before "));
    let after = num(&holder.expect_line("after "));
    assert!(holder.finish().success());
    println!("scheduler lease: {before} held before the deadline, at most {after} after");
    assert_eq!(
        before,
        u64::from(MAX),
        "the leased ceiling is in force before"
    );
    assert_eq!(
        after, SAFE,
        "after the deadline, at most (and up to) the safe level"
    );
    assert_eq!(u64::from(sched.ceiling()), SAFE);
    // The region's own ceiling (1) is recorded for a release.
    let r = cluster::release(&sched, true).unwrap();
    assert!(r.was_armed);
    assert_eq!(r.restored, Some(1));
    assert_eq!(sched.ceiling(), 1);
}

#[test]
fn a_lapsed_limiter_lease_holds_every_process_at_the_safe_rate() {
    if role().is_some() {
        return;
    }
    let name = unique_name("lapse-l");
    let _c = Cleanup(name.clone());
    let region = Region::create(&name).unwrap();
    let lim = Limiter::shared(&region, 100).unwrap();
    let mut lessor = spawn("child_role", "lessor", &[name.clone(), "limiter".into()]);
    let at = lessor.expect_line("until ");
    assert!(lessor.finish().success());
    let mut c = spawn("child_role", "consumer", &[name.clone(), at]);
    let before = num(&c.expect_line("before "));
    let line = c.expect_line("after ");
    assert!(c.finish().success());
    let after = num(&line);
    println!("limiter lease: {before} tokens in 50 ms before the deadline, {after} in 1 s after ({line})");
    assert!(before > 200, "the leased rate is in force before: {before}");
    // Safe rate 10/s with a burst of 10 (the lease's burst ratio, 1): at
    // most the burst plus one second of refill.
    assert!(after <= 10 + 10 + 1, "after the deadline: {after}");
    assert!(line.ends_with("rate 10"), "{line}");
    assert_eq!(lim.tokens_per_second(), 10);
}

/// Admissions that start after the deadline are held to the safe level
/// even while the leased fast path runs right up to it (its coarse-clock
/// check must hand over to the precise one before the deadline: the
/// coarse clock lags 2 to 6 ms here). One thread takes up to one slot more
/// than the safe level and gives them back, in a loop from 150 ms before
/// the deadline to 100 ms after it; a round never asks for more than that,
/// so no failed take's slow path lowers the ceiling for it. No round that
/// started after the deadline gets more than the safe level; rounds before
/// it get what they ask.
#[test]
fn admissions_across_the_deadline_never_exceed_safe_after_it() {
    if role().is_some() {
        return;
    }
    let region = Region::anonymous().unwrap();
    let sched = Scheduler::shared(&region, MAX).unwrap();
    let until = Instant::now() + Duration::from_millis(150);
    cluster::lease_until(&sched, u64::from(MAX), SAFE, until).unwrap();
    // The recorded deadline is read after `until` was: a few µs later.
    let after = until + Duration::from_millis(1);
    let ask = SAFE as usize + 1;
    let (mut full_before, mut rounds_after, mut over) = (0u64, 0u64, Vec::new());
    let mut held = Vec::with_capacity(ask);
    while Instant::now() < until + Duration::from_millis(100) {
        let start = Instant::now();
        for _ in 0..ask {
            if let Some(p) = sched.try_acquire(Priority::Normal) {
                held.push(p);
            }
        }
        if start > after {
            rounds_after += 1;
            if held.len() > SAFE as usize {
                over.push((start.duration_since(until), held.len()));
            }
        } else if start < until && held.len() == ask {
            full_before += 1;
        }
        held.clear();
    }
    println!(
        "{rounds_after} rounds after the deadline, {} over the safe level",
        over.len()
    );
    assert!(
        over.is_empty(),
        "rounds over the safe level after the deadline (time after it, held): {:?}",
        &over[..over.len().min(10)]
    );
    assert!(
        rounds_after > 100,
        "only {rounds_after} rounds after the deadline"
    );
    assert!(
        full_before > 100,
        "the leased level before the deadline: {full_before} rounds"
    );
    assert_eq!(u64::from(sched.ceiling()), SAFE);
}
