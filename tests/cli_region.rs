//! `shmsched stat`, `watch` and `reap` on regions this test creates.
//!
//! A child that must die holding slots is this test binary re-executed
//! with `SHMSCHED_CLI_ROLE=hold` (spawned, never forked from the
//! multi-threaded harness).

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use shmsched::region::Region;
use shmsched::scheduler::Scheduler;
use shmsched::Priority;

const BIN: &str = env!("CARGO_BIN_EXE_shmsched");

/// A region file removed on drop.
struct Named(String);

impl Named {
    fn new(tag: &str) -> Named {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        Named(format!("test-cli-{tag}-{}-{nanos}", std::process::id()))
    }
}

impl Drop for Named {
    fn drop(&mut self) {
        let _ = Region::remove(&self.0);
    }
}

fn cli(args: &[&str]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("shmsched {args:?} hung");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

fn ok_stdout(args: &[&str]) -> String {
    let out = cli(args);
    assert!(
        out.status.success(),
        "{args:?}: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Child role: attach to the region named in `SHMSCHED_CLI_ARGS`, take the
/// given number of slots, say so, and wait to be killed.
#[test]
fn child_holder() {
    if std::env::var("SHMSCHED_CLI_ROLE").as_deref() != Ok("hold") {
        return;
    }
    let args = std::env::var("SHMSCHED_CLI_ARGS").unwrap();
    let (name, n) = args.split_once(' ').unwrap();
    let region = Region::open(name).unwrap();
    let sched = Scheduler::attach(&region).unwrap();
    let permits: Vec<_> = (0..n.parse::<u32>().unwrap())
        .map(|_| sched.acquire(Priority::High).unwrap())
        .collect();
    println!("held {}", permits.len());
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn stat_shows_a_live_scheduler_and_leaves_no_trace() {
    let name = Named::new("stat");
    let region = Region::create(&name.0).unwrap();
    let sched = Scheduler::shared(&region, 5).unwrap();
    let _a = sched.acquire(Priority::High).unwrap();
    let _b = sched.acquire(Priority::Low).unwrap();

    let human = ok_stdout(&["stat", &name.0]);
    for want in [
        "kind        scheduler",
        "running     2 / 5 max",
        "processes   1 alive",
        "waiting     0",
    ] {
        assert!(human.contains(want), "missing {want:?} in:\n{human}");
    }
    let me = std::process::id().to_string();
    assert!(human.contains(&me), "our pid {me} missing:\n{human}");

    let path = format!("/dev/shm/shmsched.{}", name.0);
    let v: Value = serde_json::from_str(&ok_stdout(&["stat", &path, "--json"])).unwrap();
    assert_eq!(v["region"]["kind"], "scheduler");
    assert_eq!(v["region"]["path"], path.as_str());
    assert_eq!(v["region"]["created_pid"], std::process::id());
    let s = &v["scheduler"];
    assert_eq!(s["max"], 5);
    assert_eq!(s["running"], 2);
    assert_eq!(s["waiting_total"], 0);
    assert_eq!(s["waiters"]["highest"], 0);
    assert_eq!(s["processes_alive"], 1);
    let procs = s["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "{v}");
    assert_eq!(procs[0]["pid"], std::process::id());
    assert_eq!(procs[0]["slots_held"], 2);
    assert_eq!(procs[0]["alive"], true);

    // The inspector left nothing: only this process is registered, nothing
    // was reaped, nothing else is held.
    let left = sched.processes().unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].0.pid as u32, std::process::id());
    let stats = sched.stats().shared.unwrap();
    assert_eq!(stats.reaped_processes, 0);
    assert_eq!(stats.running, 2);

    // watch --count 2 prints two refreshes, then exits.
    let w = ok_stdout(&["watch", &name.0, "--count", "2", "--json"]);
    assert_eq!(w.lines().count(), 2, "{w}");
    for l in w.lines() {
        let v: Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["scheduler"]["running"], 2);
    }
    assert_eq!(sched.processes().unwrap().len(), 1);
}

#[test]
fn reap_returns_the_slots_of_a_killed_process() {
    let name = Named::new("reap");
    let region = Region::create(&name.0).unwrap();
    let sched = Scheduler::shared(&region, 4).unwrap();

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_holder",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env("SHMSCHED_CLI_ROLE", "hold")
        .env("SHMSCHED_CLI_ARGS", format!("{} 3", name.0))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child exited early");
        if line.starts_with("held 3") {
            break;
        }
    }
    assert_eq!(sched.global_running(), 3);
    let v: Value = serde_json::from_str(&ok_stdout(&["stat", &name.0, "--json"])).unwrap();
    let procs = v["scheduler"]["processes"].as_array().unwrap();
    let kid = procs
        .iter()
        .find(|p| p["pid"] == child.id())
        .expect("child listed");
    assert_eq!(kid["slots_held"], 3);

    child.kill().unwrap();
    child.wait().unwrap();
    // Dead but not reaped yet: stat shows it.
    let human = ok_stdout(&["stat", &name.0]);
    assert!(human.contains("DEAD"), "{human}");
    assert!(human.contains("running     3 / 4 max"), "{human}");

    let text = ok_stdout(&["reap", &name.0]);
    assert_eq!(text.trim(), "reaped 1 process, reclaimed 3 slots");
    assert_eq!(sched.global_running(), 0);
    let stats = sched.stats().shared.unwrap();
    assert_eq!((stats.reaped_processes, stats.reclaimed), (1, 3));

    let v: Value = serde_json::from_str(&ok_stdout(&["reap", &name.0, "--json"])).unwrap();
    assert_eq!(v["reaped_processes"], 0);
    assert_eq!(v["slots_reclaimed"], 0);
    // Neither reap nor stat left an entry behind (or was reaped itself).
    assert_eq!(sched.processes().unwrap().len(), 1);
    assert_eq!(sched.stats().shared.unwrap().reaped_processes, 1);
}

#[test]
fn stat_errors_name_the_region() {
    let out = cli(&["stat", "no-such-region-for-cli-test"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-region-for-cli-test"), "{err}");

    // A file that is not a region.
    let path = std::env::temp_dir().join(format!("shmsched-cli-junk-{}", std::process::id()));
    std::fs::write(&path, vec![7u8; 8192]).unwrap();
    let p = path.to_str().unwrap();
    for cmd in ["stat", "reap"] {
        let out = cli(&[cmd, p]);
        assert_eq!(out.status.code(), Some(1), "{cmd}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(p), "{cmd}: {err}");
    }
    // An empty file is a region nobody initialised.
    std::fs::write(&path, b"").unwrap();
    let out = cli(&["stat", p]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not initialised"));
    let _ = std::fs::remove_file(&path);
}

#[test]
fn stat_shows_a_fair_share_ledger() {
    use shmsched::fair::{FairConfig, FairShare, FairnessUnit};
    let name = Named::new("fair");
    let region = Region::create(&name.0).unwrap();
    let now = shmsched::sys::monotonic_ms();
    let cfg = FairConfig {
        ceiling: 100.0,
        fairness_unit: FairnessUnit::Cost,
        tenants: vec![("a".into(), 1.0), ("b".into(), 1.0)],
        reclaim_horizon_ms: 100,
        idle_after_ms: 1000,
        started_at_ms: now,
    };
    let mut fair = FairShare::shared(&region, &cfg).unwrap();
    let lease = fair.acquire_now("b", 30.0, 60_000).unwrap().unwrap();
    let out = ok_stdout(&["stat", &name.0, "--json"]);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["region"]["kind"], "fair-share", "{v}");
    assert_eq!(v["fair"]["config"]["ceiling"], 100.0);
    assert_eq!(v["fair"]["stats"]["tenants"]["b"]["held"], 30.0, "{v}");
    assert_eq!(v["fair"]["stats"]["tenants"]["a"]["guarantee"], 50.0);
    let human = ok_stdout(&["stat", &name.0]);
    assert!(
        human.contains("ceiling     100") && human.contains("reclaim horizon 100 ms"),
        "{human}"
    );
    let reaped = ok_stdout(&["reap", &name.0]);
    assert_eq!(reaped.trim(), "reaped 0 processes, released 0 leases");
    fair.release_now(&lease.id).unwrap();
}

#[test]
fn stat_shows_a_limiter() {
    use shmsched::limiter::Limiter;
    let name = Named::new("lim");
    let region = Region::create(&name.0).unwrap();
    // A burst of two seconds' worth, and a rate changed after creation:
    // stat shows what is in force, not what the region was created with.
    let lim = Limiter::shared_with_capacity(&region, 1_000_000, 2_000_000).unwrap();
    lim.consume(400_000, Priority::Normal).unwrap();
    lim.set_rate(500_000).unwrap();
    let out = ok_stdout(&["stat", &name.0, "--json"]);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["region"]["kind"], "limiter", "{v}");
    assert_eq!(v["limiter"]["tokens_per_second"], 500_000);
    assert_eq!(v["limiter"]["capacity"], 2_000_000);
    let tokens = v["limiter"]["tokens"].as_i64().unwrap();
    assert!((1_600_000..=2_000_000).contains(&tokens), "{tokens}");
    let human = ok_stdout(&["stat", &name.0]);
    assert!(human.contains("of 2000000 (the capacity)"), "{human}");
    assert!(
        human.contains("rate        500000 tokens per second"),
        "{human}"
    );
    let listed: Value = serde_json::from_str(ok_stdout(&["ls", "--json"]).trim()).unwrap();
    let mine = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name.0.as_str())
        .unwrap_or_else(|| panic!("ls does not list {}: {listed}", name.0));
    assert_eq!(
        mine["usage"], "500000/s",
        "ls shows the rate in force: {mine}"
    );
    let reaped = ok_stdout(&["reap", &name.0]);
    assert!(reaped.starts_with("reaped 0 processes"), "{reaped}");
}
