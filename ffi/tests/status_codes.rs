//! Every status code the header defines is produced from C by
//! `tests/c/status_codes.c`, with the calls that should produce it (bad
//! region, wrong kind, zero concurrency, timeout, disposed, double
//! release, foreign permit, NULL handle, invalid priority, …), and the
//! conventions around failures hold (message left for the thread, outputs
//! untouched, size-prefixed stats, truncation).

mod support;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use support::{
    compile_c, documented_errors, header_functions, header_status_codes, output_of, test_file, Kid,
    TempRegion,
};

#[test]
fn every_status_code_is_produced_from_c() {
    let exe = compile_c("status_codes", &[test_file("c/status_codes.c")]);
    let prefix = TempRegion::new("codes");
    let mut cmd = Command::new(exe);
    cmd.arg(&prefix.0).env("RUST_BACKTRACE", "0");
    let mut kid = Kid::spawn("status_codes", cmd);
    let lines = kid.rest();
    let status = kid.wait();
    let failures: Vec<&String> = lines.iter().filter(|l| l.starts_with("FAIL")).collect();
    assert!(
        failures.is_empty() && status.success(),
        "status_codes.c reported failures ({status:?}):\n{}",
        failures
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let produced: BTreeSet<u32> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("produced "))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    let defined = header_status_codes();
    assert!(defined.len() >= 25, "parsed the header's enum: {defined:?}");
    // Kept in the header for ABI stability, no longer returned: a
    // fair-share ledger in a region takes a `now` earlier than its last
    // accepted one as that one (issue 20), and the C ABI's ledgers are all
    // in regions.
    let retired = ["SHMSCHED_STATUS_TIME_WENT_BACKWARDS"];
    let missing: Vec<&(String, u32)> = defined
        .iter()
        .filter(|(n, v)| !produced.contains(v) && !retired.contains(&n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "status codes no test produced: {missing:?}"
    );
    // Every status a function was seen to return is in the "Errors:" list
    // of that function's doc comment.
    let functions = header_functions();
    let name_of = |code: u32| {
        defined
            .iter()
            .find(|(_, v)| *v == code)
            .map(|(n, _)| n.trim_start_matches("SHMSCHED_STATUS_").to_string())
    };
    let mut undocumented = BTreeSet::new();
    let mut pairs = 0;
    for l in &lines {
        let Some(rest) = l.strip_prefix("produced ") else {
            continue;
        };
        let mut w = rest.split_whitespace();
        let (Some(code), Some(func)) = (w.next().and_then(|c| c.parse::<u32>().ok()), w.next())
        else {
            continue;
        };
        if code == 0 || func == "-" {
            continue;
        }
        assert!(
            functions.iter().any(|(n, _)| n == func),
            "{func} (from status_codes.c) is not in the header"
        );
        let status = name_of(code).unwrap_or_else(|| format!("code {code}"));
        pairs += 1;
        if !documented_errors(&functions, func).contains(&status) {
            undocumented.insert(format!("{func} returns {status}"));
        }
    }
    assert!(
        pairs >= 60,
        "only {pairs} (function, status) pairs were checked"
    );
    assert!(
        undocumented.is_empty(),
        "statuses returned but not listed under the function's \"Errors:\" in the header: {undocumented:#?}"
    );
    // The forked children printed their own lines: the FORKED and
    // FOREIGN_PERMIT checks ran in a child as well as in the parent.
    assert!(
        lines
            .iter()
            .any(|l| l.contains("acquire on an inherited scheduler handle")),
        "the fork checks ran"
    );
}

/// A panic inside the library is caught silently: the status is INTERNAL,
/// the message (with where it happened) is the thread's last error, and
/// nothing at all reaches the host program's stderr.
#[test]
fn a_caught_panic_prints_nothing_on_stderr() {
    let exe = compile_c("panic_quiet", &[test_file("c/panic_quiet.c")]);
    let mut cmd = Command::new(exe);
    cmd.env("RUST_BACKTRACE", "1");
    let out = output_of(cmd, Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{:?}: {stdout}", out.status);
    assert!(
        out.stderr.is_empty(),
        "the library wrote to stderr: {:?}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("status 24"), "{stdout}");
    assert!(
        stdout.contains("shmsched_debug_panic was called") && stdout.contains("lib.rs:"),
        "the message says what panicked and where: {stdout}"
    );
}

/// `switch ((enum shmsched_status)st)` is checked by -Wswitch (part of
/// -Wall) in C99, C11 and C++: a switch that misses a code does not
/// compile with -Werror, and one that covers them all does, while
/// `shmsched_status` itself keeps the ABI's width (`uint32_t` in C).
#[test]
fn a_switch_over_statuses_is_checked_for_coverage() {
    let codes = header_status_codes();
    let cases = |skip: usize| -> String {
        codes
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != skip)
            .map(|(_, (n, _))| format!("    case {n}: return 1;\n"))
            .collect()
    };
    let program = |body: String| {
        format!(
            "#include \"shmsched.h\"\n\
             _Static_assert_placeholder\n\
             int classify(shmsched_status st);\n\
             int classify(shmsched_status st) {{\n  switch ((enum shmsched_status)st) {{\n{body}  }}\n  return 0;\n}}\n"
        )
    };
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-switch");
    std::fs::create_dir_all(&dir).unwrap();
    for (compiler, lang, std, width) in [
        (
            support::cc(),
            "c",
            "c99",
            "typedef char width_check[sizeof(shmsched_status) == 4 ? 1 : -1];",
        ),
        (
            support::cc(),
            "c",
            "c11",
            "_Static_assert(sizeof(shmsched_status) == 4, \"uint32_t\");",
        ),
        (
            support::cxx(),
            "c++",
            "c++11",
            "static_assert(sizeof(shmsched_status) == 4, \"uint32_t\");",
        ),
    ] {
        for (skip, must_compile) in [(usize::MAX, true), (3, false)] {
            let src = dir.join(format!(
                "switch-{std}-{must_compile}.{}",
                if lang == "c" { "c" } else { "cpp" }
            ));
            std::fs::write(
                &src,
                program(cases(skip)).replace("_Static_assert_placeholder", width),
            )
            .unwrap();
            let mut cmd = Command::new(&compiler);
            cmd.args([
                "-x",
                lang,
                &format!("-std={std}"),
                "-Wall",
                "-Wextra",
                "-Werror",
                "-fsyntax-only",
            ])
            .arg("-I")
            .arg(support::include_dir())
            .arg(&src);
            let out = output_of(cmd, support::BUILD_TIMEOUT);
            let err = String::from_utf8_lossy(&out.stderr);
            if must_compile {
                assert!(
                    out.status.success(),
                    "{std}: a complete switch must compile:\n{err}"
                );
            } else {
                assert!(
                    !out.status.success(),
                    "{std}: a switch missing {} must not compile",
                    codes[3].0
                );
                assert!(
                    err.contains(&codes[3].0),
                    "{std}: the compiler names the missing case:\n{err}"
                );
            }
        }
    }
}
