//! Three "hosts" sharing one cluster budget of 12 slots through Redis, in
//! one process for the sake of a demo: each host is its own region with its
//! own scheduler, agent and busy worker threads whose load changes at
//! random. Prints each host's grant, ceiling and slots held twice a second
//! for about 10 seconds, with the sums (which never exceed 12).
//!
//! ```sh
//! redis-server --port 6379 --save '' --appendonly no --daemonize yes
//! cargo run --release --example cluster -- redis://127.0.0.1:6379/
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shmsched::cluster::{Agent, AgentConfig};
use shmsched::region::Region;
use shmsched::scheduler::Scheduler;
use shmsched::Priority;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".into());
    let budget = format!("example-{}", std::process::id());
    let stop = Arc::new(AtomicBool::new(false));
    let mut hosts = vec![];
    let mut threads = vec![];
    for h in 0..3u64 {
        let sched = Scheduler::shared(&Region::anonymous()?, 10)?;
        let mut cfg = AgentConfig::new(url.clone(), budget.clone(), 12)
            .renew_every(Duration::from_millis(200));
        cfg.host = Some(format!("host-{h}"));
        let agent = Agent::start(&sched, cfg)?;
        for t in 0..6u64 {
            let (sched, stop) = (sched.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                let mut x = (h * 97 + t * 13 + 1) | 1;
                let mut rnd = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                let mut busy_until = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    if Instant::now() > busy_until + Duration::from_millis(rnd() % 1500) {
                        // Idle for a while, then busy for a while.
                        std::thread::sleep(Duration::from_millis(rnd() % 1500));
                        busy_until = Instant::now() + Duration::from_millis(rnd() % 2000);
                    }
                    if let Ok(p) =
                        sched.acquire_timeout(Priority::Normal, Duration::from_millis(100))
                    {
                        std::thread::sleep(Duration::from_millis(2 + rnd() % 10));
                        drop(p);
                    }
                }
            }));
        }
        hosts.push((sched, agent));
    }
    println!("budget {budget}: capacity 12 across 3 hosts (learning mode for the first TTL, 2 s)");
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(500));
        let mut line = format!("{:>5.1} s", start.elapsed().as_secs_f64());
        let (mut g, mut c, mut r) = (0, 0, 0);
        for (i, (sched, agent)) in hosts.iter().enumerate() {
            let st = agent.status();
            let running = sched.global_running();
            line += &format!(
                " | host-{i} {:<8} grant {:>2} ceiling {:>2} held {:>2}",
                st.mode.name(),
                st.lease.grant,
                sched.ceiling(),
                running
            );
            g += st.lease.grant;
            c += u64::from(sched.ceiling());
            r += u64::from(running);
        }
        println!("{line} | Σ grant {g:>2} ceiling {c:>2} held {r:>2}");
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}
