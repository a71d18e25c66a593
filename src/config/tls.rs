//! The proxy listener's certificates and keys (`[server.tls]`, and `[[server.tls.certs]]`
//! chosen by SNI): read and paired when the configuration loads, so that `check` and a reload
//! refuse a bad pair, or a certificate that does not cover the hosts that select it, before
//! anything changes, and what was checked is what serves (the files are not read a second
//! time).
//!
//! rustls, offering h2 and http/1.1 by ALPN. A renewed certificate is picked up by a reload,
//! which loads the files, and with them the pairs, again.
//!
//! The hazard with several certificates: a client may send on one connection requests for
//! every host its certificate covers (RFC 9113 §9.1.1), so the certificate served, not the SNI
//! sent, says which hosts a connection may ask for; the gateway answers 421 to the others
//! ([`ListenerTls::served`]).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use thiserror::Error;
use tokio_rustls::TlsAcceptor;

use crate::host::{self, HostPattern};

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
    /// A certificate chosen for a host is not valid for it: every client would refuse it.
    #[error(
        "certificate {path} is not valid for {host}, which selects it (its names, or a wildcard of them, must cover the host)"
    )]
    Uncovered {
        /// The file.
        path: String,
        /// The host.
        host: String,
    },
}

/// `[server.tls]`: the default certificate chain and key files, the certificates chosen by
/// SNI (`[[server.tls.certs]]`), and the server configuration read from them.
#[derive(Clone)]
pub struct ListenerTls {
    /// Certificate chain, leaf first.
    pub cert: PathBuf,
    /// The leaf's private key.
    pub key: PathBuf,
    /// Certificates for named hosts, chosen by the name a client sends (SNI).
    pub by_host: Vec<HostCert>,
    server: Arc<rustls::ServerConfig>,
    certificates: Arc<Certificates>,
}

/// `[[server.tls.certs]]`: a certificate for some hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCert {
    /// The hosts whose name selects it (exact, or `*.domain`).
    pub hosts: Vec<HostPattern>,
    /// Certificate chain, leaf first.
    pub cert: PathBuf,
    /// The leaf's private key.
    pub key: PathBuf,
}

impl ListenerTls {
    /// Reads and pairs the files of a listener with one certificate.
    pub fn load(cert: PathBuf, key: PathBuf) -> Result<Self, TlsError> {
        Self::load_all(cert, key, Vec::new())
    }

    /// Reads and pairs the default certificate and each of `by_host`, and checks that each
    /// covers the hosts that select it.
    pub fn load_all(cert: PathBuf, key: PathBuf, by_host: Vec<HostCert>) -> Result<Self, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let default = Served::load(&cert, &key, &provider)?;
        let mut certificates =
            Certificates { default: Arc::new(default), exact: HashMap::new(), wildcards: Vec::new(), several: false };
        for entry in &by_host {
            let served = Arc::new(Served::load(&entry.cert, &entry.key, &provider)?);
            for host in &entry.hosts {
                // A wildcard covers one label in a certificate (RFC 6125 §6.4.3): a name one
                // label under the domain is what it must cover.
                let probe = match host {
                    HostPattern::Exact(name) => name.clone(),
                    HostPattern::Wildcard(suffix) => format!("any{suffix}"),
                };
                if !served.covers(&probe) {
                    return Err(TlsError::Uncovered { path: entry.cert.display().to_string(), host: host.to_string() });
                }
                match host {
                    HostPattern::Exact(name) => {
                        certificates.exact.insert(name.clone(), Arc::clone(&served));
                    }
                    HostPattern::Wildcard(_) => certificates.wildcards.push((host.clone(), Arc::clone(&served))),
                }
            }
        }
        // The longest domain first, as routes match.
        certificates.wildcards.sort_by_key(|(host, _)| std::cmp::Reverse(host.to_string().len()));
        certificates.several = !by_host.is_empty();
        let certificates = Arc::new(certificates);
        let mut server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Rustls(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(&certificates) as Arc<dyn ResolvesServerCert>);
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self { cert, key, by_host, server: Arc::new(server), certificates })
    }

    /// An acceptor for the listener.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(&self.server))
    }

    /// The certificate served on a connection whose client sent `sni`, when the listener
    /// has several (with one, every connection is served the same, and nothing is compared).
    pub fn served(&self, sni: Option<&str>) -> Option<Arc<Served>> {
        self.certificates.several.then(|| Arc::clone(self.certificates.choose(sni)))
    }
}

/// The listener's certificates by the name a client asks for: exact names, then wildcards
/// (the longest domain first), then the default, which is also what a client without SNI
/// gets. rustls's own resolver knows exact names only.
#[derive(Debug)]
struct Certificates {
    default: Arc<Served>,
    exact: HashMap<String, Arc<Served>>,
    wildcards: Vec<(HostPattern, Arc<Served>)>,
    several: bool,
}

impl Certificates {
    fn choose(&self, sni: Option<&str>) -> &Arc<Served> {
        let Some(name) = sni.and_then(host::normalize) else { return &self.default };
        self.exact
            .get(name.as_ref())
            .or_else(|| self.wildcards.iter().find(|(w, _)| w.matches(&name)).map(|(_, served)| served))
            .unwrap_or(&self.default)
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.choose(hello.server_name()).key))
    }
}

/// One certificate the listener serves, with its key.
pub struct Served {
    key: Arc<CertifiedKey>,
}

impl Served {
    fn load(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<Self, TlsError> {
        let cert_path = cert.display().to_string();
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect::<Result<_, _>>())
            .map_err(|e| TlsError::Cert { path: cert_path.clone(), detail: e.to_string() })?;
        if certs.is_empty() {
            return Err(TlsError::Cert { path: cert_path, detail: "holds no PEM certificate".into() });
        }
        if webpki::EndEntityCert::try_from(&certs[0]).is_err() {
            return Err(TlsError::Cert { path: cert_path, detail: "its first certificate cannot be parsed".into() });
        }
        let private = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| TlsError::Key { path: key.display().to_string(), detail: e.to_string() })?;
        let certified = CertifiedKey::from_der(certs, private, provider)
            .map_err(|e| TlsError::Rustls(format!("{cert_path}: {e}")))?;
        Ok(Self { key: Arc::new(certified) })
    }

    /// Whether this certificate is valid for `host` (normalised): the test a client applies
    /// before it reuses a connection for another host (RFC 9110 §4.3.4, RFC 9113 §9.1.1).
    pub fn covers(&self, host: &str) -> bool {
        let Some(leaf) = self.key.cert.first() else { return false };
        let Ok(leaf) = webpki::EndEntityCert::try_from(leaf) else { return false };
        let name = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        ServerName::try_from(name).is_ok_and(|name| leaf.verify_is_valid_for_subject_name(&name).is_ok())
    }
}

impl fmt::Debug for Served {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Served").finish_non_exhaustive()
    }
}

impl fmt::Debug for ListenerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListenerTls").field("cert", &self.cert).field("key", &self.key).finish_non_exhaustive()
    }
}

/// Two listener settings are the same when they name the same files for the same hosts.
impl PartialEq for ListenerTls {
    fn eq(&self, other: &Self) -> bool {
        self.cert == other.cert && self.key == other.key && self.by_host == other.by_host
    }
}

impl Eq for ListenerTls {}
