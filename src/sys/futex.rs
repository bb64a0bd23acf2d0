//! Shared futex wait and wake.
//!
//! The futex words live in a `MAP_SHARED` mapping used by several
//! processes, so these calls use the *shared* futex operations (no
//! `FUTEX_PRIVATE_FLAG`): the kernel keys the wait queue on the underlying
//! page (inode + offset), not on this process's address space, so a waiter in
//! one process is woken by a waker in another even though the word sits at
//! different virtual addresses in each.
//!
//! The timeout of `FUTEX_WAIT` is relative and measured on
//! `CLOCK_MONOTONIC`, so wall-clock changes do not stretch or cut a wait.

#[cfg(not(shuttle))]
pub use os::{futex_wait, futex_wait_bitset, futex_wake, futex_wake_bitset};

#[cfg(shuttle)]
pub use model::{futex_wait, futex_wait_bitset, futex_wake, futex_wake_bitset};

/// How a [`futex_wait`] ended. Every outcome may be spurious from the
/// caller's point of view: callers re-check their condition in a loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitResult {
    /// Woken by a [`futex_wake`] (or spuriously).
    Woken,
    /// The timeout elapsed.
    TimedOut,
    /// The word did not hold `expected` when the kernel looked, so the call
    /// returned at once (`EAGAIN`).
    Mismatch,
    /// A signal interrupted the wait (`EINTR`).
    Interrupted,
}

/// Every bit: a waiter sleeping with this mask is woken by any
/// [`futex_wake_bitset`], and a wake with it reaches every sleeper.
pub const BITSET_ALL: u32 = u32::MAX;

/// The futex system calls, on the standard library's atomics: the
/// crate's futex functions outside the model checker, and always the fork
/// gate's (process-wide words in statics, never part of a modelled
/// protocol).
// Under the model checker only the fork gate uses this module.
#[cfg_attr(shuttle, allow(dead_code))]
pub(crate) mod os {
    use super::WaitResult;
    use std::sync::atomic::AtomicU32;
    use std::time::Duration;

    /// Sleeps while `word == expected`, at most `timeout` (relative,
    /// `CLOCK_MONOTONIC`) if given.
    ///
    /// The check of the word and the going to sleep are atomic with respect to
    /// [`futex_wake`]: a wake issued after the word changed cannot be missed.
    pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> WaitResult {
        let ts = timeout.map(|d| libc::timespec {
            // Saturate absurdly long timeouts instead of wrapping to negative.
            tv_sec: d.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        });
        let ts_ptr: *const libc::timespec = match &ts {
            Some(t) => t,
            None => std::ptr::null(),
        };
        // SAFETY: `word.as_ptr()` points to a live, aligned u32 for the whole call
        // (we hold a shared reference to it); the kernel only reads it. `ts_ptr` is
        // null or points to `ts`, which outlives the call. FUTEX_WAIT (shared) has
        // no other memory effects.
        let r = unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT,
                expected,
                ts_ptr,
            )
        };
        wait_result(r)
    }

    /// What a `FUTEX_WAIT` or `FUTEX_WAIT_BITSET` call returning `r` means.
    fn wait_result(r: libc::c_long) -> WaitResult {
        if r == 0 {
            return WaitResult::Woken;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ETIMEDOUT) => WaitResult::TimedOut,
            Some(libc::EAGAIN) => WaitResult::Mismatch,
            Some(libc::EINTR) => WaitResult::Interrupted,
            e => {
                // EFAULT/EINVAL/ENOSYS cannot happen with a valid reference and a
                // normalised timespec; callers loop anyway, so report it as an
                // interruption in release builds.
                debug_assert!(false, "unexpected futex wait error {e:?}");
                WaitResult::Interrupted
            }
        }
    }

    /// Wakes up to `n` waiters sleeping on `word` (in any process that maps the
    /// same page). Returns how many were woken.
    ///
    /// `FUTEX_WAKE` never reads or writes the word itself; it only uses the
    /// address as a key. That is why a wake on memory that another process has
    /// just unmapped is harmless, and why `EFAULT` (which can only arise if the
    /// page went away under us) can be ignored: there is nobody to wake on a
    /// mapping that no longer exists.
    pub fn futex_wake(word: &AtomicU32, n: i32) -> usize {
        // SAFETY: `word.as_ptr()` is a live, aligned u32 for the whole call; the
        // kernel uses the address only to find the wait queue and does not write
        // through it.
        let r = unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, n) };
        if r < 0 {
            // Only EFAULT (harmless, see above) or EINVAL (n < 0 is not an error
            // for FUTEX_WAKE, so none) are possible.
            debug_assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::EFAULT)
            );
            return 0;
        }
        r as usize
    }

    /// Like [`futex_wait`], but the sleeper is tagged with `bitset` (nonzero):
    /// only a [`futex_wake_bitset`] whose mask shares a bit with it wakes it
    /// (a plain [`futex_wake`] wakes it too). Lets many threads sleep on one
    /// shared word while a waker picks which of them to wake.
    ///
    /// The timeout is relative on `CLOCK_MONOTONIC`, like [`futex_wait`]'s (the
    /// kernel's `FUTEX_WAIT_BITSET` takes an absolute time; this converts).
    pub fn futex_wait_bitset(
        word: &AtomicU32,
        expected: u32,
        timeout: Option<Duration>,
        bitset: u32,
    ) -> WaitResult {
        let ts = timeout.map(|d| {
            let now = crate::sys::clock::monotonic_ns();
            let until = u128::from(now) + d.as_nanos();
            // Saturate absurdly long timeouts instead of wrapping.
            let secs = (until / 1_000_000_000).min(libc::time_t::MAX as u128);
            libc::timespec {
                tv_sec: secs as libc::time_t,
                tv_nsec: (until % 1_000_000_000) as libc::c_long,
            }
        });
        let ts_ptr: *const libc::timespec = match &ts {
            Some(t) => t,
            None => std::ptr::null(),
        };
        // SAFETY: as in `futex_wait`: `word` is a live aligned u32 for the call,
        // the kernel only reads it; `ts_ptr` is null or points to `ts`, which
        // outlives the call; `uaddr2` is unused by FUTEX_WAIT_BITSET (null).
        // A zero bitset would be EINVAL, so it is forced to at least one bit.
        let r = unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT_BITSET,
                expected,
                ts_ptr,
                std::ptr::null::<u32>(),
                bitset.max(1),
            )
        };
        wait_result(r)
    }

    /// Wakes up to `n` sleepers on `word` whose [`futex_wait_bitset`] mask
    /// shares a bit with `bitset` (sleepers of a plain [`futex_wait`] match
    /// every mask). Returns how many were woken. Harmless on unmapped memory,
    /// like [`futex_wake`].
    pub fn futex_wake_bitset(word: &AtomicU32, n: i32, bitset: u32) -> usize {
        // SAFETY: the address is used only as a key; the kernel neither reads nor
        // writes through it for a wake. `uaddr2` and `val2` are unused.
        let r = unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAKE_BITSET,
                n,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                bitset.max(1),
            )
        };
        if r < 0 {
            debug_assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::EFAULT)
            );
            return 0;
        }
        r as usize
    }
}

#[cfg(shuttle)]
pub mod model {
    //! The futex calls under the model checker (`--cfg shuttle`): a model of
    //! the kernel's shared futexes built from the checker's own primitives, so
    //! that no call ever blocks the one OS thread the checker runs every model
    //! thread on, and so that a sleeper that is never woken is a deadlock the
    //! checker reports.
    //!
    //! - **Keys.** The kernel keys a shared futex on the page (inode + offset),
    //!   not on the virtual address: two processes map the region at different
    //!   addresses. Each region mapping registers its range and its file's
    //!   identity here ([`map_range`], from `Mapping::new`), so a word in a
    //!   mapping is keyed by (file, offset) and a waker in one "process" (a
    //!   group of model threads with its own mapping) reaches a sleeper in
    //!   another. Other words (process memory) are keyed by their address.
    //! - **No lost wake-up.** A sleeper checks the word and enqueues itself
    //!   under the table's lock, and a waker takes the same lock to dequeue, so
    //!   a wake issued after the word changed is never missed (the callers bump
    //!   the word before they wake, as with the kernel).
    //! - **Timeouts** are switchable per execution ([`set_timeouts`]). Off: a
    //!   timed wait ends only by a wake (a wake-up the protocol loses shows up
    //!   as a deadlock; spurious wake-ups of the checker are slept through).
    //!   On: a timed wait may also end by timeout, at whatever point the
    //!   checker next runs the sleeper (it yields once; the checker decides
    //!   when it runs again). Waits without a timeout always end only by a
    //!   wake.
    //! - **Death.** [`kill_parked`] marks a mapping's process dead while all
    //!   its threads are inside a wait here (asleep, or woken and not yet run):
    //!   a wake no longer counts them (a dead process has no sleepers), and,
    //!   when next run, they unwind with [`Died`] (without the panic hook,
    //!   through frames that hold no lock of the region), so they never act
    //!   again. A process may also die at a named step of the protocol
    //!   ([`death_point`]), its running thread unwinding from there. A test
    //!   runs each model thread under `catch_unwind` and treats `Died` as the
    //!   thread's end.
    //! - **Stops.** A process can be stopped ([`stop`]) and continued
    //!   ([`cont`]): while it is stopped its threads are not scheduled. Every
    //!   atomic operation and lock of the crate's protocols is a step where a
    //!   thread of a stopped process parks ([`stop_gate`]; model threads say
    //!   which process they belong to with [`join_process`]), so a stop lands
    //!   between any two steps; a stopped thread asleep here stays asleep
    //!   (a wake marks it woken; it runs on only once continued).
    //! - **Time.** The bounds on other processes' progress (a designation
    //!   not taken, a front not charged, a lock holder that does not move)
    //!   are measured on a model clock ([`now_ns`]) that moves only when a
    //!   test says time passes ([`advance`]): a process stopped "for a
    //!   while" is one the test stopped and then advanced the clock for.
    //!   Waiters' own timeouts are the timeouts above.
    //! - **Private words.** A word in process memory (a waiter's own word)
    //!   is keyed by its address; its sleeper counts as a sleeper of the
    //!   process its thread belongs to, for deaths and stops alike.

    use super::WaitResult;
    use crate::sync::atomic::{AtomicU32, Ordering};
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering as StdOrdering};
    use std::sync::Arc;
    use std::time::Duration;

    /// Prints `msg` with the current model thread's name if `MODEL_TRACE`
    /// is set (to follow a replayed schedule).
    pub fn trace(msg: std::fmt::Arguments<'_>) {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if *ON.get_or_init(|| std::env::var_os("MODEL_TRACE").is_some()) {
            let t = shuttle::thread::current();
            eprintln!("[{}] {msg}", t.name().unwrap_or("?"));
        }
    }

    /// The unwind payload of a thread whose process died (see the module
    /// docs).
    #[derive(Debug)]
    pub struct Died;

    /// A region mapping: where it lies in this address space, its file's
    /// identity, and whether its process is dead.
    #[derive(Debug)]
    struct Range {
        base: usize,
        len: usize,
        identity: (u64, u64),
        dead: bool,
    }

    /// Every live region mapping of the (one, real) process. A plain std
    /// lock: mappings are real, and no model operation runs under it.
    static RANGES: std::sync::Mutex<Vec<Range>> = std::sync::Mutex::new(Vec::new());

    fn ranges() -> std::sync::MutexGuard<'static, Vec<Range>> {
        RANGES.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a region mapping (`Mapping::new`).
    pub fn map_range(base: usize, len: usize, identity: (u64, u64)) {
        let mut r = ranges();
        r.retain(|x| x.base != base);
        r.push(Range {
            base,
            len,
            identity,
            dead: false,
        });
    }

    /// Forgets a region mapping (`Mapping`'s drop, before the unmap).
    pub fn unmap_range(base: usize) {
        ranges().retain(|x| x.base != base);
    }

    /// What the kernel would key a futex word on.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Key {
        /// A word of a region file: the file and the offset in it.
        Shared { identity: (u64, u64), offset: usize },
        /// A word in process memory.
        Private(usize),
    }

    /// The key of the word at `addr`, the base of the mapping it lies in,
    /// and whether that mapping's process is dead.
    fn key_of(addr: usize) -> (Key, Option<usize>, bool) {
        let r = ranges();
        match r.iter().find(|x| addr >= x.base && addr < x.base + x.len) {
            Some(x) => (
                Key::Shared {
                    identity: x.identity,
                    offset: addr - x.base,
                },
                Some(x.base),
                x.dead,
            ),
            None => (Key::Private(addr), None, false),
        }
    }

    const WAITING: u8 = 0;
    const WOKEN: u8 = 1;
    const DEAD: u8 = 2;

    /// A thread inside a wait: in the table from its check of the word
    /// until it runs again after a wake, a timeout or its death.
    #[derive(Debug)]
    struct Sleeper {
        key: Key,
        bits: u32,
        /// The mapping (process) the word was reached through.
        base: Option<usize>,
        thread: shuttle::thread::Thread,
        /// WAITING, WOKEN or DEAD; changed only under the table's lock.
        state: Arc<AtomicU8>,
    }

    #[derive(Debug, Default)]
    struct Table {
        /// In the order they went to sleep (the kernel wakes FIFO within a
        /// priority); a wake skips those already woken.
        sleepers: Vec<Sleeper>,
        timeouts: bool,
        /// Death points armed: (mapping base, point name).
        armed: Vec<(usize, &'static str)>,
        /// The scheduler's fairness hand-off never comes due (see
        /// [`set_never_fair`]).
        never_fair: bool,
        /// Ghost tallies (see [`ghost_add`]): per key, the tally now.
        ghosts: Vec<(Key, i64)>,
        /// Ghost watches: the words positive since the watch began (see
        /// [`ghost_watch`]); `None` once ended.
        watches: Vec<Option<Vec<Key>>>,
    }

    shuttle::lazy_static! {
        /// The sleepers of the current execution (a fresh table for each).
        static ref TABLE: shuttle::sync::Mutex<Table> = shuttle::sync::Mutex::new(Table::default());
    }

    fn table() -> shuttle::sync::MutexGuard<'static, Table> {
        TABLE.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Switches timeouts on or off for the current execution (off until
    /// called; see the module docs).
    pub fn set_timeouts(on: bool) {
        table().timeouts = on;
    }

    // ---- time and stops (per test thread, not scheduling points; [`begin`]
    // resets them at the start of every execution) -----------------------
    //
    // Shuttle runs every model thread of an execution on the test's own OS
    // thread, and the test harness runs several model tests at once on
    // threads of its own: so this state is the test thread's (a plain
    // process-wide static was shared by tests running side by side, whose
    // `begin` and thread ids then mixed up each other's processes).

    /// Which process (mapping base) each model thread belongs to, which
    /// processes are stopped, and the threads parked by a stop.
    #[derive(Default)]
    struct Stops {
        members: Vec<(usize, usize)>,
        stopped: Vec<usize>,
        parked: Vec<(usize, shuttle::thread::Thread)>,
        /// Stop points armed: (mapping base, point name).
        armed: Vec<(usize, &'static str)>,
    }

    /// The model's clock, stop flag and stops of one test thread.
    struct TimeAndStops {
        now_ns: AtomicU64,
        any_stopped: AtomicBool,
        stops: std::sync::Mutex<Stops>,
    }

    thread_local! {
        // Leaked once per test thread, so the accessors can hand out
        // 'static references (a few bytes; test builds only).
        static TIME_AND_STOPS: &'static TimeAndStops = Box::leak(Box::new(TimeAndStops {
            now_ns: AtomicU64::new(1 << 40),
            any_stopped: AtomicBool::new(false),
            stops: std::sync::Mutex::new(Stops::default()),
        }));
    }

    fn time_and_stops() -> &'static TimeAndStops {
        TIME_AND_STOPS.with(|t| *t)
    }

    fn stops() -> std::sync::MutexGuard<'static, Stops> {
        time_and_stops()
            .stops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Starts an execution: the model clock at its origin, nobody stopped,
    /// no thread in any process yet.
    pub fn begin() {
        time_and_stops().now_ns.store(1 << 40, StdOrdering::SeqCst);
        time_and_stops()
            .any_stopped
            .store(false, StdOrdering::SeqCst);
        *stops() = Stops::default();
    }

    /// The model clock, ns (see the module docs).
    pub fn now_ns() -> u64 {
        time_and_stops().now_ns.load(StdOrdering::SeqCst)
    }

    /// Lets `ns` of model time pass.
    pub fn advance(ns: u64) {
        time_and_stops().now_ns.fetch_add(ns, StdOrdering::SeqCst);
    }

    fn thread_key() -> usize {
        usize::from(shuttle::thread::current().id())
    }

    /// Records the calling model thread as a thread of the process whose
    /// region mapping is at `base`.
    pub fn join_process(base: usize) {
        let me = thread_key();
        let mut s = stops();
        s.members.retain(|&(t, _)| t != me);
        s.members.push((me, base));
    }

    /// The process (mapping base) of the calling thread, if it joined one.
    fn my_process() -> Option<usize> {
        let me = thread_key();
        stops()
            .members
            .iter()
            .find(|&&(t, _)| t == me)
            .map(|&(_, b)| b)
    }

    /// Arms a stop at the named step `point` (a death point's name) of the
    /// process of the mapping at `base`: the first thread of it to pass
    /// that step stops the process there (see [`stop_point`]).
    pub fn arm_stop(base: usize, point: &'static str) {
        stops().armed.push((base, point));
    }

    /// At the named step `point` of the process at `base`: if a stop is
    /// armed there (once), stops the process and parks the calling thread
    /// until it is continued ([`cont`]).
    pub fn stop_point(base: usize, point: &'static str) {
        let armed = {
            let mut s = stops();
            match s.armed.iter().position(|&(b, p)| b == base && p == point) {
                Some(i) => {
                    s.armed.swap_remove(i);
                    true
                }
                None => false,
            }
        };
        if armed {
            trace(format_args!("stops at {point}"));
            stop(base);
            stop_gate();
        }
    }

    /// Whether the process of the mapping at `base` is stopped.
    pub fn is_stopped(base: usize) -> bool {
        stops().stopped.contains(&base)
    }

    /// Whether the calling thread's process has died (its thread is
    /// unwinding: what it still runs is not the process's any more).
    pub fn my_process_dead() -> bool {
        my_process().is_some_and(is_dead)
    }

    /// Stops the process of the mapping at `base`: from its threads' next
    /// step on, they are not scheduled until [`cont`].
    pub fn stop(base: usize) {
        let mut s = stops();
        if !s.stopped.contains(&base) {
            s.stopped.push(base);
        }
        time_and_stops()
            .any_stopped
            .store(true, StdOrdering::SeqCst);
        trace(format_args!("stops process {base:#x}"));
    }

    /// Continues a stopped process: its parked threads may run again.
    pub fn cont(base: usize) {
        let woken: Vec<shuttle::thread::Thread> = {
            let mut s = stops();
            s.stopped.retain(|&b| b != base);
            time_and_stops()
                .any_stopped
                .store(!s.stopped.is_empty(), StdOrdering::SeqCst);
            let (go, stay): (Vec<_>, Vec<_>) = s.parked.drain(..).partition(|(b, _)| *b == base);
            s.parked = stay;
            go.into_iter().map(|(_, t)| t).collect()
        };
        trace(format_args!("continues process {base:#x}"));
        for t in woken {
            t.unpark();
        }
    }

    /// A step of the crate's protocols: if the calling thread's process is
    /// stopped, it parks here until the process is continued.
    #[inline]
    pub fn stop_gate() {
        if !time_and_stops().any_stopped.load(StdOrdering::SeqCst) {
            return;
        }
        let Some(base) = my_process() else { return };
        loop {
            {
                let mut s = stops();
                if !s.stopped.contains(&base) {
                    return;
                }
                s.parked.push((base, shuttle::thread::current()));
            }
            shuttle::thread::park();
            stops()
                .parked
                .retain(|(_, t)| t.id() != shuttle::thread::current().id());
        }
    }

    /// Models `FUTEX_WAIT` (every bit: see the module docs).
    pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> WaitResult {
        futex_wait_bitset(word, expected, timeout, super::BITSET_ALL)
    }

    /// Models `FUTEX_WAKE` (every bit).
    pub fn futex_wake(word: &AtomicU32, n: i32) -> usize {
        futex_wake_bitset(word, n, super::BITSET_ALL)
    }

    /// Models `FUTEX_WAIT_BITSET` (see the module docs).
    pub fn futex_wait_bitset(
        word: &AtomicU32,
        expected: u32,
        timeout: Option<Duration>,
        bitset: u32,
    ) -> WaitResult {
        stop_gate();
        let (key, base, dead) = key_of(word as *const AtomicU32 as usize);
        // A private word's sleeper belongs to its thread's process.
        let base = base.or_else(my_process);
        if dead || base.is_some_and(is_dead) {
            die();
        }
        trace(format_args!(
            "futex wait {key:?} expected {expected} bits {bitset:#x}"
        ));
        let state = Arc::new(AtomicU8::new(WAITING));
        let timed = {
            let mut t = table();
            // Checked under the lock every waker takes: atomic with respect
            // to a wake, as the kernel's check is.
            if word.load_ungated(Ordering::SeqCst) != expected {
                trace(format_args!("futex wait: mismatch"));
                return WaitResult::Mismatch;
            }
            t.sleepers.push(Sleeper {
                key,
                bits: bitset.max(1),
                base,
                thread: shuttle::thread::current(),
                state: state.clone(),
            });
            timeout.is_some() && t.timeouts
        };
        if timed {
            // The checker picks when this thread runs again: that is when
            // the timeout fires, unless a wake came first.
            shuttle::thread::yield_now();
            match leave(&state) {
                WOKEN => {
                    trace(format_args!("futex wait: woken"));
                    WaitResult::Woken
                }
                DEAD => {
                    trace(format_args!("futex wait: dead"));
                    die()
                }
                _ => {
                    trace(format_args!("futex wait: timed out"));
                    WaitResult::TimedOut
                }
            }
        } else {
            loop {
                // May return spuriously (the checker's choice, or a token
                // left by an earlier wake): only the state says why.
                shuttle::thread::park();
                if state.load(StdOrdering::SeqCst) == WAITING {
                    continue;
                }
                match leave(&state) {
                    WOKEN => {
                        trace(format_args!("futex wait: woken"));
                        return WaitResult::Woken;
                    }
                    _ => {
                        trace(format_args!("futex wait: dead"));
                        die()
                    }
                }
            }
        }
    }

    /// Takes a sleeper out of the table (it is running again) and says why
    /// it woke. A woken thread stays in the table until it runs: it is
    /// still inside its wait, where its process may die.
    fn leave(state: &Arc<AtomicU8>) -> u8 {
        let mut t = table();
        t.sleepers.retain(|s| !Arc::ptr_eq(&s.state, state));
        state.load(StdOrdering::SeqCst)
    }

    /// Models `FUTEX_WAKE_BITSET`: wakes up to `n` of the sleepers on
    /// `word`'s key whose bits meet `bitset`, oldest first.
    pub fn futex_wake_bitset(word: &AtomicU32, n: i32, bitset: u32) -> usize {
        let (key, _, _) = key_of(word as *const AtomicU32 as usize);
        let bits = bitset.max(1);
        let n = n.max(0) as usize;
        let mut woke = 0;
        trace(format_args!("futex wake {key:?} bits {bitset:#x}"));
        for s in table().sleepers.iter() {
            if woke < n
                && s.key == key
                && s.bits & bits != 0
                && s.state.load(StdOrdering::SeqCst) == WAITING
            {
                s.state.store(WOKEN, StdOrdering::SeqCst);
                s.thread.unpark();
                woke += 1;
            }
        }
        woke
    }

    /// Threads inside a wait here (asleep, or woken and not yet run) that
    /// reached their word through the mapping at `base` (one process's).
    pub fn sleeping_in(base: usize) -> usize {
        table()
            .sleepers
            .iter()
            .filter(|s| s.base == Some(base))
            .count()
    }

    /// Kills the process of the mapping at `base` if exactly `threads` of
    /// its threads are inside a wait here now (asleep, or woken and not yet
    /// run: all of them, as the caller counts): marks the mapping dead and
    /// those threads dead (they unwind with [`Died`] when next run). Atomic
    /// with respect to every wait and wake. True if it killed.
    pub fn kill_parked(base: usize, threads: usize) -> bool {
        let t = table();
        if t.sleepers.iter().filter(|s| s.base == Some(base)).count() != threads {
            return false;
        }
        kill_sleepers(&t, base);
        true
    }

    /// Marks the mapping at `base` dead, and every thread inside a wait
    /// through it (asleep, or woken and not yet run): they die when next
    /// run. Under the table's lock.
    fn kill_sleepers(t: &Table, base: usize) {
        mark_dead(base);
        for s in t.sleepers.iter().filter(|s| s.base == Some(base)) {
            s.state.store(DEAD, StdOrdering::SeqCst);
            s.thread.unpark();
        }
    }

    /// Adds `delta` to the ghost tally kept for the region word at `addr`
    /// (keyed as a futex word is, so every process's mapping of one region
    /// shares it): a quantity the protocol under test must account for,
    /// such as whether one scheduler cell is held, updated next to the
    /// atomic steps that change it (`+1` just after a take, `−1` just
    /// before a give-back), and read by [`ghost_watch`]. A decrease ends
    /// the word's part in every running watch.
    pub fn ghost_add(addr: usize, delta: i64) {
        let (key, _, _) = key_of(addr);
        let mut t = table();
        match t.ghosts.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v += delta,
            None => t.ghosts.push((key, delta)),
        }
        if delta < 0 {
            for set in t.watches.iter_mut().flatten() {
                set.retain(|k| *k != key);
            }
        }
    }

    /// Starts watching the ghost words of `len` bytes from `addr`: the
    /// ones whose tally is positive now, for as long as none of them
    /// decreases. Returns the watch's id (for [`ghost_unwatch`]).
    pub fn ghost_watch(addr: usize, len: usize) -> usize {
        let (Key::Shared { identity, offset }, _, _) = key_of(addr) else {
            let mut t = table();
            t.watches.push(Some(Vec::new()));
            return t.watches.len() - 1;
        };
        let mut t = table();
        let held: Vec<Key> = t
            .ghosts
            .iter()
            .filter(|(k, v)| {
                *v > 0
                    && matches!(*k, Key::Shared { identity: i, offset: o }
                        if i == identity && o >= offset && o < offset + len)
            })
            .map(|(k, _)| *k)
            .collect();
        t.watches.push(Some(held));
        t.watches.len() - 1
    }

    /// Ends watch `id`: how many of its words were positive throughout
    /// (each one a cell held from the watch's start to its end).
    pub fn ghost_unwatch(id: usize) -> i64 {
        let mut t = table();
        t.watches
            .get_mut(id)
            .and_then(Option::take)
            .map_or(i64::MIN, |set| set.len() as i64)
    }

    /// Makes the shared scheduler's fairness hand-off never come due in
    /// the current execution (`FAIR_AFTER` is 0 under the checker
    /// otherwise): releases then leave a woken designee of another process
    /// alone, and barging is unbounded.
    pub fn set_never_fair(on: bool) {
        table().never_fair = on;
    }

    /// Whether [`set_never_fair`] is on.
    pub fn never_fair() -> bool {
        table().never_fair
    }

    /// Arms death point `point` for the process of the mapping at `base`:
    /// the first of its threads to reach that point makes it die there
    /// (see [`death_point`]).
    pub fn arm_death(base: usize, point: &'static str) {
        table().armed.push((base, point));
    }

    /// True (once) if `point` is armed for the mapping at `base`. The
    /// caller then kills the process: [`kill_all`], drops its liveness
    /// lock, and unwinds with [`die`].
    pub fn death_point(base: usize, point: &'static str) -> bool {
        let mut t = table();
        match t.armed.iter().position(|&(b, p)| b == base && p == point) {
            Some(i) => {
                t.armed.swap_remove(i);
                trace(format_args!("dies at {point}"));
                true
            }
            None => false,
        }
    }

    /// Marks the process of the mapping at `base` dead, with every thread
    /// of it that sleeps here (the caller is its one running thread).
    pub fn kill_all(base: usize) {
        kill_sleepers(&table(), base);
    }

    /// Unwinds the calling thread with [`Died`] (its process is dead).
    pub fn die() -> ! {
        std::panic::resume_unwind(Box::new(Died))
    }

    /// Whether the process of the mapping at `base` is dead.
    fn is_dead(base: usize) -> bool {
        ranges().iter().any(|r| r.base == base && r.dead)
    }

    /// Marks the mapping at `base` dead: a thread that reaches a futex word
    /// through it unwinds with [`Died`].
    pub fn mark_dead(base: usize) {
        for r in ranges().iter_mut().filter(|r| r.base == base) {
            r.dead = true;
        }
    }
}

#[cfg(all(test, not(shuttle)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn wait_times_out() {
        let w = AtomicU32::new(7);
        let t = Instant::now();
        assert_eq!(
            futex_wait(&w, 7, Some(Duration::from_millis(30))),
            WaitResult::TimedOut
        );
        assert!(t.elapsed() >= Duration::from_millis(25));
    }

    #[test]
    fn wait_on_changed_word_returns_mismatch() {
        let w = AtomicU32::new(1);
        assert_eq!(
            futex_wait(&w, 2, Some(Duration::from_secs(5))),
            WaitResult::Mismatch
        );
    }

    #[test]
    fn wake_with_no_waiters_wakes_none() {
        let w = AtomicU32::new(0);
        assert_eq!(futex_wake(&w, i32::MAX), 0);
    }

    #[test]
    fn bitset_wake_picks_its_sleeper() {
        let w = Arc::new(AtomicU32::new(0));
        let woke = Arc::new(AtomicU32::new(0));
        let sleeper = |bits: u32| {
            let (w, woke) = (w.clone(), woke.clone());
            std::thread::spawn(move || {
                while woke.load(Ordering::SeqCst) & bits == 0 {
                    futex_wait_bitset(&w, 0, Some(Duration::from_secs(10)), bits);
                }
            })
        };
        let a = sleeper(0b01);
        let b = sleeper(0b10);
        // Wake only b's bit until b has left; a must still be asleep then.
        woke.fetch_or(0b10, Ordering::SeqCst);
        while !b.is_finished() {
            futex_wake_bitset(&w, i32::MAX, 0b10);
            std::thread::yield_now();
        }
        assert!(!a.is_finished());
        woke.fetch_or(0b01, Ordering::SeqCst);
        while !a.is_finished() {
            futex_wake_bitset(&w, i32::MAX, BITSET_ALL);
            std::thread::yield_now();
        }
        a.join().unwrap();
        b.join().unwrap();
    }

    #[test]
    fn bitset_wait_times_out() {
        let w = AtomicU32::new(3);
        let t = Instant::now();
        assert_eq!(
            futex_wait_bitset(&w, 3, Some(Duration::from_millis(20)), 1),
            WaitResult::TimedOut
        );
        assert!(t.elapsed() >= Duration::from_millis(15));
    }

    #[test]
    fn wake_wakes_a_thread() {
        let w = Arc::new(AtomicU32::new(0));
        let w2 = w.clone();
        let h = std::thread::spawn(move || {
            while w2.load(Ordering::Acquire) == 0 {
                futex_wait(&w2, 0, Some(Duration::from_secs(10)));
            }
        });
        w.store(1, Ordering::Release);
        futex_wake(&w, 1);
        h.join().unwrap();
    }
}
