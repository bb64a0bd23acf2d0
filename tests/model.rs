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
//! `MODEL_SEED=<u64>` runs the same schedules every time (CI's gate),
//! bounded by the iteration counts alone.
//! A failure prints shuttle's failing schedule; replay it with
//! `MODEL_REPLAY='<test name>:<schedule>'` (or `<test name>:@<file>`,
//! the schedule in a file), and follow it with `MODEL_TRACE=1` (futex
//! waits and wakes, by thread).

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

thread_local! {
    /// Coverage counters of the current test (its executions run on this
    /// OS thread), printed after each scheduler's run.
    static COVERAGE: std::cell::RefCell<std::collections::BTreeMap<&'static str, u64>> =
        Default::default();
}

/// Counts one execution that reached `what` (printed by [`explore`]).
fn cover(what: &'static str) {
    COVERAGE.with(|c| *c.borrow_mut().entry(what).or_default() += 1);
}

/// Runs `f` under the random scheduler and under PCT (depth 3), each for
/// `iters` executions (scaled by `MODEL_SCALE`) or `MODEL_SECONDS`,
/// whichever comes first; or replays one schedule (`MODEL_REPLAY`).
fn explore(name: &str, iters: usize, f: impl Fn() + Send + Sync + 'static) {
    let f = Arc::new(f);
    if let Ok(r) = std::env::var("MODEL_REPLAY") {
        if let Some(schedule) = r.strip_prefix(&format!("{name}:")) {
            // `@path`: the schedule is in a file (long ones do not fit in
            // the environment).
            let schedule = match schedule.strip_prefix('@') {
                Some(path) => std::fs::read_to_string(path).unwrap(),
                None => schedule.to_string(),
            };
            let g = f.clone();
            shuttle::replay(
                move || {
                    model::begin();
                    g()
                },
                schedule.trim(),
            );
        }
        return;
    }
    let n = ((iters as f64) * env_f64("MODEL_SCALE", 1.0)).max(1.0) as usize;
    let mut cfg = Config::new();
    cfg.silence_warnings = true;
    cfg.stack_size = 1 << 20;
    cfg.max_steps = shuttle::MaxSteps::FailAfter(2_000_000);
    cfg.max_time = Some(Duration::from_secs_f64(env_f64("MODEL_SECONDS", 20.0)));
    // MODEL_SEED: the same schedules on every run (CI's gate), bounded by
    // the iteration count only (the time budget would cut them short on a
    // slower machine); otherwise fresh seeds within the time budget (an
    // open search).
    let seed = std::env::var("MODEL_SEED")
        .ok()
        .map(|s| s.parse::<u64>().expect("MODEL_SEED is a u64"));
    if seed.is_some() {
        cfg.max_time = None;
    }
    for pct in [false, true] {
        let g = f.clone();
        let t = Instant::now();
        let run = move || {
            model::begin();
            g()
        };
        let done = match (pct, seed) {
            (true, Some(s)) => {
                Runner::new(PctScheduler::new_from_seed(s, 3, n), cfg.clone()).run(run)
            }
            (true, None) => Runner::new(PctScheduler::new(3, n), cfg.clone()).run(run),
            (false, Some(s)) => {
                Runner::new(RandomScheduler::new_from_seed(s, n), cfg.clone()).run(run)
            }
            (false, None) => Runner::new(RandomScheduler::new(n), cfg.clone()).run(run),
        };
        let cov = COVERAGE.with(|c| std::mem::take(&mut *c.borrow_mut()));
        eprintln!(
            "model {name}: {done} executions ({}) in {:.1} s; {cov:?}",
            if pct { "PCT, depth 3" } else { "random" },
            t.elapsed().as_secs_f64()
        );
    }
}

/// Spawns a model thread of the process whose mapping is `proc` (`None`:
/// a thread of no process, which nothing stops or kills); a thread whose
/// process died ends quietly, with `None` (see the module docs).
fn spawn<T: Send + 'static>(
    proc: Option<Arc<Mapping>>,
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> shuttle::thread::JoinHandle<Option<T>> {
    shuttle::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            if let Some(m) = proc {
                m.model_join();
            }
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
                Ok(v) => Some(v),
                Err(e) if e.is::<model::Died>() => None,
                Err(e) => std::panic::resume_unwind(e),
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
    // Nobody is queued, so nobody keeps the backstop (a waiter that
    // claimed the role as it was granted must not keep it: the process
    // would have no backstop until that waiter is queued again).
    assert_eq!(p.sched.model_keeper(), 0, "a keeper is left: {st:?}");
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
    for (proc_, held) in p.sched.processes().unwrap() {
        assert_eq!(held, 0, "{proc_:?} holds cells at the end");
    }
    if stats.total.deferred > 0 {
        cover("a waiter queued (per process)");
    }
    if stats.total.cancelled > 0 {
        cover("a queued waiter cancelled (per process)");
    }
    if shared.wakes > 0 {
        cover("a cross-thread futex wake found a sleeper");
    }
    if shared.fair_handoffs > 0 {
        cover("a fairness hand-off closed the fast paths");
    }
    if st.gate & GATE_COUNTING != 0 {
        cover("counting on");
    }
    if st.gate & GATE_STRICT != 0 {
        cover("strict bit outlived its designee");
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
/// interleaved anywhere): never more than `max` units out, cells taken
/// (`global_running`, and one scan of the table), no `held` word below
/// zero (it would wrap) or beyond what the process's threads can account
/// for. (Per-process cell counts are read one process after another, so
/// their sum is no snapshot: checked at the end.)
fn assert_step(p: &Proc, max: u32, in_cs: &AtomicU32, threads_per_proc: u64) {
    let n = in_cs.load(SeqCst);
    assert!(n <= max, "{n} units out with max {max}");
    let running = p.sched.global_running();
    assert!(running <= max, "global_running {running} with max {max}");
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

/// The checker picks the scheduler's fairness regime for this execution:
/// hand-offs due at once (`FAIR_AFTER` is 0 under the checker), or never
/// (releases leave a woken designee elsewhere alone; barging unbounded).
fn pick_fairness() {
    let never = shuttle::rand::thread_rng().gen_range(0..2) == 0;
    model::set_never_fair(never);
    if never {
        cover("fairness hand-off never due");
    }
}

/// The checker picks whether model time passes in this execution: if so, a
/// thread of no process moves the model clock on by more than every bound
/// on other processes' progress (the designation's, the limiter front's,
/// the cap lock's), a few times, at points the checker picks, so that
/// running processes are passed over and running lock holders are taken
/// over, racing what they are doing. Returns that thread.
fn pick_time_flies() -> Option<shuttle::thread::JoinHandle<Option<()>>> {
    if shuttle::rand::thread_rng().gen_range(0..2) == 0 {
        return None;
    }
    cover("model time passes (bounds elapse)");
    Some(spawn(None, "clock", || {
        for _ in 0..4 {
            model::advance(BOUNDS_PASS);
            shuttle::thread::yield_now();
        }
    }))
}

/// Model time that passes every bound on other processes' progress.
const BOUNDS_PASS: u64 = 1_000_000_000;

// ---- 1. take / give / enqueue / dispatch / wake ---------------------------------

/// `procs` processes × `threads` threads on a region of `max` cells, each
/// thread doing `ops` operations drawn by the checker (blocking acquire,
/// try_acquire, or acquire_timeout(0), which enqueues and cancels) at
/// mixed priorities; timeouts off, so a lost wake-up is a deadlock.
fn mix(max: u32, procs: usize, threads: usize, ops: usize) {
    model::set_timeouts(false);
    pick_fairness();
    let ps = Arc::new(sched_procs(procs, Concurrency::max(max)));
    let clock = pick_time_flies();
    let in_cs = Arc::new(AtomicU32::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let mut hs = Vec::new();
    for pi in 0..procs {
        for ti in 0..threads {
            let (ps, in_cs) = (ps.clone(), in_cs.clone());
            hs.push(spawn(
                Some(ps[pi].map.clone()),
                &format!("p{pi}t{ti}"),
                move || {
                    let s = &ps[pi].sched;
                    let mut rng = shuttle::rand::thread_rng();
                    for _ in 0..ops {
                        let prio = PRIOS[rng.gen_range(0..PRIOS.len())];
                        // A weighted acquire (all max units at once) when the
                        // max allows one beside single ones.
                        let op = rng.gen_range(0..if max > 1 { 5 } else { 4 });
                        model::trace(format_args!("op {op} prio {prio:?}"));
                        let permit = match op {
                            0 | 1 => Some(s.acquire(prio).unwrap()),
                            2 => s.try_acquire(prio),
                            3 => s.acquire_timeout(prio, Duration::ZERO).ok(),
                            _ => Some(s.acquire_many(prio, max).unwrap()),
                        };
                        if let Some(permit) = permit {
                            let units = permit.units();
                            let n = in_cs.fetch_add(units, SeqCst) + units;
                            assert!(n <= max, "{n} units out with max {max}");
                            shuttle::thread::yield_now();
                            in_cs.fetch_sub(units, SeqCst);
                            drop(permit);
                        }
                    }
                },
            ));
        }
    }
    let observer = {
        let (ps, in_cs, done) = (ps.clone(), in_cs.clone(), done.clone());
        spawn(None, "observer", move || {
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
    if let Some(c) = clock {
        c.join().unwrap();
    }
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
    explore("release_races_designee_take", 15000, || {
        model::set_timeouts(false);
        pick_fairness();
        let ps = Arc::new(sched_procs(2, Concurrency::max(1)));
        let holder = {
            let ps = ps.clone();
            spawn(Some(ps[0].map.clone()), "p0t0", move || {
                let p = ps[0].sched.acquire(Priority::Normal).unwrap();
                shuttle::thread::yield_now();
                drop(p);
            })
        };
        let waiter = {
            let ps = ps.clone();
            spawn(Some(ps[1].map.clone()), "p1t0", move || {
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

/// Raw permits: two threads release one raw permit at once while a third
/// thread of the same process (same owner id) acquires the cell, and a
/// thread of another process waits for it too. Exactly one of the two
/// releases lands, and the third's cell is never freed under it (the
/// losing release's CAS expects the raw permit's tag, which the third's
/// cell does not carry): while the third holds its cell, it is held.
#[test]
fn raw_double_release_races_a_take() {
    explore("raw_double_release_races_a_take", 15000, || {
        model::set_timeouts(false);
        pick_fairness();
        let ps = Arc::new(sched_procs(2, Concurrency::max(1)));
        let tag = std::num::NonZeroU32::new(7).unwrap();
        let raw = ps[0]
            .sched
            .acquire(Priority::Normal)
            .unwrap()
            .into_raw(tag)
            .unwrap();
        let wins = Arc::new(AtomicU32::new(0));
        let releasers: Vec<_> = (0..2)
            .map(|i| {
                let (ps, wins) = (ps.clone(), wins.clone());
                spawn(Some(ps[0].map.clone()), &format!("p0r{i}"), move || {
                    if ps[0].sched.release_raw(raw).is_ok() {
                        wins.fetch_add(1, SeqCst);
                    }
                })
            })
            .collect();
        let taker = {
            let ps = ps.clone();
            spawn(Some(ps[0].map.clone()), "p0t", move || {
                let p = ps[0].sched.acquire(Priority::Normal).unwrap();
                shuttle::thread::yield_now();
                assert_eq!(ps[0].state().occupied, 1, "{:?}", ps[0].state());
                drop(p);
            })
        };
        let other = {
            let ps = ps.clone();
            spawn(Some(ps[1].map.clone()), "p1t", move || {
                drop(ps[1].sched.acquire(Priority::Normal).unwrap());
            })
        };
        for r in releasers {
            r.join().unwrap();
        }
        taker.join().unwrap();
        other.join().unwrap();
        assert_eq!(wins.load(SeqCst), 1, "one release of the raw permit lands");
        for p in ps.iter() {
            assert_quiescent(p, 1);
        }
    });
}

#[test]
fn take_give_dispatch_max1_three_procs() {
    explore("take_give_dispatch_max1_three_procs", 15000, || {
        mix(1, 3, 1, 3)
    });
}

#[test]
fn take_give_dispatch_max1_two_procs_two_threads() {
    explore(
        "take_give_dispatch_max1_two_procs_two_threads",
        15000,
        || mix(1, 2, 2, 2),
    );
}

#[test]
fn take_give_dispatch_max2_three_procs() {
    explore("take_give_dispatch_max2_three_procs", 15000, || {
        mix(2, 3, 1, 3)
    });
}

#[test]
fn take_give_dispatch_max2_two_procs_two_threads() {
    explore(
        "take_give_dispatch_max2_two_procs_two_threads",
        15000,
        || mix(2, 2, 2, 2),
    );
}

// ---- 2. priority across processes ----------------------------------------------

/// A High waiter and a Low waiter in two processes behind a holder in a
/// third, lottery off: once both are asleep (queued, published, served as
/// far as they could be), the holder releases and no one else arrives; the
/// High one must be granted first. Timeouts off.
#[test]
fn priority_across_processes() {
    explore("priority_across_processes", 15000, || {
        model::set_timeouts(false);
        pick_fairness();
        let ps = Arc::new(sched_procs(3, Concurrency::max(1)));
        ps[0].sched.set_lottery(Some(7), false);
        let held = ps[0].sched.acquire(Priority::Normal).unwrap();
        let order = Arc::new(AtomicU32::new(0));
        let waiter = |pi: usize, prio: Priority| {
            let (ps, order) = (ps.clone(), order.clone());
            spawn(Some(ps[pi].map.clone()), &format!("p{pi}t0"), move || {
                let permit = ps[pi].sched.acquire(prio).unwrap();
                let rank = order.fetch_add(1, SeqCst);
                drop(permit);
                rank
            })
        };
        let high = waiter(1, Priority::High);
        let low = waiter(2, Priority::Low);
        while ps[1].map.model_sleepers() == 0 || ps[2].map.model_sleepers() == 0 {
            shuttle::thread::yield_now();
        }
        drop(held);
        assert_eq!(
            high.join().unwrap(),
            Some(0),
            "the Low waiter was granted first"
        );
        assert_eq!(low.join().unwrap(), Some(1));
        for p in ps.iter() {
            assert_quiescent(p, 1);
        }
    });
}

// ---- 3. capped admissions and counting on demand -----------------------------------

/// `max(2).low(1)` from two processes: a Low task is admitted only while
/// nothing runs (the cap compares against the total running count). The
/// region starts without counting; uncapped (Normal) takes before the
/// first capped admission carry no count, and the first capped admission
/// turns counting on, racing the uncapped takes.
///
/// Checked: never two Low holders; never a Low admission while another
/// permit was held through the whole of its acquire call (then the running
/// count it was admitted against missed that permit); counting on and
/// every `held` word exact at the end. Timeouts off.
#[test]
fn capped_admissions_counting_on_demand() {
    explore("capped_admissions_counting_on_demand", 20000, || {
        model::set_timeouts(false);
        pick_fairness();
        let c = Concurrency::max(2).low(1);
        let ps = Arc::new(sched_procs(2, c));
        ps[0].sched.set_lottery(Some(7), false);
        assert_eq!(ps[0].state().gate & GATE_COUNTING, 0);
        let clock = pick_time_flies();
        // Per thread: odd while it holds a permit (bumped at both edges).
        let holding: Arc<Vec<AtomicU32>> = Arc::new((0..4).map(|_| AtomicU32::new(0)).collect());
        let low_cs = Arc::new(AtomicU32::new(0));
        // (process, priority, uses try_acquire)
        let plan = [
            (0, Priority::Normal, false),
            (0, Priority::Low, false),
            (1, Priority::Low, false),
            (1, Priority::Normal, true),
        ];
        let mut hs = Vec::new();
        for (ti, &(pi, prio, try_it)) in plan.iter().enumerate() {
            let (ps, holding, low_cs) = (ps.clone(), holding.clone(), low_cs.clone());
            hs.push(spawn(
                Some(ps[pi].map.clone()),
                &format!("p{pi}t{ti}"),
                move || {
                    for _ in 0..2 {
                        let before: Vec<u32> = holding.iter().map(|h| h.load(SeqCst)).collect();
                        let permit = if try_it {
                            ps[pi].sched.try_acquire(prio)
                        } else {
                            Some(ps[pi].sched.acquire(prio).unwrap())
                        };
                        let Some(permit) = permit else { continue };
                        if prio == Priority::Low {
                            for (j, h) in holding.iter().enumerate() {
                                let b = before[j];
                                assert!(
                                    j == ti || b % 2 == 0 || h.load(SeqCst) != b,
                                    "a Low task was admitted while thread {j} held a permit \
                                 throughout (cap 1 against the total running count)"
                                );
                            }
                            let n = low_cs.fetch_add(1, SeqCst) + 1;
                            assert!(n <= 1, "{n} Low tasks hold permits under a Low cap of 1");
                        }
                        holding[ti].fetch_add(1, SeqCst);
                        shuttle::thread::yield_now();
                        holding[ti].fetch_add(1, SeqCst);
                        if prio == Priority::Low {
                            low_cs.fetch_sub(1, SeqCst);
                        }
                        drop(permit);
                    }
                },
            ));
        }
        for h in hs {
            h.join().unwrap();
        }
        if let Some(c) = clock {
            c.join().unwrap();
        }
        assert_ne!(
            ps[0].state().gate & GATE_COUNTING,
            0,
            "a capped admission turns counting on"
        );
        for p in ps.iter() {
            assert_quiescent(p, 2);
        }
    });
}

/// The gate's counting bit.
const GATE_COUNTING: u64 = 0x100;

// ---- 3b. exact counts: a take's provisional count, counting's start ---------------

/// As many cells free as two processes want at once, and nothing else
/// happening: both takes succeed. Max 4, 1 or 2 held by a third process
/// (counting on or off from the start, the checker's choice); then either
/// two `try_acquire`s, or a `try_acquire_many(2)` and a `try_acquire`.
/// A take counts its `n` in `held` before it looks; the look that the
/// running count cuts short (after one cell under the checker) must not
/// read "full" from that provisional `n`, nor from the other taker's
/// (one of the two takes used to fail with its cells free). Timeouts off.
#[test]
fn takes_with_exactly_n_free() {
    explore("takes_with_exactly_n_free", 15000, || {
        model::set_timeouts(false);
        // Low capped at 0: a Low try starts counting; Normal is uncapped.
        let ps = Arc::new(sched_procs(3, Concurrency::max(4).low(0)));
        let mut rng = shuttle::rand::thread_rng();
        let many = rng.gen_range(0..2) == 0;
        let held: Vec<_> = (0..if many { 1 } else { 2 })
            .map(|_| ps[2].sched.try_acquire_owned(Priority::Normal).unwrap())
            .collect();
        if rng.gen_range(0..2) == 0 {
            // A capped look starts counting (and is refused: its cap is 0).
            assert!(ps[2].sched.try_acquire(Priority::Low).is_none());
            assert_ne!(ps[2].state().gate & GATE_COUNTING, 0);
            cover("counting on before the takes");
        }
        let t0 = {
            let ps = ps.clone();
            spawn(Some(ps[0].map.clone()), "p0t0", move || {
                let n = if many { 2 } else { 1 };
                let p = ps[0].sched.try_acquire_many(Priority::Normal, n);
                assert!(p.is_some(), "{n} of the free cells not found by p0");
            })
        };
        let t1 = {
            let ps = ps.clone();
            spawn(Some(ps[1].map.clone()), "p1t0", move || {
                let p = ps[1].sched.try_acquire(Priority::Normal);
                assert!(p.is_some(), "a free cell not found by p1");
            })
        };
        t0.join().unwrap();
        t1.join().unwrap();
        drop(held);
        for p in ps.iter() {
            assert_quiescent(p, 4);
        }
    });
}

/// Counting starts while a take that read "not counting" is under way in
/// another process: `max(2).low(1)`, lottery off; one process takes a slot
/// at Normal (uncounted, it may be preempted anywhere in its take), the
/// other acquires at Low twice (the first capped admission starts
/// counting; the second reads the count, maybe while the first process's
/// cell is taken and not yet counted). Checked inside the shipped code
/// (`take_capped`, under the checker): every running count a capped
/// admission reads includes every cell held throughout its read (a count
/// that missed one admitted a Low task beside a running one: over its cap
/// by one). Timeouts off.
#[test]
fn counting_starts_under_a_late_take() {
    explore("counting_starts_under_a_late_take", 20000, || {
        model::set_timeouts(false);
        pick_fairness();
        let ps = Arc::new(sched_procs(2, Concurrency::max(2).low(1)));
        ps[0].sched.set_lottery(Some(7), false);
        let late = {
            let ps = ps.clone();
            spawn(Some(ps[0].map.clone()), "p0t0", move || {
                if let Some(p) = ps[0].sched.try_acquire(Priority::Normal) {
                    shuttle::thread::yield_now();
                    drop(p);
                }
            })
        };
        let capped = {
            let ps = ps.clone();
            spawn(Some(ps[1].map.clone()), "p1t0", move || {
                for _ in 0..2 {
                    let p = ps[1].sched.acquire(Priority::Low).unwrap();
                    shuttle::thread::yield_now();
                    drop(p);
                }
            })
        };
        late.join().unwrap();
        capped.join().unwrap();
        for p in ps.iter() {
            assert_quiescent(p, 2);
        }
    });
}

// ---- 3c. the ceiling: two rebalances at once ---------------------------------------

/// Max 4, two processes holding 2 cells each, the ceiling lowered to 1 by
/// a third (before their releases or racing them, the checker's choice);
/// both processes release their cells, one at a time, at once. Afterwards
/// exactly 1 slot is admissible: 3 cells blocked, the header's count of
/// them exact, nothing held (two releases used to block cells against one
/// stale count and overshoot). Then the ceiling goes back up and every cell
/// is in service again. Timeouts off.
#[test]
fn concurrent_rebalances_are_exact() {
    explore("concurrent_rebalances_are_exact", 15000, || {
        model::set_timeouts(false);
        let clock = pick_time_flies();
        let ps = Arc::new(sched_procs(3, Concurrency::max(4)));
        let early = shuttle::rand::thread_rng().gen_range(0..2) == 0;
        let held: Vec<Vec<_>> = (0..2)
            .map(|pi| {
                (0..2)
                    .map(|_| ps[pi].sched.try_acquire_owned(Priority::Normal).unwrap())
                    .collect()
            })
            .collect();
        if early {
            assert!(!ps[2].sched.set_ceiling(1).unwrap(), "4 held: short of 1");
            cover("ceiling lowered before the releases");
        }
        let mut hs = Vec::new();
        for (pi, permits) in held.into_iter().enumerate() {
            hs.push(spawn(
                Some(ps[pi].map.clone()),
                &format!("p{pi}t0"),
                move || {
                    for p in permits {
                        drop(p);
                        shuttle::thread::yield_now();
                    }
                },
            ));
        }
        if !early {
            let ps = ps.clone();
            hs.push(spawn(Some(ps[2].map.clone()), "p2t0", move || {
                let _ = ps[2].sched.set_ceiling(1).unwrap();
            }));
        }
        for h in hs {
            h.join().unwrap();
        }
        if let Some(c) = clock {
            c.join().unwrap();
        }
        let st = ps[2].state();
        assert_eq!(
            (
                st.occupied,
                st.blocked,
                st.pending,
                st.blocked_count,
                st.ceiling
            ),
            (0, 3, 0, 3, 1),
            "after the releases under a ceiling of 1: {st:?}"
        );
        let one = ps[2].sched.try_acquire(Priority::Normal);
        assert!(
            one.is_some(),
            "nothing admissible under a ceiling of 1: {st:?}"
        );
        assert!(
            ps[2].sched.try_acquire(Priority::Normal).is_none(),
            "two admissible under a ceiling of 1: {:?}",
            ps[2].state()
        );
        drop(one);
        assert!(ps[2].sched.set_ceiling(4).unwrap());
        let st = ps[2].state();
        assert_eq!((st.blocked, st.blocked_count), (0, 0), "{st:?}");
        for p in ps.iter() {
            assert_quiescent(p, 4);
        }
    });
}

/// The ceiling lock behind a stopped holder. Max 4, the ceiling lowered to
/// 1 while two processes hold 2 cells each; both give their cells back
/// (to the ceiling) and each lowers the ceiling to 1 again between its two
/// releases. Process 0 stops at a step the checker picks (see
/// [`stop_controller`]: holding the ceiling lock, between a cell's pending
/// step and its count, anywhere) and model time passes. Timeouts off.
///
/// Checked: process 1 finishes while process 0 is stopped (the lock is
/// taken over from a holder that does not move; it used to be waited for,
/// so this never finished); at that point no free cell is in service
/// beyond the ceiling (the region gave process 1's cells to the ceiling);
/// once process 0 runs again (robbed, perhaps, in the middle of a move),
/// exactly 1 slot is admissible: 3 cells blocked, none pending, the count
/// exact.
#[test]
fn ceiling_lock_holder_stopped() {
    explore("ceiling_lock_holder_stopped", 15000, || {
        model::set_timeouts(false);
        let ps = Arc::new(sched_procs(2, Concurrency::max(4)));
        let held: Vec<Vec<_>> = (0..2)
            .map(|pi| {
                (0..2)
                    .map(|_| ps[pi].sched.try_acquire_owned(Priority::Normal).unwrap())
                    .collect()
            })
            .collect();
        assert!(!ps[1].sched.set_ceiling(1).unwrap(), "4 held: short of 1");
        let done = Arc::new(AtomicU32::new(0));
        let mut hs = Vec::new();
        for (pi, permits) in held.into_iter().enumerate() {
            let (ps, done) = (ps.clone(), done.clone());
            hs.push(spawn(
                Some(ps[pi].map.clone()),
                &format!("p{pi}t0"),
                move || {
                    let mut permits = permits.into_iter();
                    drop(permits.next());
                    let _ = ps[pi].sched.set_ceiling(1).unwrap();
                    drop(permits.next());
                    if pi == 1 {
                        done.fetch_add(1, SeqCst);
                    }
                },
            ));
        }
        // The stop (as `stop_controller`, with the check made while the
        // victim is still stopped): in service (held + free) never beyond
        // max(ceiling, held) once process 1 is done.
        let stopper = {
            let (ps, done) = (ps.clone(), done.clone());
            spawn(None, "stopper", move || {
                let mut rng = shuttle::rand::thread_rng();
                for _ in 0..rng.gen_range(0..48) {
                    shuttle::thread::yield_now();
                }
                ps[0].map.model_stop();
                let st = ps[1].state();
                if st.ceiling_lock == st.members[0].1 {
                    cover("stopped holding the ceiling lock");
                }
                if st.pending > 0 {
                    cover("stopped with a cell pending");
                }
                let early = rng.gen_range(0..2) == 0;
                let cont_after = early.then(|| rng.gen_range(1..24));
                let mut steps = 0;
                while done.load(SeqCst) < 1 && cont_after.is_none_or(|n| steps < n) {
                    model::advance(BOUNDS_PASS);
                    shuttle::thread::yield_now();
                    steps += 1;
                }
                if done.load(SeqCst) >= 1 {
                    cover("process 1 done while process 0 was stopped");
                    let st = ps[1].state();
                    let free = 4 - st.occupied - st.blocked - st.pending;
                    assert!(
                        st.occupied + free <= st.occupied.max(st.ceiling),
                        "cells in service beyond the ceiling of 1 while a holder is stopped: {st:?}"
                    );
                } else {
                    cover("process 0 ran again while process 1 was at it");
                }
                ps[0].map.model_cont();
            })
        };
        for h in hs {
            assert!(h.join().unwrap().is_some());
        }
        stopper.join().unwrap();
        let st = ps[1].state();
        assert_eq!(
            (
                st.occupied,
                st.blocked,
                st.pending,
                st.blocked_count,
                st.ceiling
            ),
            (0, 3, 0, 3, 1),
            "after the releases under a ceiling of 1: {st:?}"
        );
        let one = ps[1].sched.try_acquire(Priority::Normal);
        assert!(
            one.is_some(),
            "nothing admissible under a ceiling of 1: {st:?}"
        );
        assert!(
            ps[0].sched.try_acquire(Priority::Normal).is_none(),
            "two admissible under a ceiling of 1: {:?}",
            ps[1].state()
        );
        drop(one);
        assert!(ps[0].sched.set_ceiling(4).unwrap());
        let st = ps[1].state();
        assert_eq!(
            (st.blocked, st.pending, st.blocked_count),
            (0, 0, 0),
            "{st:?}"
        );
        for p in ps.iter() {
            assert_quiescent(p, 4);
        }
    });
}

/// The same with process 0 killed in the middle of a cell's move (between
/// its pending step and its count, either way: the checker picks which
/// and when), holding the ceiling lock. Afterwards, the dead process
/// reaped and the ceiling set to 1 again by process 1: exactly 1 slot is
/// admissible, 3 cells blocked, none pending, the count exact (the
/// ceiling lock taken over from the dead holder recounts, turning its
/// pending cell into a blocked one).
#[test]
fn ceiling_mover_dies_mid_move() {
    explore("ceiling_mover_dies_mid_move", 15000, || {
        model::set_timeouts(false);
        let ps = Arc::new(sched_procs(2, Concurrency::max(4)));
        let held: Vec<Vec<_>> = (0..2)
            .map(|pi| {
                (0..2)
                    .map(|_| ps[pi].sched.try_acquire_owned(Priority::Normal).unwrap())
                    .collect()
            })
            .collect();
        assert!(!ps[1].sched.set_ceiling(1).unwrap(), "4 held: short of 1");
        let point = [
            "ceiling: cell pending, not counted",
            "ceiling: cell pending free, still counted",
        ][shuttle::rand::thread_rng().gen_range(0..2)];
        ps[0].map.model_arm_death(point);
        let mut hs = Vec::new();
        for (pi, permits) in held.into_iter().enumerate() {
            let ps = ps.clone();
            hs.push(spawn(
                Some(ps[pi].map.clone()),
                &format!("p{pi}t0"),
                move || {
                    let mut rest = permits.into_iter();
                    drop(rest.next());
                    // Process 0 also raises the ceiling for a moment (cells
                    // unblocked: the other death point).
                    if pi == 0 {
                        let _ = ps[pi].sched.set_ceiling(3).unwrap();
                    }
                    let _ = ps[pi].sched.set_ceiling(1).unwrap();
                    drop(rest);
                },
            ));
        }
        let died = hs.remove(0).join().unwrap().is_none();
        assert!(hs.remove(0).join().unwrap().is_some());
        if died {
            cover(point);
            let st = ps[1].state();
            if st.pending > 0 {
                cover("died with a cell pending");
            }
        }
        ps[1].sched.reap().unwrap();
        let _ = ps[1].sched.set_ceiling(1).unwrap();
        let st = ps[1].state();
        assert_eq!(
            (
                st.occupied,
                st.blocked,
                st.pending,
                st.blocked_count,
                st.ceiling
            ),
            (0, 3, 0, 3, 1),
            "after the releases under a ceiling of 1: {st:?}"
        );
        let one = ps[1].sched.try_acquire(Priority::Normal);
        assert!(
            one.is_some(),
            "nothing admissible under a ceiling of 1: {st:?}"
        );
        assert!(
            ps[1].sched.try_acquire(Priority::Normal).is_none(),
            "two admissible under a ceiling of 1: {:?}",
            ps[1].state()
        );
        drop(one);
        assert!(ps[1].sched.set_ceiling(4).unwrap());
        let st = ps[1].state();
        assert_eq!(
            (st.blocked, st.pending, st.blocked_count),
            (0, 0, 0),
            "{st:?}"
        );
        assert_quiescent(&ps[1], 4);
    });
}

// ---- 3d. a lease's end against a lapse ---------------------------------------------

/// Max 4 at its own ceiling of 4; a cluster lease armed whose deadline has
/// passed (safe level 1). Process 1 ends the lease and restores the own
/// level (`cluster::release`, as `shmsched cluster release` does) while
/// process 0 admits (its slow path reads the deadline and lowers the
/// ceiling to 1). Afterwards the lease is disarmed and the ceiling is 4,
/// whatever the order: a lowering decided on the deadline before the end
/// used to land after the restore, leaving the region at 1 with no lease.
#[test]
fn lapse_races_end_of_lease() {
    explore("lapse_races_end_of_lease", 15000, || {
        model::set_timeouts(false);
        let ps = Arc::new(sched_procs(2, Concurrency::max(4)));
        shmsched::cluster::lease_until(&ps[1].sched, 4, 1, Instant::now()).unwrap();
        let p0 = ps.clone();
        let admit = spawn(Some(ps[0].map.clone()), "p0t0", move || {
            p0[0].sched.try_acquire(Priority::Normal).is_some()
        });
        let p1 = ps.clone();
        let end = spawn(Some(ps[1].map.clone()), "p1t0", move || {
            shmsched::cluster::release(&p1[1].sched, true).unwrap()
        });
        let got = admit.join().unwrap().unwrap();
        let rel = end.join().unwrap().unwrap();
        cover(if got { "admitted" } else { "refused" });
        assert_eq!(rel.restored, Some(4), "{rel:?}");
        let g = ps[0].sched.stats();
        assert_eq!(ps[0].sched.ceiling(), 4, "the restore was undone: {g:?}");
        assert!(
            ps[0].sched.try_acquire(Priority::Normal).is_some(),
            "nothing admissible after the restore"
        );
        for p in ps.iter() {
            assert_quiescent(p, 4);
        }
    });
}

/// The same for a limiter: rate 1,000/s (capacity 1,000) leased, safe rate
/// 10, deadline passed; process 1 ends the lease restoring 1,000 while
/// process 0 consumes (its slow path lapses the rate to 10). Afterwards the
/// rate is 1,000 and the capacity 1,000.
#[test]
fn limiter_lapse_races_end_of_lease() {
    explore("limiter_lapse_races_end_of_lease", 15000, || {
        model::set_timeouts(false);
        let (lims, maps) = limiter_procs(2, 1_000, 1_000);
        let lims = Arc::new(lims);
        shmsched::cluster::lease_until(&lims[1], 1_000, 10, Instant::now()).unwrap();
        let l0 = lims.clone();
        let take = spawn(Some(maps[0].clone()), "p0t0", move || {
            let _ = l0[0].try_consume(1);
        });
        let l1 = lims.clone();
        let end = spawn(Some(maps[1].clone()), "p1t0", move || {
            shmsched::cluster::release(&l1[1], true).unwrap()
        });
        take.join().unwrap();
        let rel = end.join().unwrap().unwrap();
        assert_eq!(rel.restored, Some(1_000), "{rel:?}");
        assert_eq!(
            (lims[0].tokens_per_second(), lims[0].capacity()),
            (1_000, 1_000),
            "the restore was undone"
        );
    });
}

// ---- 4. death ------------------------------------------------------------------

/// A process dies at a point the checker picks: while its one thread sleeps
/// in the region (queued, maybe designated and woken), or after that
/// thread got a slot and returned without releasing it (it dies holding a
/// cell). Two other processes contend for the same slot meanwhile.
/// Timeouts on (death is found by probes, liveness checks before a
/// designation, and the backstop).
///
/// Checked: the survivors are served; the dead process's cells are freed
/// (`reclaimed`: what its threads held, at most one each) and its entry
/// reaped, once; its publications and designation gone; no cell left
/// taken and every `held` word exact at the end (a cell freed twice would
/// be a survivor's).
///
/// `capped`: a `max(max).low(1)` region where everyone asks at Low
/// (lottery off): a dead process's cell then holds capped waiters back
/// without filling the table.
///
/// `victim_threads`: the dying process's threads, each taking a slot and
/// keeping it; with two on a max of 1, one holds while the other waits.
fn death(max: u32, survivors: usize, capped: bool, victim_threads: usize) {
    model::set_timeouts(true);
    pick_fairness();
    let c = if capped {
        Concurrency::max(max).low(1)
    } else {
        Concurrency::max(max)
    };
    let ps = Arc::new(sched_procs(1 + survivors, c));
    if capped {
        ps[0].sched.set_lottery(Some(7), false);
    }
    let prios: &'static [Priority] = if capped {
        &[Priority::Low, Priority::Low]
    } else {
        &[Priority::High, Priority::Low]
    };
    let in_cs = Arc::new(AtomicU32::new(0));
    let got = Arc::new(AtomicU32::new(0));
    let victim_done = Arc::new(AtomicU32::new(0));
    let victims: Vec<_> = (0..victim_threads)
        .map(|ti| {
            let (ps, got, done) = (ps.clone(), got.clone(), victim_done.clone());
            spawn(Some(ps[0].map.clone()), &format!("p0t{ti}"), move || {
                let permit = ps[0].sched.acquire(prios[1]).unwrap();
                got.fetch_add(1, SeqCst);
                std::mem::forget(permit);
                done.fetch_add(1, SeqCst);
            })
        })
        .collect();
    let mut hs = Vec::new();
    for pi in 1..=survivors {
        let (ps, in_cs) = (ps.clone(), in_cs.clone());
        hs.push(spawn(
            Some(ps[pi].map.clone()),
            &format!("p{pi}t0"),
            move || {
                for &prio in prios {
                    let permit = ps[pi].sched.acquire(prio).unwrap();
                    let n = in_cs.fetch_add(1, SeqCst) + 1;
                    assert!(n <= max);
                    shuttle::thread::yield_now();
                    in_cs.fetch_sub(1, SeqCst);
                    drop(permit);
                }
            },
        ));
    }
    // The killer: the victim dies as soon as the checker runs this while
    // every thread it has left sleeps (none left: all returned).
    loop {
        let left = victim_threads - victim_done.load(SeqCst) as usize;
        if ps[0].die_if_parked(left) {
            cover(match (left, got.load(SeqCst)) {
                (0, _) => "victim died holding cells, its threads done",
                (_, 0) => "victim died while its threads slept",
                _ => "victim died holding a cell while a thread of it slept",
            });
            break;
        }
        shuttle::thread::yield_now();
    }
    match ps[1].state().designee {
        Some(d) if d.0 == 0 => cover("victim designated just after its death"),
        _ => {}
    }
    for h in hs {
        h.join().unwrap();
    }
    for v in victims {
        v.join().unwrap();
    }
    let live = &ps[1];
    live.sched.reap().unwrap();
    let shared = live.sched.stats().shared.unwrap();
    // Each victim thread held at most one cell at its death: the one it
    // returned with, or one its process had taken and granted it while it
    // slept (woken, it died before it ran).
    let got = u64::from(got.load(SeqCst));
    assert!(
        (got..=victim_threads as u64).contains(&shared.reclaimed),
        "{} cells freed for the dead process, whose threads had {got} of \
         at most {victim_threads}: {shared:?}",
        shared.reclaimed
    );
    assert_eq!(shared.reaped_processes, 1, "{shared:?}");
    assert!(
        live.state().members.iter().all(|m| m.0 != 0),
        "the dead process is still a member: {:?}",
        live.state()
    );
    for p in ps[1..].iter() {
        assert_quiescent(p, max);
    }
}

#[test]
fn death_max1_two_survivors() {
    explore("death_max1_two_survivors", 15000, || death(1, 2, false, 1));
}

#[test]
fn death_max2_two_survivors() {
    explore("death_max2_two_survivors", 10000, || death(2, 2, false, 1));
}

#[test]
fn death_capped_max2_two_survivors() {
    explore("death_capped_max2_two_survivors", 15000, || {
        death(2, 2, true, 1)
    });
}

#[test]
fn death_two_victim_threads_max1() {
    explore("death_two_victim_threads_max1", 15000, || {
        death(1, 1, false, 2)
    });
}

// ---- 4b. stops: alive is not progress --------------------------------------------

/// The controller of a stop: stops the process of `victim` as soon as the
/// checker runs it (so at any step of that process: holding the cap lock,
/// designated and woken, taking for its designee, holding a cell, asleep),
/// then lets model time pass, again and again, until `done` reaches
/// `survivors` (every other thread finished while the victim was stopped),
/// and continues it. A survivor that waits for the stopped process without
/// a bound never finishes: the checker reports the deadlock (or the step
/// limit).
///
/// `at_stop` runs as the victim stops (to record, for coverage, what it was
/// in the middle of). With `early`, the checker may instead continue the
/// victim after a few steps of its choosing (time having passed), while the
/// survivors are still at it: a process that was passed over, or robbed of
/// the cap lock, then runs again in the middle of what the others do (the
/// survivors must still be served, and every invariant hold).
fn stop_controller(
    victim: Arc<Mapping>,
    done: Arc<AtomicU32>,
    survivors: u32,
    early: bool,
    at_stop: impl FnOnce() + Send + 'static,
) -> shuttle::thread::JoinHandle<Option<()>> {
    spawn(None, "stopper", move || {
        let mut rng = shuttle::rand::thread_rng();
        // A few steps first, so that the random scheduler, too, stops the
        // victim in the middle of things (the checker picks how many).
        for _ in 0..rng.gen_range(0..48) {
            shuttle::thread::yield_now();
        }
        victim.model_stop();
        at_stop();
        let cont_after = (early && rng.gen_range(0..2) == 0).then(|| rng.gen_range(1..24));
        let mut steps = 0;
        while done.load(SeqCst) < survivors && cont_after.is_none_or(|n| steps < n) {
            model::advance(BOUNDS_PASS);
            shuttle::thread::yield_now();
            steps += 1;
        }
        if done.load(SeqCst) >= survivors {
            cover("every survivor was served while the victim was stopped");
        } else {
            cover("the victim ran again while the survivors were at it");
        }
        victim.model_cont();
    })
}

/// A process stops at a step the checker picks (see [`stop_controller`])
/// while two others contend with it (max 2, lottery off; everyone at
/// Normal: a stopped designee holds back its own tier, which nothing
/// outranks), and model time passes while it is stopped. Timeouts on (each
/// process's keeper does the rounds).
///
/// `capped`: `max(2).low(1)`: the victim also takes Low permits
/// (capped: the cap lock, counting) and the survivors `try_acquire(Low)`
/// besides their uncapped acquires; a stop while the victim holds the cap
/// lock must not hold their capped admissions back (the lock is taken over
/// from a holder that makes no progress), and the cap must hold throughout.
///
/// Checked: the survivors are all served while the victim is stopped (or,
/// in executions where the checker continues it early, whatever it does
/// once it runs again in the middle of theirs: passed over, or robbed of
/// the cap lock); never more than max units out, never two Low holders;
/// once it is continued, the victim finishes too; at the end nothing is
/// held, nobody waits or is designated, every count is exact.
fn stop_anywhere(capped: bool) {
    model::set_timeouts(true);
    pick_fairness();
    let max = 2;
    let c = if capped {
        Concurrency::max(max).low(1)
    } else {
        Concurrency::max(max)
    };
    let ps = Arc::new(sched_procs(3, c));
    ps[0].sched.set_lottery(Some(7), false);
    let in_cs = Arc::new(AtomicU32::new(0));
    let low_cs = Arc::new(AtomicU32::new(0));
    let done = Arc::new(AtomicU32::new(0));
    // One critical section: never more than max units, never two Low
    // permits (the cap of 1 counts every permit, so two Low ones at once
    // means a capped admission saw a stale count).
    let hold = {
        let (in_cs, low_cs) = (in_cs.clone(), low_cs.clone());
        move |p: shmsched::scheduler::Permit<'_>| {
            let n = in_cs.fetch_add(1, SeqCst) + 1;
            assert!(n <= max, "{n} permits out with max {max}");
            let low = p.priority() == Priority::Low;
            if low {
                let l = low_cs.fetch_add(1, SeqCst) + 1;
                assert!(l <= 1, "{l} Low permits under a Low cap of 1");
            }
            shuttle::thread::yield_now();
            if low {
                low_cs.fetch_sub(1, SeqCst);
            }
            in_cs.fetch_sub(1, SeqCst);
            drop(p);
        }
    };
    let victim = {
        let (ps, hold) = (ps.clone(), hold.clone());
        // Uncapped: everyone at Normal, so a stopped designee holds back
        // waiters of its own tier (a higher one would outrank it).
        let prios: &[Priority] = if capped {
            &[Priority::Low, Priority::Normal, Priority::Low]
        } else {
            &[Priority::Normal, Priority::Normal]
        };
        spawn(Some(ps[0].map.clone()), "p0t0", move || {
            for &prio in prios {
                hold(ps[0].sched.acquire(prio).unwrap());
            }
        })
    };
    let survivors: Vec<_> = (1..3)
        .map(|pi| {
            let (ps, hold, done) = (ps.clone(), hold.clone(), done.clone());
            spawn(Some(ps[pi].map.clone()), &format!("p{pi}t0"), move || {
                let s = &ps[pi].sched;
                if capped {
                    if let Some(p) = s.try_acquire(Priority::Low) {
                        cover("a survivor's capped try_acquire got a Low permit");
                        hold(p);
                    }
                }
                for _ in 0..2 {
                    hold(s.acquire(Priority::Normal).unwrap());
                }
                done.fetch_add(1, SeqCst);
            })
        })
        .collect();
    let stopper = {
        let ps = ps.clone();
        stop_controller(ps[0].map.clone(), done.clone(), 2, true, move || {
            let st = ps[1].state();
            match st.designee {
                Some((0, _, _, _, _, true)) => cover("stopped taking for its designee"),
                Some((0, _, _, _, true, _)) => cover("stopped designated and notified"),
                Some((0, ..)) => cover("stopped designated"),
                _ => {}
            }
            if st.members.iter().any(|m| m.0 == 0 && m.3 > 0) {
                cover("stopped holding a cell");
            }
            if st.members.iter().any(|m| m.0 == 0 && m.1 == st.cap_lock) {
                cover("stopped holding the cap lock");
            }
        })
    };
    for h in survivors {
        assert!(h.join().unwrap().is_some());
    }
    stopper.join().unwrap();
    assert!(victim.join().unwrap().is_some());
    let shared = ps[1].sched.stats().shared.unwrap();
    if shared.passed_over > 0 {
        cover("a process was passed over");
    }
    for p in ps.iter() {
        assert_quiescent(p, max);
    }
}

#[test]
fn stop_anywhere_uncapped() {
    explore("stop_anywhere_uncapped", 15000, || stop_anywhere(false));
}

#[test]
fn stop_anywhere_capped() {
    explore("stop_anywhere_capped", 15000, || stop_anywhere(true));
}

/// A cap-lock holder robbed between its count and its take. Max 2, Low
/// capped at 1. Process 0's capped `try_acquire(Low)` stops right after it
/// read the running count (0) under the cap lock; model time passes, and
/// process 1's capped `try_acquire(Low)` takes the lock over from it and
/// is admitted; it holds its permit while process 0 runs again. Process 0
/// must find that it was robbed (its release CAS fails), give back what it
/// took on its stale count and be refused: never two Low permits at once.
/// (This kills the mutant of `docs/model-checking.md` that survived the
/// random stops: a holder that does not check, after its take, that the
/// lock is still its own.)
#[test]
fn robbed_cap_lock_holder_takes_nothing_on_its_stale_count() {
    explore(
        "robbed_cap_lock_holder_takes_nothing_on_its_stale_count",
        3000,
        || {
            model::set_timeouts(false);
            let ps = Arc::new(sched_procs(2, Concurrency::max(2).low(1)));
            ps[0].map.model_arm_stop("cap lock held, count read");
            let low = Arc::new(AtomicU32::new(0));
            let robbed_done = Arc::new(AtomicBool::new(false));
            let a = {
                let (ps, low) = (ps.clone(), low.clone());
                spawn(Some(ps[0].map.clone()), "p0t0", move || {
                    let p = ps[0].sched.try_acquire(Priority::Low);
                    if p.is_some() {
                        let n = low.fetch_add(1, SeqCst) + 1;
                        assert!(n <= 1, "{n} Low permits under a Low cap of 1");
                        low.fetch_sub(1, SeqCst);
                    }
                    p.is_some()
                })
            };
            let b = {
                let (ps, low, robbed_done) = (ps.clone(), low.clone(), robbed_done.clone());
                spawn(Some(ps[1].map.clone()), "p1t0", move || {
                    while !ps[0].map.model_is_stopped() {
                        shuttle::thread::yield_now();
                    }
                    let p = ps[1].sched.try_acquire(Priority::Low);
                    assert!(
                        p.is_some(),
                        "the cap lock was not taken over from a stopped holder"
                    );
                    low.fetch_add(1, SeqCst);
                    // Held until process 0 is done.
                    while !robbed_done.load(SeqCst) {
                        shuttle::thread::yield_now();
                    }
                    low.fetch_sub(1, SeqCst);
                    drop(p);
                })
            };
            // Time passes while process 0 is stopped (so process 1 takes the
            // lock over); process 0 runs again once process 1 holds its permit.
            while low.load(SeqCst) == 0 {
                model::advance(BOUNDS_PASS);
                shuttle::thread::yield_now();
            }
            ps[0].map.model_cont();
            let got = a.join().unwrap().unwrap();
            assert!(!got, "admitted on a count read before the takeover");
            robbed_done.store(true, SeqCst);
            b.join().unwrap().unwrap();
            for p in ps.iter() {
                assert_quiescent(p, 2);
            }
        },
    );
}

// ---- 5. the limiter ---------------------------------------------------------------

/// `n` processes sharing one limiter region of `rate` tokens/s and
/// capacity `cap`, drained (`consumed` counts what was taken).
fn limiter_procs(n: usize, rate: u64, cap: u64) -> (Vec<Limiter>, Vec<Arc<Mapping>>) {
    let regions = open_regions(n);
    let lims: Vec<Limiter> = regions
        .iter()
        .map(|r| Limiter::shared_with_capacity(r, rate, cap).unwrap())
        .collect();
    let maps = regions
        .iter()
        .map(|r| r.bind(ObjectKind::Limiter, None).unwrap())
        .collect();
    if let Some(p) = regions[0].path() {
        let _ = std::fs::remove_file(p);
    }
    (lims, maps)
}

/// The bucket never mints tokens: everything consumed (as counted after
/// each charge returned, read first) ≤ capacity + tokens refilled −
/// balance (the bucket's own clock, read after).
fn assert_no_minting(lim: &Limiter, cap: u64, consumed: &AtomicU64) {
    let before = consumed.load(SeqCst);
    let st = lim.stats();
    let bound = cap as i128 + st.clock as i128 - st.tokens as i128;
    assert!(
        before as i128 <= bound,
        "{before} tokens consumed, but capacity + refilled - balance is {bound}: {st:?}"
    );
}

const RATE: u64 = 50_000;
const CAP: u64 = 4;

/// Two processes at different priorities consume from a drained shared
/// bucket (the rate is high: refills come within a few hundred model
/// steps, in real time); one also gives up at once
/// (`consume_timeout(0)`: it queues, and leaves). Timeouts on (a waiter
/// sleeps until its tokens are due).
///
/// Checked at every step (observer) and at the end: the bucket never mints
/// tokens; everyone is served; nobody left queued.
#[test]
fn limiter_two_priorities_drained_bucket() {
    explore("limiter_two_priorities_drained_bucket", 7500, || {
        model::set_timeouts(true);
        let (lims, maps) = limiter_procs(2, RATE, CAP);
        let lims = Arc::new(lims);
        let consumed = Arc::new(AtomicU64::new(0));
        assert!(lims[0].try_consume(CAP).unwrap());
        consumed.fetch_add(CAP, SeqCst);
        let done = Arc::new(AtomicBool::new(false));
        let mut hs = Vec::new();
        for (pi, prio) in [(0, Priority::High), (1, Priority::Low)] {
            let (lims, consumed) = (lims.clone(), consumed.clone());
            hs.push(spawn(
                Some(maps[pi].clone()),
                &format!("p{pi}t0"),
                move || {
                    for k in 0..3 {
                        let g = if pi == 1 && k == 1 {
                            match lims[pi].consume_timeout(3, prio, Duration::ZERO) {
                                Ok(g) => g,
                                Err(_) => {
                                    cover("a consume gave up (timeout 0)");
                                    continue;
                                }
                            }
                        } else {
                            lims[pi].consume(3, prio).unwrap()
                        };
                        consumed.fetch_add(3, SeqCst);
                        if !g.immediate {
                            cover("a consume waited (per consume)");
                        }
                        if g.forced {
                            cover("a consume was forced through (per consume)");
                        }
                    }
                },
            ));
        }
        let observer = {
            let (lims, consumed, done) = (lims.clone(), consumed.clone(), done.clone());
            spawn(None, "observer", move || {
                for _ in 0..8 {
                    if done.load(SeqCst) {
                        break;
                    }
                    assert_no_minting(&lims[1], CAP, &consumed);
                }
            })
        };
        for h in hs {
            h.join().unwrap();
        }
        done.store(true, SeqCst);
        observer.join().unwrap();
        assert_no_minting(&lims[0], CAP, &consumed);
        let shared = lims[0].stats().shared.unwrap();
        assert_eq!(shared.waiters, [0; 7], "{shared:?}");
    });
}

/// A High consumer's process dies while its thread waits in the region
/// (the region's High front, which Low fronts elsewhere defer to when it
/// can go), or after it returned. The Low consumer of another process must
/// still be served. Timeouts on.
#[test]
fn limiter_death_of_a_higher_front() {
    explore("limiter_death_of_a_higher_front", 7500, || {
        model::set_timeouts(true);
        let (lims, maps) = limiter_procs(2, RATE, CAP);
        let lims = Arc::new(lims);
        assert!(lims[0].try_consume(CAP).unwrap());
        let victim_done = Arc::new(AtomicBool::new(false));
        let victim = {
            let (lims, done) = (lims.clone(), victim_done.clone());
            spawn(Some(maps[0].clone()), "p0t0", move || {
                lims[0].consume(3, Priority::High).unwrap();
                done.store(true, SeqCst);
            })
        };
        let survivor = {
            let lims = lims.clone();
            spawn(Some(maps[1].clone()), "p1t0", move || {
                for _ in 0..2 {
                    lims[1].consume(3, Priority::Low).unwrap();
                }
            })
        };
        loop {
            if victim_done.load(SeqCst) {
                assert!(maps[0].model_die_if_parked(0));
                cover("victim died after it was served");
                break;
            }
            if maps[0].model_die_if_parked(1) {
                cover("victim died waiting");
                break;
            }
            shuttle::thread::yield_now();
        }
        assert!(survivor.join().unwrap().is_some());
        victim.join().unwrap();
        lims[1].reap().unwrap();
        let shared = lims[1].stats().shared.unwrap();
        assert_eq!(shared.waiters, [0; 7], "{shared:?}");
    });
}

/// Where a process may die inside the protocol (death points compiled into
/// the crate under `--cfg shuttle`; see `Mapping::model_death_point`).
const DEATH_POINTS: [&str; 8] = [
    "publish: count, no gate bit",
    "designee taking",
    "taken for a waiter, not granted",
    "take: counted, no cell yet",
    "count_now: counted, cell not marked",
    "cap lock held",
    "give: cell freed, count not yet",
    "release: freed, nobody served yet",
];

/// A one-thread process dies at a protocol step the checker picks (one of
/// [`DEATH_POINTS`], the first time it gets there), while two others
/// contend for a `max(2).low(1)` region (Low admissions capped: counting
/// and the cap lock in play). Lottery off: recovery must not rest on the
/// starvation lottery. Timeouts on.
///
/// Checked: the survivors are all served (no stall behind the dead
/// process); never more than `max` permits out; at the end, after a reap,
/// what the dead process held is freed once and every count is exact.
#[test]
fn death_inside_the_protocol() {
    explore("death_inside_the_protocol", 30000, || {
        model::set_timeouts(true);
        pick_fairness();
        let max = 2;
        let ps = Arc::new(sched_procs(3, Concurrency::max(max).low(1)));
        ps[0].sched.set_lottery(Some(7), false);
        let point = DEATH_POINTS[shuttle::rand::thread_rng().gen_range(0..DEATH_POINTS.len())];
        // MODEL_DEATH_POINT=<name>: only that one (to study it).
        let point = match std::env::var("MODEL_DEATH_POINT") {
            Ok(p) => DEATH_POINTS
                .into_iter()
                .find(|&d| d == p)
                .expect("a death point"),
            Err(_) => point,
        };
        ps[0].map.model_arm_death(point);
        let in_cs = Arc::new(AtomicU32::new(0));
        let run = |pi: usize, prios: &'static [Priority]| {
            let (ps, in_cs) = (ps.clone(), in_cs.clone());
            spawn(Some(ps[pi].map.clone()), &format!("p{pi}t0"), move || {
                for &prio in prios {
                    let permit = ps[pi].sched.acquire(prio).unwrap();
                    let n = in_cs.fetch_add(1, SeqCst) + 1;
                    assert!(n <= max, "{n} permits out with max {max}");
                    shuttle::thread::yield_now();
                    in_cs.fetch_sub(1, SeqCst);
                    drop(permit);
                }
            })
        };
        let victim = run(0, &[Priority::Low, Priority::Normal, Priority::Low]);
        let survivors = [
            run(1, &[Priority::Low, Priority::High]),
            run(2, &[Priority::Normal, Priority::Low]),
        ];
        for h in survivors {
            assert!(h.join().unwrap().is_some());
        }
        let died = victim.join().unwrap().is_none();
        if died {
            cover(point);
        }
        let live = &ps[1];
        live.sched.reap().unwrap();
        let shared = live.sched.stats().shared.unwrap();
        assert_eq!(shared.reaped_processes, u64::from(died), "{shared:?}");
        assert!(shared.reclaimed <= 1, "{shared:?}");
        for (i, p) in ps.iter().enumerate() {
            if i > 0 || !died {
                assert_quiescent(p, max);
            }
        }
    });
}

/// A limiter process stops at a step the checker picks (see
/// [`stop_controller`]): its High consumes on a drained bucket may make it
/// the region's High front, one that can go. Model time passes while it is
/// stopped. Timeouts on.
///
/// Checked: the other process's Low consumes are all served while it is
/// stopped (a front that can go and is not charged within the bound is
/// passed over); the bucket never mints tokens; once continued, the
/// stopped process is served too and nobody is left queued.
#[test]
fn limiter_stop_of_a_front() {
    explore("limiter_stop_of_a_front", 7500, || {
        model::set_timeouts(true);
        let (lims, maps) = limiter_procs(2, RATE, CAP);
        let lims = Arc::new(lims);
        let consumed = Arc::new(AtomicU64::new(0));
        assert!(lims[0].try_consume(CAP).unwrap());
        consumed.fetch_add(CAP, SeqCst);
        let done = Arc::new(AtomicU32::new(0));
        let victim = {
            let (lims, consumed) = (lims.clone(), consumed.clone());
            spawn(Some(maps[0].clone()), "p0t0", move || {
                for _ in 0..2 {
                    lims[0].consume(3, Priority::High).unwrap();
                    consumed.fetch_add(3, SeqCst);
                }
            })
        };
        let survivor = {
            let (lims, consumed, done) = (lims.clone(), consumed.clone(), done.clone());
            spawn(Some(maps[1].clone()), "p1t0", move || {
                for _ in 0..2 {
                    lims[1].consume(3, Priority::Low).unwrap();
                    consumed.fetch_add(3, SeqCst);
                    assert_no_minting(&lims[1], CAP, &consumed);
                }
                done.fetch_add(1, SeqCst);
            })
        };
        let stopper = stop_controller(maps[0].clone(), done, 1, false, || {});
        assert!(survivor.join().unwrap().is_some());
        stopper.join().unwrap();
        assert!(victim.join().unwrap().is_some());
        assert_no_minting(&lims[0], CAP, &consumed);
        let shared = lims[1].stats().shared.unwrap();
        if shared.passed_over > 0 {
            cover("a front was passed over");
        }
        assert_eq!(shared.waiters, [0; 7], "{shared:?}");
    });
}

/// Each process reads the region's parameters on the consume fast path
/// through its own validated copy, refilled when the block's `active` word
/// moves (`ParamCache`). Process 0 lowers the capacity to 1 while two
/// threads of process 1 (one copy, refilled by either) `try_consume(2)`.
/// Checked: once the change is published (the writer's flag seen), no
/// reader is served the old capacity (2 tokens above a capacity of 1 are
/// always refused); no read is an error (no mixed copy).
#[test]
fn limiter_param_cache_follows_changes() {
    explore("limiter_param_cache_follows_changes", 3000, || {
        let (lims, maps) = limiter_procs(2, RATE, CAP);
        let lims = Arc::new(lims);
        let done = Arc::new(AtomicU32::new(0));
        let writer = {
            let (lims, done) = (lims.clone(), done.clone());
            spawn(Some(maps[0].clone()), "p0t0", move || {
                lims[0].set_capacity(1).unwrap();
                done.store(1, SeqCst);
            })
        };
        let readers: Vec<_> = (0..2)
            .map(|t| {
                let (lims, done) = (lims.clone(), done.clone());
                spawn(Some(maps[1].clone()), &format!("p1t{t}"), move || {
                    for _ in 0..3 {
                        let after = done.load(SeqCst) == 1;
                        let ok = lims[1].try_consume(2).unwrap();
                        assert!(
                            !(after && ok),
                            "2 tokens charged after the capacity became 1"
                        );
                        shuttle::thread::yield_now();
                    }
                })
            })
            .collect();
        assert!(writer.join().unwrap().is_some());
        for r in readers {
            assert!(r.join().unwrap().is_some());
        }
        assert_eq!(lims[1].capacity(), 1);
        assert!(!lims[1].try_consume(2).unwrap());
    });
}

/// Two processes change the limiter's rate (twice each, values of their
/// own) while a reader of a third reads the parameters; one writer stops at
/// a step the checker picks (maybe half-way through filling its slot) and
/// model time passes. Checked: the other writer finishes while it is
/// stopped; the reader never sees a rate nobody wrote nor an error (no
/// mixed slot); at the end the rate in force is the last one some writer
/// published.
#[test]
fn limiter_params_stopped_writer() {
    explore("limiter_params_stopped_writer", 7500, || {
        model::set_timeouts(true);
        let (lims, maps) = limiter_procs(3, RATE, CAP);
        let lims = Arc::new(lims);
        let written: [&[u64]; 2] = [&[1_000, 2_000], &[3_000, 4_000]];
        let done = Arc::new(AtomicU32::new(0));
        let writers: Vec<_> = (0..2)
            .map(|pi| {
                let (lims, done) = (lims.clone(), done.clone());
                spawn(Some(maps[pi].clone()), &format!("p{pi}t0"), move || {
                    for &r in written[pi] {
                        lims[pi].set_rate(r).unwrap();
                    }
                    if pi == 1 {
                        done.fetch_add(1, SeqCst);
                    }
                })
            })
            .collect();
        let reader = {
            let lims = lims.clone();
            spawn(Some(maps[2].clone()), "p2t0", move || {
                for _ in 0..4 {
                    let r = u64::from(lims[2].tokens_per_second());
                    assert!(
                        r == RATE || written.iter().any(|w| w.contains(&r)),
                        "the reader saw rate {r}, which nobody wrote"
                    );
                    shuttle::thread::yield_now();
                }
            })
        };
        let stopper = stop_controller(maps[0].clone(), done, 1, true, || {});
        let mut it = writers.into_iter();
        let (w0, w1) = (it.next().unwrap(), it.next().unwrap());
        assert!(w1.join().unwrap().is_some());
        stopper.join().unwrap();
        assert!(w0.join().unwrap().is_some());
        assert!(reader.join().unwrap().is_some());
        let r = u64::from(lims[2].tokens_per_second());
        assert!(r == 2_000 || r == 4_000, "rate {r} in force at the end");
    });
}
