//! FairShare: one uncontended acquire + release pair, in-process and in a
//! region (`Region::anonymous()`), with an explicit `now` and with the
//! `*_now` calls that read `CLOCK_MONOTONIC` under the ledger's lock.
//!
//! Criterion prints the time per pair (throughput 1 element = 1 pair).
//! After the group, each row is also timed in batches of [`BATCH`] pairs and
//! the median batch time per pair is printed as `p50`, with the ratio of
//! each region row to its in-process row. Compare ratios, not absolute
//! times: the machines are shared and noisy.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use shmsched::fair::{FairConfig, FairShare, FairnessUnit, SharedFairShare};
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
    g.finish();

    let rows = [
        ("in_process", p50(|| pair_local(&mut local, 5))),
        ("region", p50(|| pair_region(&mut shared, 5))),
        ("in_process_now", p50(|| pair_local_now(&mut local_now))),
        ("region_now", p50(|| pair_region_now(&mut shared_now))),
    ];
    eprintln!("\nfair acquire+release, p50 per pair ({BATCHES} batches of {BATCH}):");
    for (name, d) in &rows {
        eprintln!("  {name:<16} {:>8.0} ns", d.as_nanos() as f64);
    }
    let ratio = |a: usize, b: usize| rows[a].1.as_secs_f64() / rows[b].1.as_secs_f64();
    eprintln!("  region / in_process         {:.2}", ratio(1, 0));
    eprintln!("  region_now / in_process_now {:.2}", ratio(3, 2));
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    targets = fair
}
criterion_main!(benches);
