//! Small safe wrappers around the alternatives a user would reach for
//! instead of shmsched, used by `benches/scheduler.rs`.
//!
//! Every wrapper owns its OS resource and releases it on drop (named
//! semaphores are unlinked at creation, System V sets are `IPC_RMID`ed,
//! lock files are removed, forked children are killed and reaped).
//! Every `unsafe` block carries a `// SAFETY:` comment.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Upper bound on one `iter_custom` batch of a cross-process bench. If the
/// parent blocks longer than this (e.g. the child died while holding the
/// baton), the default `SIGALRM` action terminates the bench process; its
/// children then die through `PR_SET_PDEATHSIG`. Nothing can hang forever.
pub const BATCH_WATCHDOG_SECS: u32 = 30;

/// A process-unique name component: `<pid>-<counter>`.
fn unique_suffix() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn check(rc: libc::c_int, what: &str) -> io::Result<()> {
    if rc == -1 {
        let e = io::Error::last_os_error();
        Err(io::Error::new(e.kind(), format!("{what}: {e}")))
    } else {
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// POSIX named semaphore (sem_open)
// ---------------------------------------------------------------------------

/// A POSIX named semaphore, opened with `O_CREAT | O_EXCL` and unlinked
/// immediately, so no name survives the process. Closed on drop.
pub struct PosixNamedSem {
    sem: *mut libc::sem_t,
}

impl PosixNamedSem {
    /// Creates a fresh named semaphore holding `value` permits.
    pub fn new(value: u32) -> io::Result<Self> {
        let name =
            CString::new(format!("/shmsched-bench-{}", unique_suffix())).expect("no interior NUL");
        // SAFETY: `name` is a valid NUL-terminated string that outlives the
        // call; with O_CREAT, sem_open takes (mode_t, unsigned) varargs, both
        // passed with their promoted C types.
        let sem = unsafe {
            libc::sem_open(
                name.as_ptr(),
                libc::O_CREAT | libc::O_EXCL,
                0o600 as libc::c_uint,
                value as libc::c_uint,
            )
        };
        if sem == libc::SEM_FAILED {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("sem_open: {e}")));
        }
        let this = PosixNamedSem { sem };
        // SAFETY: `name` is a valid C string; unlinking only removes the name,
        // the open handle `sem` stays valid until sem_close.
        check(unsafe { libc::sem_unlink(name.as_ptr()) }, "sem_unlink")?;
        Ok(this)
    }

    /// Takes one permit, blocking (retries on `EINTR`).
    #[inline]
    pub fn wait(&self) {
        loop {
            // SAFETY: `self.sem` is a live handle from sem_open, closed only
            // in Drop, which cannot run while `&self` is borrowed.
            if unsafe { libc::sem_wait(self.sem) } == 0 {
                return;
            }
            let e = io::Error::last_os_error();
            assert_eq!(e.kind(), io::ErrorKind::Interrupted, "sem_wait: {e}");
        }
    }

    /// Returns one permit.
    #[inline]
    pub fn post(&self) {
        // SAFETY: as in `wait`, `self.sem` is a live sem_open handle.
        let rc = unsafe { libc::sem_post(self.sem) };
        assert_eq!(rc, 0, "sem_post: {}", io::Error::last_os_error());
    }
}

impl Drop for PosixNamedSem {
    fn drop(&mut self) {
        // SAFETY: `self.sem` came from a successful sem_open and is closed
        // exactly once, here.
        unsafe { libc::sem_close(self.sem) };
    }
}

// ---------------------------------------------------------------------------
// System V semaphore with SEM_UNDO
// ---------------------------------------------------------------------------

/// A private one-semaphore System V set; every operation uses `SEM_UNDO`
/// (the kernel returns the permits of a process that dies). Removed with
/// `IPC_RMID` on drop.
pub struct SysvSemUndo {
    id: libc::c_int,
}

impl SysvSemUndo {
    /// Creates a private set whose single semaphore holds `value` permits.
    pub fn new(value: i32) -> io::Result<Self> {
        // SAFETY: plain syscall wrapper with integer arguments.
        let id = unsafe { libc::semget(libc::IPC_PRIVATE, 1, libc::IPC_CREAT | 0o600) };
        check(id, "semget")?;
        let this = SysvSemUndo { id };
        // SAFETY: SETVAL reads `union semun.val`; on the supported Linux ABIs
        // a variadic `int` is passed in the same slot the union would use and
        // `val` is its first member.
        check(
            unsafe { libc::semctl(id, 0, libc::SETVAL, value as libc::c_int) },
            "semctl(SETVAL)",
        )?;
        Ok(this)
    }

    #[inline]
    fn op(&self, delta: libc::c_short) {
        let mut buf = libc::sembuf {
            sem_num: 0,
            sem_op: delta,
            sem_flg: libc::SEM_UNDO as libc::c_short,
        };
        loop {
            // SAFETY: `buf` is a valid, exclusively borrowed array of one
            // sembuf for the duration of the call.
            if unsafe { libc::semop(self.id, &mut buf, 1) } == 0 {
                return;
            }
            let e = io::Error::last_os_error();
            assert_eq!(e.kind(), io::ErrorKind::Interrupted, "semop: {e}");
        }
    }

    /// Takes one permit (`semop -1, SEM_UNDO`), blocking.
    #[inline]
    pub fn acquire(&self) {
        self.op(-1);
    }

    /// Returns one permit (`semop +1, SEM_UNDO`).
    #[inline]
    pub fn release(&self) {
        self.op(1);
    }
}

impl Drop for SysvSemUndo {
    fn drop(&mut self) {
        // SAFETY: integer-only syscall on the id we created; IPC_RMID ignores
        // the variadic argument.
        unsafe { libc::semctl(self.id, 0, libc::IPC_RMID) };
    }
}

// ---------------------------------------------------------------------------
// flock on a tmpfs file
// ---------------------------------------------------------------------------

/// An exclusive `flock` on a fresh file under `/dev/shm` (tmpfs; falls back
/// to the temp dir). The file is removed on drop.
pub struct FlockFile {
    file: File,
    path: PathBuf,
}

impl FlockFile {
    /// Creates the lock file.
    pub fn new() -> io::Result<Self> {
        let dir = PathBuf::from("/dev/shm");
        let dir = if dir.is_dir() {
            dir
        } else {
            std::env::temp_dir()
        };
        let path = dir.join(format!("shmsched-bench-{}.lock", unique_suffix()));
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        Ok(FlockFile { file, path })
    }

    #[inline]
    fn flock(&self, op: libc::c_int) {
        loop {
            // SAFETY: the fd is owned by `self.file` and open for the whole
            // borrow of `self`.
            if unsafe { libc::flock(self.file.as_raw_fd(), op) } == 0 {
                return;
            }
            let e = io::Error::last_os_error();
            assert_eq!(e.kind(), io::ErrorKind::Interrupted, "flock: {e}");
        }
    }

    /// `flock(LOCK_EX)`, blocking.
    #[inline]
    pub fn lock(&self) {
        self.flock(libc::LOCK_EX);
    }

    /// `flock(LOCK_UN)`.
    #[inline]
    pub fn unlock(&self) {
        self.flock(libc::LOCK_UN);
    }
}

impl Drop for FlockFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

// ---------------------------------------------------------------------------
// Process-shared anonymous memory and unnamed semaphores in it
// ---------------------------------------------------------------------------

/// Two unnamed, process-shared (`pshared = 1`) POSIX semaphores living in a
/// `MAP_SHARED | MAP_ANONYMOUS` page, so they stay shared with forked
/// children. Destroyed and unmapped on drop.
pub struct SharedSemPair {
    base: *mut libc::sem_t,
}

impl SharedSemPair {
    /// Maps the page and initialises both semaphores to 0.
    pub fn new() -> io::Result<Self> {
        let len = 2 * std::mem::size_of::<libc::sem_t>();
        // SAFETY: anonymous shared mapping, no fd, kernel chooses the address.
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
        if p == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("mmap: {e}")));
        }
        let base = p.cast::<libc::sem_t>();
        for i in 0..2 {
            // SAFETY: the mapping is page-aligned and at least `len` bytes, so
            // `base.add(i)` for i < 2 is a valid, aligned sem_t slot.
            check(unsafe { libc::sem_init(base.add(i), 1, 0) }, "sem_init")?;
        }
        Ok(SharedSemPair { base })
    }

    fn sem(&self, i: usize) -> *mut libc::sem_t {
        assert!(i < 2);
        // SAFETY: i < 2, inside the mapping created in `new`.
        unsafe { self.base.add(i) }
    }

    /// `sem_post` on semaphore `i` (0 or 1).
    #[inline]
    pub fn post(&self, i: usize) {
        // SAFETY: `self.sem(i)` is an initialised process-shared semaphore in
        // a mapping that lives as long as `self`.
        let rc = unsafe { libc::sem_post(self.sem(i)) };
        assert_eq!(rc, 0, "sem_post: {}", io::Error::last_os_error());
    }

    /// `sem_wait` on semaphore `i` (0 or 1), retrying on `EINTR`.
    #[inline]
    pub fn wait(&self, i: usize) {
        loop {
            // SAFETY: as in `post`.
            if unsafe { libc::sem_wait(self.sem(i)) } == 0 {
                return;
            }
            let e = io::Error::last_os_error();
            assert_eq!(e.kind(), io::ErrorKind::Interrupted, "sem_wait: {e}");
        }
    }
}

impl Drop for SharedSemPair {
    fn drop(&mut self) {
        for i in 0..2 {
            // SAFETY: both semaphores were initialised in `new`; any forked
            // partner using them is killed first (`Partner` declares its
            // `child` field before the primitive, so the child drops first).
            unsafe { libc::sem_destroy(self.sem(i)) };
        }
        // SAFETY: unmaps exactly the region mapped in `new`.
        unsafe { libc::munmap(self.base.cast(), 2 * std::mem::size_of::<libc::sem_t>()) };
    }
}

// ---------------------------------------------------------------------------
// Forked ping-pong partner
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// CPU placement for the cross-process rows
// ---------------------------------------------------------------------------

/// The calling thread's CPU affinity mask.
fn affinity() -> io::Result<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is a plain bit array; all-zero is a valid value.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid out-buffer of the size passed; pid 0 = self.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    check(rc, "sched_getaffinity")?;
    Ok(set)
}

fn set_affinity(set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 = self.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) };
    check(rc, "sched_setaffinity")
}

fn only_cpu(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: all-zero is a valid empty cpu_set_t.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    assert!(cpu < libc::CPU_SETSIZE as usize);
    // SAFETY: `cpu` is within the bit array (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    set
}

/// Where the two sides of a handoff row run. Unpinned, the Linux scheduler
/// sometimes co-locates the pair (handoff ~1 us here) and sometimes not
/// (~30 us on a 2-vCPU VM, where a cross-CPU wakeup is an IPI plus an idle
/// exit), so rows of one run could land in different modes and their ratio
/// would be meaningless. Pinning makes the mode explicit and equal for all
/// rows: by default parent and partner are on two different CPUs (a waiter
/// idling on another core, the realistic case); `SHMSCHED_BENCH_SAME_CPU=1`
/// puts both on one CPU.
pub struct Placement {
    saved: libc::cpu_set_t,
    /// CPU for the parent (the measuring side).
    pub parent_cpu: Option<usize>,
    /// CPU for the forked partner.
    pub child_cpu: Option<usize>,
}

impl Placement {
    /// Picks CPUs from the allowed set and pins the calling thread; the
    /// original mask is restored on drop. With a single allowed CPU nothing
    /// is pinned.
    pub fn pin_parent() -> io::Result<Self> {
        let saved = affinity()?;
        let allowed: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            // SAFETY: CPU_ISSET only reads the bit array.
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &saved) })
            .collect();
        let same = std::env::var_os("SHMSCHED_BENCH_SAME_CPU").is_some_and(|v| v == "1");
        let (parent_cpu, child_cpu) = match allowed.as_slice() {
            [] | [_] => (None, None),
            [a, ..] if same => (Some(*a), Some(*a)),
            [a, b, ..] => (Some(*a), Some(*b)),
        };
        if let Some(cpu) = parent_cpu {
            set_affinity(&only_cpu(cpu))?;
        }
        Ok(Placement {
            saved,
            parent_cpu,
            child_cpu,
        })
    }

    /// Short label for logs.
    pub fn describe(&self) -> String {
        match (self.parent_cpu, self.child_cpu) {
            (Some(p), Some(c)) if p == c => format!("both on cpu {p}"),
            (Some(p), Some(c)) => format!("parent on cpu {p}, partner on cpu {c}"),
            _ => "unpinned".to_string(),
        }
    }
}

impl Drop for Placement {
    fn drop(&mut self) {
        let _ = set_affinity(&self.saved);
    }
}

/// Number of threads of the current process, from `/proc/self/task`.
fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// A forked child that runs `child_loop` forever (it is only ever ended by
/// `SIGKILL`). Dropping the handle kills and reaps the child.
///
/// The child is tied to the parent with `PR_SET_PDEATHSIG = SIGKILL`, so it
/// cannot outlive a crashed or timed-out parent.
pub struct Child {
    pid: libc::pid_t,
}

impl Child {
    /// Forks; the child runs `child_loop` and `_exit`s if it ever returns.
    ///
    /// `child_loop` must only do simple work: blocking syscalls on objects
    /// created before the fork. The bench process is single-threaded when it
    /// forks (criterion is built without its rayon/plotting features); this
    /// is checked, so the child's heap and locks are in a consistent state.
    pub fn spawn(child_cpu: Option<usize>, child_loop: impl FnOnce()) -> io::Result<Self> {
        let child_set = child_cpu.map(only_cpu);
        let threads = thread_count();
        assert!(
            threads <= 1,
            "refusing to fork a bench partner from a process with {threads} threads"
        );
        // SAFETY: trivially safe call.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the process is single-threaded (checked above), so the child
        // starts with a consistent copy of the address space.
        let pid = unsafe { libc::fork() };
        if pid == -1 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: prctl with integer arguments only; getppid is always
            // safe. If the parent is already gone, exit at once.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != parent {
                    libc::_exit(0);
                }
            }
            if let Some(set) = &child_set {
                // A failed pin would silently change what is measured.
                if set_affinity(set).is_err() {
                    // SAFETY: as below.
                    unsafe { libc::_exit(102) };
                }
            }
            child_loop();
            // SAFETY: _exit skips atexit handlers and stdio flushing that
            // belong to the parent's copy of the state.
            unsafe { libc::_exit(0) };
        }
        Ok(Child { pid })
    }

    /// Panics if the child has exited (it never should on its own).
    pub fn assert_alive(&self) {
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer; WNOHANG never blocks.
        let rc = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
        assert_eq!(rc, 0, "bench partner {} exited (status {status})", self.pid);
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // SAFETY: `self.pid` is our own unreaped child, so the pid cannot have
        // been recycled for another process.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        let mut status = 0;
        loop {
            // SAFETY: valid out-pointer; reaps exactly our child.
            let rc = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if rc != -1 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                break;
            }
        }
    }
}

/// Runs `batch` with a process-wide `alarm` watchdog armed, so a blocked
/// cross-process handoff cannot hang the bench (see [`BATCH_WATCHDOG_SECS`]).
pub fn with_watchdog<T>(batch: impl FnOnce() -> T) -> T {
    // SAFETY: alarm only (re)arms this process's SIGALRM timer; SIGALRM keeps
    // its default disposition (terminate).
    unsafe { libc::alarm(BATCH_WATCHDOG_SECS) };
    let out = batch();
    // SAFETY: as above; 0 cancels the timer.
    unsafe { libc::alarm(0) };
    out
}

/// Times `rounds` round trips of `round_trip` and converts the result into
/// the time criterion expects for `iters` one-way handoffs.
///
/// A round trip is two one-way handoffs, so `ceil(iters / 2)` round trips
/// are run and the per-handoff time is scaled back to `iters`.
pub fn time_handoffs(iters: u64, mut round_trip: impl FnMut()) -> Duration {
    let rounds = iters.div_ceil(2).max(1);
    let elapsed = with_watchdog(|| {
        let start = Instant::now();
        for _ in 0..rounds {
            round_trip();
        }
        start.elapsed()
    });
    elapsed.mul_f64(iters as f64 / (2 * rounds) as f64)
}
