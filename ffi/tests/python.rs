//! The Python binding's own tests (`python/tests`, stdlib `unittest`):
//! once against the freshly built library from the source tree (the fast
//! path), once against the package as a user installs it
//! (`pip install ./python` into a fresh venv, no `SHMSCHED_LIB`).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{python, repo_root, Kid};

#[test]
fn python_unittests_pass() {
    let mut cmd = python();
    cmd.args(["-m", "unittest", "discover", "-s", "python/tests", "-v"])
        .current_dir(repo_root())
        .env("RUST_BACKTRACE", "0");
    let mut kid = Kid::spawn("python3 -m unittest", cmd);
    let out = kid.rest();
    let status = kid.wait();
    assert!(
        status.success(),
        "python3 -m unittest failed ({status:?}); see its report above (stderr)\n{}",
        out.join("\n")
    );
}

/// `examples/python_pool.py`: a multiprocessing pool sharing one cap and
/// one byte budget; it checks the cap from inside every holder.
#[test]
fn python_pool_example_runs() {
    let mut cmd = python();
    cmd.arg("examples/python_pool.py")
        .args(["--workers", "4", "--cap", "2", "--tasks", "60"])
        .current_dir(repo_root());
    let mut kid = Kid::spawn("python_pool.py", cmd);
    let out = kid.rest();
    let status = kid.wait();
    let report = out.join("\n");
    assert!(status.success(), "python_pool.py failed:\n{report}");
    assert!(report.contains("max running seen by a holder"), "{report}");
    assert_eq!(out.last().map(String::as_str), Some("ok"), "{report}");
}

/// Runs `cmd` with its output in `log`, killing it after `limit`; panics
/// with the log's tail when it fails or overruns.
fn run_bounded(what: &str, mut cmd: Command, log: &Path, limit: Duration) {
    let file = std::fs::File::create(log).expect("create log");
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone().expect("dup log"))
        .stderr(file);
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let tail = |log: &Path| {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    };
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            assert!(
                st.success(),
                "{what} failed ({st:?}) after {:.1} s; the end of {}:\n{}",
                start.elapsed().as_secs_f64(),
                log.display(),
                tail(log)
            );
            eprintln!("{what}: {:.1} s", start.elapsed().as_secs_f64());
            return;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} did not finish within {limit:?}; the end of {}:\n{}",
                log.display(),
                tail(log)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The target directory and cargo profile this test binary was built with
/// (`<target>/<profile>/deps/<binary>`), so that the package's build reuses
/// what cargo already compiled for the tests.
fn target_and_profile() -> (PathBuf, String) {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in <target>/<profile>/deps");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_string(),
        Some(other) => other.to_string(),
        None => panic!("cannot tell the profile from {}", exe.display()),
    };
    (
        profile_dir.parent().expect("target dir").to_path_buf(),
        profile,
    )
}

/// A fresh venv, `pip install ./python` in it (the PEP 517 build compiles
/// `libshmsched.so` with cargo and puts it inside the package), then the
/// Python tests run against the installed package: from a directory outside
/// the checkout, with no `SHMSCHED_LIB` and no `PYTHONPATH`, and the test
/// checks that the library loaded is the one inside site-packages and that
/// `py.typed` was installed.
///
/// The build is the one a user runs, with two settings for the test's
/// sake: cargo builds into this test's target directory with this test's
/// profile (`SETUPTOOLS_RUST_CARGO_PROFILE`), so that it reuses what was
/// just compiled instead of a release build of everything (a user's
/// `pip install ./python` builds release).
#[test]
fn python_package_installs_and_its_tests_pass() {
    let root = repo_root();
    let scratch = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("python-package-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).expect("create scratch dir");
    let venv = scratch.join("venv");
    let py = venv.join("bin/python");

    let mut mk = Command::new("python3");
    mk.args(["-m", "venv"]).arg(&venv);
    run_bounded(
        "python3 -m venv",
        mk,
        &scratch.join("venv.log"),
        Duration::from_secs(300),
    );

    // The venv's python, in the scratch directory, with nothing pointing
    // at the checkout.
    let venv_python = |args: &[&str]| {
        let mut c = Command::new(&py);
        c.args(args)
            .current_dir(&scratch)
            .env_remove("SHMSCHED_LIB")
            .env_remove("PYTHONPATH")
            .env("RUST_BACKTRACE", "0");
        c
    };
    let (target, profile) = target_and_profile();
    let mut pip = venv_python(&[
        "-m",
        "pip",
        "install",
        "--no-input",
        "--progress-bar",
        "off",
    ]);
    pip.arg(root.join("python"))
        .env("CARGO_TARGET_DIR", &target)
        .env("SETUPTOOLS_RUST_CARGO_PROFILE", &profile);
    run_bounded(
        "pip install ./python",
        pip,
        &scratch.join("pip.log"),
        Duration::from_secs(1200),
    );

    let check = r#"
import os, shmsched
here = os.path.dirname(shmsched.__file__)
assert "site-packages" in here, here
assert os.path.dirname(shmsched.LIBRARY_PATH) == here, shmsched.LIBRARY_PATH
assert os.path.exists(os.path.join(here, "py.typed"))
print("installed", shmsched.__version__, shmsched.LIBRARY_PATH)
"#;
    run_bounded(
        "import the installed package",
        venv_python(&["-c", check]),
        &scratch.join("import.log"),
        Duration::from_secs(120),
    );

    let mut tests = venv_python(&["-m", "unittest", "discover", "-v", "-s"]);
    tests.arg(root.join("python/tests"));
    run_bounded(
        "python tests against the installed package",
        tests,
        &scratch.join("unittest.log"),
        Duration::from_secs(600),
    );
    let _ = std::fs::remove_dir_all(&scratch);
}
