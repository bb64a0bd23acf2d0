//! Throttled and gated I/O.
//!
//! **Throttling** (a byte-rate budget): [`LimitedReader`] and
//! [`LimitedWriter`] wrap any `Read`/`BufRead`/`Write` and charge a
//! [`Limiter`] one token per byte; [`copy`] is a throttled
//! `std::io::copy`. Charges are exact:
//!
//! - a reader charges the bytes a `read` actually returned, after the read;
//!   a `BufRead` user is charged in `fill_buf` for the bytes it is shown
//!   (at most one capacity's worth), and `consume` spends that prepayment;
//! - a writer charges the bytes the inner writer took, after each write, so
//!   a short write costs only what it wrote and no tokens are ever granted
//!   and left unused;
//! - nothing read is dropped: when the charge after a read (or a write)
//!   fails (the limiter was disposed, the handle was inherited across
//!   `fork`, the region is corrupt), the bytes already read are still
//!   returned (written), and the charge is retried at the start of the next
//!   call, whose error then reports the failure (no further byte moves
//!   until a charge succeeds); [`copy`] writes what it read before
//!   reporting a failed charge;
//! - no single charge exceeds a quarter of the smallest rate or capacity
//!   along the limiter's chain (large buffers are split), so throttled I/O
//!   never relies on the oversize rule or on debt at any level, and never
//!   waits for a completely full bucket (which would lose the wake-up
//!   latency as refill beyond the capacity);
//! - tokens charged for bytes that never moved are given back: [`copy`]
//!   refunds what a failing writer did not take, a [`LimitedReader`]
//!   dropped with bytes prepaid by `fill_buf` and not consumed refunds
//!   them, and the async writer refunds its unused credit when a write
//!   fails or the adapter is dropped.
//!
//! Under a shared limiter, every process's adapters draw on one budget.
//!
//! With the cargo feature `tokio`, `AsyncLimitedReader` and
//! `AsyncLimitedWriter` (from `Limiter::async_reader` / `async_writer`) do
//! the same for tokio's `AsyncRead`/`AsyncWrite`, charging through
//! [`Limiter::consume_async`] (the pending charge is kept in the adapter;
//! no thread blocks).
//!
//! **Gating** (a concurrency budget): [`Gated`] wraps a file (or any
//! `Read`/`Write`/`Seek`) so that each operation holds a [`Scheduler`]
//! permit for exactly its duration; [`gated_read`] and [`gated_write`] do a
//! whole-file operation under one permit — the seed's "coordinate the
//! thread pool across workers" example, across processes.
//!
//! ```
//! use std::io::{Read, Write};
//! use shmsched::limiter::Limiter;
//! use shmsched::Priority;
//!
//! # fn main() -> std::io::Result<()> {
//! let lim = Limiter::new(10_000_000).map_err(std::io::Error::other)?; // 10 MB/s
//! let data = vec![7u8; 100_000];
//! let mut out = Vec::new();
//! let n = shmsched::io::copy(&mut &data[..], &mut out, &lim, Priority::Low)?;
//! assert_eq!((n, &out), (100_000, &data));
//!
//! let mut w = lim.writer(Vec::new(), Priority::High);
//! w.write_all(b"hello")?;
//! let mut r = lim.reader(&b"world"[..], Priority::Normal);
//! let mut s = String::new();
//! r.read_to_string(&mut s)?;
//! assert_eq!(s, "world");
//! # Ok(()) }
//! ```

use std::fs::File;
use std::io::{self, BufRead, Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::limiter::Limiter;
use crate::priority::Priority;
use crate::scheduler::Scheduler;

/// Default buffer of [`copy`] (shrunk to a quarter of the capacity when
/// that is smaller).
pub const COPY_BUF: usize = 64 * 1024;

fn io_err(e: crate::Error) -> io::Error {
    match e {
        crate::Error::Timeout => io::Error::new(io::ErrorKind::TimedOut, e),
        e => io::Error::other(e),
    }
}

fn charge(lim: &Limiter, n: usize, p: Priority) -> io::Result<()> {
    if n > 0 {
        lim.consume(n as u64, p).map_err(io_err)?;
    }
    Ok(())
}

/// The largest single charge: a quarter of the smallest rate or capacity
/// along the chain ([`Limiter::io_chunk`]). A charge of a whole capacity
/// would wait for a *full* bucket, and a bucket stops refilling when full,
/// so every wake-up delay would be lost throughput; with a quarter the
/// wait ends while the bucket still fills. Bounding by every level's
/// capacity (not only the leaf's rate) keeps a charge within each level's
/// burst, so none needs the oversize rule's debt.
fn max_chunk(lim: &Limiter) -> usize {
    usize::try_from(lim.io_chunk()).unwrap_or(usize::MAX)
}

impl Limiter {
    /// Wraps `inner` so that every byte read is charged to this limiter at
    /// `priority`.
    pub fn reader<R>(&self, inner: R, priority: Priority) -> LimitedReader<R> {
        LimitedReader {
            inner,
            acct: ReadAccount {
                lim: self.clone(),
                priority,
                prepaid: 0,
                owed: 0,
            },
        }
    }

    /// Wraps `inner` so that every byte written is charged to this limiter
    /// at `priority`.
    pub fn writer<W>(&self, inner: W, priority: Priority) -> LimitedWriter<W> {
        LimitedWriter {
            inner,
            lim: self.clone(),
            priority,
            owed: 0,
        }
    }
}

/// A reader throttled by a [`Limiter`]. Implements `Read`, and `BufRead`
/// when the inner reader does.
#[derive(Debug)]
pub struct LimitedReader<R> {
    inner: R,
    acct: ReadAccount,
}

/// What a [`LimitedReader`] has charged and owes. Kept apart from the inner
/// reader so that dropping it (with the adapter, or in `into_inner`) gives
/// back the prepaid tokens of bytes never consumed.
#[derive(Debug)]
struct ReadAccount {
    lim: Limiter,
    priority: Priority,
    /// Bytes charged by `fill_buf` and not yet consumed.
    prepaid: usize,
    /// Bytes handed out whose charge failed; charged before anything else.
    owed: usize,
}

impl Drop for ReadAccount {
    fn drop(&mut self) {
        if self.prepaid > 0 {
            self.lim.refund(self.prepaid as u64, self.priority);
        }
    }
}

impl<R> LimitedReader<R> {
    /// The inner reader.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// The inner reader, mutably (bytes read through it are not charged).
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// Unwraps the inner reader. Tokens prepaid by `fill_buf` for bytes
    /// not consumed are given back.
    pub fn into_inner(self) -> R {
        self.inner
    }
}

/// Charges `owed` bytes (a failed earlier charge) before anything else
/// moves; on failure they stay owed and the error is reported.
fn settle(lim: &Limiter, owed: &mut usize, p: Priority) -> io::Result<()> {
    if *owed > 0 {
        charge(lim, *owed, p)?;
        *owed = 0;
    }
    Ok(())
}

impl<R: Read> Read for LimitedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let a = &mut self.acct;
        settle(&a.lim, &mut a.owed, a.priority)?;
        if a.prepaid > 0 {
            let k = buf.len().min(a.prepaid);
            let n = self.inner.read(&mut buf[..k])?;
            a.prepaid -= n;
            return Ok(n);
        }
        let k = buf.len().min(max_chunk(&a.lim));
        let n = self.inner.read(&mut buf[..k])?;
        if charge(&a.lim, n, a.priority).is_err() {
            // The bytes are read: hand them out, never drop them. The charge
            // is retried first thing next call, which reports the error.
            a.owed = n;
        }
        Ok(n)
    }
}

impl<R: BufRead> BufRead for LimitedReader<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        let a = &mut self.acct;
        settle(&a.lim, &mut a.owed, a.priority)?;
        if a.prepaid == 0 {
            let avail = self.inner.fill_buf()?.len().min(max_chunk(&a.lim));
            charge(&a.lim, avail, a.priority)?;
            a.prepaid = avail;
        }
        let k = a.prepaid;
        let buf = self.inner.fill_buf()?;
        Ok(&buf[..k.min(buf.len())])
    }

    fn consume(&mut self, amt: usize) {
        let amt = amt.min(self.acct.prepaid);
        self.acct.prepaid -= amt;
        self.inner.consume(amt);
    }
}

/// A writer throttled by a [`Limiter`]: each write is charged, after it,
/// for the bytes the inner writer took (see the module docs).
#[derive(Debug)]
pub struct LimitedWriter<W> {
    inner: W,
    lim: Limiter,
    priority: Priority,
    /// Bytes written whose charge failed; charged before the next write.
    owed: usize,
}

impl<W> LimitedWriter<W> {
    /// The inner writer.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    /// The inner writer, mutably (bytes written through it are not charged).
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// Unwraps the inner writer. Nothing is charged in advance, so no
    /// tokens are lost; bytes whose charge failed stay uncharged.
    pub fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: Write> Write for LimitedWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return self.inner.write(buf);
        }
        settle(&self.lim, &mut self.owed, self.priority)?;
        let k = buf.len().min(max_chunk(&self.lim));
        let n = self.inner.write(&buf[..k])?;
        if charge(&self.lim, n, self.priority).is_err() {
            // Written is written: report it, and the failed charge next call.
            self.owed = n;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Copies `reader` to `writer` (like `std::io::copy`), charging `limiter`
/// one token per byte at `priority` before each chunk is written. Returns
/// the bytes copied. If a charge fails, the chunk already read is still
/// written before the error is returned (nothing read is dropped). If the
/// writer fails, the tokens of the bytes it did not take are given back,
/// so a failed copy costs what it wrote.
pub fn copy<R: Read + ?Sized, W: Write + ?Sized>(
    reader: &mut R,
    writer: &mut W,
    limiter: &Limiter,
    priority: Priority,
) -> io::Result<u64> {
    let mut buf = vec![0u8; COPY_BUF.min(max_chunk(limiter)).max(1)];
    let mut total = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let charged = charge(limiter, n, priority);
        let written = write_counted(writer, &buf[..n]);
        total += written.as_ref().map_or_else(|(k, _)| *k, |k| *k) as u64;
        if let Err((k, e)) = written {
            if charged.is_ok() {
                limiter.refund((n - k) as u64, priority);
            }
            return Err(e);
        }
        charged?;
    }
}

/// `write_all` that says how much was written when it fails.
fn write_counted<W: Write + ?Sized>(w: &mut W, buf: &[u8]) -> Result<usize, (usize, io::Error)> {
    let mut done = 0;
    while done < buf.len() {
        match w.write(&buf[done..]) {
            Ok(0) => return Err((done, io::ErrorKind::WriteZero.into())),
            Ok(k) => done += k.min(buf.len() - done),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err((done, e)),
        }
    }
    Ok(done)
}

/// Reads the whole file at `path` while holding one permit of `sched` at
/// `priority` (the open, the reads and the close).
pub fn gated_read(
    sched: &Scheduler,
    priority: Priority,
    path: impl AsRef<Path>,
) -> io::Result<Vec<u8>> {
    let _permit = sched.acquire(priority).map_err(io_err)?;
    std::fs::read(path)
}

/// Writes `data` to the file at `path` (creating or truncating it) while
/// holding one permit of `sched` at `priority`.
pub fn gated_write(
    sched: &Scheduler,
    priority: Priority,
    path: impl AsRef<Path>,
    data: &[u8],
) -> io::Result<()> {
    let _permit = sched.acquire(priority).map_err(io_err)?;
    std::fs::write(path, data)
}

/// A file (or any `Read`/`Write`/`Seek`) whose every operation holds one
/// [`Scheduler`] permit for exactly its duration, so that all processes
/// sharing the scheduler have at most `max` operations in flight.
#[derive(Debug)]
pub struct Gated<T> {
    inner: T,
    sched: Scheduler,
    priority: Priority,
}

/// A [`Gated`] file.
pub type GatedFile = Gated<File>;

impl Gated<File> {
    /// Opens `path` for reading, the open itself under a permit.
    pub fn open(
        sched: &Scheduler,
        priority: Priority,
        path: impl AsRef<Path>,
    ) -> io::Result<GatedFile> {
        let f = {
            let _permit = sched.acquire(priority).map_err(io_err)?;
            File::open(path)?
        };
        Ok(Gated::new(f, sched, priority))
    }

    /// Creates (or truncates) `path` for writing, under a permit.
    pub fn create(
        sched: &Scheduler,
        priority: Priority,
        path: impl AsRef<Path>,
    ) -> io::Result<GatedFile> {
        let f = {
            let _permit = sched.acquire(priority).map_err(io_err)?;
            File::create(path)?
        };
        Ok(Gated::new(f, sched, priority))
    }

    /// `fsync` under a permit.
    pub fn sync_all(&self) -> io::Result<()> {
        let _permit = self.sched.acquire(self.priority).map_err(io_err)?;
        self.inner.sync_all()
    }
}

impl<T> Gated<T> {
    /// Wraps `inner`; its operations will run under permits of `sched` at
    /// `priority`.
    pub fn new(inner: T, sched: &Scheduler, priority: Priority) -> Gated<T> {
        Gated {
            inner,
            sched: sched.clone(),
            priority,
        }
    }

    /// The wrapped value.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// Unwraps the value.
    pub fn into_inner(self) -> T {
        self.inner
    }
}

impl<T: Read> Read for Gated<T> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let _permit = self.sched.acquire(self.priority).map_err(io_err)?;
        self.inner.read(buf)
    }
}

impl<T: Write> Write for Gated<T> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _permit = self.sched.acquire(self.priority).map_err(io_err)?;
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        let _permit = self.sched.acquire(self.priority).map_err(io_err)?;
        self.inner.flush()
    }
}

impl<T: Seek> Seek for Gated<T> {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        // A seek is a cheap syscall with no I/O: not gated.
        self.inner.seek(pos)
    }
}

#[cfg(feature = "tokio")]
pub use self::tokio_io::{AsyncLimitedReader, AsyncLimitedWriter};

/// Tokio `AsyncRead`/`AsyncWrite` adapters (feature `tokio`).
#[cfg(feature = "tokio")]
mod tokio_io {
    use std::future::Future;
    use std::io;
    use std::pin::Pin;
    use std::task::{ready, Context, Poll};

    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

    use super::{io_err, max_chunk};
    use crate::limiter::{Consume, Limiter};
    use crate::priority::Priority;

    impl Limiter {
        /// Wraps `inner` in an [`AsyncLimitedReader`] charging this limiter
        /// one token per byte at `priority` (feature `tokio`).
        pub fn async_reader<R>(&self, inner: R, priority: Priority) -> AsyncLimitedReader<R> {
            AsyncLimitedReader {
                inner,
                lim: self.clone(),
                priority,
                held: Vec::new(),
                pos: 0,
                pending: None,
                owed: 0,
                settling: false,
            }
        }

        /// Wraps `inner` in an [`AsyncLimitedWriter`] charging this limiter
        /// one token per byte at `priority` (feature `tokio`).
        pub fn async_writer<W>(&self, inner: W, priority: Priority) -> AsyncLimitedWriter<W> {
            AsyncLimitedWriter {
                inner,
                acct: Credit {
                    lim: self.clone(),
                    priority,
                    credit: 0,
                },
                pending: None,
            }
        }
    }

    /// Polls a stored charge; `Ready(Ok(()))` once it is charged (or if
    /// there is none).
    fn poll_charge(pending: &mut Option<Consume>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(f) = pending.as_mut() {
            let r = ready!(Pin::new(f).poll(cx));
            *pending = None;
            r.map_err(io_err)?;
        }
        Poll::Ready(Ok(()))
    }

    /// An `AsyncRead` throttled by a [`Limiter`] (feature `tokio`).
    ///
    /// Charges exactly the bytes read, after reading them: a read goes into
    /// an internal buffer (at most a quarter of the capacity), the pending
    /// charge is kept in the adapter, and the bytes are handed out once it
    /// completes. End of file costs nothing. Dropping the adapter with a
    /// charge pending cancels it (those bytes were read but are dropped).
    ///
    /// If the charge fails (a disposed limiter, a forked child), the bytes
    /// already read are still handed out, as [`LimitedReader`](super::LimitedReader)
    /// does: the charge is owed, retried before anything more is read, and
    /// its failure is what the next read reports.
    #[derive(Debug)]
    pub struct AsyncLimitedReader<R> {
        inner: R,
        lim: Limiter,
        priority: Priority,
        /// Bytes read from `inner`; `held[pos..]` not yet handed out.
        held: Vec<u8>,
        pos: usize,
        /// The charge in progress: for `held`, or (`settling`) for `owed`.
        pending: Option<Consume>,
        /// Bytes handed out whose charge failed, to be charged before the
        /// next read from `inner`.
        owed: usize,
        /// Whether `pending` is the charge of `owed`.
        settling: bool,
    }

    impl<R> AsyncLimitedReader<R> {
        /// The inner reader.
        pub fn get_ref(&self) -> &R {
            &self.inner
        }

        /// The inner reader, mutably (bytes read through it are not charged).
        pub fn get_mut(&mut self) -> &mut R {
            &mut self.inner
        }

        /// Unwraps the inner reader (bytes read ahead but not handed out
        /// are lost).
        pub fn into_inner(self) -> R {
            self.inner
        }
    }

    impl<R: AsyncRead + Unpin> AsyncRead for AsyncLimitedReader<R> {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            loop {
                let charged = ready!(poll_charge(&mut this.pending, cx));
                let settled = std::mem::take(&mut this.settling);
                match charged {
                    Ok(()) if settled => this.owed = 0,
                    Ok(()) => {}
                    // The owed charge failed again: report it; nothing more
                    // is read until it succeeds.
                    Err(e) if settled => return Poll::Ready(Err(e)),
                    // The bytes are read: hand them out below, never drop
                    // them; their charge is owed.
                    Err(_) => this.owed += this.held.len() - this.pos,
                }
                if this.pos < this.held.len() {
                    let k = (this.held.len() - this.pos).min(buf.remaining());
                    buf.put_slice(&this.held[this.pos..this.pos + k]);
                    this.pos += k;
                    return Poll::Ready(Ok(()));
                }
                if buf.remaining() == 0 {
                    return Poll::Ready(Ok(()));
                }
                if this.owed > 0 {
                    this.pending = Some(this.lim.consume_async(this.owed as u64, this.priority));
                    this.settling = true;
                    continue;
                }
                let k = buf.remaining().min(max_chunk(&this.lim));
                this.held.resize(k, 0);
                this.pos = 0;
                let mut rb = ReadBuf::new(&mut this.held[..k]);
                let r = Pin::new(&mut this.inner).poll_read(cx, &mut rb);
                let n = rb.filled().len();
                this.held.truncate(n);
                if let Poll::Ready(Err(e)) = r {
                    return Poll::Ready(Err(e));
                }
                if r.is_pending() && n == 0 {
                    return Poll::Pending;
                }
                if n == 0 {
                    return Poll::Ready(Ok(())); // end of file
                }
                this.pending = Some(this.lim.consume_async(n as u64, this.priority));
            }
        }
    }

    /// An `AsyncWrite` throttled by a [`Limiter`] (feature `tokio`).
    ///
    /// Charges before writing (at most a quarter of the smallest rate or
    /// capacity along the chain at a time); the pending charge is kept in
    /// the adapter across polls, and bytes charged but not taken by a short
    /// write are credit for the next write. Dropping the adapter with a
    /// charge pending cancels it; credit left unused when a write fails or
    /// the adapter is dropped (or unwrapped) is given back.
    #[derive(Debug)]
    pub struct AsyncLimitedWriter<W> {
        inner: W,
        acct: Credit,
        /// A charge in progress and its size.
        pending: Option<Consume>,
    }

    /// Tokens an [`AsyncLimitedWriter`] charged and has not written yet,
    /// given back when dropped (kept apart from the inner writer so that
    /// `into_inner` can move it out).
    #[derive(Debug)]
    struct Credit {
        lim: Limiter,
        priority: Priority,
        /// Bytes charged but not yet written.
        credit: usize,
    }

    impl Credit {
        fn give_back(&mut self) {
            if self.credit > 0 {
                self.lim
                    .refund(std::mem::take(&mut self.credit) as u64, self.priority);
            }
        }
    }

    impl Drop for Credit {
        fn drop(&mut self) {
            self.give_back();
        }
    }

    impl<W> AsyncLimitedWriter<W> {
        /// The inner writer.
        pub fn get_ref(&self) -> &W {
            &self.inner
        }

        /// The inner writer, mutably (bytes written through it are not
        /// charged).
        pub fn get_mut(&mut self) -> &mut W {
            &mut self.inner
        }

        /// Unwraps the inner writer (unused credit is given back).
        pub fn into_inner(self) -> W {
            self.inner
        }
    }

    impl<W: AsyncWrite + Unpin> AsyncWrite for AsyncLimitedWriter<W> {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let this = self.get_mut();
            if buf.is_empty() {
                return Pin::new(&mut this.inner).poll_write(cx, buf);
            }
            let a = &mut this.acct;
            if a.credit == 0 {
                if this.pending.is_none() {
                    let k = buf.len().min(max_chunk(&a.lim));
                    this.pending = Some(a.lim.consume_async(k as u64, a.priority));
                }
                let k = this.pending.as_ref().map_or(0, |f| f.tokens() as usize);
                ready!(poll_charge(&mut this.pending, cx))?;
                a.credit = k;
            }
            let k = buf.len().min(a.credit);
            match ready!(Pin::new(&mut this.inner).poll_write(cx, &buf[..k])) {
                Ok(n) => {
                    a.credit -= n.min(k);
                    Poll::Ready(Ok(n))
                }
                Err(e) => {
                    // Nothing of the failed write moved: its tokens go back.
                    a.give_back();
                    Poll::Ready(Err(e))
                }
            }
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_flush(cx)
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
        }
    }
}
