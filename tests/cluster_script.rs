//! The lease script against a real `redis-server`, call by call: fencing,
//! water-filling by weight and band, the grant rule (Σ max(grant, has) ≤
//! pool, a shrinking host keeps what it has), expiry, learning mode after a
//! loss of state, refusals, the reload after `SCRIPT FLUSH`, unreadable
//! records, and the same results as revision 2's first, plainer code on
//! random requests.

mod redis_util;
mod tools;

use std::time::Duration;

use redis_util::RedisServer;
use shmsched::cluster::{BudgetClient, ClusterError, RenewReply, RenewRequest, BANDS};

const T: Duration = Duration::from_secs(5);

fn req(host: &str, token: u64, cap: u64, has: u64, want: u64, ttl_ms: u64) -> RenewRequest {
    let mut wants = [0; BANDS];
    wants[3] = want;
    RenewRequest {
        host: host.into(),
        token,
        capacity: cap,
        reserve: 0,
        weight: 1.0,
        has,
        safe: 0,
        ttl_ms,
        wants,
        leave: false,
    }
}

fn granted(r: RenewReply) -> (u64, u64, bool, u64) {
    match r {
        RenewReply::Granted {
            grant,
            token,
            learning,
            target,
            ..
        } => (grant, token, learning, target),
        RenewReply::Stale { .. } => panic!("unexpected stale"),
    }
}

/// Ends the learning mode a fresh budget starts in: registers a throwaway
/// host with a short TTL and waits it out.
fn past_learning(c: &mut BudgetClient, cap: u64) {
    let r = granted(c.renew(&req("warmup", 0, cap, 0, 0, 50), T).unwrap());
    assert!(r.2, "a new budget starts in learning mode");
    std::thread::sleep(Duration::from_millis(80));
}

#[test]
fn fencing_water_filling_and_the_grant_rule() {
    let Some(srv) = RedisServer::start("script") else {
        return;
    };
    let mut c = BudgetClient::new(&srv.url(), "s1", T).unwrap();
    past_learning(&mut c, 12);
    let ttl = 60_000;
    // Three hosts with unmet wants, equal weight: 4 each, given as they
    // register (nothing is held elsewhere).
    let (g, ta, l, tg) = granted(c.renew(&req("a", 0, 12, 0, 100, ttl), T).unwrap());
    assert!(!l);
    assert_eq!((g, tg), (12, 12), "alone, a gets the whole pool");
    // b registers while a may hold 12: b gets nothing yet, its target is 6.
    let (g, tb, _, tg) = granted(c.renew(&req("b", 0, 12, 0, 100, ttl), T).unwrap());
    assert_eq!((g, tg), (0, 6));
    assert!(tb > ta, "tokens grow: {ta} then {tb}");
    // a renews, has 12: it is shrunk to 6 but keeps holding 12 until its
    // holders release; nothing is handed out meanwhile.
    let (g, _, _, _) = granted(c.renew(&req("a", ta, 12, 12, 100, ttl), T).unwrap());
    assert_eq!(g, 6);
    let st = c.peek().unwrap();
    assert_eq!(st.held(), 12);
    let (g, _, _, _) = granted(c.renew(&req("b", tb, 12, 0, 100, ttl), T).unwrap());
    assert_eq!(g, 0, "a has not released yet");
    // a reports it released down to 6: b gets its 6.
    granted(c.renew(&req("a", ta, 12, 6, 100, ttl), T).unwrap());
    let (g, _, _, _) = granted(c.renew(&req("b", tb, 12, 0, 100, ttl), T).unwrap());
    assert_eq!(g, 6);
    // A third host: targets 4 each; shares move only as hosts release.
    let (_, tc, _, tg) = granted(c.renew(&req("c", 0, 12, 0, 100, ttl), T).unwrap());
    assert_eq!(tg, 4);
    let mut has = [("a", ta, 6u64), ("b", tb, 6), ("c", tc, 0)];
    for _ in 0..4 {
        for (h, t, hv) in has.iter_mut() {
            let (g, _, _, _) = granted(c.renew(&req(h, *t, 12, *hv, 100, ttl), T).unwrap());
            // The host applies its grant and its holders follow it.
            *hv = g;
            let st = c.peek().unwrap();
            assert!(st.held() <= 12, "held {} > 12", st.held());
            assert!(st.granted() <= 12);
        }
    }
    assert_eq!(has.map(|h| h.2), [4, 4, 4]);
    // Fencing: an old token is refused; the record stays the new owner's.
    match c.renew(&req("a", ta - 1, 12, 4, 100, ttl), T).unwrap() {
        RenewReply::Stale { .. } => {}
        other => panic!("a stale token must be refused, got {other:?}"),
    }
    // Re-registering a host replaces its record (and fences the old token).
    let (_, ta2, _, _) = granted(c.renew(&req("a", 0, 12, 4, 100, ttl), T).unwrap());
    assert!(ta2 > tc);
    assert!(matches!(
        c.renew(&req("a", ta, 12, 4, 100, ttl), T).unwrap(),
        RenewReply::Stale { .. }
    ));
    assert_eq!(c.peek().unwrap().hosts.len(), 3);
    // A mismatched capacity is refused, naming both.
    let e = c.renew(&req("d", 0, 13, 0, 1, ttl), T).unwrap_err();
    assert!(matches!(e, ClusterError::Mismatch { .. }), "{e}");
    let m = e.to_string();
    assert!(
        m.contains("capacity 12") && m.contains("capacity 13"),
        "{m}"
    );
}

#[test]
fn weights_bands_and_equal_shares_within_one_unit() {
    let Some(srv) = RedisServer::start("bands") else {
        return;
    };
    let mut c = BudgetClient::new(&srv.url(), "s2", T).unwrap();
    past_learning(&mut c, 10);
    let ttl = 60_000;
    // Weights 3:1, both unmet: 7.5 and 2.5 -> whole units 8 and 2 (or 7/3).
    let mut a = req("a", 0, 10, 0, 100, ttl);
    a.weight = 3.0;
    let (_, ta, _, _) = granted(c.renew(&a, T).unwrap());
    let (_, tb, _, tgb) = granted(c.renew(&req("b", 0, 10, 0, 100, ttl), T).unwrap());
    a.token = ta;
    a.has = 10;
    let (_, _, _, tga) = granted(c.renew(&a, T).unwrap());
    assert_eq!(tga + tgb, 10);
    assert!((7..=8).contains(&tga), "weight 3 of 4: {tga}");
    // Bands: b's high-priority want is served before a's normal one.
    let mut b = req("b", tb, 10, 0, 0, ttl);
    b.wants[0] = 6;
    a.wants = [0; BANDS];
    a.wants[3] = 100;
    let (_, _, _, tgb) = granted(c.renew(&b, T).unwrap());
    assert_eq!(tgb, 6, "the high band comes first");
    let (_, _, _, tga) = granted(c.renew(&a, T).unwrap());
    assert_eq!(tga, 4);
    // Seven equal hosts with unmet wants on 10 units: every target within
    // one unit of 10/7, and they add up to 10.
    let mut d = BudgetClient::new(&srv.url(), "s3", T).unwrap();
    past_learning(&mut d, 10);
    let mut targets = vec![];
    for i in 0..7 {
        granted(
            d.renew(&req(&format!("h{i}"), 0, 10, 0, 5, ttl), T)
                .unwrap(),
        );
    }
    let st = d.peek().unwrap();
    for h in &st.hosts {
        let (_, _, _, tg) = granted(d.renew(&req(&h.host, h.token, 10, 0, 5, ttl), T).unwrap());
        targets.push(tg);
    }
    assert_eq!(targets.iter().sum::<u64>(), 10, "{targets:?}");
    assert!(targets.iter().all(|&t| (1..=2).contains(&t)), "{targets:?}");
    // Wants below the fair share are met exactly, the rest shared out.
    let mut e = BudgetClient::new(&srv.url(), "s4", T).unwrap();
    past_learning(&mut e, 10);
    granted(e.renew(&req("small", 0, 10, 0, 1, ttl), T).unwrap());
    let (_, _, _, tg) = granted(e.renew(&req("big", 0, 10, 0, 100, ttl), T).unwrap());
    assert_eq!(tg, 9);
}

#[test]
fn expiry_learning_mode_and_safe_reserve() {
    let Some(mut srv) = RedisServer::start("learn") else {
        return;
    };
    let mut c = BudgetClient::new(&srv.url(), "s5", T).unwrap();
    // A new budget learns for one TTL: a host gets only what it has.
    let (g, ta, l, _) = granted(c.renew(&req("a", 0, 10, 3, 10, 300), T).unwrap());
    assert!(l);
    assert_eq!(g, 3);
    std::thread::sleep(Duration::from_millis(350));
    // The record expired with the TTL: the token is stale now.
    assert!(matches!(
        c.renew(&req("a", ta, 10, 3, 10, 300), T).unwrap(),
        RenewReply::Stale { .. }
    ));
    let (g, ta, l, _) = granted(c.renew(&req("a", 0, 10, 3, 10, 60_000), T).unwrap());
    assert!(!l);
    assert_eq!(g, 10);
    // Redis loses its state: the old token is stale, and the budget
    // relearns for one TTL: no host grows beyond what it has.
    srv.restart();
    let r = c.renew(&req("a", ta, 10, 10, 10, 300), T);
    let r = match r {
        Err(ClusterError::Redis(_)) => c.renew(&req("a", ta, 10, 10, 10, 300), T),
        r => r,
    };
    assert!(matches!(r.unwrap(), RenewReply::Stale { .. }));
    let (g, ta, l, _) = granted(c.renew(&req("a", 0, 10, 4, 10, 300), T).unwrap());
    assert!(l, "after a loss of state the budget learns");
    assert_eq!(g, 4, "learning grants what the host has");
    let (g, _, l, _) = granted(c.renew(&req("b", 0, 10, 0, 10, 300), T).unwrap());
    assert!(l);
    assert_eq!(g, 0);
    std::thread::sleep(Duration::from_millis(320));
    let (g, _, l, _) = granted(c.renew(&req("a", 0, 10, 4, 10, 60_000), T).unwrap());
    assert!(!l, "learning lasts one TTL");
    assert!(g >= 4);
    let _ = ta;
    // Safe capacities must fit in the reserve.
    let mut s = BudgetClient::new(&srv.url(), "s6", T).unwrap();
    let mut r1 = req("x", 0, 10, 0, 1, 60_000);
    r1.reserve = 3;
    r1.safe = 2;
    granted(s.renew(&r1, T).unwrap());
    let mut r2 = req("y", 0, 10, 0, 1, 60_000);
    r2.reserve = 3;
    r2.safe = 2;
    let e = s.renew(&r2, T).unwrap_err();
    assert!(
        matches!(e, ClusterError::SafeOverReserve { sum: 4, reserve: 3 }),
        "{e}"
    );
}

#[test]
fn script_reloaded_after_script_flush() {
    let Some(srv) = RedisServer::start("flush") else {
        return;
    };
    let mut c = BudgetClient::new(&srv.url(), "s7", T).unwrap();
    granted(c.renew(&req("a", 0, 5, 0, 1, 60_000), T).unwrap());
    assert_eq!(c.script_loads(), 1, "the first call loads the script");
    let mut con = srv.con();
    let exists: Vec<i64> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(c.script_hash())
        .query(&mut con)
        .unwrap();
    assert_eq!(exists, vec![1]);
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
    let st = c.peek().unwrap();
    assert_eq!(c.script_loads(), 2, "reloaded after SCRIPT FLUSH");
    assert_eq!(st.hosts.len(), 1);
    // Keys share one hash tag (Redis Cluster puts them in one slot).
    let keys = BudgetClient::keys("s7");
    assert_eq!(keys.len(), 3 + BANDS);
    for k in &keys {
        assert!(k.starts_with("{shmsched:s7}:"), "{k}");
    }
}

/// A record the script cannot read (revision 1's seven fields, left in
/// Redis by an older build, or garbage) never fails a call: `peek` skips
/// it, the first renewal that meets it rebuilds the aggregates from the
/// readable records (dropping the others), the host it belonged to is told
/// its token is stale and registers again, and the live hosts' grants and
/// shares are as before.
#[test]
fn unreadable_records_are_dropped_and_their_host_registers_again() {
    let Some(srv) = RedisServer::start("script-old") else {
        return;
    };
    let mut c = BudgetClient::new(&srv.url(), "s9", T).unwrap();
    past_learning(&mut c, 12);
    let ttl = 60_000;
    let (g, ta, _, _) = granted(c.renew(&req("a", 0, 12, 0, 100, ttl), T).unwrap());
    assert_eq!(g, 12);
    let (_, tb, _, tg) = granted(c.renew(&req("b", 0, 12, 0, 100, ttl), T).unwrap());
    assert_eq!(tg, 6);
    let st = c.peek().unwrap();
    let far = st.now_ms + 600_000;
    let hosts = &BudgetClient::keys("s9")[1];
    let mut con = srv.con();
    let _: () = redis::cmd("HSET")
        .arg(hosts)
        .arg("old")
        .arg(format!("7 3 0 0 {far} 1 0,0,0,4,0,0,0"))
        .arg("junk")
        .arg("not a record")
        .query(&mut con)
        .unwrap();
    // Unreadable records are not live hosts.
    let st = c.peek().unwrap();
    assert_eq!(st.hosts.len(), 2, "{:?}", st.hosts);
    // The old host renews with its old token: refused as stale (its record
    // is dropped with the rebuild), then it registers.
    match c.renew(&req("old", 7, 12, 0, 100, ttl), T).unwrap() {
        RenewReply::Stale { .. } => {}
        r => panic!("an unreadable record's token was accepted: {r:?}"),
    }
    let raw: Vec<String> = redis::cmd("HKEYS").arg(hosts).query(&mut con).unwrap();
    assert!(
        !raw.iter().any(|h| h == "junk" || h == "old"),
        "unreadable records are dropped: {raw:?}"
    );
    let (g, _, _, tg) = granted(c.renew(&req("old", 0, 12, 0, 100, ttl), T).unwrap());
    assert_eq!((g, tg), (0, 4), "a holds the pool: nothing yet, target 4");
    // The live hosts' records and the aggregates survived the rebuild: a
    // (holding 12) is shrunk to its share of three, b keeps waiting.
    let (g, _, _, tg) = granted(c.renew(&req("a", ta, 12, 12, 100, ttl), T).unwrap());
    assert_eq!((g, tg), (4, 4));
    let (g, _, _, tg) = granted(c.renew(&req("b", tb, 12, 0, 100, ttl), T).unwrap());
    assert_eq!((g, tg), (0, 4), "a still holds 12");
    let st = c.peek().unwrap();
    assert_eq!(st.hosts.len(), 3);
    assert_eq!(st.held(), 12);
}

/// The script against revision 2's first, plainer code
/// (`tests/redis_util/lease_v2_reference.lua`) on the same random requests
/// (hosts registering, renewing with new wants in several bands, weights,
/// reports of less held, leaving, stale tokens, replayed sequence numbers,
/// acknowledgements missing): the same replies, and in the end the same
/// records, band sets and aggregates. Every other step runs the reference
/// on the script's budget too: both read and write one format.
#[test]
fn the_script_matches_the_reference_on_random_requests() {
    let Some(srv) = RedisServer::start("script-ref") else {
        return;
    };
    let mut con = srv.con();
    let reference = redis::Script::new(include_str!("redis_util/lease_v2_reference.lua"));
    let script = redis::Script::new(include_str!("../src/cluster/lease.lua"));
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    for (round, pool) in [10u64, 100, 1000].into_iter().enumerate() {
        let (ka, kb) = (
            BudgetClient::keys(&format!("ref{round}")),
            BudgetClient::keys(&format!("new{round}")),
        );
        let mut tok = std::collections::HashMap::<u64, (u64, u64, u64, u64, f64)>::new();
        let mut seq = 1_000_000u64;
        for step in 0..1500u64 {
            if step == 3 {
                for k in [&ka, &kb] {
                    let _: () = redis::cmd("HSET")
                        .arg(&k[0])
                        .arg("learn_until")
                        .arg(0)
                        .query(&mut con)
                        .unwrap();
                }
            }
            let h = rnd(60);
            // (token here, token there, has, last accepted seq, weight)
            let e = tok.entry(h).or_insert((0, 0, 0, 0, 1.0));
            if rnd(20) == 0 {
                (e.0, e.1) = (0, 0);
            }
            if round != 1 && rnd(10) == 0 {
                e.4 = [1.0, 2.0, 0.5, 1.5, 3.0][rnd(5) as usize];
            }
            let mut wants = [0u64; BANDS];
            for _ in 0..rnd(4) {
                wants[rnd(4) as usize] = rnd(31);
            }
            let has = if rnd(5) == 0 { rnd(e.2 + 3) } else { e.2 };
            seq += 1;
            let s = if e.3 > 0 && rnd(30) == 0 { e.3 } else { seq };
            let ack = if rnd(10) == 0 { 0 } else { seq - 1 };
            let op = if rnd(33) == 0 { "leave" } else { "renew" };
            let ws: Vec<String> = wants.iter().map(u64::to_string).collect();
            let call =
                |sc: &redis::Script, keys: &[String], token: u64, con: &mut redis::Connection| {
                    let mut inv = sc.prepare_invoke();
                    for k in keys {
                        inv.key(k);
                    }
                    inv.arg(op)
                        .arg(format!("h{h}"))
                        .arg(token)
                        .arg(pool)
                        .arg(0)
                        .arg(format!("{:?}", e.4))
                        .arg(has)
                        .arg(0)
                        .arg(600_000)
                        .arg(ws.join(","))
                        .arg(s)
                        .arg(ack);
                    inv.invoke::<Vec<i64>>(con).unwrap()
                };
            let b_script = if step % 2 == 0 { &script } else { &reference };
            let va = call(&reference, &ka, e.0, &mut con);
            let vb = call(b_script, &kb, e.1, &mut con);
            let pick = |v: &[i64]| -> Vec<i64> {
                let mut f: Vec<i64> = [0, 1, 4, 6, 7, 8]
                    .iter()
                    .filter_map(|&i| v.get(i).copied())
                    .collect();
                if v[0] == 6 {
                    f.push(v[1]);
                }
                f
            };
            assert_eq!(
                pick(&va),
                pick(&vb),
                "step {step} of pool {pool}: {va:?} vs {vb:?}"
            );
            match va[0] {
                1 => (e.0, e.2, e.3) = (va[3] as u64, va[1] as u64, s),
                2 => e.0 = 0,
                _ => {}
            }
            match vb[0] {
                1 => e.1 = vb[3] as u64,
                2 => e.1 = 0,
                _ => {}
            }
        }
        // Records (but tokens and deadlines), band sets and aggregates.
        let recs = |k: &[String], con: &mut redis::Connection| {
            let m: std::collections::BTreeMap<String, String> =
                redis::cmd("HGETALL").arg(&k[1]).query(con).unwrap();
            m.into_iter()
                .map(|(h, r)| {
                    let f: Vec<String> = r.split(' ').map(str::to_string).collect();
                    let w: f64 = f[5].parse().unwrap();
                    (
                        h,
                        (
                            f[1].clone(),
                            f[2].clone(),
                            f[3].clone(),
                            w,
                            f[6].clone(),
                            f[8].clone(),
                        ),
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            recs(&ka, &mut con),
            recs(&kb, &mut con),
            "records of pool {pool}"
        );
        for b in 0..BANDS {
            let z = |k: &[String], con: &mut redis::Connection| {
                let v: Vec<(String, f64)> = redis::cmd("ZRANGE")
                    .arg(&k[3 + b])
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query(con)
                    .unwrap();
                v
            };
            assert_eq!(
                z(&ka, &mut con),
                z(&kb, &mut con),
                "band {b} of pool {pool}"
            );
        }
        let meta = |k: &[String], con: &mut redis::Connection| {
            let m: std::collections::BTreeMap<String, String> =
                redis::cmd("HGETALL").arg(&k[0]).query(con).unwrap();
            m.into_iter()
                .filter(|(f, _)| !["token", "epoch", "learn_until", "kept"].contains(&f.as_str()))
                .map(|(f, v)| {
                    let n: Vec<f64> = v.split(' ').map(|x| x.parse().unwrap()).collect();
                    (f, n)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            meta(&ka, &mut con),
            meta(&kb, &mut con),
            "aggregates of pool {pool}"
        );
    }
}
