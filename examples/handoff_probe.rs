//! Per-hand-off counts of the cross-process hand-off (`benches/scheduler.rs`,
//! `handoff_latency`), with the parent and a forked partner on one CPU
//! (`same`) or two (`cross`). Modes:
//!
//! - `shm`: the old bench's ping-pong through two shared schedulers of max
//!   1 (each side holds one slot; a side can run round trips alone while
//!   the other is preempted holding nothing);
//! - `shmlow`: the same with the partner at `Low`;
//! - `shm3`: the bench's ping-pong through three schedulers (each side
//!   always holds a slot the other needs next);
//! - `sem`: two process-shared POSIX semaphores;
//! - `pipe`: two pipes, one byte each way;
//! - `futex`, `futext`: two futex words, a flag each way (the semaphores'
//!   skeleton); `futext` sleeps with a 20 ms absolute timeout read from
//!   the clock before each sleep, as a shared root's keeper sleeps with its
//!   backstop (the difference is the cost of that timer).
//!
//! Prints, per one-way hand-off: wall time, both processes' voluntary and
//! involuntary context switches (`/proc/<pid>/status`), CPU time, the
//! partner's loops per parent round trip (1 when the sides alternate
//! strictly), slow acquires of each side, and the region's wakes and
//! fairness hand-offs.
//!
//! ```sh
//! cargo build --profile bench --example handoff_probe
//! target/release/examples/handoff_probe shm,shm3,sem 100000 same
//! perf stat -e context-switches,syscalls:sys_enter_futex \
//!     target/release/examples/handoff_probe shm3 100000 same   # both processes
//! # instructions: both processes, N against 2N round trips
//! SHMSCHED_PROBE_EXIT=1 SHMSCHED_PROBE_REPEAT=1 valgrind --tool=callgrind \
//!     --toggle-collect='*handoff_probe*measure*' --toggle-collect='*partner_loop*' \
//!     --toggle-collect='*uncounted*' \
//!     target/release/examples/handoff_probe shm3 2000 same
//! ```
//!
//! (`--toggle-collect='*uncounted*'` leaves out the partner's own reads of
//! its counters, every [`SLOW_EVERY`] loops: a toggle inside a toggled
//! function switches collection off.)
//!
//! Several modes in one run (`shm,sem`) are interleaved round by round
//! (`SHMSCHED_PROBE_REPEAT`, default 3), each mode with its own partner.
//! `SHMSCHED_PROBE_EXIT=1`: the partners exit after their last step (a
//! profile needs a clean exit). `SHMSCHED_PROBE_TRACE=1`: one measurement
//! of the first mode, then a TSC-stamped trace of both sides' acquires and
//! releases over 20,000 round trips (the first 400,000 events).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use shmsched::region::Region;
use shmsched::scheduler::{Permit, Scheduler};
use shmsched::Priority;

/// Counters the partner keeps in a shared page.
#[repr(C)]
struct Shared {
    /// Partner loop iterations (one per hand-off it receives).
    loops: AtomicU64,
    /// Partner ready (1) once it holds its first slot.
    ready: AtomicU64,
    /// The partner's slow acquires (its handles' deferred counts), stored
    /// every [`SLOW_EVERY`] loops.
    slow: AtomicU64,
}

/// Events of the trace (`SHMSCHED_PROBE_TRACE=1`): a shared ring of
/// (TSC, side << 8 | event << 4 | scheduler) after the first measurement.
const TRACE_LEN: usize = 400_000;

static TRACE: AtomicU64 = AtomicU64::new(0);

/// The trace ring (a shared page per run), or null.
static mut RING: *mut AtomicU64 = std::ptr::null_mut();

/// Records an event if tracing: side 0 parent, 1 partner; ev 1 acquire
/// called, 2 acquired, 3 released.
#[inline]
fn ev(side: u64, e: u64, sched: usize) {
    // SAFETY: RING is set once before the fork and never changed.
    let ring = unsafe { RING };
    if ring.is_null() {
        return;
    }
    // SAFETY: the ring page holds 2 * TRACE_LEN + 1 words: word 0 the cursor.
    let cur = unsafe { &*ring };
    if cur.load(Ordering::Relaxed) == u64::MAX || TRACE.load(Ordering::Relaxed) == 0 && side == 0 {
        return;
    }
    let i = cur.fetch_add(1, Ordering::SeqCst) as usize;
    if i >= TRACE_LEN {
        return;
    }
    // SAFETY: rdtsc has no preconditions; i < TRACE_LEN is inside the ring.
    unsafe {
        let t = core::arch::x86_64::_rdtsc();
        (*ring.add(1 + 2 * i)).store(t, Ordering::Relaxed);
        (*ring.add(2 + 2 * i)).store(side << 8 | e << 4 | sched as u64, Ordering::Relaxed);
    }
}

/// Partner loops between two stores of its slow-acquire count.
const SLOW_EVERY: u64 = 64;

/// A shared anonymous mapping of `len` bytes.
fn shared_map(len: usize) -> *mut u8 {
    // SAFETY: anonymous shared mapping, no fd, the kernel picks the address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert!(p != libc::MAP_FAILED, "mmap");
    p.cast()
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes one bit.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set),
            0,
            "sched_setaffinity"
        );
    }
}

/// The first two CPUs this process may run on.
fn cpus() -> (usize, usize) {
    // SAFETY: sched_getaffinity fills the zeroed set; CPU_ISSET reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set);
        let v: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect();
        (v[0], *v.get(1).unwrap_or(&v[0]))
    }
}

/// (voluntary, nonvoluntary) context switches and CPU ticks (utime+stime)
/// of `pid`.
fn switches(pid: i32) -> (u64, u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().parse::<u64>().expect("number"))
            .expect("field")
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    // Fields 14 and 15 (utime, stime) are 12 and 13 after "pid (comm) ".
    let ticks = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    (
        field("voluntary_ctxt_switches:"),
        field("nonvoluntary_ctxt_switches:"),
        ticks,
    )
}

/// One side of the scheduler ping-pong (as `benches/scheduler.rs`).
struct Side {
    s: [&'static Scheduler; 2],
    held: Option<Permit<'static>>,
    on: usize,
    prio: Priority,
}

impl Side {
    fn release_then_acquire(&mut self) {
        drop(self.held.take());
        ev(0, 3, self.on);
        self.on = 1 - self.on;
        ev(0, 1, self.on);
        self.held = Some(self.s[self.on].acquire(self.prio).expect("acquire"));
        ev(0, 2, self.on);
    }

    fn acquire_then_release(&mut self) {
        let next = 1 - self.on;
        ev(1, 1, next);
        let p = self.s[next].acquire(self.prio).expect("acquire");
        ev(1, 2, next);
        drop(self.held.replace(p));
        ev(1, 3, self.on);
        self.on = next;
    }
}

/// One side of a three-scheduler ping-pong (`shm3`): the parent starts
/// holding 0 and 1, the partner 2. Parent step i releases i % 3 and waits
/// for (i + 2) % 3; partner step i waits for i % 3 and releases
/// (i + 2) % 3. Each side always holds a slot the other needs next, so
/// neither can run round trips alone (as with two semaphores), which it
/// can with two schedulers while the other side is preempted holding
/// nothing.
struct Side3 {
    s: [&'static Scheduler; 3],
    held: [Option<Permit<'static>>; 3],
    step: usize,
}

impl Side3 {
    fn release_then_acquire(&mut self) {
        let (r, a) = (self.step % 3, (self.step + 2) % 3);
        drop(self.held[r].take());
        ev(0, 3, r);
        ev(0, 1, a);
        self.held[a] = Some(self.s[a].acquire(Priority::Normal).expect("acquire"));
        ev(0, 2, a);
        self.step += 1;
    }

    fn acquire_then_release(&mut self) {
        let (a, r) = (self.step % 3, (self.step + 2) % 3);
        ev(1, 1, a);
        self.held[a] = Some(self.s[a].acquire(Priority::Normal).expect("acquire"));
        ev(1, 2, a);
        drop(self.held[r].take());
        ev(1, 3, r);
        self.step += 1;
    }
}

struct Shm3Mode {
    side: Side3,
}

impl Mode for Shm3Mode {
    fn round_trip(&mut self) {
        self.side.release_then_acquire();
    }
    fn counters(&self) -> [u64; 3] {
        sched_counters(&self.side.s)
    }
}

/// Stores the partner's slow acquires summed over `scheds` (named for the
/// profile's `--toggle-collect='*uncounted*'`: the probe's own bookkeeping,
/// no part of a hand-off).
#[inline(never)]
fn store_slow_uncounted(shared: &Shared, scheds: &[&Scheduler]) {
    let slow = scheds.iter().map(|s| s.stats().total.deferred).sum();
    shared.slow.store(slow, Ordering::Relaxed);
}

/// (slow acquires, wakes, fair hand-offs) summed over `scheds`.
fn sched_counters(scheds: &[&Scheduler]) -> [u64; 3] {
    let mut c = [0; 3];
    for s in scheds {
        let st = s.stats();
        c[0] += st.total.deferred;
        if let Some(sh) = st.shared {
            c[1] += sh.wakes;
            c[2] += sh.fair_handoffs;
        }
    }
    c
}

/// What a mode's parent side does per round trip, and the counters it can
/// read.
trait Mode {
    fn round_trip(&mut self);
    /// (slow acquires, wakes, fair hand-offs) so far, region-wide where the
    /// region counts.
    fn counters(&self) -> [u64; 3] {
        [0; 3]
    }
}

struct ShmMode {
    side: Side,
}

impl Mode for ShmMode {
    fn round_trip(&mut self) {
        self.side.release_then_acquire();
    }
    fn counters(&self) -> [u64; 3] {
        sched_counters(&self.side.s)
    }
}

struct PipeMode {
    /// The write end to the partner, the read end from it.
    fds: [i32; 2],
}

impl Mode for PipeMode {
    fn round_trip(&mut self) {
        let mut b = [0u8; 1];
        // SAFETY: two open pipe ends of this process; one-byte buffers.
        unsafe {
            while libc::write(self.fds[0], b.as_ptr().cast(), 1) != 1 {}
            while libc::read(self.fds[1], b.as_mut_ptr().cast(), 1) != 1 {}
        }
    }
}

/// Waits for the flag `w` (then clears it), sleeping on it; `timed`: with
/// a 20 ms absolute deadline read before each sleep (a keeper's backstop).
fn flag_wait(w: &std::sync::atomic::AtomicU32, timed: bool) {
    loop {
        if w.swap(0, Ordering::SeqCst) != 0 {
            return;
        }
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let tp: *const libc::timespec = if timed {
            // SAFETY: a valid timespec to fill.
            unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
            ts.tv_nsec += 20_000_000;
            if ts.tv_nsec >= 1_000_000_000 {
                ts.tv_sec += 1;
                ts.tv_nsec -= 1_000_000_000;
            }
            &ts
        } else {
            std::ptr::null()
        };
        // SAFETY: a live aligned u32 in a shared mapping; `tp` is null or
        // points to `ts`, which outlives the call.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                w.as_ptr(),
                libc::FUTEX_WAIT_BITSET,
                0u32,
                tp,
                std::ptr::null::<u32>(),
                1u32,
            )
        };
    }
}

/// Sets the flag `w` and wakes its sleeper.
fn flag_post(w: &std::sync::atomic::AtomicU32) {
    w.store(1, Ordering::SeqCst);
    // SAFETY: a live aligned u32 in a shared mapping; no timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            w.as_ptr(),
            libc::FUTEX_WAKE_BITSET,
            1i32,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            1u32,
        )
    };
}

struct FutexMode {
    /// To the partner, from it (a shared page).
    words: &'static [std::sync::atomic::AtomicU32; 2],
    timed: bool,
}

impl Mode for FutexMode {
    fn round_trip(&mut self) {
        flag_post(&self.words[0]);
        flag_wait(&self.words[1], self.timed);
    }
}

struct SemMode {
    sems: *mut libc::sem_t,
}

impl Mode for SemMode {
    fn round_trip(&mut self) {
        // SAFETY: two initialised process-shared semaphores in a live mapping.
        unsafe {
            libc::sem_post(self.sems);
            while libc::sem_wait(self.sems.add(1)) != 0 {}
        }
    }
}

/// Partner loops after which the partner exits (0: never), for counting
/// instructions (`SHMSCHED_PROBE_EXIT=1`: a partner killed by a signal
/// writes no profile).
static EXIT_AFTER: AtomicU64 = AtomicU64::new(0);

/// Round trips before the first measurement.
fn warmup(rounds: u64) -> u64 {
    if EXIT_AFTER.load(Ordering::Relaxed) != 0 {
        1000
    } else {
        rounds.min(10_000)
    }
}

/// The partner's loop: `step(n)` for n = 0, 1, …, counted in `loops`
/// (callgrind: `--toggle-collect='*partner_loop*'`).
#[inline(never)]
fn partner_loop(shared: &Shared, mut step: impl FnMut(u64)) {
    let limit = EXIT_AFTER.load(Ordering::Relaxed);
    loop {
        let n = shared.loops.load(Ordering::Relaxed);
        step(n);
        shared.loops.store(n + 1, Ordering::Relaxed);
        if n + 1 == limit {
            std::process::exit(0);
        }
    }
}

/// A mode with its partner running.
struct Running {
    name: &'static str,
    pid: i32,
    shared: &'static Shared,
    mode: Box<dyn Mode>,
}

impl Drop for Running {
    fn drop(&mut self) {
        // SAFETY: our own child, killed and reaped once.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

/// Waits until the forked partner has set itself up (its `ready` store).
fn wait_ready(shared: &Shared) {
    while shared.ready.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Forks a partner running `child` forever.
fn fork_partner(cpu: usize, child: impl FnOnce()) -> i32 {
    // SAFETY: the child only runs the partner loop and never returns.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: prctl with PR_SET_PDEATHSIG only sets a signal.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        pin(cpu);
        child();
        // SAFETY: _exit skips the parent's atexit state.
        unsafe { libc::_exit(0) }
    }
    pid
}

fn start(name: &'static str, child_cpu: usize) -> Running {
    let shared: &'static Shared = {
        let p = shared_map(4096).cast::<Shared>();
        // SAFETY: a fresh zeroed shared page holds a valid (zero) Shared.
        unsafe { &*p }
    };
    match name {
        "shm" | "shmlow" => {
            // shmlow: the partner acquires at Low, so a waiter of the
            // parent's (Normal) closes its fast path: no barging.
            let partner_prio = if name == "shmlow" {
                Priority::Low
            } else {
                Priority::Normal
            };
            let regions: &'static [Region; 2] = Box::leak(Box::new([
                Region::anonymous().expect("region"),
                Region::anonymous().expect("region"),
            ]));
            let parent = [0, 1]
                .map(|i| &*Box::leak(Box::new(Scheduler::shared(&regions[i], 1).expect("shared"))));
            let first = parent[0].acquire(Priority::Normal).expect("acquire");
            let pid = fork_partner(child_cpu, || {
                let s = [0, 1].map(|i| {
                    &*Box::leak(Box::new(Scheduler::attach(&regions[i]).expect("attach")))
                });
                let held = s[1].try_acquire(Priority::Normal).expect("slot 1");
                let mut side = Side {
                    s,
                    held: Some(held),
                    on: 1,
                    prio: partner_prio,
                };
                shared.ready.store(1, Ordering::SeqCst);
                partner_loop(shared, |n| {
                    side.acquire_then_release();
                    if n % SLOW_EVERY == 0 {
                        store_slow_uncounted(shared, &s);
                    }
                });
            });
            wait_ready(shared);
            Running {
                name,
                pid,
                shared,
                mode: Box::new(ShmMode {
                    side: Side {
                        s: parent,
                        held: Some(first),
                        on: 0,
                        prio: Priority::Normal,
                    },
                }),
            }
        }
        "shm3" => {
            let regions: &'static [Region; 3] = Box::leak(Box::new([
                Region::anonymous().expect("region"),
                Region::anonymous().expect("region"),
                Region::anonymous().expect("region"),
            ]));
            let parent = [0, 1, 2]
                .map(|i| &*Box::leak(Box::new(Scheduler::shared(&regions[i], 1).expect("shared"))));
            let held = [
                Some(parent[0].acquire(Priority::Normal).expect("acquire")),
                Some(parent[1].acquire(Priority::Normal).expect("acquire")),
                None,
            ];
            let pid = fork_partner(child_cpu, || {
                let s = [0, 1, 2].map(|i| {
                    &*Box::leak(Box::new(Scheduler::attach(&regions[i]).expect("attach")))
                });
                let mine = s[2].try_acquire(Priority::Normal).expect("slot 2");
                let mut side = Side3 {
                    s,
                    held: [None, None, Some(mine)],
                    step: 0,
                };
                shared.ready.store(1, Ordering::SeqCst);
                partner_loop(shared, |n| {
                    side.acquire_then_release();
                    if n % SLOW_EVERY == 0 {
                        store_slow_uncounted(shared, &s);
                    }
                });
            });
            wait_ready(shared);
            Running {
                name,
                pid,
                shared,
                mode: Box::new(Shm3Mode {
                    side: Side3 {
                        s: parent,
                        held,
                        step: 0,
                    },
                }),
            }
        }
        "sem" => {
            let sems = shared_map(4096).cast::<libc::sem_t>();
            for i in 0..2 {
                // SAFETY: two aligned sem_t slots in a fresh shared page.
                assert_eq!(unsafe { libc::sem_init(sems.add(i), 1, 0) }, 0);
            }
            let pid = fork_partner(child_cpu, || {
                shared.ready.store(1, Ordering::SeqCst);
                partner_loop(shared, |_| {
                    // SAFETY: as in SemMode.
                    unsafe {
                        while libc::sem_wait(sems) != 0 {}
                        libc::sem_post(sems.add(1));
                    }
                });
            });
            wait_ready(shared);
            Running {
                name,
                pid,
                shared,
                mode: Box::new(SemMode { sems }),
            }
        }
        "pipe" => {
            let (mut to, mut from) = ([0i32; 2], [0i32; 2]);
            // SAFETY: pipe fills the two-element arrays.
            unsafe {
                assert_eq!(libc::pipe(to.as_mut_ptr()), 0, "pipe");
                assert_eq!(libc::pipe(from.as_mut_ptr()), 0, "pipe");
            }
            let pid = fork_partner(child_cpu, || {
                shared.ready.store(1, Ordering::SeqCst);
                let mut b = [0u8; 1];
                partner_loop(shared, |_| {
                    // SAFETY: the inherited pipe ends; one-byte buffers.
                    unsafe {
                        while libc::read(to[0], b.as_mut_ptr().cast(), 1) != 1 {}
                        while libc::write(from[1], b.as_ptr().cast(), 1) != 1 {}
                    }
                });
            });
            wait_ready(shared);
            Running {
                name,
                pid,
                shared,
                mode: Box::new(PipeMode {
                    fds: [to[1], from[0]],
                }),
            }
        }
        "futex" | "futext" => {
            let timed = name == "futext";
            let words: &'static [std::sync::atomic::AtomicU32; 2] = {
                let p = shared_map(4096).cast::<[std::sync::atomic::AtomicU32; 2]>();
                // SAFETY: a fresh zeroed shared page holds two zero words.
                unsafe { &*p }
            };
            let pid = fork_partner(child_cpu, || {
                shared.ready.store(1, Ordering::SeqCst);
                partner_loop(shared, |_| {
                    flag_wait(&words[0], timed);
                    flag_post(&words[1]);
                });
            });
            wait_ready(shared);
            Running {
                name,
                pid,
                shared,
                mode: Box::new(FutexMode { words, timed }),
            }
        }
        other => panic!("unknown mode {other} (shm, shmlow, shm3, sem, pipe, futex, futext)"),
    }
}

/// `rounds` round trips of `r`, and one line of per-hand-off figures.
#[inline(never)]
fn measure(r: &mut Running, rounds: u64) {
    let me = std::process::id() as i32;
    let (pv0, pn0, pt0) = switches(me);
    let (cv0, cn0, ct0) = switches(r.pid);
    let l0 = r.shared.loops.load(Ordering::SeqCst);
    let s0 = r.shared.slow.load(Ordering::SeqCst);
    let k0 = r.mode.counters();
    let t = Instant::now();
    for _ in 0..rounds {
        r.mode.round_trip();
    }
    let el = t.elapsed();
    let k1 = r.mode.counters();
    let l1 = r.shared.loops.load(Ordering::SeqCst);
    let s1 = r.shared.slow.load(Ordering::SeqCst);
    let (pv1, pn1, pt1) = switches(me);
    let (cv1, cn1, ct1) = switches(r.pid);
    let h = (2 * rounds) as f64;
    // SAFETY: sysconf has no preconditions.
    let tick_ns = 1e9 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    println!(
        "{:4} {:8.0} ns/handoff | parent vol {:.2} invol {:.3} | partner vol {:.2} invol {:.3} \
         | cpu {:6.0} ns/handoff | partner loops/round {:.3} | slow acq {:.2} (partner {:.2}) wakes {:.2} fair {:.4}",
        r.name,
        el.as_nanos() as f64 / h,
        (pv1 - pv0) as f64 / h,
        (pn1 - pn0) as f64 / h,
        (cv1 - cv0) as f64 / h,
        (cn1 - cn0) as f64 / h,
        ((pt1 - pt0) + (ct1 - ct0)) as f64 * tick_ns / h,
        (l1 - l0) as f64 / rounds as f64,
        (k1[0] - k0[0]) as f64 / h,
        s1.saturating_sub(s0) as f64 / h,
        (k1[1] - k0[1]) as f64 / h,
        (k1[2] - k0[2]) as f64 / h,
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let modes = args.next().unwrap_or_else(|| "shm".into());
    let rounds: u64 = args.next().map_or(100_000, |a| a.parse().expect("rounds"));
    let same = args.next().as_deref() != Some("cross");
    let repeat: usize = std::env::var("SHMSCHED_PROBE_REPEAT")
        .ok()
        .map_or(3, |v| v.parse().expect("repeat"));
    if std::env::var_os("SHMSCHED_PROBE_EXIT").is_some() {
        EXIT_AFTER.store(1000 + repeat as u64 * rounds, Ordering::Relaxed);
    }
    let (a, b) = cpus();
    let child_cpu = if same { a } else { b };
    pin(a);
    println!(
        "{} round trips per line, parent on cpu {a}, partner on cpu {child_cpu}",
        rounds
    );
    let names: Vec<&'static str> = modes
        .split(',')
        .map(|m| &*Box::leak(m.to_string().into_boxed_str()))
        .collect();
    let trace = std::env::var_os("SHMSCHED_PROBE_TRACE").is_some();
    if trace {
        // SAFETY: set once, before any fork.
        unsafe { RING = shared_map(8 * (2 * TRACE_LEN + 1)).cast() };
        // SAFETY: the fresh ring's cursor word.
        unsafe { (*RING).store(u64::MAX, Ordering::SeqCst) };
    }
    let mut running: Vec<Running> = names.iter().map(|n| start(n, child_cpu)).collect();
    for r in &mut running {
        for _ in 0..warmup(rounds) {
            r.mode.round_trip();
        }
    }
    if trace {
        measure(&mut running[0], rounds);
        TRACE.store(1, Ordering::SeqCst);
        // SAFETY: the ring's cursor: start recording.
        unsafe { (*RING).store(0, Ordering::SeqCst) };
        for _ in 0..20_000 {
            running[0].mode.round_trip();
        }
        let mut t0 = 0;
        for i in 0..TRACE_LEN {
            // SAFETY: inside the ring.
            let (t, e) = unsafe {
                (
                    (*RING.add(1 + 2 * i)).load(Ordering::SeqCst),
                    (*RING.add(2 + 2 * i)).load(Ordering::SeqCst),
                )
            };
            if t0 == 0 {
                t0 = t;
            }
            let what = ["?", "acquire", "acquired", "released"][(e >> 4 & 15) as usize];
            println!(
                "{:10} {} {} s{}",
                t - t0,
                if e >> 8 == 0 { "parent " } else { "partner" },
                what,
                e & 15
            );
        }
        return;
    }
    for _ in 0..repeat {
        for r in &mut running {
            measure(r, rounds);
        }
    }
    if EXIT_AFTER.load(Ordering::Relaxed) != 0 {
        // The partners exit by themselves: wait for them (and their
        // profiles) before exiting, which would kill them.
        for r in &running {
            // SAFETY: our own child, reaped once; we exit without Drop.
            unsafe { libc::waitpid(r.pid, std::ptr::null_mut(), 0) };
        }
        std::process::exit(0);
    }
}
