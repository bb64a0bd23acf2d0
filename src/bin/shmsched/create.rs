//! `create` and `set`: make a region and retune a live one from the shell
//! (what `ipcmk` and `tc` do), with the library's errors.

use std::process::ExitCode;

use clap::Args;
use shmsched::limiter::Limiter;
use shmsched::region::{ObjectKind, Region, RegionOptions};
use shmsched::scheduler::Scheduler;

use crate::{outln, pipe, CliError, CliResult, ErrorKind};

/// Arguments of `create`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("object").required(true).args(["max", "rate"])))]
pub struct CreateArgs {
    /// Region name (maps to /dev/shm/shmsched.NAME) or path.
    region: String,
    /// A scheduler: at most N units held at once across every process.
    #[arg(long, conflicts_with_all = ["rate", "capacity"])]
    max: Option<u32>,
    /// A limiter of this many bytes (tokens) per second: 10M, 1.5GiB, 64k.
    #[arg(long, value_parser = parse_rate)]
    rate: Option<u64>,
    /// The limiter's burst in bytes (default: 100 ms of rate).
    #[arg(long, value_parser = parse_bytes, requires = "rate")]
    capacity: Option<u64>,
    /// Permission bits of the region file (0600 default; 0660 gives the
    /// group access; world-writable modes are refused).
    #[arg(long, value_parser = parse_mode, default_value = "600")]
    mode: u32,
    /// Process-table entries (1..=4096).
    #[arg(long, default_value_t = 128)]
    process_slots: u32,
    /// Succeed if the region exists with these parameters (else the
    /// library's mismatch error); without it an existing region is an error.
    #[arg(long)]
    exist_ok: bool,
}

/// Arguments of `set`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).multiple(true).args(["ceiling", "rate", "capacity"])))]
pub struct SetArgs {
    /// Region name (maps to /dev/shm/shmsched.NAME) or path.
    region: String,
    /// A scheduler's ceiling for every process: N (at most the region's
    /// max), or `max` for the region's own max.
    #[arg(long, conflicts_with_all = ["rate", "capacity"])]
    ceiling: Option<String>,
    /// A limiter's rate in bytes (tokens) per second.
    #[arg(long, value_parser = parse_rate)]
    rate: Option<u64>,
    /// A limiter's burst in bytes.
    #[arg(long, value_parser = parse_bytes)]
    capacity: Option<u64>,
}

fn parse_rate(s: &str) -> Result<u64, String> {
    shmsched::pump::parse_rate(s).map_err(|e| e.to_string())
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    shmsched::pump::parse_bytes(s).map_err(|e| e.to_string())
}

fn parse_mode(s: &str) -> Result<u32, String> {
    let t = s.trim_start_matches("0o");
    u32::from_str_radix(t, 8).map_err(|_| format!("mode {s:?} is not an octal number (600, 0660)"))
}

/// `create`.
pub fn create(a: CreateArgs) -> CliResult {
    let what = format!("region {:?}", a.region);
    let lib = |e: shmsched::Error| CliError::lib(&what, &e);
    let opts = RegionOptions {
        mode: a.mode,
        process_slots: a.process_slots,
    };
    let region = if a.exist_ok {
        Region::open_or_create_with(&a.region, opts)
    } else {
        Region::create_with(&a.region, opts)
    }
    .map_err(|e| match &e {
        shmsched::Error::Io { source, .. } if source.kind() == std::io::ErrorKind::AlreadyExists => {
            CliError::new(
                ErrorKind::InUse,
                format!("{what} already exists (pass --exist-ok to accept it with the same parameters, or `shmsched rm {}`)", a.region),
            )
        }
        _ => lib(e),
    })?;
    // A region this call created and could not initialise is removed
    // again, so that a retry with a valid value works.
    let undo = |e: shmsched::Error| {
        if !a.exist_ok {
            let _ = Region::remove(&a.region);
        }
        lib(e)
    };
    if let Some(max) = a.max {
        let sched = Scheduler::shared(&region, max).map_err(undo)?;
        outln!("{}: scheduler, max {max}", a.region)?;
        let _ = sched.detach();
    } else if let Some(rate) = a.rate {
        let cap = a.capacity.unwrap_or_else(|| pipe::default_capacity(rate));
        let lim = Limiter::shared_with_capacity(&region, rate, cap).map_err(undo)?;
        outln!(
            "{}: limiter, {rate} bytes/s, capacity {cap} bytes",
            a.region
        )?;
        let _ = lim.detach();
    }
    Ok(ExitCode::SUCCESS)
}

/// `set`.
/// After `set`: a lease left by a dead agent no longer holds the region
/// (its deadline would lower the new level); a live agent's is kept, and
/// said so (its next renewal moves the level again).
fn forget_lease(
    region: &str,
    r: Result<shmsched::cluster::Released, shmsched::cluster::ClusterError>,
) {
    match r {
        Ok(rel) if rel.was_armed => {
            eprintln!("{region}: the lease a dead agent left is released");
        }
        Ok(_) => {}
        Err(e) => eprintln!("{region}: note: {e}; it will move the level again"),
    }
}

/// Opens an initialised region for a change: the region and its object's
/// kind (`what` names it in errors).
pub fn open_initialised(name: &str, what: &str) -> Result<(Region, ObjectKind), CliError> {
    let lib = |e: shmsched::Error| CliError::lib(what, &e);
    let region = Region::open(name).map_err(lib)?;
    let kind = region
        .info()
        .map_err(lib)?
        .ok_or_else(|| CliError::new(ErrorKind::BadRegion, format!("{what} is not initialised")))?
        .kind;
    Ok((region, kind))
}

pub fn set(a: SetArgs) -> CliResult {
    let what = format!("region {:?}", a.region);
    let lib = |e: shmsched::Error| CliError::lib(&what, &e);
    let (region, kind) = open_initialised(&a.region, &what)?;
    match (kind, &a.ceiling) {
        (ObjectKind::Scheduler, Some(c)) => {
            let sched = Scheduler::attach(&region).map_err(lib)?;
            let max = sched.concurrency().unwrap_or(0);
            let target = if c == "max" {
                max
            } else {
                c.trim().parse::<u32>().map_err(|_| {
                    CliError::new(
                        ErrorKind::InvalidInput,
                        format!("--ceiling {c:?} is not a number of units (0..={max}) or `max`"),
                    )
                })?
            };
            if target > max {
                return Err(CliError::new(
                    ErrorKind::InvalidInput,
                    format!("--ceiling {target} is above the region's max {max}"),
                ));
            }
            let before = sched.ceiling();
            // The dead agent's lease goes first: released after the change,
            // a process that found its deadline passed in between would
            // lower the new ceiling to the lease's safe level.
            forget_lease(&a.region, shmsched::cluster::release(&sched, false));
            let reached = sched.set_ceiling(target).map_err(lib)?;
            let held = sched.global_running();
            if reached {
                outln!("{}: ceiling {target} (was {before}; max {max})", a.region)?;
            } else {
                outln!(
                    "{}: ceiling {target} (was {before}; max {max}); {held} held now, \
                     releases go to the ceiling until it is reached",
                    a.region
                )?;
            }
            let _ = sched.detach();
            Ok(ExitCode::SUCCESS)
        }
        (ObjectKind::Limiter, None) => {
            let lim = Limiter::attach(&region).map_err(lib)?;
            // First, as for a ceiling (above).
            forget_lease(&a.region, shmsched::cluster::release(&lim, false));
            if let Some(r) = a.rate {
                lim.set_rate(r).map_err(lib)?;
            }
            if let Some(c) = a.capacity {
                lim.set_capacity(c).map_err(lib)?;
            }
            outln!(
                "{}: {} bytes/s, capacity {} bytes",
                a.region,
                lim.tokens_per_second(),
                lim.capacity()
            )?;
            let _ = lim.detach();
            Ok(ExitCode::SUCCESS)
        }
        (kind, _) => {
            let asked = if a.ceiling.is_some() {
                "--ceiling applies to a scheduler"
            } else {
                "--rate and --capacity apply to a limiter"
            };
            Err(CliError::new(
                ErrorKind::BadRegion,
                format!("{what} holds a {}: {asked}", kind.name()),
            ))
        }
    }
}
