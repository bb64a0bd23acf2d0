//! The Node.js binding's own tests (`node/test`, `node --test`), run
//! against the freshly built library.

mod support;

use support::{node, repo_root, Kid};

#[test]
fn node_tests_pass() {
    let mut cmd = node();
    cmd.arg("--test")
        .current_dir(repo_root().join("node"))
        .env("RUST_BACKTRACE", "0");
    let mut kid = Kid::spawn("node --test", cmd);
    let out = kid.rest();
    let status = kid.wait();
    let report = out.join("\n");
    assert!(
        status.success(),
        "node --test failed ({status:?}):\n{report}"
    );
    let passed = out
        .iter()
        .find_map(|l| l.strip_prefix("# pass "))
        .and_then(|n| n.trim().parse::<u32>().ok())
        .unwrap_or(0);
    assert!(passed >= 7, "node --test ran {passed} tests:\n{report}");
}
