//! Crash consistency of the shared ledger: a child process is killed while
//! holding the robust mutex at every step of every call of a trace; the
//! parent then recovers (`OwnerDied` → committed copy) and must see exactly
//! the state after the calls that committed.
//!
//! One test function only: forking from a single-threaded test binary
//! keeps the child's allocator usable.

mod common;
mod tools;

use common::shm::TestShared;
use common::{at, cfg2};
use shmsched::fair::shared::CrashPoint;
use shmsched::fair::{FairLedger, FairShare};

#[derive(Clone, Copy)]
enum Call {
    Acq(&'static str, f64, u64, i64),
    Rel(&'static str, i64),
    Stats(i64),
}

const SCRIPT: &[Call] = &[
    Call::Acq("b", 50.0, 100, 0),
    Call::Acq("b", 50.0, 100, 0),
    Call::Acq("a", 50.0, 100, 10),
    Call::Stats(50),
    Call::Rel("b1", 100),
    Call::Rel("b2", 100),
    Call::Acq("a", 50.0, 100, 100),
    Call::Rel("zz", 150),
    Call::Rel("a1", 200),
    Call::Acq("a", 50.0, 100, 200),
];

fn run<L: FairLedger>(l: &mut L, calls: &[Call]) {
    for c in calls {
        match *c {
            Call::Acq(t, cost, hold, now) => drop(l.acquire(t, cost, hold, at(now))),
            Call::Rel(id, now) => drop(l.release(id, at(now))),
            Call::Stats(now) => drop(l.stats(at(now))),
        }
    }
}

fn snapshot<L: FairLedger>(l: &mut L) -> serde_json::Value {
    serde_json::json!({
        "stats": serde_json::to_value(l.stats(at(10_000)).unwrap()).unwrap(),
        "report": serde_json::to_value(l.fairness_report(at(10_000)).unwrap()).unwrap(),
        "next": serde_json::to_value(l.acquire("b", 1.0, 10, at(10_000)).unwrap().ok().map(|x| x.id)).unwrap(),
    })
}

/// One test function so the binary forks from a single thread.
#[test]
fn crash_consistency_and_concurrency() {
    killed_holder_at_every_step_leaves_committed_state();
    concurrent_processes_keep_the_ledger_exact();
}

/// Four processes hammer one ledger through their own handles; every grant
/// and release is accounted for and the ceiling is never exceeded.
fn concurrent_processes_keep_the_ledger_exact() {
    let cfg = common::cfg(
        100.0,
        shmsched::fair::FairnessUnit::Cost,
        &[("a", 1.0), ("b", 1.0), ("c", 1.0), ("d", 1.0)],
        100,
        1000,
        0,
    );
    let t = TestShared::create(&cfg, 64).unwrap();
    let mut pids = Vec::new();
    for (k, tenant) in ["a", "b", "c", "d"].into_iter().enumerate() {
        // SAFETY: forked from this single-threaded test binary.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let mut h = t.attach().unwrap();
            h.set_owner(k as u32 + 1);
            let mut granted = 0;
            for i in 0..300u64 {
                // Everyone uses the same instant: time never goes backwards.
                if let Ok(Ok(l)) = h.acquire(tenant, 5.0, 10, 0) {
                    granted += 1;
                    let s = h.stats(0).unwrap();
                    let held: f64 = s.tenants.iter().map(|x| x.held).sum();
                    if held > 100.0 + 1e-6 {
                        // SAFETY: report failure through the exit code.
                        unsafe { libc::_exit(10) };
                    }
                    if i % 3 != 0 && h.release(&l.id, 0).is_err() {
                        // SAFETY: as above.
                        unsafe { libc::_exit(11) };
                    }
                }
            }
            // SAFETY: exit code carries how many grants this child got.
            unsafe { libc::_exit(if granted > 0 { 0 } else { 12 }) };
        }
        pids.push(pid);
    }
    for pid in pids {
        let status = tools::bounded_waitpid(pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child status {status}"
        );
    }
    let mut h = t.attach().unwrap();
    let s = h.stats(0).unwrap();
    let held: f64 = s.tenants.iter().map(|x| x.held).sum();
    assert!(held <= 100.0 + 1e-6);
    for x in &s.tenants {
        assert_eq!(x.held, 5.0 * x.leases as f64, "{x:?}");
        assert_eq!(
            x.leases, 5,
            "each tenant ends holding its full 25 in unreleased leases"
        );
    }
    assert_eq!(h.recoveries(), 0);
    // The reaper gives back everything owner 1 ("a") still holds.
    let a_leases = s.tenant("a").unwrap().leases;
    assert_eq!(h.reap_owner(1, 0).unwrap(), a_leases);
    assert_eq!(h.stats(0).unwrap().tenant("a").unwrap().held, 0.0);
}

fn killed_holder_at_every_step_leaves_committed_state() {
    let points = [
        CrashPoint::AfterLock,
        CrashPoint::MidCopy,
        CrashPoint::BeforeFlip,
        CrashPoint::AfterFlip,
    ];
    let mut checked = 0;
    for (n, call) in SCRIPT.iter().enumerate() {
        for &point in &points {
            let t = TestShared::create(&cfg2(), 16).unwrap();
            // SAFETY: fork from this single-threaded test; the child only
            // uses the ledger and then dies by abort (or exits).
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0);
            if pid == 0 {
                let mut h = t.attach().unwrap();
                h.crash_at(n as u64, point);
                let mut calls = SCRIPT.iter();
                for c in calls.by_ref() {
                    match *c {
                        Call::Acq(tn, cost, hold, now) => drop(h.acquire(tn, cost, hold, at(now))),
                        Call::Rel(id, now) => drop(h.release(id, at(now))),
                        Call::Stats(now) => drop(h.stats(at(now))),
                    }
                }
                // SAFETY: leave without running the parent's destructors.
                unsafe { libc::_exit(3) };
            }
            let status = tools::bounded_waitpid(pid);
            let died = libc::WIFSIGNALED(status);
            // A misuse call (releasing "zz") fails before the flip, so its
            // BeforeFlip/AfterFlip points are never reached: the child
            // finishes the script and exits normally.
            let misuse = matches!(call, Call::Rel("zz", _));
            assert!(
                died || (misuse && point >= CrashPoint::BeforeFlip),
                "call {n} {point:?}"
            );
            assert!(died || libc::WEXITSTATUS(status) == 3);
            let mut h = t.attach().unwrap();
            let committed = match (died, point) {
                (false, _) => SCRIPT.len(),
                (true, CrashPoint::AfterFlip) => n + 1,
                (true, _) => n,
            };
            let mut reference = FairShare::new(cfg2()).unwrap();
            run(&mut reference, &SCRIPT[..committed]);
            let got = snapshot(&mut h);
            assert_eq!(h.recoveries(), u64::from(died), "call {n} {point:?}");
            assert_eq!(got, snapshot(&mut reference), "call {n} {point:?}");
            checked += 1;
        }
    }
    assert_eq!(checked, SCRIPT.len() * 4);
}
