//! A private `redis-server` on a free loopback port, killed when the test process exits
//! (see `process.rs`).
//!
//! redis-server cannot bind port 0 and report the port it got, so a port is picked first; it
//! may be taken before redis-server binds it (the kernel hands such ports to outgoing
//! connections). A server is only used once it is up and answering as *this* child process
//! (`INFO server`'s `process_id`), and a start that lost its port is retried on another.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::process::spawn_tied;

pub struct RedisServer {
    pub port: u16,
    child: Mutex<Option<Child>>,
    /// Its working directory: a replica's full sync writes an RDB file there, and a server
    /// started in a directory holding one would load it.
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// The server shared by every test of this binary.
    pub fn shared() -> &'static RedisServer {
        static SHARED: OnceLock<RedisServer> = OnceLock::new();
        SHARED.get_or_init(RedisServer::start)
    }

    /// A server of the test's own (for tests that stop it).
    pub fn start() -> RedisServer {
        for _ in 0..10 {
            let dir = tempfile::tempdir().expect("a temporary directory for redis-server");
            let server = RedisServer { port: free_port(), child: Mutex::new(None), dir };
            if server.launch() {
                return server;
            }
        }
        panic!("redis-server did not start on any of 10 ports");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Makes this server a replica of `primary`.
    /// Makes this server a replica of `primary` and waits until the link is up. Waiting
    /// matters: a primary takes a new replication ID when its first replica attaches, which
    /// a gateway that had already seen the old one would rightly report as a failover.
    pub fn replicate(&self, primary: &RedisServer) {
        let _: () = ::redis::cmd("REPLICAOF").arg("127.0.0.1").arg(primary.port).query(&mut self.connection()).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let info: String = ::redis::cmd("INFO").arg("replication").query(&mut self.connection()).unwrap();
            if info.lines().any(|l| l.trim() == "master_link_status:up") {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "the replica never linked to its primary: {info}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Promotes this replica to a primary, as a failover does.
    pub fn promote(&self) {
        let _: () = ::redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut self.connection()).unwrap();
    }

    /// Keys in the current database.
    pub fn dbsize(&self) -> u64 {
        ::redis::cmd("DBSIZE").query(&mut self.connection()).unwrap()
    }

    /// Starts redis-server on `self.port`; false when it exited (its port was taken).
    fn launch(&self) -> bool {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--protected-mode", "no", "--loglevel", "warning"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = spawn_tied(cmd).expect("redis-server must be on PATH (it is installed by .ci/run)");
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            if answering_pid(self.port) == Some(pid) {
                *self.child.lock().unwrap() = Some(child);
                return true;
            }
            assert!(Instant::now() < deadline, "timed out waiting for redis-server on port {}", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server; its data is gone (it keeps nothing on disk).
    pub fn stop(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        wait_until(|| !ping(self.port), "redis-server to stop");
    }

    /// Starts the server again on the same port, empty. The port was ours a moment ago;
    /// should something take it meanwhile, the test cannot go on and says so.
    pub fn restart(&self) {
        self.stop();
        for _ in 0..50 {
            if self.launch() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server could not get port {} back", self.port);
    }

    /// A synchronous connection, for assertions on what Redis holds.
    pub fn connection(&self) -> ::redis::Connection {
        ::redis::Client::open(self.url()).unwrap().get_connection().unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The `process_id` of the redis-server answering on `port`, if one does.
fn answering_pid(port: u16) -> Option<u32> {
    let client = ::redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let mut conn = client.get_connection_with_timeout(Duration::from_millis(200)).ok()?;
    let info: String = ::redis::cmd("INFO").arg("server").query(&mut conn).ok()?;
    info.lines().find_map(|l| l.strip_prefix("process_id:")).and_then(|p| p.trim().parse().ok())
}

fn ping(port: u16) -> bool {
    let Ok(client) = ::redis::Client::open(format!("redis://127.0.0.1:{port}")) else { return false };
    let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200)) else { return false };
    ::redis::cmd("PING").query::<String>(&mut conn).is_ok()
}

fn wait_until(mut ok: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
