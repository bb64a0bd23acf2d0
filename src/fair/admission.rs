//! The ledger's algorithms, written once over a [`View`] so that the
//! in-process home and the shared-region home run the same code.
//!
//! # Admission order (ruling Q19)
//!
//! An acquire is decided before anything is written: (1) misuse (unknown
//! tenant, bad cost, `hold_ms` 0, `now` going backwards) is an error and
//! changes nothing; (2) a charge above the whole ceiling is refused
//! `exceeds_ceiling`; (3) a charge that fits the tenant's own free units
//! (guarantee − own use − units lent out) is granted with no horizon limit;
//! (4) if the tenant has units on loan and the charge would fit once they
//! return (Q21), it is granted from third-party idle lenders when `hold_ms`
//! is within the horizon and they cover the shortfall, else refused
//! `guarantee_on_loan` with the minimal earliest-deadline set of blocking
//! leases (Q6); (5) otherwise a hold above the horizon is refused
//! `hold_exceeds_reclaim_horizon`; (6) idle lenders cover the shortfall:
//! grant, largest free lender first (Q7: ties by constructor order);
//! (7) else `no_lendable_capacity`.
//!
//! A lender is a tenant other than the requester that holds no live lease
//! and has had no activity (acquire attempt or release) for
//! `idle_after_ms` (inclusive, Q2). A tenant holding a lease is never idle:
//! idleness is measured from the release (D9), so an overrunning holder can
//! never become a lender and reissue its own units. Because every refusal is
//! activity, a returning tenant leaves the lender pool the instant it asks
//! (the reclaim freeze) and stays out for `idle_after_ms`, which is longer
//! than any loan; hence the bound: no lease against its units outlives
//! `ask + reclaim_horizon_ms` unless its holder overruns.
//!
//! Global feasibility is never computed from a summed total (Q15): every
//! held unit is either inside its holder's own guarantee or in a slice
//! attributed to one lender's guarantee, and the guarantees partition the
//! ceiling, so per-tenant checks with tolerance 1e-9 bound the total.
//!
//! # Deficit integration
//!
//! Each tenant record carries its want (largest refused charge
//! outstanding, Q10), the instant it opened and `integrated_to_ms`. Before
//! any mutating step, [`advance`] integrates every tenant from
//! `integrated_to_ms` to `now` at the rate `min(guarantee, held + want) −
//! held` (Q9; zero without a want). A want lapses at `last_ask +
//! idle_after_ms`: the integral is cut at that instant (D20) and the
//! in-progress wait is dropped without being recorded (D28). Because the
//! rate is constant between calls, splitting an interval at extra calls
//! (stats, other tenants' calls) does not change the result. A grant ends
//! the wait and records its length in `worst_reclaim` (Q8).

use super::config::FairnessUnit;
use super::error::FairError;
use super::plan::plan_allocation;
use super::store::{
    LeaseRec, MetaRec, SliceRec, TenantRec, View, FLAG_REFUSAL_NOT_ACTIVITY, MAX_SLICES,
};
use super::types::{
    FairnessReport, Lease, Plan, PlanEntry, Refusal, RefusalReason, Slice, Stats, TenantShare,
    TenantStats,
};

/// Fixed comparison tolerance of the seed (D30).
pub const TOLERANCE: f64 = 1e-9;

/// Formats a quantity for explanations: at most 9 decimals, no `.0`.
pub(crate) fn fmt_num(x: f64) -> String {
    // Beyond 1e15 there is no fraction left to round (and `x * 1e9` would
    // overflow to infinity for a finite x above ~1.8e299): print the value
    // itself, in exponent form once its decimal expansion gets long.
    if !x.is_finite() || x.abs() >= 1e15 {
        return if x.is_finite() && x.abs() >= 1e16 {
            format!("{x:e}")
        } else {
            format!("{x}")
        };
    }
    let r = (x * 1e9).round() / 1e9;
    if r == 0.0 {
        "0".into()
    } else {
        format!("{r}")
    }
}

fn unit_of(v: &View<'_>) -> FairnessUnit {
    FairnessUnit::from_code(v.p.unit).unwrap_or(FairnessUnit::Cost)
}

/// Ruling Q22: `now` may not precede `startedAt` or the last accepted `now`.
pub(crate) fn check_now(v: &View<'_>, now: u64) -> Result<MetaRec, FairError> {
    if now < v.p.started_at_ms {
        return Err(FairError::BeforeStart {
            now_ms: now,
            started_at_ms: v.p.started_at_ms,
        });
    }
    let m = v.meta()?;
    if now < m.last_now_ms {
        return Err(FairError::TimeWentBackwards {
            now_ms: now,
            last_ms: m.last_now_ms,
        });
    }
    Ok(m)
}

fn integrate(t: &mut TenantRec, idle_after_ms: u64, now: u64) {
    let t0 = t.integrated_to_ms;
    if t.want_open == 1 {
        let lapse = t.last_ask_ms.saturating_add(idle_after_ms);
        let end = now.min(lapse);
        if end > t0 {
            let held = t.held();
            let gap = (t.guarantee.min(held + t.want) - held).max(0.0);
            t.deficit_unit_ms += gap * (end - t0) as f64;
        }
        if now >= lapse {
            t.want_open = 0;
            t.want = 0.0;
        }
    }
    t.integrated_to_ms = now.max(t0);
}

/// Integrates every tenant's deficit up to `now`, lapses old wants and
/// records `now` as the last accepted instant. Call only after all misuse
/// checks passed.
pub(crate) fn advance(v: &mut View<'_>, now: u64) -> Result<(), FairError> {
    for i in 0..v.n() {
        let mut t = v.tenant(i)?;
        integrate(&mut t, v.p.idle_after_ms, now);
        v.set_tenant(i, t);
    }
    let mut m = v.meta()?;
    m.last_now_ms = m.last_now_ms.max(now);
    v.set_meta(m);
    Ok(())
}

fn is_idle(t: &TenantRec, idle_after_ms: u64, now: u64) -> bool {
    t.live_leases == 0 && t.last_activity_ms <= now && now - t.last_activity_ms >= idle_after_ms
}

/// Idle lenders other than `me` with free units, largest first, ties by
/// constructor order.
fn lenders(ts: &[TenantRec], me: usize, idle_after_ms: u64, now: u64) -> Vec<(u32, f64)> {
    let mut v: Vec<(u32, f64)> = ts
        .iter()
        .enumerate()
        .filter(|(i, t)| *i != me && is_idle(t, idle_after_ms, now))
        .map(|(i, t)| (i as u32, t.guarantee - t.own_held - t.lent))
        .filter(|(_, free)| *free > TOLERANCE)
        .collect();
    v.sort_by(|a, b| {
        b.1.partial_cmp(&a.1)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.0.cmp(&b.0))
    });
    v
}

/// Slices covering `need` from `lenders` in order, or `None`.
fn cover(lenders: &[(u32, f64)], need: f64) -> Option<Vec<(u32, f64)>> {
    if need <= TOLERANCE {
        return Some(Vec::new());
    }
    let mut remaining = need;
    let mut out = Vec::new();
    for &(i, free) in lenders {
        if out.len() == MAX_SLICES {
            return None;
        }
        let take = free.min(remaining);
        if remaining - take <= TOLERANCE {
            out.push((i, remaining));
            return Some(out);
        }
        out.push((i, take));
        remaining -= take;
    }
    None
}

enum Decision {
    Grant { own: f64, slices: Vec<(u32, f64)> },
    Refuse(Refusal),
}

struct Ask<'s> {
    ti: usize,
    name: &'s str,
    charge: f64,
    hold: u64,
    now: u64,
}

fn decide(v: &View<'_>, a: &Ask<'_>) -> Result<Decision, FairError> {
    let p = v.p;
    let unit = unit_of(v).noun();
    let ts = v.all_tenants()?;
    let me = ts[a.ti];
    let (name, charge, hold, now) = (a.name, a.charge, a.hold, a.now);
    let h = p.reclaim_horizon_ms;
    // (2) a charge no ceiling can hold.
    if charge > p.ceiling + TOLERANCE {
        return Ok(Decision::Refuse(Refusal {
            reason: RefusalReason::ExceedsCeiling,
            retry_after_ms: None,
            blocking_leases: Vec::new(),
            explanation: format!(
                "Tenant \"{name}\" asked for {} {unit}, which exceeds the whole ceiling of {} {unit}, so no amount of \
                 waiting can admit it. Split the work into pieces of at most {} {unit}.",
                fmt_num(charge),
                fmt_num(p.ceiling),
                fmt_num(p.ceiling)
            ),
        }));
    }
    // (3) fits the own free units: no horizon limit.
    let own_free = me.guarantee - me.own_held - me.lent;
    if charge <= own_free + TOLERANCE {
        return Ok(Decision::Grant {
            own: charge,
            slices: Vec::new(),
        });
    }
    let own_part = own_free.max(0.0);
    let need = charge - own_part;
    let pool = lenders(&ts, a.ti, p.idle_after_ms, now);
    // (4) would fit once its own loans return.
    if me.lent > TOLERANCE && charge <= own_free + me.lent + TOLERANCE {
        if hold <= h {
            if let Some(slices) = cover(&pool, need) {
                return Ok(Decision::Grant {
                    own: own_part,
                    slices,
                });
            }
        }
        return Ok(Decision::Refuse(on_loan(
            v,
            a,
            &me,
            own_part,
            need,
            hold > h && !pool.is_empty(),
        )?));
    }
    // (5) borrowing for longer than the horizon is refused outright.
    if hold > h {
        return Ok(Decision::Refuse(Refusal {
            reason: RefusalReason::HoldExceedsReclaimHorizon,
            retry_after_ms: None,
            blocking_leases: Vec::new(),
            explanation: format!(
                "Tenant \"{name}\" asked to hold {} {unit} for {hold}ms, which exceeds the reclaim horizon of {h}ms, \
                 and the request needs to borrow capacity because only {} of its own guarantee is free. Borrowed \
                 capacity may not be committed for longer than the horizon, because nothing here is preempted and a \
                 lender that comes back would otherwise wait for the whole hold. Retry with holdMs of {h} or less, \
                 split the work so it fits inside the tenant's own guarantee, or raise reclaimHorizonMs if the \
                 tenants really can tolerate waiting that long for their share.",
                fmt_num(charge),
                fmt_num(own_part)
            ),
        }));
    }
    // (6) idle lenders, largest first.
    if let Some(slices) = cover(&pool, need) {
        return Ok(Decision::Grant {
            own: own_part,
            slices,
        });
    }
    // (7) nothing to borrow.
    let usable: f64 = pool.iter().take(MAX_SLICES).map(|l| l.1).sum();
    let all: f64 = pool.iter().map(|l| l.1).sum();
    let spread = if all + TOLERANCE >= need && pool.len() > MAX_SLICES {
        format!(" ({} idle tenants hold enough in total, but one lease may borrow from at most {MAX_SLICES} of them.)", pool.len())
    } else {
        String::new()
    };
    Ok(Decision::Refuse(Refusal {
        reason: RefusalReason::NoLendableCapacity,
        retry_after_ms: None,
        blocking_leases: Vec::new(),
        explanation: format!(
            "Tenant \"{name}\" asked for {} {unit}, but only {} of its own guarantee of {} is free and idle tenants \
             can lend only {} more; a tenant lends only after {}ms without an acquire attempt or release, and a \
             tenant that is waiting for its share never lends.{spread} Retry when capacity is released, or ask for \
             at most {}.",
            fmt_num(charge),
            fmt_num(own_part),
            fmt_num(me.guarantee),
            fmt_num(usable),
            p.idle_after_ms,
            fmt_num(own_part + usable)
        ),
    }))
}

/// The `guarantee_on_loan` refusal: minimal earliest-deadline blocking set.
fn on_loan(
    v: &View<'_>,
    a: &Ask<'_>,
    me: &TenantRec,
    own_part: f64,
    need: f64,
    horizon_blocked_borrowing: bool,
) -> Result<Refusal, FairError> {
    let unit = unit_of(v).noun();
    let ti = a.ti as u32;
    let mut loans: Vec<(LeaseRec, f64)> = v
        .live_leases()?
        .into_iter()
        .map(|(_, l)| {
            let u = l.units_from(ti);
            (l, u)
        })
        .filter(|(_, u)| *u > 0.0)
        .collect();
    loans.sort_by(|x, y| {
        x.0.deadline_ms
            .cmp(&y.0.deadline_ms)
            .then(x.0.seq.cmp(&y.0.seq))
    });
    let mut acc = 0.0;
    let mut set = Vec::new();
    for (l, u) in loans {
        set.push(l);
        acc += u;
        if acc + TOLERANCE >= need {
            break;
        }
    }
    let overrun: Vec<&LeaseRec> = set.iter().filter(|l| a.now > l.deadline_ms).collect();
    let ids = set
        .iter()
        .map(|l| v.lease_id(l))
        .collect::<Result<Vec<_>, _>>()?;
    let retry = if overrun.is_empty() {
        set.iter()
            .map(|l| l.deadline_ms - a.now.min(l.deadline_ms))
            .max()
    } else {
        None
    };
    let when = match retry {
        Some(r) => format!(
            "The loans that must come back first ({}) are due back by their declared deadlines within {r}ms; retry then.",
            ids.join(", ")
        ),
        None if !overrun.is_empty() => {
            let over = overrun.iter().map(|l| v.lease_id(l)).collect::<Result<Vec<_>, _>>()?;
            format!(
                "Lease {} has run past its declared deadline (by {}ms), so no reclaim time can be promised; it stays \
                 counted against the ceiling until its holder releases it.",
                over.join(", "),
                a.now - overrun[0].deadline_ms
            )
        }
        None => "No loan against it is recorded, so no reclaim time can be promised.".into(),
    };
    let meanwhile = if horizon_blocked_borrowing {
        format!(
            " Borrowing from idle tenants meanwhile is not possible because holdMs {} exceeds the reclaim horizon of {}ms.",
            a.hold, v.p.reclaim_horizon_ms
        )
    } else {
        " No other idle tenant can cover the shortfall meanwhile.".into()
    };
    Ok(Refusal {
        reason: RefusalReason::GuaranteeOnLoan,
        retry_after_ms: retry,
        blocking_leases: ids,
        explanation: format!(
            "Tenant \"{}\" asked for {} {unit}, which fits its guarantee of {} once its loans return, but only {} of \
             it is free now because {} is lent to other tenants and it holds {} itself; {} more must come back.{meanwhile} {when}",
            a.name,
            fmt_num(a.charge),
            fmt_num(me.guarantee),
            fmt_num(own_part),
            fmt_num(me.lent),
            fmt_num(me.own_held),
            fmt_num(need)
        ),
    })
}

fn snap(x: f64) -> f64 {
    if x < 1e-12 {
        0.0
    } else {
        x
    }
}

/// `acquire`: misuse → `Err`; refusal → `Ok(Err(..))`; grant → `Ok(Ok(..))`.
pub(crate) fn acquire(
    v: &mut View<'_>,
    owner: u32,
    tenant: &str,
    cost: f64,
    hold_ms: u64,
    now: u64,
) -> Result<Result<Lease, Refusal>, FairError> {
    // (1) misuse: nothing below this block may fail for a caller's reason.
    check_now(v, now)?;
    let ti = v
        .find_tenant(tenant)?
        .ok_or_else(|| FairError::UnknownTenant(tenant.to_string()))?;
    if !(cost.is_finite() && cost >= 0.0) {
        return Err(FairError::InvalidCost(cost));
    }
    if hold_ms == 0 {
        return Err(FairError::InvalidHold(hold_ms));
    }
    let charge = match unit_of(v) {
        FairnessUnit::Cost => cost,
        FairnessUnit::Requests => 1.0,
    };
    let ask = Ask {
        ti,
        name: tenant,
        charge,
        hold: hold_ms,
        now,
    };
    let decision = decide(v, &ask)?;
    let slot = match decision {
        Decision::Grant { .. } => Some(v.free_slot()?.ok_or(FairError::CapacityExhausted {
            what: "lease table",
            limit: v.capacity(),
        })?),
        Decision::Refuse(_) => None,
    };
    let deadline = now
        .checked_add(hold_ms)
        .ok_or(FairError::InvalidHold(hold_ms))?;
    // From here on the call is accepted and recorded.
    advance(v, now)?;
    let mut me = v.tenant(ti)?;
    me.last_ask_ms = now;
    match decision {
        Decision::Refuse(r) => {
            if v.p.flags & FLAG_REFUSAL_NOT_ACTIVITY == 0 {
                me.last_activity_ms = now;
            }
            // Q20: exceeds_ceiling is activity but records no want.
            if r.reason != RefusalReason::ExceedsCeiling {
                if me.want_open == 1 {
                    me.want = me.want.max(charge);
                } else {
                    me.want_open = 1;
                    me.want = charge;
                    me.want_since_ms = now;
                }
            }
            v.set_tenant(ti, me);
            Ok(Err(r))
        }
        Decision::Grant { own, slices } => {
            let slot = slot.unwrap_or(0);
            me.last_activity_ms = now;
            if me.want_open == 1 {
                let waited = now - me.want_since_ms.min(now);
                me.worst_reclaim_plus1 = me
                    .worst_reclaim_plus1
                    .max(waited.saturating_add(1).min(super::store::COUNTER_LIMIT));
                me.want_open = 0;
                me.want = 0.0;
            }
            let borrowed: f64 = slices.iter().map(|s| s.1).sum();
            me.own_held += own;
            me.borrowed += borrowed;
            me.live_leases += 1;
            let no = me.next_lease_no;
            me.next_lease_no += 1;
            me.granted_requests += 1;
            me.granted_cost += cost;
            v.set_tenant(ti, me);
            let mut rec = LeaseRec {
                state: 1,
                tenant: ti as u32,
                owner,
                n_slices: slices.len() as u32,
                no,
                seq: 0,
                cost,
                charge,
                own,
                granted_ms: now,
                deadline_ms: deadline,
                slices: [SliceRec::default(); MAX_SLICES],
            };
            let mut out = Vec::with_capacity(slices.len());
            for (k, &(li, units)) in slices.iter().enumerate() {
                let mut l = v.tenant(li as usize)?;
                l.lent += units;
                out.push(Slice {
                    lender: l.id_str().to_string(),
                    units,
                });
                v.set_tenant(li as usize, l);
                rec.slices[k] = SliceRec {
                    lender: li,
                    _pad: 0,
                    units,
                };
            }
            let mut m = v.meta()?;
            rec.seq = m.next_seq;
            m.next_seq += 1;
            if slot as u32 >= m.lease_hwm {
                m.lease_hwm = slot as u32 + 1;
            }
            v.set_meta(m);
            v.set_lease(slot, rec);
            Ok(Ok(Lease {
                id: format!("{tenant}{no}"),
                tenant: tenant.to_string(),
                cost,
                charge,
                own,
                slices: out,
                granted_at_ms: now,
                deadline_ms: deadline,
            }))
        }
    }
}

/// Gives back a lease's units to its holder's and lenders' ledgers.
fn free_lease(v: &mut View<'_>, slot: usize, l: &LeaseRec) -> Result<(), FairError> {
    let ti = l.tenant as usize;
    let mut t = v.tenant(ti)?;
    t.live_leases = t.live_leases.saturating_sub(1);
    if t.live_leases == 0 {
        t.own_held = 0.0;
        t.borrowed = 0.0;
    } else {
        t.own_held = snap(t.own_held - l.own);
        t.borrowed = snap(t.borrowed - l.borrowed());
    }
    v.set_tenant(ti, t);
    for s in &l.slices[..(l.n_slices as usize).min(MAX_SLICES)] {
        let mut lt = v.tenant(s.lender as usize)?;
        lt.lent = snap(lt.lent - s.units);
        v.set_tenant(s.lender as usize, lt);
    }
    v.set_lease(slot, LeaseRec::default());
    Ok(())
}

fn find_live(v: &View<'_>, lease_id: &str) -> Result<Option<(usize, LeaseRec)>, FairError> {
    for (s, l) in v.live_leases()? {
        if v.lease_id(&l)? == lease_id {
            return Ok(Some((s, l)));
        }
    }
    Ok(None)
}

/// Whether `lease_id` names a lease that was issued (and so, if not live,
/// already released).
fn was_issued(v: &View<'_>, lease_id: &str) -> Result<bool, FairError> {
    for t in v.all_tenants()? {
        if let Some(rest) = lease_id.strip_prefix(t.id_str()) {
            if !rest.starts_with('0') {
                if let Ok(n) = rest.parse::<u64>() {
                    if n >= 1 && n < t.next_lease_no {
                        return Ok(true);
                    }
                }
            }
        }
    }
    Ok(false)
}

/// `release`: the holder's release is activity (idleness is measured from it).
pub(crate) fn release(v: &mut View<'_>, lease_id: &str, now: u64) -> Result<(), FairError> {
    check_now(v, now)?;
    let Some((slot, l)) = find_live(v, lease_id)? else {
        return Err(if was_issued(v, lease_id)? {
            FairError::AlreadyReleased(lease_id.to_string())
        } else {
            FairError::UnknownLease(lease_id.to_string())
        });
    };
    advance(v, now)?;
    free_lease(v, slot, &l)?;
    let mut t = v.tenant(l.tenant as usize)?;
    t.last_activity_ms = now;
    v.set_tenant(l.tenant as usize, t);
    Ok(())
}

/// Releases every lease recorded for `owner` (a dead process). Not activity
/// of the tenants: a dead process signals no presence. Returns the count.
pub(crate) fn reap_owner(v: &mut View<'_>, owner: u32, now: u64) -> Result<u64, FairError> {
    check_now(v, now)?;
    advance(v, now)?;
    let mut n = 0;
    for (slot, l) in v.live_leases()? {
        if l.owner == owner {
            free_lease(v, slot, &l)?;
            let mut t = v.tenant(l.tenant as usize)?;
            t.reaped_leases += 1;
            v.set_tenant(l.tenant as usize, t);
            n += 1;
        }
    }
    let mut m = v.meta()?;
    m.reaped_total += n;
    v.set_meta(m);
    Ok(n)
}

/// `stats(now)`.
pub(crate) fn stats(v: &mut View<'_>, now: u64) -> Result<Stats, FairError> {
    check_now(v, now)?;
    advance(v, now)?;
    let tenants = v
        .all_tenants()?
        .iter()
        .map(|t| TenantStats {
            id: t.id_str().to_string(),
            guarantee: t.guarantee,
            held: t.held(),
            borrowed: t.borrowed,
            lent: t.lent,
            want: if t.want_open == 1 { t.want } else { 0.0 },
            deficit_unit_ms: t.deficit_unit_ms,
            worst_reclaim_ms: t.worst_reclaim_plus1.checked_sub(1),
            leases: t.live_leases,
            reaped_leases: t.reaped_leases,
        })
        .collect();
    let mut over: Vec<LeaseRec> = v
        .live_leases()?
        .into_iter()
        .map(|x| x.1)
        .filter(|l| now > l.deadline_ms)
        .collect();
    over.sort_by_key(|l| l.seq);
    let overrun_leases = over
        .iter()
        .map(|l| v.lease_id(l))
        .collect::<Result<_, _>>()?;
    Ok(Stats {
        now_ms: now,
        tenants,
        overrun_leases,
    })
}

/// `plan(now)`: progressive filling over current demand (held + want).
pub(crate) fn plan(v: &mut View<'_>, now: u64) -> Result<Plan, FairError> {
    check_now(v, now)?;
    advance(v, now)?;
    let ts = v.all_tenants()?;
    let demand: Vec<(f64, f64)> = ts
        .iter()
        .map(|t| {
            (
                t.weight,
                t.held() + if t.want_open == 1 { t.want } else { 0.0 },
            )
        })
        .collect();
    let target = plan_allocation(v.p.ceiling, &demand);
    Ok(Plan {
        tenants: ts
            .iter()
            .zip(demand.iter().zip(target))
            .map(|(t, (d, x))| PlanEntry {
                id: t.id_str().to_string(),
                demand: d.1,
                target: x,
                held: t.held(),
            })
            .collect(),
    })
}

/// `fairness_report(now)`: shares of granted leases since start (Q14).
pub(crate) fn report(v: &mut View<'_>, now: u64) -> Result<FairnessReport, FairError> {
    check_now(v, now)?;
    advance(v, now)?;
    let ts = v.all_tenants()?;
    let total_cost: f64 = ts.iter().map(|t| t.granted_cost).sum();
    let total_req: f64 = ts.iter().map(|t| t.granted_requests as f64).sum();
    let share = |x: f64, tot: f64| if tot > 0.0 { x / tot } else { 0.0 };
    let unit = unit_of(v);
    let tenants: Vec<TenantShare> = ts
        .iter()
        .map(|t| {
            let cost_share = share(t.granted_cost, total_cost);
            let request_share = share(t.granted_requests as f64, total_req);
            let configured = match unit {
                FairnessUnit::Cost => cost_share,
                FairnessUnit::Requests => request_share,
            };
            TenantShare {
                id: t.id_str().to_string(),
                cost_share,
                request_share,
                skew: configured / (t.weight / v.p.total_weight),
            }
        })
        .collect();
    let mut disagree = tenants
        .iter()
        .any(|t| (t.cost_share - t.request_share).abs() > 0.05);
    for (i, x) in tenants.iter().enumerate() {
        for y in &tenants[i + 1..] {
            let dc = x.cost_share - y.cost_share;
            let dr = x.request_share - y.request_share;
            if (dc > TOLERANCE && dr < -TOLERANCE) || (dc < -TOLERANCE && dr > TOLERANCE) {
                disagree = true;
            }
        }
    }
    Ok(FairnessReport {
        tenants,
        units_disagree: disagree,
    })
}

#[cfg(test)]
mod tests {
    use super::fmt_num;

    #[test]
    fn numbers_in_explanations() {
        assert_eq!(fmt_num(50.0), "50");
        assert_eq!(fmt_num(0.0), "0");
        assert_eq!(fmt_num(-0.0), "0");
        assert_eq!(fmt_num(1e-12), "0");
        assert_eq!(fmt_num(0.15000000000000002), "0.15");
        assert_eq!(fmt_num(13.333333333333334), "13.333333333");
        assert_eq!(fmt_num(100_000.0), "100000");
    }
}
