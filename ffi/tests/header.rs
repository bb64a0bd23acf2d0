//! `include/shmsched.h` is current (regenerated with the pinned cbindgen
//! and compared byte for byte) and compiles as C99, C11, C++11 and C++17
//! with `-Wall -Wextra -Werror -pedantic`.

mod support;

use std::path::Path;
use std::process::Command;

use support::{cc, cxx, include_dir, output_of, BUILD_TIMEOUT};

/// Generates the header with the cbindgen library this test depends on
/// (pinned to the version the committed header names: `=0.29.4` in
/// `ffi/Cargo.toml`), with `ffi/cbindgen.toml`: nothing to install.
fn generate() -> String {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .unwrap_or_else(|e| panic!("read ffi/cbindgen.toml: {e}"));
    let bindings = cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen failed: {e}"));
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("cbindgen writes UTF-8")
}

/// Writes the freshly generated header over the committed one when
/// `SHMSCHED_BLESS_HEADER=1` (the way to regenerate it:
/// `SHMSCHED_BLESS_HEADER=1 cargo test -p shmsched-ffi --test header`).
fn bless(fresh: &str) -> bool {
    if std::env::var_os("SHMSCHED_BLESS_HEADER").is_some_and(|v| v == "1") {
        std::fs::write(include_dir().join("shmsched.h"), fresh).expect("write the header");
        return true;
    }
    false
}

#[test]
fn header_is_current() {
    let fresh = generate();
    if bless(&fresh) {
        return;
    }
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
             generated: {:?}\n  committed: {:?}\nRegenerate it with:\n    \
             SHMSCHED_BLESS_HEADER=1 cargo test -p shmsched-ffi --test header",
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

fn compile(compiler: &Path, lang: &str, std: &str) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("header-probe");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!(
        "probe-{std}.{}",
        if lang == "c" { "c" } else { "cpp" }
    ));
    std::fs::write(&src, PROBE).unwrap();
    let mut cmd = Command::new(compiler);
    cmd.args(["-x", lang, &format!("-std={std}")])
        .args(["-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only"])
        .arg("-I")
        .arg(include_dir())
        .arg(&src);
    let out = output_of(cmd, BUILD_TIMEOUT);
    assert!(
        out.status.success(),
        "shmsched.h does not compile with {} -std={std} -Wall -Wextra -Werror -pedantic:\n{}",
        compiler.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn header_compiles_as_c_with_warnings_as_errors() {
    let cc = cc();
    compile(&cc, "c", "c99");
    compile(&cc, "c", "c11");
}

#[test]
fn header_compiles_as_cpp_with_warnings_as_errors() {
    let cxx = cxx();
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
