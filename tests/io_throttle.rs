//! Throttled and gated I/O: byte-identical output through every adapter,
//! exact charging, a throttled copy taking about N/R, and file operations
//! gated by a scheduler.

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use shmsched::io::{copy, gated_read, gated_write, GatedFile};
use shmsched::limiter::Limiter;
use shmsched::scheduler::Scheduler;
use shmsched::Priority;

fn data(len: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x % 17 == 0 {
                b'\n'
            } else {
                x as u8
            }
        })
        .collect()
}

/// The bucket word: its growth is the bytes charged, exactly, while the
/// bucket does not fill up (see the limiter's accounting invariant).
fn word(l: &Limiter) -> i64 {
    let s = l.stats();
    s.clock as i64 + i64::from(s.tokens_per_second) - s.tokens
}

/// A writer that takes at most 7 bytes per call.
struct Dribble(Vec<u8>);
impl Write for Dribble {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len().min(7);
        self.0.extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn adapters_are_byte_identical_and_charge_exactly() {
    let src = data(300_000);
    // Capacity 50_000 < buffer sizes: charges are split.
    let l = Limiter::new(50_000).unwrap();
    let fast = Limiter::new(2_000_000_000).unwrap();

    // Read
    let mut out = Vec::new();
    fast.reader(&src[..], Priority::Low)
        .read_to_end(&mut out)
        .unwrap();
    assert_eq!(out, src);

    // BufRead: line by line, mixing read_until and read.
    let mut r = fast.reader(BufReader::with_capacity(4096, &src[..]), Priority::Normal);
    let mut out = Vec::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        if r.read_until(b'\n', &mut line).unwrap() == 0 {
            break;
        }
        out.extend_from_slice(&line);
        let mut b = [0u8; 3];
        let n = r.read(&mut b).unwrap();
        out.extend_from_slice(&b[..n]);
    }
    assert_eq!(out, src);

    // Write, with short writes underneath: credit carries over.
    let mid = Limiter::new(1_000_000).unwrap();
    mid.consume(1_000_000, Priority::Normal).unwrap(); // empty, as above
    let before = word(&mid);
    let mut w = mid.writer(Dribble(Vec::new()), Priority::High);
    w.write_all(&src).unwrap();
    w.flush().unwrap();
    assert_eq!(w.get_ref().0, src);
    let charged = word(&mid) - before;
    assert!(
        (src.len() as i64..=src.len() as i64 + 7).contains(&charged),
        "charged {charged} for {}",
        src.len()
    );

    // copy, on the slow limiter: exactly N charged.
    let small = &src[..60_000];
    l.consume(50_000, Priority::Normal).unwrap(); // empty: word moves by charges only
    let before = word(&l);
    let mut out = Vec::new();
    let n = copy(&mut &small[..], &mut out, &l, Priority::Normal).unwrap();
    assert_eq!((n, &out[..]), (60_000, small));
    assert_eq!(word(&l) - before, 60_000);
    assert_eq!(l.stats().forced, 0, "no charge above the capacity");
}

#[test]
fn a_throttled_copy_of_n_bytes_at_r_takes_about_n_over_r() {
    const N: usize = 300_000;
    const R: u64 = 200_000;
    let l = Limiter::new(R).unwrap();
    l.consume(R, Priority::Normal).unwrap(); // start empty
    let src = data(N);
    let mut out = Vec::with_capacity(N);
    let t = Instant::now();
    let n = copy(&mut &src[..], &mut out, &l, Priority::Normal).unwrap();
    let el = t.elapsed().as_secs_f64();
    assert_eq!(n as usize, N);
    assert_eq!(out, src);
    let expect = N as f64 / R as f64; // 1.5 s
    assert!(
        el > expect * 0.8 && el < expect * 1.6,
        "{el:.2}s vs {expect:.2}s"
    );
}

#[test]
fn throttled_readers_at_two_priorities_share_the_budget() {
    // Two copies at once under one limiter: together they get the rate.
    let l = Limiter::new(400_000).unwrap();
    l.consume(400_000, Priority::Normal).unwrap();
    let src = Arc::new(data(200_000));
    let t = Instant::now();
    let hs: Vec<_> = [Priority::High, Priority::Low]
        .into_iter()
        .map(|p| {
            let (l, src) = (l.clone(), src.clone());
            thread::spawn(move || {
                let mut out = Vec::new();
                l.reader(&src[..], p).read_to_end(&mut out).unwrap();
                assert_eq!(out, *src);
                Instant::now()
            })
        })
        .collect();
    let ends: Vec<Instant> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    let el = t.elapsed().as_secs_f64();
    // 400_000 bytes at 400_000/s: about a second in all.
    assert!(el > 0.8 && el < 1.8, "{el:.2}");
    // High finishes no later than Low (give or take one chunk of time).
    assert!(ends[0] <= ends[1] + Duration::from_millis(150));
}

#[test]
fn gated_file_operations_hold_a_permit_each() {
    let dir = std::env::temp_dir().join(format!("shmsched-io-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("f");
    let sched = Scheduler::new(1).unwrap();
    let src = data(10_000);
    gated_write(&sched, Priority::Normal, &path, &src).unwrap();
    assert_eq!(gated_read(&sched, Priority::High, &path).unwrap(), src);

    let mut f = GatedFile::create(&sched, Priority::Normal, dir.join("g")).unwrap();
    f.write_all(&src).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let mut f = GatedFile::open(&sched, Priority::Normal, dir.join("g")).unwrap();
    let mut back = Vec::new();
    f.read_to_end(&mut back).unwrap();
    assert_eq!(back, src);
    assert_eq!(sched.stats().running, 0);

    // While someone holds the only slot, a gated read waits for it.
    let permit = sched.acquire(Priority::Normal).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let h = {
        let (s, p, done) = (sched.clone(), path.clone(), done.clone());
        thread::spawn(move || {
            let v = gated_read(&s, Priority::Low, &p).unwrap();
            done.store(true, Ordering::SeqCst);
            v.len()
        })
    };
    thread::sleep(Duration::from_millis(100));
    assert!(
        !done.load(Ordering::SeqCst),
        "read went ahead without a slot"
    );
    drop(permit);
    assert_eq!(h.join().unwrap(), src.len());
    std::fs::remove_dir_all(&dir).unwrap();
}
