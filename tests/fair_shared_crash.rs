//! Crash consistency of the shared ledger (updated in place under an undo
//! journal, committed by one store; `src/fair/shared.rs`): a child process
//! is killed while holding the robust mutex at every step of every call of
//! a trace (right after the lock, in the middle of the first journaled
//! write with a torn record, before the commit store, after it, before the
//! unlock); the parent then recovers (`OwnerDied` → undo) and must see
//! exactly the state after the calls that committed. A second process
//! killed in the middle of undoing the first one's update leaves the same
//! state. And a writer stopped (SIGSTOP) at each step leaves a region that
//! an inspector reads, without the lock, as exactly the committed state.
//!
//! One test function only: forking from a single-threaded test binary
//! keeps the child's allocator usable.

mod common;
mod tools;

use common::shm::TestShared;
use common::{at, cfg2};
use shmsched::fair::shared::CrashPoint;
use shmsched::fair::{FairLedger, FairShare};

#[derive(Debug, Clone, Copy)]
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

fn snapshot_no_acquire<L: FairLedger>(l: &mut L) -> serde_json::Value {
    serde_json::json!({
        "stats": serde_json::to_value(l.stats(at(10_000)).unwrap()).unwrap(),
        "report": serde_json::to_value(l.fairness_report(at(10_000)).unwrap()).unwrap(),
    })
}

/// One test function so the binary forks from a single thread.
#[test]
fn crash_consistency_and_concurrency() {
    killed_holder_at_every_step_leaves_committed_state();
    killed_before_every_journal_save_leaves_committed_state();
    killed_during_the_undo_leaves_committed_state();
    stopped_writer_is_read_as_committed_state();
    concurrent_processes_keep_the_ledger_exact();
}

/// A holder killed just before each journal save of each call (after `k`
/// saves and their writes, for every `k` the call reaches: the records it
/// changes written field range by field range, the tenant's `want_open` on
/// its own) leaves exactly the state after the calls before it; a `k` past
/// the call's last save lets the script finish.
fn killed_before_every_journal_save_leaves_committed_state() {
    let mut kills = 0;
    for (n, call) in SCRIPT.iter().enumerate() {
        let mut saves = None;
        for k in 0..40 {
            let t = TestShared::create(&cfg2(), 16).unwrap();
            // SAFETY: fork from this single-threaded test; the child only
            // uses the ledger and then dies by abort (or exits).
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0);
            if pid == 0 {
                crash_child(&t, n, CrashPoint::BeforeSave(k));
            }
            let status = tools::bounded_waitpid(pid);
            let died = libc::WIFSIGNALED(status);
            assert!(died || libc::WEXITSTATUS(status) == 3, "call {n} save {k}");
            let mut h = t.attach().unwrap();
            let committed = if died { n } else { SCRIPT.len() };
            let mut reference = FairShare::new(cfg2()).unwrap();
            run(&mut reference, &SCRIPT[..committed]);
            let got = snapshot(&mut h);
            assert_eq!(h.recoveries(), u64::from(died), "call {n} save {k}");
            assert_eq!(
                got,
                snapshot(&mut reference),
                "call {n} {call:?} killed before save {k}"
            );
            if !died {
                saves = Some(k);
                break;
            }
            kills += 1;
        }
        let saves = saves.expect("a call makes fewer than 40 journal saves");
        // An acquire or release saves at least its tenant and the meta
        // record, a stats call the meta record (its time); a misuse call
        // (releasing "zz") saves nothing.
        let least = match call {
            _ if !writes(call) => 0,
            Call::Stats(_) => 1,
            _ => 2,
        };
        assert!(
            saves >= least && (least > 0 || saves == 0),
            "call {n} {call:?} made {saves} saves"
        );
    }
    assert!(kills > 3 * SCRIPT.len(), "{kills} kills");
}

/// Whether call `c` of the script writes the ledger (a misuse error is
/// found before any write, so the points after the first write are never
/// reached).
fn writes(c: &Call) -> bool {
    !matches!(c, Call::Rel("zz", _))
}

fn run_one<L: FairLedger>(l: &mut L, c: &Call) {
    run(l, std::slice::from_ref(c));
}

/// The child of a crash run: `n` calls, then the rest with the crash armed
/// at call `n`.
fn crash_child(t: &TestShared, n: usize, point: CrashPoint) -> ! {
    let mut h = t.attach().unwrap();
    h.crash_at(n as u64, point);
    run(&mut h, SCRIPT);
    // SAFETY: leave without running the parent's destructors.
    unsafe { libc::_exit(3) };
}

fn wait(pid: libc::pid_t) -> i32 {
    tools::bounded_waitpid(pid)
}

/// The second process to lock after a crash mid-update dies while undoing
/// it; the third undoes it again: the state is the last committed one.
fn killed_during_the_undo_leaves_committed_state() {
    for (n, call) in SCRIPT.iter().enumerate().filter(|(_, c)| writes(c)) {
        let t = TestShared::create(&cfg2(), 16).unwrap();
        // SAFETY: fork from this single-threaded test; the child only uses
        // the ledger and then dies by abort.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            crash_child(&t, n, CrashPoint::MidWrite);
        }
        assert!(libc::WIFSIGNALED(wait(pid)), "call {n} {call:?}");
        // SAFETY: as above.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let mut h = t.attach().unwrap();
            h.crash_at(0, CrashPoint::MidUndo);
            drop(h.stats(at(10_000)));
            // SAFETY: leave without running the parent's destructors.
            unsafe { libc::_exit(3) };
        }
        assert!(libc::WIFSIGNALED(wait(pid)), "undo of call {n}");
        let mut h = t.attach().unwrap();
        let mut reference = FairShare::new(cfg2()).unwrap();
        run(&mut reference, &SCRIPT[..n]);
        assert_eq!(snapshot(&mut h), snapshot(&mut reference), "call {n}");
        assert_eq!(h.recoveries(), 2);
    }
}

/// Stops the calling process (SIGSTOP) until the parent continues it.
fn stop_self() {
    // SAFETY: raise(2) on this process.
    unsafe { libc::raise(libc::SIGSTOP) };
}

/// A writer stopped at each step of each call: an inspector's read of the
/// region (no lock, no write) is exactly the committed state, and the file
/// is unchanged by it; SIGKILLed there, the next locker recovers the same.
fn stopped_writer_is_read_as_committed_state() {
    use shmsched::fair::FairShare as F;
    use shmsched::region::{Region, RegionView};
    let path = format!("/dev/shm/shmsched-test-crash-stop-{}", std::process::id());
    struct Rm(String);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _rm = Rm(path.clone());
    let points = [
        CrashPoint::AfterLock,
        CrashPoint::MidWrite,
        CrashPoint::BeforeCommit,
        CrashPoint::AfterCommit,
    ];
    let mut checked = 0;
    for (n, call) in SCRIPT.iter().enumerate() {
        for &point in &points {
            if point > CrashPoint::AfterLock && !writes(call) {
                continue;
            }
            let _ = std::fs::remove_file(&path);
            let region = Region::create(&path).unwrap();
            drop(F::shared_with_capacity(&region, &cfg2(), 16).unwrap());
            // SAFETY: fork from this single-threaded test; the child only
            // uses the ledger, stops itself, and is killed.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0);
            if pid == 0 {
                let mut f = F::attach(&region).unwrap();
                run(&mut f, &SCRIPT[..n]);
                f.test_hook_at(point, Some(stop_self));
                run_one(&mut f, call);
                // SAFETY: not reached (killed while stopped).
                unsafe { libc::_exit(3) };
            }
            let mut st = 0;
            // SAFETY: our child; WUNTRACED reports the stop.
            let r = unsafe { libc::waitpid(pid, &mut st, libc::WUNTRACED) };
            assert!(
                r == pid && libc::WIFSTOPPED(st),
                "call {n} {point:?}: {st:#x}"
            );
            let committed = if point >= CrashPoint::AfterCommit {
                n + 1
            } else {
                n
            };
            let mut reference = FairShare::new(cfg2()).unwrap();
            run(&mut reference, &SCRIPT[..committed]);
            let before = std::fs::read(&path).unwrap();
            let seen = RegionView::open(&path).unwrap().fair_share().unwrap();
            assert!(seen.leases_consistent);
            assert!(std::fs::read(&path).unwrap() == before, "the read wrote");
            let want = reference.stats(seen.stats.now_ms).unwrap();
            assert_eq!(seen.stats, want, "call {n} {point:?}");
            // SAFETY: our stopped child: kill it (a stopped process dies on
            // SIGKILL) and reap it.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            assert!(libc::WIFSIGNALED(wait(pid)));
            // (Stats and report only: an acquire would reap the dead child.)
            let mut h = F::attach(&region).unwrap();
            let mut reference = FairShare::new(cfg2()).unwrap();
            run(&mut reference, &SCRIPT[..committed]);
            assert_eq!(
                snapshot_no_acquire(&mut h),
                snapshot_no_acquire(&mut reference),
                "call {n} {point:?}"
            );
            checked += 1;
        }
    }
    assert!(checked > SCRIPT.len() * 3);
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
        CrashPoint::MidWrite,
        CrashPoint::BeforeCommit,
        CrashPoint::AfterCommit,
        CrashPoint::BeforeUnlock,
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
                crash_child(&t, n, point);
            }
            let status = tools::bounded_waitpid(pid);
            let died = libc::WIFSIGNALED(status);
            // A misuse call (releasing "zz") fails before its first write,
            // so the points from the first write on are never reached: the
            // child finishes the script and exits normally.
            assert!(
                died || (!writes(call) && point >= CrashPoint::MidWrite),
                "call {n} {point:?}"
            );
            assert!(died || libc::WEXITSTATUS(status) == 3);
            let mut h = t.attach().unwrap();
            let committed = match (died, point) {
                (false, _) => SCRIPT.len(),
                (true, CrashPoint::AfterCommit | CrashPoint::BeforeUnlock) => n + 1,
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
    assert_eq!(checked, SCRIPT.len() * 5);
}
