//! Traces: one span per request, with child spans for the claim, a duplicate's wait, the
//! upstream exchange, the settle and a reconciliation, exported over OTLP/HTTP
//! (`[telemetry]`).
//!
//! W3C trace context (`traceparent`, `tracestate`) always reaches the upstream: untouched when
//! the request is not traced, and with the gateway's own span as the parent when it is, so the
//! upstream's spans hang under the gateway's in the trace of a slow checkout.
//!
//! The hazard is a client steering what is exported. Its `sampled` flag, believed from
//! anyone, would have every one of its requests exported; and a decision made on its trace id
//! (the id's low bits against `sample_ratio`) is the client's to choose, since it picks the
//! id. So only a peer in `server.trusted_proxies` continues its trace, with its decision. For
//! anyone else the gateway starts a trace of its own, sampled by `sample_ratio` on a draw of
//! its own, with a span link to the client's context: the client's trace still leads to the
//! gateway's, and a trace is decided once, by the gateway that starts it (a gateway behind
//! another trusts it as a proxy and follows its decision). `tracestate` is kept within W3C's
//! bounds (512 characters, 32 members) in what is forwarded and what is exported: a client's
//! 6.5 KB of it was 15 KB of export per request. Attributes name the route, the outcome, the
//! attempt and the record's hash, never the key or a credential.
//!
//! Off by default, and then free: without `[telemetry]` nothing here runs and no span is
//! built. Spans leave in batches from a background thread; the export itself runs on the
//! gateway's runtime, with the same hyper client and TLS stack as its upstreams, and what is
//! left is flushed on shutdown. The queue is bounded; a span that finds it full, and the spans
//! of an export that failed (the collector down, slow or refusing), are counted in
//! `idemgate_telemetry_spans_dropped_total{reason}` and said in the log once per interval.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue};
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{Link, Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

mod export;

use self::export::{Bounded, Counted, Exporting, Queue};
use crate::config::{TelemetryConfig, UpstreamConfig};
use crate::upstream::Upstream;

/// How long one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest collector answer read.
const MAX_ANSWER: usize = 64 * 1024;
/// Spans waiting to be exported, at most; past it, spans are dropped (and counted).
const MAX_QUEUE: usize = 2048;
/// The longest silence while spans are being dropped.
const SAY_DROPS_EVERY: Duration = Duration::from_secs(10);
/// W3C Trace Context's bounds on a `tracestate` a vendor propagates: its length in
/// characters, its members, and a member that is dropped first when it must be cut.
const TRACESTATE_MAX_LEN: usize = 512;
const TRACESTATE_MAX_MEMBERS: usize = 32;
const TRACESTATE_LONG_MEMBER: usize = 128;

/// The exporter and the sampling rule, shared by every request.
pub struct Telemetry {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    /// `sample_ratio` as a bound on a random 64-bit draw.
    sample_below: u64,
    /// Spans dropped, by reason.
    dropped: Family<DropReason, Counter>,
}

/// Why spans were not exported (the `reason` label of `telemetry_spans_dropped`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct DropReason {
    reason: &'static str,
}

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
#[error("telemetry: {0}")]
pub struct TelemetryError(String);

impl Telemetry {
    /// Starts the exporter. Must run inside the gateway's tokio runtime, which the exports use.
    pub fn start(config: &TelemetryConfig) -> Result<Self, TelemetryError> {
        let collector = UpstreamConfig {
            name: "telemetry".into(),
            urls: vec![config.traces_url.clone()],
            resolve_every: None,
            ejection: crate::config::default_ejection(),
            timeout: EXPORT_TIMEOUT,
            connect_timeout: Duration::from_secs(5),
            ca_file: config.ca_file.clone(),
        };
        let client = Exporting {
            upstream: Arc::new(Upstream::new(&collector, None).map_err(|e| TelemetryError(e.to_string()))?),
            runtime: tokio::runtime::Handle::try_current().map_err(|e| TelemetryError(e.to_string()))?,
        };
        let mut headers = HashMap::new();
        if let Some((name, value)) = &config.header {
            headers.insert(name.to_string(), value.0.clone());
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(config.traces_url.to_string())
            .with_timeout(EXPORT_TIMEOUT)
            .with_headers(headers)
            .build()
            .map_err(|e| TelemetryError(e.to_string()))?;
        let resource = Resource::builder().with_service_name(config.service_name.clone()).build();
        let dropped = Family::<DropReason, Counter>::default();
        let queue = Arc::new(Queue::new(dropped.clone()));
        // The batch processor's own queue holds as many as ours lets through, so it never
        // drops a span of its own accord (it would, silently).
        let batch = BatchSpanProcessor::builder(Counted { inner: exporter, queue: Arc::clone(&queue) })
            .with_batch_config(BatchConfigBuilder::default().with_max_queue_size(MAX_QUEUE).build())
            .build();
        // Every span started here is wanted: the sampling decision is made before (`begin`).
        let provider = SdkTracerProvider::builder()
            .with_span_processor(Bounded { inner: batch, queue })
            .with_sampler(Sampler::AlwaysOn)
            .with_resource(resource)
            .build();
        let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "idemgate");
        let sample_below = (config.sample_ratio.clamp(0.0, 1.0) * u64::MAX as f64) as u64;
        Ok(Self { provider, tracer, sample_below, dropped })
    }

    /// The counters of spans dropped, for the metrics registry.
    pub fn dropped(&self) -> Family<DropReason, Counter> {
        self.dropped.clone()
    }

    /// The span of one request, when it is traced. A trusted proxy's trace is continued with
    /// its sampling decision; anyone else's request gets a trace of the gateway's own, sampled
    /// by `sample_ratio`, linked to the client's context when it sent one (see the module
    /// docs). When such a request is not sampled, the `traceparent` it forwards says so (its
    /// `sampled` flag cleared): the decision is the gateway's, and a gateway or tracer behind
    /// this one that believes it must not follow the client's flag instead. `headers`'
    /// `tracestate` has been cut to W3C's bounds ([`bound_tracestate`], for every request).
    pub fn begin(
        &self,
        headers: &mut HeaderMap,
        trusted: bool,
        route: &str,
        method: &http::Method,
    ) -> Option<RequestSpan> {
        let remote = TraceContextPropagator::new().extract(&Headers(headers)).span().span_context().clone();
        // A trusted proxy's decision, or a draw of the gateway's own: nothing else a client
        // sends moves it.
        let (parent, link, decided) = match (remote.is_valid(), trusted) {
            (true, true) => (Context::new().with_remote_span_context(remote.clone()), None, Some(remote.is_sampled())),
            (true, false) => (Context::new(), Some(Link::with_context(remote)), None),
            (false, _) => (Context::new(), None, None),
        };
        if !decided.unwrap_or_else(|| self.draw(rand::random())) {
            if let Some(link) = &link {
                let context = &link.span_context;
                let unsampled = format!("00-{}-{}-00", context.trace_id(), context.span_id());
                if let Ok(value) = HeaderValue::from_str(&unsampled) {
                    headers.insert("traceparent", value);
                }
            }
            return None;
        }
        let span = self
            .tracer
            .span_builder(format!("{method} {route}"))
            .with_kind(SpanKind::Server)
            .with_links(link.into_iter().collect())
            .with_attributes([
                KeyValue::new("idemgate.route", route.to_owned()),
                KeyValue::new("http.request.method", method.to_string()),
            ])
            .start_with_context(&self.tracer, &parent);
        Some(RequestSpan { cx: parent.with_span(span), tracer: self.tracer.clone() })
    }

    /// Whether a request whose trace the gateway starts is sampled, on `draw` (random).
    fn draw(&self, draw: u64) -> bool {
        self.sample_below == u64::MAX || draw < self.sample_below
    }

    /// Exports what is left; called once, at shutdown.
    pub async fn shutdown(&self) {
        let provider = self.provider.clone();
        // The provider blocks until its last batch is out; the export itself needs the runtime.
        let done = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(e)) = done {
            tracing::warn!(error = %e, "telemetry: spans not exported at shutdown");
        }
    }
}

/// The span of one traced request.
#[derive(Clone)]
pub struct RequestSpan {
    cx: Context,
    tracer: SdkTracer,
}

impl std::fmt::Debug for RequestSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sc = self.cx.span().span_context().clone();
        write!(f, "RequestSpan({}-{})", sc.trace_id(), sc.span_id())
    }
}

/// A span below a request's.
pub struct ChildSpan {
    cx: Context,
}

impl RequestSpan {
    /// Starts a child span `name` now.
    pub fn child(&self, name: &'static str) -> ChildSpan {
        let span =
            self.tracer.span_builder(name).with_kind(SpanKind::Internal).start_with_context(&self.tracer, &self.cx);
        ChildSpan { cx: self.cx.with_span(span) }
    }

    /// A child span `name` that began at `start` and ended at `end` (for a phase whose extent
    /// is known only afterwards, such as a duplicate's wait).
    pub fn child_between(&self, name: &'static str, start: SystemTime, end: SystemTime) {
        let mut span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_start_time(start)
            .start_with_context(&self.tracer, &self.cx);
        span.end_with_timestamp(end);
    }

    /// The span that calls the upstream: a client span whose id the upstream gets as its
    /// parent in `traceparent` (set in `headers`, with `tracestate`).
    pub fn upstream(&self, headers: &mut HeaderMap) -> ChildSpan {
        let span =
            self.tracer.span_builder("upstream").with_kind(SpanKind::Client).start_with_context(&self.tracer, &self.cx);
        let child = ChildSpan { cx: self.cx.with_span(span) };
        child.inject(headers);
        child
    }

    /// Ends the request's span with what became of it.
    pub fn end(&self, outcome: &'static str, status: u16, attempt: Option<u32>, record: Option<&str>) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new("idemgate.outcome", outcome));
        span.set_attribute(KeyValue::new("http.response.status_code", i64::from(status)));
        if let Some(attempt) = attempt {
            span.set_attribute(KeyValue::new("idemgate.attempt", i64::from(attempt)));
        }
        if let Some(record) = record {
            span.set_attribute(KeyValue::new("idemgate.record", record.to_owned()));
        }
        if status >= 500 {
            span.set_status(Status::error(outcome));
        }
        span.end();
    }
}

impl ChildSpan {
    /// Adds an attribute.
    pub fn set(&self, key: &'static str, value: impl Into<opentelemetry::Value>) {
        self.cx.span().set_attribute(KeyValue::new(key, value));
    }

    /// Ends the span, as failed with `error` when there is one.
    pub fn end(self, error: Option<String>) {
        let span = self.cx.span();
        if let Some(error) = error {
            span.set_status(Status::error(error));
        }
        span.end();
    }

    /// Writes `traceparent` (and the `tracestate` it carries) naming this span as the parent.
    fn inject(&self, headers: &mut HeaderMap) {
        let sc = self.cx.span().span_context().clone();
        let value = format!("00-{}-{}-{:02x}", sc.trace_id(), sc.span_id(), sc.trace_flags().to_u8());
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert("traceparent", value);
        }
        let state = sc.trace_state().header();
        match HeaderValue::from_str(&state) {
            Ok(value) if !state.is_empty() => {
                headers.insert("tracestate", value);
            }
            _ => {
                headers.remove("tracestate");
            }
        }
    }
}

/// Cuts `tracestate` to W3C Trace Context's bounds (Level 1, §3.3.1.4 and §3.5): at most 32
/// members, whose whole (with their commas) is at most 512 characters. Where it must be cut,
/// members longer than 128 characters go first, then members from the end. Several
/// `tracestate` fields are one list. Without a member left, the field goes.
pub fn bound_tracestate(headers: &mut HeaderMap) {
    // A name made once, not parsed from a string at every request: this runs for all of them.
    const TRACESTATE: http::HeaderName = http::HeaderName::from_static("tracestate");
    let mut values = headers.get_all(&TRACESTATE).iter();
    let Some(first) = values.next() else { return };
    let joined;
    let text = match values.next() {
        None => match first.to_str() {
            Ok(text) if text.len() <= TRACESTATE_MAX_LEN && text.matches(',').count() < TRACESTATE_MAX_MEMBERS => {
                return;
            }
            Ok(text) => text,
            Err(_) => {
                headers.remove("tracestate");
                return;
            }
        },
        Some(_) => {
            let all: Vec<&str> = headers.get_all("tracestate").iter().filter_map(|v| v.to_str().ok()).collect();
            joined = all.join(",");
            &joined
        }
    };
    let mut members: Vec<&str> =
        text.split(',').map(str::trim).filter(|m| !m.is_empty()).take(TRACESTATE_MAX_MEMBERS).collect();
    let length = |members: &[&str]| members.iter().map(|m| m.len()).sum::<usize>() + members.len().saturating_sub(1);
    if length(&members) > TRACESTATE_MAX_LEN {
        members.retain(|m| m.len() <= TRACESTATE_LONG_MEMBER);
    }
    while length(&members) > TRACESTATE_MAX_LEN {
        members.pop();
    }
    let bounded = members.join(",");
    match HeaderValue::from_str(&bounded) {
        Ok(value) if !bounded.is_empty() => {
            headers.insert("tracestate", value);
        }
        _ => {
            headers.remove("tracestate");
        }
    }
}

/// Reads `traceparent` and `tracestate` for the propagator.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SpanData, SpanExporter, SpanProcessor};

    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("tracestate", HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn state(h: &HeaderMap) -> Option<String> {
        h.get("tracestate").map(|v| v.to_str().unwrap().to_owned())
    }

    #[test]
    fn a_tracestate_within_bounds_is_left_as_it_is() {
        let mut h = headers(&["rojo=00f067aa0ba902b7, congo=t61rcWkgMzE"]);
        bound_tracestate(&mut h);
        assert_eq!(state(&h).as_deref(), Some("rojo=00f067aa0ba902b7, congo=t61rcWkgMzE"));
    }

    #[test]
    fn a_tracestate_is_cut_to_512_characters_and_32_members() {
        // 6.5 KB in 100-character members: cut from the end to 512 characters.
        let member = |i: usize| format!("v{i:03}={}", "x".repeat(95));
        let long: Vec<String> = (0..65).map(member).collect();
        let mut h = headers(&[&long.join(",")]);
        bound_tracestate(&mut h);
        let kept = state(&h).unwrap();
        assert!(kept.len() <= 512, "{}", kept.len());
        assert!(kept.starts_with("v000=") && kept.split(',').count() == 5, "{kept}");
        // A member over 128 characters goes before any other.
        let mut h = headers(&[&format!("big={},a=1", "y".repeat(600)), "b=2"]);
        bound_tracestate(&mut h);
        assert_eq!(state(&h).as_deref(), Some("a=1,b=2"));
        // 40 small members: the first 32.
        let many: Vec<String> = (0..40).map(|i| format!("k{i}=v")).collect();
        let mut h = headers(&[&many.join(",")]);
        bound_tracestate(&mut h);
        assert_eq!(state(&h).unwrap().split(',').count(), 32);
        // Nothing left: no field.
        let mut h = headers(&[&format!("only={}", "z".repeat(700))]);
        bound_tracestate(&mut h);
        assert_eq!(state(&h), None);
    }

    #[derive(Debug, Default)]
    struct Sink(std::sync::Mutex<usize>);

    impl SpanProcessor for Sink {
        fn on_start(&self, _: &mut opentelemetry_sdk::trace::Span, _: &Context) {}
        fn on_end(&self, _: SpanData) {
            *self.0.lock().unwrap() += 1;
        }
        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
            Ok(())
        }
    }

    #[derive(Debug)]
    struct Refusing;

    impl SpanExporter for Refusing {
        async fn export(&self, _: Vec<SpanData>) -> OTelSdkResult {
            Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure(
                "HTTP export failed with status code: 500".into(),
            ))
        }
    }

    fn span() -> SpanData {
        SpanData {
            span_context: opentelemetry::trace::SpanContext::empty_context(),
            parent_span_id: opentelemetry::trace::SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: "s".into(),
            start_time: SystemTime::now(),
            end_time: SystemTime::now(),
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::Unset,
            instrumentation_scope: Default::default(),
        }
    }

    fn count(dropped: &Family<DropReason, Counter>, reason: &'static str) -> u64 {
        dropped.get_or_create(&DropReason { reason }).get()
    }

    #[test]
    fn spans_past_the_queue_are_dropped_and_counted() {
        let dropped = Family::default();
        let queue = Arc::new(Queue::new(dropped.clone()));
        let bounded = Bounded { inner: Sink::default(), queue: Arc::clone(&queue) };
        for _ in 0..MAX_QUEUE + 10 {
            bounded.on_end(span());
        }
        assert_eq!(*bounded.inner.0.lock().unwrap(), MAX_QUEUE);
        assert_eq!(count(&dropped, "queue_full"), 10);
        // An export frees its places, whatever came of it.
        queue.left(100);
        bounded.on_end(span());
        assert_eq!(*bounded.inner.0.lock().unwrap(), MAX_QUEUE + 1);
    }

    #[tokio::test]
    async fn an_export_that_fails_counts_its_spans_and_frees_their_places() {
        let dropped = Family::default();
        let queue = Arc::new(Queue::new(dropped.clone()));
        assert!((0..3).all(|_| queue.admit()));
        let counted = Counted { inner: Refusing, queue: Arc::clone(&queue) };
        assert!(counted.export(vec![span(), span(), span()]).await.is_err());
        assert_eq!(count(&dropped, "export_failed"), 3);
        assert_eq!(queue.pending.load(Ordering::Acquire), 0);
    }
}
