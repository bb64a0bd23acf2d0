//! What the C ABI's integration tests share: the freshly built library,
//! compiling C programs against it, the tools they need (through the
//! project's one convention, `tests/tools`: a missing tool is got or named
//! at once, never a hang), and child processes that are bounded in time (a
//! test never hangs: every wait has a deadline, and children are killed
//! when their handle drops).

#![allow(dead_code)]

#[path = "../../../tests/tools/mod.rs"]
pub mod tools;

pub use tools::{output_of, require_tool, Get};

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
        let mut cmd = Command::new(&cargo);
        cmd.args(["build", "-p", "shmsched-ffi", "--profile", &profile])
            .arg("--target-dir")
            .arg(target_dir)
            .current_dir(repo_root());
        let out = output_of(cmd, BUILD_TIMEOUT);
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

/// The longest a build or compile a test starts may take.
pub const BUILD_TIMEOUT: Duration = Duration::from_secs(600);

/// The C compiler (`$CC`, else `cc`), got from Debian's gcc when missing.
pub fn cc() -> PathBuf {
    match std::env::var_os("CC") {
        Some(cc) => PathBuf::from(cc),
        None => require_tool("cc", Get::Apt("gcc")),
    }
}

/// The C++ compiler (`$CXX`, else `c++`), got from Debian's g++ when
/// missing.
pub fn cxx() -> PathBuf {
    match std::env::var_os("CXX") {
        Some(cxx) => PathBuf::from(cxx),
        None => require_tool("c++", Get::Apt("g++")),
    }
}

/// `pkg-config`, got from Debian's pkgconf when missing.
pub fn pkg_config() -> PathBuf {
    require_tool("pkg-config", Get::Apt("pkgconf"))
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
    let mut cmd = Command::new(cc());
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
    let res = output_of(cmd, BUILD_TIMEOUT);
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
    /// Removes the path and every file named after it with a `-` suffix
    /// (the C programs derive their regions' names as `PATH-tag`): on
    /// success, and when a failing test unwinds.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let path = Path::new(&self.0);
        let (Some(dir), Some(stem)) = (path.parent(), path.file_name().and_then(|n| n.to_str()))
        else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let derived = format!("{stem}-");
        for e in entries.flatten() {
            if e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&derived))
            {
                let _ = std::fs::remove_file(e.path());
            }
        }
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
    let mut cmd = Command::new(require_tool("python3", Get::Apt("python3")));
    cmd.env("PYTHONPATH", repo_root().join("python"))
        .env("SHMSCHED_LIB", shared_lib())
        .env("PYTHONUNBUFFERED", "1");
    cmd
}

/// The oldest Node.js the binding supports.
const NODE_MAJOR: u32 = 20;

/// The longest `npm ci` may take.
const NPM_TIMEOUT: Duration = Duration::from_secs(300);

/// `node` with the fresh library, after making sure of the binding's
/// dependencies (koffi, and typescript for its tests, from the npm
/// registry): the first caller of a test run runs `npm ci --prefix node`
/// when `node/node_modules/koffi` or `typescript` is
/// missing (once, under a lock shared with the other test processes,
/// bounded by a timeout, its output shown on failure). Fails within
/// seconds naming what is missing: `node` (20 or later), `npm`, or koffi
/// when `npm ci` fails.
pub fn node() -> Command {
    static READY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let node = READY.get_or_init(prepare_node).clone();
    let node = node.unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = Command::new(node);
    cmd.env("SHMSCHED_LIB", shared_lib());
    cmd
}

fn prepare_node() -> Result<PathBuf, String> {
    let how = "Node.js 20 or later (https://nodejs.org, or the distribution's nodejs package if it is 20+)";
    let node = tools::find_tool("node").ok_or_else(|| {
        format!("missing tool: `node` is needed by this test and is not on PATH; install {how}")
    })?;
    let mut v = Command::new(&node);
    v.arg("--version");
    let out = tools::output_within(v, Duration::from_secs(20))?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let major: u32 = version
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if major < NODE_MAJOR {
        return Err(format!(
            "missing tool: `node` {version:?} at {} is older than {NODE_MAJOR}; install {how}",
            node.display()
        ));
    }
    let dir = repo_root().join("node");
    // The binding's dependency (koffi) and the tests' (typescript).
    let installed = || {
        ["koffi", "typescript"].iter().all(|d| {
            dir.join("node_modules")
                .join(d)
                .join("package.json")
                .exists()
        })
    };
    if installed() {
        return Ok(node);
    }
    // One `npm ci` per checkout at a time, whichever test process asks.
    let tag: String = dir
        .display()
        .to_string()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let _lock =
        tools::FileLock::take(&std::env::temp_dir().join(format!("shmsched-npm-ci{tag}.lock")))?;
    if installed() {
        // Another test process installed it while we waited for the lock.
        return Ok(node);
    }
    let npm = tools::find_tool("npm").ok_or_else(|| {
        format!("missing tool: `npm` is needed to install the Node binding's dependency (koffi) and is not on PATH; install {how} with npm")
    })?;
    let mut ci = Command::new(npm);
    ci.args(["ci", "--no-audit", "--no-fund", "--prefix"])
        .arg(&dir);
    let out = tools::output_within(ci, NPM_TIMEOUT).map_err(|e| {
        format!("missing dependency: koffi, for the Node binding: `npm ci --prefix node` {e}")
    })?;
    if !out.status.success() || !installed() {
        return Err(format!(
            "missing dependency: koffi or typescript, for the Node binding: `npm ci --prefix node` failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(node)
}

/// Every function the header declares, with the text of the doc comment
/// just above its declaration (the `*` margins removed), in header order.
pub fn header_functions() -> Vec<(String, String)> {
    let h = std::fs::read_to_string(include_dir().join("shmsched.h")).expect("read header");
    let lines: Vec<&str> = h.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let is_decl = line.starts_with(|c: char| c.is_ascii_lowercase())
            && !line.starts_with("typedef")
            && line.contains("shmsched_")
            && line.contains('(');
        if !is_decl {
            continue;
        }
        let name = line[..line.find('(').expect("a '('")]
            .rsplit(|c: char| !(c.is_alphanumeric() || c == '_'))
            .next()
            .expect("a name")
            .to_string();
        let doc = if i > 0 && lines[i - 1].trim() == "*/" {
            let start = (0..i)
                .rev()
                .find(|&k| lines[k].trim() == "/**")
                .unwrap_or(i);
            lines[start..i]
                .iter()
                .map(|l| l.trim().trim_start_matches("/**").trim_start_matches("*/"))
                .map(|l| l.strip_prefix('*').unwrap_or(l).trim())
                .collect::<Vec<_>>()
                .join("\n")
        } else {
            String::new()
        };
        out.push((name, doc));
    }
    out
}

/// The status names (`TIMEOUT`, …) a function's doc lists under "Errors",
/// following "as `shmsched_other`" references.
pub fn documented_errors(
    functions: &[(String, String)],
    name: &str,
) -> std::collections::BTreeSet<String> {
    fn errors_text(doc: &str) -> &str {
        let Some(at) = doc.find("Errors") else {
            return "";
        };
        let rest = &doc[at..];
        let end = rest.find("Threads").unwrap_or(rest.len());
        &rest[..end]
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut out = std::collections::BTreeSet::new();
    let mut todo = vec![name.to_string()];
    while let Some(f) = todo.pop() {
        if !seen.insert(f.clone()) {
            continue;
        }
        let Some((_, doc)) = functions.iter().find(|(n, _)| *n == f) else {
            continue;
        };
        let text = errors_text(doc);
        for word in text.split('`').skip(1).step_by(2) {
            if word.starts_with("shmsched_") {
                todo.push(word.to_string());
            } else if word.len() >= 2 && word.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
                out.insert(word.to_string());
            }
        }
    }
    out
}
