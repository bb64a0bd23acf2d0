//! Moving bytes from one descriptor to another under a [`Limiter`]: the
//! loop behind `shmsched pipe`, and the byte sizes and rates it is given.
//!
//! # How it works
//!
//! The pump *charges before it takes*. Each round it asks the input how
//! many bytes are waiting (`FIONREAD`; when nothing is, it sleeps in
//! `poll` until something is), charges the limiter for at most one chunk
//! of them, and only then moves up to what it has charged, with
//! `splice(2)` inside the kernel when either side is a pipe (no copy
//! through user space) or with `read`/`write` through one buffer
//! otherwise. What it charged and could not move yet (a short splice) is
//! kept as credit for the next round, so:
//!
//! - no byte is ever passed before it is charged;
//! - a failed charge (the limiter disposed, the region scribbled, a handle
//!   used after `fork`) takes nothing from the input: every byte not yet
//!   passed is still there for whoever reads next, none is lost;
//! - what is charged and never passed is at most the credit of one chunk
//!   at end of input (less when the input tells its size through
//!   `FIONREAD`: pipes, FIFOs, sockets, terminals and regular files do).
//!
//! Pipes on either side are grown to 1 MiB (`F_SETPIPE_SZ`, within what an
//! unprivileged process may ask) so that each move is large.
//!
//! A chunk is at most a quarter of the bucket's capacity (as for the
//! throttled readers: a charge never waits for a completely full bucket),
//! 20 ms of rate (so the output flows evenly), and 1 MiB.
//!
//! **Strict pacing.** A bucket starts full: a copy shorter than the
//! capacity runs at the speed of the disk, not at the rate. With
//! [`PumpOptions::strict`] the pump charges through a child limiter of the
//! rate in force whose capacity is one chunk, so this pump alone never runs
//! ahead of the rate, whatever the region's burst; the burst shared by all
//! users is the region's capacity (`shmsched create --capacity`).

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};
use crate::limiter::{Limiter, MAX_TOKENS_PER_SECOND};
use crate::priority::Priority;
use crate::sys::pipe as sp;

/// The largest chunk of one charge and one move (1 MiB).
pub const MAX_CHUNK: u64 = 1 << 20;

/// How a [`pump`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PumpOptions {
    /// The priority every charge is made at.
    pub priority: Priority,
    /// Never run ahead of the rate, even on a full bucket (see the module
    /// docs).
    pub strict: bool,
}

impl Default for PumpOptions {
    fn default() -> Self {
        PumpOptions {
            priority: Priority::Normal,
            strict: false,
        }
    }
}

/// Why a [`pump`] stopped early.
#[derive(Debug)]
pub enum PumpError {
    /// Reading the input failed.
    Read(std::io::Error),
    /// Writing the output failed (`BrokenPipe` when its reader is gone).
    Write(std::io::Error),
    /// Charging the limiter failed; nothing more was taken from the input.
    Charge(Error),
}

impl std::fmt::Display for PumpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PumpError::Read(e) => write!(f, "reading the input: {e}"),
            PumpError::Write(e) => write!(f, "writing the output: {e}"),
            PumpError::Charge(e) => write!(f, "charging the limiter: {e}"),
        }
    }
}

impl std::error::Error for PumpError {}

/// The chunk for a bucket of `rate` tokens/s and `capacity` (module docs).
pub fn chunk_for(rate: u64, capacity: u64) -> u64 {
    (capacity / 4).min(rate / 50).clamp(1, MAX_CHUNK)
}

/// Counts of a finished [`pump`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PumpReport {
    /// Bytes passed from the input to the output.
    pub bytes: u64,
    /// Tokens charged (`bytes` plus the unspent credit at end of input).
    pub charged: u64,
    /// Whether the bytes moved through `splice` (else through a buffer).
    pub spliced: bool,
}

/// What the pump charges: a chunk size and a blocking charge.
trait Charge {
    /// The largest charge of one round.
    fn chunk(&self) -> u64;
    /// Charges `n` tokens, blocking until they are charged.
    fn charge(&mut self, n: u64) -> Result<()>;
}

/// The limiter (or its strict child) behind a [`pump`].
struct Meter<'a> {
    lim: &'a Limiter,
    strict: Option<(Limiter, u32)>,
    priority: Priority,
}

impl Charge for Meter<'_> {
    fn chunk(&self) -> u64 {
        chunk_for(
            u64::from(self.lim.tokens_per_second()),
            u64::from(self.lim.capacity()),
        )
    }

    fn charge(&mut self, n: u64) -> Result<()> {
        let lim = match &mut self.strict {
            None => self.lim,
            Some((child, rate)) => {
                // Follow the rate in force (`shmsched set --rate`).
                let now = self.lim.tokens_per_second();
                if now != *rate && now > 0 {
                    child.set_rate(u64::from(now))?;
                    child.set_capacity(chunk_for(u64::from(now), u64::from(now)))?;
                    *rate = now;
                }
                &*child
            }
        };
        lim.consume(n, self.priority).map(|_| ())
    }
}

/// Copies `input` to `output` until end of input, charging `lim` one token
/// per byte before passing it (see the module docs), and adding each byte
/// passed to `progress` as it goes (for a progress line read from another
/// thread). Returns the counts; on an error, `progress` holds the bytes
/// passed before it.
pub fn pump(
    input: BorrowedFd<'_>,
    output: BorrowedFd<'_>,
    lim: &Limiter,
    opts: PumpOptions,
    progress: &AtomicU64,
) -> std::result::Result<PumpReport, PumpError> {
    let strict = if opts.strict {
        let rate = lim.tokens_per_second().max(1);
        let cap = chunk_for(u64::from(rate), u64::from(rate));
        let child = lim
            .child_with_capacity(u64::from(rate), cap)
            .map_err(PumpError::Charge)?;
        // The child starts full: spend its one chunk so that even the first
        // chunk waits for the rate.
        let _ = child.try_consume(cap);
        Some((child, rate))
    } else {
        None
    };
    let mut m = Meter {
        lim,
        strict,
        priority: opts.priority,
    };
    run(input, output, &mut m, progress)
}

fn run(
    input: BorrowedFd<'_>,
    output: BorrowedFd<'_>,
    m: &mut dyn Charge,
    progress: &AtomicU64,
) -> std::result::Result<PumpReport, PumpError> {
    let (in_pipe, out_pipe) = (
        sp::is_fifo(input).unwrap_or(false),
        sp::is_fifo(output).unwrap_or(false),
    );
    // Larger pipe buffers: fewer, larger moves (an unprivileged process may
    // grow a pipe up to /proc/sys/fs/pipe-max-size, 1 MiB by default; a
    // refusal only costs speed).
    for (fd, is) in [(input, in_pipe), (output, out_pipe)] {
        if is && sp::pipe_size(fd).unwrap_or(0) < MAX_CHUNK as usize {
            let _ = sp::set_pipe_size(fd, MAX_CHUNK as usize);
        }
    }
    let splicing = in_pipe || out_pipe;
    let mut report = PumpReport {
        spliced: splicing,
        ..PumpReport::default()
    };
    // Charged and not yet passed.
    let mut credit = 0u64;
    let mut buf: Vec<u8> = Vec::new();
    loop {
        if credit == 0 {
            let want = waiting(input).map_err(PumpError::Read)?;
            let n = want.min(m.chunk()).max(1);
            m.charge(n).map_err(PumpError::Charge)?;
            credit = n;
            report.charged += n;
        }
        let len = credit.min(MAX_CHUNK) as usize;
        let moved = if report.spliced {
            match sp::splice(input, output, len) {
                Ok(n) => n,
                // EINVAL: this pair cannot be spliced (nothing moved): go on
                // through a buffer.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && report.bytes == 0 => {
                    report.spliced = false;
                    continue;
                }
                // A closed reader of the output gives EPIPE.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                    return Err(PumpError::Write(e))
                }
                Err(e) => return Err(PumpError::Read(e)),
            }
        } else {
            if buf.len() < len {
                buf.resize(len.max(64 * 1024).min(MAX_CHUNK as usize), 0);
            }
            let n = sp::read(input, &mut buf[..len]).map_err(PumpError::Read)?;
            write_all(output, &buf[..n]).map_err(PumpError::Write)?;
            n
        };
        if moved == 0 {
            return Ok(report);
        }
        credit -= moved as u64;
        report.bytes += moved as u64;
        progress.fetch_add(moved as u64, Ordering::Relaxed);
    }
}

/// How many bytes `input` has waiting, sleeping until it has some (or is
/// at its end, reported as 1 so that one byte is charged to find out).
/// An input that cannot tell (`/dev/zero`) is asked for a whole chunk.
fn waiting(input: BorrowedFd<'_>) -> std::io::Result<u64> {
    match sp::fionread(input) {
        Ok(0) => {}
        Ok(n) => return Ok(n as u64),
        Err(_) => return Ok(u64::MAX),
    }
    sp::wait_readable(input, None)?;
    match sp::fionread(input) {
        Ok(0) | Err(_) => Ok(1),
        Ok(n) => Ok(n as u64),
    }
}

fn write_all(fd: BorrowedFd<'_>, mut b: &[u8]) -> std::io::Result<()> {
    while !b.is_empty() {
        let n = sp::write(fd, b)?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        b = &b[n..];
    }
    Ok(())
}

/// Parses a byte count: a non-negative number with an optional unit,
/// decimal (`k`/`K` = 1000, `M` = 10^6, `G` = 10^9, `T` = 10^12) or binary
/// (`Ki` = 1024, `Mi`, `Gi`, `Ti`), an optional `B` after it, spaces
/// allowed before the unit: `"64k"`, `"1.5GiB"`, `"10 MB"`, `"4096"`. The
/// result is rounded to the nearest byte. Errors name the value.
///
/// ```
/// use shmsched::pump::parse_bytes;
/// assert_eq!(parse_bytes("64k").unwrap(), 64_000);
/// assert_eq!(parse_bytes("1.5GiB").unwrap(), 1_610_612_736);
/// assert_eq!(parse_bytes("10M").unwrap(), 10_000_000);
/// assert!(parse_bytes("ten").is_err());
/// assert!(parse_bytes("5 parsecs").is_err());
/// ```
pub fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num = num.replace('_', "");
    let bad = |why: &str| {
        Error::InvalidArgument(format!(
            "{s:?} is not a byte count: {why} (examples: 4096, 64k, 10M, 1.5GiB)"
        ))
    };
    if num.is_empty() {
        return Err(bad("it does not start with a number"));
    }
    let x: f64 = num.parse().map_err(|_| bad("the number is malformed"))?;
    let mult: f64 = match unit.trim() {
        "" | "B" | "b" => 1.0,
        "k" | "K" | "kB" | "KB" => 1e3,
        "M" | "MB" => 1e6,
        "G" | "GB" => 1e9,
        "T" | "TB" => 1e12,
        "Ki" | "KiB" => 1024.0,
        "Mi" | "MiB" => 1024.0 * 1024.0,
        "Gi" | "GiB" => 1024.0 * 1024.0 * 1024.0,
        "Ti" | "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        u => {
            return Err(bad(&format!(
                "unknown unit {u:?} (k, M, G, T are powers of 1000; Ki, Mi, Gi, Ti of 1024)"
            )))
        }
    };
    let v = (x * mult).round();
    if !v.is_finite() || v >= u64::MAX as f64 {
        return Err(bad("it is too large"));
    }
    Ok(v as u64)
}

/// Parses a byte rate: a [`parse_bytes`] count with an optional `/s`
/// (`"10M"`, `"1.5GiB/s"`, `"64k"`), positive and at most
/// [`MAX_TOKENS_PER_SECOND`] (about 2 GiB/s). Errors name the value and
/// the limit.
///
/// ```
/// use shmsched::pump::parse_rate;
/// assert_eq!(parse_rate("20MB/s").unwrap(), 20_000_000);
/// assert!(parse_rate("0").is_err());
/// assert!(parse_rate("3GiB").is_err()); // above the limit
/// ```
pub fn parse_rate(s: &str) -> Result<u64> {
    let t = s.trim();
    let t = t.strip_suffix("/s").unwrap_or(t);
    let v = parse_bytes(t)?;
    if v == 0 || v > MAX_TOKENS_PER_SECOND {
        return Err(Error::InvalidArgument(format!(
            "rate {s:?} is {v} bytes/s: it must be 1..={MAX_TOKENS_PER_SECOND} (about 2 GiB/s)"
        )));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    #[test]
    fn sizes_and_rates_parse_or_name_the_value() {
        assert_eq!(parse_bytes("0").unwrap(), 0);
        assert_eq!(parse_bytes("1_000").unwrap(), 1000);
        assert_eq!(parse_bytes("64 KiB").unwrap(), 65_536);
        assert_eq!(parse_bytes("2T").unwrap(), 2_000_000_000_000);
        assert_eq!(parse_rate("2147483647").unwrap(), MAX_TOKENS_PER_SECOND);
        for bad in ["", "k", "-1", "1..2", "1e3", "12 bits"] {
            let e = parse_bytes(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
        let e = parse_rate("2GiB").unwrap_err().to_string();
        assert!(e.contains("2147483648") && e.contains("2147483647"), "{e}");
        assert!(parse_rate("0.4").unwrap_err().to_string().contains("1..="));
    }

    #[test]
    fn chunks_are_bounded() {
        assert_eq!(chunk_for(1, 1), 1);
        assert_eq!(chunk_for(2_000_000_000, 2_000_000_000), MAX_CHUNK);
        assert_eq!(chunk_for(20_000_000, 20_000_000), 400_000);
        assert_eq!(chunk_for(20_000_000, 400_000), 100_000);
    }

    fn pipe() -> (std::fs::File, std::fs::File) {
        let (r, w) = std::io::pipe().unwrap();
        (
            std::fs::File::from(std::os::fd::OwnedFd::from(r)),
            std::fs::File::from(std::os::fd::OwnedFd::from(w)),
        )
    }

    /// Records every charge; fails once `fail_at` tokens were charged.
    struct Probe {
        charged: std::sync::Arc<AtomicU64>,
        chunk: u64,
        fail_at: u64,
    }

    impl Charge for Probe {
        fn chunk(&self) -> u64 {
            self.chunk
        }
        fn charge(&mut self, n: u64) -> Result<()> {
            if self.charged.load(Ordering::SeqCst) + n > self.fail_at {
                return Err(Error::InvalidArgument("the test's charge fails".into()));
            }
            self.charged.fetch_add(n, Ordering::SeqCst);
            Ok(())
        }
    }

    /// Pipe to pipe (splice): every byte arrives, in order, never before
    /// it was charged, and exactly the bytes passed are charged (the input
    /// tells its size), plus one to learn of the end of input.
    #[test]
    fn pipe_to_pipe_passes_every_byte_after_its_charge() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let (in_r, mut in_w) = pipe();
        let (out_r, out_w) = pipe();
        let charged = std::sync::Arc::new(AtomicU64::new(0));
        let d = data.clone();
        let writer = std::thread::spawn(move || in_w.write_all(&d).unwrap());
        let seen = charged.clone();
        let reader = std::thread::spawn(move || {
            let (mut v, mut r, mut b) = (Vec::new(), out_r, [0u8; 4096]);
            loop {
                let n = r.read(&mut b).unwrap();
                if n == 0 {
                    return v;
                }
                v.extend_from_slice(&b[..n]);
                assert!(
                    v.len() as u64 <= seen.load(Ordering::SeqCst),
                    "an uncharged byte"
                );
            }
        });
        let mut probe = Probe {
            charged: charged.clone(),
            chunk: 10_000,
            fail_at: u64::MAX,
        };
        let progress = AtomicU64::new(0);
        let rep = run(in_r.as_fd(), out_w.as_fd(), &mut probe, &progress).unwrap();
        drop(out_w);
        writer.join().unwrap();
        assert_eq!(reader.join().unwrap(), data);
        assert!(rep.spliced);
        assert_eq!(rep.bytes, data.len() as u64);
        assert_eq!(progress.load(Ordering::Relaxed), rep.bytes);
        assert_eq!(rep.charged, rep.bytes + 1);
        assert_eq!(charged.load(Ordering::SeqCst), rep.charged);
    }

    /// Through a buffer (neither side a pipe): the same counts.
    #[test]
    fn file_to_file_through_a_buffer() {
        let dir = std::env::temp_dir().join(format!("shmsched-pump-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(dir.join("in"), &data).unwrap();
        let input = std::fs::File::open(dir.join("in")).unwrap();
        let output = std::fs::File::create(dir.join("out")).unwrap();
        let lim = Limiter::new(1_000_000_000).unwrap();
        let rep = pump(
            input.as_fd(),
            output.as_fd(),
            &lim,
            PumpOptions::default(),
            &AtomicU64::new(0),
        )
        .unwrap();
        assert!(!rep.spliced);
        assert_eq!((rep.bytes, rep.charged), (100_000, 100_001));
        assert_eq!(std::fs::read(dir.join("out")).unwrap(), data);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A failed charge takes nothing more from the input: the bytes not
    /// passed are still there for the next reader.
    #[test]
    fn failed_charge_loses_nothing() {
        let (in_r, mut in_w) = pipe();
        let (mut out_r, out_w) = pipe();
        in_w.write_all(b"0123456789").unwrap();
        let mut probe = Probe {
            charged: std::sync::Arc::new(AtomicU64::new(0)),
            chunk: 4,
            fail_at: 6,
        };
        let e = run(in_r.as_fd(), out_w.as_fd(), &mut probe, &AtomicU64::new(0)).unwrap_err();
        assert!(matches!(e, PumpError::Charge(_)), "{e}");
        drop((in_w, out_w));
        let (mut passed, mut rest) = (String::new(), String::new());
        out_r.read_to_string(&mut passed).unwrap();
        let mut r = in_r;
        r.read_to_string(&mut rest).unwrap();
        assert_eq!((passed.as_str(), rest.as_str()), ("0123", "456789"));
    }

    /// Strict pacing on a full bucket: the burst is not spent.
    #[test]
    fn strict_does_not_run_at_the_burst() {
        let (in_r, mut in_w) = pipe();
        let (mut out_r, out_w) = pipe();
        let lim = Limiter::new(400_000).unwrap(); // full: 400 kB of burst
        let w = std::thread::spawn(move || in_w.write_all(&[1u8; 120_000]).unwrap());
        let r = std::thread::spawn(move || {
            let mut v = Vec::new();
            out_r.read_to_end(&mut v).unwrap();
            v.len()
        });
        let t = std::time::Instant::now();
        let opts = PumpOptions {
            strict: true,
            ..PumpOptions::default()
        };
        let rep = pump(in_r.as_fd(), out_w.as_fd(), &lim, opts, &AtomicU64::new(0)).unwrap();
        let took = t.elapsed();
        drop(out_w);
        w.join().unwrap();
        assert_eq!(r.join().unwrap(), 120_000);
        assert_eq!(rep.bytes, 120_000);
        // 120 kB at 400 kB/s is 300 ms; the burst would have let it go at once.
        assert!(took.as_millis() >= 250, "took {took:?}");
    }
}
