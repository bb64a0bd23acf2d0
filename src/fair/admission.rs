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
//! outstanding, Q10), the instant it opened and `integrated_to_ms`. The
//! deficit grows at the rate `min(guarantee, held + want) − held` (Q9; zero
//! without a want), which only a call *of that tenant* changes (its grant,
//! release, refusal or reaped lease: lending does not enter the rate). So a
//! tenant is integrated from `integrated_to_ms` to `now` lazily, just
//! before a call changes its held units or its want ([`integrate`]), and
//! `stats` and `plan` integrate copies up to their `now` without storing
//! them: a call touches the records of the tenants it concerns, never all
//! of them. A want lapses at `last_ask + idle_after_ms`: the integral is cut
//! at that instant (D20) and the in-progress wait is dropped without being
//! recorded (D28); that instant is fixed when the want opens, so a lazy
//! integration finds the same cut. A grant ends the wait and records its
//! length in `worst_reclaim` (Q8).
//!
//! # Time
//!
//! In-process (and in replays), a `now` earlier than the last accepted one
//! or than `started_at_ms` is misuse (Q22). In a region the view is built
//! with `clamp_time`: such a `now` is taken as the last accepted one (which
//! is never earlier than `started_at_ms`), so processes that read the clock
//! and then race for the lock never fail, and a release never fails for
//! time. Every instant recorded (grant time, deadline, activity, the stats'
//! `now_ms`) is the one taken, so a log of the calls with these instants
//! replays exactly in-process.
//!
//! # Allocation
//!
//! A grant, a release and [`stats_into`] allocate nothing: the lender pool
//! and the borrowed slices are fixed arrays of at most [`MAX_SLICES`], ids
//! are inline ([`LeaseId`], [`TenantId`]), and the overrun list is sorted in
//! a caller-owned scratch vector. Refusals build their explanation.

use std::ptr;

use super::config::FairnessUnit;
use super::error::FairError;
use super::plan::plan_allocation;
use super::store::{
    Found, LeaseRec, MetaRec, SliceRec, TenantRec, View, COUNTER_LIMIT, FLAG_REFUSAL_NOT_ACTIVITY,
    MAX_SLICES,
};
use super::types::{
    FairnessReport, Lease, LeaseId, Plan, PlanEntry, Refusal, RefusalReason, Slice, Slices, Stats,
    TenantId, TenantShare, TenantStats,
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

/// The instant a call at `now` is taken at, and the validated meta record.
/// In-process (ruling Q22) `now` may not precede `startedAt` or the last
/// accepted `now`; in a region (`clamp_time`) it is raised to the last
/// accepted one. Call first: nothing is written.
pub(crate) fn accept_now(v: &View<'_>, now: u64) -> Result<(u64, MetaRec), FairError> {
    let m = v.meta()?;
    if v.clamp_time {
        return Ok((now.max(m.last_now_ms).max(v.p.started_at_ms), m));
    }
    if now < v.p.started_at_ms {
        return Err(FairError::BeforeStart {
            now_ms: now,
            started_at_ms: v.p.started_at_ms,
        });
    }
    if now < m.last_now_ms {
        return Err(FairError::TimeWentBackwards {
            now_ms: now,
            last_ms: m.last_now_ms,
        });
    }
    Ok((now, m))
}

/// Records `now` as the last accepted instant (after every check passed).
fn note_now(v: &mut View<'_>, mut m: MetaRec, now: u64) -> Result<(), FairError> {
    if now > m.last_now_ms {
        m.last_now_ms = now;
        v.set_meta(m)?;
    }
    Ok(())
}

/// Integrates `t`'s deficit up to `now` and lapses its want if due (see
/// the module docs). Call before changing the tenant's held units or want.
pub(crate) fn integrate(t: &mut TenantRec, idle_after_ms: u64, now: u64) {
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

fn is_idle(t: &TenantRec, idle_after_ms: u64, now: u64) -> bool {
    t.live_leases == 0 && t.last_activity_ms <= now && now - t.last_activity_ms >= idle_after_ms
}

/// The idle lenders other than the requester: the [`MAX_SLICES`] with the
/// most free units (largest first, ties by constructor order, ruling Q7),
/// and how many there are and hold in all.
struct Pool {
    top: [(u32, f64); MAX_SLICES],
    n: usize,
    count: usize,
    all: f64,
}

impl Pool {
    fn top(&self) -> &[(u32, f64)] {
        &self.top[..self.n]
    }
}

fn lenders(v: &View<'_>, me: usize, now: u64) -> Result<Pool, FairError> {
    let mut pool = Pool {
        top: [(0, 0.0); MAX_SLICES],
        n: 0,
        count: 0,
        all: 0.0,
    };
    for i in (0..v.n()).filter(|&i| i != me) {
        let t = v.tenant(i)?;
        let free = t.guarantee - t.own_held - t.lent;
        if !is_idle(&t, v.p.idle_after_ms, now) || free <= TOLERANCE {
            continue;
        }
        pool.count += 1;
        pool.all += free;
        // Insertion into the sorted top: after every entry with at least
        // as many free units (an earlier tenant wins a tie).
        let at = pool.top[..pool.n]
            .iter()
            .position(|&(_, f)| f < free)
            .unwrap_or(pool.n);
        if at < MAX_SLICES {
            let end = (pool.n + 1).min(MAX_SLICES);
            pool.top.copy_within(at..end - 1, at + 1);
            pool.top[at] = (i as u32, free);
            pool.n = end;
        }
    }
    Ok(pool)
}

/// Borrowed slices of a grant: at most [`MAX_SLICES`] `(lender, units)`.
#[derive(Clone, Copy)]
struct Cover {
    s: [(u32, f64); MAX_SLICES],
    n: usize,
}

impl Cover {
    const NONE: Cover = Cover {
        s: [(0, 0.0); MAX_SLICES],
        n: 0,
    };

    fn slices(&self) -> &[(u32, f64)] {
        &self.s[..self.n]
    }
}

/// Slices covering `need` from `lenders` in order, or `None`.
fn cover(lenders: &[(u32, f64)], need: f64) -> Option<Cover> {
    let mut out = Cover::NONE;
    if need <= TOLERANCE {
        return Some(out);
    }
    let mut remaining = need;
    for &(i, free) in lenders.iter().take(MAX_SLICES) {
        let take = free.min(remaining);
        if remaining - take <= TOLERANCE {
            out.s[out.n] = (i, remaining);
            out.n += 1;
            return Some(out);
        }
        out.s[out.n] = (i, take);
        out.n += 1;
        remaining -= take;
    }
    None
}

/// What [`decide`] found. Small on purpose (it is moved through the
/// call): a grant's borrowed slices are written to the caller's [`Cover`]
/// (`borrows` says whether they were), a refusal is boxed (it allocates
/// its explanation anyway).
enum Decision {
    Grant { own: f64, borrows: bool },
    Refuse(Box<Refusal>),
}

struct Ask<'s> {
    ti: usize,
    name: &'s str,
    charge: f64,
    hold: u64,
    now: u64,
}

/// Decides an acquire (nothing is written to the ledger). A grant that
/// borrows writes its slices to `out` and answers `borrows: true`; `out`
/// is left alone otherwise.
fn decide(
    v: &View<'_>,
    a: &Ask<'_>,
    me: &TenantRec,
    out: &mut std::mem::MaybeUninit<Cover>,
) -> Result<Decision, FairError> {
    let p = v.p;
    let (name, charge, hold, now) = (a.name, a.charge, a.hold, a.now);
    let h = p.reclaim_horizon_ms;
    // (2) a charge no ceiling can hold.
    if charge > p.ceiling + TOLERANCE {
        let unit = unit_of(v).noun();
        return Ok(Decision::Refuse(Box::new(Refusal {
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
        })));
    }
    // (3) fits the own free units: no horizon limit.
    let own_free = me.guarantee - me.own_held - me.lent;
    if charge <= own_free + TOLERANCE {
        return Ok(Decision::Grant {
            own: charge,
            borrows: false,
        });
    }
    let own_part = own_free.max(0.0);
    let need = charge - own_part;
    let pool = lenders(v, a.ti, now)?;
    // (4) would fit once its own loans return.
    if me.lent > TOLERANCE && charge <= own_free + me.lent + TOLERANCE {
        if hold <= h {
            if let Some(cover) = cover(pool.top(), need) {
                out.write(cover);
                return Ok(Decision::Grant {
                    own: own_part,
                    borrows: true,
                });
            }
        }
        return Ok(Decision::Refuse(Box::new(on_loan(
            v,
            a,
            me,
            own_part,
            need,
            hold > h && pool.count > 0,
        )?)));
    }
    let unit = unit_of(v).noun();
    // (5) borrowing for longer than the horizon is refused outright.
    if hold > h {
        return Ok(Decision::Refuse(Box::new(Refusal {
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
        })));
    }
    // (6) idle lenders, largest first.
    if let Some(cover) = cover(pool.top(), need) {
        out.write(cover);
        return Ok(Decision::Grant {
            own: own_part,
            borrows: true,
        });
    }
    // (7) nothing to borrow.
    let usable: f64 = pool.top().iter().map(|l| l.1).sum();
    let spread = if pool.all + TOLERANCE >= need && pool.count > MAX_SLICES {
        format!(" ({} idle tenants hold enough in total, but one lease may borrow from at most {MAX_SLICES} of them.)", pool.count)
    } else {
        String::new()
    };
    Ok(Decision::Refuse(Box::new(Refusal {
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
    })))
}

/// The live leases, as `(slot, record)`.
fn live_leases<'v>(
    v: &'v View<'_>,
    m: &MetaRec,
) -> impl Iterator<Item = Result<(usize, LeaseRec), FairError>> + 'v {
    (0..m.live_count as usize).map(move |pos| v.live_lease(pos))
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
    let m = v.meta()?;
    let mut loans: Vec<(LeaseRec, f64)> = Vec::new();
    for x in live_leases(v, &m) {
        let (_, l) = x?;
        let u = l.units_from(ti);
        if u > 0.0 {
            loans.push((l, u));
        }
    }
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
    let join = |ids: &[LeaseId]| {
        ids.iter()
            .map(|i| i.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let names = |ids: &[LeaseId]| ids.iter().map(|i| i.to_string()).collect::<Vec<_>>();
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
            join(&ids)
        ),
        None if !overrun.is_empty() => {
            let over = overrun.iter().map(|l| v.lease_id(l)).collect::<Result<Vec<_>, _>>()?;
            format!(
                "Lease {} has run past its declared deadline (by {}ms), so no reclaim time can be promised; it stays \
                 counted against the ceiling until its holder releases it.",
                join(&over),
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
        blocking_leases: names(&ids),
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

/// What [`acquire`] answered (the lease itself is written in place).
pub(crate) enum Answer {
    /// Granted: the lease was written to `out`.
    Granted,
    /// Refused, with the reason (boxed: the answer is moved through every
    /// layer of a call, and a grant's is then two words, not a `Refusal`'s
    /// hundred bytes; a refusal allocates its explanation anyway).
    Refused(Box<Refusal>),
    /// Deferred: nothing was written (see [`acquire`]).
    Deferred,
}

impl Answer {
    /// The public answer, built in place. `out` must be the one [`acquire`]
    /// wrote to. `Deferred` (which only the caller that asked for it can
    /// get, and then does not call this) is a corrupt-ledger error.
    #[inline(always)]
    pub(crate) fn into_result(
        self,
        out: &std::mem::MaybeUninit<Lease>,
    ) -> Result<Result<Lease, Refusal>, FairError> {
        match self {
            // SAFETY: `acquire` answers `Granted` only after writing `out`
            // (the last thing it does on that path).
            Answer::Granted => Ok(Ok(unsafe { out.assume_init_read() })),
            Answer::Refused(r) => Ok(Err(*r)),
            Answer::Deferred => Err(FairError::Corrupt(
                "an acquire was deferred where it may not be".into(),
            )),
        }
    }
}

/// `acquire`: misuse → `Err`; refusal → `Ok(Refused)`; grant →
/// `Ok(Granted)` with the lease written to `out` (in place: a lease is a
/// few hundred bytes, and it is not moved through the layers above). When
/// the answer would be a refusal or a full lease table and `defer()` says
/// so, nothing is written and the answer is `Ok(Deferred)` (the region
/// home then reaps dead processes and asks again, so that a refusal is
/// recorded once).
#[allow(clippy::too_many_arguments)]
pub(crate) fn acquire(
    v: &mut View<'_>,
    owner: u32,
    tenant: &str,
    cost: f64,
    hold_ms: u64,
    now: u64,
    defer: &mut dyn FnMut() -> bool,
    out: &mut std::mem::MaybeUninit<Lease>,
) -> Result<Answer, FairError> {
    // (1) misuse: nothing below this block may fail for a caller's reason.
    let (now, m) = accept_now(v, now)?;
    let ti = v
        .find_tenant(tenant)
        .ok_or_else(|| FairError::UnknownTenant(tenant.to_string()))?;
    let mut me_buf = std::mem::MaybeUninit::uninit();
    let me = v.tenant_into(ti, &mut me_buf)?;
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
    let mut cover_buf = std::mem::MaybeUninit::uninit();
    let decision = decide(v, &ask, me, &mut cover_buf)?;
    let slot = match decision {
        Decision::Grant { .. } => match v.take_slot(m)? {
            Some(s) => Some(s),
            None if defer() => return Ok(Answer::Deferred),
            None => {
                return Err(FairError::CapacityExhausted {
                    what: "lease table",
                    limit: v.capacity(),
                })
            }
        },
        Decision::Refuse(_) => None,
    };
    let deadline = now
        .checked_add(hold_ms)
        .ok_or(FairError::InvalidHold(hold_ms))?;
    if matches!(decision, Decision::Refuse(_)) && defer() {
        return Ok(Answer::Deferred);
    }
    // From here on the call is accepted and recorded.
    integrate(me, v.p.idle_after_ms, now);
    me.last_ask_ms = now;
    let (own, cover, slot, mut m) = match (decision, slot) {
        (Decision::Refuse(r), _) => {
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
            v.set_tenant(ti, me)?;
            note_now(v, m, now)?;
            return Ok(Answer::Refused(r));
        }
        (Decision::Grant { own, borrows }, Some((slot, m))) => {
            let cover: &[(u32, f64)] = if borrows {
                // SAFETY: `decide` wrote the cover when it answered
                // `borrows: true`.
                unsafe { cover_buf.assume_init_ref() }.slices()
            } else {
                &[]
            };
            (own, cover, slot, m)
        }
        (Decision::Grant { .. }, None) => {
            return Err(FairError::Corrupt("a grant without a slot".into()))
        }
    };
    me.last_activity_ms = now;
    if me.want_open == 1 {
        let waited = now - me.want_since_ms.min(now);
        me.worst_reclaim_plus1 = me
            .worst_reclaim_plus1
            .max(waited.saturating_add(1).min(COUNTER_LIMIT));
        me.want_open = 0;
        me.want = 0.0;
    }
    let borrowed: f64 = cover.iter().map(|s| s.1).sum();
    me.own_held += own;
    me.borrowed += borrowed;
    me.live_leases += 1;
    let no = me.next_lease_no;
    me.next_lease_no += 1;
    me.granted_requests += 1;
    me.granted_cost += cost;
    v.set_tenant(ti, me)?;
    let mut rec = LeaseRec {
        state: 1,
        tenant: ti as u32,
        owner,
        n_slices: cover.len() as u32,
        no,
        seq: m.next_seq,
        cost,
        charge,
        own,
        granted_ms: now,
        deadline_ms: deadline,
        ..LeaseRec::default()
    };
    // The lease is built where the caller keeps it: a `Lease` is 232
    // bytes, and building it here and moving it there cost a copy.
    let o = out.as_mut_ptr();
    // SAFETY: `o` points at the caller's `MaybeUninit<Lease>`, valid for
    // writes; `addr_of_mut!` names the field without reading or making a
    // reference to uninitialised memory, and `write` does not drop the
    // (uninitialised) old value. After it, `slices` is initialised (an
    // empty `Slices`), so a `&mut` to it is sound; `out` stays borrowed
    // by this function meanwhile, so nothing else aliases it.
    let slices = unsafe {
        let at = ptr::addr_of_mut!((*o).slices);
        at.write(Slices::new());
        &mut *at
    };
    for (k, &(li, units)) in cover.iter().enumerate() {
        let mut l = v.tenant(li as usize)?;
        l.lent += units;
        slices.push(Slice { lender: li, units });
        v.set_tenant(li as usize, &l)?;
        rec.slices[k] = SliceRec {
            lender: li,
            _pad: 0,
            units,
        };
    }
    m.next_seq += 1;
    m.last_now_ms = m.last_now_ms.max(now);
    v.insert_lease(&mut m, slot, &rec)?;
    v.set_meta(m)?;
    let bad_id = || FairError::Corrupt(format!("tenant id \"{tenant}\" too long"));
    let tenant_id = TenantId::new(tenant).ok_or_else(bad_id)?;
    let id = LeaseId::of(&tenant_id, no);
    // SAFETY: as above (`o` is valid for writes and not aliased: `slices`
    // is no longer used); every field but `slices` (written above) is
    // written here, so the whole lease is initialised when this returns
    // `Granted`.
    unsafe {
        ptr::addr_of_mut!((*o).id).write(id);
        ptr::addr_of_mut!((*o).tenant).write(tenant_id);
        ptr::addr_of_mut!((*o).cost).write(cost);
        ptr::addr_of_mut!((*o).charge).write(charge);
        ptr::addr_of_mut!((*o).own).write(own);
        ptr::addr_of_mut!((*o).granted_at_ms).write(now);
        ptr::addr_of_mut!((*o).deadline_ms).write(deadline);
    }
    Ok(Answer::Granted)
}

/// Gives back a lease's units to its holder's and lenders' ledgers and
/// frees its slot. A release is activity of the holder; a reap is not, and
/// counts in `reaped_leases`.
fn free_lease(
    v: &mut View<'_>,
    m: &mut MetaRec,
    f: &Found,
    l: &LeaseRec,
    now: u64,
    reaped: bool,
) -> Result<(), FairError> {
    let ti = l.tenant as usize;
    let mut t_buf = std::mem::MaybeUninit::uninit();
    let t = v.tenant_into(ti, &mut t_buf)?;
    integrate(t, v.p.idle_after_ms, now);
    t.live_leases = t.live_leases.saturating_sub(1);
    if t.live_leases == 0 {
        t.own_held = 0.0;
        t.borrowed = 0.0;
    } else {
        t.own_held = snap(t.own_held - l.own);
        t.borrowed = snap(t.borrowed - l.borrowed());
    }
    if reaped {
        t.reaped_leases += 1;
        m.reaped_total += 1;
    } else {
        t.last_activity_ms = now;
    }
    v.set_tenant(ti, t)?;
    for s in &l.slices[..(l.n_slices as usize).min(MAX_SLICES)] {
        let mut lt = v.tenant(s.lender as usize)?;
        lt.lent = snap(lt.lent - s.units);
        v.set_tenant(s.lender as usize, &lt)?;
    }
    v.remove_lease(m, f, l)
}

/// `release`: the holder's release is activity (idleness is measured from
/// it). Any process may release any live lease by its id.
pub(crate) fn release(v: &mut View<'_>, lease_id: &str, now: u64) -> Result<(), FairError> {
    let (now, mut m) = accept_now(v, now)?;
    let Some((ti, no)) = v.parse_lease_id(lease_id) else {
        return Err(FairError::UnknownLease(lease_id.to_string()));
    };
    let Some(f) = v.find_lease(ti, no)? else {
        return Err(if no < v.tenant(ti)?.next_lease_no {
            FairError::AlreadyReleased(lease_id.to_string())
        } else {
            FairError::UnknownLease(lease_id.to_string())
        });
    };
    let mut rec = LeaseRec::default();
    v.lease_into(f.slot, &mut rec)?;
    free_lease(v, &mut m, &f, &rec, now, false)?;
    m.last_now_ms = m.last_now_ms.max(now);
    v.set_meta(m)
}

/// Releases every lease recorded for `owner` (a dead process), one at a
/// time, calling `commit` after each (the region home commits each release
/// on its own, so the undo journal stays small). Not activity of the
/// tenants: a dead process signals no presence. Returns the count.
pub(crate) fn reap_owner(
    v: &mut View<'_>,
    owner: u32,
    now: u64,
    commit: &mut dyn FnMut(&mut View<'_>) -> Result<(), FairError>,
) -> Result<u64, FairError> {
    let (now, mut m) = accept_now(v, now)?;
    let mut n = 0;
    // Backwards: a release moves the last live entry into the freed
    // position, which this scan has already passed.
    let mut pos = m.live_count as usize;
    while pos > 0 {
        pos -= 1;
        let (_, l) = v.live_lease(pos)?;
        if l.owner != owner {
            continue;
        }
        let f = v.find_lease(l.tenant as usize, l.no)?.ok_or_else(|| {
            FairError::Corrupt(format!("live lease at position {pos} is on no hash chain"))
        })?;
        let rec = v.lease(f.slot)?;
        free_lease(v, &mut m, &f, &rec, now, true)?;
        m.last_now_ms = m.last_now_ms.max(now);
        v.set_meta(m)?;
        commit(v)?;
        n += 1;
    }
    Ok(n)
}

/// One tenant's line of `stats` at `now` (integrating a copy).
pub(crate) fn tenant_stats(
    t: &TenantRec,
    idle_after_ms: u64,
    now: u64,
) -> Result<TenantStats, FairError> {
    let mut t = *t;
    integrate(&mut t, idle_after_ms, now);
    Ok(TenantStats {
        id: TenantId::new(t.id_str())
            .ok_or_else(|| FairError::Corrupt("a tenant id is too long".into()))?,
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
}

/// `stats(now)` into `out` (reusing its vectors: with the same number of
/// tenants and no more overrun leases than its capacity, nothing is
/// allocated). `scratch` sorts the overrun leases.
pub(crate) fn stats_into(
    v: &mut View<'_>,
    now: u64,
    out: &mut Stats,
    scratch: &mut Vec<(u64, u32)>,
) -> Result<(), FairError> {
    let (now, m) = accept_now(v, now)?;
    let n = v.n();
    out.tenants.truncate(n);
    for i in 0..n {
        let line = tenant_stats(&v.tenant(i)?, v.p.idle_after_ms, now)?;
        match out.tenants.get_mut(i) {
            Some(x) => *x = line,
            None => out.tenants.push(line),
        }
    }
    scratch.clear();
    for x in live_leases(v, &m) {
        let (slot, l) = x?;
        if now > l.deadline_ms {
            scratch.push((l.seq, slot as u32));
        }
    }
    scratch.sort_unstable();
    out.overrun_leases.clear();
    for &(_, slot) in scratch.iter() {
        out.overrun_leases
            .push(v.lease_id(&v.lease(slot as usize)?)?);
    }
    out.now_ms = now;
    note_now(v, m, now)
}

/// `plan(now)`: progressive filling over current demand (held + want).
pub(crate) fn plan(v: &mut View<'_>, now: u64) -> Result<Plan, FairError> {
    let (now, m) = accept_now(v, now)?;
    let mut ts = Vec::with_capacity(v.n());
    for i in 0..v.n() {
        let mut t = v.tenant(i)?;
        integrate(&mut t, v.p.idle_after_ms, now);
        ts.push(t);
    }
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
    let mut tenants = Vec::with_capacity(ts.len());
    for (t, (d, x)) in ts.iter().zip(demand.iter().zip(target)) {
        tenants.push(PlanEntry {
            id: TenantId::new(t.id_str())
                .ok_or_else(|| FairError::Corrupt("a tenant id is too long".into()))?,
            demand: d.1,
            target: x,
            held: t.held(),
        });
    }
    note_now(v, m, now)?;
    Ok(Plan { tenants })
}

/// `fairness_report(now)`: shares of granted leases since start (Q14).
pub(crate) fn report(v: &mut View<'_>, now: u64) -> Result<FairnessReport, FairError> {
    let (now, m) = accept_now(v, now)?;
    let ts = (0..v.n())
        .map(|i| v.tenant(i))
        .collect::<Result<Vec<_>, _>>()?;
    let total_cost: f64 = ts.iter().map(|t| t.granted_cost).sum();
    let total_req: f64 = ts.iter().map(|t| t.granted_requests as f64).sum();
    let share = |x: f64, tot: f64| if tot > 0.0 { x / tot } else { 0.0 };
    let unit = unit_of(v);
    let mut tenants: Vec<TenantShare> = Vec::with_capacity(ts.len());
    for t in &ts {
        let cost_share = share(t.granted_cost, total_cost);
        let request_share = share(t.granted_requests as f64, total_req);
        let configured = match unit {
            FairnessUnit::Cost => cost_share,
            FairnessUnit::Requests => request_share,
        };
        tenants.push(TenantShare {
            id: TenantId::new(t.id_str())
                .ok_or_else(|| FairError::Corrupt("a tenant id is too long".into()))?,
            cost_share,
            request_share,
            skew: configured / (t.weight / v.p.total_weight),
        });
    }
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
    note_now(v, m, now)?;
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
