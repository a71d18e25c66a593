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
    get_path(addr, ca, alpn, "/").await.map(|(status, version, _)| (status, version))
}

/// GET `path` over TLS trusting `ca`, offering `alpn`; the status, the version and the
/// answer's Content-Security-Policy.
async fn get_path(
    addr: SocketAddr,
    ca: &CertificateDer<'static>,
    alpn: &[u8],
    path: &str,
) -> Result<(u16, Version, Option<String>), String> {
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
    let request = Request::get(format!("https://{addr}{path}"))
        .header("host", addr.to_string())
        .body(Empty::<Bytes>::new())
        .unwrap();
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
    let policy = response.headers().get("content-security-policy").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let _ = response.into_body().collect().await;
    Ok((status, version, policy))
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

/// `[server.admin_tls]`: the admin listener speaks TLS with its own certificate (the console
/// and its calls included), never plain HTTP, and renews it on reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_speaks_tls_with_its_own_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let proxy_ca = issue(dir.path(), "proxy");
    let admin_dir = dir.path().join("admin");
    std::fs::create_dir_all(&admin_dir).unwrap();
    let admin_ca = issue(&admin_dir, "admin");
    let upstream = TestUpstream::start().await;
    let toml = config(upstream.addr, dir.path()).replace(
        "[store]",
        &format!(
            "[server.admin_tls]\ncert = {:?}\nkey = {:?}\n\n[store]",
            admin_dir.join("cert.pem"),
            admin_dir.join("key.pem")
        ),
    );
    let gw = GatewayProc::start(&toml);
    for alpn in [&b"h2"[..], b"http/1.1"] {
        let (status, _, policy) = get_path(gw.admin, &admin_ca, alpn, "/console/").await.expect("the console over TLS");
        assert_eq!(status, 200);
        assert!(policy.is_some_and(|p| p.contains("frame-ancestors 'none'")), "served under its policy");
        assert_eq!(get_path(gw.admin, &admin_ca, alpn, "/healthz").await.map(|r| r.0), Ok(200));
    }
    assert!(get_path(gw.admin, &proxy_ca, b"h2", "/healthz").await.is_err(), "its own certificate, not the proxy's");
    let plain = Client::new(gw.admin).try_send(http::Method::GET, "/healthz", &[], "").await;
    assert!(plain.is_err() || plain.as_ref().is_ok_and(|r| r.status != 200), "plain HTTP answered: {plain:?}");

    // Renewed on reload, over the listener itself.
    let renewed = issue(&admin_dir, "admin renewed");
    let reload = reload_over_tls(gw.admin, &admin_ca).await;
    assert_eq!(reload, Ok(200));
    assert_eq!(get_path(gw.admin, &renewed, b"h2", "/healthz").await.map(|r| r.0), Ok(200));
    assert!(get_path(gw.admin, &admin_ca, b"h2", "/healthz").await.is_err(), "the old certificate is gone");
}

/// `POST /reload` over TLS with the admin token; the status.
async fn reload_over_tls(addr: SocketAddr, ca: &CertificateDer<'static>) -> Result<u16, String> {
    let mut sender = connect(addr, ca, None).await;
    let request = Request::post(format!("https://{addr}/reload"))
        .header("host", addr.to_string())
        .header("authorization", "Bearer test-admin-token-0123456789")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    Ok(response.status().as_u16())
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

/// A certificate for `names` signed by `ca`, written to `dir/{file}.pem` and `dir/{file}-key.pem`.
fn issue_for(dir: &std::path::Path, ca: &CertifiedIssuer<'static, KeyPair>, file: &str, names: &[&str]) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, file);
    let cert = params.signed_by(&key, ca).unwrap();
    std::fs::write(dir.join(format!("{file}.pem")), cert.pem()).unwrap();
    std::fs::write(dir.join(format!("{file}-key.pem")), key.serialize_pem()).unwrap();
}

/// A listener whose default certificate is for 127.0.0.1, with one for `api.example.com` and
/// one for `*.example.com` chosen by SNI.
fn sni_config(upstream: SocketAddr, dir: &std::path::Path) -> String {
    let file = |name: &str| dir.join(name);
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[server.tls]
cert = {:?}
key = {:?}

[[server.tls.certs]]
hosts = ["api.example.com"]
cert = {:?}
key = {:?}

[[server.tls.certs]]
hosts = ["*.example.com"]
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
        file("default.pem"),
        file("default-key.pem"),
        file("api.pem"),
        file("api-key.pem"),
        file("wild.pem"),
        file("wild-key.pem"),
    )
}

/// One TLS connection to `addr` asking for `sni` (none: by address, no SNI sent), trusting
/// `ca`, speaking HTTP/1.1; the names of the certificate it was served are checked by rustls.
async fn connect(
    addr: SocketAddr,
    ca: &CertificateDer<'static>,
    sni: Option<&'static str>,
) -> hyper::client::conn::http1::SendRequest<Empty<Bytes>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = match sni {
        Some(name) => ServerName::try_from(name).unwrap(),
        None => ServerName::IpAddress(addr.ip().into()),
    };
    let tls = TlsConnector::from(Arc::new(config)).connect(name, tcp).await.unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.unwrap();
    tokio::spawn(conn);
    sender
}

async fn status_for(sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>, host: &str) -> u16 {
    sender.ready().await.unwrap();
    let request = Request::get("/x").header("host", host).body(Empty::<Bytes>::new()).unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    if status == 421 {
        assert!(String::from_utf8_lossy(&body).contains("misdirected-request"), "{body:?}");
    }
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_are_chosen_by_name_and_a_host_the_served_one_does_not_cover_gets_421() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "sni CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    issue_for(dir.path(), &ca, "default", &["127.0.0.1"]);
    issue_for(dir.path(), &ca, "api", &["api.example.com"]);
    issue_for(dir.path(), &ca, "wild", &["*.example.com"]);
    let ca_der = ca.der().clone();
    let upstream = TestUpstream::start().await;
    let gw = GatewayProc::start(&sni_config(upstream.addr, dir.path()));

    // rustls on the client side refuses any certificate but one valid for the name it asked:
    // each handshake below proves which certificate was chosen.
    let mut api = connect(gw.addr, &ca_der, Some("api.example.com")).await;
    assert_eq!(status_for(&mut api, "api.example.com").await, 201);
    assert_eq!(status_for(&mut api, "API.example.com:443").await, 201);
    // The same connection reused for a host its certificate does not cover.
    assert_eq!(status_for(&mut api, "t.example.com").await, 421);
    assert_eq!(status_for(&mut api, "api.example.com").await, 201, "the connection stays usable");

    let mut wild = connect(gw.addr, &ca_der, Some("t.example.com")).await;
    assert_eq!(status_for(&mut wild, "t.example.com").await, 201);
    // Covered by the served certificate, whatever name was sent: reuse is allowed.
    assert_eq!(status_for(&mut wild, "u.example.com").await, 201);
    assert_eq!(status_for(&mut wild, "api.example.com").await, 201);
    // A certificate's wildcard covers one label.
    assert_eq!(status_for(&mut wild, "a.b.example.com").await, 421);

    // No SNI: the default certificate.
    let mut plain = connect(gw.addr, &ca_der, None).await;
    assert_eq!(status_for(&mut plain, "127.0.0.1").await, 201);
    assert_eq!(status_for(&mut plain, "api.example.com").await, 421);
    // An unknown name is served the default too (the client would refuse it, as here).
    let unknown = {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca_der.clone()).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tcp = TcpStream::connect(gw.addr).await.unwrap();
        TlsConnector::from(Arc::new(config)).connect(ServerName::try_from("other.test").unwrap(), tcp).await
    };
    assert!(unknown.is_err());

    // The 201s only: nothing refused reached the upstream.
    assert_eq!(upstream.seen().len(), 7);
}

#[test]
fn a_certificate_that_does_not_cover_its_hosts_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    issue_for(dir.path(), &ca, "default", &["127.0.0.1"]);
    issue_for(dir.path(), &ca, "api", &["api.example.com"]);
    issue_for(dir.path(), &ca, "wild", &["other.example.com"]);
    let err = idemgate::config::Config::from_toml(&sni_config("127.0.0.1:1".parse().unwrap(), dir.path()), "t")
        .unwrap_err()
        .to_string();
    assert!(err.contains("wild.pem is not valid for *.example.com"), "{err}");
}
