//! FairShare call cost does not depend on how many leases are or were held
//! (issue 20, point 2): one acquire + release pair with 1, 1,024 and 4,096
//! other leases held, and after all of them were released, in-process and
//! in a region. A loose bound (the bench row `benches/fair.rs` measures the
//! same on a quiet machine): the slowest level within 3× of the fastest,
//! each level timed as the fastest of many batches so that a loaded
//! machine's noise does not decide. The old ledger took 0.3 µs empty,
//! 494 µs with 4,096 held and 81 µs after all were released.

use std::time::{Duration, Instant};

use shmsched::fair::{FairConfig, FairLedger, FairShare, FairnessUnit};
use shmsched::region::Region;

fn cfg() -> FairConfig {
    FairConfig {
        ceiling: 1e9,
        fairness_unit: FairnessUnit::Cost,
        tenants: vec![("a".into(), 1.0), ("b".into(), 1.0)],
        reclaim_horizon_ms: 100,
        idle_after_ms: 1000,
        started_at_ms: 0,
    }
}

const CAP: usize = 4096 + 16;

/// The fastest per-pair time over `batches` batches of `per` pairs.
fn pair_cost<L: FairLedger>(f: &mut L, now: u64, batches: usize, per: usize) -> Duration {
    let mut best = Duration::MAX;
    for _ in 0..batches {
        let t = Instant::now();
        for _ in 0..per {
            let l = f.acquire("a", 1.0, 100, now).unwrap().unwrap();
            f.release(&l.id, now).unwrap();
        }
        best = best.min(t.elapsed() / per as u32);
    }
    best
}

/// Times the pair at each level of leases held by tenant `b`, then after
/// they are all released; returns the times and checks the bound.
fn levels<L: FairLedger>(f: &mut L, home: &str) {
    let now = 5;
    let mut held = Vec::new();
    let mut rows = Vec::new();
    // Warm up.
    pair_cost(f, now, 3, 50);
    for level in [1usize, 1024, 4096] {
        while held.len() < level {
            held.push(f.acquire("b", 1.0, 1_000_000, now).unwrap().unwrap().id);
        }
        rows.push((level.to_string(), pair_cost(f, now, 40, 50)));
    }
    for id in held.drain(..) {
        f.release(&id, now).unwrap();
    }
    rows.push(("0 after 4096".into(), pair_cost(f, now, 40, 50)));
    let fastest = rows.iter().map(|r| r.1).min().unwrap();
    let slowest = rows.iter().map(|r| r.1).max().unwrap();
    for (level, d) in &rows {
        eprintln!(
            "{home}: {level:>12} held: {:>8.0} ns / pair",
            d.as_nanos() as f64
        );
    }
    let ratio = slowest.as_secs_f64() / fastest.as_secs_f64();
    assert!(
        ratio <= 3.0,
        "{home}: the pair costs {ratio:.1}× more at one level than another: {rows:?}"
    );
}

#[test]
fn in_process_cost_is_flat_in_leases_held() {
    let mut f = FairShare::with_capacity(cfg(), CAP).unwrap();
    levels(&mut f, "in-process");
}

#[test]
fn region_cost_is_flat_in_leases_held() {
    let region = Region::anonymous().unwrap();
    let mut f = FairShare::shared_with_capacity(&region, &cfg(), CAP).unwrap();
    levels(&mut f, "region");
}
