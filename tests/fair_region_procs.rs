//! The region home across real processes: this test binary spawns itself
//! with a role in `SHMSCHED_FAIR_ROLE` (the `child_role` test runs it; it
//! does nothing in a normal run).
//!
//! - a process holding leases is SIGKILLed; another process's acquire finds
//!   the capacity short, reaps, and gets it; an explicit `reap()` does the
//!   same; both are counted as reaped, not as overruns;
//! - several processes acquire and release different tenants of one region
//!   at once through the `*_now` calls: no lost update, the ceiling holds,
//!   time never goes backwards.

mod tools;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use shmsched::fair::{FairConfig, FairShare, FairnessUnit, SharedFairShare};
use shmsched::region::Region;

const ROLE: &str = "SHMSCHED_FAIR_ROLE";
const PATH: &str = "SHMSCHED_FAIR_REGION";
const ARG: &str = "SHMSCHED_FAIR_ARG";

fn cfg(tenants: &[&str]) -> FairConfig {
    FairConfig {
        ceiling: 100.0,
        fairness_unit: FairnessUnit::Cost,
        tenants: tenants.iter().map(|t| (t.to_string(), 1.0)).collect(),
        reclaim_horizon_ms: 100,
        idle_after_ms: 1000,
        started_at_ms: 0,
    }
}

/// Removes the region file when the test ends.
struct TempRegion(String);

impl TempRegion {
    fn new(tag: &str) -> TempRegion {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        TempRegion(format!(
            "/dev/shm/shmsched-fairtest-{}-{tag}-{nanos}",
            std::process::id()
        ))
    }
}

impl Drop for TempRegion {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn spawn(role: &str, path: &str, arg: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["child_role", "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(PATH, path)
        .env(ARG, arg)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Lines the child printed with our prefix.
fn role_lines(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.find("ROLE: ").map(|i| &l[i + 6..]))
        .map(str::to_string)
        .collect()
}

/// Writes a report line to the real stdout (bypassing the test harness's
/// output capture) and flushes it.
fn say(line: String) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "ROLE: {line}");
    let _ = out.flush();
}

fn fail(msg: String) -> ! {
    eprintln!("child failed: {msg}");
    std::process::exit(2);
}

/// Entry point of the child processes.
#[test]
fn child_role() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let path = std::env::var(PATH).unwrap();
    let arg = std::env::var(ARG).unwrap_or_default();
    let region = Region::open(&path).unwrap_or_else(|e| fail(e.to_string()));
    let mut f = FairShare::attach(&region).unwrap_or_else(|e| fail(e.to_string()));
    match role.as_str() {
        // arg: "tenant:cost:hold,…"; every acquire must be granted.
        "hold" => {
            let mut ids = Vec::new();
            for spec in arg.split(',') {
                let p: Vec<&str> = spec.split(':').collect();
                let (cost, hold) = (p[1].parse().unwrap(), p[2].parse().unwrap());
                match f.acquire_now(p[0], cost, hold) {
                    Ok(Ok(l)) => ids.push(l.id),
                    other => fail(format!("{spec}: {other:?}")),
                }
            }
            say(format!(
                "held {} owner {}",
                ids.join(" "),
                f.owner().unwrap()
            ));
            std::thread::sleep(Duration::from_secs(60));
            fail("was not killed".into());
        }
        // arg: tenant. Acquire 5 for 50 ms 3000 times, keeping the last
        // three leases outstanding (15 < the guarantee of 25: never refused).
        "worker" => {
            let tenant = arg.as_str();
            let ceiling = f.config().ceiling;
            let mut granted = 0u64;
            let mut open = std::collections::VecDeque::new();
            for i in 0..3000u64 {
                match f.acquire_now(tenant, 5.0, 50) {
                    Ok(Ok(l)) => {
                        granted += 1;
                        // Only this process acquires for `tenant`: the ids run
                        // 1, 2, 3, … with no gap or repeat (no lost update).
                        if l.id != format!("{tenant}{granted}") {
                            fail(format!("grant {granted} got id {}", l.id));
                        }
                        open.push_back(l.id);
                        if open.len() > 3 {
                            let id = open.pop_front().unwrap_or_default();
                            if let Err(e) = f.release_now(&id) {
                                fail(format!("release {id}: {e}"));
                            }
                        }
                        if i % 8 == 0 {
                            let s = f.stats_now().unwrap_or_else(|e| fail(e.to_string()));
                            let held: f64 = s.tenants.iter().map(|t| t.held).sum();
                            if held > ceiling + 1e-9 {
                                fail(format!("held {held} above the ceiling {ceiling}"));
                            }
                            let mine = s.tenant(tenant).map(|t| t.held).unwrap_or(-1.0);
                            if mine != 5.0 * open.len() as f64 {
                                fail(format!("{tenant} holds {mine} with {} open", open.len()));
                            }
                        }
                    }
                    Ok(Err(r)) => fail(format!("refused: {}", r.explanation)),
                    Err(e) => fail(format!("acquire {i}: {e}")),
                }
            }
            say(format!("done {granted} {}", open.len()));
        }
        // A handle inherited across fork acts as the child's own process:
        // the child's lease is recorded under a new owner id, so when the
        // child has exited, reaping returns exactly its lease and not ours.
        "fork" => {
            let mine = f.acquire_now("a", 10.0, 1000);
            let Ok(Ok(mine)) = mine else {
                fail(format!("{mine:?}"))
            };
            let parent_owner = f.owner().unwrap_or_else(|e| fail(e.to_string()));
            // SAFETY: the child only uses the ledger (glibc's malloc is
            // fork-safe) and leaves with _exit.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                let code = match (f.owner(), f.acquire_now("a", 20.0, 1000)) {
                    (Ok(o), Ok(Ok(_))) if o != parent_owner => 0,
                    _ => 1,
                };
                // SAFETY: leave the forked child without running destructors.
                unsafe { libc::_exit(code) };
            }
            let status = tools::bounded_waitpid(pid);
            if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
                fail(format!("forked child status {status}"));
            }
            let held = f.stats_now().map(|s| s.tenant("a").map(|t| t.held));
            let out = f.reap().unwrap_or_else(|e| fail(e.to_string()));
            let after = f.stats_now().unwrap_or_else(|e| fail(e.to_string()));
            let a = after.tenant("a").unwrap_or_else(|| fail("no a".into()));
            say(format!(
                "fork before {:?} reaped {} {} after {} {} kept {}",
                held, out.processes, out.leases, a.held, a.reaped_leases, mine.id
            ));
        }
        other => fail(format!("unknown role {other}")),
    }
}

fn kill_and_wait(mut child: Child) {
    // SAFETY: plain kill(2) of our own child's pid.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
    assert_eq!(rc, 0);
    let st = child.wait().unwrap();
    assert!(!st.success());
}

/// Spawns a `hold` child and waits for its report line.
fn holder(path: &str, arg: &str) -> (Child, String) {
    let mut child = spawn("hold", path, arg);
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("holder has no stdout");
    };
    let mut out = BufReader::new(stdout);
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap_or(0) == 0 {
            let st = child.wait();
            panic!("holder exited early: {st:?}");
        }
        if let Some(rest) = role_lines(&line).pop() {
            if let Some(rest) = rest.strip_prefix("held ") {
                return (child, rest.to_string());
            }
        }
    }
}

fn held(f: &mut SharedFairShare, t: &str) -> f64 {
    f.stats_now().unwrap().tenant(t).unwrap().held
}

#[test]
fn leases_of_a_killed_process_are_released_by_the_reaper() {
    let tmp = TempRegion::new("kill");
    let region = Region::create(&tmp.0).unwrap();
    let mut f = FairShare::shared_with_capacity(&region, &cfg(&["a", "b"]), 64).unwrap();

    // The child takes b's own 50 and borrows a's idle 50.
    let (child, report) = holder(&tmp.0, "b:50:1000,b:50:100");
    assert!(report.starts_with("b1 b2 owner "), "{report}");
    let child_owner: u32 = report.rsplit(' ').next().unwrap().parse().unwrap();
    assert_ne!(child_owner, f.owner().unwrap());
    assert_eq!(held(&mut f, "b"), 100.0);
    // While the child lives, a short acquire scans and reaps nothing.
    let r = f.acquire_now("a", 50.0, 100).unwrap();
    assert_eq!(r.unwrap_err().reason.as_str(), "guarantee_on_loan");
    assert_eq!(held(&mut f, "b"), 100.0);
    assert_eq!(f.reaped(), (0, 0));

    kill_and_wait(child);
    // Past the rate limit of the previous scan.
    std::thread::sleep(Duration::from_millis(
        shmsched::fair::region::REAP_INTERVAL_MS + 10,
    ));
    // Capacity is short for a: the acquire path notices the dead process.
    let lease = f.acquire_now("a", 50.0, 100).unwrap().unwrap();
    assert_eq!(lease.id, "a1");
    let s = f.stats_now().unwrap();
    let b = s.tenant("b").unwrap();
    assert_eq!((b.held, b.leases, b.reaped_leases), (0.0, 0, 2));
    assert!(s.overrun_leases.is_empty(), "{:?}", s.overrun_leases);
    assert_eq!(s.tenant("a").unwrap().lent, 0.0);
    assert_eq!(f.reaped(), (1, 2));

    // An explicit reap() does the same without an acquire.
    let (child, report) = holder(&tmp.0, "b:30:1000,b:20:1000");
    assert!(report.starts_with("b3 b4 "), "{report}");
    assert_eq!(held(&mut f, "b"), 50.0);
    kill_and_wait(child);
    let out = f.reap().unwrap();
    assert_eq!((out.processes, out.leases), (1, 2));
    let s = f.stats_now().unwrap();
    let b = s.tenant("b").unwrap();
    assert_eq!((b.held, b.reaped_leases), (0.0, 4));
    assert_eq!(
        s.tenant("a").unwrap().held,
        50.0,
        "a's own lease is untouched"
    );
    assert_eq!(f.reaped(), (2, 4));
    assert_eq!(f.reap().unwrap().processes, 0, "reaping is exact: once");
    f.release_now(&lease.id).unwrap();
    assert_eq!(f.recoveries(), 0);
}

#[test]
fn several_processes_share_one_region_without_lost_updates() {
    let tmp = TempRegion::new("multi");
    let tenants = ["a", "b", "c", "d"];
    let region = Region::create(&tmp.0).unwrap();
    // Start now on the shared clock: nobody is idle (lendable) for the next
    // second (ruling Q1), so each tenant works within its own 25. Kept
    // leases are overrun later and never freed, so lending them would
    // starve a lender for good.
    let mut c = cfg(&tenants);
    c.started_at_ms = shmsched::sys::monotonic_ms();
    let mut f = FairShare::shared_with_capacity(&region, &c, 256).unwrap();
    let children: Vec<Child> = tenants.iter().map(|t| spawn("worker", &tmp.0, t)).collect();
    let mut results = Vec::new();
    for (t, child) in tenants.iter().zip(children) {
        let out = tools::bounded_wait_output(child);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "{t}: {:?} {text}", out.status);
        let lines = role_lines(&text);
        assert!(!lines.is_empty(), "{t}: no report in {text:?}");
        let v: Vec<u64> = lines[0]
            .strip_prefix("done ")
            .unwrap()
            .split(' ')
            .map(|x| x.parse().unwrap())
            .collect();
        assert!(v[0] > 0, "{t} got no grant");
        eprintln!("{t}: granted {} kept {}", v[0], v[1]);
        results.push((*t, v[0], v[1]));
    }
    let s = f.stats_now().unwrap();
    let total: f64 = s.tenants.iter().map(|t| t.held).sum();
    assert!(total <= 100.0 + 1e-9, "held {total}");
    for &(t, granted, kept) in &results {
        assert_eq!((granted, kept), (3000, 3), "{t}");
        let x = s.tenant(t).unwrap();
        // A child that exited may already have been reaped by another's
        // acquire path; either way its kept leases are accounted for.
        assert_eq!(x.leases + x.reaped_leases, kept, "{t}");
        assert_eq!(x.held, 5.0 * x.leases as f64, "{t}");
        assert_eq!((x.borrowed, x.lent), (0.0, 0.0), "{t}");
    }
    // The children have exited: the reaper gives back what they kept.
    let out = f.reap().unwrap();
    assert_eq!(f.reaped().0, 4);
    assert_eq!(f.reaped().1, results.iter().map(|r| r.2).sum::<u64>());
    assert!(out.processes <= 4);
    // Lease numbers continue where each child stopped: nothing was lost.
    for &(t, granted, _) in &results {
        let l = f.acquire_now(t, 1.0, 10).unwrap().unwrap();
        assert_eq!(l.id, format!("{t}{}", granted + 1));
        f.release_now(&l.id).unwrap();
    }
    let s = f.stats_now().unwrap();
    assert!(s.tenants.iter().all(|t| t.held == 0.0 && t.leases == 0));
    assert_eq!(f.recoveries(), 0);
}

#[test]
fn a_handle_inherited_across_fork_is_the_childs_own_process() {
    let tmp = TempRegion::new("fork");
    let region = Region::create(&tmp.0).unwrap();
    let _f = FairShare::shared_with_capacity(&region, &cfg(&["a", "b"]), 16).unwrap();
    // Fork from a fresh single-purpose process, not from this test harness.
    let out = tools::bounded_wait_output(spawn("fork", &tmp.0, ""));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{:?} {text}", out.status);
    let lines = role_lines(&text);
    assert_eq!(
        lines,
        ["fork before Ok(Some(30.0)) reaped 1 1 after 10 1 kept a1"],
        "{text}"
    );
}
