//! A readiness descriptor for event loops: one file descriptor that is
//! readable while something was signalled or a deadline has passed.
//!
//! [`ReadyFd`] is an `epoll` instance over two descriptors of its own: an
//! `eventfd` (a counter that [`ReadyFd::signal`] bumps, from any thread) and
//! a `timerfd` on `CLOCK_MONOTONIC` (armed by [`ReadyFd::arm`] at an
//! absolute instant). An epoll descriptor is readable while any descriptor
//! in its set is, so the one fd handed to an event loop (`asyncio`'s
//! `add_reader`, libuv's `uv_poll`) covers both; [`ReadyFd::clear`] drains
//! them, after which it is readable again only on the next signal or
//! deadline. [`ReadyFd::wait`] blocks a thread on the same fd, for callers
//! without an event loop.
//!
//! Nothing here knows what was signalled: the caller keeps its own lists
//! and uses the fd as a doorbell, re-checking its lists after every
//! [`ReadyFd::clear`] so that a signal racing the clear is never lost.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// An epoll descriptor over an eventfd (the doorbell) and a timerfd (the
/// next deadline). All methods take `&self` and may be called from any
/// thread.
#[derive(Debug)]
pub struct ReadyFd {
    epoll: OwnedFd,
    event: OwnedFd,
    timer: OwnedFd,
}

fn check(r: libc::c_int, op: &'static str) -> io::Result<libc::c_int> {
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{op}: {e}")));
    }
    Ok(r)
}

/// Takes ownership of a descriptor a syscall just returned.
fn own(fd: libc::c_int, op: &'static str) -> io::Result<OwnedFd> {
    let fd = check(fd, op)?;
    // SAFETY: `fd` was just returned by the kernel to this call and is owned
    // by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl ReadyFd {
    /// Creates the three descriptors (close-on-exec, non-blocking), not
    /// readable and with no deadline armed.
    pub fn new() -> io::Result<ReadyFd> {
        // SAFETY: plain syscalls with constant flags; each result is owned
        // at once.
        let epoll = own(
            unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) },
            "epoll_create1",
        )?;
        // SAFETY: as above.
        let event = own(
            unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) },
            "eventfd",
        )?;
        // SAFETY: as above.
        let timer = own(
            unsafe {
                libc::timerfd_create(
                    libc::CLOCK_MONOTONIC,
                    libc::TFD_CLOEXEC | libc::TFD_NONBLOCK,
                )
            },
            "timerfd_create",
        )?;
        for fd in [event.as_raw_fd(), timer.as_raw_fd()] {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: fd as u64,
            };
            // SAFETY: both descriptors are open and owned by this value; `ev`
            // is a valid epoll_event for the duration of the call.
            check(
                unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) },
                "epoll_ctl",
            )?;
        }
        Ok(ReadyFd {
            epoll,
            event,
            timer,
        })
    }

    /// The descriptor to watch for readability (the epoll fd). It stays
    /// owned by this value: watch it, never close it.
    pub fn fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Makes the fd readable (until the next [`clear`](Self::clear)).
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our own eventfd. The
        // only failure, EAGAIN at a counter of u64::MAX - 1, leaves it
        // readable, which is what a signal wants.
        unsafe { libc::write(self.event.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Drains the doorbell and an expired timer: the fd is not readable
    /// afterwards until the next signal or deadline. Callers re-check
    /// their own state after this (a signal may land just before).
    pub fn clear(&self) {
        let mut v: u64 = 0;
        for fd in [self.event.as_raw_fd(), self.timer.as_raw_fd()] {
            // SAFETY: reads 8 bytes into a valid u64 from our own
            // non-blocking descriptor; EAGAIN (nothing to drain) is fine.
            unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
        }
    }

    /// Arms the timer at the absolute `CLOCK_MONOTONIC` instant `at_ns`
    /// (readable from then on until cleared), or disarms it (`None`). An
    /// instant already past fires at once.
    pub fn arm(&self, at_ns: Option<u64>) {
        let at = at_ns.map(|ns| ns.max(1));
        let value = at.map_or(
            libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            |ns| libc::timespec {
                tv_sec: (ns / 1_000_000_000).min(libc::time_t::MAX as u64) as libc::time_t,
                tv_nsec: (ns % 1_000_000_000) as libc::c_long,
            },
        );
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: value,
        };
        // SAFETY: our own timerfd, a valid itimerspec, no old value wanted.
        // Cannot fail for valid arguments.
        unsafe {
            libc::timerfd_settime(
                self.timer.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        };
    }

    /// Blocks until the fd is readable or `timeout` passes (`None`: no
    /// limit). True if readable; false on timeout or when a signal
    /// interrupted the wait (callers loop on their own condition).
    pub fn wait(&self, timeout: Option<Duration>) -> bool {
        let ms = timeout.map_or(-1, |d| {
            // Round up, so that a wait never ends before its timeout.
            let ms = d.as_nanos().div_ceil(1_000_000);
            ms.min(i32::MAX as u128) as libc::c_int
        });
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: our own epoll fd, room for one event in `ev`.
        let n = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), &mut ev, 1, ms) };
        n > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::monotonic_ns;

    #[test]
    fn signal_then_clear() {
        let r = ReadyFd::new().unwrap();
        assert!(!r.wait(Some(Duration::ZERO)));
        r.signal();
        r.signal();
        assert!(r.wait(Some(Duration::ZERO)));
        r.clear();
        assert!(!r.wait(Some(Duration::ZERO)));
    }

    #[test]
    fn deadline_makes_it_readable() {
        let r = ReadyFd::new().unwrap();
        let start = monotonic_ns();
        r.arm(Some(start + 20_000_000));
        assert!(!r.wait(Some(Duration::ZERO)));
        assert!(r.wait(Some(Duration::from_secs(5))));
        assert!(monotonic_ns() >= start + 20_000_000);
        r.clear();
        assert!(!r.wait(Some(Duration::ZERO)));
        r.arm(Some(1));
        assert!(
            r.wait(Some(Duration::from_secs(5))),
            "a past instant fires at once"
        );
        r.clear();
        r.arm(None);
        assert!(!r.wait(Some(Duration::from_millis(10))));
    }
}
