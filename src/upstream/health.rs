//! Health: what an instance's exchanges say about it, noted where each is learned — a
//! connection made or not in the connector ([`super::dial`]), an answer, a refused stream or a
//! broken exchange where the request is sent — for the balancer ([`Load`]), the instance's
//! metrics and the log.
//!
//! Connects are noted in the connector, not where the request fails, because the request
//! may never learn of them: the pool races a kept connection against a new dial, and a dial
//! that loses goes on in the background; a dial cut short by the request's deadline is told
//! here before the request is.
//!
//! Broken exchanges and gateway errors (502, 503, 504) count only on an upstream that may
//! have several instances: the one instance of an upstream is never left out, and they would
//! only make noise there. Whatever is noted, nothing is ever sent again because of it: what
//! the balancer learns decides only where the next requests go.

use std::sync::Arc;

use http::StatusCode;
use tokio::time::Instant;

use super::balance::{Load, Trouble};
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
    /// Whether broken exchanges and gateway errors count.
    outliers: bool,
}

impl Health {
    /// `outliers`: whether broken exchanges and gateway errors count (an upstream that may
    /// have several instances).
    pub(super) fn new(
        upstream: &str,
        label: &str,
        rule: Ejection,
        outliers: bool,
        metrics: Option<InstanceMetrics>,
    ) -> Self {
        let load = Arc::new(Load::default());
        Self { upstream: upstream.to_owned(), label: label.to_owned(), load, metrics, rule, outliers }
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
        self.failed(Trouble::Connect);
    }

    /// It answered with `status`'s head: a success, but for a gateway error (502, 503, 504),
    /// which counts toward `eject_after_gateway_errors` and must not end that run. An
    /// instance that never failed takes no lock: this runs once per request.
    pub(super) fn answered(&self, status: StatusCode) {
        let gateway_error = matches!(status.as_u16(), 502..=504);
        if !(gateway_error && self.outliers) {
            return self.load.answered();
        }
        if let Some(metrics) = &self.metrics {
            metrics.gateway_error.inc();
        }
        if self.rule.after_gateway_errors == 0 {
            // Not counted: an answer, as any other.
            return self.load.answered();
        }
        self.failed(Trouble::Gateway);
    }

    /// It refused an HTTP/2 stream (`REFUSED_STREAM`): it is up, and did not process the
    /// request.
    pub(super) fn refused(&self) {
        if let Some(metrics) = &self.metrics {
            metrics.refused.inc();
        }
    }

    /// The exchange broke after the request may have been written, before any answer; by the
    /// instance's doing (a reset, a close, something that is not HTTP) unless `ours` (the
    /// request's own body failed: the client's upload broke off).
    pub(super) fn broke(&self, ours: bool) {
        if let Some(metrics) = &self.metrics {
            metrics.broken.inc();
        }
        if self.outliers && !ours {
            self.failed(Trouble::Broken);
        }
    }

    /// Notes `trouble`; when that leaves the instance out, says so, with why.
    fn failed(&self, trouble: Trouble) {
        let Some(out_for) = self.load.failed(trouble, &self.rule, Instant::now()) else { return };
        if let Some(metrics) = &self.metrics {
            metrics.ejections.inc();
            metrics.ejected(trouble.reason());
        }
        let (upstream, instance, reason, running) =
            (&self.upstream, &self.label, trouble.reason(), trouble.after(&self.rule));
        // The target these lines always had, whatever file says them: operators filter on it.
        match trouble {
            Trouble::Connect => tracing::warn!(
                target: "idemgate::upstream",
                %upstream, %instance, reason, out_for = ?out_for,
                "an instance failed to connect {running} times running; left out for {out_for:?}"
            ),
            Trouble::Broken => tracing::warn!(
                target: "idemgate::upstream",
                %upstream, %instance, reason, out_for = ?out_for,
                "an instance broke {running} exchanges running (reset or closed before any answer); left out for {out_for:?}"
            ),
            Trouble::Gateway => tracing::warn!(
                target: "idemgate::upstream",
                %upstream, %instance, reason, out_for = ?out_for,
                "an instance answered {running} gateway errors (502, 503, 504) running; left out for {out_for:?}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const RULE: Ejection = Ejection {
        after: 3,
        after_broken: 2,
        after_gateway_errors: 2,
        base: Duration::from_secs(5),
        max: Duration::from_secs(5),
    };

    #[test]
    fn gateway_errors_and_broken_exchanges_leave_out_only_one_of_several_and_only_the_instances_doing() {
        let now = Instant::now();
        let several = Health::new("app", "10.0.0.5:3000", RULE, true, None);
        several.answered(StatusCode::BAD_GATEWAY);
        several.answered(StatusCode::SERVICE_UNAVAILABLE);
        assert!(several.load.out(now), "two gateway errors running");
        several.answered(StatusCode::NOT_FOUND);
        assert!(!several.load.out(now), "any other answer is a success");
        // A request whose own body failed says nothing about the instance.
        several.broke(true);
        several.broke(true);
        assert!(!several.load.out(now));
        several.broke(false);
        several.broke(false);
        assert!(several.load.out(now));
        // The one instance of an upstream: as before, only connects count.
        let lone = Health::new("app", "10.0.0.5:3000", RULE, false, None);
        for _ in 0..10 {
            lone.answered(StatusCode::GATEWAY_TIMEOUT);
            lone.broke(false);
        }
        assert!(!lone.load.out(now));
        for _ in 0..3 {
            lone.dial_failed();
        }
        assert!(lone.load.out(now));
    }
}
