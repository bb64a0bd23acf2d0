//! Inspecting a FairShare region is read-only (issue 20 point 8, issue 16
//! point 5): `stat`, `stat --json`, `stat --prometheus`, `watch --count 1`
//! and a `serve` scrape leave the region file byte-identical (header,
//! process table, object), work on a full process table without reaping,
//! and answer at once beside an application stopped (SIGSTOP) inside a
//! ledger call, holding the ledger's lock. One `serve` scrape answers for
//! the other regions at once. The applications are real processes (this
//! test binary re-executed with a role, `tests/procs`); every stopped child
//! is continued and killed by a guard.

mod common;
mod procs;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use procs::{role, say, serve, spawn, unique_name, wait_parent, Gone, Kid};
use serde_json::Value;
use shmsched::fair::shared::CrashPoint;
use shmsched::fair::FairShare;
use shmsched::region::{Region, RegionOptions};

/// How long an inspecting command may take beside a stopped application.
const AT_ONCE: Duration = Duration::from_secs(1);

fn path_of(name: &str) -> PathBuf {
    shmsched::region::resolve_path(name).unwrap()
}

fn bytes(name: &str) -> Vec<u8> {
    std::fs::read(path_of(name)).unwrap()
}

/// Runs the CLI with `args`, killing it after 20 s; returns (success,
/// stdout, stderr, elapsed).
fn cli(args: &[&str]) -> (bool, String, String, Duration) {
    let (out, took, _) = procs::cli_within(args, Duration::from_secs(20));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        took,
    )
}

/// One scrape: (body, elapsed).
fn scrape(url: &str) -> (String, Duration) {
    let start = Instant::now();
    let mut resp = ureq::get(url).call().unwrap();
    let body = resp.body_mut().read_to_string().unwrap();
    (body, start.elapsed())
}

/// The value of the sample `metric{region="…",…}` whose line contains all
/// of `needles`.
fn sample(body: &str, metric: &str, needles: &[&str]) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(metric) && l[metric.len()..].starts_with('{'))
        .find(|l| needles.iter().all(|n| l.contains(n)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A child that stopped itself (SIGSTOP) inside a ledger call: continued
/// and killed on drop, whatever the test did.
struct Stopped(Kid);

impl Stopped {
    fn pid(&self) -> libc::pid_t {
        self.0.child.id() as libc::pid_t
    }

    /// Waits (at most 20 s) until the child is stopped.
    fn wait_stopped(&self) {
        let start = Instant::now();
        loop {
            let mut st = 0;
            // SAFETY: plain waitpid on our own child; WUNTRACED reports a
            // stop without reaping the child.
            let r = unsafe { libc::waitpid(self.pid(), &mut st, libc::WUNTRACED | libc::WNOHANG) };
            if r == self.pid() && libc::WIFSTOPPED(st) {
                return;
            }
            assert!(r == 0, "child ended instead of stopping: {st:#x}");
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "child never stopped"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn cont(&self) {
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(self.pid(), libc::SIGCONT) };
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        self.cont();
        let _ = self.0.child.kill();
        let _ = self.0.child.wait();
    }
}

fn stop_self() {
    // SAFETY: raise(2) on this process; SIGSTOP cannot be caught.
    unsafe { libc::raise(libc::SIGSTOP) };
}

/// Child roles (does nothing in a normal run).
#[test]
fn child_fair_inspect_role() {
    let Some((r, args)) = role() else { return };
    let region = Region::open(&args[0]).unwrap();
    let mut f = FairShare::attach(&region).unwrap();
    match r.as_str() {
        // Takes a lease of 20 for b at 250 and exits holding it (its entry
        // stays in the table, dead, until reaped).
        "die_holding" => {
            f.acquire("b", 20.0, 60_000, 250).unwrap().unwrap();
            say("held");
        }
        // Stops itself inside the ledger's lock during an acquire of 20 for
        // a at 500 (right after locking, or in the middle of the update);
        // when continued, reports the answer.
        "stop_in_call" | "stop_mid_write" => {
            if r == "stop_in_call" {
                f.test_while_locked(Some(stop_self));
            } else {
                // Stopped with the first record of the update half written.
                f.test_hook_at(CrashPoint::MidWrite, Some(stop_self));
            }
            let r = f.acquire("a", 20.0, 60_000, 500);
            f.test_while_locked(None);
            f.test_hook_at(CrashPoint::MidWrite, None);
            match r {
                Ok(Ok(l)) => say(&format!("granted {} at {}", l.id, l.granted_at_ms)),
                other => say(&format!("failed {other:?}")),
            }
            wait_parent();
        }
        other => panic!("unknown role {other}"),
    }
}

/// A fair-share region whose ledger holds b's 30 (granted at 200 by this
/// process on its own time scale, far below the clock).
fn region_holding_b30(
    tag: &str,
    opts: RegionOptions,
) -> (String, Gone, shmsched::fair::SharedFairShare) {
    let name = unique_name(tag);
    let gone = Gone(name.clone());
    let region = Region::create_with(&name, opts).unwrap();
    let mut f = FairShare::shared(&region, &common::cfg2()).unwrap();
    f.acquire("b", 30.0, 60_000, 200).unwrap().unwrap();
    (name, gone, f)
}

fn json(out: &str) -> Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Every inspecting command, each followed by a byte comparison of the
/// whole region file; returns the `stat --json` view.
fn inspect_all_unchanged(name: &str, limit: Duration) -> Value {
    let before = bytes(name);
    let mut view = Value::Null;
    for args in [
        vec!["stat", name],
        vec!["stat", name, "--json"],
        vec!["stat", name, "--prometheus"],
        vec!["watch", name, "--count", "1"],
        vec!["watch", name, "--count", "1", "--json"],
    ] {
        let (ok, out, err, took) = cli(&args);
        assert!(ok, "{args:?}: {err}");
        assert!(took < limit, "{args:?} took {took:?}");
        assert!(bytes(name) == before, "{args:?} changed the region's bytes");
        if args.contains(&"--json") && args[0] == "stat" {
            view = json(&out);
        }
    }
    let s = serve(&[name]);
    let (body, took) = scrape(&s.1);
    assert!(took < limit, "the scrape took {took:?}");
    assert_eq!(
        sample(&body, "shmsched_region_up", &[]),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        sample(&body, "shmsched_fair_held", &["tenant=\"b\""]),
        Some(
            view["fair"]["stats"]["tenants"]["b"]["held"]
                .as_f64()
                .unwrap()
        ),
        "{body}"
    );
    drop(s);
    assert!(
        bytes(name) == before,
        "a serve scrape changed the region's bytes"
    );
    view
}

/// Issue 16 point 5: after inspecting, the application's next call at its
/// own (explicit) time is taken at that time: inspecting did not move the
/// ledger's clock, register, or commit.
#[test]
fn inspecting_leaves_the_region_byte_identical() {
    let (name, _g, mut f) = region_holding_b30("inspect-bytes", RegionOptions::default());
    let v = inspect_all_unchanged(&name, Duration::from_secs(10));
    assert_eq!(v["fair"]["stats"]["tenants"]["b"]["held"], 30, "{v}");
    assert_eq!(v["fair"]["stats"]["tenants"]["a"]["guarantee"], 50, "{v}");
    let l = f.acquire("a", 10.0, 100, 300).unwrap().unwrap();
    assert_eq!((l.id.to_string(), l.granted_at_ms), ("a1".to_string(), 300));
    f.release(&l.id, 301).unwrap();
}

/// On a full process table (this process and a dead one that still holds
/// a lease) inspecting shows the ledger and reaps nothing.
#[test]
fn inspecting_a_full_table_changes_nothing() {
    let opts = RegionOptions {
        process_slots: 2,
        ..RegionOptions::default()
    };
    let (name, _g, mut f) = region_holding_b30("inspect-full", opts);
    let mut kid = spawn(
        "child_fair_inspect_role",
        "die_holding",
        std::slice::from_ref(&name),
    );
    kid.expect_line("held");
    assert!(kid.finish().success());
    let v = inspect_all_unchanged(&name, Duration::from_secs(10));
    assert_eq!(v["fair"]["stats"]["tenants"]["b"]["held"], 50, "{v}");
    assert_eq!(
        v["fair"]["stats"]["tenants"]["b"]["reaped_leases"], 0,
        "{v}"
    );
    assert!(v["note"].is_null(), "{v}");
    // The application's own reap still finds the dead process.
    let r = f.reap().unwrap();
    assert_eq!((r.processes, r.leases), (1, 1));
}

/// An application stopped inside a ledger call, holding its lock: every
/// inspecting command answers within a second (it used to wait 5 s and
/// fail), shows the last committed state, and changes no byte; once
/// continued, the application's call succeeds at its own time.
#[test]
fn inspecting_beside_an_application_stopped_in_a_call() {
    for role in ["stop_in_call", "stop_mid_write"] {
        let (name, _g, _f) = region_holding_b30("inspect-stopped", RegionOptions::default());
        let stopped = Stopped(spawn(
            "child_fair_inspect_role",
            role,
            std::slice::from_ref(&name),
        ));
        stopped.wait_stopped();
        let v = inspect_all_unchanged(&name, AT_ONCE);
        assert_eq!(
            v["fair"]["stats"]["tenants"]["b"]["held"], 30,
            "{role}: {v}"
        );
        assert_eq!(v["fair"]["stats"]["tenants"]["a"]["held"], 0, "{role}: {v}");
        assert_eq!(
            v["fair"]["stats"]["tenants"]["a"]["leases"], 0,
            "{role}: {v}"
        );
        stopped.cont();
        let mut stopped = stopped;
        assert_eq!(stopped.0.expect_line("granted"), "a1 at 500", "{role}");
    }
}

/// One scrape of three regions, one of them beside an application stopped
/// in a ledger call, answers for all three at once.
#[test]
fn one_scrape_answers_for_every_region_beside_a_stopped_application() {
    let (stuck, _g1, _f1) = region_holding_b30("scrape-stuck", RegionOptions::default());
    let (other, _g2, _f2) = region_holding_b30("scrape-other", RegionOptions::default());
    let sched = unique_name("scrape-sched");
    let _g3 = Gone(sched.clone());
    let r = Region::create(&sched).unwrap();
    let _s = shmsched::scheduler::Scheduler::shared(&r, 3).unwrap();
    let stopped = Stopped(spawn(
        "child_fair_inspect_role",
        "stop_in_call",
        std::slice::from_ref(&stuck),
    ));
    stopped.wait_stopped();
    let s = serve(&[&stuck, &other, &sched]);
    for _ in 0..3 {
        let (body, took) = scrape(&s.1);
        assert!(took < AT_ONCE, "the scrape took {took:?}");
        for name in [&stuck, &other, &sched] {
            let label = format!("region=\"{name}\"");
            assert_eq!(
                sample(&body, "shmsched_region_up", &[&label]),
                Some(1.0),
                "{name}: {body}"
            );
        }
        let label = format!("region=\"{stuck}\"");
        assert_eq!(
            sample(&body, "shmsched_fair_held", &[&label, "tenant=\"b\""]),
            Some(30.0)
        );
    }
}

/// `serve --region-timeout`: a region that cannot be read in time (here its
/// file is held under an exclusive `flock`, as by a stopped initialiser) is
/// reported down at that scrape, and the other regions are answered.
#[test]
fn a_region_that_cannot_be_read_in_time_is_reported_down_alone() {
    use std::os::fd::AsRawFd;
    let (locked, _g1, _f1) = region_holding_b30("scrape-locked", RegionOptions::default());
    let (other, _g2, _f2) = region_holding_b30("scrape-free", RegionOptions::default());
    let file = std::fs::File::open(path_of(&locked)).unwrap();
    // SAFETY: flock(2) on a descriptor this test owns.
    assert_eq!(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) }, 0);
    let s = serve(&["--region-timeout", "300", &locked, &other]);
    let (body, took) = scrape(&s.1);
    assert!(took < Duration::from_secs(3), "the scrape took {took:?}");
    let up = |name: &str| {
        sample(
            &body,
            "shmsched_region_up",
            &[&format!("region=\"{name}\"")],
        )
    };
    assert_eq!(up(&locked), Some(0.0), "{body}");
    assert_eq!(up(&other), Some(1.0), "{body}");
    drop(file);
    let (body, _) = scrape(&s.1);
    let up = |name: &str| {
        sample(
            &body,
            "shmsched_region_up",
            &[&format!("region=\"{name}\"")],
        )
    };
    assert_eq!(up(&locked), Some(1.0), "{body}");
}
