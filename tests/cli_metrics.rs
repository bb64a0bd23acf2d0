//! Prometheus metrics: `shmsched serve` scraped over HTTP by a real client
//! (ureq) while regions are under load, every answer parsed by a real
//! Prometheus text parser (prometheus-parse); counters never go down
//! between scrapes, and at rest the gauges equal `stat --json`. The Grafana
//! dashboard is checked against the names the exporter really emits.

mod procs;
mod tools;

use tools::BoundedOutput;

use std::collections::{BTreeSet, HashMap};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use procs::{role, say, serve, spawn, unique_name, until, wait_parent, Gone};
use prometheus_parse::{Sample, Scrape, Value as PValue};
use serde_json::Value;
use shmsched::fair::{FairConfig, FairShare, FairnessUnit};
use shmsched::limiter::Limiter;
use shmsched::region::Region;
use shmsched::scheduler::Scheduler;
use shmsched::Priority;

const BIN: &str = env!("CARGO_BIN_EXE_shmsched");

fn get(url: &str) -> (String, String) {
    let mut resp = ureq::get(url).call().unwrap();
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (ct, resp.body_mut().read_to_string().unwrap())
}

fn parse(text: &str) -> Scrape {
    Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("valid exposition text")
}

fn value(s: &Sample) -> f64 {
    match s.value {
        PValue::Counter(v) | PValue::Gauge(v) | PValue::Untyped(v) => v,
        ref other => panic!("unexpected value {other:?}"),
    }
}

/// `metric{sorted labels}` → value.
fn keyed(s: &Scrape) -> HashMap<String, f64> {
    s.samples
        .iter()
        .map(|x| {
            let mut l: Vec<_> = x.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            l.sort();
            (format!("{}{{{}}}", x.metric, l.join(",")), value(x))
        })
        .collect()
}

fn one(s: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    let hits: Vec<&Sample> = s
        .samples
        .iter()
        .filter(|x| x.metric == metric && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .collect();
    assert_eq!(hits.len(), 1, "{metric} {labels:?}: {hits:?}");
    value(hits[0])
}

fn stat_json(name: &str) -> Value {
    let out = Command::new(BIN)
        .args(["stat", name, "--json"])
        .bounded_output();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Child role: hold one slot of the scheduler region in the args, then
/// wait to be killed.
#[test]
fn child_metrics_holder() {
    let Some((r, args)) = role() else { return };
    assert_eq!(r, "hold1");
    let region = Region::open(&args[0]).unwrap();
    let sched = Scheduler::attach(&region).unwrap();
    let _p = sched.acquire(Priority::High).unwrap();
    say("held");
    wait_parent();
}

/// Child role for the token counters: attach the limiter region in the
/// args, run [`token_script`] on "go", report, wait.
#[test]
fn child_metrics_tokens() {
    let Some((r, args)) = role() else { return };
    assert_eq!(r, "tokens");
    let region = Region::open(&args[0]).unwrap();
    let lim = Limiter::attach(&region).unwrap();
    say("ready");
    wait_parent();
    token_script(&lim);
    say("done");
    wait_parent();
}

/// A fixed mix on a limiter of 100,000/s (capacity 100,000): at once, after
/// waiting, async, `try_consume` (counted at normal), a refund, and a
/// consume that times out before it is charged (counted nowhere). Tokens
/// consumed per priority: low 100,000, high 5,700, normal 5,300; refunded:
/// high 1,000.
fn token_script(lim: &Limiter) {
    lim.consume(100_000, Priority::Low).unwrap(); // waits for a full bucket
    assert!(!lim.consume(5_000, Priority::High).unwrap().immediate); // ~50 ms
    for _ in 0..2 {
        lim.consume(2_500, Priority::Normal).unwrap();
    }
    lim.refund(1_000, Priority::High);
    let late = lim.consume_timeout(90_000, Priority::Lowest, Duration::from_millis(1));
    assert!(matches!(late, Err(shmsched::Error::Timeout)), "{late:?}");
    let g = futures::executor::block_on(lim.consume_async(700, Priority::High)).unwrap();
    assert!(!g.forced);
    until("300 tokens refilled", 10, || lim.tokens().unwrap() >= 300);
    assert!(lim.try_consume(300).unwrap());
}

/// Tokens consumed and refunded per priority are exact counters: per
/// handle (in process and in a region) and region-wide after the same
/// script ran in two processes, and `stat`, `stat --json` and
/// `stat --prometheus` show the region's figures.
#[test]
fn limiter_token_counters_are_exact_and_shown() {
    let (low, normal, high) = (
        Priority::Low.index(),
        Priority::Normal.index(),
        Priority::High.index(),
    );
    let check = |q: &[shmsched::limiter::LimiterQueueStats], k: u64| {
        for (t, q) in q.iter().enumerate() {
            let want = match t {
                t if t == low => 100_000,
                t if t == high => 5_700,
                t if t == normal => 5_300,
                _ => 0,
            };
            assert_eq!(q.consumed, k * want, "consumed at index {t}");
            let back = if t == high { 1_000 } else { 0 };
            assert_eq!(q.refunded, k * back, "refunded at index {t}");
        }
    };

    let local = Limiter::new(100_000).unwrap();
    token_script(&local);
    let st = local.stats();
    check(&st.queues, 1);
    assert_eq!((st.consumed, st.refunded), (111_000, 1_000));

    let name = unique_name("metrics-tokens");
    let _g = Gone(name.clone());
    let region = Region::create(&name).unwrap();
    let lim = Limiter::shared(&region, 100_000).unwrap();
    let mut kid = spawn(
        "child_metrics_tokens",
        "tokens",
        std::slice::from_ref(&name),
    );
    kid.expect_line("ready");
    kid.send("go");
    kid.expect_line("done");
    token_script(&lim);
    let st = lim.stats();
    check(&st.queues, 1); // this handle's own
    let sh = st.shared.clone().unwrap();
    let region_wide: Vec<_> = sh
        .consumed
        .iter()
        .zip(&sh.refunded)
        .map(
            |(&consumed, &refunded)| shmsched::limiter::LimiterQueueStats {
                consumed,
                refunded,
                ..Default::default()
            },
        )
        .collect();
    check(&region_wide, 2); // both processes
    kid.send("exit");
    assert!(kid.finish().success());

    let j = stat_json(&name);
    let l = &j["limiter"];
    assert_eq!(l["consumed"], 222_000, "{l}");
    assert_eq!(l["refunded"], 2_000, "{l}");
    for (p, c, r) in [
        (Priority::Low, 200_000, 0),
        (Priority::High, 11_400, 2_000),
        (Priority::Normal, 10_600, 0),
        (Priority::Lowest, 0, 0),
    ] {
        assert_eq!(l["queues"][p.index()]["consumed"], c, "{p}: {l}");
        assert_eq!(l["queues"][p.index()]["refunded"], r, "{p}: {l}");
        assert_eq!(l["shared"]["consumed"][p.index()], c, "{p}: {l}");
    }

    let out = Command::new(BIN).args(["stat", &name]).bounded_output();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("consumed    222000 tokens: high 11400, normal 10600, low 200000"),
        "{text}"
    );
    assert!(
        text.contains("refunded    2000 tokens: high 2000"),
        "{text}"
    );

    let out = Command::new(BIN)
        .args(["stat", &name, "--prometheus"])
        .bounded_output();
    let s = parse(&String::from_utf8_lossy(&out.stdout));
    let m = "shmsched_limiter_consumed_tokens_total";
    assert_eq!(one(&s, m, &[("priority", "low")]), 200_000.0);
    assert_eq!(one(&s, m, &[("priority", "high")]), 11_400.0);
    assert_eq!(one(&s, m, &[("priority", "lowest")]), 0.0);
    let m = "shmsched_limiter_refunded_tokens_total";
    assert_eq!(one(&s, m, &[("priority", "high")]), 2_000.0);
}

/// `served` (tasks granted a slot after waiting, region-wide) in `stat`,
/// `stat --json` and `stat --prometheus`: 0 on a fresh region and after
/// acquires that went at once; exactly 3 after three waited grants; a wait
/// that timed out is not counted.
#[test]
fn scheduler_served_counter_is_exact_and_shown() {
    let name = unique_name("metrics-served");
    let _g = Gone(name.clone());
    let region = Region::create(&name).unwrap();
    let sched = Scheduler::shared(&region, 1).unwrap();
    let shown = |want: u64| {
        let v = stat_json(&name);
        assert_eq!(v["scheduler"]["served"], want, "{v}");
        let out = Command::new(BIN).args(["stat", &name]).bounded_output();
        let text = String::from_utf8_lossy(&out.stdout);
        let noun = if want == 1 { "task" } else { "tasks" };
        let line = format!("served      {want} {noun} after waiting");
        assert!(text.contains(&line), "missing {line:?} in:\n{text}");
        let out = Command::new(BIN)
            .args(["stat", &name, "--prometheus"])
            .bounded_output();
        let s = parse(&String::from_utf8_lossy(&out.stdout));
        assert_eq!(
            one(&s, "shmsched_served_waiters_total", &[("region", &name)]),
            want as f64
        );
    };
    shown(0);

    let held = sched.acquire(Priority::High).unwrap(); // at once: not counted
    let waiters: Vec<_> = [Priority::Low, Priority::Normal, Priority::High]
        .into_iter()
        .map(|p| {
            let s = sched.clone();
            std::thread::spawn(move || drop(s.acquire(p).unwrap()))
        })
        .collect();
    until("three waiters", 20, || {
        sched.stats().shared.unwrap().waiters.iter().sum::<u32>() == 3
    });
    shown(0);
    drop(held); // each waiter in turn gets the slot and frees it
    for t in waiters {
        t.join().unwrap();
    }
    let late = {
        let _held = sched.acquire(Priority::Normal).unwrap();
        sched.acquire_timeout(Priority::Normal, Duration::from_millis(1))
    };
    assert!(matches!(late, Err(shmsched::Error::Timeout)), "{late:?}");
    assert_eq!(sched.stats().shared.unwrap().served, 3);
    shown(3);
}

#[test]
fn serve_under_load_counters_rise_and_gauges_match_stat() {
    let sname = unique_name("metrics-sched");
    let lname = unique_name("metrics-lim");
    let (_gs, _gl) = (Gone(sname.clone()), Gone(lname.clone()));
    let sregion = Region::create(&sname).unwrap();
    let sched = Scheduler::shared(&sregion, 2).unwrap();
    let lregion = Region::create(&lname).unwrap();
    let lim = Limiter::shared(&lregion, 200_000).unwrap();

    // A process dies holding a slot: a waiter below reclaims it.
    let mut kid = spawn(
        "child_metrics_holder",
        "hold1",
        std::slice::from_ref(&sname),
    );
    kid.expect_line("held");
    kid.kill();

    // Load: threads take and give slots and tokens at mixed priorities.
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for (i, p) in [
        Priority::Low,
        Priority::Normal,
        Priority::High,
        Priority::Lowest,
    ]
    .into_iter()
    .enumerate()
    {
        let (s, l, stop) = (sched.clone(), lim.clone(), stop.clone());
        load.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let permit = s.acquire_timeout(p, Duration::from_secs(10)).unwrap();
                std::thread::sleep(Duration::from_micros(200 * (i as u64 + 1)));
                drop(permit);
                l.consume(20_000, p).unwrap();
            }
        }));
    }
    let served = serve(&[&sname, &lname]);
    let url = served.1.clone();

    let mut last: Option<HashMap<String, f64>> = None;
    let mut scrapes = 0;
    let start = Instant::now();
    // At least 5 scrapes, and until the stall clock has visibly moved.
    while scrapes < 5 || start.elapsed() < Duration::from_millis(300) {
        let (ct, text) = get(&url);
        assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
        let s = parse(&text);
        assert!(s.samples.iter().all(|x| x.metric.starts_with("shmsched_")));
        for r in [&sname, &lname] {
            assert_eq!(one(&s, "shmsched_region_up", &[("region", r)]), 1.0);
        }
        let now = keyed(&s);
        if let Some(prev) = &last {
            for (k, v) in prev.iter().filter(|(k, _)| k.contains("_total{")) {
                let n = now.get(k).unwrap_or_else(|| panic!("counter {k} vanished"));
                assert!(n >= v, "counter {k} went down: {v} -> {n}");
            }
        }
        last = Some(now);
        scrapes += 1;
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "scrapes too slow"
        );
    }
    let stall = last.as_ref().unwrap()[&format!("shmsched_stall_seconds_total{{region={sname}}}")];
    assert!(stall > 0.0, "the load made tasks wait");

    // At rest, in a fixed state: 2 slots held here, one High waiter.
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.join().unwrap();
    }
    // The dead child's slot came back exactly once (to a waiter of the load,
    // or to this reap).
    sched.reap().unwrap();
    assert_eq!(sched.stats().shared.unwrap().reclaimed, 1);
    let held: Vec<_> = (0..2)
        .map(|_| sched.acquire(Priority::Normal).unwrap())
        .collect();
    let waiter = {
        let s = sched.clone();
        std::thread::spawn(move || drop(s.acquire_timeout(Priority::High, Duration::from_secs(30))))
    };
    until("one waiter", 20, || {
        sched.stats().shared.unwrap().waiters.iter().sum::<u32>() == 1
    });
    // The bucket refills to full (200 000 tokens at 200 000/s) and stays.
    until("a full bucket", 20, || lim.tokens().unwrap() == 200_000);

    let s = parse(&get(&url).1);
    let v = stat_json(&sname);
    let r = [("region", sname.as_str())];
    assert_eq!(
        one(&s, "shmsched_running", &r),
        v["scheduler"]["running"].as_f64().unwrap()
    );
    assert_eq!(
        one(&s, "shmsched_max", &r),
        v["scheduler"]["max"].as_f64().unwrap()
    );
    assert_eq!(
        one(&s, "shmsched_processes", &r),
        v["scheduler"]["processes_alive"].as_f64().unwrap()
    );
    for p in Priority::ALL {
        assert_eq!(
            one(
                &s,
                "shmsched_waiters",
                &[("region", &sname), ("priority", p.name())]
            ),
            v["scheduler"]["waiters"][p.name()].as_f64().unwrap(),
            "{p:?}"
        );
    }
    assert_eq!(one(&s, "shmsched_running", &r), 2.0);
    assert_eq!(
        one(
            &s,
            "shmsched_waiters",
            &[("region", &sname), ("priority", "high")]
        ),
        1.0
    );
    assert_eq!(
        one(&s, "shmsched_reclaimed_slots_total", &r),
        v["scheduler"]["slots_reclaimed"].as_f64().unwrap()
    );
    assert_eq!(one(&s, "shmsched_reclaimed_slots_total", &r), 1.0);
    let v = stat_json(&lname);
    let r = [("region", lname.as_str())];
    assert_eq!(
        one(&s, "shmsched_limiter_tokens", &r),
        v["limiter"]["tokens"].as_f64().unwrap()
    );
    assert_eq!(
        one(&s, "shmsched_limiter_rate_tokens_per_second", &r),
        v["limiter"]["tokens_per_second"].as_f64().unwrap()
    );
    assert_eq!(
        one(&s, "shmsched_processes", &r),
        v["limiter"]["shared"]["processes"].as_f64().unwrap()
    );
    assert_eq!(
        one(&s, "shmsched_limiter_forced_total", &r),
        v["limiter"]["shared"]["forced"].as_f64().unwrap()
    );

    // A named region that goes away is reported down, not an error.
    drop(held);
    waiter.join().unwrap();
    let (code, _) = {
        let mut resp = ureq::get(&url).call().unwrap();
        (resp.status(), resp.body_mut().read_to_string().unwrap())
    };
    assert_eq!(code, 200);
    let missing = unique_name("metrics-missing");
    let served2 = serve(&[&missing]);
    let s = parse(&get(&served2.1).1);
    assert_eq!(one(&s, "shmsched_region_up", &[("region", &missing)]), 0.0);
    // Other paths are 404.
    let base = served2.1.trim_end_matches("/metrics").to_string();
    match ureq::get(&format!("{base}/nope")).call() {
        Err(ureq::Error::StatusCode(404)) => {}
        other => panic!("expected 404, got {other:?}"),
    }
}

/// The metric names a dashboard expression uses.
fn names_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while let Some(k) = expr[i..].find("shmsched_") {
        let s = i + k;
        let mut e = s;
        while e < b.len() && (b[e].is_ascii_alphanumeric() || b[e] == b'_') {
            e += 1;
        }
        out.push(expr[s..e].to_string());
        i = e;
    }
    out
}

fn collect_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "expr" {
                    out.push(x.as_str().unwrap().to_string());
                } else if let Value::Object(q) = x {
                    if k == "query" {
                        if let Some(Value::String(s)) = q.get("query") {
                            out.push(s.clone());
                        }
                    }
                    collect_exprs(x, out);
                } else {
                    collect_exprs(x, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| collect_exprs(x, out)),
        _ => {}
    }
}

/// The dashboard loads, covers what the issue asks for, and every metric
/// it queries is one `stat --prometheus` emits for a scheduler, a limiter
/// and a fair-share region.
#[test]
fn grafana_dashboard_queries_only_exported_metrics() {
    let (sn, ln, fname) = (
        unique_name("dash-sched"),
        unique_name("dash-lim"),
        unique_name("dash-fair"),
    );
    let _g = (Gone(sn.clone()), Gone(ln.clone()), Gone(fname.clone()));
    let _s = Scheduler::shared(&Region::create(&sn).unwrap(), 3).unwrap();
    let _l = Limiter::shared(&Region::create(&ln).unwrap(), 1000).unwrap();
    let cfg = FairConfig {
        ceiling: 10.0,
        fairness_unit: FairnessUnit::Cost,
        tenants: vec![("a".into(), 1.0), ("b".into(), 3.0)],
        reclaim_horizon_ms: 100,
        idle_after_ms: 1000,
        started_at_ms: 0,
    };
    let _f = FairShare::shared(&Region::create(&fname).unwrap(), &cfg).unwrap();
    let mut exported = BTreeSet::new();
    for n in [&sn, &ln, &fname] {
        let out = Command::new(BIN)
            .args(["stat", n, "--prometheus"])
            .bounded_output();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let s = parse(&String::from_utf8_lossy(&out.stdout));
        exported.extend(s.samples.iter().map(|x| x.metric.clone()));
        if n == &fname {
            assert_eq!(one(&s, "shmsched_fair_guarantee", &[("tenant", "b")]), 7.5);
        }
    }

    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/grafana/shmsched.json");
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut exprs = Vec::new();
    collect_exprs(&dash, &mut exprs);
    let used: BTreeSet<String> = exprs.iter().flat_map(|e| names_in(e)).collect();
    let unknown: Vec<_> = used.difference(&exported).collect();
    assert!(
        unknown.is_empty(),
        "dashboard queries metrics nobody exports: {unknown:?}"
    );
    for want in [
        "shmsched_running",
        "shmsched_max",
        "shmsched_waiters",
        "shmsched_stall_seconds_total",
        "shmsched_reclaimed_slots_total",
        "shmsched_limiter_tokens",
        "shmsched_limiter_consumed_tokens_total",
        "shmsched_limiter_refunded_tokens_total",
        "shmsched_fair_held",
        "shmsched_fair_guarantee",
    ] {
        assert!(used.contains(want), "the dashboard does not show {want}");
    }
    let titles: Vec<String> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["title"].as_str().unwrap().to_lowercase())
        .collect();
    for t in [
        "running vs max",
        "waiters per priority",
        "stall seconds per second",
        "reclaimed slots",
        "tokens and debt",
        "held vs guarantee",
    ] {
        assert!(
            titles.iter().any(|x| x.contains(t)),
            "no panel for {t:?}: {titles:?}"
        );
    }
}
