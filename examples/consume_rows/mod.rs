//! What `consume_cost.rs` and `consume_call.rs` share: the limiters of
//! each row, `governor`'s loop, the modes and the `wall` timing; each
//! example brings its own consume loops ([`Loops`]), so that whether the
//! compiler inlines `consume` into them depends on that example alone.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Instant;

use shmsched::limiter::Limiter;
use shmsched::region::Region;

/// The rate of every row: the highest, so nothing ever waits.
pub const RATE: u64 = i32::MAX as u64;

type Gov = governor::DefaultDirectRateLimiter;

/// `n` checks of `governor`'s direct limiter.
#[inline(never)]
pub fn calls_governor(gov: &Gov, n: u64) {
    for _ in 0..n {
        let _ = black_box(gov.check());
    }
}

/// The rows, in the order they are printed.
const ROWS: [&str; 5] = ["local", "shared", "try", "child", "governor"];

/// The consume loops of the example that runs the rows: how its rows call
/// `consume` and `try_consume`.
pub struct Loops {
    /// `n` consumes of 1 token at `Priority::Normal`.
    pub consume: fn(&Limiter, u64),
    /// `n` `try_consume`s of 1 token.
    pub try_consume: fn(&Limiter, u64),
}

/// The example's `main`: the mode and count from the command line (see
/// `consume_cost.rs`).
pub fn main(loops: Loops) -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "shared".into());
    let region = Region::anonymous()?;
    if mode == "wall" {
        let rounds: usize = args.next().map_or(Ok(300), |a| a.parse())?;
        return wall(&region, &loops, rounds);
    }
    let n: u64 = args.next().map_or(Ok(200_000), |a| a.parse())?;
    if mode == "other" {
        let l = Limiter::new(RATE)?;
        (loops.consume)(&l, 1); // the main thread owns the counters now
        let t = Instant::now();
        std::thread::scope(|s| s.spawn(|| (loops.consume)(&l, n)).join())
            .map_err(|_| "the consuming thread panicked")?;
        let ns = t.elapsed().as_nanos() as f64 / n as f64;
        println!("{mode}: {n} calls, {ns:.1} ns/call (wall, with a thread start)");
        return Ok(());
    }
    let run = row(&region, &loops, &mode)?;
    let t = Instant::now();
    run(n);
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    println!("{mode}: {n} calls, {ns:.1} ns/call (wall; meaningless under valgrind)");
    Ok(())
}

/// A row's loop: `k` calls.
type Run = Box<dyn Fn(u64)>;

/// The loop of one row, on limiters made now.
fn row(region: &Region, loops: &Loops, mode: &str) -> Result<Run, Box<dyn std::error::Error>> {
    let (consume, try_consume) = (loops.consume, loops.try_consume);
    Ok(match mode {
        "local" => {
            let l = Limiter::new(RATE)?;
            Box::new(move |k| consume(&l, k))
        }
        "shared" => {
            let l = Limiter::shared(region, RATE)?;
            Box::new(move |k| consume(&l, k))
        }
        "child" => {
            let c = Limiter::shared(region, RATE)?.child(RATE)?;
            Box::new(move |k| consume(&c, k))
        }
        "try" => {
            let l = Limiter::shared(region, RATE)?;
            Box::new(move |k| try_consume(&l, k))
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
fn wall(region: &Region, loops: &Loops, rounds: usize) -> Result<(), Box<dyn std::error::Error>> {
    const BATCH: u64 = 20_000;
    let runs = ROWS
        .iter()
        .map(|m| row(region, loops, m))
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
