//! A shared-region `try_acquire` + release loop for counting instructions
//! (`valgrind --tool=callgrind --toggle-collect='*pair_cost*pairs*'`): the
//! fast path's cost per pair, on a plain shared scheduler or (`leased`)
//! with a cluster lease armed on its region, far from its deadline.
//!
//! ```sh
//! cargo build --profile bench --example pair_cost
//! valgrind --tool=callgrind --toggle-collect='*pair_cost*pairs*' \
//!     target/release/examples/pair_cost 1000000 [leased]
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

use shmsched::region::Region;
use shmsched::scheduler::Scheduler;
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
    let leased = args.next().as_deref() == Some("leased");
    let region = Region::anonymous()?;
    let s = Scheduler::shared(&region, 64)?;
    if leased {
        // A lease at the region's whole max (safe level 1), an hour away.
        shmsched::cluster::lease_until(&s, 64, 1, Instant::now() + Duration::from_secs(3600))?;
    }
    pairs(&s, 1000);
    let t = Instant::now();
    pairs(&s, n);
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    println!(
        "{n} pairs, {}: {ns:.1} ns/pair (wall, not under valgrind)",
        if leased { "lease armed" } else { "no lease" }
    );
    Ok(())
}
