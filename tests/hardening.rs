//! The edge as an attacker probes it: the real `idemgate` binary, raw TCP and raw HTTP/2
//! frames, and a counting upstream. Each test names the threat of docs/security.md it covers.

use crate::support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use support::client::{Client, DEFAULT_AUTH};
use support::gateway_proc::{GatewayProc, Toml};
use support::raw_upstream::{Misbehaviour, RawUpstream};
use support::upstream::{Behavior, TestUpstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ORDER: &str = r#"{"sku":"A-1","quantity":2}"#;

/// The binary on port 0 with the memory store, `server` lines added to `[server]` and `policy`
/// lines to the idempotent `POST /orders` route; everything else passes through.
fn start(upstream: SocketAddr, server: &str, policy: &str) -> GatewayProc {
    GatewayProc::start(&Toml { server, policy, upstream_lines: "timeout = \"5s\"", ..Toml::new(upstream) }.render())
}

/// Reads until the peer closes the connection or `limit` passes; returns what was read and
/// whether the connection was closed.
async fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return (out, false),
            Ok(Ok(0)) | Ok(Err(_)) => return (out, true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

fn status_of(raw: &[u8]) -> u16 {
    let text = String::from_utf8_lossy(raw);
    text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

// ---- slow and silent clients ---------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_within_the_header_timeout_while_others_are_served() {
    let upstream = TestUpstream::start().await;
    let gw = start(upstream.addr, r#"header_read_timeout = "1s""#, "");
    // Bounded by the test process's descriptor limit, well within any CI's.
    let mut silent = Vec::new();
    for _ in 0..300 {
        silent.push(TcpStream::connect(gw.addr).await.unwrap());
    }
    let started = Instant::now();
    let served = gw.client().get("/anything", &[]).await;
    assert_eq!(served.status, 201, "a normal client is served meanwhile");
    let mut closed = 0;
    for stream in &mut silent {
        let (_, was_closed) = read_until_closed(stream, Duration::from_secs(3)).await;
        closed += usize::from(was_closed);
    }
    assert_eq!(closed, 300, "every silent connection was closed");
    assert!(started.elapsed() < Duration::from_secs(4), "took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_connections_new_clients_wait_instead_of_failing() {
    let upstream = TestUpstream::start().await;
    let gw = start(upstream.addr, "max_connections = 2\nheader_read_timeout = \"1s\"", "");
    // Two silent connections take both places...
    let _silent: Vec<TcpStream> = futures_util::future::join_all((0..2).map(|_| TcpStream::connect(gw.addr)))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // ...so a third client waits in the backlog (its connect succeeds, the kernel queues it)
    // and is served as soon as the header timeout frees a place: it is not refused.
    let started = Instant::now();
    let served = gw.client().get("/anything", &[]).await;
    assert_eq!(served.status, 201);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(700) && waited < Duration::from_secs(3), "served after {waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_clients_past_max_connections_is_held_in_the_backlog_not_dropped() {
    let upstream = TestUpstream::start().await;
    let gw = start(upstream.addr, "max_connections = 1\nheader_read_timeout = \"30s\"", "");
    // One silent connection holds the only place for the whole test...
    let _silent = TcpStream::connect(gw.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // ...so every client after it waits in the listen backlog: its connect completes (the
    // kernel holds it) as long as the backlog has room. With tokio's default of 128 the
    // 130th SYN was dropped and its connect never completed while the place was held.
    let mut waiting = Vec::new();
    for n in 0..500 {
        match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(gw.addr)).await {
            Ok(Ok(stream)) => waiting.push(stream),
            Ok(Err(e)) => panic!("client {n} refused: {e}"),
            Err(_) => panic!("client {n} was not held: the listen backlog is full after {n}"),
        }
    }
    assert_eq!(waiting.len(), 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_head_is_cut_off_at_the_header_timeout() {
    let upstream = TestUpstream::start().await;
    let gw = start(upstream.addr, r#"header_read_timeout = "1s""#, "");
    let mut stream = TcpStream::connect(gw.addr).await.unwrap();
    stream.write_all(b"GET /anything HTTP/1.1\r\nhost: x\r\n").await.unwrap();
    let started = Instant::now();
    // One header byte every 200ms: always active, never done.
    let mut cut = false;
    for _ in 0..30 {
        if stream.write_all(b"x").await.is_err() {
            cut = true;
            break;
        }
        let mut buf = [0u8; 64];
        if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(Duration::from_millis(200), stream.read(&mut buf)).await {
            cut = true;
            break;
        }
    }
    assert!(cut, "the trickling head was never cut off");
    assert!(started.elapsed() < Duration::from_millis(2500), "took {:?}", started.elapsed());
    assert_eq!(upstream.executions(), 0);
}

/// The connection's one timer is not reset per request, so a head that begins after an idle
/// spell must still be held to the header timeout from its first byte, not to the idle
/// deadline (60 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_that_begins_after_an_idle_spell_is_cut_off_at_the_header_timeout() {
    let upstream = TestUpstream::start().await;
    let gw = start(upstream.addr, "idle_timeout = \"60s\"\nheader_read_timeout = \"1s\"", "");
    let mut stream = TcpStream::connect(gw.addr).await.unwrap();
    stream.write_all(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
    let mut buf = [0u8; 4096];
    let n = stream.read(&mut buf).await.unwrap();
    assert_eq!(status_of(&buf[..n]), 201);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stream.write_all(b"GET /b HTTP/1.1\r\nhost: x\r\n").await.unwrap();
    let started = Instant::now();
    let (_, closed) = read_until_closed(&mut stream, Duration::from_secs(5)).await;
    assert!(closed, "a head left unfinished after an idle spell was never cut off");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_millis(2500), "cut off after {took:?}");
    assert_eq!(upstream.executions(), 1, "only the first request reached the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let upstream = TestUpstream::start().await;
    let gw = start(upstream.addr, "idle_timeout = \"1s\"\nheader_read_timeout = \"5s\"", "");
    let mut stream = TcpStream::connect(gw.addr).await.unwrap();
    stream.write_all(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
    let mut buf = [0u8; 4096];
    let n = stream.read(&mut buf).await.unwrap();
    assert_eq!(status_of(&buf[..n]), 201);
    let started = Instant::now();
    let (_, closed) = read_until_closed(&mut stream, Duration::from_secs(4)).await;
    assert!(closed, "still open after 4s");
    let idle = started.elapsed();
    assert!(idle >= Duration::from_millis(900) && idle < Duration::from_secs(3), "closed after {idle:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_gets_408_and_holds_no_claim() {
    let upstream = TestUpstream::start().await;
    let gw = start(upstream.addr, r#"body_read_timeout = "1s""#, "");
    let mut stream = TcpStream::connect(gw.addr).await.unwrap();
    let head = format!(
        "POST /orders HTTP/1.1\r\nhost: x\r\nauthorization: {DEFAULT_AUTH}\r\nidempotency-key: stalled\r\n\
         content-type: application/json\r\ncontent-length: 1000\r\n\r\n{{\"sku\""
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let (raw, closed) = read_until_closed(&mut stream, Duration::from_secs(4)).await;
    assert_eq!(status_of(&raw), 408, "{}", String::from_utf8_lossy(&raw));
    assert!(String::from_utf8_lossy(&raw).contains("body-timeout"));
    assert!(closed, "the connection closes after a 408");
    // Nothing was claimed: the same key runs at once.
    let r = gw.client().post_json("/orders", Some("stalled"), ORDER).await;
    assert_eq!(r.status, 201);
    assert_eq!(upstream.executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_over_the_limit_gets_431() {
    let upstream = TestUpstream::start().await;
    let gw = start(upstream.addr, r#"max_header_bytes = "16KiB""#, "");
    let big = "a".repeat(20 << 10);
    let mut stream = TcpStream::connect(gw.addr).await.unwrap();
    let request = format!("GET /x HTTP/1.1\r\nhost: x\r\nx-big: {big}\r\n\r\n");
    let _ = stream.write_all(request.as_bytes()).await;
    let (raw, _) = read_until_closed(&mut stream, Duration::from_secs(3)).await;
    assert_eq!(status_of(&raw), 431, "{}", String::from_utf8_lossy(&raw));
    assert_eq!(upstream.executions(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_peer_that_does_not_answer_pings_is_dropped() {
    let upstream = TestUpstream::start().await;
    let gw = start(upstream.addr, "h2_keepalive_interval = \"1s\"\nheader_read_timeout = \"20s\"", "");
    let mut stream = TcpStream::connect(gw.addr).await.unwrap();
    // The client preface and an empty SETTINGS frame, then silence: no SETTINGS ack, no PING ack.
    stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    stream.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    let started = Instant::now();
    let (frames, closed) = read_until_closed(&mut stream, Duration::from_secs(8)).await;
    assert!(closed, "still open after 8s");
    // Frames are a 9-byte header (length, type, flags, stream); find a PING (type 6).
    let mut i = 0;
    let mut pinged = false;
    while i + 9 <= frames.len() {
        let len = usize::from(frames[i]) << 16 | usize::from(frames[i + 1]) << 8 | usize::from(frames[i + 2]);
        pinged |= frames[i + 3] == 6;
        i += 9 + len;
    }
    assert!(pinged, "the gateway pinged the silent peer");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(6), "dropped after {took:?}, long before the 20s header timeout");
}

// ---- Host and versions -----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http11_requests_need_exactly_one_host() {
    let upstream = TestUpstream::start().await;
    let gw = start(upstream.addr, "", "");
    for (head, want) in [
        ("GET /a HTTP/1.1\r\n\r\n", 400),
        ("GET /a HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n", 400),
        ("GET /a HTTP/1.1\r\nhost: a\r\n\r\n", 201),
        ("GET /a HTTP/1.0\r\n\r\n", 201),
    ] {
        let mut stream = TcpStream::connect(gw.addr).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = stream.read(&mut buf).await.unwrap();
        assert_eq!(status_of(&buf[..n]), want, "{head:?}: {}", String::from_utf8_lossy(&buf[..n]));
        if want == 400 {
            assert!(String::from_utf8_lossy(&buf[..n]).contains("bad-host"));
        }
    }
    assert_eq!(upstream.executions(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http10_upstream_answers_http11_clients_in_http11_and_keeps_them_alive() {
    let upstream = RawUpstream::start(Misbehaviour::AnswerHttp10).await;
    let gw = start(upstream.addr, "", "");
    let mut stream = TcpStream::connect(gw.addr).await.unwrap();
    for i in 0..2 {
        stream.write_all(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = stream.read(&mut buf).await.unwrap();
        let text = String::from_utf8_lossy(&buf[..n]);
        assert!(text.starts_with("HTTP/1.1 200"), "request {i} on one connection: {text}");
    }
}

// ---- upgrades -------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_is_bridged_on_a_pass_through_route_and_refused_on_an_idempotent_one() {
    let upstream = RawUpstream::start(Misbehaviour::UpgradeEcho).await;
    let gw = start(upstream.addr, "", "");
    let mut stream = TcpStream::connect(gw.addr).await.unwrap();
    stream
        .write_all(
            b"GET /chat HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\
              sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        )
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = stream.read(&mut buf).await.unwrap();
    let head = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    // A masked WebSocket text frame "hello", echoed back by the upstream through the bridge.
    let frame = [0x81, 0x85, 1, 2, 3, 4, b'h' ^ 1, b'e' ^ 2, b'l' ^ 3, b'l' ^ 4, b'o' ^ 1];
    for _ in 0..3 {
        stream.write_all(&frame).await.unwrap();
        let mut echoed = [0u8; 11];
        stream.read_exact(&mut echoed).await.unwrap();
        assert_eq!(echoed, frame);
    }
    assert_eq!(upstream.header_values("upgrade"), [Some("websocket".into())], "the upgrade reached the upstream");

    let mut stream = TcpStream::connect(gw.addr).await.unwrap();
    let request = format!(
        "POST /orders HTTP/1.1\r\nhost: x\r\nauthorization: {DEFAULT_AUTH}\r\nidempotency-key: ws\r\n\
         connection: upgrade\r\nupgrade: websocket\r\ncontent-length: 0\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let (raw, _) = read_until_closed(&mut stream, Duration::from_secs(2)).await;
    assert_eq!(status_of(&raw), 400);
    assert!(String::from_utf8_lossy(&raw).contains("upgrade-refused"));
    assert_eq!(upstream.executions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_connection_lives_while_bytes_move_and_is_closed_once_idle() {
    let upstream = RawUpstream::start(Misbehaviour::UpgradeEcho).await;
    let gw = start(upstream.addr, "idle_timeout = \"1s\"", "");
    let mut stream = TcpStream::connect(gw.addr).await.unwrap();
    stream
        .write_all(b"GET /chat HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = stream.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase().starts_with("http/1.1 101"));
    // Traffic every 400 ms for 2.4 s, twice the idle timeout: the bridge stays up.
    for i in 0..6u8 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        stream.write_all(&[i; 4]).await.unwrap();
        let mut echoed = [0u8; 4];
        stream.read_exact(&mut echoed).await.unwrap();
        assert_eq!(echoed, [i; 4], "message {i} went through the bridge");
    }
    // Then silence: the gateway closes the connection after about the idle timeout.
    let silent = std::time::Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await;
    let waited = silent.elapsed();
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "closed by the gateway: {closed:?}");
    assert!(waited >= Duration::from_millis(900), "not before the idle timeout: {waited:?}");
}

// ---- exchanges and resets --------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exchanges_past_the_per_connection_cap_get_503_and_are_not_forwarded() {
    let upstream = TestUpstream::with(Behavior { delay: Duration::from_millis(800), ..Behavior::default() }).await;
    let gw = start(upstream.addr, "max_exchanges_per_connection = 3", "");
    let client = Client::h2(gw.addr);
    let requests: Vec<_> = (0..10)
        .map(|i| {
            let c = client.clone();
            tokio::spawn(async move { c.post_json("/orders", Some(&format!("cap-{i}")), ORDER).await })
        })
        .collect();
    let mut statuses = Vec::new();
    for r in requests {
        let reply = r.await.unwrap();
        if reply.status == 503 {
            assert_eq!(reply.problem(), "overloaded");
            assert_eq!(reply.header("retry-after"), Some("1"));
        }
        statuses.push(reply.status.as_u16());
    }
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 3, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 503).count(), 7, "{statuses:?}");
    assert_eq!(upstream.executions(), 3, "the refused ones never reached the upstream");
    // Their claims were given back: a refused key runs once a slot is free.
    let refused = (0..10).find(|i| statuses[*i] == 503).unwrap();
    let again = client.post_json("/orders", Some(&format!("cap-{refused}")), ORDER).await;
    assert_eq!(again.status, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exchanges_past_the_global_cap_get_503_whatever_the_connection() {
    let upstream = TestUpstream::with(Behavior { delay: Duration::from_millis(800), ..Behavior::default() }).await;
    let gw = start(upstream.addr, "max_exchanges = 2", "");
    // One HTTP/1.1 connection per request: only the global cap applies.
    let requests: Vec<_> = (0..5)
        .map(|i| {
            let c = Client::new(gw.addr);
            tokio::spawn(async move { c.post_json("/orders", Some(&format!("global-{i}")), ORDER).await })
        })
        .collect();
    let mut statuses = Vec::new();
    for r in requests {
        statuses.push(r.await.unwrap().status.as_u16());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [201, 201, 503, 503, 503]);
    assert_eq!(upstream.executions(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_storm_ends_in_goaway_and_the_upstream_sees_at_most_the_cap() {
    let upstream = TestUpstream::with(Behavior { delay: Duration::from_millis(1500), ..Behavior::default() }).await;
    let gw = start(upstream.addr, "max_exchanges_per_connection = 5\nmax_reset_streams = 20", "");
    let tcp = TcpStream::connect(gw.addr).await.unwrap();
    let (mut h2, connection) = h2::client::handshake(tcp).await.unwrap();
    let driver = tokio::spawn(connection);
    let mut refused_after = None;
    for i in 0..200 {
        let request = http::Request::builder()
            .method(Method::POST)
            .uri(format!("http://{}/orders", gw.addr))
            .header("content-type", "application/json")
            .header("authorization", DEFAULT_AUTH)
            .header("idempotency-key", format!("storm-{i}"))
            .body(())
            .unwrap();
        let ready = tokio::time::timeout(Duration::from_secs(2), h2.clone().ready()).await;
        let Ok(Ok(mut sender)) = ready else {
            refused_after = Some(i);
            break;
        };
        let Ok((response, mut body)) = sender.send_request(request, false) else {
            refused_after = Some(i);
            break;
        };
        let _ = body.send_data(Bytes::from_static(ORDER.as_bytes()), true);
        // Give the gateway a moment to start the exchange, then reset the stream.
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(response);
        body.send_reset(h2::Reason::CANCEL);
        h2 = sender;
    }
    let refused_after = refused_after.expect("the connection was never closed");
    assert!(refused_after <= 40, "GOAWAY came only after {refused_after} resets");
    let _ = tokio::time::timeout(Duration::from_secs(3), driver).await;
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let executions = upstream.executions();
    assert!(executions <= 5 + 1, "the upstream saw {executions} exchanges from one connection");
}

// ---- admin -----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_bearer_scheme_is_case_insensitive() {
    let upstream = TestUpstream::start().await;
    let gw = start(upstream.addr, r#"admin_token = "test-admin-token-0123456789""#, "");
    let admin = Client::new(gw.admin);
    let path = "/keys?route=orders&key=k";
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let auth = format!("{scheme} test-admin-token-0123456789");
        let r =
            admin.send(Method::GET, path, &[("authorization", &auth), ("scope-authorization", "Bearer x")], "").await;
        assert_eq!(r.status, 404, "{scheme}: authorized, and the key is absent");
    }
    let r = admin.send(Method::GET, path, &[("authorization", "Basic dGVzdA==")], "").await;
    assert_eq!(r.status, 401);
}

// ---- replays and operators' answers ----------------------------------------------------------

const TOKEN: &str = "test-admin-token-0123456789";

/// Sends `retry` (a keyed POST) and a `GET /next` on one keep-alive connection, and splits what
/// comes back into responses by their own framing (RFC 9112 §6.3): each as its head (lower
/// case) and body. A response whose length lies leaves the next one starting inside it.
async fn two_on_one_connection(addr: SocketAddr, key: &str) -> Vec<(String, Vec<u8>)> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let requests = format!(
        "POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: {key}\r\nauthorization: {DEFAULT_AUTH}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{ORDER}\
         GET /next HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        ORDER.len()
    );
    stream.write_all(requests.as_bytes()).await.unwrap();
    let (raw, _) = read_until_closed(&mut stream, Duration::from_secs(5)).await;
    let mut out = Vec::new();
    let mut rest = &raw[..];
    while !rest.is_empty() {
        let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") else { break };
        let head = String::from_utf8_lossy(&rest[..end]).to_lowercase();
        rest = &rest[end + 4..];
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0);
        let body = rest[..length.min(rest.len())].to_vec();
        rest = &rest[length.min(rest.len())..];
        out.push((head, body));
    }
    out
}

/// docs/security.md, "an operator's answer that would split responses": `PUT /keys` refuses
/// a `Content-Length` (and every header a replay never carries) with 400 naming it, and the
/// answer it takes is replayed as one response: the next request on the connection gets its
/// own. Against the release binary in CI, where hyper does not assert on a bad length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_answer_cannot_split_the_responses_of_a_connection() {
    let upstream = RawUpstream::start(Misbehaviour::CloseAfterRequest).await;
    let gw = start(upstream.addr, &format!("admin_token = \"{TOKEN}\""), "");
    let lost = gw.client().post_json("/orders", Some("split"), ORDER).await;
    assert_eq!(lost.status, 502);
    let admin = Client::new(gw.admin);
    let bearer = format!("Bearer {TOKEN}");
    let headers = [("authorization", bearer.as_str()), ("scope-authorization", DEFAULT_AUTH)];
    let smuggling = r#"{"status":201,"headers":{"content-length":"2"},"body":"{\"order_id\":1}HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nowned"}"#;
    let refused = admin.send(Method::PUT, "/keys?route=orders&key=split", &headers, smuggling).await;
    assert_eq!(refused.status, 400, "{:?}", refused.body);
    let detail = refused.json()["detail"].as_str().unwrap().to_owned();
    assert!(detail.contains("content-length cannot be part of a stored answer"), "{detail}");
    let answer = r#"{"status":201,"headers":{"content-type":"application/json"},"body":"{\"order_id\":1}"}"#;
    let put = admin.send(Method::PUT, "/keys?route=orders&key=split", &headers, answer).await;
    assert_eq!(put.status, 200, "{:?}", put.body);
    let responses = two_on_one_connection(gw.addr, "split").await;
    assert_eq!(responses.len(), 2, "{responses:?}");
    assert!(responses[0].0.starts_with("http/1.1 201"), "{responses:?}");
    assert_eq!(responses[0].1, b"{\"order_id\":1}");
    assert!(responses[1].0.starts_with("http/1.1 "), "the next request got its own answer: {responses:?}");
    assert_eq!(upstream.executions(), 2, "the POST once (its retry was a replay), and the GET");
}

/// A record written by hand (or by an earlier version) with a `Content-Length` that does not
/// match its body is replayed framed from its body all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_whose_length_lies_is_replayed_framed_from_its_body() {
    use idemgate::store::StoredResponse;
    let upstream = TestUpstream::start().await;
    let redis = support::redis::RedisServer::shared();
    let prefix = support::unique("lies");
    let store = format!("backend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{prefix}\"", redis.url());
    let toml = Toml {
        store: &store,
        policy: "scope = \"global\"",
        upstream_lines: "timeout = \"5s\"",
        ..Toml::new(upstream.addr)
    }
    .render();
    let gw = GatewayProc::start(&toml);
    assert_eq!(gw.client().post_json("/orders", Some("lies"), ORDER).await.status, 201);
    // The record: a 73-byte header, then the response; its response now says 2 bytes.
    let name = support::record_key(&prefix, "lies");
    let mut conn = redis.connection();
    let value: Vec<u8> = ::redis::cmd("GET").arg(name.as_str()).query(&mut conn).unwrap();
    let mut stored = StoredResponse::decode(bytes::Bytes::copy_from_slice(&value[73..])).unwrap();
    assert!(stored.body.len() > 2);
    stored.headers.insert("content-length", http::HeaderValue::from_static("2"));
    let mut forged = value[..73].to_vec();
    forged.extend_from_slice(&stored.encode());
    let _: () = ::redis::cmd("SET").arg(name.as_str()).arg(forged).arg("KEEPTTL").query(&mut conn).unwrap();
    let responses = two_on_one_connection(gw.addr, "lies").await;
    assert_eq!(responses.len(), 2, "{responses:?}");
    assert!(responses[0].0.contains("idempotent-replay: true"), "{responses:?}");
    assert!(responses[0].0.contains(&format!("content-length: {}", stored.body.len())), "{responses:?}");
    assert_eq!(responses[0].1, stored.body.to_bytes());
    assert!(responses[1].0.starts_with("http/1.1 201"), "the next request got its own answer: {responses:?}");
    assert_eq!(upstream.executions(), 2, "the POST once, the GET once");
}

/// docs/security.md, "an operator releasing a key a running request holds": `DELETE /keys`
/// answers 409 `admin-conflict` while a request holds the key, and a retry meanwhile waits
/// for it instead of running it again; only `force=true` releases it. Every change is an
/// audit line naming the route, the key's hash, the state before and the result, never the
/// caller's scope or an answer's body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_a_running_request_holds_is_released_only_by_force_and_every_change_is_audited() {
    let upstream = TestUpstream::with(Behavior { delay: Duration::from_millis(1500), ..Behavior::default() }).await;
    let gw = start(upstream.addr, &format!("admin_token = \"{TOKEN}\""), "wait = \"5s\"");
    let client = gw.client();
    let first = tokio::spawn({
        let client = client.clone();
        async move { client.post_json("/orders", Some("running"), ORDER).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let admin = Client::new(gw.admin);
    let bearer = format!("Bearer {TOKEN}");
    let headers = [("authorization", bearer.as_str()), ("scope-authorization", DEFAULT_AUTH)];
    let refused = admin.send(Method::DELETE, "/keys?route=orders&key=running", &headers, "").await;
    assert_eq!((refused.status.as_u16(), refused.problem().as_str()), (409, "admin-conflict"), "{:?}", refused.body);
    assert_eq!(refused.header("x-record-state"), Some("in_progress"));
    assert!(refused.json()["detail"].as_str().unwrap().contains("force=true"));
    let retry = client.post_json("/orders", Some("running"), ORDER).await;
    let first = first.await.unwrap();
    assert_eq!(first.status, 201);
    assert!(retry.is_replay(), "the retry waited for the running request: {:?}", retry.body);
    assert_eq!(upstream.executions(), 1, "executed once");
    let bogus = admin.send(Method::DELETE, "/keys?route=orders&key=running&force=yes", &headers, "").await;
    assert_eq!(bogus.status, 400);

    // Forced: a key held by a request is released, and the line says it was forced.
    let second = tokio::spawn({
        let client = client.clone();
        async move { client.post_json("/orders", Some("forced"), ORDER).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let forced = admin.send(Method::DELETE, "/keys?route=orders&key=forced&force=true", &headers, "").await;
    assert_eq!(forced.json(), serde_json::json!({"released": true, "was": "in_progress"}));
    let _ = second.await.unwrap();
    let resolved = admin
        .send(Method::PUT, "/keys?route=orders&key=forced", &headers, r#"{"status":201,"body":"secret-body"}"#)
        .await;
    assert_eq!(resolved.status, 409, "released, not unknown: {:?}", resolved.body);

    // The bad `force` value was refused before the record was read: three changes asked for.
    let audit = gw.lines_with("operator changed a key", 3);
    assert_eq!(audit.len(), 3, "{audit:#?}");
    let expect = [
        ("action=\"release\"", "before=\"in_progress\"", "result=\"refused: a request holds the key\""),
        ("action=\"forced-release\"", "before=\"in_progress\"", "result=\"released\""),
        ("action=\"resolve\"", "before=\"released\"", "result=\"refused: not unknown or executed\""),
    ];
    for (line, (action, before, result)) in audit.iter().zip(expect) {
        assert!(line.contains(action) && line.contains(before) && line.contains(result), "{line}");
        assert!(line.contains("route=orders") && line.contains("peer=127.0.0.1") && line.contains("key="), "{line}");
        // The key's hash, never the key, the caller's credential or the answer's body.
        for secret in ["tester", "secret-body", "\"running\"", "\"forced\""] {
            assert!(!line.contains(secret), "the audit line shows {secret}: {line}");
        }
    }
}

/// docs/security.md, "an admin parameter given twice": `force=false&force=true` released a
/// running key (the last value won) while a retry then ran it a second time. A parameter
/// named twice, given empty, or unknown to `/keys` is 400 `admin-bad-request` naming it,
/// before any record is read: the key stays held and the retry waits for the first run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_parameter_given_twice_or_empty_is_refused_and_the_key_stays_held() {
    let upstream = TestUpstream::with(Behavior { delay: Duration::from_millis(1500), ..Behavior::default() }).await;
    let gw = start(upstream.addr, &format!("admin_token = \"{TOKEN}\""), "wait = \"5s\"");
    let client = gw.client();
    let first = tokio::spawn({
        let client = client.clone();
        async move { client.post_json("/orders", Some("twice"), ORDER).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let admin = Client::new(gw.admin);
    let bearer = format!("Bearer {TOKEN}");
    let headers = [("authorization", bearer.as_str()), ("scope-authorization", DEFAULT_AUTH)];
    let refusals = [
        (Method::DELETE, "route=orders&key=twice&force=false&force=true", "force is given 2 times"),
        (Method::DELETE, "route=orders&key=twice&force=true&force=true", "force is given 2 times"),
        (Method::DELETE, "route=orders&key=twice&force=", "force is given empty"),
        (Method::DELETE, "route=orders&key=twice&force", "force is given empty"),
        (Method::DELETE, "route=orders&key=twice&key=other&force=true", "key is given 2 times"),
        (Method::DELETE, "route=orders&key=twice&ro%75te=orders&force=true", "route is given 2 times"),
        (Method::DELETE, "route=orders&key=twice&Force=true", "\"Force\" is not a parameter of /keys"),
        (Method::DELETE, "route=orders&key=twice&scope-hash=00", "\"scope-hash\" is not a parameter of /keys"),
        (Method::GET, "route=orders&route=other&key=twice", "route is given 2 times"),
        (Method::GET, "route=orders&key=", "key is given empty"),
        (Method::GET, "route=&key=twice", "route is given empty"),
        (Method::GET, "route=orders&key=twice&host=", "host is given empty"),
        (Method::GET, "route=orders&key=twice&scope_hash=", "scope_hash is given empty"),
        (Method::GET, "route=orders&state=unknown&state=executed", "state is given 2 times"),
        (Method::GET, "route=orders&state=unknown&limit=1&limit=1000", "limit is given 2 times"),
        (Method::GET, "route=orders&state=unknown&cursor=a&cursor=b", "cursor is given 2 times"),
        (Method::GET, "route=orders&state=", "state is given empty"),
        (Method::PUT, "route=orders&key=twice&key=twice", "key is given 2 times"),
    ];
    for (method, query, named) in refusals {
        let r = admin.send(method.clone(), &format!("/keys?{query}"), &headers, "").await;
        assert_eq!(
            (r.status.as_u16(), r.problem().as_str()),
            (400, "admin-bad-request"),
            "{method} {query}: {:?}",
            r.body
        );
        let detail = r.json()["detail"].as_str().unwrap_or_default().to_owned();
        assert!(detail.contains(named), "{method} {query}: {detail}");
    }
    let held = admin.send(Method::GET, "/keys?route=orders&key=twice", &headers, "").await;
    assert_eq!(held.json()["state"], "in_progress", "still held: {:?}", held.body);
    // A retry meanwhile waits for the running request and gets its answer.
    let retry = client.post_json("/orders", Some("twice"), ORDER).await;
    assert_eq!(first.await.unwrap().status, 201);
    assert!(retry.is_replay(), "the retry waited for the running request: {:?}", retry.body);
    assert_eq!(upstream.executions(), 1, "executed once");
    // An empty cursor still starts a listing from the beginning, as it always has.
    let listed = admin.send(Method::GET, "/keys?route=orders&state=unknown&cursor=", &headers, "").await;
    assert_eq!(listed.status, 200, "{:?}", listed.body);
    assert!(!gw.log().contains("operator changed a key"), "nothing was changed: {}", gw.log());
}

/// docs/security.md, "admin input that is the client's fault reported as a store outage": a
/// cursor no listing handed out is 400, and a command the store refuses (here a record name
/// holding a key of another type) is logged as a refusal, never as the store going down;
/// `/readyz` stays 200 throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_mistake_is_never_reported_as_a_store_outage() {
    let upstream = TestUpstream::start().await;
    let redis = support::redis::RedisServer::shared();
    let prefix = support::unique("refused");
    let store = format!("backend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{prefix}\"", redis.url());
    let toml = Toml {
        server: &format!("admin_token = \"{TOKEN}\""),
        store: &store,
        policy: "scope = \"global\"",
        upstream_lines: "timeout = \"5s\"",
        ..Toml::new(upstream.addr)
    }
    .render();
    let gw = GatewayProc::start(&toml);
    let admin = Client::new(gw.admin);
    let bearer = format!("Bearer {TOKEN}");
    for cursor in ["18446744073709551615.18446744073709551615", "1.99999999999", "9007199254740993.0"] {
        let path = format!("/keys?route=orders&state=unknown&cursor={cursor}");
        let r = admin.send(Method::GET, &path, &[("authorization", bearer.as_str())], "").await;
        assert_eq!((r.status.as_u16(), r.problem().as_str()), (400, "admin-bad-request"), "{cursor}: {:?}", r.body);
    }
    // A record name that holds a list: Redis refuses the claim's commands (WRONGTYPE).
    let name = support::record_key(&prefix, "wrong-type");
    let _: () = ::redis::cmd("RPUSH").arg(name.as_str()).arg("x").query(&mut redis.connection()).unwrap();
    let refused = gw.client().post_json("/orders", Some("wrong-type"), ORDER).await;
    assert_eq!(refused.status, 503, "fail-closed: {:?}", refused.body);
    assert_eq!(upstream.executions(), 0);
    assert_eq!(admin.get("/readyz", &[]).await.status, 200);
    assert_eq!(gw.lines_with("store refused a command", 1).len(), 1, "{}", gw.log());
    assert!(!gw.log().contains("store stopped answering"), "{}", gw.log());
    let _: () = ::redis::cmd("DEL").arg(name.as_str()).query(&mut redis.connection()).unwrap();
    assert_eq!(gw.client().post_json("/orders", Some("wrong-type"), ORDER).await.status, 201);
}

// ---- the admin listener's connections -----------------------------------------------------

/// docs/security.md, "the admin listener held open": a silent connection and a half-sent head
/// are closed at the header timeout, an idle keep-alive at the idle timeout, and a `PUT` that
/// stalls after 10 of its 100 bytes gets 408 `admin-body-timeout` at the body timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_closes_silent_slow_idle_and_stalled_connections() {
    let upstream = TestUpstream::start().await;
    let server = format!(
        "admin_token = \"{TOKEN}\"\nheader_read_timeout = \"1s\"\nidle_timeout = \"1s\"\nbody_read_timeout = \"1s\""
    );
    let gw = start(upstream.addr, &server, "");
    let started = Instant::now();
    let mut silent = TcpStream::connect(gw.admin).await.unwrap();
    let mut half = TcpStream::connect(gw.admin).await.unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n").await.unwrap();
    let mut idle = TcpStream::connect(gw.admin).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
    let mut stalled = TcpStream::connect(gw.admin).await.unwrap();
    let head = format!(
        "PUT /keys?route=orders&key=k HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\n\
         scope-authorization: {DEFAULT_AUTH}\r\ncontent-length: 100\r\n\r\n{{\"status\":"
    );
    stalled.write_all(head.as_bytes()).await.unwrap();
    for (name, stream) in [("silent", &mut silent), ("half a head", &mut half), ("idle", &mut idle)] {
        let (_, closed) = read_until_closed(stream, Duration::from_secs(5)).await;
        assert!(closed, "{name}: still open after {:?}", started.elapsed());
    }
    let (raw, closed) = read_until_closed(&mut stalled, Duration::from_secs(5)).await;
    assert_eq!(status_of(&raw), 408, "{}", String::from_utf8_lossy(&raw));
    assert!(String::from_utf8_lossy(&raw).contains("admin-body-timeout"));
    assert!(closed, "the connection closes after a 408");
    assert!(started.elapsed() < Duration::from_secs(4), "took {:?}", started.elapsed());
}

/// The admin listener has a cap of its own: past it, new clients wait in the backlog and are
/// served once a place frees up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_cap_the_admin_listener_makes_clients_wait() {
    let upstream = TestUpstream::start().await;
    let gw = start(upstream.addr, "admin_max_connections = 2\nheader_read_timeout = \"1s\"", "");
    let _silent: Vec<TcpStream> = futures_util::future::join_all((0..2).map(|_| TcpStream::connect(gw.admin)))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    assert_eq!(Client::new(gw.admin).get("/healthz", &[]).await.status, 200);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(700) && waited < Duration::from_secs(3), "served after {waited:?}");
}

/// docs/security.md, "a flood on one listener starving the other": under 512 file
/// descriptors, 600 silent connections on the admin port, then 600 on the proxy port. Each
/// listener stops accepting at its cap, fitted at start into the limit with a reserve, and
/// the other goes on serving; "accept failed" is said at most once per interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_descriptor_limit_a_flood_on_one_listener_never_stops_the_other() {
    let upstream = TestUpstream::start().await;
    let toml = Toml {
        server: "header_read_timeout = \"30s\"\nidle_timeout = \"30s\"",
        upstream_lines: "timeout = \"5s\"",
        ..Toml::new(upstream.addr)
    }
    .render();
    let gw = GatewayProc::start_limited(&toml, 512);
    let fitted = gw.lines_with("this process may open 512", 1);
    assert_eq!(fitted.len(), 1, "the caps are fitted and it is said: {}", gw.log());
    assert!(fitted[0].contains("serves at most 192 connections and 64 on the admin listener"), "{}", fitted[0]);
    // 600 connects at once; those the kernel queues (a listener's places, then its backlog)
    // complete, and the rest are given up after two seconds (past the backlog, the kernel
    // drops the SYNs and the client would retry for minutes).
    let flood = |addr: SocketAddr| async move {
        let connects = (0..600).map(|_| tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr)));
        let held: Vec<TcpStream> =
            futures_util::future::join_all(connects).await.into_iter().filter_map(|c| c.ok()?.ok()).collect();
        assert!(held.len() > 64, "only {} connections got through", held.len());
        held
    };
    let admin_flood = flood(gw.admin).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..5 {
        let r = tokio::time::timeout(Duration::from_secs(5), gw.client().get(&format!("/during-admin-flood/{i}"), &[]))
            .await;
        assert_eq!(r.map(|r| r.status.as_u16()).ok(), Some(201), "the proxy stopped serving: {}", gw.log());
    }
    // Gone: each is found closed as it is accepted. (Past its cap a listener serves its
    // backlog in order, so a listener flooded with silent clients is slow for its own
    // clients until the header timeout frees places; the other one is what must not suffer.)
    drop(admin_flood);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _proxy_flood = flood(gw.addr).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    for path in ["/healthz", "/metrics", "/readyz"] {
        let r = tokio::time::timeout(Duration::from_secs(5), Client::new(gw.admin).get(path, &[])).await;
        assert_eq!(
            r.map(|r| r.status.as_u16()).ok(),
            Some(200),
            "{path}: the admin listener stopped serving: {}",
            gw.log()
        );
    }
    assert!(gw.lines_with("accept failed", 1).len() <= 1, "{}", gw.log());
}

// ---- the store's own settings ------------------------------------------------------------

/// docs/security.md, "records silently evicted by the store": a Redis whose
/// `maxmemory-policy` evicts is an error in the log at start, a metric, and a line in
/// `/readyz` (which stays 200: the gateway serves); one that refuses `CONFIG` (a managed
/// service) is a warning, never a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_evicts_records_is_an_error_and_one_that_hides_its_settings_a_warning() {
    let upstream = TestUpstream::start().await;
    let start_on = |redis: &support::redis::RedisServer| {
        let store =
            format!("backend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"{}\"", redis.url(), support::unique("cfg"));
        let toml = Toml { store: &store, upstream_lines: "timeout = \"5s\"", ..Toml::new(upstream.addr) }.render();
        GatewayProc::start(&toml)
    };
    let evicting =
        support::redis::RedisServer::start_with(&["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"]);
    let gw = start_on(&evicting);
    let said = gw.lines_with("maxmemory-policy is allkeys-lru", 1);
    assert_eq!(said.len(), 1, "{}", gw.log());
    assert!(said[0].contains("ERROR") && said[0].contains("noeviction"), "{}", said[0]);
    let ready = Client::new(gw.admin).get("/readyz", &[]).await;
    assert_eq!(ready.status, 200, "the gateway serves");
    let body = String::from_utf8_lossy(&ready.body).into_owned();
    assert!(body.starts_with("ready\n") && body.contains("store error: maxmemory-policy is allkeys-lru"), "{body}");
    assert_eq!(gw.metric("idemgate_store_evicts_records").await, 1.0);
    assert_eq!(gw.client().post_json("/orders", Some("served"), ORDER).await.status, 201);

    let hiding = support::redis::RedisServer::start_with(&["--rename-command", "CONFIG", "\"\""]);
    let gw = start_on(&hiding);
    let said = gw.lines_with("cannot read maxmemory-policy", 1);
    assert_eq!(said.len(), 1, "{}", gw.log());
    assert!(said[0].contains("WARN") && !gw.log().contains("ERROR"), "{}", gw.log());
    let ready = Client::new(gw.admin).get("/readyz", &[]).await;
    assert_eq!(ready.status, 200);
    assert!(String::from_utf8_lossy(&ready.body).contains("store warning: cannot read maxmemory-policy"));
    assert_eq!(gw.metric("idemgate_store_evicts_records").await, 0.0);
    assert!(!gw.log().contains("store stopped answering"), "{}", gw.log());
    assert_eq!(gw.client().post_json("/orders", Some("served"), ORDER).await.status, 201);

    let sound = support::redis::RedisServer::start_with(&["--appendonly", "yes"]);
    let gw = start_on(&sound);
    let summary = gw.lines_with("store settings", 1);
    assert!(
        summary[0].contains("maxmemory-policy noeviction") && summary[0].contains("appendonly yes"),
        "{}",
        summary[0]
    );
    assert!(!gw.log().contains("store:"), "no finding: {}", gw.log());
}
