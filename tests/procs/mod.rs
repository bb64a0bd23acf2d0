//! Helpers for cross-process tests: children are this same test binary,
//! re-executed with a role in the environment, so no test forks a
//! multi-threaded harness. Every wait on a child has a deadline
//! ([`WAIT`]), and a child is killed when its handle drops (also when a
//! failing test unwinds), so no test hangs on a child.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How long any single wait for a child (a line, its exit) may take before
/// the test fails.
pub const WAIT: Duration = Duration::from_secs(60);

/// The role a re-executed child plays, if any.
pub fn role() -> Option<(String, Vec<String>)> {
    let r = std::env::var("SHMSCHED_TEST_ROLE").ok()?;
    let args = std::env::var("SHMSCHED_TEST_ARGS").unwrap_or_default();
    Some((
        r,
        args.split(' ')
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
    ))
}

/// A child process running `role` through the test named `entry`; its
/// stdout lines arrive through a channel (read by a thread), so that every
/// wait has a deadline. Killed and reaped on drop.
pub struct Kid {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

pub fn spawn(entry: &str, role: &str, args: &[String]) -> Kid {
    let exe = std::env::current_exe().expect("test binary path");
    let mut child = Command::new(exe)
        .args(["--exact", entry, "--nocapture", "--test-threads=1", "-q"])
        .env("SHMSCHED_TEST_ROLE", role)
        .env("SHMSCHED_TEST_ARGS", args.join(" "))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdin = child.stdin.take();
    let out = BufReader::new(child.stdout.take().unwrap());
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Kid {
        child,
        stdin,
        lines,
    }
}

impl Kid {
    /// Reads lines until one starts with `prefix`; returns the rest of it.
    /// Fails if the child exits first or prints no such line within
    /// [`WAIT`].
    pub fn expect_line(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.trim_end().strip_prefix(prefix) {
                        return rest.trim().to_string();
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!(
                        "child {}: no line {prefix:?} within {WAIT:?}",
                        self.child.id()
                    )
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!(
                        "child {} exited before printing {prefix:?}",
                        self.child.id()
                    )
                }
            }
        }
    }

    /// Closes stdin (the child's signal to finish) and waits for it, at
    /// most [`WAIT`]; kills it and fails after that.
    pub fn finish(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(st) = self.child.try_wait().expect("wait child") {
                return st;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("child {} did not exit within {WAIT:?}", self.child.id());
            }
            // A time bound on the wait, not synchronisation: the outcome is
            // the child's exit status.
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn send(&mut self, line: &str) {
        let s = self.stdin.as_mut().unwrap();
        writeln!(s, "{line}").unwrap();
        s.flush().unwrap();
    }

    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Child side: prints a line to the parent.
pub fn say(line: &str) {
    let mut o = std::io::stdout().lock();
    writeln!(o, "{line}").unwrap();
    o.flush().unwrap();
}

/// Child side: blocks until the parent closes stdin or sends a line.
pub fn wait_parent() -> Option<String> {
    let mut s = String::new();
    match std::io::stdin().read_line(&mut s) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(s.trim().to_string()),
    }
}

/// Polls `cond` (yielding) until true, failing after `secs`.
pub fn until(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A region name unique to this test run.
pub fn unique_name(tag: &str) -> String {
    format!(
        "test-{tag}-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    )
}

/// Removes the named region when dropped.
pub struct Gone(pub String);

impl Drop for Gone {
    fn drop(&mut self) {
        let _ = shmsched::region::Region::remove(&self.0);
    }
}

/// A `shmsched serve` process and its metrics URL, killed on drop.
pub struct Served(pub Child, pub String);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `shmsched serve --listen 127.0.0.1:0 ARGS…` (regions and flags)
/// and reads the address it listens on; its stderr is drained meanwhile.
pub fn serve(args: &[&str]) -> Served {
    let mut child = Command::new(env!("CARGO_BIN_EXE_shmsched"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    assert!(err.read_line(&mut line).unwrap() > 0, "serve said nothing");
    let url = line
        .trim()
        .strip_prefix("shmsched serve: listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line}"))
        .to_string();
    // Keep draining stderr so the server never blocks on it.
    std::thread::spawn(move || for _ in err.lines() {});
    Served(child, url)
}

/// Runs `shmsched ARGS…` (stdin closed), killing it and failing the test
/// after `limit`; returns its output, how long it took and its pid.
pub fn cli_within(args: &[&str], limit: Duration) -> (std::process::Output, Duration, u32) {
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_shmsched"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn shmsched");
    while child.try_wait().expect("try_wait").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("shmsched {args:?} ran longer than {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let (took, pid) = (start.elapsed(), child.id());
    (child.wait_with_output().expect("output"), took, pid)
}
