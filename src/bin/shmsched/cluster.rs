//! `cluster agent` and `cluster status`: a region's share of a cluster-wide
//! budget leased from Redis (see the library's `cluster` module).
//!
//! `cluster agent` attaches to an existing region (a shared scheduler or
//! limiter) and runs a [`shmsched::cluster::Agent`] on it until SIGINT or
//! SIGTERM, printing a line whenever its role, mode, grant or token
//! changes. Run it in two processes per region for takeover: the second
//! stands by. On the way out it lowers the region to its safe capacity and
//! resigns (exit 0). `cluster status` prints what Redis holds for a budget.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use shmsched::cluster::{Agent, AgentConfig, AgentStatus, BudgetClient, LeaseMode, Role};
use shmsched::limiter::Limiter;
use shmsched::region::{ObjectKind, Region};
use shmsched::scheduler::Scheduler;

use crate::{outln, signals, CliError, CliResult, ErrorKind};

/// Arguments of `cluster agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Redis URL: redis://HOST:PORT/DB or unix:///path/to/socket.
    #[arg(long)]
    redis: String,
    /// The budget's name (its keys are {shmsched:NAME}:meta and :hosts).
    #[arg(long)]
    budget: String,
    /// The budget's capacity for the whole cluster (slots, or tokens per
    /// second for a limiter region); every agent of the budget must agree.
    #[arg(long)]
    capacity: u64,
    /// The part of the capacity set aside for the hosts' safe capacities.
    #[arg(long, default_value_t = 0)]
    safe_reserve: u64,
    /// What this host runs on without a lease (at most --safe-reserve).
    #[arg(long, default_value_t = 0)]
    safe: u64,
    /// This host's weight in the water-filling.
    #[arg(long, default_value_t = 1.0)]
    weight: f64,
    /// Renew period in milliseconds (TTL 10 periods, drain TTL/4 unless set).
    #[arg(long, default_value_t = 1000)]
    renew_ms: u64,
    /// Lease TTL in milliseconds.
    #[arg(long)]
    ttl_ms: Option<u64>,
    /// Fall to the safe capacity this long before an unrenewed deadline, ms.
    #[arg(long)]
    drain_ms: Option<u64>,
    /// This host's id in the budget (default: HOSTNAME:REGION-PATH).
    #[arg(long)]
    host: Option<String>,
    /// Print each status line as a JSON object.
    #[arg(long)]
    pub json: bool,
    /// The region (name or path): a shared scheduler or limiter.
    region: String,
}

/// Arguments of `cluster release`.
#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// The region (name or path): a shared scheduler or limiter.
    region: String,
}

/// `cluster release REGION`.
pub fn release(a: ReleaseArgs) -> CliResult {
    let what = format!("region {:?}", a.region);
    let lib = |e: shmsched::Error| CliError::lib(&what, &e);
    let (region, kind) = crate::create::open_initialised(&a.region, &what)?;
    let refused = |e: shmsched::cluster::ClusterError| {
        CliError::new(ErrorKind::InvalidInput, format!("{what}: {e}"))
    };
    let r = match kind {
        ObjectKind::Scheduler => {
            let s = Scheduler::attach(&region).map_err(lib)?;
            shmsched::cluster::release(&s, true).map_err(refused)?
        }
        ObjectKind::Limiter => {
            let l = Limiter::attach(&region).map_err(lib)?;
            shmsched::cluster::release(&l, true).map_err(refused)?
        }
        ObjectKind::FairShare => {
            return Err(CliError::new(
                ErrorKind::BadRegion,
                format!("{what} is a fair-share region; it has no cluster lease"),
            ))
        }
    };
    match r.restored {
        Some(level) => outln!("{}: lease released; own level {level} restored", a.region)?,
        None if r.was_armed => outln!(
            "{}: lease released (no own level recorded; the level stays)",
            a.region
        )?,
        None => outln!("{}: no lease held the region", a.region)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `cluster status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Redis URL.
    #[arg(long)]
    redis: String,
    /// The budget's name.
    #[arg(long)]
    budget: String,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

fn line(st: &AgentStatus) -> String {
    let l = &st.lease;
    let role = match st.role {
        Role::Active => "active",
        Role::Standby => "standby",
        Role::Stopped => "stopped",
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let deadline = if st.mode.leased() {
        format!("deadline in {} ms", l.deadline_unix_ms.saturating_sub(now))
    } else {
        "no deadline".into()
    };
    let mut s = format!(
        "{role} host {} mode {} grant {} safe {} level {} token {} {deadline}, {} renewals, {} failures",
        st.host,
        st.mode.name(),
        l.grant,
        l.safe,
        st.level,
        l.token,
        l.renewals,
        l.failures
    );
    if let Some(e) = &st.last_error {
        s.push_str(&format!("; last error: {e}"));
    }
    s
}

/// `cluster agent REGION`.
pub fn agent(a: AgentArgs) -> CliResult {
    signals::install();
    let region = Region::open(&a.region)
        .map_err(|e| CliError::lib(&format!("region {:?}", a.region), &e))?;
    let info = region
        .info()
        .map_err(|e| CliError::lib(&format!("region {:?}", a.region), &e))?
        .ok_or_else(|| {
            CliError::new(
                ErrorKind::BadRegion,
                format!(
                    "region {:?} is not initialised (no object in it yet)",
                    a.region
                ),
            )
        })?;
    let mut cfg = AgentConfig::new(a.redis.clone(), a.budget.clone(), a.capacity)
        .renew_every(Duration::from_millis(a.renew_ms))
        .safe(a.safe_reserve, a.safe);
    cfg.weight = a.weight;
    if let Some(t) = a.ttl_ms {
        cfg.ttl = Duration::from_millis(t);
        cfg.drain = cfg.ttl / 4;
    }
    if let Some(d) = a.drain_ms {
        cfg.drain = Duration::from_millis(d);
    }
    cfg.host = a.host.clone();
    let invalid =
        |e: shmsched::cluster::ClusterError| CliError::new(ErrorKind::InvalidInput, e.to_string());
    let agent = match info.kind {
        ObjectKind::Scheduler => {
            let s = Scheduler::attach(&region)
                .map_err(|e| CliError::lib(&format!("region {:?}", a.region), &e))?;
            Agent::start(&s, cfg).map_err(invalid)?
        }
        ObjectKind::Limiter => {
            let l = Limiter::attach(&region)
                .map_err(|e| CliError::lib(&format!("region {:?}", a.region), &e))?;
            Agent::start(&l, cfg).map_err(invalid)?
        }
        ObjectKind::FairShare => {
            return Err(CliError::new(
                ErrorKind::BadRegion,
                format!(
                    "region {:?} is a fair-share region; an agent leases a scheduler's or a limiter's budget",
                    a.region
                ),
            ))
        }
    };
    let mut last: Option<(Role, LeaseMode, u64, u64, bool)> = None;
    let mut printed = Instant::now();
    loop {
        let st = agent.status();
        let key = (
            st.role,
            st.mode,
            st.lease.grant,
            st.lease.token,
            st.last_error.is_some(),
        );
        if last != Some(key) || printed.elapsed() >= Duration::from_secs(60) {
            if a.json {
                outln!(
                    "{}",
                    serde_json::to_string(&st).map_err(|e| CliError::from(e.to_string()))?
                )?;
            } else {
                outln!("{}", line(&st))?;
            }
            last = Some(key);
            printed = Instant::now();
        }
        if signals::caught().is_some() {
            agent.stop();
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `cluster status`.
pub fn status(a: StatusArgs) -> CliResult {
    let mut c = BudgetClient::new(&a.redis, &a.budget, Duration::from_secs(5))
        .map_err(|e| CliError::new(ErrorKind::InvalidInput, e.to_string()))?;
    let st = c.peek().map_err(|e| CliError::from(e.to_string()))?;
    if a.json {
        outln!(
            "{}",
            serde_json::to_string(&st).map_err(|e| CliError::from(e.to_string()))?
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    if st.epoch_ms == 0 {
        outln!(
            "budget {}: no state in Redis (no agent has renewed yet)",
            a.budget
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "budget {}: capacity {}, safe reserve {}, pool {}{}",
        a.budget,
        st.capacity,
        st.reserve,
        st.capacity.saturating_sub(st.reserve),
        if st.learning() {
            format!(", learning for {} ms more", st.learn_until_ms - st.now_ms)
        } else {
            String::new()
        }
    )?;
    outln!(
        "granted {}, held {} (Σ max(grant, has)), {} live hosts",
        st.granted(),
        st.held(),
        st.hosts.len()
    )?;
    outln!(
        "  {:<40} {:>8} {:>8} {:>6} {:>7} {:>10} {:>16}",
        "host",
        "grant",
        "has",
        "safe",
        "weight",
        "ttl left",
        "token"
    )?;
    for h in &st.hosts {
        outln!(
            "  {:<40} {:>8} {:>8} {:>6} {:>7} {:>7} ms {:>16}",
            h.host,
            h.grant,
            h.has,
            h.safe,
            h.weight,
            h.deadline_ms.saturating_sub(st.now_ms),
            h.token
        )?;
    }
    Ok(ExitCode::SUCCESS)
}
