//! Identifiers. All are short strings of `[A-Za-z0-9._-]` that do not start with `.`,
//! validated on construction so a bad id never reaches a file name (`..` would leave the
//! directory it names a file in), a Prometheus label or an SQL literal.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Why a string is not a valid identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("{kind} id is empty")]
    Empty { kind: &'static str },
    #[error("{kind} id `{value}` is longer than {max} characters")]
    TooLong {
        kind: &'static str,
        value: String,
        max: usize,
    },
    #[error("{kind} id `{value}` has `{ch}`; use letters, digits, '.', '_' or '-'")]
    BadChar {
        kind: &'static str,
        value: String,
        ch: char,
    },
    #[error("{kind} id `{value}` starts with '.'; it would name a hidden or a parent directory")]
    LeadingDot { kind: &'static str, value: String },
}

/// The longest identifier accepted.
pub const MAX_ID_LEN: usize = 64;

/// The longest job id accepted: gpuledger's scheduler names a job after its account
/// (`ACCOUNT.N`), so a job id has room for the longest account id and a number.
pub const MAX_JOB_ID_LEN: usize = 96;

fn validate(kind: &'static str, max: usize, value: &str) -> Result<(), IdError> {
    if value.is_empty() {
        return Err(IdError::Empty { kind });
    }
    if value.len() > max {
        return Err(IdError::TooLong {
            kind,
            value: value.to_owned(),
            max,
        });
    }
    if let Some(ch) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(IdError::BadChar {
            kind,
            value: value.to_owned(),
            ch,
        });
    }
    if value.starts_with('.') {
        return Err(IdError::LeadingDot {
            kind,
            value: value.to_owned(),
        });
    }
    Ok(())
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        string_id!($(#[$doc])* $name, $kind, MAX_ID_LEN);
    };
    ($(#[$doc:meta])* $name:ident, $kind:literal, $max:expr) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(Arc<str>);

        impl $name {
            /// Validates and wraps `value`.
            pub fn new(value: impl AsRef<str>) -> Result<Self, IdError> {
                let value = value.as_ref();
                validate($kind, $max, value)?;
                Ok(Self(Arc::from(value)))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), &*self.0)
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(value: String) -> Result<Self, IdError> {
                Self::new(value)
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(value: &str) -> Result<Self, IdError> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0.to_string()
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

string_id!(
    /// A department, the unit that is billed and that fair share ranks (a Slurm account, a
    /// Kubernetes namespace).
    AccountId,
    "account"
);
string_id!(
    /// A project inside an account (a Slurm association, a Kubernetes ResourceQuota).
    ProjectId,
    "project"
);
string_id!(
    /// A job, as its scheduler names it (`1234`, `1234_7`, a pod name).
    JobId,
    "job",
    MAX_JOB_ID_LEN
);
string_id!(
    /// A node, by its short host name.
    NodeId,
    "node"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_scheduler_style_ids() {
        assert_eq!(
            JobId::new("1234_7").map(|j| j.to_string()).ok(),
            Some("1234_7".into())
        );
        assert!(NodeId::new("gpu-node.01").is_ok());
    }

    #[test]
    fn rejects_bad_ids_with_a_reason() {
        let err = AccountId::new("team a").unwrap_err();
        assert_eq!(
            err.to_string(),
            "account id `team a` has ` `; use letters, digits, '.', '_' or '-'"
        );
        assert_eq!(
            ProjectId::new("").unwrap_err(),
            IdError::Empty { kind: "project" }
        );
        assert!(matches!(
            AccountId::new("x".repeat(65)),
            Err(IdError::TooLong { max: 64, .. })
        ));
        // A job id has room for the longest account id, a dot and a number.
        assert!(JobId::new(format!("{}.18446744073709551615", "x".repeat(64))).is_ok());
        assert!(matches!(
            JobId::new("x".repeat(97)),
            Err(IdError::TooLong { max: 96, .. })
        ));
    }

    #[test]
    fn an_id_cannot_name_a_parent_or_hidden_directory() {
        for bad in ["..", ".", ".hidden", "../x", "a/b"] {
            assert!(AccountId::new(bad).is_err(), "{bad}");
            assert!(ProjectId::new(bad).is_err(), "{bad}");
        }
        let err = AccountId::new("..").unwrap_err().to_string();
        assert!(err.contains("starts with '.'"), "{err}");
        // A dot inside stays allowed: Slurm's `12.batch`, `gpu-node.01`.
        assert!(JobId::new("12.batch").is_ok());
        assert!(AccountId::new("team.a").is_ok());
    }
}
