//! The tenant tree: accounts (departments) and their projects, with weights for fair share and
//! quotas. Jobs hang below projects and are the scheduler's business.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::{AccountId, ProjectId};
use crate::quota::Quota;

/// An account and its projects.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Account {
    pub id: AccountId,
    /// A human name, e.g. "Research".
    pub name: String,
    /// Fair-share weight (Slurm `Fairshare=`); relative, > 0.
    pub weight: u32,
    #[serde(default)]
    pub quota: Quota,
    #[serde(default)]
    pub projects: Vec<Project>,
    /// The Unix user (and group) the live scheduler runs this account's jobs as. A scheduler
    /// running as root refuses jobs of an account without one; `{ user = "root" }` says root
    /// on purpose.
    #[serde(default)]
    pub run_as: Option<RunAs>,
}

/// A Unix user, and optionally a group other than the user's own, that jobs run as.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunAs {
    pub user: String,
    #[serde(default)]
    pub group: Option<String>,
}

/// A project inside an account.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Project {
    pub id: ProjectId,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub quota: Quota,
    /// The Unix user (and group) this project's jobs run as, when not its account's: projects
    /// of one account kept apart from each other.
    #[serde(default)]
    pub run_as: Option<RunAs>,
}

/// Accounts by id, for lookups.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantTree {
    accounts: BTreeMap<AccountId, Account>,
}

impl TenantTree {
    pub fn new(accounts: impl IntoIterator<Item = Account>) -> Self {
        TenantTree {
            accounts: accounts.into_iter().map(|a| (a.id.clone(), a)).collect(),
        }
    }

    pub fn account(&self, id: &AccountId) -> Option<&Account> {
        self.accounts.get(id)
    }

    pub fn accounts(&self) -> impl Iterator<Item = &Account> {
        self.accounts.values()
    }

    pub fn len(&self) -> usize {
        self.accounts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.accounts.is_empty()
    }

    /// The limits that hold for a job of `account` in `project` (the account's own where the
    /// job names no project). `None` if the account, or the named project, does not exist.
    pub fn effective_quota(
        &self,
        account: &AccountId,
        project: Option<&ProjectId>,
    ) -> Option<Quota> {
        let acc = self.accounts.get(account)?;
        match project {
            None => Some(acc.quota.clone()),
            Some(p) => acc
                .projects
                .iter()
                .find(|proj| &proj.id == p)
                .map(|proj| Quota::effective_for_project(&acc.quota, &proj.quota)),
        }
    }

    /// Sum of all weights, for shares.
    pub fn total_weight(&self) -> u64 {
        self.accounts.values().map(|a| u64::from(a.weight)).sum()
    }
}
