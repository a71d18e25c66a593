//! The TLS client configuration of an upstream's pools: the roots of its `ca_file`, the system's
//! for an https upstream without one, or none.

use http::Uri;
use http::uri::Scheme;

use super::error::UpstreamSetupError;
use crate::config::UpstreamConfig;
use crate::outbound::{self, Roots, TlsSetupError};

/// The TLS configuration of `config`'s pool: its `ca_file`, else the system's roots for an
/// https upstream, else none.
pub(super) fn tls_config(config: &UpstreamConfig) -> Result<rustls::ClientConfig, UpstreamSetupError> {
    let roots = match &config.ca_file {
        Some(path) => Roots::PemFile(path),
        None if config.urls.first().and_then(Uri::scheme) == Some(&Scheme::HTTPS) => Roots::System,
        None => Roots::None,
    };
    outbound::tls_config(roots).map_err(|e| {
        let upstream = config.name.clone();
        match e {
            TlsSetupError::CaFile(detail) => UpstreamSetupError::CaFile { upstream, detail },
            TlsSetupError::NoSystemRoots => {
                UpstreamSetupError::Tls { upstream, detail: "no system CA certificates found; set ca_file".into() }
            }
            TlsSetupError::Protocol(detail) => UpstreamSetupError::Tls { upstream, detail },
        }
    })
}
