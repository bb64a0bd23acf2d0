//! `shmsched`: a thin command-line face over the shmsched library.
//!
//! - `demo`: a master and N worker processes sharing one concurrency budget
//!   through a region, with a progress line and a summary table; `--kill N`
//!   SIGKILLs workers mid-run and shows that nothing leaks.
//! - `ls [DIR]`, `rm NAME…`: the regions on this host, and their removal.
//! - `stat REGION`, `watch REGION`: a live region's header and figures,
//!   read-only (no process-table entry, read permission is enough);
//!   `stat --prometheus` and `serve` expose them as Prometheus metrics.
//! - `reap REGION`: returns dead processes' slots now (needs write access).
//! - `run REGION -- CMD`: a command holding units for its whole life.
//! - `pipe REGION`: stdin to stdout under a shared byte rate.
//! - `jobserver REGION -- BUILD`: a make jobserver backed by shared slots.
//! - `create REGION`, `set REGION`: make a region, retune a live one.
//! - `fair replay LOG`: replays a fair-share call log (`docs/fair-share.md`).
//! - `cluster agent REGION`, `cluster status`: a region's share of a
//!   cluster-wide budget leased from Redis, and the budget as Redis holds it.
//!
//! Exit codes: 0 success, 1 an error (printed as `shmsched: error: …`, or
//! as a JSON object with `--json`), 2 a usage error, 128 + N when stopped
//! by signal N where that cuts a run short (`demo`: 130 for SIGINT, 143 for
//! SIGTERM), 141 when standard output is a closed pipe (as a program killed
//! by SIGPIPE, but quietly). `run` and `jobserver` exit with their
//! command's status, and 124 (timed out waiting), 125 (their own error),
//! 126 (command not executable), 127 (command not found).

mod cluster;
mod create;
mod demo;
mod fair;
mod held;
mod jobserver;
mod layout;
mod ls;
mod metrics;
mod out;
mod pipe;
mod rng;
mod run;
mod serve;
mod signals;
mod stat;
mod worker;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// Share one concurrency budget across processes; look inside live regions.
#[derive(Debug, Parser)]
#[command(name = "shmsched", version = layout::version(), about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a self-contained demo: a master and N worker processes share a
    /// cap through a fresh region.
    Demo(demo::DemoArgs),
    /// List the regions in /dev/shm (or in DIR): kind, live processes,
    /// usage, mode and owner.
    Ls(ls::LsArgs),
    /// Remove regions; refuses while live processes are attached unless
    /// --force.
    Rm(ls::RmArgs),
    /// Print a region: header, and its object's figures and processes.
    /// Read-only: needs read permission only and takes no process entry.
    Stat(stat::StatArgs),
    /// Like `stat`, refreshed every second until Ctrl-C or `--count N`;
    /// redraws in place on a terminal, prints plain lines when piped.
    Watch(stat::WatchArgs),
    /// Serve the figures of regions as Prometheus metrics over HTTP
    /// (`/metrics`).
    Serve(serve::ServeArgs),
    /// Return the slots (or leases) of dead processes now. Needs write
    /// access to the region.
    Reap(stat::ReapArgs),
    /// Run a command holding units of a shared scheduler for its whole life;
    /// exits with its status.
    Run(run::RunArgs),
    /// Copy stdin to stdout under a shared byte rate (like `pv -L`, for
    /// every process on the budget).
    Pipe(pipe::PipeArgs),
    /// Serve a private make jobserver to a build (make, cargo, ninja), every
    /// token backed by a slot of a shared scheduler.
    Jobserver(jobserver::JobserverArgs),
    /// Create a region: a scheduler (--max N) or a limiter (--rate R).
    Create(create::CreateArgs),
    /// Retune a live region: a scheduler's --ceiling, a limiter's --rate or
    /// --capacity, for every process.
    Set(create::SetArgs),
    /// Fair-share tools.
    #[command(subcommand)]
    Fair(FairCommand),
    /// A cluster-wide budget leased from Redis.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Internal: one demo worker (spawned by `demo`).
    #[command(hide = true)]
    DemoWorker(worker::WorkerArgs),
}

impl Command {
    /// Whether errors should be printed as JSON.
    fn json(&self) -> bool {
        match self {
            Command::Stat(a) => a.json,
            Command::Watch(a) => a.json,
            Command::Reap(a) => a.json,
            Command::Ls(a) => a.json,
            Command::Demo(a) => a.json,
            Command::Cluster(ClusterCommand::Agent(a)) => a.json,
            Command::Cluster(ClusterCommand::Status(a)) => a.json,
            _ => false,
        }
    }
}

#[derive(Debug, Subcommand)]
enum FairCommand {
    /// Replay a JSON-lines call log (format: docs/fair-share.md, "Call
    /// logs"); prints one JSON line per call. Exits 1 if a line is not a
    /// valid call (malformed JSON, unknown op, missing field, no config
    /// line) or the log is empty; a call the ledger refuses as misuse is an
    /// answer, printed on its line.
    Replay(ReplayArgs),
}

#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// Lease this region's share of a cluster-wide budget from Redis and
    /// move the region to it (a shared scheduler's ceiling, a limiter's
    /// rate) until SIGINT or SIGTERM; prints a line per change. Run it in
    /// two processes for takeover (the second stands by).
    Agent(cluster::AgentArgs),
    /// Print a budget as Redis holds it: capacity, mode, live hosts with
    /// their grants.
    Status(cluster::StatusArgs),
    /// After an agent crashed: end its lease's hold on the region and move
    /// the region back to its own ceiling or rate (refused while a live
    /// agent holds it).
    Release(cluster::ReleaseArgs),
}

/// Arguments of `fair replay`.
#[derive(Debug, Args)]
struct ReplayArgs {
    /// The log file, or `-` for standard input.
    log: String,
}

/// What kind of failure an error is (the `kind` of a JSON error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The region (or file) does not exist.
    NotFound,
    /// The OS refused access.
    PermissionDenied,
    /// The file is not a valid region, or not of the kind asked for.
    BadRegion,
    /// Live processes are attached (`rm` without `--force`).
    InUse,
    /// An input (log, argument) is invalid.
    InvalidInput,
    /// Anything else.
    Other,
    /// Standard output is a closed pipe: exit quietly.
    BrokenPipe,
}

impl ErrorKind {
    fn name(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::BadRegion => "bad_region",
            ErrorKind::InUse => "in_use",
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::Other => "other",
            ErrorKind::BrokenPipe => "broken_pipe",
        }
    }
}

/// An error for the user: a message, printed as `shmsched: error: …`.
#[derive(Debug)]
pub struct CliError {
    /// The message, naming the value at fault.
    pub msg: String,
    /// Its kind.
    pub kind: ErrorKind,
}

impl CliError {
    /// An error of kind `kind`.
    pub fn new(kind: ErrorKind, msg: impl Into<String>) -> CliError {
        CliError {
            msg: msg.into(),
            kind,
        }
    }

    /// A library error about `what` (a region name), classified.
    pub fn lib(what: &str, e: &shmsched::Error) -> CliError {
        let kind = match e {
            shmsched::Error::Io { source, .. } => match source.kind() {
                std::io::ErrorKind::NotFound => ErrorKind::NotFound,
                std::io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
                _ => ErrorKind::Other,
            },
            shmsched::Error::BadRegion(_)
            | shmsched::Error::Mismatch(_)
            | shmsched::Error::WrongKind { .. }
            | shmsched::Error::VersionMismatch { .. } => ErrorKind::BadRegion,
            shmsched::Error::InvalidArgument(_) => ErrorKind::InvalidInput,
            _ => ErrorKind::Other,
        };
        CliError::new(kind, format!("{what}: {e}"))
    }
}

impl From<shmsched::Error> for CliError {
    fn from(e: shmsched::Error) -> Self {
        let mut c = CliError::lib("", &e);
        c.msg = e.to_string();
        c
    }
}

impl From<String> for CliError {
    fn from(s: String) -> Self {
        CliError::new(ErrorKind::Other, s)
    }
}

/// The result of a subcommand: the process exit code, or an error.
pub type CliResult = Result<ExitCode, CliError>;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // `run` and `jobserver` pass their command's status on, which
            // may be 2: their own usage errors are 125, as `env` does.
            let holder = matches!(
                std::env::args().nth(1).as_deref(),
                Some("run" | "jobserver")
            );
            if holder && e.use_stderr() {
                let _ = e.print();
                return ExitCode::from(held::OWN_ERROR);
            }
            e.exit();
        }
    };
    let json = cli.command.json();
    let r = match cli.command {
        Command::Demo(a) => demo::run(a),
        Command::Ls(a) => ls::ls(a),
        Command::Rm(a) => ls::rm(a),
        Command::Stat(a) => stat::stat(a),
        Command::Watch(a) => stat::watch(a),
        Command::Serve(a) => serve::serve(a),
        Command::Reap(a) => stat::reap(a),
        Command::Fair(FairCommand::Replay(a)) => fair::replay(&a.log),
        Command::Cluster(ClusterCommand::Agent(a)) => cluster::agent(a),
        Command::Cluster(ClusterCommand::Status(a)) => cluster::status(a),
        Command::Cluster(ClusterCommand::Release(a)) => cluster::release(a),
        Command::DemoWorker(a) => worker::run(a),
        Command::Run(a) => return run::run(a),
        Command::Jobserver(a) => return jobserver::run(a),
        Command::Pipe(a) => pipe::run(a),
        Command::Create(a) => create::create(a),
        Command::Set(a) => create::set(a),
    };
    match r {
        Ok(code) => code,
        Err(e) if e.kind == ErrorKind::BrokenPipe => out::broken_pipe_exit(),
        Err(e) => {
            if json {
                let v = serde_json::json!({"error": {"kind": e.kind.name(), "message": e.msg}});
                // Printed on stdout, where a JSON consumer reads; if that
                // fails too, stderr still gets the plain message.
                if out::line(&v.to_string()).is_ok() {
                    return ExitCode::FAILURE;
                }
            }
            eprintln!("shmsched: error: {}", e.msg);
            ExitCode::FAILURE
        }
    }
}
