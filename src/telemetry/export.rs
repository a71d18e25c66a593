//! The way out of the process for spans: a queue bounded at `MAX_QUEUE` (what it drops is
//! counted and said once a while), the exporter's outcomes counted, and its HTTP client, the
//! collector called as an upstream on the gateway's runtime.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::BodyExt;
use opentelemetry::Context;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter, SpanProcessor};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::body;
use crate::upstream::{Upstream, UpstreamError};

use super::{DropReason, EXPORT_TIMEOUT, MAX_ANSWER, MAX_QUEUE, SAY_DROPS_EVERY};

/// Spans handed to the batch processor and not yet exported or given up: what bounds the
/// queue, and the counters and log of what was dropped.
#[derive(Debug)]
pub(super) struct Queue {
    pub(super) pending: AtomicUsize,
    pub(super) dropped: Family<DropReason, Counter>,
    pub(super) said: Mutex<Option<std::time::Instant>>,
}

impl Queue {
    pub(super) fn new(dropped: Family<DropReason, Counter>) -> Self {
        Self { pending: AtomicUsize::new(0), dropped, said: Mutex::new(None) }
    }

    /// Takes a place in the queue, if there is one.
    pub(super) fn admit(&self) -> bool {
        self.pending.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < MAX_QUEUE).then_some(n + 1)).is_ok()
    }

    /// `spans` left the queue (exported, or given up).
    pub(super) fn left(&self, spans: usize) {
        let _ = self.pending.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_sub(spans)));
    }

    /// Counts `spans` dropped for `reason`, and says so at most once per interval.
    pub(super) fn dropped(&self, reason: &'static str, spans: usize, why: &dyn std::fmt::Display) {
        self.dropped.get_or_create(&DropReason { reason }).inc_by(spans as u64);
        let mut said = self.said.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if said.is_none_or(|at| at.elapsed() >= SAY_DROPS_EVERY) {
            *said = Some(std::time::Instant::now());
            tracing::warn!(reason, spans, error = %why, "telemetry: spans dropped (counted in idemgate_telemetry_spans_dropped_total; said at most every 10 s)");
        }
    }
}

/// The batch processor behind a bounded queue: a span that finds the queue full is dropped
/// here, counted, instead of silently there.
#[derive(Debug)]
pub(super) struct Bounded<P> {
    pub(super) inner: P,
    pub(super) queue: Arc<Queue>,
}

impl<P: SpanProcessor> SpanProcessor for Bounded<P> {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.queue.admit() {
            self.inner.on_end(span);
        } else {
            self.queue.dropped("queue_full", 1, &format_args!("{MAX_QUEUE} spans are waiting for the collector"));
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The exporter, counting what leaves the queue and what an export that failed lost.
#[derive(Debug)]
pub(super) struct Counted<E> {
    pub(super) inner: E,
    pub(super) queue: Arc<Queue>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let result = self.inner.export(batch).await;
        self.queue.left(spans);
        if let Err(e) = &result {
            self.queue.dropped("export_failed", spans, e);
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The exporter's HTTP client: the collector as an upstream, called on the gateway's runtime
/// (the batch processor exports from a thread of its own, outside any runtime).
#[derive(Debug)]
pub(super) struct Exporting {
    pub(super) upstream: Arc<Upstream>,
    pub(super) runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for Exporting {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let upstream = Arc::clone(&self.upstream);
        let call = async move {
            let deadline = tokio::time::Instant::now() + EXPORT_TIMEOUT;
            let response = match upstream.send(request.map(body::full), deadline).await {
                Err(UpstreamError::Timeout { .. }) => return Err("the collector did not answer in time".into()),
                answered => answered?,
            };
            let (parts, answer) = response.into_parts();
            let bytes = http_body_util::Limited::new(answer, MAX_ANSWER).collect().await?.to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, bytes))
        };
        self.runtime.spawn(call).await?
    }
}
