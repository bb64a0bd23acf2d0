//! Region hardening (issue 8): foreign files, world-writable files, crashed
//! and killed creators, fork windows, scribbled ready marks, truncation,
//! full process tables in transit, and object initialisations that fail.
//! The adversary (the killed creator, the truncating writer, the reaper in
//! progress) runs in another process; every wait is bounded.

mod region_util;
use region_util as common;

use std::os::unix::fs::{FileExt, PermissionsExt};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use shmsched::fair::{FairConfig, FairShare, FairnessUnit};
use shmsched::limiter::Limiter;
use shmsched::region::{ObjectKind, ObjectSpec, Region, RegionOptions, TryInit};
use shmsched::scheduler::Scheduler;
use shmsched::{Error, Priority};

const LIMIT: Duration = Duration::from_secs(30);

fn fair_cfg() -> FairConfig {
    FairConfig {
        ceiling: 100.0,
        fairness_unit: FairnessUnit::Cost,
        tenants: vec![("a".into(), 1.0), ("b".into(), 1.0)],
        reclaim_horizon_ms: 100,
        idle_after_ms: 1000,
        started_at_ms: 0,
    }
}

/// A 1 MiB file whose first 4 KiB are zero and whose rest is user data is
/// not a region: no bind of any kind may modify it.
#[test]
fn foreign_file_with_a_zeroed_start_is_never_overwritten() {
    let path = std::env::temp_dir().join(unique_name("zerostart"));
    let mut data = vec![0u8; 1 << 20];
    for (i, b) in data.iter_mut().enumerate().skip(4096) {
        *b = (i % 251) as u8;
    }
    std::fs::write(&path, &data).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let p = path.to_str().unwrap();
    let check = |what: &str, e: Error| {
        let m = e.to_string();
        assert!(matches!(e, Error::BadRegion(_)), "{what}: {m}");
        assert!(m.contains("not a shmsched region"), "{what}: {m}");
        assert!(m.contains(&(1u64 << 20).to_string()), "{what}: {m}");
    };
    check(
        "scheduler",
        Scheduler::shared(&Region::open(p).unwrap(), 4).unwrap_err(),
    );
    check(
        "limiter",
        Limiter::shared(&Region::open_or_create(p).unwrap(), 1000).unwrap_err(),
    );
    check(
        "fair",
        FairShare::shared(&Region::open(p).unwrap(), &fair_cfg()).unwrap_err(),
    );
    check("info", Region::open(p).unwrap().info().unwrap_err());
    assert!(
        std::fs::read(&path).unwrap() == data,
        "the file was modified"
    );
    std::fs::remove_file(&path).unwrap();
}

/// A region file chmod-ed world-writable after its creation is refused,
/// naming the file and its mode: on open, and on bind through a handle
/// opened before the chmod.
#[test]
fn world_writable_region_file_is_refused() {
    let name = unique_name("ww");
    let _c = Cleanup(name.clone());
    let r = Region::create(&name).unwrap();
    drop(Scheduler::shared(&r, 2).unwrap());
    let early = Region::open(&name).unwrap();
    let path = r.path().unwrap().to_path_buf();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let check = |e: Error| {
        let m = e.to_string();
        assert!(matches!(e, Error::BadRegion(_)), "{m}");
        assert!(m.contains(&path.display().to_string()), "{m}");
        assert!(m.contains("0o666") && m.contains("world-writable"), "{m}");
    };
    check(Region::open(&name).unwrap_err());
    check(Region::open_or_create(&name).unwrap_err());
    check(Scheduler::attach(&early).unwrap_err());
    check(early.info().unwrap_err());
    // Group access stays allowed.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660)).unwrap();
    Scheduler::attach(&Region::open(&name).unwrap()).unwrap();
}

/// A creator that dies at any step of the initialisation leaves a file the
/// next binder recognises and initialises again.
#[test]
fn creator_killed_at_each_init_step_is_repaired() {
    for step in 1..=4u32 {
        let name = unique_name(&format!("step{step}"));
        let _c = Cleanup(name.clone());
        let n2 = name.clone();
        let pid = fork_child(move || {
            shmsched::region::create::test_crash_during_init_at(step);
            let r = Region::open_or_create(&n2).unwrap();
            let _ = Scheduler::shared(&r, 3);
            0 // not reached: the hook aborts
        });
        assert_eq!(
            wait_child(pid, LIMIT),
            Exit::Signal(libc::SIGABRT),
            "step {step}"
        );
        let r = Region::open(&name).unwrap();
        assert_eq!(r.info().unwrap(), None, "step {step}: not ready");
        let s = Scheduler::shared(&r, 3).unwrap();
        let p = s.try_acquire(Priority::Normal).expect("a free slot");
        assert_eq!(s.stats().shared.unwrap().running, 1, "step {step}");
        drop(p);
        assert_eq!(r.info().unwrap().unwrap().params[0], 3);
    }
}

/// Creators SIGKILLed at random instants of their initialisation (all three
/// kinds; the limiter's includes a 20 ms clock calibration): the next
/// binder always ends with a working region. The kill point is random, so
/// how often each state is hit is reported, not asserted.
#[test]
fn creators_sigkilled_at_random_points_are_repaired() {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(std::process::id());
    let mut states = [0u32; 3]; // empty, magic without ready, ready
    for i in 0..36u32 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let name = unique_name(&format!("kill{i}"));
        let _c = Cleanup(name.clone());
        let (mut started_r, mut started_w) = pipe();
        let n2 = name.clone();
        let kind = i % 3;
        let pid = fork_child(move || {
            send(&mut started_w, &[1]);
            let r = Region::open_or_create(&n2).unwrap();
            match kind {
                0 => drop(Scheduler::shared(&r, 4).unwrap()),
                1 => drop(Limiter::shared(&r, 5000).unwrap()),
                _ => drop(FairShare::shared(&r, &fair_cfg()).unwrap()),
            }
            std::thread::sleep(Duration::from_secs(30));
            0
        });
        assert_eq!(recv(&mut started_r), Some(1));
        // The randomness of the kill point, not synchronisation.
        std::thread::sleep(Duration::from_micros(rng % 30_000));
        kill(pid);
        assert_eq!(wait_child(pid, LIMIT), Exit::Signal(libc::SIGKILL));
        let path = shmsched::region::resolve_path(&name).unwrap();
        let bytes = std::fs::read(&path).unwrap_or_default();
        let state = if bytes.is_empty() {
            0
        } else if bytes.len() >= 156 && bytes[152..156] == *b"REDY" {
            2
        } else {
            assert_eq!(
                &bytes[..bytes.len().min(8)],
                &b"SHMSCHED"[..bytes.len().min(8)]
            );
            1
        };
        states[state] += 1;
        let r = Region::open_or_create(&name).unwrap();
        match kind {
            0 => {
                let s = Scheduler::shared(&r, 4).unwrap();
                assert!(s.try_acquire(Priority::High).is_some(), "iteration {i}");
            }
            1 => {
                let l = Limiter::shared(&r, 5000).unwrap();
                assert!(l.try_consume(1).unwrap(), "iteration {i}");
            }
            _ => {
                let mut f = FairShare::shared(&r, &fair_cfg()).unwrap();
                assert!(
                    f.acquire_now("a", 1.0, 10).unwrap().is_ok(),
                    "iteration {i}"
                );
            }
        }
    }
    eprintln!(
        "killed creators left: {} empty, {} half-initialised, {} ready",
        states[0], states[1], states[2]
    );
}

/// A child forked while its parent initialises a region (holding the
/// exclusive `flock`) does not keep that lock when the parent dies: the
/// next binder initialises the region instead of waiting for the child.
#[test]
fn fork_during_creation_does_not_keep_the_flock() {
    let name = unique_name("forkflock");
    let _c = Cleanup(name.clone());
    let (mut pid_r, pid_w) = pipe();
    let (hold_r, mut hold_w) = pipe();
    let n2 = name.clone();
    let creator = fork_child(move || {
        let r = Region::open_or_create(&n2).unwrap();
        let init = move |_: &mut [u8]| {
            // SAFETY (test): the grandchild only sends its pid, waits on a
            // pipe and leaves with _exit.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                let (mut w, mut hold) = (pid_w.try_clone().unwrap(), hold_r.try_clone().unwrap());
                // SAFETY (test): getpid has no preconditions.
                send(&mut w, &[unsafe { libc::getpid() } as u32]);
                wait_go(&mut hold);
                // SAFETY (test): leave without running destructors.
                unsafe { libc::_exit(0) };
            }
            std::process::abort(); // the creator dies mid-initialisation
        };
        let spec = ObjectSpec {
            kind: ObjectKind::Scheduler,
            params: [8, 0, 0, 0, 0, 0, 0, 0],
            object_size: OBJ_SIZE,
            init: &init,
        };
        let _ = r.bind(ObjectKind::Scheduler, Some(&spec));
        0
    });
    let grandchild = recv(&mut pid_r).expect("grandchild pid") as libc::pid_t;
    assert_eq!(wait_child(creator, LIMIT), Exit::Signal(libc::SIGABRT));
    // The grandchild lives on. Bind from another process, bounded.
    let n3 = name.clone();
    let binder = fork_child(move || {
        let r = Region::open(&n3).unwrap();
        match r.bind(ObjectKind::Scheduler, Some(&spec(8))) {
            Ok(m) if m.header().params[0] == 8 => 0,
            Ok(_) => 2,
            Err(e) => {
                eprintln!("bind after a dead creator: {e}");
                1
            }
        }
    });
    let got = wait_child(binder, Duration::from_secs(8));
    go(&mut hold_w, 1);
    kill(grandchild);
    assert_eq!(got, Exit::Code(0));
}

static WINDOW_STEP: AtomicU32 = AtomicU32::new(0);

/// Runs inside the open-to-record window of a liveness-lock fd: lets the
/// forking thread go, and gives its fork 300 ms to happen (it cannot while
/// the window is open: it waits for it).
fn window_hook() {
    if WINDOW_STEP
        .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return;
    }
    let t = Instant::now();
    while WINDOW_STEP.load(Ordering::SeqCst) != 2 && t.elapsed() < Duration::from_millis(300) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A fork on another thread while a process registers (between the open of
/// its liveness fd and its recording) does not hand the child a copy that
/// keeps the parent "alive" after its death.
#[test]
fn fork_in_the_registration_window_does_not_outlive_the_parent() {
    let r = Region::anonymous().unwrap();
    let m = r.bind(ObjectKind::Scheduler, Some(&spec(2))).unwrap();
    let (mut rep_r, rep_w) = pipe();
    let (hold_r, mut hold_w) = pipe();
    let m2 = m.clone();
    let parent = fork_child(move || {
        let mut rep_w = rep_w;
        shmsched::sys::fork::set_window_hook(Some(window_hook));
        let (mut w2, hold) = (rep_w.try_clone().unwrap(), hold_r);
        let forker = std::thread::spawn(move || {
            while WINDOW_STEP.load(Ordering::SeqCst) != 1 {
                std::thread::sleep(Duration::from_millis(1));
            }
            // SAFETY (test): the grandchild sends its pid, waits, _exits.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                let mut hold = hold;
                // SAFETY (test): getpid has no preconditions.
                send(&mut w2, &[1, unsafe { libc::getpid() } as u32]);
                wait_go(&mut hold);
                // SAFETY (test): leave without running destructors.
                unsafe { libc::_exit(0) };
            }
            WINDOW_STEP.store(2, Ordering::SeqCst);
        });
        let me = m2.me().unwrap();
        forker.join().unwrap();
        send(&mut rep_w, &[0, me.idx]);
        0 // the "parent" exits: its entry must look dead
    });
    // Two tagged reports, in either order: 0 = entry index, 1 = grandchild.
    let mut got = [0u32; 2];
    for _ in 0..2 {
        let tag = recv(&mut rep_r).unwrap() as usize;
        got[tag] = recv(&mut rep_r).unwrap();
    }
    assert_eq!(wait_child(parent, LIMIT), Exit::Code(0));
    let (idx, grandchild) = (got[0], got[1] as libc::pid_t);
    let alive = m.is_alive(idx).unwrap();
    go(&mut hold_w, 1);
    kill(grandchild);
    assert!(
        !alive,
        "the dead parent's entry {idx} is held by its forked child"
    );
    assert_eq!(m.reap_dead(&mut |_, _| {}).unwrap(), 1);
}

/// A ready mark scribbled away while processes are registered does not make
/// the next binder wipe the region under them.
#[test]
fn scribbled_ready_mark_with_live_processes_is_not_reinitialised() {
    let name = unique_name("unready");
    let _c = Cleanup(name.clone());
    let r = Region::create(&name).unwrap();
    let sched = Scheduler::shared(&r, 2).unwrap();
    let permit = sched.try_acquire(Priority::Normal).unwrap();
    let path = r.path().unwrap().to_path_buf();
    let size = std::fs::metadata(&path).unwrap().len();
    // The writer is another process.
    let p2 = path.clone();
    let writer = fork_child(move || {
        let f = std::fs::OpenOptions::new().write(true).open(&p2).unwrap();
        f.write_all_at(&[0u8; 4], 152).unwrap();
        0
    });
    assert_eq!(wait_child(writer, LIMIT), Exit::Code(0));
    let e = Scheduler::shared(&Region::open(&name).unwrap(), 2).unwrap_err();
    assert!(
        e.to_string().contains("live processes are registered"),
        "{e}"
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
    assert_eq!(sched.stats().shared.unwrap().running, 1, "state kept");
    drop(permit);
}

/// An anonymous region is sealed against shrinking: another process
/// holding its memfd cannot truncate it.
#[test]
fn memfd_region_cannot_be_shrunk() {
    let r = Region::anonymous().unwrap();
    let sched = Scheduler::shared(&r, 2).unwrap();
    let adversary = fork_child(|| {
        for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
            let target = std::fs::read_link(entry.path()).unwrap_or_default();
            if target.to_string_lossy().starts_with("/memfd:shmsched") {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(entry.path())
                    .unwrap();
                match f.set_len(0) {
                    Err(e) if e.raw_os_error() == Some(libc::EPERM) => return 0,
                    other => {
                        eprintln!("truncating the memfd: {other:?}");
                        return 1;
                    }
                }
            }
        }
        2
    });
    assert_eq!(wait_child(adversary, LIMIT), Exit::Code(0));
    assert!(sched.try_acquire(Priority::Normal).is_some());
}

/// What happens when a named region is truncated by another process while
/// mapped (documented in the README): a process that then touches the
/// lost pages dies with SIGBUS. The library cannot prevent it for a named
/// file; anonymous regions are sealed (above).
#[test]
fn named_region_truncated_under_a_process_raises_sigbus() {
    let name = unique_name("trunc");
    let _c = Cleanup(name.clone());
    let (mut ready_r, ready_w) = pipe();
    let (go_r, mut go_w) = pipe();
    let n2 = name.clone();
    let victim = fork_child(move || {
        let (mut ready_w, mut go_r) = (ready_w, go_r);
        let r = Region::open_or_create(&n2).unwrap();
        let s = Scheduler::shared(&r, 2).unwrap();
        send(&mut ready_w, &[1]);
        wait_go(&mut go_r);
        let _p = s.try_acquire(Priority::Normal);
        0
    });
    assert_eq!(recv(&mut ready_r), Some(1));
    let path = shmsched::region::resolve_path(&name).unwrap();
    let truncator = fork_child(move || {
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(0).unwrap();
        0
    });
    assert_eq!(wait_child(truncator, LIMIT), Exit::Code(0));
    go(&mut go_w, 1);
    assert_eq!(wait_child(victim, LIMIT), Exit::Signal(libc::SIGBUS));
}

/// A bind that finds the process table full of live processes and one dead
/// process *being reaped by another process* waits for that reap instead of
/// failing with ProcessTableFull.
#[test]
fn bind_waits_for_an_entry_being_reaped() {
    let r = Region::anonymous_with(RegionOptions {
        process_slots: 2,
        ..Default::default()
    })
    .unwrap();
    Scheduler::shared(&r, 2).unwrap().detach().unwrap();
    let m = r.bind(ObjectKind::Scheduler, None).unwrap();
    // Entry 1: a live holder. Entry 2: a process that died.
    let (hold_r, mut hold_w) = pipe();
    let (mut rep_r, rep_w) = pipe();
    let (m1, h1, mut w1) = (
        m.clone(),
        hold_r.try_clone().unwrap(),
        rep_w.try_clone().unwrap(),
    );
    let live = fork_child(move || {
        let mut h1 = h1;
        send(&mut w1, &[m1.me().unwrap().idx]);
        wait_go(&mut h1);
        0
    });
    let (m2, mut w2) = (m.clone(), rep_w.try_clone().unwrap());
    let dead = fork_child(move || {
        send(&mut w2, &[m2.me().unwrap().idx]);
        0
    });
    let _ = (recv(&mut rep_r).unwrap(), recv(&mut rep_r).unwrap());
    assert_eq!(wait_child(dead, LIMIT), Exit::Code(0));
    // The reaper: claims the dead entry and stays inside its release until
    // told to finish.
    let (mut in_r, in_w) = pipe();
    let (fin_r, mut fin_w) = pipe();
    let m3 = m.clone();
    let reaper = fork_child(move || {
        let (mut in_w, mut fin_r) = (in_w, fin_r);
        let n = m3
            .reap_dead(&mut |_, _| {
                send(&mut in_w, &[1]);
                wait_go(&mut fin_r);
            })
            .unwrap();
        i32::from(n != 1)
    });
    assert_eq!(recv(&mut in_r), Some(1), "the reaper is at work");
    let (tx, rx) = std::sync::mpsc::channel();
    let r2 = r.clone();
    let binder = std::thread::spawn(move || {
        let got = Scheduler::attach(&r2).map(|s| s.owner_id());
        tx.send(got.map_err(|e| e.to_string())).unwrap();
    });
    // While the reaper works, the bind must still be waiting (today it fails
    // at once with ProcessTableFull).
    let early = rx.recv_timeout(Duration::from_millis(300));
    go(&mut fin_w, 1);
    let got = match early {
        Ok(v) => v,
        Err(_) => rx.recv_timeout(LIMIT).expect("bind finished"),
    };
    binder.join().unwrap();
    assert_eq!(wait_child(reaper, LIMIT), Exit::Code(0));
    go(&mut hold_w, 1);
    assert_eq!(wait_child(live, LIMIT), Exit::Code(0));
    assert!(
        got.is_ok(),
        "bind failed while an entry was being reaped: {got:?}"
    );
}

/// An object initialisation that fails leaves the region unmarked: the
/// bind reports the error and the next binder initialises it.
#[test]
fn failed_object_init_leaves_the_region_unmarked() {
    let r = Region::anonymous().unwrap();
    let bad = TryInit(|_: &mut [u8]| Err(Error::InvalidArgument("no room for the object".into())));
    let s = ObjectSpec {
        kind: ObjectKind::Scheduler,
        params: [8, 0, 0, 0, 0, 0, 0, 0],
        object_size: OBJ_SIZE,
        init: &bad,
    };
    let e = r.bind(ObjectKind::Scheduler, Some(&s)).unwrap_err();
    assert!(e.to_string().contains("no room for the object"), "{e}");
    assert_eq!(r.info().unwrap(), None);
    let m = r.bind(ObjectKind::Scheduler, Some(&spec(8))).unwrap();
    assert_eq!(m.header().params[0], 8);
}

/// A reap whose release fails keeps the dead process's entry (and its owner
/// id), so a later reap releases what it held.
#[test]
fn failed_release_keeps_the_entry_for_a_later_reap() {
    let r = Region::anonymous().unwrap();
    let m = r.bind(ObjectKind::Scheduler, Some(&spec(2))).unwrap();
    let (mut rep_r, rep_w) = pipe();
    let m2 = m.clone();
    let dead = fork_child(move || {
        let mut rep_w = rep_w;
        let me = m2.me().unwrap();
        send(&mut rep_w, &[me.idx, me.owner]);
        0
    });
    let (idx, owner) = (recv(&mut rep_r).unwrap(), recv(&mut rep_r).unwrap());
    assert_eq!(wait_child(dead, LIMIT), Exit::Code(0));
    let e = m
        .reap_dead_checked(&mut |_, _| Err(Error::BadRegion("ledger unavailable".into())))
        .unwrap_err();
    assert!(e.to_string().contains("ledger unavailable"), "{e}");
    let mut seen = vec![];
    let n = m
        .reap_dead_checked(&mut |i, o| {
            seen.push((i, o));
            Ok(())
        })
        .unwrap();
    assert_eq!((n, seen), (1, vec![(idx, owner)]));
    let _ = Arc::strong_count(&m);
}

/// Churn (the field report of issue 8): a 4-entry table with two live
/// holders, and two churners that keep forking workers which register and
/// are SIGKILLed at once, so that each dead entry is reaped by the next
/// registrant, often by two at a time. No registration may fail: the table
/// is never full of live processes. (The deterministic version of the race
/// is `bind_waits_for_an_entry_being_reaped`.)
#[test]
fn registration_under_churn_never_finds_the_table_full() {
    let r = Region::anonymous_with(RegionOptions {
        process_slots: 4,
        ..Default::default()
    })
    .unwrap();
    Scheduler::shared(&r, 2).unwrap().detach().unwrap();
    let (hold_r, mut hold_w) = pipe();
    let (mut rep_r, rep_w) = pipe();
    let holders: Vec<_> = (0..2)
        .map(|_| {
            let (r, mut h, mut w) = (
                r.clone(),
                hold_r.try_clone().unwrap(),
                rep_w.try_clone().unwrap(),
            );
            fork_child(move || {
                let s = Scheduler::attach(&r).unwrap();
                send(&mut w, &[1]);
                wait_go(&mut h);
                drop(s);
                0
            })
        })
        .collect();
    assert_eq!((recv(&mut rep_r), recv(&mut rep_r)), (Some(1), Some(1)));
    let churners: Vec<_> = (0..2)
        .map(|_| {
            let r = r.clone();
            std::thread::spawn(move || {
                let mut codes = std::collections::BTreeMap::new();
                for _ in 0..150 {
                    let r = r.clone();
                    let pid = fork_child(move || match Scheduler::attach(&r) {
                        Ok(_s) => {
                            // SAFETY (test): dies at once, holding its entry.
                            unsafe { libc::raise(libc::SIGKILL) };
                            0
                        }
                        Err(shmsched::Error::ProcessTableFull { .. }) => 3,
                        Err(e) => {
                            eprintln!("attach under churn: {e}");
                            4
                        }
                    });
                    *codes
                        .entry(format!("{:?}", wait_child(pid, LIMIT)))
                        .or_insert(0) += 1;
                }
                codes
            })
        })
        .collect();
    let mut codes = std::collections::BTreeMap::new();
    for c in churners {
        for (k, v) in c.join().unwrap() {
            *codes.entry(k).or_insert(0) += v;
        }
    }
    go(&mut hold_w, 2);
    for h in holders {
        assert_eq!(wait_child(h, LIMIT), Exit::Code(0));
    }
    let killed = format!("{:?}", Exit::Signal(libc::SIGKILL));
    assert_eq!(codes.get(&killed), Some(&300), "outcomes: {codes:?}");
}
