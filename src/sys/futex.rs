//! TEMPORARY stand-in; replaced by the region branch's futex module.
#![allow(missing_docs)]
use std::sync::atomic::AtomicU32;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitResult { Woken, TimedOut, Mismatch, Interrupted }

pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> WaitResult {
    let ts = timeout.map(|d| libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as _ });
    let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    let r = unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, tsp, 0usize, 0u32) };
    if r == 0 { return WaitResult::Woken; }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ETIMEDOUT) => WaitResult::TimedOut,
        Some(libc::EAGAIN) => WaitResult::Mismatch,
        _ => WaitResult::Interrupted,
    }
}

pub fn futex_wake(word: &AtomicU32, n: i32) -> usize {
    let r = unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, n, 0usize, 0usize, 0u32) };
    r.max(0) as usize
}
