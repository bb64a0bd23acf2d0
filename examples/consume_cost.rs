//! Uncontended limiter consumes in a loop, for counting instructions per
//! call (`valgrind --tool=callgrind --toggle-collect='*consume_cost*calls*'`):
//! the fast path of `Limiter::consume` in-process, shared through a region,
//! through a child of a shared root, `try_consume` shared, and `governor`'s
//! direct limiter `check`, all at the highest rate (nothing ever waits).
//! The count per call includes the call and the loop.
//!
//! ```sh
//! cargo build --profile bench --example consume_cost
//! for m in local shared child try governor; do
//!   valgrind --tool=callgrind --toggle-collect='*consume_cost*calls*' \
//!     --callgrind-out-file=/tmp/cg.$m target/release/examples/consume_cost $m 200000
//! done
//! # instructions per call: the "summary" line of each file over 200,000
//! ```

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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "shared".into());
    let n: u64 = args.next().map_or(Ok(200_000), |a| a.parse())?;
    let region = Region::anonymous()?;
    let run: Box<dyn Fn(u64)> = match mode.as_str() {
        "local" => {
            let l = Limiter::new(RATE)?;
            Box::new(move |k| calls_consume(&l, k))
        }
        "shared" => {
            let l = Limiter::shared(&region, RATE)?;
            Box::new(move |k| calls_consume(&l, k))
        }
        "child" => {
            let c = Limiter::shared(&region, RATE)?.child(RATE)?;
            Box::new(move |k| calls_consume(&c, k))
        }
        "try" => {
            let l = Limiter::shared(&region, RATE)?;
            Box::new(move |k| calls_try(&l, k))
        }
        "governor" => {
            let q = governor::Quota::per_second(NonZeroU32::new(RATE as u32).expect("nonzero"));
            let g = governor::RateLimiter::direct(q);
            Box::new(move |k| calls_governor(&g, k))
        }
        m => return Err(format!("mode {m:?}: one of local, shared, child, try, governor").into()),
    };
    let t = Instant::now();
    run(n);
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    println!("{mode}: {n} calls, {ns:.1} ns/call (wall; meaningless under valgrind)");
    Ok(())
}
