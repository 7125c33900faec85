//! TLS for gpuledger's listeners and its HTTP clients, with rustls on ring.
//!
//! A listener is given a PEM certificate chain and a PEM private key ([`server_config`]). The
//! files are read again when either changes (checked at each handshake, one `stat` per file),
//! so a certificate renewed by cert-manager or certbot is served without a restart; a renewal
//! caught half-written keeps the previous pair and is retried at the next handshake.
//!
//! A client trusts the Mozilla roots, or only the CAs of a PEM file when given one
//! ([`client_tls`]): a cluster's private CA.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("{path}: not PEM: {message}")]
    Pem { path: String, message: String },
    #[error("{path}: no certificate in it (expected PEM `BEGIN CERTIFICATE` sections)")]
    NoCertificate { path: String },
    #[error("{path}: no private key in it (expected a PEM PKCS#8, PKCS#1 or SEC1 key)")]
    NoKey { path: String },
    #[error("{key}: not a key that can serve {cert}: {message}")]
    Key {
        cert: String,
        key: String,
        message: String,
    },
    #[error("TLS: {0}")]
    Rustls(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server configuration serving the certificate chain in `cert` with the key in `key`
/// (HTTP/1.1 over TLS 1.2 or 1.3), both reloaded when they change on disk.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>> {
    let resolver = ReloadingCert::load(cert, key)?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Rustls(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// What a client trusts: the CAs in the PEM file `ca_file`, or else the Mozilla roots.
pub fn client_tls(ca_file: Option<&Path>) -> Result<ureq::tls::TlsConfig> {
    let builder = ureq::tls::TlsConfig::builder().provider(ureq::tls::TlsProvider::Rustls);
    let Some(path) = ca_file else {
        return Ok(builder.build());
    };
    let pem = read(path)?;
    let roots: Vec<ureq::tls::Certificate<'static>> = CertificateDer::pem_slice_iter(&pem)
        .map(|c| c.map(|der| ureq::tls::Certificate::from_der(&der).to_owned()))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| pem_error(path, &e))?;
    if roots.is_empty() {
        return Err(Error::NoCertificate { path: shown(path) });
    }
    Ok(builder
        .root_certs(ureq::tls::RootCerts::new_with_certs(&roots))
        .build())
}

/// The listener's certificate: the pair last read whole, and when each file was written.
struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Loaded>,
}

#[derive(Clone)]
struct Loaded {
    key: Arc<CertifiedKey>,
    written: (Option<SystemTime>, Option<SystemTime>),
}

impl fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert", &self.cert_path)
            .field("key", &self.key_path)
            .finish_non_exhaustive()
    }
}

impl ReloadingCert {
    fn load(cert: &Path, key: &Path) -> Result<Self> {
        let written = (modified(cert), modified(key));
        let key_pair = certified_key(cert, key)?;
        Ok(ReloadingCert {
            cert_path: cert.to_owned(),
            key_path: key.to_owned(),
            current: RwLock::new(Loaded {
                key: key_pair,
                written,
            }),
        })
    }

    /// The pair to serve now, read again first if either file changed since.
    fn current(&self) -> Arc<CertifiedKey> {
        let written = (modified(&self.cert_path), modified(&self.key_path));
        let loaded = self
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if loaded.written == written {
            return loaded.key;
        }
        match certified_key(&self.cert_path, &self.key_path) {
            Ok(key) => {
                tracing::info!(cert = %self.cert_path.display(), "TLS certificate reloaded");
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = Loaded {
                    key: Arc::clone(&key),
                    written,
                };
                key
            }
            Err(error) => {
                tracing::warn!(%error, "TLS certificate changed but cannot be loaded; serving the previous one");
                loaded.key
            }
        }
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn certified_key(cert_path: &Path, key_path: &Path) -> Result<Arc<CertifiedKey>> {
    let cert_pem = read(cert_path)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| pem_error(cert_path, &e))?;
    if chain.is_empty() {
        return Err(Error::NoCertificate {
            path: shown(cert_path),
        });
    }
    let key_pem = read(key_path)?;
    let key = match PrivateKeyDer::from_pem_slice(&key_pem) {
        Ok(key) => key,
        Err(rustls_pki_types::pem::Error::NoItemsFound) => {
            return Err(Error::NoKey {
                path: shown(key_path),
            })
        }
        Err(e) => return Err(pem_error(key_path, &e)),
    };
    let pair = CertifiedKey::from_der(chain, key, &provider()).map_err(|e| Error::Key {
        cert: shown(cert_path),
        key: shown(key_path),
        message: e.to_string(),
    })?;
    Ok(Arc::new(pair))
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|error| Error::Io {
        path: shown(path),
        error,
    })
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn pem_error(path: &Path, error: &rustls_pki_types::pem::Error) -> Error {
    Error::Pem {
        path: shown(path),
        message: error.to_string(),
    }
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let key = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let cert_path = dir.join(format!("{name}.crt"));
        let key_path = dir.join(format!("{name}.key"));
        std::fs::write(&cert_path, key.cert.pem()).unwrap();
        std::fs::write(&key_path, key.signing_key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    #[test]
    fn a_renewed_certificate_is_served_and_a_half_written_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = self_signed(dir.path(), "a");
        let reloading = ReloadingCert::load(&cert, &key).unwrap();
        let first = reloading.current().cert[0].to_vec();

        let (cert_b, key_b) = self_signed(dir.path(), "b");
        std::fs::copy(&cert_b, &cert).unwrap();
        std::fs::copy(&key_b, &key).unwrap();
        bump_mtime(&cert);
        let second = reloading.current().cert[0].to_vec();
        assert_ne!(first, second, "the renewed certificate is served");
        assert_eq!(second, std::fs::read(&cert_b).map(|pem| der(&pem)).unwrap());

        std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\nMIIB").unwrap();
        bump_mtime(&cert);
        assert_eq!(reloading.current().cert[0].to_vec(), second);
        assert!(server_config(&cert_b, &key_b).is_ok());
    }

    fn der(pem: &[u8]) -> Vec<u8> {
        CertificateDer::from_pem_slice(pem).unwrap().to_vec()
    }

    /// Sets a file's mtime a second ahead, so a change within one clock tick is still seen.
    fn bump_mtime(path: &Path) {
        let file = std::fs::File::options().write(true).open(path).unwrap();
        let later = modified(path).unwrap() + std::time::Duration::from_secs(1);
        file.set_modified(later).unwrap();
    }

    #[test]
    fn bad_files_are_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = self_signed(dir.path(), "a");
        let (_, other_key) = self_signed(dir.path(), "b");
        let missing = dir.path().join("missing.pem");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();

        let message = |c: &Path, k: &Path| server_config(c, k).unwrap_err().to_string();
        assert!(message(&missing, &key).starts_with(&missing.display().to_string()));
        assert!(message(&empty, &key).contains("no certificate in it"));
        assert!(message(&cert, &empty).contains("no private key in it"));
        assert!(message(&key, &key).contains("no certificate"));
        let mismatch = message(&cert, &other_key);
        assert!(
            mismatch.starts_with(&format!(
                "{}: not a key that can serve",
                other_key.display()
            )),
            "{mismatch}"
        );
        assert!(client_tls(Some(&empty))
            .unwrap_err()
            .to_string()
            .contains("no certificate"));
        assert!(client_tls(Some(&cert)).is_ok());
        assert!(client_tls(None).is_ok());
    }
}
