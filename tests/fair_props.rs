//! Property test over random traces: the ceiling, the horizon, lending only
//! from idle lenders, the reclaim bound, and exact replay.

use proptest::prelude::*;
use shmsched::fair::replay::{acquire_json, release_json, value_json};
use shmsched::fair::{replay, FairConfig, FairShare, FairnessUnit, TOLERANCE};

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        tenant: usize,
        cost: f64,
        hold: u64,
        dt: u64,
    },
    Release {
        pick: usize,
        dt: u64,
    },
    Stats {
        dt: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0usize..4, 0u32..80, 1u64..300, 0u64..60).prop_map(|(tenant, c, hold, dt)| Op::Acquire {
            tenant,
            cost: c as f64 * 0.75,
            hold,
            dt
        }),
        3 => (any::<usize>(), 0u64..60).prop_map(|(pick, dt)| Op::Release { pick, dt }),
        1 => (0u64..400).prop_map(|dt| Op::Stats { dt }),
    ]
}

struct Live {
    id: String,
    tenant: usize,
    deadline: u64,
    lenders: Vec<usize>,
}

const IDS: [&str; 4] = ["t0", "t1", "t2", "t3"];

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn random_traces_keep_the_invariants(
        weights in proptest::collection::vec(1u32..5, 4),
        requests in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let (h, idle) = (100u64, 250u64);
        let ceiling = 120.0;
        let cfg = FairConfig {
            ceiling,
            fairness_unit: if requests { FairnessUnit::Requests } else { FairnessUnit::Cost },
            tenants: IDS.iter().zip(&weights).map(|(n, w)| (n.to_string(), *w as f64)).collect(),
            reclaim_horizon_ms: h,
            idle_after_ms: idle,
            started_at_ms: 0,
        };
        let mut f = FairShare::recording(cfg, 256).unwrap();
        let mut out = vec![serde_json::json!({"ok": true})];
        let mut now = 0u64;
        let mut last_activity = [0u64; 4];
        let mut live: Vec<Live> = Vec::new();
        for op in ops {
            match op {
                Op::Acquire { tenant, cost, hold, dt } => {
                    now += dt;
                    // The bound: when a tenant asks, every lease holding its
                    // units ends within the horizon (or is overrun).
                    for l in live.iter().filter(|l| l.lenders.contains(&tenant)) {
                        prop_assert!(l.deadline <= now + h || now > l.deadline);
                    }
                    let r = f.acquire(IDS[tenant], cost, hold, now);
                    out.push(acquire_json(f.config(), &r));
                    let r = r.unwrap();
                    if let Ok(lease) = &r {
                        let lenders: Vec<usize> = lease.slices.iter()
                            .map(|s| s.lender as usize).collect();
                        prop_assert!(lenders.iter().all(|&l| l < IDS.len()));
                        if !lenders.is_empty() {
                            prop_assert!(hold <= h, "borrowed lease held {} > horizon", hold);
                        }
                        for &l in &lenders {
                            prop_assert!(l != tenant);
                            prop_assert!(!live.iter().any(|x| x.tenant == l), "lender {} holds a lease", l);
                            prop_assert!(now - last_activity[l] >= idle, "lender {} active at {}", l, last_activity[l]);
                        }
                        live.push(Live { id: lease.id.to_string(), tenant, deadline: lease.deadline_ms, lenders });
                    }
                    last_activity[tenant] = now;
                }
                Op::Release { pick, dt } => {
                    now += dt;
                    if live.is_empty() {
                        let r = f.release("t09", now);
                        prop_assert!(r.is_err());
                        out.push(release_json(&r));
                        continue;
                    }
                    let l = live.remove(pick % live.len());
                    let r = f.release(&l.id, now);
                    out.push(release_json(&r));
                    prop_assert!(r.is_ok());
                    last_activity[l.tenant] = now;
                }
                Op::Stats { dt } => {
                    now += dt;
                    let s = f.stats(now);
                    out.push(value_json(&s));
                    let s = s.unwrap();
                    let over: Vec<&String> = live.iter().filter(|l| now > l.deadline).map(|l| &l.id).collect();
                    prop_assert_eq!(s.overrun_leases.len(), over.len());
                }
            }
            let s = f.stats(now);
            out.push(value_json(&s));
            let s = s.unwrap();
            let held: f64 = s.tenants.iter().map(|t| t.held).sum();
            prop_assert!(held <= ceiling + 8.0 * TOLERANCE, "held {} > ceiling", held);
            let lent: f64 = s.tenants.iter().map(|t| t.lent).sum();
            let borrowed: f64 = s.tenants.iter().map(|t| t.borrowed).sum();
            prop_assert!((lent - borrowed).abs() < 1e-6);
            for t in &s.tenants {
                prop_assert!(t.held - t.borrowed + t.lent <= t.guarantee + 4.0 * TOLERANCE);
                prop_assert!(t.deficit_unit_ms >= 0.0 && t.deficit_unit_ms.is_finite());
            }
        }
        // Replaying the recorded log reproduces every answer.
        let log = f.call_log().unwrap().join("\n");
        let mut buf = Vec::new();
        replay(log.as_bytes(), &mut buf).unwrap();
        let replayed: Vec<serde_json::Value> =
            String::from_utf8(buf).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        prop_assert_eq!(replayed, out);
    }
}
