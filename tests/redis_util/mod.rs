//! A real `redis-server` per test: on a Unix socket in a temporary
//! directory (`--port 0`: no TCP), persistence off, killed and waited for
//! on drop. A missing `redis-server` is got the project's way
//! (`tests/tools`: one quiet `apt-get install`), else the test fails
//! naming it.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

// The test crate declares `mod tools;` beside `mod redis_util;`.
use crate::tools;

static INSTALL: Mutex<Option<bool>> = Mutex::new(None);

fn have_redis() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// True if `redis-server` can run here (installing it once if needed).
fn ensure_redis() -> bool {
    let mut g = INSTALL.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(ok) = *g {
        return ok;
    }
    let ok = have_redis() || {
        tools::require_tool("redis-server", tools::Get::Apt("redis-server"));
        have_redis()
    };
    *g = Some(ok);
    ok
}

/// A running `redis-server` of this test.
pub struct RedisServer {
    child: Option<Child>,
    pub dir: PathBuf,
    pub sock: PathBuf,
}

impl RedisServer {
    /// Starts a server (always `Some`: a missing redis-server that cannot
    /// be installed fails the test, naming it). The `Option` is kept for
    /// the callers' `let Some(..) else { return }`.
    pub fn start(tag: &str) -> Option<RedisServer> {
        if !ensure_redis() {
            tools::skip(
                tag,
                "redis-server is installed but does not run (`redis-server --version` failed)",
            );
            return None;
        }
        let dir = std::env::temp_dir().join(format!(
            "shmsched-redis-{tag}-{}-{}",
            std::process::id(),
            Instant::now().elapsed().as_nanos() % 1_000_000
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let sock = dir.join("redis.sock");
        let mut s = RedisServer {
            child: None,
            dir,
            sock,
        };
        s.restart();
        Some(s)
    }

    /// The URL clients use.
    pub fn url(&self) -> String {
        format!("unix://{}", self.sock.display())
    }

    /// The server's pid.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// (Re)starts the server on the same socket, empty.
    pub fn restart(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.sock);
        let child = Command::new("redis-server")
            .args(["--port", "0", "--unixsocket"])
            .arg(&self.sock)
            .args([
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--daemonize", "no", "--dir"])
            .arg(&self.dir)
            .args(["--logfile"])
            .arg(self.dir.join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        let start = Instant::now();
        loop {
            if let Ok(c) = redis::Client::open(self.url().as_str()) {
                if let Ok(mut con) = c.get_connection_with_timeout(Duration::from_secs(1)) {
                    if redis::cmd("PING").query::<String>(&mut con).is_ok() {
                        return;
                    }
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "redis-server did not answer on {} within 20 s",
                self.sock.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A plain connection (for the test's own commands).
    pub fn con(&self) -> redis::Connection {
        let c = redis::Client::open(self.url().as_str()).unwrap();
        let con = c
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap();
        con.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        con
    }

    /// Sends `sig` to the server.
    pub fn signal(&self, sig: i32) {
        let pid = self.pid();
        if pid > 0 {
            // SAFETY: kill(2) with the pid of our own child process.
            unsafe { libc::kill(pid, sig) };
        }
    }

    /// SIGKILLs the server and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            // A stopped server must be continued to die promptly? SIGKILL
            // works on a stopped process too.
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
