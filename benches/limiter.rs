//! The Limiter against `governor` in one run, and a throttled copy against
//! `std::io::copy` (see DESIGN.md, "Measuring": compare rows by ratio).
//!
//! Groups:
//!
//! - `consume`: one uncontended consume of 1 token on a single thread, at the
//!   highest rate (2,147,483,647 tokens/s), so nothing ever waits: this
//!   measures the fast path (one clock read, one CAS per level). Rows: shmsched
//!   in-process, shared through a region, through a child of a shared root,
//!   `try_consume` shared, and `governor`'s direct (in-process) limiter.
//!   The closures call `consume`'s out-of-line copy (the compiler does not
//!   inline it into three callers), `try_consume` inlined;
//!   `examples/consume_call.rs` and `examples/consume_cost.rs` time the
//!   same rows out of line and inlined, as the fastest of many batches.
//! - `copy`: copying 1 MiB from memory into a preallocated `Vec`, with
//!   `std::io::copy` and with `shmsched::io::copy` through a fresh limiter
//!   at the highest rate (a full bucket, so no waiting: the overhead of
//!   charging 64 KiB chunks), and the same 64 KiB buffer loop without a
//!   limiter (`buffer_loop_64k`), which isolates the charging cost from the
//!   extra copy through an intermediate buffer that `std::io::copy` avoids
//!   for slices.
//! - `copy_file`: 32 MiB file to file on tmpfs: the `cp` binary,
//!   `std::io::copy`, and `shmsched::io::copy` through a limiter at the
//!   highest rate (a process spawn is part of the `cp` row).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use shmsched::limiter::Limiter;
use shmsched::region::Region;
use shmsched::Priority;

const RATE: u64 = i32::MAX as u64;

fn consume(c: &mut Criterion) {
    let mut g = c.benchmark_group("consume");
    g.throughput(Throughput::Elements(1));

    let local = Limiter::new(RATE).expect("limiter");
    g.bench_function("shmsched_local", |b| {
        b.iter(|| {
            black_box(
                local
                    .consume(black_box(1), Priority::Normal)
                    .expect("consume"),
            )
        })
    });

    let region = Region::anonymous().expect("memfd region");
    let shared = Limiter::shared(&region, RATE).expect("shared limiter");
    g.bench_function("shmsched_shared", |b| {
        b.iter(|| {
            black_box(
                shared
                    .consume(black_box(1), Priority::Normal)
                    .expect("consume"),
            )
        })
    });

    g.bench_function("shmsched_shared_try", |b| {
        b.iter(|| black_box(shared.try_consume(black_box(1)).expect("try_consume")))
    });

    let child = shared.child(RATE).expect("child");
    g.bench_function("shmsched_shared_child", |b| {
        b.iter(|| {
            black_box(
                child
                    .consume(black_box(1), Priority::Normal)
                    .expect("consume"),
            )
        })
    });

    let quota = governor::Quota::per_second(NonZeroU32::new(RATE as u32).expect("nonzero"));
    let gov = governor::RateLimiter::direct(quota);
    g.bench_function("governor_direct", |b| b.iter(|| black_box(gov.check())));
    g.finish();
}

fn copy(c: &mut Criterion) {
    const LEN: usize = 1 << 20;
    let src = vec![0xa5u8; LEN];
    let mut g = c.benchmark_group("copy");
    g.throughput(Throughput::Bytes(LEN as u64));
    let mut out = Vec::with_capacity(LEN);
    g.bench_function("std_io_copy", |b| {
        b.iter(|| {
            out.clear();
            black_box(std::io::copy(&mut &src[..], &mut out).expect("copy"))
        })
    });
    // The same loop as shmsched::io::copy (64 KiB buffer, read then
    // write_all) without a limiter: isolates the cost of charging.
    g.bench_function("buffer_loop_64k", |b| {
        b.iter(|| {
            out.clear();
            let mut buf = vec![0u8; 64 * 1024];
            let mut r = &src[..];
            let mut n = 0;
            loop {
                let k = std::io::Read::read(&mut r, &mut buf).expect("read");
                if k == 0 {
                    break;
                }
                std::io::Write::write_all(&mut out, &buf[..k]).expect("write");
                n += k;
            }
            black_box(n)
        })
    });
    g.bench_function("shmsched_io_copy", |b| {
        b.iter_batched(
            || Limiter::new(RATE).expect("limiter"),
            |lim| {
                out.clear();
                black_box(
                    shmsched::io::copy(&mut &src[..], &mut out, &lim, Priority::Normal)
                        .expect("copy"),
                )
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

/// File to file on tmpfs, 32 MiB: the `cp` binary against
/// `shmsched::io::copy` through a fresh limiter at the highest rate (its
/// full bucket covers the file, so this is the overhead of charging plus our
/// buffer loop, not throttling) and against plain `std::io::copy`.
fn copy_file(c: &mut Criterion) {
    const LEN: usize = 32 << 20;
    let dir = std::env::temp_dir();
    let src = dir.join(format!("shmsched-bench-src-{}", std::process::id()));
    let dst = dir.join(format!("shmsched-bench-dst-{}", std::process::id()));
    let shm_src = std::path::Path::new("/dev/shm").join(src.file_name().expect("name"));
    let shm_dst = std::path::Path::new("/dev/shm").join(dst.file_name().expect("name"));
    let (src, dst) = if std::path::Path::new("/dev/shm").is_dir() {
        (shm_src, shm_dst)
    } else {
        (src, dst)
    };
    std::fs::write(&src, vec![0x5au8; LEN]).expect("write source");
    let mut g = c.benchmark_group("copy_file");
    g.throughput(Throughput::Bytes(LEN as u64));
    g.sample_size(10);
    g.bench_function("cp", |b| {
        b.iter(|| {
            let st = std::process::Command::new("cp")
                .arg(&src)
                .arg(&dst)
                .status()
                .expect("run cp");
            assert!(st.success());
        })
    });
    g.bench_function("std_io_copy", |b| {
        b.iter(|| {
            let mut r = std::fs::File::open(&src).expect("open");
            let mut w = std::fs::File::create(&dst).expect("create");
            black_box(std::io::copy(&mut r, &mut w).expect("copy"))
        })
    });
    g.bench_function("shmsched_io_copy", |b| {
        b.iter_batched(
            || Limiter::new(RATE).expect("limiter"),
            |lim| {
                let mut r = std::fs::File::open(&src).expect("open");
                let mut w = std::fs::File::create(&dst).expect("create");
                black_box(shmsched::io::copy(&mut r, &mut w, &lim, Priority::Normal).expect("copy"))
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
    let _ = std::fs::remove_file(&src);
    let _ = std::fs::remove_file(&dst);
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = consume, copy, copy_file
}
criterion_main!(benches);
