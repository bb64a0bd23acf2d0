//! The agent: one thread per process that runs it; the one holding the
//! region's agent lock renews the lease, the others stand by.
//!
//! # How it works
//!
//! Each period the thread first makes sure it is the region's agent
//! ([`Registry::try_become_agent`](crate::region::registry::Registry::try_become_agent): an owner id set by CAS, taken over
//! only when its process is dead by kernel liveness).
//!
//! - **Standing by**, it polls the lock a few times per renew period (a
//!   takeover takes one poll plus one round trip to Redis), and watches the
//!   lease in the region: a lease still marked in force within half the
//!   drain time of its deadline means the active agent is stuck (its
//!   process stopped, say) and no longer renews, so the standby lowers the
//!   region to the lease's safe capacity itself. It never raises anything
//!   and never writes the lease (the active agent is its one writer).
//! - **Taking over**, it adopts the lease recorded in the region (the grant
//!   stays in force until its recorded deadline) and registers anew with
//!   Redis (token 0), which fences off whatever the previous agent held.
//! - **Active**, it reads the region (level, holders, waiters), sends one
//!   renewal with what the host *has* (max(running, level) above its safe
//!   capacity: what it may hold until the reply is applied, since only this
//!   thread raises the level) and what it *wants*, and applies the grant:
//!   the level becomes safe + grant. The lease is valid for the TTL from the
//!   instant the request was sent, by this host's monotonic clock; Redis
//!   keeps the record until TTL after it ran the script, which is later.
//!   A stale token is answered by registering at once. Between renewals it
//!   samples the region a few times for the peak use it reports next.
//! - **Lapsing.** If no renewal succeeded by `deadline − drain`, the region
//!   goes to its safe capacity (mode `lapsed`); the holders of what it
//!   lost have the drain time to release before Redis hands those units to
//!   others. Requests are given at most the time left before that instant,
//!   so a Redis that hangs (SIGSTOP) cannot delay the fallback.
//! - **Stopping** (drop), the active agent lowers the region to its safe
//!   capacity, sends a last renewal with no wants (Redis drops the record
//!   once the host holds nothing from the pool), and resigns the lock; a
//!   standby of another process takes over.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::client::{BudgetClient, RenewReply, RenewRequest};
use super::config::AgentConfig;
use super::target::{wants, Target};
use super::{ClusterError, Lease, LeaseMode};

/// What an agent is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// It holds the region's agent lock and renews the lease.
    Active,
    /// Another process holds the lock; this one watches and waits.
    Standby,
    /// Stopped.
    Stopped,
}

/// A snapshot of an agent, for logs and tests.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AgentStatus {
    /// What it is doing.
    pub role: Role,
    /// Its host id in the budget.
    pub host: String,
    /// The lease as this agent last saw it (written by it while active,
    /// read from the region while standing by).
    pub lease: Lease,
    /// The lease's mode.
    pub mode: LeaseMode,
    /// The level it last applied (ceiling or rate).
    pub level: u64,
    /// Its last water-filling target (pool units).
    pub target: u64,
    /// Σ max(grant, has) over the budget's hosts at its last renewal.
    pub held_sum: u64,
    /// Live hosts at its last renewal.
    pub hosts: u64,
    /// Renewals refused for a stale token.
    pub stale: u64,
    /// Registrations (token 0) it made.
    pub registrations: u64,
    /// Times it took the lock over from a dead or resigned agent.
    pub takeovers: u64,
    /// Times the standby watchdog lowered a stuck agent's region.
    pub watchdog_falls: u64,
    /// The last error, if the last attempt failed.
    pub last_error: Option<String>,
}

struct Shared {
    stop: Mutex<bool>,
    wake: Condvar,
    status: Mutex<AgentStatus>,
}

impl Shared {
    /// Sleeps up to `d`; true if asked to stop.
    fn sleep(&self, d: Duration) -> bool {
        let g = self.stop.lock().unwrap_or_else(|p| p.into_inner());
        if *g {
            return true;
        }
        let (g, _) = self
            .wake
            .wait_timeout(g, d)
            .unwrap_or_else(|p| p.into_inner());
        *g
    }

    fn stopping(&self) -> bool {
        *self.stop.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn status(&self) -> std::sync::MutexGuard<'_, AgentStatus> {
        self.status.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A cluster agent running on a shared Scheduler or Limiter (a thread of
/// this process). Stops on drop.
///
/// Run one in several processes of a host for takeover: only the holder of
/// the region's agent lock renews; the others stand by. Every agent of one
/// region must be configured alike; a process runs at most one agent per
/// region (the lock is the process's).
pub struct Agent {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    rid: String,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("status", &*self.shared.status())
            .finish_non_exhaustive()
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX)) as u64
}

/// The region's identity on this host: its path, or for an anonymous
/// region its memfd's inode, its creator's pid and its creation time.
fn region_id(target: &Target) -> Result<String, ClusterError> {
    let map = target.registry()?.mapping();
    Ok(match map.region().path() {
        Some(p) => p.display().to_string(),
        None => {
            // A memfd: its inode tells it apart from every other region, in
            // every process that shares it.
            use std::os::fd::AsRawFd;
            use std::os::unix::fs::MetadataExt;
            let fd = map.region().as_fd().as_raw_fd();
            let ino = std::fs::metadata(format!("/proc/self/fd/{fd}")).map_or(0, |m| m.ino());
            let h = map.header();
            format!("memfd-{ino}-{}-{}", h.created_pid, h.created_at_unix_ms)
        }
    })
}

/// The regions this process runs an agent on (the agent lock is per
/// process, so one agent per region per process).
static RUNNING: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// `HOSTNAME:` and the region's identity.
fn default_host(target: &Target) -> Result<String, ClusterError> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into());
    let region = region_id(target)?;
    let id: String = format!("{name}:{region}")
        .chars()
        .map(|c| if c.is_whitespace() { '_' } else { c })
        .collect();
    super::config::check_host(&id)?;
    Ok(id)
}

impl Agent {
    /// Starts an agent on `target` (a `&Scheduler` or `&Limiter` shared
    /// through a region). If no live agent holds the region, this one
    /// becomes it and, before returning, lowers the region to its safe
    /// capacity unless a lease recorded there is still in force; the first
    /// renewal follows at once on the agent's thread. Redis is not needed
    /// to start (an unreachable Redis is retried every period).
    ///
    /// Errors: an invalid configuration (naming the value), a handle not
    /// shared through a region, a Limiter with safe capacity 0.
    pub fn start(target: impl Into<Target>, cfg: AgentConfig) -> Result<Agent, ClusterError> {
        let target = target.into();
        cfg.validate()?;
        target.registry()?;
        if !target.is_root() {
            return Err(ClusterError::Config(
                "an agent moves the region's own budget: start it on the root handle \
                 (Scheduler::shared/attach, Limiter::shared/attach), not on a child"
                    .into(),
            ));
        }
        if target.is_limiter() && cfg.safe_capacity == 0 {
            return Err(ClusterError::Config(
                "a Limiter's safe_capacity must be at least 1 (a rate cannot be 0): set \
                 safe_reserve and safe_capacity"
                    .into(),
            ));
        }
        let host = match &cfg.host {
            Some(h) => h.clone(),
            None => default_host(&target)?,
        };
        let client = BudgetClient::new(&cfg.redis_url, &cfg.budget, cfg.renew_every)?;
        let rid = region_id(&target)?;
        {
            let mut running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
            if running.contains(&rid) {
                return Err(ClusterError::Config(format!(
                    "an agent already runs on region {rid} in this process (one per region and \
                     process: the agent lock belongs to the process)"
                )));
            }
            running.push(rid.clone());
        }
        let shared = Arc::new(Shared {
            stop: Mutex::new(false),
            wake: Condvar::new(),
            status: Mutex::new(AgentStatus {
                role: Role::Standby,
                host: host.clone(),
                lease: Lease::default(),
                mode: LeaseMode::None,
                level: 0,
                target: 0,
                held_sum: 0,
                hosts: 0,
                stale: 0,
                registrations: 0,
                takeovers: 0,
                watchdog_falls: 0,
                last_error: None,
            }),
        });
        let mut run = Run {
            burst: target.burst_ratio(),
            target,
            cfg,
            host,
            client,
            shared: shared.clone(),
            active: false,
            token: 0,
            grant: 0,
            mode: LeaseMode::None,
            deadline: None,
            deadline_unix: 0,
            renewals: 0,
            failures: 0,
            peak: 0,
            consumed_at: None,
        };
        let unlist = |rid: &str| {
            RUNNING
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|r| r != rid);
        };
        // Become the agent (or a standby) now, so that a region without a
        // lease is at its safe capacity when this returns.
        if let Err(e) = run.claim() {
            unlist(&rid);
            return Err(e);
        }
        let thread = std::thread::Builder::new()
            .name("shmsched-agent".into())
            .spawn(move || run.main())
            .map_err(|e| {
                unlist(&rid);
                ClusterError::Config(format!("spawning the agent thread: {e}"))
            })?;
        Ok(Agent {
            shared,
            thread: Some(thread),
            rid,
        })
    }

    /// A snapshot of what the agent is doing.
    pub fn status(&self) -> AgentStatus {
        self.shared.status().clone()
    }

    /// Stops the agent and waits for its thread (see the module docs for
    /// what an active agent does on the way out).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        *self.shared.stop.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
            RUNNING
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|r| *r != self.rid);
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The agent thread's state.
struct Run {
    target: Target,
    cfg: AgentConfig,
    host: String,
    client: BudgetClient,
    shared: Arc<Shared>,
    burst: f64,
    active: bool,
    /// The fencing token; 0: register on the next renewal.
    token: u64,
    /// Pool units granted and in force.
    grant: u64,
    mode: LeaseMode,
    /// The lease's local deadline (TTL after the request was sent).
    deadline: Option<Instant>,
    deadline_unix: u64,
    renewals: u64,
    failures: u64,
    /// Peak units held since the last renewal (scheduler).
    peak: u64,
    /// Tokens consumed at the last renewal, and when (limiter).
    consumed_at: Option<(Instant, u64)>,
}

impl Run {
    fn main(mut self) {
        let poll =
            (self.cfg.renew_every / 4).clamp(Duration::from_millis(10), Duration::from_millis(250));
        loop {
            if self.shared.stopping() {
                break;
            }
            match self.claim() {
                Ok(true) => {}
                Ok(false) => {
                    if self.shared.sleep(poll) {
                        break;
                    }
                    continue;
                }
                Err(e) => {
                    self.shared.status().last_error = Some(e.to_string());
                    if self.shared.sleep(poll) {
                        break;
                    }
                    continue;
                }
            }
            let sent = Instant::now();
            self.renew_once(sent);
            if self.token == 0 && self.shared.status().last_error.is_none() {
                // A stale token: register at once.
                self.renew_once(Instant::now());
            }
            self.check_lapse();
            self.publish();
            if self.wait_until(sent + self.cfg.renew_every) {
                break;
            }
        }
        self.leave();
    }

    /// Takes the agent lock if free (or its holder is dead) and adopts the
    /// region's lease; as a standby, watches for a stuck agent. True while
    /// this process is the agent.
    fn claim(&mut self) -> Result<bool, ClusterError> {
        let reg = self.target.registry()?;
        let before = reg.agent_owner();
        if reg.try_become_agent() {
            if !self.active {
                self.active = true;
                self.token = 0;
                if before != 0 && before != reg.me().owner {
                    self.shared.status().takeovers += 1;
                }
                self.adopt()?;
            }
            Ok(true)
        } else {
            if self.active {
                // Someone found this process dead? Not while it lives; be
                // safe: stop acting.
                self.active = false;
                self.token = 0;
            }
            self.watch();
            Ok(false)
        }
    }

    /// On becoming the agent: keep a lease recorded in the region while it
    /// is in force, else go to the safe capacity.
    fn adopt(&mut self) -> Result<(), ClusterError> {
        let reg = self.target.registry()?;
        // The region's own level, what a leaving agent restores (kept if an
        // earlier agent recorded it and crashed).
        if !reg.lease_guard().armed {
            let (level, burst) = self.target.own();
            reg.record_own(level, burst);
        }
        let l = reg.lease().unwrap_or_default();
        self.renewals = l.renewals;
        self.failures = l.failures;
        let now_unix = unix_ms();
        let mode = LeaseMode::from_word(l.mode).unwrap_or(LeaseMode::None);
        let drain = ms(self.cfg.drain);
        if mode.leased() && l.deadline_unix_ms > now_unix + drain {
            self.grant = l.grant;
            self.mode = mode;
            self.deadline_unix = l.deadline_unix_ms;
            self.deadline =
                Instant::now().checked_add(Duration::from_millis(l.deadline_unix_ms - now_unix));
            // The level stays as the previous agent left it.
        } else {
            self.grant = 0;
            self.mode = if mode == LeaseMode::None {
                LeaseMode::None
            } else {
                LeaseMode::Lapsed
            };
            self.deadline = None;
            self.target.apply(self.cfg.safe_capacity, self.burst)?;
        }
        {
            let mut st = self.shared.status();
            st.role = Role::Active;
        }
        self.publish();
        Ok(())
    }

    /// Standby: lower the region if the lease recorded there is past the
    /// point where its agent should have given it up.
    fn watch(&mut self) {
        let Ok(reg) = self.target.registry() else {
            return;
        };
        reg.standby_beat();
        let Some(l) = reg.lease() else { return };
        let mode = LeaseMode::from_word(l.mode).unwrap_or(LeaseMode::None);
        let mut fell = false;
        if mode.leased() && unix_ms() + ms(self.cfg.drain) / 2 >= l.deadline_unix_ms {
            let s = self.target.sample();
            if s.level > l.safe.max(self.target.min_units())
                && self.target.apply(l.safe, self.burst).is_ok()
            {
                fell = true;
            }
        }
        let mut st = self.shared.status();
        st.role = Role::Standby;
        st.lease = l;
        st.mode = mode;
        if fell {
            st.watchdog_falls += 1;
        }
    }

    fn request(&mut self) -> RenewRequest {
        let s = self.target.sample();
        let safe = self.cfg.safe_capacity;
        let max_units = self.target.max_units();
        let has = s.level.max(s.running).saturating_sub(safe);
        let use_units = if self.target.is_limiter() {
            let now = Instant::now();
            let rate = match self.consumed_at {
                Some((t, c)) => {
                    let dt = now.duration_since(t).as_secs_f64();
                    if dt > 0.0 {
                        (s.consumed.saturating_sub(c) as f64 / dt).round() as u64
                    } else {
                        0
                    }
                }
                None => 0,
            };
            self.consumed_at = Some((now, s.consumed));
            rate
        } else {
            let u = self.peak.max(s.running);
            self.peak = s.running;
            u
        };
        RenewRequest {
            host: self.host.clone(),
            token: self.token,
            capacity: self.cfg.capacity,
            reserve: self.cfg.safe_reserve,
            weight: self.cfg.weight,
            has,
            safe,
            ttl_ms: ms(self.cfg.ttl),
            wants: wants(
                use_units,
                &s.waiters,
                s.level,
                self.target.is_limiter(),
                safe,
                max_units,
            ),
            leave: false,
        }
    }

    /// The instant the region must be at its safe capacity by.
    fn fall_at(&self) -> Option<Instant> {
        self.deadline
            .map(|d| d.checked_sub(self.cfg.drain).unwrap_or(d))
    }

    fn renew_once(&mut self, sent: Instant) {
        // One renewal in flight at a time: this thread sends them one after
        // another and waits for each (or its timeout) before the next. A
        // timed-out request may still reach Redis later; the client numbers
        // every request (growing, above any number a previous agent used),
        // and the script refuses one whose number is not above the last it
        // accepted, so that late request cannot overwrite a later one.
        let req = self.request();
        let mut timeout = self.cfg.renew_every;
        if let Some(f) = self.fall_at() {
            let left = f.saturating_duration_since(Instant::now());
            if left > Duration::from_millis(5) {
                timeout = timeout.min(left);
            }
        }
        let sent_unix = unix_ms();
        let r = self.client.renew(&req, timeout);
        let mut st = self.shared.status();
        match r {
            Ok(RenewReply::Granted {
                grant,
                token,
                learning,
                target,
                held_sum,
                hosts,
                ..
            }) => {
                if req.token == 0 {
                    st.registrations += 1;
                }
                drop(st);
                self.token = token;
                self.renewals += 1;
                let deadline = sent + self.cfg.ttl;
                let now = Instant::now();
                if now + self.cfg.drain < deadline {
                    let level = self.cfg.safe_capacity.saturating_add(grant);
                    // The region enforces the lapse: the deadline goes in
                    // before the level goes up (see the module docs).
                    let fall = deadline.checked_sub(self.cfg.drain).unwrap_or(deadline);
                    let fall_ns = crate::sys::clock::monotonic_ns()
                        .saturating_add(ms(fall.saturating_duration_since(now)) * 1_000_000);
                    if let Ok(reg) = self.target.registry() {
                        let safe = self.cfg.safe_capacity;
                        reg.arm_lease(fall_ns, safe, self.target.burst_at(safe, self.burst));
                    }
                    match self.target.apply(level, self.burst) {
                        Ok(()) => {
                            self.grant = grant;
                            self.mode = if learning {
                                LeaseMode::Learning
                            } else {
                                LeaseMode::Normal
                            };
                            self.deadline = Some(deadline);
                            self.deadline_unix = sent_unix + ms(self.cfg.ttl);
                            let mut st = self.shared.status();
                            st.last_error = None;
                            st.target = target;
                            st.held_sum = held_sum;
                            st.hosts = hosts;
                        }
                        Err(e) => {
                            self.failures += 1;
                            self.shared.status().last_error = Some(e.to_string());
                        }
                    }
                } else {
                    // The answer came too late to use: the lease it carries
                    // is already past the point of falling back.
                    self.shared.status().last_error =
                        Some("a grant arrived after its lease's fallback point".into());
                }
            }
            Ok(RenewReply::Stale { .. }) => {
                st.stale += 1;
                st.last_error = None;
                drop(st);
                self.token = 0;
            }
            Err(e) => {
                st.last_error = Some(e.to_string());
                drop(st);
                self.failures += 1;
            }
        }
    }

    /// Falls to the safe capacity once the lease is within `drain` of its
    /// deadline.
    fn check_lapse(&mut self) {
        if let Some(f) = self.fall_at() {
            if Instant::now() >= f {
                if let Err(e) = self.target.apply(self.cfg.safe_capacity, self.burst) {
                    self.shared.status().last_error = Some(e.to_string());
                    return;
                }
                self.grant = 0;
                self.mode = LeaseMode::Lapsed;
                self.deadline = None;
                self.publish();
            }
        }
    }

    /// Writes the lease to the region and the status.
    fn publish(&mut self) {
        let lease = Lease {
            grant: self.grant,
            deadline_unix_ms: if self.mode.leased() {
                self.deadline_unix
            } else {
                0
            },
            token: self.token,
            mode: self.mode.to_word(),
            safe: self.cfg.safe_capacity,
            renewals: self.renewals,
            failures: self.failures,
        };
        if let Ok(reg) = self.target.registry() {
            reg.set_lease(&lease);
        }
        let level = self.target.sample().level;
        let mut st = self.shared.status();
        st.role = Role::Active;
        st.lease = lease;
        st.mode = self.mode;
        st.level = level;
    }

    /// Sleeps until `until`, sampling the region for its peak use and
    /// falling back on time; true if asked to stop.
    fn wait_until(&mut self, until: Instant) -> bool {
        let step = (self.cfg.renew_every / 5).max(Duration::from_millis(2));
        loop {
            let now = Instant::now();
            if now >= until {
                return false;
            }
            let mut d = (until - now).min(step);
            if let Some(f) = self.fall_at() {
                d = d.min(
                    f.saturating_duration_since(now)
                        .max(Duration::from_millis(1)),
                );
            }
            if self.shared.sleep(d) {
                return true;
            }
            if !self.target.is_limiter() {
                let s = self.target.sample();
                self.peak = self.peak.max(s.running);
            }
            self.check_lapse();
        }
    }

    /// On stop: the active agent goes to its safe capacity, tells Redis,
    /// and resigns.
    fn leave(&mut self) {
        if self.active {
            let _ = self.target.apply(self.cfg.safe_capacity, self.burst);
            let had_token = self.token;
            self.grant = 0;
            self.mode = LeaseMode::Lapsed;
            self.deadline = None;
            self.publish();
            if had_token != 0 {
                let mut req = self.request();
                req.leave = true;
                let t = self.cfg.renew_every.min(Duration::from_millis(500));
                let _ = self.client.renew(&req, t);
            }
            if let Ok(reg) = self.target.registry() {
                // Leave the region as it was found, unless a standby of
                // another process is there to take over (it looked within
                // two of its polls): then the region stays at its safe
                // capacity for it.
                let poll = (self.cfg.renew_every / 4)
                    .clamp(Duration::from_millis(10), Duration::from_millis(250));
                let handover =
                    reg.standby_seen_within(ms(poll * 2 + Duration::from_millis(100)) * 1_000_000);
                let g = reg.lease_guard();
                if let Some(own) = g.own_level.filter(|_| !handover) {
                    // Disarmed and restored as one step against every
                    // process's lapse (see `Target::end_lease`).
                    if self.target.end_lease(Some((own, g.own_burst))).is_ok() {
                        self.mode = LeaseMode::None;
                        self.publish();
                    }
                }
            }
            if let Ok(reg) = self.target.registry() {
                reg.resign_agent();
            }
            self.active = false;
        }
        self.shared.status().role = Role::Stopped;
    }
}
