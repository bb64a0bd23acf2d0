//! `examples/consume_cost.rs`'s rows, with every `consume` and
//! `try_consume` a call of its out-of-line copy, as a caller gets it when
//! the compiler does not inline them into its code (criterion's closures
//! in `benches/limiter.rs`, a user's own functions): the function pointer
//! is hidden from the compiler, so it neither inlines nor specialises the
//! call. The same modes (`local shared child try governor other wall`);
//! the count per call includes the call and the loop.
//!
//! ```sh
//! cargo build --profile bench --example consume_call
//! for m in local shared child try governor other; do
//!   valgrind --tool=callgrind --toggle-collect='*consume_call*calls*' \
//!     --callgrind-out-file=/tmp/cg.$m target/release/examples/consume_call $m 200000
//! done
//! target/release/examples/consume_call wall 300   # wall clock, all rows
//! ```

use std::hint::black_box;

use shmsched::limiter::{Grant, Limiter};
use shmsched::{Priority, Result};

mod consume_rows;

/// `n` consumes of 1 token through `lim`, each a call of `consume`'s
/// out-of-line copy.
#[inline(never)]
fn calls_consume(lim: &Limiter, n: u64) {
    let f: fn(&Limiter, u64, Priority) -> Result<Grant> = black_box(Limiter::consume);
    for _ in 0..n {
        black_box(f(lim, black_box(1), Priority::Normal).expect("consume"));
    }
}

/// `n` `try_consume`s of 1 token through `lim`, each a call of its
/// out-of-line copy.
#[inline(never)]
fn calls_try(lim: &Limiter, n: u64) {
    let f: fn(&Limiter, u64) -> Result<bool> = black_box(Limiter::try_consume);
    for _ in 0..n {
        black_box(f(lim, black_box(1)).expect("try_consume"));
    }
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    consume_rows::main(consume_rows::Loops {
        consume: calls_consume,
        try_consume: calls_try,
    })
}
