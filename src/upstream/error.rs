//! Why an exchange with an upstream failed, as its callers are told ([`UpstreamError`]) and as
//! the balancer needs it told ([`Failure`]); why an upstream could not be set up at start.

use std::time::Duration;

use thiserror::Error;

/// Why an exchange with the upstream failed.
#[derive(Debug, Error)]
pub enum UpstreamError {
    /// No connection could be made (refused, DNS, TLS handshake).
    #[error("upstream {upstream} unreachable: {detail}")]
    Unreachable {
        /// Upstream name.
        upstream: String,
        /// The underlying error.
        detail: String,
    },
    /// The upstream did not answer within its timeout.
    #[error("upstream {upstream} did not answer within {timeout:?}")]
    Timeout {
        /// Upstream name.
        upstream: String,
        /// The configured timeout.
        timeout: Duration,
    },
    /// The connection broke or the upstream sent something that is not HTTP.
    #[error("upstream {upstream} failed: {detail}")]
    Failed {
        /// Upstream name.
        upstream: String,
        /// The underlying error.
        detail: String,
    },
}

impl UpstreamError {
    /// Whether the request certainly never reached the upstream. Only a connection that was
    /// never made proves it: once bytes were written, a reset, a timeout or a broken answer
    /// leaves the outcome unknown.
    pub fn never_sent(&self) -> bool {
        matches!(self, Self::Unreachable { .. })
    }
}

/// Why an exchange with one instance failed, as the balancer needs it told.
pub(super) enum Failure {
    /// No connection could be made: never sent.
    Connect(hyper_util::client::legacy::Error),
    /// The instance refused the stream (`REFUSED_STREAM`): never processed.
    Refused(hyper_util::client::legacy::Error),
    /// Anything after the request may have been written: the outcome is unknown.
    Sent(hyper_util::client::legacy::Error),
}

impl Failure {
    pub(super) fn of(e: hyper_util::client::legacy::Error) -> Self {
        if e.is_connect() {
            return Self::Connect(e);
        }
        // RFC 9113 §8.7: a stream the instance reset with REFUSED_STREAM was not processed
        // and may be sent again, elsewhere too.
        // Hazard: a stream above the last id of a GOAWAY was not processed either, but hyper
        // cannot say which streams those are. Its HTTP/2 client queues a request's HEADERS,
        // then asks the connection whether it is still ready; a GOAWAY that lands between the
        // two fails that request with the GOAWAY's error although its stream is at or below
        // the last id and goes out (the instance runs it). Taken as refused, such a request
        // ran on two instances (tests/instances.rs). So a GOAWAY's error is `Sent`: unknown.
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            if let Some(h2) = c.downcast_ref::<h2::Error>() {
                if h2.is_reset() && h2.is_remote() && h2.reason() == Some(h2::Reason::REFUSED_STREAM) {
                    return Self::Refused(e);
                }
                break;
            }
            cause = c.source();
        }
        Self::Sent(e)
    }
}

/// Whether an exchange broke by the gateway's side: the request's own body failed (a client
/// whose upload broke off on a pass-through route), which says nothing about the instance.
pub(super) fn ours(e: &hyper_util::client::legacy::Error) -> bool {
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(hyper) = c.downcast_ref::<hyper::Error>() {
            return hyper.is_user();
        }
        cause = c.source();
    }
    false
}

/// Why an upstream could not be set up at start.
#[derive(Debug, Error)]
pub enum UpstreamSetupError {
    /// The CA bundle could not be read.
    #[error("upstreams.{upstream}.ca_file: {detail}")]
    CaFile {
        /// Upstream name.
        upstream: String,
        /// What went wrong.
        detail: String,
    },
    /// TLS could not be configured.
    #[error("upstreams.{upstream}: TLS setup failed: {detail}")]
    Tls {
        /// Upstream name.
        upstream: String,
        /// What went wrong.
        detail: String,
    },
}
