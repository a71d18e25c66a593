//! Traces: what an OTLP collector receives from the gateway, and the trace context the
//! upstream gets. The collector here is a small in-process OTLP/HTTP receiver that decodes
//! every export as a real collector would.

use crate::support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use support::client::DEFAULT_AUTH;
use support::gateway::TestGateway;
use support::gateway_proc::{GatewayProc, Toml};
use support::upstream::{Behavior, TestUpstream};

const ORDER: &str = r#"{"sku":"A-1","quantity":2}"#;
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// One span as the collector got it.
#[derive(Debug, Clone)]
struct Got {
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    attributes: HashMap<String, String>,
    service: String,
    /// The contexts it links to: trace id, span id, trace state.
    links: Vec<(String, String, String)>,
}

#[derive(Default)]
struct Collector {
    spans: Mutex<Vec<Got>>,
    auth: Mutex<Vec<Option<String>>>,
    /// Bytes of every export received.
    sizes: Mutex<Vec<usize>>,
    /// Answer every export with this status instead of 200.
    refuse: Mutex<Option<u16>>,
}

async fn collect(state: Arc<Collector>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    state.auth.lock().unwrap().push(req.headers().get("x-otlp-token").map(|v| v.to_str().unwrap().to_owned()));
    let body = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    state.sizes.lock().unwrap().push(body.len());
    if let Some(status) = *state.refuse.lock().unwrap() {
        return Ok(Response::builder().status(status).body(Full::new(Bytes::new())).unwrap());
    }
    let export = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf export");
    for resource in export.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|a| a.key == "service.name")
            .and_then(|a| a.value.as_ref()?.value.as_ref().map(text))
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                let attributes = span
                    .attributes
                    .iter()
                    .filter_map(|a| Some((a.key.clone(), text(a.value.as_ref()?.value.as_ref()?))))
                    .collect();
                state.spans.lock().unwrap().push(Got {
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent: hex(&span.parent_span_id),
                    attributes,
                    service: service.clone(),
                    links: span
                        .links
                        .iter()
                        .map(|l| (hex(&l.trace_id), hex(&l.span_id), l.trace_state.clone()))
                        .collect(),
                });
            }
        }
    }
    Ok(Response::new(Full::new(Bytes::new())))
}

fn text(v: &Value) -> String {
    match v {
        Value::StringValue(s) => s.clone(),
        Value::IntValue(n) => n.to_string(),
        Value::BoolValue(b) => b.to_string(),
        other => format!("{other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn collector() -> (SocketAddr, Arc<Collector>) {
    let state = Arc::new(Collector::default());
    (support::serve_http(Arc::clone(&state), collect).await, state)
}

fn config(upstream: SocketAddr, collector: SocketAddr, server: &str, telemetry: &str) -> String {
    let policy = "wait = \"3s\"";
    format!(
        "{}\n[telemetry]\notlp_endpoint = \"http://{collector}\"\nservice_name = \"checkout-gateway\"\n{telemetry}\n",
        Toml { server, policy, ..Toml::new(upstream) }.render()
    )
}

async fn spans_of(collector: &Collector, trace: &str, at_least: usize) -> Vec<Got> {
    for _ in 0..200 {
        let spans: Vec<Got> = collector.spans.lock().unwrap().iter().filter(|s| s.trace_id == trace).cloned().collect();
        if spans.len() >= at_least {
            return spans;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("fewer than {at_least} spans of {trace}: {:#?}", collector.spans.lock().unwrap());
}

fn traceparent(span: &str, flags: &str) -> String {
    format!("00-{TRACE}-{span}-{flags}")
}

/// Every span the collector has once it has at least `at_least`.
async fn all_spans(collector: &Collector, at_least: usize) -> Vec<Got> {
    for _ in 0..200 {
        let spans = collector.spans.lock().unwrap().clone();
        if spans.len() >= at_least {
            return spans;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("fewer than {at_least} spans: {:#?}", collector.spans.lock().unwrap());
}

/// A client that is not a trusted proxy gets a trace of the gateway's own, linked to its
/// context: its first request, a duplicate that waited and a replay each start one, with the
/// claim, the wait, the exchange and the settle below; the upstream's parent is the gateway's
/// upstream span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_request_replay_and_waited_duplicate_are_traced_and_linked_to_the_clients_trace() {
    let upstream = TestUpstream::with(Behavior { delay: Duration::from_millis(300), ..Behavior::default() }).await;
    let (collector_addr, collector) = collector().await;
    let gw = TestGateway::start(&config(upstream.addr, collector_addr, "shutdown_grace = \"2s\"", "")).await;
    let client = gw.client();
    let headers = |parent: &str| {
        vec![
            ("content-type", "application/json".to_owned()),
            ("idempotency-key", "trace-1".to_owned()),
            ("authorization", DEFAULT_AUTH.to_owned()),
            ("traceparent", traceparent(parent, "01")),
            ("tracestate", "vendor=x".to_owned()),
        ]
    };
    let send = |parent: &'static str| {
        let client = client.clone();
        let headers = headers(parent);
        async move {
            let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            client.send(Method::POST, "/orders", &headers, ORDER).await
        }
    };
    let first = tokio::spawn(send("00f067aa0ba902b7"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waited = send("00f067aa0ba902b8").await;
    assert_eq!(first.await.unwrap().status, 201);
    assert!(waited.is_replay());
    let replay = send("00f067aa0ba902b9").await;
    assert!(replay.is_replay());

    // The upstream got the gateway's upstream span as its parent, in the gateway's trace.
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    let parent = seen[0].headers.get("traceparent").unwrap().to_str().unwrap().to_owned();
    assert!(!parent.contains(TRACE) && parent.ends_with("-01"), "a trace of the gateway's own: {parent}");
    assert_eq!(seen[0].headers.get("tracestate"), None, "the client's state belongs to the client's trace");

    gw.shutdown().await;
    let spans = all_spans(&collector, 8).await;
    let requests: Vec<&Got> = spans.iter().filter(|s| s.name == "POST orders").collect();
    assert_eq!(requests.len(), 3, "{spans:#?}");
    for span in &spans {
        assert_eq!(span.service, "checkout-gateway");
        assert_ne!(span.trace_id, TRACE, "{span:?}");
        for value in span.attributes.values() {
            assert!(!value.contains("trace-1") && !value.contains("Bearer"), "no key or credential: {span:?}");
        }
    }
    let by_link = |client_span: &str| {
        let linked = |s: &&&Got| s.links.iter().any(|(trace, span, _)| trace == TRACE && span == client_span);
        requests.iter().find(linked).copied().unwrap_or_else(|| panic!("no span links to {client_span}: {spans:#?}"))
    };
    let executed = by_link("00f067aa0ba902b7");
    assert_eq!(executed.parent, "", "a root of the gateway's own");
    assert_eq!(executed.links[0].2, "vendor=x", "the link carries the client's trace state");
    assert_eq!(executed.attributes["idemgate.outcome"], "executed");
    assert_eq!(executed.attributes["idemgate.attempt"], "1");
    assert_eq!(executed.attributes["idemgate.route"], "orders");
    assert_eq!(executed.attributes["idemgate.record"].len(), 12, "the record's hash, short");
    assert_eq!(by_link("00f067aa0ba902b8").attributes["idemgate.outcome"], "replayed");
    assert_eq!(by_link("00f067aa0ba902b9").attributes["idemgate.outcome"], "replayed");
    let traces: std::collections::HashSet<&str> = requests.iter().map(|s| s.trace_id.as_str()).collect();
    assert_eq!(traces.len(), 3, "one trace per request");
    // Child spans: the claim of each, the duplicate's wait, the exchange and its settle.
    let children = |of: &Got| -> Vec<String> {
        let mut names: Vec<String> = spans.iter().filter(|s| s.parent == of.span_id).map(|s| s.name.clone()).collect();
        names.sort();
        names
    };
    assert_eq!(children(executed), ["claim", "settle", "upstream"]);
    assert_eq!(children(by_link("00f067aa0ba902b8")), ["claim", "wait"]);
    assert_eq!(children(by_link("00f067aa0ba902b9")), ["claim"]);
    let upstream_span = spans.iter().find(|s| s.name == "upstream").unwrap();
    assert_eq!(parent, format!("00-{}-{}-01", executed.trace_id, upstream_span.span_id));
}

/// docs/security.md, "a client steering trace export": at `sample_ratio = 0.001`, 300
/// requests whose trace ids have zero low 64 bits (what made every one of them sampled) are
/// sampled as any others: by a draw of the gateway's own. And a 6.5 KB `tracestate` reaches
/// neither the upstream nor the collector whole: both get at most W3C's 512 characters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_can_neither_force_an_export_nor_swell_one() {
    let upstream = TestUpstream::start().await;
    let (collector_addr, collector) = collector().await;
    let gw = TestGateway::start(&config(upstream.addr, collector_addr, "", "sample_ratio = 0.001")).await;
    let client = gw.client();
    for i in 0..300u32 {
        let parent = format!("00-{:016x}0000000000000000-00f067aa0ba902b7-01", u64::from(i) + 1);
        let r = client.send(Method::GET, &format!("/steer/{i}"), &[("traceparent", parent.as_str())], "").await;
        assert_eq!(r.status, 201);
    }
    gw.shutdown().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let exported = collector.spans.lock().unwrap().iter().filter(|s| s.name == "GET rest").count();
    // Binomial(300, 0.001): P(more than 4) is about 1e-6.
    assert!(exported <= 4, "{exported} of 300 exported at a ratio of 0.001");

    let state: Vec<String> = (0..65).map(|i| format!("v{i:03}={}", "x".repeat(95))).collect();
    let state = state.join(",");
    assert!(state.len() > 6500);
    let parent = traceparent("00f067aa0ba902b7", "01");
    let headers = [("traceparent", parent.as_str()), ("tracestate", state.as_str())];
    // Not sampled: the context goes on, not sampled, its state cut to the bounds.
    let quiet = TestGateway::start(&config(upstream.addr, collector_addr, "", "sample_ratio = 0.0")).await;
    assert_eq!(quiet.client().send(Method::GET, "/quiet", &headers, "").await.status, 201);
    quiet.shutdown().await;
    let forwarded = upstream.seen().last().unwrap().headers.clone();
    assert_eq!(forwarded.get("traceparent").unwrap().to_str().unwrap(), traceparent("00f067aa0ba902b7", "00"));
    let forwarded = forwarded.get("tracestate").unwrap().to_str().unwrap().to_owned();
    assert!(forwarded.len() <= 512 && forwarded.starts_with("v000="), "{} characters", forwarded.len());
    // Sampled: the export carries the cut state in its link, nothing more.
    let before = collector.sizes.lock().unwrap().len();
    let traced = TestGateway::start(&config(upstream.addr, collector_addr, "", "")).await;
    assert_eq!(traced.client().send(Method::GET, "/traced", &headers, "").await.status, 201);
    traced.shutdown().await;
    let spans = all_spans(&collector, 1).await;
    let span = spans.iter().find(|s| s.links.iter().any(|(trace, _, _)| trace == TRACE)).expect("the linked span");
    assert!(span.links[0].2.len() <= 512, "{}", span.links[0].2.len());
    let sizes = collector.sizes.lock().unwrap()[before..].to_vec();
    assert!(sizes.iter().all(|&n| n < 2048), "exports of {sizes:?} bytes");
}

/// docs/security.md, "failed exports nobody sees": a collector that answers 500 loses the
/// spans of each export, and they are counted and said in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_a_refusing_collector_loses_are_counted() {
    let upstream = TestUpstream::start().await;
    let (collector_addr, collector) = collector().await;
    *collector.refuse.lock().unwrap() = Some(500);
    let gw = GatewayProc::start(&config(upstream.addr, collector_addr, "", ""));
    for i in 0..3 {
        assert_eq!(gw.client().get(&format!("/lost/{i}"), &[]).await.status, 201);
    }
    // Batches leave every 5 s, and at once at shutdown; wait for the counter.
    let mut counted = 0.0;
    for _ in 0..150 {
        counted = gw.metric("idemgate_telemetry_spans_dropped_total{reason=\"export_failed\"}").await;
        if counted >= 3.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(counted >= 3.0, "counted {counted}: {}", gw.log());
    let said = gw.lines_with("telemetry: spans dropped", 1);
    assert_eq!(said.len(), 1, "said once: {}", gw.log());
    assert!(said[0].contains("export_failed") && said[0].contains("500"), "{}", said[0]);
}

/// A client's `sampled` flag is believed only from a trusted proxy: anyone else could have
/// all its requests exported (or none). A request that is not traced passes its context on,
/// with the gateway's decision in its flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_trusted_proxy_decides_sampling_and_untraced_requests_pass_their_context_on() {
    let upstream = TestUpstream::start().await;
    let (collector_addr, collector) = collector().await;
    // Nobody trusted, ratio 0: the client's sampled flag is not believed.
    let gw = TestGateway::start(&config(upstream.addr, collector_addr, "", "sample_ratio = 0.0")).await;
    let parent = traceparent("00f067aa0ba902b7", "01");
    let r = gw
        .client()
        .send(Method::GET, "/anything", &[("traceparent", parent.as_str()), ("tracestate", "vendor=x")], "")
        .await;
    assert_eq!(r.status, 201);
    // Passed on, with the decision the gateway made: not sampled. (A tracer or a gateway behind
    // this one that trusts it must not follow the client's flag.)
    let unsampled = traceparent("00f067aa0ba902b7", "00");
    assert_eq!(upstream.seen()[0].headers.get("traceparent").unwrap().to_str().unwrap(), unsampled);
    assert_eq!(upstream.seen()[0].headers.get("tracestate").unwrap(), "vendor=x");
    gw.shutdown().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(collector.spans.lock().unwrap().is_empty(), "nothing exported");

    // From a trusted proxy (here: loopback), its decision stands even at ratio 0. The
    // collector's header comes from the environment: the gateway runs as a process of its
    // own, given the variable, because the tests share this process's environment (setting
    // a variable while other threads read theirs is undefined behaviour).
    let mut gw = GatewayProc::start_full(
        &config(
            upstream.addr,
            collector_addr,
            "trusted_proxies = [\"127.0.0.1/32\"]",
            "sample_ratio = 0.0\nheaders_env = \"IDEMGATE_TEST_OTLP_HEADER\"",
        ),
        &[],
        &[("IDEMGATE_TEST_OTLP_HEADER", "X-Otlp-Token: t0ken")],
    );
    let r = gw.client().send(Method::GET, "/anything", &[("traceparent", parent.as_str())], "").await;
    assert_eq!(r.status, 201);
    let r = gw.client().send(Method::GET, "/other", &[("traceparent", unsampled.as_str())], "").await;
    assert_eq!(r.status, 201);
    gw.sigterm();
    assert!(gw.wait_exit(Duration::from_secs(10)).is_some_and(|s| s.success()), "the gateway exits");
    let spans = spans_of(&collector, TRACE, 1).await;
    assert_eq!(spans.iter().filter(|s| s.name == "GET rest").count(), 1, "the sampled one only: {spans:#?}");
    assert!(
        collector.auth.lock().unwrap().iter().all(|a| a.as_deref() == Some("t0ken")),
        "the header from the environment"
    );
}

/// On one thread (`worker_threads = 1`, no pool) the exporter's thread hands its calls to the
/// gateway's runtime: spans still leave, and the last ones at shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_on_one_thread_exports_its_spans_and_the_last_ones_at_shutdown() {
    let upstream = TestUpstream::start().await;
    let (collector_addr, collector) = collector().await;
    let mut gw = GatewayProc::start(&config(upstream.addr, collector_addr, "worker_threads = 1", ""));
    let parent = traceparent("00f067aa0ba902b7", "01");
    let r = gw.client().send(Method::GET, "/anything", &[("traceparent", parent.as_str())], "").await;
    assert_eq!(r.status, 201);
    gw.sigterm();
    let status = gw.wait_exit(Duration::from_secs(10)).expect("the gateway exits");
    assert!(status.success(), "{status:?}");
    let spans = all_spans(&collector, 1).await;
    assert!(spans.iter().any(|s| s.name == "GET rest"), "the request's span: {spans:#?}");
}
