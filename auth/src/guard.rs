//! A service's door: its tokens (followed in the token file, so revocations take effect
//! without a restart) or none, and the routes open without one.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use crate::{Action, Denied, Principal, Public, Result, TokenFile, Verifier};

/// A service's authentication: tokens (or none: authentication off) and what is public.
#[derive(Clone, Debug, Default)]
pub struct Guard {
    verifier: Option<Arc<RwLock<Verifier>>>,
    /// The token file, when the guard follows it (see [`Guard::follow`]).
    source: Option<Arc<TokenSource>>,
    public: BTreeSet<Public>,
}

/// The token file a guard re-reads when it changes, so `gpuledger token add|revoke` takes
/// effect on a running service without a restart.
#[derive(Debug)]
struct TokenSource {
    path: std::path::PathBuf,
    state: Mutex<SourceState>,
}

#[derive(Debug)]
struct SourceState {
    checked: Instant,
    modified: Option<SystemTime>,
}

/// How often a followed token file is looked at (one `stat`).
pub(crate) const TOKEN_FILE_CHECK: Duration = Duration::from_secs(1);

pub(crate) fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl Guard {
    /// Authentication off: every request acts as an operator. For a loopback test or a
    /// single-user install; services log a warning when they run like this.
    pub fn off() -> Self {
        Guard::default()
    }

    pub fn new(file: &TokenFile, public: impl IntoIterator<Item = Public>) -> Self {
        Guard {
            verifier: Some(Arc::new(RwLock::new(Verifier::new(file)))),
            source: None,
            public: public.into_iter().collect(),
        }
    }

    /// A guard of the token file at `path`, read now and again within a second of each change:
    /// a revoked token stops working, an added one starts, without a restart. A file that
    /// cannot be read or parsed later keeps the tokens last read (and is logged).
    pub fn follow(path: &Path, public: impl IntoIterator<Item = Public>) -> Result<Self> {
        let written = modified(path);
        let file = TokenFile::load(path)?;
        let mut guard = Guard::new(&file, public);
        guard.source = Some(Arc::new(TokenSource {
            path: path.to_owned(),
            state: Mutex::new(SourceState {
                checked: Instant::now(),
                modified: written,
            }),
        }));
        Ok(guard)
    }

    /// Re-reads the followed file if it changed since it was last read.
    fn refresh(&self) {
        let (Some(source), Some(verifier)) = (&self.source, &self.verifier) else {
            return;
        };
        let mut state = source.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.checked.elapsed() < TOKEN_FILE_CHECK {
            return;
        }
        state.checked = Instant::now();
        let written = modified(&source.path);
        if written == state.modified {
            return;
        }
        match TokenFile::load(&source.path) {
            Ok(file) => {
                *verifier.write().unwrap_or_else(|p| p.into_inner()) = Verifier::new(&file);
                state.modified = written;
                tracing::info!(path = %source.path.display(), tokens = file.tokens.len(), "token file reloaded");
            }
            Err(error) => {
                tracing::warn!(%error, "token file changed but cannot be read; keeping the tokens read before");
            }
        }
    }

    pub fn is_on(&self) -> bool {
        self.verifier.is_some()
    }

    pub fn public(&self) -> &BTreeSet<Public> {
        &self.public
    }

    /// Who presented `token` (`None`: no token). A token that does not verify is refused
    /// even where the route is public, so a mistyped token is noticed.
    pub fn principal(&self, token: Option<&str>) -> Result<Principal, Denied> {
        let Some(verifier) = &self.verifier else {
            return Ok(Principal::Operator);
        };
        let Some(t) = token else {
            return Ok(Principal::Anonymous);
        };
        self.refresh();
        let verifier = verifier.read().unwrap_or_else(|p| p.into_inner());
        verifier.verify(t).ok_or(Denied::Unauthenticated)
    }

    /// The principal of `token` if it may do `action`.
    pub fn check(&self, token: Option<&str>, action: Action<'_>) -> Result<Principal, Denied> {
        let principal = self.principal(token)?;
        if principal.may(action, &self.public) {
            Ok(principal)
        } else if principal == Principal::Anonymous {
            Err(Denied::Unauthenticated)
        } else {
            Err(Denied::Forbidden)
        }
    }
}

/// The token in an `Authorization: Bearer ...` header value.
pub fn bearer(header_value: &str) -> Option<&str> {
    let (scheme, token) = header_value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}
