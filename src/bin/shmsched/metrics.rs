//! Region figures as Prometheus metrics (text exposition format 0.0.4),
//! encoded by `prometheus-client`, for `stat --prometheus` and `serve`.
//!
//! Every series carries `region` (the name given on the command line, or
//! the name `ls` shows). Counters end in `_total`, times are in seconds,
//! priorities are a `priority` label (`lowest` … `highest`), fair-share
//! tenants a `tenant` label. `shmsched_region_up` is 0 for a region that
//! could not be read at this scrape (removed, corrupt, no permission); its
//! other series are then absent. The full list is in `docs/metrics.md`.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::TypedMetric;
use prometheus_client::registry::{Metric, Registry};
use shmsched::Priority;

use crate::stat::StatView;
use crate::CliError;

/// The `Content-Type` of what [`encode`] returns.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

type Labels = Vec<(String, String)>;
type IntGauge = Family<Labels, Gauge>;
type FloatGauge = Family<Labels, Gauge<f64, AtomicU64>>;
type IntCounter = Family<Labels, Counter>;
type FloatCounter = Family<Labels, Counter<f64, AtomicU64>>;

/// One region's outcome at a scrape.
#[derive(Debug)]
pub enum Scraped {
    /// Read: the region's label value and its view.
    Ok(String, Box<StatView>),
    /// Not readable now: the label value (why is logged by the caller).
    Failed(String),
}

fn family<M>(r: &mut Registry, name: &str, help: &str) -> Family<Labels, M>
where
    M: Metric + TypedMetric + Default + Clone,
{
    let f = Family::<Labels, M>::default();
    r.register(name, help, f.clone());
    f
}

fn labels(region: &str, extra: &[(&str, &str)]) -> Labels {
    let mut l = vec![("region".to_string(), region.to_string())];
    l.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    l
}

/// The metrics of every family, in one registry built per scrape.
struct Families {
    up: IntGauge,
    info: IntGauge,
    processes: IntGauge,
    process_slots: IntGauge,
    waiters: IntGauge,
    stall: FloatCounter,
    running: IntGauge,
    max: IntGauge,
    served: IntCounter,
    reclaimed: IntCounter,
    reaped: IntCounter,
    tokens: IntGauge,
    front_stall: IntGauge,
    rate: IntGauge,
    capacity: IntGauge,
    forced: IntCounter,
    wakes: IntCounter,
    consumed: IntCounter,
    refunded: IntCounter,
    ceiling: FloatGauge,
    guarantee: FloatGauge,
    held: FloatGauge,
    borrowed: FloatGauge,
    lent: FloatGauge,
    want: FloatGauge,
    leases: IntGauge,
    deficit: FloatCounter,
    overrun: IntGauge,
    reaped_leases: IntCounter,
    lease_grant: IntGauge,
    lease_safe: IntGauge,
    lease_deadline: FloatGauge,
    lease_mode: IntGauge,
    lease_renewals: IntCounter,
    lease_failures: IntCounter,
    agent_up: IntGauge,
}

impl Families {
    fn new(r: &mut Registry) -> Families {
        Families {
            up: family(r, "shmsched_region_up", "1 if the region could be read at this scrape, else 0"),
            info: family(r, "shmsched_region_info", "Always 1; labels: the region's kind and path"),
            processes: family(r, "shmsched_processes", "Live processes attached to the region"),
            process_slots: family(r, "shmsched_process_slots", "Size of the region's process table"),
            waiters: family(r, "shmsched_waiters", "Tasks (scheduler) or consumes (limiter) waiting now, per priority, in live processes"),
            stall: family(r, "shmsched_stall_seconds", "Seconds during which at least one task or consume waited, in any process"),
            running: family(r, "shmsched_running", "Scheduler slots held now, across all processes"),
            max: family(r, "shmsched_max", "The scheduler's global max"),
            served: family(r, "shmsched_served_waiters", "Scheduler tasks granted a slot after waiting, in any process"),
            reclaimed: family(r, "shmsched_reclaimed_slots", "Scheduler slots returned on behalf of processes that died holding them"),
            reaped: family(r, "shmsched_reaped_processes", "Dead processes reaped (scheduler regions)"),
            tokens: family(r, "shmsched_limiter_tokens", "Tokens in the limiter's bucket now; negative while in debt"),
            front_stall: family(r, "shmsched_limiter_front_stall_ticks", "Consecutive ~100 ms ticks the region's front of each priority has been blocked (0: nobody waits); at 10 it is forced through"),
            rate: family(r, "shmsched_limiter_rate_tokens_per_second", "The limiter's rate in force (set_rate changes it)"),
            capacity: family(r, "shmsched_limiter_capacity_tokens", "The limiter's capacity (burst) in force, in tokens"),
            forced: family(r, "shmsched_limiter_forced", "Anti-starvation force-throughs into debt, by all processes"),
            wakes: family(r, "shmsched_limiter_wakes", "Futex wake-ups sent to a process with a sleeper, by all processes"),
            consumed: family(r, "shmsched_limiter_consumed_tokens", "Tokens charged at each priority, by all processes"),
            refunded: family(r, "shmsched_limiter_refunded_tokens", "Tokens given back at each priority (charged, then unused), by all processes"),
            ceiling: family(r, "shmsched_fair_ceiling", "The fair-share ceiling, in the fairness unit"),
            guarantee: family(r, "shmsched_fair_guarantee", "A tenant's guarantee: ceiling * weight / total weight"),
            held: family(r, "shmsched_fair_held", "Units a tenant holds now (own and borrowed)"),
            borrowed: family(r, "shmsched_fair_borrowed", "Units a tenant holds on loan from idle tenants"),
            lent: family(r, "shmsched_fair_lent", "Units of a tenant's guarantee lent out now"),
            want: family(r, "shmsched_fair_want", "A tenant's stated demand (the largest refused charge outstanding)"),
            leases: family(r, "shmsched_fair_leases", "Leases a tenant holds now"),
            deficit: family(r, "shmsched_fair_deficit_unit_seconds", "Integral of (entitled - held) while a tenant was short, in unit-seconds"),
            overrun: family(r, "shmsched_fair_overrun_leases", "Leases held past their declared deadline (never freed silently)"),
            reaped_leases: family(r, "shmsched_fair_reaped_leases", "Leases released because the process holding them died"),
            lease_grant: family(r, "shmsched_cluster_lease_grant", "Units of the cluster budget leased to this region (its level is safe + grant while leased)"),
            lease_safe: family(r, "shmsched_cluster_lease_safe", "The region's safe capacity: its level without a lease"),
            lease_deadline: family(r, "shmsched_cluster_lease_deadline_seconds", "When the lease lapses without renewal, Unix seconds (0 when not leased)"),
            lease_mode: family(r, "shmsched_cluster_lease_mode", "Always 1; label mode: none, normal, learning or lapsed"),
            lease_renewals: family(r, "shmsched_cluster_lease_renewals", "Successful lease renewals"),
            lease_failures: family(r, "shmsched_cluster_lease_failures", "Failed lease renewal attempts"),
            agent_up: family(r, "shmsched_cluster_agent_up", "1 if a live process holds the region's agent lock, else 0"),
        }
    }

    fn add(&self, region: &str, v: &StatView) {
        let l = labels(region, &[]);
        self.up.get_or_create(&l).set(1);
        self.info
            .get_or_create(&labels(
                region,
                &[("kind", v.region.kind), ("path", &v.region.path)],
            ))
            .set(1);
        self.process_slots
            .get_or_create(&l)
            .set(i64::from(v.region.process_slots));
        if let Some(s) = &v.scheduler {
            let sh = &s.shared;
            self.processes
                .get_or_create(&l)
                .set(i64::from(sh.processes));
            self.running.get_or_create(&l).set(i64::from(sh.running));
            self.max.get_or_create(&l).set(i64::from(sh.max));
            for p in Priority::ALL {
                self.waiters
                    .get_or_create(&labels(region, &[("priority", p.name())]))
                    .set(i64::from(sh.waiters[p.index()]));
            }
            self.stall
                .get_or_create(&l)
                .inc_by(sh.stall_ns as f64 / 1e9);
            self.served.get_or_create(&l).inc_by(sh.served);
            self.reclaimed.get_or_create(&l).inc_by(sh.reclaimed);
            self.reaped.get_or_create(&l).inc_by(sh.reaped_processes);
        }
        if let Some(lim) = &v.limiter {
            self.tokens.get_or_create(&l).set(lim.stats.tokens);
            self.rate
                .get_or_create(&l)
                .set(i64::from(lim.stats.tokens_per_second));
            self.capacity
                .get_or_create(&l)
                .set(i64::from(lim.stats.capacity));
            if let Some(sh) = &lim.stats.shared {
                self.processes
                    .get_or_create(&l)
                    .set(i64::from(sh.processes));
                for p in Priority::ALL {
                    self.waiters
                        .get_or_create(&labels(region, &[("priority", p.name())]))
                        .set(i64::try_from(sh.waiters[p.index()]).unwrap_or(i64::MAX));
                }
                self.stall
                    .get_or_create(&l)
                    .inc_by(sh.stall_ns as f64 / 1e9);
                self.forced.get_or_create(&l).inc_by(sh.forced);
                self.wakes.get_or_create(&l).inc_by(sh.wakes);
                for p in Priority::ALL {
                    let pl = labels(region, &[("priority", p.name())]);
                    self.front_stall
                        .get_or_create(&pl)
                        .set(i64::try_from(sh.stall[p.index()]).unwrap_or(i64::MAX));
                    self.consumed
                        .get_or_create(&pl)
                        .inc_by(sh.consumed[p.index()]);
                    self.refunded
                        .get_or_create(&pl)
                        .inc_by(sh.refunded[p.index()]);
                }
            }
        }
        if let Some(c) = &v.cluster {
            self.lease_grant
                .get_or_create(&l)
                .set(i64::try_from(c.lease.grant).unwrap_or(i64::MAX));
            self.lease_safe
                .get_or_create(&l)
                .set(i64::try_from(c.lease.safe).unwrap_or(i64::MAX));
            self.lease_deadline
                .get_or_create(&l)
                .set(c.lease.deadline_unix_ms as f64 / 1000.0);
            self.lease_mode
                .get_or_create(&labels(region, &[("mode", c.mode.name())]))
                .set(1);
            self.lease_renewals
                .get_or_create(&l)
                .inc_by(c.lease.renewals);
            self.lease_failures
                .get_or_create(&l)
                .inc_by(c.lease.failures);
            self.agent_up
                .get_or_create(&l)
                .set(i64::from(c.agent_alive));
        }
        if let Some(f) = &v.fair {
            self.ceiling.get_or_create(&l).set(f.config.ceiling);
            self.overrun
                .get_or_create(&l)
                .set(i64::try_from(f.stats.overrun_leases.len()).unwrap_or(i64::MAX));
            let mut reaped = 0;
            for t in &f.stats.tenants {
                let tl = labels(region, &[("tenant", &t.id)]);
                self.guarantee.get_or_create(&tl).set(t.guarantee);
                self.held.get_or_create(&tl).set(t.held);
                self.borrowed.get_or_create(&tl).set(t.borrowed);
                self.lent.get_or_create(&tl).set(t.lent);
                self.want.get_or_create(&tl).set(t.want);
                self.leases
                    .get_or_create(&tl)
                    .set(i64::try_from(t.leases).unwrap_or(i64::MAX));
                self.deficit
                    .get_or_create(&tl)
                    .inc_by(t.deficit_unit_ms / 1000.0);
                reaped += t.reaped_leases;
            }
            self.reaped_leases.get_or_create(&l).inc_by(reaped);
        }
    }
}

/// Encodes `regions` in the Prometheus text format.
pub fn encode(regions: &[Scraped]) -> Result<String, CliError> {
    let mut r = Registry::default();
    let f = Families::new(&mut r);
    for s in regions {
        match s {
            Scraped::Ok(name, v) => f.add(name, v),
            Scraped::Failed(name) => {
                f.up.get_or_create(&labels(name, &[])).set(0);
            }
        }
    }
    let mut text = String::new();
    prometheus_text::encode(&mut text, &r)
        .map_err(|e| CliError::from(format!("encoding metrics: {e}")))?;
    Ok(text)
}
