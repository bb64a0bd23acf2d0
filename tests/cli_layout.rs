//! `shmsched --version` names the region layout this build reads, and `ls`
//! and `stat` name a region made by another version of shmsched as such:
//! another header layout version, or an object area of another revision
//! (which before this was read as if it were this build's, and reported
//! as "1408 bytes at object offset 0 run past the 768-byte object area").

mod tools;

use std::process::Command;

use shmsched::region::layout::{encode, HeaderInfo, READY};
use shmsched::region::{ObjectKind, Region};
use shmsched::scheduler::Scheduler;
use tools::BoundedOutput;

const BIN: &str = env!("CARGO_BIN_EXE_shmsched");

/// Removes the named region on drop (also when the test fails).
struct Gone(String);
impl Drop for Gone {
    fn drop(&mut self) {
        let _ = Region::remove(&self.0);
    }
}

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let o = Command::new(BIN).args(args).bounded_output();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A scheduler region whose header is rewritten by `edit` (checksum fixed
/// up, so only the edited field differs).
fn region_with(tag: &str, edit: impl FnOnce(&mut HeaderInfo)) -> Gone {
    let name = format!("test-layout-{tag}-{}", std::process::id());
    let g = Gone(name.clone());
    let region = Region::create(&name).unwrap();
    let sched = Scheduler::shared(&region, 4).unwrap();
    let mut h = region.info().unwrap().expect("initialised");
    drop((sched, region));
    edit(&mut h);
    let bytes = encode(&h, READY);
    let path = format!("/dev/shm/shmsched.{name}");
    let mut all = std::fs::read(&path).unwrap();
    all[..bytes.len()].copy_from_slice(&bytes);
    std::fs::write(&path, all).unwrap();
    g
}

#[test]
fn version_names_the_layout() {
    let (code, out, _) = run(&["--version"]);
    assert_eq!(code, Some(0));
    assert!(
        out.starts_with(&format!("shmsched {}", env!("CARGO_PKG_VERSION"))),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "region layout version {}",
            shmsched::LAYOUT_VERSION
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "scheduler {}",
            shmsched::object_revision(ObjectKind::Scheduler)
        )),
        "{out}"
    );
}

#[test]
fn ls_and_stat_name_another_object_revision() {
    let mine = shmsched::object_revision(ObjectKind::Scheduler);
    let g = region_with("rev", |h| h.params[1] = mine - 1);
    let (code, _, err) = run(&["stat", &g.0]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("another layout"), "{err}");
    assert!(
        err.contains(&format!("revision {}", mine - 1))
            && err.contains(&format!("reads revision {mine}")),
        "{err}"
    );
    assert!(!err.contains("run past"), "{err}");
    let (code, out, _) = run(&["stat", "--json", &g.0]);
    assert_eq!(code, Some(1));
    assert!(out.contains("another layout"), "{out}");
    let (code, out, err) = run(&["ls"]);
    assert_eq!(code, Some(0), "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with(&g.0))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("another layout"), "{line}");
}

#[test]
fn ls_and_stat_name_another_layout_version() {
    let g = region_with("ver", |h| h.layout_version = shmsched::LAYOUT_VERSION + 1);
    let want = format!(
        "layout version {} but this build reads version {}",
        shmsched::LAYOUT_VERSION + 1,
        shmsched::LAYOUT_VERSION
    );
    let (code, _, err) = run(&["stat", &g.0]);
    assert_eq!(code, Some(1));
    assert!(err.contains(&want), "{err}");
    let (_, out, _) = run(&["ls"]);
    let line = out
        .lines()
        .find(|l| l.starts_with(&g.0))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains(&want), "{line}");
}
