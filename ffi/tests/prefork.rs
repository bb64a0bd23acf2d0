//! `examples/c/prefork.c` builds with `cc` through `pkg-config` from the
//! build tree and runs: a master, forked workers with mixed priorities
//! sharing one cap and one byte budget, some SIGKILLed mid-run; the cap
//! holds and nothing leaks. And `ffi/install.sh` makes a prefix that
//! `pkg-config` and a static link work from.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use std::time::Duration;

use support::{
    include_dir, lib_dir, output_of, pkg_config as pkg_config_tool, repo_root, Kid, BUILD_TIMEOUT,
};

/// The longest one run of a small program here may take.
const RUN: Duration = Duration::from_secs(60);

fn pkg_config(path: &Path, args: &[&str]) -> Vec<String> {
    let mut cmd = Command::new(pkg_config_tool());
    cmd.args(args).arg("shmsched").env("PKG_CONFIG_PATH", path);
    let out = output_of(cmd, RUN);
    assert!(
        out.status.success(),
        "pkg-config {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .map(String::from)
        .collect()
}

fn cc(args: &[String], source: &Path, out: &Path) {
    let mut cmd = Command::new(support::cc());
    cmd.args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-O1"])
        .arg(source)
        .arg("-o")
        .arg(out)
        .args(args);
    let res = output_of(cmd, BUILD_TIMEOUT);
    assert!(
        res.status.success(),
        "cc {} failed:\n{}",
        source.display(),
        String::from_utf8_lossy(&res.stderr)
    );
}

fn out_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn prefork_example_builds_with_pkg_config_and_runs() {
    let profile = lib_dir().file_name().unwrap().to_str().unwrap().to_string();
    let flags = pkg_config(
        &repo_root().join("ffi/pkgconfig"),
        &[
            &format!("--define-variable=profile={profile}"),
            "--cflags",
            "--libs",
        ],
    );
    assert!(flags
        .iter()
        .any(|f| f.starts_with("-I") && f.ends_with("ffi/include")));
    let exe = out_dir("prefork").join("prefork");
    cc(&flags, &repo_root().join("examples/c/prefork.c"), &exe);
    let mut cmd = Command::new(&exe);
    cmd.args([
        "--workers",
        "4",
        "--cap",
        "2",
        "--seconds",
        "2",
        "--kill",
        "2",
    ])
    .args(["--rate", "20000000"]);
    let mut kid = Kid::spawn("prefork", cmd);
    let lines = kid.rest();
    let status = kid.wait();
    let report = lines.join("\n");
    assert!(status.success(), "prefork failed ({status:?}):\n{report}");
    let field = |prefix: &str| -> String {
        lines
            .iter()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line in:\n{report}"))
            .trim()
            .to_string()
    };
    let worst: u32 = field("max running seen ")
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(worst <= 2, "the cap was exceeded:\n{report}");
    assert_eq!(field("leaked "), "0", "{report}");
    assert!(field("tasks ").parse::<u64>().unwrap() > 0, "{report}");
    assert!(report.contains("2 killed"), "{report}");
    assert_eq!(lines.last().map(String::as_str), Some("ok"));
}

#[test]
fn install_prefix_works_with_pkg_config_and_static_linking() {
    let prefix = out_dir("install-prefix");
    let mut cmd = Command::new("bash");
    cmd.arg(repo_root().join("ffi/install.sh"))
        .arg(&prefix)
        .arg(lib_dir());
    let res = output_of(cmd, RUN);
    assert!(
        res.status.success(),
        "install.sh failed: {}",
        String::from_utf8_lossy(&res.stderr)
    );
    assert_eq!(
        std::fs::read(prefix.join("include/shmsched.h")).unwrap(),
        std::fs::read(include_dir().join("shmsched.h")).unwrap()
    );
    let src = prefix.join("version.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include \"shmsched.h\"\n\
         int main(void) {\n  shmsched_region *r;\n  if (shmsched_region_anonymous(0, &r) != SHMSCHED_STATUS_OK) return 1;\n  \
         shmsched_region_close(r);\n  printf(\"abi %u\\n\", shmsched_abi_version());\n  \
         return shmsched_abi_version() == SHMSCHED_ABI_VERSION ? 0 : 1;\n}\n",
    )
    .unwrap();
    let pc = prefix.join("lib/pkgconfig");
    // Dynamic, through the installed .pc.
    let dynamic = prefix.join("version-dynamic");
    cc(&pkg_config(&pc, &["--cflags", "--libs"]), &src, &dynamic);
    let mut cmd = Command::new(&dynamic);
    cmd.env("LD_LIBRARY_PATH", prefix.join("lib"));
    let out = output_of(cmd, RUN);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "abi 1");
    // Static: the archive plus the system libraries the .pc lists.
    let stat = prefix.join("version-static");
    let mut flags = pkg_config(&pc, &["--cflags"]);
    flags.push(prefix.join("lib/libshmsched.a").display().to_string());
    flags.extend(
        pkg_config(&pc, &["--static", "--libs"])
            .into_iter()
            .filter(|f| f != "-lshmsched" && !f.starts_with("-L")),
    );
    cc(&flags, &src, &stat);
    let out = output_of(Command::new(&stat), RUN);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "abi 1");
}

/// The README's C snippet ("From C") builds as C99 with warnings as errors
/// and runs: acquires, releases, and removes its region (under a name of
/// the test's own instead of the snippet's `pool`, which a user may have).
#[test]
fn readme_c_snippet_builds_and_runs() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let start = readme
        .find("```c\n#include <stdio.h>\n#include <shmsched.h>")
        .expect("the README's C snippet");
    let body = &readme[start + "```c\n".len()..];
    let body = &body[..body.find("```").expect("the snippet's end")];
    assert_eq!(
        body.matches("\"pool\"").count(),
        2,
        "the snippet's region name"
    );
    let name = format!("test-readme-c-{}", std::process::id());
    // Removed on drop, also when the snippet fails half-way.
    let _cleanup = support::TempRegion(format!("/dev/shm/shmsched.{name}"));
    let dir = out_dir("readme-c");
    let src = dir.join("snippet.c");
    std::fs::write(&src, body.replace("\"pool\"", &format!("\"{name}\""))).unwrap();
    let profile = lib_dir().file_name().unwrap().to_str().unwrap().to_string();
    let flags = pkg_config(
        &repo_root().join("ffi/pkgconfig"),
        &[
            &format!("--define-variable=profile={profile}"),
            "--cflags",
            "--libs",
        ],
    );
    let exe = dir.join("snippet");
    cc(&flags, &src, &exe);
    let out = output_of(Command::new(&exe), RUN);
    assert!(
        out.status.success(),
        "the README's C snippet failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !Path::new(&format!("/dev/shm/shmsched.{name}")).exists(),
        "the snippet left its region behind"
    );
}
