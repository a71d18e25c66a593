//! TLS on the proxy listener (`[server.tls]`): rustls, offering h2 and http/1.1 by ALPN.
//!
//! The certificate and key are read when the server starts and again on every reload, so a
//! renewed certificate is picked up with SIGHUP. The handshake counts against the header
//! timeout: a client that opens a connection and never finishes it is dropped like a silent
//! one.

use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;
use tokio_rustls::TlsAcceptor;

use crate::config::ListenerTls;

/// Why the listener's TLS could not be set up.
#[derive(Debug, Error)]
pub enum TlsError {
    /// The certificate file is unreadable or holds no certificate.
    #[error("certificate {path}: {detail}")]
    Cert {
        /// The file.
        path: String,
        /// What is wrong.
        detail: String,
    },
    /// The key file is unreadable or holds no key.
    #[error("key {path}: {detail}")]
    Key {
        /// The file.
        path: String,
        /// What is wrong.
        detail: String,
    },
    /// rustls refused the pair (the key does not match the certificate, say).
    #[error("{0}")]
    Rustls(String),
}

/// Builds the acceptor from the files named by `tls`.
pub fn acceptor(tls: &ListenerTls) -> Result<TlsAcceptor, TlsError> {
    let cert_path = tls.cert.display().to_string();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&tls.cert)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| TlsError::Cert { path: cert_path.clone(), detail: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::Cert { path: cert_path, detail: "holds no PEM certificate".into() });
    }
    let key = PrivateKeyDer::from_pem_file(&tls.key)
        .map_err(|e| TlsError::Key { path: tls.key.display().to_string(), detail: e.to_string() })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Rustls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Rustls(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
