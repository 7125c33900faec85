//! The token file `gpuledger token` manages: roles, one record per token (its id, name, role,
//! account or node, the SHA-256 of the token, when it was issued and expires), never a token
//! itself; mode 0600, errors with file and line.

use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use gpuledger_model::config::{line_col, parse_toml};
use gpuledger_model::AccountId;

use crate::{Error, Result};

/// Version of the token file format.
pub const TOKEN_FILE_VERSION: u32 = 1;
pub(crate) const PREFIX: &str = "gpl_";
pub(crate) const ID_BYTES: usize = 6;
pub(crate) const SECRET_BYTES: usize = 32;

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Node,
    Tenant,
    Finance,
    Operator,
    /// Scrapes `/metrics` and nothing else: the token Prometheus holds.
    Metrics,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Node => "node",
            Role::Tenant => "tenant",
            Role::Finance => "finance",
            Role::Operator => "operator",
            Role::Metrics => "metrics",
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
            "metrics" => Ok(Role::Metrics),
            other => Err(format!(
                "unknown role `{other}`; known: node, tenant, finance, operator, metrics"
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

pub(crate) fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

fn random_hex(bytes: usize) -> Result<String> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(|e| Error::Random(e.to_string()))?;
    Ok(hex::encode(buf))
}

/// The longest name a token may have: it is shown in `token list` and in logs.
pub const MAX_TOKEN_NAME_CHARS: usize = 128;

/// Why `name` cannot name a token: empty, too long, or with a control character (a newline
/// would forge a line in `token list` and in the services' logs).
fn name_problem(name: &str) -> Option<String> {
    if name.trim().is_empty() {
        Some("is empty".into())
    } else if name.chars().count() > MAX_TOKEN_NAME_CHARS {
        Some(format!(
            "has {} characters; at most {MAX_TOKEN_NAME_CHARS}",
            name.chars().count()
        ))
    } else if name.chars().any(char::is_control) {
        Some("has a control character (a newline, a tab, an escape)".into())
    } else {
        None
    }
}

/// Why `node` cannot be a node token's node: it must be a node id, as the config's nodes are.
fn node_problem(node: &str) -> Option<String> {
    gpuledger_model::NodeId::new(node)
        .err()
        .map(|e| e.to_string())
}

/// The id part of a presented token, if it has the token shape.
pub(crate) fn token_id(token: &str) -> Option<&str> {
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
            if let Some(why) = name_problem(&t.name) {
                return Err(invalid(&t.id, format!("{}: {why}", field("name"))));
            }
            if let Some(why) = t.node.as_deref().and_then(node_problem) {
                return Err(invalid(&t.id, format!("{}: {why}", field("node"))));
            }
            match (t.role, &t.account, &t.node) {
                (Role::Tenant, Some(_), None) | (Role::Node, None, Some(_)) => {}
                (Role::Finance | Role::Operator | Role::Metrics, None, None) => {}
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

    /// Writes the file durably (temporary name, fsync, rename, fsync of the directory),
    /// readable by its owner only.
    pub fn save(&self, path: &Path) -> Result<()> {
        let io = |source| Error::Io {
            path: path.display().to_string(),
            source,
        };
        let text = format!(
            "# gpuledger tokens, managed by `gpuledger token`. Only SHA-256 hashes are kept.\n{}",
            toml::to_string(self).map_err(|e| Error::Usage(e.to_string()))?
        );
        gpuledger_model::durable::replace_file_with_mode(path, text.as_bytes(), Some(0o600))
            .map_err(io)
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
            (Role::Finance | Role::Operator | Role::Metrics, None, None) => {}
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
        if let Some(why) = name_problem(name) {
            return Err(Error::Usage(format!("--name {why}")));
        }
        if let Some(why) = node.as_deref().and_then(node_problem) {
            return Err(Error::Usage(format!("--node: {why}")));
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
