//! `shmsched pipe` from the outside: bytes out equal bytes in, a budget
//! shared by several pipes and a library reader holds its rate, the burst
//! rules, and throughput against `cat` and `pv`.

mod procs;
mod shell;
mod tools;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shell::{cli, gone, name, text, wait_bounded, Scratch, BIN};
use shmsched::limiter::Limiter;
use shmsched::region::Region;
use shmsched::Priority;

/// Deterministic binary data: every byte value, no long runs.
fn data(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Bytes out == bytes in for binary data, through every path: pipe to pipe
/// (splice), file to pipe, pipe to file, file to file (a buffer).
#[test]
fn bytes_out_equal_bytes_in() {
    let r = name("pipesum");
    let _g = gone(&r);
    let dir = Scratch::new("pipesum");
    let input = data(3_000_000 + 17);
    let inf = dir.path().join("in");
    std::fs::write(&inf, &input).unwrap();
    assert!(cli(&["create", &r, "--rate", "2000M/s"]).status.success());
    // pipe -> pipe
    let mut c = Command::new(BIN)
        .args(["pipe", &r])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut w = c.stdin.take().unwrap();
    let d = input.clone();
    let feeder = std::thread::spawn(move || w.write_all(&d).unwrap());
    let mut got = Vec::new();
    c.stdout.take().unwrap().read_to_end(&mut got).unwrap();
    feeder.join().unwrap();
    assert!(wait_bounded(c, 60, "pipe").status.success());
    assert!(
        got == input,
        "pipe to pipe: {} bytes back of {}",
        got.len(),
        input.len()
    );
    // file -> pipe, pipe -> file, file -> file
    for (from_file, to_file) in [(true, false), (false, true), (true, true)] {
        let outf = dir.path().join("out");
        let mut cmd = Command::new(BIN);
        cmd.args(["pipe", &r]);
        cmd.stdin(if from_file {
            Stdio::from(std::fs::File::open(&inf).unwrap())
        } else {
            Stdio::piped()
        });
        cmd.stdout(if to_file {
            Stdio::from(std::fs::File::create(&outf).unwrap())
        } else {
            Stdio::piped()
        });
        let mut c = cmd.spawn().unwrap();
        let feeder = c.stdin.take().map(|mut w| {
            let d = input.clone();
            std::thread::spawn(move || w.write_all(&d).unwrap())
        });
        let mut got = Vec::new();
        if let Some(mut o) = c.stdout.take() {
            o.read_to_end(&mut got).unwrap();
        }
        if let Some(f) = feeder {
            f.join().unwrap();
        }
        assert!(wait_bounded(c, 60, "pipe").status.success());
        if to_file {
            got = std::fs::read(&outf).unwrap();
        }
        assert!(
            got == input,
            "file {from_file} -> file {to_file}: {} of {}",
            got.len(),
            input.len()
        );
    }
}

/// Four `pipe`s and a library reader on one budget: together they never
/// pass the rate by more than 2 % over 3 s, and reach at least 85 % of it.
#[test]
fn four_pipes_and_a_library_reader_share_the_rate() {
    let r = name("pipeshare");
    let _g = gone(&r);
    const RATE: u64 = 4_000_000;
    // A burst of 10 ms of rate: what is measured is the rate, not the burst.
    assert!(cli(&["create", &r, "--rate", "4M", "--capacity", "40k"])
        .status
        .success());
    let stop = Arc::new(AtomicBool::new(false));
    let mut counters = Vec::new();
    let mut kids = Vec::new();
    let mut threads = Vec::new();
    for _ in 0..4 {
        let mut c = Command::new(BIN)
            .args(["pipe", &r, "--quiet"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut w = c.stdin.take().unwrap();
        let st = stop.clone();
        threads.push(std::thread::spawn(move || {
            let block = [0x5au8; 65536];
            while !st.load(Ordering::SeqCst) {
                if w.write_all(&block).is_err() {
                    break;
                }
            }
        }));
        let n = Arc::new(AtomicU64::new(0));
        let mut o = c.stdout.take().unwrap();
        let nn = n.clone();
        threads.push(std::thread::spawn(move || {
            let mut b = vec![0u8; 65536];
            while let Ok(k) = o.read(&mut b) {
                if k == 0 {
                    break;
                }
                nn.fetch_add(k as u64, Ordering::SeqCst);
            }
        }));
        counters.push(n);
        kids.push(c);
    }
    // The library reader: a throttled reader of an endless source.
    let region = Region::open(&r).unwrap();
    let lim = Limiter::attach(&region).unwrap();
    let n = Arc::new(AtomicU64::new(0));
    {
        let (n, st, lim) = (n.clone(), stop.clone(), lim.clone());
        threads.push(std::thread::spawn(move || {
            let mut rd = lim.reader(std::io::repeat(1), Priority::Normal);
            let mut b = vec![0u8; 16384];
            while !st.load(Ordering::SeqCst) {
                let k = rd.read(&mut b).unwrap();
                n.fetch_add(k as u64, Ordering::SeqCst);
            }
        }));
    }
    counters.push(n);
    let total = |c: &[Arc<AtomicU64>]| c.iter().map(|n| n.load(Ordering::SeqCst)).sum::<u64>();
    // Let every pipe start and the bucket settle, then measure 3 s.
    std::thread::sleep(Duration::from_millis(500));
    let (t0, b0) = (Instant::now(), total(&counters));
    std::thread::sleep(Duration::from_secs(3));
    let (t1, b1) = (Instant::now(), total(&counters));
    let each: Vec<u64> = counters.iter().map(|n| n.load(Ordering::SeqCst)).collect();
    stop.store(true, Ordering::SeqCst);
    let rate = (b1 - b0) as f64 / t1.duration_since(t0).as_secs_f64();
    println!(
        "4 pipes + a library reader: {rate:.0} B/s for a budget of {RATE} ({:+.2} %); each {each:?}",
        (rate / RATE as f64 - 1.0) * 100.0
    );
    for c in kids {
        let _ = wait_bounded_kill(c);
    }
    for t in threads {
        t.join().unwrap();
    }
    // Above the budget is the bound (strict); below it is throughput, which
    // a loaded machine can take from the readers (loose: -2.1 % was seen at
    // load 10 on two cores).
    assert!(
        rate / RATE as f64 - 1.0 <= 0.02,
        "{rate:.0} B/s is more than 2 % above the budget of {RATE}"
    );
    assert!(
        rate / RATE as f64 - 1.0 >= -0.15,
        "{rate:.0} B/s is more than 15 % below the budget of {RATE}"
    );
    assert!(each.iter().all(|&b| b > 0), "someone starved: {each:?}");
}

/// Ends a pipe whose input is closed by its writer thread stopping: the
/// writer is blocked on a full pipe, so kill the child to end both.
fn wait_bounded_kill(mut c: std::process::Child) -> std::process::ExitStatus {
    let _ = c.kill();
    c.wait().unwrap()
}

/// A short copy does not run at the burst. A limiter made by `pipe --rate`
/// has a burst of 100 ms of rate (the documented default): two 1 MB copies
/// under 1 MB/s take about 2 s, not the 1 s a second's burst gave. On a
/// region whose bucket holds a full second (made by the library),
/// `--strict` keeps one copy at the rate.
#[test]
fn a_short_copy_does_not_run_at_the_burst() {
    let r = name("pipeburst");
    let _g = gone(&r);
    let input = data(1_000_000);
    let copy = |extra: &[&str], r: &str| {
        let mut args = vec!["pipe", r, "--quiet"];
        args.extend_from_slice(extra);
        let mut c = Command::new(BIN)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut w = c.stdin.take().unwrap();
        let d = input.clone();
        std::thread::spawn(move || {
            let _ = w.write_all(&d);
        });
        c
    };
    // The first creates the limiter; make sure it exists before the second.
    assert!(cli(&["create", &r, "--rate", "1M"]).status.success());
    let t = Instant::now();
    let (a, b) = (copy(&["--rate", "1M"], &r), copy(&[], &r));
    let (oa, ob) = (wait_bounded(a, 30, "copy a"), wait_bounded(b, 30, "copy b"));
    let took = t.elapsed();
    assert!(oa.status.success(), "{}", text(&oa.stderr));
    assert!(ob.status.success(), "{}", text(&ob.stderr));
    println!("two 1 MB copies under 1 MB/s (burst 100 ms): {took:?}");
    assert!(took >= Duration::from_millis(1800), "took {took:?}");
    // A bucket of a second, full: --strict still paces a copy.
    let full = name("pipefull");
    let _gf = gone(&full);
    let region = Region::create(&full).unwrap();
    let _lim = Limiter::shared(&region, 1_000_000).unwrap();
    let t = Instant::now();
    let o = wait_bounded(copy(&[], &full), 30, "burst copy");
    let burst = t.elapsed();
    assert!(o.status.success());
    let t = Instant::now();
    let o = wait_bounded(copy(&["--strict"], &full), 30, "strict copy");
    let strict = t.elapsed();
    assert!(o.status.success(), "{}", text(&o.stderr));
    println!("1 MB under 1 MB/s: {burst:?} on a full second's bucket, {strict:?} with --strict (after it)");
    assert!(
        strict >= Duration::from_millis(900),
        "strict took {strict:?}"
    );
}

/// Bad rates and missing regions are errors that say what to do.
#[test]
fn rate_errors_name_the_value() {
    let o = cli(&["pipe", &name("x"), "--rate", "3GiB"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("3GiB") && text(&o.stderr).contains("2147483647"));
    let o = cli(&["pipe", &name("x"), "--rate", "fast"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("\"fast\""), "{}", text(&o.stderr));
    let o = cli(&["pipe", &name("x")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("--rate"), "{}", text(&o.stderr));
}

/// Throughput at an unlimited rate (the largest, 2 GiB/s, above what the
/// pipeline reaches) against `cat` and `pv` in one run: best of 5
/// interleaved rounds each, as ratios. Asserted loosely (the machine is
/// shared); the README's figure comes from a quiet machine.
#[test]
fn throughput_against_cat_and_pv() {
    let r = name("pipefast");
    let _g = gone(&r);
    assert!(cli(&["create", &r, "--rate", "2147483647"])
        .status
        .success());
    let pv = Some(tools::require_tool("pv", tools::Get::Apt("pv")));
    const N: u64 = 256 << 20;
    let producer = format!("head -c {N} /dev/zero");
    let mut tools_under = vec![("cat".to_string(), "cat".to_string())];
    if let Some(pv) = &pv {
        tools_under.push(("pv".into(), format!("{} -q", pv.display())));
    }
    tools_under.push(("shmsched pipe".into(), format!("{BIN} pipe {r} --quiet")));
    let mut best = vec![f64::MAX; tools_under.len()];
    for _ in 0..5 {
        for (i, (_, cmd)) in tools_under.iter().enumerate() {
            let t = Instant::now();
            let c = Command::new("sh")
                .args(["-c", &format!("{producer} | {cmd} | cat > /dev/null")])
                .stdin(Stdio::null())
                .spawn()
                .unwrap();
            assert!(wait_bounded(c, 120, cmd).status.success());
            best[i] = best[i].min(t.elapsed().as_secs_f64());
        }
    }
    let cat = best[0];
    for (i, (label, _)) in tools_under.iter().enumerate() {
        println!(
            "{label}: {:.0} MB/s, {:.2}x cat",
            N as f64 / best[i] / 1e6,
            cat / best[i]
        );
    }
    let ours = cat / best[best.len() - 1];
    assert!(ours >= 0.6, "shmsched pipe at {ours:.2}x cat");
}
