//! `pipe NAME [--rate R] [--priority P] [--size BYTES] [--strict]`:
//! standard input to standard output under the region's shared byte rate
//! (`shmsched::pump`: every byte charged before it passes; `splice(2)`
//! when a side is a pipe), with a pv-like progress line on a terminal.

use std::io::{IsTerminal, Write};
use std::os::fd::AsFd;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Args;
use shmsched::limiter::Limiter;
use shmsched::pump::{self, PumpError, PumpOptions};
use shmsched::region::Region;
use shmsched::Priority;

use crate::{held, out, CliError, CliResult, ErrorKind};

/// Arguments of `pipe`.
#[derive(Debug, Args)]
pub struct PipeArgs {
    /// Limiter region name (maps to /dev/shm/shmsched.NAME) or path.
    region: String,
    /// Create the limiter with this rate (bytes/s: 10M, 1.5GiB, 64k) when
    /// the region does not exist; an existing limiter must run at this rate.
    #[arg(long, value_parser = parse_rate)]
    rate: Option<u64>,
    /// Burst of a limiter created here, in bytes (default: 100 ms of rate).
    #[arg(long, value_parser = parse_bytes, requires = "rate")]
    capacity: Option<u64>,
    /// Priority every charge is made at.
    #[arg(long, short = 'p', default_value = "normal", value_parser = held::parse_priority)]
    priority: Priority,
    /// The input's size, for the progress line's percentage and ETA.
    #[arg(long, short = 's', value_parser = parse_bytes)]
    size: Option<u64>,
    /// Never run ahead of the rate, even while the bucket is full (this
    /// pipe spends no burst).
    #[arg(long)]
    strict: bool,
    /// Show the progress line even when stderr is not a terminal.
    #[arg(long, conflicts_with = "quiet")]
    progress: bool,
    /// No progress line.
    #[arg(long, short = 'q')]
    quiet: bool,
}

fn parse_rate(s: &str) -> Result<u64, String> {
    pump::parse_rate(s).map_err(|e| e.to_string())
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    pump::parse_bytes(s).map_err(|e| e.to_string())
}

/// The burst of a limiter that `pipe` or `create` makes: 100 ms of rate
/// (at least 1 byte), so that a short copy does not run at a second's
/// burst.
pub fn default_capacity(rate: u64) -> u64 {
    (rate / 10).max(1)
}

/// The limiter of region `name`, created with `rate` when missing.
fn open_limiter(name: &str, rate: Option<u64>, capacity: Option<u64>) -> Result<Limiter, CliError> {
    let what = format!("region {name:?}");
    let lib = |e: shmsched::Error| CliError::lib(&what, &e);
    let Some(rate) = rate else {
        let hint = format!("pass --rate R to create it (or `shmsched create {name} --rate R`)");
        let region = Region::open(name).map_err(|e| held::region_error(name, &e, &hint))?;
        return Limiter::attach(&region).map_err(lib);
    };
    let region = Region::open_or_create(name).map_err(lib)?;
    let lim = match region.info().map_err(lib)? {
        None => Limiter::shared_with_capacity(
            &region,
            rate,
            capacity.unwrap_or_else(|| default_capacity(rate)),
        )
        .map_err(lib)?,
        Some(_) => Limiter::attach(&region).map_err(lib)?,
    };
    let now = u64::from(lim.tokens_per_second());
    if now != rate {
        return Err(CliError::new(
            ErrorKind::BadRegion,
            format!(
                "{what}: region mismatch: the limiter runs at {now} bytes/s but --rate asks for {rate}; \
                 leave --rate out to use it as it is, or change it with `shmsched set {name} --rate R`"
            ),
        ));
    }
    Ok(lim)
}

/// `pipe`: exits 0 at end of input, 1 on an error (141 when standard
/// output's reader is gone).
pub fn run(a: PipeArgs) -> CliResult {
    let lim = open_limiter(&a.region, a.rate, a.capacity)?;
    let show = !a.quiet && (a.progress || std::io::stderr().is_terminal());
    let passed = AtomicU64::new(0);
    let opts = PumpOptions {
        priority: a.priority,
        strict: a.strict,
    };
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let start = Instant::now();
    let r = std::thread::scope(|s| {
        let (stop, stopped) = mpsc::channel::<()>();
        let progress = show.then(|| {
            let passed = &passed;
            s.spawn(move || {
                let mut last = 0;
                loop {
                    let gone = !matches!(
                        stopped.recv_timeout(Duration::from_millis(500)),
                        Err(mpsc::RecvTimeoutError::Timeout)
                    );
                    let n = passed.load(Ordering::Relaxed);
                    last = line(n, start.elapsed(), a.size, gone, last);
                    if gone {
                        return;
                    }
                }
            })
        });
        let r = pump::pump(stdin.as_fd(), stdout.as_fd(), &lim, opts, &passed);
        drop(stop);
        if let Some(p) = progress {
            let _ = p.join();
        }
        r
    });
    match r {
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(PumpError::Write(e)) => Err(out::write_error(e)),
        Err(e) => Err(CliError::new(
            ErrorKind::Other,
            format!("pipe {:?}: {e}", a.region),
        )),
    }
}

/// `12.3 MiB`.
fn human(n: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n;
    let mut i = 0;
    while v >= 1024.0 && i < units.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} {}", units[0])
    } else {
        format!("{v:.1} {}", units[i])
    }
}

fn clock(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// Draws the progress line (`\r`, padded over the previous one; a newline
/// when `last`): bytes, elapsed time, average rate, and with a size the
/// percentage and ETA. Returns its width.
fn line(n: u64, elapsed: Duration, size: Option<u64>, last: bool, prev: usize) -> usize {
    let secs = elapsed.as_secs_f64().max(1e-3);
    let rate = n as f64 / secs;
    let mut s = format!("{} {} [{}/s]", human(n as f64), clock(elapsed), human(rate));
    if let Some(total) = size.filter(|&t| t > 0) {
        let pct = (n as f64 / total as f64 * 100.0).min(100.0);
        let eta = if rate > 0.0 && n < total {
            clock(Duration::from_secs_f64((total - n) as f64 / rate))
        } else {
            clock(Duration::ZERO)
        };
        s.push_str(&format!(" {pct:3.0}% ETA {eta}"));
    }
    let width = s.len();
    let pad = prev.saturating_sub(width);
    let mut e = std::io::stderr().lock();
    let _ = write!(e, "\r{s}{}", " ".repeat(pad));
    if last {
        let _ = writeln!(e);
    }
    let _ = e.flush();
    width
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes_and_clock() {
        assert_eq!(human(512.0), "512 B");
        assert_eq!(human(1536.0), "1.5 KiB");
        assert_eq!(human(3.0 * 1024.0 * 1024.0 * 1024.0), "3.0 GiB");
        assert_eq!(clock(Duration::from_secs(3725)), "1:02:05");
        assert_eq!(default_capacity(20_000_000), 2_000_000);
        assert_eq!(default_capacity(5), 1);
    }
}
