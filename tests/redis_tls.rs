//! A managed Redis as the gateway meets it: TLS with a private CA, mutual TLS, and a password
//! from the environment. The test makes its own CA, starts `redis-server` with TLS only, and
//! runs the real binary against it.

use crate::support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::client::Client;
use support::gateway_proc::{GatewayProc, Toml};
use support::pki::Pki;
use support::process::spawn_tied;
use support::upstream::TestUpstream;

const ORDER: &str = r#"{"sku":"A-1","quantity":2}"#;
const PASSWORD: &str = "s3cret-redis-password-9c1e";

/// redis-server listening with TLS only (mutual TLS required) and a password.
struct TlsRedis {
    port: u16,
    _child: Child,
}

fn start_tls_redis(pki: &Pki) -> TlsRedis {
    for _ in 0..10 {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = pki.path(&format!("redis-{port}.log"));
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--requirepass", PASSWORD])
            .arg("--tls-cert-file")
            .arg(pki.path("server.pem"))
            .arg("--tls-key-file")
            .arg(pki.path("server.key"))
            .arg("--tls-ca-cert-file")
            .arg(pki.path("ca.pem"))
            .args(["--tls-auth-clients", "yes"])
            .arg("--dir")
            .arg(pki.dir())
            .arg("--logfile")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = spawn_tied(cmd).expect("redis-server must be on PATH");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                break; // the port was taken: try another
            }
            if std::fs::read_to_string(&log).is_ok_and(|l| l.contains("Ready to accept connections")) {
                return TlsRedis { port, _child: child };
            }
            assert!(
                Instant::now() < deadline,
                "redis-server with TLS did not start: {:?}",
                std::fs::read_to_string(&log)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    panic!("redis-server with TLS did not start on any of 10 ports");
}

fn config(upstream: std::net::SocketAddr, redis_port: u16, store_extra: &str) -> String {
    let store = format!(
        "backend = \"redis\"\nurl = \"rediss://default@127.0.0.1:{redis_port}\"\n\
         password_env = \"IDEMGATE_TEST_REDIS_PASSWORD\"\ntimeout = \"2s\"\n{store_extra}"
    );
    Toml { store: &store, pass_through: false, ..Toml::new(upstream) }.render()
}

fn tls_files(pki: &Pki) -> String {
    format!(
        "ca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}",
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client.key")
    )
}

fn start_gateway(toml: &str) -> GatewayProc {
    // The password reaches the gateway through its environment only, never the file.
    GatewayProc::start_full(toml, &[], &[("IDEMGATE_TEST_REDIS_PASSWORD", PASSWORD)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_redis_with_a_private_ca_a_client_certificate_and_a_password_serves() {
    let pki = Pki::new();
    let redis = start_tls_redis(&pki);
    let upstream = TestUpstream::start().await;
    let gw = start_gateway(&config(upstream.addr, redis.port, &tls_files(&pki)));
    let client = gw.client();
    let admin = Client::new(gw.admin);
    let deadline = Instant::now() + Duration::from_secs(10);
    while admin.get("/readyz", &[]).await.status != 200 {
        assert!(Instant::now() < deadline, "never ready:\n{}", gw.log_lines().join("\n"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first = client.post_json("/orders", Some("tls-1"), ORDER).await;
    assert_eq!(first.status, 201, "{first:?}\n{}", gw.log_lines().join("\n"));
    let again = client.post_json("/orders", Some("tls-1"), ORDER).await;
    assert!(again.is_replay());
    assert_eq!(upstream.executions(), 1);
    assert!(!gw.log_lines().join("\n").contains(PASSWORD), "the password is never logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_whose_certificate_the_gateway_does_not_trust_is_not_used() {
    let pki = Pki::new();
    let redis = start_tls_redis(&pki);
    let upstream = TestUpstream::start().await;
    // Another CA: the server's certificate does not verify.
    let other = Pki::new();
    let files = format!(
        "ca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}",
        other.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client.key")
    );
    let gw = start_gateway(&config(upstream.addr, redis.port, &files));
    let r = gw.client().post_json("/orders", Some("untrusted"), ORDER).await;
    assert_eq!((r.status.as_u16(), r.problem().as_str()), (503, "store-unavailable"));
    assert_eq!(Client::new(gw.admin).get("/readyz", &[]).await.status, 503);
    assert_eq!(upstream.executions(), 0, "fail-closed: nothing forwarded");
    assert!(!gw.log_lines().join("\n").contains(PASSWORD));
}

#[test]
fn tls_files_are_checked_at_load() {
    let pki = Pki::new();
    let with = |url: &str, extra: &str| {
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[store]\nbackend = \"redis\"\nurl = \"{url}\"\n{extra}\n\
             [upstreams.app]\nurl = \"http://127.0.0.1:1\"\n[[routes]]\nname = \"r\"\npath = \"/\"\nupstream = \"app\"\n"
        )
    };
    let check =
        |text: &str| idemgate::config::Config::from_toml_with_env(text, "t", &|_| None).err().map(|e| e.to_string());
    let plain = check(&with("redis://127.0.0.1:6379", &format!("ca_file = {:?}", pki.path("ca.pem")))).unwrap();
    assert!(plain.contains("store.ca_file: applies to TLS URLs only (rediss://"), "{plain}");
    let half = check(&with("rediss://127.0.0.1:6379", &format!("cert_file = {:?}", pki.path("client.pem")))).unwrap();
    assert!(half.contains("store.key_file: is required with cert_file"), "{half}");
    let missing = check(&with("rediss://127.0.0.1:6379", "ca_file = \"/nonexistent/ca.pem\"")).unwrap();
    assert!(missing.contains("store.ca_file: cannot read /nonexistent/ca.pem"), "{missing}");
    let unset = check(&with("rediss://127.0.0.1:6379", "password_env = \"NOT_SET_ANYWHERE_1234\"")).unwrap();
    assert!(
        unset.contains("store.password_env: the environment variable \"NOT_SET_ANYWHERE_1234\" is not set"),
        "{unset}"
    );
    assert!(check(&with("rediss://127.0.0.1:6379", &tls_files(&pki))).is_none());
}
