//! External tools a test needs, and child processes bounded in time: the
//! one convention every test of the project follows (the root `tests/` use
//! it as `mod tools;`, `ffi/tests` through `ffi/tests/support`).
//!
//! `cargo test --workspace` must pass on a fresh machine of the project's
//! kind (the Rust toolchain, gcc, python3, node 20 with npm, make) with
//! nothing installed by hand, and must never hang. So a test that needs a
//! program beyond that:
//!
//! 1. calls [`require_tool`]`("redis-server", Get::Apt("redis-server"))`
//!    before it starts anything. If the program is on `PATH` that is all.
//!    If not, the project gets it the way it can ([`Get::Apt`]: one quiet
//!    `apt-get install`, as root or through `sudo -n`, once per machine at a
//!    time under a lock, bounded by [`INSTALL_TIMEOUT`]); if that fails too
//!    the test **fails at once**, with a message starting `missing tool:`
//!    that names the program, what was tried, and how to install it.
//! 2. Only where the tool cannot be had on this kind of machine at all (say
//!    a program that no registry the project reaches ships) the test calls
//!    [`skip`] instead and returns. A skip prints a line starting
//!    `SHMSCHED-SKIP:`; with `CI` set (as `.ci/run` runs) a skip is a
//!    failure, so CI never passes with a test that did not run.
//! 3. Every child process runs through [`output_within`] (or a handle that
//!    kills it on drop and bounds each wait, like `tests/procs` and
//!    `ffi/tests/support`'s `Kid`): a child that hangs is killed and the
//!    test fails naming it, with its output.
//!
//! Region files a test creates are removed by guards on drop, so a failing
//! test (a panic unwinds through them) leaves nothing in `/dev/shm`.

#![allow(dead_code)]

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How a missing tool can be got on this kind of machine.
#[derive(Clone, Copy, Debug)]
pub enum Get {
    /// Debian's package of that name (`apt-get install -y PACKAGE`).
    Apt(&'static str),
    /// Not installable by a test: the sentence says how a person gets it.
    Manual(&'static str),
}

/// The longest an install a test starts may take.
pub const INSTALL_TIMEOUT: Duration = Duration::from_secs(300);

/// The prefix of every skip line (see [`skip`]).
pub const SKIP_PREFIX: &str = "SHMSCHED-SKIP:";

/// The path of `tool` on `PATH` (or `tool` itself when it has a `/`).
pub fn find_tool(tool: &str) -> Option<PathBuf> {
    if tool.contains('/') {
        return Path::new(tool).is_file().then(|| PathBuf::from(tool));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(tool))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The path of `tool`, got with `how` when it is not on `PATH`; panics with
/// a message starting `missing tool:` (naming the tool, what was tried and
/// how to install it) when it cannot be had. Quick when the tool is there.
pub fn require_tool(tool: &str, how: Get) -> PathBuf {
    if let Some(p) = find_tool(tool) {
        return p;
    }
    let tried = match how {
        Get::Apt(pkg) => match apt_install(pkg) {
            Ok(()) => match find_tool(tool) {
                Some(p) => return p,
                None => format!("`apt-get install {pkg}` ran, and `{tool}` is still not on PATH"),
            },
            Err(why) => format!("`apt-get install {pkg}` failed: {why}"),
        },
        Get::Manual(_) => "nothing (a test cannot install it)".to_string(),
    };
    let fix = match how {
        Get::Apt(pkg) => format!("apt-get install -y {pkg}"),
        Get::Manual(s) => s.to_string(),
    };
    panic!("missing tool: `{tool}` is needed by this test and is not on PATH; tried {tried}; install it with: {fix}");
}

/// Reports that the calling test does not run here, and why; the caller
/// returns right after. A failure instead when `CI` is set: CI must run
/// every test. For tools that cannot be had on this kind of machine only
/// (anything installable goes through [`require_tool`]).
pub fn skip(test: &str, why: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "{SKIP_PREFIX} {test}: {why} (a skip fails in CI, where every test must run)"
    );
    eprintln!("{SKIP_PREFIX} {test}: {why}");
    println!("{SKIP_PREFIX} {test}: {why}");
}

/// One install at a time on the machine (apt's own lock makes a second
/// concurrent `apt-get` fail), across test threads and test processes.
static APT: Mutex<()> = Mutex::new(());

fn apt_install(pkg: &str) -> Result<(), String> {
    let _one = APT.lock().unwrap_or_else(|p| p.into_inner());
    let _lock = FileLock::take(&std::env::temp_dir().join("shmsched-test-apt.lock"))?;
    let apt = find_tool("apt-get").ok_or("there is no apt-get on this machine")?;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut base = if root {
        Command::new(&apt)
    } else {
        let sudo = find_tool("sudo").ok_or("not root, and there is no sudo")?;
        let mut c = Command::new(sudo);
        c.arg("-n").arg(&apt);
        c
    };
    base.env("DEBIAN_FRONTEND", "noninteractive");
    let install = |base: &Command| {
        let mut c = clone_command(base);
        c.args(["install", "-y", "-qq", pkg]);
        output_within(c, INSTALL_TIMEOUT)
    };
    let first = install(&base)?;
    if first.status.success() {
        return Ok(());
    }
    // The package lists may be missing or stale: update once, then retry.
    let mut update = clone_command(&base);
    update.args(["update", "-qq"]);
    let _ = output_within(update, INSTALL_TIMEOUT)?;
    let second = install(&base)?;
    if second.status.success() {
        Ok(())
    } else {
        Err(tail(&second))
    }
}

fn clone_command(c: &Command) -> Command {
    let mut n = Command::new(c.get_program());
    n.args(c.get_args());
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => n.env(k, v),
            None => n.env_remove(k),
        };
    }
    n
}

/// The last lines of a child's stderr (or stdout), for a message.
pub fn tail(out: &Output) -> String {
    let text = if out.stderr.is_empty() {
        &out.stdout
    } else {
        &out.stderr
    };
    let s = String::from_utf8_lossy(text);
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// How long a short child (a CLI call, a compiled test program, a forked
/// checker) may run in a test before it is killed and the test fails.
pub const CHILD_LIMIT: Duration = Duration::from_secs(120);

/// `Command::output` with a deadline: `cmd.bounded_output()` runs the
/// command as `output()` does (stdin closed, stdout and stderr captured)
/// and panics, naming it, if it does not end within [`CHILD_LIMIT`].
pub trait BoundedOutput {
    /// See the trait.
    fn bounded_output(&mut self) -> Output;
}

impl BoundedOutput for Command {
    #[track_caller]
    fn bounded_output(&mut self) -> Output {
        let name = self.get_program().to_string_lossy().into_owned();
        let child = self
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run `{name}`: {e}"));
        wait_output(&name, child, CHILD_LIMIT).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// `Child::wait_with_output` with a deadline ([`CHILD_LIMIT`]): panics,
/// naming the child, if it does not end in time (after killing it).
#[track_caller]
pub fn bounded_wait_output(child: std::process::Child) -> Output {
    let name = format!("child {}", child.id());
    wait_output(&name, child, CHILD_LIMIT).unwrap_or_else(|e| panic!("{e}"))
}

/// Waits for the forked child `pid` at most [`CHILD_LIMIT`] and returns
/// its raw wait status; SIGKILLs it and panics after that.
#[track_caller]
pub fn bounded_waitpid(pid: libc::pid_t) -> libc::c_int {
    let deadline = Instant::now() + CHILD_LIMIT;
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our own child with a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(
            r >= 0,
            "waitpid({pid}) failed: {}",
            std::io::Error::last_os_error()
        );
        if r == pid {
            return status;
        }
        if Instant::now() >= deadline {
            // SAFETY: kill(2) on our own child, then reap it.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("forked child {pid} did not exit within {CHILD_LIMIT:?} and was killed");
        }
        // A time bound on the wait, not synchronisation: the outcome is the
        // child's exit status.
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Runs `cmd` to its end with stdin closed and stdout/stderr captured,
/// killing it after `limit`. `Err` names the program when it cannot be
/// started or did not end in time (with what it printed so far).
pub fn output_within(mut cmd: Command, limit: Duration) -> Result<Output, String> {
    let name = cmd.get_program().to_string_lossy().into_owned();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run `{name}`: {e}"))?;
    wait_output(&name, child, limit)
}

/// Collects a spawned child's output (its piped stdout and stderr, if
/// any), killing it after `limit`.
fn wait_output(
    name: &str,
    mut child: std::process::Child,
    limit: Duration,
) -> Result<Output, String> {
    // Drain both pipes on threads, so a chatty child never blocks on a
    // full pipe while we wait for its exit.
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let status = wait_within(&mut child, limit);
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    match status {
        Some(status) => Ok(Output {
            status,
            stdout,
            stderr,
        }),
        None => Err(format!(
            "`{name}` did not end within {limit:?} and was killed; it printed:\n{}{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        )),
    }
}

/// [`output_within`] that panics with the message on failure to run or
/// finish (the exit status is the caller's to judge).
#[track_caller]
pub fn output_of(cmd: Command, limit: Duration) -> Output {
    output_within(cmd, limit).unwrap_or_else(|e| panic!("{e}"))
}

/// Waits for `child` at most `limit`; kills and reaps it and returns `None`
/// after that.
pub fn wait_within(child: &mut std::process::Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) => {}
            Err(_) => return None,
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        // A time bound on the wait, not synchronisation: the outcome is the
        // child's exit status.
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// An exclusive `flock` on a file, for setup that must run once on the
/// machine at a time (an install, `npm ci`), held until drop. Taking it is
/// bounded too: a holder that does not let go within [`INSTALL_TIMEOUT`]
/// is an error naming the file.
pub struct FileLock(File);

impl FileLock {
    /// Takes the lock on `path` (created if needed).
    pub fn take(path: &Path) -> Result<FileLock, String> {
        use std::os::fd::AsRawFd;
        let f = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| format!("cannot open the lock file {}: {e}", path.display()))?;
        let deadline = Instant::now() + INSTALL_TIMEOUT;
        loop {
            // SAFETY: flock on an fd this function owns, non-blocking.
            let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if r == 0 {
                return Ok(FileLock(f));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} stayed locked for {INSTALL_TIMEOUT:?} (another test's install?)",
                    path.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
