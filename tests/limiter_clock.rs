//! The limiter region's clock: the creator's TSC calibration is stored in
//! the region and every handle and process uses that same one; a corrupted
//! stored calibration is refused as a bad region.

mod procs;

use std::os::unix::fs::FileExt;

use procs::{say, spawn, wait_parent};
use shmsched::limiter::Limiter;
use shmsched::region::Region;
use shmsched::sys::clock::{tsc_reliable, Clock};
use shmsched::{Error, Priority};

const ENTRY: &str = "child_entry";

/// Byte offset of the stored clock words in the limiter's object area.
/// Byte offset, in the object area, of the stored clock (the "TSC in use"
/// flag, then tsc0, ns0, mult, shift) in the first parameter slot: the wait
/// registry (1,408 bytes), the state and counter lines (128 each), the
/// parameter block's head line (128), then the slot's gen, rate, capacity
/// and clock base (40 bytes).
const CLOCK_OFF: u64 = 1408 + 128 + 128 + 128 + 40;

fn path_of(name: &str) -> String {
    format!("/dev/shm/shmsched.{name}")
}

struct Cleanup(String);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Region::remove(&self.0);
    }
}

/// Entry point of the child processes (does nothing in a normal test run).
#[test]
fn child_entry() {
    let Some((role, args)) = procs::role() else {
        return;
    };
    match role.as_str() {
        "calibration" => {
            let region = Region::open(&args[0]).expect("open region");
            let lim = Limiter::attach(&region).expect("attach");
            lim.consume(1, Priority::Normal).expect("consume");
            let tsc = lim.stats().shared.expect("shared").tsc;
            say(&format!("tsc {tsc:?}"));
            wait_parent();
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn every_handle_and_process_uses_the_stored_calibration() {
    let name = procs::unique_name("limclk");
    let _c = Cleanup(name.clone());
    let region = Region::create(&name).unwrap();
    let a = Limiter::shared(&region, 1000).unwrap();
    let tsc = a.stats().shared.unwrap().tsc;
    assert_eq!(tsc.is_some(), tsc_reliable(), "{tsc:?}");
    let region2 = Region::open(&name).unwrap();
    let b = Limiter::attach(&region2).unwrap();
    assert_eq!(b.stats().shared.unwrap().tsc, tsc);
    // The process's own clock is a different calibration (or none).
    if let (Some(mine), Some(stored)) = (Clock::process().tsc(), tsc) {
        assert!(mine.tsc0 != stored.tsc0 || mine == stored);
    }
    let mut kid = spawn(ENTRY, "calibration", &[path_of(&name)]);
    let line = kid.expect_line("tsc");
    assert_eq!(line, format!("{tsc:?}"));
    kid.send("bye");
    assert!(kid.finish().success());
    // Both handles charge one bucket on one clock.
    a.consume(500, Priority::Normal).unwrap();
    b.consume(400, Priority::Normal).unwrap();
    let left = a.tokens().unwrap();
    assert!((99..=110).contains(&left), "{left}");
}

#[test]
fn a_corrupted_stored_calibration_is_a_bad_region() {
    let name = procs::unique_name("limclk");
    let _c = Cleanup(name.clone());
    let region = Region::create(&name).unwrap();
    let lim = Limiter::shared(&region, 1000).unwrap();
    let off = region.info().unwrap().unwrap().object_offset + CLOCK_OFF;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path_of(&name))
        .unwrap();
    let mut orig = [0u8; 40];
    f.read_exact_at(&mut orig, off).unwrap();
    let attach = || {
        let r = Region::open(&name).unwrap();
        Limiter::attach(&r).map(|_| ())
    };
    attach().unwrap();
    let word = |i: u64, v: u64| f.write_all_at(&v.to_ne_bytes(), off + 8 * i).unwrap();
    // A flag that is neither 0 nor 1.
    word(0, 7);
    let e = attach().unwrap_err();
    assert!(matches!(e, Error::BadRegion(_)), "{e:?}");
    assert!(e.to_string().contains("flag 7"), "{e}");
    // A TSC calibration in use with a zero multiplier or a huge shift.
    for (i, v) in [(3, 0), (4, 64), (4, u64::MAX)] {
        f.write_all_at(&orig, off).unwrap();
        word(0, 1);
        word(i, v);
        let e = attach().unwrap_err();
        assert!(matches!(e, Error::BadRegion(_)), "word {i} = {v}: {e:?}");
        assert!(e.to_string().contains("clock"), "{e}");
    }
    // Restored, it attaches again; the handle bound before still works.
    f.write_all_at(&orig, off).unwrap();
    attach().unwrap();
    lim.consume(1, Priority::Normal).unwrap();
}

/// A TSC calibration that no longer agrees with CLOCK_MONOTONIC (the TSC
/// stopped or jumped: a VM restore, a resume) must not freeze the bucket:
/// the region moves to CLOCK_MONOTONIC, for every process, and keeps its
/// tokens (no jump in the virtual clock).
#[test]
fn a_tsc_that_no_longer_agrees_moves_the_region_to_monotonic() {
    if !shmsched::sys::clock::tsc_reliable() {
        eprintln!("skipped: this machine does not use a reliable TSC");
        return;
    }
    for (i, v) in [(2u64, 1u64), (1, u64::MAX)] {
        let name = procs::unique_name("limclk-demote");
        let _c = Cleanup(name.clone());
        let region = Region::create(&name).unwrap();
        let made = std::time::Instant::now();
        let lim = Limiter::shared(&region, 1000).unwrap();
        assert!(lim.stats().shared.unwrap().tsc.is_some());
        lim.consume(600, Priority::Normal).unwrap();
        let off = region.info().unwrap().unwrap().object_offset + CLOCK_OFF;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path_of(&name))
            .unwrap();
        // ns0 far in the past (a TSC that stopped), or tsc0 in the future
        // (a TSC that went backwards).
        f.write_all_at(&v.to_ne_bytes(), off + 8 * i).unwrap();
        let r = Region::open(&name).unwrap();
        let other = Limiter::attach(&r).unwrap();
        assert_eq!(other.stats().shared.unwrap().tsc, None, "word {i} = {v}");
        assert_eq!(
            lim.stats().shared.unwrap().tsc,
            None,
            "seen by the first handle"
        );
        // The balance went on from where it was (400 left, refilling). A
        // clock that stopped or went backwards cannot say how long it ran:
        // the re-based clock goes on from the old one's reading, which
        // saturates at its base (the bucket's making), so the refill of
        // the time since then may be lost (never granted twice), a token
        // per millisecond at 1,000/s: on a loaded machine 2 ms passed
        // between the making and the consume.
        let t = lim.tokens().unwrap();
        let lost = made.elapsed().as_millis() as i64 + 1;
        assert!(
            (400 - lost..=1000).contains(&t),
            "word {i} = {v}: {t} ({lost} ms since the bucket was made)"
        );
        // And it still refills on the new clock.
        other.consume(1000, Priority::Normal).unwrap();
        let t0 = std::time::Instant::now();
        other.consume(100, Priority::Normal).unwrap();
        assert!(t0.elapsed() >= std::time::Duration::from_millis(60));
    }
}
