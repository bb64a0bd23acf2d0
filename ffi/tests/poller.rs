//! A process that only polls (`shmsched_scheduler_try_acquire` every 1 ms,
//! no blocking call anywhere) gets back the slots of holders that were
//! SIGKILLed within 100 ms of its first failed try: a failed try is a slow
//! path that notices dead holders, through the C ABI as in Rust (it used to
//! answer `WOULD_BLOCK` for as long as it polled).

mod support;

use std::process::Command;

use shmsched::region::Region;
use shmsched::scheduler::Scheduler;
use support::{compile_c, test_file, Kid, TempRegion};

#[test]
fn a_c_poller_gets_dead_holders_slots_back() {
    let exe = compile_c("poller", &[test_file("c/poller.c")]);
    let tmp = TempRegion::new("poller");
    let region = Region::create(&tmp.0).unwrap();
    let me = Scheduler::shared(&region, 4).unwrap();
    let run = |name: &str, args: &[&str]| {
        let mut c = Command::new(&exe);
        c.args(args).env("RUST_BACKTRACE", "0");
        Kid::spawn(name, c)
    };
    let mut holders: Vec<Kid> = (0..2)
        .map(|i| {
            let mut k = run(&format!("holder{i}"), &["hold", &tmp.0, "2"]);
            k.expect_line("held");
            k
        })
        .collect();
    let mut poller = run("poller", &["poll", &tmp.0, "4"]);
    poller.expect_line("ready");
    assert_eq!(me.global_running(), 4);
    for h in holders.drain(..) {
        h.kill();
    }
    poller.send("go");
    let line = poller.expect_line("polled ");
    let v: Vec<f64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
    eprintln!(
        "  C poller: {} of 4 slots back {:.1} ms after its first failed try ({} failed tries)",
        v[0], v[1], v[2]
    );
    assert_eq!(
        v[0], 4.0,
        "the C poller did not get the dead holders' slots back"
    );
    assert!(
        v[1] < 100.0,
        "the C poller waited {} ms (bound: 100 ms)",
        v[1]
    );
    assert!(poller.finish().success());
    assert_eq!(me.global_running(), 0);
}
