//! Region validation, fuzzed: for each object kind, thousands of mutated
//! region files (bit flips; words set to 0, -1, 0x7f, small or random
//! values; byte ranges filled with 0, 0xff, 0x7f or noise; header fields
//! changed with the checksum fixed up; truncation;
//! extension; a valid header of another kind over the body), each opened
//! and used through the public API (`info`, attach, stats, one
//! acquire/consume/ledger call, reap, detach) in a worker process that must
//! answer `Ok` or a clear `Err` within [`PER_FILE`]: no panic, no signal, no
//! hang. A sample also goes through `shmsched stat`.
//!
//! How it runs: the test re-executes this binary as a worker (role in the
//! environment; the `fuzz_worker` entry does nothing in a normal run) and
//! feeds it one file at a time over a pipe, with a watchdog per file; a
//! worker that hangs is killed and one that dies is replaced, and the
//! failure (file, mutation, symptom) is recorded. Workers are recycled every
//! [`PER_WORKER`] files so that nothing accumulates. The mutations come from
//! a seeded generator: `SHMSCHED_FUZZ_SEED` replays a run,
//! `SHMSCHED_FUZZ_FILES` sets the files per kind (default 20,000), and
//! failing files are kept under the system temp dir for reproduction.

mod tools;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use shmsched::fair::{FairConfig, FairShare, FairnessUnit};
use shmsched::limiter::Limiter;
use shmsched::region::layout::{fnv1a64, CHECKSUM_OFFSET, HEADER_SIZE};
use shmsched::region::{Region, RegionOptions};
use shmsched::scheduler::Scheduler;
use shmsched::Priority;

const ROLE: &str = "SHMSCHED_FUZZ_ROLE";
/// Longest a worker may take over one file.
const PER_FILE: Duration = Duration::from_secs(2);
/// Files one worker process handles before it is replaced.
const PER_WORKER: usize = 500;
/// Every this many files of a kind also make a blocking call (acquire or
/// consume with a 5 ms timeout).
const BLOCK_EVERY: usize = 4;
/// Every this many files of a kind also go through `shmsched stat`.
const CLI_EVERY: usize = 50;
const KINDS: [&str; 3] = ["scheduler", "limiter", "fair"];

fn fair_cfg() -> FairConfig {
    FairConfig {
        ceiling: 100.0,
        fairness_unit: FairnessUnit::Cost,
        tenants: vec![("t0".into(), 1.0), ("t1".into(), 3.0)],
        reclaim_horizon_ms: 100,
        idle_after_ms: 1000,
        started_at_ms: 0,
    }
}

fn opts() -> RegionOptions {
    RegionOptions {
        process_slots: 8,
        ..RegionOptions::default()
    }
}

// ---------------------------------------------------------------- worker

/// Uses one file through the public API; `Err` carries the error's text.
/// `block`: also make one blocking call (bounded by a short timeout).
fn use_file(kind: &str, path: &str, block: bool) -> Result<(), String> {
    let r = Region::open(path).map_err(|e| e.to_string())?;
    let _ = r.info();
    // The other kinds' attaches must refuse cleanly (or work, if the file
    // now says it is of that kind).
    let sched = || -> shmsched::Result<()> {
        let s = Scheduler::attach(&r)?;
        let _ = s.stats();
        let _ = s.processes();
        drop(s.try_acquire(Priority::Normal));
        if block {
            drop(s.acquire_timeout(Priority::High, Duration::from_millis(5)));
        }
        let _ = s.reap();
        s.detach()
    };
    let lim = || -> shmsched::Result<()> {
        let l = Limiter::attach(&r)?;
        let _ = l.stats();
        let _ = l.tokens();
        let _ = l.try_consume(1);
        if block {
            let _ = l.consume_timeout(2, Priority::High, Duration::from_millis(5));
        }
        let _ = l.reap();
        l.detach()
    };
    let fair = || -> shmsched::Result<()> {
        let mut f = FairShare::attach(&r)?;
        let _ = f.stats_now();
        if let Ok(Ok(l)) = f.acquire_now("t0", 1.0, 10) {
            f.release_now(&l.id).map_err(shmsched::Error::from)?;
        }
        let _ = f.reap();
        let _ = f.plan_now();
        f.mapping().deregister()
    };
    let (s, l, f) = (sched(), lim(), fair());
    let mine = match kind {
        "scheduler" => s,
        "limiter" => l,
        _ => f,
    };
    mine.map_err(|e| e.to_string())
}

/// Worker entry: reads "KIND BLOCK PATH" lines, answers one "FUZZ ..."
/// line each.
#[test]
fn fuzz_worker() {
    if std::env::var(ROLE).is_err() {
        return;
    }
    let say = |s: &str| {
        let mut o = std::io::stdout().lock();
        writeln!(o, "FUZZ {s}").unwrap();
        o.flush().unwrap();
    };
    say("ready");
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let mut it = line.splitn(3, ' ');
        let (Some(kind), Some(block), Some(path)) = (it.next(), it.next(), it.next()) else {
            break;
        };
        let r = std::panic::catch_unwind(|| use_file(kind, path, block == "1"));
        match r {
            Ok(Ok(())) => say("ok"),
            Ok(Err(e)) if !e.trim().is_empty() => say(&format!("err {}", e.replace('\n', " "))),
            Ok(Err(_)) => say("unclear empty error"),
            Err(p) => {
                let m = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                say(&format!("panic {}", m.replace('\n', " ")));
            }
        }
    }
}

// ---------------------------------------------------------------- driver

/// A seeded xorshift generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A worker process and its pipes.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
}

impl Worker {
    fn spawn() -> Worker {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "fuzz_worker",
                "--nocapture",
                "--test-threads=1",
                "-q",
            ])
            .env(ROLE, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn fuzz worker");
        let stdin = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut w = Worker { child, stdin, out };
        match w.line(Duration::from_secs(30)) {
            Line::Got(l) if l == "ready" => w,
            other => panic!("fuzz worker did not start: {other:?}"),
        }
    }

    /// The next "FUZZ ..." line, within `limit`.
    fn line(&mut self, limit: Duration) -> Line {
        let deadline = Instant::now() + limit;
        loop {
            if self.out.buffer().is_empty() {
                let left = deadline.saturating_duration_since(Instant::now());
                let mut p = libc::pollfd {
                    fd: self.out.get_ref().as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                let n = unsafe { libc::poll(&mut p, 1, left.as_millis().min(60_000) as i32) };
                if n == 0 {
                    return Line::Timeout;
                }
            }
            let mut s = String::new();
            match self.out.read_line(&mut s) {
                Ok(0) | Err(_) => return Line::Eof,
                Ok(_) => {
                    if let Some(rest) = s.trim_end().strip_prefix("FUZZ ") {
                        return Line::Got(rest.to_string());
                    }
                }
            }
        }
    }

    fn kill(mut self) -> Option<i32> {
        let _ = self.child.kill();
        self.child.wait().ok().and_then(|s| {
            use std::os::unix::process::ExitStatusExt;
            s.signal()
        })
    }

    /// Waits for a worker that has closed its output; its signal, if any.
    fn reap(mut self) -> String {
        use std::os::unix::process::ExitStatusExt;
        let t = Instant::now();
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return match s.signal() {
                    Some(sig) => format!("killed by signal {sig}"),
                    None => format!("exited with {:?}", s.code()),
                };
            }
            if t.elapsed() > Duration::from_secs(5) {
                let _ = self.kill();
                return "closed its output and hung".into();
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

#[derive(Debug)]
enum Line {
    Got(String),
    Timeout,
    Eof,
}

/// Makes the three base files (each with a dead process holding slots,
/// tokens or leases, so that reaping paths run too) and returns their
/// bytes.
fn bases(dir: &Path) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for kind in KINDS {
        let path = dir.join(format!("base-{kind}"));
        let p = path.to_str().unwrap().to_string();
        let r = Region::create_with(&p, opts()).unwrap();
        // A holder that dies holding: in a child, so the entry is dead.
        let held = {
            let r = r.clone();
            let kind = kind.to_string();
            move || match kind.as_str() {
                "scheduler" => {
                    let s = Scheduler::shared(&r, 8).unwrap();
                    std::mem::forget(s.try_acquire(Priority::High).unwrap());
                    std::mem::forget(s.try_acquire(Priority::Low).unwrap());
                    std::mem::forget(s);
                }
                "limiter" => {
                    let l = Limiter::shared(&r, 100_000).unwrap();
                    l.consume(60_000, Priority::Normal).unwrap();
                    std::mem::forget(l);
                }
                _ => {
                    let mut f = FairShare::shared_with_capacity(&r, &fair_cfg(), 16).unwrap();
                    f.acquire_now("t0", 10.0, 60_000).unwrap().unwrap();
                    f.acquire_now("t1", 50.0, 60_000).unwrap().unwrap();
                    std::mem::forget(f);
                }
            }
        };
        // SAFETY (test): the child only uses the region and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            held();
            // SAFETY (test): leave without running destructors.
            unsafe { libc::_exit(0) };
        }
        let st = tools::bounded_waitpid(pid);
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "base {kind}"
        );
        out.push(std::fs::read(&path).unwrap());
        std::fs::remove_file(&path).unwrap();
    }
    out
}

/// Offsets where the interesting words of a region are: the header, the
/// process table, the object area (all of it).
fn pick_offset(rng: &mut Rng, len: usize, align: usize) -> usize {
    let table = HEADER_SIZE as usize;
    // The header is checksummed (one in five mutations there is plenty);
    // the process table and the object area are not.
    let (lo, hi) = match rng.below(5) {
        0 => (0, 160.min(len)),
        1 | 2 => (table, (table + 8 * 256).min(len)),
        _ => ((table + 8 * 256).min(len), len),
    };
    let (lo, hi) = if lo >= hi { (0, len) } else { (lo, hi) };
    let at = lo + rng.below(hi - lo);
    (at / align * align).min(len.saturating_sub(align))
}

fn set_word(f: &mut [u8], at: usize, width: usize, v: u64) {
    if at + width <= f.len() {
        f[at..at + width].copy_from_slice(&v.to_ne_bytes()[..width]);
    }
}

fn word_value(rng: &mut Rng, old: u64) -> (u64, &'static str) {
    match rng.below(7) {
        0 => (0, "0"),
        1 => (u64::MAX, "-1"),
        2 => (0x7f, "0x7f"),
        3 => (rng.next(), "random"),
        4 => (1 + rng.below(16) as u64, "small"),
        5 => (old.wrapping_add(1), "+1"),
        _ => (old.wrapping_sub(1), "-1 of it"),
    }
}

fn fix_checksum(f: &mut [u8]) {
    if f.len() >= CHECKSUM_OFFSET + 8 {
        let sum = fnv1a64(&f[..CHECKSUM_OFFSET]);
        f[CHECKSUM_OFFSET..CHECKSUM_OFFSET + 8].copy_from_slice(&sum.to_ne_bytes());
    }
}

/// The byte ranges whose words steer the code: the header, the head of each
/// process entry (state, generation, pid, futex, the first object words),
/// the object's own header, and for a ledger its shared header (with the
/// mutex) and the start of both copies. Computed from the file itself (the
/// region header's offsets and, for a ledger, the JSON length in
/// `params[7]`), so the list follows layout changes.
fn hot_ranges(kind: usize, base: &[u8]) -> Vec<(usize, usize)> {
    let word = |at: usize| u64::from_ne_bytes(base[at..at + 8].try_into().unwrap()) as usize;
    let table = word(24);
    let object = word(32);
    let mut r = vec![(0, 160)];
    for e in 0..8 {
        r.push((table + e * 256, table + e * 256 + 96));
    }
    r.push((object, object + 256));
    if KINDS[kind] == "fair" {
        let ledger = object + 128 + word(56 + 7 * 8).div_ceil(128) * 128;
        r.push((ledger, ledger + 192 + 512));
    }
    r.into_iter()
        .map(|(a, b)| (a.min(base.len()), b.min(base.len())))
        .filter(|(a, b)| a + 8 <= *b)
        .collect()
}

/// One mutated file of `kind` (index into `bases`) and what was done.
fn mutate(rng: &mut Rng, bases: &[Vec<u8>], kind: usize) -> (Vec<u8>, String) {
    let mut f = bases[kind].clone();
    let len = f.len();
    let roll = rng.below(100);
    let what = if roll < 25 {
        // Words that steer the code, one to three at a time.
        let hot = hot_ranges(kind, &bases[kind]);
        let n = 1 + rng.below(3);
        let mut d = Vec::new();
        for _ in 0..n {
            let (a, b) = hot[rng.below(hot.len())];
            let width = if rng.below(2) == 0 { 4 } else { 8 };
            let at = (a + rng.below(b - a - width + 1)) / width * width;
            let mut old = [0u8; 8];
            old[..width].copy_from_slice(&f[at..at + width]);
            let (v, name) = word_value(rng, u64::from_ne_bytes(old));
            set_word(&mut f, at, width, v);
            d.push(format!("hot {width}-byte word at {at} := {name} ({v:#x})"));
        }
        d.join(", ")
    } else if roll < 40 {
        let n = 1 + rng.below(4);
        for _ in 0..n {
            let at = pick_offset(rng, len, 1);
            f[at] ^= 1 << rng.below(8);
        }
        format!("{n} bit flip(s)")
    } else if roll < 62 {
        let n = if rng.below(4) == 0 {
            2 + rng.below(3)
        } else {
            1
        };
        let mut d = Vec::new();
        for _ in 0..n {
            let width = if rng.below(2) == 0 { 4 } else { 8 };
            let at = pick_offset(rng, len, width);
            let mut old = [0u8; 8];
            old[..width].copy_from_slice(&f[at..at + width]);
            let (v, name) = word_value(rng, u64::from_ne_bytes(old));
            set_word(&mut f, at, width, v);
            d.push(format!("{width}-byte word at {at} := {name} ({v:#x})"));
        }
        d.join(", ")
    } else if roll < 68 {
        let at = pick_offset(rng, len, 8);
        let n = (8 + rng.below(512)).min(len - at);
        let v = [0u8, 0xff, 0x7f][rng.below(3)];
        let random = rng.below(4) == 0;
        for b in &mut f[at..at + n] {
            *b = if random { rng.next() as u8 } else { v };
        }
        format!(
            "{n} bytes at {at} := {}",
            if random {
                "random".to_string()
            } else {
                format!("{v:#x}")
            }
        )
    } else if roll < 78 {
        let width = if rng.below(2) == 0 { 4 } else { 8 };
        let at = rng.below(CHECKSUM_OFFSET / width) * width;
        let mut old = [0u8; 8];
        old[..width].copy_from_slice(&f[at..at + width]);
        let (v, name) = word_value(rng, u64::from_ne_bytes(old));
        set_word(&mut f, at, width, v);
        fix_checksum(&mut f);
        format!("header word at {at} := {name} ({v:#x}), checksum fixed")
    } else if roll < 87 {
        let to = match rng.below(4) {
            0 => rng.below(200),
            1 => rng.below(HEADER_SIZE as usize + 8 * 256),
            _ => rng.below(len),
        };
        f.truncate(to);
        format!("truncated to {to}")
    } else if roll < 93 {
        let n = 1 + rng.below(8192);
        let fill = rng.below(2) == 0;
        f.extend((0..n).map(|_| if fill { 0 } else { rng.next() as u8 }));
        format!(
            "extended by {n} {} bytes",
            if fill { "zero" } else { "random" }
        )
    } else {
        let other = (kind + 1 + rng.below(2)) % 3;
        let o = &bases[other];
        let h = HEADER_SIZE as usize;
        f[..h].copy_from_slice(&o[..h]);
        let resized = rng.below(2) == 0;
        if resized {
            f.resize(o.len(), 0);
        }
        format!(
            "the {} header over this body{}",
            KINDS[other],
            if resized { ", resized to its size" } else { "" }
        )
    };
    (f, what)
}

fn write_file(path: &Path, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    f.write_all(bytes).unwrap();
}

/// Per kind: files, Ok answers, Err answers, and the failures.
#[derive(Default)]
struct Tally {
    files: usize,
    ok: usize,
    err: usize,
    cli: usize,
    failures: Vec<String>,
    /// Errors by their first words (what validation caught).
    errors: std::collections::BTreeMap<String, usize>,
}

/// An error's class: its text up to the first number or quote.
fn class(e: &str) -> String {
    let cut = e
        .find(|c: char| c.is_ascii_digit() || c == '"' || c == '/' || c == '(')
        .unwrap_or(e.len());
    e[..cut]
        .chars()
        .take(60)
        .collect::<String>()
        .trim()
        .to_string()
}

/// Runs `shmsched stat` on `path` (bounded); `Some(problem)` if it hung,
/// died by a signal, or failed without a message.
fn cli_stat(path: &Path) -> Option<String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_shmsched"))
        .args(["stat", path.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            use std::os::unix::process::ExitStatusExt;
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err);
            return match (st.signal(), st.code()) {
                (Some(sig), _) => Some(format!("shmsched stat killed by signal {sig}")),
                (None, Some(0)) => None,
                (None, _) if err.contains("shmsched: error:") => None,
                (None, c) => Some(format!("shmsched stat exited {c:?} with {err:?}")),
            };
        }
        if t.elapsed() > Duration::from_secs(5) {
            let _ = child.kill();
            let _ = child.wait();
            return Some("shmsched stat hung".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn mutated_region_files_give_ok_or_a_clear_error() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    let per_kind: usize = std::env::var("SHMSCHED_FUZZ_FILES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let seed: u64 = std::env::var("SHMSCHED_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    let dir = PathBuf::from(format!("/dev/shm/shmsched-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keep = std::env::temp_dir().join(format!("shmsched-fuzz-failures-{seed}"));
    let bases = bases(&dir);
    let mut rng = Rng(seed);
    let mut tally: Vec<Tally> = KINDS.iter().map(|_| Tally::default()).collect();
    let start = Instant::now();
    let mut worker = Some(Worker::spawn());
    let mut in_worker = 0;
    let file = dir.join("f");
    for i in 0..per_kind * KINDS.len() {
        let kind = i % KINDS.len();
        let (bytes, what) = mutate(&mut rng, &bases, kind);
        write_file(&file, &bytes);
        let t = &mut tally[kind];
        t.files += 1;
        let mut w = match worker.take() {
            Some(w) if in_worker < PER_WORKER => w,
            Some(w) => {
                drop(w.stdin);
                let _ = w.child.wait_with_output();
                in_worker = 0;
                Worker::spawn()
            }
            None => {
                in_worker = 0;
                Worker::spawn()
            }
        };
        in_worker += 1;
        let block = u8::from(i / KINDS.len() % BLOCK_EVERY == 0);
        writeln!(w.stdin, "{} {block} {}", KINDS[kind], file.display()).unwrap();
        w.stdin.flush().unwrap();
        let mut failure = None;
        match w.line(PER_FILE) {
            Line::Got(l) if l == "ok" => {
                t.ok += 1;
                worker = Some(w);
            }
            Line::Got(l) if l.starts_with("err ") => {
                t.err += 1;
                *t.errors.entry(class(&l[4..])).or_default() += 1;
                worker = Some(w);
            }
            Line::Got(l) => {
                failure = Some(l);
                worker = Some(w);
            }
            Line::Timeout => {
                let sig = w.kill();
                failure = Some(format!(
                    "hang: no answer within {PER_FILE:?} (killed, {sig:?})"
                ));
            }
            Line::Eof => failure = Some(format!("worker {}", w.reap())),
        }
        if failure.is_none() && t.files % CLI_EVERY == 0 {
            t.cli += 1;
            failure = cli_stat(&file);
        }
        if let Some(f) = failure {
            std::fs::create_dir_all(&keep).unwrap();
            let kept = keep.join(format!("{}-{i}", KINDS[kind]));
            write_file(&kept, &bytes);
            t.failures.push(format!(
                "{}: {what}: {f} (file kept at {})",
                KINDS[kind],
                kept.display()
            ));
        }
    }
    if let Some(w) = worker {
        drop(w.stdin);
        let _ = w.child.wait_with_output();
    }
    let _ = std::fs::remove_dir_all(&dir);
    let secs = start.elapsed().as_secs_f64();
    // Written straight to fd 2 (not eprintln!), so that the figures show in
    // CI logs even when the test passes and its output is captured.
    let mut report = format!("fuzz seed {seed}: {secs:.1} s\n");
    for (k, t) in KINDS.iter().zip(&tally) {
        report += &format!(
            "  {k:<9} {} files: {} Ok, {} clear Err, {} failures; {} through shmsched stat\n",
            t.files,
            t.ok,
            t.err,
            t.failures.len(),
            t.cli
        );
        let mut top: Vec<_> = t.errors.iter().collect();
        top.sort_by(|a, b| b.1.cmp(a.1));
        for (c, n) in top.iter().take(8) {
            report += &format!("      {n:>5}  {c}\n");
        }
    }
    let failures: Vec<&String> = tally.iter().flat_map(|t| &t.failures).collect();
    for f in failures.iter().take(30) {
        report += &format!("FAILURE {f}\n");
    }
    let _ = std::io::stderr().write_all(report.as_bytes());
    assert!(
        failures.is_empty(),
        "{} mutated files broke the library (seed {seed})",
        failures.len()
    );
    for t in &tally {
        assert!(t.ok + t.err == t.files && t.files >= per_kind);
    }
}
