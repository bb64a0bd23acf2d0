//! What the throttled I/O adapters charge: never more than a quarter of the
//! smallest rate or capacity along the limiter's chain at once, and never
//! for bytes that did not move (a failing writer, bytes prepaid by
//! `fill_buf` and not consumed).

use std::io::{self, BufRead, Read, Write};

use shmsched::io::copy;
use shmsched::limiter::Limiter;
use shmsched::region::Region;
use shmsched::Priority;

/// The bucket word: its growth is the tokens charged, exactly, while the
/// bucket is not full (refill moves the clock and the balance alike).
fn word(l: &Limiter) -> i64 {
    let s = l.stats();
    s.clock as i64 + i64::from(s.tokens_per_second) - s.tokens
}

/// A reader over `data` that records the largest buffer it was handed.
struct Probe<'a> {
    data: &'a [u8],
    largest: usize,
}

impl Read for Probe<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.largest = self.largest.max(buf.len());
        self.data.read(buf)
    }
}

/// A writer that records the largest buffer it was handed and takes all.
#[derive(Default)]
struct Sink {
    out: Vec<u8>,
    largest: usize,
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.largest = self.largest.max(buf.len());
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A writer that takes `room` bytes in all, then fails.
struct Failing {
    room: usize,
}

impl Write for Failing {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.room == 0 {
            return Err(io::Error::other("disk full"));
        }
        let n = buf.len().min(self.room);
        self.room -= n;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

#[test]
fn a_charge_never_exceeds_a_quarter_of_the_burst() {
    // 1 MB/s with a 1,000-token burst: charges of at most 250 bytes, none
    // relying on the oversize rule's debt (the issue saw 64 KiB charges and
    // 16 forced per 400 kB).
    let lim = Limiter::with_capacity(1_000_000, 1_000).unwrap();
    let src = data(40_000);
    let mut r = lim.reader(
        Probe {
            data: &src,
            largest: 0,
        },
        Priority::Normal,
    );
    let mut out = Vec::new();
    r.read_to_end(&mut out).unwrap();
    assert_eq!(out, src);
    assert!(r.get_ref().largest <= 250, "{}", r.get_ref().largest);

    let mut w = lim.writer(Sink::default(), Priority::Normal);
    w.write_all(&src).unwrap();
    assert_eq!(w.get_ref().out, src);
    assert!(w.get_ref().largest <= 250, "{}", w.get_ref().largest);
    let mut sink = Sink::default();
    copy(&mut &src[..], &mut sink, &lim, Priority::Normal).unwrap();
    assert!(sink.largest <= 250, "{}", sink.largest);
    assert_eq!(lim.stats().forced, 0);
}

#[test]
fn a_charge_is_bounded_by_every_level_of_the_chain() {
    // A fast child of a slow root: the root's 10 kB/s bounds the charge.
    let root = Limiter::new(10_000).unwrap();
    let child = root.child(1_000_000).unwrap();
    let src = data(6_000);
    let mut r = child.reader(
        Probe {
            data: &src,
            largest: 0,
        },
        Priority::Normal,
    );
    let mut out = Vec::new();
    r.read_to_end(&mut out).unwrap();
    assert_eq!(out, src);
    assert!(r.get_ref().largest <= 2_500, "{}", r.get_ref().largest);

    // The same under a root shared through a region with a small burst.
    let region = Region::anonymous().unwrap();
    let shared = Limiter::shared_with_capacity(&region, 1_000_000, 4_000).unwrap();
    let child = shared.child(2_000_000_000).unwrap();
    let mut w = child.writer(Sink::default(), Priority::Normal);
    w.write_all(&data(20_000)).unwrap();
    assert!(w.get_ref().largest <= 1_000, "{}", w.get_ref().largest);
    assert_eq!(shared.stats().forced, 0);
}

#[test]
fn copy_into_a_failing_writer_costs_what_it_wrote() {
    // 200,000/s: charges of 50,000; half the bucket spent first so that the
    // bucket word counts charges exactly.
    let lim = Limiter::new(200_000).unwrap();
    lim.consume(100_000, Priority::Normal).unwrap();
    let before = word(&lim);
    let src = data(100_000);
    let err = copy(
        &mut &src[..],
        &mut Failing { room: 1_000 },
        &lim,
        Priority::Normal,
    )
    .unwrap_err();
    assert_eq!(err.to_string(), "disk full");
    assert_eq!(
        word(&lim) - before,
        1_000,
        "charged for bytes never written"
    );
}

#[test]
fn bytes_prepaid_by_fill_buf_and_never_consumed_are_refunded() {
    let lim = Limiter::new(200_000).unwrap();
    lim.consume(100_000, Priority::Normal).unwrap();
    let before = word(&lim);
    let src = data(30_000);
    let mut r = lim.reader(&src[..], Priority::Normal);
    assert_eq!(r.fill_buf().unwrap().len(), 30_000);
    r.consume(10);
    let mut two = [0u8; 2];
    r.read_exact(&mut two).unwrap();
    assert_eq!(
        word(&lim) - before,
        30_000,
        "fill_buf prepays what it shows"
    );
    drop(r);
    assert_eq!(
        word(&lim) - before,
        12,
        "only the bytes consumed stay charged"
    );

    // into_inner gives the prepayment back too.
    let before = word(&lim);
    let mut r = lim.reader(&src[..], Priority::Normal);
    r.fill_buf().unwrap();
    r.consume(5);
    let rest = r.into_inner();
    assert_eq!(rest.len(), 30_000 - 5);
    assert_eq!(word(&lim) - before, 5);
}
