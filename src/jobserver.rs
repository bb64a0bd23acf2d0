//! A private GNU make jobserver whose every token is backed by a slot of a
//! shared [`Scheduler`]: the bridge behind `shmsched jobserver`.
//!
//! # The protocol (GNU make 4.3 and 4.4, the `jobserver` crate, ninja 1.13)
//!
//! A jobserver is a pipe of one-byte tokens. A client reads one byte to
//! start a job and writes one byte back when it ends (make writes `+`, the
//! crate the byte it read: any byte is accepted here). Every client also
//! has one *implicit* slot that is never in the pipe: its first job runs
//! without a token. Clients find the pipe in the **last**
//! `--jobserver-auth=` word of `MAKEFLAGS` (cargo and rustc look at
//! `CARGO_MAKEFLAGS` first): `R,W` names inherited descriptors (the only
//! form make 4.3 reads), `fifo:PATH` a named FIFO (make 4.4; the only form
//! ninja 1.13 reads).
//!
//! # How the bridge backs the tokens
//!
//! The bridge makes a FIFO in a private directory and keeps a read-write,
//! non-blocking end of it open for the build's whole life (make opens the
//! path with a blocking read-only `open`, which must not wait for a
//! writer). Both forms of `--jobserver-auth` name that one FIFO. Then:
//!
//! - **the implicit slot** is one real slot of the Scheduler, taken before
//!   the build starts ([`Bridge::new`] takes it as a permit);
//! - **a token is written only after its slot is held**, and only when the
//!   pipe is empty: at most one unread spare token sits in the pipe (more
//!   would hoard the budget), and at most `jobs - 1` tokens exist;
//! - **tokens that come back are returned to the region**: when `FIONREAD`
//!   shows more than one unread byte, the bridge reads the extra ones and
//!   releases one slot per byte.
//!
//! So at any time the slots held are `1 + tokens`, and `tokens` = unread
//! bytes in the pipe (0 or 1) + tokens in the clients' hands.
//!
//! The bridge waits on one `epoll`: the pipe is sized to one page, so its
//! write side is "writable" exactly when it is empty (the spare was taken:
//! time to ask for the next slot), and an edge-triggered read side reports
//! every write into it (a token came back). The slot itself is asked for
//! with [`Scheduler::acquire_async`], whose waker signals an `eventfd` in
//! the same `epoll`, so a wait for a slot keeps its place in the region's
//! queue (priority and FIFO order across processes, the lottery) and is
//! cancelled cleanly when no longer needed. A 100 ms backstop re-checks
//! the counts in case a wake-up was missed; it is never the normal path.
//!
//! # What a crash costs
//!
//! - **The bridge dies** (even by `SIGKILL`): it is the holder of every
//!   slot, so the region reclaims all of them, exactly, as for any dead
//!   process.
//! - **A client dies holding tokens** (make killed mid-build): a token in a
//!   client's hands is only a byte it read, owned by nobody the bridge can
//!   see, so the bridge cannot tell a lost token from one in use. It keeps
//!   those slots until the build ends (make itself notices only at exit:
//!   "INTERNAL: exiting with N jobserver tokens available; should be M!").
//!   The loss is bounded by the tree's `jobs - 1` and ends with the tree,
//!   when the bridge releases every slot.
//! - **A client writes a byte it did not read**: that breaks any jobserver.
//!   The bridge drains it like a returned token; it never releases more
//!   slots than it holds and counts what it could not match in
//!   [`BridgeStats::surplus`].

use std::future::Future;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::priority::Priority;
use crate::scheduler::{OwnedPermit, Scheduler};
use crate::sys::pipe::{self as sp, Epoll, EventFd, FifoEnd, Interest};

/// How often the bridge re-checks its counts when no event came (a safety
/// net; events are the normal path).
pub const BACKSTOP: Duration = Duration::from_millis(100);

/// The byte the bridge writes as a token (make's own).
pub const TOKEN: u8 = b'+';

/// Which `--jobserver-auth` form the clients are given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// `R,W`: inherited descriptors (GNU make 4.3 and later, the
    /// `jobserver` crate).
    Fds,
    /// `fifo:PATH` (GNU make 4.4 and later, ninja 1.13, the crate).
    Fifo,
}

/// A snapshot of a bridge's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BridgeStats {
    /// Slots held for tokens (not counting the implicit one).
    pub tokens: u32,
    /// Unread bytes in the pipe now.
    pub in_pipe: u32,
    /// The most tokens at once (`jobs - 1`).
    pub limit: u32,
    /// Tokens ever written.
    pub written: u64,
    /// Tokens that came back and whose slot was returned to the region.
    pub returned: u64,
    /// Bytes drained from the pipe with no slot left to release (a client
    /// wrote back more than it took).
    pub surplus: u64,
    /// The most tokens held at once.
    pub peak: u32,
    /// Slots granted that were given straight back because the pipe was no
    /// longer empty when they arrived.
    pub unneeded: u64,
}

const KEY_RETURN: u64 = 1;
const KEY_EMPTY: u64 = 2;
const KEY_GRANT: u64 = 3;
const KEY_STOP: u64 = 4;

/// A waker that bumps an eventfd (the bridge's epoll sees it).
#[derive(Debug)]
struct EventWaker(EventFd);

impl Wake for EventWaker {
    fn wake(self: Arc<Self>) {
        self.0.notify();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.notify();
    }
}

/// The private directory holding the FIFO, removed on drop.
#[derive(Debug)]
struct FifoDir {
    dir: PathBuf,
    path: PathBuf,
}

impl Drop for FifoDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A jobserver backed by slots of a [`Scheduler`] (see the module docs).
#[derive(Debug)]
pub struct Bridge {
    sched: Scheduler,
    priority: Priority,
    limit: u32,
    fifo: FifoDir,
    /// The bridge's own end: read-write, non-blocking (reads, writes,
    /// FIONREAD, the edge-triggered "a byte came in").
    own: OwnedFd,
    /// The clients' ends for `R,W` (blocking, close-on-exec until a child
    /// clears it); the write end is also watched for "the pipe is empty".
    client_r: OwnedFd,
    client_w: OwnedFd,
    epoll: Epoll,
    waker: Arc<EventWaker>,
    /// Held for the implicit slot: `None` only after [`Bridge::release_all`].
    implicit: Option<OwnedPermit>,
    tokens: Vec<OwnedPermit>,
    watching_empty: bool,
    /// The pipe is one page, so "writable" means "empty".
    one_page: bool,
    stats: BridgeStats,
}

fn io_error(op: &'static str, path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        op,
        path: Some(path.to_path_buf()),
        source: e,
    }
}

impl Bridge {
    /// A bridge for a build of at most `jobs` jobs at once (`1..=65_536`;
    /// the implicit one included) on `sched`, whose implicit slot is
    /// `implicit` (a permit of `sched`, taken before the build starts); its
    /// tokens are asked for at `implicit`'s priority. The FIFO is made in a
    /// new private directory (`0700`) under `dir`.
    pub fn new(sched: &Scheduler, implicit: OwnedPermit, jobs: u32, dir: &Path) -> Result<Bridge> {
        if jobs == 0 || jobs > 65_536 {
            return Err(Error::InvalidArgument(format!(
                "jobs {jobs} is out of range: must be 1..=65536"
            )));
        }
        let fifo = make_fifo_dir(dir)?;
        let own = sp::open_fifo(&fifo.path, FifoEnd::ReadWriteNonBlocking)
            .map_err(|e| io_error("open", &fifo.path, e))?;
        let client_r = sp::open_fifo(&fifo.path, FifoEnd::Read)
            .map_err(|e| io_error("open", &fifo.path, e))?;
        let client_w = sp::open_fifo(&fifo.path, FifoEnd::Write)
            .map_err(|e| io_error("open", &fifo.path, e))?;
        // One page: the write side is writable exactly when the pipe is
        // empty (one buffer slot, in use while any byte is unread). Where
        // the kernel refuses, "empty" is noticed by the backstop instead.
        let one_page = sp::set_pipe_size(own.as_fd(), 4096).is_ok_and(|n| n == 4096);
        let epoll = Epoll::new().map_err(|e| Error::io("epoll_create", None, e))?;
        let waker = Arc::new(EventWaker(
            EventFd::new().map_err(|e| Error::io("eventfd", None, e))?,
        ));
        epoll
            .add(own.as_fd(), KEY_RETURN, Interest::ReadableEdge)
            .and_then(|()| epoll.add(waker.0.fd(), KEY_GRANT, Interest::Readable))
            .map_err(|e| Error::io("epoll_ctl", None, e))?;
        let priority = implicit.priority();
        Ok(Bridge {
            sched: sched.clone(),
            priority,
            limit: jobs - 1,
            fifo,
            own,
            client_r,
            client_w,
            epoll,
            waker,
            implicit: Some(implicit),
            tokens: Vec::new(),
            watching_empty: false,
            one_page,
            stats: BridgeStats {
                limit: jobs - 1,
                ..BridgeStats::default()
            },
        })
    }

    /// The FIFO's path (for `fifo:PATH`).
    pub fn fifo_path(&self) -> &Path {
        &self.fifo.path
    }

    /// Removes the FIFO's name (and its private directory) now: clients of
    /// the `R,W` form need only the inherited descriptors, and a bridge
    /// killed later leaves nothing behind. `fifo:` clients open the path, so
    /// keep it for them.
    pub fn unlink_fifo(&mut self) {
        let _ = std::fs::remove_file(&self.fifo.path);
        let _ = std::fs::remove_dir(&self.fifo.dir);
    }

    /// The clients' descriptors `(R, W)` for the `R,W` form; a child must
    /// inherit them (clear close-on-exec between fork and exec, as
    /// [`bind_to_holder`](crate::child::bind_to_holder) does).
    pub fn client_fds(&self) -> (RawFd, RawFd) {
        (self.client_r.as_raw_fd(), self.client_w.as_raw_fd())
    }

    /// The `--jobserver-auth=` word for `auth`.
    pub fn auth_word(&self, auth: Auth) -> String {
        match auth {
            Auth::Fds => {
                let (r, w) = self.client_fds();
                format!("--jobserver-auth={r},{w}")
            }
            Auth::Fifo => format!("--jobserver-auth=fifo:{}", self.fifo.path.display()),
        }
    }

    /// The `MAKEFLAGS` (and `CARGO_MAKEFLAGS`) value for the build: the
    /// words of `existing` except any `-j`, `--jobs` and jobserver words
    /// (an outer jobserver must not be the last word), then `-jJOBS` and
    /// this bridge's auth word, last among the options (before a `--` that
    /// starts make's variable overrides).
    pub fn makeflags(&self, existing: Option<&str>, auth: Auth) -> String {
        let mut opts: Vec<&str> = Vec::new();
        let mut vars: Vec<&str> = Vec::new();
        let mut in_vars = false;
        for w in existing.unwrap_or("").split_whitespace() {
            if in_vars {
                vars.push(w);
                continue;
            }
            if w == "--" {
                in_vars = true;
                continue;
            }
            let job_word = w.starts_with("-j")
                || w.starts_with("--jobs")
                || w.starts_with("--jobserver-auth")
                || w.starts_with("--jobserver-fds");
            if !job_word {
                opts.push(w);
            }
        }
        let mut out: Vec<String> = opts.iter().map(|w| w.to_string()).collect();
        out.push(format!("-j{}", self.limit + 1));
        out.push(self.auth_word(auth));
        if !vars.is_empty() {
            out.push("--".into());
            out.extend(vars.iter().map(|w| w.to_string()));
        }
        out.join(" ")
    }

    /// The counts now.
    pub fn stats(&self) -> BridgeStats {
        let mut s = self.stats;
        s.tokens = self.tokens.len() as u32;
        s.in_pipe = self.in_pipe() as u32;
        s
    }

    /// Slots this bridge holds now (the implicit one and the tokens').
    pub fn held(&self) -> u32 {
        self.tokens.len() as u32 + u32::from(self.implicit.is_some())
    }

    fn in_pipe(&self) -> usize {
        sp::fionread(self.own.as_fd()).unwrap_or(0)
    }

    /// Serves the jobserver until `stop` becomes readable (the build's
    /// pidfd, for example), then returns; the slots are still held (drop
    /// the bridge or call [`release_all`](Self::release_all)).
    pub fn serve_until(&mut self, stop: BorrowedFd<'_>) -> Result<()> {
        self.epoll
            .add(stop, KEY_STOP, Interest::Readable)
            .map_err(|e| Error::io("epoll_ctl", None, e))?;
        let r = self.serve_loop();
        let _ = self.epoll.remove(stop);
        r
    }

    fn serve_loop(&mut self) -> Result<()> {
        // Cloned so that the pending acquire (which borrows it) lives beside
        // `&mut self`.
        let sched = self.sched.clone();
        let waker = Waker::from(self.waker.clone());
        let mut pending: Option<Pin<Box<crate::scheduler::Acquire<'_>>>> = None;
        loop {
            self.drain_returns();
            let empty = self.in_pipe() == 0;
            let room = (self.tokens.len() as u32) < self.limit;
            if empty && room && pending.is_none() {
                pending = Some(Box::pin(sched.acquire_async(self.priority)));
            }
            if !empty {
                // A slot asked for is no longer needed: cancelling the
                // future leaves no trace in the region.
                pending = None;
            }
            if let Some(f) = pending.as_mut() {
                let mut cx = Context::from_waker(&waker);
                match f.as_mut().poll(&mut cx) {
                    Poll::Ready(Ok(permit)) => {
                        pending = None;
                        self.offer(permit.into_owned());
                        continue;
                    }
                    Poll::Ready(Err(e)) => return Err(e),
                    Poll::Pending => {}
                }
            }
            // Watch for "empty" only when a token could be added and no
            // slot is being asked for (else it would fire while we wait).
            self.watch_empty(self.one_page && !empty && room && pending.is_none())?;
            let keys = self
                .epoll
                .wait(Some(BACKSTOP))
                .map_err(|e| Error::io("epoll_wait", None, e))?;
            if keys.contains(&KEY_GRANT) {
                self.waker.0.clear();
            }
            if keys.contains(&KEY_STOP) {
                return Ok(());
            }
        }
    }

    fn watch_empty(&mut self, on: bool) -> Result<()> {
        if on != self.watching_empty {
            let fd = self.client_w.as_fd();
            let r = if on {
                self.epoll.add(fd, KEY_EMPTY, Interest::Writable)
            } else {
                self.epoll.remove(fd)
            };
            r.map_err(|e| Error::io("epoll_ctl", None, e))?;
            self.watching_empty = on;
        }
        Ok(())
    }

    /// A granted slot: written as a token if the pipe is still empty and
    /// there is room, else given straight back.
    fn offer(&mut self, permit: OwnedPermit) {
        if self.in_pipe() == 0 && (self.tokens.len() as u32) < self.limit {
            // Held first, then written: never a token without its slot.
            self.tokens.push(permit);
            match sp::write(self.own.as_fd(), &[TOKEN]) {
                Ok(1) => {
                    self.stats.written += 1;
                    self.stats.peak = self.stats.peak.max(self.tokens.len() as u32);
                }
                _ => {
                    self.tokens.pop();
                }
            }
        } else {
            self.stats.unneeded += 1;
        }
    }

    /// Reads the unread bytes beyond one spare and releases a slot for each.
    fn drain_returns(&mut self) {
        let mut buf = [0u8; 256];
        loop {
            let n = self.in_pipe();
            // Keep one spare only if it is backed.
            let keep = usize::from(!self.tokens.is_empty()).min(1);
            if n <= keep {
                return;
            }
            let want = (n - keep).min(buf.len());
            let got = match sp::read(self.own.as_fd(), &mut buf[..want]) {
                Ok(0) | Err(_) => return, // a client was quicker
                Ok(k) => k,
            };
            for _ in 0..got {
                if self.tokens.pop().is_some() {
                    self.stats.returned += 1;
                } else {
                    self.stats.surplus += 1;
                }
            }
        }
    }

    /// Returns every slot (the tokens' and the implicit one) to the region
    /// now; the bridge serves nothing afterwards. Dropping it does the same.
    pub fn release_all(&mut self) {
        self.tokens.clear();
        self.implicit = None;
    }
}

fn make_fifo_dir(parent: &Path) -> Result<FifoDir> {
    use std::os::unix::fs::DirBuilderExt;
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let pid = std::process::id();
    for _ in 0..64 {
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let t = crate::sys::clock::monotonic_ns() % 1_000_000_007;
        let dir = parent.join(format!("shmsched-jobserver-{pid}-{n}-{t}"));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {
                let path = dir.join("fifo");
                let d = FifoDir { dir, path };
                sp::mkfifo(&d.path, 0o600).map_err(|e| io_error("mkfifo", &d.path, e))?;
                return Ok(d);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_error("mkdir", &dir, e)),
        }
    }
    Err(Error::InvalidArgument(format!(
        "could not make a private directory under {}",
        parent.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::Region;
    use std::time::Instant;

    /// A bridge served on a thread of its own until `stop` is notified.
    struct Served {
        stop: Arc<EventFd>,
        handle: Option<std::thread::JoinHandle<Bridge>>,
        path: PathBuf,
    }

    fn serve(sched: &Scheduler, jobs: u32) -> Served {
        let implicit = sched.acquire_owned(Priority::Normal).unwrap();
        let mut b = Bridge::new(sched, implicit, jobs, &std::env::temp_dir()).unwrap();
        let path = b.fifo_path().to_path_buf();
        let stop = Arc::new(EventFd::new().unwrap());
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            b.serve_until(s.fd()).unwrap();
            b
        });
        Served {
            stop,
            handle: Some(handle),
            path,
        }
    }

    impl Served {
        fn finish(mut self) -> Bridge {
            self.stop.notify();
            self.handle.take().unwrap().join().unwrap()
        }
    }

    fn until(what: &str, mut f: impl FnMut() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(10), "timed out: {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A client of the FIFO, as make 4.4 or ninja opens it.
    fn client(path: &Path) -> OwnedFd {
        sp::open_fifo(path, FifoEnd::ReadWriteNonBlocking).unwrap()
    }

    fn take(fd: &OwnedFd) -> Option<u8> {
        let mut b = [0u8];
        match sp::read(fd.as_fd(), &mut b) {
            Ok(1) => Some(b[0]),
            _ => None,
        }
    }

    /// Tokens are backed by held slots, at most one spare sits in the pipe,
    /// returned tokens go back to the region, and the limit holds.
    #[test]
    fn tokens_follow_slots() {
        let region = Region::anonymous().unwrap();
        let sched = Scheduler::shared(&region, 4).unwrap();
        let s = serve(&sched, 3); // implicit + 2 tokens at most
        until("a spare token", || sched.global_running() == 2);
        let c = client(&s.path);
        assert_eq!(sp::fionread(c.as_fd()).unwrap(), 1);
        let t1 = loop {
            if let Some(t) = take(&c) {
                break t;
            }
        };
        assert_eq!(t1, TOKEN);
        // The spare was taken: the bridge asks for another slot and writes
        // the second (and last) token.
        until("a second token", || sched.global_running() == 3);
        while take(&c).is_none() {}
        // At the limit: no third token, whatever waits.
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(sp::fionread(c.as_fd()).unwrap(), 0);
        assert_eq!(sched.global_running(), 3);
        // Give both back (any byte): one stays as the spare, one slot returns.
        sp::write(c.as_fd(), b"x").unwrap();
        sp::write(c.as_fd(), b"+").unwrap();
        until("one slot returned", || sched.global_running() == 2);
        assert_eq!(sp::fionread(c.as_fd()).unwrap(), 1);
        let b = s.finish();
        let st = b.stats();
        assert_eq!(
            (st.tokens, st.in_pipe, st.written, st.returned),
            (1, 1, 2, 1)
        );
        drop(b);
        assert_eq!(sched.global_running(), 0);
    }

    /// A slot asked for while the budget is full keeps its place in the
    /// region's queue, and is cancelled when a returned token makes it
    /// unneeded (nothing is left queued).
    #[test]
    fn a_wait_for_a_slot_is_cancelled_when_a_token_comes_back() {
        let region = Region::anonymous().unwrap();
        let sched = Scheduler::shared(&region, 2).unwrap();
        let s = serve(&sched, 8);
        until("implicit and spare", || sched.global_running() == 2);
        let c = client(&s.path);
        while take(&c).is_none() {}
        // Pipe empty, budget full: the bridge waits for a slot.
        let waiting = |s: &Scheduler| {
            s.stats()
                .shared
                .map_or(0, |x| x.waiters.iter().sum::<u32>())
        };
        until("a queued wait", || waiting(&sched) == 1);
        sp::write(c.as_fd(), b"+").unwrap();
        until("no waiter left", || waiting(&sched) == 0);
        assert_eq!(sched.global_running(), 2);
        let b = s.finish();
        assert_eq!(b.stats().in_pipe, 1);
    }

    #[test]
    fn makeflags_put_the_bridge_last() {
        let region = Region::anonymous().unwrap();
        let sched = Scheduler::shared(&region, 2).unwrap();
        let implicit = sched.acquire_owned(Priority::Low).unwrap();
        let b = Bridge::new(&sched, implicit, 6, &std::env::temp_dir()).unwrap();
        let m = b.makeflags(
            Some("ks -j3 --jobserver-auth=3,4 --no-print-directory"),
            Auth::Fifo,
        );
        let fifo = format!("--jobserver-auth=fifo:{}", b.fifo_path().display());
        assert_eq!(m, format!("ks --no-print-directory -j6 {fifo}"));
        let m = b.makeflags(Some("k -- CC=gcc"), Auth::Fifo);
        assert_eq!(m, format!("k -j6 {fifo} -- CC=gcc"));
        let (r, w) = b.client_fds();
        assert_eq!(
            b.makeflags(None, Auth::Fds),
            format!("-j6 --jobserver-auth={r},{w}")
        );
        assert!(Bridge::new(
            &sched,
            sched.acquire_owned(Priority::Low).unwrap(),
            0,
            &std::env::temp_dir()
        )
        .is_err());
        let dir = b.fifo_path().parent().unwrap().to_path_buf();
        drop(b);
        assert!(!dir.exists());
    }
}
