//! Who may do what in gpuledger. Every HTTP service authenticates a request by its bearer
//! token; a token has one role:
//!
//! | role | may |
//! |---|---|
//! | `node` | push samples, as its own node only |
//! | `tenant` | read its own account's usage, jobs and invoices; submit and cancel its own jobs |
//! | `finance` | read every account's usage and invoices |
//! | `operator` | everything |
//! | `metrics` | scrape `/metrics` (the token Prometheus holds) |
//!
//! Tokens live in a TOML file that `gpuledger token` manages ([`TokenFile`]); the file keeps
//! only the SHA-256 of each token, and a presented token is compared with it in constant time
//! ([`Verifier`]). A token is `gpl_<id>_<secret>`: the id (public, 12 hex digits) finds the
//! record, so the file can list and revoke tokens without holding them.
//!
//! This crate is pure policy: services turn [`Denied`] into their 401/403/404 responses.
//! [`Sessions`] are the status page's sign-ins: the cookie holds a random id, never a token.
//! [`tls`] loads the certificates the listeners serve and the CAs the clients trust.

use gpuledger_model::config::ConfigError;

mod guard;
mod permissions;
pub mod sessions;
pub mod tls;
mod token_file;
mod verifier;

pub use guard::{bearer, Guard};
pub use permissions::{Action, Denied, Principal, Public, Scope};
pub use sessions::Sessions;
pub use token_file::{Role, TokenFile, TokenRecord, TOKEN_FILE_VERSION};
pub use verifier::Verifier;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::{modified, TOKEN_FILE_CHECK};
    use chrono::{DateTime, TimeZone, Utc};
    use gpuledger_model::AccountId;
    use std::collections::BTreeSet;
    use std::path::Path;
    use std::time::Duration;

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
        // A name that would forge a line in `token list` and the logs, or a node no config
        // can name, neither issued nor read.
        let tenant = bad.replace(
            "role = \"tenant\"",
            "role = \"tenant\"\naccount = \"team-a\"",
        );
        for (from, to, says) in [
            (
                "name = \"x\"",
                "name = \"x\\nforged\"",
                "`tokens[0].name`: has a control character",
            ),
            ("name = \"x\"", "name = \"\"", "`tokens[0].name`: is empty"),
            (
                "role = \"tenant\"\naccount = \"team-a\"",
                "role = \"node\"\nnode = \"../etc\"",
                "`tokens[0].node`: node id `../etc`",
            ),
        ] {
            let err = TokenFile::from_toml_str(&tenant.replace(from, to), "tokens.toml")
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("tokens.toml:3:") && err.contains(says),
                "{err}"
            );
        }
        for (name, node, says) in [
            ("a\nb", None, "--name has a control character"),
            (
                &"n".repeat(129)[..],
                None,
                "--name has 129 characters; at most 128",
            ),
            ("n", Some("gpu 1"), "--node: node id `gpu 1`"),
        ] {
            let role = if node.is_some() {
                Role::Node
            } else {
                Role::Finance
            };
            let err = file
                .issue(role, name, None, node.map(str::to_owned), now())
                .unwrap_err()
                .to_string();
            assert!(err.contains(says), "{err}");
        }
        assert_eq!(file.tokens.len(), 1, "nothing refused was added");
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
        // Prometheus's token scrapes and reads nothing else.
        let scraper = Principal::Metrics;
        assert!(scraper.may(Action::Metrics, &none));
        for action in [
            Action::Sql,
            Action::ReadAll,
            Action::ReadAccount("team-a"),
            Action::ReadInvoices("team-a"),
            Action::ViewStatus,
            Action::PostEvents,
            Action::Operate,
            Action::ManageJobs("team-a"),
            Action::Ingest { node: "gpu001" },
        ] {
            assert!(!scraper.may(action, &none), "{action:?}");
        }
        assert_eq!(scraper.scope(&none), Scope::Nothing);
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
