//! The waitset (`shmsched_waitset_*`) from C, by `tests/c/waitset.c`:
//! 5,000 pending acquires on one waitset start quickly and without a
//! thread each, complete as capacity frees, cancel and close leave 0
//! waiters and 0 held, timeouts fire, a cancelled consume gives its tokens
//! back, and a High wait in a waitset is served before a Low blocking
//! waiter in another process. Prints the figures it measured.

mod support;

use std::process::Command;

use support::{compile_c, test_file, Kid, TempRegion};

#[test]
fn waitset_from_c() {
    let exe = compile_c("waitset", &[test_file("c/waitset.c")]);
    let prefix = TempRegion::new("waitset");
    let mut cmd = Command::new(exe);
    cmd.arg(&prefix.0).env("RUST_BACKTRACE", "0");
    let mut kid = Kid::spawn("waitset", cmd);
    let lines = kid.rest();
    let status = kid.wait();
    let report = lines.join("\n");
    eprintln!("{report}");
    let failures: Vec<&String> = lines.iter().filter(|l| l.starts_with("FAIL")).collect();
    assert!(
        failures.is_empty() && status.success(),
        "waitset.c failed ({status:?}):\n{report}"
    );
    let figure = |name: &str| -> f64 {
        lines
            .iter()
            .find_map(|l| l.strip_prefix(&format!("figure {name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no figure {name}:\n{report}"))
    };
    // Loose bounds (the machine is shared): starting 5,000 waits is a
    // matter of milliseconds, not the seconds a thread per wait took.
    assert!(figure("start_5000_ms") < 2_000.0, "{report}");
    assert!(
        figure("threads_after") - figure("threads_before") <= 1.0,
        "{report}"
    );
}
