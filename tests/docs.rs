//! The project carries its own documentation: every document it cites is
//! in the repository, nothing cites the design notes outside it, and the
//! README says what the operability issue found missing (stumbles 4 and 8).

mod tools;

use std::path::{Path, PathBuf};
use std::process::Command;
use tools::BoundedOutput;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().filter_map(Result::ok) {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else if matches!(p.extension().and_then(|x| x.to_str()), Some("rs" | "md")) {
            out.push(p);
        }
    }
}

/// Every Markdown file name cited in the README, the sources and the docs.
fn cited() -> Vec<(PathBuf, String)> {
    let mut all = vec![PathBuf::from(ROOT).join("README.md")];
    for d in ["src", "docs", "tests"] {
        files(&PathBuf::from(ROOT).join(d), &mut all);
    }
    let mut out = Vec::new();
    for f in all {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, _) in text.match_indices(".md") {
            let start = text[..i]
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || "_./-".contains(c)))
                .map_or(0, |s| s + 1);
            let name = &text[start..i + 3];
            if name.len() > 3 {
                out.push((f.clone(), name.to_string()));
            }
        }
    }
    out
}

#[test]
fn every_cited_document_is_in_the_repository() {
    let mut missing = Vec::new();
    for (from, name) in cited() {
        let base = Path::new(&name).file_name().unwrap().to_owned();
        let found = [
            PathBuf::from(ROOT),
            PathBuf::from(ROOT).join("docs"),
            from.parent().unwrap().to_path_buf(),
        ]
        .iter()
        .any(|d| d.join(&name).exists() || d.join(&base).exists());
        if !found
            || name.contains("FAIR-SHARE")
            || name.contains("DESIGN")
            || name.contains("shared/")
        {
            missing.push(format!("{}: {name}", from.display()));
        }
    }
    assert!(missing.is_empty(), "cited but not shipped: {missing:?}");
}

#[test]
fn replay_help_points_at_the_shipped_format() {
    let out = Command::new(env!("CARGO_BIN_EXE_shmsched"))
        .args(["fair", "replay", "--help"])
        .bounded_output();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("docs/fair-share.md"), "{help}");
    assert!(!help.contains("FAIR-SHARE"), "{help}");
    let doc = std::fs::read_to_string(PathBuf::from(ROOT).join("docs/fair-share.md")).unwrap();
    for op in [
        "\"op\":\"config\"",
        "\"op\":\"acquire\"",
        "\"op\":\"release\"",
        "\"op\":\"stats\"",
        "\"op\":\"plan\"",
        "\"op\":\"report\"",
    ] {
        assert!(doc.contains(op), "the call-log format lacks {op}");
    }
}

#[test]
fn readme_states_limits_platform_failure_modes_and_removal() {
    let readme = std::fs::read_to_string(PathBuf::from(ROOT).join("README.md")).unwrap();
    for want in [
        "Linux only",
        "128 by default",
        "4,096",
        "65,536",
        "2³¹−1",
        "tenants",
        "ProcessTableFull",
        "Error::Mismatch",
        "Error::WrongKind",
        "Error::VersionMismatch",
        "Who removes a region",
        "shmsched rm",
        "Scheduler` |",
        "Limiter` |",
        "FairShare` |",
    ] {
        assert!(readme.contains(want), "README does not say {want:?}");
    }
    assert!(!readme.contains("/var/log/syslog"));
    assert!(
        !readme.contains("rust,no_run"),
        "every Rust snippet runs as a doc test"
    );
}

#[test]
fn license_file_matches_the_manifest() {
    let manifest = std::fs::read_to_string(PathBuf::from(ROOT).join("Cargo.toml")).unwrap();
    assert!(manifest.contains("license = \"MIT\""));
    let license = std::fs::read_to_string(PathBuf::from(ROOT).join("LICENSE")).unwrap();
    assert!(license.starts_with("MIT License"));
    assert!(license.contains("Permission is hereby granted, free of charge"));
}
