//! `fair replay LOG`: wires the library's call-log replay to a file or
//! standard input and standard output.

use std::fs::File;
use std::io::{self, BufReader};
use std::process::ExitCode;

use crate::{CliError, CliResult};

/// Replays `log` (a path, or `-` for stdin), one JSON line per call on
/// stdout. Misuse errors are answered on their own lines (and counted on
/// stderr); only I/O failures are errors.
pub fn replay(log: &str) -> CliResult {
    let stdout = io::stdout().lock();
    let summary = if log == "-" {
        shmsched::fair::replay(io::stdin().lock(), stdout)
    } else {
        let f =
            File::open(log).map_err(|e| CliError(format!("cannot open call log {log:?}: {e}")))?;
        shmsched::fair::replay(BufReader::new(f), stdout)
    }
    .map_err(|e| CliError(format!("replaying {log:?}: {e}")))?;
    if summary.errors > 0 {
        eprintln!(
            "shmsched: replayed {} calls, {} answered with an error",
            summary.lines, summary.errors
        );
    }
    Ok(ExitCode::SUCCESS)
}
