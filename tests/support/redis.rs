//! Private Redis processes on free loopback ports, killed when the test process exits (see
//! `process.rs`): a single `redis-server`, a primary and its replica watched by three Sentinels
//! (`SentinelSet`), and a Redis Cluster (`RedisCluster`).
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

use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::pki::TlsFiles;
use super::process::spawn_tied;

/// How the fixture's own checks reach a server on loopback: plain TCP, or TLS trusting a CA.
#[derive(Clone, Default)]
struct Reach {
    /// The CA's PEM, for a server that speaks TLS only.
    ca: Option<Arc<Vec<u8>>>,
}

impl Reach {
    fn of(tls: Option<&TlsFiles>) -> Reach {
        Reach { ca: tls.map(|files| Arc::new(files.ca_pem())) }
    }

    fn is_tls(&self) -> bool {
        self.ca.is_some()
    }

    /// `redis` or `rediss`.
    fn scheme(&self) -> &'static str {
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
    reach: Reach,
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
    fn start_args(tls: Option<&TlsFiles>, mut extra: impl FnMut(u16) -> Vec<String>) -> RedisServer {
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

/// A primary and one replica watched by three Sentinels, all on loopback. The Sentinels may
/// fail the primary over on their own should it stop answering for a second.
pub struct SentinelSet {
    // Declared first so they are dropped first: a Sentinel outliving the servers for a moment
    // would start a failover of its own.
    sentinels: Vec<Sentinel>,
    servers: [RedisServer; 2],
    name: String,
    reach: Reach,
}

impl SentinelSet {
    /// Starts a primary, its replica (linked), and three Sentinels monitoring them as
    /// `master_name` with a quorum of 2; returns once every Sentinel knows the replica and the
    /// two other Sentinels, so that a failover can succeed.
    pub fn start(master_name: &str) -> SentinelSet {
        SentinelSet::start_with(master_name, None)
    }

    /// [`start`] with TLS only: the servers and the Sentinels listen with TLS alone, the replica
    /// replicates over TLS, and the Sentinels talk TLS to the servers and to each other.
    pub fn start_tls(master_name: &str, files: &TlsFiles) -> SentinelSet {
        SentinelSet::start_with(master_name, Some(files))
    }

    fn start_with(master_name: &str, tls: Option<&TlsFiles>) -> SentinelSet {
        let start = || match tls {
            Some(files) => RedisServer::start_tls(files),
            None => RedisServer::start(),
        };
        let primary = start();
        let replica = start();
        replica.replicate(&primary);
        let sentinels = (0..3).map(|_| Sentinel::start(master_name, primary.port, tls)).collect();
        let reach = primary.reach.clone();
        let set = SentinelSet { sentinels, servers: [primary, replica], name: master_name.to_string(), reach };
        set.wait_settled(0, Duration::from_secs(30));
        set
    }

    /// `redis+sentinel://` (`rediss+sentinel://` with TLS) with every Sentinel's address and
    /// the master name.
    pub fn url(&self) -> String {
        let addrs: Vec<String> = self.sentinels.iter().map(|s| format!("127.0.0.1:{}", s.port)).collect();
        format!("{}+sentinel://{}/{}", self.reach.scheme(), addrs.join(","), self.name)
    }

    pub fn master_name(&self) -> &str {
        &self.name
    }

    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// The primary's port as the first Sentinel that answers reports it.
    pub fn master_port(&self) -> u16 {
        self.sentinels.iter().find_map(|s| s.master_addr(&self.name)).expect("no Sentinel reports a primary")
    }

    /// The server the Sentinels report as the primary now.
    pub fn primary_server(&self) -> &RedisServer {
        &self.servers[self.primary_index()]
    }

    /// The server the Sentinels do not report as the primary.
    pub fn replica_server(&self) -> &RedisServer {
        &self.servers[1 - self.primary_index()]
    }

    fn primary_index(&self) -> usize {
        let port = self.master_port();
        self.servers
            .iter()
            .position(|s| s.port == port)
            .unwrap_or_else(|| panic!("the Sentinels report an unknown primary {port}"))
    }

    /// Forces a failover and returns as soon as the Sentinel that ran it names the new
    /// primary (it announces `+switch-master` then). The old primary still answers as a
    /// writable primary until the Sentinels demote it, about ten seconds later; [`failover`]
    /// waits for that too.
    pub fn switch(&self) {
        let old = self.primary_index();
        let new_port = self.servers[1 - old].port;
        let first = &self.sentinels[0];
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            // A failover already under way (INPROG) may be the very one wanted.
            if first.master_addr(&self.name) == Some(new_port) {
                break;
            }
            match first.query::<()>(::redis::cmd("SENTINEL").arg("FAILOVER").arg(&self.name)) {
                Ok(()) => break,
                Err(e) => {
                    let retry = e.is_io_error() || matches!(e.code(), Some("NOGOODSLAVE" | "INPROG"));
                    let e = e.to_string();
                    assert!(retry, "SENTINEL FAILOVER {} failed: {e}", self.name);
                    assert!(Instant::now() < deadline, "SENTINEL FAILOVER {} kept failing: {e}", self.name);
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        wait_for(Duration::from_secs(30), "the Sentinel to name the new primary", || {
            match first.master_addr(&self.name) {
                Some(port) if port == new_port => Ok(()),
                other => Err(format!("Sentinel {} still names {other:?}", first.port)),
            }
        });
    }

    /// Fails over to the replica with `SENTINEL FAILOVER` and returns once every Sentinel reports
    /// it as the primary, it answers as one, and the old primary is its replica with the link up.
    /// Sentinel turns the old primary into a replica only when it next looks at it, about ten
    /// seconds after the promotion, so this takes that long.
    pub fn failover(&self) {
        self.switch();
        self.wait_demoted();
    }

    /// After [`switch`], waits until every Sentinel names the new primary and the old one is
    /// its replica with the link up.
    pub fn wait_demoted(&self) {
        let new = self.servers.iter().position(|s| Some(s.port) == self.sentinels[0].master_addr(&self.name));
        let new = new.expect("the first Sentinel names one of the two servers");
        let (old_port, new_port) = (self.servers[1 - new].port, self.servers[new].port);
        let old = 1 - new;
        wait_for(Duration::from_secs(30), "the Sentinel failover to complete", || {
            for s in &self.sentinels {
                let addr = s.master_addr(&self.name);
                if addr != Some(new_port) {
                    return Err(format!("Sentinel {} reports the primary at {addr:?}, not {new_port}", s.port));
                }
            }
            let role = info_field(&self.reach, new_port, "replication", "role");
            if role.as_deref() != Some("master") {
                return Err(format!("the new primary {new_port} has role {role:?}"));
            }
            replica_linked(&self.reach, old_port, new_port)
        });
        self.wait_settled(1 - old, Duration::from_secs(20));
    }

    /// Waits until every Sentinel reports `servers[primary]` as the primary, no failover is under
    /// way, and each knows the replica and the two other Sentinels, all healthy.
    fn wait_settled(&self, primary: usize, timeout: Duration) {
        let (primary, replica) = (self.servers[primary].port, self.servers[1 - primary].port);
        wait_for(timeout, "the Sentinels to agree on the primary, its replica and each other", || {
            for s in &self.sentinels {
                let addr = s.master_addr(&self.name);
                if addr != Some(primary) {
                    return Err(format!("Sentinel {} reports the primary at {addr:?}, not {primary}", s.port));
                }
                let master = s.query::<Vec<String>>(::redis::cmd("SENTINEL").arg("MASTER").arg(&self.name));
                let master = master.map(|m| pairs(&m)).map_err(|e| e.to_string())?;
                let flags = field(&master, "flags");
                if flags != "master" {
                    return Err(format!("Sentinel {} flags the primary {flags:?}", s.port));
                }
                let replicas = s.entries("REPLICAS", &self.name)?;
                if !replicas.iter().any(|r| field(r, "port") == replica.to_string() && healthy(r)) {
                    return Err(format!("Sentinel {} does not know replica {replica} healthy: {replicas:?}", s.port));
                }
                let peers = s.entries("SENTINELS", &self.name)?;
                if peers.iter().filter(|p| healthy(p)).count() != 2 {
                    return Err(format!("Sentinel {} does not know both others healthy: {peers:?}", s.port));
                }
            }
            Ok(())
        });
    }
}

/// One `redis-server --sentinel` with its own config file, which it rewrites.
struct Sentinel {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
    reach: Reach,
}

impl Sentinel {
    fn start(name: &str, primary_port: u16, tls: Option<&TlsFiles>) -> Sentinel {
        let reach = Reach::of(tls);
        for _ in 0..10 {
            let dir = tempfile::tempdir().expect("a temporary directory for a Sentinel");
            let port = free_port();
            let conf = dir.path().join("sentinel.conf");
            std::fs::write(&conf, sentinel_conf(port, dir.path(), name, primary_port, tls)).unwrap();
            let mut cmd = Command::new("redis-server");
            cmd.arg(&conf).arg("--sentinel").stdout(Stdio::null()).stderr(Stdio::null());
            let child = spawn_tied(cmd).expect("redis-server must be on PATH (it is installed by .ci/run)");
            if let Some(child) = answering_as(child, &reach, port, "redis-server --sentinel") {
                let sentinel = Sentinel { port, child, _dir: dir, reach: reach.clone() };
                wait_for(Duration::from_secs(10), "a new Sentinel to report the primary", || {
                    match sentinel.master_addr(name) {
                        Some(p) if p == primary_port => Ok(()),
                        other => Err(format!("Sentinel {port} reports {other:?}, not {primary_port}")),
                    }
                });
                return sentinel;
            }
        }
        panic!("redis-server --sentinel did not start on any of 10 ports");
    }

    fn query<T: ::redis::FromRedisValue>(&self, cmd: &mut ::redis::Cmd) -> ::redis::RedisResult<T> {
        cmd.query(&mut connect(&self.reach, self.port)?)
    }

    /// The port of the primary this Sentinel reports for `name`.
    fn master_addr(&self, name: &str) -> Option<u16> {
        let addr: Option<(String, u16)> =
            self.query(::redis::cmd("SENTINEL").arg("GET-MASTER-ADDR-BY-NAME").arg(name)).ok()?;
        addr.map(|(_, port)| port)
    }

    /// `SENTINEL REPLICAS name` or `SENTINEL SENTINELS name`, each entry as field/value pairs.
    fn entries(&self, what: &str, name: &str) -> Result<Vec<Vec<(String, String)>>, String> {
        let raw: Vec<Vec<String>> =
            self.query(::redis::cmd("SENTINEL").arg(what).arg(name)).map_err(|e| format!("SENTINEL {what}: {e}"))?;
        Ok(raw.iter().map(|e| pairs(e)).collect())
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sentinel_conf(port: u16, dir: &Path, name: &str, primary_port: u16, tls: Option<&TlsFiles>) -> String {
    let mut conf = String::new();
    match tls {
        None => writeln!(conf, "port {port}").unwrap(),
        Some(files) => {
            // TLS only; `tls-replication` makes the Sentinel talk TLS to the servers it
            // monitors and to the other Sentinels (and announce its TLS port to them).
            writeln!(conf, "port 0").unwrap();
            writeln!(conf, "tls-port {port}").unwrap();
            writeln!(conf, "tls-cert-file {}", files.cert.display()).unwrap();
            writeln!(conf, "tls-key-file {}", files.key.display()).unwrap();
            writeln!(conf, "tls-ca-cert-file {}", files.ca.display()).unwrap();
            writeln!(conf, "tls-auth-clients no").unwrap();
            writeln!(conf, "tls-replication yes").unwrap();
        }
    }
    writeln!(conf, "bind 127.0.0.1").unwrap();
    writeln!(conf, "protected-mode no").unwrap();
    writeln!(conf, "dir {}", dir.display()).unwrap();
    writeln!(conf, "loglevel warning").unwrap();
    writeln!(conf, "sentinel monitor {name} 127.0.0.1 {primary_port} 2").unwrap();
    writeln!(conf, "sentinel down-after-milliseconds {name} 1000").unwrap();
    writeln!(conf, "sentinel failover-timeout {name} 5000").unwrap();
    writeln!(conf, "sentinel parallel-syncs {name} 1").unwrap();
    conf
}

/// A flat `[field, value, ...]` reply as pairs.
fn pairs(flat: &[String]) -> Vec<(String, String)> {
    flat.chunks(2).filter(|c| c.len() == 2).map(|c| (c[0].clone(), c[1].clone())).collect()
}

fn field<'a>(entry: &'a [(String, String)], name: &str) -> &'a str {
    entry.iter().find(|(k, _)| k == name).map_or("", |(_, v)| v.as_str())
}

/// A Sentinel's entry for a replica or another Sentinel is connected and not thought down.
fn healthy(entry: &[(String, String)]) -> bool {
    field(entry, "flags").split(',').all(|f| !matches!(f, "s_down" | "o_down" | "disconnected"))
}

/// A Redis Cluster on loopback, every node with its own data and cluster bus ports.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    primaries: usize,
    /// The CA file when the nodes speak TLS only, for redis-cli.
    ca: Option<std::path::PathBuf>,
    reach: Reach,
}

impl RedisCluster {
    /// Starts `primaries * (1 + replicas_per_primary)` nodes, joins them with
    /// `redis-cli --cluster create`, and returns once every node reports all 16384 slots served
    /// and the cluster ok, and every replica is linked to its primary. Redis Cluster needs at
    /// least 3 primaries.
    pub fn start(primaries: usize, replicas_per_primary: usize) -> RedisCluster {
        RedisCluster::start_with(primaries, replicas_per_primary, None)
    }

    /// [`start`] with TLS only: clients, replication and the cluster bus all use TLS, and
    /// the nodes announce their TLS ports.
    pub fn start_tls(primaries: usize, replicas_per_primary: usize, files: &TlsFiles) -> RedisCluster {
        RedisCluster::start_with(primaries, replicas_per_primary, Some(files))
    }

    fn start_with(primaries: usize, replicas_per_primary: usize, tls: Option<&TlsFiles>) -> RedisCluster {
        assert!(primaries >= 3, "redis-cli --cluster create needs at least 3 primaries, not {primaries}");
        let nodes: Vec<RedisServer> = (0..primaries * (1 + replicas_per_primary))
            .map(|_| {
                RedisServer::start_args(tls, |port| {
                    // Explicit: port + 10000, the default, is past 65535 for high ports.
                    let bus = loop {
                        let bus = free_port();
                        if bus != port {
                            break bus;
                        }
                    };
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "2000",
                    ]
                    .iter()
                    .map(|a| a.to_string())
                    .chain(["--cluster-port".to_string(), bus.to_string()])
                    .chain(tls.map(|_| ["--tls-cluster".to_string(), "yes".to_string()]).into_iter().flatten())
                    .collect()
                })
            })
            .collect();
        let cluster = RedisCluster { nodes, primaries, ca: tls.map(|f| f.ca.clone()), reach: Reach::of(tls) };
        cluster.create(replicas_per_primary);
        cluster.wait_healthy(Duration::from_secs(30));
        cluster
    }

    fn create(&self, replicas_per_primary: usize) {
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut cmd = Command::new("redis-cli");
        if let Some(ca) = &self.ca {
            cmd.arg("--tls").arg("--cacert").arg(ca);
        }
        cmd.arg("--cluster").arg("create");
        cmd.args(self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        cmd.args(["--cluster-replicas", &replicas_per_primary.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(log.reopen().unwrap())
            .stderr(log.reopen().unwrap());
        let mut child = spawn_tied(cmd).expect("redis-cli must be on PATH");
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("redis-cli --cluster create timed out: {}", std::fs::read_to_string(log.path()).unwrap());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let output = std::fs::read_to_string(log.path()).unwrap();
        assert!(
            status.success() && output.contains("[OK] All 16384 slots covered"),
            "redis-cli --cluster create failed ({status}): {output}"
        );
    }

    /// `redis+cluster://` (`rediss+cluster://` with TLS) with every current primary's address.
    pub fn url(&self) -> String {
        let addrs: Vec<String> = self.primary_ports().iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("{}+cluster://{}", self.reach.scheme(), addrs.join(","))
    }

    /// Every node's port, primaries and replicas.
    pub fn node_ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The ports of the primaries serving slots now, ascending.
    pub fn primary_ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> =
            self.view().iter().filter(|n| n.is_primary() && !n.slots.is_empty()).map(|n| n.port).collect();
        ports.sort_unstable();
        ports
    }

    /// The ports of `primary_port`'s replicas now, ascending.
    pub fn replicas_of(&self, primary_port: u16) -> Vec<u16> {
        let view = self.view();
        let primary =
            view.iter().find(|n| n.port == primary_port).unwrap_or_else(|| panic!("no node on port {primary_port}"));
        let mut ports: Vec<u16> = view.iter().filter(|n| n.primary_id == primary.id).map(|n| n.port).collect();
        ports.sort_unstable();
        ports
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`).
    pub fn slot_for_key(&self, key: &str) -> u16 {
        self.query_any(::redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
    }

    /// The port of the primary serving `key`'s slot.
    pub fn node_for_key(&self, key: &str) -> u16 {
        let slot = self.slot_for_key(key);
        self.view()
            .iter()
            .find(|n| n.is_primary() && n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            .unwrap_or_else(|| panic!("no primary serves slot {slot} (key {key:?})"))
            .port
    }

    /// Keys held by the node on `port`.
    pub fn dbsize(&self, port: u16) -> u64 {
        ::redis::cmd("DBSIZE").query(&mut self.connection(port)).unwrap_or_else(|e| panic!("DBSIZE on {port}: {e}"))
    }

    /// Keys held by all primaries together.
    pub fn dbsize_total(&self) -> u64 {
        self.primary_ports().into_iter().map(|p| self.dbsize(p)).sum()
    }

    /// A plain connection to one node (no redirections followed).
    pub fn connection(&self, port: u16) -> ::redis::Connection {
        connect(&self.reach, port).unwrap_or_else(|e| panic!("cannot connect to cluster node {port}: {e}"))
    }

    /// `FLUSHALL` on one primary: its shard loses every key (its replicas follow).
    pub fn flush_node(&self, port: u16) {
        let _: () = ::redis::cmd("FLUSHALL")
            .query(&mut self.connection(port))
            .unwrap_or_else(|e| panic!("FLUSHALL on {port}: {e}"));
    }

    /// `CLUSTER FAILOVER` on the replica on `replica_port`; returns once it serves its shard's
    /// slots as a primary in every node's view, its old primary is its replica with the link
    /// up, and the cluster is ok everywhere.
    pub fn failover(&self, replica_port: u16) {
        let view = self.view();
        let me =
            view.iter().find(|n| n.port == replica_port).unwrap_or_else(|| panic!("no node on port {replica_port}"));
        assert!(me.flags.iter().any(|f| f == "slave"), "node {replica_port} is not a replica: {:?}", me.flags);
        let old_port = view.iter().find(|n| n.id == me.primary_id).expect("the replica's primary").port;
        let mut sent: Option<Instant> = None;
        wait_for(Duration::from_secs(30), "a cluster failover to complete", || {
            // A manual failover gives up after 5 s; ask again past that.
            if sent.is_none_or(|t| t.elapsed() > Duration::from_secs(6))
                && info_field(&self.reach, replica_port, "replication", "role").as_deref() != Some("master")
            {
                let _: () = ::redis::cmd("CLUSTER")
                    .arg("FAILOVER")
                    .query(&mut self.connection(replica_port))
                    .map_err(|e| format!("CLUSTER FAILOVER: {e}"))?;
                sent = Some(Instant::now());
            }
            for node in &self.nodes {
                let view = nodes_of(&self.reach, node.port)?;
                let new = view.iter().find(|n| n.port == replica_port).ok_or("the new primary is unknown")?;
                let old = view.iter().find(|n| n.port == old_port).ok_or("the old primary is unknown")?;
                if !new.is_primary() || new.slots.is_empty() || old.primary_id != new.id {
                    return Err(format!(
                        "node {} does not see {replica_port} as the primary of {old_port} yet",
                        node.port
                    ));
                }
            }
            replica_linked(&self.reach, old_port, replica_port)
        });
        self.wait_healthy(Duration::from_secs(20));
    }

    /// The cluster's layout as the first node that answers sees it.
    fn view(&self) -> Vec<ClusterNode> {
        self.nodes
            .iter()
            .find_map(|n| nodes_of(&self.reach, n.port).ok())
            .expect("no cluster node answers CLUSTER NODES")
    }

    fn query_any<T: ::redis::FromRedisValue>(&self, cmd: &mut ::redis::Cmd) -> T {
        self.nodes
            .iter()
            .find_map(|n| connect(&self.reach, n.port).and_then(|mut c| cmd.query(&mut c)).ok())
            .expect("no cluster node answers")
    }

    /// Waits until every node reports the cluster ok with all slots served, sees all nodes
    /// (`primaries` primaries with slots, the rest replicas, none failing), and every replica
    /// is linked to its primary.
    fn wait_healthy(&self, timeout: Duration) {
        wait_for(timeout, "the cluster to be ok on every node", || {
            for node in &self.nodes {
                let info: String = connect(&self.reach, node.port)
                    .and_then(|mut c| ::redis::cmd("CLUSTER").arg("INFO").query(&mut c))
                    .map_err(|e| format!("CLUSTER INFO on {}: {e}", node.port))?;
                for want in ["cluster_state:ok", "cluster_slots_assigned:16384", "cluster_slots_ok:16384"] {
                    if !info.lines().any(|l| l.trim() == want) {
                        return Err(format!("node {} lacks {want}: {info}", node.port));
                    }
                }
                let view = nodes_of(&self.reach, node.port)?;
                let serving = view.iter().filter(|n| n.is_primary() && !n.slots.is_empty()).count();
                let replicas = view.iter().filter(|n| n.flags.iter().any(|f| f == "slave")).count();
                let failing = view.iter().any(|n| n.flags.iter().any(|f| f.starts_with("fail")));
                if view.len() != self.nodes.len()
                    || serving != self.primaries
                    || replicas != self.nodes.len() - self.primaries
                    || failing
                {
                    return Err(format!(
                        "node {} sees {} nodes, {serving} serving primaries, {replicas} replicas, failing: {failing}",
                        node.port,
                        view.len()
                    ));
                }
                if view
                    .iter()
                    .find(|n| n.flags.iter().any(|f| f == "myself"))
                    .is_some_and(|me| me.flags.iter().any(|f| f == "slave"))
                {
                    let link = info_field(&self.reach, node.port, "replication", "master_link_status");
                    if link.as_deref() != Some("up") {
                        return Err(format!("replica {} has master_link_status {link:?}", node.port));
                    }
                }
            }
            Ok(())
        });
    }
}

/// A line of `CLUSTER NODES`.
#[derive(Debug)]
struct ClusterNode {
    id: String,
    port: u16,
    flags: Vec<String>,
    /// The primary's id for a replica, "-" for a primary.
    primary_id: String,
    /// Served slot ranges, inclusive; slots being migrated are left out.
    slots: Vec<(u16, u16)>,
}

impl ClusterNode {
    fn is_primary(&self) -> bool {
        self.flags.iter().any(|f| f == "master")
    }
}

/// `CLUSTER NODES` as the node on `port` sees it.
fn nodes_of(reach: &Reach, port: u16) -> Result<Vec<ClusterNode>, String> {
    let text: String = connect(reach, port)
        .and_then(|mut c| ::redis::cmd("CLUSTER").arg("NODES").query(&mut c))
        .map_err(|e| format!("CLUSTER NODES on {port}: {e}"))?;
    text.lines().filter(|l| !l.trim().is_empty()).map(parse_cluster_node).collect()
}

/// `<id> <ip:port@cport[,hostname]> <flags> <primary> <ping> <pong> <epoch> <link> <slot>...`
fn parse_cluster_node(line: &str) -> Result<ClusterNode, String> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let bad = || format!("unexpected CLUSTER NODES line: {line}");
    if f.len() < 8 {
        return Err(bad());
    }
    let addr = f[1].split(['@', ',']).next().ok_or_else(bad)?;
    let port = addr.rsplit(':').next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let mut slots = Vec::new();
    for s in &f[8..] {
        if s.starts_with('[') {
            continue;
        }
        let (a, b) = s.split_once('-').unwrap_or((s, s));
        slots.push((a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?));
    }
    Ok(ClusterNode {
        id: f[0].to_string(),
        port,
        flags: f[2].split(',').map(str::to_string).collect(),
        primary_id: f[3].to_string(),
        slots,
    })
}

/// Ok once the server on `replica` is a replica of `primary` with its link up.
fn replica_linked(reach: &Reach, replica: u16, primary: u16) -> Result<(), String> {
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
fn info_field(reach: &Reach, port: u16, section: &str, name: &str) -> Option<String> {
    let info: String = ::redis::cmd("INFO").arg(section).query(&mut connect(reach, port).ok()?).ok()?;
    let prefix = format!("{name}:");
    info.lines().find_map(|l| l.strip_prefix(&prefix)).map(|v| v.trim().to_string())
}

/// A connection to `port` on loopback whose connect, reads and writes give up after 2 s.
fn connect(reach: &Reach, port: u16) -> ::redis::RedisResult<::redis::Connection> {
    let client = reach.client(port)?;
    let conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    conn.set_write_timeout(Some(Duration::from_secs(2)))?;
    Ok(conn)
}

/// Waits until `child` answers on `port` as itself; None when it exited first (a port it
/// needed was taken).
fn answering_as(mut child: Child, reach: &Reach, port: u16, what: &str) -> Option<Child> {
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

fn free_port() -> u16 {
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
fn wait_for(timeout: Duration, what: &str, mut check: impl FnMut() -> Result<(), String>) {
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
