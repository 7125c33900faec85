//! Who may do what in gpuledger. Every HTTP service authenticates a request by its bearer
//! token; a token has one role:
//!
//! | role | may |
//! |---|---|
//! | `node` | push samples, as its own node only |
//! | `tenant` | read its own account's usage, jobs and invoices; submit and cancel its own jobs |
//! | `finance` | read every account's usage and invoices |
//! | `operator` | everything |
//!
//! Tokens live in a TOML file that `gpuledger token` manages ([`TokenFile`]); the file keeps
//! only the SHA-256 of each token, and a presented token is compared with it in constant time
//! ([`Verifier`]). A token is `gpl_<id>_<secret>`: the id (public, 12 hex digits) finds the
//! record, so the file can list and revoke tokens without holding them.
//!
//! This crate is pure policy: services turn [`Denied`] into their 401/403/404 responses.
//! [`tls`] loads the certificates the listeners serve and the CAs the clients trust.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use gpuledger_model::config::{line_col, parse_toml, ConfigError};
use gpuledger_model::AccountId;

pub mod tls;

/// Version of the token file format.
pub const TOKEN_FILE_VERSION: u32 = 1;
const PREFIX: &str = "gpl_";
const ID_BYTES: usize = 6;
const SECRET_BYTES: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Parse(#[from] ConfigError),
    #[error("{origin}: {message}")]
    Invalid { origin: String, message: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("the operating system's random source failed: {0}")]
    Random(String),
    #[error("no token with id or name `{0}`")]
    UnknownToken(String),
    #[error("{0}")]
    Usage(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Node,
    Tenant,
    Finance,
    Operator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Node => "node",
            Role::Tenant => "tenant",
            Role::Finance => "finance",
            Role::Operator => "operator",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "node" => Ok(Role::Node),
            "tenant" => Ok(Role::Tenant),
            "finance" => Ok(Role::Finance),
            "operator" => Ok(Role::Operator),
            other => Err(format!(
                "unknown role `{other}`; known: node, tenant, finance, operator"
            )),
        }
    }
}

/// One token as the file keeps it: never the token itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRecord {
    /// Public part of the token, 12 hex digits.
    pub id: String,
    /// Who or what holds it, e.g. `prometheus`, `gpu017`, `team-a lead`.
    pub name: String,
    pub role: Role,
    /// The tenant's account (tenant tokens only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<AccountId>,
    /// The node it pushes as (node tokens only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Hex SHA-256 of the whole token.
    pub sha256: String,
    /// RFC 3339, UTC.
    pub created: String,
}

/// The token file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenFile {
    pub version: u32,
    #[serde(default)]
    pub tokens: Vec<TokenRecord>,
}

impl Default for TokenFile {
    fn default() -> Self {
        TokenFile {
            version: TOKEN_FILE_VERSION,
            tokens: Vec::new(),
        }
    }
}

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

fn random_hex(bytes: usize) -> Result<String> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(|e| Error::Random(e.to_string()))?;
    Ok(hex::encode(buf))
}

/// The id part of a presented token, if it has the token shape.
fn token_id(token: &str) -> Option<&str> {
    let rest = token.strip_prefix(PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let hex_of = |s: &str, n: usize| s.len() == n * 2 && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex_of(id, ID_BYTES) && hex_of(secret, SECRET_BYTES)).then_some(id)
}

impl TokenFile {
    /// Parses and checks a token file; errors name `origin` and the line.
    pub fn from_toml_str(src: &str, origin: &str) -> Result<Self> {
        let file: TokenFile = parse_toml(src, origin)?;
        let invalid = |at: &str, message: String| {
            let line = src
                .find(at)
                .map(|offset| format!(":{}", line_col(src, offset).0))
                .unwrap_or_default();
            Error::Invalid {
                origin: format!("{origin}{line}"),
                message,
            }
        };
        if file.version != TOKEN_FILE_VERSION {
            return Err(invalid(
                "version",
                format!(
                    "`version`: {} is not a token file version this gpuledger reads ({TOKEN_FILE_VERSION})",
                    file.version
                ),
            ));
        }
        let mut ids = BTreeSet::new();
        for (i, t) in file.tokens.iter().enumerate() {
            let field = |f: &str| format!("`tokens[{i}].{f}`");
            if t.id.len() != ID_BYTES * 2 || !t.id.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(invalid(
                    &t.id,
                    format!("{}: must be {} hex digits", field("id"), ID_BYTES * 2),
                ));
            }
            if !ids.insert(t.id.as_str()) {
                return Err(invalid(
                    &t.id,
                    format!("{}: `{}` appears twice", field("id"), t.id),
                ));
            }
            if t.sha256.len() != 64 || !t.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(invalid(
                    &t.sha256,
                    format!("{}: must be 64 hex digits", field("sha256")),
                ));
            }
            match (t.role, &t.account, &t.node) {
                (Role::Tenant, Some(_), None) | (Role::Node, None, Some(_)) => {}
                (Role::Finance | Role::Operator, None, None) => {}
                (Role::Tenant, _, _) => {
                    return Err(invalid(
                        &t.id,
                        format!(
                            "{}: a tenant token names its `account` and no `node`",
                            field("role")
                        ),
                    ))
                }
                (Role::Node, _, _) => {
                    return Err(invalid(
                        &t.id,
                        format!(
                            "{}: a node token names its `node` and no `account`",
                            field("role")
                        ),
                    ))
                }
                (role, _, _) => {
                    return Err(invalid(
                        &t.id,
                        format!(
                            "{}: a {role} token names no `account` or `node`",
                            field("role")
                        ),
                    ))
                }
            }
        }
        Ok(file)
    }

    /// Reads `path`; a missing file is an empty token file.
    pub fn load(path: &Path) -> Result<Self> {
        match std::fs::read_to_string(path) {
            Ok(src) => Self::from_toml_str(&src, &path.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TokenFile::default()),
            Err(source) => Err(Error::Io {
                path: path.display().to_string(),
                source,
            }),
        }
    }

    /// Writes the file atomically (temporary name, fsync, rename), readable by its owner only.
    pub fn save(&self, path: &Path) -> Result<()> {
        use std::io::Write;
        #[cfg(unix)]
        use std::os::unix::fs::OpenOptionsExt;
        let io = |source| Error::Io {
            path: path.display().to_string(),
            source,
        };
        let text = format!(
            "# gpuledger tokens, managed by `gpuledger token`. Only SHA-256 hashes are kept.\n{}",
            toml::to_string(self).map_err(|e| Error::Usage(e.to_string()))?
        );
        let tmp = path.with_extension("tmp");
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        options.mode(0o600);
        let mut f = options.open(&tmp).map_err(io)?;
        f.write_all(text.as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Makes a new token and records its hash; returns the token, shown once.
    pub fn issue(
        &mut self,
        role: Role,
        name: &str,
        account: Option<AccountId>,
        node: Option<String>,
        now: DateTime<Utc>,
    ) -> Result<String> {
        match (role, &account, &node) {
            (Role::Tenant, Some(_), None) | (Role::Node, None, Some(_)) => {}
            (Role::Finance | Role::Operator, None, None) => {}
            (Role::Tenant, _, _) => {
                return Err(Error::Usage(
                    "a tenant token needs --account and no --node".into(),
                ))
            }
            (Role::Node, _, _) => {
                return Err(Error::Usage(
                    "a node token needs --node and no --account".into(),
                ))
            }
            (role, _, _) => {
                return Err(Error::Usage(format!(
                    "a {role} token takes no --account or --node"
                )))
            }
        }
        let id = loop {
            let id = random_hex(ID_BYTES)?;
            if self.tokens.iter().all(|t| t.id != id) {
                break id;
            }
        };
        let token = format!("{PREFIX}{id}_{}", random_hex(SECRET_BYTES)?);
        self.tokens.push(TokenRecord {
            id,
            name: name.to_owned(),
            role,
            account,
            node,
            sha256: sha256_hex(&token),
            created: now.to_rfc3339_opts(SecondsFormat::Secs, true),
        });
        Ok(token)
    }

    /// Removes the token with this id, or every token with this name.
    pub fn revoke(&mut self, id_or_name: &str) -> Result<Vec<TokenRecord>> {
        let (gone, kept): (Vec<_>, Vec<_>) = self
            .tokens
            .drain(..)
            .partition(|t| t.id == id_or_name || t.name == id_or_name);
        self.tokens = kept;
        if gone.is_empty() {
            return Err(Error::UnknownToken(id_or_name.to_owned()));
        }
        Ok(gone)
    }
}

/// Who made a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    Operator,
    Finance,
    Tenant(AccountId),
    Node(String),
    /// No token; allowed only what the operator opened to everyone.
    Anonymous,
}

/// What a request wants to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action<'a> {
    /// Push samples as this node.
    Ingest { node: &'a str },
    /// Post job events (the scheduler, or a follower of Slurm).
    PostEvents,
    /// Read everything about every account: the whole usage feed, cluster indicators.
    ReadAll,
    /// Read one account's usage, indicators and jobs.
    ReadAccount(&'a str),
    /// Read one account's invoices.
    ReadInvoices(&'a str),
    /// Submit, cancel or checkpoint a job of this account.
    ManageJobs(&'a str),
    /// Free-form SQL over every table.
    Sql,
    /// Scrape `/metrics`.
    Metrics,
    /// See the status page (each principal sees its own [`Scope`]).
    ViewStatus,
    /// Anything else an operator does (reservations, the allocation feed).
    Operate,
}

/// Routes the operator opened to requests without a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Public {
    /// `/metrics`, for a Prometheus without a token.
    Metrics,
    /// The status page, every account on it.
    Status,
}

impl FromStr for Public {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "metrics" => Ok(Public::Metrics),
            "status" => Ok(Public::Status),
            other => Err(format!(
                "`{other}` cannot be public; known: metrics, status"
            )),
        }
    }
}

/// Which accounts a principal's reads cover.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    All,
    Account(AccountId),
    Nothing,
}

impl Scope {
    pub fn covers(&self, account: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Account(a) => a.as_str() == account,
            Scope::Nothing => false,
        }
    }
}

impl Principal {
    /// Whether this principal may do `action`; `public` is what the operator opened.
    pub fn may(&self, action: Action<'_>, public: &BTreeSet<Public>) -> bool {
        match (self, action) {
            (Principal::Operator, _) => true,
            (Principal::Node(me), Action::Ingest { node }) => me == node,
            (Principal::Finance, Action::ReadAll | Action::ReadAccount(_))
            | (Principal::Finance, Action::ReadInvoices(_) | Action::ViewStatus) => true,
            (
                Principal::Tenant(mine),
                Action::ReadAccount(a) | Action::ReadInvoices(a) | Action::ManageJobs(a),
            ) => mine.as_str() == a,
            (Principal::Tenant(_), Action::ViewStatus) => true,
            (Principal::Anonymous, Action::Metrics) => public.contains(&Public::Metrics),
            (Principal::Anonymous, Action::ViewStatus) => public.contains(&Public::Status),
            _ => false,
        }
    }

    /// The accounts this principal's reads cover (the status page, the usage feed, queues).
    pub fn scope(&self, public: &BTreeSet<Public>) -> Scope {
        match self {
            Principal::Operator | Principal::Finance => Scope::All,
            Principal::Tenant(a) => Scope::Account(a.clone()),
            Principal::Anonymous if public.contains(&Public::Status) => Scope::All,
            Principal::Anonymous | Principal::Node(_) => Scope::Nothing,
        }
    }

    /// A short description for logs: role and, for tenants and nodes, whose.
    pub fn describe(&self) -> String {
        match self {
            Principal::Operator => "operator".into(),
            Principal::Finance => "finance".into(),
            Principal::Tenant(a) => format!("tenant:{a}"),
            Principal::Node(n) => format!("node:{n}"),
            Principal::Anonymous => "anonymous".into(),
        }
    }
}

/// Why a request was not let in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denied {
    /// No token where one is needed, or a token nobody issued: 401.
    Unauthenticated,
    /// A valid token whose role may not do this: 403.
    Forbidden,
}

/// Checks presented tokens against a token file's hashes.
#[derive(Clone)]
pub struct Verifier {
    by_id: HashMap<String, TokenRecord>,
    /// Compared against when the id is unknown, so an unknown id costs what a wrong secret does.
    decoy: [u8; 32],
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("tokens", &self.by_id.len())
            .finish()
    }
}

impl Verifier {
    pub fn new(file: &TokenFile) -> Self {
        Verifier {
            by_id: file
                .tokens
                .iter()
                .map(|t| (t.id.clone(), t.clone()))
                .collect(),
            decoy: [0u8; 32],
        }
    }

    /// The principal a token stands for, or `None` for a token nobody issued.
    pub fn verify(&self, token: &str) -> Option<Principal> {
        let id = token_id(token.trim())?;
        let presented = Sha256::digest(token.trim().as_bytes());
        let record = self.by_id.get(id);
        let stored: [u8; 32] = record
            .and_then(|r| hex::decode(&r.sha256).ok())
            .and_then(|b| b.try_into().ok())
            .unwrap_or(self.decoy);
        let equal: bool = presented.as_slice().ct_eq(&stored).into();
        let record = record.filter(|_| equal)?;
        Some(match record.role {
            Role::Operator => Principal::Operator,
            Role::Finance => Principal::Finance,
            Role::Tenant => Principal::Tenant(record.account.clone()?),
            Role::Node => Principal::Node(record.node.clone()?),
        })
    }
}

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
const TOKEN_FILE_CHECK: Duration = Duration::from_secs(1);

fn modified(path: &Path) -> Option<SystemTime> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 1, 8, 0, 0).unwrap()
    }

    fn account(a: &str) -> AccountId {
        a.parse().unwrap()
    }

    #[test]
    fn a_followed_token_file_takes_revocations_and_new_tokens_without_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let mut file = TokenFile::default();
        let kept = file
            .issue(Role::Operator, "ops", None, None, now())
            .unwrap();
        let revoked = file
            .issue(Role::Tenant, "a", Some(account("team-a")), None, now())
            .unwrap();
        file.save(&path).unwrap();
        let guard = Guard::follow(&path, []).unwrap();
        assert_eq!(
            guard.principal(Some(&revoked)),
            Ok(Principal::Tenant(account("team-a")))
        );

        file.revoke("a").unwrap();
        let added = file.issue(Role::Finance, "fin", None, None, now()).unwrap();
        file.save(&path).unwrap();
        // Within the check interval the tokens read before stand; then the new file does.
        std::thread::sleep(TOKEN_FILE_CHECK + Duration::from_millis(100));
        bump_mtime(&path);
        assert_eq!(
            guard.principal(Some(&revoked)),
            Err(Denied::Unauthenticated)
        );
        assert_eq!(guard.principal(Some(&added)), Ok(Principal::Finance));
        assert_eq!(guard.principal(Some(&kept)), Ok(Principal::Operator));

        // A broken rewrite keeps the tokens read before.
        std::fs::write(&path, "version = 1\n[[tokens]\n").unwrap();
        std::thread::sleep(TOKEN_FILE_CHECK + Duration::from_millis(100));
        bump_mtime(&path);
        assert_eq!(guard.principal(Some(&added)), Ok(Principal::Finance));
    }

    /// Moves a file's mtime a second on, so a rewrite within one clock tick is still seen.
    fn bump_mtime(path: &Path) {
        let f = std::fs::File::options().write(true).open(path).unwrap();
        f.set_modified(modified(path).unwrap() + Duration::from_secs(1))
            .unwrap();
    }

    #[test]
    fn issued_tokens_verify_as_their_principal_and_nothing_else_does() {
        let mut file = TokenFile::default();
        let op = file
            .issue(Role::Operator, "ops", None, None, now())
            .unwrap();
        let a = file
            .issue(Role::Tenant, "a", Some(account("team-a")), None, now())
            .unwrap();
        let n = file
            .issue(Role::Node, "gpu001", None, Some("gpu001".into()), now())
            .unwrap();
        let v = Verifier::new(&file);
        assert_eq!(v.verify(&op), Some(Principal::Operator));
        assert_eq!(v.verify(&a), Some(Principal::Tenant(account("team-a"))));
        assert_eq!(v.verify(&n), Some(Principal::Node("gpu001".into())));
        // One hex digit of the secret changed: refused.
        let mut forged = a.clone().into_bytes();
        let last = forged.len() - 1;
        forged[last] = if forged[last] == b'0' { b'1' } else { b'0' };
        assert_eq!(v.verify(std::str::from_utf8(&forged).unwrap()), None);
        assert_eq!(v.verify("gpl_000000000000_00"), None);
        assert_eq!(v.verify(""), None);
        let text = toml::to_string(&file).unwrap();
        assert!(!text.contains(&a[16..]), "the file never holds a secret");
    }

    #[test]
    fn the_file_round_trips_and_refuses_bad_records_with_their_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let mut file = TokenFile::default();
        file.issue(Role::Finance, "finance", None, None, now())
            .unwrap();
        file.save(&path).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert_eq!(TokenFile::load(&path).unwrap(), file);
        let bad = "version = 1\n[[tokens]]\nid = \"0123456789ab\"\nname = \"x\"\nrole = \"tenant\"\nsha256 = \"".to_owned()
            + &"0".repeat(64)
            + "\"\ncreated = \"2026-12-01T00:00:00Z\"\n";
        let err = TokenFile::from_toml_str(&bad, "tokens.toml")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("tokens.toml:3:"), "{err}");
        assert!(err.contains("names its `account`"), "{err}");
        let err = TokenFile::from_toml_str("version = 1\nrole = 3\n", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("t.toml:2:"), "{err}");
    }

    #[test]
    fn roles_may_only_what_the_table_says() {
        let none = BTreeSet::new();
        let a = Principal::Tenant(account("team-a"));
        assert!(a.may(Action::ReadAccount("team-a"), &none));
        assert!(!a.may(Action::ReadAccount("team-b"), &none));
        assert!(a.may(Action::ManageJobs("team-a"), &none));
        assert!(!a.may(Action::ManageJobs("team-b"), &none));
        assert!(!a.may(Action::ReadAll, &none));
        assert!(!a.may(Action::Sql, &none));
        assert!(!a.may(Action::Metrics, &none));
        assert!(!a.may(Action::Ingest { node: "gpu001" }, &none));
        let node = Principal::Node("gpu001".into());
        assert!(node.may(Action::Ingest { node: "gpu001" }, &none));
        assert!(!node.may(Action::Ingest { node: "gpu002" }, &none));
        assert!(!node.may(Action::ReadAccount("team-a"), &none));
        assert!(!node.may(Action::ViewStatus, &none));
        assert!(Principal::Finance.may(Action::ReadInvoices("team-b"), &none));
        assert!(!Principal::Finance.may(Action::Sql, &none));
        assert!(!Principal::Finance.may(Action::PostEvents, &none));
        assert!(!Principal::Anonymous.may(Action::Metrics, &none));
        let open = BTreeSet::from([Public::Metrics]);
        assert!(Principal::Anonymous.may(Action::Metrics, &open));
        assert!(!Principal::Anonymous.may(Action::ViewStatus, &open));
        assert_eq!(a.scope(&none), Scope::Account(account("team-a")));
        assert_eq!(Principal::Anonymous.scope(&open), Scope::Nothing);
    }

    #[test]
    fn the_guard_tells_401_from_403_and_is_open_when_off() {
        let mut file = TokenFile::default();
        let a = file
            .issue(Role::Tenant, "a", Some(account("team-a")), None, now())
            .unwrap();
        let guard = Guard::new(&file, [Public::Metrics]);
        assert_eq!(guard.check(None, Action::Sql), Err(Denied::Unauthenticated));
        assert_eq!(
            guard.check(Some("gpl_nope"), Action::Metrics),
            Err(Denied::Unauthenticated),
            "a bad token is refused even on a public route"
        );
        assert_eq!(guard.check(Some(&a), Action::Sql), Err(Denied::Forbidden));
        assert_eq!(guard.check(None, Action::Metrics), Ok(Principal::Anonymous));
        assert_eq!(
            Guard::off().check(None, Action::Sql),
            Ok(Principal::Operator)
        );
        assert_eq!(bearer("Bearer  abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
    }
}
