//! Cell tokens from C (`tests/c/cell_token.c`): double, stale and garbage
//! releases, table tokens for weighted and child permits, a release after
//! close, max 1 and max 65,536 (slot 65,535 round-trips), and a forked child
//! that cannot release its parent's token.

mod support;

use std::process::Command;

use support::{compile_c, test_file, Kid};

#[test]
fn cell_tokens_from_c() {
    let exe = compile_c("cell_token", &[test_file("c/cell_token.c")]);
    let mut cmd = Command::new(exe);
    cmd.env("RUST_BACKTRACE", "0");
    let mut kid = Kid::spawn("cell_token", cmd);
    let lines = kid.rest();
    let status = kid.wait();
    let failures: Vec<&String> = lines.iter().filter(|l| l.starts_with("FAIL")).collect();
    assert!(
        failures.is_empty() && status.success() && lines.iter().any(|l| l == "done"),
        "cell_token.c ({status:?}):\n{}",
        lines.join("\n")
    );
}
