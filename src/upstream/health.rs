//! Health: what an instance's exchanges say about it, noted where each is learned — a
//! connection made or not in the connector ([`super::dial`]), an answer, a refused stream or a
//! broken exchange where the request is sent — for the balancer ([`Load`]), the instance's
//! metrics and the log.
//!
//! Connects are noted in the connector, not where the request fails, because the request
//! may never learn of them: the pool races a kept connection against a new dial, and a dial
//! that loses goes on in the background; a dial cut short by the request's deadline is told
//! here before the request is.

use std::sync::Arc;

use http::StatusCode;
use tokio::time::Instant;

use super::balance::Load;
use crate::config::Ejection;
use crate::metrics::InstanceMetrics;

/// One instance's health, shared by its pool's connector and the requests sent to it.
pub(super) struct Health {
    upstream: String,
    label: String,
    /// What the balancer reads.
    pub(super) load: Arc<Load>,
    /// Its series, on an upstream with several instances.
    pub(super) metrics: Option<InstanceMetrics>,
    rule: Ejection,
}

impl Health {
    pub(super) fn new(upstream: &str, label: &str, rule: Ejection, metrics: Option<InstanceMetrics>) -> Self {
        Self { upstream: upstream.to_owned(), label: label.to_owned(), load: Arc::new(Load::default()), metrics, rule }
    }

    /// A connection was made.
    pub(super) fn dialed(&self) {
        self.load.dialed();
    }

    /// No connection could be made (refused, unreachable, TLS, or none within the time the
    /// dial had). Left out after `eject_after` running.
    pub(super) fn dial_failed(&self) {
        if let Some(metrics) = &self.metrics {
            metrics.connect_failed.inc();
        }
        if let Some(out_for) = self.load.failed(&self.rule, Instant::now()) {
            if let Some(metrics) = &self.metrics {
                metrics.ejections.inc();
            }
            tracing::warn!(
                upstream = %self.upstream,
                instance = %self.label,
                out_for = ?out_for,
                "an instance failed to connect {} times running; left out for {out_for:?}",
                self.rule.after
            );
        }
    }

    /// It answered with `status`'s head: a success.
    pub(super) fn answered(&self, _status: StatusCode) {
        self.load.answered();
    }

    /// It refused an HTTP/2 stream, or left it above a GOAWAY: it is up, and did not process
    /// the request.
    pub(super) fn refused(&self) {
        if let Some(metrics) = &self.metrics {
            metrics.refused.inc();
        }
    }

    /// The exchange broke after the request may have been written.
    pub(super) fn broke(&self) {
        if let Some(metrics) = &self.metrics {
            metrics.broken.inc();
        }
    }
}
