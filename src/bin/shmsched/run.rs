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

use clap::Args;

use crate::held::{self, Failed, HoldArgs};

/// Arguments of `run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    hold: HoldArgs,
    /// Units to hold (a weighted acquire: all at once or none).
    #[arg(short = 'n', long = "units", default_value_t = 1)]
    units: u32,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// `run`: exits with the command's status (see `docs/cli.md`).
pub fn run(a: RunArgs) -> ExitCode {
    held::report(go(a))
}

fn go(a: RunArgs) -> Result<ExitCode, Failed> {
    let sched = held::open_scheduler(&a.hold.region, a.hold.max)?;
    let permit = held::take(&sched, &a.hold, "run", a.units)?;
    let child = held::spawn(held::command(&a.command, Vec::new()), &a.command[0])?;
    let code = held::wait(child);
    drop(permit);
    code
}
