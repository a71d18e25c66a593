//! https:// upstreams: verified against the CA bundle named by `ca_file`, over HTTP/2 when
//! the upstream offers it by ALPN; an upstream the CA did not sign is refused (502).

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use support::gateway::TestGateway;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{self, pki_types::PrivateKeyDer};

struct TlsUpstream {
    port: u16,
    ca_pem: String,
    hits: Arc<AtomicUsize>,
    versions: Arc<std::sync::Mutex<Vec<http::Version>>>,
}

async fn tls_upstream() -> TlsUpstream {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_owned()]).unwrap().signed_by(&leaf_key, &ca).unwrap();

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()))
        .unwrap();
    server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(server));

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let versions = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (h, v) = (hits.clone(), versions.clone());
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { continue };
            let (acceptor, h, v) = (acceptor.clone(), h.clone(), v.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let n = h.fetch_add(1, Ordering::SeqCst) + 1;
                    v.lock().unwrap().push(req.version());
                    async move {
                        Ok::<_, std::convert::Infallible>(
                            http::Response::builder()
                                .status(201)
                                .body(Full::new(Bytes::from(format!("{{\"n\":{n}}}"))))
                                .unwrap(),
                        )
                    }
                });
                let _ = auto::Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(tls), service).await;
            });
        }
    });
    TlsUpstream { port, ca_pem: ca.pem(), hits, versions }
}

fn config(port: u16, ca_file: &std::path::Path) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
[store]
backend = "memory"
[upstreams.secure]
url = "https://localhost:{port}"
ca_file = "{ca}"
timeout = "3s"
[[routes]]
name = "orders"
methods = ["POST"]
path = "/orders"
upstream = "secure"
[routes.idempotency]
"#,
        ca = ca_file.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstream_verified_by_ca_file_over_h2() {
    let up = tls_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let ca_path = dir.path().join("ca.pem");
    std::fs::write(&ca_path, &up.ca_pem).unwrap();
    let gw = TestGateway::start(&config(up.port, &ca_path)).await;
    let client = gw.client();
    let first = client.post_json("/orders", Some("tls"), "{}").await;
    assert_eq!(first.status, 201, "{first:?}");
    let again = client.post_json("/orders", Some("tls"), "{}").await;
    assert!(again.is_replay() && again.body == first.body);
    assert_eq!(up.hits.load(Ordering::SeqCst), 1);
    assert_eq!(up.versions.lock().unwrap()[0], http::Version::HTTP_2, "h2 negotiated by ALPN");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstream_signed_by_another_ca_is_refused() {
    let up = tls_upstream().await;
    let other = tls_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let ca_path = dir.path().join("other-ca.pem");
    std::fs::write(&ca_path, &other.ca_pem).unwrap();
    let gw = TestGateway::start(&config(up.port, &ca_path)).await;
    let r = gw.client().post_json("/orders", Some("mitm"), "{}").await;
    assert_eq!(r.status, 502);
    assert_eq!(r.problem(), "upstream-unavailable");
    assert_eq!(up.hits.load(Ordering::SeqCst), 0);
}
