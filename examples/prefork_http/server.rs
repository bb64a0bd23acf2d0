//! The server: a master that binds one socket, creates the shared state and
//! forks workers; workers that accept, parse HTTP/1.1 with `httparse`, take
//! a slot per request and record its wait; the master's summary.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shmsched::region::Region;
use shmsched::scheduler::Scheduler;
use shmsched::Priority;

use super::{Args, Gate};

/// The served paths and their priorities.
pub const PATHS: [&str; 3] = ["/high", "/normal", "/low"];
const PRIORITIES: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

/// Longest accepted request head, and body.
const MAX_HEAD: usize = 16 << 10;
const MAX_BODY: u64 = 1 << 20;

/// How long a stopping worker waits for its requests to leave the gate
/// before it exits anyway (a backend call is milliseconds).
const DRAIN_BOUND: Duration = Duration::from_secs(5);

/// How often the master samples the running count.
const SAMPLE_EVERY: Duration = Duration::from_micros(200);

// ---------------------------------------------------------------------------
// Small OS helpers
// ---------------------------------------------------------------------------

fn os_err(what: &str) -> String {
    format!("{what}: {}", io::Error::last_os_error())
}

/// A pipe (both ends `O_CLOEXEC`): (read, write).
fn pipe() -> Result<(OwnedFd, OwnedFd), String> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(os_err("pipe2"));
    }
    // SAFETY: pipe2 succeeded: both fds are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Threads of this process (from /proc), to check that a fork is safe.
fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// Sends `sig` to `pid` (ignoring a process already gone).
pub fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: plain syscall on a child pid of ours.
    unsafe { libc::kill(pid, sig) };
}

/// Waits for child `pid` until `deadline`, then SIGKILLs it and reaps it.
/// Returns the wait status (None if it had to be killed).
fn reap_pid(pid: i32, deadline: Instant) -> Option<i32> {
    loop {
        let mut status = 0;
        // SAFETY: waiting for our own child, with a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Some(status);
        }
        if r < 0 {
            return None; // not our child any more (already reaped)
        }
        if Instant::now() >= deadline {
            signal(pid, libc::SIGKILL);
            // SAFETY: as above; SIGKILL cannot be ignored, so this returns.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

// ---------------------------------------------------------------------------
// Shared memory: the POSIX semaphore and the running counters
// ---------------------------------------------------------------------------

/// State shared by the master and its workers, in one anonymous
/// `MAP_SHARED` page mapped before forking (never unmapped: it lives as long
/// as the processes, and vanishes with them; nothing has a name).
#[repr(C)]
struct Shared {
    /// The semaphore of `--gate sem` (initialised for both gates).
    sem: libc::sem_t,
    /// Requests between their grant and their release, counted by the
    /// requests themselves (never more than the slots really held).
    running: AtomicU32,
    /// The highest `running` seen by any request right after its grant.
    max_running: AtomicU32,
}

impl Shared {
    /// Maps and initialises the page; `cap` permits in the semaphore.
    fn map(cap: u32) -> Result<&'static Shared, String> {
        let len = std::mem::size_of::<Shared>();
        // SAFETY: a fresh anonymous shared mapping; no existing memory is
        // affected.
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
            return Err(os_err("mmap"));
        }
        let s = p.cast::<Shared>();
        // SAFETY: `s` points to `len` zeroed, writable bytes, suitably
        // aligned (page-aligned); zeroed atomics are valid zeros, and
        // sem_init initialises the semaphore in place with pshared = 1.
        unsafe {
            if libc::sem_init(std::ptr::addr_of_mut!((*s).sem), 1, cap) != 0 {
                return Err(os_err("sem_init"));
            }
            Ok(&*s)
        }
    }

    fn sem_ptr(&self) -> *mut libc::sem_t {
        std::ptr::addr_of!(self.sem).cast_mut()
    }

    /// `sem_wait`, retried on EINTR.
    fn sem_wait(&self) {
        // SAFETY: the semaphore was initialised by `map` and is never
        // destroyed; sem_wait is thread- and process-safe on a shared one.
        while unsafe { libc::sem_wait(self.sem_ptr()) } != 0 {
            let e = io::Error::last_os_error();
            assert_eq!(e.kind(), io::ErrorKind::Interrupted, "sem_wait: {e}");
        }
    }

    fn sem_post(&self) {
        // SAFETY: as in `sem_wait`.
        let rc = unsafe { libc::sem_post(self.sem_ptr()) };
        assert_eq!(rc, 0, "sem_post: {}", io::Error::last_os_error());
    }

    /// Permits taken right now (`cap` minus the semaphore's value).
    fn sem_taken(&self, cap: u32) -> u32 {
        let mut v: libc::c_int = 0;
        // SAFETY: as in `sem_wait`; `v` is a valid out pointer.
        unsafe { libc::sem_getvalue(self.sem_ptr(), &mut v) };
        cap.saturating_sub(v.max(0) as u32)
    }
}

// ---------------------------------------------------------------------------
// Wait statistics
// ---------------------------------------------------------------------------

/// Waits from arrival to slot granted, in milliseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WaitStats {
    /// Requests granted a slot.
    pub n: u64,
    /// Requests still waiting at the end (their wait so far is included in
    /// the percentiles and the max).
    pub waiting_at_stop: u64,
    /// Median wait.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Longest wait.
    pub max_ms: f64,
}

/// Nearest-rank percentile of sorted microseconds, in ms.
fn pct_ms(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64 / 1000.0
}

impl WaitStats {
    fn of(granted: &[u64], waiting: &[u64]) -> WaitStats {
        let mut all: Vec<u64> = granted.iter().chain(waiting).copied().collect();
        all.sort_unstable();
        WaitStats {
            n: granted.len() as u64,
            waiting_at_stop: waiting.len() as u64,
            p50_ms: pct_ms(&all, 0.50),
            p99_ms: pct_ms(&all, 0.99),
            max_ms: pct_ms(&all, 1.0),
        }
    }
}

/// One path's waits.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PathRow {
    /// `/high`, `/normal` or `/low`.
    pub path: String,
    /// Its waits.
    pub wait: WaitStats,
}

/// One worker's waits.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerRow {
    /// Worker number, 0-based.
    pub worker: u32,
    /// Its process id.
    pub pid: i32,
    /// False if the worker died or did not report (its requests are lost).
    pub reported: bool,
    /// Connections it accepted.
    pub connections: u64,
    /// Most slots it held at once.
    pub max_held: u32,
    /// Most of its requests waiting for a slot at once.
    pub max_waiting: u32,
    /// Waits of all its requests.
    pub wait: WaitStats,
    /// Per path.
    pub paths: Vec<PathRow>,
}

/// The server's summary (one JSON line on stdout at the end).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// The gate.
    pub gate: Gate,
    /// Worker processes.
    pub workers: u32,
    /// The shared cap.
    pub cap: u32,
    /// The simulated backend call.
    pub backend_ms: f64,
    /// From all workers ready to stop.
    pub elapsed_s: f64,
    /// Requests granted a slot (and answered), all paths.
    pub served: u64,
    /// Malformed requests, unknown paths and failed acquires.
    pub other_requests: u64,
    /// Highest running count sampled by the master every 200 µs
    /// (`global_running()`, or cap minus the semaphore's value).
    pub max_running_sampled: u32,
    /// Highest running count seen by a request right after its grant.
    pub max_running_counted: u32,
    /// Slots still held after every worker exited and a reap (shmsched).
    pub leaked: Option<u32>,
    /// Requests that still held a slot (or waited in the gate) when their
    /// worker gave up draining and exited (see "Stopping" in `worker_run`):
    /// 0 unless a backend call outlived the drain bound. Each one would
    /// leave `max_running_counted` one too high from then on (its
    /// decrement never runs, while the region reclaims its slot).
    pub exited_in_gate: u32,
    /// Waits per path, all workers.
    pub paths: Vec<PathRow>,
    /// Waits per worker.
    pub per_worker: Vec<WorkerRow>,
}

impl Summary {
    /// The highest running count observed either way.
    pub fn max_running(&self) -> u32 {
        self.max_running_sampled.max(self.max_running_counted)
    }

    /// The row of `path`.
    pub fn path(&self, path: &str) -> Option<&WaitStats> {
        self.paths.iter().find(|r| r.path == path).map(|r| &r.wait)
    }
}

/// What a worker sends its master at the end.
#[derive(Debug, Default, Serialize, Deserialize)]
struct WorkerReport {
    connections: u64,
    other_requests: u64,
    max_held: u32,
    /// Requests still in the gate when the drain gave up (see `Summary`).
    exited_in_gate: u32,
    max_waiting: u32,
    /// Per path: waits of granted requests, µs.
    waits_us: [Vec<u64>; 3],
    /// Per path: waits so far of requests still waiting, µs.
    waiting_us: [Vec<u64>; 3],
}

// ---------------------------------------------------------------------------
// The worker
// ---------------------------------------------------------------------------

enum WorkerGate {
    Sched(Scheduler),
    Sem,
}

#[derive(Default)]
struct Samples {
    waits_us: [Vec<u64>; 3],
    /// Requests waiting now: id → (path, arrival).
    waiting: HashMap<u64, (usize, Instant)>,
    max_waiting: u32,
    next_id: u64,
}

struct Ctx {
    gate: WorkerGate,
    shared: &'static Shared,
    backend: Duration,
    accept_pause: Duration,
    samples: Mutex<Samples>,
    connections: AtomicU64,
    other_requests: AtomicU64,
    /// Slots this worker holds now, and the most it held at once.
    held: AtomicU32,
    max_held: AtomicU32,
    /// Set when the worker stops: no request enters the gate any more.
    stopping: AtomicBool,
    /// Requests between their entry into the gate (before the acquire)
    /// and the end of their slot's hold; the stop drains it to 0.
    in_gate: AtomicU32,
}

impl Ctx {
    fn samples(&self) -> std::sync::MutexGuard<'_, Samples> {
        self.samples.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a slot for `path` (arrived at `arrival`), runs the backend
    /// call, releases; returns the wait.
    fn handle(&self, path: usize, arrival: Instant) -> Result<Duration, String> {
        // Counted in the gate before the stop flag is read: a stop that
        // sets the flag and then sees `in_gate` at 0 has no request left
        // between acquire and release (see "Stopping" in `worker_run`).
        self.in_gate.fetch_add(1, Ordering::SeqCst);
        let r = if self.stopping.load(Ordering::SeqCst) {
            Err("the server is stopping".to_string())
        } else {
            self.gated(path, arrival)
        };
        self.in_gate.fetch_sub(1, Ordering::SeqCst);
        r
    }

    fn gated(&self, path: usize, arrival: Instant) -> Result<Duration, String> {
        let id = {
            let mut s = self.samples();
            s.next_id += 1;
            let id = s.next_id;
            s.waiting.insert(id, (path, arrival));
            s.max_waiting = s.max_waiting.max(s.waiting.len() as u32);
            id
        };
        let r = match &self.gate {
            WorkerGate::Sched(sched) => match sched.acquire(PRIORITIES[path]) {
                Ok(_permit) => Ok(self.backend_call(id, path, arrival)),
                Err(e) => Err(e.to_string()),
            },
            WorkerGate::Sem => {
                self.shared.sem_wait();
                let wait = self.backend_call(id, path, arrival);
                self.shared.sem_post();
                Ok(wait)
            }
        };
        if r.is_err() {
            self.samples().waiting.remove(&id);
        }
        r
    }

    /// Runs with the slot held: records the wait, counts the running
    /// requests, sleeps for the backend call.
    fn backend_call(&self, id: u64, path: usize, arrival: Instant) -> Duration {
        let wait = arrival.elapsed();
        {
            let mut s = self.samples();
            s.waiting.remove(&id);
            s.waits_us[path].push(wait.as_micros() as u64);
        }
        let now = self.shared.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.shared.max_running.fetch_max(now, Ordering::SeqCst);
        let here = self.held.fetch_add(1, Ordering::Relaxed) + 1;
        self.max_held.fetch_max(here, Ordering::Relaxed);
        std::thread::sleep(self.backend);
        self.held.fetch_sub(1, Ordering::Relaxed);
        self.shared.running.fetch_sub(1, Ordering::SeqCst);
        wait
    }

    fn report(&self) -> WorkerReport {
        let s = self.samples();
        let mut waiting_us: [Vec<u64>; 3] = Default::default();
        for (path, arrival) in s.waiting.values() {
            waiting_us[*path].push(arrival.elapsed().as_micros() as u64);
        }
        WorkerReport {
            connections: self.connections.load(Ordering::Relaxed),
            other_requests: self.other_requests.load(Ordering::Relaxed),
            max_held: self.max_held.load(Ordering::Relaxed),
            exited_in_gate: 0,
            max_waiting: s.max_waiting,
            waits_us: s.waits_us.clone(),
            waiting_us,
        }
    }
}

/// A parsed request head, owned.
struct Head {
    len: usize,
    method: String,
    path: String,
    keep_alive: bool,
    content_length: u64,
    chunked: bool,
}

enum Parse {
    Done(Head),
    Partial,
    Bad(u16, &'static str),
}

fn parse_head(buf: &[u8]) -> Parse {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parse::Partial,
        Err(httparse::Error::TooManyHeaders) => {
            return Parse::Bad(431, "Request Header Fields Too Large")
        }
        Err(_) => return Parse::Bad(400, "Bad Request"),
    };
    let http11 = req.version == Some(1);
    let mut keep_alive = http11;
    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    for h in req.headers.iter() {
        let value = String::from_utf8_lossy(h.value);
        if h.name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                if token.eq_ignore_ascii_case("close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case("keep-alive") {
                    keep_alive = true;
                }
            }
        } else if h.name.eq_ignore_ascii_case("content-length") {
            match value.trim().parse::<u64>() {
                Ok(n) if content_length.is_none_or(|c| c == n) => content_length = Some(n),
                _ => return Parse::Bad(400, "Bad Request"),
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = true;
        }
    }
    let target = req.path.unwrap_or("/");
    Parse::Done(Head {
        len,
        method: req.method.unwrap_or("").to_string(),
        path: target.split('?').next().unwrap_or("").to_string(),
        keep_alive,
        content_length: content_length.unwrap_or(0),
        chunked,
    })
}

fn respond(
    stream: &mut TcpStream,
    code: u16,
    reason: &str,
    body: &str,
    head_only: bool,
    close: bool,
) -> io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n",
        body.len()
    );
    if code == 405 {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str(if close {
        "Connection: close\r\n\r\n"
    } else {
        "Connection: keep-alive\r\n\r\n"
    });
    if !head_only {
        out.push_str(body);
    }
    stream.write_all(out.as_bytes())
}

/// Serves one keep-alive connection until the peer closes it or an error.
fn serve_conn(ctx: &Ctx, mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut buf = vec![0u8; 4096];
    let mut len = 0usize;
    loop {
        let head = match parse_head(&buf[..len]) {
            Parse::Done(h) => h,
            Parse::Bad(code, reason) => {
                ctx.other_requests.fetch_add(1, Ordering::Relaxed);
                let _ = respond(&mut stream, code, reason, "", false, true);
                return;
            }
            Parse::Partial => {
                if len == buf.len() {
                    if len >= MAX_HEAD {
                        ctx.other_requests.fetch_add(1, Ordering::Relaxed);
                        let _ = respond(
                            &mut stream,
                            431,
                            "Request Header Fields Too Large",
                            "",
                            false,
                            true,
                        );
                        return;
                    }
                    buf.resize(len * 2, 0);
                }
                match stream.read(&mut buf[len..]) {
                    Ok(0) => return,
                    Ok(n) => len += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return,
                }
                continue;
            }
        };
        if head.chunked {
            ctx.other_requests.fetch_add(1, Ordering::Relaxed);
            let _ = respond(&mut stream, 501, "Not Implemented", "", false, true);
            return;
        }
        if head.content_length > MAX_BODY {
            ctx.other_requests.fetch_add(1, Ordering::Relaxed);
            let _ = respond(&mut stream, 413, "Content Too Large", "", false, true);
            return;
        }
        // Consume the body (requests here have none; discard one if sent).
        let in_buf = (len - head.len).min(head.content_length as usize);
        let mut rest = head.content_length - in_buf as u64;
        let consumed = head.len + in_buf;
        buf.copy_within(consumed..len, 0);
        len -= consumed;
        while rest > 0 {
            let mut sink = [0u8; 4096];
            let want = rest.min(sink.len() as u64) as usize;
            match stream.read(&mut sink[..want]) {
                Ok(0) => return,
                Ok(n) => rest -= n as u64,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
        let arrival = Instant::now();
        let head_only = head.method == "HEAD";
        let close = !head.keep_alive;
        let sent = if head.method != "GET" && !head_only {
            ctx.other_requests.fetch_add(1, Ordering::Relaxed);
            respond(&mut stream, 405, "Method Not Allowed", "", false, close)
        } else if let Some(path) = PATHS.iter().position(|p| *p == head.path) {
            match ctx.handle(path, arrival) {
                Ok(wait) => {
                    let body = format!(
                        "{} ok: waited {} us for a slot\n",
                        PATHS[path],
                        wait.as_micros()
                    );
                    respond(&mut stream, 200, "OK", &body, head_only, close)
                }
                Err(e) => {
                    ctx.other_requests.fetch_add(1, Ordering::Relaxed);
                    let body = format!("no slot: {e}\n");
                    respond(
                        &mut stream,
                        503,
                        "Service Unavailable",
                        &body,
                        head_only,
                        true,
                    )
                    .and(Err(io::ErrorKind::Other.into()))
                }
            }
        } else {
            ctx.other_requests.fetch_add(1, Ordering::Relaxed);
            respond(
                &mut stream,
                404,
                "Not Found",
                "try /high, /normal or /low\n",
                head_only,
                close,
            )
        };
        if sent.is_err() || close {
            return;
        }
    }
}

fn accept_loop(listener: TcpListener, ctx: Arc<Ctx>) {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                ctx.connections.fetch_add(1, Ordering::Relaxed);
                let c = ctx.clone();
                let spawned = std::thread::Builder::new()
                    .name("conn".into())
                    .stack_size(256 << 10)
                    .spawn(move || serve_conn(&c, stream));
                // A short pause before the next accept, so that a burst of
                // connects spreads over the workers (like a prefork server
                // that accepts one connection per process at a time) rather
                // than going to whichever worker happens to be running.
                std::thread::sleep(if spawned.is_ok() {
                    ctx.accept_pause
                } else {
                    Duration::from_millis(10)
                });
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => std::thread::sleep(Duration::from_millis(10)), // EMFILE, ECONNABORTED, …
        }
    }
}

/// Fds a worker gets from its master.
struct WorkerFds {
    /// Read end of the stop pipe: EOF means stop (also when the master dies).
    stop: RawFd,
    /// Write end of this worker's result pipe.
    result: RawFd,
    /// Fds of the master this worker must close (the stop pipe's write
    /// end, so that EOF can happen).
    close: Vec<RawFd>,
}

/// A forked worker: never returns.
fn worker_main(
    region: &Region,
    shared: &'static Shared,
    listener: &TcpListener,
    a: &Args,
    fds: WorkerFds,
    master: i32,
) -> ! {
    // SAFETY: plain syscalls in the freshly forked, single-threaded child:
    // die with the master; SIGINT (a Ctrl-C to the process group) is for
    // the master, which stops the workers in order; SIGTERM kills.
    unsafe {
        for fd in &fds.close {
            libc::close(*fd);
        }
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() != master {
            libc::_exit(1);
        }
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
    }
    let code = match worker_run(region, shared, listener, a, &fds) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("prefork_http worker {}: {e}", std::process::id());
            1
        }
    };
    // Connection threads may still hold slots: the master reaps them.
    std::process::exit(code)
}

fn worker_run(
    region: &Region,
    shared: &'static Shared,
    listener: &TcpListener,
    a: &Args,
    fds: &WorkerFds,
) -> Result<(), String> {
    let gate = match a.gate {
        // Each worker makes its own handle from the inherited region.
        Gate::Shmsched => WorkerGate::Sched(
            Scheduler::shared(region, a.cap).map_err(|e| format!("Scheduler::shared: {e}"))?,
        ),
        Gate::Sem => WorkerGate::Sem,
    };
    let ctx = Arc::new(Ctx {
        gate,
        shared,
        backend: Duration::from_secs_f64(a.backend_ms / 1000.0),
        accept_pause: Duration::from_secs_f64(a.accept_pause_ms / 1000.0),
        samples: Mutex::new(Samples::default()),
        connections: AtomicU64::new(0),
        other_requests: AtomicU64::new(0),
        held: AtomicU32::new(0),
        max_held: AtomicU32::new(0),
        stopping: AtomicBool::new(false),
        in_gate: AtomicU32::new(0),
    });
    let l = listener
        .try_clone()
        .map_err(|e| format!("dup listener: {e}"))?;
    {
        let ctx = ctx.clone();
        std::thread::Builder::new()
            .name("accept".into())
            .spawn(move || accept_loop(l, ctx))
            .map_err(|e| format!("spawn accept thread: {e}"))?;
    }
    // SAFETY: the master handed these fds to this process alone; each is
    // wrapped once.
    let (mut result, mut stop) =
        unsafe { (File::from_raw_fd(fds.result), File::from_raw_fd(fds.stop)) };
    result
        .write_all(b"ready\n")
        .map_err(|e| format!("write ready: {e}"))?;
    let mut b = [0u8; 16];
    loop {
        match stop.read(&mut b) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    // Stopping. The report is the state at the stop (requests still
    // waiting count with their wait so far). Then the worker drains before
    // it exits: a process that exits while its threads hold slots has
    // them reclaimed by the region (they are a dead process's), but each
    // of those requests already counted itself in `Shared::running` and its
    // decrement never runs, so the counter would read too high for every
    // later grant in the workers still running (seen in a CI run: "sampled
    // 4, counted 6", two requests of an exited worker). So: no request
    // enters the gate any more, the queued acquires of this worker's handle
    // fail (`dispose`), and the worker waits (bounded) until every request
    // in the gate has released its slot. A semaphore wait cannot be
    // cancelled: those drain as the holders release.
    ctx.stopping.store(true, Ordering::SeqCst);
    let mut report = ctx.report();
    if let WorkerGate::Sched(sched) = &ctx.gate {
        sched.dispose();
    }
    let drain_by = Instant::now() + DRAIN_BOUND;
    while ctx.in_gate.load(Ordering::SeqCst) > 0 && Instant::now() < drain_by {
        std::thread::sleep(Duration::from_millis(1));
    }
    report.exited_in_gate = ctx.in_gate.load(Ordering::SeqCst);
    let mut line = serde_json::to_vec(&report).map_err(|e| e.to_string())?;
    line.push(b'\n');
    result
        .write_all(&line)
        .map_err(|e| format!("write report: {e}"))?;
    Ok(())
}

// ---------------------------------------------------------------------------
// The master
// ---------------------------------------------------------------------------

/// Forked workers, SIGKILLed and reaped if still there when dropped.
struct Kids(Vec<i32>);

impl Drop for Kids {
    fn drop(&mut self) {
        for &pid in &self.0 {
            signal(pid, libc::SIGKILL);
        }
        for &pid in &self.0 {
            reap_pid(pid, Instant::now());
        }
    }
}

enum FromWorker {
    Ready,
    Report(Box<WorkerReport>),
    Eof,
}

pub fn serve(a: &Args) -> Result<(), String> {
    let machine = a.serve;
    let listener = TcpListener::bind((a.host.as_str(), a.port))
        .map_err(|e| format!("bind {}:{}: {e}", a.host, a.port))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    // The shared state, created before forking.
    let region = Region::anonymous().map_err(|e| format!("Region::anonymous: {e}"))?;
    let sched = match a.gate {
        Gate::Shmsched => {
            Some(Scheduler::shared(&region, a.cap).map_err(|e| format!("Scheduler::shared: {e}"))?)
        }
        Gate::Sem => None,
    };
    let shared = Shared::map(a.cap)?;
    let stop_flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop_flag.clone()).map_err(|e| e.to_string())?;
    }
    let threads = thread_count();
    if threads != 1 {
        return Err(format!(
            "the master runs {threads} threads before forking; it must run one"
        ));
    }

    let (stop_r, stop_w) = pipe()?;
    let master = std::process::id() as i32;
    let mut kids = Kids(Vec::new());
    let mut results = Vec::new();
    for _ in 0..a.workers {
        let (res_r, res_w) = pipe()?;
        // SAFETY: the master is single-threaded here (checked above), so
        // the child is a consistent copy; it runs `worker_main`, which
        // never returns into the master's code.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(os_err("fork"));
        }
        if pid == 0 {
            let fds = WorkerFds {
                stop: stop_r.as_raw_fd(),
                result: res_w.as_raw_fd(),
                close: vec![stop_w.as_raw_fd(), res_r.as_raw_fd()],
            };
            worker_main(&region, shared, &listener, a, fds, master);
        }
        kids.0.push(pid);
        drop(res_w);
        results.push(res_r);
    }
    drop(stop_r);

    // One reader thread per worker.
    let (tx, rx) = mpsc::channel::<(usize, FromWorker)>();
    for (i, fd) in results.into_iter().enumerate() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(File::from(fd)).lines();
            while let Some(Ok(line)) = lines.next() {
                let msg = if line == "ready" {
                    FromWorker::Ready
                } else {
                    match serde_json::from_str::<WorkerReport>(&line) {
                        Ok(r) => FromWorker::Report(Box::new(r)),
                        Err(_) => continue,
                    }
                };
                if tx.send((i, msg)).is_err() {
                    return;
                }
            }
            let _ = tx.send((i, FromWorker::Eof));
        });
    }
    drop(tx);
    let n = a.workers as usize;
    let mut ready = 0;
    let until = Instant::now() + Duration::from_secs(30);
    while ready < n {
        let left = until.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((_, FromWorker::Ready)) => ready += 1,
            Ok((i, _)) => return Err(format!("worker {i} exited before it was ready")),
            Err(_) => return Err(format!("only {ready} of {n} workers ready after 30 s")),
        }
    }

    let started = Instant::now();
    if machine {
        println!("{}", serde_json::json!({ "listening": addr.to_string() }));
    } else {
        eprintln!(
            "prefork_http: {n} workers on http://{addr}/{{high,normal,low}}, gate {}, cap {}, \
             backend {} ms; {}",
            a.gate.name(),
            a.cap,
            a.backend_ms,
            match a.seconds {
                Some(s) => format!("stopping after {s} s"),
                None => "Ctrl-C to stop".into(),
            }
        );
    }
    let _ = io::stdout().flush();

    // The sampler.
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (sched, sampling, cap) = (sched.clone(), sampling.clone(), a.cap);
        std::thread::spawn(move || {
            let mut max = 0;
            while sampling.load(Ordering::Relaxed) {
                let now = match &sched {
                    Some(s) => s.global_running(),
                    None => shared.sem_taken(cap),
                };
                max = max.max(now);
                std::thread::sleep(SAMPLE_EVERY);
            }
            max
        })
    };

    let deadline = a.seconds.map(|s| started + Duration::from_secs_f64(s));
    while !stop_flag.load(Ordering::SeqCst) && deadline.is_none_or(|d| Instant::now() < d) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let elapsed = started.elapsed().as_secs_f64();
    sampling.store(false, Ordering::Relaxed);
    let max_sampled = sampler.join().unwrap_or(u32::MAX);

    // Stop: EOF on the stop pipe; collect the reports.
    drop(stop_w);
    let mut reports: Vec<Option<WorkerReport>> = (0..n).map(|_| None).collect();
    let mut open = n;
    let until = Instant::now() + Duration::from_secs(20);
    while open > 0 {
        let left = until.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((i, FromWorker::Report(r))) => reports[i] = Some(*r),
            Ok((_, FromWorker::Eof)) => open -= 1,
            Ok((_, FromWorker::Ready)) => {}
            Err(_) => break,
        }
    }
    let reap_by = Instant::now() + Duration::from_secs(5);
    let pids = std::mem::take(&mut kids.0);
    for &pid in &pids {
        reap_pid(pid, reap_by);
    }
    let leaked = match &sched {
        Some(s) => {
            let _ = s.reap();
            Some(s.global_running())
        }
        None => None,
    };
    let summary = summarize(a, elapsed, &pids, &reports, max_sampled, shared, leaked);
    if !machine {
        print_server_summary(&summary);
    }
    println!(
        "{}",
        serde_json::to_string(&summary).map_err(|e| e.to_string())?
    );
    let lost = summary.per_worker.iter().filter(|w| !w.reported).count();
    if lost > 0 {
        return Err(format!("{lost} workers did not report"));
    }
    Ok(())
}

fn summarize(
    a: &Args,
    elapsed: f64,
    pids: &[i32],
    reports: &[Option<WorkerReport>],
    max_sampled: u32,
    shared: &Shared,
    leaked: Option<u32>,
) -> Summary {
    let mut all: [(Vec<u64>, Vec<u64>); 3] = Default::default();
    let mut per_worker = Vec::new();
    let mut other = 0;
    for (i, r) in reports.iter().enumerate() {
        let empty = WorkerReport::default();
        let rep = r.as_ref().unwrap_or(&empty);
        other += rep.other_requests;
        let mut paths = Vec::new();
        let (mut g, mut w) = (Vec::new(), Vec::new());
        for p in 0..3 {
            paths.push(PathRow {
                path: PATHS[p].into(),
                wait: WaitStats::of(&rep.waits_us[p], &rep.waiting_us[p]),
            });
            g.extend_from_slice(&rep.waits_us[p]);
            w.extend_from_slice(&rep.waiting_us[p]);
            all[p].0.extend_from_slice(&rep.waits_us[p]);
            all[p].1.extend_from_slice(&rep.waiting_us[p]);
        }
        per_worker.push(WorkerRow {
            worker: i as u32,
            pid: pids.get(i).copied().unwrap_or(0),
            reported: r.is_some(),
            connections: rep.connections,
            max_held: rep.max_held,
            max_waiting: rep.max_waiting,
            wait: WaitStats::of(&g, &w),
            paths,
        });
    }
    let paths: Vec<PathRow> = (0..3)
        .map(|p| PathRow {
            path: PATHS[p].into(),
            wait: WaitStats::of(&all[p].0, &all[p].1),
        })
        .collect();
    Summary {
        gate: a.gate,
        workers: a.workers,
        cap: a.cap,
        backend_ms: a.backend_ms,
        elapsed_s: elapsed,
        served: paths.iter().map(|r| r.wait.n).sum(),
        other_requests: other,
        max_running_sampled: max_sampled,
        max_running_counted: shared.max_running.load(Ordering::SeqCst),
        leaked,
        exited_in_gate: reports.iter().flatten().map(|r| r.exited_in_gate).sum(),
        paths,
        per_worker,
    }
}

pub fn ms(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.1}")
    }
}

pub fn triple(w: &WaitStats) -> String {
    format!("{} / {} / {}", ms(w.p50_ms), ms(w.p99_ms), ms(w.max_ms))
}

fn print_server_summary(s: &Summary) {
    eprintln!(
        "\nserved {} requests in {:.1} s ({:.0}/s); max running {} (cap {}); other requests {}",
        s.served,
        s.elapsed_s,
        s.served as f64 / s.elapsed_s.max(1e-9),
        s.max_running(),
        s.cap,
        s.other_requests
    );
    eprintln!("{:<22} {:>8}  wait ms p50 / p99 / max", "", "served");
    for r in &s.paths {
        eprintln!("{:<22} {:>8}  {}", r.path, r.wait.n, triple(&r.wait));
    }
    for w in &s.per_worker {
        eprintln!(
            "{:<22} {:>8}  {}",
            format!("worker {} ({} conns)", w.worker, w.connections),
            w.wait.n,
            triple(&w.wait)
        );
    }
}
