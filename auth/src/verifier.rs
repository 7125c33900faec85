//! Checks a presented token against the token file's hashes, in constant time.

use std::collections::HashMap;
use std::fmt;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::token_file::token_id;
use crate::{Principal, Role, TokenFile, TokenRecord};

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
            Role::Metrics => Principal::Metrics,
            Role::Tenant => Principal::Tenant(record.account.clone()?),
            Role::Node => Principal::Node(record.node.clone()?),
        })
    }
}
