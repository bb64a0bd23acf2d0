//! `ls` and `rm`: the regions on this host, and their removal.
//!
//! Both read regions through a read-only [`RegionView`], so listing takes
//! no process entry and works on regions this user may only read. A file
//! is a region if its header validates; anything else is shown as
//! `foreign` (not a shmsched region), `invalid` (a shmsched header this
//! build does not accept, for example a newer layout), `uninitialised` or
//! `unreadable`, and `rm` leaves foreign and invalid files alone unless
//! `--force`.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use serde::Serialize;
use shmsched::region::{resolve_path, ObjectKind, Probe, RegionView, NAME_PREFIX, SHM_DIR};

use crate::stat::count;
use crate::{out, outln, CliError, CliResult, ErrorKind};

/// Arguments of `ls`.
#[derive(Debug, Args)]
pub struct LsArgs {
    /// Directory to list (default /dev/shm, where only `shmsched.*` files
    /// are regions by name; in another directory every file is examined).
    dir: Option<PathBuf>,
    /// In /dev/shm, examine every file, not only `shmsched.*`.
    #[arg(long)]
    all: bool,
    /// Print one JSON array.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `rm`.
#[derive(Debug, Args)]
pub struct RmArgs {
    /// Region names (maps to /dev/shm/shmsched.NAME) or paths.
    #[arg(required = true)]
    regions: Vec<String>,
    /// Remove even with live processes attached (they keep using the
    /// removed region; new opens create a new one), and remove files that
    /// are not valid regions.
    #[arg(long)]
    force: bool,
}

/// One file as `ls` shows it.
#[derive(Debug, Serialize)]
pub struct Entry {
    /// The name to pass to other commands: `NAME` for
    /// `/dev/shm/shmsched.NAME`, else the path.
    pub name: String,
    /// The file.
    pub path: String,
    /// `scheduler`, `limiter`, `fair-share`, `uninitialised`, `foreign`,
    /// `invalid` or `unreadable`.
    pub kind: String,
    /// Live processes attached (regions only).
    pub live: Option<u32>,
    /// Entries of dead processes not reaped yet (regions only).
    pub dead: Option<u32>,
    /// `running/max` (scheduler), `RATE/s` (limiter), `N tenants`
    /// (fair-share).
    pub usage: Option<String>,
    /// Permission bits, octal.
    pub mode: String,
    /// The owner's user name (or uid).
    pub owner: String,
    /// Why a file is not a readable region.
    pub note: Option<String>,
    /// A cluster lease holds the region above its safe level now.
    pub lease_in_force: bool,
    /// Until when (Unix ms), while in force.
    pub lease_until_unix_ms: Option<u64>,
    /// The pid of the agent whose lease it is.
    pub lease_agent_pid: Option<u64>,
}

/// The user name of `uid` from /etc/passwd, else the number.
fn user_name(uid: u32) -> String {
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                let mut f = l.split(':');
                let name = f.next()?;
                let id = f.nth(1)?.parse::<u32>().ok()?;
                (id == uid).then(|| name.to_string())
            })
        })
        .unwrap_or_else(|| uid.to_string())
}

/// The name other commands accept for `path`.
pub fn display_name(path: &Path) -> String {
    if path.parent() == Some(Path::new(SHM_DIR)) {
        if let Some(n) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix(NAME_PREFIX))
        {
            if !n.is_empty() && resolve_path(n).ok().as_deref() == Some(path) {
                return n.to_string();
            }
        }
    }
    path.display().to_string()
}

/// The regular files `ls` examines in `dir` (default /dev/shm), sorted.
pub fn scan(dir: Option<&Path>, all: bool) -> Result<Vec<PathBuf>, CliError> {
    let (dir, only_prefixed) = match dir {
        Some(d) => (d.to_path_buf(), false),
        None => (PathBuf::from(SHM_DIR), !all),
    };
    let rd = std::fs::read_dir(&dir).map_err(|e| {
        let kind = match e.kind() {
            std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            std::io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            _ => ErrorKind::Other,
        };
        CliError::new(kind, format!("cannot list {}: {e}", dir.display()))
    })?;
    let mut files: Vec<PathBuf> = rd
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| !only_prefixed || e.file_name().to_string_lossy().starts_with(NAME_PREFIX))
        .map(|e| e.path())
        .collect();
    files.sort();
    Ok(files)
}

/// How a probe error is shown: a kind and a note.
fn classify(e: &shmsched::Error) -> (&'static str, String) {
    let note = e.to_string();
    let kind = match e {
        shmsched::Error::Io { source, .. }
            if source.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            "unreadable"
        }
        shmsched::Error::BadRegion(m) if m.contains("not a shmsched region") => "foreign",
        _ => "invalid",
    };
    (kind, note)
}

/// Examines one file.
pub fn entry(path: &Path) -> Entry {
    let meta = std::fs::metadata(path).ok();
    let mut e = Entry {
        name: display_name(path),
        path: path.display().to_string(),
        kind: String::new(),
        live: None,
        dead: None,
        usage: None,
        mode: meta
            .as_ref()
            .map_or_else(|| "?".into(), |m| format!("{:04o}", m.mode() & 0o7777)),
        owner: meta
            .as_ref()
            .map_or_else(|| "?".into(), |m| user_name(m.uid())),
        note: None,
        lease_in_force: false,
        lease_until_unix_ms: None,
        lease_agent_pid: None,
    };
    match RegionView::probe(path) {
        Ok(Probe::Uninitialised) => e.kind = "uninitialised".into(),
        Ok(Probe::Region(v)) if crate::layout::other_layout(&v.header()).is_some() => {
            let h = v.header();
            e.kind = h.kind.name().into();
            e.note = crate::layout::other_layout(&h);
        }
        Ok(Probe::Region(v)) => {
            let h = v.header();
            e.kind = h.kind.name().into();
            match v.processes() {
                Ok(p) => {
                    let live = p.iter().filter(|p| p.alive).count() as u32;
                    e.live = Some(live);
                    e.dead = Some(p.len() as u32 - live);
                }
                Err(err) => e.note = Some(err.to_string()),
            }
            e.usage = match h.kind {
                ObjectKind::Scheduler => v
                    .scheduler_stats()
                    .ok()
                    .map(|s| format!("{}/{}", s.running, s.max)),
                // The rate in force (set_rate changes it), not the one the
                // region was created with.
                ObjectKind::Limiter => v
                    .limiter_stats()
                    .ok()
                    .map(|s| format!("{}/s", s.tokens_per_second)),
                ObjectKind::FairShare => Some(count(h.params[2], "tenant", "tenants")),
            };
            if let Ok(Some(c)) = v.cluster() {
                if c.in_force {
                    e.lease_in_force = true;
                    e.lease_until_unix_ms = Some(c.in_force_until_unix_ms);
                    e.lease_agent_pid = c.armed_by_pid;
                }
            }
        }
        Err(err) => {
            let (kind, note) = classify(&err);
            e.kind = kind.into();
            e.note = Some(note);
        }
    }
    e
}

/// The NOTE of a region a lease ceiling holds.
fn lease_note(e: &Entry) -> String {
    if !e.lease_in_force {
        return String::new();
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let left = e.lease_until_unix_ms.unwrap_or(0).saturating_sub(now);
    match e.lease_agent_pid {
        Some(p) => format!("lease ceiling in force {left} ms more (agent pid {p})"),
        None => format!("lease ceiling in force {left} ms more"),
    }
}

/// `ls [DIR]`.
pub fn ls(a: LsArgs) -> CliResult {
    let entries: Vec<Entry> = scan(a.dir.as_deref(), a.all)?
        .iter()
        .map(|p| entry(p))
        .collect();
    if a.json {
        let text = serde_json::to_string(&entries)
            .map_err(|e| CliError::from(format!("encoding: {e}")))?;
        outln!("{text}")?;
        return Ok(ExitCode::SUCCESS);
    }
    if entries.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    let w = entries
        .iter()
        .map(|e| e.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut text = format!(
        "{:<w$}  {:<13} {:>5} {:>5}  {:<13} {:<5} {:<10} {}\n",
        "NAME", "KIND", "LIVE", "DEAD", "USAGE", "MODE", "OWNER", "NOTE"
    );
    let dash = |x: Option<u32>| x.map_or("-".to_string(), |n| n.to_string());
    for e in &entries {
        text.push_str(
            format!(
                "{:<w$}  {:<13} {:>5} {:>5}  {:<13} {:<5} {:<10} {}",
                e.name,
                e.kind,
                dash(e.live),
                dash(e.dead),
                e.usage.as_deref().unwrap_or("-"),
                e.mode,
                e.owner,
                e.note.clone().unwrap_or_else(|| lease_note(e))
            )
            .trim_end(),
        );
        text.push('\n');
    }
    out::raw(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// Removes one region (see [`RmArgs`]); `Ok(message)` when removed.
fn rm_one(name: &str, force: bool) -> Result<String, CliError> {
    let path = resolve_path(name).map_err(|e| CliError::lib(&format!("region {name:?}"), &e))?;
    match RegionView::probe(&path) {
        Ok(Probe::Region(v)) => {
            let live: Vec<String> = v
                .processes()
                .map_err(|e| CliError::lib(&format!("region {name:?}"), &e))?
                .iter()
                .filter(|p| p.alive)
                .map(|p| p.pid.to_string())
                .collect();
            if !live.is_empty() && !force {
                return Err(CliError::new(
                    ErrorKind::InUse,
                    format!(
                        "region {name:?} not removed: {} attached (pid {}); stop them first, or use --force \
                         (they keep the removed region; new opens create a new one)",
                        count(live.len() as u64, "live process", "live processes"),
                        live.join(", ")
                    ),
                ));
            }
        }
        Ok(Probe::Uninitialised) => {}
        Err(e) => {
            let c = CliError::lib(&format!("region {name:?}"), &e);
            match c.kind {
                ErrorKind::NotFound => {
                    return Err(CliError::new(
                        ErrorKind::NotFound,
                        format!("region {name:?}: no such region ({} does not exist)", path.display()),
                    ))
                }
                _ if force => {}
                ErrorKind::PermissionDenied => {
                    return Err(CliError::new(
                        ErrorKind::PermissionDenied,
                        format!("region {name:?} not removed: cannot read it to check for live processes ({e}); use --force to remove it unchecked"),
                    ))
                }
                _ => {
                    return Err(CliError::new(
                        ErrorKind::BadRegion,
                        format!("{} not removed: it is not a valid shmsched region ({e}); use --force to remove it anyway", path.display()),
                    ))
                }
            }
        }
    }
    std::fs::remove_file(&path).map_err(|e| {
        let kind = if e.kind() == std::io::ErrorKind::PermissionDenied {
            ErrorKind::PermissionDenied
        } else {
            ErrorKind::Other
        };
        CliError::new(kind, format!("removing {}: {e}", path.display()))
    })?;
    Ok(format!("removed {}", path.display()))
}

/// `rm NAME…`: removes each region; reports every failure and exits 1 if
/// any region was not removed.
pub fn rm(a: RmArgs) -> CliResult {
    let mut failed = Vec::new();
    for name in &a.regions {
        match rm_one(name, a.force) {
            Ok(msg) => outln!("{msg}")?,
            Err(e) => {
                eprintln!("shmsched: error: {}", e.msg);
                failed.push(e);
            }
        }
    }
    match failed.len() {
        0 => Ok(ExitCode::SUCCESS),
        1 if a.regions.len() == 1 => Ok(ExitCode::FAILURE),
        n => Err(CliError::new(
            failed[0].kind,
            format!(
                "{n} of {} not removed",
                count(a.regions.len() as u64, "region", "regions")
            ),
        )),
    }
}
