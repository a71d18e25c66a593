//! Several instances behind one upstream (`urls`, or a name resolved again with
//! `resolve_every`): the load spread by least outstanding requests over two random choices,
//! an instance that stops left out, a request that was never sent tried on another instance,
//! and one that was sent never sent again. Every test counts executions per instance, not
//! only what the client saw.

use crate::support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::client::Client;
use support::gateway::TestGateway;
use support::raw_upstream::Hanging;
use support::upstream::{Behavior, TestUpstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

const ORDER: &str = r#"{"sku":"BOOK-42"}"#;

fn config(urls: &[String]) -> String {
    let store = support::gateway::StoreKind::Memory.toml(&support::unique("inst"));
    let urls: Vec<String> = urls.iter().map(|u| format!("{u:?}")).collect();
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[store]
{store}

[upstreams.app]
urls = [{}]
timeout = "5s"
connect_timeout = "1s"
eject_after = 2
eject_for = "30s"

[[routes]]
name = "orders"
methods = ["POST"]
path = "/orders"
upstream = "app"
[routes.idempotency]

[[routes]]
name = "rest"
path = "/{{*rest}}"
upstream = "app"
"#,
        urls.join(", ")
    )
}

/// A port nothing listens on (bound, then let go).
async fn closed_port() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

/// How many times each key reached any of `upstreams`.
fn executions(upstreams: &[&TestUpstream]) -> HashMap<String, usize> {
    let mut all = HashMap::new();
    for upstream in upstreams {
        for (key, n) in upstream.executions_by_key() {
            *all.entry(key).or_insert(0) += n;
        }
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_is_spread_within_ten_percent_over_three_instances() {
    let slow = Behavior { delay: Duration::from_millis(5), ..Behavior::default() };
    let (a, b, c) = (
        TestUpstream::with(slow.clone()).await,
        TestUpstream::with(slow.clone()).await,
        TestUpstream::with(slow).await,
    );
    let urls: Vec<String> = [&a, &b, &c].iter().map(|u| format!("http://{}", u.addr)).collect();
    let gw = TestGateway::start(&config(&urls)).await;
    let mut clients = JoinSet::new();
    for worker in 0..30 {
        let client = gw.client();
        clients.spawn(async move {
            for i in 0..20 {
                let r = client.post_json("/orders", Some(&format!("spread-{worker}-{i}")), ORDER).await;
                assert_eq!(r.status, 201, "{r:?}");
            }
        });
    }
    while let Some(done) = clients.join_next().await {
        done.unwrap();
    }
    let counts = [a.executions(), b.executions(), c.executions()];
    assert_eq!(counts.iter().sum::<usize>(), 600);
    for n in counts {
        assert!((180..=220).contains(&n), "not within 10% of 200 each: {counts:?}");
    }
    assert!(executions(&[&a, &b, &c]).values().all(|&n| n == 1));
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_no_instance_was_sent_goes_to_another() {
    let live = TestUpstream::start().await;
    let urls = [format!("http://{}", live.addr), closed_port().await, closed_port().await];
    let gw = TestGateway::start(&config(&urls)).await;
    let client = gw.client();
    for i in 0..30 {
        let r = client.post_json("/orders", Some(&format!("elsewhere-{i}")), ORDER).await;
        assert_eq!(r.status, 201, "request {i}: {r:?}");
        assert_eq!(r.header("idempotency-status"), None);
    }
    // Every key ran once, on the one instance that connects, as its first attempt.
    assert_eq!(live.executions(), 30);
    assert!(executions(&[&live]).values().all(|&n| n == 1));
    assert!(live.seen().iter().all(|s| s.headers["idempotency-attempt"] == "1"));
    // Each instance in /metrics: the live one took every request; each dead one failed to
    // connect until it was left out (eject_after = 2), once, and was tried no more.
    let metrics = String::from_utf8_lossy(&gw.admin_client().get("/metrics", &[]).await.body).into_owned();
    let series = |name: &str, instance: &str, extra: &str| -> u64 {
        let prefix = format!("idemgate_upstream_instance_{name}{{upstream=\"app\",instance=\"{instance}\"{extra}}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
            .unwrap_or_else(|| panic!("no {prefix} in {metrics}"))
    };
    let authority = |url: &str| url.trim_start_matches("http://").to_owned();
    assert_eq!(series("requests_total", &authority(&urls[0]), ""), 30);
    for dead in &urls[1..] {
        let dead = authority(dead);
        assert_eq!(series("failures_total", &dead, ",kind=\"connect\""), 2, "{metrics}");
        assert_eq!(series("ejections_total", &dead, ""), 1);
        assert_eq!(series("requests_total", &dead, ""), 2);
    }
    assert_eq!(series("in_flight", &authority(&urls[0]), ""), 0);
    gw.shutdown().await;
}

/// An instance that reads each request whole, counts it, and closes the connection without
/// an answer: the request was sent, and its outcome is unknown.
async fn swallowing_instance() -> (SocketAddr, Arc<Mutex<usize>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(0));
    let count = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { continue };
            let count = Arc::clone(&count);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // The head and the 17-byte body.
                while !String::from_utf8_lossy(&buf).contains(ORDER) {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                *count.lock().unwrap() += 1;
                let _ = stream.shutdown().await;
            });
        }
    });
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_was_sent_is_never_sent_to_another_instance() {
    let (swallower, swallowed) = swallowing_instance().await;
    let live = TestUpstream::start().await;
    let urls = [format!("http://{swallower}"), format!("http://{}", live.addr)];
    let gw = TestGateway::start(&config(&urls)).await;
    let unknown = unknown_of_24(&gw, "sent").await;
    // Both instances were chosen; every request the first swallowed stayed unknown and never
    // reached the second.
    let swallowed = *swallowed.lock().unwrap();
    assert!(swallowed > 0, "the swallowing instance was never chosen");
    assert_eq!(swallowed, unknown.len(), "a request it took was answered by another instance");
    let ran = live.executions_by_key();
    for key in &unknown {
        assert!(!ran.contains_key(&format!("\"{key}\"")) && !ran.contains_key(key), "{key} ran elsewhere: {ran:?}");
    }
    assert_eq!(live.executions() + unknown.len(), 24);
    gw.shutdown().await;
}

/// An instance that can be stopped: its listener and every connection it serves end at once.
struct Stoppable {
    addr: SocketAddr,
    upstream: TestUpstream,
    proxy: tokio::task::JoinHandle<()>,
}

impl Stoppable {
    /// A TCP relay in front of a [`TestUpstream`], so that stopping it ends its connections.
    async fn start() -> Self {
        let upstream = TestUpstream::start().await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let target = upstream.addr;
        let proxy = tokio::spawn(async move {
            let mut relays = JoinSet::new();
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else { continue };
                relays.spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Self { addr, upstream, proxy }
    }

    fn stop(&self) {
        self.proxy.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_stops_is_left_out_and_no_request_runs_twice() {
    let (a, b, c) = (Stoppable::start().await, Stoppable::start().await, Stoppable::start().await);
    let urls: Vec<String> = [&a, &b, &c].iter().map(|u| format!("http://{}", u.addr)).collect();
    let gw = TestGateway::start(&config(&urls)).await;
    let client = gw.client();
    let send = |client: Client, from: usize, to: usize| async move {
        for i in from..to {
            let r = client.post_json("/orders", Some(&format!("stop-{i}")), ORDER).await;
            assert_eq!(r.status, 201, "request {i}: {r:?}");
        }
    };
    send(client.clone(), 0, 30).await;
    let before = c.upstream.executions();
    assert!(before > 0, "c was never chosen");
    c.stop();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Pooled connections to c are gone, and new ones are refused: each request that picks
    // it was never sent, and goes to another.
    send(client.clone(), 30, 90).await;
    assert_eq!(c.upstream.executions(), before, "c ran a request after it stopped");
    let all = executions(&[&a.upstream, &b.upstream, &c.upstream]);
    assert_eq!(all.len(), 90);
    assert!(all.values().all(|&n| n == 1), "a key ran twice: {all:?}");
    gw.shutdown().await;
}

/// What an [`h2_instance`] saw: its address, the streams, the keys it ran, and for each
/// stream the server name the client sent and its `:authority`.
type H2Instance = (SocketAddr, Arc<std::sync::atomic::AtomicUsize>, Arc<Mutex<Vec<String>>>, Arc<Mutex<Vec<String>>>);

/// An https instance speaking HTTP/2 (by ALPN) with the test PKI's server certificate. With
/// `refuse`, it resets every stream with REFUSED_STREAM before reading it (RFC 9113 §8.7: not
/// processed); otherwise it answers 201. Counts the streams it saw and the keys it ran.
async fn h2_instance(pki: &support::pki::Pki, refuse: bool) -> H2Instance {
    use std::sync::atomic::{AtomicUsize, Ordering};

    let acceptor = h2_acceptor(pki);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let streams = Arc::new(AtomicUsize::new(0));
    let ran = Arc::new(Mutex::new(Vec::new()));
    let names = Arc::new(Mutex::new(Vec::new()));
    let (s, r, n) = (Arc::clone(&streams), Arc::clone(&ran), Arc::clone(&names));
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { continue };
            let (acceptor, s, r, n) = (acceptor.clone(), Arc::clone(&s), Arc::clone(&r), Arc::clone(&n));
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let sni = tls.get_ref().1.server_name().unwrap_or("(none)").to_owned();
                let Ok(mut connection) = h2::server::handshake(tls).await else { return };
                while let Some(Ok((request, mut respond))) = connection.accept().await {
                    s.fetch_add(1, Ordering::SeqCst);
                    let authority = request.uri().authority().map_or("(none)", |a| a.as_str());
                    n.lock().unwrap().push(format!("{sni} {authority}"));
                    if refuse {
                        respond.send_reset(h2::Reason::REFUSED_STREAM);
                        continue;
                    }
                    let key = request.headers().get("idempotency-key").map(|v| v.to_str().unwrap().to_owned());
                    r.lock().unwrap().push(key.unwrap_or_default());
                    // A task per stream: the connection makes progress only while `accept`
                    // is polled.
                    tokio::spawn(async move {
                        let mut body = request.into_body();
                        while let Some(chunk) = body.data().await {
                            let _ = body.flow_control().release_capacity(chunk.map(|c| c.len()).unwrap_or(0));
                        }
                        let response = http::Response::builder().status(201).body(()).unwrap();
                        if let Ok(mut send) = respond.send_response(response, false) {
                            let _ = send.send_data(bytes::Bytes::from_static(b"{\"ok\":true}"), true);
                        }
                    });
                }
            });
        }
    });
    (addr, streams, ran, names)
}

/// Sends 24 orders keyed `PREFIX-i`, each answered 201 or 502 `outcome-unknown`; the keys
/// of the latter.
async fn unknown_of_24(gw: &TestGateway, prefix: &str) -> Vec<String> {
    let client = gw.client();
    let mut unknown = Vec::new();
    for i in 0..24 {
        let key = format!("{prefix}-{i}");
        let r = client.post_json("/orders", Some(&key), ORDER).await;
        match r.status.as_u16() {
            201 => {}
            502 => {
                assert_eq!(r.problem(), "outcome-unknown", "{r:?}");
                unknown.push(key);
            }
            other => panic!("{other}: {r:?}"),
        }
    }
    unknown
}

/// `toml` trusting the test PKI's CA for its https instances.
fn with_ca(toml: &str, pki: &support::pki::Pki) -> String {
    toml.replace("connect_timeout = \"1s\"", &format!("connect_timeout = \"1s\"\nca_file = {:?}", pki.path("ca.pem")))
}

/// `n` keys ran, each once.
fn assert_each_ran_once(ran: &Mutex<Vec<String>>, n: usize) {
    let all = ran.lock().unwrap().clone();
    let mut distinct = all.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!((distinct.len(), all.len()), (n, n), "{all:?}");
}

/// An https instance that speaks just enough HTTP/2, frame by frame, to take each request's
/// HEADERS and answer it with a GOAWAY. With `above`, the GOAWAY's last stream id is below
/// the request's: the stream was not processed (RFC 9113 §6.8). Otherwise it is the
/// request's own, which says the stream may have been processed, and the connection closes
/// without an answer. Counts the streams it took.
async fn goaway_instance(pki: &support::pki::Pki, above: bool) -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};

    let acceptor = h2_acceptor(pki);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let turned_away = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&turned_away);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { continue };
            let (acceptor, counted) = (acceptor.clone(), Arc::clone(&counted));
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                let mut preface = [0u8; 24];
                if tls.read_exact(&mut preface).await.is_err() || &preface != b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" {
                    return;
                }
                // Our SETTINGS (none changed).
                let _ = tls.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await;
                loop {
                    let mut head = [0u8; 9];
                    if tls.read_exact(&mut head).await.is_err() {
                        return;
                    }
                    let length = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
                    let (kind, flags) = (head[3], head[4]);
                    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
                    let mut payload = vec![0u8; length];
                    if tls.read_exact(&mut payload).await.is_err() {
                        return;
                    }
                    match kind {
                        // The client's SETTINGS: acknowledged.
                        4 if flags & 1 == 0 => {
                            let _ = tls.write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0]).await;
                        }
                        // A request: GOAWAY, NO_ERROR, with the last stream id below it, or
                        // at it and the connection closed.
                        1 => {
                            counted.fetch_add(1, Ordering::SeqCst);
                            let last = if above { stream.saturating_sub(2) } else { stream };
                            let mut frame = vec![0, 0, 8, 7, 0, 0, 0, 0, 0];
                            frame.extend_from_slice(&last.to_be_bytes());
                            frame.extend_from_slice(&[0, 0, 0, 0]);
                            let _ = tls.write_all(&frame).await;
                            let _ = tls.flush().await;
                            if !above {
                                let _ = tls.shutdown().await;
                                return;
                            }
                        }
                        _ => {}
                    }
                }
            });
        }
    });
    (addr, turned_away)
}

/// A TLS acceptor with the test PKI's server certificate, offering h2 by ALPN.
fn h2_acceptor(pki: &support::pki::Pki) -> tokio_rustls::TlsAcceptor {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(pki.path("server.pem")).unwrap().map(Result::unwrap).collect();
    let key = PrivateKeyDer::from_pem_file(pki.path("server.key")).unwrap();
    let mut server = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    server.alpn_protocols = vec![b"h2".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(server))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_above_a_goaway_is_held_as_unknown_and_never_sent_elsewhere() {
    // The instance turns each stream away with a GOAWAY below it: not processed, by RFC 9113
    // §6.8. But hyper reports a GOAWAY the same way for a stream it had already queued at or
    // below the last id (which the instance runs), so no GOAWAY'd stream is taken for unsent:
    // each is an unknown outcome, and none runs on another instance.
    let pki = support::pki::Pki::new();
    let (leaving, turned_away) = goaway_instance(&pki, true).await;
    let (good, _, good_ran, _) = h2_instance(&pki, false).await;
    let toml = with_ca(&config(&[format!("https://{leaving}"), format!("https://{good}")]), &pki);
    let gw = TestGateway::start(&toml).await;
    let unknown = unknown_of_24(&gw, "goaway").await;
    let turned_away = turned_away.load(std::sync::atomic::Ordering::SeqCst);
    assert!(turned_away > 0, "the leaving instance was never chosen");
    assert_eq!(turned_away, unknown.len(), "a stream it turned away was answered by another instance");
    let ran = good_ran.lock().unwrap().clone();
    for key in &unknown {
        assert!(!ran.contains(key), "{key} ran elsewhere: {ran:?}");
    }
    assert_eq!(ran.len() + unknown.len(), 24);
    let metrics = metrics(&gw).await;
    let refused = format!(
        "idemgate_upstream_instance_failures_total{{upstream=\"app\",instance=\"{leaving}\",kind=\"refused\"}} 0"
    );
    assert!(metrics.contains(&refused), "no {refused:?} in {metrics}");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_at_or_below_a_goaway_is_never_sent_to_another_instance() {
    // The GOAWAY covers the stream (it may have been processed), then the connection is lost:
    // the outcome is unknown, as for any request that was sent.
    let pki = support::pki::Pki::new();
    let (leaving, took) = goaway_instance(&pki, false).await;
    let (good, _, good_ran, _) = h2_instance(&pki, false).await;
    let toml = with_ca(&config(&[format!("https://{leaving}"), format!("https://{good}")]), &pki);
    let gw = TestGateway::start(&toml).await;
    let unknown = unknown_of_24(&gw, "covered").await;
    let took = took.load(std::sync::atomic::Ordering::SeqCst);
    assert!(took > 0, "the leaving instance was never chosen");
    assert_eq!(took, unknown.len(), "a request it took was answered by another instance");
    let ran = good_ran.lock().unwrap().clone();
    for key in &unknown {
        assert!(!ran.contains(key), "{key} ran elsewhere: {ran:?}");
    }
    assert_eq!(ran.len() + unknown.len(), 24);
    let metrics = metrics(&gw).await;
    let line = format!(
        "idemgate_upstream_instance_failures_total{{upstream=\"app\",instance=\"{leaving}\",kind=\"broken\"}} {}",
        unknown.len()
    );
    assert!(metrics.contains(&line), "no {line:?} in {metrics}");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_an_instance_refused_goes_to_another() {
    let pki = support::pki::Pki::new();
    let (refuser, refused, refuser_ran, _) = h2_instance(&pki, true).await;
    let (good, _, good_ran, _) = h2_instance(&pki, false).await;
    let toml = with_ca(&config(&[format!("https://{refuser}"), format!("https://{good}")]), &pki);
    let gw = TestGateway::start(&toml).await;
    let client = gw.client();
    for i in 0..20 {
        let r = client.post_json("/orders", Some(&format!("refused-{i}")), ORDER).await;
        assert_eq!(r.status, 201, "request {i}: {r:?}");
    }
    // The refusing instance saw streams and ran none; every key ran once, on the other.
    let refused = refused.load(std::sync::atomic::Ordering::SeqCst);
    assert!(refused > 0, "the refusing instance was never chosen");
    assert!(refuser_ran.lock().unwrap().is_empty());
    assert_each_ran_once(&good_ran, 20);
    let metrics = String::from_utf8_lossy(&gw.admin_client().get("/metrics", &[]).await.body).into_owned();
    let line = format!(
        "idemgate_upstream_instance_failures_total{{upstream=\"app\",instance=\"{refuser}\",kind=\"refused\"}} {refused}"
    );
    assert!(metrics.contains(&line), "no {line:?} in {metrics}");
    gw.shutdown().await;
}

/// `config` with one `url` on a name looked up again each second instead of `urls`.
fn resolved_config(url: &str) -> String {
    config(&[]).replace("urls = []", &format!("url = {url:?}\nresolve_every = \"1s\""))
}

/// The gateway's `/metrics`.
async fn metrics(gw: &TestGateway) -> String {
    String::from_utf8_lossy(&gw.admin_client().get("/metrics", &[]).await.body).into_owned()
}

/// The `instance` labels of upstream `app`'s request series, sorted.
fn instance_labels(metrics: &str) -> Vec<String> {
    let mut labels: Vec<String> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix("idemgate_upstream_instance_requests_total{upstream=\"app\",instance=\""))
        .filter_map(|rest| rest.split('"').next().map(str::to_owned))
        .collect();
    labels.sort();
    labels
}

/// What `localhost` resolves to here, as instance labels: the instances the gateway should
/// come to (127.0.0.1 on most machines; ::1 as well on some).
async fn localhost_instances(port: u16) -> Vec<String> {
    let mut found: Vec<SocketAddr> = tokio::net::lookup_host(("localhost", port)).await.unwrap().collect();
    found.sort();
    found.dedup();
    found.iter().map(SocketAddr::to_string).collect()
}

/// Waits (10 s at most) until the gateway's instances of `app` are `expected`.
async fn until_instances(gw: &TestGateway, expected: &[String]) -> String {
    for _ in 0..100 {
        let text = metrics(gw).await;
        if instance_labels(&text) == expected {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the instances never became {expected:?}: {}", metrics(gw).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_resolved_again_becomes_its_addresses_while_host_keeps_the_name() {
    let live = TestUpstream::start().await;
    let port = live.addr.port();
    let expected = localhost_instances(port).await;
    assert!(expected.contains(&live.addr.to_string()), "localhost does not resolve to {}: {expected:?}", live.addr);
    let gw = TestGateway::start(&resolved_config(&format!("http://localhost:{port}"))).await;
    // Until the first lookup the one instance is the name; after it, each address.
    let before = until_instances(&gw, &expected).await;
    assert!(!before.contains(&format!("instance=\"localhost:{port}\"")), "{before}");
    assert!(before.contains("idemgate_upstream_lookups_total{upstream=\"app\",outcome=\"changed\"} 1"), "{before}");
    let client = gw.client();
    for i in 0..20 {
        let r = client.post_json("/orders", Some(&format!("resolved-{i}")), ORDER).await;
        assert_eq!(r.status, 201, "request {i}: {r:?}");
    }
    // Every key ran once; the upstream was reached at its address and still addressed by name.
    assert_eq!(live.executions(), 20);
    assert!(executions(&[&live]).values().all(|&n| n == 1));
    for seen in live.seen() {
        assert_eq!(seen.headers["host"], format!("localhost:{port}").as_str());
    }
    let after = metrics(&gw).await;
    let line = format!("idemgate_upstream_instance_requests_total{{upstream=\"app\",instance=\"{}\"}} 20", live.addr);
    assert!(after.contains(&line), "no {line:?} in {after}");
    // Later lookups find the same addresses: the instances (and their pools) stay.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let later = metrics(&gw).await;
    assert!(later.contains("idemgate_upstream_lookups_total{upstream=\"app\",outcome=\"unchanged\"}"), "{later}");
    assert_eq!(instance_labels(&later), expected);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolved_https_instance_is_connected_by_address_and_verified_by_name() {
    let pki = support::pki::Pki::new();
    let (addr, _, ran, names) = h2_instance(&pki, false).await;
    let port = addr.port();
    let expected = localhost_instances(port).await;
    let toml = with_ca(&resolved_config(&format!("https://localhost:{port}")), &pki);
    let gw = TestGateway::start(&toml).await;
    until_instances(&gw, &expected).await;
    let client = gw.client();
    for i in 0..10 {
        let r = client.post_json("/orders", Some(&format!("resolved-tls-{i}")), ORDER).await;
        assert_eq!(r.status, 201, "request {i}: {r:?}");
    }
    assert_eq!(ran.lock().unwrap().len(), 10);
    // The server name sent and the authority of every stream are the configured name, not
    // the address the connection went to.
    let names = names.lock().unwrap().clone();
    assert!(names.len() >= 10, "{names:?}");
    assert!(names.iter().all(|n| *n == format!("localhost localhost:{port}")), "{names:?}");
    let line = format!("idemgate_upstream_instance_requests_total{{upstream=\"app\",instance=\"{addr}\"}} 10");
    let text = metrics(&gw).await;
    assert!(text.contains(&line), "no {line:?} in {text}");
    gw.shutdown().await;
}

/// `config` with upstream `timeout = "1s"` and the default `connect_timeout` (5 s): a connect
/// that hangs outlasts the request's whole deadline.
fn one_second_config(urls: &[String]) -> String {
    let toml = config(urls);
    assert!(toml.contains("timeout = \"5s\"\nconnect_timeout = \"1s\"\n"));
    toml.replace("timeout = \"5s\"\nconnect_timeout = \"1s\"\n", "timeout = \"1s\"\n")
}

/// The value of `idemgate_upstream_instance_NAME{upstream="app",instance="INSTANCE"EXTRA}`.
fn instance_series(metrics: &str, name: &str, instance: impl std::fmt::Display, extra: &str) -> u64 {
    let prefix = format!("idemgate_upstream_instance_{name}{{upstream=\"app\",instance=\"{instance}\"{extra}}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in {metrics}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_connect_outlasts_its_deadline_is_released_and_the_instance_left_out() {
    // The instance's connects hang; the request's 1 s deadline passes while the dial waits.
    let hanging = Hanging::start().await;
    let live = TestUpstream::start().await;
    let urls = [format!("http://{}", hanging.addr), format!("http://{}", live.addr)];
    let gw = TestGateway::start(&one_second_config(&urls)).await;
    let client = gw.client();
    let mut released = Vec::new();
    for i in 0..24 {
        let key = format!("hung-{i}");
        let r = client.post_json("/orders", Some(&key), ORDER).await;
        match r.status.as_u16() {
            201 => {}
            // Never sent: the key is released, never held as unknown (502/504 outcome-unknown).
            502 if r.problem() == "upstream-unavailable" => released.push(key),
            _ => panic!("{key}: {r:?}"),
        }
    }
    // Drawn until it had failed to connect twice (eject_after = 2), then left out for 30 s.
    assert_eq!(released.len(), 2, "{released:?}");
    // Each released key runs on its retry, on the live instance, as attempt 1 (given back).
    for key in &released {
        let r = client.post_json("/orders", Some(key), ORDER).await;
        assert_eq!(r.status, 201, "{key}: {r:?}");
    }
    let ran = executions(&[&live]);
    assert_eq!(ran.len(), 24, "{ran:?}");
    assert!(ran.values().all(|&n| n == 1), "a key ran twice: {ran:?}");
    assert!(live.seen().iter().all(|s| s.headers["idempotency-attempt"] == "1"));
    // Each dial cut short was counted against the instance: that is what left it out.
    let metrics = metrics(&gw).await;
    assert_eq!(instance_series(&metrics, "requests_total", hanging.addr, ""), 2, "{metrics}");
    assert_eq!(instance_series(&metrics, "failures_total", hanging.addr, ",kind=\"connect\""), 2);
    assert_eq!(instance_series(&metrics, "ejections_total", hanging.addr, ""), 1);
    assert_eq!(instance_series(&metrics, "requests_total", live.addr, ""), 24);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_instance_whose_connect_hangs_is_told_unreachable_and_the_key_runs_when_it_is_back() {
    let hanging = Hanging::start().await;
    let gw = TestGateway::start(&one_second_config(&[format!("http://{}", hanging.addr)])).await;
    let client = gw.client();
    // A pass-through request, and a keyed one: never sent, and told so.
    let passed = client.get("/anything", &[]).await;
    assert_eq!((passed.status.as_u16(), passed.problem()), (502, "upstream-unavailable".to_owned()), "{passed:?}");
    let first = client.post_json("/orders", Some("lone-1"), ORDER).await;
    assert_eq!((first.status.as_u16(), first.problem()), (502, "upstream-unavailable".to_owned()), "{first:?}");
    // Back: the retry runs, as the key's first attempt; it was released, not held.
    let live = hanging.come_back();
    let retry = client.post_json("/orders", Some("lone-1"), ORDER).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert_eq!(live.executions(), 1);
    assert_eq!(live.seen()[0].headers["idempotency-attempt"], "1");
    gw.shutdown().await;
}

/// `config` with `lines` added to the upstream's table.
fn config_with(urls: &[String], lines: &str) -> String {
    let toml = config(urls);
    assert!(toml.contains("eject_for = \"30s\"\n"));
    toml.replace("eject_for = \"30s\"\n", &format!("eject_for = \"30s\"\n{lines}\n"))
}

/// Sends 40 orders to `[resetter, live]` (`eject_after = 2`, `eject_after_broken = 3`); the
/// keys answered 502 `outcome-unknown`. Checks that no key ran twice, that none of those ran
/// on the live instance (nor does on its retry), and that the resetter was left out once.
async fn reset_of_40(gw: &TestGateway, resetter: SocketAddr, live: &TestUpstream) -> Vec<String> {
    let client = gw.client();
    let mut unknown = Vec::new();
    for i in 0..40 {
        let key = format!("reset-{i}");
        let r = client.post_json("/orders", Some(&key), ORDER).await;
        match r.status.as_u16() {
            201 => {}
            // Reset after the request was written: it may have been read.
            502 if r.problem() == "outcome-unknown" => unknown.push(key),
            _ => panic!("{key}: {r:?}"),
        }
    }
    // What it may have taken stays unknown: retries are refused, and never reach the live one.
    for key in &unknown {
        let r = client.post_json("/orders", Some(key), ORDER).await;
        assert_eq!((r.status.as_u16(), r.problem()), (502, "outcome-unknown".to_owned()), "{key}: {r:?}");
    }
    let ran = executions(&[live]);
    assert_eq!(ran.len() + unknown.len(), 40, "{ran:?} {unknown:?}");
    assert!(ran.values().all(|&n| n == 1), "a key ran twice: {ran:?}");
    for key in &unknown {
        assert!(!ran.contains_key(key), "{key} ran elsewhere: {ran:?}");
    }
    let metrics = metrics(gw).await;
    assert_eq!(instance_series(&metrics, "ejections_total", resetter, ""), 1, "{metrics}");
    unknown
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_resets_every_exchange_is_left_out_and_nothing_it_took_is_sent_again() {
    // It reads what the gateway writes, then resets: every exchange breaks after it was sent.
    let (resetter, reset) = support::raw_upstream::resetting(true).await;
    let live = TestUpstream::start().await;
    let urls = [format!("http://{resetter}"), format!("http://{}", live.addr)];
    let gw = TestGateway::start(&config_with(&urls, "eject_after_broken = 3")).await;
    let unknown = reset_of_40(&gw, resetter, &live).await;
    // Three exchanges broke running (eject_after_broken = 3); then it was left out (30 s).
    assert_eq!(reset.load(std::sync::atomic::Ordering::SeqCst), 3, "what reached the resetter");
    assert_eq!(unknown.len(), 3, "{unknown:?}");
    let metrics = metrics(&gw).await;
    assert_eq!(instance_series(&metrics, "failures_total", resetter, ",kind=\"broken\""), 3, "{metrics}");
    assert_eq!(instance_series(&metrics, "ejection_reasons_total", resetter, ",reason=\"broken\""), 1);
    assert_eq!(instance_series(&metrics, "ejection_reasons_total", resetter, ",reason=\"connect\""), 0);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_resets_every_connection_at_once_is_left_out() {
    // Reset as soon as accepted: a connection found reset before the request was written is a
    // connect failure (never sent: the request goes to the live instance), one reset after, a
    // broken exchange (unknown). Either run leaves it out: a connect failure does not end the
    // broken run, and a connection made ends only the connect run, so at most 6 reach it.
    let (resetter, reset) = support::raw_upstream::resetting(false).await;
    let live = TestUpstream::start().await;
    let urls = [format!("http://{resetter}"), format!("http://{}", live.addr)];
    let gw = TestGateway::start(&config_with(&urls, "eject_after_broken = 3")).await;
    let unknown = reset_of_40(&gw, resetter, &live).await;
    let reset = reset.load(std::sync::atomic::Ordering::SeqCst);
    assert!((2..=6).contains(&reset), "{reset} connections reached the resetter");
    assert!(unknown.len() <= 3, "{unknown:?}");
    gw.shutdown().await;
}

/// Sends 40 requests, keyed orders or pass-through GETs, to `[failing, live]` where `failing`
/// answers 503, 504, then 502 to everything, with `eject_after_gateway_errors = 3`; checks
/// what reached each.
async fn gateway_errors_leave_an_instance_out(keyed: bool) {
    let failing = TestUpstream::with(Behavior {
        statuses: [503, 504].into_iter().collect(),
        default_status: 502,
        ..Behavior::default()
    })
    .await;
    let live = TestUpstream::start().await;
    let urls = [format!("http://{}", failing.addr), format!("http://{}", live.addr)];
    let gw = TestGateway::start(&config_with(&urls, "eject_after_gateway_errors = 3")).await;
    let client = gw.client();
    for i in 0..40 {
        let r = match keyed {
            true => client.post_json("/orders", Some(&format!("gateway-{i}")), ORDER).await,
            false => client.get(&format!("/items/{i}"), &[]).await,
        };
        // The failing instance's own answers reach the client; nothing is sent again.
        assert!([201, 502, 503, 504].contains(&r.status.as_u16()), "request {i}: {r:?}");
        assert!(r.header("x-execution").is_some(), "request {i} was not answered by an instance: {r:?}");
    }
    // Three gateway errors running, none ending the run of the others: left out (30 s).
    assert_eq!(failing.executions(), 3, "what reached the failing instance");
    assert_eq!(live.executions(), 37);
    let all = executions(&[&failing, &live]);
    assert_eq!(all.values().sum::<usize>(), 40);
    if keyed {
        assert_eq!(all.len(), 40, "a key ran twice: {all:?}");
    }
    let metrics = metrics(&gw).await;
    let at = failing.addr;
    assert_eq!(instance_series(&metrics, "failures_total", at, ",kind=\"gateway_error\""), 3, "{metrics}");
    assert_eq!(instance_series(&metrics, "ejection_reasons_total", at, ",reason=\"gateway_error\""), 1);
    assert_eq!(instance_series(&metrics, "ejections_total", at, ""), 1);
    assert_eq!(instance_series(&metrics, "failures_total", live.addr, ",kind=\"gateway_error\""), 0);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_answering_gateway_errors_is_left_out_on_a_keyed_route() {
    gateway_errors_leave_an_instance_out(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_answering_gateway_errors_is_left_out_on_a_pass_through_route() {
    gateway_errors_leave_an_instance_out(false).await;
}
