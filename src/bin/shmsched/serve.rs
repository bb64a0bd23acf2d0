//! `serve --listen ADDR [REGION…]`: Prometheus metrics over HTTP.
//!
//! `GET /metrics` reads the named regions (or every region `ls` finds,
//! looked up again at each scrape, so new regions appear and removed ones
//! go) read-only and answers in the text exposition format. The HTTP side is
//! `tiny_http`; requests are served one at a time, and SIGINT or SIGTERM
//! stops the server (exit 0: that is how a service is stopped).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

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
}

/// Reads every region to serve now.
fn scrape(a: &ServeArgs) -> Result<Vec<Scraped>, CliError> {
    let failed = |name: String, e: CliError| {
        eprintln!("shmsched serve: {}", e.msg);
        Scraped::Failed(name)
    };
    let read = |name: String, v: &RegionView| match build(&name, v) {
        Ok(sv) => Scraped::Ok(name, Box::new(sv)),
        Err(e) => failed(name, e),
    };
    if !a.regions.is_empty() {
        return Ok(a
            .regions
            .iter()
            .map(|name| match open_view(name) {
                Ok(v) => read(name.clone(), &v),
                Err(e) => failed(name.clone(), e),
            })
            .collect());
    }
    Ok(scan(a.dir.as_deref(), false)?
        .into_iter()
        .filter_map(|p| match RegionView::probe(&p) {
            Ok(Probe::Region(v)) => Some(read(display_name(&p), &v)),
            // Not a region (foreign, uninitialised, unreadable): not served.
            _ => None,
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
