//! Processes in four languages sharing one region: a Rust process (this
//! test binary re-executed, using the Rust library directly), two C
//! processes, a Python process and a Node process, with this test process
//! observing through the Rust library.
//!
//! - One Scheduler (cap 3): under churn from all five, the observer never
//!   sees more than 3 running; a C holder SIGKILLed mid-hold has its slot
//!   reclaimed (a waiter gets it) and nothing leaks; priorities cross
//!   languages (a Highest waiter in Python, then a High one in Node, are
//!   served before a Low waiter in C); a Node waiter aborted through its
//!   AbortSignal leaves no waiter and holds nothing. A Python asyncio
//!   waiter (no thread per wait) that is cancelled leaves no waiter and
//!   takes nothing; one that waits at Low is served before a Lowest waiter
//!   in C.
//! - One Limiter: the five together consume at the budget's rate, within
//!   1 % over 3 s, measured from each process's own completion times.
//!
//! The workers speak one line protocol (see `tests/workers/worker.c`).

mod support;

use std::io::{BufRead, Write};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use shmsched::limiter::Limiter;
use shmsched::region::Region;
use shmsched::scheduler::Scheduler;
use shmsched::Priority;
use support::{compile_c, node, python, test_file, until, Kid, TempRegion};

const ROLE: &str = "SHMSCHED_MIXED_ROLE";

/// CLOCK_MONOTONIC in ns, the clock every worker timestamps with.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn say(line: &str) {
    let mut o = std::io::stdout().lock();
    writeln!(o, "{line}").unwrap();
    o.flush().unwrap();
}

fn read_line() -> Option<String> {
    let mut s = String::new();
    match std::io::stdin().lock().read_line(&mut s) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(s.trim().to_string()),
    }
}

/// The Rust worker: this test binary re-executed with a role. Does nothing
/// in a normal test run.
#[test]
fn rust_worker_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let args: Vec<String> = std::env::var("SHMSCHED_MIXED_ARGS")
        .unwrap()
        .split(' ')
        .map(String::from)
        .collect();
    let region = Region::open(&args[0]).expect("open region");
    match role.as_str() {
        "sched-churn" => {
            let s = Scheduler::attach(&region).unwrap();
            say("ready");
            read_line().expect("go");
            let end = Instant::now() + Duration::from_secs_f64(args[1].parse().unwrap());
            let mut rng = u64::from(std::process::id()) | 1;
            let mut n = 0u64;
            while Instant::now() < end {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let _p = s.acquire(Priority::ALL[(rng % 7) as usize]).unwrap();
                let hold = Instant::now() + Duration::from_nanos(rng % 200_000);
                while Instant::now() < hold {}
                n += 1;
            }
            say(&format!("done {n}"));
        }
        "lim-consume" => {
            let lim = Limiter::attach(&region).unwrap();
            let chunk: u64 = args[1].parse().unwrap();
            say("ready");
            let go = read_line().expect("go");
            let origin: u64 = go.strip_prefix("go ").unwrap().parse().unwrap();
            let stop = std::sync::Arc::new(AtomicBool::new(false));
            let s2 = stop.clone();
            std::thread::spawn(move || {
                while let Some(l) = read_line() {
                    if l == "stop" {
                        break;
                    }
                }
                s2.store(true, Ordering::SeqCst);
            });
            let mut buckets = std::collections::BTreeMap::<u64, u64>::new();
            let mut total = 0;
            while !stop.load(Ordering::SeqCst) {
                lim.consume(chunk, Priority::Normal).unwrap();
                let at = monotonic_ns();
                total += chunk;
                if at >= origin {
                    *buckets.entry((at - origin) / 10_000_000).or_default() += chunk;
                }
            }
            for (i, t) in buckets {
                say(&format!("bucket {i} {t}"));
            }
            say(&format!("consumed {total}"));
        }
        other => panic!("unknown role {other}"),
    }
}

/// A worker in `lang` playing `role` with `args`.
fn worker(lang: &str, role: &str, args: &[&str]) -> Kid {
    let cmd = match lang {
        "c" => {
            let exe = compile_c("worker", &[test_file("workers/worker.c")]);
            let mut c = Command::new(exe);
            c.arg(role).args(args);
            c
        }
        "python" => {
            let mut c = python();
            c.arg(test_file("workers/worker.py")).arg(role).args(args);
            c
        }
        "node" => {
            let mut c = node();
            c.arg(test_file("workers/worker.mjs")).arg(role).args(args);
            c
        }
        "rust" => {
            let mut c = Command::new(std::env::current_exe().unwrap());
            c.args([
                "--exact",
                "rust_worker_entry",
                "--nocapture",
                "--test-threads=1",
                "-q",
            ])
            .env(ROLE, role)
            .env("SHMSCHED_MIXED_ARGS", args.join(" "));
            c
        }
        other => panic!("no worker in {other}"),
    };
    let mut kid = Kid::spawn(&format!("{lang} {role}"), cmd);
    kid.expect_line("ready");
    kid
}

/// Samples the global running count until `stop`, keeping the highest value
/// seen and how many samples saw the cap reached.
fn observe(s: &Scheduler, stop: &AtomicBool, worst: &AtomicU32, full: &AtomicU64, cap: u32) {
    while !stop.load(Ordering::Relaxed) {
        let r = s.global_running();
        worst.fetch_max(r, Ordering::Relaxed);
        if r == cap {
            full.fetch_add(1, Ordering::Relaxed);
        }
        std::thread::yield_now();
    }
}

const LANGS: [&str; 5] = ["rust", "c", "c", "python", "node"];

/// Sets the flag when dropped: the observer thread stops also when the
/// test fails (a panic unwinds through this guard before the scope joins
/// the observer, which would otherwise spin for ever).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Checks every tool the workers need before anything starts, so a missing
/// one fails the test at once, naming it.
fn tools_first() {
    drop(node());
    drop(python());
    compile_c("worker", &[test_file("workers/worker.c")]);
}

/// The two tests load both cores; run them one at a time, so that the
/// limiter's workers are not starved of CPU by the scheduler's churn.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn mixed_languages_share_one_scheduler() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    tools_first();
    const CAP: u32 = 3;
    let tmp = TempRegion::new("mixed-sched");
    let region = Region::create(&tmp.0).unwrap();
    let me = Scheduler::shared(&region, CAP).unwrap();
    me.set_lottery(None, false);

    // 1. The hard cap under churn from every language.
    let stop = AtomicBool::new(false);
    let worst = AtomicU32::new(0);
    let full = AtomicU64::new(0);
    std::thread::scope(|sc| {
        let observer = sc.spawn(|| observe(&me, &stop, &worst, &full, CAP));
        let stop_guard = StopOnDrop(&stop);
        let mut kids: Vec<Kid> = LANGS
            .iter()
            .map(|l| worker(l, "sched-churn", &[&tmp.0, "2"]))
            .collect();
        for k in &mut kids {
            k.send("go");
        }
        for k in &mut kids {
            let n: u64 = k.expect_line("done").parse().unwrap();
            assert!(n > 0, "{} acquired nothing", k.name);
        }
        for k in kids {
            assert!(k.finish().success());
        }
        drop(stop_guard);
        observer.join().unwrap();
    });
    let worst = worst.load(Ordering::Relaxed);
    assert!(worst <= CAP, "running reached {worst} with a cap of {CAP}");
    assert!(
        full.load(Ordering::Relaxed) > 0,
        "the observer never saw the cap reached: the workers did not overlap"
    );
    assert_eq!(me.global_running(), 0);

    // 2. A C holder is SIGKILLed mid-hold: a waiter gets its slot, and
    //    nothing leaks.
    let victim = {
        let mut k = worker("c", "sched-hold", &[&tmp.0, "normal"]);
        k.expect_line("got");
        k
    };
    let mut py = worker("python", "sched-hold", &[&tmp.0, "high"]);
    py.expect_line("got");
    let mut nd = worker("node", "sched-hold", &[&tmp.0, "normal"]);
    nd.expect_line("got");
    assert_eq!(me.global_running(), CAP);
    let mut waiter = worker("c", "sched-hold", &[&tmp.0, "low"]);
    until("the C waiter queued", || {
        me.stats().shared.unwrap().waiters[Priority::Low.index()] == 1
    });
    victim.kill();
    // The waiter finds the budget full, notices the dead owner, reaps its
    // slot and takes it.
    waiter.expect_line("got");
    let st = me.stats().shared.unwrap();
    assert_eq!(st.running, CAP, "the dead holder's slot went to the waiter");
    assert_eq!(st.reclaimed, 1, "exactly the one slot of the dead process");
    for mut k in [py, nd, waiter] {
        k.send("release");
        k.expect_line("released");
        assert!(k.finish().success());
    }
    me.reap().unwrap();
    let st = me.stats().shared.unwrap();
    assert_eq!(st.running, 0, "nothing leaked: {st:?}");
    assert_eq!(st.waiters, [0; 7]);
    assert_eq!(st.reclaimed, 1);

    // 3. Priorities cross languages: with the cap held here, a Low waiter
    //    in C, a High one in Node and a Highest one in Python queue (in that
    //    order); each freed slot goes to the highest.
    let held: Vec<_> = (0..CAP)
        .map(|_| me.acquire(Priority::Normal).unwrap())
        .collect();
    let mut queued = Vec::new();
    for (lang, prio) in [
        ("c", Priority::Low),
        ("node", Priority::High),
        ("python", Priority::Highest),
    ] {
        let k = worker(lang, "sched-hold", &[&tmp.0, prio.name()]);
        until(&format!("the {lang} waiter at {prio} queued"), || {
            me.stats().shared.unwrap().waiters[prio.index()] == 1
        });
        queued.push(k);
    }
    let mut held = held.into_iter();
    let mut served = Vec::new();
    // Highest (Python) first, then High (Node), then Low (C).
    for (i, expect) in [
        (2usize, Priority::Highest),
        (1, Priority::High),
        (0, Priority::Low),
    ] {
        drop(held.next());
        queued[i].expect_line("got");
        served.push(expect);
        let st = me.stats().shared.unwrap();
        assert_eq!(st.running, CAP);
        for (j, p) in [
            (0usize, Priority::Low),
            (1, Priority::High),
            (2, Priority::Highest),
        ] {
            let still_waiting = u32::from(!served.contains(&p));
            assert_eq!(
                st.waiters[p.index()],
                still_waiting,
                "after serving {served:?}: the {p} waiter (worker {j}) should {}wait",
                if still_waiting == 1 {
                    "still "
                } else {
                    "no longer "
                }
            );
        }
    }
    for mut k in queued {
        k.send("release");
        k.expect_line("released");
        assert!(k.finish().success());
    }
    assert_eq!(me.global_running(), 0);

    // 4. A Node waiter cancelled by its AbortSignal leaves the region as it
    //    found it: once its promise rejects, no waiter is counted and it
    //    holds nothing, so freed slots go to nobody.
    let held: Vec<_> = (0..CAP)
        .map(|_| me.acquire(Priority::Normal).unwrap())
        .collect();
    let mut aborted = worker("node", "sched-abort", &[&tmp.0, "highest"]);
    until("the Node waiter with a signal queued", || {
        me.stats().shared.unwrap().waiters[Priority::Highest.index()] == 1
    });
    aborted.send("abort");
    assert_eq!(aborted.expect_line("aborted"), "AbortError");
    let st = me.stats().shared.unwrap();
    assert_eq!(st.waiters, [0; 7], "the aborted Node waiter left a waiter");
    assert_eq!(st.running, CAP);
    drop(held);
    assert_eq!(
        me.global_running(),
        0,
        "a freed slot went to the aborted waiter"
    );
    assert!(aborted.finish().success());
}

/// A Python asyncio waiter in the same region (its waits take no thread
/// each): cancelled, it leaves no waiter and takes nothing; served, it
/// beats a lower-priority C waiter, as a blocking waiter would.
#[test]
fn mixed_languages_python_asyncio_waiter() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    const CAP: u32 = 2;
    let tmp = TempRegion::new("mixed-async");
    let region = Region::create(&tmp.0).unwrap();
    let me = Scheduler::shared(&region, CAP).unwrap();
    me.set_lottery(None, false);
    let mut held: Vec<_> = (0..CAP)
        .map(|_| me.acquire(Priority::Normal).unwrap())
        .collect();
    let waiters = || me.stats().shared.unwrap().waiters;
    let mut c = worker("c", "sched-hold", &[&tmp.0, "lowest"]);
    until("the C waiter queued", || {
        waiters()[Priority::Lowest.index()] == 1
    });
    let mut py = worker("python", "sched-async", &[&tmp.0]);
    until("both Python asyncio waiters queued", || {
        let w = waiters();
        w[Priority::Highest.index()] == 1 && w[Priority::Low.index()] == 1
    });
    py.send("cancel");
    py.expect_line("cancelled");
    until("the cancelled asyncio waiter left", || {
        waiters()[Priority::Highest.index()] == 0
    });
    assert_eq!(me.global_running(), CAP, "the cancelled wait took nothing");
    drop(held.pop());
    py.expect_line("got");
    let st = me.stats().shared.unwrap();
    assert_eq!(st.running, CAP);
    assert_eq!(
        st.waiters[Priority::Lowest.index()],
        1,
        "C (lowest) still waits"
    );
    drop(held.pop());
    c.expect_line("got");
    for mut k in [py, c] {
        k.send("release");
        k.expect_line("released");
        assert!(k.finish().success());
    }
    let st = me.stats().shared.unwrap();
    assert_eq!((st.running, st.waiters), (0, [0; 7]));
}

#[test]
fn mixed_languages_share_one_limiter() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    tools_first();
    const RATE: u64 = 1_000_000;
    const CHUNK: &str = "2000";
    // Completions are counted in 10 ms buckets from the origin; the window
    // [0.25 s, 3.25 s) is 3 s of steady state (the edges fall between
    // buckets, so no completion is split).
    const FROM: u64 = 25;
    const TO: u64 = 325;
    let tmp = TempRegion::new("mixed-lim");
    let region = Region::create(&tmp.0).unwrap();
    let lim = Limiter::shared(&region, RATE).unwrap();
    let mut kids: Vec<Kid> = LANGS
        .iter()
        .map(|l| worker(l, "lim-consume", &[&tmp.0, CHUNK]))
        .collect();
    // Empty the (full) bucket, so that everything the workers get comes
    // from the refill at the budget's rate.
    lim.consume(RATE, Priority::Normal).unwrap();
    let origin = monotonic_ns();
    for k in &mut kids {
        k.send(&format!("go {origin}"));
    }
    // The measurement window is on the workers' own clocks; this only waits
    // for it to pass.
    while monotonic_ns() < origin + (TO * 10 + 250) * 1_000_000 {
        std::thread::sleep(Duration::from_millis(50));
    }
    for k in &mut kids {
        k.send("stop");
    }
    let mut total = 0u64;
    let mut per_worker = Vec::new();
    for mut k in kids {
        let lines = k.rest();
        assert!(k.wait().success(), "{} failed", k.name);
        let mut mine = 0;
        for l in &lines {
            if let Some(rest) = l.strip_prefix("bucket ") {
                let (i, t) = rest.split_once(' ').unwrap();
                let (i, t): (u64, u64) = (i.parse().unwrap(), t.parse().unwrap());
                if (FROM..TO).contains(&i) {
                    mine += t;
                }
            }
        }
        assert!(
            lines.iter().any(|l| l.starts_with("consumed ")),
            "{} did not report",
            k.name
        );
        assert!(mine > 0, "{} consumed nothing in the window", k.name);
        per_worker.push((k.name.clone(), mine));
        total += mine;
    }
    let budget = RATE * (TO - FROM) / 100;
    let err = (total as f64 - budget as f64) / budget as f64;
    assert!(
        err.abs() <= 0.01,
        "{total} tokens in 3 s against a budget of {budget} ({:+.2} %): {per_worker:?}",
        err * 100.0
    );
    eprintln!(
        "limiter across languages: {total} tokens in 3 s, budget {budget} ({:+.3} %): {per_worker:?}",
        err * 100.0
    );
}
