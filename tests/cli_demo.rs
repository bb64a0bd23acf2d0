//! The `shmsched demo` command, end to end (each run is bounded: the demo
//! stops itself after `--seconds`, and the test kills it after a deadline).

mod procs;

use std::process::Output;
use std::time::Duration;

use serde_json::Value;

/// Runs the binary with `args`, killing it after `limit`.
fn run(args: &[&str], limit: Duration) -> Output {
    let (out, _, pid) = procs::cli_within(args, limit);
    let leftovers: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("shmsched.demo-{pid}-"))
        })
        .collect();
    assert!(
        leftovers.is_empty(),
        "demo left its region behind: {leftovers:?}"
    );
    out
}

fn summary(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "status {:?}\nstdout: {text}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {text}"))
}

#[test]
fn demo_small_run_respects_the_cap_and_leaks_nothing() {
    let out = run(
        &[
            "demo",
            "--seconds",
            "2",
            "--workers",
            "4",
            "--cap",
            "2",
            "--json",
        ],
        Duration::from_secs(30),
    );
    let s = summary(&out);
    assert_eq!(s["cap"], 2);
    assert_eq!(s["workers"], 4);
    let max = s["max_running_observed"].as_u64().unwrap();
    assert!((1..=2).contains(&max), "{s}");
    assert_eq!(s["leaked"], 0, "{s}");
    assert_eq!(s["leftover_processes"], 0, "{s}");
    assert_eq!(s["killed"], 0, "{s}");
    assert_eq!(
        s["reaped_processes"], 0,
        "clean workers detach, nothing to reap: {s}"
    );
    let rows = s["priorities"].as_array().unwrap();
    assert_eq!(rows.len(), 5);
    let per: u64 = rows.iter().map(|r| r["completed"].as_u64().unwrap()).sum();
    assert_eq!(per, s["completed"].as_u64().unwrap());
    // 2 slots, reads of 2..20 ms, 2 s: well over 100 tasks.
    assert!(per > 100, "{s}");
    for r in rows {
        assert!(
            r["wait_p50_ms"].as_f64().unwrap() <= r["wait_p99_ms"].as_f64().unwrap(),
            "{r}"
        );
    }
}

#[test]
fn demo_with_kills_reclaims_and_leaks_nothing() {
    let out = run(
        &["demo", "--seconds", "3", "--kill", "3", "--json"],
        Duration::from_secs(40),
    );
    let s = summary(&out);
    assert_eq!(s["killed"], 3, "{s}");
    assert_eq!(s["respawned"], 3, "{s}");
    assert_eq!(
        s["reaped_processes"], 3,
        "each killed worker is reaped once: {s}"
    );
    assert_eq!(s["leaked"], 0, "{s}");
    assert_eq!(s["leftover_processes"], 0, "{s}");
    assert!(s["max_running_observed"].as_u64().unwrap() <= 4, "{s}");
    // Kills prefer a worker that holds a slot; under saturation most do.
    assert!(s["slots_reclaimed"].as_u64().unwrap() <= 3 * 4, "{s}");
}

#[test]
fn demo_human_output_has_the_table() {
    let out = run(
        &[
            "demo",
            "--seconds",
            "1",
            "--workers",
            "3",
            "--cap",
            "1",
            "--kill",
            "1",
        ],
        Duration::from_secs(30),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for want in [
        "priority",
        "highest",
        "lowest",
        "wait p99",
        "max running observed: 1 (cap 1)",
        "leaked: 0",
        "SIGKILLed: 1",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("completed"), "progress line missing: {err}");
}

#[test]
fn bad_arguments_are_clear_errors() {
    for (args, needle) in [
        (&["demo", "--workers", "0"][..], "0"),
        (&["demo", "--cap", "abc"][..], "abc"),
        (&["demo", "--seconds", "-1"][..], "at most 86400"),
        (&["demo", "--seconds", "nan"][..], "nan"),
        (&["demo", "--kill", "x"][..], "x"),
        // Negative numbers are values out of range, not unknown flags.
        (&["demo", "--cap", "-1"][..], "-1 is not in 1..=65536"),
        (&["demo", "--kill", "-3"][..], "-3 is not in 0..=10000"),
        (&["stat"][..], "REGION"),
        (&["watch", "r", "--count", "0"][..], "0 is not in 1..="),
        (&["watch", "r", "--count", "-1"][..], "-1 is not in 1..="),
        (&["frobnicate"][..], "frobnicate"),
    ] {
        let out = run(args, Duration::from_secs(10));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(needle),
            "{args:?}: error does not name {needle:?}: {err}"
        );
    }
}
