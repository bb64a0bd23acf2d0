//! Who a thread id names, read from `/proc`: does the thread exist, and
//! does its process map a given file?
//!
//! A process-shared lock word in writable shared memory names its holder by
//! thread id, and anyone who can write the memory can write any id there.
//! These two questions let a waiter tell a holder that can still release
//! the lock from a word that can never change again. Both answer
//! [`Answer::Unknown`] when `/proc` cannot tell (not mounted, another pid
//! namespace, no permission): callers must then assume the holder is real.

use std::io::{BufRead, BufReader};

/// A yes, a no, or "cannot tell".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Known true.
    Yes,
    /// Known false.
    No,
    /// `/proc` could not tell.
    Unknown,
}

/// This thread's id (`gettid`).
pub fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() }
}

/// Whether `/proc` shows this process's pid namespace: our own thread is
/// visible there. Without that, a missing `/proc/<tid>` proves nothing.
fn proc_is_ours() -> bool {
    std::fs::metadata(format!("/proc/self/task/{}", gettid())).is_ok()
}

/// Whether a thread with id `tid` exists in this pid namespace
/// (`/proc/<tid>` resolves for any thread, not only for process leaders).
pub fn thread_exists(tid: i32) -> Answer {
    if tid <= 0 {
        return Answer::No;
    }
    match std::fs::metadata(format!("/proc/{tid}")) {
        Ok(_) => Answer::Yes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if proc_is_ours() {
                Answer::No
            } else {
                Answer::Unknown
            }
        }
        Err(_) => Answer::Unknown,
    }
}

/// The process (thread group) id of thread `tid`, from the world-readable
/// `/proc/<tid>/status`; `None` if it cannot be read.
pub fn thread_group(tid: i32) -> Option<i32> {
    if tid <= 0 {
        return None;
    }
    let text = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Whether the process of thread `tid` maps the file `(st_dev, st_ino)`
/// (a line of `/proc/<tid>/maps` with that device and inode).
pub fn thread_maps_file(tid: i32, file: (u64, u64)) -> Answer {
    if tid <= 0 {
        return Answer::No;
    }
    let Ok(f) = std::fs::File::open(format!("/proc/{tid}/maps")) else {
        return match thread_exists(tid) {
            Answer::No => Answer::No,
            _ => Answer::Unknown, // no permission, or a race with its exit
        };
    };
    let (major, minor) = (libc::major(file.0), libc::minor(file.0));
    for line in BufReader::new(f).lines() {
        let Ok(line) = line else {
            return Answer::Unknown;
        };
        // "start-end perms offset MAJ:MIN inode path"
        let mut it = line.split_whitespace().skip(3);
        let (Some(dev), Some(ino)) = (it.next(), it.next()) else {
            continue;
        };
        let Some((ma, mi)) = dev.split_once(':') else {
            continue;
        };
        let same_dev =
            u32::from_str_radix(ma, 16) == Ok(major) && u32::from_str_radix(mi, 16) == Ok(minor);
        if same_dev && ino.parse::<u64>() == Ok(file.1) {
            return Answer::Yes;
        }
    }
    Answer::No
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn own_thread_exists_and_maps_what_it_maps() {
        assert_eq!(thread_exists(gettid()), Answer::Yes);
        assert_eq!(thread_group(gettid()), Some(std::process::id() as i32));
        assert_eq!(thread_group(0x3fff_fff0), None);
        assert_eq!(thread_exists(0), Answer::No);
        // Thread ids are below 2^22 on Linux (pid_max's ceiling).
        assert_eq!(thread_exists(0x3fff_fff0), Answer::No);
        let fd = crate::sys::file::memfd_create("mapstest").unwrap();
        crate::sys::file::ftruncate(std::os::fd::AsFd::as_fd(&fd), 4096).unwrap();
        let m = crate::sys::file::map_shared(std::os::fd::AsFd::as_fd(&fd), 4096).unwrap();
        let meta = std::fs::File::from(fd.try_clone().unwrap())
            .metadata()
            .unwrap();
        let id = (meta.dev(), meta.ino());
        assert_eq!(thread_maps_file(gettid(), id), Answer::Yes);
        assert_eq!(thread_maps_file(gettid(), (id.0, id.1 + 12345)), Answer::No);
        drop(m);
        assert_eq!(thread_maps_file(gettid(), id), Answer::No);
    }
}
