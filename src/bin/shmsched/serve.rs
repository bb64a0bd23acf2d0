//! `serve --listen ADDR [REGION…]`: Prometheus metrics over HTTP.
//!
//! `GET /metrics` reads the named regions (or every region `ls` finds,
//! looked up again at each scrape, so new regions appear and removed ones
//! go) read-only and answers in the text exposition format. The HTTP side is
//! `tiny_http`; requests are served one at a time, and SIGINT or SIGTERM
//! stops the server (exit 0: that is how a service is stopped).
//!
//! Each region is read on a thread of its own, and a scrape waits for each
//! at most `--region-timeout` (1 s by default): a region that cannot be read
//! in time (its file locked by a stopped initialiser, say) is reported with
//! `shmsched_region_up 0` and a line on stderr, and the other regions are
//! answered all the same. (Reading takes no lock of the ledger's, so an
//! application stopped inside a FairShare call does not hold a scrape up.)

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Args;
use shmsched::region::{Probe, RegionView};
use tiny_http::{Header, Method, Response, Server};

use crate::ls::{display_name, scan};
use crate::metrics::{self, Scraped};
use crate::stat::{build, open_view};
use crate::{signals, CliError, CliResult, ErrorKind};

/// Arguments of `serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on, `HOST:PORT` (port 0 picks a free one; the
    /// address is printed on stderr).
    #[arg(long)]
    listen: String,
    /// Regions to serve (names or paths); default: every region in DIR.
    regions: Vec<String>,
    /// Where to look for regions when none is named (default /dev/shm).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Longest a scrape waits for one region, in milliseconds; a region
    /// not read in time is reported down (`shmsched_region_up 0`).
    #[arg(long, default_value_t = 1000, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    region_timeout: u64,
}

/// What one region's reader thread reports: `None` for a file that is not
/// a region (not served when scanning).
type Read = Option<Scraped>;

/// Reads `name` (named on the command line).
fn read_named(name: String) -> Read {
    Some(match open_view(&name) {
        Ok(v) => read_view(name, &v),
        Err(e) => failed(name, &e),
    })
}

/// Reads the file `path` found by scanning; not a region: not served.
fn read_scanned(path: PathBuf) -> Read {
    match RegionView::probe(&path) {
        Ok(Probe::Region(v)) => Some(read_view(display_name(&path), &v)),
        // Not a region (foreign, uninitialised, unreadable): not served.
        _ => None,
    }
}

fn read_view(name: String, v: &RegionView) -> Scraped {
    match build(&name, v) {
        Ok(sv) => Scraped::Ok(name, Box::new(sv)),
        Err(e) => failed(name, &e),
    }
}

fn failed(name: String, e: &CliError) -> Scraped {
    eprintln!("shmsched serve: {}", e.msg);
    Scraped::Failed(name)
}

/// Reads every region to serve now, each on its own thread, waiting for
/// each at most the region timeout (all of them at once).
fn scrape(a: &ServeArgs) -> Result<Vec<Scraped>, CliError> {
    let jobs: Vec<(String, Box<dyn FnOnce() -> Read + Send>)> = if a.regions.is_empty() {
        scan(a.dir.as_deref(), false)?
            .into_iter()
            .map(|p| {
                let label = display_name(&p);
                (
                    label,
                    Box::new(move || read_scanned(p)) as Box<dyn FnOnce() -> Read + Send>,
                )
            })
            .collect()
    } else {
        a.regions
            .iter()
            .map(|n| {
                let name = n.clone();
                (
                    n.clone(),
                    Box::new(move || read_named(name)) as Box<dyn FnOnce() -> Read + Send>,
                )
            })
            .collect()
    };
    let (tx, rx) = mpsc::channel::<(usize, Read)>();
    let mut out: Vec<Option<Read>> = Vec::with_capacity(jobs.len());
    let mut labels = Vec::with_capacity(jobs.len());
    for (i, (label, job)) in jobs.into_iter().enumerate() {
        let tx = tx.clone();
        labels.push(label);
        out.push(None);
        // A reader that outlives the scrape finishes on its own (every wait
        // of a region read is bounded) and its answer is dropped.
        let spawned = std::thread::Builder::new()
            .name("serve-read".into())
            .spawn(move || {
                let _ = tx.send((i, job()));
            });
        if let Err(e) = spawned {
            return Err(CliError::from(format!("starting a reader thread: {e}")));
        }
    }
    drop(tx);
    let timeout = Duration::from_millis(a.region_timeout);
    let deadline = Instant::now() + timeout;
    let mut pending = out.len();
    while pending > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((i, r)) => {
                if let Some(slot) = out.get_mut(i) {
                    *slot = Some(r);
                    pending -= 1;
                }
            }
            Err(_) => break,
        }
    }
    Ok(out
        .into_iter()
        .zip(labels)
        .filter_map(|(r, label)| match r {
            Some(r) => r,
            None => {
                eprintln!(
                    "shmsched serve: region {label:?} was not read within {} ms; reported down",
                    timeout.as_millis()
                );
                Some(Scraped::Failed(label))
            }
        })
        .collect())
}

fn header(name: &str, value: &str) -> Header {
    // Both are ASCII constants of this file.
    Header::from_bytes(name.as_bytes(), value.as_bytes()).expect("valid header")
}

fn respond(a: &ServeArgs, req: tiny_http::Request) {
    let path = req.url().split('?').next().unwrap_or("");
    let r = match (req.method(), path) {
        (Method::Get | Method::Head, "/metrics") => match scrape(a)
            .and_then(|s| metrics::encode(&s))
        {
            Ok(text) => Response::from_string(text)
                .with_header(header("Content-Type", metrics::CONTENT_TYPE)),
            Err(e) => Response::from_string(format!("shmsched: {}\n", e.msg)).with_status_code(500),
        },
        (Method::Get | Method::Head, "/") => {
            Response::from_string("shmsched: region metrics are at /metrics\n")
        }
        (Method::Get | Method::Head, _) => {
            Response::from_string("not found; try /metrics\n").with_status_code(404)
        }
        _ => Response::from_string("method not allowed\n")
            .with_status_code(405)
            .with_header(header("Allow", "GET, HEAD")),
    };
    // A client that hung up is its own problem; keep serving.
    let _ = req.respond(r);
}

/// `serve`.
pub fn serve(a: ServeArgs) -> CliResult {
    signals::install();
    let server = Server::http(&a.listen).map_err(|e| {
        CliError::new(
            ErrorKind::InvalidInput,
            format!("cannot listen on {:?}: {e}", a.listen),
        )
    })?;
    eprintln!(
        "shmsched serve: listening on http://{}/metrics",
        server.server_addr()
    );
    loop {
        if signals::caught().is_some() {
            return Ok(ExitCode::SUCCESS);
        }
        match server.recv_timeout(Duration::from_millis(100)) {
            Ok(Some(req)) => respond(&a, req),
            Ok(None) => {}
            Err(e) => return Err(CliError::from(format!("accepting a connection: {e}"))),
        }
    }
}
