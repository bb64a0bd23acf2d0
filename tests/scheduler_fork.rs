//! What a Scheduler handle does after `fork` (DESIGN rule 6): it belongs to
//! the parent. In the child it fails with a clear error, and dropping an
//! inherited permit does nothing (the slot is the parent's). The Region
//! handle works in the child, which registers as a process of its own.
//!
//! One test in this binary, so the fork happens with no other test thread
//! running.

mod tools;
use shmsched::region::Region;
use shmsched::scheduler::{RawPermit, RawRelease, RawReleaser, Scheduler};
use shmsched::{Error, Priority};

fn child_checks(
    region: &Region,
    inherited: &Scheduler,
    permit: shmsched::scheduler::Permit<'_>,
    releaser: &RawReleaser,
    raw: RawPermit,
) -> i32 {
    match inherited.acquire(Priority::Normal) {
        Err(Error::Forked(m)) if m.contains("Scheduler::shared") => {}
        _ => return 10,
    }
    // The parent's binding: no releaser from it, and its releaser leaves
    // the parent's raw permit alone.
    if inherited.raw_releaser().is_some() {
        return 20;
    }
    if !matches!(releaser.release_raw(raw), Err(Error::Forked(_))) {
        return 21;
    }
    if !matches!(releaser.release_raw_first_look(raw), RawRelease::Declined) {
        return 22;
    }
    if inherited.try_acquire(Priority::Normal).is_some() {
        return 11;
    }
    let Ok(own) = Scheduler::attach(region) else {
        return 12;
    };
    if own.stats().shared.map(|s| s.running) != Some(2) {
        return 13;
    }
    drop(permit);
    if own.stats().shared.map(|s| s.running) != Some(2) {
        return 14; // the parent's slots must stay the parent's
    }
    match own.raw_releaser() {
        Some(r) if r.same_root(&own) && !releaser.same_root(&own) => {}
        _ => return 23, // the child's binding is its own
    }
    let Some(mine) = own.try_acquire(Priority::Normal) else {
        return 15;
    };
    std::mem::forget(mine); // exit holding it: the parent must reclaim it
    0
}

#[test]
fn inherited_handles_after_fork() {
    let region = Region::anonymous().unwrap();
    let sched = Scheduler::shared(&region, 3).unwrap();
    let permit = sched.acquire(Priority::Normal).unwrap();
    let releaser = sched.raw_releaser().unwrap();
    let raw = sched.acquire_raw_fast(Priority::Normal).unwrap();
    // SAFETY: the only other thread is the idle test-harness main thread; the
    // child calls only this crate's code and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            child_checks(&region, &sched, permit, &releaser, raw)
        }))
        .unwrap_or(99);
        // SAFETY: leave the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let status = tools::bounded_waitpid(pid);
    assert!(libc::WIFEXITED(status), "child crashed: {status:#x}");
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "child check failed (code = step)"
    );
    // The child's own slot comes back when its death is noticed.
    let (procs, slots) = sched.reap().unwrap();
    assert_eq!((procs, slots), (1, 1));
    let st = sched.stats().shared.unwrap();
    assert_eq!(st.running, 2, "only the parent's permits are held");
    drop(permit);
    releaser.release_raw(raw).unwrap();
    assert_eq!(sched.stats().shared.unwrap().running, 0);
}
