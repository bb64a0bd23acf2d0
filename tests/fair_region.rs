//! The conformance traces and region-specific behaviour of the ledger bound
//! to a real [`Region`] (`Region::anonymous()` + `FairShare::shared`).

mod common;

use common::{at, cfg2, ok};
use shmsched::fair::{FairConfig, FairError, FairShare, FairnessUnit, SharedFairShare};
use shmsched::region::{ObjectKind, ObjectSpec, Region};
use shmsched::Error;

fn make(cfg: FairConfig, freeze: bool) -> Result<SharedFairShare, FairError> {
    // Same construction errors as in-process (T01 reads the message).
    cfg.validate()?;
    let region = Region::anonymous().map_err(|e| FairError::Region(e.to_string()))?;
    let mut f = FairShare::shared_with_capacity(&region, &cfg, 64)
        .map_err(|e| FairError::Region(e.to_string()))?;
    f.set_refusal_counts_as_activity(freeze);
    Ok(f)
}

trace_suite!(make; t01, t03, t04, t05, t06, t07, t08, t09, t10, t12, t19, t23, t27, t36, t37, t41, t44, t45, p1, misuse, time_backwards_is_clamped, strict_lease_ids);

/// The region home answers exactly like the in-process ledger (T27, JSON).
#[test]
fn same_answers_as_in_process() {
    let mut a = FairShare::new(cfg2()).unwrap();
    let mut b = make(cfg2(), true).unwrap();
    common::t27_run(&mut a);
    common::t27_run(&mut b);
    assert_eq!(
        serde_json::to_value(a.stats(at(300)).unwrap()).unwrap(),
        serde_json::to_value(b.stats(at(300)).unwrap()).unwrap()
    );
    assert_eq!(
        serde_json::to_value(a.plan(at(300)).unwrap()).unwrap(),
        serde_json::to_value(b.plan(at(300)).unwrap()).unwrap()
    );
    assert_eq!(
        serde_json::to_value(a.fairness_report(at(300)).unwrap()).unwrap(),
        serde_json::to_value(b.fairness_report(at(300)).unwrap()).unwrap()
    );
}

/// Reopening with the same configuration joins the ledger; attach reads
/// the stored configuration back.
#[test]
fn reopen_same_config_and_attach_read_back() {
    let region = Region::anonymous().unwrap();
    let mut f1 = FairShare::shared_with_capacity(&region, &cfg2(), 32).unwrap();
    let l = ok(f1.acquire("b", 50.0, 1000, at(0)));
    let mut f2 = FairShare::shared_with_capacity(&region, &cfg2(), 32).unwrap();
    let mut f3 = FairShare::attach(&region).unwrap();
    assert_eq!(f3.config(), &cfg2());
    assert_eq!(f3.lease_capacity(), 32);
    assert_eq!(f2.stats(at(1)).unwrap().tenant("b").unwrap().held, 50.0);
    f3.release(&l.id, at(2)).unwrap();
    assert_eq!(
        f1.release(&l.id, at(3)).unwrap_err(),
        FairError::AlreadyReleased("b1".into())
    );
    // A lease records this process as its owner (one registration).
    assert_eq!(f1.owner().unwrap(), f3.owner().unwrap());
    let h = f1.handle().unwrap();
    assert_eq!(h.config(), &cfg2());
}

/// Opening with another configuration is `Mismatch` naming what differs.
#[test]
fn other_config_is_a_mismatch_naming_the_difference() {
    let region = Region::anonymous().unwrap();
    let _f = FairShare::shared_with_capacity(&region, &cfg2(), 32).unwrap();
    let mut c = cfg2();
    c.ceiling = 200.0;
    c.idle_after_ms = 2000;
    match FairShare::shared_with_capacity(&region, &c, 32) {
        Err(Error::Mismatch(m)) => {
            assert!(m.contains("ceiling 100 (asked 200)"), "{m}");
            assert!(m.contains("idle_after_ms 1000 (asked 2000)"), "{m}");
            assert!(!m.contains("tenants"), "{m}");
        }
        other => panic!("expected Mismatch, got {other:?}"),
    }
    let mut c = cfg2();
    c.tenants[1].1 = 3.0;
    c.fairness_unit = FairnessUnit::Requests;
    match FairShare::shared_with_capacity(&region, &c, 32) {
        Err(Error::Mismatch(m)) => {
            assert!(m.contains("tenants [a:1, b:1] (asked [a:1, b:3])"), "{m}");
            assert!(
                m.contains("fairness_unit \"cost\" (asked \"requests\")"),
                "{m}"
            );
        }
        other => panic!("expected Mismatch, got {other:?}"),
    }
    match FairShare::shared_with_capacity(&region, &cfg2(), 64) {
        Err(Error::Mismatch(m)) => assert!(m.contains("lease capacity 32 (asked 64)"), "{m}"),
        other => panic!("expected Mismatch, got {other:?}"),
    }
    // An invalid configuration is refused before touching the region.
    let mut c = cfg2();
    c.idle_after_ms = 100;
    let e = FairShare::shared(&region, &c).unwrap_err().to_string();
    assert!(e.contains("100"), "{e}");
}

/// Attaching to an empty region or one of another kind is an error.
#[test]
fn attach_needs_an_initialised_fair_share_region() {
    let region = Region::anonymous().unwrap();
    assert!(matches!(
        FairShare::attach(&region),
        Err(Error::BadRegion(_))
    ));
    let init = |_: &mut [u8]| {};
    let spec = ObjectSpec {
        kind: ObjectKind::Scheduler,
        params: [1; 8],
        object_size: 4096,
        init: &init,
    };
    let region = Region::anonymous().unwrap();
    drop(region.bind(ObjectKind::Scheduler, Some(&spec)).unwrap());
    match FairShare::shared(&region, &cfg2()) {
        Err(e @ Error::WrongKind { .. }) => assert!(e.to_string().contains("scheduler"), "{e}"),
        other => panic!("expected WrongKind, got {other:?}"),
    }
}

/// A region whose pthread mutex was laid out by another libc is refused by
/// both `shared` and `attach`, naming both layouts.
#[test]
fn mutex_layout_mismatch_is_refused() {
    let region = Region::anonymous().unwrap();
    let init = |_: &mut [u8]| {};
    // As another build would write it: same rev, a different tag and size.
    let spec = ObjectSpec {
        kind: ObjectKind::FairShare,
        params: [
            shmsched::fair::region::OBJECT_REVISION,
            0,
            2,
            32,
            (2 << 32) | 24,
            24,
            2,
            10,
        ],
        object_size: 1 << 16,
        init: &init,
    };
    drop(region.bind(ObjectKind::FairShare, Some(&spec)).unwrap());
    for r in [
        FairShare::attach(&region),
        FairShare::shared_with_capacity(&region, &cfg2(), 32),
    ] {
        match r {
            Err(Error::Mismatch(m)) => {
                assert!(m.contains("\"musl\" with 24-byte"), "{m}");
                assert!(m.contains("this build uses"), "{m}");
            }
            other => panic!("expected Mismatch, got {other:?}"),
        }
    }
}

/// Scribbling on the stored configuration is detected (hash), never a panic.
#[test]
fn scribbled_config_is_bad_region() {
    let region = Region::anonymous().unwrap();
    let f = FairShare::shared_with_capacity(&region, &cfg2(), 8).unwrap();
    // SAFETY: byte 130 is inside the stored JSON of the live object area.
    unsafe { *f.mapping().object_ptr().add(130) ^= 0x20 };
    let e = FairShare::attach(&region).unwrap_err();
    assert!(matches!(e, Error::BadRegion(_)), "{e}");
    assert!(e.to_string().contains("hash"), "{e}");
}

/// The `*_now` calls use the shared monotonic clock and never go backwards,
/// even from several threads with their own handles.
#[test]
fn now_calls_use_the_clock_under_the_lock() {
    let region = Region::anonymous().unwrap();
    let mut f = FairShare::shared_with_capacity(&region, &cfg2(), 256).unwrap();
    let t0 = shmsched::sys::clock::monotonic_ms();
    let l = ok(f.acquire_now("a", 10.0, 50));
    assert!(l.deadline_ms >= t0 + 50);
    let mut threads = Vec::new();
    for k in 0..4 {
        let mut h = f.handle().unwrap();
        threads.push(std::thread::spawn(move || {
            let tenant = if k % 2 == 0 { "a" } else { "b" };
            for _ in 0..200 {
                match h.acquire_now(tenant, 1.0, 50) {
                    Ok(Ok(l)) => h.release_now(&l.id).unwrap(),
                    Ok(Err(_)) => {}
                    Err(e) => panic!("{e}"),
                }
                h.stats_now().unwrap();
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    f.release_now(&l.id).unwrap();
    let s = f.stats_now().unwrap();
    assert!(s.now_ms >= t0);
    assert_eq!(
        s.tenant("a").unwrap().held + s.tenant("b").unwrap().held,
        0.0
    );
    f.plan_now().unwrap();
    f.fairness_report_now().unwrap();
    // An explicit time behind the clock is taken at the ledger's last
    // accepted time (issue 20): a region's time is monotonic by rule.
    let l = ok(f.acquire("a", 1.0, 10, 5));
    assert!(l.granted_at_ms >= s.now_ms, "{l:?}");
    f.release(&l.id, 6).unwrap();
}

/// Two handles of one region record their calls, some with times behind
/// the ledger's (taken at the last accepted time) and some at the clock;
/// the merged log replays in-process to exactly the recorded answers.
#[test]
fn recorded_region_logs_merge_and_replay_exactly() {
    use shmsched::fair::replay::{acquire_json, merge_call_logs, release_json, value_json};
    let region = Region::anonymous().unwrap();
    let mut h1 = FairShare::shared_with_capacity(&region, &cfg2(), 16).unwrap();
    let mut h2 = h1.handle().unwrap();
    h1.record_calls().unwrap();
    h2.record_calls().unwrap();
    // (seq, handle, answer): the merge keeps ties (calls that changed
    // nothing, which commute) in log order, handle 1's first.
    let mut answers: Vec<(u64, u8, serde_json::Value)> = Vec::new();
    fn seq_of(h: &SharedFairShare) -> u64 {
        let line = h.call_log().unwrap().last().unwrap();
        serde_json::from_str::<serde_json::Value>(line).unwrap()["seq"]
            .as_u64()
            .unwrap()
    }
    macro_rules! call {
        ($h:ident, $json:expr) => {{
            let v = $json;
            let k = if stringify!($h) == "h1" { 1 } else { 2 };
            answers.push((seq_of(&$h), k, v));
        }};
    }
    let c = cfg2();
    call!(h1, acquire_json(&c, &h1.acquire("b", 50.0, 1000, at(50))));
    let late = h2.acquire("b", 10.0, 100, at(10));
    call!(h2, acquire_json(&c, &late));
    let late = late.unwrap().unwrap();
    assert_eq!(late.granted_at_ms, at(50));
    call!(h2, release_json(&h2.release(&late.id, at(0))));
    call!(h1, release_json(&h1.release("b1", 0)));
    call!(h2, release_json(&h2.release("b1", 0)));
    call!(h1, value_json(&h1.stats(at(20))));
    call!(h2, acquire_json(&c, &h2.acquire_now("a", 60.0, 100)));
    call!(h1, acquire_json(&c, &h1.acquire("a", 10.0, 100, at(60))));
    call!(h1, value_json(&h1.plan(0)));
    call!(h2, value_json(&h2.fairness_report(0)));
    call!(h2, value_json(&h2.stats_now()));
    answers.sort_by_key(|a| (a.0, a.1));
    let merged = merge_call_logs(&[h1.call_log().unwrap(), h2.call_log().unwrap()]);
    assert_eq!(merged.len(), answers.len() + 1);
    let mut out = Vec::new();
    let sum = shmsched::fair::replay(merged.join("\n").as_bytes(), &mut out).unwrap();
    assert_eq!(sum.malformed, 0);
    let replayed: Vec<serde_json::Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(replayed[0], serde_json::json!({"ok": true}));
    let want: Vec<serde_json::Value> = answers.into_iter().map(|a| a.2).collect();
    assert_eq!(replayed[1..], want[..]);
    assert!(
        replayed.iter().any(|r| r["error"]
            .as_str()
            .is_some_and(|e| e.contains("already released"))),
        "{replayed:?}"
    );
}
