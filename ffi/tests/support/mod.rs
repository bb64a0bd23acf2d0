//! What the C ABI's integration tests share: the freshly built library,
//! compiling C programs against it, and child processes that are bounded
//! in time (a test never hangs: every wait has a deadline, and children are
//! killed when their handle drops).

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("ffi/ has a parent")
        .to_path_buf()
}

/// `ffi/include`, where `shmsched.h` lives.
pub fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("include")
}

/// The directory holding `libshmsched.so` and `libshmsched.a`, built once
/// per test binary.
///
/// Cargo does not build a `cdylib` for its own crate's integration tests
/// (they link the crate as an rlib, and this crate has none: its lib is
/// named `shmsched` like the library's, and two rlibs of one name would
/// collide in the target directory). So the first caller runs
/// `cargo build -p shmsched-ffi` for the profile and target directory this
/// test binary was built with (cargo holds no lock while tests run), which
/// is quick: everything it needs was just compiled for the test.
pub fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("test binary path");
        // <target>/<profile dir>/deps/<test binary>
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("test binary lives in <target>/<profile>/deps");
        let target_dir = profile_dir.parent().expect("target dir");
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev".to_string(),
            Some(other) => other.to_string(),
            None => panic!("cannot tell the profile from {}", exe.display()),
        };
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(&cargo)
            .args(["build", "-p", "shmsched-ffi", "--profile", &profile])
            .arg("--target-dir")
            .arg(target_dir)
            .current_dir(repo_root())
            .output()
            .expect("run cargo build -p shmsched-ffi");
        assert!(
            out.status.success(),
            "cargo build -p shmsched-ffi failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let so = profile_dir.join("libshmsched.so");
        assert!(so.exists(), "{} was not built", so.display());
        profile_dir.to_path_buf()
    })
}

/// The shared library's path (for ctypes and koffi).
pub fn shared_lib() -> PathBuf {
    lib_dir().join("libshmsched.so")
}

/// Where this test binary's compiled C programs go.
fn c_out_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ffi-c");
    std::fs::create_dir_all(&d).expect("create C output dir");
    d
}

/// Compiles C `sources` into an executable named `name`, linked against
/// the shared library (with an rpath, so it runs as is), with `-std=c99
/// -Wall -Wextra -Werror`. Cached per test binary.
pub fn compile_c(name: &str, sources: &[PathBuf]) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let built = BUILT.get_or_init(|| Mutex::new(HashMap::new()));
    let mut built = built.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.get(name) {
        return p.clone();
    }
    let out = c_out_dir().join(name);
    let lib = lib_dir();
    let mut cmd = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cmd.args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-O1", "-g"])
        .arg("-I")
        .arg(include_dir())
        .args(sources)
        .arg("-o")
        .arg(&out)
        .arg("-L")
        .arg(lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lshmsched", "-lpthread"]);
    let res = cmd.output().expect("run cc");
    assert!(
        res.status.success(),
        "cc failed for {name}:\n{}",
        String::from_utf8_lossy(&res.stderr)
    );
    built.insert(name.to_string(), out.clone());
    out
}

/// A source file under `ffi/tests/`.
pub fn test_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(rel)
}

/// A region path under `/dev/shm` unique to this run, removed on drop.
pub struct TempRegion(pub String);

impl TempRegion {
    pub fn new(tag: &str) -> TempRegion {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        TempRegion(format!(
            "/dev/shm/shmsched-ffi-test-{tag}-{}-{n}",
            std::process::id()
        ))
    }
}

impl Drop for TempRegion {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A child process whose stdout lines arrive through a channel, so that
/// every wait has a deadline. Killed (and reaped) on drop.
pub struct Kid {
    pub name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

/// How long any single wait for a child may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(60);

impl Kid {
    /// Spawns `cmd` with piped stdin and stdout (stderr inherited).
    pub fn spawn(name: &str, mut cmd: Command) -> Kid {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Kid {
            name: name.to_string(),
            child,
            stdin,
            lines: rx,
        }
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits (at most [`WAIT`]) for a line starting with `prefix`; returns
    /// the rest of it, trimmed. Fails if the child exits first.
    pub fn expect_line(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.trim().to_string();
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("{}: no line {prefix:?} within {WAIT:?}", self.name)
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let st = self.child.wait().ok();
                    panic!("{}: exited ({st:?}) before printing {prefix:?}", self.name)
                }
            }
        }
    }

    /// Sends one line to the child's stdin.
    pub fn send(&mut self, line: &str) {
        let s = self.stdin.as_mut().expect("stdin open");
        writeln!(s, "{line}")
            .and_then(|_| s.flush())
            .unwrap_or_else(|e| panic!("{}: write to stdin: {e}", self.name));
    }

    /// Closes stdin (the usual "finish" signal) and waits for the exit, at
    /// most [`WAIT`]; kills and fails after that.
    pub fn finish(mut self) -> ExitStatus {
        drop(self.stdin.take());
        self.wait()
    }

    /// Waits for the exit, at most [`WAIT`]; kills and fails after that.
    pub fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return st;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("{}: did not exit within {WAIT:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Collects every remaining stdout line until the child exits (bounded
    /// by [`WAIT`]).
    pub fn rest(&mut self) -> Vec<String> {
        let deadline = Instant::now() + WAIT;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => out.push(l),
                Err(RecvTimeoutError::Disconnected) => return out,
                Err(RecvTimeoutError::Timeout) => {
                    panic!("{}: output did not end within {WAIT:?}", self.name)
                }
            }
        }
    }

    /// SIGKILLs the child and reaps it.
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

/// Polls `cond` until true, failing after [`WAIT`]. For states that have
/// no event to wait on (a waiter being queued in another process is only
/// visible in the region's gauges); the 1 ms nap only bounds the polling
/// cost.
pub fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The status codes the header defines, as `(name, value)`, parsed from
/// `shmsched.h` (so a code added to the enum must also be produced by the
/// status-code test).
pub fn header_status_codes() -> Vec<(String, u32)> {
    let h = std::fs::read_to_string(include_dir().join("shmsched.h")).expect("read header");
    let start = h
        .find("enum shmsched_status")
        .expect("status enum in header");
    let body = &h[start..];
    let body = &body[..body.find("};").expect("end of enum")];
    body.lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l.strip_prefix("SHMSCHED_STATUS_")?;
            let (name, value) = rest.split_once(" = ")?;
            let value = value.trim_end_matches(',').parse().ok()?;
            Some((format!("SHMSCHED_STATUS_{name}"), value))
        })
        .collect()
}

/// `python3` with the binding on its path and the fresh library.
pub fn python() -> Command {
    let mut cmd = Command::new("python3");
    cmd.env("PYTHONPATH", repo_root().join("python"))
        .env("SHMSCHED_LIB", shared_lib())
        .env("PYTHONUNBUFFERED", "1");
    cmd
}

/// `node` with the fresh library, after checking that the binding's
/// dependency (koffi, from the npm registry) is installed.
pub fn node() -> Command {
    let koffi = repo_root().join("node/node_modules/koffi");
    assert!(
        koffi.exists(),
        "{} is missing: run `npm ci --prefix node` once (.ci/run does) before `cargo test`",
        koffi.display()
    );
    let mut cmd = Command::new("node");
    cmd.env("SHMSCHED_LIB", shared_lib());
    cmd
}
