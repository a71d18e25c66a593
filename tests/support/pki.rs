//! A private PKI made by the test: a CA, a server certificate for 127.0.0.1 and localhost, and
//! a client certificate, as PEM files in a temporary directory.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// PEM files of a test CA (`ca.pem`), a server certificate (`server.pem`, `server.key`) for
/// 127.0.0.1 and localhost, and a client certificate (`client.pem`, `client.key`).
pub struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // Distinct names: OpenSSL (redis-server) takes a certificate whose issuer is its own
        // subject for self-signed, and rcgen names every certificate alike by default.
        ca_params.distinguished_name.push(DnType::CommonName, "idemgate test CA");
        let ca_key = KeyPair::generate().unwrap();
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        for (name, sans) in [("server", &["127.0.0.1", "localhost"][..]), ("client", &["gateway"][..])] {
            let key = KeyPair::generate().unwrap();
            let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
            let mut params = CertificateParams::new(sans).unwrap();
            params.distinguished_name.push(DnType::CommonName, format!("idemgate test {name}"));
            let cert = params.signed_by(&key, &ca).unwrap();
            std::fs::write(dir.path().join(format!("{name}.pem")), cert.pem()).unwrap();
            std::fs::write(dir.path().join(format!("{name}.key")), key.serialize_pem()).unwrap();
        }
        Self { dir }
    }

    /// One of the files: `ca.pem`, `server.pem`, `server.key`, `client.pem`, `client.key`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The directory holding the files (and free for logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// What a redis-server (or Sentinel) needs to serve TLS with the server certificate.
    pub fn server_files(&self) -> TlsFiles {
        TlsFiles { ca: self.path("ca.pem"), cert: self.path("server.pem"), key: self.path("server.key") }
    }
}

/// A server's TLS files: the CA it trusts (and its peers' certificates verify against), its
/// certificate and its key.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsFiles {
    /// The CA as PEM bytes, for a client that trusts it.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(&self.ca).unwrap_or_else(|e| panic!("cannot read {}: {e}", self.ca.display()))
    }
}
