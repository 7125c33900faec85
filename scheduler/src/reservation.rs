//! Advance reservations: a window, nodes (a count or names) and the accounts that may use them,
//! as Slurm's `scontrol create reservation`. Inside the window only those accounts run there,
//! and only jobs that end by the window's end; outside it anyone may, as long as the job ends
//! before the window starts.

use gpuledger_model::time::UnixSeconds;
use gpuledger_model::{AccountId, NodeId};

use crate::cluster::{Cluster, NodeFilter};

/// Which nodes a reservation asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeRequest {
    /// Any this many nodes; the scheduler picks ones free for the window.
    Count(u32),
    Names(Vec<NodeId>),
}

/// A reservation as asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReservationRequest {
    pub name: String,
    pub start_s: UnixSeconds,
    pub end_s: UnixSeconds,
    /// The first account is the owner, billed for what goes unused.
    pub accounts: Vec<AccountId>,
    pub nodes: NodeRequest,
}

/// A reservation in force, with its nodes chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdvanceReservation {
    pub name: String,
    pub start_s: UnixSeconds,
    pub end_s: UnixSeconds,
    pub accounts: Vec<AccountId>,
    /// Node indices in the cluster.
    pub nodes: Vec<usize>,
}

impl AdvanceReservation {
    pub fn owner(&self) -> &AccountId {
        &self.accounts[0]
    }

    fn overlaps(&self, start: UnixSeconds, end: UnixSeconds) -> bool {
        self.start_s < end && self.end_s > start
    }

    /// True when a job of `account` running `[start, end)` may use this reservation's nodes.
    pub fn admits(&self, account: &AccountId, start: UnixSeconds, end: UnixSeconds) -> bool {
        if !self.overlaps(start, end) {
            return true;
        }
        self.accounts.contains(account) && start >= self.start_s && end <= self.end_s
    }
}

/// Why a reservation was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReservationError {
    #[error("reservation `{0}` already exists")]
    Duplicate(String),
    #[error("reservation name must not be empty")]
    NoName,
    #[error("the window must end after it starts")]
    EmptyWindow,
    #[error("a reservation needs at least one account")]
    NoAccounts,
    #[error("account `{0}` does not exist")]
    UnknownAccount(AccountId),
    #[error("node `{0}` does not exist")]
    UnknownNode(String),
    #[error("node `{node}` is already reserved by `{by}` in that window")]
    NodeReserved { node: String, by: String },
    #[error("node `{node}` is dedicated to another account")]
    NodeDedicated { node: String },
    #[error("node `{node}` runs job {job} into the window")]
    JobInTheWay { node: String, job: String },
    #[error("{asked} nodes asked, {available} are free for the whole window")]
    NotEnoughNodes { asked: u32, available: u32 },
    #[error("a reservation needs at least one node")]
    NoNodes,
    #[error("reservation name `{0}`: use 1 to {MAX_NAME_CHARS} letters, digits, '.', '_' or '-'")]
    BadName(String),
    #[error("account `{0}` is named twice")]
    DuplicateAccount(AccountId),
    #[error("node `{0}` is named twice")]
    DuplicateNode(String),
    #[error("give `nodes` (a count) or `node_names`, not both")]
    CountAndNames,
}

/// The longest reservation name: it heads invoice lines and the scheduler's listings.
pub const MAX_NAME_CHARS: usize = 64;

impl ReservationError {
    /// The request's field the error is about, as the API and a reservations file name it.
    pub fn field(&self) -> &'static str {
        match self {
            ReservationError::Duplicate(_)
            | ReservationError::NoName
            | ReservationError::BadName(_) => "name",
            ReservationError::EmptyWindow => "end",
            ReservationError::NoAccounts
            | ReservationError::UnknownAccount(_)
            | ReservationError::DuplicateAccount(_) => "accounts",
            ReservationError::UnknownNode(_)
            | ReservationError::DuplicateNode(_)
            | ReservationError::NodeReserved { .. }
            | ReservationError::NodeDedicated { .. }
            | ReservationError::JobInTheWay { .. } => "node_names",
            ReservationError::NotEnoughNodes { .. }
            | ReservationError::NoNodes
            | ReservationError::CountAndNames => "nodes",
        }
    }
}

/// A refused name as an error repeats it: its first characters, however long it was.
pub fn shown_name(name: &str) -> String {
    match name.char_indices().nth(MAX_NAME_CHARS) {
        Some((cut, _)) => format!("{}...", &name[..cut]),
        None => name.to_owned(),
    }
}

fn well_formed_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().count() <= MAX_NAME_CHARS
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// The reservations in force.
#[derive(Clone, Debug, Default)]
pub struct Reservations {
    list: Vec<AdvanceReservation>,
}

impl Reservations {
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &AdvanceReservation> {
        self.list.iter()
    }

    pub fn get(&self, name: &str) -> Option<&AdvanceReservation> {
        self.list.iter().find(|r| r.name == name)
    }

    pub fn remove(&mut self, name: &str) -> Option<AdvanceReservation> {
        let at = self.list.iter().position(|r| r.name == name)?;
        Some(self.list.remove(at))
    }

    /// Drops reservations that ended before `now`.
    pub fn expire(&mut self, now: UnixSeconds) {
        self.list.retain(|r| r.end_s > now);
    }

    /// Start and end times, where what a job may use changes.
    pub fn boundaries(&self) -> Vec<UnixSeconds> {
        self.list
            .iter()
            .flat_map(|r| [r.start_s, r.end_s])
            .collect()
    }

    /// The nodes a job of `account` running `[start, end)` may not use.
    pub fn filter(
        &self,
        cluster: &Cluster,
        account: &AccountId,
        start: UnixSeconds,
        end: UnixSeconds,
    ) -> NodeFilter {
        let mut filter = NodeFilter::none();
        for r in &self.list {
            if !r.admits(account, start, end) {
                for &n in &r.nodes {
                    filter.block(n, cluster.node_count());
                }
            }
        }
        filter
    }

    /// Only the reserved nodes a job of `account` running `[start, end)` may use: a job that
    /// ends before a reservation starts, or runs inside its own, goes there first and leaves
    /// the other nodes to jobs that cannot. `None` when there are none.
    pub fn usable_reserved(
        &self,
        cluster: &Cluster,
        account: &AccountId,
        start: UnixSeconds,
        end: UnixSeconds,
    ) -> Option<NodeFilter> {
        let mut usable = vec![false; cluster.node_count()];
        for r in self.list.iter().filter(|r| r.end_s > start) {
            if r.admits(account, start, end) {
                for &n in &r.nodes {
                    usable[n] = true;
                }
            }
        }
        for r in self.list.iter().filter(|r| !r.admits(account, start, end)) {
            for &n in &r.nodes {
                usable[n] = false;
            }
        }
        if !usable.iter().any(|u| *u) {
            return None;
        }
        let mut filter = NodeFilter::none();
        for (n, ok) in usable.iter().enumerate() {
            if !ok {
                filter.block(n, cluster.node_count());
            }
        }
        Some(filter)
    }

    /// Checks a request and chooses its nodes. `busy_until(node)` is when the last job running
    /// there reaches its time limit (or `None` when nothing runs there).
    pub fn add(
        &mut self,
        req: ReservationRequest,
        cluster: &Cluster,
        account_exists: impl Fn(&AccountId) -> bool,
        running_into: impl Fn(usize) -> Option<(UnixSeconds, String)>,
    ) -> Result<&AdvanceReservation, ReservationError> {
        if req.name.trim().is_empty() {
            return Err(ReservationError::NoName);
        }
        if !well_formed_name(&req.name) {
            return Err(ReservationError::BadName(shown_name(&req.name)));
        }
        if self.get(&req.name).is_some() {
            return Err(ReservationError::Duplicate(req.name));
        }
        if req.end_s <= req.start_s {
            return Err(ReservationError::EmptyWindow);
        }
        let Some(owner) = req.accounts.first() else {
            return Err(ReservationError::NoAccounts);
        };
        if let Some(unknown) = req.accounts.iter().find(|a| !account_exists(a)) {
            return Err(ReservationError::UnknownAccount(unknown.clone()));
        }
        if let Some(twice) = first_repeated(&req.accounts) {
            return Err(ReservationError::DuplicateAccount(twice.clone()));
        }
        let problem = |node: usize| -> Option<ReservationError> {
            let name = cluster.node_spec(node).id.to_string();
            if let Some(r) = self
                .list
                .iter()
                .find(|r| r.overlaps(req.start_s, req.end_s) && r.nodes.contains(&node))
            {
                return Some(ReservationError::NodeReserved {
                    node: name,
                    by: r.name.clone(),
                });
            }
            if !cluster.usable_by(node, owner) {
                return Some(ReservationError::NodeDedicated { node: name });
            }
            match running_into(node) {
                Some((until, job)) if until > req.start_s => {
                    Some(ReservationError::JobInTheWay { node: name, job })
                }
                _ => None,
            }
        };
        let nodes = match &req.nodes {
            NodeRequest::Names(names) => {
                if names.is_empty() {
                    return Err(ReservationError::NoNodes);
                }
                if let Some(twice) = first_repeated(names) {
                    return Err(ReservationError::DuplicateNode(twice.to_string()));
                }
                let mut nodes = Vec::with_capacity(names.len());
                for name in names {
                    let node = cluster
                        .node_index(name.as_str())
                        .ok_or_else(|| ReservationError::UnknownNode(name.to_string()))?;
                    if let Some(e) = problem(node) {
                        return Err(e);
                    }
                    nodes.push(node);
                }
                nodes
            }
            NodeRequest::Count(0) => return Err(ReservationError::NoNodes),
            NodeRequest::Count(n) => {
                // From the top of the node list down, so that the packing of small jobs from
                // the bottom keeps away from reserved nodes.
                let free: Vec<usize> = (0..cluster.node_count())
                    .rev()
                    .filter(|node| problem(*node).is_none())
                    .collect();
                if free.len() < *n as usize {
                    return Err(ReservationError::NotEnoughNodes {
                        asked: *n,
                        available: free.len() as u32,
                    });
                }
                let mut nodes: Vec<usize> = free.into_iter().take(*n as usize).collect();
                nodes.sort_unstable();
                nodes
            }
        };
        self.list.push(AdvanceReservation {
            name: req.name,
            start_s: req.start_s,
            end_s: req.end_s,
            accounts: req.accounts,
            nodes,
        });
        Ok(self.list.last().unwrap_or_else(|| unreachable!()))
    }
}

/// The first item that comes again later in `items`.
fn first_repeated<T: Ord>(items: &[T]) -> Option<&T> {
    let mut seen = std::collections::BTreeSet::new();
    items.iter().find(|item| !seen.insert(*item))
}

/// One reservation in a reservations file.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReservationEntry {
    pub name: String,
    pub start: chrono::DateTime<chrono::Utc>,
    pub end: chrono::DateTime<chrono::Utc>,
    /// The first is the owner, billed for what goes unused.
    pub accounts: Vec<AccountId>,
    /// A number of nodes for the scheduler to choose...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    /// ...or the nodes by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_names: Vec<NodeId>,
}

#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct ReservationsFile {
    #[serde(default)]
    reservations: Vec<ReservationEntry>,
}

impl ReservationEntry {
    /// The request it makes; refused when it gives both a node count and node names.
    pub fn to_request(&self) -> Result<ReservationRequest, ReservationError> {
        let nodes = match (self.nodes, self.node_names.is_empty()) {
            (Some(_), false) => return Err(ReservationError::CountAndNames),
            (count, true) => NodeRequest::Count(count.unwrap_or(0)),
            (None, false) => NodeRequest::Names(self.node_names.clone()),
        };
        Ok(ReservationRequest {
            name: self.name.clone(),
            start_s: self.start.timestamp(),
            end_s: self.end.timestamp(),
            accounts: self.accounts.clone(),
            nodes,
        })
    }
}

/// Reads a reservations file (`[[reservations]]` with `name`, `start`, `end`, `accounts` and
/// `nodes` or `node_names`). Errors name the file, line and field.
pub fn parse_reservations(
    text: &str,
    origin: &str,
) -> Result<Vec<ReservationEntry>, gpuledger_model::ConfigError> {
    let file: ReservationsFile = gpuledger_model::config::parse_toml(text, origin)?;
    let mut errors = Vec::new();
    for (i, r) in file.reservations.iter().enumerate() {
        let at = |f: &str| format!("reservations[{i}].{f}");
        if r.end <= r.start {
            errors.push(field_error(at("end"), "must be after `start`"));
        }
        if !well_formed_name(&r.name) {
            let why = ReservationError::BadName(shown_name(&r.name)).to_string();
            errors.push(field_error(at("name"), &why));
        }
        if r.accounts.is_empty() {
            errors.push(field_error(at("accounts"), "name at least one account"));
        }
        if let Some(twice) = first_repeated(&r.accounts) {
            errors.push(field_error(
                at("accounts"),
                &format!("`{twice}` is named twice"),
            ));
        }
        if let Some(twice) = first_repeated(&r.node_names) {
            errors.push(field_error(
                at("node_names"),
                &format!("`{twice}` is named twice"),
            ));
        }
        match (r.nodes, r.node_names.is_empty()) {
            (Some(_), false) => errors.push(field_error(
                at("nodes"),
                "give `nodes` (a count) or `node_names`, not both",
            )),
            (None, true) | (Some(0), true) => {
                errors.push(field_error(at("nodes"), "reserve at least one node"))
            }
            _ => {}
        }
    }
    if errors.is_empty() {
        return Ok(file.reservations);
    }
    gpuledger_model::config::locate_lines(text, &mut errors);
    Err(gpuledger_model::ConfigError::Invalid {
        origin: origin.to_owned(),
        errors,
    })
}

/// Writes reservations in the format [`parse_reservations`] reads.
pub fn reservations_toml(entries: &[ReservationEntry]) -> String {
    toml::to_string(&ReservationsFile {
        reservations: entries.to_vec(),
    })
    .unwrap_or_default()
}

fn field_error(field: String, message: &str) -> gpuledger_model::config::FieldError {
    gpuledger_model::config::FieldError {
        field,
        line: None,
        message: message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservations_file_round_trips_and_bad_fields_are_named() {
        let text = "[[reservations]]\nname = \"flagship\"\nstart = \"2026-06-10T08:00:00Z\"\n\
                    end = \"2026-06-17T08:00:00Z\"\naccounts = [\"team-e\"]\nnodes = 64\n";
        let entries = parse_reservations(text, "r.toml").unwrap();
        let request = entries[0].to_request().unwrap();
        assert_eq!(request.end_s - request.start_s, 7 * 86_400);
        assert_eq!(
            parse_reservations(&reservations_toml(&entries), "again").unwrap(),
            entries
        );
        let bad = text.replace("nodes = 64", "nodes = 64\nnode_names = [\"gpu001\"]");
        let err = parse_reservations(&bad, "r.toml").unwrap_err().to_string();
        assert!(err.contains("reservations[0].nodes"), "{err}");
        for (from, to, field, says) in [
            (
                "\"flagship\"",
                "\"<b>flag</b>\"",
                "reservations[0].name",
                "use 1 to 64",
            ),
            (
                "[\"team-e\"]",
                "[\"team-e\", \"team-e\"]",
                "reservations[0].accounts",
                "`team-e` is named twice",
            ),
            (
                "nodes = 64",
                "node_names = [\"gpu001\", \"gpu001\"]",
                "reservations[0].node_names",
                "`gpu001` is named twice",
            ),
        ] {
            let err = parse_reservations(&text.replace(from, to), "r.toml")
                .unwrap_err()
                .to_string();
            assert!(err.contains(field) && err.contains(says), "{err}");
        }
        let unknown = text.replace("nodes = 64", "nodez = 64");
        assert!(parse_reservations(&unknown, "r.toml")
            .unwrap_err()
            .to_string()
            .contains("r.toml:6"));
    }
}
