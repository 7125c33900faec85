//! The permission table: who made a request ([`Principal`]), what it wants ([`Action`]),
//! what the operator opened to anonymous requests ([`Public`]), which accounts a read covers
//! ([`Scope`]), and why a request is refused ([`Denied`]).

use std::collections::BTreeSet;
use std::str::FromStr;

use gpuledger_model::AccountId;

/// Who made a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    Operator,
    Finance,
    Tenant(AccountId),
    Node(String),
    /// Prometheus: scrapes `/metrics`, reads nothing else.
    Metrics,
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
            (Principal::Metrics, Action::Metrics) => true,
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
            Principal::Anonymous | Principal::Node(_) | Principal::Metrics => Scope::Nothing,
        }
    }

    /// A short description for logs: role and, for tenants and nodes, whose.
    pub fn describe(&self) -> String {
        match self {
            Principal::Operator => "operator".into(),
            Principal::Finance => "finance".into(),
            Principal::Tenant(a) => format!("tenant:{a}"),
            Principal::Node(n) => format!("node:{n}"),
            Principal::Metrics => "metrics".into(),
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
