//! The real `idemgate` binary as a child process: started on free ports, killed with
//! SIGKILL or stopped with SIGTERM like in production.
// Child processes get a descriptor limit (setrlimit before exec) and signals (kill): libc
// calls, each commented. The gateway itself has no unsafe code.
#![allow(unsafe_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::client::Client;
use super::process::spawn_tied;

pub struct GatewayProc {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl GatewayProc {
    /// Starts the binary with `toml` (which should listen on port 0) and waits until it serves.
    pub fn start(toml: &str) -> Self {
        Self::start_with(toml, &[])
    }

    /// Starts the binary with `toml` and extra command-line arguments. The addresses come from
    /// the one line the gateway prints on stdout once bound.
    pub fn start_with(toml: &str, args: &[&str]) -> Self {
        Self::start_full(toml, args, &[])
    }

    /// Starts the binary with `toml`, extra arguments and extra environment variables.
    pub fn start_full(toml: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_in(&binary(), toml, args, env, None)
    }

    /// Starts the binary with `toml`, allowed `nofile` file descriptors at most (its soft and
    /// hard `RLIMIT_NOFILE`, as `prlimit --nofile=N` sets them).
    pub fn start_limited(toml: &str, nofile: u64) -> Self {
        Self::start_in(&binary(), toml, &[], &[], Some(nofile))
    }

    /// Starts `bin` (another build of the gateway, such as the previous release) with `toml`.
    pub fn start_binary(bin: &std::path::Path, toml: &str) -> Self {
        Self::start_in(bin, toml, &[], &[], None)
    }

    fn start_in(bin: &std::path::Path, toml: &str, args: &[&str], env: &[(&str, &str)], nofile: Option<u64>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, toml).unwrap();
        let mut cmd = Command::new(bin);
        cmd.arg("--config").arg(&path).args(args).env("RUST_LOG", "info");
        cmd.envs(env.iter().copied());
        if let Some(n) = nofile {
            limit_nofile(&mut cmd, n);
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = spawn_tied(cmd).expect("start idemgate");
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&log);
        // Drain stderr for the whole life of the process: a full pipe would block its logging.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("idemgate listening ") {
                    let _ = tx.send(line);
                }
            }
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| {
            panic!("gateway did not start:\n{}", log.lock().unwrap().join("\n"));
        });
        let addr = field(&line, "proxy=").parse().unwrap();
        let admin = field(&line, "admin=").parse().unwrap();
        Self { addr, admin, child, log, _dir: dir }
    }

    /// The configuration file the gateway reads (and re-reads on reload).
    pub fn config_path(&self) -> std::path::PathBuf {
        self._dir.path().join("gateway.toml")
    }

    /// Sends SIGHUP: reload the configuration.
    pub fn sighup(&self) {
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGHUP);
        }
    }

    /// The log lines written so far.
    pub fn log_lines(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// The log lines containing `needle`, once there are at least `at_least` of them (or
    /// after 5 s, with what there is): lines reach stderr through the gateway's log writer
    /// thread, a moment after what they report.
    pub fn lines_with(&self, needle: &str, at_least: usize) -> Vec<String> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let lines: Vec<String> = self.log_lines().into_iter().filter(|l| l.contains(needle)).collect();
            if lines.len() >= at_least || std::time::Instant::now() > deadline {
                return lines;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    pub fn client(&self) -> Client {
        Client::new(self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: the process dies mid-whatever, with no chance to release anything.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn sigterm(&self) {
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
    }

    /// Waits for the process to exit, at most `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A metric's value from the admin listener (0 when absent).
    pub async fn metric(&self, name: &str) -> f64 {
        let text = Client::new(self.admin).get("/metrics", &[]).await.body;
        String::from_utf8_lossy(&text)
            .lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for GatewayProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A test failing with a gateway up: its last log lines say what the gateway saw (a
        // store error, a reload refused), which the client's status alone does not.
        if std::thread::panicking() {
            let lines = self.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            let told: Vec<&String> = lines.iter().filter(|l| !l.contains("idemgate::access")).collect();
            let tail = &told[told.len().saturating_sub(30)..];
            let shown: Vec<&str> = tail.iter().map(|l| l.as_str()).collect();
            eprintln!(
                "--- the gateway on {}: the last {} of its log lines other than access lines:\n{}",
                self.addr,
                shown.len(),
                shown.join("\n")
            );
        }
    }
}

/// The binary under test: this build's, or the one `IDEMGATE_BIN` names (CI points it at the
/// release build, so that the hardening tests also run against what ships).
fn binary() -> std::path::PathBuf {
    std::env::var_os("IDEMGATE_BIN").map_or_else(|| env!("CARGO_BIN_EXE_idemgate").into(), Into::into)
}

fn field<'a>(line: &'a str, prefix: &str) -> &'a str {
    let start = line.find(prefix).unwrap_or_else(|| panic!("no {prefix} in {line}")) + prefix.len();
    line[start..].split_whitespace().next().unwrap()
}

/// The config most process tests start from: listeners on port 0, the memory store, one
/// upstream `app`, an idempotent `POST /orders` route, and (unless turned off) a pass-through
/// route for everything else. Each field adds lines to its section.
pub struct Toml<'a> {
    pub upstream: SocketAddr,
    /// The proxy listener (`"127.0.0.1:0"` unless a test needs a fixed one).
    pub listen: &'a str,
    /// Extra `[server]` lines.
    pub server: &'a str,
    /// The `[store]` section's lines.
    pub store: &'a str,
    /// Extra `[upstreams.app]` lines.
    pub upstream_lines: &'a str,
    /// Lines of the orders route's `[routes.idempotency]`.
    pub policy: &'a str,
    /// Whether `/{*rest}` passes through to the upstream (the last route).
    pub pass_through: bool,
    /// Routes after the orders route.
    pub routes: String,
}

impl<'a> Toml<'a> {
    pub fn new(upstream: SocketAddr) -> Self {
        Self {
            upstream,
            listen: "127.0.0.1:0",
            server: "",
            store: "backend = \"memory\"",
            upstream_lines: "",
            policy: "",
            pass_through: true,
            routes: String::new(),
        }
    }

    pub fn render(&self) -> String {
        let Self { upstream, listen, server, store, upstream_lines, policy, pass_through, routes } = self;
        let rest =
            if *pass_through { "\n[[routes]]\nname = \"rest\"\npath = \"/{*rest}\"\nupstream = \"app\"\n" } else { "" };
        format!(
            r#"
[server]
listen = "{listen}"
admin_listen = "127.0.0.1:0"
{server}

[store]
{store}

[upstreams.app]
url = "http://{upstream}"
{upstream_lines}

[[routes]]
name = "orders"
methods = ["POST"]
path = "/orders"
upstream = "app"

[routes.idempotency]
{policy}
{routes}{rest}"#
        )
    }
}

/// Runs `cmd` allowed `n` file descriptors at most (its soft and hard `RLIMIT_NOFILE`, as
/// `prlimit --nofile=N` sets them).
pub fn limit_nofile(cmd: &mut Command, n: u64) {
    use std::os::unix::process::CommandExt;
    // In the child, before exec: only async-signal-safe calls.
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit { rlim_cur: n, rlim_max: n };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
