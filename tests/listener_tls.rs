//! TLS on the proxy listener, against the real binary: HTTP/1.1 and h2 by ALPN, the upstream
//! told `X-Forwarded-Proto: https`, a renewed certificate picked up on reload, and a client
//! that never finishes its handshake dropped at the header timeout.

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Version};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls_pki_types::{CertificateDer, ServerName};
use support::client::Client;
use support::gateway_proc::GatewayProc;
use support::upstream::TestUpstream;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// A CA and a certificate for 127.0.0.1 signed by it, written to `dir`.
fn issue(dir: &std::path::Path, name: &str) -> CertificateDer<'static> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, format!("{name} CA"));
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, format!("{name} gateway"));
    let cert = params.signed_by(&key, &ca).unwrap();
    std::fs::write(dir.join("cert.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
    ca.der().clone()
}

fn config(upstream: SocketAddr, dir: &std::path::Path) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
admin_token = "test-admin-token-0123456789"
header_read_timeout = "1s"

[server.tls]
cert = {:?}
key = {:?}

[store]
backend = "memory"

[upstreams.app]
url = "http://{upstream}"

[[routes]]
name = "rest"
path = "/{{*rest}}"
upstream = "app"
"#,
        dir.join("cert.pem"),
        dir.join("key.pem")
    )
}

/// GET / over TLS trusting `ca`, offering `alpn`; the status and the HTTP version spoken.
async fn get(addr: SocketAddr, ca: &CertificateDer<'static>, alpn: &[u8]) -> Result<(u16, Version), String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ServerName::IpAddress(addr.ip().into());
    let tls = TlsConnector::from(Arc::new(config)).connect(name, tcp).await.map_err(|e| e.to_string())?;
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    // HTTP/1.1 needs its Host (the gateway refuses a request without one); h2 has :authority.
    let request =
        Request::get(format!("https://{addr}/")).header("host", addr.to_string()).body(Empty::<Bytes>::new()).unwrap();
    let response = if h2 {
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        sender.send_request(request).await.map_err(|e| e.to_string())?
    } else {
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        sender.send_request(request).await.map_err(|e| e.to_string())?
    };
    let version = response.version();
    let status = response.status().as_u16();
    let _ = response.into_body().collect().await;
    Ok((status, version))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_speaks_tls_with_h2_and_http11_and_renews_on_reload() {
    let dir = tempfile::tempdir().unwrap();
    let first_ca = issue(dir.path(), "first");
    let upstream = TestUpstream::start().await;
    let gw = GatewayProc::start(&config(upstream.addr, dir.path()));

    assert_eq!(get(gw.addr, &first_ca, b"h2").await, Ok((201, Version::HTTP_2)));
    assert_eq!(get(gw.addr, &first_ca, b"http/1.1").await, Ok((201, Version::HTTP_11)));
    assert_eq!(upstream.seen()[0].headers["x-forwarded-proto"], "https");

    // A renewed certificate (another CA here, to tell them apart) is read on reload.
    let second_ca = issue(dir.path(), "second");
    let reload = Client::new(gw.admin)
        .send(http::Method::POST, "/reload", &[("authorization", "Bearer test-admin-token-0123456789")], "")
        .await;
    assert_eq!(reload.status, 200, "{:?}", reload.body);
    assert_eq!(get(gw.addr, &second_ca, b"h2").await, Ok((201, Version::HTTP_2)));
    assert!(get(gw.addr, &first_ca, b"h2").await.is_err(), "the old certificate is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_handshake_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    issue(dir.path(), "only");
    let upstream = TestUpstream::start().await;
    let gw = GatewayProc::start(&config(upstream.addr, dir.path()));
    let mut silent = TcpStream::connect(gw.addr).await.unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(4), silent.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "still open: {read:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "dropped after {:?}", started.elapsed());
}

#[test]
fn bad_certificate_files_are_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cert.pem"), "not a certificate").unwrap();
    std::fs::write(dir.path().join("key.pem"), "not a key").unwrap();
    let err =
        idemgate::config::Config::from_toml(&config("127.0.0.1:1".parse().unwrap(), dir.path()), "t").unwrap_err();
    assert!(err.to_string().contains("server.tls: certificate"), "{err}");
}
