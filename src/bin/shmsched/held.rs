//! What `run` and `jobserver` share: opening the scheduler, taking units
//! with a one-time note while waiting, running the command as the holder
//! of those units, and their exit codes.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::process::{Child, Command, ExitCode};
use std::time::Duration;

use clap::Args;
use shmsched::region::Region;
use shmsched::scheduler::{OwnedPermit, Scheduler};
use shmsched::Priority;

use crate::{CliError, ErrorKind};

/// Exit status when the units did not come within `--timeout` (as
/// `timeout(1)`).
pub const TIMED_OUT: u8 = 124;
/// Exit status for an error of shmsched itself (bad or missing region, a
/// mismatch, a bad argument), as `env`, `nice` and `timeout` use it.
pub const OWN_ERROR: u8 = 125;
/// The command was found but could not be executed.
pub const CANNOT_EXECUTE: u8 = 126;
/// The command was not found.
pub const NOT_FOUND: u8 = 127;

/// The flags `run` and `jobserver` share: where the units come from, at
/// which priority, for how long to wait.
#[derive(Debug, Args)]
pub struct HoldArgs {
    /// Scheduler region name (maps to /dev/shm/shmsched.NAME) or path.
    pub region: String,
    /// Create the region with this max when it does not exist; an existing
    /// region must have this max.
    #[arg(long)]
    pub max: Option<u32>,
    /// Priority to wait at: lowest, lower, low, normal, high, higher,
    /// highest or -3..=3.
    #[arg(long, short = 'p', default_value = "normal", value_parser = parse_priority)]
    pub priority: Priority,
    /// Give up (exit 124) if the (first) units are not free within this
    /// time (500ms, 2.5s, 10, 1m).
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Say what it waits for even when stderr is not a terminal (`jobserver`:
    /// and print its counts when the build ends).
    #[arg(long, short = 'v')]
    pub verbose: bool,
}

/// A failure of `run` or `jobserver` before the command ran: its message
/// and its exit status.
#[derive(Debug)]
pub struct Failed {
    /// Printed as `shmsched: error: …`.
    pub msg: String,
    /// [`TIMED_OUT`], [`OWN_ERROR`], [`CANNOT_EXECUTE`] or [`NOT_FOUND`].
    pub code: u8,
}

impl From<CliError> for Failed {
    fn from(e: CliError) -> Failed {
        Failed {
            msg: e.msg,
            code: OWN_ERROR,
        }
    }
}

/// Prints the failure and returns its status.
pub fn report(r: Result<ExitCode, Failed>) -> ExitCode {
    r.unwrap_or_else(|f| {
        eprintln!("shmsched: error: {}", f.msg);
        ExitCode::from(f.code)
    })
}

/// A library error about region `name`, with `hint` (what to do) when the
/// region does not exist.
pub fn region_error(name: &str, e: &shmsched::Error, hint: &str) -> CliError {
    let what = format!("region {name:?}");
    let c = CliError::lib(&what, e);
    if c.kind == ErrorKind::NotFound {
        CliError::new(
            ErrorKind::NotFound,
            format!("{what}: no such region; {hint}"),
        )
    } else {
        c
    }
}

/// The scheduler of region `name`: created with `max` when it does not
/// exist (an existing one must have that max, else the library's
/// mismatch), joined whatever its max without `max`.
pub fn open_scheduler(name: &str, max: Option<u32>) -> Result<Scheduler, CliError> {
    let r = match max {
        Some(m) => Region::open_or_create(name).and_then(|region| Scheduler::shared(&region, m)),
        None => Region::open(name).and_then(|region| Scheduler::attach(&region)),
    };
    r.map_err(|e| {
        region_error(
            name,
            &e,
            &format!("create it with `shmsched create {name} --max N` or pass --max N"),
        )
    })
}

/// Takes `n` units at `priority`, waiting at most `timeout`. If they are
/// not free at once, says once on stderr what it waits for (when stderr is
/// a terminal, or with `verbose`).
pub fn take(sched: &Scheduler, a: &HoldArgs, who: &str, n: u32) -> Result<OwnedPermit, Failed> {
    let (name, priority, timeout, verbose) = (&a.region, a.priority, a.timeout, a.verbose);
    let own = |e: shmsched::Error| Failed {
        msg: format!("{who}: region {name:?}: {e}"),
        code: OWN_ERROR,
    };
    if let Some(p) = sched.try_acquire_many(priority, n) {
        return Ok(p.into_owned());
    }
    // A request that can never be met is the library's error at once, with
    // no note about waiting.
    let possible = n > 0 && sched.concurrency().is_none_or(|m| n <= m);
    if possible && (verbose || std::io::stderr().is_terminal()) {
        let s = sched.stats();
        let (held, ceiling, waiting) = s.shared.as_ref().map_or((0, 0, 0), |x| {
            (x.running, x.ceiling, x.waiters.iter().sum::<u32>())
        });
        let units = if n == 1 {
            "1 unit".to_string()
        } else {
            format!("{n} units")
        };
        eprintln!(
            "shmsched {who}: waiting for {units} of {name:?} at priority {priority} \
             ({held}/{ceiling} held, {waiting} waiting){}",
            timeout.map_or(String::new(), |t| format!(", for at most {t:?}"))
        );
    }
    let r = match timeout {
        Some(t) => sched.acquire_many_timeout(priority, n, t),
        None => sched.acquire_many(priority, n),
    };
    match r {
        Ok(p) => Ok(p.into_owned()),
        Err(shmsched::Error::Timeout) => Err(Failed {
            msg: format!(
                "{who}: timed out after {:?} waiting for {n} unit(s) of {name:?}",
                timeout.unwrap_or_default()
            ),
            code: TIMED_OUT,
        }),
        Err(e) => Err(own(e)),
    }
}

/// The command `argv` as a [`Command`] that dies with this process and
/// inherits `inherit` (see `shmsched::child`).
pub fn command(argv: &[OsString], inherit: Vec<i32>) -> Command {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    shmsched::child::bind_to_holder(&mut cmd, inherit);
    cmd
}

/// Spawns `cmd` with the forwarded signals blocked until the child is
/// named (so none is lost or acts on this process in between).
pub fn spawn(mut cmd: Command, argv0: &OsString) -> Result<Child, Failed> {
    let fw = shmsched::child::Forwarder::install().map_err(|e| Failed {
        msg: format!("installing signal handlers: {e}"),
        code: OWN_ERROR,
    })?;
    match cmd.spawn() {
        Ok(child) => {
            fw.target(child.id());
            Ok(child)
        }
        Err(e) => {
            shmsched::child::unblock_signals();
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => NOT_FOUND,
                _ => CANNOT_EXECUTE,
            };
            Err(Failed {
                msg: format!("{}: {e}", argv0.to_string_lossy()),
                code,
            })
        }
    }
}

/// Waits for the child and returns the status to exit with.
pub fn wait(mut child: Child) -> Result<ExitCode, Failed> {
    let st = child.wait().map_err(|e| Failed {
        msg: format!("waiting for the command: {e}"),
        code: OWN_ERROR,
    })?;
    Ok(ExitCode::from(shmsched::child::exit_code(st)))
}

/// Parses a duration: a number with a unit `ms`, `s`, `m` or `h` (`s`
/// when there is none): `500ms`, `2.5s`, `10`, `1m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let x: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (examples: 500ms, 2.5s, 10, 1m)"))?;
    let secs = match unit.trim() {
        "ms" => x / 1000.0,
        "" | "s" => x,
        "m" | "min" => x * 60.0,
        "h" => x * 3600.0,
        u => return Err(format!("{s:?}: unknown unit {u:?} (use ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{s:?} is out of range"))
}

/// Parses a priority for clap.
pub fn parse_priority(s: &str) -> Result<Priority, String> {
    shmsched::priority::parse_priority(s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2.5s").unwrap(), Duration::from_millis(2500));
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert!(parse_duration("soon").unwrap_err().contains("soon"));
        assert!(parse_duration("3 days").is_err());
        assert!(parse_duration("-1").is_err());
    }
}
