//! Signals you can steer by (issue 20): the stall counter never goes back
//! (A), a dead waiter's stall ends when a reader notices its death (B), and
//! a process that only watches a region reads the pressure its workers
//! read (C). Every adversary runs in forked processes.

mod region_util;

use std::time::{Duration, Instant};

use region_util::{fork_child, kill, pipe, recv, send, wait_child, Exit};
use shmsched::limiter::Limiter;
use shmsched::pressure::{Pressure, PressureConfig, Sample};
use shmsched::region::Region;
use shmsched::scheduler::Scheduler;
use shmsched::sys::monotonic_ns;
use shmsched::Priority;

/// The tests of this binary run one at a time (they load the CPUs and
/// measure time).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reads of the stall counter each monotonicity test makes.
const READS: u64 = 1_000_000;
/// The time bound of any one phase of a test (never reached when it passes).
const LIMIT: Duration = Duration::from_secs(120);

/// Spins (holding what the caller holds) for about `us` µs.
fn spin_us(us: u64) {
    let t = monotonic_ns();
    while monotonic_ns() - t < us * 1000 {
        std::hint::spin_loop();
    }
}

/// Polls `cond` until true (bounded).
fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < LIMIT, "timed out: {what}");
        std::thread::yield_now();
    }
}

/// Reads `read` `READS` times; returns (decreases seen, the largest in ns,
/// how much the counter grew).
fn count_decreases(mut read: impl FnMut() -> u64) -> (u64, u64, u64) {
    let t = Instant::now();
    let first = read();
    let (mut prev, mut n, mut worst, mut still) = (first, 0, 0, 0);
    for i in 0..READS {
        let v = read();
        if v < prev {
            n += 1;
            worst = worst.max(prev - v);
        }
        still += u64::from(v == prev);
        prev = v;
        if i % 4096 == 0 {
            assert!(t.elapsed() < LIMIT, "{i} reads in {LIMIT:?}");
        }
    }
    eprintln!(
        "{READS} reads in {:?}, {still} of them unchanged (no stall)",
        t.elapsed()
    );
    (n, worst, prev.saturating_sub(first))
}

/// A. Processes churn stalls on a region scheduler of max 1 (each
/// acquires, holds 2 µs, releases, waits 2 µs, so the backlog empties and
/// refills all the time); a watching process reads the region's stall time a
/// million times: it never goes back (on the code before: 1 to 7
/// decreases per million here).
#[test]
fn region_stall_time_never_goes_back() {
    let _serial = serial();
    let region = Region::anonymous().unwrap();
    let me = Scheduler::shared(&region, 1).unwrap();
    let (mut ready_r, ready_w) = pipe();
    let kids: Vec<_> = (0..3)
        .map(|_| {
            let mut ready_w = ready_w.try_clone().unwrap();
            fork_child(|| {
                let Ok(s) = Scheduler::attach(&region) else {
                    return 2;
                };
                send(&mut ready_w, &[1]);
                loop {
                    let p = s.acquire(Priority::Normal).unwrap();
                    spin_us(2);
                    drop(p);
                    spin_us(2);
                }
            })
        })
        .collect();
    drop(ready_w);
    for _ in &kids {
        assert_eq!(recv(&mut ready_r), Some(1), "a child could not attach");
    }
    let stall = || me.stats().shared.unwrap().stall_ns;
    let (n, worst, grew) = count_decreases(stall);
    for k in kids {
        kill(k);
        assert_eq!(wait_child(k, LIMIT), Exit::Signal(libc::SIGKILL));
    }
    eprintln!("region: {n} decreases in {READS} reads (worst {worst} ns), stall grew {grew} ns");
    assert!(grew > 0, "the children never stalled");
    assert_eq!(
        n, 0,
        "the region's stall time went back {n} times in {READS} reads (by up to {worst} ns)"
    );
}

/// A, in-process: threads churn stalls on a scheduler of one process (hold
/// 3 µs, wait 3 µs); a reader thread reads its stall time a million times
/// (on the code before: 7 decreases per million, by up to 4 ms).
#[test]
fn in_process_stall_time_never_goes_back() {
    let _serial = serial();
    let sched = Scheduler::new(1).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn: Vec<_> = (0..3)
        .map(|_| {
            let (s, stop) = (sched.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let p = s.acquire(Priority::Normal).unwrap();
                    spin_us(3);
                    drop(p);
                    spin_us(3);
                }
            })
        })
        .collect();
    let (n, worst, grew) = count_decreases(|| sched.stats().stall_ns);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in churn {
        t.join().unwrap();
    }
    eprintln!(
        "in-process: {n} decreases in {READS} reads (worst {worst} ns), stall grew {grew} ns"
    );
    assert!(grew > 0, "the threads never stalled");
    assert_eq!(
        n, 0,
        "the scheduler's stall time went back {n} times in {READS} reads (by up to {worst} ns)"
    );
}

fn fast_pressure() -> Pressure {
    Pressure::new(PressureConfig {
        tau_ns: 50_000_000, // 50 ms: the average follows within a few samples
        ..PressureConfig::default()
    })
    .unwrap()
}

/// Samples `sample` every ~5 ms for `ms` ms into `p`.
fn sample_for(p: &mut Pressure, ms: u64, mut sample: impl FnMut() -> Sample) {
    let end = monotonic_ns() + ms * 1_000_000;
    while monotonic_ns() < end {
        p.update(sample(), monotonic_ns());
        // A sampling period, not synchronisation.
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What a test of a dead waiter measured after the kill.
struct AfterDeath {
    /// Stall time between the child's death and the first reading that
    /// stopped growing, ns.
    ran_on_ns: u64,
    /// The stall time then, and 200 ms later.
    stopped: (u64, u64),
}

/// Kills `pid`, waits for it, then reads `stall` until two readings 25 ms
/// apart (longer than a reap interval) agree.
fn kill_and_watch(pid: libc::pid_t, stall: &dyn Fn() -> u64) -> AfterDeath {
    kill(pid);
    assert_eq!(wait_child(pid, LIMIT), Exit::Signal(libc::SIGKILL));
    let at_death = stall();
    let t = Instant::now();
    let mut prev = at_death;
    loop {
        // The reap interval is 20 ms: a measurement period.
        std::thread::sleep(Duration::from_millis(25));
        let now = stall();
        if now == prev {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the stall clock still runs {:?} after the only waiter died ({} ms counted)",
            t.elapsed(),
            (now - at_death) / 1_000_000
        );
        prev = now;
    }
    let stopped = stall();
    std::thread::sleep(Duration::from_millis(200));
    AfterDeath {
        ran_on_ns: stopped - at_death,
        stopped: (stopped, stall()),
    }
}

/// B, scheduler: the only waiter (a forked child) is SIGKILLed while this
/// process holds the only slot and acquires nothing more. Reading stats is
/// what notices the death: the stall ends within about one reap interval,
/// and pressure falls back to 0 (before: some 0.95 and full 0.95 until
/// someone reaped).
#[test]
fn a_dead_waiters_stall_ends_scheduler() {
    let _serial = serial();
    let region = Region::anonymous().unwrap();
    let sched = Scheduler::shared(&region, 1).unwrap();
    let _hold = sched.acquire(Priority::Normal).unwrap();
    let pid = fork_child(|| {
        let Ok(s) = Scheduler::attach(&region) else {
            return 2;
        };
        let _ = s.acquire(Priority::Normal);
        3 // not reached: the parent holds the only slot until it kills us
    });
    let waiters = || sched.stats().shared.unwrap().waiters.iter().sum::<u32>();
    until("the child waits", || waiters() == 1);
    let mut p = fast_pressure();
    sample_for(&mut p, 300, || Sample::from_scheduler(&sched.stats()));
    assert!(p.some() > 0.8 && p.shed(), "stalled: some {:.2}", p.some());
    assert!(
        p.full() > 0.8 && p.paused(),
        "stalled: full {:.2}",
        p.full()
    );
    let stall = || sched.stats().shared.unwrap().stall_ns;
    let after = kill_and_watch(pid, &stall);
    eprintln!(
        "after the death: stall ran on {} µs, then {:?}",
        after.ran_on_ns / 1000,
        after.stopped
    );
    assert_eq!(waiters(), 0);
    assert_eq!(after.stopped.0, after.stopped.1, "the stall clock stopped");
    assert!(
        after.ran_on_ns < 100_000_000,
        "the stall ran on {} ms after the death",
        after.ran_on_ns / 1_000_000
    );
    sample_for(&mut p, 500, || Sample::from_scheduler(&sched.stats()));
    eprintln!(
        "scheduler pressure after the death: some {:.3} full {:.3}",
        p.some(),
        p.full()
    );
    assert!(
        p.some() < 0.01 && p.full() < 0.01 && !p.shed() && !p.paused(),
        "pressure after the death: some {:.3} full {:.3} shed {} paused {}",
        p.some(),
        p.full(),
        p.shed(),
        p.paused()
    );
}

/// B, limiter: the only consume waiting on an empty region bucket (a
/// forked child) is SIGKILLed; reading stats notices, and the stall ends.
#[test]
fn a_dead_waiters_stall_ends_limiter() {
    let _serial = serial();
    let region = Region::anonymous().unwrap();
    // 1 token/s, capacity 100: a consume of 100 on an empty bucket waits.
    let lim = Limiter::shared_with_capacity(&region, 1, 100).unwrap();
    lim.consume(100, Priority::Normal).unwrap();
    let pid = fork_child(|| {
        let Ok(l) = Limiter::attach(&region) else {
            return 2;
        };
        let _ = l.consume(100, Priority::Normal);
        // A force-through may let it go after ~1 s: then it waits again.
        loop {
            let _ = l.consume(100, Priority::Normal);
        }
    });
    let waiters = || lim.stats().shared.unwrap().waiters.iter().sum::<u64>();
    until("the child waits", || waiters() == 1);
    let stall = || lim.stats().shared.unwrap().stall_ns;
    let s0 = stall();
    until("the stall clock runs", || stall() > s0);
    let after = kill_and_watch(pid, &stall);
    eprintln!(
        "after the death: stall ran on {} µs, then {:?}",
        after.ran_on_ns / 1000,
        after.stopped
    );
    assert_eq!(waiters(), 0);
    assert_eq!(after.stopped.0, after.stopped.1, "the stall clock stopped");
    assert!(
        after.ran_on_ns < 100_000_000,
        "the stall ran on {} ms after the death",
        after.ran_on_ns / 1_000_000
    );
    let mut p = fast_pressure();
    sample_for(&mut p, 500, || Sample::from_limiter(&lim.stats()));
    eprintln!(
        "limiter pressure after the death: some {:.3} full {:.3}",
        p.some(),
        p.full()
    );
    assert!(
        p.some() < 0.01 && !p.shed(),
        "pressure after the death: some {:.3} shed {}",
        p.some(),
        p.shed()
    );
}

/// C. Two worker processes drain a real backlog through a region scheduler
/// (four threads each on two slots); this process is attached and acquires
/// nothing. It reads the pressure a worker reads, within 0.05 (before: it
/// read full 0.96 and paused while the workers read about 0).
#[test]
fn a_watching_process_reads_the_workers_pressure() {
    let _serial = serial();
    const SAMPLE_MS: u64 = 2000;
    let region = Region::anonymous().unwrap();
    let me = Scheduler::shared(&region, 2).unwrap();
    let (mut rep_r, rep_w) = pipe();
    let (go_r, go_w) = pipe();
    let kids: Vec<_> = (0..2)
        .map(|k| {
            let (mut rep_w, mut go_r) = (rep_w.try_clone().unwrap(), go_r.try_clone().unwrap());
            let region = &region;
            fork_child(move || {
                let Ok(s) = Scheduler::attach(region) else {
                    return 2;
                };
                let threads: Vec<_> = (0..4)
                    .map(|_| {
                        let s = s.clone();
                        std::thread::spawn(move || loop {
                            let p = s.acquire(Priority::Normal).unwrap();
                            spin_us(100);
                            drop(p);
                        })
                    })
                    .collect();
                drop(threads);
                send(&mut rep_w, &[0]);
                if !region_util::wait_go(&mut go_r) {
                    return 4;
                }
                if k == 0 {
                    let mut p = Pressure::new(PressureConfig {
                        tau_ns: 500_000_000,
                        ..PressureConfig::default()
                    })
                    .unwrap();
                    sample_for(&mut p, SAMPLE_MS, || Sample::from_scheduler(&s.stats()));
                    let q = |x: f64| (x * 10_000.0).round() as u32;
                    send(&mut rep_w, &[q(p.some()), q(p.full())]);
                }
                // Keep draining until the parent kills us.
                loop {
                    std::thread::park();
                }
            })
        })
        .collect();
    drop((rep_w, go_r));
    for _ in &kids {
        assert_eq!(recv(&mut rep_r), Some(0), "a worker could not attach");
    }
    let mut go_w = go_w;
    region_util::go(&mut go_w, kids.len());
    let mut p = Pressure::new(PressureConfig {
        tau_ns: 500_000_000,
        ..PressureConfig::default()
    })
    .unwrap();
    let served0 = me.stats().shared.unwrap().served;
    sample_for(&mut p, SAMPLE_MS, || Sample::from_scheduler(&me.stats()));
    let served = me.stats().shared.unwrap().served - served0;
    let worker = [recv(&mut rep_r), recv(&mut rep_r)];
    for k in kids {
        kill(k);
        assert_eq!(wait_child(k, LIMIT), Exit::Signal(libc::SIGKILL));
    }
    let [Some(ws), Some(wf)] = worker else {
        panic!("the worker sent no reading: {worker:?}");
    };
    let (ws, wf) = (f64::from(ws) / 10_000.0, f64::from(wf) / 10_000.0);
    eprintln!(
        "watcher some {:.3} full {:.3}, worker some {ws:.3} full {wf:.3}, {served} grants",
        p.some(),
        p.full()
    );
    assert!(served > 100, "the workers drained only {served} grants");
    assert!(ws > 0.5, "the workers had a backlog: worker some {ws:.3}");
    assert!(
        (p.some() - ws).abs() < 0.05 && (p.full() - wf).abs() < 0.05,
        "watcher some {:.3} full {:.3} paused {}, worker some {ws:.3} full {wf:.3} \
         ({served} grants in {SAMPLE_MS} ms)",
        p.some(),
        p.full(),
        p.paused()
    );
    assert_eq!(p.paused(), wf > 0.3, "the watcher's paused flag");
}
