//! The cluster tier's two costs, against a real `redis-server` (started
//! here on a Unix socket, persistence off; skipped with a message if it is
//! not installed):
//!
//! 1. **The local pair with an agent running.** Uncontended acquire +
//!    release on a shared scheduler whose agent renews every 100 ms, against
//!    the same pair on a plain shared scheduler. Rows are timed in
//!    interleaved rounds (load on this shared machine falls on both alike);
//!    the median round is reported. The agent never touches the acquire
//!    path, so the two should be equal within noise.
//! 2. **Renewals per second one Redis sustains** for N registered hosts,
//!    from one and from two client connections: each renewal is one script
//!    call that reads every live record and water-fills, so its cost grows
//!    with N. With a renew period R, N hosts need N / R renewals per second.
//!
//! `cargo bench --bench cluster` (about a minute).

#[path = "../tests/redis_util/mod.rs"]
mod redis_util;
#[path = "../tests/tools/mod.rs"]
mod tools;

use std::time::{Duration, Instant};

use shmsched::cluster::{Agent, AgentConfig, BudgetClient, RenewReply, RenewRequest, BANDS};
use shmsched::region::Region;
use shmsched::scheduler::Scheduler;
use shmsched::Priority;

const PAIRS: u64 = 2_000_000;
const ROUNDS: usize = 9;

fn pair_ns(s: &Scheduler) -> f64 {
    let t = Instant::now();
    for _ in 0..PAIRS {
        let p = s.acquire(Priority::Normal).expect("acquire");
        std::hint::black_box(&p);
        drop(p);
    }
    t.elapsed().as_nanos() as f64 / PAIRS as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn pair_rows(url: &str) {
    let plain_region = Region::anonymous().expect("region");
    let plain = Scheduler::shared(&plain_region, 64).expect("scheduler");
    let leased_region = Region::anonymous().expect("region");
    let leased = Scheduler::shared(&leased_region, 64).expect("scheduler");
    // Safe capacity 1: the pair never waits for a grant, whatever the
    // agent's last sample of the use was.
    let cfg = AgentConfig::new(url, "bench-pair", 64)
        .renew_every(Duration::from_millis(100))
        .safe(1, 1);
    let agent = Agent::start(&leased, cfg).expect("agent");
    // Learning mode first (one TTL), then a normal lease.
    let t0 = Instant::now();
    while agent.status().mode != shmsched::cluster::LeaseMode::Normal {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no lease: {:?}",
            agent.status()
        );
        drop(leased.acquire(Priority::Normal));
        std::thread::sleep(Duration::from_millis(5));
    }
    let (mut a, mut b) = (vec![], vec![]);
    pair_ns(&plain);
    pair_ns(&leased);
    for _ in 0..ROUNDS {
        a.push(pair_ns(&plain));
        b.push(pair_ns(&leased));
    }
    let renewals = agent.status().lease.renewals;
    let (pa, pb) = (median(a), median(b));
    println!("acquire + release, one thread, median of {ROUNDS} interleaved rounds of {PAIRS}:");
    println!("  plain shared scheduler          {pa:6.1} ns/pair");
    println!(
        "  with an agent renewing (100 ms) {pb:6.1} ns/pair  ({:.2}x; {renewals} renewals during the run)",
        pb / pa
    );
    drop(agent);
}

fn renew_rows(url: &str) {
    println!("renewals per second, one redis-server, N live hosts (each call water-fills all N):");
    println!(
        "  {:>6} {:>16} {:>16}",
        "hosts", "1 connection", "2 connections"
    );
    for n in [1usize, 10, 100, 1000] {
        let budget = format!("bench-renew-{n}");
        let mut c = BudgetClient::new(url, &budget, Duration::from_secs(5)).expect("client");
        let mut wants = [0; BANDS];
        wants[3] = 5;
        let mut hosts: Vec<(String, u64)> = vec![];
        for i in 0..n {
            let req = RenewRequest {
                host: format!("host-{i}"),
                token: 0,
                capacity: 1000,
                reserve: 0,
                weight: 1.0,
                has: 0,
                safe: 0,
                ttl_ms: 600_000,
                wants,
                leave: false,
            };
            match c.renew(&req, Duration::from_secs(5)).expect("register") {
                RenewReply::Granted { token, .. } => hosts.push((req.host, token)),
                RenewReply::Stale { .. } => unreachable!("a registration is never stale"),
            }
        }
        let run = |threads: usize| -> f64 {
            let dur = Duration::from_millis(1500);
            let total: u64 = std::thread::scope(|s| {
                let hs: Vec<_> = (0..threads)
                    .map(|t| {
                        let hosts = &hosts;
                        let budget = &budget;
                        s.spawn(move || {
                            let mut c = BudgetClient::new(url, budget, Duration::from_secs(5))
                                .expect("client");
                            let t0 = Instant::now();
                            let mut k = 0u64;
                            let mut i = t;
                            while t0.elapsed() < dur {
                                let (h, tok) = &hosts[i % hosts.len()];
                                let req = RenewRequest {
                                    host: h.clone(),
                                    token: *tok,
                                    capacity: 1000,
                                    reserve: 0,
                                    weight: 1.0,
                                    has: 0,
                                    safe: 0,
                                    ttl_ms: 600_000,
                                    wants,
                                    leave: false,
                                };
                                c.renew(&req, Duration::from_secs(5)).expect("renew");
                                k += 1;
                                i += threads;
                            }
                            k
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().expect("thread")).sum()
            });
            total as f64 / dur.as_secs_f64()
        };
        let one = run(1);
        let two = run(2);
        println!("  {n:>6} {one:>14.0}/s {two:>14.0}/s");
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing
    // useful: run only when benchmarking.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let Some(srv) = redis_util::RedisServer::start("bench") else {
        println!("cluster bench skipped: redis-server is not installed");
        return;
    };
    let url = srv.url();
    pair_rows(&url);
    renew_rows(&url);
}
