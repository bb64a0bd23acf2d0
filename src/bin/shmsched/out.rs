//! Standard output that never panics: a closed pipe (`shmsched watch R |
//! head -3`) ends the command quietly instead of `println!`'s panic.

use std::fmt::Display;
use std::io::Write;
use std::process::ExitCode;

use crate::{CliError, ErrorKind};

/// Exit status when standard output is a closed pipe: what a shell shows
/// for a program killed by SIGPIPE (128 + 13), without the noise.
pub fn broken_pipe_exit() -> ExitCode {
    ExitCode::from(141)
}

/// Maps a write error on stdout: a closed pipe is [`ErrorKind::BrokenPipe`].
pub fn write_error(e: std::io::Error) -> CliError {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        CliError::new(ErrorKind::BrokenPipe, "standard output is closed")
    } else {
        CliError::new(ErrorKind::Other, format!("writing to standard output: {e}"))
    }
}

/// Writes `text` and a newline to stdout and flushes.
pub fn line(text: &dyn Display) -> Result<(), CliError> {
    let mut o = std::io::stdout().lock();
    writeln!(o, "{text}")
        .and_then(|()| o.flush())
        .map_err(write_error)
}

/// Writes `text` as is (no newline) to stdout and flushes.
pub fn raw(text: &str) -> Result<(), CliError> {
    let mut o = std::io::stdout().lock();
    o.write_all(text.as_bytes())
        .and_then(|()| o.flush())
        .map_err(write_error)
}

/// `println!` that returns a [`CliError`] instead of panicking; use it with
/// `?` in a function returning `Result<_, CliError>`.
#[macro_export]
macro_rules! outln {
    () => { $crate::out::line(&"") };
    ($($arg:tt)*) => { $crate::out::line(&format_args!($($arg)*)) };
}
