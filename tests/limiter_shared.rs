//! The Limiter shared by real processes through one region: the aggregate
//! rate of 8 processes, exact token accounting (nothing created or lost),
//! region validation, and a scribbled bucket word reported as an error.

mod procs;

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use procs::{say, spawn, wait_parent, Kid};
use shmsched::limiter::Limiter;
use shmsched::region::Region;
use shmsched::{Error, Priority};

const ENTRY: &str = "child_entry";

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
        // Attach, wait for "go", consume random chunks at random priorities
        // for `ms` milliseconds, report what was consumed.
        "consume" => {
            let region = Region::open(&args[0]).expect("open region");
            let lim = Limiter::attach(&region).expect("attach");
            let ms: u64 = args[1].parse().unwrap();
            let max_chunk: u64 = args[2].parse().unwrap();
            let mut x = u64::from(std::process::id()) | 1;
            say("ready");
            wait_parent();
            let start = Instant::now();
            let (mut total, mut forced, mut forced_tokens) = (0u64, 0u64, 0u64);
            while start.elapsed() < Duration::from_millis(ms) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let n = 1 + x % max_chunk;
                let p = Priority::ALL[(x >> 32) as usize % 7];
                let g = lim.consume(n, p).expect("consume");
                total += n;
                if g.forced {
                    forced += 1;
                    forced_tokens += n;
                }
            }
            say(&format!("done {total} {forced} {forced_tokens}"));
            wait_parent();
        }
        // Consume small chunks at every priority until killed.
        "hog" => {
            let region = Region::open(&args[0]).expect("open region");
            let lim = Limiter::attach(&region).expect("attach");
            say("ready");
            let mut i = 0usize;
            loop {
                lim.consume(97, Priority::ALL[i % 7]).expect("consume");
                i += 1;
            }
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
fn eight_processes_share_one_rate_exactly() {
    const RATE: u64 = 2_000_000;
    const PROCS: usize = 8;
    const MS: u64 = 3000;
    let name = procs::unique_name("lim8");
    let _c = Cleanup(name.clone());
    let region = Region::create(&name).unwrap();
    let lim = Limiter::shared(&region, RATE).unwrap();
    let path = path_of(&name);
    let mut kids: Vec<Kid> = (0..PROCS)
        .map(|_| {
            spawn(
                ENTRY,
                "consume",
                &[path.clone(), MS.to_string(), "20000".into()],
            )
        })
        .collect();
    for k in &mut kids {
        k.expect_line("ready");
    }
    // Empty the (full) bucket so the children see only the refill.
    lim.consume(RATE, Priority::Highest).unwrap();
    let s0 = lim.stats();
    let tat0 = s0.clock as i64 + RATE as i64 - s0.tokens;
    let t0 = Instant::now();
    for k in &mut kids {
        k.send("go");
    }
    let (mut total, mut forced, mut forced_tokens) = (0u64, 0u64, 0u64);
    for k in &mut kids {
        let line = k.expect_line("done");
        let v: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
        total += v[0];
        forced += v[1];
        forced_tokens += v[2];
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let s1 = lim.stats();
    for k in kids {
        assert!(k.finish().success());
    }
    let tat1 = s1.clock as i64 + RATE as i64 - s1.tokens;
    // Exact accounting: every grant added exactly n to the bucket word, and
    // the bucket was never full again (8 busy processes), so nothing was
    // created or lost.
    assert_eq!(
        total as i64,
        tat1 - tat0,
        "consumed {total}, word moved {}",
        tat1 - tat0
    );
    // The shared counter saw every force-through the children saw.
    let shared = s1.shared.as_ref().unwrap();
    assert_eq!(shared.forced, forced, "{s1:?}");
    // Consumed ≤ refill over the window + forced debt (the balance says how
    // much debt is outstanding).
    let refill = (s1.clock - s0.clock) as i64;
    assert!(total as i64 <= refill - s1.tokens + s0.tokens);
    assert!(
        -s1.tokens <= forced_tokens as i64 + 20_000,
        "{} {forced_tokens}",
        s1.tokens
    );
    // Aggregate rate within 15% of the configured one.
    let rate = total as f64 / elapsed;
    assert!(
        rate > RATE as f64 * 0.85 && rate < RATE as f64 * 1.15,
        "aggregate {rate:.0}/s vs {RATE}/s over {elapsed:.2}s"
    );
    eprintln!(
        "8 processes: {rate:.0} tokens/s ({:.1}% of {RATE}), forced {forced}",
        100.0 * rate / RATE as f64
    );
}

#[test]
fn region_rate_is_validated_and_attach_joins_it() {
    let name = procs::unique_name("limv");
    let _c = Cleanup(name.clone());
    let region = Region::create(&name).unwrap();
    assert!(Limiter::shared(&region, 0).is_err());
    let a = Limiter::shared(&region, 5000).unwrap();
    let e = Limiter::shared(&region, 6000).unwrap_err();
    assert!(matches!(e, Error::Mismatch(_)), "{e:?}");
    let b = Limiter::attach(&Region::open(&name).unwrap()).unwrap();
    assert_eq!(b.tokens_per_second(), 5000);
    // One bucket: what one handle takes, the other sees.
    a.consume(3000, Priority::Normal).unwrap();
    assert!(b.tokens().unwrap() <= 2010);
    let s = b.stats();
    let sh = s.shared.unwrap();
    assert!(sh.processes >= 1);
    // A scheduler region is not a limiter.
    let other = procs::unique_name("limk");
    let _c2 = Cleanup(other.clone());
    let r2 = Region::create(&other).unwrap();
    let _s = shmsched::scheduler::Scheduler::shared(&r2, 4).unwrap();
    assert!(matches!(
        Limiter::attach(&r2).unwrap_err(),
        Error::WrongKind { .. }
    ));
}

#[test]
fn a_scribbled_bucket_word_is_an_error_not_a_hang() {
    let name = procs::unique_name("lims");
    let _c = Cleanup(name.clone());
    let region = Region::create(&name).unwrap();
    let lim = Limiter::shared(&region, 1000).unwrap();
    // The bucket word opens the limiter's state line, after the wait
    // registry.
    let off = region.info().unwrap().unwrap().object_offset;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path_of(&name))
        .unwrap();
    f.write_all_at(
        &u64::MAX.to_ne_bytes(),
        off + shmsched::region::registry::REGISTRY_SIZE as u64,
    )
    .unwrap();
    let e = lim.consume(1, Priority::Normal).unwrap_err();
    assert!(matches!(e, Error::BadRegion(_)), "{e:?}");
    assert!(e.to_string().contains(&u64::MAX.to_string()), "{e}");
    assert!(lim.try_consume(1).is_err());
    assert!(lim.tokens().is_err());
    // Repaired by hand (the word back to a sane value), it works again.
    f.write_all_at(
        &0u64.to_ne_bytes(),
        off + shmsched::region::registry::REGISTRY_SIZE as u64,
    )
    .unwrap();
    lim.consume(1, Priority::Normal).unwrap();
}

#[test]
fn processes_killed_mid_consume_leave_a_valid_bucket_and_are_reaped() {
    let name = procs::unique_name("limk9");
    let _c = Cleanup(name.clone());
    let region = Region::create(&name).unwrap();
    let lim = Limiter::shared(&region, 100_000).unwrap();
    let mut kids: Vec<Kid> = (0..3)
        .map(|_| spawn(ENTRY, "hog", &[path_of(&name)]))
        .collect();
    for k in &mut kids {
        k.expect_line("ready");
    }
    std::thread::sleep(Duration::from_millis(300));
    let before = lim.stats().shared.unwrap();
    assert_eq!(before.processes, 4, "{before:?}");
    for k in kids {
        k.kill(); // SIGKILL, at any point of a consume
    }
    // The bucket is one word changed only by CAS: whatever the moment of
    // death, it is valid.
    let t = lim.tokens().unwrap();
    assert!((-(97 * 3 * 7)..=100_000).contains(&t), "{t}");
    // Hogs still alive while the others were killed may have reaped them
    // already (a drain that finds a dead process's stale waiter counts
    // reaps it rather than deferring to it); together, all three are gone.
    assert!(lim.reap().unwrap() <= 3);
    let after = lim.stats().shared.unwrap();
    assert_eq!(after.processes, 1, "{after:?}");
    assert_eq!(after.waiters, [0; 7], "dead waiters are not counted");
    // The hogs waited: the region's stall clock ran, and stopped with them.
    assert!(after.stall_ns > 0, "{after:?}");
    assert_eq!(lim.stats().shared.unwrap().stall_ns, after.stall_ns);
    let g = lim
        .consume_timeout(1000, Priority::Normal, Duration::from_secs(5))
        .unwrap();
    assert!(!g.forced);
}

#[test]
fn try_consume_at_counts_at_its_priority_in_the_region() {
    let (hi, no, lo) = (
        Priority::High.index(),
        Priority::Normal.index(),
        Priority::Low.index(),
    );
    let name = procs::unique_name("limt");
    let _c = Cleanup(name.clone());
    let region = Region::create(&name).unwrap();
    // 1 token/s: nothing measurable refills while the test runs.
    let a = Limiter::shared_with_capacity(&region, 1, 1000).unwrap();
    let b = Limiter::attach(&Region::open(&name).unwrap()).unwrap();
    assert!(a.try_consume_at(300, Priority::High).unwrap());
    assert!(b.try_consume_at(200, Priority::Low).unwrap());
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!((sa.queues[hi].consumed, sa.queues[lo].consumed), (300, 0));
    assert_eq!((sb.queues[hi].consumed, sb.queues[lo].consumed), (0, 200));
    let sh = sb.shared.unwrap();
    assert_eq!(sh.consumed[hi], 300);
    assert_eq!(sh.consumed[lo], 200);
    assert_eq!(sh.consumed[no], 0);
    // Empty the bucket; a child's try then refuses at the root, and the
    // child (charged first) is refunded at the priority; the region is not.
    assert!(a.try_consume(500).unwrap());
    let child = a.child_with_capacity(1, 1000).unwrap();
    assert!(!child.try_consume_at(250, Priority::High).unwrap());
    let c = child.stats();
    assert_eq!((c.queues[hi].consumed, c.queues[hi].refunded), (250, 250));
    assert_eq!(c.refunded, 250);
    let sh = a.stats().shared.unwrap();
    assert_eq!(sh.consumed[hi], 300);
    assert_eq!(sh.consumed[no], 500);
    assert_eq!(sh.refunded, [0; 7]);
}
