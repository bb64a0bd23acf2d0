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
//! 2. **Renewals per second one Redis sustains** for N = 10 … 10,000
//!    hosts' records in Redis, from four client processes, every renewal
//!    with a new want: the lease script of revision 2 (O(log N) per call)
//!    beside revision 1 (`benches/lease_v1.lua`: every call reads and
//!    water-fills all N records) in the same run. With a renew period R, N
//!    hosts need N / R renewals per second. The last column is the client
//!    processes' CPU time per v2 renewal: the client side is not the
//!    bottleneck while it is well below Redis's time per call.
//!
//! `cargo bench --bench cluster` (about a minute); `cargo bench --bench
//! cluster -- renew` for the renewal rows only.

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

/// The lease script of revision 1 (every call reads and water-fills every
/// record), kept as the baseline.
const V1: &str = include_str!("lease_v1.lua");

const POOL: u64 = 1000;
const CLIENTS: usize = 4;
const ROW: Duration = Duration::from_millis(2000);

/// Host `i`'s want on its `k`th renewal: 1..=10, different every time (so
/// every renewal moves the host in its band, the costly path), Σ wants well
/// above the pool from 200 hosts on (the band is shared at a water level).
fn want(i: usize, k: u64) -> u64 {
    1 + (i as u64 + k) % 10
}

fn wants_of(w: u64) -> [u64; BANDS] {
    let mut a = [0; BANDS];
    a[3] = w;
    a
}

fn request(host: String, token: u64, has: u64, w: u64) -> RenewRequest {
    RenewRequest {
        host,
        token,
        capacity: POOL,
        reserve: 0,
        weight: 1.0,
        has,
        safe: 0,
        ttl_ms: 600_000,
        wants: wants_of(w),
        leave: false,
    }
}

/// Revision 2: registers `n` hosts through the script itself.
fn setup_v2(url: &str, budget: &str, n: usize) {
    let mut c = BudgetClient::new(url, budget, Duration::from_secs(30)).expect("client");
    for i in 0..n {
        let r = c
            .renew(
                &request(format!("h{i}"), 0, 0, want(i, 0)),
                Duration::from_secs(30),
            )
            .expect("register");
        assert!(matches!(r, RenewReply::Granted { .. }), "{r:?}");
    }
}

/// Revision 1: writes `n` records in its format (registering them through
/// the O(n) script would take minutes at 10,000 hosts).
fn setup_v1(url: &str, budget: &str, n: usize) {
    let cl = redis::Client::open(url).expect("url");
    let mut con = cl.get_connection().expect("connect");
    let t: (u64, u64) = redis::cmd("TIME").query(&mut con).expect("TIME");
    let now = t.0 * 1000 + t.1 / 1000;
    let keys = BudgetClient::keys(budget);
    redis::cmd("HSET")
        .arg(&keys[0])
        .arg(&["epoch", &(now - 700_000).to_string(), "learn_until", "0"])
        .arg(&[
            "capacity",
            &POOL.to_string(),
            "reserve",
            "0",
            "token",
            "1000000000",
        ])
        .query::<()>(&mut con)
        .expect("meta");
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut p = redis::pipe();
        for &i in chunk {
            let ws: Vec<String> = wants_of(want(i, 0)).iter().map(u64::to_string).collect();
            let rec = format!("{} 0 0 0 {} 1 {}", i + 1, now + 600_000, ws.join(","));
            p.cmd("HSET")
                .arg(&keys[1])
                .arg(format!("h{i}"))
                .arg(rec)
                .ignore();
        }
        p.query::<()>(&mut con).expect("records");
    }
}

/// This process's CPU time (user + system), µs.
fn cpu_us() -> u64 {
    // SAFETY: getrusage writes the struct it is given; zeroed is a valid
    // value of it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always a valid target.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0;
    }
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(u.ru_utime) + us(u.ru_stime)
}

/// Tells the parent this client is set up ("ready") and waits for its go
/// (a line on stdin), so that no client's setup (a peek at 10,000 hosts is
/// about 0.1 s of Redis time) falls in another's timed row or in the
/// row's Redis statistics.
fn ready_then_go() {
    use std::io::{BufRead, Write};
    println!("ready");
    std::io::stdout().flush().expect("stdout");
    let mut go = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut go)
        .expect("the go line");
}

/// A client process: renews hosts first, first + step, … of `n` for
/// `ROW`, printing how many renewals it made and the CPU time they took.
fn renew_child(spec: &str) {
    let f: Vec<&str> = spec.split(' ').collect();
    let (rev, url, budget) = (f[0], f[1], f[2]);
    let first: usize = f[3].parse().expect("first");
    let n: usize = f[4].parse().expect("n");
    let mine: Vec<usize> = (first..n).step_by(CLIENTS).collect();
    let mut k = 0u64;
    let mut has = vec![0u64; mine.len()];
    let cpu0;
    if rev == "v2" {
        let mut c = BudgetClient::new(url, budget, Duration::from_secs(30)).expect("client");
        let st = c.peek().expect("peek");
        let tok: std::collections::HashMap<&str, u64> = st
            .hosts
            .iter()
            .map(|h| (h.host.as_str(), h.token))
            .collect();
        ready_then_go();
        let t0 = Instant::now();
        cpu0 = cpu_us();
        while t0.elapsed() < ROW {
            let j = (k as usize) % mine.len();
            let i = mine[j];
            let h = format!("h{i}");
            let r = request(h.clone(), tok[h.as_str()], has[j], want(i, k + 1));
            match c.renew(&r, Duration::from_secs(30)).expect("renew") {
                RenewReply::Granted { grant, .. } => has[j] = grant,
                RenewReply::Stale { .. } => panic!("stale token for {h}"),
            }
            k += 1;
        }
    } else {
        let cl = redis::Client::open(url).expect("url");
        let mut con = cl.get_connection().expect("connect");
        let script = redis::Script::new(V1);
        let keys = BudgetClient::keys(budget);
        ready_then_go();
        let t0 = Instant::now();
        cpu0 = cpu_us();
        while t0.elapsed() < ROW {
            let j = (k as usize) % mine.len();
            let i = mine[j];
            let ws: Vec<String> = wants_of(want(i, k + 1))
                .iter()
                .map(u64::to_string)
                .collect();
            let v: Vec<redis::Value> = script
                .key(&keys[0])
                .key(&keys[1])
                .arg("renew")
                .arg(format!("h{i}"))
                .arg(i + 1)
                .arg(POOL)
                .arg(0)
                .arg("1.0")
                .arg(has[j])
                .arg(0)
                .arg(600_000)
                .arg(ws.join(","))
                .invoke(&mut con)
                .expect("v1 renew");
            if let Some(redis::Value::Int(g)) = v.get(1) {
                has[j] = *g as u64;
            }
            k += 1;
        }
    }
    println!("renewals {k}");
    println!("cpu_us {}", cpu_us().saturating_sub(cpu0));
}

/// Redis's own time per script call since the last reset (INFO
/// commandstats), µs.
fn server_us(url: &str) -> f64 {
    let cl = redis::Client::open(url).expect("url");
    let mut con = cl.get_connection().expect("connect");
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut con)
        .expect("INFO");
    info.lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("usec_per_call=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

fn reset_stats(url: &str) {
    let cl = redis::Client::open(url).expect("url");
    let mut con = cl.get_connection().expect("connect");
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(&mut con)
        .expect("RESETSTAT");
}

/// Renewals per second from `CLIENTS` client processes against one budget,
/// Redis's time per call and the client processes' CPU time per renewal
/// (µs both: a client side near 1 s/s per core would be the bottleneck).
fn rate(rev: &str, url: &str, budget: &str, n: usize) -> (f64, f64, f64) {
    use std::io::{BufRead, Read, Write};
    let exe = std::env::current_exe().expect("exe");
    let mut kids: Vec<_> = (0..CLIENTS)
        .map(|c| {
            std::process::Command::new(&exe)
                .env(
                    "SHMSCHED_RENEW_CHILD",
                    format!("{rev} {url} {budget} {c} {n}"),
                )
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn a client process")
        })
        .collect();
    // Every client set up, then the statistics reset, then all go at once.
    let mut outs: Vec<_> = kids
        .iter_mut()
        .map(|k| {
            let mut out = std::io::BufReader::new(k.stdout.take().expect("piped"));
            let mut line = String::new();
            out.read_line(&mut line).expect("a client's ready line");
            assert_eq!(line.trim(), "ready", "a client process failed to set up");
            out
        })
        .collect();
    reset_stats(url);
    for k in kids.iter_mut() {
        let mut stdin = k.stdin.take().expect("piped");
        stdin.write_all(b"go\n").expect("a client's go line");
    }
    let (mut total, mut cpu) = (0u64, 0u64);
    for (k, out) in kids.iter_mut().zip(outs.iter_mut()) {
        let mut s = String::new();
        out.read_to_string(&mut s).expect("a client's output");
        assert!(
            k.wait().expect("client process").success(),
            "a client process failed"
        );
        total += s
            .lines()
            .find_map(|l| l.strip_prefix("renewals "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .expect("a count");
        cpu += s
            .lines()
            .find_map(|l| l.strip_prefix("cpu_us "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .expect("a CPU time");
    }
    (
        total as f64 / ROW.as_secs_f64(),
        server_us(url),
        cpu as f64 / total.max(1) as f64,
    )
}

fn renew_rows(url: &str) {
    println!(
        "renewals per second, one redis-server, N hosts' records in Redis, {CLIENTS} client \
         processes, every renewal a new want (pool {POOL}):"
    );
    println!(
        "  (µs/call: Redis's own time per script call, INFO commandstats; client µs: the \
         client processes' CPU per v2 renewal)"
    );
    println!(
        "  {:>6} {:>14} {:>11} {:>14} {:>11} {:>9} {:>10}",
        "hosts",
        "v1 renewals/s",
        "v1 µs/call",
        "v2 renewals/s",
        "v2 µs/call",
        "v2 vs 10",
        "client µs"
    );
    let mut base = None;
    for n in [10usize, 100, 1000, 10_000] {
        let (b1, b2) = (format!("bench-v1-{n}"), format!("bench-v2-{n}"));
        setup_v1(url, &b1, n);
        setup_v2(url, &b2, n);
        let (v1, us1, _) = rate("v1", url, &b1, n);
        let (v2, us2, cpu2) = rate("v2", url, &b2, n);
        let b = *base.get_or_insert(us2);
        println!(
            "  {n:>6} {v1:>14.0} {us1:>11.1} {v2:>14.0} {us2:>11.1} {:>8.2}x {cpu2:>10.1}",
            us2 / b
        );
    }
}

fn main() {
    if let Ok(spec) = std::env::var("SHMSCHED_RENEW_CHILD") {
        renew_child(&spec);
        return;
    }
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing
    // useful: run only when benchmarking. A filter `renew` or `pair` runs
    // only those rows.
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--bench") {
        return;
    }
    let only = |row: &str| {
        let filters: Vec<&String> = args
            .iter()
            .skip(1)
            .filter(|a| !a.starts_with("--"))
            .collect();
        filters.is_empty() || filters.iter().any(|f| row.contains(f.as_str()))
    };
    let Some(srv) = redis_util::RedisServer::start("bench") else {
        println!("cluster bench skipped: redis-server is not installed");
        return;
    };
    let url = srv.url();
    if only("pair") {
        pair_rows(&url);
    }
    if only("renew") {
        renew_rows(&url);
    }
}
