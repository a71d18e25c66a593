//! What every outgoing HTTP client shares (the upstream pools, `idemgate keys`): the TLS
//! configuration with its roots, and an error told with its causes.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// Where the certificates that a client trusts come from.
#[derive(Debug, Clone, Copy)]
pub enum Roots<'a> {
    /// None: a cleartext client, whose TLS half is never used.
    None,
    /// The system's store (`SSL_CERT_FILE` and `SSL_CERT_DIR` are honoured).
    System,
    /// A PEM bundle.
    PemFile(&'a Path),
}

/// Why a client's TLS could not be set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsSetupError {
    /// The PEM bundle cannot be read or holds no certificate; the detail names the file.
    CaFile(String),
    /// The system's store holds no certificate.
    NoSystemRoots,
    /// rustls refused the configuration.
    Protocol(String),
}

/// A client configuration trusting `roots`, on the ring provider with rustls's safe defaults.
pub fn tls_config(roots: Roots<'_>) -> Result<rustls::ClientConfig, TlsSetupError> {
    let mut store = rustls::RootCertStore::empty();
    match roots {
        Roots::None => {}
        Roots::System => {
            // Reading the system's store is not free: only a client that needs it does.
            store.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            if store.is_empty() {
                return Err(TlsSetupError::NoSystemRoots);
            }
        }
        Roots::PemFile(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| TlsSetupError::CaFile(format!("cannot read {}: {e}", path.display())))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| TlsSetupError::CaFile(format!("{}: {e}", path.display())))?;
            if certs.is_empty() {
                return Err(TlsSetupError::CaFile(format!("{} holds no PEM certificates", path.display())));
            }
            for cert in certs {
                store.add(cert).map_err(|e| TlsSetupError::CaFile(e.to_string()))?;
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsSetupError::Protocol(e.to_string()))?
        .with_root_certificates(store)
        .with_no_client_auth())
}

/// An error and its causes, which hyper keeps apart: "client error (Connect): tcp connect
/// error: Connection refused (os error 111)".
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_names_every_cause_and_a_bundle_without_certificates_is_refused() {
        let inner = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let outer = std::io::Error::other(Wrapped(inner));
        assert_eq!(error_chain(&outer), "wrapped: refused");
        let dir = std::env::temp_dir().join(format!("idemgate-outbound-{}", std::process::id()));
        std::fs::write(&dir, "not a certificate\n").unwrap();
        let refused = tls_config(Roots::PemFile(&dir));
        let _ = std::fs::remove_file(&dir);
        assert!(matches!(refused, Err(TlsSetupError::CaFile(detail)) if detail.contains("no PEM certificates")));
        assert!(tls_config(Roots::None).is_ok());
    }

    #[derive(Debug)]
    struct Wrapped(std::io::Error);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("wrapped")
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
}
