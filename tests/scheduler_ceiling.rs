//! The run-time ceiling of a shared scheduler (what a cluster lease moves):
//! below the cell count, for every handle, without revoking held slots.

use std::time::Duration;

use shmsched::region::Region;
use shmsched::scheduler::Scheduler;
use shmsched::{Error, Priority};

#[test]
fn lowering_keeps_holders_and_takes_releases_raising_serves_waiters() {
    let region = Region::anonymous().unwrap();
    let a = Scheduler::shared(&region, 6).unwrap();
    let held: Vec<_> = (0..5)
        .map(|_| a.acquire(Priority::Normal).unwrap())
        .collect();
    // Down to 2 while 5 are held: nothing is revoked, nothing new admitted.
    assert!(
        !a.set_ceiling(2).unwrap(),
        "5 held: the ceiling cannot be reached yet"
    );
    assert_eq!(a.ceiling(), 2);
    assert_eq!(a.global_running(), 5);
    assert!(a.try_acquire(Priority::Highest).is_none());
    // Each release goes to the ceiling until it is reached: 5 → 2 held.
    let mut held = held;
    for _ in 0..3 {
        drop(held.pop());
        assert!(
            a.try_acquire(Priority::Highest).is_none(),
            "a freed slot went back to the pool"
        );
    }
    assert_eq!(a.global_running(), 2);
    let s = a.stats().shared.unwrap();
    assert_eq!((s.running, s.max, s.ceiling), (2, 6, 2));
    // Another handle (another process would see the same) is bound by it too.
    let b = Scheduler::attach(&region).unwrap();
    assert_eq!(b.ceiling(), 2);
    let waiter = std::thread::spawn(move || {
        b.acquire_owned_timeout(Priority::Normal, Duration::from_secs(10))
    });
    // Raising it serves the waiter at once.
    while a.stats().shared.unwrap().waiters[Priority::Normal.index()] == 0 {
        std::thread::yield_now();
    }
    assert!(a.set_ceiling(4).unwrap());
    let served = waiter.join().unwrap().unwrap();
    let _c = a.acquire(Priority::Normal).unwrap(); // 4 of 4 now
    assert!(a.try_acquire(Priority::Normal).is_none());
    drop(held);
    drop(_c);
    drop(served);
    // Back to the full max; nothing blocked, nothing leaked.
    assert!(a.set_ceiling(6).unwrap());
    let all: Vec<_> = (0..6)
        .map(|_| a.try_acquire(Priority::Normal).unwrap())
        .collect();
    assert_eq!(a.global_running(), 6);
    drop(all);
    assert_eq!(a.global_running(), 0);
}

#[test]
fn ceiling_above_max_and_in_process_are_errors() {
    let region = Region::anonymous().unwrap();
    let a = Scheduler::shared(&region, 3).unwrap();
    let e = a.set_ceiling(4).unwrap_err().to_string();
    assert!(e.contains('4') && e.contains('3'), "{e}");
    assert!(a.set_ceiling(0).unwrap());
    assert!(matches!(
        a.acquire_timeout(Priority::High, Duration::from_millis(20)),
        Err(Error::Timeout)
    ));
    let local = Scheduler::new(3).unwrap();
    assert!(matches!(
        local.set_ceiling(1),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(local.ceiling(), 3);
}
