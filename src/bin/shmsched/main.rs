//! `shmsched`: a thin command-line face over the shmsched library.
//!
//! - `demo`: a master and N worker processes sharing one concurrency budget
//!   through a region, with a progress line and a summary table; `--kill N`
//!   SIGKILLs workers mid-run and shows that nothing leaks.
//! - `stat REGION`, `watch REGION`: a live region's header and figures.
//! - `reap REGION`: returns dead processes' slots now.
//! - `fair replay LOG`: replays a fair-share call log (FAIR-SHARE.md).

mod demo;
mod fair;
mod rng;
mod stat;
mod worker;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// Share one concurrency budget across processes; look inside live regions.
#[derive(Debug, Parser)]
#[command(name = "shmsched", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a self-contained demo: a master and N worker processes share a
    /// cap through a fresh region.
    Demo(demo::DemoArgs),
    /// Print a live region: header, and for a scheduler its figures and
    /// processes.
    Stat(stat::StatArgs),
    /// Like `stat`, refreshed every second until Ctrl-C or `--count N`.
    Watch(stat::WatchArgs),
    /// Return the slots of dead processes in a scheduler region now.
    Reap(stat::ReapArgs),
    /// Fair-share tools.
    #[command(subcommand)]
    Fair(FairCommand),
    /// Internal: one demo worker (spawned by `demo`).
    #[command(hide = true)]
    DemoWorker(worker::WorkerArgs),
}

#[derive(Debug, Subcommand)]
enum FairCommand {
    /// Replay a JSON-lines call log (FAIR-SHARE.md, "Call logs"); prints one
    /// JSON line per call.
    Replay(ReplayArgs),
}

/// Arguments of `fair replay`.
#[derive(Debug, Args)]
struct ReplayArgs {
    /// The log file, or `-` for standard input.
    log: String,
}

/// An error for the user: a message, printed as `shmsched: error: …`.
#[derive(Debug)]
pub struct CliError(pub String);

impl From<shmsched::Error> for CliError {
    fn from(e: shmsched::Error) -> Self {
        CliError(e.to_string())
    }
}

impl From<String> for CliError {
    fn from(s: String) -> Self {
        CliError(s)
    }
}

/// The result of a subcommand: the process exit code, or an error.
pub type CliResult = Result<ExitCode, CliError>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Demo(a) => demo::run(a),
        Command::Stat(a) => stat::stat(a),
        Command::Watch(a) => stat::watch(a),
        Command::Reap(a) => stat::reap(a),
        Command::Fair(FairCommand::Replay(a)) => fair::replay(&a.log),
        Command::DemoWorker(a) => worker::run(a),
    };
    match r {
        Ok(code) => code,
        Err(CliError(msg)) => {
            eprintln!("shmsched: error: {msg}");
            ExitCode::FAILURE
        }
    }
}
