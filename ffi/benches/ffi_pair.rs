//! Acquire + release through the C ABI against the same pair from Rust,
//! in one run (see the README's "From C" section for the figures).
//!
//! Every row times the same thing the same way: one uncontended acquire and
//! release of a scheduler shared through an anonymous region (max 8), in
//! rounds of `SHMSCHED_BENCH_ITERS` pairs (default 1,000,000; Python a
//! tenth of that), the median of 15 rounds in ns per pair, then the ratio
//! to the Rust row. The rows' rounds are interleaved (one round of each row
//! in turn), so that load from other work on the machine falls on every
//! row alike. The C program (`benches/c/pair.c`) is built with `cc -O2`
//! against the release `libshmsched.a` (static, as a C program or Go would
//! link it) and `libshmsched.so`; the Python rows go through ctypes. Two
//! more C rows time the pair's atomic skeleton without the library
//! (`benches/c/atomics.c`): the library's two CASes alone, with the
//! checked-permit table's claim CAS and stores (the floor of a release
//! check that claims an entry of its own), and with what a cell token adds
//! (the tag store and the pin: the floor of the check carried by the
//! cell's own give-back CAS, the path one-slot permits take).
//!
//! Run: `cargo bench -p shmsched-ffi --bench ffi_pair`. Not a criterion
//! bench: the C and Python rows run in other processes, and all rows must
//! be timed alike to be compared.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use shmsched::region::Region;
use shmsched::scheduler::Scheduler;
use shmsched::Priority;

const ROUNDS: usize = 15;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// One round of the Rust row.
fn rust_round(s: &Scheduler, iters: u64) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        drop(std::hint::black_box(
            s.acquire(Priority::Normal).expect("acquire"),
        ));
    }
    t.elapsed().as_nanos() as f64 / iters as f64
}

/// Builds the release library next to this bench binary's target dir and
/// returns `<target>/release`.
fn release_lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("bench binary path");
    let target = exe
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .expect("<target>/<profile>/deps/<bench>");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .args(["build", "--release", "-p", "shmsched-ffi", "--target-dir"])
        .arg(target)
        .current_dir(root)
        .status()
        .expect("cargo build --release -p shmsched-ffi");
    assert!(st.success());
    target.join("release")
}

/// Builds the C pair program against the static or the shared library.
fn build_c(lib: &Path, statically: bool) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = lib.join(if statically {
        "pair-static"
    } else {
        "pair-dynamic"
    });
    let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cc.args(["-O2", "-std=c99", "-I"])
        .arg(dir.join("include"))
        .arg(dir.join("benches/c/pair.c"))
        .arg("-o")
        .arg(&out);
    if statically {
        cc.arg(lib.join("libshmsched.a")).args([
            "-lgcc_s",
            "-lutil",
            "-lrt",
            "-lpthread",
            "-lm",
            "-ldl",
            "-lc",
        ]);
    } else {
        cc.arg("-L")
            .arg(lib)
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .arg("-lshmsched");
    }
    assert!(cc.status().expect("run cc").success(), "cc failed");
    out
}

/// Builds the atomic skeleton of a pair (`benches/c/atomics.c`, no
/// library): the library's two CASes alone, and with the C table's claim.
fn build_atomics(lib: &Path) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = lib.join("pair-atomics");
    let st = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-O2", "-std=c11"])
        .arg(dir.join("benches/c/atomics.c"))
        .arg("-o")
        .arg(&out)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed");
    out
}

/// One round of a C row: `exe [mode] ITERS 1`.
fn c_round(exe: &Path, mode: Option<&str>, iters: u64) -> f64 {
    let run = Command::new(exe)
        .args(mode)
        .args([iters.to_string(), "1".to_string()])
        .output()
        .expect("run the C pair bench");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    String::from_utf8_lossy(&run.stdout)
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("ns_per_pair line")
}

/// One round of the Python rows.
fn python_round(lib: &Path, iters: u64) -> Vec<(String, f64)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let run = Command::new("python3")
        .arg(dir.join("benches/python/pair.py"))
        .args([(iters / 10).max(1).to_string(), "1".to_string()])
        .env("PYTHONPATH", dir.parent().unwrap().join("python"))
        .env("SHMSCHED_LIB", lib.join("libshmsched.so"))
        .output()
        .expect("run python3");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    String::from_utf8_lossy(&run.stdout)
        .lines()
        .filter_map(|l| {
            let (name, v) = l.split_once(' ')?;
            Some((name.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn main() {
    // `cargo bench -- --list` and friends: nothing to list.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let iters: u64 = std::env::var("SHMSCHED_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let lib = release_lib_dir();
    let c_static = build_c(&lib, true);
    let c_dynamic = build_c(&lib, false);
    let atomics = build_atomics(&lib);
    let region = Region::anonymous().expect("region");
    let s = Scheduler::shared(&region, 8).expect("scheduler");
    let labels = [
        "Rust `acquire` + drop (the library)",
        "C, `libshmsched.a` (static)",
        "C, `libshmsched.so` (dynamic)",
        "Python, bare ctypes calls",
        "Python, `with sched.acquire():`",
        "C skeleton: the library's two CASes alone",
        "C skeleton: + the table's claim CAS and stores",
        "C skeleton: + the cell token's tag store and pin",
    ];
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); labels.len()];
    for _ in 0..ROUNDS {
        samples[0].push(rust_round(&s, iters));
        samples[1].push(c_round(&c_static, None, iters));
        samples[2].push(c_round(&c_dynamic, None, iters));
        samples[5].push(c_round(&atomics, Some("cas2"), iters));
        samples[6].push(c_round(&atomics, Some("table"), iters));
        samples[7].push(c_round(&atomics, Some("token"), iters));
        for (name, v) in python_round(&lib, iters) {
            match name.as_str() {
                "ctypes_raw" => samples[3].push(v),
                "binding_with" => samples[4].push(v),
                other => panic!("unknown Python row {other}"),
            }
        }
    }
    let medians: Vec<f64> = samples.into_iter().map(median).collect();
    let rust = medians[0];
    println!("acquire + release, one thread, shared scheduler (max 8); median of {ROUNDS} interleaved rounds");
    println!("| row | ns / pair | vs Rust |");
    println!("|---|---:|---:|");
    for (name, v) in labels.iter().zip(medians) {
        println!("| {name} | {v:.1} | {:.2} |", v / rust);
    }
}
