//! Support for the tests of the shell front ends (`run`, `pipe`,
//! `jobserver`, `create`, `set`): the binary, regions removed on drop,
//! bounded waits, and a marker directory that counts jobs running at once.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `shmsched` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_shmsched");

/// A region name unique to this test and process.
pub fn name(tag: &str) -> String {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("test-sh-{tag}-{}-{n}", std::process::id())
}

/// A region file removed on drop.
pub struct Gone(pub PathBuf);

impl Drop for Gone {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The guard for region `name`.
pub fn gone(name: &str) -> Gone {
    Gone(PathBuf::from(format!("/dev/shm/shmsched.{name}")))
}

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let p = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name(tag));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Waits for `child` at most `secs` seconds, killing it (and failing) after.
pub fn wait_bounded(mut child: Child, secs: u64, what: &str) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} ran longer than {secs} s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.wait_with_output().unwrap()
}

/// Runs `shmsched ARGS` (stdin empty) and returns its output, bounded.
pub fn cli(args: &[&str]) -> Output {
    let child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_bounded(child, 60, &format!("shmsched {args:?}"))
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[allow(unused_imports)]
pub use crate::procs::until;

/// Spawns `shmsched ARGS` with stdout piped and returns it with its stdout
/// and the first line it printed.
pub fn spawn_reading(
    args: &[&str],
) -> (Child, std::io::BufReader<std::process::ChildStdout>, String) {
    use std::io::BufRead;
    let mut c = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    (c, out, line.trim().to_string())
}

/// A shell snippet that holds a marker in `dir` while `body` runs and logs
/// how many markers it saw on arrival into `dir.log` (one line per job).
/// Every job (and library worker) that holds a slot holds a marker inside
/// its slot, so the largest count logged bounds the jobs run at once.
pub fn marked(dir: &Path, body: &str) -> String {
    let d = dir.display();
    format!(
        "m={d}/$$.$(date +%s%N); : > $m; n=$(ls {d} | wc -l); echo $n >> {d}.log; {body}; rm -f $m"
    )
}

/// The counts logged by [`marked`] jobs (and [`Marker`]s) in `dir`.
pub fn counts(dir: &Path) -> Vec<usize> {
    std::fs::read_to_string(format!("{}.log", dir.display()))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// A marker held by library code while it holds a slot.
pub struct Marker(PathBuf);

impl Marker {
    pub fn new(dir: &Path, tag: &str) -> Marker {
        use std::io::Write;
        let p = dir.join(format!("lib-{tag}-{}", std::process::id()));
        std::fs::write(&p, b"").unwrap();
        let n = std::fs::read_dir(dir).unwrap().count();
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(format!("{}.log", dir.display()))
            .unwrap();
        // One write per line: `writeln!` may split a line into several
        // writes, and two threads' pieces would interleave ("2" "3" "\n").
        log.write_all(format!("{n}\n").as_bytes()).unwrap();
        Marker(p)
    }
}

impl Drop for Marker {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The state letter of process `pid` (`/proc/PID/stat`), `None` once gone.
pub fn proc_state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Whether `pid` is dead (gone, or a zombie nobody reaped yet).
pub fn dead(pid: u32) -> bool {
    matches!(proc_state(pid), None | Some('Z') | Some('X'))
}

/// The body of a library-worker child role (args: region, marker dir,
/// threads, priority, hold ms): each thread takes a slot, holds a marker in
/// it for the hold time, releases, until the parent closes stdin; then
/// prints `slots N` (the slots it got).
pub fn library_worker(args: &[String]) {
    use shmsched::region::Region;
    use shmsched::scheduler::Scheduler;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let region = Region::open(&args[0]).unwrap();
    let sched = Scheduler::attach(&region).unwrap();
    let dir = PathBuf::from(&args[1]);
    let threads: usize = args[2].parse().unwrap();
    let prio: shmsched::Priority = args[3].parse().unwrap();
    let hold = Duration::from_millis(args[4].parse().unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let got = Arc::new(AtomicU64::new(0));
    let ts: Vec<_> = (0..threads)
        .map(|t| {
            let (sched, dir, stop, got) = (sched.clone(), dir.clone(), stop.clone(), got.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let Ok(p) = sched.acquire_timeout(prio, Duration::from_millis(200)) else {
                        continue;
                    };
                    got.fetch_add(1, Ordering::SeqCst);
                    let m = Marker::new(&dir, &format!("w{t}"));
                    std::thread::sleep(hold);
                    drop(m);
                    drop(p);
                }
            })
        })
        .collect();
    crate::procs::say("working");
    crate::procs::wait_parent();
    stop.store(true, Ordering::SeqCst);
    for t in ts {
        t.join().unwrap();
    }
    crate::procs::say(&format!("slots {}", got.load(Ordering::SeqCst)));
}
