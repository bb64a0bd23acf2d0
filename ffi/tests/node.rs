//! The Node.js binding's own tests (`node/test`, `node --test`): in the
//! source tree against the freshly built library, and as a user gets the
//! package: `npm pack` of `node/` (which ships the library inside),
//! installed into a scratch project of its own, the same tests run there
//! against the installed copy (no `SHMSCHED_LIB`).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use support::tools::output_within;
use support::{node, repo_root, shared_lib};

/// The longest one step (npm pack, npm install, a test run) may take.
const STEP: Duration = Duration::from_secs(300);

/// Runs `cmd` to the end, at most `limit` (killed after that, and the test
/// fails naming it); returns its status and its stdout and stderr together.
fn run(what: &str, cmd: Command, limit: Duration) -> (ExitStatus, String) {
    let out = output_within(cmd, limit).unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, text)
}

/// The count on `node --test`'s closing `# pass N` line.
fn passed(report: &str) -> u32 {
    report
        .lines()
        .find_map(|l| l.strip_prefix("# pass "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// `node --test` in `dir`, with `env` set; asserts it passed at least
/// `min` tests.
fn node_tests(what: &str, mut cmd: Command, dir: &Path, min: u32) {
    cmd.arg("--test")
        .current_dir(dir)
        .env("RUST_BACKTRACE", "0");
    let (status, report) = run(what, cmd, STEP);
    assert!(status.success(), "{what} failed ({status:?}):\n{report}");
    let n = passed(&report);
    assert!(
        n >= min,
        "{what} ran {n} tests (expected {min} or more):\n{report}"
    );
}

/// The two runs of the suite load both cores (5,000 waits, the bad-input
/// children): one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn node_tests_pass() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    node_tests(
        "node --test (source tree)",
        node(),
        &repo_root().join("node"),
        20,
    );
}

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn npm_pack_installs_into_a_scratch_project_and_its_tests_pass_there() {
    let pkg = repo_root().join("node");
    // node() checks that node and the binding's dependencies are there.
    drop(node());
    let scratch =
        Scratch(std::env::temp_dir().join(format!("shmsched-npm-scratch-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&scratch.0);
    std::fs::create_dir_all(&scratch.0).unwrap();

    // 1. npm pack: prepack ships the library given by SHMSCHED_LIB.
    let mut pack = Command::new("npm");
    pack.args(["pack", "--json", "--pack-destination"])
        .arg(&scratch.0)
        .current_dir(&pkg)
        .env("SHMSCHED_LIB", shared_lib());
    let (st, out) = run("npm pack", pack, STEP);
    assert!(st.success(), "npm pack failed:\n{out}");
    let tarball = std::fs::read_dir(&scratch.0)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "tgz"))
        .unwrap_or_else(|| panic!("npm pack made no tarball:\n{out}"));
    assert!(
        out.contains("native/linux-x64/libshmsched.so") || out.contains("native/"),
        "the tarball ships the library:\n{out}"
    );
    assert!(
        !pkg.join("native").exists(),
        "postpack left node/native behind"
    );

    // 2. A project of its own installs it (and TypeScript, for the types
    //    test), from the registry's cache where it can.
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(pkg.join("package.json")).unwrap()).unwrap();
    let ts = manifest["devDependencies"]["typescript"]
        .as_str()
        .expect("typescript in devDependencies");
    let project = scratch.0.join("project");
    std::fs::create_dir_all(project.join("test")).unwrap();
    std::fs::write(
        project.join("package.json"),
        serde_json::json!({
            "name": "shmsched-scratch",
            "version": "1.0.0",
            "private": true,
            "type": "module",
            "dependencies": {
                "shmsched": format!("file:{}", tarball.display()),
                "typescript": ts,
            },
        })
        .to_string(),
    )
    .unwrap();
    let mut install = Command::new("npm");
    install
        .args(["install", "--prefer-offline", "--no-audit", "--no-fund"])
        .current_dir(&project);
    let (st, out) = run("npm install (scratch project)", install, STEP);
    assert!(
        st.success(),
        "npm install in the scratch project failed:\n{out}"
    );
    let installed = project.join("node_modules/shmsched");
    assert!(
        installed.join("native/linux-x64/libshmsched.so").exists()
            || std::fs::read_dir(installed.join("native")).is_ok(),
        "the installed package has its library"
    );

    // 3. The package's tests, copied beside it, run against the installed
    //    copy: `import 'shmsched'` resolves to node_modules, and the
    //    library is the one shipped inside (no SHMSCHED_LIB).
    copy_dir(&pkg.join("test"), &project.join("test"));
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = Command::new("node");
    cmd.env_remove("SHMSCHED_LIB")
        .env("SHMSCHED_EXPECT_LIB", "node_modules/shmsched/native/");
    node_tests("node --test (installed package)", cmd, &project, 20);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let p = e.path();
        let dest = to.join(e.file_name());
        if p.is_dir() {
            copy_dir(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).unwrap();
        }
    }
}
