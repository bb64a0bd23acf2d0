//! Record and replay of call logs (format: `docs/fair-share.md`, "Call
//! logs").
//!
//! A log is JSON lines: one `config` line, then `acquire`, `release`,
//! `stats`, `plan` and `report` calls with explicit `now_ms`. Because the
//! ledger has no timers and reads no clock, replaying a log on a fresh
//! ledger reproduces every answer exactly. [`replay`] writes one JSON line
//! per input line; a misuse error (or a malformed line) is reported on its
//! own line and replay continues.

use std::io::{self, BufRead, Write};

use serde_json::{json, Value};

use super::{num_value, AcquireResult, FairConfig, FairError, FairShare, DEFAULT_LEASE_CAPACITY};

/// Counts from one [`replay`] run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReplaySummary {
    /// Non-empty lines read.
    pub lines: usize,
    /// Lines answered with an error (misuse, malformed, no config).
    pub errors: usize,
    /// The part of `errors` that are not valid calls at all: malformed
    /// JSON, an unknown op, a missing or mistyped field, a missing or
    /// invalid config line. A log with any is not a faithful recording.
    pub malformed: usize,
}

/// The replay line for an acquire result of a ledger configured with
/// `cfg` (which names the lenders: a lease records them by index).
pub fn acquire_json(cfg: &FairConfig, r: &AcquireResult) -> Value {
    let name = |i: u32| {
        cfg.tenant_id(i)
            .map_or_else(|| format!("#{i}"), str::to_owned)
    };
    match r {
        Ok(Ok(l)) => json!({
            "ok": true,
            "lease": l.id,
            "own": num_value(l.own),
            "slices": l.slices.iter().map(|s| json!({"lender": name(s.lender), "units": num_value(s.units)})).collect::<Vec<_>>(),
            "deadline_ms": l.deadline_ms,
        }),
        Ok(Err(f)) => json!({
            "ok": false,
            "reason": f.reason.as_str(),
            "retry_after_ms": f.retry_after_ms,
            "blocking_leases": f.blocking_leases,
            "explanation": f.explanation,
        }),
        Err(e) => error_json(e),
    }
}

/// The replay line for a misuse error.
pub fn error_json(e: &FairError) -> Value {
    json!({"ok": false, "error": e.to_string()})
}

/// The replay line for `release`, `stats`, `plan` or `report` results.
pub fn value_json<T: serde::Serialize>(r: &Result<T, FairError>) -> Value {
    match r {
        Ok(v) => {
            serde_json::to_value(v).unwrap_or_else(|e| json!({"ok": false, "error": e.to_string()}))
        }
        Err(e) => error_json(e),
    }
}

/// The replay line for `release`.
pub fn release_json(r: &Result<(), FairError>) -> Value {
    match r {
        Ok(()) => json!({"ok": true}),
        Err(e) => error_json(e),
    }
}

fn field<'a>(o: &'a Value, k: &str) -> Result<&'a Value, String> {
    o.get(k).ok_or_else(|| format!("missing field \"{k}\""))
}

fn u64_field(o: &Value, k: &str) -> Result<u64, String> {
    let v = field(o, k)?;
    v.as_u64()
        .ok_or_else(|| format!("field \"{k}\" is {v}, expected a non-negative integer"))
}

fn f64_field(o: &Value, k: &str) -> Result<f64, String> {
    let v = field(o, k)?;
    v.as_f64()
        .ok_or_else(|| format!("field \"{k}\" is {v}, expected a number"))
}

fn str_field<'a>(o: &'a Value, k: &str) -> Result<&'a str, String> {
    let v = field(o, k)?;
    v.as_str()
        .ok_or_else(|| format!("field \"{k}\" is {v}, expected a string"))
}

/// Applies one log line to `ledger` (creating it on `config`) and returns
/// the output line.
pub fn replay_line(ledger: &mut Option<FairShare>, line: &str) -> Value {
    match replay_line_checked(ledger, line) {
        Ok(v) => v,
        Err(m) => json!({"ok": false, "error": m}),
    }
}

/// Like [`replay_line`], but a line that is not a valid call (malformed
/// JSON, unknown op, missing or mistyped field, no ledger yet, an invalid
/// config) is `Err(message)`; a call the ledger answers with a misuse error
/// is an `Ok` answer.
pub fn replay_line_checked(ledger: &mut Option<FairShare>, line: &str) -> Result<Value, String> {
    let mut o: Value =
        serde_json::from_str(line).map_err(|e| format!("malformed log line: {e}"))?;
    let op = str_field(&o, "op")?.to_string();
    if op == "config" {
        let obj = o.as_object_mut().ok_or("config line is not an object")?;
        obj.remove("op");
        let cap = match obj.remove("lease_capacity") {
            None => DEFAULT_LEASE_CAPACITY,
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| format!("lease_capacity {v} is not a non-negative integer"))?,
        };
        let cfg: FairConfig = serde_json::from_value(o)
            .map_err(|e| FairError::InvalidConfig(e.to_string()).to_string())?;
        *ledger = None;
        let l = FairShare::with_capacity(cfg, cap).map_err(|e| e.to_string())?;
        *ledger = Some(l);
        return Ok(json!({"ok": true}));
    }
    let l = ledger
        .as_mut()
        .ok_or("no ledger: the log must start with a config line")?;
    Ok(match op.as_str() {
        "acquire" => {
            let r = l.acquire(
                str_field(&o, "tenant")?,
                f64_field(&o, "cost")?,
                u64_field(&o, "hold_ms")?,
                u64_field(&o, "now_ms")?,
            );
            acquire_json(l.config(), &r)
        }
        "release" => release_json(&l.release(str_field(&o, "lease")?, u64_field(&o, "now_ms")?)),
        "stats" => value_json(&l.stats(u64_field(&o, "now_ms")?)),
        "plan" => value_json(&l.plan(u64_field(&o, "now_ms")?)),
        "report" => value_json(&l.fairness_report(u64_field(&o, "now_ms")?)),
        other => return Err(format!("unknown op \"{other}\"")),
    })
}

/// Merges the call logs recorded by several handles (or processes) of one
/// region ([`SharedFairShare::record_calls`](super::SharedFairShare::record_calls))
/// into one log in the order the ledger ran the calls: the first `config`
/// line, then every call line sorted by its `"seq"` (ties, which only calls
/// that changed nothing can have, keep their order). Lines that are not
/// JSON objects with a `"seq"` (other `config` lines) are dropped.
pub fn merge_call_logs(logs: &[&[String]]) -> Vec<String> {
    let mut config = None;
    let mut calls: Vec<(u64, &String)> = Vec::new();
    for log in logs {
        for line in log.iter() {
            let v: Value = match serde_json::from_str(line) {
                Ok(v) => v,
                Err(_) => continue,
            };
            match v.get("seq").and_then(Value::as_u64) {
                Some(seq) => calls.push((seq, line)),
                None if v.get("op").and_then(Value::as_str) == Some("config") => {
                    config.get_or_insert(line);
                }
                None => {}
            }
        }
    }
    calls.sort_by_key(|c| c.0);
    config
        .into_iter()
        .chain(calls.into_iter().map(|c| c.1))
        .cloned()
        .collect()
}

/// Replays a call log from `reader`, writing one JSON line per call to
/// `writer`. Blank lines are skipped. Only I/O failures stop the replay.
///
/// ```
/// let log = r#"{"op":"config","ceiling":100,"fairness_unit":"cost","tenants":[{"id":"a","weight":1},{"id":"b","weight":1}],"reclaim_horizon_ms":100,"idle_after_ms":1000,"started_at_ms":0}
/// {"op":"acquire","tenant":"b","cost":50,"hold_ms":1000,"now_ms":10000}
/// {"op":"release","lease":"b7","now_ms":10100}"#;
/// let mut out = Vec::new();
/// let sum = shmsched::fair::replay(log.as_bytes(), &mut out).unwrap();
/// assert_eq!(sum.lines, 3);
/// assert_eq!(sum.errors, 1);
/// let text = String::from_utf8(out).unwrap();
/// assert!(text.lines().nth(1).unwrap().starts_with(r#"{"deadline_ms":11000,"lease":"b1""#));
/// ```
pub fn replay<R: BufRead, W: Write>(reader: R, mut writer: W) -> io::Result<ReplaySummary> {
    let mut ledger = None;
    let mut sum = ReplaySummary::default();
    for line in reader.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        sum.lines += 1;
        let out = match replay_line_checked(&mut ledger, &line) {
            Ok(v) => v,
            Err(m) => {
                sum.malformed += 1;
                json!({"ok": false, "error": m})
            }
        };
        if out.get("error").is_some() {
            sum.errors += 1;
        }
        writeln!(writer, "{out}")?;
    }
    writer.flush()?;
    Ok(sum)
}
