//! A child command that must not outlive its holder (`shmsched run`,
//! `shmsched jobserver`): the death signal, and signals forwarded to it.
//!
//! **The death signal.** [`die_with_parent`] runs in the child between
//! `fork` and `exec` and asks the kernel (`PR_SET_PDEATHSIG`) to send it a
//! signal when its parent dies. Two traps: the signal follows the parent
//! *thread* that forked, not the process (so the holder must fork from the
//! thread that lives as long as the child: its main thread, which then
//! waits for it), and a parent that died before the `prctl` ran is missed
//! (so the child compares `getppid()` with the pid it expects and kills
//! itself if they differ: the parent is already gone).
//!
//! **Forwarding.** [`Forwarder`] catches the signals a shell or a service
//! manager sends (`SIGHUP`, `SIGINT`, `SIGQUIT`, `SIGTERM`, `SIGUSR1`,
//! `SIGUSR2`, `SIGALRM`) and sends each to the child. A signal the kernel
//! generated for the terminal (Ctrl-C, Ctrl-\, hang-up: `si_code ==
//! SI_KERNEL`) is not forwarded, because it went to the whole foreground
//! process group, the child included (as `sudo` does). Signals are blocked
//! from [`Forwarder::install`] until [`Forwarder::target`] names the child,
//! so one that arrives in between is delivered, and forwarded, then. The
//! handler only loads an atomic and calls `kill`, both async-signal-safe.

use std::io;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

/// The signals a [`Forwarder`] passes on.
pub const FORWARDED: [libc::c_int; 7] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
];

/// `SIGKILL`, the death signal the front ends use.
pub const SIGKILL: i32 = libc::SIGKILL;

/// Sets the calling (child) process's death signal to `sig`, then checks
/// that its parent is still `parent`; if not, the parent died before the
/// request took effect, and the child sends `sig` to itself.
/// Async-signal-safe: call it from `CommandExt::pre_exec`.
pub fn die_with_parent(parent: i32, sig: i32) -> io::Result<()> {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number and no pointers.
    let r = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: getppid has no preconditions and cannot fail.
    if unsafe { libc::getppid() } != parent {
        // SAFETY: signalling this process itself; kill is async-signal-safe.
        unsafe { libc::kill(libc::getpid(), sig) };
        return Err(io::Error::other("the parent died before the child started"));
    }
    Ok(())
}

/// The child signals go to (0: none yet; never a group or `-1`).
static TARGET: AtomicI32 = AtomicI32::new(0);

/// Bit `i` set: `FORWARDED[i]` was already blocked before
/// [`Forwarder::install`] (the child keeps it blocked, as it was given).
static WAS_BLOCKED: AtomicU32 = AtomicU32::new(0);

extern "C" fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let code = if info.is_null() {
        0
    } else {
        unsafe { (*info).si_code }
    };
    if code == libc::SI_KERNEL {
        return; // the terminal signalled the whole process group
    }
    let pid = TARGET.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe; `pid` is a single process.
        unsafe { libc::kill(pid, sig) };
    }
}

fn sigset(sigs: &[libc::c_int]) -> libc::sigset_t {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set; sigaddset adds valid numbers.
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        for &s in sigs {
            libc::sigaddset(set.as_mut_ptr(), s);
        }
        set.assume_init()
    }
}

/// Forwards [`FORWARDED`] signals to one child process (see the module
/// docs). One per process.
#[derive(Debug)]
pub struct Forwarder {
    _private: (),
}

impl Forwarder {
    /// Blocks the forwarded signals in the calling thread (threads it
    /// creates from now on inherit the block) and installs the handlers.
    /// Call it on the thread that will spawn and wait for the child.
    pub fn install() -> io::Result<Forwarder> {
        let set = sigset(&FORWARDED);
        let mut old = sigset(&[]);
        // SAFETY: both sets are initialised sigsets that outlive the call.
        let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        let mut was = 0u32;
        for (i, &sig) in FORWARDED.iter().enumerate() {
            // SAFETY: `old` is an initialised sigset and `sig` a valid signal.
            if unsafe { libc::sigismember(&old, sig) } == 1 {
                was |= 1 << i;
            }
        }
        WAS_BLOCKED.store(was, Ordering::SeqCst);
        for &sig in &FORWARDED {
            // SAFETY: a zeroed sigaction is a valid start; the handler is an
            // extern "C" function with the SA_SIGINFO signature that only
            // does async-signal-safe work.
            let r = unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = forward as *const () as usize;
                sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
                libc::sigemptyset(&mut sa.sa_mask);
                libc::sigaction(sig, &sa, std::ptr::null_mut())
            };
            if r < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(Forwarder { _private: () })
    }

    /// Names the child and unblocks the signals: any that arrived since
    /// [`install`](Self::install) is delivered, and forwarded, now.
    pub fn target(&self, pid: u32) {
        TARGET.store(i32::try_from(pid).unwrap_or(0), Ordering::SeqCst);
        unblock();
    }
}

/// Unblocks the forwarded signals in the calling thread (also for a
/// holder that gives up before it has a child).
pub fn unblock() {
    let was = WAS_BLOCKED.load(Ordering::SeqCst);
    let ours: Vec<libc::c_int> = FORWARDED
        .iter()
        .enumerate()
        .filter(|(i, _)| was & (1 << i) == 0)
        .map(|(_, &s)| s)
        .collect();
    let set = sigset(&ours);
    // SAFETY: `set` is an initialised sigset.
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
}

/// In a child between `fork` and `exec`: unblocks the forwarded signals
/// that [`Forwarder::install`] blocked (the signal mask survives `exec`, and
/// the command must get the mask its holder was given). Async-signal-safe.
pub fn restore_child_mask() -> io::Result<()> {
    let was = WAS_BLOCKED.load(Ordering::SeqCst);
    // SAFETY: sigemptyset/sigaddset/sigprocmask are async-signal-safe and
    // work on a local, initialised set.
    unsafe {
        let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        libc::sigemptyset(set.as_mut_ptr());
        for (i, &sig) in FORWARDED.iter().enumerate() {
            if was & (1 << i) == 0 {
                libc::sigaddset(set.as_mut_ptr(), sig);
            }
        }
        if libc::sigprocmask(libc::SIG_UNBLOCK, set.as_ptr(), std::ptr::null_mut()) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The name of signal `sig` (`"SIGTERM"`), or `"signal N"`.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_names() {
        assert_eq!(signal_name(libc::SIGTERM), "SIGTERM");
        assert_eq!(signal_name(64), "signal 64");
    }
}
