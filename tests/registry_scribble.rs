//! A region's wait registry is region contents: any writer may scribble on
//! it. No caller may hang or panic on what it finds; the objects go on
//! working (or fail with a clear error) and the registry heals as waiters
//! come and go.

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use shmsched::limiter::Limiter;
use shmsched::region::Region;
use shmsched::scheduler::Scheduler;
use shmsched::Priority;

fn scribble(region: &Region, at: u64, bytes: &[u8]) {
    let off = region.info().unwrap().unwrap().object_offset + at;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(region.path().unwrap())
        .unwrap();
    f.write_all_at(bytes, off).unwrap();
}

struct Cleanup(String);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Region::remove(&self.0);
    }
}

fn name(tag: &str) -> String {
    format!("test-scribble-{tag}-{}", std::process::id())
}

#[test]
fn a_gate_of_all_ones_neither_hangs_nor_stops_the_scheduler() {
    let n = name("sched");
    let _c = Cleanup(n.clone());
    let region = Region::create(&n).unwrap();
    let s = Scheduler::shared(&region, 2).unwrap();
    // The gate (every tier "waiting", strict, counting, shrinking, and a
    // stall start in the far future), the designee and the tickets.
    scribble(&region, 0, &u64::MAX.to_ne_bytes());
    scribble(&region, 128, &[0xff; 64]);
    let t = Instant::now();
    let a = s
        .acquire_timeout(Priority::Low, Duration::from_secs(5))
        .expect("served");
    let b = s.try_acquire(Priority::Highest);
    drop((a, b));
    assert!(t.elapsed() < Duration::from_secs(5));
    // Nothing waits now: the gate's tier bits are cleared by the waiters
    // that came and went, and the fast path is open again.
    let st = s.stats().shared.unwrap();
    assert_eq!(st.waiters, [0; 7]);
    assert!(s.try_acquire(Priority::Normal).is_some());
}

#[test]
fn a_scribbled_limiter_registry_neither_hangs_nor_stops_the_limiter() {
    let n = name("lim");
    let _c = Cleanup(n.clone());
    let region = Region::create(&n).unwrap();
    let lim = Limiter::shared(&region, 1_000_000).unwrap();
    scribble(&region, 0, &u64::MAX.to_ne_bytes());
    scribble(&region, 128, &[0xff; 64]);
    let t = Instant::now();
    lim.consume_timeout(10, Priority::Low, Duration::from_secs(5))
        .expect("charged");
    let _ = lim.try_consume(10).unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(lim.stats().shared.unwrap().waiters, [0; 7]);
}
