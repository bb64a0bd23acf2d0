//! A command run while this process holds part of a budget for it (the
//! shell front ends `shmsched run` and `shmsched jobserver`).
//!
//! The holder of the units is this process, not the command: if it dies,
//! even by `SIGKILL`, the region takes the units back through its normal
//! dead-process reclaim. The command must then not run on outside the
//! budget, so [`bind_to_holder`] makes the kernel kill it when its holder
//! dies (`PR_SET_PDEATHSIG`, with the race against an early death closed;
//! see `sys/child.rs`). The signal follows the *thread* that spawned the
//! command: spawn it from the thread that waits for it.
//!
//! The death signal reaches the command itself; processes it started
//! (a shell's background jobs, a build's compilers) are not signalled by
//! the kernel and finish what they were doing.
//!
//! [`Forwarder`] passes the signals a shell or a service manager sends to
//! the holder (`SIGTERM`, `SIGHUP`, …) on to the command, and
//! [`exit_code`] turns the command's end into the holder's exit status.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus};

pub use crate::sys::child::{signal_name, unblock as unblock_signals, Forwarder, FORWARDED};

/// Makes `cmd`, once spawned, die by `SIGKILL` when this process (the
/// thread that spawns it) dies; also clears close-on-exec on
/// `inherit` so that the command inherits those descriptors (a jobserver's
/// pipe ends).
pub fn bind_to_holder(cmd: &mut Command, inherit: Vec<i32>) {
    let parent = crate::sys::file::getpid();
    // SAFETY: the closure runs in the child between fork and exec and calls
    // only async-signal-safe functions (sigprocmask, prctl, getppid, kill,
    // fcntl); it
    // allocates nothing (the vector was built before the fork).
    unsafe {
        cmd.pre_exec(move || {
            crate::sys::child::restore_child_mask()?;
            crate::sys::child::die_with_parent(parent, crate::sys::child::SIGKILL)?;
            for &fd in &inherit {
                crate::sys::pipe::set_cloexec(fd, false)?;
            }
            Ok(())
        });
    }
}

/// A descriptor that becomes readable when the child `pid` exits (a
/// pidfd), to wait for it beside other events (`Bridge::serve_until`).
pub fn exit_fd(pid: u32) -> crate::Result<std::os::fd::OwnedFd> {
    crate::sys::pipe::pidfd_open(pid).map_err(|e| crate::Error::Io {
        op: "pidfd_open",
        path: None,
        source: e,
    })
}

/// The exit status a holder passes on for its command's end: the command's
/// code, or 128 + the signal that killed it (as a shell reports it).
pub fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => (c & 0xff) as u8,
        (None, Some(s)) => (128 + s).clamp(0, 255) as u8,
        (None, None) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell() {
        let st = Command::new("sh").args(["-c", "exit 7"]).status().unwrap();
        assert_eq!(exit_code(st), 7);
        let st = Command::new("sh")
            .args(["-c", "kill -TERM $$"])
            .status()
            .unwrap();
        assert_eq!(exit_code(st), 143);
    }
}
