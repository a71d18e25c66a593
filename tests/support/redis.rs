//! A private `redis-server` on a free loopback port, killed when the test process exits
//! (see `process.rs`).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::process::spawn_tied;

pub struct RedisServer {
    pub port: u16,
    child: Mutex<Option<Child>>,
}

impl RedisServer {
    /// The server shared by every test of this binary.
    pub fn shared() -> &'static RedisServer {
        static SHARED: OnceLock<RedisServer> = OnceLock::new();
        SHARED.get_or_init(RedisServer::start)
    }

    /// A server of the test's own (for tests that stop it).
    pub fn start() -> RedisServer {
        let port = free_port();
        let server = RedisServer { port, child: Mutex::new(None) };
        server.launch();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn launch(&self) {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--protected-mode", "no", "--loglevel", "warning"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = spawn_tied(cmd).expect("redis-server must be on PATH (it is installed by .ci/run)");
        *self.child.lock().unwrap() = Some(child);
        let port = self.port;
        wait_until(|| ping(port), "redis-server to answer PING");
    }

    /// Kills the server; its data is gone (it keeps nothing on disk).
    pub fn stop(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        wait_until(|| !ping(self.port), "redis-server to stop");
    }

    /// Starts the server again on the same port, empty.
    pub fn restart(&self) {
        self.stop();
        self.launch();
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
