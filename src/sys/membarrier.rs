//! `membarrier(2)`, private expedited: one thread makes every running
//! thread of this process execute a full memory barrier, so the other
//! threads can pair their side of a Dekker-style handshake with a mere
//! compiler fence (the asymmetric fence of the C ABI's permit pin, see
//! `ffi/src/pin.rs`).
//!
//! The command needs a registration once per process
//! (`MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED`, kernel 4.14+). Whether it
//! works is decided once, on the first call of [`available`]: under a
//! seccomp filter that refuses the syscall, or on an older kernel, it
//! answers false for good and callers use full fences instead.

use std::sync::atomic::{AtomicU8, Ordering};

/// `MEMBARRIER_CMD_PRIVATE_EXPEDITED` (linux/membarrier.h).
const CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
/// `MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED` (linux/membarrier.h).
const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

/// 0: not decided yet; 1: registered and working; 2: unavailable.
static STATE: AtomicU8 = AtomicU8::new(0);

fn membarrier(cmd: libc::c_int) -> bool {
    // SAFETY: membarrier takes two integers (command, flags) and touches
    // no memory of ours; an unknown or refused command fails with -1.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_int) == 0 }
}

/// Whether [`barrier`] works in this process: registers once (and tries
/// one barrier) on the first call, then answers from memory. A forked
/// child decides afresh (its atfork handler calls [`forget`]): registering
/// again is harmless, and relying on the registration being carried into
/// the child's address space is not needed.
#[inline]
pub fn available() -> bool {
    match STATE.load(Ordering::Acquire) {
        1 => true,
        2 => false,
        _ => decide(),
    }
}

/// Whether [`available`] has answered true in this process, without
/// deciding: false also while undecided. For the side of a handshake that
/// may always fall back to a full fence.
#[inline(always)]
pub fn known_available() -> bool {
    STATE.load(Ordering::Acquire) == 1
}

#[cold]
fn decide() -> bool {
    let ok = membarrier(CMD_REGISTER_PRIVATE_EXPEDITED) && membarrier(CMD_PRIVATE_EXPEDITED);
    STATE.store(if ok { 1 } else { 2 }, Ordering::Release);
    ok
}

/// Makes every running thread of this process execute a full memory
/// barrier before this returns (threads not running pass one at their
/// next context switch). True if it did; false if membarrier is not
/// [`available`] (then nothing happened, and the caller must not rely on
/// it).
pub fn barrier() -> bool {
    available() && membarrier(CMD_PRIVATE_EXPEDITED)
}

/// Forgets the decision (for a forked child's atfork handler: only a
/// store). The next [`available`] decides again, registering the child's
/// own address space, which need not have inherited its parent's
/// registration.
pub fn forget() {
    STATE.store(0, Ordering::SeqCst);
}
