//! `jobserver NAME [--priority P] [-j MAX] -- make|cargo|ninja …`: a
//! private GNU make jobserver for one build tree, every token backed by a
//! slot of the region's shared scheduler (`shmsched::jobserver`).
//!
//! The bridge takes the build's implicit slot first (waiting like `run`),
//! makes the FIFO, sets `MAKEFLAGS` and `CARGO_MAKEFLAGS` (the bridge's
//! `--jobserver-auth` word last), spawns the build as its holder (killed
//! if the bridge dies), serves tokens until the build exits, then returns
//! every slot and exits with the build's status.

use clap::{Args, ValueEnum};
use shmsched::jobserver::{Auth, Bridge};
use std::ffi::{OsStr, OsString};
use std::os::fd::AsFd;
use std::process::ExitCode;

use crate::held::{self, Failed, HoldArgs, OWN_ERROR};

/// Which `--jobserver-auth` form to give the build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AuthArg {
    /// `fifo:PATH` for ninja and GNU make 4.4 or later, `R,W` for the rest.
    Auto,
    /// Inherited descriptors `R,W` (make 4.3, cargo).
    Fds,
    /// A named FIFO `fifo:PATH` (make 4.4, ninja 1.13).
    Fifo,
}

/// Arguments of `jobserver`.
#[derive(Debug, Args)]
pub struct JobserverArgs {
    #[command(flatten)]
    hold: HoldArgs,
    /// Most jobs of this build at once, the implicit one included (default:
    /// a `-jN` given to make or ninja, which is taken off their command
    /// line, else the region's ceiling).
    #[arg(short = 'j', long = "jobs")]
    jobs: Option<u32>,
    /// The `--jobserver-auth` form.
    #[arg(long, value_enum, default_value = "auto")]
    auth: AuthArg,
    /// The build command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// `jobserver`: exits with the build's status (see `docs/cli.md`).
pub fn run(a: JobserverArgs) -> ExitCode {
    held::report(go(a))
}

fn tool_name(argv0: &OsStr) -> String {
    std::path::Path::new(argv0)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn is_make(tool: &str) -> bool {
    tool == "make" || tool == "gmake" || tool.ends_with("-make")
}

/// GNU make's version as (major, minor), from `make --version`.
fn make_version(argv0: &OsStr) -> Option<(u32, u32)> {
    let out = std::process::Command::new(argv0)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text.lines().next()?.strip_prefix("GNU Make ")?;
    let mut it = v.trim().split('.');
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// Takes a `-jN`, `-j N`, `--jobs=N` or `--jobs N` out of make's or
/// ninja's arguments (given on their command line, make becomes its own
/// jobserver and ninja ignores the jobserver: both would leave the
/// budget): `Some(Some(n))` for a number, `Some(None)` for a bare `-j`.
fn take_jobs(args: &mut Vec<OsString>) -> Option<Option<u32>> {
    let mut found = None;
    let mut i = 1;
    while i < args.len() {
        let a = args[i].to_string_lossy().into_owned();
        if a == "--" {
            break;
        }
        let (num, width) = if let Some(n) = a.strip_prefix("--jobs=") {
            (Some(n.to_string()), 1)
        } else if a == "--jobs" || a == "-j" {
            match args.get(i + 1).map(|n| n.to_string_lossy().into_owned()) {
                Some(n) if n.parse::<u32>().is_ok() => (Some(n), 2),
                _ => (None, 1),
            }
        } else if let Some(n) = a.strip_prefix("-j").filter(|n| n.parse::<u32>().is_ok()) {
            (Some(n.to_string()), 1)
        } else {
            i += 1;
            continue;
        };
        found = Some(num.and_then(|n| n.parse().ok()));
        args.drain(i..i + width);
    }
    found
}

fn go(mut a: JobserverArgs) -> Result<ExitCode, Failed> {
    let tool = tool_name(&a.command[0]);
    let mut jobs = a.jobs;
    if is_make(&tool) || tool == "ninja" {
        if let Some(Some(n)) = take_jobs(&mut a.command) {
            jobs = jobs.or(Some(n));
        }
    }
    let auth = match a.auth {
        AuthArg::Fds => Auth::Fds,
        AuthArg::Fifo => Auth::Fifo,
        AuthArg::Auto if tool == "ninja" => Auth::Fifo,
        AuthArg::Auto if is_make(&tool) && make_version(&a.command[0]) >= Some((4, 4)) => {
            Auth::Fifo
        }
        AuthArg::Auto => Auth::Fds,
    };
    let sched = held::open_scheduler(&a.hold.region, a.hold.max)?;
    let jobs = jobs.unwrap_or_else(|| sched.ceiling()).max(1);
    let own = |e: &dyn std::fmt::Display| Failed {
        msg: format!("jobserver: region {:?}: {e}", a.hold.region),
        code: OWN_ERROR,
    };
    let implicit = held::take(&sched, &a.hold, "jobserver", 1)?;
    let mut bridge =
        Bridge::new(&sched, implicit, jobs, &std::env::temp_dir()).map_err(|e| own(&e))?;
    let flags = bridge.makeflags(std::env::var("MAKEFLAGS").ok().as_deref(), auth);
    let inherit = match auth {
        Auth::Fds => {
            bridge.unlink_fifo();
            let (r, w) = bridge.client_fds();
            vec![r, w]
        }
        Auth::Fifo => Vec::new(),
    };
    let mut cmd = held::command(&a.command, inherit);
    cmd.env("MAKEFLAGS", &flags)
        .env("CARGO_MAKEFLAGS", &flags)
        .env_remove("MFLAGS");
    let child = held::spawn(cmd, &a.command[0])?;
    let done = shmsched::child::exit_fd(child.id()).map_err(|e| own(&e))?;
    let served = bridge.serve_until(done.as_fd());
    let code = held::wait(child);
    let stats = bridge.stats();
    bridge.release_all();
    if a.hold.verbose {
        eprintln!(
            "shmsched jobserver: {} jobs at most; {} tokens written, {} returned to the region, \
             {} slots held at most; {} unread at the end",
            jobs,
            stats.written,
            stats.returned,
            stats.peak + 1,
            stats.in_pipe
        );
    }
    served.map_err(|e| own(&e))?;
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn make_jobs_are_taken_out() {
        let mut a = args(&["make", "-j8", "all"]);
        assert_eq!(take_jobs(&mut a), Some(Some(8)));
        assert_eq!(a, args(&["make", "all"]));
        let mut a = args(&["make", "-j", "3", "-k"]);
        assert_eq!(take_jobs(&mut a), Some(Some(3)));
        assert_eq!(a, args(&["make", "-k"]));
        let mut a = args(&["make", "--jobs=5"]);
        assert_eq!(take_jobs(&mut a), Some(Some(5)));
        let mut a = args(&["make", "-j", "all"]);
        assert_eq!(take_jobs(&mut a), Some(None));
        assert_eq!(a, args(&["make", "all"]));
        let mut a = args(&["make", "-C", "dir"]);
        assert_eq!(take_jobs(&mut a), None);
    }
}
