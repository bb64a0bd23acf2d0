//! The hidden `demo-worker` subcommand: one worker process of the demo.
//!
//! It attaches to the master's region, then loops until the deadline (or
//! until its stdin closes, which is how the master stops it early, and how
//! it notices that the master died): pick a priority from the demo mix,
//! acquire, simulate a file read (sleep 2–20 ms), release. After each task
//! it writes one JSON line to stdout, so the master loses at most the task
//! in flight when it SIGKILLs the worker:
//!
//! - `{"ev":"ready","pid":P}` once attached,
//! - `{"ev":"task","p":I,"wait_us":W,"running":R}` per task (`I` is the
//!   priority's stats index, `R` the global running count seen just after
//!   the slot was granted),
//! - `{"ev":"done","tasks":N}` after a clean exit from the region.

use std::io::{self, Read, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;
use shmsched::region::Region;
use shmsched::scheduler::Scheduler;
use shmsched::{Error, Priority};

use crate::rng::Rng;
use crate::{signals, CliError, CliResult};

/// The demo's priority mix, in percent: highest 5, high 20, normal 40,
/// low 25, lowest 10.
pub const MIX: [(Priority, u64); 5] = [
    (Priority::Highest, 5),
    (Priority::High, 20),
    (Priority::Normal, 40),
    (Priority::Low, 25),
    (Priority::Lowest, 10),
];

/// Arguments of the hidden `demo-worker` subcommand.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Path of the master's region.
    #[arg(long)]
    region: String,
    /// Worker number (for messages).
    #[arg(long)]
    id: u32,
    /// Seed of this worker's generator.
    #[arg(long)]
    seed: u64,
    /// Stop starting tasks at this wall-clock instant (ms since the Unix
    /// epoch), so that respawned workers share the master's deadline.
    #[arg(long)]
    until_ms: u64,
}

fn pick(rng: &mut Rng) -> Priority {
    let mut x = rng.below(100);
    for (p, pct) in MIX {
        if x < pct {
            return p;
        }
        x -= pct;
    }
    Priority::Normal
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Runs one worker.
pub fn run(a: WorkerArgs) -> CliResult {
    signals::ignore_interrupt();
    let fail = |e: Error| CliError::from(format!("demo worker {}: {e}", a.id));
    let region = Region::open(&a.region).map_err(fail)?;
    let sched = Scheduler::attach(&region).map_err(fail)?;

    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            let mut stdin = io::stdin();
            while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}
            stop.store(true, Ordering::SeqCst);
        });
    }
    let mut out = io::stdout().lock();
    let mut emit =
        |v: serde_json::Value| -> bool { writeln!(out, "{v}").and_then(|_| out.flush()).is_ok() };
    if !emit(json!({"ev": "ready", "pid": std::process::id()})) {
        stop.store(true, Ordering::SeqCst);
    }
    let mut rng = Rng::new(a.seed);
    let mut tasks = 0u64;
    let over = || stop.load(Ordering::SeqCst) || unix_ms() >= a.until_ms;
    'tasks: while !over() {
        let p = pick(&mut rng);
        let t0 = Instant::now();
        let permit = loop {
            match sched.acquire_timeout(p, Duration::from_millis(100)) {
                Ok(permit) => break permit,
                Err(Error::Timeout) if over() => break 'tasks,
                Err(Error::Timeout) => continue,
                Err(e) => return Err(fail(e)),
            }
        };
        let wait = t0.elapsed();
        let running = sched.global_running();
        // The simulated file read.
        std::thread::sleep(Duration::from_micros(2_000 + rng.below(18_001)));
        drop(permit);
        tasks += 1;
        let line = json!({"ev": "task", "p": p.index(), "wait_us": wait.as_micros() as u64, "running": running});
        if !emit(line) {
            break; // the master is gone
        }
    }
    sched.detach().map_err(fail)?;
    emit(json!({"ev": "done", "tasks": tasks}));
    Ok(ExitCode::SUCCESS)
}
