//! The conformance traces and region-home specifics against the shared
//! ledger in a `MAP_SHARED` anonymous mapping.

mod common;

use common::shm::TestShared;
use common::{at, cfg2, ok};
use shmsched::fair::shared::SharedLedger;
use shmsched::fair::{FairConfig, FairError, FairShare};

fn make(cfg: FairConfig, freeze: bool) -> Result<TestShared, FairError> {
    let mut t = TestShared::create(&cfg, 64)?;
    t.ledger.set_refusal_counts_as_activity(freeze);
    Ok(t)
}

trace_suite!(make; t01, t03, t04, t05, t06, t07, t08, t09, t10, t12, t19, t23, t27, t36, t37, t41, t44, t45, p1, misuse, time_backwards_is_clamped, strict_lease_ids);

/// Two handles (as two processes would have) see one ledger.
#[test]
fn handles_share_state() {
    let t = TestShared::create(&cfg2(), 16).unwrap();
    let mut h1 = t.attach().unwrap();
    let mut h2 = t.attach().unwrap();
    ok(h1.acquire("b", 50.0, 1000, at(0)));
    let l = ok(h2.acquire("b", 50.0, 100, at(0)));
    assert_eq!(l.id, "b2");
    h1.release("b2", at(5)).unwrap();
    assert_eq!(
        h2.release("b2", at(6)).unwrap_err(),
        FairError::AlreadyReleased("b2".into())
    );
    assert_eq!(h2.stats(at(6)).unwrap().tenant("b").unwrap().held, 50.0);
}

/// The shared home gives the same JSON answers as the in-process one over
/// the T27 trace.
#[test]
fn same_answers_as_in_process() {
    let mut a = FairShare::new(cfg2()).unwrap();
    let mut b = TestShared::create(&cfg2(), 16).unwrap();
    common::t27_run(&mut a);
    common::t27_run(&mut b);
    let sa = serde_json::to_value(a.stats(at(300)).unwrap()).unwrap();
    let sb = serde_json::to_value(b.ledger.stats(at(300)).unwrap()).unwrap();
    assert_eq!(sa, sb);
    let ra = serde_json::to_value(a.fairness_report(at(300)).unwrap()).unwrap();
    let rb = serde_json::to_value(b.ledger.fairness_report(at(300)).unwrap()).unwrap();
    assert_eq!(ra, rb);
}

/// A dead owner's leases are released by the reaper, counted separately.
#[test]
fn reap_owner_releases_dead_process_leases() {
    let t = TestShared::create(&cfg2(), 16).unwrap();
    let mut dead = t.attach().unwrap();
    dead.set_owner(7);
    let mut live = t.attach().unwrap();
    live.set_owner(8);
    ok(dead.acquire("b", 50.0, 1000, at(0)));
    ok(dead.acquire("b", 30.0, 100, at(0)));
    ok(live.acquire("a", 10.0, 100, at(0)));
    assert_eq!(live.reap_owner(7, at(10)).unwrap(), 2);
    let s = live.stats(at(10)).unwrap();
    let b = s.tenant("b").unwrap();
    assert_eq!((b.held, b.leases, b.reaped_leases), (0.0, 0, 2));
    assert_eq!(s.tenant("a").unwrap().lent, 0.0);
    assert_eq!(s.tenant("a").unwrap().held, 10.0);
    assert_eq!(live.reap_owner(7, at(10)).unwrap(), 0);
}

/// Attach refuses foreign or damaged memory with errors, never panics.
#[test]
fn attach_validates_header() {
    let t = TestShared::create(&cfg2(), 16).unwrap();
    // SAFETY: the mapping is live and at least 8 bytes.
    unsafe {
        let magic = t.map.ptr as *mut u64;
        let saved = *magic;
        *magic = 42;
        let e = SharedLedger::attach(t.map.ptr, t.map.len).unwrap_err();
        assert!(e.to_string().contains("magic"), "{e}");
        *magic = saved;
        let e = SharedLedger::attach(t.map.ptr, 100).unwrap_err();
        assert!(
            matches!(e, FairError::InvalidConfig(_) | FairError::Corrupt(_)),
            "{e}"
        );
    }
    assert!(t.attach().is_ok());
}

/// Scribbling on any byte of the state gives errors or valid answers,
/// never a panic; the committed copy is the only one read.
#[test]
fn scribbled_state_is_an_error_not_a_panic() {
    let cfg = cfg2();
    let len = SharedLedger::required_size(&cfg, 8).unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..200 {
        let mut t = TestShared::create(&cfg, 8).unwrap();
        ok(t.ledger.acquire("b", 50.0, 1000, at(0)));
        ok(t.ledger.acquire("b", 50.0, 100, at(0)));
        for _ in 0..4 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let off = 128 + (seed as usize % (len - 128));
            // SAFETY: `off < len`, inside the live mapping.
            unsafe { *t.map.ptr.add(off) = (seed >> 40) as u8 ^ 0xa5 };
        }
        let _ = t.ledger.acquire("a", 50.0, 100, at(10));
        let _ = t.ledger.release("b2", at(20));
        let _ = t.ledger.stats(at(30));
        let _ = t.ledger.plan(at(30));
        let _ = t.ledger.fairness_report(at(30));
        let _ = round;
    }
}
