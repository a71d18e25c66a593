//! `RedisServer`: one private `redis-server` on a free loopback port, killed when the test
//! process exits (see `process.rs`), and the helpers the Sentinel and Cluster fixtures share.
//!
//! redis-server cannot bind port 0 and report the port it got, so a port is picked first; it
//! may be taken before redis-server binds it (the kernel hands such ports to outgoing
//! connections). A server is only used once it is up and answering as *this* child process
//! (`INFO server`'s `process_id`), and a start that lost its port is retried on another.
//!
//! Each fixture also runs with TLS only (`start_tls`): servers listen on a TLS port alone
//! (`--port 0`), replicate (and a cluster gossips) over TLS, and Sentinels talk TLS to the
//! servers and to each other; clients need no certificate. The fixture's own checks then
//! connect with TLS, trusting the test's CA.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::pki::TlsFiles;
use super::process::spawn_tied;

/// How the fixture's own checks reach a server on loopback: plain TCP, or TLS trusting a CA.
#[derive(Clone, Default)]
pub(super) struct Reach {
    /// The CA's PEM, for a server that speaks TLS only.
    ca: Option<Arc<Vec<u8>>>,
}

impl Reach {
    pub(super) fn of(tls: Option<&TlsFiles>) -> Reach {
        Reach { ca: tls.map(|files| Arc::new(files.ca_pem())) }
    }

    fn is_tls(&self) -> bool {
        self.ca.is_some()
    }

    /// `redis` or `rediss`.
    pub(super) fn scheme(&self) -> &'static str {
        if self.is_tls() { "rediss" } else { "redis" }
    }

    fn client(&self, port: u16) -> ::redis::RedisResult<::redis::Client> {
        let url = format!("{}://127.0.0.1:{port}", self.scheme());
        match &self.ca {
            None => ::redis::Client::open(url),
            Some(ca) => ::redis::Client::build_with_tls(
                url,
                ::redis::TlsCertificates { client_tls: None, root_cert: Some(ca.to_vec()) },
            ),
        }
    }
}

pub struct RedisServer {
    pub port: u16,
    child: Mutex<Option<Child>>,
    /// Its working directory: a replica's full sync writes an RDB file there, and a server
    /// started in a directory holding one would load it. A cluster node keeps `nodes.conf` here.
    dir: tempfile::TempDir,
    /// Arguments appended to the common ones, kept for `restart`.
    extra: Vec<String>,
    /// TLS files when it listens with TLS only.
    tls: Option<TlsFiles>,
    pub(super) reach: Reach,
}

impl RedisServer {
    /// The server shared by every test of this binary.
    pub fn shared() -> &'static RedisServer {
        static SHARED: OnceLock<RedisServer> = OnceLock::new();
        SHARED.get_or_init(RedisServer::start)
    }

    /// A server of the test's own (for tests that stop it).
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// A server of the test's own with `extra` appended to its command line, as
    /// `["--maxmemory", "10mb"]`; a later argument overrides an earlier one.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let extra: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
        RedisServer::start_args(None, |_| extra.clone())
    }

    /// A server of the test's own listening with TLS only, with `files`; it replicates over
    /// TLS too, and does not ask clients for a certificate.
    pub fn start_tls(files: &TlsFiles) -> RedisServer {
        RedisServer::start_tls_with(files, &[])
    }

    /// [`start_tls`] with `extra` appended to the command line.
    pub fn start_tls_with(files: &TlsFiles, extra: &[&str]) -> RedisServer {
        let extra: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
        RedisServer::start_args(Some(files), |_| extra.clone())
    }

    /// `extra(port)` is asked anew for every port tried, for arguments naming ports of their own.
    pub(super) fn start_args(tls: Option<&TlsFiles>, mut extra: impl FnMut(u16) -> Vec<String>) -> RedisServer {
        let reach = Reach::of(tls);
        for _ in 0..10 {
            let dir = tempfile::tempdir().expect("a temporary directory for redis-server");
            let port = free_port();
            let server = RedisServer {
                port,
                child: Mutex::new(None),
                dir,
                extra: extra(port),
                tls: tls.cloned(),
                reach: reach.clone(),
            };
            if server.launch() {
                return server;
            }
        }
        panic!("redis-server did not start on any of 10 ports");
    }

    /// `redis://` or, with TLS, `rediss://`.
    pub fn url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.reach.scheme(), self.port)
    }

    /// Whether it listens with TLS only.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Makes this server a replica of `primary` and waits until the link is up. Waiting
    /// matters: a primary takes a new replication ID when its first replica attaches, which
    /// a gateway that had already seen the old one would rightly report as a failover.
    pub fn replicate(&self, primary: &RedisServer) {
        self.replicate_at(primary.port);
    }

    /// Makes this server a replica of whatever answers on loopback `port` (a primary, or a
    /// proxy in front of one) and waits until the link is up.
    pub fn replicate_at(&self, port: u16) {
        let _: () = ::redis::cmd("REPLICAOF").arg("127.0.0.1").arg(port).query(&mut self.connection()).unwrap();
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

    /// One field of its `INFO replication`, None when it does not answer.
    pub fn replication(&self, name: &str) -> Option<String> {
        info_field(&self.reach, self.port, "replication", name)
    }

    /// How far into the replication stream it is: what a primary has written, or what a
    /// replica has applied (`master_repl_offset` is both).
    pub fn replication_offset(&self) -> Option<u64> {
        self.replication("master_repl_offset")?.parse().ok()
    }

    /// Promotes this replica to a primary, as a failover does.
    pub fn promote(&self) {
        let _: () = ::redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut self.connection()).unwrap();
    }

    /// Keys in the current database.
    pub fn dbsize(&self) -> u64 {
        ::redis::cmd("DBSIZE").query(&mut self.connection()).unwrap()
    }

    /// Starts redis-server on `self.port`; false when it exited (a port of its was taken).
    fn launch(&self) -> bool {
        let mut cmd = Command::new("redis-server");
        let port = self.port.to_string();
        match &self.tls {
            None => cmd.args(["--port", &port]),
            Some(files) => cmd
                .args(["--port", "0", "--tls-port", &port])
                .arg("--tls-cert-file")
                .arg(&files.cert)
                .arg("--tls-key-file")
                .arg(&files.key)
                .arg("--tls-ca-cert-file")
                .arg(&files.ca)
                .args(["--tls-auth-clients", "no", "--tls-replication", "yes"]),
        };
        cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--protected-mode", "no", "--loglevel", "warning"])
            // A replica's full sync starts at once instead of after the default 5 s.
            .args(["--repl-diskless-sync-delay", "0"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = spawn_tied(cmd).expect("redis-server must be on PATH (it is installed by .ci/run)");
        match answering_as(child, &self.reach, self.port, "redis-server") {
            Some(child) => {
                *self.child.lock().unwrap() = Some(child);
                true
            }
            None => false,
        }
    }

    /// Kills the server; its data is gone (it keeps nothing on disk).
    pub fn stop(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        wait_until(|| !ping(&self.reach, self.port), "redis-server to stop");
    }

    /// Stops the server in its tracks (SIGSTOP), as a node that hangs or is cut off: its port
    /// still takes connections, and nothing sent on them is answered. Killed as usual when
    /// dropped.
    pub fn freeze(&self) {
        let child = self.child.lock().unwrap();
        let pid = child.as_ref().expect("a running redis-server to freeze").id().to_string();
        let status = Command::new("kill").args(["-STOP", &pid]).status().expect("kill(1) must be on PATH");
        assert!(status.success(), "kill -STOP {pid}: {status}");
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
        self.reach.client(self.port).unwrap().get_connection().unwrap()
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

/// Ok once the server on `replica` is a replica of `primary` with its link up.
pub(super) fn replica_linked(reach: &Reach, replica: u16, primary: u16) -> Result<(), String> {
    let info: String = connect(reach, replica)
        .and_then(|mut c| ::redis::cmd("INFO").arg("replication").query(&mut c))
        .map_err(|e| format!("INFO on {replica}: {e}"))?;
    let has = |l: &str| info.lines().any(|x| x.trim() == l);
    if has("role:slave") && has(&format!("master_port:{primary}")) && has("master_link_status:up") {
        Ok(())
    } else {
        Err(format!("{replica} is not yet a linked replica of {primary}: {info}"))
    }
}

/// One field of `INFO section` from the server on `port`, None when it does not answer.
pub(super) fn info_field(reach: &Reach, port: u16, section: &str, name: &str) -> Option<String> {
    let info: String = ::redis::cmd("INFO").arg(section).query(&mut connect(reach, port).ok()?).ok()?;
    let prefix = format!("{name}:");
    info.lines().find_map(|l| l.strip_prefix(&prefix)).map(|v| v.trim().to_string())
}

/// A connection to `port` on loopback whose connect, reads and writes give up after 2 s.
pub(super) fn connect(reach: &Reach, port: u16) -> ::redis::RedisResult<::redis::Connection> {
    let client = reach.client(port)?;
    let conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    conn.set_write_timeout(Some(Duration::from_secs(2)))?;
    Ok(conn)
}

/// Waits until `child` answers on `port` as itself; None when it exited first (a port it
/// needed was taken).
pub(super) fn answering_as(mut child: Child, reach: &Reach, port: u16, what: &str) -> Option<Child> {
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return None;
        }
        if answering_pid(reach, port) == Some(pid) {
            return Some(child);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("timed out waiting for {what} on port {port}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(super) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The `process_id` of the redis-server answering on `port`, if one does.
fn answering_pid(reach: &Reach, port: u16) -> Option<u32> {
    let client = reach.client(port).ok()?;
    let mut conn = client.get_connection_with_timeout(Duration::from_millis(200)).ok()?;
    // Bounded: whatever took the port may accept and never answer (or never finish a TLS
    // handshake, which happens on the first exchange).
    conn.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    conn.set_write_timeout(Some(Duration::from_secs(1))).ok()?;
    let info: String = ::redis::cmd("INFO").arg("server").query(&mut conn).ok()?;
    info.lines().find_map(|l| l.strip_prefix("process_id:")).and_then(|p| p.trim().parse().ok())
}

fn ping(reach: &Reach, port: u16) -> bool {
    let Ok(client) = reach.client(port) else { return false };
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

/// Polls `check` until it is Ok; on timeout panics with what it last reported.
pub(super) fn wait_for(timeout: Duration, what: &str, mut check: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(()) => return,
            Err(last) => {
                assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}; last: {last}")
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
