//! Conformance traces of the fair-share rules (`docs/fair-share.md`)
//! against the in-process ledger.

mod common;

use shmsched::fair::{FairConfig, FairError, FairShare};

fn make(cfg: FairConfig, freeze: bool) -> Result<FairShare, FairError> {
    let mut f = FairShare::new(cfg)?;
    f.set_refusal_counts_as_activity(freeze);
    Ok(f)
}

trace_suite!(make; t01, t03, t04, t05, t06, t07, t08, t09, t10, t12, t19, t23, t27, t36, t37, t41, t44, t45, p1, misuse, time_backwards_is_misuse, strict_lease_ids);

/// T02: the fairness unit has no default; "tokens" is refused.
#[test]
fn t02() {
    let base = r#""ceiling":100,"tenants":[{"id":"a","weight":1}],"reclaim_horizon_ms":100,"idle_after_ms":1000,"started_at_ms":0"#;
    let e = FairConfig::from_json(&format!("{{{base}}}"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("fairness_unit"), "{e}");
    let e = FairConfig::from_json(&format!("{{{base},\"fairness_unit\":\"tokens\"}}"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("tokens"), "{e}");
    let e = "tokens"
        .parse::<shmsched::fair::FairnessUnit>()
        .unwrap_err()
        .to_string();
    assert!(e.contains("tokens") && e.contains("no default"), "{e}");
    let c = FairConfig::from_json(&format!("{{{base},\"fairness_unit\":\"requests\"}}")).unwrap();
    assert_eq!(c.fairness_unit, shmsched::fair::FairnessUnit::Requests);
}

type Mutation = Box<dyn Fn(&mut FairConfig)>;

/// Construction validation: every refusal names the value.
#[test]
fn config_validation_names_values() {
    let good = common::cfg2();
    let cases: Vec<(Mutation, &str)> = vec![
        (Box::new(|c| c.ceiling = 0.0), "ceiling 0"),
        (Box::new(|c| c.ceiling = f64::INFINITY), "ceiling inf"),
        (Box::new(|c| c.ceiling = f64::NAN), "ceiling NaN"),
        (Box::new(|c| c.tenants[1].1 = -2.0), "weight -2"),
        (Box::new(|c| c.tenants[1].1 = f64::NAN), "weight NaN"),
        (
            Box::new(|c| c.tenants[1].0 = "a".into()),
            "\"a\" appears more than once",
        ),
        (Box::new(|c| c.tenants[1].0 = String::new()), "empty id"),
        (Box::new(|c| c.tenants[1].0 = "x".repeat(33)), "33 bytes"),
        (Box::new(|c| c.tenants[1].0 = "a1".into()), "\"a1\""),
        (Box::new(|c| c.tenants.clear()), "at least one tenant"),
    ];
    for (mutate, needle) in cases {
        let mut c = good.clone();
        mutate(&mut c);
        let e = FairShare::new(c).unwrap_err().to_string();
        assert!(e.contains(needle), "{e} should contain {needle}");
    }
    let e = FairShare::with_capacity(good, 0).unwrap_err().to_string();
    assert!(e.contains("lease capacity 0"), "{e}");
}

/// A full lease table is an error naming the limit, and changes nothing.
#[test]
fn capacity_exhausted() {
    let mut f = FairShare::with_capacity(common::cfg2(), 2).unwrap();
    common::ok(f.acquire("a", 1.0, 10, 0));
    common::ok(f.acquire("a", 1.0, 10, 0));
    let e = f.acquire("a", 1.0, 10, 1).unwrap_err();
    assert_eq!(
        e,
        FairError::CapacityExhausted {
            what: "lease table",
            limit: 2
        }
    );
    assert!(e.to_string().contains("(2 entries)"));
    // A refusal still works when the table is full.
    common::no(f.acquire("a", 500.0, 10, 1));
    f.release("a1", 2).unwrap();
    assert_eq!(common::ok(f.acquire("a", 1.0, 10, 2)).id, "a3");
}
