//! HTTPS for a listener and what a client trusts, as options of every service and every
//! command that calls one.

use std::path::PathBuf;

use tokio_rustls::TlsAcceptor;

use crate::{Error, Result};

/// HTTPS for a listener, as options of every service command.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// Serve HTTPS with this PEM certificate chain (with --tls-key); a renewed file is picked
    /// up without a restart.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl TlsArgs {
    /// The acceptor the options ask for: none for plain HTTP.
    pub fn acceptor(&self) -> Result<Option<TlsAcceptor>> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                let config = gpuledger_auth::tls::server_config(cert, key)?;
                Ok(Some(TlsAcceptor::from(config)))
            }
            (None, None) => Ok(None),
            _ => Err(Error::Usage("--tls-cert and --tls-key go together".into())),
        }
    }
}

/// The URL scheme a listener serves.
pub fn scheme(tls: Option<&TlsAcceptor>) -> &'static str {
    if tls.is_some() {
        "https"
    } else {
        "http"
    }
}

/// What a client trusts of an `https://` gpuledger service, as an option of every command that
/// calls one.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ClientTlsArgs {
    /// PEM file of the CAs an `https://` aggregator or scheduler's certificate must chain to
    /// (a cluster's private CA); default the Mozilla roots.
    #[arg(long, env = "GPULEDGER_CA_FILE")]
    pub ca_file: Option<PathBuf>,
}

impl ClientTlsArgs {
    pub fn config(&self) -> Result<ureq::tls::TlsConfig> {
        Ok(gpuledger_auth::tls::client_tls(self.ca_file.as_deref())?)
    }
}
