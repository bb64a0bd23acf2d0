//! `include/shmsched.h` is current (regenerated with the pinned cbindgen
//! and compared byte for byte) and compiles as C99, C11, C++11 and C++17
//! with `-Wall -Wextra -Werror -pedantic`.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::{include_dir, repo_root};

/// The cbindgen version the header is generated with (also in
/// `ffi/cbindgen.toml` and `.ci/run`).
const CBINDGEN_VERSION: &str = "0.29.4";

fn cbindgen() -> PathBuf {
    let candidates = [
        std::env::var_os("CBINDGEN").map(PathBuf::from),
        Some(PathBuf::from("cbindgen")),
        std::env::var_os("CARGO_HOME").map(|h| Path::new(&h).join("bin/cbindgen")),
        std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo/bin/cbindgen")),
    ];
    for c in candidates.into_iter().flatten() {
        if let Ok(out) = Command::new(&c).arg("--version").output() {
            let v = String::from_utf8_lossy(&out.stdout);
            if v.trim() == format!("cbindgen {CBINDGEN_VERSION}") {
                return c;
            }
        }
    }
    panic!(
        "cbindgen {CBINDGEN_VERSION} is not installed (the header is generated with that exact \
         version). Install it with:\n    cargo install cbindgen --version {CBINDGEN_VERSION} --locked\n\
         (.ci/run does this), or point CBINDGEN at it."
    );
}

#[test]
fn header_is_current() {
    let out = std::env::temp_dir().join(format!("shmsched-header-{}.h", std::process::id()));
    let res = Command::new(cbindgen())
        .args([
            "--config",
            "ffi/cbindgen.toml",
            "--crate",
            "shmsched-ffi",
            "--quiet",
            "--output",
        ])
        .arg(&out)
        .current_dir(repo_root())
        .output()
        .expect("run cbindgen");
    assert!(
        res.status.success(),
        "cbindgen failed:\n{}",
        String::from_utf8_lossy(&res.stderr)
    );
    let fresh = std::fs::read_to_string(&out).expect("read generated header");
    let _ = std::fs::remove_file(&out);
    let committed =
        std::fs::read_to_string(include_dir().join("shmsched.h")).expect("read committed header");
    if fresh != committed {
        let line = fresh
            .lines()
            .zip(committed.lines())
            .position(|(a, b)| a != b)
            .map_or(fresh.lines().count().min(committed.lines().count()), |i| i);
        panic!(
            "ffi/include/shmsched.h is out of date (first difference at line {}):\n  \
             generated: {:?}\n  committed: {:?}\nRegenerate it from the repository root with:\n    \
             cbindgen --config ffi/cbindgen.toml --crate shmsched-ffi --output ffi/include/shmsched.h",
            line + 1,
            fresh.lines().nth(line).unwrap_or("<end>"),
            committed.lines().nth(line).unwrap_or("<end>"),
        );
    }
}

/// A translation unit that includes the header and touches every kind of
/// declaration in it (constants, enums, structs, functions).
const PROBE: &str = r#"
#include "shmsched.h"
#include <stddef.h>

int probe(void);
int probe(void) {
    shmsched_status st = SHMSCHED_STATUS_OK;
    shmsched_priority p = SHMSCHED_PRIORITY_HIGHEST;
    shmsched_permit permit = {0, 0};
    shmsched_concurrency c = shmsched_concurrency_max(SHMSCHED_UNLIMITED);
    shmsched_scheduler_stats s;
    shmsched_limiter_stats l;
    shmsched_region_info i;
    shmsched_fair_outcome o;
    (void)permit;
    s.size = sizeof s;
    l.size = sizeof l;
    i.size = sizeof i;
    o.lease_id[SHMSCHED_LEASE_ID_MAX - 1] = 0;
    c.caps[SHMSCHED_PRIORITY_LOW + 3] = SHMSCHED_CAP_UNSET;
    st = shmsched_concurrency_set_cap(&c, p, 1);
    return (int)st + (int)shmsched_abi_version() - SHMSCHED_ABI_VERSION
        + (int)SHMSCHED_KIND_NONE + (int)SHMSCHED_REFUSAL_REASON_NONE
        + (int)(s.size + l.size + i.size) * 0 + (int)o.lease_id[0] * 0
        + (shmsched_strerror(st) == NULL);
}
"#;

fn compile(compiler: &str, lang: &str, std: &str) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("header-probe");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!(
        "probe-{std}.{}",
        if lang == "c" { "c" } else { "cpp" }
    ));
    std::fs::write(&src, PROBE).unwrap();
    let out = Command::new(compiler)
        .args(["-x", lang, &format!("-std={std}")])
        .args(["-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only"])
        .arg("-I")
        .arg(include_dir())
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("run {compiler}: {e}"));
    assert!(
        out.status.success(),
        "shmsched.h does not compile with {compiler} -std={std} -Wall -Wextra -Werror -pedantic:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn header_compiles_as_c_with_warnings_as_errors() {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    compile(&cc, "c", "c99");
    compile(&cc, "c", "c11");
}

#[test]
fn header_compiles_as_cpp_with_warnings_as_errors() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    compile(&cxx, "c++", "c++11");
    compile(&cxx, "c++", "c++17");
}

/// Every function the header declares documents its thread safety and its
/// behaviour across `fork` (the doc comment just above it has a
/// "Threads" and a "Fork" part).
#[test]
fn every_function_documents_threads_and_fork() {
    let h = std::fs::read_to_string(include_dir().join("shmsched.h")).unwrap();
    let lines: Vec<&str> = h.lines().collect();
    let mut checked = 0;
    let mut missing = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let is_decl = line.starts_with(|c: char| c.is_ascii_lowercase())
            && !line.starts_with("typedef")
            && line.contains("shmsched_")
            && line.contains('(');
        if !is_decl {
            continue;
        }
        let name = line[..line.find('(').unwrap()]
            .rsplit(|c: char| !(c.is_alphanumeric() || c == '_'))
            .next()
            .unwrap()
            .to_string();
        // The doc comment ends on the line just above the declaration.
        assert_eq!(lines[i - 1].trim(), "*/", "{name} has no doc comment");
        let start = (0..i).rev().find(|&k| lines[k].trim() == "/**").unwrap();
        let doc = lines[start..i].join("\n");
        if !(doc.contains("Threads") && doc.contains("Fork")) {
            missing.push(name);
        }
        checked += 1;
    }
    assert!(checked >= 60, "found {checked} functions in the header");
    assert!(
        missing.is_empty(),
        "functions whose docs lack \"Threads\" or \"Fork\": {missing:?}"
    );
}
