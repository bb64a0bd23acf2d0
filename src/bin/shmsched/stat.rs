//! `stat`, `watch` and `reap`: a live region from the outside.
//!
//! `stat` and `watch` read a region through a [`RegionView`]: the file is
//! opened read-only and mapped `PROT_READ`, the process table and the
//! object's words are read with atomic loads, liveness comes from
//! `F_OFD_GETLK`. The inspector takes no process entry, no lock and writes
//! nothing, so it works with read permission alone and on a full process
//! table, for every kind of region. A fair-share ledger is copied without
//! its lock (a seqlock read of its last committed state,
//! [`RegionView::fair_share`]) and its stats computed on the copy, so
//! inspecting never moves the ledger's time, and an application stopped
//! inside a ledger call does not hold `stat` up.
//!
//! `reap` frees dead processes' holdings and needs write access.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use shmsched::fair::{FairConfig, FairShare, Stats};
use shmsched::limiter::{Limiter, LimiterStats};
use shmsched::region::{HeaderInfo, ObjectKind, ProcState, Region, RegionView};
use shmsched::scheduler::{Scheduler, SharedStats};
use shmsched::Priority;

use crate::{metrics, out, outln, signals, CliError, CliResult, ErrorKind};

/// Arguments of `stat`.
#[derive(Debug, Args)]
pub struct StatArgs {
    /// Region name (maps to /dev/shm/shmsched.NAME) or path.
    region: String,
    /// Print one JSON object (errors too, as `{"error": {...}}`).
    #[arg(long)]
    pub json: bool,
    /// Print Prometheus metrics (text exposition format 0.0.4).
    #[arg(long, conflicts_with = "json")]
    prometheus: bool,
}

/// Arguments of `watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Region name (maps to /dev/shm/shmsched.NAME) or path.
    region: String,
    /// Stop after this many refreshes (default: until Ctrl-C).
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..))]
    count: Option<u32>,
    /// Print one JSON object per refresh, one per line.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `reap`.
#[derive(Debug, Args)]
pub struct ReapArgs {
    /// Region name (maps to /dev/shm/shmsched.NAME) or path.
    region: String,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// The region header, as `stat` shows it.
#[derive(Debug, Serialize)]
pub struct Header {
    /// The region file.
    pub path: String,
    /// The object kind.
    pub kind: &'static str,
    layout_version: u32,
    params: [u64; 8],
    total_size: u64,
    /// Size of the process table.
    pub process_slots: u32,
    created_at_unix_ms: u64,
    created_pid: i32,
    /// Permission bits, in octal (`"0600"`).
    mode: String,
}

/// One registered process.
#[derive(Debug, Serialize)]
struct Proc {
    pid: i32,
    entry: u32,
    owner: u32,
    /// Whether the process still runs (its liveness lock is held).
    alive: bool,
    /// The table entry's state: `registered` (until reaped, also after the
    /// process exited: `alive` says which) or `reaping`.
    state: &'static str,
    /// Slots held (scheduler regions; 0 for a limiter).
    slots_held: u32,
}

/// A scheduler region's figures.
#[derive(Debug, Serialize)]
pub struct SchedView {
    /// Slots held across all processes.
    pub running: u32,
    /// The global max.
    pub max: u32,
    waiters: std::collections::BTreeMap<&'static str, u32>,
    waiting_total: u32,
    /// Tasks granted a slot after waiting, in any process, since creation
    /// (an acquire that went at once is not counted, nor a cancelled wait).
    served: u64,
    processes_alive: u32,
    processes: Vec<Proc>,
    slots_reclaimed: u64,
    reaped_processes: u64,
    /// Time during which at least one task waited, in any process.
    stall_ms: f64,
    /// The raw region-wide figures (for the metrics).
    #[serde(skip)]
    pub shared: SharedStats,
}

/// A limiter region's figures and processes.
#[derive(Debug, Serialize)]
pub struct LimView {
    /// The figures, as an attached process would see them.
    #[serde(flatten)]
    pub stats: LimiterStats,
    processes: Vec<Proc>,
}

/// What `stat --json` prints.
#[derive(Debug, Serialize)]
pub struct StatView {
    /// The header.
    pub region: Header,
    /// Present for a scheduler region.
    pub scheduler: Option<SchedView>,
    /// Present for a fair-share region whose ledger could be read.
    pub fair: Option<FairView>,
    /// Present for a limiter region.
    pub limiter: Option<LimView>,
    /// The region's cluster lease, when an agent runs (or ran) on it.
    pub cluster: Option<shmsched::cluster::ClusterView>,
    /// Why a part is missing, when one is.
    pub note: Option<String>,
}

/// A fair-share region: its configuration and `stats` read now.
#[derive(Debug, Serialize)]
pub struct FairView {
    /// The configuration the region holds.
    pub config: FairConfig,
    /// The ledger's statistics now (computed on a copy: the ledger's time
    /// does not move).
    pub stats: Stats,
    /// The latest `now` the ledger accepted.
    pub ledger_now_ms: u64,
    /// Processes reaped since creation.
    pub reaped_processes: u64,
    /// Leases those processes held.
    pub reaped_leases: u64,
    /// Processes registered in the region (alive or not yet reaped).
    processes: Vec<Proc>,
}

/// `n` and the noun, singular or plural.
pub fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Opens `name` read-only, with messages that say what to do.
pub fn open_view(name: &str) -> Result<RegionView, CliError> {
    RegionView::open(name).map_err(|e| {
        let path = shmsched::region::resolve_path(name)
            .map_or_else(|_| name.to_string(), |p| p.display().to_string());
        let c = CliError::lib(&format!("region {name:?}"), &e);
        match c.kind {
            ErrorKind::NotFound => CliError::new(
                ErrorKind::NotFound,
                format!("region {name:?}: no such region ({path} does not exist); `shmsched ls` lists the regions"),
            ),
            ErrorKind::PermissionDenied => CliError::new(
                ErrorKind::PermissionDenied,
                format!("region {name:?}: permission denied reading {path}: inspecting a region needs read permission on its file"),
            ),
            _ => c,
        }
    })
}

fn proc_rows(list: Vec<(shmsched::region::ProcSummary, u32)>) -> Vec<Proc> {
    list.into_iter()
        .map(|(p, held)| Proc {
            pid: p.pid,
            entry: p.idx,
            owner: p.owner,
            alive: p.alive,
            state: match p.state {
                ProcState::Free => "free",
                ProcState::Live => "registered",
                ProcState::Reaping => "reaping",
            },
            slots_held: held,
        })
        .collect()
}

fn sched_view(name: &str, v: &RegionView) -> Result<SchedView, CliError> {
    let bad = |e: shmsched::Error| CliError::lib(&format!("region {name:?}"), &e);
    let shared = v.scheduler_stats().map_err(bad)?;
    let processes = proc_rows(v.scheduler_processes().map_err(bad)?);
    let waiters = Priority::ALL
        .iter()
        .rev()
        .map(|p| (p.name(), shared.waiters[p.index()]))
        .collect();
    Ok(SchedView {
        running: shared.running,
        max: shared.max,
        waiters,
        waiting_total: shared.waiters.iter().sum(),
        served: shared.served,
        processes_alive: shared.processes,
        processes,
        slots_reclaimed: shared.reclaimed,
        reaped_processes: shared.reaped_processes,
        stall_ms: shared.stall_ns as f64 / 1e6,
        shared,
    })
}

/// The process rows of a region whose processes hold no slots.
fn slotless_procs(v: &RegionView) -> Result<Vec<Proc>, shmsched::Error> {
    Ok(proc_rows(
        v.processes()?.into_iter().map(|p| (p, 0)).collect(),
    ))
}

fn limiter_view(name: &str, v: &RegionView) -> Result<LimView, CliError> {
    let bad = |e: shmsched::Error| CliError::lib(&format!("region {name:?}"), &e);
    let stats = v.limiter_stats().map_err(bad)?;
    let processes = slotless_procs(v).map_err(bad)?;
    Ok(LimView { stats, processes })
}

/// Reads a fair-share region's ledger without writing (see the module docs).
fn fair_view(name: &str, v: &RegionView) -> Result<FairView, CliError> {
    let bad = |e: shmsched::Error| CliError::lib(&format!("region {name:?}"), &e);
    let f = v.fair_share().map_err(bad)?;
    let processes = slotless_procs(v).map_err(bad)?;
    Ok(FairView {
        config: f.config,
        stats: f.stats,
        ledger_now_ms: f.ledger_now_ms,
        reaped_processes: f.reaped_processes,
        reaped_leases: f.reaped_leases,
        processes,
    })
}

fn header(v: &RegionView, h: &HeaderInfo) -> Header {
    Header {
        path: v.path().display().to_string(),
        kind: h.kind.name(),
        layout_version: h.layout_version,
        params: h.params,
        total_size: h.total_size,
        process_slots: h.process_slots,
        created_at_unix_ms: h.created_at_unix_ms,
        created_pid: h.created_pid,
        mode: v.mode().map_or_else(|_| "?".into(), |m| format!("{m:04o}")),
    }
}

/// Builds the view of the region `name` opened as `v`.
pub fn build(name: &str, v: &RegionView) -> Result<StatView, CliError> {
    let info = v.header();
    if let Some(other) = crate::layout::other_layout(&info) {
        return Err(CliError::new(
            ErrorKind::BadRegion,
            format!("region {name:?}: {other}"),
        ));
    }
    let mut sv = StatView {
        region: header(v, &info),
        scheduler: None,
        fair: None,
        limiter: None,
        cluster: None,
        note: None,
    };
    sv.cluster = v
        .cluster()
        .map_err(|e| CliError::new(ErrorKind::BadRegion, format!("region {name:?}: {e}")))?;
    match info.kind {
        ObjectKind::Scheduler => sv.scheduler = Some(sched_view(name, v)?),
        ObjectKind::Limiter => sv.limiter = Some(limiter_view(name, v)?),
        ObjectKind::FairShare => sv.fair = Some(fair_view(name, v)?),
    }
    Ok(sv)
}

fn print_fair(o: &mut String, f: &FairView) {
    let c = &f.config;
    let _ = writeln!(
        o,
        "ceiling     {} ({:?}), reclaim horizon {} ms, idle after {} ms",
        c.ceiling, c.fairness_unit, c.reclaim_horizon_ms, c.idle_after_ms
    );
    let _ = writeln!(
        o,
        "  {:<16} {:>10} {:>10} {:>10} {:>10} {:>10} {:>14} {:>8} {:>7}",
        "tenant",
        "guarantee",
        "held",
        "borrowed",
        "lent",
        "want",
        "deficit u*ms",
        "worst ms",
        "leases"
    );
    for t in &f.stats.tenants {
        let worst = t
            .worst_reclaim_ms
            .map_or("-".to_string(), |w| w.to_string());
        let _ = writeln!(
            o,
            "  {:<16} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>14.1} {:>8} {:>7}",
            t.id,
            t.guarantee,
            t.held,
            t.borrowed,
            t.lent,
            t.want,
            t.deficit_unit_ms,
            worst,
            t.leases
        );
    }
    if f.stats.overrun_leases.is_empty() {
        let _ = writeln!(o, "overrun     none");
    } else {
        let _ = writeln!(o, "overrun     {}", f.stats.overrun_leases.join(", "));
    }
    let _ = writeln!(
        o,
        "reaped      {} from {}",
        count(f.reaped_leases, "lease", "leases"),
        count(f.reaped_processes, "dead process", "dead processes")
    );
}

fn print_limiter(o: &mut String, l: &LimiterStats) {
    let _ = writeln!(
        o,
        "tokens      {} of {} (the capacity){}",
        l.tokens,
        l.capacity,
        if l.tokens < 0 { ", in debt" } else { "" }
    );
    let _ = writeln!(o, "rate        {} tokens per second", l.tokens_per_second);
    if let Some(sh) = &l.shared {
        let waiting: Vec<String> = Priority::ALL
            .iter()
            .rev()
            .filter(|p| sh.waiters[p.index()] > 0)
            .map(|p| format!("{} {}", p.name(), sh.waiters[p.index()]))
            .collect();
        let _ = writeln!(
            o,
            "waiting     {}",
            if waiting.is_empty() {
                "0".to_string()
            } else {
                waiting.join(", ")
            }
        );
        let blocked: Vec<String> = Priority::ALL
            .iter()
            .rev()
            .filter(|p| sh.waiters[p.index()] > 0)
            .map(|p| format!("{} {}", p.name(), sh.stall[p.index()]))
            .collect();
        if !blocked.is_empty() {
            let _ = writeln!(
                o,
                "blocked     {} ticks of 100 ms (the front; forced through at {})",
                blocked.join(", "),
                shmsched::limiter::STALL_TICKS
            );
        }
        let _ = writeln!(o, "forced      {} across all processes", sh.forced);
        // Tokens charged and given back per priority (counters, every
        // process): the achieved rate of a priority is the net's rate.
        let by_priority = |v: &[u64]| -> String {
            let parts: Vec<String> = Priority::ALL
                .iter()
                .rev()
                .filter(|p| v[p.index()] > 0)
                .map(|p| format!("{} {}", p.name(), v[p.index()]))
                .collect();
            if parts.is_empty() {
                "0".to_string()
            } else {
                parts.join(", ")
            }
        };
        let _ = writeln!(
            o,
            "consumed    {} tokens: {}",
            l.consumed,
            by_priority(&sh.consumed)
        );
        let _ = writeln!(
            o,
            "refunded    {} tokens: {}",
            l.refunded,
            by_priority(&sh.refunded)
        );
        let _ = writeln!(
            o,
            "stalled     {:.1} ms in all (some consume waiting)",
            sh.stall_ns as f64 / 1e6
        );
        let _ = writeln!(o, "processes   {} alive", sh.processes);
    }
}

fn print_cluster(o: &mut String, c: &shmsched::cluster::ClusterView) {
    let l = &c.lease;
    let agent = match (c.agent_pid, c.agent_alive) {
        (Some(pid), true) => format!("agent pid {pid}"),
        (Some(pid), false) => format!("agent pid {pid} (DEAD)"),
        (None, _) => "no agent".to_string(),
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let deadline = if !c.mode.leased() {
        "no deadline".to_string()
    } else if c.expired {
        format!(
            "deadline passed {} ms ago (EXPIRED)",
            now.saturating_sub(l.deadline_unix_ms)
        )
    } else {
        format!("deadline in {} ms", l.deadline_unix_ms.saturating_sub(now))
    };
    let whose = c
        .armed_by_pid
        .map_or(String::new(), |p| format!(" of agent pid {p}"));
    if c.in_force {
        let _ = writeln!(
            o,
            "lease ceiling in force{whose} until {} (in {} ms), then the safe level {}",
            c.in_force_until_unix_ms,
            c.in_force_until_unix_ms.saturating_sub(now),
            l.safe
        );
    } else if c.in_force_until_unix_ms != 0 {
        let _ = writeln!(
            o,
            "lease ceiling lapsed{whose} {} ms ago: the region holds the safe level {}{}",
            now.saturating_sub(c.in_force_until_unix_ms),
            l.safe,
            c.own_level.map_or(String::new(), |v| format!(
                " (its own level {v} comes back with `shmsched cluster release` or `shmsched set`)"
            ))
        );
    }
    let _ = writeln!(
        o,
        "lease       {} (mode {}): grant {} + safe {}, token {}, {deadline}, {} renewals, {} failures",
        agent,
        c.mode.name(),
        l.grant,
        l.safe,
        l.token,
        l.renewals,
        l.failures
    );
}

fn print_procs(o: &mut String, procs: &[Proc], slots: bool) {
    if procs.is_empty() {
        return;
    }
    if slots {
        let _ = writeln!(
            o,
            "  {:>8} {:>6} {:>6} {:>11}",
            "pid", "entry", "alive", "slots held"
        );
    } else {
        let _ = writeln!(o, "  {:>8} {:>6} {:>6}", "pid", "entry", "alive");
    }
    for p in procs {
        let alive = if p.alive { "yes" } else { "DEAD" };
        if slots {
            let _ = writeln!(
                o,
                "  {:>8} {:>6} {:>6} {:>11}",
                p.pid, p.entry, alive, p.slots_held
            );
        } else {
            let _ = writeln!(o, "  {:>8} {:>6} {:>6}", p.pid, p.entry, alive);
        }
    }
}

/// `YYYY-MM-DD HH:MM:SS UTC` for a time in ms since the Unix epoch (the
/// civil-from-days conversion of the proleptic Gregorian calendar).
fn utc_time(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The human-readable form of `v`.
fn human(v: &StatView) -> String {
    let mut o = String::new();
    let h = &v.region;
    let _ = writeln!(o, "region      {}", h.path);
    let _ = writeln!(o, "kind        {} (layout v{})", h.kind, h.layout_version);
    let _ = writeln!(
        o,
        "size        {} bytes, {} process slots, mode {}",
        h.total_size, h.process_slots, h.mode
    );
    let _ = writeln!(
        o,
        "created     by pid {} at {}",
        h.created_pid,
        utc_time(h.created_at_unix_ms)
    );
    if let Some(note) = &v.note {
        let _ = writeln!(o, "note        {note}");
    }
    if let Some(c) = &v.cluster {
        print_cluster(&mut o, c);
    }
    if let Some(f) = &v.fair {
        print_fair(&mut o, f);
        print_procs(&mut o, &f.processes, false);
    }
    if let Some(l) = &v.limiter {
        print_limiter(&mut o, &l.stats);
        print_procs(&mut o, &l.processes, false);
    }
    let Some(s) = &v.scheduler else { return o };
    if s.shared.ceiling < s.max {
        let _ = writeln!(
            o,
            "running     {} / {} ceiling ({} max)",
            s.running, s.shared.ceiling, s.max
        );
    } else {
        let _ = writeln!(o, "running     {} / {} max", s.running, s.max);
    }
    let waiting: Vec<String> = s
        .waiters
        .iter()
        .filter(|(_, &n)| n > 0)
        .map(|(p, n)| format!("{p} {n}"))
        .collect();
    if waiting.is_empty() {
        let _ = writeln!(o, "waiting     0");
    } else {
        let _ = writeln!(
            o,
            "waiting     {} ({})",
            s.waiting_total,
            waiting.join(", ")
        );
    }
    let _ = writeln!(
        o,
        "served      {} after waiting",
        count(s.served, "task", "tasks")
    );
    let _ = writeln!(
        o,
        "reclaimed   {} from {} reaped",
        count(s.slots_reclaimed, "slot", "slots"),
        count(s.reaped_processes, "dead process", "dead processes")
    );
    let _ = writeln!(
        o,
        "stalled     {:.1} ms in all (some task waiting)",
        s.stall_ms
    );
    let _ = writeln!(o, "processes   {} alive", s.processes_alive);
    print_procs(&mut o, &s.processes, true);
    o
}

fn json_line(v: &impl Serialize) -> Result<String, CliError> {
    serde_json::to_string(v).map_err(|e| CliError::from(format!("encoding: {e}")))
}

/// `stat REGION`.
pub fn stat(a: StatArgs) -> CliResult {
    let view = open_view(&a.region)?;
    let v = build(&a.region, &view)?;
    if a.prometheus {
        out::raw(&metrics::encode(&[metrics::Scraped::Ok(
            a.region.clone(),
            Box::new(v),
        )])?)?;
    } else if a.json {
        outln!("{}", json_line(&v)?)?;
    } else {
        out::raw(&human(&v))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `watch REGION`: `stat` every second until Ctrl-C, SIGTERM or `--count`.
/// On a terminal each refresh replaces the last; piped, each is printed
/// after a `--- N s` line (or as one JSON line with `--json`).
pub fn watch(a: WatchArgs) -> CliResult {
    signals::install();
    let view = open_view(&a.region)?;
    let redraw = !a.json && std::io::stdout().is_terminal();
    let mut n = 0u64;
    let start = Instant::now();
    loop {
        let v = build(&a.region, &view)?;
        if a.json {
            outln!("{}", json_line(&v)?)?;
        } else if redraw {
            // Home, clear the screen, then the figures.
            out::raw(&format!(
                "\x1b[H\x1b[2J{}(every 1 s; Ctrl-C to stop)\n",
                human(&v)
            ))?;
        } else {
            out::raw(&format!(
                "--- {:.0} s\n{}",
                start.elapsed().as_secs_f64(),
                human(&v)
            ))?;
        }
        n += 1;
        if a.count.is_some_and(|c| n >= u64::from(c)) {
            return Ok(ExitCode::SUCCESS);
        }
        let next = start + Duration::from_secs(n);
        while Instant::now() < next {
            if signals::caught().is_some() {
                // Ctrl-C is how a watch normally ends.
                return Ok(ExitCode::SUCCESS);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Opens `name` for writing, for `reap`, with a message that says why
/// write access is needed.
fn open_for_reap(name: &str) -> Result<(Region, HeaderInfo), CliError> {
    let region = Region::open(name).map_err(|e| {
        let c = CliError::lib(&format!("region {name:?}"), &e);
        if c.kind == ErrorKind::PermissionDenied {
            CliError::new(
                ErrorKind::PermissionDenied,
                format!(
                    "region {name:?}: permission denied: reap frees what dead processes held, which needs \
                     write access to the region file (`shmsched stat {name}` needs only read access)"
                ),
            )
        } else if c.kind == ErrorKind::NotFound {
            let path = shmsched::region::resolve_path(name)
                .map_or_else(|_| name.to_string(), |p| p.display().to_string());
            CliError::new(
                ErrorKind::NotFound,
                format!(
                    "region {name:?}: no such region ({path} does not exist); `shmsched ls` lists \
                     the regions"
                ),
            )
        } else {
            c
        }
    })?;
    let info = region
        .info()
        .map_err(|e| CliError::lib(&format!("region {name:?}"), &e))?
        .ok_or_else(|| {
            CliError::new(
                ErrorKind::BadRegion,
                format!("region {name:?} is not initialised (no object was created in it yet)"),
            )
        })?;
    Ok((region, info))
}

/// `reap` on a fair-share region: releases dead processes' leases now.
fn reap_fair(a: &ReapArgs, region: &Region) -> CliResult {
    let bad = |e: &dyn std::fmt::Display| CliError::from(format!("region {:?}: {e}", a.region));
    let mut fair = FairShare::attach(region).map_err(|e| bad(&e))?;
    let r = fair.reap().map_err(|e| bad(&e));
    fair.mapping()
        .deregister()
        .map_err(|e| CliError::from(format!("leaving region {:?}: {e}", a.region)))?;
    let r = r?;
    if a.json {
        outln!(
            "{}",
            serde_json::json!({ "reaped_processes": r.processes, "leases_released": r.leases })
        )?;
    } else {
        outln!(
            "reaped {}, released {}",
            count(r.processes, "process", "processes"),
            count(r.leases, "lease", "leases")
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `reap REGION`: returns dead processes' slots now.
pub fn reap(a: ReapArgs) -> CliResult {
    let (region, info) = open_for_reap(&a.region)?;
    match info.kind {
        ObjectKind::FairShare => reap_fair(&a, &region),
        ObjectKind::Limiter => {
            let lim = Limiter::attach(&region)
                .map_err(|e| CliError::lib(&format!("region {:?}", a.region), &e))?;
            let r = lim.reap();
            lim.detach()
                .map_err(|e| CliError::from(format!("leaving region {:?}: {e}", a.region)))?;
            let procs =
                r.map_err(|e| CliError::lib(&format!("reaping region {:?}", a.region), &e))?;
            if a.json {
                outln!("{}", serde_json::json!({ "reaped_processes": procs }))?;
            } else {
                outln!(
                    "reaped {} (a limiter holds no tokens for them)",
                    count(procs, "process", "processes")
                )?;
            }
            Ok(ExitCode::SUCCESS)
        }
        ObjectKind::Scheduler => {
            let sched = Scheduler::attach(&region)
                .map_err(|e| CliError::lib(&format!("region {:?}", a.region), &e))?;
            let r = sched.reap();
            sched
                .detach()
                .map_err(|e| CliError::from(format!("leaving region {:?}: {e}", a.region)))?;
            let (procs, slots) =
                r.map_err(|e| CliError::lib(&format!("reaping region {:?}", a.region), &e))?;
            if a.json {
                outln!(
                    "{}",
                    serde_json::json!({ "reaped_processes": procs, "slots_reclaimed": slots })
                )?;
            } else {
                outln!(
                    "reaped {}, reclaimed {}",
                    count(procs, "process", "processes"),
                    count(slots, "slot", "slots")
                )?;
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::utc_time;

    #[test]
    fn utc_time_of_known_instants() {
        assert_eq!(utc_time(0), "1970-01-01 00:00:00 UTC");
        // 2000-02-29 (a leap day of a year divisible by 400).
        assert_eq!(utc_time(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc_time(1_796_074_724_508), "2026-11-30 21:38:44 UTC");
        assert_eq!(utc_time(4_102_444_799_999), "2099-12-31 23:59:59 UTC");
    }
}
