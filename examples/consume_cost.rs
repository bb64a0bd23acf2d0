//! Uncontended limiter consumes in a loop, for counting instructions per
//! call (`valgrind --tool=callgrind --toggle-collect='*consume_cost*calls*'`):
//! the fast path of `Limiter::consume` in-process, shared through a region,
//! through a child of a shared root, `try_consume` shared, and `governor`'s
//! direct limiter `check`, all at the highest rate (nothing ever waits).
//! The count per call includes the call and the loop. Mode `other` (not in
//! `wall`) is the in-process consume by a thread that does not own the
//! handle's counters (`src/limiter/tally.rs`): the main thread claims them
//! first.
//!
//! ```sh
//! cargo build --profile bench --example consume_cost
//! for m in local shared child try governor other; do
//!   valgrind --tool=callgrind --toggle-collect='*consume_cost*calls*' \
//!     --callgrind-out-file=/tmp/cg.$m target/release/examples/consume_cost $m 200000
//! done
//! # instructions per call: the "summary" line of each file over 200,000
//! target/release/examples/consume_cost wall 300   # wall clock, all rows
//! ```
//!
//! `wall R` times every row in one process, interleaved: R rounds of a
//! batch of 20,000 calls per row, and prints per row the fastest batch
//! and the median (ns per call) and their ratio to `governor`'s. The
//! fastest batch is the one no other job preempted, which on a loaded
//! machine is the figure that repeats.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Instant;

use shmsched::limiter::Limiter;
use shmsched::region::Region;
use shmsched::Priority;

const RATE: u64 = i32::MAX as u64;

/// `n` consumes of 1 token through `lim`.
#[inline(never)]
fn calls_consume(lim: &Limiter, n: u64) {
    for _ in 0..n {
        black_box(
            lim.consume(black_box(1), Priority::Normal)
                .expect("consume"),
        );
    }
}

/// `n` `try_consume`s of 1 token through `lim`.
#[inline(never)]
fn calls_try(lim: &Limiter, n: u64) {
    for _ in 0..n {
        black_box(lim.try_consume(black_box(1)).expect("try_consume"));
    }
}

type Gov = governor::DefaultDirectRateLimiter;

/// `n` checks of `governor`'s direct limiter.
#[inline(never)]
fn calls_governor(gov: &Gov, n: u64) {
    for _ in 0..n {
        let _ = black_box(gov.check());
    }
}

/// The rows, in the order they are printed.
const ROWS: [&str; 5] = ["local", "shared", "try", "child", "governor"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "shared".into());
    let region = Region::anonymous()?;
    if mode == "wall" {
        let rounds: usize = args.next().map_or(Ok(300), |a| a.parse())?;
        return wall(&region, rounds);
    }
    let n: u64 = args.next().map_or(Ok(200_000), |a| a.parse())?;
    if mode == "other" {
        let l = Limiter::new(RATE)?;
        calls_consume(&l, 1); // the main thread owns the counters now
        let t = Instant::now();
        std::thread::scope(|s| s.spawn(|| calls_consume(&l, n)).join())
            .map_err(|_| "the consuming thread panicked")?;
        let ns = t.elapsed().as_nanos() as f64 / n as f64;
        println!("{mode}: {n} calls, {ns:.1} ns/call (wall, with a thread start)");
        return Ok(());
    }
    let run = row(&region, &mode)?;
    let t = Instant::now();
    run(n);
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    println!("{mode}: {n} calls, {ns:.1} ns/call (wall; meaningless under valgrind)");
    Ok(())
}

/// A row's loop: `k` calls.
type Run = Box<dyn Fn(u64)>;

/// The loop of one row, on limiters made now.
fn row(region: &Region, mode: &str) -> Result<Run, Box<dyn std::error::Error>> {
    Ok(match mode {
        "local" => {
            let l = Limiter::new(RATE)?;
            Box::new(move |k| calls_consume(&l, k))
        }
        "shared" => {
            let l = Limiter::shared(region, RATE)?;
            Box::new(move |k| calls_consume(&l, k))
        }
        "child" => {
            let c = Limiter::shared(region, RATE)?.child(RATE)?;
            Box::new(move |k| calls_consume(&c, k))
        }
        "try" => {
            let l = Limiter::shared(region, RATE)?;
            Box::new(move |k| calls_try(&l, k))
        }
        "governor" => {
            let q = governor::Quota::per_second(NonZeroU32::new(RATE as u32).expect("nonzero"));
            let g = governor::RateLimiter::direct(q);
            Box::new(move |k| calls_governor(&g, k))
        }
        m => {
            return Err(format!(
                "mode {m:?}: one of local, shared, child, try, governor, other, wall"
            )
            .into())
        }
    })
}

/// Every row, interleaved, `rounds` batches each (see the module docs).
fn wall(region: &Region, rounds: usize) -> Result<(), Box<dyn std::error::Error>> {
    const BATCH: u64 = 20_000;
    let runs = ROWS
        .iter()
        .map(|m| row(region, m))
        .collect::<Result<Vec<_>, _>>()?;
    let mut times = vec![Vec::with_capacity(rounds); ROWS.len()];
    for _ in 0..rounds {
        for (run, t) in runs.iter().zip(&mut times) {
            let t0 = Instant::now();
            run(BATCH);
            t.push(t0.elapsed().as_nanos() as f64 / BATCH as f64);
        }
    }
    let stat = |t: &mut Vec<f64>| {
        t.sort_by(f64::total_cmp);
        (t[0], t[t.len() / 2])
    };
    let stats: Vec<(f64, f64)> = times.iter_mut().map(stat).collect();
    let (gmin, gmed) = stats[ROWS.len() - 1];
    println!("row        fastest  median   (ns/call; ratio to governor's)");
    for (m, (min, med)) in ROWS.iter().zip(&stats) {
        println!(
            "{m:<9} {min:7.2} {med:7.2}   ({:.2}, {:.2})",
            min / gmin,
            med / gmed
        );
    }
    Ok(())
}
