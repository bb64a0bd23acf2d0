//! Behaviour of the in-process ledger beyond the listed traces: reclaim
//! bounds under an adversarial borrower, lender attribution, overruns,
//! wants and deficits, both units, and record/replay.

mod common;

use common::{at, cfg, cfg2, no, ok, sl, slices, AB};
use serde_json::Value;
use shmsched::fair::replay::{acquire_json, release_json, value_json};
use shmsched::fair::{
    replay, AcquireResult, FairConfig, FairError, FairLedger, FairShare, FairnessReport,
    FairnessUnit, Plan, RefusalReason, Stats,
};

/// Tenants of the lender-attribution configurations, in constructor order
/// (a slice names its lender by index).
const XPQR: &[&str] = &["x", "p", "q", "r"];
const ABC: &[&str] = &["a", "b", "c"];

/// Wraps a recording ledger and keeps the replay line of every answer.
struct Capture {
    f: FairShare,
    out: Vec<Value>,
}

impl Capture {
    fn new(c: FairConfig) -> Capture {
        Capture {
            f: FairShare::recording(c, 64).unwrap(),
            out: vec![serde_json::json!({"ok": true})],
        }
    }
    fn replayed(&self) -> Vec<Value> {
        let log = self.f.call_log().unwrap().join("\n");
        let mut buf = Vec::new();
        replay(log.as_bytes(), &mut buf).unwrap();
        String::from_utf8(buf)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl FairLedger for Capture {
    fn acquire(&mut self, tenant: &str, cost: f64, hold_ms: u64, now_ms: u64) -> AcquireResult {
        let r = self.f.acquire(tenant, cost, hold_ms, now_ms);
        self.out.push(acquire_json(self.f.config(), &r));
        r
    }
    fn release(&mut self, lease_id: &str, now_ms: u64) -> Result<(), FairError> {
        let r = self.f.release(lease_id, now_ms);
        self.out.push(release_json(&r));
        r
    }
    fn stats(&mut self, now_ms: u64) -> Result<Stats, FairError> {
        let r = self.f.stats(now_ms);
        self.out.push(value_json(&r));
        r
    }
    fn plan(&mut self, now_ms: u64) -> Result<Plan, FairError> {
        let r = self.f.plan(now_ms);
        self.out.push(value_json(&r));
        r
    }
    fn fairness_report(&mut self, now_ms: u64) -> Result<FairnessReport, FairError> {
        let r = self.f.fairness_report(now_ms);
        self.out.push(value_json(&r));
        r
    }
}

/// T45: replaying T27's recorded log on a fresh instance gives deep-equal
/// results (ids, retryAfterMs, blockingLeases, stats, report).
#[test]
fn t45_replay_of_t27_is_identical() {
    let mut c = Capture::new(cfg2());
    common::t27_run(&mut c);
    c.stats(at(300)).unwrap();
    c.fairness_report(at(300)).unwrap();
    c.plan(at(300)).unwrap();
    let _ = c.release("a2", at(300)); // misuse is replayed too
    let replayed = c.replayed();
    assert_eq!(replayed, c.out);
    assert_eq!(replayed[3]["retry_after_ms"], 90);
    assert_eq!(replayed[3]["blocking_leases"], serde_json::json!(["b2"]));
    assert_eq!(
        replayed[2]["slices"],
        serde_json::json!([{"lender": "a", "units": 50}])
    );
    let stats = &replayed[replayed.len() - 4];
    assert_eq!(stats["tenants"]["a"]["deficit_unit_ms"], 4500);
    assert_eq!(stats["tenants"]["a"]["worst_reclaim_ms"], 90);
    assert_eq!(
        replayed.last().unwrap()["error"],
        "lease \"a2\" was already released"
    );
}

/// The call-log format of `docs/fair-share.md`, line by line, including a misuse
/// line in the middle that does not stop the replay.
#[test]
fn replay_documented_format() {
    let log = r#"{"op":"config","ceiling":100,"fairness_unit":"cost","tenants":[{"id":"a","weight":1},{"id":"b","weight":1}],"reclaim_horizon_ms":100,"idle_after_ms":1000,"started_at_ms":0}
{"op":"acquire","tenant":"b","cost":50,"hold_ms":1000,"now_ms":10000}
{"op":"acquire","tenant":"b","cost":50,"hold_ms":100,"now_ms":10000}
{"op":"release","lease":"b9","now_ms":10050}
not json
{"op":"acquire","tenant":"a","cost":50,"hold_ms":100,"now_ms":10010}
{"op":"release","lease":"b2","now_ms":10100}
{"op":"stats","now_ms":10100}
{"op":"plan","now_ms":10100}
{"op":"report","now_ms":10100}
{"op":"acquire","tenant":"a","cost":50,"hold_ms":100,"now_ms":-5}
"#;
    let mut out = Vec::new();
    let sum = replay(log.as_bytes(), &mut out).unwrap();
    assert_eq!(sum.lines, 11);
    assert_eq!(sum.errors, 3);
    let lines: Vec<Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines[2],
        serde_json::json!({"ok":true,"lease":"b2","own":0,"slices":[{"lender":"a","units":50}],"deadline_ms":10100})
    );
    assert_eq!(lines[3]["ok"], false);
    assert!(lines[3]["error"].as_str().unwrap().contains("b9"));
    assert!(lines[4]["error"].as_str().unwrap().contains("malformed"));
    assert_eq!(lines[5]["reason"], "guarantee_on_loan");
    assert_eq!(lines[5]["retry_after_ms"], 90);
    assert_eq!(lines[6], serde_json::json!({"ok": true}));
    assert_eq!(lines[7]["tenants"]["a"]["guarantee"], 50);
    assert_eq!(lines[7]["overrun_leases"], serde_json::json!([]));
    assert_eq!(lines[8]["a"]["target"], 50);
    assert_eq!(lines[9]["units_disagree"], false);
    assert!(lines[10]["error"].as_str().unwrap().contains("now_ms"));
}

/// The borrower gets first move at the instant capacity frees up and loops
/// on acquire every millisecond; the returner asks every 10ms. With the
/// freeze, the returner is served at t=100 (ask at 10 + horizon), and no
/// loan against its units is written after its first ask.
#[test]
fn adversarial_borrower_loops_first() {
    let mut f = FairShare::new(cfg2()).unwrap();
    ok(f.acquire("b", 50.0, 100_000, at(0)));
    let b2 = ok(f.acquire("b", 50.0, 100, at(0)));
    let mut served_at = None;
    for t in 1..=300 {
        if t == 100 {
            f.release(&b2.id, at(t)).unwrap();
        }
        if let Ok(l) = f.acquire("b", 50.0, 100, at(t)).unwrap() {
            panic!(
                "borrower re-borrowed {} at {t} while the lender was waiting",
                l.id
            );
        }
        if t % 10 == 0 && served_at.is_none() {
            if let Ok(_l) = f.acquire("a", 50.0, 100, at(t)).unwrap() {
                served_at = Some(t);
            }
        }
    }
    assert_eq!(served_at, Some(100));
    let s = f.stats(at(300)).unwrap();
    assert_eq!(s.tenant("a").unwrap().worst_reclaim_ms, Some(90));
}

/// The same run without the demand signal (refusal is not activity): the
/// borrower renews at every expiry and the returner starves.
#[test]
fn starvation_without_demand_signal() {
    let mut f = FairShare::new(cfg2()).unwrap();
    f.set_refusal_counts_as_activity(false);
    ok(f.acquire("b", 50.0, 100_000, at(0)));
    let mut loan = ok(f.acquire("b", 50.0, 100, at(0)));
    let mut refusals = 0;
    for t in (10..=1000).step_by(10) {
        if at(t) == loan.deadline_ms {
            f.release(&loan.id, at(t)).unwrap();
            loan = ok(f.acquire("b", 50.0, 100, at(t)));
            assert_eq!(slices(&loan, AB), sl(&[("a", 50.0)]));
        }
        let r = no(f.acquire("a", 50.0, 100, at(t)));
        assert_eq!(r.reason, RefusalReason::GuaranteeOnLoan);
        assert_eq!(r.blocking_leases, vec![loan.id]);
        refusals += 1;
    }
    assert_eq!(refusals, 100, "a was never served in 1000ms");
    assert_eq!(loan.id, "b12", "b renewed at every one of the 10 expiries");
}

/// An overrunning borrower: retry is null, the lease is listed and still
/// counted, the reclaim ends only when the holder finally releases.
#[test]
fn overrun_blocks_until_released_and_is_counted() {
    let mut f = FairShare::new(cfg2()).unwrap();
    ok(f.acquire("b", 50.0, 1000, at(0)));
    ok(f.acquire("b", 50.0, 100, at(0)));
    let r = no(f.acquire("a", 50.0, 100, at(100)));
    assert_eq!(
        r.retry_after_ms,
        Some(0),
        "at the deadline instant: not overrun, retry 0 (Q11)"
    );
    assert!(f.stats(at(100)).unwrap().overrun_leases.is_empty());
    let r = no(f.acquire("a", 50.0, 100, at(101)));
    assert_eq!(r.retry_after_ms, None);
    assert!(
        r.explanation.contains("run past its declared deadline"),
        "{}",
        r.explanation
    );
    let s = f.stats(at(400)).unwrap();
    assert_eq!(s.overrun_leases, vec!["b2"]);
    let total: f64 = s.tenants.iter().map(|t| t.held).sum();
    assert_eq!(total, 100.0);
    assert_eq!(s.tenant("a").unwrap().lent, 50.0);
    assert_eq!(s.tenant("b").unwrap().borrowed, 50.0);
    // a keeps asking; b finally releases at 500.
    no(f.acquire("a", 50.0, 100, at(490)));
    f.release("b2", at(500)).unwrap();
    ok(f.acquire("a", 50.0, 100, at(500)));
    let s = f.stats(at(500)).unwrap();
    assert_eq!(s.tenant("a").unwrap().worst_reclaim_ms, Some(400));
    assert_eq!(s.tenant("a").unwrap().deficit_unit_ms, 50.0 * 400.0);
    assert!(s.overrun_leases.is_empty());
}

/// Largest free lender first; ties by constructor order; a loan spans
/// several lenders only when the largest is not enough.
#[test]
fn lender_attribution_largest_first() {
    let c = cfg(
        100.0,
        FairnessUnit::Cost,
        &[("x", 1.0), ("p", 2.0), ("q", 2.0), ("r", 5.0)],
        100,
        1000,
        0,
    );
    let mut f = FairShare::new(c).unwrap(); // guarantees 10, 20, 20, 50
    let l = ok(f.acquire("x", 40.0, 100, at(0)));
    assert_eq!(l.own, 10.0);
    assert_eq!(slices(&l, XPQR), sl(&[("r", 30.0)]));
    // r has 20 free now, tied with p and q: constructor order p, q, r.
    let l = ok(f.acquire("x", 45.0, 100, at(0)));
    assert_eq!(
        slices(&l, XPQR),
        sl(&[("p", 20.0), ("q", 20.0), ("r", 5.0)])
    );
    let s = f.stats(at(0)).unwrap();
    assert_eq!(s.tenant("r").unwrap().lent, 35.0);
    assert_eq!(s.tenant("x").unwrap().borrowed, 75.0);
    let r = no(f.acquire("x", 20.0, 100, at(0)));
    assert_eq!(r.reason, RefusalReason::NoLendableCapacity);
    assert!(r.explanation.contains("lend only 15"), "{}", r.explanation);
}

/// Q4: a tenant whose own units are on loan may borrow from a third idle
/// tenant within the horizon; beyond it, the reason is guarantee_on_loan.
#[test]
fn on_loan_tenant_borrows_from_third_party() {
    let c = cfg(
        90.0,
        FairnessUnit::Cost,
        &[("a", 1.0), ("b", 1.0), ("c", 1.0)],
        100,
        1000,
        0,
    );
    let mut f = FairShare::new(c).unwrap();
    ok(f.acquire("b", 30.0, 1000, at(0)));
    let b2 = ok(f.acquire("b", 30.0, 100, at(0)));
    assert_eq!(
        slices(&b2, ABC),
        sl(&[("a", 30.0)]),
        "tie between a and c: constructor order"
    );
    let r = no(f.acquire("a", 30.0, 101, at(10)));
    assert_eq!(r.reason, RefusalReason::GuaranteeOnLoan);
    assert_eq!(r.retry_after_ms, Some(90));
    assert!(
        r.explanation.contains("exceeds the reclaim horizon"),
        "{}",
        r.explanation
    );
    let l = ok(f.acquire("a", 30.0, 100, at(10)));
    assert_eq!(slices(&l, ABC), sl(&[("c", 30.0)]));
}

/// Stated demand is the largest single refused charge, not the sum; the
/// deficit is cut when the want lapses, and the abandoned wait is not
/// recorded as a reclaim.
#[test]
fn want_is_max_not_sum_and_lapses() {
    let mut f = FairShare::new(cfg2()).unwrap();
    ok(f.acquire("b", 50.0, 100_000, at(0)));
    ok(f.acquire("b", 50.0, 100, at(0)));
    for (t, c) in [(10, 20.0), (20, 30.0), (30, 10.0)] {
        no(f.acquire("a", c, 100, at(t)));
    }
    let s = f.stats(at(40)).unwrap();
    assert_eq!(s.tenant("a").unwrap().want, 30.0);
    // Deficit: 20 × 10ms, then 30 × 20ms.
    assert_eq!(s.tenant("a").unwrap().deficit_unit_ms, 200.0 + 600.0);
    // a stops asking at 30; the want lapses at 30 + 1000 (inclusive).
    let s = f.stats(at(5000)).unwrap();
    let a = s.tenant("a").unwrap();
    assert_eq!(a.want, 0.0);
    assert_eq!(a.deficit_unit_ms, 200.0 + 30.0 * 1010.0);
    assert_eq!(a.worst_reclaim_ms, None, "abandoned wait not recorded");
}

/// Q20: exceeds_ceiling is activity (freezes the tenant as a lender) but
/// records no want.
#[test]
fn exceeds_ceiling_freezes_without_want() {
    let mut f = FairShare::new(cfg2()).unwrap();
    let r = no(f.acquire("a", 101.0, 10, at(0)));
    assert_eq!(r.reason, RefusalReason::ExceedsCeiling);
    assert!(
        r.explanation.contains("ceiling of 100 cost units"),
        "{}",
        r.explanation
    );
    assert_eq!(f.stats(at(0)).unwrap().tenant("a").unwrap().want, 0.0);
    ok(f.acquire("b", 50.0, 1000, at(0)));
    let r = no(f.acquire("b", 10.0, 100, at(0)));
    assert_eq!(r.reason, RefusalReason::NoLendableCapacity);
    // 1000ms later a is idle again.
    ok(f.acquire("b", 10.0, 100, at(1000)));
}

/// Q22: equal deadlines in a blocking set are taken in creation order; the
/// set is minimal; retry is the latest deadline in the set.
#[test]
fn blocking_set_minimal_earliest_deadline() {
    let mut f = FairShare::new(cfg2()).unwrap();
    ok(f.acquire("b", 50.0, 1000, at(0)));
    ok(f.acquire("b", 20.0, 100, at(0))); // b2 {a:20} deadline 100
    ok(f.acquire("b", 20.0, 80, at(10))); // b3 {a:20} deadline 90
    ok(f.acquire("b", 10.0, 80, at(20))); // b4 {a:10} deadline 100
    let r = no(f.acquire("a", 10.0, 100, at(30)));
    assert_eq!(
        (r.blocking_leases.clone(), r.retry_after_ms),
        (vec!["b3".to_string()], Some(60))
    );
    let r = no(f.acquire("a", 30.0, 100, at(30)));
    assert_eq!(
        (r.blocking_leases.clone(), r.retry_after_ms),
        (vec!["b3".into(), "b2".into()], Some(70))
    );
    let r = no(f.acquire("a", 50.0, 100, at(30)));
    assert_eq!(r.blocking_leases, vec!["b3", "b2", "b4"]);
}

/// Q16: explanations name the configured unit; under requests, deficit is
/// counted in requests.
#[test]
fn requests_unit_names_unit() {
    let c = cfg(
        2.0,
        FairnessUnit::Requests,
        &[("a", 1.0), ("b", 1.0)],
        100,
        1000,
        0,
    );
    let mut f = FairShare::new(c).unwrap();
    ok(f.acquire("b", 5.0, 1000, at(0)));
    let r = no(f.acquire("b", 5.0, 1000, at(0)));
    assert!(
        r.explanation.contains("hold 1 requests for 1000ms"),
        "{}",
        r.explanation
    );
    let l = ok(f.acquire("b", 7.0, 100, at(0)));
    assert_eq!((l.charge, l.cost), (1.0, 7.0));
    no(f.acquire("a", 9.0, 100, at(10)));
    let s = f.stats(at(20)).unwrap();
    assert_eq!(s.tenant("a").unwrap().deficit_unit_ms, 10.0);
}

/// Q17/Q22 clock: before startedAt is misuse; equal times are fine; cost 0
/// is accepted; a wait of 0 records worst 0.
#[test]
fn clock_and_small_values() {
    let mut c = cfg2();
    c.started_at_ms = 500;
    let mut f = FairShare::new(c).unwrap();
    assert_eq!(
        f.acquire("a", 1.0, 1, 499).unwrap_err(),
        FairError::BeforeStart {
            now_ms: 499,
            started_at_ms: 500
        }
    );
    assert!(f.stats(499).is_err());
    ok(f.acquire("a", 0.0, 1, 500));
    ok(f.acquire("a", 50.0, 1000, 500));
    no(f.acquire("a", 10.0, 1000, 500));
    f.release("a2", 500).unwrap();
    ok(f.acquire("a", 10.0, 1000, 500));
    assert_eq!(
        f.stats(500).unwrap().tenant("a").unwrap().worst_reclaim_ms,
        Some(0)
    );
}

/// A tenant in the middle of a long call is never idle, however long the
/// call runs (idleness is measured from the release).
#[test]
fn holder_is_never_lendable() {
    let mut f = FairShare::new(cfg2()).unwrap();
    ok(f.acquire("a", 10.0, 100_000, at(0)));
    ok(f.acquire("b", 50.0, 100_000, at(0)));
    let r = no(f.acquire("b", 10.0, 100, at(50_000)));
    assert_eq!(r.reason, RefusalReason::NoLendableCapacity);
    f.release("a1", at(50_000)).unwrap();
    no(f.acquire("b", 10.0, 100, at(50_999)));
    let l = ok(f.acquire("b", 10.0, 100, at(51_000)));
    assert_eq!(slices(&l, AB), sl(&[("a", 10.0)]));
}
