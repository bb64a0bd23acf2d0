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
