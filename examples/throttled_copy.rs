//! Several processes copying files at once under ONE shared bytes-per-second
//! budget.
//!
//! ```text
//! cargo run --release --example throttled_copy -- [PROCS] [BYTES_PER_SEC] [MB_PER_PROC]
//! ```
//!
//! (defaults: 4 processes, 8,000,000 B/s, 8 MB each). The example creates a
//! limiter region, spawns PROCS copies of itself as workers, and each worker
//! copies its own file through `shmsched::io::copy` with the shared limiter,
//! printing its own rate; the parent prints the total, which stays at the
//! budget however many workers there are.
//!
//! To run the workers yourself (e.g. from several terminals), start each
//! with `--worker REGION BYTES_PER_SEC MB`: they all bind (or create) the
//! same named region and share its budget; remove it afterwards with
//! `rm /dev/shm/shmsched.REGION`.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Instant;

use shmsched::limiter::Limiter;
use shmsched::region::Region;
use shmsched::Priority;

fn arg(args: &[String], i: usize, default: u64) -> u64 {
    args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn worker(region: &str, rate: u64, mb: u64) -> Result<(), Box<dyn std::error::Error>> {
    let region = Region::open_or_create(region)?;
    let lim = Limiter::shared(&region, rate)?;
    let dir = std::env::temp_dir();
    let src = dir.join(format!("throttled-copy-src-{}", std::process::id()));
    let dst = dir.join(format!("throttled-copy-dst-{}", std::process::id()));
    {
        let mut f = std::fs::File::create(&src)?;
        let chunk = vec![0x5au8; 1 << 20];
        for _ in 0..mb {
            f.write_all(&chunk)?;
        }
    }
    let t = Instant::now();
    let mut r = std::fs::File::open(&src)?;
    let mut w = std::fs::File::create(&dst)?;
    let n = shmsched::io::copy(&mut r, &mut w, &lim, Priority::Normal)?;
    let secs = t.elapsed().as_secs_f64();
    println!(
        "pid {:>7}: copied {n} bytes in {secs:.2} s = {:.0} B/s",
        std::process::id(),
        n as f64 / secs
    );
    let _ = std::fs::remove_file(&src);
    let _ = std::fs::remove_file(&dst);
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--worker") {
        let region = args.get(1).ok_or("--worker REGION BYTES_PER_SEC MB")?;
        return worker(region, arg(&args, 2, 8_000_000), arg(&args, 3, 8));
    }
    let procs = arg(&args, 0, 4);
    let rate = arg(&args, 1, 8_000_000);
    let mb = arg(&args, 2, 8);
    let name = format!("throttled-copy-{}", std::process::id());
    let region = Region::create(&name)?;
    // Create the limiter, then empty its (full) bucket so that the total
    // below measures the refill rate only.
    let lim = Limiter::shared(&region, rate)?;
    lim.consume(rate, Priority::Highest)?;
    println!("{procs} processes, {mb} MB each, sharing {rate} B/s");
    let exe = std::env::current_exe()?;
    let t = Instant::now();
    let kids: Vec<_> = (0..procs)
        .map(|_| {
            Command::new(&exe)
                .args(["--worker", &name, &rate.to_string(), &mb.to_string()])
                .stdout(Stdio::inherit())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let mut ok = true;
    for mut k in kids {
        ok &= k.wait()?.success();
    }
    let secs = t.elapsed().as_secs_f64();
    let total = procs * mb * (1 << 20);
    println!(
        "total: {total} bytes in {secs:.2} s = {:.0} B/s ({:.1}% of the budget)",
        total as f64 / secs,
        100.0 * total as f64 / secs / rate as f64
    );
    let _ = Region::remove(&name);
    if !ok {
        return Err("a worker failed".into());
    }
    Ok(())
}
