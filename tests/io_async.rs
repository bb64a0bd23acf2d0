//! Tokio `AsyncRead`/`AsyncWrite` adapters throttled by a Limiter (feature
//! `tokio`): rates, exact charges, cancellation.
#![cfg(feature = "tokio")]

mod region_util;

use std::time::{Duration, Instant};

use region_util::{fork_child, wait_child, Exit};
use shmsched::limiter::Limiter;
use shmsched::region::Region;
use shmsched::Priority;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const RATE: u64 = 100_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_writer_holds_the_rate() {
    let lim = Limiter::new(RATE).unwrap();
    let data = vec![5u8; 250_000];
    let t = Instant::now();
    let mut w = lim.async_writer(Vec::new(), Priority::Normal);
    w.write_all(&data).await.unwrap();
    w.flush().await.unwrap();
    let e = t.elapsed();
    assert_eq!(w.into_inner(), data);
    // 100 000 in the full bucket, 150 000 refilled at 100 000/s.
    assert!(e >= Duration::from_millis(1_300), "{e:?}");
    assert!(e < Duration::from_millis(2_500), "{e:?}");
    assert_eq!(lim.stats().pending, 0);
}

#[tokio::test]
async fn async_reader_holds_the_rate_and_returns_every_byte() {
    let lim = Limiter::new(RATE).unwrap();
    let data: Vec<u8> = (0..250_000u32).map(|i| (i % 251) as u8).collect();
    let t = Instant::now();
    let mut r = lim.async_reader(&data[..], Priority::High);
    let mut out = Vec::new();
    r.read_to_end(&mut out).await.unwrap();
    let e = t.elapsed();
    assert_eq!(out, data);
    assert!(e >= Duration::from_millis(1_300), "{e:?}");
    assert!(e < Duration::from_millis(2_500), "{e:?}");
}

#[tokio::test]
async fn charges_are_exact() {
    let lim = Limiter::new(1_000_000).unwrap();
    let mut r = lim.async_reader(&[1u8; 1_234][..], Priority::Normal);
    let mut out = Vec::new();
    r.read_to_end(&mut out).await.unwrap();
    assert_eq!(out.len(), 1_234);
    let t = lim.tokens().unwrap();
    assert!(
        (1_000_000 - 1_234..1_000_000 - 1_234 + 500).contains(&t),
        "{t}"
    );

    let lim = Limiter::new(1_000_000).unwrap();
    let mut w = lim.async_writer(Vec::new(), Priority::Low);
    w.write_all(&[2u8; 4_321]).await.unwrap();
    let t = lim.tokens().unwrap();
    assert!(
        (1_000_000 - 4_321..1_000_000 - 4_321 + 500).contains(&t),
        "{t}"
    );
}

#[tokio::test]
async fn copy_between_adapters() {
    let lim = Limiter::new(RATE).unwrap();
    let data = vec![9u8; 50_000];
    let mut r = lim.async_reader(&data[..], Priority::Normal);
    let mut w = lim
        .child(RATE)
        .unwrap()
        .async_writer(Vec::new(), Priority::Normal);
    let n = tokio::io::copy(&mut r, &mut w).await.unwrap();
    assert_eq!(n, 50_000);
    assert_eq!(w.into_inner(), data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_write_leaves_no_waiter() {
    let lim = Limiter::new(10_000).unwrap();
    lim.consume(10_000, Priority::Normal).unwrap(); // drained
    let mut w = lim.async_writer(Vec::new(), Priority::Normal);
    let r = tokio::time::timeout(Duration::from_millis(50), w.write_all(&[0u8; 2_000])).await;
    assert!(r.is_err());
    drop(w);
    let s = lim.stats();
    assert_eq!(s.pending, 0);
    assert_eq!(s.total.cancelled, 1);
    assert_eq!(s.total.deferred, s.total.completed);
}

/// When the charge after a read fails (here: the limiter handle is used in
/// a forked child, where it refuses to charge), the bytes already read are
/// still handed out, as the blocking reader does; the next read reports
/// the failure without reading more. (A plain test: it forks, and the
/// child drives the adapter with `futures`' executor, no runtime threads.)
#[test]
fn async_reader_drops_no_byte_when_a_charge_fails() {
    let region = Region::anonymous().unwrap();
    let lim = Limiter::shared(&region, 1_000_000).unwrap();
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
    let pid = fork_child(move || {
        futures::executor::block_on(async {
            let mut r = lim.async_reader(&data[..], Priority::Normal);
            let mut got = vec![0u8; 4096];
            let n = match r.read(&mut got).await {
                Ok(n) => n,
                Err(e) => {
                    let read = data.len() - r.get_ref().len();
                    eprintln!("first read failed after reading {read} bytes: {e}");
                    return 1;
                }
            };
            let consumed = data.len() - r.get_ref().len();
            if n == 0 || n != consumed || got[..n] != data[..n] {
                eprintln!("read {consumed} bytes from the source, handed out {n}");
                return 2;
            }
            // The failed charge is reported now, and nothing more is read;
            // and again on the read after (the charge is still owed).
            for attempt in 0..2 {
                match r.read(&mut got).await {
                    Err(_) if data.len() - r.get_ref().len() == consumed => {}
                    other => {
                        eprintln!(
                            "read #{attempt} after the failed charge: {other:?}, source at {}",
                            data.len() - r.get_ref().len()
                        );
                        return 3;
                    }
                }
            }
            0
        })
    });
    assert_eq!(wait_child(pid, Duration::from_secs(30)), Exit::Code(0));
}

/// An `AsyncWrite` that takes `room` bytes in all, then fails.
struct FailingAsync {
    room: usize,
}

impl tokio::io::AsyncWrite for FailingAsync {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.room == 0 {
            return std::task::Poll::Ready(Err(std::io::Error::other("disk full")));
        }
        let n = buf.len().min(self.room);
        self.room -= n;
        std::task::Poll::Ready(Ok(n))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// The bucket word: its growth is the tokens charged, exactly, while the
/// bucket is not full.
fn word(l: &Limiter) -> i64 {
    let s = l.stats();
    s.clock as i64 + i64::from(s.tokens_per_second) - s.tokens
}

#[tokio::test]
async fn a_failing_async_writer_gives_its_credit_back() {
    // The issue: 20,000 tokens charged for 1,000 bytes written.
    let lim = Limiter::new(200_000).unwrap();
    lim.consume(100_000, Priority::Normal).unwrap();
    let before = word(&lim);
    let mut w = lim.async_writer(FailingAsync { room: 1_000 }, Priority::Normal);
    let err = w.write_all(&[3u8; 20_000]).await.unwrap_err();
    assert_eq!(err.to_string(), "disk full");
    assert_eq!(word(&lim) - before, 1_000);

    // Credit left by a short write is given back when the adapter goes.
    let before = word(&lim);
    let mut w = lim.async_writer(FailingAsync { room: 300 }, Priority::Normal);
    assert_eq!(w.write(&[3u8; 20_000]).await.unwrap(), 300);
    assert_eq!(word(&lim) - before, 20_000, "charged before writing");
    drop(w);
    assert_eq!(word(&lim) - before, 300);
}

#[tokio::test]
async fn async_charges_are_bounded_by_the_chain() {
    let root = Limiter::with_capacity(1_000_000, 1_000).unwrap();
    let child = root.child(2_000_000_000).unwrap();
    let mut r = child.async_reader(&[9u8; 5_000][..], Priority::Normal);
    let mut buf = vec![0u8; 5_000];
    let n = r.read(&mut buf).await.unwrap();
    assert!(n <= 250, "{n}");
    assert_eq!(root.stats().forced, 0);
}
