//! TLS for gpuledger's listeners and its HTTP clients, with rustls on ring.
//!
//! A listener is given a PEM certificate chain and a PEM private key ([`server_config`]). The
//! files are read again when either changes (checked at each handshake, one `stat` per file),
//! so a certificate renewed by cert-manager or certbot is served without a restart; a renewal
//! caught half-written keeps the previous pair and is retried at the next handshake.
//!
//! A certificate that is not valid now (expired, or not yet valid) is refused, at start and at
//! reload (the previous pair is kept); [`certificate_metrics`] counts the refusals and gives the
//! served certificate's expiry, for every service's `/metrics`.
//!
//! A client trusts the Mozilla roots, or only the CAs of a PEM file when given one
//! ([`client_tls`]): a cluster's private CA.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
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
    /// The certificate is not valid now: expired, or not yet valid.
    #[error("{path}: {message}")]
    NotValidNow { path: String, message: String },
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
        SERVED_NOT_AFTER.store(not_after_of(&key_pair), Ordering::Relaxed);
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
                SERVED_NOT_AFTER.store(not_after_of(&key), Ordering::Relaxed);
                tracing::info!(cert = %self.cert_path.display(), "TLS certificate reloaded");
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = Loaded {
                    key: Arc::clone(&key),
                    written,
                };
                key
            }
            Err(error) => {
                RELOADS_REFUSED.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%error, "TLS certificate changed but cannot be loaded; serving the previous one");
                // Tried again once either file changes again, not at every handshake.
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = Loaded {
                    key: Arc::clone(&loaded.key),
                    written,
                };
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
    valid_now(cert_path, &chain[0], unix_now())?;
    let pair = CertifiedKey::from_der(chain, key, &provider()).map_err(|e| Error::Key {
        cert: shown(cert_path),
        key: shown(key_path),
        message: e.to_string(),
    })?;
    Ok(Arc::new(pair))
}

/// Certificates changed on disk but refused (unreadable, mismatched, expired or not yet valid),
/// by any listener of this process.
static RELOADS_REFUSED: AtomicU64 = AtomicU64::new(0);
/// When the certificate served last expires (Unix seconds); 0 before one is loaded.
static SERVED_NOT_AFTER: AtomicI64 = AtomicI64::new(0);

/// The listener certificate's lines for a service's `/metrics` (none when it serves plain
/// HTTP): the served certificate's expiry and the reloads refused. A process serves one
/// listener, so these are the process's own.
pub fn certificate_metrics() -> String {
    let not_after = SERVED_NOT_AFTER.load(Ordering::Relaxed);
    if not_after == 0 {
        return String::new();
    }
    format!(
        "# HELP gpuledger_tls_certificate_not_after_timestamp_seconds When the served TLS certificate expires.\n\
         # TYPE gpuledger_tls_certificate_not_after_timestamp_seconds gauge\n\
         gpuledger_tls_certificate_not_after_timestamp_seconds {not_after}\n\
         # HELP gpuledger_tls_certificate_reloads_refused_total Renewed certificates refused (unreadable, mismatched, expired or not yet valid); the previous one is still served.\n\
         # TYPE gpuledger_tls_certificate_reloads_refused_total counter\n\
         gpuledger_tls_certificate_reloads_refused_total {}\n",
        RELOADS_REFUSED.load(Ordering::Relaxed)
    )
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn not_after_of(key: &CertifiedKey) -> i64 {
    key.cert
        .first()
        .and_then(|leaf| validity(leaf))
        .map_or(0, |(_, not_after)| not_after)
}

/// Refuses a leaf certificate that is not valid at `now` (Unix seconds), or whose validity
/// cannot be read.
fn valid_now(path: &Path, leaf: &CertificateDer<'_>, now: i64) -> Result<()> {
    let refuse = |message: String| Error::NotValidNow {
        path: shown(path),
        message,
    };
    let (not_before, not_after) =
        validity(leaf).ok_or_else(|| refuse("its validity period does not read".into()))?;
    let at = |t: i64| {
        chrono::DateTime::from_timestamp(t, 0).map_or_else(|| t.to_string(), |d| d.to_rfc3339())
    };
    if now < not_before {
        return Err(refuse(format!("not valid before {}", at(not_before))));
    }
    if now > not_after {
        return Err(refuse(format!("expired at {}", at(not_after))));
    }
    Ok(())
}

/// The validity period (notBefore, notAfter as Unix seconds) of a DER X.509 certificate:
/// `Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL, serialNumber,
/// signature, issuer, validity SEQUENCE { notBefore, notAfter }, ... }, ... }`.
fn validity(der: &[u8]) -> Option<(i64, i64)> {
    let (tag, certificate, _) = der_element(der)?;
    (tag == 0x30).then_some(())?;
    let (tag, mut tbs, _) = der_element(certificate)?;
    (tag == 0x30).then_some(())?;
    let (tag, _, rest) = der_element(tbs)?;
    if tag == 0xa0 {
        tbs = rest;
    }
    // serialNumber, signature, issuer
    for _ in 0..3 {
        tbs = der_element(tbs)?.2;
    }
    let (tag, validity, _) = der_element(tbs)?;
    (tag == 0x30).then_some(())?;
    let (tag, not_before, rest) = der_element(validity)?;
    let not_before = der_time(tag, not_before)?;
    let (tag, not_after, _) = der_element(rest)?;
    Some((not_before, der_time(tag, not_after)?))
}

/// One DER element: its tag, its content and what follows it.
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let length = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > size_of::<usize>() || rest.len() < count {
            return None;
        }
        let (bytes, after) = rest.split_at(count);
        rest = after;
        bytes.iter().fold(0usize, |n, &b| (n << 8) | usize::from(b))
    };
    (rest.len() >= length).then(|| (tag, &rest[..length], &rest[length..]))
}

/// UTCTime (`YYMMDDHHMMSSZ`, years 1950-2049) or GeneralizedTime (`YYYYMMDDHHMMSSZ`).
fn der_time(tag: u8, content: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(content).ok()?;
    let digits = text.strip_suffix('Z')?;
    let full = match (tag, digits.len()) {
        (0x17, 12) => {
            let yy: u32 = digits[..2].parse().ok()?;
            let century = if yy >= 50 { "19" } else { "20" };
            format!("{century}{digits}")
        }
        (0x18, 14) => digits.to_owned(),
        _ => return None,
    };
    let parsed = chrono::NaiveDateTime::parse_from_str(&full, "%Y%m%d%H%M%S").ok()?;
    Some(parsed.and_utc().timestamp())
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

    /// A certificate for localhost valid from `from` to `to` (year, month, day).
    fn dated(dir: &Path, name: &str, from: (i32, u8, u8), to: (i32, u8, u8)) -> (PathBuf, PathBuf) {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.not_before = rcgen::date_time_ymd(from.0, from.1, from.2);
        params.not_after = rcgen::date_time_ymd(to.0, to.1, to.2);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let cert_path = dir.join(format!("{name}.crt"));
        let key_path = dir.join(format!("{name}.key"));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    #[test]
    fn a_certificate_not_valid_now_is_refused_at_start_and_at_reload() {
        let dir = tempfile::tempdir().unwrap();
        let (expired, expired_key) = dated(dir.path(), "old", (2000, 1, 1), (2001, 1, 1));
        let message = server_config(&expired, &expired_key)
            .unwrap_err()
            .to_string();
        assert_eq!(
            message,
            format!(
                "{}: expired at 2001-01-01T00:00:00+00:00",
                expired.display()
            )
        );
        let (early, early_key) = dated(dir.path(), "early", (2090, 6, 1), (2091, 1, 1));
        let message = server_config(&early, &early_key).unwrap_err().to_string();
        assert!(
            message.ends_with("not valid before 2090-06-01T00:00:00+00:00"),
            "{message}"
        );

        let (cert, key) = dated(dir.path(), "live", (2020, 1, 1), (2090, 1, 1));
        let reloading = ReloadingCert::load(&cert, &key).unwrap();
        let served = reloading.current().cert[0].to_vec();
        assert!(certificate_metrics().contains(&format!(
            "gpuledger_tls_certificate_not_after_timestamp_seconds {}\n",
            chrono::NaiveDate::from_ymd_opt(2090, 1, 1)
                .unwrap()
                .and_hms_opt(0, 0, 0)
                .unwrap()
                .and_utc()
                .timestamp()
        )));
        let refused_before = RELOADS_REFUSED.load(Ordering::Relaxed);
        std::fs::copy(&expired, &cert).unwrap();
        std::fs::copy(&expired_key, &key).unwrap();
        bump_mtime(&cert);
        assert_eq!(
            reloading.current().cert[0].to_vec(),
            served,
            "the previous pair is kept"
        );
        assert!(RELOADS_REFUSED.load(Ordering::Relaxed) > refused_before);
        assert!(certificate_metrics().contains("gpuledger_tls_certificate_reloads_refused_total "));
    }

    #[test]
    fn validity_reads_both_time_forms_and_refuses_what_is_not_der() {
        let dir = tempfile::tempdir().unwrap();
        // Past 2049 X.509 writes GeneralizedTime; before, UTCTime.
        let (cert, _) = dated(dir.path(), "span", (1999, 12, 31), (2051, 3, 4));
        let leaf = der(&std::fs::read(&cert).unwrap());
        let day = |y, m, d| {
            chrono::NaiveDate::from_ymd_opt(y, m, d)
                .unwrap()
                .and_hms_opt(0, 0, 0)
                .unwrap()
                .and_utc()
                .timestamp()
        };
        assert_eq!(validity(&leaf), Some((day(1999, 12, 31), day(2051, 3, 4))));
        assert_eq!(validity(&leaf[..leaf.len() / 3]), None);
        assert_eq!(validity(b"\x30\x84\xff\xff\xff\xff"), None);
        assert_eq!(validity(&[]), None);
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
