//! Operability of the CLI: read-only inspection (another user, a full
//! process table), a closed pipe, JSON errors, exit codes, `ls` and `rm`.
//!
//! Children that must hold slots (and die holding them) are this test
//! binary re-executed with a role (see `procs`); every wait on a child is
//! bounded.

mod procs;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use procs::{role, say, spawn, unique_name, wait_parent};
use serde_json::Value;
use shmsched::limiter::Limiter;
use shmsched::region::{Region, RegionOptions};
use shmsched::scheduler::Scheduler;
use shmsched::Priority;

const BIN: &str = env!("CARGO_BIN_EXE_shmsched");

/// A region (file) removed on drop.
struct Gone(PathBuf);

impl Drop for Gone {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn shm(name: &str) -> Gone {
    Gone(PathBuf::from(format!("/dev/shm/shmsched.{name}")))
}

/// Waits for `child` at most `secs` seconds, killing it (and failing) after.
fn wait_bounded(mut child: Child, secs: u64, what: &str) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            panic!("{what} ran longer than {secs} s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

fn run_cmd(mut cmd: Command, what: &str) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_bounded(child, 30, what)
}

fn cli(args: &[&str]) -> Output {
    let mut c = Command::new(BIN);
    c.args(args);
    run_cmd(c, &format!("shmsched {args:?}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Child role: attach to the scheduler region named in the args, take N
/// slots, say so, and wait for the parent (or to be killed).
#[test]
fn child_ops_holder() {
    let Some((r, args)) = role() else { return };
    assert_eq!(r, "hold");
    let region = Region::open(&args[0]).unwrap();
    let sched = Scheduler::attach(&region).unwrap();
    let n: u32 = args[1].parse().unwrap();
    let permits: Vec<_> = (0..n)
        .map(|_| sched.acquire(Priority::High).unwrap())
        .collect();
    say(&format!("held {}", permits.len()));
    wait_parent();
}

/// Stumble 1: `watch R | head -3` panicked with a broken pipe (exit 101).
/// Now the watch ends quietly once the reader is gone.
#[test]
fn watch_into_a_closed_pipe_exits_quietly() {
    let name = unique_name("ops-pipe");
    let _g = shm(&name);
    let region = Region::create(&name).unwrap();
    let _s = Scheduler::shared(&region, 2).unwrap();
    let mut child = Command::new(BIN)
        .args(["watch", &name])
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        // Read three lines, like `head -3`, then close the pipe.
        let mut r = BufReader::new(child.stdout.take().unwrap());
        for _ in 0..3 {
            let mut l = String::new();
            assert!(r.read_line(&mut l).unwrap() > 0);
        }
    }
    let mut err = child.stderr.take().unwrap();
    let out = wait_bounded(child, 20, "watch into a closed pipe");
    let mut stderr = String::new();
    err.read_to_string(&mut stderr).unwrap();
    assert_eq!(out.status.code(), Some(141), "stderr: {stderr}");
    assert!(stderr.is_empty(), "not quiet: {stderr}");
}

/// Stumble 2 (full table): `stat` refused with "process table is full"
/// because it registered. Now it reads without an entry.
#[test]
fn stat_and_watch_work_on_a_full_process_table() {
    let name = unique_name("ops-full");
    let _g = shm(&name);
    let region = Region::create_with(
        &name,
        RegionOptions {
            process_slots: 1,
            ..RegionOptions::default()
        },
    )
    .unwrap();
    let sched = Scheduler::shared(&region, 3).unwrap();
    let _p = sched.acquire(Priority::High).unwrap();
    let out = cli(&["stat", &name, "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    assert_eq!(v["scheduler"]["running"], 1);
    assert_eq!(v["scheduler"]["processes_alive"], 1);
    assert_eq!(v["region"]["process_slots"], 1);
    let out = cli(&["watch", &name, "--count", "2", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).lines().count(), 2);
    // Still only us, nothing reaped.
    assert_eq!(sched.processes().unwrap().len(), 1);
    assert_eq!(sched.stats().shared.unwrap().reaped_processes, 0);
}

/// The uid/gid the other user runs as, and a group of ours that it is a
/// member of (by supplementary group).
const OTHER_UID: &str = "65534";
const SHARED_GID: u32 = 48_151;

/// A copy of the binary that another user may execute (the build tree may
/// not be reachable for it).
fn binary_for_others() -> (tempdir::Dir, PathBuf) {
    let d = tempdir::Dir::new("shmsched-ops-bin");
    let dst = d.0.join("shmsched");
    std::fs::copy(BIN, &dst).unwrap();
    std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o755)).unwrap();
    (d, dst)
}

mod tempdir {
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    /// A world-readable temporary directory, removed on drop.
    pub struct Dir(pub PathBuf);

    impl Dir {
        pub fn new(tag: &str) -> Dir {
            let p = std::env::temp_dir().join(format!(
                "{tag}-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .subsec_nanos()
            ));
            std::fs::create_dir_all(&p).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            Dir(p)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Runs `bin args` as uid 65534 with `SHARED_GID` as a supplementary
/// group, through `setpriv`. `None` (with the reason printed) where that
/// is impossible: not root, or no `setpriv`.
fn as_other_user(bin: &Path, args: &[&str]) -> Option<Output> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: inspecting as another user needs root to switch users (this test is not root)");
        return None;
    }
    let gid = SHARED_GID.to_string();
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid", OTHER_UID, "--regid", OTHER_UID, "--groups", &gid, "--",
    ])
    .arg(bin)
    .args(args);
    match c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => Some(wait_bounded(child, 30, "setpriv shmsched")),
        Err(e) => {
            eprintln!("SKIPPED: cannot run setpriv ({e}), needed to inspect as another user");
            None
        }
    }
}

/// Stumble 2 (permissions): a group member with read access only got
/// "Permission denied" from `stat`. Now `stat` and `watch` work for it,
/// leave the region untouched, and `reap` says it needs write access.
#[test]
fn another_user_with_read_access_inspects_a_region() {
    let name = unique_name("ops-ro");
    let g = shm(&name);
    let region = Region::create_with(
        &name,
        RegionOptions {
            mode: 0o640,
            ..RegionOptions::default()
        },
    )
    .unwrap();
    let sched = Scheduler::shared(&region, 4).unwrap();
    let _a = sched.acquire(Priority::High).unwrap();
    let _b = sched.acquire(Priority::Low).unwrap();
    // Group-owned by a group the other user is in (we are root here).
    let path = std::ffi::CString::new(g.0.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string; chown has no memory effects. Failure (not
    // root) is handled by the skip in `as_other_user`.
    unsafe { libc::chown(path.as_ptr(), u32::MAX, SHARED_GID) };
    let lim_name = unique_name("ops-ro-lim");
    let lg = shm(&lim_name);
    let lregion = Region::create_with(
        &lim_name,
        RegionOptions {
            mode: 0o640,
            ..RegionOptions::default()
        },
    )
    .unwrap();
    let lim = Limiter::shared(&lregion, 1000).unwrap();
    lim.consume(300, Priority::Normal).unwrap();
    let lpath = std::ffi::CString::new(lg.0.to_str().unwrap()).unwrap();
    // SAFETY: as above.
    unsafe { libc::chown(lpath.as_ptr(), u32::MAX, SHARED_GID) };

    let (_dir, bin) = binary_for_others();
    let Some(out) = as_other_user(&bin, &["stat", &name, "--json"]) else {
        return;
    };
    assert!(
        out.status.success(),
        "stat as another user: {}",
        text(&out.stderr)
    );
    let v: Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    assert_eq!(v["scheduler"]["running"], 2, "{v}");
    assert_eq!(v["scheduler"]["processes_alive"], 1, "{v}");
    assert_eq!(v["scheduler"]["processes"][0]["slots_held"], 2, "{v}");
    assert_eq!(v["region"]["mode"], "0640");

    let out = as_other_user(&bin, &["watch", &name, "--count", "2"]).unwrap();
    assert!(
        out.status.success(),
        "watch as another user: {}",
        text(&out.stderr)
    );
    assert!(text(&out.stdout).contains("running     2 / 4 max"));

    let out = as_other_user(&bin, &["stat", &lim_name, "--json"]).unwrap();
    assert!(
        out.status.success(),
        "limiter stat as another user: {}",
        text(&out.stderr)
    );
    let v: Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    assert_eq!(v["limiter"]["tokens_per_second"], 1000, "{v}");
    assert_eq!(v["limiter"]["shared"]["processes"], 1, "{v}");

    // reap frees things: it needs write access and says so.
    let out = as_other_user(&bin, &["reap", &name]).unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("write access"), "{err}");

    // Nothing was registered, reaped or changed by the inspections.
    assert_eq!(sched.processes().unwrap().len(), 1);
    let st = sched.stats().shared.unwrap();
    assert_eq!((st.running, st.reaped_processes), (2, 0));
    assert_eq!(lim.stats().shared.unwrap().processes, 1);
}

/// Stumble 9: `stat --json` printed errors as plain text.
#[test]
fn json_errors_are_json() {
    let out = cli(&["stat", "no-such-region-ops-json", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_str(text(&out.stdout).trim())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&out.stdout)));
    assert_eq!(v["error"]["kind"], "not_found");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("no-such-region-ops-json"));
    // Usage errors keep clap's exit code 2.
    assert_eq!(cli(&["stat"]).status.code(), Some(2));
}

/// Stumble 9: SIGTERM to `demo` exited 130 (SIGINT's code); 143 is the
/// convention. The region is still removed.
#[test]
fn demo_stopped_by_sigterm_exits_143() {
    let mut child = Command::new(BIN)
        .args(["demo", "--workers", "2", "--seconds", "30"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The demo announces itself on stderr once its region and workers are
    // set up; then SIGTERM it.
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    assert!(err.read_line(&mut line).unwrap() > 0, "demo said nothing");
    assert!(line.contains("workers share cap"), "{line}");
    let pid = child.id();
    // SAFETY: kill has no memory effects; `pid` is our live child.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = err.read_to_string(&mut rest);
    });
    let out = wait_bounded(child, 30, "demo after SIGTERM");
    assert_eq!(out.status.code(), Some(143));
    assert!(text(&out.stdout).contains("interrupted after"));
    let left = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("shmsched.demo-{pid}-"))
        });
    assert!(!left, "demo left its region behind");
}

fn ls_json(dir: &Path) -> Vec<Value> {
    let out = cli(&["ls", dir.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_str::<Value>(text(&out.stdout).trim())
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn by_path<'a>(list: &'a [Value], p: &Path) -> &'a Value {
    list.iter()
        .find(|e| e["path"] == p.to_str().unwrap())
        .unwrap_or_else(|| panic!("{} not listed: {list:?}", p.display()))
}

/// Stumble 3: regions piled up with no way to list or remove them. `ls`
/// and `rm` on live, dead, uninitialised and foreign files.
#[test]
fn ls_and_rm_on_live_dead_and_foreign_files() {
    let dir = tempdir::Dir::new("shmsched-ops-ls");
    let live = dir.0.join("live");
    let dead = dir.0.join("dead");
    let lim = dir.0.join("lim");
    let uninit = dir.0.join("uninit");
    let foreign = dir.0.join("foreign");
    let s = |p: &Path| p.to_str().unwrap().to_string();

    let live_region = Region::create(&s(&live)).unwrap();
    let sched = Scheduler::shared(&live_region, 3).unwrap();
    let _p = sched.acquire(Priority::Normal).unwrap();
    // A region whose only process died holding two slots.
    {
        let r = Region::create(&s(&dead)).unwrap();
        let creator = Scheduler::shared(&r, 5).unwrap();
        let mut kid = spawn("child_ops_holder", "hold", &[s(&dead), "2".into()]);
        kid.expect_line("held 2");
        kid.kill();
        creator.detach().unwrap();
    }
    let lr = Region::create(&s(&lim)).unwrap();
    let l = Limiter::shared(&lr, 5000).unwrap();
    l.detach().unwrap();
    std::fs::write(&uninit, b"").unwrap();
    std::fs::write(&foreign, b"not a region, just text\n").unwrap();

    let list = ls_json(&dir.0);
    assert_eq!(list.len(), 5, "{list:?}");
    let e = by_path(&list, &live);
    assert_eq!(
        (e["kind"].as_str(), e["live"].as_u64()),
        (Some("scheduler"), Some(1))
    );
    assert_eq!(e["usage"], "1/3");
    assert_eq!(e["mode"], "0600");
    let e = by_path(&list, &dead);
    assert_eq!(
        (e["kind"].as_str(), e["live"].as_u64(), e["dead"].as_u64()),
        (Some("scheduler"), Some(0), Some(1))
    );
    assert_eq!(e["usage"], "2/5");
    let e = by_path(&list, &lim);
    assert_eq!(
        (e["kind"].as_str(), e["usage"].as_str()),
        (Some("limiter"), Some("5000/s"))
    );
    assert_eq!(by_path(&list, &uninit)["kind"], "uninitialised");
    let e = by_path(&list, &foreign);
    assert_eq!(e["kind"], "foreign");
    assert!(e["note"]
        .as_str()
        .unwrap()
        .contains("not a shmsched region"));
    // The table form names every file.
    let out = cli(&["ls", dir.0.to_str().unwrap()]);
    let table = text(&out.stdout);
    for p in [&live, &dead, &lim, &uninit, &foreign] {
        assert!(table.contains(p.to_str().unwrap()), "{table}");
    }

    // rm: a live region is refused (naming the pid), the rest as expected.
    let out = cli(&["rm", &s(&live)]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("1 live process") && err.contains(&std::process::id().to_string()),
        "{err}"
    );
    assert!(live.exists());
    let out = cli(&["rm", &s(&foreign)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("not a valid shmsched region"));
    assert!(foreign.exists());
    let out = cli(&["rm", &s(&dead), &s(&uninit), &s(&lim)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!dead.exists() && !uninit.exists() && !lim.exists());
    let out = cli(&["rm", &s(&dead)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("no such region"));
    let out = cli(&["rm", "--force", &s(&live), &s(&foreign)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!live.exists() && !foreign.exists());
    // The live process keeps using its (now unnamed) region.
    assert_eq!(sched.global_running(), 1);
}

/// `ls` without a directory lists /dev/shm by region name.
#[test]
fn ls_lists_named_regions_in_dev_shm() {
    let name = unique_name("ops-ls-name");
    let _g = shm(&name);
    let region = Region::create(&name).unwrap();
    let _s = Scheduler::shared(&region, 7).unwrap();
    let out = cli(&["ls", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let list: Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    let e = list
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name.as_str())
        .unwrap_or_else(|| panic!("{name} not in {list}"));
    assert_eq!(e["usage"], "0/7");
    assert_eq!(e["live"], 1);
    // And `rm NAME` works by that name once nobody is attached.
    drop(_s);
    let out = cli(&["rm", &name]);
    // The scheduler handle left an entry that is now dead, not live.
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// `watch` redraws in place on a terminal (a pty from `script`) and prints
/// plain separated refreshes when piped.
#[test]
fn watch_redraws_on_a_terminal_and_prints_lines_when_piped() {
    let name = unique_name("ops-tty");
    let _g = shm(&name);
    let region = Region::create(&name).unwrap();
    let _s = Scheduler::shared(&region, 2).unwrap();

    let piped = cli(&["watch", &name, "--count", "2"]);
    assert!(piped.status.success());
    let p = text(&piped.stdout);
    assert!(p.contains("--- 0 s") && p.contains("--- 1 s"), "{p}");
    assert!(!p.contains('\x1b'), "no escape codes in a pipe: {p:?}");

    let mut c = Command::new("script");
    c.args(["-q", "-e", "-c"])
        .arg(format!("{BIN} watch {name} --count 2"))
        .arg("/dev/null");
    let out = match c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => wait_bounded(child, 30, "script watch"),
        Err(e) => {
            eprintln!("SKIPPED: no `script` to run watch on a terminal ({e})");
            return;
        }
    };
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    assert_eq!(t.matches("\x1b[H\x1b[2J").count(), 2, "{t:?}");
    assert!(!t.contains("--- 0 s"), "{t:?}");
    assert!(t.contains("running     0 / 2 max"), "{t:?}");
}
