//! `shmsched run`, `create` and `set` from the outside: real processes,
//! every wait bounded, every region removed.

mod procs;
mod shell;

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use procs::{role, spawn};
use shell::{
    cli, counts, dead, gone, name, spawn_reading, text, until, wait_bounded, Scratch, BIN,
};
use shmsched::limiter::Limiter;
use shmsched::region::Region;
use shmsched::scheduler::{Scheduler, REAP_INTERVAL_MS};
use shmsched::Priority;

/// Child role: a library worker (see `shell::library_worker`).
#[test]
fn child_run_worker() {
    let Some((r, args)) = role() else { return };
    assert_eq!(r, "worker");
    shell::library_worker(&args);
}

/// N concurrent `run`s of a command plus library workers in another
/// process never hold more than the max at once: every holder keeps a
/// marker inside its slot, and no arrival ever sees more than max of them.
#[test]
fn concurrent_runs_and_workers_never_exceed_max() {
    let r = name("runmax");
    let _g = gone(&r);
    let dir = Scratch::new("runmax");
    let marks = dir.path().join("m");
    std::fs::create_dir(&marks).unwrap();
    assert!(cli(&["create", &r, "--max", "3"]).status.success());
    let region = Region::open(&r).unwrap();
    let sched = Scheduler::attach(&region).unwrap();
    let mut worker = spawn(
        "child_run_worker",
        "worker",
        &[
            r.clone(),
            marks.display().to_string(),
            "2".into(),
            "normal".into(),
            "15".into(),
        ],
    );
    worker.expect_line("working");
    let job = shell::marked(&marks, "sleep 0.1");
    let runs: Vec<_> = (0..8)
        .map(|_| {
            Command::new(BIN)
                .args(["run", &r, "--", "sh", "-c", &job])
                .stdin(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    // The observer: the region's own count, sampled while they run.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let observer = {
        let (sched, stop) = (sched.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                peak = peak.max(sched.global_running());
                std::thread::sleep(Duration::from_micros(500));
            }
            peak
        })
    };
    let outs: Vec<_> = runs
        .into_iter()
        .map(|c| wait_bounded(c, 60, "run"))
        .collect();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let peak = observer.join().unwrap();
    worker.finish();
    for o in &outs {
        assert!(o.status.success(), "{:?}", o.status);
    }
    let seen = counts(&marks);
    let most = seen.iter().copied().max().unwrap_or(0);
    assert!(seen.len() >= 8, "jobs logged: {seen:?}");
    assert!(
        most <= 3,
        "{most} holders at once under a max of 3: {seen:?}"
    );
    assert!(peak <= 3, "the region showed {peak} held");
    assert!(most >= 2, "nothing ran in parallel: {seen:?}");
    assert_eq!(sched.global_running(), 0);
}

/// The command's status is passed on (128 + N for signal N), a missing or
/// unrunnable command and a bad region have their own documented codes,
/// and a signal sent to `run` reaches the command.
#[test]
fn exit_status_and_signals() {
    let r = name("runexit");
    let _g = gone(&r);
    assert!(cli(&["create", &r, "--max", "1"]).status.success());
    let code = |args: &[&str]| cli(args).status.code();
    assert_eq!(code(&["run", &r, "--", "sh", "-c", "exit 7"]), Some(7));
    assert_eq!(code(&["run", &r, "--", "true"]), Some(0));
    assert_eq!(
        code(&["run", &r, "--", "sh", "-c", "kill -KILL $$"]),
        Some(137)
    );
    assert_eq!(code(&["run", &r, "--", "/nonexistent/command"]), Some(127));
    assert_eq!(code(&["run", &r, "--", "/dev/null"]), Some(126));
    // Bad region: missing, or of another kind; a usage error is 125 too.
    assert_eq!(code(&["run", &name("missing"), "--", "true"]), Some(125));
    let lim = name("runlim");
    let _gl = gone(&lim);
    assert!(cli(&["create", &lim, "--rate", "1M"]).status.success());
    let o = cli(&["run", &lim, "--", "true"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).contains("limiter"), "{}", text(&o.stderr));
    assert_eq!(code(&["run", &r, "--bogus", "--", "true"]), Some(125));
    assert_eq!(code(&["run", &r, "-n", "2", "--", "true"]), Some(125));
    // A mismatched --max is refused with the library's error.
    let o = cli(&["run", &r, "--max", "5", "--", "true"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).contains("mismatch"), "{}", text(&o.stderr));
    // Timed out waiting: 124, with the one-time note under --verbose.
    let region = Region::open(&r).unwrap();
    let sched = Scheduler::attach(&region).unwrap();
    let held = sched.acquire(Priority::High).unwrap();
    let o = cli(&["run", &r, "--timeout", "200ms", "--verbose", "--", "true"]);
    assert_eq!(o.status.code(), Some(124));
    let err = text(&o.stderr);
    assert_eq!(
        err.matches("shmsched run: waiting for 1 unit").count(),
        1,
        "{err}"
    );
    assert!(err.contains("timed out"), "{err}");
    drop(held);
    // SIGTERM to `run` reaches the command (which says so and exits 9).
    let trap = "trap 'echo got-term; exit 9' TERM; echo ready; while :; do sleep 0.05; done";
    let (c, mut out, line) = spawn_reading(&["run", &r, "--", "sh", "-c", trap]);
    assert_eq!(line, "ready");
    let mut line = String::new();
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "got-term");
    let o = wait_bounded(c, 20, "run with a forwarded SIGTERM");
    assert_eq!(o.status.code(), Some(9));
    assert_eq!(sched.global_running(), 0);
}

/// `run` is the holder: SIGKILLed, its units come back within one reap
/// interval (to a waiter that was blocked on them), and the command is
/// killed too instead of running on outside the budget.
#[test]
fn sigkill_of_run_returns_its_units_and_kills_the_command() {
    let r = name("runkill");
    let _g = gone(&r);
    let (mut c, _out, line) = spawn_reading(&[
        "run",
        &r,
        "--max",
        "2",
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        "echo $$; exec sleep 60",
    ]);
    let child: u32 = line.trim().parse().unwrap();
    let region = Region::open(&r).unwrap();
    let sched = Scheduler::attach(&region).unwrap();
    assert_eq!(sched.global_running(), 2);
    let waiter = {
        let sched = sched.clone();
        std::thread::spawn(move || {
            let p = sched.acquire_many_timeout(Priority::Normal, 2, Duration::from_secs(20));
            let at = Instant::now();
            (p.map(|p| p.into_owned()), at)
        })
    };
    until("the waiter to queue", 10, || {
        sched
            .stats()
            .shared
            .is_some_and(|s| s.waiters.iter().sum::<u32>() == 1)
    });
    let killed = Instant::now();
    c.kill().unwrap();
    c.wait().unwrap();
    let (p, at) = waiter.join().unwrap();
    let p = p.expect("the waiter got the dead holder's units");
    let took = at.duration_since(killed);
    println!("units back {took:?} after SIGKILL (reap interval {REAP_INTERVAL_MS} ms)");
    // One reap interval, plus scheduling noise on a loaded machine.
    assert!(
        took < Duration::from_millis(REAP_INTERVAL_MS + 500),
        "units came back after {took:?}"
    );
    until("the command to die", 10, || dead(child));
    drop(p);
}

/// A `--priority high` run waiting beside a `low` one is served first.
#[test]
fn high_priority_run_is_served_first() {
    let r = name("runprio");
    let _g = gone(&r);
    assert!(cli(&["create", &r, "--max", "1"]).status.success());
    let region = Region::open(&r).unwrap();
    let sched = Scheduler::attach(&region).unwrap();
    // Strict priority for this test (the lottery could pick `low`).
    sched.set_lottery(None, false);
    let dir = Scratch::new("runprio");
    let log = dir.path().join("order");
    let held = sched.acquire(Priority::Highest).unwrap();
    let waiting = |p: Priority| sched.stats().shared.map_or(0, |s| s.waiters[p.index()]);
    let start = |p: &str| {
        Command::new(BIN)
            .args(["run", &r, "--priority", p, "--", "sh", "-c"])
            .arg(format!("echo {p} >> {}", log.display()))
            .stdin(Stdio::null())
            .spawn()
            .unwrap()
    };
    let low = start("low");
    until("low to wait", 10, || waiting(Priority::Low) == 1);
    let high = start("high");
    until("high to wait", 10, || waiting(Priority::High) == 1);
    drop(held);
    assert!(wait_bounded(high, 20, "high run").status.success());
    assert!(wait_bounded(low, 20, "low run").status.success());
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "high\nlow\n");
}

/// `create` and `set` round trips, seen by another process (this one,
/// through the library), and the library's errors through them.
#[test]
fn create_and_set_round_trips() {
    let s = name("mk");
    let _gs = gone(&s);
    let o = cli(&["create", &s, "--max", "4"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let region = Region::open(&s).unwrap();
    let sched = Scheduler::attach(&region).unwrap();
    assert_eq!((sched.concurrency(), sched.ceiling()), (Some(4), 4));
    let o = cli(&["set", &s, "--ceiling", "2"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(sched.ceiling(), 2);
    assert!(cli(&["set", &s, "--ceiling", "max"]).status.success());
    assert_eq!(sched.ceiling(), 4);
    // Errors: the library's, naming the value.
    let o = cli(&["set", &s, "--ceiling", "9"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains('9'), "{}", text(&o.stderr));
    let o = cli(&["set", &s, "--rate", "1M"]);
    assert!(
        text(&o.stderr).contains("holds a scheduler"),
        "{}",
        text(&o.stderr)
    );
    let o = cli(&["create", &s, "--max", "4"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("already exists"),
        "{}",
        text(&o.stderr)
    );
    assert!(cli(&["create", &s, "--max", "4", "--exist-ok"])
        .status
        .success());
    let o = cli(&["create", &s, "--max", "5", "--exist-ok"]);
    assert!(text(&o.stderr).contains("mismatch"), "{}", text(&o.stderr));
    // An invalid max leaves no file behind.
    let bad = name("mkbad");
    let _gb = gone(&bad);
    let o = cli(&["create", &bad, "--max", "70000"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("70000"), "{}", text(&o.stderr));
    assert!(Region::open(&bad).is_err());
    // A limiter: rate and burst in units, then retuned.
    let l = name("mklim");
    let _gl = gone(&l);
    let o = cli(&["create", &l, "--rate", "10M", "--capacity", "64KiB"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let lregion = Region::open(&l).unwrap();
    let lim = Limiter::attach(&lregion).unwrap();
    assert_eq!(
        (lim.tokens_per_second(), lim.capacity()),
        (10_000_000, 65_536)
    );
    assert!(cli(&["set", &l, "--rate", "1.5MiB", "--capacity", "1M"])
        .status
        .success());
    assert_eq!(
        (lim.tokens_per_second(), lim.capacity()),
        (1_572_864, 1_000_000)
    );
    let o = cli(&["set", &l, "--rate", "3GiB"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("3GiB"), "{}", text(&o.stderr));
    let o = cli(&["set", &l, "--ceiling", "1"]);
    assert!(
        text(&o.stderr).contains("holds a limiter"),
        "{}",
        text(&o.stderr)
    );
    // Default burst of a limiter made from the shell: 100 ms of rate.
    let d = name("mkdef");
    let _gd = gone(&d);
    assert!(cli(&["create", &d, "--rate", "20M"]).status.success());
    let dregion = Region::open(&d).unwrap();
    assert_eq!(Limiter::attach(&dregion).unwrap().capacity(), 2_000_000);
}
