//! The contended async hand-off of `benches/scheduler.rs` (`vs_tokio`), as a
//! program to count instructions in: four tasks on a two-worker tokio
//! runtime share one permit, each holding it across a `yield_now`, through
//! an in-process [`Scheduler`] of max 1 or a `tokio::sync::Semaphore` of one
//! permit.
//!
//! ```text
//! cargo run --release --example async_handoff_cost -- shmsched 200000
//! cargo run --release --example async_handoff_cost -- tokio 200000
//! ```
//!
//! prints the wall time per acquisition. Instructions per acquisition are
//! the difference of two runs under callgrind (the runtime's start and
//! stop cancel out):
//!
//! ```text
//! B=target/release/examples/async_handoff_cost
//! for n in 40000 80000; do
//!   valgrind --tool=callgrind --callgrind-out-file=cg.$n $B shmsched $n
//! done   # then (total(80000) - total(40000)) / 40000
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use shmsched::scheduler::{Concurrency, Scheduler};
use shmsched::Priority;

/// Tasks sharing the one permit (the bench's `HANDOFF_TASKS`).
const TASKS: u64 = 4;

/// Which semaphore the tasks share.
#[derive(Clone, Copy, PartialEq)]
enum Which {
    Shmsched,
    Tokio,
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let which = match args.next().as_deref() {
        Some("shmsched") => Which::Shmsched,
        Some("tokio") => Which::Tokio,
        other => {
            eprintln!("usage: async_handoff_cost shmsched|tokio [ACQUISITIONS]; got {other:?}");
            return ExitCode::from(2);
        }
    };
    let total: u64 = match args.next().map(|s| s.parse::<u64>()) {
        None => 200_000,
        Some(Ok(n)) if n >= TASKS => n,
        Some(_) => {
            eprintln!("ACQUISITIONS must be a whole number of at least {TASKS}");
            return ExitCode::from(2);
        }
    };
    let per_task = total / TASKS;

    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("no tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let sched = match Scheduler::new(Concurrency::max(1)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("no scheduler: {e}");
            return ExitCode::FAILURE;
        }
    };
    let sem = Arc::new(tokio::sync::Semaphore::new(1));

    let started = Instant::now();
    let failed = rt.block_on(async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let (sched, sem) = (sched.clone(), sem.clone());
                tokio::spawn(async move {
                    for _ in 0..per_task {
                        if which == Which::Shmsched {
                            let p = sched.clone().acquire_owned_async(Priority::Normal).await?;
                            tokio::task::yield_now().await;
                            drop(p);
                        } else {
                            let p = sem.clone().acquire_owned().await.map_err(|e| {
                                shmsched::Error::InvalidArgument(format!("tokio: {e}"))
                            })?;
                            tokio::task::yield_now().await;
                            drop(p);
                        }
                    }
                    Ok::<(), shmsched::Error>(())
                })
            })
            .collect();
        let mut failed = None;
        for task in tasks {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failed = Some(e.to_string()),
                Err(e) => failed = Some(e.to_string()),
            }
        }
        failed
    });
    if let Some(e) = failed {
        eprintln!("a task failed: {e}");
        return ExitCode::FAILURE;
    }
    let done = per_task * TASKS;
    println!(
        "{} acquisitions: {:.1} ns each",
        done,
        started.elapsed().as_nanos() as f64 / done as f64
    );
    ExitCode::SUCCESS
}
