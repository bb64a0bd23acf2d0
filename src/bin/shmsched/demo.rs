//! `demo`: a master and N worker processes sharing one cap through a fresh
//! region, with a progress line and a summary table.
//!
//! The master creates a uniquely named region under `/dev/shm` (removed on
//! exit, on error and on Ctrl-C) and spawns its workers as
//! `shmsched demo-worker …` processes (spawned, not forked: the master is
//! multi-threaded). Workers stream one JSON line per finished task (see
//! [`crate::worker`]); reader threads fold them into a tally, so tasks of a
//! worker killed later are not lost. A sampler thread reads the global
//! running count every 100 µs for the highest value observed.
//!
//! With `--kill N`, at N random instants the master SIGKILLs a random
//! worker (preferring one that holds slots) and spawns a replacement. The
//! dead worker's slots come back through the library's reaping (waiters
//! reap when they find the budget full; the master reaps once more at the
//! end). After every worker has exited and a final reap, the global running
//! count must be 0: the table prints it as `leaked`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clap::Args;
use serde::{Deserialize, Serialize};
use shmsched::priority::LEVELS;
use shmsched::region::{Region, RegionOptions, MAX_PROCESS_SLOTS};
use shmsched::scheduler::{Scheduler, MAX_SHARED_SLOTS};

use crate::rng::{clock_seed, Rng};
use crate::worker::{unix_ms, MIX};
use crate::{outln, signals, CliError, CliResult};

/// Arguments of `demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Number of worker processes.
    #[arg(long, allow_negative_numbers = true, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=512))]
    workers: u32,
    /// The shared cap: at most this many simulated reads at once, across
    /// all workers.
    #[arg(long, allow_negative_numbers = true, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_SHARED_SLOTS)))]
    cap: u32,
    /// How long the workers run, in seconds (fractions allowed).
    #[arg(long, allow_negative_numbers = true, default_value_t = 10.0, value_parser = parse_seconds)]
    seconds: f64,
    /// SIGKILL this many random workers during the run (each is respawned).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    kill: u32,
    /// Seed for priorities, read times and kill choices (default: clock).
    #[arg(long)]
    seed: Option<u64>,
    /// Print the final table as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !v.is_finite() || v <= 0.0 || v > 86_400.0 {
        return Err(format!(
            "{s} seconds is out of range: expected more than 0 and at most 86400"
        ));
    }
    Ok(v)
}

/// One worker's JSON line (see [`crate::worker`]).
#[derive(Debug, Deserialize)]
struct Event {
    ev: String,
    #[serde(default)]
    p: usize,
    #[serde(default)]
    wait_us: u64,
    #[serde(default)]
    running: u32,
}

/// What the reader threads gather from the workers.
#[derive(Debug, Default)]
struct Tally {
    /// Wait times in µs, per priority index.
    waits: [Vec<u64>; LEVELS],
    /// Highest global running count a worker saw right after acquiring.
    max_seen_by_workers: u32,
    /// Workers that exited cleanly (sent `done`).
    clean_exits: u32,
    /// Lines that did not parse.
    bad_lines: u64,
}

impl Tally {
    fn completed(&self) -> usize {
        self.waits.iter().map(Vec::len).sum()
    }
}

struct Worker {
    id: u32,
    child: Child,
    stdin: Option<ChildStdin>,
    reader: Option<JoinHandle<()>>,
}

/// Removes the demo's region file when dropped (normal exit, error, Ctrl-C).
struct RegionFile(PathBuf);

impl Drop for RegionFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// One priority's row of the final table.
#[derive(Debug, Serialize)]
struct Row {
    priority: &'static str,
    completed: usize,
    wait_p50_ms: f64,
    wait_p99_ms: f64,
}

/// The final table.
#[derive(Debug, Serialize)]
struct Summary {
    workers: u32,
    cap: u32,
    seconds: f64,
    elapsed_s: f64,
    interrupted: bool,
    priorities: Vec<Row>,
    completed: usize,
    max_running_observed: u32,
    killed: u32,
    respawned: u32,
    reaped_processes: u64,
    slots_reclaimed: u64,
    slots_reclaimed_by_final_reap: u64,
    leaked: u32,
    leftover_processes: usize,
}

fn spawn_worker(
    exe: &std::path::Path,
    region: &str,
    id: u32,
    seed: u64,
    until_ms: u64,
    tally: &Arc<Mutex<Tally>>,
) -> Result<Worker, CliError> {
    let mut child = Command::new(exe)
        .args(["demo-worker", "--region", region])
        .args(["--id", &id.to_string(), "--seed", &seed.to_string()])
        .args(["--until-ms", &until_ms.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| {
            CliError::from(format!(
                "cannot spawn demo worker {id} ({}): {e}",
                exe.display()
            ))
        })?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let tally = tally.clone();
    let reader = stdout.map(|out| {
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let mut t = tally.lock().unwrap_or_else(|p| p.into_inner());
                match serde_json::from_str::<Event>(&line) {
                    Ok(e) if e.ev == "task" && e.p < LEVELS => {
                        t.waits[e.p].push(e.wait_us);
                        t.max_seen_by_workers = t.max_seen_by_workers.max(e.running);
                    }
                    Ok(e) if e.ev == "done" => t.clean_exits += 1,
                    Ok(e) if e.ev == "ready" => {}
                    _ => t.bad_lines += 1,
                }
            }
        })
    });
    Ok(Worker {
        id,
        child,
        stdin,
        reader,
    })
}

/// Waits for `w` to exit, SIGKILLing it after `grace`.
fn reap_child(w: &mut Worker, grace: Duration) {
    w.stdin = None;
    let end = Instant::now() + grace;
    loop {
        match w.child.try_wait() {
            Ok(Some(_)) | Err(_) => break,
            Ok(None) if Instant::now() >= end => {
                let _ = w.child.kill();
                let _ = w.child.wait();
                break;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    if let Some(r) = w.reader.take() {
        let _ = r.join();
    }
}

fn percentile_ms(sorted_us: &[u64], q: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted_us.len() as f64).ceil() as usize).clamp(1, sorted_us.len());
    (sorted_us[rank - 1] as f64 / 100.0).round() / 10.0
}

/// Runs the demo.
pub fn run(a: DemoArgs) -> CliResult {
    signals::install();
    let exe = std::env::current_exe().map_err(|e| {
        CliError::from(format!(
            "cannot find the shmsched executable to spawn workers: {e}"
        ))
    })?;
    let seed = a.seed.unwrap_or_else(clock_seed);
    let mut rng = Rng::new(seed);
    let path = format!(
        "/dev/shm/shmsched.demo-{}-{:08x}",
        std::process::id(),
        rng.next_u64() as u32
    );
    let slots = (a.workers.saturating_mul(2) + 16).min(MAX_PROCESS_SLOTS);
    let region = Region::create_with(
        &path,
        RegionOptions {
            process_slots: slots,
            ..RegionOptions::default()
        },
    )?;
    let _file = RegionFile(PathBuf::from(&path));
    let sched = Scheduler::shared(&region, a.cap)?;

    let tty = std::io::stderr().is_terminal();
    if !a.json {
        eprintln!(
            "shmsched demo: {} workers share cap {} for {:.1} s through {path} (each task a \
             simulated file read of 2-20 ms at a random priority){}",
            a.workers,
            a.cap,
            a.seconds,
            if a.kill > 0 {
                format!("; {} will be SIGKILLed and respawned", a.kill)
            } else {
                String::new()
            }
        );
    }

    let run_ms = (a.seconds * 1000.0).round() as u64;
    let started = Instant::now();
    let until_ms = unix_ms() + run_ms;
    let deadline = started + Duration::from_millis(run_ms);
    let tally = Arc::new(Mutex::new(Tally::default()));

    // The sampler: highest global running count observed by the master.
    let max_sampled = Arc::new(AtomicU32::new(0));
    let stop_sampler = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (s, max, stop) = (sched.clone(), max_sampled.clone(), stop_sampler.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                max.fetch_max(s.global_running(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(100));
            }
        })
    };

    let mut workers: Vec<Worker> = Vec::new();
    let mut spawn_err = None;
    for id in 0..a.workers {
        match spawn_worker(&exe, &path, id, rng.next_u64(), until_ms, &tally) {
            Ok(w) => workers.push(w),
            Err(e) => {
                spawn_err = Some(e);
                break;
            }
        }
    }

    // Kill instants, spread over the middle of the run.
    let mut kills: Vec<Duration> = (0..if spawn_err.is_some() { 0 } else { a.kill })
        .map(|_| Duration::from_secs_f64(a.seconds * (0.1 + 0.75 * rng.unit())))
        .collect();
    kills.sort();
    kills.reverse();
    let (mut killed, mut respawned) = (0u32, 0u32);
    let mut last_progress = Instant::now() - Duration::from_secs(10);
    let mut interrupted = None;

    while spawn_err.is_none() {
        let now = Instant::now();
        if let Some(sig) = signals::caught() {
            interrupted = Some(sig);
            break;
        }
        if now >= deadline {
            break;
        }
        while kills.last().is_some_and(|&k| started + k <= now) {
            kills.pop();
            // Prefer a worker that holds a slot right now.
            let holding: HashMap<i32, u32> = sched
                .processes()
                .unwrap_or_default()
                .into_iter()
                .map(|(p, held)| (p.pid, held))
                .collect();
            let busy: Vec<usize> = (0..workers.len())
                .filter(|&i| {
                    holding
                        .get(&(workers[i].child.id() as i32))
                        .is_some_and(|&h| h > 0)
                })
                .collect();
            let i = if busy.is_empty() {
                rng.below(workers.len() as u64) as usize
            } else {
                busy[rng.below(busy.len() as u64) as usize]
            };
            let w = &mut workers[i];
            let _ = w.child.kill(); // SIGKILL
            let _ = w.child.wait();
            if let Some(r) = w.reader.take() {
                let _ = r.join();
            }
            killed += 1;
            let id = w.id;
            match spawn_worker(&exe, &path, id, rng.next_u64(), until_ms, &tally) {
                Ok(nw) => {
                    workers[i] = nw;
                    respawned += 1;
                }
                Err(e) => {
                    spawn_err = Some(e);
                    break;
                }
            }
        }
        if now.duration_since(last_progress) >= Duration::from_millis(if tty { 250 } else { 1000 })
            && !a.json
        {
            last_progress = now;
            let completed = tally.lock().unwrap_or_else(|p| p.into_inner()).completed();
            let shared = sched.stats().shared.unwrap_or_default();
            let line = format!(
                "{:5.1}s  completed {completed:6}  running {}/{}  waiting {:3}  killed {killed}  reclaimed {}",
                started.elapsed().as_secs_f64(),
                shared.running,
                shared.max,
                shared.waiters.iter().sum::<u32>(),
                shared.reclaimed,
            );
            if tty {
                eprint!("\r{line}  ");
                let _ = std::io::stderr().flush();
            } else {
                eprintln!("{line}");
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if tty && !a.json {
        eprintln!();
    }

    // Stop: workers stop at the deadline by themselves; closing stdin stops
    // them early (Ctrl-C, error). Give them time to finish the task in hand.
    for w in &mut workers {
        w.stdin = None;
    }
    for w in &mut workers {
        reap_child(w, Duration::from_secs(5));
    }
    stop_sampler.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let elapsed = started.elapsed().as_secs_f64();

    let (_, reclaimed_final) = sched.reap()?;
    let shared = sched.stats().shared.unwrap_or_default();
    let leaked = sched.global_running();
    let me = sched.owner_id();
    let leftover = sched
        .processes()?
        .into_iter()
        .filter(|(p, _)| Some(p.owner) != me)
        .count();
    sched.detach()?;
    drop(region);
    if let Some(e) = spawn_err {
        return Err(e);
    }

    let t = tally.lock().unwrap_or_else(|p| p.into_inner());
    let mut rows = Vec::new();
    for (p, _) in MIX {
        let mut w = t.waits[p.index()].clone();
        w.sort_unstable();
        rows.push(Row {
            priority: p.name(),
            completed: w.len(),
            wait_p50_ms: percentile_ms(&w, 0.50),
            wait_p99_ms: percentile_ms(&w, 0.99),
        });
    }
    let summary = Summary {
        workers: a.workers,
        cap: a.cap,
        seconds: a.seconds,
        elapsed_s: (elapsed * 100.0).round() / 100.0,
        interrupted: interrupted.is_some(),
        completed: t.completed(),
        priorities: rows,
        max_running_observed: max_sampled
            .load(Ordering::Relaxed)
            .max(t.max_seen_by_workers),
        killed,
        respawned,
        reaped_processes: shared.reaped_processes,
        slots_reclaimed: shared.reclaimed,
        slots_reclaimed_by_final_reap: reclaimed_final,
        leaked,
        leftover_processes: leftover,
    };
    if t.bad_lines > 0 {
        eprintln!(
            "shmsched demo: {} malformed worker lines ignored",
            t.bad_lines
        );
    }
    drop(t);
    print_summary(&summary, a.json)?;
    let ok = summary.leaked == 0
        && summary.max_running_observed <= summary.cap
        && summary.leftover_processes == 0;
    Ok(if let Some(sig) = interrupted {
        ExitCode::from(signals::exit_status(sig))
    } else if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn print_summary(s: &Summary, json: bool) -> Result<(), CliError> {
    if json {
        let text = serde_json::to_string(s)
            .map_err(|e| CliError::from(format!("encoding the summary: {e}")))?;
        outln!("{text}")?;
        return Ok(());
    }
    outln!()?;
    if s.interrupted {
        outln!("interrupted after {:.1} s", s.elapsed_s)?;
    }
    outln!(
        "{:<10} {:>10} {:>11} {:>11}",
        "priority",
        "completed",
        "wait p50",
        "wait p99"
    )?;
    for r in &s.priorities {
        outln!(
            "{:<10} {:>10} {:>8.1} ms {:>8.1} ms",
            r.priority,
            r.completed,
            r.wait_p50_ms,
            r.wait_p99_ms
        )?;
    }
    outln!("{:<10} {:>10}", "total", s.completed)?;
    outln!()?;
    let verdict = if s.max_running_observed <= s.cap {
        "never above the cap"
    } else {
        "ABOVE THE CAP"
    };
    outln!(
        "max running observed: {} (cap {}): {verdict}",
        s.max_running_observed,
        s.cap
    )?;
    if s.killed > 0 {
        outln!(
            "workers SIGKILLed: {} (respawned {}); their finished tasks are counted above (streamed per task)",
            s.killed, s.respawned
        )?;
    }
    outln!(
        "dead processes reaped: {}, slots reclaimed: {} ({} by waiting workers as they ran, {} by the final reap)",
        s.reaped_processes,
        s.slots_reclaimed,
        s.slots_reclaimed - s.slots_reclaimed_by_final_reap.min(s.slots_reclaimed),
        s.slots_reclaimed_by_final_reap
    )?;
    if s.reaped_processes < u64::from(s.killed) {
        outln!(
            "  ({} of the killed workers died before they joined the region: nothing to reap; a \
             worker killed between tasks holds no slot, so fewer slots than kills come back)",
            u64::from(s.killed) - s.reaped_processes
        )?;
    }
    outln!(
        "leaked: {} (slots held after every worker exited and a final reap; process entries left: {})",
        s.leaked, s.leftover_processes
    )?;
    Ok(())
}
