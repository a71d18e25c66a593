//! Traces: one span per request, with child spans for the claim, a duplicate's wait, the
//! upstream exchange, the settle and a reconciliation, exported over OTLP/HTTP
//! (`[telemetry]`).
//!
//! W3C trace context (`traceparent`, `tracestate`) always reaches the upstream: untouched when
//! the request is not traced, and with the gateway's own span as the parent when it is, so the
//! upstream's spans hang under the gateway's in the trace of a slow checkout.
//!
//! The hazard is the client's `sampled` flag: believed from anyone, any client could have
//! every one of its requests exported. It is believed only from `server.trusted_proxies`;
//! otherwise `sample_ratio` decides, on the trace id (so every gateway on a trace decides
//! alike). Attributes name the route, the outcome, the attempt and the record's hash, never the
//! key or a credential.
//!
//! Off by default, and then free: without `[telemetry]` nothing here runs and no span is
//! built. Spans leave in batches from a background thread; the export itself runs on the
//! gateway's runtime, with the same hyper client and TLS stack as its upstreams, and what is
//! left is flushed on shutdown.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue};
use http_body_util::BodyExt;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{Span as _, SpanContext, SpanKind, Status, TraceContextExt, TraceFlags, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};

use crate::body;
use crate::config::{TelemetryConfig, UpstreamConfig};
use crate::upstream::Upstream;

/// How long one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest collector answer read.
const MAX_ANSWER: usize = 64 * 1024;

/// The exporter and the sampling rule, shared by every request.
pub struct Telemetry {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    /// `sample_ratio` as a bound on the trace id's low 64 bits.
    sample_below: u64,
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
            url: config.traces_url.clone(),
            timeout: EXPORT_TIMEOUT,
            connect_timeout: Duration::from_secs(5),
            ca_file: config.ca_file.clone(),
        };
        let client = Exporting {
            upstream: Arc::new(Upstream::new(&collector).map_err(|e| TelemetryError(e.to_string()))?),
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
        // Every span started here is wanted: the sampling decision is made before (`begin`).
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(Sampler::AlwaysOn)
            .with_resource(resource)
            .build();
        let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "idemgate");
        let sample_below = (config.sample_ratio.clamp(0.0, 1.0) * u64::MAX as f64) as u64;
        Ok(Self { provider, tracer, sample_below })
    }

    /// The span of one request, when it is traced: continuing the client's trace (its
    /// `traceparent`) or starting one. `trusted`: the peer is a trusted proxy, whose sampling
    /// decision is believed.
    pub fn begin(&self, headers: &HeaderMap, trusted: bool, route: &str, method: &http::Method) -> Option<RequestSpan> {
        let parent = TraceContextPropagator::new().extract(&Headers(headers));
        let remote = parent.span().span_context().clone();
        let sampled = match remote.is_valid() {
            true if trusted => remote.is_sampled(),
            true => self.ratio(remote.trace_id().to_bytes()),
            // A new trace: its id is not made yet, and the same odds on a random draw will do.
            false => self.ratio(rand::random()),
        };
        if !sampled {
            return None;
        }
        // The client's trace, as sampled: the spans below are exported whatever its flag said.
        let parent = match remote.is_valid() {
            true => Context::new().with_remote_span_context(SpanContext::new(
                remote.trace_id(),
                remote.span_id(),
                TraceFlags::SAMPLED,
                true,
                remote.trace_state().clone(),
            )),
            false => Context::new(),
        };
        let span = self
            .tracer
            .span_builder(format!("{method} {route}"))
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("idemgate.route", route.to_owned()),
                KeyValue::new("http.request.method", method.to_string()),
            ])
            .start_with_context(&self.tracer, &parent);
        Some(RequestSpan { cx: parent.with_span(span), tracer: self.tracer.clone() })
    }

    fn ratio(&self, trace_id: [u8; 16]) -> bool {
        let low = u64::from_be_bytes([
            trace_id[8],
            trace_id[9],
            trace_id[10],
            trace_id[11],
            trace_id[12],
            trace_id[13],
            trace_id[14],
            trace_id[15],
        ]);
        self.sample_below == u64::MAX || low < self.sample_below
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

/// The exporter's HTTP client: the collector as an upstream, called on the gateway's runtime
/// (the batch processor exports from a thread of its own, outside any runtime).
#[derive(Debug)]
struct Exporting {
    upstream: Arc<Upstream>,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for Exporting {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let upstream = Arc::clone(&self.upstream);
        let call = async move {
            let response = tokio::time::timeout(EXPORT_TIMEOUT, upstream.send(request.map(body::full)))
                .await
                .map_err(|_| "the collector did not answer in time")??;
            let (parts, answer) = response.into_parts();
            let bytes = http_body_util::Limited::new(answer, MAX_ANSWER).collect().await?.to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, bytes))
        };
        self.runtime.spawn(call).await?
    }
}
