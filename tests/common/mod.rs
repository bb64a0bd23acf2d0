//! Conformance traces of the fair-share rules (`docs/fair-share.md`),
//! written once against the `FairLedger` trait so that every home of the
//! ledger runs them.
//!
//! Cfg2 starts at -10_000; our times are unsigned, so every time in a
//! trace is shifted by +10_000 (`at(t)`), and `started_at_ms` is 0.

#![allow(dead_code)]

pub mod shm;

use shmsched::fair::{
    AcquireResult, FairConfig, FairError, FairLedger, FairnessUnit, Lease, Refusal, RefusalReason,
};

/// Builds a ledger of the home under test. `freeze` false disables
/// "refusal = activity" (the T10 seam).
pub type Make<L> = fn(FairConfig, bool) -> Result<L, FairError>;

pub const Z: u64 = 10_000;

pub fn at(t: i64) -> u64 {
    (t + Z as i64) as u64
}

pub fn cfg(
    ceiling: f64,
    unit: FairnessUnit,
    tenants: &[(&str, f64)],
    h: u64,
    i: u64,
    start: u64,
) -> FairConfig {
    FairConfig {
        ceiling,
        fairness_unit: unit,
        tenants: tenants.iter().map(|(n, w)| (n.to_string(), *w)).collect(),
        reclaim_horizon_ms: h,
        idle_after_ms: i,
        started_at_ms: start,
    }
}

pub fn cfg2() -> FairConfig {
    cfg(
        100.0,
        FairnessUnit::Cost,
        &[("a", 1.0), ("b", 1.0)],
        100,
        1000,
        0,
    )
}

#[track_caller]
pub fn ok(r: AcquireResult) -> Lease {
    match r {
        Ok(Ok(l)) => l,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[track_caller]
pub fn no(r: AcquireResult) -> Refusal {
    match r {
        Ok(Err(f)) => f,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The tenants of [`cfg2`], in constructor order.
pub const AB: &[&str] = &["a", "b"];

/// A lease's slices with their lenders named: `names` are the ledger's
/// tenants in constructor order (a slice records its lender by index).
pub fn slices(l: &Lease, names: &[&str]) -> Vec<(String, f64)> {
    l.slices
        .iter()
        .map(|s| (names[s.lender as usize].to_string(), s.units))
        .collect()
}

pub fn sl(v: &[(&str, f64)]) -> Vec<(String, f64)> {
    v.iter().map(|(a, u)| (a.to_string(), *u)).collect()
}

pub fn norm(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub fn t01<L: FairLedger>(mk: Make<L>) {
    for i in [100, 99] {
        let mut c = cfg2();
        c.idle_after_ms = i;
        let e = mk(c, true)
            .err()
            .expect("must refuse idleAfterMs <= reclaimHorizonMs")
            .to_string();
        assert!(
            e.contains(&i.to_string()) && e.contains("100"),
            "message names both values: {e}"
        );
    }
    let mut c = cfg2();
    c.idle_after_ms = 101;
    assert!(mk(c, true).is_ok());
}

pub fn t03<L: FairLedger>(mk: Make<L>) {
    let c = cfg(
        100_000.0,
        FairnessUnit::Cost,
        &[("acme", 3.0), ("globex", 1.0)],
        250,
        1000,
        0,
    );
    let mut f = mk(c, true).unwrap();
    let l = ok(f.acquire("acme", 4_200.0, 200, 0));
    assert_eq!(l.own, 4_200.0);
    assert!(l.slices.is_empty());
    let s = f.stats(0).unwrap();
    assert_eq!(s.tenant("acme").unwrap().guarantee, 75_000.0);
    assert_eq!(s.tenant("globex").unwrap().guarantee, 25_000.0);
}

pub fn t04<L: FairLedger>(mk: Make<L>) {
    let mut f = mk(cfg2(), true).unwrap();
    let e = f.acquire("zed", 1.0, 10, at(0)).unwrap_err();
    assert_eq!(e, FairError::UnknownTenant("zed".into()));
    assert!(e.to_string().contains("\"zed\""));
}

pub const T05_TEXT: &str = "Tenant \"b\" asked to hold 50 cost units for 1000ms, which exceeds the reclaim horizon of \
    100ms, and the request needs to borrow capacity because only 0 of its own guarantee is free. Borrowed capacity \
    may not be committed for longer than the horizon, because nothing here is preempted and a lender that comes back \
    would otherwise wait for the whole hold. Retry with holdMs of 100 or less, split the work so it fits inside the \
    tenant's own guarantee, or raise reclaimHorizonMs if the tenants really can tolerate waiting that long for their \
    share.";

pub fn t05<L: FairLedger>(mk: Make<L>) {
    let mut f = mk(cfg2(), true).unwrap();
    let b1 = ok(f.acquire("b", 50.0, 1000, at(0)));
    assert_eq!(b1.id, "b1");
    assert!(b1.slices.is_empty());
    let r = no(f.acquire("b", 50.0, 1000, at(0)));
    assert_eq!(r.reason, RefusalReason::HoldExceedsReclaimHorizon);
    assert_eq!(r.reason.as_str(), "hold_exceeds_reclaim_horizon");
    assert_eq!(norm(&r.explanation), norm(T05_TEXT));
    assert_eq!(r.retry_after_ms, None);
    assert_eq!(f.stats(at(0)).unwrap().tenant("b").unwrap().held, 50.0);
    let a1 = ok(f.acquire("a", 50.0, 100, at(10)));
    assert_eq!(a1.id, "a1");
    assert!(a1.slices.is_empty());
}

pub fn t06<L: FairLedger>(mk: Make<L>) {
    let mut f = mk(cfg2(), true).unwrap();
    ok(f.acquire("b", 50.0, 1000, at(0)));
    let r = no(f.acquire("b", 10.0, 101, at(0)));
    assert_eq!(r.reason, RefusalReason::HoldExceedsReclaimHorizon);
    let l = ok(f.acquire("b", 10.0, 100, at(0)));
    assert_eq!(slices(&l, AB), sl(&[("a", 10.0)]));
    assert_eq!(l.own, 0.0);
}

pub fn t07<L: FairLedger>(mk: Make<L>) {
    let mut f = mk(cfg2(), true).unwrap();
    let l = ok(f.acquire("b", 50.0, 1_000_000, at(0)));
    assert!(l.slices.is_empty());
    assert_eq!(l.deadline_ms, at(1_000_000));
}

pub fn t08<L: FairLedger>(mk: Make<L>) {
    let mut f = mk(cfg2(), true).unwrap();
    ok(f.acquire("b", 30.0, 1000, at(0)));
    let r = no(f.acquire("b", 40.0, 1000, at(0)));
    assert_eq!(r.reason, RefusalReason::HoldExceedsReclaimHorizon);
    assert!(
        r.explanation
            .contains("only 20 of its own guarantee is free"),
        "{}",
        r.explanation
    );
    let l = ok(f.acquire("b", 40.0, 100, at(0)));
    assert_eq!(l.own, 20.0);
    assert_eq!(slices(&l, AB), sl(&[("a", 20.0)]));
}

/// T09 and T27 share this prefix: b1 own, b2 borrowed from a, a refused at 10.
fn freeze_prefix<L: FairLedger>(f: &mut L, b1_hold: u64, ask_at: i64) {
    let b1 = ok(f.acquire("b", 50.0, b1_hold, at(0)));
    assert!(b1.slices.is_empty());
    let b2 = ok(f.acquire("b", 50.0, 100, at(0)));
    assert_eq!(b2.id, "b2");
    assert_eq!(slices(&b2, AB), sl(&[("a", 50.0)]));
    assert_eq!(b2.deadline_ms, at(100));
    let r = no(f.acquire("a", 50.0, 100, at(ask_at)));
    assert_eq!(r.reason, RefusalReason::GuaranteeOnLoan);
    assert_eq!(r.retry_after_ms, Some((100 - ask_at) as u64));
    assert_eq!(r.blocking_leases, vec!["b2".to_string()]);
}

pub fn t09<L: FairLedger>(mk: Make<L>) {
    let mut f = mk(cfg2(), true).unwrap();
    freeze_prefix(&mut f, 1000, 10);
    f.release("b2", at(100)).unwrap();
    let r = no(f.acquire("b", 50.0, 100, at(100)));
    assert_eq!(r.reason, RefusalReason::NoLendableCapacity);
    assert_eq!(r.retry_after_ms, None);
    let a1 = ok(f.acquire("a", 50.0, 100, at(100)));
    assert_eq!(a1.id, "a1");
    let s = f.stats(at(100)).unwrap();
    let a = s.tenant("a").unwrap();
    assert_eq!(a.worst_reclaim_ms, Some(90));
    assert_eq!(a.deficit_unit_ms, 4500.0);
    assert_eq!(s.tenant("b").unwrap().deficit_unit_ms, 0.0);
}

fn t10_tail<L: FairLedger>(f: &mut L) {
    f.release("b2", at(100)).unwrap();
    let b3 = ok(f.acquire("b", 50.0, 100, at(100)));
    assert_eq!(b3.id, "b3");
    assert_eq!(slices(&b3, AB), sl(&[("a", 50.0)]));
    assert_eq!(b3.deadline_ms, at(200));
    let r = no(f.acquire("a", 50.0, 100, at(100)));
    assert_eq!(r.reason, RefusalReason::GuaranteeOnLoan);
    assert_eq!(r.retry_after_ms, Some(100));
    assert_eq!(r.blocking_leases, vec!["b3".to_string()]);
}

pub fn t10<L: FairLedger>(mk: Make<L>) {
    // Without a's t=10 ask.
    let mut f = mk(cfg2(), true).unwrap();
    ok(f.acquire("b", 50.0, 1000, at(0)));
    ok(f.acquire("b", 50.0, 100, at(0)));
    t10_tail(&mut f);
    // With the ask, but refusal is not activity (test seam).
    let mut f = mk(cfg2(), false).unwrap();
    freeze_prefix(&mut f, 1000, 10);
    t10_tail(&mut f);
}

pub fn t12<L: FairLedger>(mk: Make<L>) {
    let mut f = mk(cfg2(), true).unwrap();
    freeze_prefix(&mut f, 1000, 0);
    f.release("b2", at(100)).unwrap();
    no(f.acquire("b", 50.0, 100, at(100)));
    ok(f.acquire("a", 50.0, 100, at(100)));
    let s = f.stats(at(100)).unwrap();
    assert_eq!(s.tenant("a").unwrap().worst_reclaim_ms, Some(100));
    assert_eq!(s.tenant("a").unwrap().deficit_unit_ms, 5000.0);
}

pub fn t19<L: FairLedger>(mk: Make<L>) {
    let c = cfg(
        100.0,
        FairnessUnit::Cost,
        &[("a", 1.0), ("b", 1.0), ("c", 4.0), ("d", 4.0)],
        100,
        1000,
        0,
    );
    let mut f = mk(c, true).unwrap();
    let d1 = ok(f.acquire("d", 40.0, 1000, at(0)));
    assert!(d1.slices.is_empty());
    let d2 = ok(f.acquire("d", 40.0, 100, at(0)));
    assert_eq!(slices(&d2, &["a", "b", "c", "d"]), sl(&[("c", 40.0)]));
    assert!(ok(f.acquire("a", 10.0, 100, at(10))).slices.is_empty());
    assert!(ok(f.acquire("b", 10.0, 100, at(10))).slices.is_empty());
    let r = no(f.acquire("c", 10.0, 100, at(10)));
    assert_eq!(r.reason, RefusalReason::GuaranteeOnLoan);
    assert_eq!(r.retry_after_ms, Some(90));
    assert_eq!(r.blocking_leases, vec!["d2".to_string()]);
}

pub fn t23<L: FairLedger>(mk: Make<L>) {
    let mut f = mk(cfg2(), true).unwrap();
    freeze_prefix(&mut f, 100, 10);
    f.release("b1", at(100)).unwrap();
    let r = no(f.acquire("a", 50.0, 100, at(150)));
    assert_eq!(r.reason, RefusalReason::GuaranteeOnLoan);
    assert_eq!(r.retry_after_ms, None);
    assert_eq!(r.blocking_leases, vec!["b2".to_string()]);
    let s = f.stats(at(150)).unwrap();
    assert_eq!(s.overrun_leases, vec!["b2".to_string()]);
    assert_eq!(s.tenant("b").unwrap().held, 50.0);
    let s = f.stats(at(10_000)).unwrap();
    assert_eq!(s.overrun_leases, vec!["b2".to_string()]);
    assert_eq!(s.tenant("b").unwrap().held, 50.0);
    let r = no(f.acquire("a", 50.0, 100, at(10_000)));
    assert_eq!(r.reason, RefusalReason::GuaranteeOnLoan);
    assert_eq!(r.retry_after_ms, None);
}

/// Runs T27 and returns the ledger for further checks.
pub fn t27_run<L: FairLedger>(f: &mut L) {
    freeze_prefix(f, 100, 10);
    f.release("b1", at(100)).unwrap();
    f.release("b2", at(100)).unwrap();
    assert_eq!(ok(f.acquire("a", 50.0, 100, at(100))).id, "a1");
    f.release("a1", at(200)).unwrap();
    assert_eq!(ok(f.acquire("a", 50.0, 100, at(200))).id, "a2");
    f.release("a2", at(300)).unwrap();
}

pub fn t27<L: FairLedger>(mk: Make<L>) {
    let mut f = mk(cfg2(), true).unwrap();
    t27_run(&mut f);
    let r = f.fairness_report(at(300)).unwrap();
    for t in ["a", "b"] {
        let x = r.tenant(t).unwrap();
        assert_eq!((x.cost_share, x.request_share, x.skew), (0.5, 0.5, 1.0));
    }
    assert!(!r.units_disagree);
    let s = f.stats(at(300)).unwrap();
    assert_eq!(s.tenant("a").unwrap().deficit_unit_ms, 4500.0);
    assert_eq!(s.tenant("b").unwrap().deficit_unit_ms, 0.0);
    assert_eq!(s.tenant("a").unwrap().worst_reclaim_ms, Some(90));
}

fn t36_run<L: FairLedger>(mk: Make<L>, unit: FairnessUnit) -> L {
    let mut c = cfg2();
    c.fairness_unit = unit;
    let mut f = mk(c, true).unwrap();
    let b = f.acquire("b", 60.0, 1000, at(0));
    match unit {
        FairnessUnit::Requests => assert_eq!(ok(b).charge, 1.0),
        FairnessUnit::Cost => {
            let r = no(b);
            assert_eq!(r.reason, RefusalReason::HoldExceedsReclaimHorizon);
            assert!(
                r.explanation
                    .contains("only 50 of its own guarantee is free"),
                "{}",
                r.explanation
            );
        }
    }
    for _ in 0..3 {
        ok(f.acquire("a", 10.0, 1000, at(0)));
    }
    f
}

pub fn t36<L: FairLedger>(mk: Make<L>) {
    let mut f = t36_run(mk, FairnessUnit::Requests);
    let r = f.fairness_report(at(0)).unwrap();
    let (a, b) = (r.tenant("a").unwrap(), r.tenant("b").unwrap());
    assert_eq!((a.request_share, b.request_share), (0.75, 0.25));
    assert!((a.cost_share - 1.0 / 3.0).abs() < 1e-12 && (b.cost_share - 2.0 / 3.0).abs() < 1e-12);
    assert!(r.units_disagree);
    assert_eq!((a.skew, b.skew), (1.5, 0.5));
    assert_eq!(f.stats(at(0)).unwrap().tenant("b").unwrap().held, 1.0);

    let mut f = t36_run(mk, FairnessUnit::Cost);
    let r = f.fairness_report(at(0)).unwrap();
    let (a, b) = (r.tenant("a").unwrap(), r.tenant("b").unwrap());
    assert_eq!(
        (a.cost_share, a.request_share, b.cost_share, b.request_share),
        (1.0, 1.0, 0.0, 0.0)
    );
    assert!(!r.units_disagree);
}

pub fn t37<L: FairLedger>(mk: Make<L>) {
    let c = cfg(
        4.0,
        FairnessUnit::Requests,
        &[("a", 1.0), ("b", 1.0)],
        100,
        1000,
        0,
    );
    let mut f = mk(c, true).unwrap();
    for _ in 0..2 {
        ok(f.acquire("a", 200.0, 1000, at(0)));
        ok(f.acquire("b", 100_000.0, 1000, at(0)));
    }
    let r = f.fairness_report(at(0)).unwrap();
    let (a, b) = (r.tenant("a").unwrap(), r.tenant("b").unwrap());
    assert_eq!((a.request_share, b.request_share), (0.5, 0.5));
    assert_eq!(a.cost_share, 0.001996007984031936);
    assert_eq!(b.cost_share, 0.998003992015968);
    assert!((b.cost_share / a.cost_share - 500.0).abs() < 1e-9);
    assert!(r.units_disagree);
    assert_eq!((a.skew, b.skew), (1.0, 1.0));
}

pub fn t41<L: FairLedger>(mk: Make<L>) {
    let c = cfg(
        0.3,
        FairnessUnit::Cost,
        &[("a", 1.0), ("b", 1.0)],
        100,
        1000,
        0,
    );
    let mut f = mk(c, true).unwrap();
    ok(f.acquire("b", 0.01, 1000, 0));
    assert!(ok(f.acquire("a", 0.1, 1000, 0)).slices.is_empty());
    let l = ok(f.acquire("a", 0.05, 1000, 0));
    assert!(l.slices.is_empty(), "absorbed by tolerance, no borrowing");
    assert_eq!(
        f.stats(0).unwrap().tenant("a").unwrap().held,
        0.15000000000000002
    );
}

pub fn t44<L: FairLedger>(mk: Make<L>) {
    let mut f = mk(cfg2(), true).unwrap();
    ok(f.acquire("b", 50.0, 1000, at(0)));
    let b2 = ok(f.acquire("b", 20.0, 100, at(0)));
    assert_eq!(slices(&b2, AB), sl(&[("a", 20.0)]));
    let r = no(f.acquire("a", 50.0, 100, at(10)));
    assert_eq!(r.reason, RefusalReason::GuaranteeOnLoan);
    assert_eq!(r.retry_after_ms, Some(90));
    assert_eq!(r.blocking_leases, vec!["b2".to_string()]);
    assert_eq!(f.stats(at(10)).unwrap().tenant("a").unwrap().held, 0.0);
    let l = ok(f.acquire("a", 30.0, 100, at(10)));
    assert!(l.slices.is_empty());
}

pub fn t45<L: FairLedger>(mk: Make<L>) {
    let mut f = mk(cfg2(), true).unwrap();
    let a1 = ok(f.acquire("a", 50.0, 10, at(0)));
    f.release(&a1.id, at(0)).unwrap();
    assert_eq!(ok(f.acquire("a", 50.0, 10, at(0))).id, "a2");
}

pub fn p1<L: FairLedger>(mk: Make<L>) {
    // P1 through the ledger: a holds 30; b holds 50 and wants 50 more.
    let mut f = mk(cfg2(), true).unwrap();
    ok(f.acquire("a", 30.0, 1000, at(0)));
    ok(f.acquire("b", 50.0, 1000, at(0)));
    no(f.acquire("b", 50.0, 1000, at(0)));
    let p = f.plan(at(0)).unwrap();
    assert_eq!((p.target("a"), p.target("b")), (Some(30.0), Some(70.0)));
    // The want lapses idleAfterMs after b's last ask: demand falls back to held.
    let p = f.plan(at(1000)).unwrap();
    assert_eq!((p.target("a"), p.target("b")), (Some(30.0), Some(50.0)));
}

/// Every Q17 misuse is an error, names the bad value, changes nothing and
/// is not activity.
pub fn misuse<L: FairLedger>(mk: Make<L>) {
    let mut f = mk(cfg2(), true).unwrap();
    ok(f.acquire("b", 50.0, 1000, at(0)));
    ok(f.acquire("b", 50.0, 100, at(0)));
    let before = f.stats(at(0)).unwrap();
    let cases: Vec<(FairError, String)> = vec![
        (
            f.acquire("nobody", 1.0, 10, at(5)).unwrap_err(),
            "nobody".into(),
        ),
        (f.acquire("a", -1.0, 10, at(5)).unwrap_err(), "-1".into()),
        (
            f.acquire("a", f64::NAN, 10, at(5)).unwrap_err(),
            "NaN".into(),
        ),
        (
            f.acquire("a", f64::INFINITY, 10, at(5)).unwrap_err(),
            "inf".into(),
        ),
        (
            f.acquire("a", 1.0, 0, at(5)).unwrap_err(),
            "hold_ms 0".into(),
        ),
        (f.release("b9", at(5)).unwrap_err(), "b9".into()),
        (f.release("zz1", at(5)).unwrap_err(), "zz1".into()),
    ];
    for (e, needle) in &cases {
        assert!(
            e.to_string().contains(needle.as_str()),
            "{e} should name {needle}"
        );
    }
    f.release("b2", at(5)).unwrap();
    let e = f.release("b2", at(6)).unwrap_err();
    assert_eq!(e, FairError::AlreadyReleased("b2".into()));
    // Nothing changed for a: still idle (lendable), no want, no deficit.
    let s = f.stats(at(6)).unwrap();
    let a = s.tenant("a").unwrap();
    assert_eq!((a.held, a.want, a.deficit_unit_ms), (0.0, 0.0, 0.0));
    assert_eq!(before.tenant("a").unwrap().held, 0.0);
    // a was never active: b can still borrow all of a's 50.
    let l = ok(f.acquire("b", 50.0, 100, at(6)));
    assert_eq!(slices(&l, AB), sl(&[("a", 50.0)]));
    assert_eq!(l.id, "b3");
}

/// Ruling Q22 in-process: `now` earlier than the last accepted `now` (or
/// than `started_at_ms`) is misuse, names the value and changes nothing.
pub fn time_backwards_is_misuse<L: FairLedger>(mk: Make<L>) {
    let mut f = mk(cfg2(), true).unwrap();
    ok(f.acquire("b", 50.0, 100, at(0)));
    f.release("b1", at(5)).unwrap();
    let e = f.release("b1", at(6)).unwrap_err();
    assert_eq!(e, FairError::AlreadyReleased("b1".into()));
    let e = f.acquire("a", 1.0, 10, at(4)).unwrap_err();
    // The refused double release at 6 was not accepted: the last accepted now is 5.
    assert_eq!(
        e,
        FairError::TimeWentBackwards {
            now_ms: at(4),
            last_ms: at(5)
        }
    );
    assert!(e.to_string().contains(&at(4).to_string()));
    let mut c = cfg2();
    c.started_at_ms = 100;
    let mut g = mk(c, true).unwrap();
    let e = g.acquire("a", 1.0, 10, 99).unwrap_err();
    assert_eq!(
        e,
        FairError::BeforeStart {
            now_ms: 99,
            started_at_ms: 100
        }
    );
    // a was never active: b can still borrow all of a's 50.
    let l = ok(f.acquire("b", 50.0, 100, at(5)));
    assert_eq!(l.own, 50.0);
    let l = ok(f.acquire("b", 50.0, 100, at(5)));
    assert_eq!(slices(&l, AB), sl(&[("a", 50.0)]));
}

/// Issue 20, point 1, in a region: a `now` earlier than the last accepted
/// one (or than `started_at_ms`) is taken as the last accepted one, so two
/// processes that read the clock and race to the lock never fail, and a
/// release never fails for time. The lease, the stats and the deadline say
/// which instant was used.
pub fn time_backwards_is_clamped<L: FairLedger>(mk: Make<L>) {
    let mut f = mk(cfg2(), true).unwrap();
    let b1 = ok(f.acquire("b", 50.0, 100, at(50)));
    assert_eq!(b1.granted_at_ms, at(50));
    let late = ok(f.acquire("b", 10.0, 100, at(10)));
    assert_eq!((late.granted_at_ms, late.deadline_ms), (at(50), at(150)));
    f.release(&late.id, at(0)).unwrap();
    f.release("b1", 0).unwrap();
    let e = f.release("b1", 0).unwrap_err();
    assert_eq!(e, FairError::AlreadyReleased("b1".into()));
    let s = f.stats(at(20)).unwrap();
    assert_eq!(s.now_ms, at(50));
    // b's last activity is at 50, not at 0: b is lendable only from 1050.
    let r = no(f.acquire("a", 60.0, 100, at(1049)));
    assert_eq!(r.reason, RefusalReason::NoLendableCapacity);
    let l = ok(f.acquire("a", 60.0, 100, at(1050)));
    assert_eq!(slices(&l, AB), sl(&[("b", 10.0)]));
}

/// Issue 20, point 9: a lease id is the tenant id followed by the lease
/// number in plain decimal (no sign, no leading zero, no space); anything
/// else is an unknown lease, whatever number it would parse to.
pub fn strict_lease_ids<L: FairLedger>(mk: Make<L>) {
    let mut f = mk(cfg2(), true).unwrap();
    let a1 = ok(f.acquire("a", 10.0, 100, at(0)));
    assert_eq!(a1.id, "a1");
    for bogus in [
        "a+1",
        "a01",
        "a1 ",
        " a1",
        "a-1",
        "a",
        "",
        "a0",
        "a2",
        "1",
        "b1",
        "a18446744073709551616",
        "a99999999999999999999999",
        "a１",
        "A1",
    ] {
        assert_eq!(
            f.release(bogus, at(1)).unwrap_err(),
            FairError::UnknownLease(bogus.into()),
            "{bogus:?}"
        );
    }
    f.release("a1", at(2)).unwrap();
    for (bogus, e) in [
        ("a1", FairError::AlreadyReleased("a1".into())),
        ("a+1", FairError::UnknownLease("a+1".into())),
    ] {
        assert_eq!(f.release(bogus, at(3)).unwrap_err(), e);
    }
}

#[macro_export]
macro_rules! trace_suite {
    ($mk:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                common::$name($mk);
            }
        )*
    };
}
