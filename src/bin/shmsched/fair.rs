//! `fair replay LOG`: wires the library's call-log replay to a file or
//! standard input and standard output.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::process::ExitCode;

use shmsched::fair::replay::replay_line_checked;

use crate::{out, CliError, CliResult, ErrorKind};

/// Replays `log` (a path, or `-` for stdin), one JSON line per call on
/// stdout. A call the ledger refuses as misuse is an answer, printed on its
/// line. A line that is not a valid call (malformed JSON, unknown op,
/// missing field, no or invalid config line) is answered on its line too,
/// named on stderr with its line number, and makes the exit status 1, as
/// does an empty log.
pub fn replay(log: &str) -> CliResult {
    let reader: Box<dyn BufRead> = if log == "-" {
        Box::new(io::stdin().lock())
    } else {
        let f = File::open(log).map_err(|e| {
            let kind = match e.kind() {
                io::ErrorKind::NotFound => ErrorKind::NotFound,
                io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
                _ => ErrorKind::Other,
            };
            CliError::new(kind, format!("cannot open call log {log:?}: {e}"))
        })?;
        Box::new(BufReader::new(f))
    };
    let mut stdout = io::stdout().lock();
    let mut ledger = None;
    let (mut calls, mut bad) = (0usize, 0usize);
    for (i, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| {
            CliError::new(
                ErrorKind::InvalidInput,
                format!("reading {log:?} line {}: {e}", i + 1),
            )
        })?;
        if line.trim().is_empty() {
            continue;
        }
        calls += 1;
        let answer = match replay_line_checked(&mut ledger, &line) {
            Ok(v) => v,
            Err(msg) => {
                bad += 1;
                eprintln!("shmsched: {log}:{}: {msg}", i + 1);
                serde_json::json!({"ok": false, "error": msg})
            }
        };
        writeln!(stdout, "{answer}").map_err(out::write_error)?;
    }
    stdout.flush().map_err(out::write_error)?;
    if calls == 0 {
        return Err(CliError::new(
            ErrorKind::InvalidInput,
            format!("call log {log:?} is empty: it must start with a config line"),
        ));
    }
    if bad > 0 {
        return Err(CliError::new(
            ErrorKind::InvalidInput,
            format!(
                "{bad} of {calls} lines of {log:?} are not valid calls (see above); the other answers are printed"
            ),
        ));
    }
    Ok(ExitCode::SUCCESS)
}
