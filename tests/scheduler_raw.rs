//! Raw permits (`Permit::into_raw`, `Scheduler::release_raw`): the cell's
//! own give-back CAS is the check against a double, stale or forged
//! release. Every test asserts exact counts on the region's cells
//! afterwards (`global_running`, `stats().shared.running`, what a take can
//! still get), so a release that freed a cell it should not have shows up.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;

use shmsched::region::Region;
use shmsched::scheduler::{Concurrency, RawPermit, RawRelease, Scheduler};
use shmsched::{Error, Priority};

fn tag(t: u32) -> NonZeroU32 {
    NonZeroU32::new(t).unwrap()
}

fn shared(max: u32) -> Scheduler {
    Scheduler::shared(&Region::anonymous().unwrap(), max).unwrap()
}

/// Both cells of a max-2 scheduler are free for ordinary permits.
fn both_free(s: &Scheduler) {
    let a = s.try_acquire(Priority::Normal).unwrap();
    let b = s.try_acquire(Priority::Normal).unwrap();
    assert!(s.try_acquire(Priority::Normal).is_none());
    drop((a, b));
}

fn already(r: shmsched::Result<()>) -> bool {
    matches!(r, Err(Error::AlreadyReleased { .. }))
}

#[test]
fn release_once_then_already_released() {
    let s = shared(2);
    let raw = s
        .acquire(Priority::Normal)
        .unwrap()
        .into_raw(tag(1))
        .unwrap();
    assert_eq!(raw.tag(), tag(1));
    assert_eq!(s.global_running(), 1);
    s.release_raw(raw).unwrap();
    assert_eq!(s.global_running(), 0);
    assert!(already(s.release_raw(raw)));
    assert_eq!(s.global_running(), 0);
    both_free(&s);
}

#[test]
fn a_stale_raw_permit_never_frees_the_next_holders_cell() {
    let s = shared(1);
    let old = s
        .acquire(Priority::Normal)
        .unwrap()
        .into_raw(tag(1))
        .unwrap();
    s.release_raw(old).unwrap();
    // The one cell again, as a raw permit of another tag, then as a plain one.
    let new = s
        .acquire(Priority::Normal)
        .unwrap()
        .into_raw(tag(2))
        .unwrap();
    assert_eq!(new.cell(), old.cell());
    assert!(already(s.release_raw(old)));
    assert_eq!(s.global_running(), 1);
    assert!(s.try_acquire(Priority::Normal).is_none(), "still held");
    s.release_raw(new).unwrap();
    let plain = s.acquire(Priority::Normal).unwrap();
    assert!(already(s.release_raw(old)));
    assert!(already(s.release_raw(new)));
    assert_eq!(s.global_running(), 1);
    drop(plain);
    assert_eq!(s.global_running(), 0);
}

#[test]
fn forged_parts_change_nothing() {
    let s = shared(4);
    let raw = s
        .acquire(Priority::Normal)
        .unwrap()
        .into_raw(tag(9))
        .unwrap();
    let wrong_tag = RawPermit::from_parts(raw.cell(), raw.counted(), tag(10)).unwrap();
    let wrong_counted = RawPermit::from_parts(raw.cell(), !raw.counted(), tag(9)).unwrap();
    let wrong_cell = RawPermit::from_parts((raw.cell() + 1) % 4, raw.counted(), tag(9)).unwrap();
    let past_max = RawPermit::from_parts(100, raw.counted(), tag(9)).unwrap();
    for f in [wrong_tag, wrong_counted, wrong_cell, past_max] {
        assert!(already(s.release_raw(f)), "{f:?}");
        assert_eq!(s.global_running(), 1);
    }
    assert!(RawPermit::from_parts(RawPermit::MAX_CELL + 1, false, tag(1)).is_none());
    // Random parts: never a free of the held cell, never a panic.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..10_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let Some(t) = NonZeroU32::new(x as u32) else {
            continue;
        };
        if t == tag(9) {
            continue;
        }
        let f = RawPermit::from_parts((x >> 32) as u32 & 0xffff, x >> 48 & 1 == 1, t).unwrap();
        assert!(already(s.release_raw(f)));
    }
    assert_eq!(s.global_running(), 1);
    s.release_raw(raw).unwrap();
    assert_eq!(s.global_running(), 0);
}

#[test]
fn two_threads_racing_on_one_raw_permit_free_it_once() {
    let s = shared(1);
    let barrier = Barrier::new(3);
    for round in 0..300u32 {
        let raw = s
            .acquire(Priority::Normal)
            .unwrap()
            .into_raw(tag(round + 1))
            .unwrap();
        let wins = AtomicUsize::new(0);
        // A third thread takes the cell as soon as it is free, as a raw
        // permit of its own: the losing release must not free it.
        let taken = std::thread::scope(|sc| {
            for _ in 0..2 {
                sc.spawn(|| {
                    barrier.wait();
                    if s.release_raw(raw).is_ok() {
                        wins.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
            let t = sc.spawn(|| {
                barrier.wait();
                s.acquire(Priority::Normal)
                    .unwrap()
                    .into_raw(tag(round + 1_000_000))
                    .unwrap()
            });
            t.join().unwrap()
        });
        assert_eq!(wins.load(Ordering::SeqCst), 1, "round {round}");
        assert_eq!(s.global_running(), 1, "the third thread's cell is held");
        assert!(s.try_acquire(Priority::Normal).is_none());
        s.release_raw(taken).unwrap();
        assert_eq!(s.global_running(), 0);
    }
}

#[test]
fn counted_raw_permits_keep_the_running_count_exact() {
    // A cap below the max turns counting on: cells carry COUNTED and the
    // process's `held`.
    let s = Scheduler::shared(&Region::anonymous().unwrap(), Concurrency::max(3).low(2)).unwrap();
    let low = s.acquire(Priority::Low).unwrap().into_raw(tag(1)).unwrap();
    let low2 = s.acquire(Priority::Low).unwrap().into_raw(tag(2)).unwrap();
    assert!(low.counted() && low2.counted());
    assert!(s.try_acquire(Priority::Low).is_none(), "cap 2 reached");
    s.release_raw(low).unwrap();
    assert!(already(s.release_raw(low)));
    // The cap admits exactly one more: the count went down by one, once.
    let again = s.try_acquire(Priority::Low).expect("room under the cap");
    assert!(s.try_acquire(Priority::Low).is_none());
    drop(again);
    s.release_raw(low2).unwrap();
    assert_eq!(s.global_running(), 0);
    assert_eq!(s.stats().shared.map(|x| x.running), Some(0));
}

#[test]
fn a_raw_release_wakes_a_waiter() {
    let s = shared(1);
    let raw = s
        .acquire(Priority::Normal)
        .unwrap()
        .into_raw(tag(5))
        .unwrap();
    std::thread::scope(|sc| {
        let w = sc.spawn(|| {
            let p = s.acquire(Priority::High).unwrap();
            drop(p);
        });
        // The waiter is queued once the region counts it.
        while s.stats().pending == 0 {
            std::thread::yield_now();
        }
        s.release_raw(raw).unwrap();
        w.join().unwrap();
    });
    assert_eq!(s.global_running(), 0);
}

#[test]
fn under_a_lowered_ceiling_a_raw_release_gives_its_cell_to_it() {
    let s = shared(3);
    let raws: Vec<_> = (1..=3)
        .map(|t| {
            s.acquire(Priority::Normal)
                .unwrap()
                .into_raw(tag(t))
                .unwrap()
        })
        .collect();
    assert!(!s.set_ceiling(1).unwrap(), "all held: not reached yet");
    s.release_raw(raws[0]).unwrap();
    assert!(already(s.release_raw(raws[0])));
    s.release_raw(raws[1]).unwrap();
    assert_eq!(s.ceiling(), 1);
    assert_eq!(s.global_running(), 1);
    assert!(
        s.try_acquire(Priority::Normal).is_none(),
        "ceiling 1 in use"
    );
    s.release_raw(raws[2]).unwrap();
    assert!(already(s.release_raw(raws[2])));
    let one = s.try_acquire(Priority::Normal).expect("ceiling 1 free");
    assert!(s.try_acquire(Priority::Normal).is_none());
    drop(one);
    s.set_ceiling(3).unwrap();
    let all: Vec<_> = (0..3)
        .map(|_| {
            s.try_acquire(Priority::Normal)
                .expect("all back in service")
        })
        .collect();
    drop(all);
}

#[test]
fn only_one_cell_permits_of_a_shared_root_become_raw() {
    let local = Scheduler::new(2).unwrap();
    let p = local.acquire(Priority::Normal).unwrap();
    let p = p.into_raw(tag(1)).expect_err("in-process");
    assert_eq!(local.stats().running, 1);
    drop(p);
    assert_eq!(local.stats().running, 0);

    let s = shared(4);
    let many = s.acquire_many(Priority::Normal, 2).unwrap();
    let many = many.into_raw(tag(1)).expect_err("weighted");
    assert_eq!(s.global_running(), 2);
    drop(many);
    let child = s.child(2).unwrap();
    let c = child.acquire(Priority::Normal).unwrap();
    let c = c.into_raw(tag(1)).expect_err("child");
    assert_eq!(s.global_running(), 1);
    drop(c);
    assert_eq!(s.global_running(), 0);
    // A raw permit released through a handle that is not a shared root.
    let raw = s
        .acquire(Priority::Normal)
        .unwrap()
        .into_raw(tag(3))
        .unwrap();
    assert!(matches!(
        child.release_raw(raw),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        local.release_raw(raw),
        Err(Error::InvalidArgument(_))
    ));
    s.release_raw(raw).unwrap();
    assert_eq!(s.global_running(), 0);
}

#[test]
fn max_one_and_max_65536_round_trip_every_cell() {
    let s = shared(1);
    let raw = s
        .acquire(Priority::Normal)
        .unwrap()
        .into_raw(tag(1))
        .unwrap();
    assert_eq!(raw.cell(), 0);
    s.release_raw(raw).unwrap();

    let max = shmsched::scheduler::MAX_SHARED_SLOTS;
    let s = shared(max);
    let raws: Vec<_> = (0..max)
        .map(|i| {
            s.try_acquire(Priority::Normal)
                .expect("free")
                .into_raw(tag(i + 1))
                .unwrap()
        })
        .collect();
    assert!(s.try_acquire(Priority::Normal).is_none());
    let mut cells: Vec<u32> = raws.iter().map(|r| r.cell()).collect();
    cells.sort_unstable();
    assert_eq!(cells, (0..max).collect::<Vec<_>>());
    let last = raws.iter().find(|r| r.cell() == max - 1).unwrap();
    let again = RawPermit::from_parts(last.cell(), last.counted(), last.tag()).unwrap();
    s.release_raw(again).unwrap();
    assert!(already(s.release_raw(*last)));
    for r in &raws {
        if r.cell() != max - 1 {
            s.release_raw(*r).unwrap();
        }
    }
    assert_eq!(s.global_running(), 0);
}

/// A raw permit of one region released on another region's scheduler
/// (where this process may well have the same owner id) frees nothing
/// there: that region's cells do not hold its tag.
#[test]
fn a_raw_permit_of_another_region_frees_nothing() {
    let a = shared(2);
    let b = shared(2);
    let raw = a
        .acquire(Priority::Normal)
        .unwrap()
        .into_raw(tag(4))
        .unwrap();
    let held_b = b.acquire(Priority::Normal).unwrap();
    assert!(already(b.release_raw(raw)));
    assert_eq!(b.global_running(), 1);
    drop(held_b);
    a.release_raw(raw).unwrap();
    assert_eq!(a.global_running(), 0);
}

/// The tag `acquire_raw_fast` gives after `t` on the same cell.
fn next(t: NonZeroU32) -> NonZeroU32 {
    NonZeroU32::new(t.get().wrapping_add(1)).unwrap_or(NonZeroU32::MIN)
}

/// `acquire_raw_fast` is `acquire` then `into_raw` when the fast path
/// admits: released once, stale afterwards; the scheduler's tag on a cell
/// is its last one there plus one (what other permits did with the cell in
/// between does not matter), from a start of its own per binding.
#[test]
fn acquire_raw_fast_is_acquire_then_into_raw() {
    let region = Region::anonymous().unwrap();
    let s = Scheduler::shared(&region, 1).unwrap();
    let a = s.acquire_raw_fast(Priority::Normal).expect("a free cell");
    assert_eq!(s.global_running(), 1);
    assert!(s.acquire_raw_fast(Priority::Normal).is_none(), "full");
    assert!(s.try_acquire(Priority::Normal).is_none(), "still held");
    assert_eq!(s.global_running(), 1, "a refusal takes nothing");
    s.release_raw(a).unwrap();
    assert!(already(s.release_raw(a)));
    assert_eq!(s.global_running(), 0);

    let b = s.acquire_raw_fast(Priority::Normal).unwrap();
    assert_eq!((b.cell(), b.tag()), (a.cell(), next(a.tag())));
    assert!(
        already(s.release_raw(a)),
        "a stale raw permit frees nothing"
    );
    assert_eq!(s.global_running(), 1);
    s.release_raw(b).unwrap();
    // A plain permit and a raw one of a caller's tag in between.
    drop(s.acquire(Priority::Normal).unwrap());
    let theirs = s
        .acquire(Priority::Normal)
        .unwrap()
        .into_raw(tag(7))
        .unwrap();
    s.release_raw(theirs).unwrap();
    let c = s.acquire_raw_fast(Priority::High).unwrap();
    assert_eq!(c.tag(), next(b.tag()));
    assert!(already(s.release_raw(b)));
    s.release_raw(c).unwrap();
    assert_eq!(s.global_running(), 0);

    // Another binding of the region starts elsewhere (one chance in 2^32
    // of the same start).
    drop(s);
    let again = Scheduler::attach(&region).unwrap();
    let d = again.acquire_raw_fast(Priority::Normal).unwrap();
    assert_ne!(d.tag(), next(c.tag()), "a start of its own");
    assert!(already(again.release_raw(c)));
    again.release_raw(d).unwrap();
    assert_eq!(again.global_running(), 0);
}

/// Where `acquire` would not return at once from its fast path, or the
/// permit would not become raw, `acquire_raw_fast` takes nothing.
#[test]
fn acquire_raw_fast_takes_nothing_where_the_fast_path_does_not_admit() {
    let local = Scheduler::new(2).unwrap();
    assert!(local.acquire_raw_fast(Priority::Normal).is_none());
    assert_eq!(local.stats().running, 0);

    let s = shared(2);
    let child = s.child(2).unwrap();
    assert!(child.acquire_raw_fast(Priority::Normal).is_none());
    assert_eq!((s.global_running(), child.stats().running), (0, 0));

    // Counted cells under a cap, up to the cap and no further.
    let capped =
        Scheduler::shared(&Region::anonymous().unwrap(), Concurrency::max(3).low(1)).unwrap();
    let low = capped
        .acquire_raw_fast(Priority::Low)
        .expect("under the cap");
    assert!(low.counted());
    assert!(
        capped.acquire_raw_fast(Priority::Low).is_none(),
        "at the cap"
    );
    assert_eq!(capped.global_running(), 1);
    capped.release_raw(low).unwrap();
    assert_eq!(capped.global_running(), 0);

    let zero = Scheduler::shared(&Region::anonymous().unwrap(), 0).unwrap();
    assert!(zero.acquire_raw_fast(Priority::Normal).is_none());

    s.dispose();
    assert!(s.acquire_raw_fast(Priority::Normal).is_none(), "disposed");
    assert_eq!(s.global_running(), 0);
}

/// Threads taking and releasing raw permits of one cell through
/// `acquire_raw_fast` and the first looks (and plain permits beside
/// them) never free a cell
/// twice: a stale raw permit released again by every thread frees
/// nothing, and the count is exact at the end.
#[test]
fn acquire_raw_fast_races_stay_exact() {
    let s = shared(2);
    let wrong = AtomicUsize::new(0);
    std::thread::scope(|sc| {
        for t in 0..3 {
            let (s, wrong) = (&s, &wrong);
            sc.spawn(move || {
                let mut stale = Vec::new();
                for i in 0..20_000u32 {
                    if (i + t) % 5 == 0 {
                        drop(s.acquire(Priority::Normal).unwrap());
                        continue;
                    }
                    let first = i % 2 == 0;
                    let raw = if first {
                        s.acquire_raw_first_look(Priority::Normal)
                    } else {
                        s.acquire_raw_fast(Priority::Normal)
                    };
                    let Some(raw) = raw else {
                        std::thread::yield_now();
                        continue;
                    };
                    assert!(s.global_running() >= 1);
                    if first {
                        match s.release_raw_first_look(raw) {
                            RawRelease::Released => {}
                            RawRelease::Serve(serve) => drop(serve),
                            other => panic!("{other:?}"),
                        }
                    } else {
                        s.release_raw(raw).unwrap();
                    }
                    stale.push(raw);
                    if stale.len() > 16 {
                        stale.remove(0);
                    }
                    for old in &stale {
                        if s.release_raw(*old).is_ok() {
                            wrong.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            });
        }
    });
    assert_eq!(
        wrong.load(Ordering::SeqCst),
        0,
        "a stale raw permit freed a cell"
    );
    assert_eq!(s.global_running(), 0);
    both_free(&s);
}

/// The first looks: `acquire_raw_first_look` takes the cell at this
/// process's hint or nothing; `release_raw_first_look` gives a raw permit
/// back as `release_raw` does, leaving serving the queue to the `Serve` it
/// hands back, and declines (doing nothing) where `release_raw` would call
/// out (a lowered ceiling) or fail early (not a shared root).
#[test]
fn first_looks_take_and_give_back_as_the_fast_path_does() {
    let s = shared(2);
    let a = s
        .acquire_raw_first_look(Priority::Normal)
        .expect("the hint's cell");
    assert!(
        s.acquire_raw_first_look(Priority::Normal).is_none(),
        "the hint's cell is taken: the first look declines"
    );
    assert_eq!(
        s.global_running(),
        1,
        "a declining first look takes nothing"
    );
    let b = s
        .acquire_raw_fast(Priority::Normal)
        .expect("the other cell");
    assert_ne!(a.cell(), b.cell());
    assert!(matches!(s.release_raw_first_look(a), RawRelease::Released));
    assert!(matches!(s.release_raw_first_look(a), RawRelease::NotHeld));
    let forged = RawPermit::from_parts(b.cell(), b.counted(), next(b.tag())).unwrap();
    assert!(matches!(
        s.release_raw_first_look(forged),
        RawRelease::NotHeld
    ));
    assert_eq!(s.global_running(), 1);

    // Not a shared root: declined, nothing done.
    let child = s.child(2).unwrap();
    assert!(child.acquire_raw_first_look(Priority::Normal).is_none());
    assert!(matches!(
        child.release_raw_first_look(b),
        RawRelease::Declined
    ));
    assert_eq!(s.global_running(), 1);

    // A waiter: the release hands back a `Serve`, which serves it when
    // dropped.
    let c = s.acquire_raw_fast(Priority::Normal).expect("the last cell");
    std::thread::scope(|sc| {
        let w = sc.spawn(|| drop(s.acquire(Priority::High).unwrap()));
        while s.stats().pending == 0 {
            std::thread::yield_now();
        }
        // A waiter above closes the first look.
        assert!(s.acquire_raw_first_look(Priority::Normal).is_none());
        match s.release_raw_first_look(c) {
            RawRelease::Serve(serve) => drop(serve),
            other => panic!("expected Serve, got {other:?}"),
        }
        w.join().unwrap();
    });
    assert_eq!(s.global_running(), 1, "b is still held");

    // Above a lowered ceiling: declined, then `release_raw` gives the cell
    // to the ceiling.
    let d = s.acquire_raw_fast(Priority::Normal).unwrap();
    assert!(!s.set_ceiling(1).unwrap(), "both held: not reached yet");
    assert!(matches!(s.release_raw_first_look(d), RawRelease::Declined));
    assert_eq!(s.global_running(), 2, "nothing done");
    s.release_raw(d).unwrap();
    assert_eq!(s.ceiling(), 1);
    assert!(matches!(s.release_raw_first_look(b), RawRelease::Released));
    s.set_ceiling(2).unwrap();
    assert_eq!(s.global_running(), 0);

    // A cap below the max at the priority: declined; a capped take turns
    // counting on, after which the first look takes counted cells.
    let capped =
        Scheduler::shared(&Region::anonymous().unwrap(), Concurrency::max(3).low(1)).unwrap();
    assert!(capped.acquire_raw_first_look(Priority::Low).is_none());
    let low = capped
        .acquire_raw_fast(Priority::Low)
        .expect("under the cap");
    let counted = capped
        .acquire_raw_first_look(Priority::Normal)
        .or_else(|| capped.acquire_raw_fast(Priority::Normal))
        .unwrap();
    assert!(low.counted() && counted.counted());
    assert_eq!(capped.stats().shared.map(|x| x.running), Some(2));
    assert!(matches!(
        capped.release_raw_first_look(counted),
        RawRelease::Released
    ));
    capped.release_raw(low).unwrap();
    assert_eq!(capped.stats().shared.map(|x| x.running), Some(0));

    s.dispose();
    assert!(
        s.acquire_raw_first_look(Priority::Normal).is_none(),
        "disposed"
    );
    assert!(Scheduler::new(2)
        .unwrap()
        .acquire_raw_first_look(Priority::Normal)
        .is_none());
}

/// A `RawReleaser` is the binding, not a handle: raw permits taken through
/// any handle of the binding are released through it once, also after
/// every handle is dropped; it answers as `release_raw` and its first look
/// do; it names its binding and no other (a child, an in-process
/// scheduler, another region, the same region opened again); while it
/// lives `detach` refuses, and once it is dropped detach succeeds.
#[test]
fn a_raw_releaser_releases_past_its_handles_and_names_one_binding() {
    let region = Region::anonymous().unwrap();
    let a = Scheduler::shared(&region, 4).unwrap();
    let b = Scheduler::attach(&region).unwrap();
    let releaser = a.raw_releaser().expect("a shared root");
    assert!(releaser.same_root(&a) && releaser.same_root(&b));
    let child = a.child(2).unwrap();
    assert!(child.raw_releaser().is_none());
    assert!(!releaser.same_root(&child));
    let local = Scheduler::new(2).unwrap();
    assert!(local.raw_releaser().is_none());
    assert!(!releaser.same_root(&local));
    assert!(!releaser.same_root(&shared(2)), "another region");
    let again = Region::from_fd(region.as_fd().try_clone_to_owned().unwrap()).unwrap();
    let other = Scheduler::attach(&again).unwrap();
    assert!(!releaser.same_root(&other), "another binding of the region");
    assert!(other.raw_releaser().unwrap().same_root(&other));
    drop((other, again));

    let x = a.acquire_raw_fast(Priority::Normal).unwrap();
    let y = b
        .acquire(Priority::Normal)
        .unwrap()
        .into_raw(tag(9))
        .unwrap();
    let z = b.acquire_raw_fast(Priority::High).unwrap();
    assert_eq!(releaser.raw_permits_held(), 3);
    assert_eq!(a.raw_permits_held(), 3, "the same count through a handle");
    drop((a, b, child));
    assert_eq!(releaser.raw_permits_held(), 3, "held past the handles");
    releaser.release_raw(x).unwrap();
    assert!(already(releaser.release_raw(x)));
    assert!(matches!(
        releaser.release_raw_first_look(y),
        RawRelease::Released
    ));
    assert!(matches!(
        releaser.release_raw_first_look(y),
        RawRelease::NotHeld
    ));
    assert_eq!(releaser.raw_permits_held(), 1);

    // Detach refuses while the releaser shares the binding.
    let c = Scheduler::attach(&region).unwrap();
    assert!(releaser.same_root(&c), "the binding the releaser kept");
    assert_eq!(c.global_running(), 1);
    releaser.release_raw(z).unwrap();
    assert_eq!(c.global_running(), 0);
    match c.detach() {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("raw releaser"), "{m}"),
        r => panic!("detach with a releaser alive: {r:?}"),
    }
    drop(releaser);
    let d = Scheduler::attach(&region).unwrap();
    drop(region);
    d.detach().unwrap();
}
