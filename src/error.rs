//! Typed errors shared by the region and the objects built on it.
//!
//! Every message names the bad value and, where there is one, the limit it
//! broke, so that a user reading a log line knows what to change.

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::region::ObjectKind;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in shmsched, outside FairShare refusals
/// (which are answers, not errors).
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A syscall failed; `op` says which operation, `path` which region file.
    Io {
        /// What was being done ("open", "ftruncate", "mmap", ...).
        op: &'static str,
        /// The region file, when there is one.
        path: Option<PathBuf>,
        /// The OS error.
        source: io::Error,
    },
    /// An argument was out of range or malformed. The message names the
    /// value and the limit.
    InvalidArgument(String),
    /// The region's contents are not what this build expects or are corrupt:
    /// bad magic, wrong version, wrong kind, wrong size, out-of-range fields.
    BadRegion(String),
    /// The region exists but holds different parameters from the ones asked
    /// for (for example another `max`).
    Mismatch(String),
    /// The region holds another kind of object than the one asked for (a
    /// limiter opened as a scheduler, say).
    WrongKind {
        /// What the region holds.
        found: ObjectKind,
        /// What was asked for.
        expected: ObjectKind,
    },
    /// The region was laid out by a build with another layout version
    /// ([`LAYOUT_VERSION`](crate::region::LAYOUT_VERSION)): processes of
    /// both builds cannot share it. Finish the old processes, remove the
    /// region, and let the new build create it.
    VersionMismatch {
        /// The region's layout version.
        found: u32,
        /// The version this build reads and writes.
        expected: u32,
    },
    /// The region's process table is full.
    ProcessTableFull {
        /// Number of process slots in the region.
        slots: u32,
    },
    /// The object was disposed (or its parent was): queued waiters get this,
    /// later calls fail at once.
    Disposed,
    /// The concurrency is 0: nothing can ever be admitted, so a blocking call
    /// fails at once instead of hanging.
    ZeroConcurrency,
    /// A timed wait expired.
    Timeout,
    /// A handle was used in a process other than the one it belongs to
    /// (after `fork`) in a way that cannot be carried over.
    Forked(String),
    /// A raw permit ([`RawPermit`](crate::scheduler::RawPermit)) whose cell
    /// does not hold it: released already, or never issued with that tag
    /// on that cell. Nothing was changed.
    AlreadyReleased {
        /// The cell it named.
        cell: u32,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io {
                op,
                path: Some(p),
                source,
            } => {
                write!(f, "{op} {}: {source}", p.display())
            }
            Error::Io {
                op,
                path: None,
                source,
            } => write!(f, "{op}: {source}"),
            Error::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            Error::BadRegion(m) => write!(f, "bad region: {m}"),
            Error::Mismatch(m) => write!(f, "region mismatch: {m}"),
            Error::WrongKind { found, expected } => write!(
                f,
                "region mismatch: the region holds a {} but a {} was asked for",
                found.name(),
                expected.name()
            ),
            Error::VersionMismatch { found, expected } => write!(
                f,
                "bad region: layout version {found} but this build reads version {expected} \
                 (remove the region once its old processes have finished)"
            ),
            Error::ProcessTableFull { slots } => write!(
                f,
                "the region's process table is full ({slots} processes attached); \
                 create the region with more process slots"
            ),
            Error::Disposed => f.write_str("Scheduler is disposed"),
            Error::ZeroConcurrency => f.write_str("Scheduler concurrency is 0"),
            Error::Timeout => f.write_str("timed out waiting for capacity"),
            Error::Forked(m) => write!(f, "handle used after fork: {m}"),
            Error::AlreadyReleased { cell } => write!(
                f,
                "raw permit on cell {cell} is not held: it was already released, or never \
                 issued with that tag on that cell"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl Error {
    /// Wraps an [`io::Error`] as an [`Error::Io`].
    pub(crate) fn io(op: &'static str, path: Option<PathBuf>, source: io::Error) -> Error {
        Error::Io { op, path, source }
    }
}
