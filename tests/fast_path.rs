//! The uncontended fast path makes no syscall and no allocation.
//!
//! * No syscall: a forked child builds its schedulers, warms them up, then
//!   enters `SECCOMP_MODE_STRICT` (only `read`, `write`, `_exit` and
//!   `sigreturn` are allowed; any other syscall kills it with `SIGKILL`),
//!   runs the fast path 100k times and leaves with a raw `exit` syscall. The
//!   parent asserts a clean exit. Control cases (`getpid`, a futex wake)
//!   inside the strict section must get the child killed, so the check can
//!   fail.
//! * No allocation: a counting global allocator (per thread, so the test
//!   harness's own threads do not count) sees zero allocations across 100k
//!   acquire + release pairs (raw permits of `acquire_raw_fast`, the
//!   first looks and `release_raw` among them); and, after the first,
//!   none in a blocking
//!   acquire that waits at a shared root (its queue reuses the waiters of
//!   earlier acquires).
//!
//! One test in this binary, so the forks happen with no other test thread
//! running (only the idle harness main thread).

mod tools;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::AtomicU32;

use shmsched::region::Region;
use shmsched::scheduler::{Concurrency, RawRelease, Scheduler};
use shmsched::Priority;

const PAIRS: usize = 100_000;

// ---------------------------------------------------------------------------
// Counting allocator
// ---------------------------------------------------------------------------

struct Counting;

thread_local! {
    // Const-initialised, no destructor: touching it never allocates.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn count_one() {
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

// SAFETY: every method forwards to `System` unchanged; counting only touches
// a thread-local Cell.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded with the caller's contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded with the caller's contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: forwarded with the caller's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// ---------------------------------------------------------------------------
// The fast path under test
// ---------------------------------------------------------------------------

/// The schedulers of one check: built (allocating, making syscalls) before
/// the measured section.
struct Subjects {
    _region: Region,
    shared: Scheduler,
    local: Scheduler,
    bounded: Scheduler,
}

impl Subjects {
    fn new() -> Subjects {
        let region = Region::anonymous().expect("anonymous region");
        let shared = Scheduler::shared(&region, 8).expect("shared scheduler");
        Subjects {
            _region: region,
            shared,
            local: Scheduler::new(Concurrency::unlimited()).expect("scheduler"),
            bounded: Scheduler::new(8).expect("scheduler"),
        }
    }

    /// `n` uncontended pairs of each kind. Returns false if any acquire did
    /// not succeed (it must, uncontended).
    fn run(&self, n: usize) -> bool {
        for _ in 0..n {
            for s in [&self.shared, &self.local, &self.bounded] {
                match s.acquire(Priority::Normal) {
                    Ok(p) => drop(black_box(p)),
                    Err(_) => return false,
                }
                match s.try_acquire(Priority::High) {
                    Some(p) => drop(black_box(p)),
                    None => return false,
                }
            }
            // Raw permits of the C face's lean path, and their releases.
            match self.shared.acquire_raw_fast(Priority::Normal) {
                Some(raw) if self.shared.release_raw(black_box(raw)).is_ok() => {}
                _ => return false,
            }
            match self.shared.acquire_raw_first_look(Priority::Normal) {
                Some(raw) => match self.shared.release_raw_first_look(black_box(raw)) {
                    RawRelease::Released => {}
                    _ => return false,
                },
                None => return false,
            }
        }
        true
    }
}

fn no_allocation() {
    let subjects = Subjects::new();
    assert!(subjects.run(1_000), "warm-up failed");
    let before = allocs();
    let ok = subjects.run(PAIRS);
    let after = allocs();
    assert!(ok, "an uncontended acquire failed");
    assert_eq!(
        after - before,
        0,
        "the fast path allocated {} times in {PAIRS} rounds",
        after - before
    );
    // The counter does see allocations (the check can fail).
    let before = allocs();
    black_box(Box::new(7u64));
    assert_eq!(allocs() - before, 1, "the counting allocator counts");
}

// ---------------------------------------------------------------------------
// Strict seccomp in a forked child
// ---------------------------------------------------------------------------

/// What the child does inside the strict section.
#[derive(Clone, Copy, Debug)]
enum Strict {
    /// The fast path only: must exit 0.
    FastPath,
    /// Control: `getpid` must be killed.
    Getpid,
    /// Control: a futex wake (what a slow-path release would do) must be
    /// killed.
    FutexWake,
}

/// Writes `msg` to stderr with a raw `write` (allowed in strict mode).
fn say(msg: &str) {
    // SAFETY: `msg` is a live buffer of `msg.len()` bytes.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
}

/// Leaves the child with the raw `exit` syscall (strict mode allows `exit`,
/// not `exit_group`; the child has a single thread, so this ends it).
fn raw_exit(code: libc::c_long) -> ! {
    // SAFETY: ends the calling (only) thread; nothing runs afterwards.
    unsafe { libc::syscall(libc::SYS_exit, code) };
    unreachable!("SYS_exit returned")
}

/// The child: build, warm up, go strict, run `what`, exit.
fn child(what: Strict) -> ! {
    let subjects = Subjects::new();
    if !subjects.run(1_000) {
        say("fast_path child: warm-up failed\n");
        raw_exit(2);
    }
    let word = AtomicU32::new(0);
    // SAFETY: prctl with integer arguments; from here on only read, write,
    // exit and sigreturn are allowed.
    if unsafe { libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_STRICT) } != 0 {
        say("fast_path child: PR_SET_SECCOMP failed\n");
        raw_exit(3);
    }
    match what {
        Strict::FastPath => {
            if !subjects.run(PAIRS) {
                say("fast_path child: an uncontended acquire failed\n");
                raw_exit(4);
            }
        }
        Strict::Getpid => {
            // SAFETY: trivially safe call (and fatal under strict seccomp).
            black_box(unsafe { libc::getpid() });
        }
        Strict::FutexWake => {
            // SAFETY: FUTEX_WAKE on a live, aligned u32; wakes nobody.
            black_box(unsafe {
                libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 1)
            });
        }
    }
    raw_exit(0)
}

/// Forks a child running `what` and returns its raw wait status.
fn run_child(what: Strict) -> libc::c_int {
    // SAFETY: the only other thread is the idle test-harness main thread; the
    // child only builds its own objects (before going strict) and leaves
    // through `raw_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // A panic must not unwind into the harness's copy in the child.
        let _ = std::panic::catch_unwind(|| child(what));
        raw_exit(5);
    }
    tools::bounded_waitpid(pid)
}

fn killed_by_seccomp(status: libc::c_int) -> bool {
    libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL
}

fn no_syscall() {
    for control in [Strict::Getpid, Strict::FutexWake] {
        let status = run_child(control);
        assert!(
            killed_by_seccomp(status),
            "control {control:?}: expected SIGKILL under strict seccomp, got status {status:#x}"
        );
    }
    let status = run_child(Strict::FastPath);
    assert!(
        !killed_by_seccomp(status),
        "the fast path made a syscall (child killed by strict seccomp)"
    );
    assert!(
        libc::WIFEXITED(status),
        "child ended abnormally: {status:#x}"
    );
    assert_eq!(libc::WEXITSTATUS(status), 0, "child check failed");
}

/// Rounds of [`no_allocation_waiting`].
const WAITS: usize = 200;

/// A blocking acquire that waits at a shared root allocates nothing once
/// its queue has a spare waiter: each round, this thread holds the only
/// slot until a second thread is queued for it (the region's published
/// count says so), then releases; that thread counts its own allocations
/// across its acquire. Some rounds hold the slot past the waiter's
/// backstop, so its keeper's reap runs too (it once allocated the path it
/// reopens the region by: the test failed when a loaded machine delayed a
/// release by 20 ms).
fn no_allocation_waiting() {
    let region = Region::anonymous().expect("anonymous region");
    let s = Scheduler::shared(&region, 1).expect("shared scheduler");
    let step = std::sync::Barrier::new(2);
    let counts = std::thread::scope(|sc| {
        let waiter = sc.spawn(|| {
            let mut counts = Vec::with_capacity(WAITS);
            for _ in 0..WAITS {
                step.wait(); // the slot is held
                let before = allocs();
                let p = s.acquire(Priority::Normal).expect("acquire");
                counts.push(allocs() - before);
                drop(p);
                step.wait(); // released again
            }
            counts
        });
        for round in 0..WAITS {
            let hold = s.acquire(Priority::Normal).expect("hold");
            step.wait();
            let start = std::time::Instant::now();
            while s.stats().pending != 1 {
                assert!(
                    start.elapsed() < std::time::Duration::from_secs(20),
                    "round {round}: the second thread never queued"
                );
                std::thread::yield_now();
            }
            if round % 40 == 39 {
                // Now and then the waiter sleeps past its backstop (20 ms),
                // so its keeper round runs (a reap of the region, which
                // reopens the region file): that allocates nothing either.
                // (A sleep to make the wait long, not synchronisation.)
                std::thread::sleep(
                    shmsched::scheduler::BACKSTOP + std::time::Duration::from_millis(5),
                );
            }
            drop(hold);
            step.wait();
        }
        waiter.join().expect("waiter thread")
    });
    let st = s.stats();
    assert_eq!(st.total.deferred, WAITS as u64, "every round waited");
    assert_eq!((st.running, st.pending), (0, 0));
    let later: u64 = counts[1..].iter().sum();
    assert_eq!(
        later,
        0,
        "waiting acquires after the first allocated {later} times in {} rounds: {counts:?}",
        WAITS - 1
    );
}

#[test]
fn fast_path_makes_no_syscall_and_no_allocation() {
    no_allocation();
    no_syscall();
    // Threads only after the forks (see the module docs).
    no_allocation_waiting();
}
