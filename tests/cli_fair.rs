//! `shmsched fair replay`: FAIR-SHARE.md trace T09 through the CLI.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_shmsched");

/// T09 with Cfg2, times shifted by +10 000 (unsigned time).
const T09: &str = r#"{"op":"config","ceiling":100,"fairness_unit":"cost","tenants":[{"id":"a","weight":1},{"id":"b","weight":1}],"reclaim_horizon_ms":100,"idle_after_ms":1000,"started_at_ms":0}
{"op":"acquire","tenant":"b","cost":50,"hold_ms":1000,"now_ms":10000}
{"op":"acquire","tenant":"b","cost":50,"hold_ms":100,"now_ms":10000}
{"op":"acquire","tenant":"a","cost":50,"hold_ms":100,"now_ms":10010}
{"op":"release","lease":"b2","now_ms":10100}

{"op":"acquire","tenant":"b","cost":50,"hold_ms":100,"now_ms":10100}
{"op":"acquire","tenant":"a","cost":50,"hold_ms":100,"now_ms":10100}
{"op":"stats","now_ms":10100}
"#;

fn check_t09(stdout: &[u8]) {
    let lines: Vec<Value> = String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len(), 8, "{lines:?}");
    assert_eq!(lines[1]["lease"], "b1");
    assert_eq!(lines[2]["lease"], "b2");
    assert_eq!(lines[2]["slices"][0]["lender"], "a");
    assert_eq!(lines[2]["deadline_ms"], 10100);
    assert_eq!(lines[3]["ok"], false);
    assert_eq!(lines[3]["reason"], "guarantee_on_loan");
    assert_eq!(lines[3]["retry_after_ms"], 90);
    assert_eq!(lines[3]["blocking_leases"][0], "b2");
    assert_eq!(lines[4]["ok"], true);
    assert_eq!(lines[5]["ok"], false, "a is frozen: b is refused");
    assert_eq!(lines[6]["ok"], true, "a is admitted at t=100");
    assert_eq!(lines[7]["tenants"]["a"]["worst_reclaim_ms"], 90);
    assert_eq!(lines[7]["tenants"]["a"]["deficit_unit_ms"], 4500);
}

#[test]
fn replay_from_a_file_reproduces_t09() {
    let path = std::env::temp_dir().join(format!("shmsched-cli-t09-{}.jsonl", std::process::id()));
    std::fs::write(&path, T09).unwrap();
    let out = Command::new(BIN)
        .args(["fair", "replay"])
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_t09(&out.stdout);
}

#[test]
fn replay_from_stdin_reproduces_t09() {
    let mut child = Command::new(BIN)
        .args(["fair", "replay", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(T09.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    check_t09(&out.stdout);
}

#[test]
fn replay_of_a_missing_file_names_it() {
    let out = Command::new(BIN)
        .args(["fair", "replay", "/nonexistent/shmsched-log.jsonl"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/shmsched-log.jsonl"), "{err}");
}

#[test]
fn misuse_lines_are_answered_and_counted() {
    let mut child = Command::new(BIN)
        .args(["fair", "replay", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"not json\n{\"op\":\"stats\",\"now_ms\":1}\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("2 answered with an error"));
}
