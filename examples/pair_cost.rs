//! A `try_acquire` + release loop for counting instructions
//! (`valgrind --tool=callgrind --toggle-collect='*pair_cost*pairs*'`): the
//! fast path's cost per pair, on a plain shared scheduler of max 64 (no
//! second argument), with a cluster lease armed on its region far from its
//! deadline (`leased`), with a cap at the acquiring priority (`capped`:
//! `Concurrency::max(64).normal(32)`), through one in-process child of
//! the shared scheduler (`child`), or on an in-process root of max 64
//! (`local`). Per pair: the difference of an N- and a 2N-pair run, so
//! setup cancels.
//!
//! ```sh
//! cargo build --profile bench --example pair_cost
//! valgrind --tool=callgrind --toggle-collect='*pair_cost*pairs*' \
//!     target/release/examples/pair_cost 100000 [leased|capped|child|local]
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

use shmsched::region::Region;
use shmsched::scheduler::{Concurrency, Scheduler};
use shmsched::Priority;

/// `n` uncontended pairs.
#[inline(never)]
fn pairs(s: &Scheduler, n: u64) {
    for _ in 0..n {
        let p = s.try_acquire(Priority::Normal).expect("a free slot");
        black_box(&p);
        drop(p);
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().map_or(Ok(1_000_000), |a| a.parse())?;
    let mode = args.next().unwrap_or_else(|| "shared".into());
    let region = Region::anonymous()?;
    let shared = match mode.as_str() {
        "capped" => Scheduler::shared(&region, Concurrency::max(64).normal(32))?,
        _ => Scheduler::shared(&region, 64)?,
    };
    let s = match mode.as_str() {
        "shared" | "capped" => shared.clone(),
        "leased" => {
            // A lease at the region's whole max (safe level 1), an hour away.
            shmsched::cluster::lease_until(
                &shared,
                64,
                1,
                Instant::now() + Duration::from_secs(3600),
            )?;
            shared.clone()
        }
        "child" => shared.child(64)?,
        "local" => Scheduler::new(64)?,
        other => return Err(format!("unknown mode {other}").into()),
    };
    pairs(&s, 1000);
    let t = Instant::now();
    pairs(&s, n);
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    println!("{n} pairs, {mode}: {ns:.1} ns/pair (wall, not under valgrind)");
    Ok(())
}
