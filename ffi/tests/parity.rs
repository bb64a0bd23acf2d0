//! Parity: every function of the C header is reachable from Python and from
//! Node. Reads the header's function list and each binding's table of the
//! C functions it declares: the Python package's prototype table (entries
//! `"shmsched_name": (restype, argtypes)` in `python/shmsched/*.py`) and
//! the Node package's prototypes (`'… shmsched_name(…)'` strings in
//! `node/*.mjs` and `node/lib/*.mjs`). A new C function without a binding
//! fails this test; so does a binding declaring a function the header does
//! not have (callback types aside). The intentional exclusions are listed
//! below, each with its reason. `SHMSCHED_PARITY_ROOT=DIR` reads the
//! bindings from another checkout (a binding's own worktree).

mod support;

use std::collections::BTreeSet;
use std::path::Path;

use support::header_functions;

/// Where the bindings are read from.
fn bindings_root() -> std::path::PathBuf {
    std::env::var_os("SHMSCHED_PARITY_ROOT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(support::repo_root)
}

/// Functions a binding deliberately does not bind: (binding, function,
/// why). Empty today: both bindings are to bind every function (the
/// `_async` callback calls and `shmsched_debug_panic` included, which
/// their tests use). Keep it small and give each entry a reason.
const EXCLUDED: &[(&str, &str, &str)] = &[];

fn sources(dir: &Path, ext: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.extension().and_then(|x| x.to_str()) == Some(ext) {
            out.push(p);
        }
    }
    out.sort();
    out
}

fn ident_at(s: &str, at: usize) -> &str {
    let rest = &s[at..];
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    &rest[..end]
}

/// `"shmsched_x": (` keys of the Python prototype table.
fn python_declared() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for f in sources(&bindings_root().join("python/shmsched"), "py") {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, _) in text.match_indices("\"shmsched_") {
            let name = ident_at(&text, i + 1);
            let after = text[i + 1 + name.len()..]
                .trim_start_matches('"')
                .trim_start();
            if text[i + 1 + name.len()..].starts_with('"') && after.starts_with(':') {
                out.insert(name.to_string());
            }
        }
    }
    out
}

/// `shmsched_x(` inside a string literal (a koffi prototype) in the Node
/// package's modules.
fn node_declared() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let root = bindings_root().join("node");
    let mut files = sources(&root, "mjs");
    files.extend(sources(&root.join("lib"), "mjs"));
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for line in text.lines() {
            for (i, _) in line.match_indices("shmsched_") {
                let name = ident_at(line, i);
                let quotes = line[..i].chars().filter(|&c| c == '\'' || c == '"').count();
                if quotes % 2 == 1 && line[i + name.len()..].starts_with('(') {
                    out.insert(name.to_string());
                }
            }
        }
    }
    out
}

#[test]
fn every_c_function_has_a_binding_in_python_and_node() {
    let header: BTreeSet<String> = header_functions().into_iter().map(|(n, _)| n).collect();
    assert!(
        header.len() >= 70,
        "parsed {} functions from the header",
        header.len()
    );
    let mut problems = Vec::new();
    for (binding, declared) in [("python", python_declared()), ("node", node_declared())] {
        assert!(
            declared.len() >= 20,
            "{binding}: found only {} declared functions: is the table where this test looks?",
            declared.len()
        );
        let excluded: BTreeSet<&str> = EXCLUDED
            .iter()
            .filter(|(b, _, _)| *b == binding)
            .map(|(_, f, _)| *f)
            .collect();
        for f in &excluded {
            assert!(
                header.contains(*f),
                "{binding}: excluded {f} is not in the header"
            );
        }
        let missing: Vec<&String> = header
            .iter()
            .filter(|f| !declared.contains(*f) && !excluded.contains(f.as_str()))
            .collect();
        // Callback types (`shmsched_acquire_callback`) are typedefs, not
        // functions.
        let unknown: Vec<&String> = declared
            .iter()
            .filter(|f| !header.contains(*f) && !f.ends_with("_callback"))
            .collect();
        if !missing.is_empty() {
            problems.push(format!("{binding} binds no {missing:?}"));
        }
        if !unknown.is_empty() {
            problems.push(format!(
                "{binding} declares functions the header lacks: {unknown:?}"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
