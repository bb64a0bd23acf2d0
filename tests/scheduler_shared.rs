//! The Scheduler shared by real processes through one region: the hard cap,
//! exact crash recovery under SIGKILL chaos, cross-process priority, and
//! waits that leave nothing behind.

mod procs;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use procs::{say, spawn, until, wait_parent, Kid};
use shmsched::region::Region;
use shmsched::scheduler::{Concurrency, Scheduler};
use shmsched::{Error, Priority};

const ENTRY: &str = "child_entry";

struct Rng(u64);
impl Rng {
    fn new() -> Rng {
        let t = Instant::now().elapsed().as_nanos() as u64;
        Rng(u64::from(std::process::id()) << 20 ^ t ^ 0x9E37_79B9_7F4A_7C15)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn attach(path: &str) -> Scheduler {
    let region = Region::open(path).expect("open region");
    Scheduler::attach(&region).expect("attach")
}

/// Entry point of the child processes (does nothing in a normal test run).
#[test]
fn child_entry() {
    let Some((role, args)) = procs::role() else {
        return;
    };
    let mut rng = Rng::new();
    match role.as_str() {
        // Acquire/release `iters` times at random priorities, then hold
        // `hold` permits until told to finish.
        "hammer" => {
            let s = attach(&args[0]);
            let iters: u64 = args[1].parse().unwrap();
            let hold: usize = args[2].parse().unwrap();
            for _ in 0..iters {
                let p = Priority::ALL[rng.below(7) as usize];
                let _permit = s.acquire(p).unwrap();
                for _ in 0..rng.below(200) {
                    std::hint::spin_loop();
                }
            }
            let held: Vec<_> = (0..hold)
                .map(|_| s.acquire(Priority::Normal).unwrap())
                .collect();
            say(&format!("holding {}", held.len()));
            wait_parent();
        }
        // Wait at one priority with the lottery off; report; hold until told.
        "waiter" => {
            let s = attach(&args[0]);
            s.set_lottery(None, false);
            let p: Priority = args[1].parse().unwrap();
            say("start");
            let _permit = s.acquire(p).unwrap();
            say("got");
            wait_parent();
        }
        // Churn until killed.
        "churn" => {
            let s = attach(&args[0]);
            say("start");
            loop {
                let p = Priority::ALL[rng.below(7) as usize];
                let permit = s.acquire(p).unwrap();
                // Hold most of the time, so that kills land on holders (and,
                // with 5 churners and 4 slots, on waiters). The sleep is load
                // shaping for a 2-core machine, not synchronisation.
                std::thread::sleep(Duration::from_micros(rng.below(300)));
                drop(permit);
                for _ in 0..rng.below(2000) {
                    std::hint::spin_loop();
                }
            }
        }
        // The partner of a three-scheduler ping-pong (see
        // `ping_pong_hand_offs_across_processes_are_never_lost`): holds slot
        // 2, then step i waits for slot i % 3 and releases (i + 2) % 3.
        "pingpong" => {
            let s: Vec<Scheduler> = args[..3].iter().map(|p| attach(p)).collect();
            let steps: usize = args[3].parse().unwrap();
            let mut held: [Option<_>; 3] = [None, None, s[2].try_acquire(Priority::Normal)];
            assert!(held[2].is_some(), "slot 2 free at start");
            say("ready");
            for i in 0..steps {
                match s[i % 3].acquire_timeout(Priority::Normal, Duration::from_secs(5)) {
                    Ok(p) => held[i % 3] = Some(p),
                    Err(e) => {
                        say(&format!("failed at {i}: {e}"));
                        std::process::exit(1);
                    }
                }
                drop(held[(i + 2) % 3].take());
            }
            say("done");
            wait_parent();
        }
        // Threads that count themselves between grant and release in a
        // second shared page (see `holders_count_themselves`).
        "counter" => {
            let s = attach(&args[0]);
            let page = CountPage::open(&args[1]);
            let threads: usize = args[2].parse().unwrap();
            let until = Instant::now() + Duration::from_millis(args[3].parse().unwrap());
            let raw = args[4] == "raw";
            say("start");
            std::thread::scope(|sc| {
                for t in 0..threads {
                    let (s, page) = (&s, &page);
                    sc.spawn(move || count_holds(s, page, t, until, raw));
                }
            });
            say("done");
            wait_parent();
        }
        other => panic!("unknown role {other}"),
    }
}

/// A page of counters that the processes of a test share (a file in
/// /dev/shm, mapped by each): the holders' own count of who holds what.
struct CountPage {
    map: memmap2::MmapMut,
}

/// Words of a [`CountPage`].
const RUNNING: usize = 0; // units held now, counted by the holders
const MOST: usize = 1; // the most `RUNNING` was after a grant
const OVER: usize = 2; // grants that saw `RUNNING` above the max
const DOUBLE: usize = 3; // raw permits that found their cell's holder set
const GRANTS: usize = 4;
const MAX_WORD: usize = 5;
const HOLDERS: usize = 8; // one word per cell (raw permits)

impl CountPage {
    fn create(path: &str, max: u32) -> CountPage {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .unwrap();
        f.set_len(((HOLDERS + max as usize) * 8) as u64).unwrap();
        let page = CountPage::map(&f);
        page.word(MAX_WORD).store(u64::from(max), Ordering::SeqCst);
        page
    }

    fn open(path: &str) -> CountPage {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        CountPage::map(&f)
    }

    fn map(f: &std::fs::File) -> CountPage {
        // SAFETY: a file of this test's, only ever accessed through the
        // atomics below (by every process that maps it).
        let map = unsafe { memmap2::MmapMut::map_mut(f) }.unwrap();
        CountPage { map }
    }

    fn word(&self, i: usize) -> &std::sync::atomic::AtomicU64 {
        let words = self.map.len() / 8;
        assert!(i < words, "word {i} of {words}");
        // SAFETY: in bounds (asserted), 8-aligned (the mapping is
        // page-aligned), and shared memory is only accessed atomically.
        unsafe { &*(self.map.as_ptr().add(i * 8) as *const std::sync::atomic::AtomicU64) }
    }
}

/// One thread of a "counter" child: until `until`, takes units by every
/// way there is (blocking, with a timeout, try, weighted, async, and as a
/// raw permit when `raw`), at random priorities; counts the units it holds
/// in the page between its grant and its release, and checks the count
/// against the max. A raw permit also claims its cell's holder word, so
/// two holders of one cell are seen even if the count stays within max.
fn count_holds(s: &Scheduler, page: &CountPage, t: usize, until: Instant, raw: bool) {
    let max = page.word(MAX_WORD).load(Ordering::SeqCst);
    let me = (u64::from(std::process::id()) << 16) | (t as u64 + 1);
    let mut rng = Rng(Rng::new().0 ^ (me << 1) | 1);
    while Instant::now() < until {
        let p = Priority::ALL[rng.below(7) as usize];
        let (permit, n) = match rng.below(20) {
            0..=9 => (Some(s.acquire(p).unwrap()), 1),
            10..=13 => (
                s.acquire_timeout(p, Duration::from_micros(rng.below(2000)))
                    .ok(),
                1,
            ),
            14..=15 => (s.try_acquire(p), 1),
            16 => {
                let n = 1 + rng.below(max.min(3)) as u32;
                (
                    s.acquire_many_timeout(p, n, Duration::from_millis(5)).ok(),
                    u64::from(n),
                )
            }
            _ => (
                Some(futures::executor::block_on(s.acquire_async(p)).unwrap()),
                1,
            ),
        };
        let Some(permit) = permit else { continue };
        page.word(GRANTS).fetch_add(1, Ordering::Relaxed);
        let now = page.word(RUNNING).fetch_add(n, Ordering::SeqCst) + n;
        page.word(MOST).fetch_max(now, Ordering::SeqCst);
        if now > max {
            page.word(OVER).fetch_add(1, Ordering::SeqCst);
        }
        // Load shaping for a 2-core machine (hold a while, sometimes
        // yielding the CPU), not synchronisation.
        let hold = |rng: &mut Rng| {
            for _ in 0..rng.below(3000) {
                std::hint::spin_loop();
            }
            if rng.below(4) == 0 {
                std::thread::yield_now();
            }
        };
        let tag = std::num::NonZeroU32::new(rng.next() as u32 | 1).unwrap();
        match if raw && n == 1 {
            permit.into_raw(tag)
        } else {
            Err(permit)
        } {
            Ok(raw) => {
                let holder = page.word(HOLDERS + raw.cell() as usize);
                if holder.swap(me, Ordering::SeqCst) != 0 {
                    page.word(DOUBLE).fetch_add(1, Ordering::SeqCst);
                }
                hold(&mut rng);
                let _ = holder.compare_exchange(me, 0, Ordering::SeqCst, Ordering::SeqCst);
                page.word(RUNNING).fetch_sub(n, Ordering::SeqCst);
                s.release_raw(raw).unwrap();
            }
            Err(permit) => {
                hold(&mut rng);
                page.word(RUNNING).fetch_sub(n, Ordering::SeqCst);
                drop(permit);
            }
        }
    }
}

struct TempRegion(String);
impl TempRegion {
    fn new(tag: &str) -> TempRegion {
        TempRegion(format!("/dev/shm/shmsched-{}", procs::unique_name(tag)))
    }
}
impl Drop for TempRegion {
    fn drop(&mut self) {
        let _ = Region::remove(&self.0);
    }
}

/// Sets the flag when dropped, so an observer thread also stops when the
/// test body panics (else `thread::scope` would wait for it forever).
struct StopOnDrop<'a>(&'a AtomicBool);
impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Samples the global running count on a thread until stopped; returns the
/// highest value seen.
fn observe(s: &Scheduler, stop: &AtomicBool, worst: &AtomicU32) {
    while !stop.load(Ordering::Relaxed) {
        worst.fetch_max(s.global_running(), Ordering::Relaxed);
        std::thread::yield_now();
    }
}

#[test]
fn eight_processes_never_exceed_max() {
    let tmp = TempRegion::new("hammer");
    let region = Region::create(&tmp.0).unwrap();
    let me = Scheduler::shared(&region, 3).unwrap();
    let stop = AtomicBool::new(false);
    let worst = AtomicU32::new(0);
    // Less than max in all, so that the last hammering child can finish.
    let holds = [0, 1, 0, 0, 0, 0, 1, 0];
    std::thread::scope(|sc| {
        sc.spawn(|| observe(&me, &stop, &worst));
        let _stop = StopOnDrop(&stop);
        let mut kids: Vec<Kid> = holds
            .iter()
            .map(|h| {
                spawn(
                    ENTRY,
                    "hammer",
                    &[tmp.0.clone(), "3000".into(), h.to_string()],
                )
            })
            .collect();
        let mut total = 0;
        for k in &mut kids {
            total += k.expect_line("holding").parse::<u32>().unwrap();
        }
        // Quiescent: every child holds what it said, nothing else is held.
        let st = me.stats().shared.unwrap();
        assert_eq!(st.running, total, "running equals the sum of live holdings");
        assert_eq!(st.processes, 9);
        assert_eq!(st.waiters, [0; 7]);
        for k in kids {
            assert!(k.finish().success());
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(
        worst.load(Ordering::Relaxed) <= 3,
        "observed {} > max 3",
        worst.load(Ordering::Relaxed)
    );
    assert!(
        worst.load(Ordering::Relaxed) >= 1,
        "the observer saw the load"
    );
    let st = me.stats().shared.unwrap();
    assert_eq!(st.running, 0);
    assert_eq!(st.reclaimed, 0, "clean exits leave nothing to reclaim");
}

#[test]
fn high_priority_in_another_process_is_served_first() {
    let tmp = TempRegion::new("prio");
    let region = Region::create(&tmp.0).unwrap();
    let me = Scheduler::shared(&region, 1).unwrap();
    let hold = me.acquire(Priority::Normal).unwrap();
    let mut low = spawn(ENTRY, "waiter", &[tmp.0.clone(), "low".into()]);
    low.expect_line("start");
    until("low queued", 10, || {
        me.stats().shared.unwrap().waiters[Priority::Low.index()] == 1
    });
    let mut high = spawn(ENTRY, "waiter", &[tmp.0.clone(), "high".into()]);
    high.expect_line("start");
    until("high queued", 10, || {
        me.stats().shared.unwrap().waiters[Priority::High.index()] == 1
    });
    drop(hold);
    high.expect_line("got");
    let st = me.stats().shared.unwrap();
    assert_eq!(
        st.waiters[Priority::Low.index()],
        1,
        "low still waits while high runs"
    );
    assert_eq!(st.running, 1);
    assert!(high.finish().success());
    low.expect_line("got");
    assert!(low.finish().success());
    assert_eq!(me.stats().shared.unwrap().running, 0);
}

#[test]
fn chaos_sigkill_holders_nothing_leaks() {
    const MAX: u32 = 4;
    const KILLS: usize = 500;
    let tmp = TempRegion::new("chaos");
    let region = Region::create(&tmp.0).unwrap();
    let me = Scheduler::shared(&region, MAX).unwrap();
    let stop = AtomicBool::new(false);
    let worst = AtomicU32::new(0);
    let mut rng = Rng::new();
    let started = Instant::now();
    std::thread::scope(|sc| {
        sc.spawn(|| observe(&me, &stop, &worst));
        let _stop = StopOnDrop(&stop);
        let mut kids: Vec<Kid> = (0..5)
            .map(|_| spawn(ENTRY, "churn", std::slice::from_ref(&tmp.0)))
            .collect();
        for k in &mut kids {
            k.expect_line("start");
        }
        for _ in 0..KILLS {
            assert!(
                started.elapsed() < Duration::from_secs(240),
                "chaos took too long"
            );
            let i = rng.below(kids.len() as u64) as usize;
            // A random instant inside the victim's churn loop.
            std::thread::sleep(Duration::from_micros(rng.below(3000)));
            let victim = kids.swap_remove(i);
            victim.kill();
            let mut k = spawn(ENTRY, "churn", std::slice::from_ref(&tmp.0));
            k.expect_line("start");
            kids.push(k);
        }
        for k in kids {
            k.kill();
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(
        worst.load(Ordering::Relaxed) <= MAX,
        "cap violated: {}",
        worst.load(Ordering::Relaxed)
    );
    me.reap().unwrap();
    let st = me.stats().shared.unwrap();
    assert_eq!(
        st.running, 0,
        "every slot of every dead process came back: {st:?}"
    );
    assert_eq!(st.waiters, [0; 7]);
    assert_eq!(st.processes, 1);
    // Kills landed on holders: the crash path was exercised for real. (How
    // often depends on timing: kills come faster than the ~50 ms automatic
    // reclaim, so many land on waiters while the slots are held by the
    // already dead. Typically 15-70 of the 500.)
    assert!(st.reclaimed >= 1, "no kill landed on a holder");
    // The budget is whole: all MAX slots can be taken at once.
    let all: Vec<_> = (0..MAX)
        .map(|_| me.try_acquire(Priority::Normal).expect("slot"))
        .collect();
    assert!(me.try_acquire(Priority::Highest).is_none());
    drop(all);
    eprintln!(
        "chaos: {KILLS} kills in {:?}, {} slots reclaimed from {} dead processes",
        started.elapsed(),
        st.reclaimed,
        st.reaped_processes
    );
}

#[test]
fn waiter_reclaims_slots_of_a_dead_holder_by_itself() {
    let tmp = TempRegion::new("autoreap");
    let region = Region::create(&tmp.0).unwrap();
    let me = Scheduler::shared(&region, 2).unwrap();
    let mut kid = spawn(ENTRY, "hammer", &[tmp.0.clone(), "0".into(), "2".into()]);
    assert_eq!(kid.expect_line("holding"), "2");
    assert!(me.try_acquire(Priority::High).is_none());
    kid.kill();
    // No explicit reap: the blocked waiter finds the dead holder itself.
    let p = me
        .acquire_timeout(Priority::Normal, Duration::from_secs(10))
        .expect("reclaimed");
    let st = me.stats().shared.unwrap();
    assert_eq!(st.reclaimed, 2);
    assert_eq!(st.reaped_processes, 1);
    assert_eq!(st.running, 1);
    drop(p);
}

#[test]
fn timed_out_shared_wait_leaves_no_waiter_count() {
    let tmp = TempRegion::new("timeout");
    let region = Region::create(&tmp.0).unwrap();
    let me = Scheduler::shared(&region, 1).unwrap();
    let other = Scheduler::attach(&region).unwrap();
    let _hold = me.acquire(Priority::Normal).unwrap();
    let e = other
        .acquire_timeout(Priority::High, Duration::from_millis(30))
        .unwrap_err();
    assert!(matches!(e, Error::Timeout));
    let st = other.stats();
    assert_eq!(st.shared.as_ref().unwrap().waiters, [0; 7]);
    // Region-wide stall time: the 30 ms wait, closed when it was cancelled.
    let stall = st.shared.as_ref().unwrap().stall_ns;
    assert!(stall >= 25_000_000, "stall {stall} ns");
    assert_eq!(other.stats().shared.unwrap().stall_ns, stall, "closed");
    assert_eq!(st.queues[Priority::High.index()].cancelled, 1);
    assert_eq!(st.pending, 0);
    // The fast path is open again for everyone.
    drop(_hold);
    assert!(other.try_acquire(Priority::Low).is_some());
}

#[test]
fn opening_with_another_max_is_an_error() {
    let tmp = TempRegion::new("mismatch");
    let region = Region::create(&tmp.0).unwrap();
    let _a = Scheduler::shared(&region, Concurrency::max(4)).unwrap();
    let e = Scheduler::shared(&region, 5).unwrap_err().to_string();
    assert!(e.contains('4') && e.contains('5'), "{e}");
    let e = Scheduler::shared(&region, Concurrency::unlimited())
        .unwrap_err()
        .to_string();
    assert!(e.contains("finite max"), "{e}");
    let e = Scheduler::shared(&Region::anonymous().unwrap(), 70_000)
        .unwrap_err()
        .to_string();
    assert!(e.contains("70000") && e.contains("65536"), "{e}");
}

/// Every hand-off of a ping-pong between two processes through three
/// schedulers of max 1 (each side always holds a slot the other needs
/// next) wakes the waiter in the other process: a waiter's first sleep
/// uses the words it read when it was queued, before its enqueue served,
/// so a designation or grant that lands between that serve and the sleep
/// must still wake it. A lost wake-up shows as a step that waits for the
/// keeper's backstop (20 ms) or times out (5 s, then the test fails).
#[test]
fn ping_pong_hand_offs_across_processes_are_never_lost() {
    const STEPS: usize = 3000;
    let tmps: Vec<TempRegion> = (0..3).map(|i| TempRegion::new(&format!("pp{i}"))).collect();
    let regions: Vec<Region> = tmps.iter().map(|t| Region::create(&t.0).unwrap()).collect();
    let s: Vec<Scheduler> = regions
        .iter()
        .map(|r| Scheduler::shared(r, 1).unwrap())
        .collect();
    let mut held = [
        Some(s[0].acquire(Priority::Normal).unwrap()),
        Some(s[1].acquire(Priority::Normal).unwrap()),
        None,
    ];
    let mut args: Vec<String> = tmps.iter().map(|t| t.0.clone()).collect();
    args.push(STEPS.to_string());
    let mut kid = spawn(ENTRY, "pingpong", &args);
    kid.expect_line("ready");
    until("partner holds slot 2", 10, || s[2].global_running() == 1);
    let mut steps = Vec::with_capacity(STEPS);
    for i in 0..STEPS {
        let t = Instant::now();
        drop(held[i % 3].take());
        let want = (i + 2) % 3;
        held[want] = Some(
            s[want]
                .acquire_timeout(Priority::Normal, Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("step {i}: {e}")),
        );
        steps.push(t.elapsed());
    }
    kid.expect_line("done");
    assert!(kid.finish().success());
    steps.sort();
    let median = steps[STEPS / 2];
    let slow = steps
        .iter()
        .filter(|d| **d >= Duration::from_millis(20))
        .count();
    eprintln!("ping-pong: median round trip {median:?}, {slow} of {STEPS} at 20 ms or more");
    assert!(
        median < Duration::from_millis(5),
        "median round trip {median:?}"
    );
    assert!(
        slow * 50 < STEPS,
        "{slow} of {STEPS} round trips took 20 ms or more"
    );
}

/// The hard cap as the holders see it: threads in four processes count
/// themselves in shared memory between their grant and their release (the
/// region's own count of taken cells cannot see two holders of one cell,
/// or a cell freed under its holder), taking units by every way there is,
/// while one of the processes is stopped and continued over and over (the
/// adversary: its waiters are passed over and reclaim their places, its
/// holders hold while it is stopped). At max 1, 4 and 64, plain permits
/// and raw ones (a raw permit also claims its cell's holder word): never
/// more holders than the max, never two holders of one cell, nothing held
/// at the end.
#[test]
fn holders_count_themselves_and_never_exceed_the_max() {
    for (max, mode) in [(1, "plain"), (4, "plain"), (4, "raw"), (64, "raw")] {
        let tmp = TempRegion::new(&format!("count{max}{mode}"));
        let page_path = format!("{}-page", tmp.0);
        let _page_file = TempRegion(page_path.clone());
        let region = Region::create(&tmp.0).unwrap();
        let me = Scheduler::shared(&region, max).unwrap();
        let page = CountPage::create(&page_path, max);
        let threads = if max == 64 { 24 } else { 4 };
        let mut kids: Vec<Kid> = (0..4)
            .map(|_| {
                spawn(
                    ENTRY,
                    "counter",
                    &[
                        tmp.0.clone(),
                        page_path.clone(),
                        threads.to_string(),
                        "1500".into(),
                        mode.into(),
                    ],
                )
            })
            .collect();
        for k in &mut kids {
            k.expect_line("start");
        }
        // The adversary: the last child is stopped and continued (10 ms
        // each) until the children are done.
        let victim = kids[3].child.id() as libc::pid_t;
        let started = Instant::now();
        let mut stops = 0;
        while started.elapsed() < Duration::from_millis(1400) {
            // SAFETY: signals to our own child, which is alive (it waits
            // for its parent before it exits).
            unsafe { libc::kill(victim, libc::SIGSTOP) };
            stops += 1;
            std::thread::sleep(Duration::from_millis(10));
            // SAFETY: as above.
            unsafe { libc::kill(victim, libc::SIGCONT) };
            std::thread::sleep(Duration::from_millis(10));
        }
        for k in &mut kids {
            k.expect_line("done");
        }
        for k in kids {
            assert!(k.finish().success());
        }
        let w = |i| page.word(i).load(Ordering::SeqCst);
        eprintln!(
            "max {max} {mode}: {} grants, most held at once {}, {stops} stops",
            w(GRANTS),
            w(MOST)
        );
        assert_eq!(
            w(OVER),
            0,
            "max {max} {mode}: grants above the max (most {})",
            w(MOST)
        );
        assert_eq!(w(DOUBLE), 0, "max {max} {mode}: a cell with two holders");
        assert!(w(MOST) <= u64::from(max));
        assert_eq!(w(RUNNING), 0);
        assert!(
            w(GRANTS) >= 100,
            "max {max} {mode}: only {} grants",
            w(GRANTS)
        );
        let st = me.stats().shared.unwrap();
        assert_eq!(
            st.running, 0,
            "max {max} {mode}: nothing held at the end: {st:?}"
        );
        assert_eq!(st.waiters, [0; 7]);
        // The whole budget is there.
        let all: Vec<_> = (0..max)
            .map(|_| me.try_acquire(Priority::Normal).expect("slot"))
            .collect();
        assert!(me.try_acquire(Priority::Highest).is_none());
        drop(all);
    }
}
