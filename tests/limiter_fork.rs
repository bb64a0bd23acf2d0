//! What a Limiter handle does after `fork` (DESIGN rule 6): it belongs to
//! the parent and fails in the child with a clear error; the child binds
//! its own handle from the Region and shares the same bucket.
//!
//! One test in this binary, so the fork happens with no other test thread
//! running.

mod tools;
use shmsched::limiter::Limiter;
use shmsched::region::Region;
use shmsched::{Error, Priority};

fn child_checks(region: &Region, inherited: &Limiter, local: &Limiter) -> i32 {
    // The forking thread owned every handle's counter (it consumed through
    // them twice): the owner's fast path, which skips the fork test, must
    // not take the child for the owner.
    match inherited.consume(1, Priority::Normal) {
        Err(Error::Forked(m)) if m.contains("Limiter::shared") => {}
        _ => return 10,
    }
    if !matches!(inherited.try_consume(1), Err(Error::Forked(_))) {
        return 11;
    }
    if !matches!(local.consume(1, Priority::Normal), Err(Error::Forked(_))) {
        return 20;
    }
    if !matches!(local.try_consume(1), Err(Error::Forked(_))) {
        return 21;
    }
    // A handle made in the child is the child's thread's to own.
    let Ok(mine) = Limiter::with_capacity(1_000, 10) else {
        return 22;
    };
    for _ in 0..10 {
        if mine.consume(1, Priority::Normal).map(|g| g.immediate).ok() != Some(true) {
            return 23;
        }
    }
    if mine.try_consume(1).ok() != Some(false) {
        return 24;
    }
    if mine.stats().queues[Priority::Normal.index()].consumed != 10 {
        return 25;
    }
    let Ok(own) = Limiter::attach(region) else {
        return 12;
    };
    // The parent took 600 of 1000: the child sees the same bucket.
    match own.tokens() {
        Ok(t) if (400..=450).contains(&t) => {}
        _ => return 13,
    }
    if own.try_consume(400).ok() != Some(true) {
        return 14;
    }
    0
}

#[test]
fn inherited_limiter_after_fork() {
    let region = Region::anonymous().unwrap();
    let lim = Limiter::shared(&region, 1000).unwrap();
    lim.consume(300, Priority::Normal).unwrap();
    lim.consume(300, Priority::Normal).unwrap();
    let local = Limiter::new(1000).unwrap();
    assert!(local.try_consume(1).unwrap());
    assert!(local.try_consume(1).unwrap());
    local.consume(1, Priority::Normal).unwrap();
    // SAFETY: the only other thread is the idle test-harness main thread; the
    // child calls only this crate's code and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            child_checks(&region, &lim, &local)
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
    // The child's 400 came out of the parent's bucket too.
    assert!(lim.tokens().unwrap() < 200);
    assert_eq!(lim.reap().unwrap(), 1);
}
