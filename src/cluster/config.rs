//! An agent's configuration and its validation.

use std::time::Duration;

use super::ClusterError;

/// The largest capacity of a cluster budget (units or tokens per second):
/// 2,147,483,647, like a limiter's rate (and exact in the script's
/// floating-point arithmetic).
pub const MAX_CAPACITY: u64 = i32::MAX as u64;

/// The largest weight of a host.
pub const MAX_WEIGHT: f64 = 1e6;

/// The longest budget name, in bytes.
pub const MAX_BUDGET_LEN: usize = 64;

/// The longest host id, in bytes.
pub const MAX_HOST_LEN: usize = 256;

/// How an [`Agent`](super::Agent) leases its region's share of a cluster
/// budget. [`AgentConfig::new`] fills in the defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    /// The Redis URL: `redis://[user:password@]host:port/db`, or
    /// `unix:///path/to/socket` (`redis+unix://` too). TLS is not built in.
    pub redis_url: String,
    /// The budget's name (1–64 bytes of `A-Z a-z 0-9 . _ - :`); its keys are
    /// `{shmsched:NAME}:meta` and `{shmsched:NAME}:hosts` (one hash tag).
    pub budget: String,
    /// The budget's capacity C for the whole cluster: slots for a
    /// Scheduler, tokens per second for a Limiter (1..=2,147,483,647).
    /// Every agent of a budget must use the same.
    pub capacity: u64,
    /// The part S of the capacity set aside for the hosts' safe capacities
    /// (default 0); the rest, C − S, is leased. Every agent of a budget
    /// must use the same, and the safe capacities of all hosts must fit in
    /// it.
    pub safe_reserve: u64,
    /// What this host runs on when it holds no lease (before the first
    /// one, and once one lapses): default 0, fail closed. At most
    /// `safe_reserve`; a Limiter needs at least 1 (a rate cannot be 0).
    pub safe_capacity: u64,
    /// This host's weight in the water-filling (finite, > 0, ≤ 10⁶;
    /// default 1).
    pub weight: f64,
    /// How often the agent renews (default 1 s; at least 10 ms).
    pub renew_every: Duration,
    /// How long a lease is valid after the renewal that granted it was sent
    /// (default 10 × `renew_every`; at least 3 × `renew_every`).
    pub ttl: Duration,
    /// How long before its deadline an unrenewed lease is given up (the
    /// region lowered to its safe capacity), so that holders can release
    /// before Redis hands the units to others (default `ttl` / 4; `drain +
    /// renew_every` must stay below `ttl`).
    pub drain: Duration,
    /// This host's id in the budget; unique per region across the cluster.
    /// Default: `HOSTNAME:` followed by the region's path (or, for an
    /// anonymous region, its memfd's inode, creator's pid and creation
    /// time).
    pub host: Option<String>,
}

impl AgentConfig {
    /// A configuration with the defaults: no safe reserve, safe capacity 0,
    /// weight 1, renew every second, TTL 10 s, drain 2.5 s, host id from
    /// the host name and the region.
    pub fn new(redis_url: impl Into<String>, budget: impl Into<String>, capacity: u64) -> Self {
        AgentConfig {
            redis_url: redis_url.into(),
            budget: budget.into(),
            capacity,
            safe_reserve: 0,
            safe_capacity: 0,
            weight: 1.0,
            renew_every: Duration::from_secs(1),
            ttl: Duration::from_secs(10),
            drain: Duration::from_millis(2500),
            host: None,
        }
    }

    /// Sets the renew period, with the TTL at 10 periods and the drain at a
    /// quarter of the TTL.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = every;
        self.ttl = every.saturating_mul(10);
        self.drain = self.ttl / 4;
        self
    }

    /// Sets the safe reserve S and this host's safe capacity.
    pub fn safe(mut self, reserve: u64, capacity: u64) -> Self {
        self.safe_reserve = reserve;
        self.safe_capacity = capacity;
        self
    }

    /// Checks every value; errors name the value and its limit.
    pub fn validate(&self) -> Result<(), ClusterError> {
        let bad = |m: String| Err(ClusterError::Config(m));
        if let Err(e) = redis::Client::open(self.redis_url.as_str()) {
            return bad(format!(
                "redis URL {:?} is not a redis:// or unix:// URL: {e}",
                self.redis_url
            ));
        }
        check_budget(&self.budget)?;
        if self.capacity == 0 || self.capacity > MAX_CAPACITY {
            return bad(format!(
                "capacity {} is out of range 1..={MAX_CAPACITY}",
                self.capacity
            ));
        }
        if self.safe_reserve > self.capacity {
            return bad(format!(
                "safe_reserve {} is above the capacity {}",
                self.safe_reserve, self.capacity
            ));
        }
        if self.safe_capacity > self.safe_reserve {
            return bad(format!(
                "safe_capacity {} is above the safe_reserve {} (the hosts' safe capacities must \
                 fit in the reserve)",
                self.safe_capacity, self.safe_reserve
            ));
        }
        if !self.weight.is_finite() || self.weight <= 0.0 || self.weight > MAX_WEIGHT {
            return bad(format!(
                "weight {} is out of range: must be a finite number > 0 and <= {MAX_WEIGHT}",
                self.weight
            ));
        }
        let ms = |d: Duration| d.as_millis();
        if self.renew_every < Duration::from_millis(10)
            || self.renew_every > Duration::from_secs(3600)
        {
            return bad(format!(
                "renew_every {} ms is out of range 10..=3600000 ms",
                ms(self.renew_every)
            ));
        }
        if self.ttl < self.renew_every.saturating_mul(3) || self.ttl > Duration::from_secs(86_400) {
            return bad(format!(
                "ttl {} ms is out of range: at least 3 renew periods ({} ms), at most 86400000 ms",
                ms(self.ttl),
                ms(self.renew_every.saturating_mul(3))
            ));
        }
        if self.drain + self.renew_every >= self.ttl {
            return bad(format!(
                "drain {} ms leaves less than one renew period ({} ms) of the ttl {} ms",
                ms(self.drain),
                ms(self.renew_every),
                ms(self.ttl)
            ));
        }
        if let Some(h) = &self.host {
            check_host(h)?;
        }
        Ok(())
    }
}

/// Checks a budget name (1–64 bytes of `A-Z a-z 0-9 . _ - :`).
pub fn check_budget(b: &str) -> Result<(), ClusterError> {
    if b.is_empty()
        || b.len() > MAX_BUDGET_LEN
        || !b
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"._-:".contains(&c))
    {
        return Err(ClusterError::Config(format!(
            "budget name {b:?} must be 1..={MAX_BUDGET_LEN} bytes of A-Z a-z 0-9 . _ - :"
        )));
    }
    Ok(())
}

/// Checks a host id (1–256 bytes, printable, no whitespace).
pub fn check_host(h: &str) -> Result<(), ClusterError> {
    if h.is_empty()
        || h.len() > MAX_HOST_LEN
        || h.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(ClusterError::Config(format!(
            "host id {h:?} must be 1..={MAX_HOST_LEN} bytes without whitespace or control characters"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_errors_name_values() {
        let c = AgentConfig::new("redis://127.0.0.1/", "db", 100);
        c.validate().unwrap();
        assert_eq!(c.drain, c.ttl / 4);
        let e = |f: &dyn Fn(&mut AgentConfig)| {
            let mut c = AgentConfig::new("redis://127.0.0.1/", "db", 100);
            f(&mut c);
            c.validate().unwrap_err().to_string()
        };
        assert!(e(&|c| c.capacity = 0).contains("capacity 0"));
        assert!(e(&|c| c.capacity = MAX_CAPACITY + 1).contains("2147483648"));
        assert!(e(&|c| c.safe_reserve = 101).contains("101"));
        let m = e(&|c| {
            c.safe_reserve = 5;
            c.safe_capacity = 6
        });
        assert!(m.contains('6') && m.contains('5'), "{m}");
        assert!(e(&|c| c.weight = f64::NAN).contains("NaN"));
        assert!(e(&|c| c.weight = 0.0).contains("weight 0"));
        assert!(e(&|c| c.budget = "a{b}".into()).contains("a{b}"));
        assert!(e(&|c| c.redis_url = "http://x".into()).contains("http://x"));
        assert!(e(&|c| c.ttl = Duration::from_secs(2)).contains("2000 ms"));
        assert!(e(&|c| c.drain = Duration::from_secs(9)).contains("9000 ms"));
        assert!(e(&|c| c.host = Some("a b".into())).contains("a b"));
        assert!(e(&|c| c.renew_every = Duration::from_millis(1)).contains("1 ms"));
    }
}
