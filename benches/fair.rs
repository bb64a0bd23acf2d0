//! FairShare: one uncontended acquire + release pair, in-process and in a
//! region (`Region::anonymous()`), with an explicit `now` and with the
//! `*_now` calls that read `CLOCK_MONOTONIC` under the ledger's lock; and
//! the same pair while 1, 1,024 and 4,096 other leases are held (the cost
//! must not depend on it: issue 20), and a `stats_into` of a fixed shape.
//!
//! Criterion prints the time per pair (throughput 1 element = 1 pair).
//! After the groups, each row is also timed in batches of [`BATCH`] pairs
//! and the median batch time per pair is printed as `p50`, with the ratio
//! of each region row to its in-process row and of each held level to the
//! first. Compare ratios, not absolute times: the machines are shared and
//! noisy.
//!
//! Instruction counts, which do not depend on the machine's load: with
//! `SHMSCHED_FAIR_PAIRS=N ROW=…` set, the binary runs N pairs of one row
//! and exits (no criterion), so that under `valgrind --tool=callgrind` the
//! difference between two N divided by their difference is the
//! instructions per pair:
//!
//! ```sh
//! cargo bench --bench fair --no-run   # prints the binary's path
//! for n in 10000 20000; do SHMSCHED_FAIR_PAIRS=$n SHMSCHED_FAIR_ROW=region \
//!   valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$n target/release/deps/fair-…; done
//! ```
//!
//! Rows: `in_process`, `region`, `in_process_held` and `region_held`
//! (4,096 leases held), `in_process_stats`, `region_stats`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, Throughput};
use shmsched::fair::{FairConfig, FairLedger, FairShare, FairnessUnit, SharedFairShare, Stats};
use shmsched::region::Region;

/// Pairs per timed batch in the p50 pass.
const BATCH: u32 = 64;
/// Batches in the p50 pass.
const BATCHES: usize = 3000;

fn cfg() -> FairConfig {
    FairConfig {
        ceiling: 100.0,
        fairness_unit: FairnessUnit::Cost,
        tenants: vec![("a".into(), 1.0), ("b".into(), 1.0)],
        reclaim_horizon_ms: 100,
        idle_after_ms: 1000,
        started_at_ms: 0,
    }
}

/// Lease slots of the held-level rows (room for 4,096 held and the pair).
const HELD_CAP: usize = 4096 + 16;

/// Leases held beside the pair, per row.
const HELD: [usize; 3] = [1, 1024, 4096];

/// One acquire + release pair through the trait (either home).
fn pair<L: FairLedger>(f: &mut L, now: u64) {
    let l = f.acquire("a", 1.0, 100, now).unwrap().unwrap();
    f.release(black_box(&l.id), now).unwrap();
}

/// Makes tenant b hold `n` long leases in `f`.
fn hold<L: FairLedger>(f: &mut L, n: usize) {
    for _ in 0..n {
        f.acquire("b", 1.0, 1 << 40, 5).unwrap().unwrap();
    }
}

fn held_cfg() -> FairConfig {
    FairConfig {
        ceiling: 1e9,
        ..cfg()
    }
}

fn pair_local(f: &mut FairShare, now: u64) {
    let l = f.acquire("a", 1.0, 100, now).unwrap().unwrap();
    f.release(black_box(&l.id), now).unwrap();
}

fn pair_region(f: &mut SharedFairShare, now: u64) {
    let l = f.acquire("a", 1.0, 100, now).unwrap().unwrap();
    f.release(black_box(&l.id), now).unwrap();
}

fn pair_region_now(f: &mut SharedFairShare) {
    let l = f.acquire_now("a", 1.0, 100).unwrap().unwrap();
    f.release_now(black_box(&l.id)).unwrap();
}

fn pair_local_now(f: &mut FairShare) {
    let l = f.acquire_now("a", 1.0, 100).unwrap().unwrap();
    f.release_now(black_box(&l.id)).unwrap();
}

/// Median time per pair over [`BATCHES`] batches of [`BATCH`] pairs.
fn p50(mut pair: impl FnMut()) -> Duration {
    for _ in 0..10_000 {
        pair();
    }
    let mut t: Vec<Duration> = (0..BATCHES)
        .map(|_| {
            let s = Instant::now();
            for _ in 0..BATCH {
                pair();
            }
            s.elapsed() / BATCH
        })
        .collect();
    t.sort();
    t[t.len() / 2]
}

fn fair(c: &mut Criterion) {
    let mut local = FairShare::new(cfg()).expect("in-process ledger");
    let region = Region::anonymous().expect("memfd region");
    let mut shared = FairShare::shared(&region, &cfg()).expect("region ledger");
    let mut local_now = FairShare::new(cfg()).expect("in-process ledger");
    let region2 = Region::anonymous().expect("memfd region");
    let mut shared_now = FairShare::shared(&region2, &cfg()).expect("region ledger");
    let mut stats = Stats::default();
    local.stats_into(5, &mut stats).unwrap();

    let mut g = c.benchmark_group("fair_acquire_release");
    g.throughput(Throughput::Elements(1));
    g.bench_function("in_process", |b| b.iter(|| pair_local(&mut local, 5)));
    g.bench_function("region", |b| b.iter(|| pair_region(&mut shared, 5)));
    g.bench_function("in_process_now", |b| {
        b.iter(|| pair_local_now(&mut local_now))
    });
    g.bench_function("region_now", |b| {
        b.iter(|| pair_region_now(&mut shared_now))
    });
    g.bench_function("in_process_stats_into", |b| {
        b.iter(|| local.stats_into(5, black_box(&mut stats)).unwrap())
    });
    g.bench_function("region_stats_into", |b| {
        b.iter(|| shared.stats_into(5, black_box(&mut stats)).unwrap())
    });
    g.finish();

    // The same pair beside 1, 1,024 and 4,096 held leases, each level in a
    // ledger of its own (built up front, so that every row runs on a warm,
    // settled ledger).
    let mut held_local: Vec<FairShare> = HELD
        .iter()
        .map(|&n| {
            let mut f = FairShare::with_capacity(held_cfg(), HELD_CAP).expect("in-process ledger");
            hold(&mut f, n);
            f
        })
        .collect();
    let held_regions: Vec<Region> = HELD
        .iter()
        .map(|_| Region::anonymous().expect("memfd region"))
        .collect();
    let mut held_shared: Vec<SharedFairShare> = HELD
        .iter()
        .zip(&held_regions)
        .map(|(&n, r)| {
            let mut f =
                FairShare::shared_with_capacity(r, &held_cfg(), HELD_CAP).expect("region ledger");
            hold(&mut f, n);
            f
        })
        .collect();
    let mut g = c.benchmark_group("fair_held");
    g.throughput(Throughput::Elements(1));
    for (i, n) in HELD.iter().enumerate() {
        g.bench_function(format!("in_process/{n}"), |b| {
            b.iter(|| pair(&mut held_local[i], 5))
        });
        g.bench_function(format!("region/{n}"), |b| {
            b.iter(|| pair(&mut held_shared[i], 5))
        });
    }
    g.finish();

    let mut rows = vec![
        ("in_process".to_string(), p50(|| pair_local(&mut local, 5))),
        ("region".to_string(), p50(|| pair_region(&mut shared, 5))),
        (
            "in_process_now".to_string(),
            p50(|| pair_local_now(&mut local_now)),
        ),
        (
            "region_now".to_string(),
            p50(|| pair_region_now(&mut shared_now)),
        ),
    ];
    for (i, n) in HELD.iter().enumerate() {
        rows.push((
            format!("in_process/{n} held"),
            p50(|| pair(&mut held_local[i], 5)),
        ));
        rows.push((
            format!("region/{n} held"),
            p50(|| pair(&mut held_shared[i], 5)),
        ));
    }
    eprintln!("\nfair acquire+release, p50 per pair ({BATCHES} batches of {BATCH}):");
    for (name, d) in &rows {
        eprintln!("  {name:<22} {:>8.0} ns", d.as_nanos() as f64);
    }
    let ratio = |a: usize, b: usize| rows[a].1.as_secs_f64() / rows[b].1.as_secs_f64();
    eprintln!("  region / in_process         {:.2}", ratio(1, 0));
    eprintln!("  region_now / in_process_now {:.2}", ratio(3, 2));
    eprintln!(
        "  4,096 held / 1 held: in-process {:.2}, region {:.2}",
        ratio(8, 4),
        ratio(9, 5)
    );
}

/// The `SHMSCHED_FAIR_PAIRS` mode (see the module docs): runs the pairs of
/// one row and returns true, or returns false when the variable is unset.
fn instruction_count_mode() -> bool {
    let Some(n) = std::env::var("SHMSCHED_FAIR_PAIRS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return false;
    };
    let row = std::env::var("SHMSCHED_FAIR_ROW").unwrap_or_else(|_| "in_process".into());
    let region = Region::anonymous().expect("memfd region");
    let mut local = FairShare::with_capacity(held_cfg(), HELD_CAP).expect("in-process ledger");
    let mut shared =
        FairShare::shared_with_capacity(&region, &held_cfg(), HELD_CAP).expect("region ledger");
    let mut stats = Stats::default();
    if row.ends_with("_held") {
        hold(&mut local, 4096);
        hold(&mut shared, 4096);
    }
    // One warm-up pair (first touches, the stats' shape).
    pair(&mut local, 5);
    pair(&mut shared, 5);
    local.stats_into(5, &mut stats).unwrap();
    shared.stats_into(5, &mut stats).unwrap();
    for _ in 0..n {
        match row.as_str() {
            "in_process" | "in_process_held" => pair(&mut local, 5),
            "region" | "region_held" => pair(&mut shared, 5),
            "in_process_stats" => local.stats_into(5, black_box(&mut stats)).unwrap(),
            "region_stats" => shared.stats_into(5, black_box(&mut stats)).unwrap(),
            other => panic!("unknown row {other}"),
        }
    }
    true
}

fn main() {
    if instruction_count_mode() {
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    targets = fair
}
