//! Error messages name values the way the API does (stumble 9 of the
//! operability issue): Rust and JSON field names, the real limit broken,
//! finite numbers printed as such, mismatches as "max 8, asked for 9".

use shmsched::fair::{FairConfig, FairError, FairShare, FairnessUnit};
use shmsched::limiter::Limiter;
use shmsched::region::Region;
use shmsched::scheduler::Scheduler;
use shmsched::Error;

fn cfg() -> FairConfig {
    FairConfig {
        ceiling: 100.0,
        fairness_unit: FairnessUnit::Cost,
        tenants: vec![("a".into(), 1.0), ("b".into(), 1.0)],
        reclaim_horizon_ms: 100,
        idle_after_ms: 1000,
        started_at_ms: 10,
    }
}

fn no_camel_case(m: &str) {
    for bad in [
        "holdMs",
        "idleAfterMs",
        "reclaimHorizonMs",
        "startedAt",
        "nowMs",
    ] {
        assert!(!m.contains(bad), "{bad} in {m:?}");
    }
}

#[test]
fn fair_errors_use_the_api_names_and_the_real_limit() {
    let mut c = cfg();
    c.idle_after_ms = 100;
    let m = FairShare::new(c).unwrap_err().to_string();
    assert!(
        m.contains("idle_after_ms (100)") && m.contains("reclaim_horizon_ms (100)"),
        "{m}"
    );
    no_camel_case(&m);

    let mut f = FairShare::new(cfg()).unwrap();
    let m = f.acquire("a", 1.0, 0, 20).unwrap_err().to_string();
    assert!(m.contains("hold_ms 0") && m.contains("at least 1"), "{m}");
    // A hold whose deadline overflows is too large, not too small.
    let e = f.acquire("a", 1.0, u64::MAX, 20).unwrap_err();
    assert_eq!(e, FairError::InvalidHold(u64::MAX));
    let m = e.to_string();
    assert!(m.contains("too large") && !m.contains("at least 1"), "{m}");
    let m = f.acquire("a", 1.0, 10, 5).unwrap_err().to_string();
    assert!(
        m.contains("now_ms 5") && m.contains("started_at_ms 10"),
        "{m}"
    );
    no_camel_case(&m);
    let m = f.acquire("a", -1e308, 10, 20).unwrap_err().to_string();
    assert!(m.contains("-1e308"), "{m}");
    assert!(m.len() < 120, "a huge number is printed short: {m}");
}

#[test]
fn a_finite_huge_cost_is_not_reported_as_inf() {
    let mut f = FairShare::new(cfg()).unwrap();
    let r = f.acquire("a", 1e308, 10, 20).unwrap().unwrap_err();
    assert_eq!(r.reason.as_str(), "exceeds_ceiling");
    assert!(r.explanation.contains("1e308"), "{}", r.explanation);
    assert!(!r.explanation.contains("inf"), "{}", r.explanation);
}

struct Gone(String);

impl Drop for Gone {
    fn drop(&mut self) {
        let _ = Region::remove(&self.0);
    }
}

fn name(tag: &str) -> String {
    format!("test-msg-{tag}-{}", std::process::id())
}

#[test]
fn mismatch_says_max_8_asked_for_9() {
    let n = name("sched");
    let _g = Gone(n.clone());
    let region = Region::create(&n).unwrap();
    let _s = Scheduler::shared(&region, 8).unwrap();
    // Another process (a fresh Region handle) asking for another max.
    let other = Region::open(&n).unwrap();
    let e = Scheduler::shared(&other, 9).unwrap_err();
    assert!(matches!(e, Error::Mismatch(_)), "{e}");
    let m = e.to_string();
    assert!(m.contains("scheduler has max 8, asked for 9"), "{m}");
    assert!(!m.contains('['), "no raw parameter arrays: {m}");

    let n = name("lim");
    let _g = Gone(n.clone());
    let region = Region::create(&n).unwrap();
    let _l = Limiter::shared(&region, 1000).unwrap();
    let e = Limiter::shared(&Region::open(&n).unwrap(), 2000).unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("limiter has tokens per second at creation 1000, asked for 2000"),
        "{m}"
    );
    assert!(!m.contains('['), "{m}");
    // A capacity that differs is named as such.
    let e = Limiter::shared(&Region::open(&n).unwrap(), 1000)
        .map(|_| ())
        .and_then(|()| {
            Limiter::shared_with_capacity(&Region::open(&n).unwrap(), 1000, 5000).map(|_| ())
        })
        .unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("capacity at creation 1000, asked for 5000") && !m.contains("reserved"),
        "{m}"
    );
}
