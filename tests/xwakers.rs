//! Wakers that misbehave, on a region shared with another process: a
//! waker that re-enters the same Scheduler or Limiter when it is woken
//! (`try_acquire`, `stats`, dropping a permit of the same scheduler;
//! `try_consume`, `stats`, `tokens`) must not deadlock, whether it runs on
//! the process's helper thread (a release in another process) or on the
//! releasing thread itself; a waker that panics must break nothing later.
//!
//! The scenarios run in a child process driven line by line, so a deadlock
//! is a missing line within a deadline (and the child is killed), never a
//! hung test.

mod xproc;

use std::future::Future;
use std::pin::Pin;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use shmsched::limiter::Limiter;
use shmsched::region::Region;
use shmsched::scheduler::{OwnedPermit, Scheduler};
use shmsched::Priority;
use xproc::{child_init, commands, say, serial, until, Kid, TempRegion};

const ENTRY: &str = "child_entry";
const SEC: Duration = Duration::from_secs(1);

/// What a waker does to the object that woke it.
enum Target {
    Sched(Scheduler, Mutex<Option<OwnedPermit>>),
    Lim(Limiter),
}

struct Rude {
    target: Target,
    tx: Mutex<Sender<String>>,
    panics: bool,
}

impl Rude {
    fn waker(target: Target, panics: bool) -> (Waker, Receiver<String>) {
        let (tx, rx) = channel();
        let w = Arc::new(Rude {
            target,
            tx: Mutex::new(tx),
            panics,
        });
        (Waker::from(w), rx)
    }
}

impl Wake for Rude {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let what = match &self.target {
            Target::Sched(s, permit) => {
                let running = s.stats().running;
                let took = s.try_acquire(Priority::Normal).is_some();
                let p = permit.lock().unwrap().take();
                let dropped = p.is_some();
                drop(p);
                format!(
                    "stats().running={running} try_acquire={took} dropped a permit={dropped} \
                     global_running={}",
                    s.global_running()
                )
            }
            Target::Lim(l) => {
                let tried = l.try_consume(1);
                let pending = l.stats().pending;
                format!(
                    "try_consume(1)={tried:?} stats().pending={pending} tokens={:?}",
                    l.tokens()
                )
            }
        };
        let _ = self.tx.lock().unwrap().send(what);
        if self.panics {
            panic!("xwakers: this waker panics on purpose");
        }
    }
}

fn poll<F: Future + Unpin>(f: &mut F, w: &Waker) -> Poll<F::Output> {
    Pin::new(f).poll(&mut Context::from_waker(w))
}

/// Waits for the waker's report, then polls the future to completion (each
/// wait bounded); prints `fail ...` and exits on a timeout.
fn settle<F: Future + Unpin>(
    name: &str,
    f: &mut F,
    w: &Waker,
    rx: &Receiver<String>,
) -> (F::Output, String) {
    loop {
        let Ok(woke) = rx.recv_timeout(5 * SEC) else {
            say(&format!("fail {name}: the waker did not run within 5 s"));
            std::process::exit(1);
        };
        if let Poll::Ready(out) = poll(f, w) {
            return (out, woke);
        }
    }
}

// ---- child roles ----------------------------------------------------------------

/// Entry point of the child processes (does nothing in a normal test run).
#[test]
fn child_entry() {
    let Some((role, args)) = xproc::role() else {
        return;
    };
    child_init();
    // A panicking waker is the point of some scenarios: keep stderr short.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("xwakers child: panic: {info}");
    }));
    let region = Region::open(&args[0]).expect("open region");
    match role.as_str() {
        "sched" => sched_scenarios(Scheduler::attach(&region).expect("attach")),
        "lim" => lim_scenarios(Limiter::attach(&region).expect("attach")),
        other => panic!("unknown role {other}"),
    }
}

/// Scenarios on a max-2 scheduler; the parent holds a slot where noted and
/// releases it after `pending X`.
fn sched_scenarios(s: Scheduler) {
    let rx = commands();
    say("ready");
    while let Ok(Some(cmd)) = rx.recv() {
        match cmd.as_str() {
            // The parent holds 1; we hold 1; our async acquire waits and is
            // granted by our helper thread when the parent releases: its
            // waker runs there and re-enters (also dropping our permit).
            "A" | "C" | "D" => {
                let p0 = s.acquire_owned(Priority::Normal).unwrap();
                // C panics; D, after it, needs the helper thread alive.
                let (w, wrx) =
                    Rude::waker(Target::Sched(s.clone(), Mutex::new(Some(p0))), cmd == "C");
                let mut fut = s.acquire_async(Priority::Normal);
                assert!(poll(&mut fut, &w).is_pending(), "{cmd}: no room expected");
                say(&format!("pending {cmd}"));
                let (out, woke) = settle(&cmd, &mut fut, &w, &wrx);
                let permit = out.expect("granted");
                say(&format!(
                    "ok {cmd} (waker: {woke}) global_running={}",
                    s.global_running()
                ));
                drop(permit);
            }
            // We hold both; our async acquire waits; we release one on
            // this thread: the grant's waker runs on this very thread,
            // inside our release, and re-enters (E: and panics).
            "B" | "E" => {
                let p0 = s.acquire_owned(Priority::Normal).unwrap();
                let p1 = s.acquire_owned(Priority::Normal).unwrap();
                let (w, wrx) =
                    Rude::waker(Target::Sched(s.clone(), Mutex::new(Some(p0))), cmd == "E");
                let mut fut = s.acquire_async(Priority::Normal);
                assert!(poll(&mut fut, &w).is_pending(), "{cmd}: no room expected");
                drop(p1);
                let (out, woke) = settle(&cmd, &mut fut, &w, &wrx);
                let permit = out.expect("granted");
                say(&format!(
                    "ok {cmd} (waker: {woke}) global_running={}",
                    s.global_running()
                ));
                drop(permit);
            }
            // After everything: blocking and non-blocking acquires work.
            "after" => {
                let a = s.try_acquire(Priority::Normal).expect("try_acquire");
                let b = s.acquire_timeout(Priority::High, 5 * SEC).expect("acquire");
                drop((a, b));
                say(&format!("ok after running={}", s.global_running()));
            }
            other => panic!("unknown scenario {other}"),
        }
    }
    std::process::exit(0);
}

/// Scenarios on a 1,000/s limiter the parent drains before each: an async
/// consume of 50 at High waits about 50 ms and is charged by our helper
/// thread, whose wake runs the waker.
fn lim_scenarios(l: Limiter) {
    let rx = commands();
    say("ready");
    while let Ok(Some(cmd)) = rx.recv() {
        match cmd.as_str() {
            "A" | "B" | "C" => {
                let (w, wrx) = Rude::waker(Target::Lim(l.clone()), cmd == "B");
                let mut fut = l.consume_async(50, Priority::High);
                assert!(poll(&mut fut, &w).is_pending(), "{cmd}: no tokens expected");
                let (out, woke) = settle(&cmd, &mut fut, &w, &wrx);
                let g = out.expect("charged");
                say(&format!("ok {cmd} (waker: {woke}) grant {g:?}"));
            }
            "after" => {
                l.consume_timeout(10, Priority::Normal, 5 * SEC)
                    .expect("consume");
                let g = futures::executor::block_on(l.consume_async(10, Priority::Low))
                    .expect("consume_async");
                say(&format!("ok after {g:?} pending={}", l.stats().pending));
            }
            other => panic!("unknown scenario {other}"),
        }
    }
    std::process::exit(0);
}

// ---- parent side ----------------------------------------------------------------

#[test]
fn rude_wakers_of_a_shared_scheduler_break_nothing() {
    let _s = serial();
    let (tmp, region) = TempRegion::new("wsched");
    let me = Scheduler::shared(&region, 2).expect("scheduler");
    let mut k = Kid::spawn(ENTRY, "waker child", "sched", &[&tmp.path]);
    k.expect("ready", 10 * SEC);
    let waiting = |n: u32| me.stats().shared.unwrap().waiters[Priority::Normal.index()] == n;
    for (cmd, what) in [
        (
            "A",
            "re-entrant waker on the helper thread (release in another process)",
        ),
        ("B", "re-entrant waker on the releasing thread"),
        ("C", "panicking waker on the helper thread"),
        (
            "D",
            "re-entrant waker after the panic (helper still alive?)",
        ),
        ("E", "panicking waker on the releasing thread"),
        ("after", "blocking and non-blocking acquires afterwards"),
    ] {
        if ["A", "C", "D"].contains(&cmd) {
            let hold = me
                .acquire_timeout(Priority::Normal, 5 * SEC)
                .expect("parent's slot");
            k.send(cmd);
            k.expect(&format!("pending {cmd}"), 5 * SEC);
            until("the child's async waiter", 5 * SEC, || waiting(1));
            drop(hold);
        } else {
            k.send(cmd);
        }
        let line = match k.try_line(&format!("ok {cmd}"), 5 * SEC) {
            Some(l) => l,
            None => panic!(
                "scheduler, {what}: no answer within 5 s (deadlock or lost wake-up); child said \
                 {:?}",
                k.try_line("fail", Duration::ZERO)
            ),
        };
        eprintln!("scheduler wakers, {what}: ok {line}");
    }
    k.done();
    let st = me.stats().shared.unwrap();
    assert_eq!(st.running, 0, "{st:?}");
    assert_eq!(st.waiters, [0; 7], "{st:?}");
    let _ = me
        .try_acquire(Priority::Low)
        .expect("the parent's fast path is open");
}

#[test]
fn rude_wakers_of_a_shared_limiter_break_nothing() {
    let _s = serial();
    let (tmp, region) = TempRegion::new("wlim");
    let me = Limiter::shared(&region, 1000).expect("limiter");
    let mut k = Kid::spawn(ENTRY, "waker child", "lim", &[&tmp.path]);
    k.expect("ready", 10 * SEC);
    for (cmd, what) in [
        ("A", "re-entrant waker on the helper thread"),
        ("B", "panicking waker on the helper thread"),
        (
            "C",
            "re-entrant waker after the panic (helper still alive?)",
        ),
        ("after", "blocking and async consumes afterwards"),
    ] {
        let have = me.tokens().unwrap();
        if have > 0 {
            me.consume(have as u64, Priority::Highest).unwrap();
        }
        k.send(cmd);
        let line = match k.try_line(&format!("ok {cmd}"), 5 * SEC) {
            Some(l) => l,
            None => panic!(
                "limiter, {what}: no answer within 5 s (deadlock or lost wake-up); child said {:?}",
                k.try_line("fail", Duration::ZERO)
            ),
        };
        eprintln!("limiter wakers, {what}: ok {line}");
    }
    k.done();
    let st = me.stats().shared.unwrap();
    assert_eq!(st.waiters, [0; 7], "{st:?}");
}
