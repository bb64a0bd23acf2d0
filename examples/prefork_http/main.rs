//! A prefork HTTP server whose worker processes share ONE concurrency
//! budget by priority, and the load test that drives it past saturation.
//!
//! ```text
//! cargo run --release --example prefork_http                     # serve until Ctrl-C
//! cargo run --release --example prefork_http -- --load --seconds 10
//! ```
//!
//! **The server.** A master binds one listening socket, creates the shared
//! state — an anonymous region (`Region::anonymous()`, a memfd) holding a
//! `Scheduler` with a cap of 4, or with `--gate sem` a POSIX semaphore in
//! anonymous shared memory — and forks 6 workers (`--workers`). Each worker
//! accepts on the shared socket (pausing 1 ms after each accept, so that a
//! burst of connects spreads over the workers; `--accept-pause-ms 0` leaves
//! it to the kernel, which often hands a whole burst to one worker) and
//! serves HTTP/1.1 keep-alive connections, a thread per connection, so one
//! worker holds several slots and has several requests waiting at once.
//! Requests are parsed with `httparse`.
//! `GET /high`, `/normal` and `/low` take a slot at priority `High`,
//! `Normal` and `Low` for a simulated 2 ms backend call (`--backend-ms`),
//! then answer; any other path is a 404 that takes no slot.
//!
//! Per request the worker records the wait from arrival (request fully
//! read) to slot granted. At the end (`--seconds`, SIGINT or SIGTERM) the
//! master closes the workers' stop pipe; each worker takes its samples,
//! then drains: no request enters the gate any more, its queued acquires
//! fail (`Scheduler::dispose`), and it waits (at most 5 s) until every
//! request in the gate has released its slot, before it sends its samples
//! to the master and exits. The master prints one JSON summary on stdout:
//! wait p50/p99/max per path and per worker, requests served, connections
//! per worker, and the highest running count observed (sampled every
//! 200 µs with `global_running()`, and counted by every request after its
//! grant). Requests still waiting at the stop count with their wait so far.
//!
//! Why drain: a worker that exits while its threads hold slots has them
//! reclaimed by the region (they are a dead process's), but those requests
//! had counted themselves in the shared running counter and never count
//! themselves out, so every later grant in a worker still running would
//! see the counter too high ("counted 6" under a cap of 4, with the
//! sampled count at 4). A worker that gives up draining says how many
//! requests it left in the gate (`exited_in_gate`), and the load test
//! fails on it.
//!
//! **The load test** (`--load`) runs the server with each gate in turn and
//! drives it with three `wrk` processes, one per path (`--conns` keep-alive
//! connections each, 16 by default), for `--seconds` per gate (10 by
//! default), then prints Markdown tables comparing both gates and checks
//! the acceptance points: the cap held, every worker served, no `/high`
//! request waited over 1 s, no request waited half the run, throughput at
//! least 0.9× the semaphore's. It exits with status 1 if one fails. `wrk`
//! comes from the distribution (`apt-get install -y wrk`).
//!
//! `tests/prefork_http.rs` runs the same load test for a few seconds per
//! gate under `cargo test` (skipped, saying so, without `wrk`).
//!
//! Files: `server.rs` (master, workers, HTTP, the summary), `load.rs` (wrk,
//! tables, checks), this one (command line).

pub mod load;
pub mod server;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------

/// Which gate the workers take before the backend call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Gate {
    /// One `shmsched::Scheduler` in an anonymous region, by priority.
    Shmsched,
    /// A POSIX semaphore (`sem_init`, process-shared) in anonymous shared
    /// memory: no priorities.
    Sem,
}

impl Gate {
    /// The name used on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Gate::Shmsched => "shmsched",
            Gate::Sem => "sem",
        }
    }
}

/// A prefork HTTP server sharing one concurrency budget by priority, and
/// its load test.
#[derive(Debug, Clone, Parser)]
#[command(name = "prefork_http")]
pub struct Args {
    /// Run the load test (both gates, wrk, comparison tables) instead of
    /// serving.
    #[arg(long)]
    pub load: bool,
    /// Serve in machine mode (JSON lines only), as the load test starts it.
    #[arg(long, hide = true)]
    pub serve: bool,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Worker processes.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub workers: u32,
    /// The shared cap: backend calls in flight at once, across all workers.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub cap: u32,
    /// The gate (the load test runs both).
    #[arg(long, value_enum, default_value_t = Gate::Shmsched)]
    pub gate: Gate,
    /// Duration of the simulated backend call, in milliseconds.
    #[arg(long, default_value_t = 2.0)]
    pub backend_ms: f64,
    /// A worker's pause after each accepted connection, in milliseconds, so
    /// that a burst of connects spreads over the workers (0: each goes to
    /// whichever worker the kernel wakes, often one worker takes a whole
    /// burst).
    #[arg(long, default_value_t = 1.0)]
    pub accept_pause_ms: f64,
    /// Serving: stop after this many seconds (default: at SIGINT or
    /// SIGTERM). Load test: seconds of load per gate (default 10).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Load test: keep-alive connections of each wrk process.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub conns: u32,
    /// Load test: the paths wrk requests, one wrk process per entry.
    #[arg(long, value_delimiter = ',', default_value = "/high,/normal,/low")]
    pub paths: Vec<String>,
    /// Load test: also write both runs (server summaries, wrk figures,
    /// checks) as one JSON object to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Entry point shared by the example and `tests/prefork_http.rs`.
pub fn main_with(args: Vec<String>) -> ExitCode {
    let a = match Args::try_parse_from(args) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    if let Err(e) = validate(&a) {
        eprintln!("prefork_http: {e}");
        return ExitCode::from(2);
    }
    let r = if a.load {
        load::main(&a)
    } else {
        server::serve(&a).map(|_| true)
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("prefork_http: {e}");
            ExitCode::FAILURE
        }
    }
}

#[allow(dead_code)] // tests/prefork_http.rs includes this file without its main
fn main() -> ExitCode {
    main_with(std::env::args().collect())
}

fn validate(a: &Args) -> Result<(), String> {
    if a.paths.is_empty() || a.paths.len() > 16 {
        return Err("--paths takes 1 to 16 paths".into());
    }
    if let Some(p) = a
        .paths
        .iter()
        .find(|p| !server::PATHS.contains(&p.as_str()))
    {
        return Err(format!(
            "--paths: {p:?} is not served (expected {})",
            server::PATHS.join(", ")
        ));
    }
    if !(a.backend_ms.is_finite() && (0.0..=10_000.0).contains(&a.backend_ms)) {
        return Err(format!(
            "--backend-ms {} out of range 0..=10000",
            a.backend_ms
        ));
    }
    if !(a.accept_pause_ms.is_finite() && (0.0..=1000.0).contains(&a.accept_pause_ms)) {
        return Err(format!(
            "--accept-pause-ms {} out of range 0..=1000",
            a.accept_pause_ms
        ));
    }
    if let Some(s) = a.seconds {
        if !(s.is_finite() && s > 0.0 && s <= 86_400.0) {
            return Err(format!("--seconds {s} out of range (0, 86400]"));
        }
    }
    Ok(())
}
