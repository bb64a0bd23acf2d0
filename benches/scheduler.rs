//! shmsched versus the alternatives a user would reach for, side by side in
//! one run (see DESIGN.md, "Measuring"). Compare rows by ratio, not by
//! absolute time: the machines are shared and noisy.
//!
//! Groups (names are fixed; the shmsched rows are added in each group's
//! `// shmsched rows go here` slot):
//!
//! - `acquire_release`: one uncontended acquire + release pair on a single
//!   thread. Throughput is 1 element per pair, so criterion prints pairs/s.
//! - `handoff_latency`: a release in one process wakes a waiter in another.
//!   A forked partner ping-pongs with the parent through two cap-1
//!   resources; one criterion iteration is one one-way handoff (half a round
//!   trip), so the time shown is the one-way handoff latency. Parent and
//!   partner are pinned to two different CPUs (or to one CPU with
//!   `SHMSCHED_BENCH_SAME_CPU=1`) so every row of a run measures the same
//!   wakeup path; see `common::Placement`.
//!
//! Adding a row:
//!
//! - `acquire_release`: `g.bench_function("shmsched_…", |b| b.iter(|| { acquire; release }))`
//!   with the object built before `bench_function`.
//! - `handoff_latency`: `handoff_row(&mut g, "shmsched_…", make, child_side, parent_side)`:
//!   `make` builds the shared object(s) (before the fork), `child_side` is one
//!   "wait for the ping, send the pong" step run forever in the forked
//!   partner, `parent_side` is one "send the ping, wait for the pong" round
//!   trip. The fork, watchdog, kill and reap are handled by `handoff_row`.

mod common;

use std::hint::black_box;
use std::sync::Mutex;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};

use common::{
    time_handoffs, Child, FlockFile, Placement, PosixNamedSem, SharedSemPair, SysvSemUndo,
};

/// Permits in the uncontended `acquire_release` rows.
const PERMITS: u32 = 8;

fn acquire_release(c: &mut Criterion) {
    let mut g = c.benchmark_group("acquire_release");
    g.throughput(Throughput::Elements(1));

    // shmsched rows go here

    {
        let sem = PosixNamedSem::new(PERMITS).expect("sem_open");
        g.bench_function("posix_sem", |b| {
            b.iter(|| {
                sem.wait();
                sem.post();
            })
        });
    }

    {
        let sem = SysvSemUndo::new(PERMITS as i32).expect("semget");
        g.bench_function("sysv_sem_undo", |b| {
            b.iter(|| {
                sem.acquire();
                sem.release();
            })
        });
    }

    {
        let client = jobserver::Client::new(PERMITS as usize).expect("jobserver");
        g.bench_function("jobserver", |b| {
            b.iter(|| drop(black_box(client.acquire().expect("jobserver acquire"))))
        });
    }

    {
        let lock = FlockFile::new().expect("lock file");
        g.bench_function("flock", |b| {
            b.iter(|| {
                lock.lock();
                lock.unlock();
            })
        });
    }

    {
        let m = Mutex::new(0u64);
        g.bench_function("std_mutex", |b| {
            b.iter(|| {
                let mut guard = black_box(&m).lock().expect("poisoned");
                *guard += 1;
            })
        });
    }

    g.finish();
}

/// A forked partner and the primitive it shares with the parent. `child` is
/// declared first so it is killed and reaped before `prim` is torn down.
/// `_placement` (held for its `Drop`) is last so the parent's CPU mask is
/// restored after the child is gone.
struct Partner<P> {
    child: Child,
    prim: P,
    _placement: Placement,
}

/// Adds a cross-process handoff row. See the module docs for the contract of
/// `make`, `child_side` and `parent_side`. The partner is forked lazily on
/// the first sample (so filtered-out rows fork nothing), reused for every
/// sample of this row, and killed and reaped when the row is done.
fn handoff_row<P>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    id: &str,
    make: impl FnOnce() -> P,
    child_side: fn(&P),
    parent_side: fn(&P),
) {
    let mut make = Some(make);
    let mut partner: Option<Partner<P>> = None;
    g.bench_function(id, |b| {
        let p = partner.get_or_insert_with(|| {
            let placement = Placement::pin_parent().expect("cpu affinity");
            eprintln!("{id}: {}", placement.describe());
            let prim = (make.take().expect("made once"))();
            let child = Child::spawn(placement.child_cpu, || loop {
                child_side(&prim)
            })
            .expect("fork");
            Partner {
                child,
                prim,
                _placement: placement,
            }
        });
        p.child.assert_alive();
        b.iter_custom(|iters| time_handoffs(iters, || parent_side(&p.prim)))
    });
    drop(partner);
}

/// Exit code of a partner whose primitive failed; the parent then notices via
/// `assert_alive` (or the watchdog) instead of hanging.
fn partner_failed() -> ! {
    // SAFETY: _exit is async-signal-safe and skips the parent's atexit state.
    unsafe { libc::_exit(101) }
}

/// Two cap-1 jobservers (pipes with at most one token in flight), one per
/// direction: a single token pipe cannot force alternation, because the
/// releaser could read its own token back.
struct JobserverPingPong {
    ping: jobserver::Client,
    pong: jobserver::Client,
}

fn handoff_latency(c: &mut Criterion) {
    let mut g = c.benchmark_group("handoff_latency");
    g.throughput(Throughput::Elements(1));

    // shmsched rows go here

    handoff_row(
        &mut g,
        "jobserver_pipe",
        || JobserverPingPong {
            ping: jobserver::Client::new(0).expect("jobserver"),
            pong: jobserver::Client::new(0).expect("jobserver"),
        },
        |j| {
            if j.ping.acquire_raw().is_err() || j.pong.release_raw().is_err() {
                partner_failed();
            }
        },
        |j| {
            j.ping.release_raw().expect("jobserver release");
            j.pong.acquire_raw().expect("jobserver acquire");
        },
    );

    handoff_row(
        &mut g,
        "posix_sem",
        || SharedSemPair::new().expect("shared semaphores"),
        |s| {
            s.wait(0);
            s.post(1);
        },
        |s| {
            s.post(0);
            s.wait(1);
        },
    );

    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    targets = acquire_release, handoff_latency
}
criterion_main!(benches);
