//! `shmsched fair replay`: the freeze trace (T09 of `tests/common`) through
//! the CLI, and its exit status on logs that are not valid
//! (`docs/fair-share.md`, "Call logs").

mod tools;

use std::io::Write;
use std::process::{Command, Stdio};
use tools::BoundedOutput;

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
        .bounded_output();
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
    let out = tools::bounded_wait_output(child);
    assert!(out.status.success());
    check_t09(&out.stdout);
}

#[test]
fn replay_of_a_missing_file_names_it() {
    let out = Command::new(BIN)
        .args(["fair", "replay", "/nonexistent/shmsched-log.jsonl"])
        .bounded_output();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/shmsched-log.jsonl"), "{err}");
}

/// Replays `log` from stdin; returns (exit code, stdout lines, stderr).
fn replay_stdin(log: &str) -> (Option<i32>, Vec<String>, String) {
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
        .write_all(log.as_bytes())
        .unwrap();
    let out = tools::bounded_wait_output(child);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(String::from)
            .collect(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const CONFIG: &str = r#"{"op":"config","ceiling":100,"fairness_unit":"cost","tenants":[{"id":"a","weight":1}],"reclaim_horizon_ms":100,"idle_after_ms":1000,"started_at_ms":0}"#;

/// Stumble 5: malformed lines, an unknown op, a missing config line and an
/// empty log all exited 0. Each is now exit 1, named with its line number,
/// while every line is still answered.
#[test]
fn invalid_logs_exit_1_and_name_the_line() {
    let (code, out, err) = replay_stdin("not json\n{\"op\":\"stats\",\"now_ms\":1}\n");
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(out.len(), 2);
    assert!(err.contains("-:1: malformed log line"), "{err}");
    assert!(
        err.contains("-:2: no ledger: the log must start with a config line"),
        "{err}"
    );

    let (code, out, err) = replay_stdin(&format!(
        "{CONFIG}\n\n{{\"op\":\"frobnicate\",\"now_ms\":1}}\n"
    ));
    assert_eq!(code, Some(1));
    assert_eq!(out.len(), 2);
    assert!(err.contains("-:3: unknown op \"frobnicate\""), "{err}");

    let (code, _, err) = replay_stdin(&format!(
        "{CONFIG}\n{{\"op\":\"acquire\",\"tenant\":\"a\",\"now_ms\":1}}\n"
    ));
    assert_eq!(code, Some(1));
    assert!(err.contains("-:2: missing field \"cost\""), "{err}");

    let (code, out, err) = replay_stdin("\n  \n");
    assert_eq!(code, Some(1));
    assert!(out.is_empty());
    assert!(err.contains("empty"), "{err}");
}

/// A call the ledger answers with a misuse error (here a double release)
/// is part of the recorded behaviour: answered, exit 0.
#[test]
fn misuse_answers_are_not_failures() {
    let log = format!(
        "{CONFIG}\n{}\n{}\n{}\n",
        r#"{"op":"acquire","tenant":"a","cost":10,"hold_ms":50,"now_ms":5}"#,
        r#"{"op":"release","lease":"a1","now_ms":6}"#,
        r#"{"op":"release","lease":"a1","now_ms":7}"#
    );
    let (code, out, err) = replay_stdin(&log);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.len(), 4);
    assert!(out[3].contains("already released"), "{}", out[3]);
}
