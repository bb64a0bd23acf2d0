//! Read-only region views against attached handles, and handing a region
//! to an exec'ed program by fd (`Region::as_fd` / `Region::from_fd`).

mod procs;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use procs::{role, say, unique_name, until, wait_parent};
use shmsched::limiter::Limiter;
use shmsched::region::{Region, RegionView};
use shmsched::scheduler::Scheduler;
use shmsched::{Error, Priority};

struct Gone(String);

impl Drop for Gone {
    fn drop(&mut self) {
        let _ = Region::remove(&self.0);
    }
}

#[test]
fn scheduler_view_equals_the_attached_stats() {
    let name = unique_name("view-sched");
    let _g = Gone(name.clone());
    let region = Region::create(&name).unwrap();
    let sched = Scheduler::shared(&region, 2).unwrap();
    let held: Vec<_> = (0..2)
        .map(|_| sched.acquire(Priority::High).unwrap())
        .collect();
    // Two waiters, at low and highest, blocked behind the full budget.
    let waiters: Vec<_> = [Priority::Low, Priority::Highest]
        .into_iter()
        .map(|p| {
            let s = sched.clone();
            std::thread::spawn(move || drop(s.acquire_timeout(p, Duration::from_secs(20))))
        })
        .collect();
    until("two waiters", 20, || {
        sched.stats().shared.unwrap().waiters.iter().sum::<u32>() == 2
    });

    let view = RegionView::open(&name).unwrap();
    let before = sched.stats().shared.unwrap();
    let seen = view.scheduler_stats().unwrap();
    let after = sched.stats().shared.unwrap();
    assert_eq!(
        (seen.running, seen.max, seen.waiters, seen.processes),
        (after.running, after.max, after.waiters, after.processes)
    );
    assert_eq!((seen.reclaimed, seen.reaped_processes), (0, 0));
    // The stall clock runs while they wait: the view's read lies between.
    assert!(before.stall_ns <= seen.stall_ns && seen.stall_ns <= after.stall_ns);
    let procs = view.scheduler_processes().unwrap();
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].0.pid as u32, std::process::id());
    assert_eq!(procs[0].1, 2);
    assert_eq!(procs, sched.processes().unwrap());
    // A view of the wrong kind says so.
    assert!(matches!(view.limiter_stats(), Err(Error::WrongKind { .. })));

    drop(held);
    for w in waiters {
        w.join().unwrap();
    }
}

#[test]
fn limiter_view_equals_the_attached_stats() {
    let name = unique_name("view-lim");
    let _g = Gone(name.clone());
    let region = Region::create(&name).unwrap();
    let lim = Limiter::shared(&region, 1_000).unwrap();
    lim.consume(700, Priority::Normal).unwrap();
    let view = RegionView::open(&name).unwrap();
    let before = lim.stats();
    let seen = view.limiter_stats().unwrap();
    let after = lim.stats();
    assert_eq!(seen.tokens_per_second, 1_000);
    assert!(before.tokens <= seen.tokens && seen.tokens <= after.tokens);
    assert!(before.clock <= seen.clock && seen.clock <= after.clock);
    let (s, a) = (seen.shared.unwrap(), after.shared.unwrap());
    assert_eq!(
        (s.forced, s.waiters, s.processes, s.wakes, s.tsc),
        (a.forced, a.waiters, a.processes, a.wakes, a.tsc)
    );
    assert!(matches!(
        view.scheduler_stats(),
        Err(Error::WrongKind { .. })
    ));
}

/// Child role: adopt the region fd whose number is in the args, attach a
/// scheduler, hold two slots, and wait.
#[test]
fn child_view_from_fd() {
    let Some((r, args)) = role() else { return };
    assert_eq!(r, "fromfd");
    let n: i32 = args[0].parse().unwrap();
    // SAFETY: the parent left exactly this fd open for us across exec, and
    // nothing else in this process owns it.
    let region = Region::from_fd(unsafe { OwnedFd::from_raw_fd(n) }).unwrap();
    let sched = Scheduler::attach(&region).unwrap();
    let p: Vec<_> = (0..2)
        .map(|_| sched.acquire(Priority::Normal).unwrap())
        .collect();
    say(&format!("held {}", p.len()));
    wait_parent();
}

#[test]
fn an_execed_child_adopts_the_region_fd() {
    // An anonymous region: only the fd can carry it.
    let region = Region::anonymous().unwrap();
    let sched = Scheduler::shared(&region, 3).unwrap();
    let fd = region.as_fd().as_raw_fd();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_view_from_fd",
        "--nocapture",
        "--test-threads=1",
        "-q",
    ])
    .env("SHMSCHED_TEST_ROLE", "fromfd")
    .env("SHMSCHED_TEST_ARGS", fd.to_string())
    .stdin(Stdio::piped())
    .stdout(Stdio::piped());
    // SAFETY: runs in the forked child before exec; fcntl is
    // async-signal-safe and touches only the child's copy of the fd table.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    use std::io::BufRead;
    while !line.starts_with("held 2") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child exited early");
    }
    assert_eq!(sched.global_running(), 2);
    let kid = sched
        .processes()
        .unwrap()
        .into_iter()
        .find(|(p, _)| p.pid as u32 == child.id())
        .expect("the child registered as its own process");
    assert_eq!(kid.1, 2);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(sched.reap().unwrap(), (1, 2));
    assert_eq!(sched.global_running(), 0);
}

#[test]
fn from_fd_refuses_a_read_only_fd() {
    let name = unique_name("view-rofd");
    let _g = Gone(name.clone());
    let region = Region::create(&name).unwrap();
    let _s = Scheduler::shared(&region, 1).unwrap();
    let f = std::fs::File::open(region.path().unwrap()).unwrap();
    let e = Region::from_fd(OwnedFd::from(f)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert!(e.to_string().contains("read and write"), "{e}");
}
