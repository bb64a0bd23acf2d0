//! `run NAME [--max N] [--priority P] [-n UNITS] [--timeout D] -- CMD…`:
//! a command that holds units of a shared scheduler for its whole life.
//!
//! `run` is the holder: it takes the units, spawns the command (which the
//! kernel kills if `run` dies, so it never runs on outside the budget),
//! forwards the signals it is sent, waits, releases, and exits with the
//! command's status. Killed by `SIGKILL`, its units come back through the
//! region's dead-process reclaim.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use shmsched::Priority;

use crate::held::{self, Failed};

/// Arguments of `run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Scheduler region name (maps to /dev/shm/shmsched.NAME) or path.
    region: String,
    /// Create the region with this max when it does not exist; an existing
    /// region must have this max.
    #[arg(long)]
    max: Option<u32>,
    /// Priority to wait at: lowest, lower, low, normal, high, higher,
    /// highest or -3..=3.
    #[arg(long, short = 'p', default_value = "normal", value_parser = held::parse_priority)]
    priority: Priority,
    /// Units to hold (a weighted acquire: all at once or none).
    #[arg(short = 'n', long = "units", default_value_t = 1)]
    units: u32,
    /// Give up (exit 124) if the units are not free within this time
    /// (500ms, 2.5s, 10, 1m).
    #[arg(long, value_parser = held::parse_duration)]
    timeout: Option<Duration>,
    /// Say what it waits for even when stderr is not a terminal.
    #[arg(long, short = 'v')]
    verbose: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// `run`: exits with the command's status (see `docs/cli.md`).
pub fn run(a: RunArgs) -> ExitCode {
    held::report(go(a))
}

fn go(a: RunArgs) -> Result<ExitCode, Failed> {
    let sched = held::open_scheduler(&a.region, a.max)?;
    let permit = held::take(
        &sched, &a.region, "run", a.priority, a.units, a.timeout, a.verbose,
    )?;
    let child = held::spawn(held::command(&a.command, Vec::new()), &a.command[0])?;
    let code = held::wait(child);
    drop(permit);
    code
}
