//! The FairShare success path allocates nothing (issue 19): acquire
//! (granted, own or borrowed), release, and stats into a `Stats` of the
//! same shape, in-process and in a region, with explicit times and with
//! the clock. A counting global allocator counts this thread's
//! allocations while the calls run.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use shmsched::fair::{FairConfig, FairShare, FairnessUnit, Stats};
use shmsched::region::Region;

struct Counting;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the bookkeeping only touches
// const-initialised thread-locals (no allocation, no reentrancy).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if ON.with(Cell::get) {
            COUNT.with(|c| c.set(c.get() + 1));
        }
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if ON.with(Cell::get) {
            COUNT.with(|c| c.set(c.get() + 1));
        }
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Allocations made by this thread while `f` runs.
fn allocations(f: impl FnOnce()) -> u64 {
    COUNT.with(|c| c.set(0));
    ON.with(|o| o.set(true));
    f();
    ON.with(|o| o.set(false));
    COUNT.with(Cell::get)
}

fn cfg() -> FairConfig {
    FairConfig {
        ceiling: 100.0,
        fairness_unit: FairnessUnit::Cost,
        tenants: vec![("a".into(), 1.0), ("b".into(), 1.0), ("c".into(), 2.0)],
        reclaim_horizon_ms: 100,
        idle_after_ms: 1000,
        started_at_ms: 0,
    }
}

/// The calls counted, for either home.
macro_rules! success_path {
    ($f:expr, $stats:expr, $now:expr) => {{
        let now: u64 = $now;
        // Own units, then a loan from idle c (a and b are busy).
        let own = $f.acquire("a", 10.0, 50, now).unwrap().unwrap();
        let loan = $f.acquire("b", 40.0, 50, now).unwrap().unwrap();
        assert!(loan.slices.len() == 1);
        $f.stats_into(now, &mut $stats).unwrap();
        $f.release(&loan.id, now).unwrap();
        $f.release(&own.id, now).unwrap();
        $f.stats_into(now, &mut $stats).unwrap();
    }};
}

/// The whole check for one home: after one warm-up round (which sets the
/// stats' shape), 1,000 rounds of the success path and 100 pairs at the
/// clock allocate nothing.
macro_rules! allocates_nothing {
    ($f:expr) => {{
        let mut f = $f;
        // One overrun lease stays in the stats' shape.
        f.acquire("a", 1.0, 1, 2_000).unwrap().unwrap();
        let mut stats = Stats::default();
        let mut now = 3_000;
        success_path!(f, stats, now);
        assert_eq!(stats.overrun_leases.len(), 1);
        let n = allocations(|| {
            for _ in 0..1000 {
                now += 1;
                success_path!(f, stats, now);
            }
        });
        assert_eq!(n, 0, "allocations in 1000 rounds");
        assert_eq!(stats.tenant("b").unwrap().held, 0.0);
        let n = allocations(|| {
            for _ in 0..100 {
                let l = f.acquire_now("a", 1.0, 10).unwrap().unwrap();
                f.release_now(&l.id).unwrap();
            }
        });
        assert_eq!(n, 0, "allocations in 100 pairs at the clock");
    }};
}

#[test]
fn in_process_success_path_allocates_nothing() {
    allocates_nothing!(FairShare::new(cfg()).unwrap());
}

#[test]
fn region_success_path_allocates_nothing() {
    let region = Region::anonymous().unwrap();
    allocates_nothing!(FairShare::shared(&region, &cfg()).unwrap());
}
