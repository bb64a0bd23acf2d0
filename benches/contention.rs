//! Contended throughput: P processes share one budget of `cap` slots and
//! loop acquire → task → release, against a process-shared POSIX semaphore
//! doing the same in the same run (see DESIGN's "Measuring": compare rows
//! by ratio).
//!
//! Rows: `contention/{shmsched,posix_sem}/p{P}_cap{C}_task{T}us` for
//! P ∈ {2, 4, 8}, C ∈ {1, 4}, T ∈ {0, 10}. One criterion element is one
//! acquire + task + release by any process, so criterion prints the
//! aggregate rate. Each sample forks P workers (the bench process is
//! single-threaded when it forks), lets them run for [`RUN`] after a start
//! barrier, stops them, and sums what they completed; the time reported is
//! scaled to the iterations criterion asked for.
//!
//! The shmsched rows keep every order rule (priorities, FIFO, the lottery,
//! the fairness bound); see `src/scheduler/root.rs` for the bounded barging
//! that lets a busy pool run at the speed of its fast path.
//!
//! `SHMSCHED_BENCH_QUICK=1` runs only P=8 (the adversarial point).

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

use shmsched::region::Region;
use shmsched::scheduler::Scheduler;
use shmsched::Priority;

/// How long each sample's workers run.
const RUN: Duration = Duration::from_millis(300);

/// A page of counters shared with the forked workers.
struct Board {
    base: *mut AtomicU64,
}

// Words of the board.
const GO: usize = 0;
const STOP: usize = 1;
const DONE: usize = 2; // workers that finished
const OPS: usize = 8; // then one counter per worker

impl Board {
    fn new() -> Board {
        // SAFETY: an anonymous shared mapping of one page; no fd.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(p != libc::MAP_FAILED, "mmap");
        Board { base: p.cast() }
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < 512);
        // SAFETY: the page holds 512 u64s, zero-initialised, shared with the
        // children; AtomicU64 has the layout of u64.
        unsafe { &*self.base.add(i) }
    }

    fn reset(&self) {
        for i in 0..64 {
            self.word(i).store(0, Ordering::SeqCst);
        }
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        // SAFETY: unmaps the page mapped in `new`.
        unsafe { libc::munmap(self.base.cast(), 4096) };
    }
}

/// One process-shared POSIX semaphore in a shared page.
struct Sem {
    base: *mut libc::sem_t,
}

impl Sem {
    fn new(value: u32) -> Sem {
        // SAFETY: as in `Board::new`.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(p != libc::MAP_FAILED, "mmap");
        let base = p.cast::<libc::sem_t>();
        // SAFETY: page-aligned, large enough for one sem_t.
        assert_eq!(unsafe { libc::sem_init(base, 1, value) }, 0);
        Sem { base }
    }

    fn wait(&self) {
        // SAFETY: an initialised process-shared semaphore.
        while unsafe { libc::sem_wait(self.base) } != 0 {}
    }

    fn post(&self) {
        // SAFETY: as above.
        unsafe { libc::sem_post(self.base) };
    }
}

impl Drop for Sem {
    fn drop(&mut self) {
        // SAFETY: the workers are gone (joined before drop); unmaps the page.
        unsafe {
            libc::sem_destroy(self.base);
            libc::munmap(self.base.cast(), 4096);
        }
    }
}

/// Busy-waits `us` microseconds (the task, holding the slot).
#[inline]
fn task(us: u64) {
    if us == 0 {
        return;
    }
    let end = Instant::now() + Duration::from_micros(us);
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

/// Forks `p` workers running `body(worker_index)` until the board says stop,
/// runs them for [`RUN`], and returns the operations per second they did.
fn run_sample(board: &Board, p: usize, body: &dyn Fn(usize, &Board)) -> f64 {
    board.reset();
    let mut pids = Vec::new();
    for i in 0..p {
        // SAFETY: the bench process is single-threaded here (criterion runs
        // samples on the main thread); the child only uses objects created
        // before the fork and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // SAFETY: prctl with integer arguments.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
            while board.word(GO).load(Ordering::SeqCst) == 0 {
                std::hint::spin_loop();
            }
            body(i, board);
            board.word(DONE).fetch_add(1, Ordering::SeqCst);
            // SAFETY: leave without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        pids.push(pid);
    }
    let start = Instant::now();
    board.word(GO).store(1, Ordering::SeqCst);
    std::thread::sleep(RUN);
    board.word(STOP).store(1, Ordering::SeqCst);
    let ops: u64 = {
        let deadline = Instant::now() + Duration::from_secs(20);
        while board.word(DONE).load(Ordering::SeqCst) < p as u64 {
            assert!(Instant::now() < deadline, "workers did not stop");
            std::thread::sleep(Duration::from_millis(1));
        }
        (0..p)
            .map(|i| board.word(OPS + i).load(Ordering::SeqCst))
            .sum()
    };
    let elapsed = start.elapsed();
    for pid in pids {
        let mut st = 0;
        // SAFETY: reaps our own child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "worker failed: {st}"
        );
    }
    ops as f64 / elapsed.as_secs_f64()
}

/// The loop every worker runs: until stop, one op, counted every 64.
fn worker_loop(i: usize, board: &Board, mut op: impl FnMut()) {
    let mut n = 0u64;
    loop {
        for _ in 0..64 {
            op();
        }
        n += 64;
        board.word(OPS + i).store(n, Ordering::Relaxed);
        if board.word(STOP).load(Ordering::Relaxed) != 0 {
            return;
        }
    }
}

fn contention(c: &mut Criterion) {
    let mut g = c.benchmark_group("contention");
    g.throughput(Throughput::Elements(1));
    let board = Board::new();
    let quick = std::env::var_os("SHMSCHED_BENCH_QUICK").is_some();
    let ps: &[usize] = if quick { &[8] } else { &[2, 4, 8] };
    for &p in ps {
        for cap in [1u32, 4] {
            for us in [0u64, 10] {
                let id = format!("p{p}_cap{cap}_task{us}us");
                let sem = Sem::new(cap);
                g.bench_function(format!("posix_sem/{id}"), |b| {
                    b.iter_custom(|iters| {
                        let rate = run_sample(&board, p, &|i, bd| {
                            worker_loop(i, bd, || {
                                sem.wait();
                                task(us);
                                sem.post();
                            })
                        });
                        Duration::from_secs_f64(iters as f64 / rate)
                    })
                });
                drop(sem);
                let region = Region::anonymous().expect("region");
                let parent = Scheduler::shared(&region, cap).expect("scheduler");
                g.bench_function(format!("shmsched/{id}"), |b| {
                    b.iter_custom(|iters| {
                        let rate = run_sample(&board, p, &|i, bd| {
                            // A Scheduler handle is the parent's: attach anew.
                            let Ok(s) = Scheduler::attach(&region) else {
                                // SAFETY: leave the child at once.
                                unsafe { libc::_exit(3) }
                            };
                            worker_loop(i, bd, || {
                                let permit = black_box(s.acquire(Priority::Normal));
                                task(us);
                                drop(permit);
                            })
                        });
                        Duration::from_secs_f64(iters as f64 / rate)
                    })
                });
                drop(parent);
            }
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(10);
    targets = contention
}
criterion_main!(benches);
