//! `stat`, `watch` and `reap`: a live region from the outside.
//!
//! Reading a scheduler's figures means attaching to it, which registers
//! this process in the region's process table; every path here leaves
//! through [`Scheduler::detach`], so the inspector leaves no entry behind
//! and holds nothing. Its own entry is left out of the process list.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use shmsched::fair::{FairConfig, FairShare, Stats};
use shmsched::limiter::{Limiter, LimiterStats};
use shmsched::region::{HeaderInfo, ObjectKind, ProcState, Region};
use shmsched::scheduler::{Scheduler, SharedStats};
use shmsched::Priority;

use crate::{CliError, CliResult};
use shmsched::sys::signal as signals;

/// Arguments of `stat`.
#[derive(Debug, Args)]
pub struct StatArgs {
    /// Region name (maps to /dev/shm/shmsched.NAME) or path.
    region: String,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Arguments of `watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Region name (maps to /dev/shm/shmsched.NAME) or path.
    region: String,
    /// Stop after this many refreshes (default: until Ctrl-C).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
    /// Print one JSON object per refresh, one per line.
    #[arg(long)]
    json: bool,
}

/// Arguments of `reap`.
#[derive(Debug, Args)]
pub struct ReapArgs {
    /// Region name (maps to /dev/shm/shmsched.NAME) or path.
    region: String,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// The region header, as `stat` shows it.
#[derive(Debug, Serialize)]
struct Header {
    path: String,
    kind: &'static str,
    layout_version: u32,
    params: [u64; 8],
    total_size: u64,
    process_slots: u32,
    created_at_unix_ms: u64,
    created_pid: i32,
}

/// One registered process of a scheduler region.
#[derive(Debug, Serialize)]
struct Proc {
    pid: i32,
    entry: u32,
    owner: u32,
    alive: bool,
    state: &'static str,
    slots_held: u32,
}

/// A scheduler region's figures.
#[derive(Debug, Serialize)]
struct SchedView {
    running: u32,
    max: u32,
    waiters: std::collections::BTreeMap<&'static str, u32>,
    waiting_total: u32,
    processes_alive: u32,
    processes: Vec<Proc>,
    slots_reclaimed: u64,
    reaped_processes: u64,
    /// Time during which at least one task waited, in any process.
    stall_ms: f64,
}

/// What `stat --json` prints.
#[derive(Debug, Serialize)]
struct StatView {
    region: Header,
    /// Present for a scheduler region.
    scheduler: Option<SchedView>,
    /// Present for a fair-share region.
    fair: Option<FairView>,
    /// Present for a limiter region.
    limiter: Option<LimiterStats>,
    /// Set when this kind has no detailed view yet.
    note: Option<String>,
}

/// A fair-share region: its configuration and `stats` read now.
#[derive(Debug, Serialize)]
struct FairView {
    config: FairConfig,
    stats: Stats,
    /// Processes reaped and leases they held, since creation.
    reaped_processes: u64,
    reaped_leases: u64,
}

fn limiter_view(name: &str, region: &Region) -> Result<LimiterStats, CliError> {
    let lim = Limiter::attach(region).map_err(|e| CliError(format!("region {name:?}: {e}")))?;
    // `stats` shows 0 tokens on a corrupt bucket word; `tokens` says why.
    let tokens = lim
        .tokens()
        .map_err(|e| CliError(format!("region {name:?}: {e}")));
    let stats = lim.stats();
    lim.detach()
        .map_err(|e| CliError(format!("leaving region {name:?}: {e}")))?;
    tokens?;
    Ok(stats)
}

fn print_limiter(l: &LimiterStats) {
    println!(
        "tokens      {} of {} (tokens per second = capacity){}",
        l.tokens,
        l.tokens_per_second,
        if l.tokens < 0 { ", in debt" } else { "" }
    );
    println!("pending     {} here; forced {} here", l.pending, l.forced);
    if let Some(sh) = &l.shared {
        let waiting: Vec<String> = Priority::ALL
            .iter()
            .rev()
            .filter(|p| sh.waiters[p.index()] > 0)
            .map(|p| format!("{} {}", p.name(), sh.waiters[p.index()]))
            .collect();
        println!(
            "waiting     {}",
            if waiting.is_empty() {
                "0".to_string()
            } else {
                waiting.join(", ")
            }
        );
        println!("forced      {} across all processes", sh.forced);
        println!(
            "stalled     {:.1} ms in all (some consume waiting)",
            sh.stall_ns as f64 / 1e6
        );
        println!("processes   {} alive", sh.processes.saturating_sub(1));
    }
}

fn fair_view(name: &str, region: &Region) -> Result<FairView, CliError> {
    let bad = |e: &dyn std::fmt::Display| CliError(format!("region {name:?}: {e}"));
    let mut fair = FairShare::attach(region).map_err(|e| bad(&e))?;
    let stats = fair.stats_now().map_err(|e| bad(&e));
    let (reaped_processes, reaped_leases) = fair.reaped();
    let config = fair.config().clone();
    // The inspector holds no lease: leave no entry behind.
    fair.mapping()
        .deregister()
        .map_err(|e| CliError(format!("leaving region {name:?}: {e}")))?;
    Ok(FairView {
        config,
        stats: stats?,
        reaped_processes,
        reaped_leases,
    })
}

fn print_fair(f: &FairView) {
    let c = &f.config;
    println!(
        "ceiling     {} ({:?}), reclaim horizon {} ms, idle after {} ms",
        c.ceiling, c.fairness_unit, c.reclaim_horizon_ms, c.idle_after_ms
    );
    println!(
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
        println!(
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
        println!("overrun     none");
    } else {
        println!("overrun     {}", f.stats.overrun_leases.join(", "));
    }
    println!(
        "reaped      {} leases from {} dead processes",
        f.reaped_leases, f.reaped_processes
    );
}

fn header(region: &Region, name: &str, h: &HeaderInfo) -> Header {
    Header {
        path: region
            .path()
            .map_or_else(|| name.to_string(), |p| p.display().to_string()),
        kind: h.kind.name(),
        layout_version: h.layout_version,
        params: h.params,
        total_size: h.total_size,
        process_slots: h.process_slots,
        created_at_unix_ms: h.created_at_unix_ms,
        created_pid: h.created_pid,
    }
}

fn open(name: &str) -> Result<(Region, HeaderInfo), CliError> {
    let region = Region::open(name).map_err(|e| CliError(format!("region {name:?}: {e}")))?;
    let info = region
        .info()
        .map_err(|e| CliError(format!("region {name:?}: {e}")))?
        .ok_or_else(|| {
            CliError(format!(
                "region {name:?} is not initialised (no object was created in it yet)"
            ))
        })?;
    Ok((region, info))
}

fn sched_view(sched: &Scheduler) -> Result<SchedView, CliError> {
    let shared: SharedStats = sched
        .stats()
        .shared
        .ok_or_else(|| CliError("internal: an attached scheduler has no shared stats".into()))?;
    let me = sched.owner_id();
    let processes: Vec<Proc> = sched
        .processes()?
        .into_iter()
        .filter(|(p, _)| Some(p.owner) != me)
        .map(|(p, held)| Proc {
            pid: p.pid,
            entry: p.idx,
            owner: p.owner,
            alive: p.alive,
            state: match p.state {
                ProcState::Free => "free",
                ProcState::Live => "live",
                ProcState::Reaping => "reaping",
            },
            slots_held: held,
        })
        .collect();
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
        // Without this inspector, which counts itself while attached.
        processes_alive: shared.processes.saturating_sub(1),
        processes,
        slots_reclaimed: shared.reclaimed,
        reaped_processes: shared.reaped_processes,
        stall_ms: shared.stall_ns as f64 / 1e6,
    })
}

/// Builds the view of `name`, attaching to (and detaching from) a scheduler.
fn view(name: &str, region: &Region, info: &HeaderInfo) -> Result<StatView, CliError> {
    let head = header(region, name, info);
    if info.kind == ObjectKind::FairShare {
        return Ok(StatView {
            region: head,
            scheduler: None,
            fair: Some(fair_view(name, region)?),
            limiter: None,
            note: None,
        });
    }
    if info.kind == ObjectKind::Limiter {
        return Ok(StatView {
            region: head,
            scheduler: None,
            fair: None,
            limiter: Some(limiter_view(name, region)?),
            note: None,
        });
    }
    if info.kind != ObjectKind::Scheduler {
        return Ok(StatView {
            region: head,
            scheduler: None,
            fair: None,
            limiter: None,
            note: Some(format!(
                "the detailed view of a {} region is not supported yet",
                info.kind.name()
            )),
        });
    }
    let sched = Scheduler::attach(region).map_err(|e| CliError(format!("region {name:?}: {e}")))?;
    let v = sched_view(&sched);
    sched
        .detach()
        .map_err(|e| CliError(format!("leaving region {name:?}: {e}")))?;
    Ok(StatView {
        region: head,
        scheduler: Some(v?),
        fair: None,
        limiter: None,
        note: None,
    })
}

fn print_human(v: &StatView) {
    let h = &v.region;
    println!("region      {}", h.path);
    println!("kind        {} (layout v{})", h.kind, h.layout_version);
    let params: Vec<String> = h.params.iter().map(u64::to_string).collect();
    println!("params      [{}]", params.join(", "));
    println!(
        "size        {} bytes, {} process slots",
        h.total_size, h.process_slots
    );
    println!(
        "created     by pid {} at {} ms since the Unix epoch",
        h.created_pid, h.created_at_unix_ms
    );
    if let Some(note) = &v.note {
        println!("{note}");
    }
    if let Some(f) = &v.fair {
        print_fair(f);
    }
    if let Some(l) = &v.limiter {
        print_limiter(l);
    }
    let Some(s) = &v.scheduler else { return };
    println!("running     {} / {} max", s.running, s.max);
    let waiting: Vec<String> = s
        .waiters
        .iter()
        .filter(|(_, &n)| n > 0)
        .map(|(p, n)| format!("{p} {n}"))
        .collect();
    if waiting.is_empty() {
        println!("waiting     0");
    } else {
        println!("waiting     {} ({})", s.waiting_total, waiting.join(", "));
    }
    println!(
        "reclaimed   {} slots from {} dead processes reaped",
        s.slots_reclaimed, s.reaped_processes
    );
    println!(
        "stalled     {:.1} ms in all (some task waiting)",
        s.stall_ms
    );
    println!("processes   {} alive", s.processes_alive);
    if !s.processes.is_empty() {
        println!(
            "  {:>8} {:>6} {:>6} {:>11}",
            "pid", "entry", "alive", "slots held"
        );
        for p in &s.processes {
            println!(
                "  {:>8} {:>6} {:>6} {:>11}",
                p.pid,
                p.entry,
                if p.alive { "yes" } else { "DEAD" },
                p.slots_held
            );
        }
    }
}

fn emit(v: &StatView, json: bool) -> Result<(), CliError> {
    if json {
        let text = serde_json::to_string(v).map_err(|e| CliError(format!("encoding: {e}")))?;
        println!("{text}");
    } else {
        print_human(v);
    }
    Ok(())
}

/// `stat REGION`.
pub fn stat(a: StatArgs) -> CliResult {
    let (region, info) = open(&a.region)?;
    emit(&view(&a.region, &region, &info)?, a.json)?;
    Ok(ExitCode::SUCCESS)
}

/// `watch REGION`: `stat` every second until Ctrl-C or `--count`.
pub fn watch(a: WatchArgs) -> CliResult {
    signals::install_interrupt_flag();
    let (region, info) = open(&a.region)?;
    let mut n = 0u64;
    let start = Instant::now();
    loop {
        let v = view(&a.region, &region, &info)?;
        if !a.json {
            println!("--- {:.0} s", start.elapsed().as_secs_f64());
        }
        emit(&v, a.json)?;
        n += 1;
        if a.count.is_some_and(|c| n >= c) {
            return Ok(ExitCode::SUCCESS);
        }
        let next = start + Duration::from_secs(n);
        while Instant::now() < next {
            if signals::interrupted() {
                return Ok(ExitCode::SUCCESS);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `reap` on a fair-share region: releases dead processes' leases now.
fn reap_fair(a: &ReapArgs, region: &Region) -> CliResult {
    let bad = |e: &dyn std::fmt::Display| CliError(format!("region {:?}: {e}", a.region));
    let mut fair = FairShare::attach(region).map_err(|e| bad(&e))?;
    let r = fair.reap().map_err(|e| bad(&e));
    fair.mapping()
        .deregister()
        .map_err(|e| CliError(format!("leaving region {:?}: {e}", a.region)))?;
    let r = r?;
    if a.json {
        let text =
            serde_json::json!({ "reaped_processes": r.processes, "leases_released": r.leases });
        println!("{text}");
    } else {
        println!(
            "reaped {} processes, released {} leases",
            r.processes, r.leases
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// What `reap --json` prints.
#[derive(Debug, Serialize)]
struct Reaped {
    reaped_processes: u32,
    slots_reclaimed: u64,
}

/// `reap REGION`: returns dead processes' slots now.
pub fn reap(a: ReapArgs) -> CliResult {
    let (region, info) = open(&a.region)?;
    if info.kind == ObjectKind::FairShare {
        return reap_fair(&a, &region);
    }
    if info.kind == ObjectKind::Limiter {
        let lim = Limiter::attach(&region)
            .map_err(|e| CliError(format!("region {:?}: {e}", a.region)))?;
        let r = lim.reap();
        lim.detach()
            .map_err(|e| CliError(format!("leaving region {:?}: {e}", a.region)))?;
        let procs = r.map_err(|e| CliError(format!("reaping region {:?}: {e}", a.region)))?;
        if a.json {
            println!("{}", serde_json::json!({ "reaped_processes": procs }));
        } else {
            println!("reaped {procs} processes (a limiter holds no tokens for them)");
        }
        return Ok(ExitCode::SUCCESS);
    }
    if info.kind != ObjectKind::Scheduler {
        return Err(CliError(format!(
            "region {:?} holds a {}, which reap does not know",
            a.region,
            info.kind.name()
        )));
    }
    let sched =
        Scheduler::attach(&region).map_err(|e| CliError(format!("region {:?}: {e}", a.region)))?;
    let r = sched.reap();
    sched
        .detach()
        .map_err(|e| CliError(format!("leaving region {:?}: {e}", a.region)))?;
    let (procs, slots) = r.map_err(|e| CliError(format!("reaping region {:?}: {e}", a.region)))?;
    if a.json {
        let text = serde_json::to_string(&Reaped {
            reaped_processes: procs,
            slots_reclaimed: slots,
        })
        .map_err(|e| CliError(format!("encoding: {e}")))?;
        println!("{text}");
    } else {
        println!("reaped {procs} processes, reclaimed {slots} slots");
    }
    Ok(ExitCode::SUCCESS)
}
