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
//!
//! Here the compiler inlines `consume` and `try_consume` into their loop
//! (each has one caller); a caller it does not inline them into (the
//! criterion closures of `benches/limiter.rs`, which call `consume` from
//! three places, or a user's own code) calls their out-of-line copies:
//! `examples/consume_call.rs` times and counts those, in the same modes.

use std::hint::black_box;

use shmsched::limiter::Limiter;
use shmsched::Priority;

mod consume_rows;

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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    consume_rows::main(consume_rows::Loops {
        consume: calls_consume,
        try_consume: calls_try,
    })
}
