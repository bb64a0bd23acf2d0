//! Helpers for the adversarial cross-process tests (`xsched.rs`,
//! `xlimiter.rs`, `xwakers.rs`): children are this same test binary,
//! re-executed with a role; every read from a child has a deadline; a child
//! left behind is killed when its handle drops; a child whose parent is gone
//! (stdin closed) or that outlives [`CHILD_LIFETIME`] exits by itself.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use shmsched::region::Region;

/// No child lives longer than this, whatever happens to its parent.
pub const CHILD_LIFETIME: Duration = Duration::from_secs(60);

/// Serialises the timing-sensitive tests of one binary (they measure
/// latencies; running them side by side on 2 cores would measure each
/// other).
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The role a re-executed child plays, if any.
pub fn role() -> Option<(String, Vec<String>)> {
    let r = std::env::var("SHMSCHED_XTEST_ROLE").ok()?;
    let args = std::env::var("SHMSCHED_XTEST_ARGS").unwrap_or_default();
    Some((
        r,
        args.split(' ')
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
    ))
}

/// `CLOCK_MONOTONIC` in ns: one clock for every process of the host, so
/// instants printed by different processes compare.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CPU time (user + system) of process `pid` so far, ns, as the kernel
/// accounts it (`/proc/PID/stat` utime + stime, in clock ticks).
pub fn proc_cpu_ns(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // The fields after the command name's closing parenthesis: state is
    // field 3, utime 14 and stime 15.
    let rest = stat.rsplit_once(") ").expect("stat format").1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    ticks * 1_000_000_000 / hz
}

/// Voluntary context switches of this whole process so far (every thread,
/// finished ones included).
pub fn voluntary_switches() -> u64 {
    // SAFETY: zeroed rusage is valid; a valid out-pointer.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru.ru_nvcsw as u64
}

/// CPU time (user + system) of this whole process so far, ns.
pub fn cpu_ns() -> u64 {
    // SAFETY: zeroed rusage is valid; a valid out-pointer.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

pub fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// A region file in /dev/shm, removed on drop.
pub struct TempRegion {
    pub path: String,
}

impl TempRegion {
    pub fn new(tag: &str) -> (TempRegion, Region) {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let path = format!(
            "/dev/shm/shmsched-xt-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let region = Region::create(&path).expect("create region");
        (TempRegion { path }, region)
    }
}

impl Drop for TempRegion {
    fn drop(&mut self) {
        let _ = Region::remove(&self.path);
    }
}

/// A child process playing a role, with a line protocol on its stdio.
pub struct Kid {
    pub name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    rx: Receiver<Option<String>>,
    backlog: VecDeque<String>,
    eof: bool,
}

impl Kid {
    /// Spawns this test binary running `entry` (the binary's child entry
    /// test) as `role` with `args`.
    pub fn spawn(entry: &str, name: &str, role: &str, args: &[&str]) -> Kid {
        let exe = std::env::current_exe().expect("test binary path");
        let mut child = Command::new(exe)
            .args(["--exact", entry, "--nocapture", "--test-threads=1", "-q"])
            .env("SHMSCHED_XTEST_ROLE", role)
            .env("SHMSCHED_XTEST_ARGS", args.join(" "))
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn child");
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().expect("child stdout"));
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in out.lines() {
                match line {
                    Ok(l) => {
                        if tx.send(Some(l)).is_err() {
                            return;
                        }
                    }
                    Err(_) => break,
                }
            }
            let _ = tx.send(None);
        });
        Kid {
            name: name.to_string(),
            child,
            stdin,
            rx,
            backlog: VecDeque::new(),
            eof: false,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends one command line.
    pub fn send(&mut self, line: &str) {
        let s = self.stdin.as_mut().expect("stdin open");
        if writeln!(s, "{line}").and_then(|()| s.flush()).is_err() {
            panic!("{}: could not send {line:?} (child gone?)", self.name);
        }
    }

    /// Closes the child's stdin (its signal to finish) without waiting for
    /// it to exit: its last lines can still be read.
    pub fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// The first line starting with `prefix` (its remainder, trimmed), within
    /// `within`; lines that do not match are kept for later calls. `None`
    /// on timeout or when the child's stdout closed.
    pub fn try_line(&mut self, prefix: &str, within: Duration) -> Option<String> {
        if let Some(i) = self.backlog.iter().position(|l| l.starts_with(prefix)) {
            let l = self.backlog.remove(i).unwrap();
            return Some(l[prefix.len()..].trim().to_string());
        }
        let deadline = Instant::now() + within;
        while !self.eof {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(Some(l)) => {
                    if let Some(rest) = l.strip_prefix(prefix) {
                        return Some(rest.trim().to_string());
                    }
                    self.backlog.push_back(l);
                }
                Ok(None) | Err(RecvTimeoutError::Disconnected) => self.eof = true,
                Err(RecvTimeoutError::Timeout) => return None,
            }
        }
        None
    }

    /// Like [`try_line`](Self::try_line), failing the test on timeout.
    #[track_caller]
    pub fn expect(&mut self, prefix: &str, within: Duration) -> String {
        match self.try_line(prefix, within) {
            Some(l) => l,
            None if self.eof => panic!(
                "{}: exited before printing {prefix:?} (seen: {:?})",
                self.name, self.backlog
            ),
            None => panic!(
                "{}: no {prefix:?} within {within:?} (seen: {:?})",
                self.name, self.backlog
            ),
        }
    }

    /// The first line starting with any of `prefixes`: (its index, the
    /// line's remainder). Fails the test on timeout.
    #[track_caller]
    pub fn expect_any(&mut self, prefixes: &[&str], within: Duration) -> (usize, String) {
        let deadline = Instant::now() + within;
        loop {
            for (i, p) in prefixes.iter().enumerate() {
                if let Some(l) = self.try_line(p, Duration::ZERO) {
                    return (i, l);
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero() && !self.eof,
                "{}: none of {prefixes:?} within {within:?} (seen: {:?})",
                self.name,
                self.backlog
            );
            match self.rx.recv_timeout(left.min(Duration::from_millis(5))) {
                Ok(Some(l)) => self.backlog.push_back(l),
                Ok(None) | Err(RecvTimeoutError::Disconnected) => self.eof = true,
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// Sends a signal to the child.
    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child.
        let r = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(r, 0, "{}: kill({sig})", self.name);
    }

    /// SIGSTOP, and waits until the kernel shows the child stopped.
    pub fn stop(&self) {
        self.signal(libc::SIGSTOP);
        let t = Instant::now();
        loop {
            let stat =
                std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
            // The state follows the command name's closing parenthesis.
            let state = stat.rsplit_once(") ").map(|(_, r)| r.chars().next());
            if state == Some(Some('T')) {
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "{}: not stopped",
                self.name
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    pub fn cont(&self) {
        self.signal(libc::SIGCONT);
    }

    /// SIGKILL, reaped: when this returns the process is gone (its kernel
    /// locks with it).
    pub fn sigkill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Closes stdin (the child's signal to finish) and waits at most
    /// `within` for it to exit; kills it and fails otherwise.
    #[track_caller]
    pub fn finish(mut self, within: Duration) -> ExitStatus {
        drop(self.stdin.take());
        let t = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().expect("wait child") {
                return st;
            }
            if t.elapsed() > within {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("{}: did not exit within {within:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// [`finish`](Self::finish), asserting success.
    #[track_caller]
    pub fn done(self) {
        let name = self.name.clone();
        let st = self.finish(Duration::from_secs(10));
        assert!(st.success(), "{name}: exited with {st}");
    }
}

/// A kid SIGSTOPped for as long as this guard lives: dropped (even by a
/// failing test's unwinding) it sends SIGCONT, so no test leaves a stopped
/// process behind.
pub struct Stopped<'a>(&'a Kid);

impl<'a> Stopped<'a> {
    /// Stops `k` (and waits until the kernel shows it stopped).
    pub fn new(k: &'a Kid) -> Stopped<'a> {
        k.stop();
        Stopped(k)
    }
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        self.0.cont();
    }
}

/// Stops `k` at `times` instants (after a short pause, a different one each
/// time, so the stops land anywhere in what it does) and each time runs
/// `op(i)` while it is stopped; `k` runs again once `op` returns, or 400 ms
/// after the stop if `op` hangs until then. Returns `op`'s worst latency
/// (ms).
pub fn while_stopped_at_instants(k: &Kid, times: u64, mut op: impl FnMut(u64)) -> f64 {
    let mut worst = 0f64;
    for i in 0..times {
        std::thread::sleep(Duration::from_micros(300 + i * 97 % 700));
        let stopped = Stopped::new(k);
        let pid = k.pid();
        let cont = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(400));
            // SAFETY: plain kill(2) on our own child.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        });
        let t = Instant::now();
        op(i);
        worst = worst.max(t.elapsed().as_secs_f64() * 1e3);
        drop(stopped);
        cont.join().unwrap();
    }
    worst
}

impl Drop for Kid {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SIGKILL ends a stopped process too; SIGCONT first all the same.
            // SAFETY: plain kill(2) on our own child.
            unsafe { libc::kill(self.pid(), libc::SIGCONT) };
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---- child side ---------------------------------------------------------------

/// Child side: arms the lifetime watchdog.
pub fn child_init() {
    std::thread::spawn(|| {
        std::thread::sleep(CHILD_LIFETIME);
        eprintln!(
            "xtest child {}: lifetime exceeded, exiting",
            std::process::id()
        );
        std::process::exit(97);
    });
}

/// Child side: prints a line to the parent.
pub fn say(line: &str) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{line}");
    let _ = o.flush();
}

/// Child side: the commands from the parent, one per line, on a channel;
/// `None` once stdin closes (the parent finished or died).
pub fn commands() -> Receiver<Option<String>> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            match line {
                Ok(l) => {
                    if tx.send(Some(l.trim().to_string())).is_err() {
                        return;
                    }
                }
                Err(_) => break,
            }
        }
        let _ = tx.send(None);
    });
    rx
}

/// Child side: blocks until stdin closes, then exits the process at once
/// (for roles whose threads block in calls that cannot be interrupted).
pub fn exit_when_parent_closes(code_on_close: i32, last_words: impl FnOnce() + Send + 'static) {
    std::thread::spawn(move || {
        let mut s = String::new();
        while let Ok(n) = std::io::stdin().read_line(&mut s) {
            if n == 0 {
                break;
            }
            s.clear();
        }
        last_words();
        std::process::exit(code_on_close);
    });
}

/// Polls `cond` until true, failing after `within` with `what`.
#[track_caller]
pub fn until(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < within, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// Median and maximum of a set of figures.
pub fn median_max(v: &[f64]) -> (f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (s[s.len() / 2], *s.last().unwrap())
}
