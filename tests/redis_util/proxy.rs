//! A loopback TCP proxy in front of a test's `redis-server` Unix socket,
//! for late packets and one-way partitions: it can hold the next script
//! call (delivering it, and handing its reply to the test, once released
//! after the client gave up on it) and drop the replies to script calls
//! (requests still pass). Used by tests/cluster_sequence.rs (clients
//! driven directly) and tests/cluster_partition.rs (agents in their own
//! processes).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Default)]
struct Shared {
    /// The next request carrying a script call is held (and the rest of
    /// its connection with it).
    hold_next: Mutex<bool>,
    /// Where a held connection waits for its release.
    release: Mutex<Option<Receiver<()>>>,
    /// Replies to script calls are dropped (requests still pass; a new
    /// connection's handshake is answered).
    drop_replies: AtomicBool,
    /// Reply bytes of the held connection go here.
    held_reply: Mutex<Option<Sender<Vec<u8>>>>,
    /// Set once a script call is being held.
    holding: AtomicBool,
}

/// A loopback TCP proxy to the server's Unix socket. Its threads end with
/// their connections; the listener thread with the test process.
pub struct Proxy {
    pub port: u16,
    shared: Arc<Shared>,
}

impl Proxy {
    pub fn start(sock: PathBuf) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().unwrap().port();
        let shared = Arc::new(Shared::default());
        let sh = shared.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(client) = c else { return };
                let Ok(server) = UnixStream::connect(&sock) else {
                    continue;
                };
                let sh = sh.clone();
                std::thread::spawn(move || pipe(client, server, sh));
            }
        });
        Proxy { port, shared }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Holds the next script call (on a new connection); the receiver gets
    /// the server's reply to it once released.
    pub fn hold_next(&self) -> (Sender<()>, Receiver<Vec<u8>>) {
        let (rel_tx, rel_rx) = channel();
        let (rep_tx, rep_rx) = channel();
        *self.shared.release.lock().unwrap() = Some(rel_rx);
        *self.shared.held_reply.lock().unwrap() = Some(rep_tx);
        *self.shared.hold_next.lock().unwrap() = true;
        (rel_tx, rep_rx)
    }

    /// True once the call [`Proxy::hold_next`] asked for is held.
    pub fn holding(&self) -> bool {
        self.shared.holding.load(Ordering::SeqCst)
    }

    /// While `on`, replies to script calls are dropped (requests pass).
    pub fn drop_replies(&self, on: bool) {
        self.shared.drop_replies.store(on, Ordering::SeqCst);
    }
}

fn pipe(mut client: TcpStream, server: UnixStream, sh: Arc<Shared>) {
    let mut up = server.try_clone().expect("clone");
    let mut down_from = server;
    let mut down_to = client.try_clone().expect("clone");
    let held = Arc::new(AtomicBool::new(false));
    let held2 = held.clone();
    // Set once the client sent a script call: replies from then on are
    // renewal replies (the connection's handshake passes).
    let scripted = Arc::new(AtomicBool::new(false));
    let scripted2 = scripted.clone();
    let sh2 = sh.clone();
    // Server -> client.
    std::thread::spawn(move || {
        let mut buf = [0u8; 65536];
        loop {
            let n = match down_from.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if held2.load(Ordering::SeqCst) {
                if let Some(tx) = sh2.held_reply.lock().unwrap().as_ref() {
                    let _ = tx.send(buf[..n].to_vec());
                }
            }
            if sh2.drop_replies.load(Ordering::SeqCst) && scripted2.load(Ordering::SeqCst) {
                continue;
            }
            let _ = down_to.write_all(&buf[..n]);
        }
    });
    // Client -> server.
    let mut buf = [0u8; 65536];
    let mut stash: Vec<u8> = vec![];
    loop {
        let n = match client.read(&mut buf) {
            Ok(0) | Err(_) => 0,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        let script_call = chunk.windows(7).any(|w| w.eq_ignore_ascii_case(b"EVALSHA"));
        if script_call {
            scripted.store(true, Ordering::SeqCst);
        }
        if !held.load(Ordering::SeqCst) && n > 0 && script_call {
            let mut h = sh.hold_next.lock().unwrap();
            if *h {
                *h = false;
                held.store(true, Ordering::SeqCst);
                sh.holding.store(true, Ordering::SeqCst);
            }
        }
        if held.load(Ordering::SeqCst) {
            stash.extend_from_slice(chunk);
            if n == 0 {
                // The client gave up and closed: wait for the release, then
                // deliver the late request.
                let rx = sh.release.lock().unwrap().take();
                if let Some(rx) = rx {
                    if rx.recv_timeout(Duration::from_secs(30)).is_ok() {
                        let _ = up.write_all(&stash);
                    }
                }
                // Keep the upstream open long enough for the reply.
                std::thread::sleep(Duration::from_millis(500));
                return;
            }
            continue;
        }
        if n == 0 {
            let _ = up.shutdown(std::net::Shutdown::Write);
            return;
        }
        if up.write_all(chunk).is_err() {
            return;
        }
    }
}

/// Revision 1 of the lease script (`benches/lease_v1.lua`: no request
/// numbers, no acknowledged grants) on revision 2's wire: its grant reply
/// is given revision 2's tenth field, the request's number echoed (ARGV[11],
/// which revision 1 ignores), so that an unchanged client or agent runs
/// against it. For showing what revision 2 fixes; selected in the tests by
/// `SHMSCHED_TEST_LEASE=v1`.
pub fn lease_v1_on_v2_wire() -> String {
    format!(
        "local function v1_main()\n{}\nend\nlocal r = v1_main()\n\
         if ARGV[1] ~= 'peek' and type(r) == 'table' and r[1] == 1 then\n  \
         r[10] = tonumber(ARGV[11])\nend\nreturn r\n",
        include_str!("../../benches/lease_v1.lua")
    )
}

/// The lease revision the tests run their agents on: `v1` when
/// `SHMSCHED_TEST_LEASE=v1` (to show a test fails there), else `v2`.
pub fn lease_revision() -> &'static str {
    match std::env::var("SHMSCHED_TEST_LEASE").as_deref() {
        Ok("v1") => "v1",
        _ => "v2",
    }
}
