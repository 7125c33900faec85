//! Who gets in: a service's [`Guard`] from its `--tokens` and `--public` options (protected
//! mode without tokens), the bearer token of a request, and the token file a client presents.

use std::net::SocketAddr;
use std::path::Path;

use axum::http::{header, HeaderMap, StatusCode};
use gpuledger_auth::{Denied, Guard, Public};

use crate::{Error, Result};

/// Who may use a service, as options of every service command: its token file, protected
/// mode, and the routes open without a token.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct AccessArgs {
    /// Token file (`gpuledger token add`; the aggregator and the scheduler read the same one):
    /// every route then wants a bearer token of a role allowed to use it. Without it
    /// authentication is off (a warning is logged), which is allowed on a loopback address
    /// only, unless --allow-unauthenticated.
    #[arg(long, env = "GPULEDGER_TOKENS")]
    pub tokens: Option<std::path::PathBuf>,
    /// Serve without --tokens on an address other hosts can reach (every request then acts as
    /// an operator): for a network you trust entirely.
    #[arg(long)]
    pub allow_unauthenticated: bool,
    /// Open routes to requests without a token, with --tokens: `metrics` (for a Prometheus
    /// without a token), `status` (the aggregator's status page, every account on it).
    #[arg(long, value_delimiter = ',')]
    pub public: Vec<Public>,
}

impl AccessArgs {
    /// The guard of `service` listening on `listen`.
    pub fn guard(&self, service: &str, listen: SocketAddr) -> Result<Guard> {
        let exposure = Exposure {
            listen,
            allow_unauthenticated: self.allow_unauthenticated,
        };
        guard(service, self.tokens.as_deref(), &self.public, exposure)
    }
}

/// Who a service's listener lets in without a token.
#[derive(Clone, Copy, Debug)]
pub struct Exposure {
    pub listen: SocketAddr,
    /// `--allow-unauthenticated`: no tokens even where other hosts can connect.
    pub allow_unauthenticated: bool,
}

/// The guard of a service from its `--tokens` and `--public` options. Without tokens a service
/// listens on loopback only, unless the operator says otherwise (as Redis's protected mode):
/// a forgotten `--tokens` must not open every account's data to the network.
pub fn guard(
    service: &str,
    tokens: Option<&Path>,
    public: &[Public],
    exposure: Exposure,
) -> Result<Guard> {
    match tokens {
        Some(path) => {
            if !path.exists() {
                return Err(Error::Usage(format!(
                    "token file {} does not exist; make one with `gpuledger token add --file {} --role operator --name admin`",
                    path.display(),
                    path.display()
                )));
            }
            let guard = Guard::follow(path, public.iter().copied())?;
            tracing::info!(service, file = %path.display(), public = ?public, "authentication on; the token file is followed");
            Ok(guard)
        }
        None => {
            if !public.is_empty() {
                return Err(Error::Usage("--public opens routes of a service that has --tokens; without --tokens everything is open".into()));
            }
            if !exposure.listen.ip().is_loopback() && !exposure.allow_unauthenticated {
                return Err(Error::Usage(format!(
                    "{service}: refusing to listen on {} without authentication, where other hosts can reach it; give --tokens FILE (`gpuledger token add`), listen on 127.0.0.1, or pass --allow-unauthenticated",
                    exposure.listen
                )));
            }
            tracing::warn!(
                service,
                "authentication is off: every request acts as an operator (give --tokens FILE)"
            );
            Ok(Guard::off())
        }
    }
}

/// The bearer token of a request (`None`: no `Authorization` header). A header that is not
/// `Bearer <token>` is refused as unauthenticated rather than read as anonymous.
pub fn bearer_token(headers: &HeaderMap) -> Result<Option<&str>, Denied> {
    match headers.get(header::AUTHORIZATION) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(gpuledger_auth::bearer)
            .map(Some)
            .ok_or(Denied::Unauthenticated),
    }
}

/// The status and message every service answers a refusal with; `what` says what the request
/// tried ("read the usage feed").
pub fn denied_message(denied: Denied, what: &str) -> (StatusCode, String) {
    match denied {
        Denied::Unauthenticated => (
            StatusCode::UNAUTHORIZED,
            format!("{what} needs a bearer token (`Authorization: Bearer <token>`)"),
        ),
        Denied::Forbidden => (
            StatusCode::FORBIDDEN,
            format!("this token's role may not {what}"),
        ),
    }
}

/// A bearer token kept in a file (one line; surrounding whitespace ignored), as a client
/// presents it to a service.
pub fn read_token_file(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("reading the token file {}", path.display()), e))?;
    let token = text.trim();
    if token.is_empty() || token.contains(char::is_whitespace) {
        return Err(Error::Usage(format!(
            "{}: expected one token on one line",
            path.display()
        )));
    }
    Ok(token.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_tokens_a_service_listens_on_loopback_only_unless_told() {
        let exposure = |listen: &str, allow_unauthenticated| Exposure {
            listen: listen.parse().unwrap(),
            allow_unauthenticated,
        };
        for loopback in ["127.0.0.1:9400", "[::1]:9400"] {
            assert!(guard("aggregator", None, &[], exposure(loopback, false)).is_ok());
        }
        for open in ["0.0.0.0:9400", "10.1.2.3:9400", "[::]:9400"] {
            let err = guard("aggregator", None, &[], exposure(open, false))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("refusing to listen on") && err.contains("--tokens"),
                "{err}"
            );
            assert!(guard("aggregator", None, &[], exposure(open, true)).is_ok());
        }
    }

    #[test]
    fn a_malformed_authorization_header_is_refused_not_anonymous() {
        let mut headers = HeaderMap::new();
        assert_eq!(bearer_token(&headers), Ok(None));
        headers.insert(header::AUTHORIZATION, "Bearer gpl_abc".parse().unwrap());
        assert_eq!(bearer_token(&headers), Ok(Some("gpl_abc")));
        headers.insert(header::AUTHORIZATION, "Basic Zm9vOmJhcg==".parse().unwrap());
        assert_eq!(bearer_token(&headers), Err(Denied::Unauthenticated));
    }

    #[test]
    fn a_token_file_holds_one_token_on_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "  gpl_0123_abc\n").unwrap();
        assert_eq!(read_token_file(&path).unwrap(), "gpl_0123_abc");
        std::fs::write(&path, "one two\n").unwrap();
        let err = read_token_file(&path).unwrap_err().to_string();
        assert!(err.contains("one token on one line"), "{err}");
        let err = read_token_file(&dir.path().join("absent"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("reading the token file"), "{err}");
    }
}
