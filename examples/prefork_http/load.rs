//! The load test: the server with each gate under three `wrk` processes,
//! the comparison tables and the acceptance checks.

use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::server::{ms, signal, triple, Summary, PATHS};
use super::{Args, Gate};

// ---------------------------------------------------------------------------
// The load test
// ---------------------------------------------------------------------------

/// Settings of a load test.
#[derive(Debug, Clone, Serialize)]
pub struct LoadOpts {
    /// Seconds of load per gate.
    pub seconds: f64,
    /// wrk connections per path.
    pub conns: u32,
    /// The workers' pause after each accept, ms.
    pub accept_pause_ms: f64,
    /// One wrk process per entry, requesting that path.
    pub paths: Vec<String>,
    /// Server workers.
    pub workers: u32,
    /// The shared cap.
    pub cap: u32,
    /// The backend call, ms.
    pub backend_ms: f64,
}

/// What acceptance demands (the long run uses [`Bounds::issue`]).
#[derive(Debug, Clone, Serialize)]
pub struct Bounds {
    /// Longest acceptable wait of a `/high` request.
    pub high_max_ms: f64,
    /// Whether that bound applies to the p99 (true) or to the max.
    pub high_bound_on_p99: bool,
    /// Longest acceptable wait of any request, as a fraction of the run.
    pub any_max_fraction: f64,
    /// Lowest acceptable throughput, as a fraction of the semaphore's.
    pub min_ratio: f64,
}

impl Bounds {
    /// The issue's acceptance: `/high` ≤ 1 s at p100, nothing half the run,
    /// ≥ 0.9× the semaphore.
    pub fn issue() -> Bounds {
        Bounds {
            high_max_ms: 1000.0,
            high_bound_on_p99: false,
            any_max_fraction: 0.5,
            min_ratio: 0.9,
        }
    }
}

/// One wrk process's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WrkRow {
    /// The path it requested.
    pub path: String,
    /// Completed requests.
    pub requests: u64,
    /// Its run, seconds.
    pub duration_s: f64,
    /// requests / duration.
    pub rps: f64,
    /// Socket errors (connect + read + write + timeout) and non-2xx/3xx.
    pub errors: u64,
    /// Client-side latency, ms.
    pub latency_p50_ms: f64,
    /// Client-side latency p99, ms.
    pub latency_p99_ms: f64,
    /// Client-side latency max, ms.
    pub latency_max_ms: f64,
}

/// One gate's run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GateRun {
    /// The gate.
    pub gate: Gate,
    /// Σ wrk requests/s.
    pub rps: f64,
    /// 1-minute load average when the run started.
    pub load_avg: f64,
    /// Per path.
    pub wrk: Vec<WrkRow>,
    /// The server's summary.
    pub server: Summary,
}

/// One acceptance point.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What is checked.
    pub name: String,
    /// Whether it held.
    pub ok: bool,
    /// The figures.
    pub detail: String,
}

/// Both runs and the checks.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// The settings.
    pub opts: LoadOpts,
    /// shmsched, then the semaphore.
    pub runs: Vec<GateRun>,
    /// shmsched's throughput / the semaphore's.
    pub ratio: f64,
}

impl LoadReport {
    /// The run of `gate`.
    pub fn run(&self, gate: Gate) -> &GateRun {
        self.runs
            .iter()
            .find(|r| r.gate == gate)
            .expect("both gates ran")
    }
}

/// True if `wrk` can be run.
pub fn have_wrk() -> bool {
    Command::new("wrk")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// wrk's `done` hook: one JSON line with its totals.
const WRK_SCRIPT: &str = r#"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%.0f,"duration_us":%.0f,"errors":%.0f,"p50_us":%.0f,"p99_us":%.0f,"max_us":%.0f}\n',
    summary.requests, summary.duration,
    e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"#;

#[derive(Deserialize)]
struct WrkLine {
    requests: f64,
    duration_us: f64,
    errors: f64,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
}

/// A child process killed (SIGKILL) and reaped if still running when
/// dropped.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// A file removed when dropped.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Spawns `cmd`, dying with this process (`PR_SET_PDEATHSIG`).
fn spawn_tied(cmd: &mut Command) -> io::Result<Guard> {
    // SAFETY: the pre-exec hook only calls prctl, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd.spawn().map(Guard)
}

fn load_avg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Waits for `child` to exit until `deadline` (then kills it).
fn wait_until(child: &mut Guard, deadline: Instant, what: &str) -> Result<(), String> {
    loop {
        match child.0.try_wait() {
            Ok(Some(_)) => return Ok(()),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.0.kill();
                return Err(format!("{what} ran past its deadline; killed"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("{what}: {e}")),
        }
    }
}

fn run_gate(exe: &Path, o: &LoadOpts, gate: Gate, script: &Path) -> Result<GateRun, String> {
    let load = load_avg();
    let mut server = spawn_tied(
        Command::new(exe)
            .args(["--serve", "--gate", gate.name()])
            .args(["--workers", &o.workers.to_string()])
            .args(["--cap", &o.cap.to_string()])
            .args(["--backend-ms", &o.backend_ms.to_string()])
            .args(["--accept-pause-ms", &o.accept_pause_ms.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit()),
    )
    .map_err(|e| format!("spawn the server ({}): {e}", exe.display()))?;
    let (tx, rx) = mpsc::channel::<String>();
    let out = server.0.stdout.take().expect("piped");
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let first = rx
        .recv_timeout(Duration::from_secs(60))
        .map_err(|_| "the server did not start within 60 s".to_string())?;
    let v: serde_json::Value =
        serde_json::from_str(&first).map_err(|e| format!("server said {first:?}: {e}"))?;
    let addr = v["listening"]
        .as_str()
        .ok_or_else(|| format!("server said {first:?}"))?
        .to_string();

    let secs = o.seconds.ceil().max(1.0) as u64;
    let mut wrks = Vec::new();
    for path in &o.paths {
        let w = spawn_tied(
            Command::new("wrk")
                .args(["-t1", &format!("-c{}", o.conns), &format!("-d{secs}s")])
                .args(["--timeout", &format!("{}s", secs + 30)])
                .arg("-s")
                .arg(script)
                .arg(format!("http://{addr}{path}"))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit()),
        )
        .map_err(|e| format!("spawn wrk: {e}"))?;
        wrks.push((path, w));
    }
    let deadline = Instant::now() + Duration::from_secs(secs + 30);
    let mut rows = Vec::new();
    for (path, w) in &mut wrks {
        wait_until(w, deadline, "wrk")?;
        let mut text = String::new();
        if let Some(mut so) = w.0.stdout.take() {
            let _ = so.read_to_string(&mut text);
        }
        let line = text
            .lines()
            .find(|l| l.starts_with("{\"requests\""))
            .ok_or_else(|| format!("wrk {path} printed no totals:\n{text}"))?;
        let l: WrkLine = serde_json::from_str(line).map_err(|e| format!("{line}: {e}"))?;
        let duration_s = l.duration_us / 1e6;
        rows.push(WrkRow {
            path: path.to_string(),
            requests: l.requests as u64,
            duration_s,
            rps: l.requests / duration_s.max(1e-9),
            errors: l.errors as u64,
            latency_p50_ms: l.p50_us / 1000.0,
            latency_p99_ms: l.p99_us / 1000.0,
            latency_max_ms: l.max_us / 1000.0,
        });
    }
    // Stop the server (SIGTERM) and read its summary.
    signal(server.0.id() as i32, libc::SIGTERM);
    let until = Instant::now() + Duration::from_secs(60);
    let summary = loop {
        let left = until.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .map_err(|_| "the server gave no summary within 60 s".to_string())?;
        if let Ok(s) = serde_json::from_str::<Summary>(&line) {
            break s;
        }
    };
    wait_until(&mut server, until, "the server")?;
    Ok(GateRun {
        gate,
        rps: rows.iter().map(|r| r.rps).sum(),
        load_avg: load,
        wrk: rows,
        server: summary,
    })
}

/// Runs the server with each gate under wrk; `exe` is this program (it is
/// started with `--serve`).
pub fn run_load(exe: &Path, o: &LoadOpts) -> Result<LoadReport, String> {
    let script =
        TempFile(std::env::temp_dir().join(format!("prefork_http-{}.lua", std::process::id())));
    std::fs::write(&script.0, WRK_SCRIPT).map_err(|e| format!("write wrk script: {e}"))?;
    let mut runs = Vec::new();
    for gate in [Gate::Shmsched, Gate::Sem] {
        eprintln!(
            "prefork_http load: gate {} for {} s (load average {:.2})",
            gate.name(),
            o.seconds,
            load_avg()
        );
        runs.push(run_gate(exe, o, gate, &script.0)?);
    }
    let ratio = runs[0].rps / runs[1].rps.max(1e-9);
    Ok(LoadReport {
        opts: o.clone(),
        runs,
        ratio,
    })
}

/// The acceptance points, on the shmsched run (the cap on both).
pub fn checks(r: &LoadReport, b: &Bounds) -> Vec<Check> {
    let s = &r.run(Gate::Shmsched).server;
    let mut out = Vec::new();
    let caps: Vec<String> = r
        .runs
        .iter()
        .map(|g| {
            format!(
                "{}: sampled {}, counted {}{}",
                g.gate.name(),
                g.server.max_running_sampled,
                g.server.max_running_counted,
                match g.server.exited_in_gate {
                    0 => String::new(),
                    n => format!(
                        " ({n} requests left in the gate at a worker's exit: counted too high)"
                    ),
                }
            )
        })
        .collect();
    out.push(Check {
        name: format!("the cap held (max running <= {})", s.cap),
        ok: r
            .runs
            .iter()
            .all(|g| g.server.max_running() <= g.server.cap && g.server.exited_in_gate == 0)
            && s.leaked.unwrap_or(0) == 0,
        detail: format!("{}; leaked {}", caps.join("; "), s.leaked.unwrap_or(0)),
    });
    // A worker the kernel gave no connection cannot serve (with either
    // gate): it is named, not counted as starved.
    let starved = s
        .per_worker
        .iter()
        .filter(|w| !w.reported || (w.connections > 0 && w.wait.n == 0))
        .count();
    let unused: Vec<String> = s
        .per_worker
        .iter()
        .filter(|w| w.reported && w.connections == 0)
        .map(|w| w.worker.to_string())
        .collect();
    let served: Vec<String> = s
        .per_worker
        .iter()
        .map(|w| format!("{} ({} conns)", w.wait.n, w.connections))
        .collect();
    out.push(Check {
        name: "every worker served requests".into(),
        ok: starved == 0,
        detail: format!(
            "served per worker: {}{}",
            served.join(", "),
            if unused.is_empty() {
                String::new()
            } else {
                format!("; accepted no connection: worker {}", unused.join(", "))
            }
        ),
    });
    let high = s.path("/high").cloned().unwrap_or_default();
    let (which, v) = if b.high_bound_on_p99 {
        ("p99", high.p99_ms)
    } else {
        ("max", high.max_ms)
    };
    out.push(Check {
        name: format!("/high waited <= {} ms ({which})", b.high_max_ms),
        // (Without /high in the mix there is nothing to bound.)
        ok: v <= b.high_max_ms && (high.n > 0 || !r.opts.paths.iter().any(|p| p == "/high")),
        detail: format!(
            "/high p99 {} ms, max {} ms, {} served",
            ms(high.p99_ms),
            ms(high.max_ms),
            high.n
        ),
    });
    let limit = r.opts.seconds * 1000.0 * b.any_max_fraction;
    let worst = s
        .paths
        .iter()
        .max_by(|x, y| x.wait.max_ms.total_cmp(&y.wait.max_ms))
        .map(|p| (p.path.clone(), p.wait.max_ms))
        .unwrap_or_default();
    let still: u64 = s.paths.iter().map(|p| p.wait.waiting_at_stop).sum();
    out.push(Check {
        name: format!(
            "no request waited {} of the run ({} ms)",
            if b.any_max_fraction == 0.5 {
                "half".to_string()
            } else {
                format!("{:.0}%", b.any_max_fraction * 100.0)
            },
            limit
        ),
        ok: worst.1 < limit,
        detail: format!(
            "longest wait {} ms on {}; {still} still waiting at the end",
            ms(worst.1),
            worst.0
        ),
    });
    let sem = r.run(Gate::Sem);
    out.push(Check {
        name: format!("throughput >= {}x the semaphore gate", b.min_ratio),
        ok: r.ratio >= b.min_ratio,
        detail: format!(
            "{:.0} vs {:.0} req/s = {:.3}x",
            r.run(Gate::Shmsched).rps,
            sem.rps,
            r.ratio
        ),
    });
    let errors: u64 = r.runs.iter().flat_map(|g| &g.wrk).map(|w| w.errors).sum();
    let other: u64 = r.runs.iter().map(|g| g.server.other_requests).sum();
    out.push(Check {
        name: "no HTTP or socket errors".into(),
        ok: errors == 0 && other == 0,
        detail: format!("wrk errors {errors}, server non-200 {other}"),
    });
    out
}

/// The comparison as Markdown tables.
pub fn render(r: &LoadReport, checks: &[Check]) -> String {
    use std::fmt::Write as _;
    let (a, b) = (r.run(Gate::Shmsched), r.run(Gate::Sem));
    let o = &r.opts;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "{} workers, cap {}, {} ms backend call; {} wrk × {} keep-alive connections ({}), {} s per gate\n",
        o.workers,
        o.cap,
        o.backend_ms,
        o.paths.len(),
        o.conns,
        o.paths.join(", "),
        o.seconds
    );
    let _ = writeln!(t, "| | shmsched | POSIX semaphore |\n|---|---:|---:|");
    let _ = writeln!(
        t,
        "| requests/s (wrk) | {:.0} ({:.2}×) | {:.0} (1.00×) |",
        a.rps, r.ratio, b.rps
    );
    // The paths requested, in PATHS order.
    let mix: Vec<&str> = PATHS
        .iter()
        .copied()
        .filter(|p| o.paths.iter().any(|q| q == p))
        .collect();
    for &p in &mix {
        let f = |g: &GateRun| -> f64 { g.wrk.iter().filter(|w| w.path == p).map(|w| w.rps).sum() };
        let _ = writeln!(t, "| {p} requests/s | {:.0} | {:.0} |", f(a), f(b));
    }
    let _ = writeln!(
        t,
        "| max running (cap {}): sampled / counted | {} / {} | {} / {} |",
        o.cap,
        a.server.max_running_sampled,
        a.server.max_running_counted,
        b.server.max_running_sampled,
        b.server.max_running_counted
    );
    let _ = writeln!(
        t,
        "| load average at start | {:.2} | {:.2} |\n",
        a.load_avg, b.load_avg
    );
    let _ = writeln!(
        t,
        "| wait for a slot, ms: p50 / p99 / max (served) | shmsched | POSIX semaphore |\n|---|---:|---:|"
    );
    for &p in &mix {
        let cell = |g: &GateRun| {
            g.server
                .path(p)
                .map_or("-".into(), |w| format!("{} ({})", triple(w), w.n))
        };
        let _ = writeln!(t, "| {p} | {} | {} |", cell(a), cell(b));
    }
    for i in 0..o.workers as usize {
        let cell = |g: &GateRun| {
            g.server.per_worker.get(i).map_or("-".into(), |w| {
                format!(
                    "{} ({}; {} conns, ≤ {} held, ≤ {} waiting)",
                    triple(&w.wait),
                    w.wait.n,
                    w.connections,
                    w.max_held,
                    w.max_waiting
                )
            })
        };
        let _ = writeln!(t, "| worker {i} | {} | {} |", cell(a), cell(b));
    }
    if mix.contains(&"/high") {
        for i in 0..o.workers as usize {
            let cell = |g: &GateRun| {
                g.server
                    .per_worker
                    .get(i)
                    .and_then(|w| w.paths.iter().find(|r| r.path == "/high"))
                    .map_or("-".into(), |r| {
                        format!("{} ({})", triple(&r.wait), r.wait.n)
                    })
            };
            let _ = writeln!(t, "| worker {i}, /high | {} | {} |", cell(a), cell(b));
        }
    }
    let _ = writeln!(t);
    for c in checks {
        let _ = writeln!(
            t,
            "{} {}: {}",
            if c.ok { "PASS" } else { "FAIL" },
            c.name,
            c.detail
        );
    }
    t
}

pub fn main(a: &Args) -> Result<bool, String> {
    if !have_wrk() {
        return Err("wrk not found: install it (apt-get install -y wrk)".into());
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let o = LoadOpts {
        seconds: a.seconds.unwrap_or(10.0).ceil(),
        conns: a.conns,
        paths: a.paths.clone(),
        accept_pause_ms: a.accept_pause_ms,
        workers: a.workers,
        cap: a.cap,
        backend_ms: a.backend_ms,
    };
    let report = run_load(&exe, &o)?;
    let checks = checks(&report, &Bounds::issue());
    print!("{}", render(&report, &checks));
    if let Some(path) = &a.json {
        let v = serde_json::json!({ "report": report, "checks": checks });
        std::fs::write(path, v.to_string()).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(checks.iter().all(|c| c.ok))
}
