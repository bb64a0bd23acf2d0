//! The Python binding's own tests (`python/tests`, stdlib `unittest`), run
//! against the freshly built library.

mod support;

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
