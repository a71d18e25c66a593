//! `SentinelSet`: a private primary and its replica watched by three Sentinels, on free
//! loopback ports, killed when the test process exits.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::pki::TlsFiles;
use super::process::spawn_tied;
use super::redis::{Reach, RedisServer, answering_as, connect, free_port, info_field, replica_linked, wait_for};

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

    /// Kills the primary (SIGKILL: an unplanned failure) and returns once the first Sentinel
    /// names the replica as the new primary.
    pub fn kill_primary(&self) {
        self.fail_primary(RedisServer::stop);
    }

    /// Freezes the primary (SIGSTOP: it hangs, its connections open and unanswered) and
    /// returns once the first Sentinel names the replica as the new primary.
    pub fn freeze_primary(&self) {
        self.fail_primary(RedisServer::freeze);
    }

    fn fail_primary(&self, fail: impl FnOnce(&RedisServer)) {
        let old = self.primary_index();
        let new_port = self.servers[1 - old].port;
        fail(&self.servers[old]);
        let first = &self.sentinels[0];
        wait_for(Duration::from_secs(30), "the Sentinels to promote the replica", || {
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
        wait_agreed(&self.sentinels, &self.name, primary, replica, timeout);
    }
}

/// Waits until every Sentinel reports `primary` as the primary of `name`, no failover is under
/// way, and each knows `replica` and the two other Sentinels, all healthy.
pub(super) fn wait_agreed(sentinels: &[Sentinel], name: &str, primary: u16, replica: u16, timeout: Duration) {
    wait_for(timeout, "the Sentinels to agree on the primary, its replica and each other", || {
        for s in sentinels {
            let addr = s.master_addr(name);
            if addr != Some(primary) {
                return Err(format!("Sentinel {} reports the primary at {addr:?}, not {primary}", s.port));
            }
            let master = s.query::<Vec<String>>(::redis::cmd("SENTINEL").arg("MASTER").arg(name));
            let master = master.map(|m| pairs(&m)).map_err(|e| e.to_string())?;
            let flags = field(&master, "flags");
            if flags != "master" {
                return Err(format!("Sentinel {} flags the primary {flags:?}", s.port));
            }
            let replicas = s.entries("REPLICAS", name)?;
            if !replicas.iter().any(|r| field(r, "port") == replica.to_string() && healthy(r)) {
                return Err(format!("Sentinel {} does not know replica {replica} healthy: {replicas:?}", s.port));
            }
            let peers = s.entries("SENTINELS", name)?;
            if peers.iter().filter(|p| healthy(p)).count() != 2 {
                return Err(format!("Sentinel {} does not know both others healthy: {peers:?}", s.port));
            }
        }
        Ok(())
    });
}

/// How long a Sentinel gives a failover; also how long it leaves a replica that replicates from
/// an address other than the primary's before re-pointing it (`+fix-slave-config`).
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(5);

/// One `redis-server --sentinel` with its own config file, which it rewrites.
pub(super) struct Sentinel {
    pub(super) port: u16,
    child: Child,
    _dir: tempfile::TempDir,
    reach: Reach,
}

impl Sentinel {
    fn start(name: &str, primary_port: u16, tls: Option<&TlsFiles>) -> Sentinel {
        Sentinel::start_with(name, primary_port, tls, FAILOVER_TIMEOUT)
    }

    /// [`start`] with a `failover-timeout` of `failover_timeout`.
    pub(super) fn start_with(
        name: &str,
        primary_port: u16,
        tls: Option<&TlsFiles>,
        failover_timeout: Duration,
    ) -> Sentinel {
        let reach = Reach::of(tls);
        for _ in 0..10 {
            let dir = tempfile::tempdir().expect("a temporary directory for a Sentinel");
            let port = free_port();
            let conf = dir.path().join("sentinel.conf");
            std::fs::write(&conf, sentinel_conf(port, dir.path(), name, primary_port, tls, failover_timeout)).unwrap();
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

    pub(super) fn query<T: ::redis::FromRedisValue>(&self, cmd: &mut ::redis::Cmd) -> ::redis::RedisResult<T> {
        cmd.query(&mut connect(&self.reach, self.port)?)
    }

    /// The port of the primary this Sentinel reports for `name`.
    pub(super) fn master_addr(&self, name: &str) -> Option<u16> {
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

fn sentinel_conf(
    port: u16,
    dir: &Path,
    name: &str,
    primary_port: u16,
    tls: Option<&TlsFiles>,
    failover_timeout: Duration,
) -> String {
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
    writeln!(conf, "sentinel failover-timeout {name} {}", failover_timeout.as_millis()).unwrap();
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
