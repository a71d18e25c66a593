//! The proxy listener's certificate and key (`[server.tls]`): read and paired when the
//! configuration loads, so that `check` and a reload refuse a bad pair before anything
//! changes, and what was checked is what serves (the files are not read a second time).
//!
//! rustls, offering h2 and http/1.1 by ALPN. A renewed certificate is picked up by a reload,
//! which loads the file, and with it the pair, again.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;
use tokio_rustls::TlsAcceptor;

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

/// `[server.tls]`: the certificate chain and key files, and the server configuration read
/// from them.
#[derive(Clone)]
pub struct ListenerTls {
    /// Certificate chain, leaf first.
    pub cert: PathBuf,
    /// The leaf's private key.
    pub key: PathBuf,
    server: Arc<rustls::ServerConfig>,
}

impl ListenerTls {
    /// Reads and pairs the files.
    pub fn load(cert: PathBuf, key: PathBuf) -> Result<Self, TlsError> {
        let cert_path = cert.display().to_string();
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert)
            .and_then(|certs| certs.collect::<Result<_, _>>())
            .map_err(|e| TlsError::Cert { path: cert_path.clone(), detail: e.to_string() })?;
        if certs.is_empty() {
            return Err(TlsError::Cert { path: cert_path, detail: "holds no PEM certificate".into() });
        }
        let private = PrivateKeyDer::from_pem_file(&key)
            .map_err(|e| TlsError::Key { path: key.display().to_string(), detail: e.to_string() })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Rustls(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(certs, private)
            .map_err(|e| TlsError::Rustls(e.to_string()))?;
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self { cert, key, server: Arc::new(server) })
    }

    /// An acceptor for the listener.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(&self.server))
    }
}

impl fmt::Debug for ListenerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListenerTls").field("cert", &self.cert).field("key", &self.key).finish_non_exhaustive()
    }
}

/// Two listener settings are the same when they name the same files.
impl PartialEq for ListenerTls {
    fn eq(&self, other: &Self) -> bool {
        self.cert == other.cert && self.key == other.key
    }
}

impl Eq for ListenerTls {}
