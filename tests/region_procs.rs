//! Cross-process region behaviour with real forked processes: the creation
//! race, a creator killed mid-initialisation, kernel-backed liveness and
//! reaping, identity across fork, and futex wait/wake across processes.
//! Every wait is bounded.

mod region_util;
use region_util as common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use shmsched::region::{HeaderInfo, ObjectKind, ProcState, Region, RegionOptions};
use shmsched::sys::{futex_wait, futex_wake, WaitResult};
use shmsched::Error;

const LIMIT: Duration = Duration::from_secs(30);

#[test]
fn creation_race_ends_with_one_region() {
    const N: usize = 10;
    let name = unique_name("race");
    let _c = Cleanup(name.clone());
    let (go_r, mut go_w) = pipe();
    let (mut rep_r, rep_w) = pipe();
    let (done_r, mut done_w) = pipe();
    let mut pids = vec![];
    for _ in 0..N {
        let name = name.clone();
        let go_r = go_r.try_clone().unwrap();
        let done_r = done_r.try_clone().unwrap();
        let mut rep_w = rep_w.try_clone().unwrap();
        pids.push(fork_child(move || {
            let (mut go_r, mut done_r) = (go_r, done_r);
            wait_go(&mut go_r); // start line: all children released at once
            let r = Region::open_or_create(&name).unwrap();
            let m = r.bind(ObjectKind::Scheduler, Some(&spec(8))).unwrap();
            let me = m.me().unwrap();
            let h = m.header();
            send(
                &mut rep_w,
                &[
                    me.idx,
                    me.owner,
                    h.clock_epoch_ns as u32,
                    (h.clock_epoch_ns >> 32) as u32,
                    h.created_pid as u32,
                ],
            );
            wait_go(&mut done_r); // stay registered until the parent has checked
            0
        }));
    }
    drop(rep_w);
    go(&mut go_w, N); // the start line
    let mut ids = HashSet::new();
    let mut epochs = HashSet::new();
    for _ in 0..N {
        let idx = recv(&mut rep_r).expect("child report");
        let owner = recv(&mut rep_r).unwrap();
        let lo = recv(&mut rep_r).unwrap();
        let hi = recv(&mut rep_r).unwrap();
        let creator = recv(&mut rep_r).unwrap();
        assert!(ids.insert(idx), "index {idx} given twice");
        assert_eq!(owner & 0xffff, idx + 1);
        epochs.insert((lo, hi, creator));
    }
    assert_eq!(epochs.len(), 1, "every process saw the same header");
    let m = Region::open(&name)
        .unwrap()
        .bind(ObjectKind::Scheduler, None)
        .unwrap();
    let live = m.live_processes().unwrap();
    assert_eq!(live.len(), N);
    assert!(live.iter().all(|p| p.alive && p.state == ProcState::Live));
    let (_, _, creator) = epochs.into_iter().next().unwrap();
    assert!(pids.contains(&(creator as i32)));
    go(&mut done_w, N);
    for p in pids {
        assert_eq!(wait_child(p, LIMIT), Exit::Code(0));
    }
    // All children died without deregistering: all reaped, exactly once each.
    let mut seen = HashSet::new();
    let n = m
        .reap_dead(&mut |idx, owner| assert!(seen.insert((idx, owner))))
        .unwrap();
    assert_eq!(n as usize, N);
    assert!(m.live_processes().unwrap().is_empty());
}

#[test]
fn creator_killed_mid_initialisation_is_repaired() {
    let name = unique_name("crash");
    let _c = Cleanup(name.clone());
    let n2 = name.clone();
    let pid = fork_child(move || {
        shmsched::region::create::test_crash_during_init();
        let r = Region::open_or_create(&n2).unwrap();
        let _ = r.bind(ObjectKind::Scheduler, Some(&spec(8)));
        0 // not reached: the hook aborts
    });
    assert_eq!(wait_child(pid, LIMIT), Exit::Signal(libc::SIGABRT));
    let r = Region::open(&name).unwrap();
    let size = std::fs::metadata(r.path().unwrap()).unwrap().len();
    assert!(size > 0, "the creator got as far as sizing the file");
    let head = std::fs::read(r.path().unwrap()).unwrap();
    assert_eq!(&head[..8], b"SHMSCHED", "half a header was written");
    assert_eq!(
        r.info().unwrap(),
        None,
        "a half-written region is not ready"
    );
    let e = r.bind(ObjectKind::Scheduler, None).unwrap_err();
    assert!(
        matches!(&e, Error::BadRegion(m) if m.contains("not initialised")),
        "{e}"
    );

    let m = r.bind(ObjectKind::Scheduler, Some(&spec(8))).unwrap();
    let h: HeaderInfo = m.header();
    assert_eq!(h.params[0], 8);
    assert_eq!(h.created_pid as u32, std::process::id());
    assert_eq!(Region::open(&name).unwrap().info().unwrap(), Some(h));
    let me = m.me().unwrap();
    assert!(m.is_alive(me.idx).unwrap());
}

/// Forks a child that registers, reports (idx, owner) and then blocks until
/// `hold` reaches EOF. Returns (pid, idx, owner).
fn registered_child(
    m: &Arc<shmsched::region::Mapping>,
    hold: &std::fs::File,
) -> (libc::pid_t, u32, u32) {
    let (mut rep_r, rep_w) = pipe();
    let m2 = m.clone();
    let hold = hold.try_clone().unwrap();
    let pid = fork_child(move || {
        let (mut rep_w, mut hold) = (rep_w, hold);
        let me = match m2.me() {
            Ok(me) => me,
            Err(Error::ProcessTableFull { .. }) => return 3,
            Err(_) => return 4,
        };
        send(&mut rep_w, &[me.idx, me.owner]);
        wait_go(&mut hold);
        0
    }); // the parent's copy of rep_w went with the closure
    let idx = recv(&mut rep_r).expect("child registered");
    let owner = recv(&mut rep_r).unwrap();
    (pid, idx, owner)
}

#[test]
fn dead_process_is_detected_and_reaped_exactly_once() {
    let r = Region::anonymous_with(RegionOptions {
        process_slots: 2,
        ..Default::default()
    })
    .unwrap();
    let m = r.bind(ObjectKind::Scheduler, Some(&spec(2))).unwrap();
    let me = m.me().unwrap();
    let (hold_r, mut hold_w) = pipe();

    let (child, idx, owner) = registered_child(&m, &hold_r);
    assert_ne!(idx, me.idx);
    assert!(m.is_alive(idx).unwrap());
    m.proc_entry(idx).unwrap().obj[0].store(42, Ordering::Relaxed);
    // A full table: a third process cannot register.
    let third = fork_child({
        let m = m.clone();
        move || match m.me() {
            Err(Error::ProcessTableFull { slots: 2 }) => 0,
            _ => 1,
        }
    });
    assert_eq!(wait_child(third, LIMIT), Exit::Code(0));
    // The third process died unregistered: nothing to reap, child alive.
    assert_eq!(
        m.reap_dead(&mut |_, _| panic!("nothing is dead")).unwrap(),
        0
    );

    kill(child);
    assert_eq!(wait_child(child, LIMIT), Exit::Signal(libc::SIGKILL));
    assert!(!m.is_alive(idx).unwrap());
    assert!(m.is_alive(me.idx).unwrap());
    // A newcomer finds the table full of one live and one dead process;
    // me() refuses, me_reaping() would reap. (Checked in a child that
    // reports without reaping, so the concurrent-reaper check below still
    // has its dead entry.)
    let probe = fork_child({
        let m = m.clone();
        move || match m.me() {
            Err(Error::ProcessTableFull { .. }) => 0,
            _ => 1,
        }
    });
    assert_eq!(wait_child(probe, LIMIT), Exit::Code(0));
    let summary = m.live_processes().unwrap();
    let s = summary.iter().find(|s| s.idx == idx).unwrap();
    assert!(!s.alive && s.state == ProcState::Live && s.owner == owner);

    // Three concurrent reapers: two threads here and one forked process.
    let calls = Arc::new(AtomicU32::new(0));
    let (start_r, mut start_w) = pipe();
    let reaper_proc = fork_child({
        let m = m.clone();
        let start_r = start_r.try_clone().unwrap();
        move || {
            let mut start_r = start_r;
            wait_go(&mut start_r);
            let mut n = 0;
            let reaped = m.reap_dead(&mut |i, o| {
                assert_eq!((i, o), (idx, owner));
                n += 1;
            });
            match reaped {
                Ok(k) if k == n => n as i32,
                _ => 100,
            }
        }
    });
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let m = m.clone();
            let calls = calls.clone();
            let mut start_r = start_r.try_clone().unwrap();
            std::thread::spawn(move || {
                wait_go(&mut start_r);
                m.reap_dead(&mut |i, o| {
                    assert_eq!((i, o), (idx, owner));
                    calls.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap()
            })
        })
        .collect();
    go(&mut start_w, 3);
    let by_threads: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let by_proc = match wait_child(reaper_proc, LIMIT) {
        Exit::Code(c) if c <= 1 => c as u32,
        other => panic!("reaper process failed: {other:?}"),
    };
    assert_eq!(by_threads, calls.load(Ordering::SeqCst));
    assert_eq!(by_threads + by_proc, 1, "release must run exactly once");

    let e = m.proc_entry(idx).unwrap();
    assert_eq!(e.state(idx).unwrap(), ProcState::Free);
    assert_eq!(e.obj[0].load(Ordering::Relaxed), 0);

    // The entry is reusable, with a new generation and owner id.
    let (child2, idx2, owner2) = registered_child(&m, &hold_r);
    assert_eq!(idx2, idx);
    assert_ne!(owner2, owner);
    assert_eq!(owner2 >> 16, (owner >> 16) + 1);
    assert!(m.is_alive(idx2).unwrap());
    go(&mut hold_w, 1);
    assert_eq!(wait_child(child2, LIMIT), Exit::Code(0));
    assert!(!m.is_alive(idx2).unwrap());
    // A newcomer in a full table (parent + dead child2) reaps and registers.
    let newcomer = fork_child({
        let m = m.clone();
        move || {
            let mut released = vec![];
            match m.me_reaping(&mut |i, o| released.push((i, o))) {
                Ok(id) if id.idx == idx2 && released == [(idx2, owner2)] => 0,
                _ => 1,
            }
        }
    });
    assert_eq!(wait_child(newcomer, LIMIT), Exit::Code(0));
    assert_eq!(m.reap_dead(&mut |i, _| assert_eq!(i, idx2)).unwrap(), 1);
}

#[test]
fn forked_child_gets_its_own_identity() {
    let r = Region::anonymous().unwrap();
    let m = r.bind(ObjectKind::Scheduler, Some(&spec(2))).unwrap();
    let parent = m.me().unwrap();
    let (hold_r, mut hold_w) = pipe();
    let (child, idx, owner) = registered_child(&m, &hold_r);
    assert_ne!(idx, parent.idx);
    assert_ne!(owner, parent.owner);
    assert_eq!(
        m.me().unwrap(),
        parent,
        "the parent's identity is unchanged"
    );
    assert!(m.is_alive(parent.idx).unwrap());
    assert!(m.is_alive(idx).unwrap());
    go(&mut hold_w, 1);
    assert_eq!(wait_child(child, LIMIT), Exit::Code(0));
    // The child's exit closed its copies of every fd: the parent's lock,
    // held through the parent's own description, survives.
    assert!(m.is_alive(parent.idx).unwrap());
    assert!(!m.is_alive(idx).unwrap());
    assert_eq!(
        m.reap_dead(&mut |i, o| assert_eq!((i, o), (idx, owner)))
            .unwrap(),
        1
    );
    assert!(m.is_alive(parent.idx).unwrap());
}

#[test]
fn parent_death_is_detected_while_its_forked_child_lives() {
    let r = Region::anonymous().unwrap();
    let m = r.bind(ObjectKind::Scheduler, Some(&spec(2))).unwrap();
    let (mut rep_r, rep_w) = pipe();
    let (hold_r, mut hold_w) = pipe();
    // P registers, forks C (which inherits P's mapping and fds), then both
    // block. C never registers: it only keeps P's fds' copies alive.
    let p = fork_child({
        let m = m.clone();
        let rep_w = rep_w.try_clone().unwrap();
        let hold_r = hold_r.try_clone().unwrap();
        move || {
            let mut rep_w = rep_w;
            let me = m.me().unwrap();
            let c = fork_child({
                let mut rep_w = rep_w.try_clone().unwrap();
                let mut hold_r = hold_r.try_clone().unwrap();
                move || {
                    send(&mut rep_w, &[u32::MAX]); // C is up
                    drop(rep_w);
                    wait_go(&mut hold_r);
                    0
                }
            });
            send(&mut rep_w, &[me.idx, c as u32]);
            drop(rep_w);
            let mut hold_r = hold_r;
            wait_go(&mut hold_r);
            0
        }
    });
    drop(rep_w);
    let mut got = vec![];
    for _ in 0..3 {
        got.push(recv(&mut rep_r).expect("report from P or C"));
    }
    got.retain(|&v| v != u32::MAX);
    let (p_idx, c_pid) = (got[0], got[1] as libc::pid_t);
    assert!(m.is_alive(p_idx).unwrap());
    kill(p);
    assert_eq!(wait_child(p, LIMIT), Exit::Signal(libc::SIGKILL));
    // C is alive: it waits for a byte that nobody has sent yet.
    // SAFETY: signal 0 only checks existence.
    assert_eq!(unsafe { libc::kill(c_pid, 0) }, 0, "C must still be alive");
    assert!(
        !m.is_alive(p_idx).unwrap(),
        "P's death must be visible although C inherited P's fds"
    );
    assert_eq!(m.reap_dead(&mut |i, _| assert_eq!(i, p_idx)).unwrap(), 1);
    go(&mut hold_w, 1); // lets C exit (it is reparented; not ours to wait for)
}

#[test]
fn futex_wakes_across_fork_and_times_out() {
    let r = Region::anonymous().unwrap();
    let m = r.bind(ObjectKind::Scheduler, Some(&spec(2))).unwrap();
    let word = as_atomic_u32(m.object_ptr());
    word.store(0, Ordering::SeqCst);

    let t = Instant::now();
    assert_eq!(
        futex_wait(word, 0, Some(Duration::from_millis(50))),
        WaitResult::TimedOut
    );
    assert!(t.elapsed() >= Duration::from_millis(45));
    assert_eq!(futex_wait(word, 1, None), WaitResult::Mismatch);

    let (mut ready_r, ready_w) = pipe();
    let child = fork_child({
        let m = m.clone();
        move || {
            let word = as_atomic_u32(m.object_ptr());
            let mut ready_w = ready_w;
            send(&mut ready_w, &[1]);
            // Sleep while the word is 0; only a wake from the parent (which
            // never changes the word) can end this before the timeout.
            match futex_wait(word, 0, Some(Duration::from_secs(20))) {
                WaitResult::Woken => 0,
                WaitResult::TimedOut => 1,
                _ => 2,
            }
        }
    });
    assert_eq!(recv(&mut ready_r), Some(1));
    // The child may not be asleep yet: wake until the kernel reports one
    // sleeper woken.
    let deadline = Instant::now() + Duration::from_secs(10);
    while futex_wake(word, 1) == 0 {
        assert!(Instant::now() < deadline, "child never slept on the word");
        std::thread::yield_now();
    }
    assert_eq!(wait_child(child, LIMIT), Exit::Code(0));
    assert_eq!(word.load(Ordering::SeqCst), 0);
}
