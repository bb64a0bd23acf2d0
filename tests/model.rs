#![cfg(shuttle)]
//! Model checking of the cross-process protocols with `shuttle`, on the
//! shipped code.
//!
//! Built only with `--cfg shuttle`, where the crate's protocol code runs on
//! the checker's atomics and locks and its futex calls on a model of the
//! kernel's (`shmsched::sys::futex::model`); files, OFD locks and mappings
//! stay real. A "process" is a group of model threads with its own
//! [`Region`] handle (its own mapping, registration and liveness lock),
//! all bound before any thread starts. A process dies by closing its
//! liveness lock while all its threads sleep in the futex model (or after
//! they have returned): they never act again, and what it held or
//! published is left to the survivors.
//!
//! ```text
//! RUSTFLAGS="--cfg shuttle" CARGO_TARGET_DIR=target/shuttle \
//!     cargo test --release --test model
//! ```
//!
//! `MODEL_SCALE` multiplies the iteration counts (default 1; every run is
//! also bounded in time, `MODEL_SECONDS` per scheduler, default 20).
//! A failure prints shuttle's failing schedule; replay it with
//! `MODEL_REPLAY='<test name>:<schedule>'`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use shmsched::limiter::Limiter;
use shmsched::region::{Mapping, ObjectKind, Region, RegionOptions};
use shmsched::scheduler::{Concurrency, ModelState, Scheduler};
use shmsched::sys::futex::model;
use shmsched::Priority;
use shuttle::rand::Rng;
use shuttle::scheduler::{PctScheduler, RandomScheduler};
use shuttle::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};
use shuttle::{Config, Runner};

// ---- harness -----------------------------------------------------------------

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `f` under the random scheduler and under PCT (depth 3), each for
/// `iters` executions (scaled by `MODEL_SCALE`) or `MODEL_SECONDS`,
/// whichever comes first; or replays one schedule (`MODEL_REPLAY`).
fn explore(name: &str, iters: usize, f: impl Fn() + Send + Sync + 'static) {
    let f = Arc::new(f);
    if let Ok(r) = std::env::var("MODEL_REPLAY") {
        if let Some(schedule) = r.strip_prefix(&format!("{name}:")) {
            let g = f.clone();
            shuttle::replay(move || g(), schedule.trim());
        }
        return;
    }
    let n = ((iters as f64) * env_f64("MODEL_SCALE", 1.0)).max(1.0) as usize;
    let mut cfg = Config::new();
    cfg.silence_warnings = true;
    cfg.stack_size = 1 << 20;
    cfg.max_steps = shuttle::MaxSteps::FailAfter(2_000_000);
    cfg.max_time = Some(Duration::from_secs_f64(env_f64("MODEL_SECONDS", 20.0)));
    for pct in [false, true] {
        let g = f.clone();
        let t = Instant::now();
        let done = if pct {
            Runner::new(PctScheduler::new(3, n), cfg.clone()).run(move || g())
        } else {
            Runner::new(RandomScheduler::new(n), cfg.clone()).run(move || g())
        };
        eprintln!(
            "model {name}: {done} executions ({}) in {:.1} s",
            if pct { "PCT, depth 3" } else { "random" },
            t.elapsed().as_secs_f64()
        );
    }
}

/// Spawns a model thread of a process; a thread whose process died ends
/// quietly (see the module docs).
fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> shuttle::thread::JoinHandle<()> {
    shuttle::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
                if !e.is::<model::Died>() {
                    std::panic::resume_unwind(e);
                }
            }
        })
        .unwrap()
}

/// A fresh region file for one execution (unlinked once every process has
/// opened it).
fn region_path() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    dir.join(format!(
        "shmsched-model-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ))
    .to_string_lossy()
    .into_owned()
}

/// Opens the region `n` times: one handle per "process", the first
/// creating it (a small process table: the model's atomics are large).
fn open_regions(n: usize) -> Vec<Region> {
    let path = region_path();
    let opts = RegionOptions {
        process_slots: 4,
        ..RegionOptions::default()
    };
    let mut v = vec![Region::create_with(&path, opts).unwrap()];
    for _ in 1..n {
        v.push(Region::open(&path).unwrap());
    }
    v
}

/// One process of a scheduler region.
struct Proc {
    sched: Scheduler,
    map: Arc<Mapping>,
}

impl Proc {
    /// This process dies if exactly `threads` of its threads are asleep
    /// (see [`Mapping::model_die_if_parked`]).
    fn die_if_parked(&self, threads: usize) -> bool {
        self.map.model_die_if_parked(threads)
    }

    fn state(&self) -> ModelState {
        self.sched.model_state().unwrap()
    }
}

/// `n` processes sharing one scheduler region, each with a handle at
/// `concurrency` (the first creates the region with its max).
fn sched_procs(n: usize, concurrency: Concurrency) -> Vec<Proc> {
    let regions = open_regions(n);
    let procs: Vec<Proc> = regions
        .iter()
        .map(|r| {
            let sched = Scheduler::shared(r, concurrency).unwrap();
            let map = r.bind(ObjectKind::Scheduler, None).unwrap();
            Proc { sched, map }
        })
        .collect();
    if let Some(p) = regions[0].path() {
        let _ = std::fs::remove_file(p);
    }
    procs
}

/// The region's state once every thread is done: nothing held, nobody
/// waiting or designated, every `held` word exact.
fn assert_quiescent(p: &Proc, max: u32) {
    let st = p.state();
    let stats = p.sched.stats();
    let shared = stats.shared.clone().unwrap();
    assert_eq!(st.occupied, 0, "cells still held at the end: {st:?}");
    assert_eq!(shared.running, 0, "{shared:?}");
    assert_eq!(shared.waiters, [0; 7], "waiters left: {shared:?} {st:?}");
    assert_eq!(st.designee, None, "a designee is left: {st:?}");
    assert_eq!(st.gate & GATE_TIERS, 0, "tier bits left: {st:?}");
    for &(idx, _, held, owned, counted) in &st.members {
        assert_eq!(owned, 0, "process {idx} owns cells: {st:?}");
        assert_eq!(
            held,
            u64::from(counted),
            "process {idx}: held word {held}, counted cells {counted}: {st:?}"
        );
    }
    assert_eq!(p.sched.global_running(), 0);
    assert!(shared.max == max);
    if st.gate & GATE_STRICT != 0 {
        // A fairness hand-off's strict bit can outlive its designee (a
        // releaser that read the designation before it ended closes the
        // fast paths after it ended): the next call that goes the slow way
        // clears it.
        drop(p.sched.try_acquire(Priority::Normal).expect("a free slot"));
        assert_eq!(p.state().gate & GATE_STRICT, 0, "{:?}", p.state());
    }
}

/// Gate bits of the tiers with waiters, and the fairness hand-off bit.
const GATE_TIERS: u64 = 0x7f;
const GATE_STRICT: u64 = 0x80;

/// Invariants that hold at every step (checked by an observer thread
/// interleaved anywhere): never more than `max` cells taken nor `max`
/// permits out, no `held` word below zero (it would wrap) or beyond what
/// the process's threads can account for.
fn assert_step(p: &Proc, max: u32, in_cs: &AtomicU32, threads_per_proc: u64) {
    let n = in_cs.load(SeqCst);
    assert!(n <= max, "{n} permits out with max {max}");
    let st = p.state();
    assert!(st.occupied <= max, "{st:?}");
    for &(idx, _, held, _, _) in &st.members {
        assert!(
            held <= u64::from(max) + 2 * threads_per_proc,
            "process {idx}: held word {held} (underflow or leak): {st:?}"
        );
    }
}

const PRIOS: [Priority; 3] = [Priority::Low, Priority::Normal, Priority::High];

// ---- 1. take / give / enqueue / dispatch / wake ---------------------------------

/// `procs` processes × `threads` threads on a region of `max` cells, each
/// thread doing `ops` operations drawn by the checker (blocking acquire,
/// try_acquire, or acquire_timeout(0), which enqueues and cancels) at
/// mixed priorities; timeouts off, so a lost wake-up is a deadlock.
fn mix(max: u32, procs: usize, threads: usize, ops: usize) {
    model::set_timeouts(false);
    let ps = Arc::new(sched_procs(procs, Concurrency::max(max)));
    let in_cs = Arc::new(AtomicU32::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let mut hs = Vec::new();
    for pi in 0..procs {
        for ti in 0..threads {
            let (ps, in_cs) = (ps.clone(), in_cs.clone());
            hs.push(spawn(&format!("p{pi}t{ti}"), move || {
                let s = &ps[pi].sched;
                let mut rng = shuttle::rand::thread_rng();
                for _ in 0..ops {
                    let prio = PRIOS[rng.gen_range(0..PRIOS.len())];
                    let op = rng.gen_range(0..4);
                    model::trace(format_args!("op {op} prio {prio:?}"));
                    let permit = match op {
                        0 | 1 => Some(s.acquire(prio).unwrap()),
                        2 => s.try_acquire(prio),
                        _ => s.acquire_timeout(prio, Duration::ZERO).ok(),
                    };
                    if let Some(permit) = permit {
                        let n = in_cs.fetch_add(1, SeqCst) + 1;
                        assert!(n <= max, "{n} permits out with max {max}");
                        shuttle::thread::yield_now();
                        in_cs.fetch_sub(1, SeqCst);
                        drop(permit);
                    }
                }
            }));
        }
    }
    let observer = {
        let (ps, in_cs, done) = (ps.clone(), in_cs.clone(), done.clone());
        spawn("observer", move || {
            for _ in 0..8 {
                if done.load(SeqCst) {
                    break;
                }
                assert_step(&ps[0], max, &in_cs, threads as u64);
            }
        })
    };
    for h in hs {
        h.join().unwrap();
    }
    done.store(true, SeqCst);
    observer.join().unwrap();
    for p in ps.iter() {
        assert_quiescent(p, max);
    }
}

/// The smallest hand-off: a holder in one process releases while a waiter
/// in another is queued, designated, and tries to take. Timeouts off: the
/// waiter must be woken by the release (or take the freed cell itself),
/// never left for the backstop.
#[test]
fn release_races_designee_take() {
    explore("release_races_designee_take", 3000, || {
        model::set_timeouts(false);
        let ps = Arc::new(sched_procs(2, Concurrency::max(1)));
        let holder = {
            let ps = ps.clone();
            spawn("p0t0", move || {
                let p = ps[0].sched.acquire(Priority::Normal).unwrap();
                shuttle::thread::yield_now();
                drop(p);
            })
        };
        let waiter = {
            let ps = ps.clone();
            spawn("p1t0", move || {
                drop(ps[1].sched.acquire(Priority::Normal).unwrap());
            })
        };
        holder.join().unwrap();
        waiter.join().unwrap();
        for p in ps.iter() {
            assert_quiescent(p, 1);
        }
    });
}

#[test]
fn take_give_dispatch_max1_three_procs() {
    explore("take_give_dispatch_max1_three_procs", 3000, || mix(1, 3, 1, 3));
}

#[test]
fn take_give_dispatch_max1_two_procs_two_threads() {
    explore(
        "take_give_dispatch_max1_two_procs_two_threads",
        3000,
        || mix(1, 2, 2, 2),
    );
}

#[test]
fn take_give_dispatch_max2_three_procs() {
    explore("take_give_dispatch_max2_three_procs", 3000, || {
        mix(2, 3, 1, 3)
    });
}

#[test]
fn take_give_dispatch_max2_two_procs_two_threads() {
    explore(
        "take_give_dispatch_max2_two_procs_two_threads",
        3000,
        || mix(2, 2, 2, 2),
    );
}

