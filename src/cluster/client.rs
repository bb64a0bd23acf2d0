//! The lease script and a synchronous client for it.
//!
//! The script (`lease.lua`, whose header explains the water-filling and the
//! grant rule) is sent by `EVALSHA`; when Redis does not know it (a restart,
//! `SCRIPT FLUSH`), the `redis` crate loads it and retries, so a flushed
//! script costs one round trip more, once. Every reply is decoded strictly:
//! a reply the script never sends is [`ClusterError::BadReply`], never a
//! panic. Any error drops the connection (a timed-out request may still be
//! answered later, and that answer must not be read as the next one's); the
//! next call connects again.

use std::time::Duration;

use redis::Value;

use super::config::{check_budget, check_host};
use super::ClusterError;

/// Priority bands a host's wants are given in, highest priority first (one
/// per [`Priority`](crate::Priority)).
pub const BANDS: usize = crate::priority::LEVELS;

const SCRIPT: &str = include_str!("lease.lua");

/// A lease script that replaces [`SCRIPT`] in every client this process
/// makes afterwards (test-only: [`use_lease_script`]).
static SCRIPT_OVERRIDE: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Test-only: every [`BudgetClient`] made afterwards in this process (an
/// agent's too) sends `source` instead of the built-in lease script, so a
/// test can run real agents against an older script revision with the
/// same wire format. Set at most once per process; a second call is
/// refused ([`ClusterError::Config`]). Not part of the API.
#[doc(hidden)]
pub fn use_lease_script(source: String) -> Result<(), ClusterError> {
    let leaked: &'static str = Box::leak(source.into_boxed_str());
    SCRIPT_OVERRIDE.set(leaked).map_err(|_| {
        ClusterError::Config("a lease script override is already set in this process".into())
    })
}

fn script_source() -> &'static str {
    SCRIPT_OVERRIDE.get().copied().unwrap_or(SCRIPT)
}

/// One renewal (or registration, with token 0).
#[derive(Debug, Clone, PartialEq)]
pub struct RenewRequest {
    /// The host's id in the budget.
    pub host: String,
    /// The fencing token from the last grant; 0 registers.
    pub token: u64,
    /// The budget's capacity C.
    pub capacity: u64,
    /// The budget's safe reserve S.
    pub reserve: u64,
    /// The host's weight.
    pub weight: f64,
    /// Pool units the host may hold now (above its safe capacity).
    pub has: u64,
    /// The host's safe capacity.
    pub safe: u64,
    /// The lease's time to live, ms.
    pub ttl_ms: u64,
    /// Pool units wanted per band, highest priority first.
    pub wants: [u64; BANDS],
    /// A last renewal with no wants: the record goes once `has` is 0.
    pub leave: bool,
}

/// What the script answered to a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewReply {
    /// The lease, renewed or new.
    Granted {
        /// Pool units granted (the ceiling is safe + grant).
        grant: u64,
        /// The record's deadline, ms of Redis time.
        deadline_ms: u64,
        /// The fencing token to present next time.
        token: u64,
        /// Redis is relearning its state: the grant is what the host had.
        learning: bool,
        /// Redis time of the renewal, ms.
        now_ms: u64,
        /// The host's water-filling target (the grant once others release).
        target: u64,
        /// Σ max(grant, has) over the live hosts, this one included.
        held_sum: u64,
        /// Live hosts, this one included.
        hosts: u64,
    },
    /// The token was stale (an old agent, or the record expired and was
    /// dropped): register again with token 0.
    Stale {
        /// Redis time, ms.
        now_ms: u64,
    },
}

/// One live host of a budget, as Redis holds it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HostRecord {
    /// Its id.
    pub host: String,
    /// Its fencing token.
    pub token: u64,
    /// Pool units granted.
    pub grant: u64,
    /// Pool units it last reported it may hold.
    pub has: u64,
    /// Its safe capacity.
    pub safe: u64,
    /// Its deadline, ms of Redis time.
    pub deadline_ms: u64,
    /// Its weight.
    pub weight: f64,
    /// Its wants per band, highest priority first.
    pub wants: Vec<u64>,
    /// The sequence number of its last accepted request.
    pub seq: u64,
    /// Its last water-filling target.
    pub target: u64,
}

/// A budget's state in Redis, read in one atomic script call.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BudgetState {
    /// Redis time, ms.
    pub now_ms: u64,
    /// When the current epoch began (0: Redis holds no state for it).
    pub epoch_ms: u64,
    /// Learning mode lasts until then.
    pub learn_until_ms: u64,
    /// The capacity C (0 if no state).
    pub capacity: u64,
    /// The safe reserve S.
    pub reserve: u64,
    /// The live hosts.
    pub hosts: Vec<HostRecord>,
}

impl BudgetState {
    /// Σ grants over the live hosts.
    pub fn granted(&self) -> u64 {
        self.hosts.iter().map(|h| h.grant).sum()
    }

    /// Σ max(grant, has) over the live hosts: what they may hold from the
    /// pool.
    pub fn held(&self) -> u64 {
        self.hosts.iter().map(|h| h.grant.max(h.has)).sum()
    }

    /// True while the script is in learning mode.
    pub fn learning(&self) -> bool {
        self.epoch_ms != 0 && self.now_ms < self.learn_until_ms
    }

    /// The record of `host`.
    pub fn host(&self, host: &str) -> Option<&HostRecord> {
        self.hosts.iter().find(|h| h.host == host)
    }
}

/// A connection to one budget's lease script. Connects on first use and
/// again after any error.
pub struct BudgetClient {
    client: redis::Client,
    con: Option<redis::Connection>,
    /// The socket timeouts `con` has now (two system calls to set: only
    /// when they change).
    con_timeout: Option<Duration>,
    budget: String,
    keys: Vec<String>,
    script: redis::Script,
    source: &'static str,
    timeout: Duration,
    loads: u64,
    seq: u64,
    learned: u64,
}

impl std::fmt::Debug for BudgetClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetClient")
            .field("budget", &self.budget)
            .field("connected", &self.con.is_some())
            .finish_non_exhaustive()
    }
}

impl BudgetClient {
    /// A client of budget `budget` at `redis_url`, whose calls give up after
    /// `timeout` (connect, send and receive each). Does not connect yet.
    pub fn new(redis_url: &str, budget: &str, timeout: Duration) -> Result<Self, ClusterError> {
        check_budget(budget)?;
        let client = redis::Client::open(redis_url).map_err(|e| {
            ClusterError::Config(format!("redis URL {redis_url:?} is not usable: {e}"))
        })?;
        Ok(BudgetClient {
            client,
            con: None,
            con_timeout: None,
            budget: budget.to_string(),
            keys: BudgetClient::keys(budget),
            script: redis::Script::new(script_source()),
            source: script_source(),
            timeout: timeout.max(Duration::from_millis(1)),
            loads: 0,
            seq: 0,
            learned: 0,
        })
    }

    /// The budget's keys, all under one hash tag (Redis Cluster and Valkey
    /// keep them in one slot): `{shmsched:NAME}:meta` (epoch, fencing
    /// counter and aggregates), `{shmsched:NAME}:hosts` (the records),
    /// `{shmsched:NAME}:dl` (hosts by deadline) and one
    /// `{shmsched:NAME}:band:B` per priority band (hosts by saturation
    /// level).
    pub fn keys(budget: &str) -> Vec<String> {
        let mut k = vec![
            format!("{{shmsched:{budget}}}:meta"),
            format!("{{shmsched:{budget}}}:hosts"),
            format!("{{shmsched:{budget}}}:dl"),
        ];
        for b in 1..=BANDS {
            k.push(format!("{{shmsched:{budget}}}:band:{b}"));
        }
        k
    }

    /// The sequence number of the last request sent (0: none yet).
    pub fn last_seq(&self) -> u64 {
        self.seq
    }

    /// The sequence number of the last grant read (what the next request
    /// acknowledges; 0: none yet).
    pub fn learned_seq(&self) -> u64 {
        self.learned
    }

    /// The next request's sequence number: above every earlier one of this
    /// client and at least the wall clock in µs, so that a new client of
    /// the same host (a takeover) starts above the old one's.
    fn next_seq(&mut self) -> u64 {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        self.seq = self.seq.saturating_add(1).max(wall);
        self.seq
    }

    /// The script's SHA1 (what `EVALSHA` names).
    pub fn script_hash(&self) -> &str {
        self.script.get_hash()
    }

    /// The budget's name.
    pub fn budget(&self) -> &str {
        &self.budget
    }

    /// Times the script was (re)loaded because Redis did not know it.
    pub fn script_loads(&self) -> u64 {
        self.loads
    }

    /// Drops the connection (the next call connects again).
    pub fn disconnect(&mut self) {
        self.con = None;
    }

    fn con(&mut self, timeout: Duration) -> Result<&mut redis::Connection, ClusterError> {
        let t = timeout.max(Duration::from_millis(1));
        if self.con.is_none() {
            let c = self
                .client
                .get_connection_with_timeout(t)
                .map_err(|e| ClusterError::Redis(format!("connecting: {e}")))?;
            self.con = Some(c);
            self.con_timeout = None;
        }
        let c = self.con.as_mut().expect("connected above");
        if self.con_timeout != Some(t) {
            c.set_read_timeout(Some(t))?;
            c.set_write_timeout(Some(t))?;
            self.con_timeout = Some(t);
        }
        Ok(c)
    }

    fn call(&mut self, args: &[String], timeout: Duration) -> Result<Value, ClusterError> {
        let r = self.call_once(args, timeout);
        if r.is_err() {
            self.con = None;
        }
        r
    }

    fn call_once(&mut self, args: &[String], timeout: Duration) -> Result<Value, ClusterError> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash()).arg(self.keys.len());
        for k in &self.keys {
            cmd.arg(k);
        }
        for a in args {
            cmd.arg(a);
        }
        let source = self.source;
        let con = self.con(timeout)?;
        match cmd.query::<Value>(con) {
            Ok(v) => Ok(v),
            Err(e) if e.kind() == redis::ErrorKind::NoScriptError => {
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(source)
                    .query::<String>(con)?;
                self.loads += 1;
                let con = self.con.as_mut().expect("still connected");
                Ok(cmd.query::<Value>(con)?)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Renews (or registers) one host's lease. `timeout` bounds this call.
    ///
    /// Each call carries a new sequence number and acknowledges the last
    /// grant this client read; a reply is matched to its request by that
    /// number. A refusal for sequence ([`ClusterError::OutOfSequence`],
    /// only when another client of the host sent a higher number, say with
    /// a clock set back) moves this client's numbers past it: the next call
    /// is accepted.
    pub fn renew(
        &mut self,
        req: &RenewRequest,
        timeout: Duration,
    ) -> Result<RenewReply, ClusterError> {
        check_host(&req.host)?;
        let wants: Vec<String> = req.wants.iter().map(u64::to_string).collect();
        let args = vec![
            if req.leave { "leave" } else { "renew" }.to_string(),
            req.host.clone(),
            req.token.to_string(),
            req.capacity.to_string(),
            req.reserve.to_string(),
            format!("{:?}", req.weight),
            req.has.to_string(),
            req.safe.to_string(),
            req.ttl_ms.to_string(),
            wants.join(","),
        ];
        let seq = self.next_seq();
        let mut args = args;
        args.push(seq.to_string());
        args.push(self.learned.to_string());
        let v = self.call(&args, timeout)?;
        match decode_renew(&v, &self.budget, (req.capacity, req.reserve), seq) {
            Ok(r) => {
                if let RenewReply::Granted { .. } = r {
                    self.learned = seq;
                }
                Ok(r)
            }
            Err(e) => {
                if let ClusterError::OutOfSequence { last, .. } = e {
                    self.seq = self.seq.max(last);
                }
                Err(e)
            }
        }
    }

    /// The budget's state, read atomically (live hosts only).
    pub fn peek(&mut self) -> Result<BudgetState, ClusterError> {
        let v = self.call(&["peek".to_string()], self.timeout)?;
        decode_peek(&v)
    }

    /// The per-call timeout given at construction.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

fn int(v: &Value, what: &str) -> Result<u64, ClusterError> {
    let bad = || ClusterError::BadReply(format!("{what} is {v:?}, not a non-negative integer"));
    match v {
        Value::Int(i) => u64::try_from(*i).map_err(|_| bad()),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(bad),
        _ => Err(bad()),
    }
}

fn array<'a>(v: &'a Value, what: &str) -> Result<&'a [Value], ClusterError> {
    match v {
        Value::Array(a) => Ok(a),
        _ => Err(ClusterError::BadReply(format!(
            "{what} is {v:?}, not an array"
        ))),
    }
}

fn decode_renew(
    v: &Value,
    budget: &str,
    ours: (u64, u64),
    seq: u64,
) -> Result<RenewReply, ClusterError> {
    let a = array(v, "the renewal reply")?;
    let f = |i: usize, what: &str| -> Result<u64, ClusterError> {
        a.get(i).map_or_else(
            || {
                Err(ClusterError::BadReply(format!(
                    "the renewal reply has {} fields, {what} (field {i}) is missing",
                    a.len()
                )))
            },
            |v| int(v, what),
        )
    };
    match f(0, "status")? {
        1 => {
            let mode = f(4, "mode")?;
            if mode != 1 && mode != 2 {
                return Err(ClusterError::BadReply(format!(
                    "mode {mode} is not 1 (normal) or 2 (learning)"
                )));
            }
            if a.len() != 10 {
                return Err(ClusterError::BadReply(format!(
                    "a grant has 10 fields, this one {}",
                    a.len()
                )));
            }
            let echoed = f(9, "seq")?;
            if echoed != seq {
                return Err(ClusterError::BadReply(format!(
                    "the grant answers request {echoed}, not this one ({seq})"
                )));
            }
            Ok(RenewReply::Granted {
                grant: f(1, "grant")?,
                deadline_ms: f(2, "deadline")?,
                token: f(3, "token")?,
                learning: mode == 2,
                now_ms: f(5, "now")?,
                target: f(6, "target")?,
                held_sum: f(7, "held sum")?,
                hosts: f(8, "hosts")?,
            })
        }
        2 => Ok(RenewReply::Stale {
            now_ms: f(5, "now")?,
        }),
        3 => Err(ClusterError::Mismatch {
            budget: budget.to_string(),
            stored: (f(1, "stored capacity")?, f(2, "stored reserve")?),
            ours,
        }),
        4 => Err(ClusterError::SafeOverReserve {
            sum: f(1, "safe sum")?,
            reserve: f(2, "reserve")?,
        }),
        5 => Err(ClusterError::BadReply(format!(
            "the script refused argument {} of the renewal",
            f(1, "argument index")?
        ))),
        6 => Err(ClusterError::OutOfSequence {
            seq,
            last: f(1, "last seq")?,
        }),
        s => Err(ClusterError::BadReply(format!(
            "status {s} is not one of 1..=6"
        ))),
    }
}

fn text(v: &Value, what: &str) -> Result<String, ClusterError> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone())
            .map_err(|_| ClusterError::BadReply(format!("{what} is not UTF-8"))),
        Value::SimpleString(s) => Ok(s.clone()),
        _ => Err(ClusterError::BadReply(format!(
            "{what} is {v:?}, not a string"
        ))),
    }
}

/// Parses a stored host record ("token grant has safe deadline weight
/// w1,w2,… seq target").
fn parse_record(host: String, rec: &str) -> Result<HostRecord, ClusterError> {
    let bad = || ClusterError::BadReply(format!("host {host:?} has a malformed record {rec:?}"));
    let f: Vec<&str> = rec.split_whitespace().collect();
    if f.len() != 9 {
        return Err(bad());
    }
    let n = |i: usize| f[i].parse::<u64>().map_err(|_| bad());
    let weight: f64 = f[5].parse().map_err(|_| bad())?;
    let wants = f[6]
        .split(',')
        .map(|w| w.parse::<u64>().map_err(|_| bad()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(HostRecord {
        token: n(0)?,
        grant: n(1)?,
        has: n(2)?,
        safe: n(3)?,
        deadline_ms: n(4)?,
        weight,
        wants,
        seq: n(7)?,
        target: n(8)?,
        host,
    })
}

fn decode_peek(v: &Value) -> Result<BudgetState, ClusterError> {
    let a = array(v, "the peek reply")?;
    if a.len() < 5 || (a.len() - 5) % 2 != 0 {
        return Err(ClusterError::BadReply(format!(
            "the peek reply has {} fields: 5 and pairs expected",
            a.len()
        )));
    }
    let hosts = a[5..]
        .chunks(2)
        .map(|p| parse_record(text(&p[0], "a host id")?, &text(&p[1], "a record")?))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(BudgetState {
        now_ms: int(&a[0], "now")?,
        epoch_ms: int(&a[1], "epoch")?,
        learn_until_ms: int(&a[2], "learn_until")?,
        capacity: int(&a[3], "capacity")?,
        reserve: int(&a[4], "reserve")?,
        hosts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_replies_are_errors_not_panics() {
        let ours = (10, 0);
        for v in [
            Value::Nil,
            Value::Int(1),
            Value::Array(vec![]),
            Value::Array(vec![Value::Int(1), Value::Int(2)]),
            Value::Array(vec![Value::Int(-1)]),
            Value::Array(vec![Value::Int(9)]),
            Value::Array((0..9).map(|_| Value::Int(1)).chain([Value::Nil]).collect()),
            Value::Array(vec![Value::Okay; 9]),
        ] {
            assert!(decode_renew(&v, "b", ours, 5).is_err(), "{v:?}");
        }
        let ok = Value::Array([1, 3, 100, 7, 2, 50, 4, 9, 2, 5].map(Value::Int).to_vec());
        assert!(
            decode_renew(&ok, "b", ours, 6).is_err(),
            "a reply to another request"
        );
        let late = Value::Array([6, 9, 0, 0, 0, 50, 0, 0, 2].map(Value::Int).to_vec());
        assert!(matches!(
            decode_renew(&late, "b", ours, 5),
            Err(ClusterError::OutOfSequence { seq: 5, last: 9 })
        ));
        assert_eq!(
            decode_renew(&ok, "b", ours, 5).unwrap(),
            RenewReply::Granted {
                grant: 3,
                deadline_ms: 100,
                token: 7,
                learning: true,
                now_ms: 50,
                target: 4,
                held_sum: 9,
                hosts: 2
            }
        );
        let mm = Value::Array([3, 20, 5].map(Value::Int).to_vec());
        let e = decode_renew(&mm, "b", ours, 5).unwrap_err().to_string();
        assert!(
            e.contains("capacity 20") && e.contains("capacity 10"),
            "{e}"
        );
        for v in [
            Value::Array(vec![Value::Int(1); 4]),
            Value::Array(vec![Value::Int(1); 6]),
            Value::Array(
                [1, 2, 3, 4, 5]
                    .map(Value::Int)
                    .into_iter()
                    .chain([
                        Value::BulkString(b"h".to_vec()),
                        Value::BulkString(b"1 2 3".to_vec()),
                    ])
                    .collect(),
            ),
        ] {
            assert!(decode_peek(&v).is_err(), "{v:?}");
        }
        let r = parse_record("h".into(), "7 3 2 1 99 1.5 1,0,2 12 4").unwrap();
        assert_eq!((r.token, r.grant, r.has, r.safe), (7, 3, 2, 1));
        assert_eq!((r.seq, r.target), (12, 4));
        assert!(parse_record("h".into(), "7 3 2 1 99 1.5 1,0,2").is_err());
        assert_eq!(r.wants, vec![1, 0, 2]);
        assert!(parse_record("h".into(), "7 3 2 1 99 x 1 1 1").is_err());
    }
}
