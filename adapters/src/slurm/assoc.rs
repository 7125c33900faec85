//! `sacctmgr dump CLUSTER` to gpuledger's tenant tree. The dump is Slurm's flat file of
//! associations: a `Cluster - 'name':...` line, then `Parent - 'acct'` lines each followed by
//! the `Account - 'name':...` and `User - 'name':...` lines below that parent, each with
//! colon-separated limits (`Fairshare=`, `GrpTRES=`, `GrpTRESMins=`, `GrpJobs=`, `MaxJobs=`,
//! `MaxTRESPerJob=`, `MaxWall`/`MaxWallDurationPerJob=`, `Priority=`, `QOS=`, ...).
//!
//! gpuledger has two levels: an account (an account under Slurm's root) and its projects (the
//! accounts under it). The mapping, limit by limit:
//!
//! | Slurm | gpuledger |
//! |---|---|
//! | `Fairshare=N` | `weight` (`parent` or absent: 1) |
//! | `GrpJobs=N` | `max_running_jobs` |
//! | `GrpSubmitJobs=N` | `max_submit_jobs` (jobs pending or running at once) |
//! | `GrpTRES=gres/gpu=N` | `max_gpus` (GPUs held at once by the account's running jobs) |
//! | `GrpTRESMins=gres/gpu=M` | `gpu_hours_per_week` = M / 60 (Slurm's holds until its usage reset; gpuledger's is a rolling week) |
//! | `MaxTRESPerJob=gres/gpu=N` | `max_gpus_per_job` |
//! | `MaxWall=`, `MaxWallDurationPerJob=` | `max_run_time` |
//! | `Priority=N` | `priority` (1-100) |
//! | `Description=` | `name` |
//!
//! Everything else is reported, with its line, as not mapped: `GrpTRES` other than GPUs,
//! `MaxJobs` (a per-user limit in Slurm), CPU and memory TRES, QOS
//! (gpuledger's tiers are partitions), users (gpuledger authenticates per account), accounts
//! deeper than two levels (their jobs are booked to the project above them).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use gpuledger_model::config::MAX_SUBMIT_JOBS;
use gpuledger_model::quota::Quota;
use gpuledger_model::tenant::{Account, Project};
use gpuledger_model::units::DurationSpec;
use gpuledger_model::{AccountId, ProjectId};

use super::{duration, tres};
use crate::{LineError, Result};

/// One line of a dump: what it is, its name, its options, where it was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpLine {
    pub line: usize,
    pub kind: Kind,
    pub name: String,
    /// Options in file order, keys as written (`QOS+` kept), values unquoted.
    pub options: Vec<(String, String)>,
    /// The `Parent - ` in force (root before any).
    pub parent: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Cluster,
    Account,
    User,
    Qos,
}

impl DumpLine {
    /// An option's value by case-insensitive key (the last one wins, as in Slurm).
    pub fn option(&self, key: &str) -> Option<&str> {
        self.options
            .iter()
            .rev()
            .find(|(k, _)| k.trim_end_matches(['+', '-']).eq_ignore_ascii_case(key))
            .map(|(_, v)| v.as_str())
    }
}

/// Splits `a:b='x:y':c` at colons outside quotes.
fn split_options(text: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => quote = Some(c),
            (None, ':') => out.push(std::mem::take(&mut cur)),
            (None, c) => cur.push(c),
        }
    }
    if quote.is_some() {
        return Err("a quote is not closed".into());
    }
    out.push(cur);
    Ok(out)
}

/// Parses a dump; `origin` names it in errors.
pub fn parse_dump(text: &str, origin: &str) -> Result<Vec<DumpLine>> {
    let mut out = Vec::new();
    let mut parent = "root".to_owned();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let err = |message: String| LineError {
            origin: origin.to_owned(),
            line,
            message,
        };
        let t = raw.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let Some((object, rest)) = t.split_once(" - ") else {
            return Err(err(format!(
                "expected `Cluster|Parent|Account|User - 'name'[:options]`, got `{t}`"
            )));
        };
        let parts = split_options(rest).map_err(err)?;
        let name = parts[0].trim().to_owned();
        if name.is_empty() {
            return Err(err(format!("`{object}` without a name")));
        }
        let mut options = Vec::new();
        for p in parts[1..].iter().filter(|p| !p.trim().is_empty()) {
            match (p.split_once('='), options.last_mut()) {
                (Some((k, v)), _) => options.push((k.trim().to_owned(), v.trim().to_owned())),
                // `MaxWall=1-00:00:00` written by hand: the colons are the value's.
                (None, Some((_, v))) if p.chars().all(|c| c.is_ascii_digit()) => {
                    v.push(':');
                    v.push_str(p.trim());
                }
                (None, _) => return Err(err(format!("option `{p}` is not KEY=VALUE"))),
            }
        }
        let kind = match object.trim().to_ascii_lowercase().as_str() {
            "cluster" | "machine" => Kind::Cluster,
            "parent" => {
                parent = name;
                continue;
            }
            "account" | "project" => Kind::Account,
            "user" => Kind::User,
            "qos" => Kind::Qos,
            other => {
                return Err(err(format!(
                    "unknown object `{other}`; a dump has Cluster, Parent, Account, User (and QOS) lines"
                )))
            }
        };
        out.push(DumpLine {
            line,
            kind,
            name,
            options,
            parent: parent.clone(),
        });
    }
    if !out.iter().any(|l| l.kind == Kind::Cluster) {
        return Err(LineError {
            origin: origin.to_owned(),
            line: 1,
            message: "no `Cluster - 'name'` line: is this the output of `sacctmgr dump`?".into(),
        });
    }
    Ok(out)
}

/// Something of the dump that has no place in gpuledger, with its line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotMapped {
    pub line: usize,
    pub what: String,
    pub why: String,
}

/// The tenant tree a dump maps to, and what it could not map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Import {
    pub cluster: String,
    pub accounts: Vec<Account>,
    pub not_mapped: Vec<NotMapped>,
    /// Users, by account they sit under (gpuledger does not model users).
    pub users: BTreeMap<String, Vec<String>>,
}

/// Options that describe rather than limit, and are dropped without a word.
const DESCRIPTIVE: [&str; 5] = [
    "organization",
    "defaultaccount",
    "adminlevel",
    "coordinator",
    "defaultwckey",
];

fn why_not(key: &str) -> &'static str {
    match key {
        "grptres" => "gpuledger limits GPUs held at once, not CPUs or memory",
        "maxjobs" | "maxsubmitjobs" | "maxjobsaccrue" => {
            "a per-user limit in Slurm; gpuledger's limits are per account and project"
        }
        "qos" | "defaultqos" => {
            "gpuledger's priority tiers are partitions ([[partitions]] in the cluster config)"
        }
        "grpjobsaccrue" => "gpuledger does not limit the jobs that accrue age",
        "grpwall" | "grptresrunmins" | "maxtresminsperjob" | "maxtresrunmins" => {
            "gpuledger has no such limit"
        }
        "maxtrespernode" | "maxnodesperjob" | "grpnodes" => "gpuledger limits GPUs, not nodes",
        _ => "not a limit gpuledger knows",
    }
}

fn id_error(what: &str, name: &str, e: impl std::fmt::Display) -> String {
    format!("{what} `{name}` is not a valid gpuledger id ({e})")
}

/// The quota, weight and name of one account line; what did not map goes to `not_mapped`.
fn limits(l: &DumpLine, not_mapped: &mut Vec<NotMapped>) -> Result<(Quota, Option<u32>), String> {
    let mut quota = Quota::default();
    let mut weight = None;
    let mut skip = |what: String, why: &str| {
        not_mapped.push(NotMapped {
            line: l.line,
            what,
            why: why.to_owned(),
        })
    };
    for (key, value) in &l.options {
        let k = key.trim_end_matches(['+', '-']).to_ascii_lowercase();
        let int = |v: &str| -> Result<u64, String> {
            v.parse::<u64>()
                .map_err(|_| format!("`{key}={v}`: expected a whole number"))
        };
        match k.as_str() {
            "fairshare" => {
                if value.eq_ignore_ascii_case("parent") {
                    skip(
                        format!("{key}={value}"),
                        "gpuledger gives the account weight 1",
                    );
                } else {
                    let w = u32::try_from(int(value)?)
                        .map_err(|_| format!("`{key}={value}`: at most {}", u32::MAX))?;
                    if w == 0 {
                        skip(
                            format!("{key}={value}"),
                            "gpuledger's weights are at least 1; 1 used",
                        );
                    }
                    weight = Some(w.max(1));
                }
            }
            "grpjobs" => {
                quota.max_running_jobs =
                    Some(u32::try_from(int(value)?).map_err(|_| {
                        format!("`{key}={value}`: at most {} running jobs", u32::MAX)
                    })?);
            }
            "grpsubmitjobs" => {
                let n = int(value)?;
                let limit = u32::try_from(n)
                    .ok()
                    .filter(|n| (1..=MAX_SUBMIT_JOBS).contains(n))
                    .ok_or_else(|| {
                        format!("`{key}={value}`: gpuledger takes 1 to {MAX_SUBMIT_JOBS} jobs")
                    })?;
                quota.max_submit_jobs = Some(limit);
            }
            "priority" => {
                let p = int(value)?;
                if !(1..=100).contains(&p) {
                    skip(
                        format!("{key}={value}"),
                        "gpuledger's priority is 1-100; clamped",
                    );
                }
                quota.priority = Some(p.clamp(1, 100) as u8);
            }
            "maxwall" | "maxwalldurationperjob" => match duration(value) {
                None => {}
                Some(Ok(s)) => quota.max_run_time = Some(DurationSpec::from_secs(s)),
                Some(Err(e)) => return Err(format!("`{key}`: {e}")),
            },
            "maxtresperjob" | "maxtres" => {
                if let Some(g) = strict_tres_gpus(key, value)? {
                    quota.max_gpus_per_job = Some(u32::try_from(g).map_err(|_| {
                        format!("`{key}` gres/gpu={g}: at most {} GPUs per job", u32::MAX)
                    })?);
                }
                for other in tres(value).keys().filter(|t| !t.starts_with("gres/gpu")) {
                    skip(
                        format!("{key} {other}"),
                        "gpuledger limits GPUs per job, nothing else",
                    );
                }
            }
            "grptres" => {
                if let Some(g) = strict_tres_gpus(key, value)? {
                    quota.max_gpus = Some(u32::try_from(g).map_err(|_| {
                        format!("`{key}` gres/gpu={g}: at most {} GPUs at once", u32::MAX)
                    })?);
                }
                for other in tres(value).keys().filter(|t| !t.starts_with("gres/gpu")) {
                    skip(format!("{key} {other}"), why_not("grptres"));
                }
            }
            "grptresmins" => {
                if let Some(minutes) = strict_tres_gpus(key, value)? {
                    let hours = minutes.div_ceil(60);
                    if minutes % 60 != 0 {
                        skip(
                            format!("{key} gres/gpu={minutes}"),
                            "not whole GPU-hours; rounded up",
                        );
                    }
                    quota.gpu_hours_per_week = Some(hours);
                }
                for other in tres(value).keys().filter(|t| !t.starts_with("gres/gpu")) {
                    skip(format!("{key} {other}"), "gpuledger counts GPU-hours only");
                }
            }
            "description" => {}
            k if DESCRIPTIVE.contains(&k) => {}
            _ => skip(format!("{key}={value}"), why_not(&k)),
        }
    }
    Ok((quota, weight))
}

/// GPUs of a TRES limit, each entry checked: an entry that is not `name=count`, or a GPU count
/// that is not a whole number of at most 2^64-1 (or whose typed entries add up past it), is an
/// error naming the option, never a limit silently left out.
fn strict_tres_gpus(key: &str, value: &str) -> Result<Option<u64>, String> {
    let mut plain = None;
    let mut typed: Option<u64> = None;
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((name, count)) = entry.split_once('=') else {
            return Err(format!("`{key}`: `{entry}` is not NAME=COUNT"));
        };
        let name = name.trim().to_ascii_lowercase();
        if !name.starts_with("gres/gpu") {
            continue;
        }
        let count: u64 = count.trim().parse().map_err(|_| {
            format!(
                "`{key}` {name}={}: expected a whole number of at most {}",
                count.trim(),
                u64::MAX
            )
        })?;
        if name == "gres/gpu" {
            plain = Some(count);
        } else {
            typed = Some(typed.unwrap_or(0).checked_add(count).ok_or_else(|| {
                format!(
                    "`{key}`: the typed gres/gpu counts add up past {}",
                    u64::MAX
                )
            })?);
        }
    }
    Ok(plain.or(typed))
}

/// `name` and its ancestors up to (not including) root, and whether root was reached.
fn chain_to_root<'a>(
    parent_of: &BTreeMap<&'a str, &'a str>,
    name: &'a str,
) -> (Vec<&'a str>, bool) {
    let mut chain = vec![name];
    let mut at = name;
    while let Some(p) = parent_of.get(at).copied() {
        if p.eq_ignore_ascii_case("root") {
            return (chain, true);
        }
        if chain.contains(&p) || chain.len() > 64 {
            break;
        }
        chain.push(p);
        at = p;
    }
    (chain, false)
}

/// Maps a parsed dump to accounts and projects.
pub fn import(lines: &[DumpLine], origin: &str) -> Result<Import> {
    let err = |line: usize, message: String| LineError {
        origin: origin.to_owned(),
        line,
        message,
    };
    let cluster = lines
        .iter()
        .find(|l| l.kind == Kind::Cluster)
        .map(|l| l.name.clone())
        .unwrap_or_default();
    let mut not_mapped = Vec::new();
    // Each account's parent, to find its top-level ancestor.
    let parent_of: BTreeMap<&str, &str> = lines
        .iter()
        .filter(|l| l.kind == Kind::Account)
        .map(|l| (l.name.as_str(), l.parent.as_str()))
        .collect();
    let mut accounts: Vec<Account> = Vec::new();
    let mut users: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // Slurm's account names are one namespace: a name twice is a hand-edited or merged dump,
    // and which parent (and which limits) it meant cannot be told.
    let mut first_line: BTreeMap<&str, usize> = BTreeMap::new();
    for l in lines.iter().filter(|l| l.kind == Kind::Account) {
        if let Some(first) = first_line.insert(l.name.as_str(), l.line) {
            return Err(err(
                l.line,
                format!(
                    "account `{}` is defined twice (first on line {first})",
                    l.name
                ),
            ));
        }
    }
    for l in lines {
        match l.kind {
            Kind::Cluster => {
                for (k, v) in &l.options {
                    let key = k.trim_end_matches(['+', '-']).to_ascii_lowercase();
                    if key != "fairshare" && !DESCRIPTIVE.contains(&key.as_str()) {
                        not_mapped.push(NotMapped {
                            line: l.line,
                            what: format!("cluster {k}={v}"),
                            why: "cluster-wide defaults are not imported; set them per account"
                                .into(),
                        });
                    }
                }
            }
            Kind::Qos => not_mapped.push(NotMapped {
                line: l.line,
                what: format!("QOS {}", l.name),
                why: why_not("qos").into(),
            }),
            Kind::User => {
                users
                    .entry(l.parent.clone())
                    .or_default()
                    .push(l.name.clone());
                for (k, v) in &l.options {
                    let key = k.trim_end_matches(['+', '-']).to_ascii_lowercase();
                    if !DESCRIPTIVE.contains(&key.as_str()) && key != "fairshare" {
                        not_mapped.push(NotMapped {
                            line: l.line,
                            what: format!("user {} {k}={v}", l.name),
                            why: "gpuledger has no per-user limits".into(),
                        });
                    }
                }
            }
            Kind::Account => {
                let (quota, weight) = limits(l, &mut not_mapped).map_err(|m| err(l.line, m))?;
                let description = l
                    .option("description")
                    .filter(|d| !d.is_empty() && *d != l.name);
                let (chain, rooted) = chain_to_root(&parent_of, &l.name);
                if !rooted {
                    return Err(err(
                        l.line,
                        format!(
                            "account `{}` hangs below `{}`, which the dump never defines",
                            l.name, l.parent
                        ),
                    ));
                }
                match chain.len() {
                    1 => {
                        let id = AccountId::new(&l.name)
                            .map_err(|e| err(l.line, id_error("account", &l.name, e)))?;
                        accounts.push(Account {
                            run_as: None,
                            id,
                            name: description.unwrap_or(&l.name).to_owned(),
                            weight: weight.unwrap_or(1).max(1),
                            quota,
                            projects: Vec::new(),
                        });
                    }
                    2 => {
                        let id = ProjectId::new(&l.name)
                            .map_err(|e| err(l.line, id_error("project", &l.name, e)))?;
                        let Some(account) = accounts.iter_mut().find(|a| a.id.as_str() == chain[1])
                        else {
                            return Err(err(
                                l.line,
                                format!(
                                    "project `{}` comes before its account `{}`",
                                    l.name, chain[1]
                                ),
                            ));
                        };
                        if weight.is_some() {
                            not_mapped.push(NotMapped {
                                line: l.line,
                                what: format!("project {} Fairshare", l.name),
                                why: "gpuledger's fair share is per account; projects share theirs"
                                    .into(),
                            });
                        }
                        account.projects.push(Project {
                            id,
                            name: description.map(str::to_owned),
                            quota,
                            run_as: None,
                        });
                    }
                    n => not_mapped.push(NotMapped {
                        line: l.line,
                        what: format!(
                            "account {} ({} levels below root: {})",
                            l.name,
                            n,
                            chain.join(" < ")
                        ),
                        why: format!(
                            "gpuledger has accounts and projects; book its jobs to project `{}`",
                            chain[n - 2]
                        ),
                    }),
                }
            }
        }
    }
    for (parent, names) in &users {
        not_mapped.push(NotMapped {
            line: 0,
            what: format!("{} user(s) under {parent}: {}", names.len(), names.join(", ")),
            why: "gpuledger authenticates per account: give each team a tenant token (gpuledger token add --role tenant)".into(),
        });
    }
    Ok(Import {
        cluster,
        accounts,
        not_mapped,
        users,
    })
}

fn quota_toml(q: &Quota) -> String {
    let mut parts = Vec::new();
    if let Some(v) = q.max_running_jobs {
        parts.push(format!("max_running_jobs = {v}"));
    }
    if let Some(v) = q.max_gpus {
        parts.push(format!("max_gpus = {v}"));
    }
    if let Some(v) = q.gpu_hours_per_day {
        parts.push(format!("gpu_hours_per_day = {v}"));
    }
    if let Some(v) = q.gpu_hours_per_week {
        parts.push(format!("gpu_hours_per_week = {v}"));
    }
    if let Some(v) = q.max_gpus_per_job {
        parts.push(format!("max_gpus_per_job = {v}"));
    }
    if let Some(v) = q.max_run_time {
        parts.push(format!("max_run_time = \"{v}\""));
    }
    if let Some(v) = q.storage {
        parts.push(format!("storage = \"{v}\""));
    }
    if let Some(v) = q.priority {
        parts.push(format!("priority = {v}"));
    }
    if let Some(v) = q.max_submit_jobs {
        parts.push(format!("max_submit_jobs = {v}"));
    }
    format!("{{ {} }}", parts.join(", "))
}

fn toml_string(s: &str) -> String {
    let escaped = s.replace('\\', "\\\\").replace('"', "\\\"");
    format!("\"{escaped}\"")
}

/// The accounts as `[[accounts]]` tables of a cluster config.
pub fn accounts_toml(accounts: &[Account]) -> String {
    let mut out = String::new();
    for a in accounts {
        let _ = writeln!(out, "[[accounts]]");
        let _ = writeln!(out, "id = {}", toml_string(a.id.as_str()));
        let _ = writeln!(out, "name = {}", toml_string(&a.name));
        let _ = writeln!(out, "weight = {}", a.weight);
        if a.quota != Quota::default() {
            let _ = writeln!(out, "quota = {}", quota_toml(&a.quota));
        }
        if !a.projects.is_empty() {
            let _ = writeln!(out, "projects = [");
            for p in &a.projects {
                let mut fields = vec![format!("id = {}", toml_string(p.id.as_str()))];
                if let Some(n) = &p.name {
                    fields.push(format!("name = {}", toml_string(n)));
                }
                if p.quota != Quota::default() {
                    fields.push(format!("quota = {}", quota_toml(&p.quota)));
                }
                let _ = writeln!(out, "  {{ {} }},", fields.join(", "));
            }
            let _ = writeln!(out, "]");
        }
        out.push('\n');
    }
    out
}

/// The report of what was not mapped, a line each.
pub fn report(import: &Import) -> String {
    let mut out = String::new();
    for n in &import.not_mapped {
        let at = if n.line > 0 {
            format!("line {}: ", n.line)
        } else {
            String::new()
        };
        let _ = writeln!(out, "{at}{}: not mapped: {}", n.what, n.why);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = "# To edit this file start with a cluster line for the new cluster\n\
Cluster - 'tux':Fairshare=1:QOS='normal'\n\
Parent - 'root'\n\
User - 'root':DefaultAccount='root':AdminLevel='Administrator':Fairshare=1\n\
Account - 'physics':Description='Physics: theory and lab':Organization='science':Fairshare=40:GrpTRES=cpu=512,gres/gpu=64:GrpJobs=20:GrpSubmitJobs=500:MaxJobs=4:MaxTRESPerJob=cpu=64,gres/gpu=16:MaxWallDurationPerJob=2880:QOS='normal,high'\n\
Parent - 'physics'\n\
Account - 'lattice':Description='lattice':GrpTRESMins=gres/gpu=6000:MaxWall=1-00:00:00\n\
User - 'alice':DefaultAccount='physics':Fairshare=1:MaxJobs=2\n\
Parent - 'lattice'\n\
Account - 'lattice-a':Fairshare=1\n";

    #[test]
    fn a_dump_maps_to_accounts_projects_and_a_report() {
        let lines = parse_dump(DUMP, "tux.cfg").unwrap();
        let import = import(&lines, "tux.cfg").unwrap();
        assert_eq!(import.cluster, "tux");
        assert_eq!(import.accounts.len(), 1);
        let physics = &import.accounts[0];
        assert_eq!(
            physics.name, "Physics: theory and lab",
            "a colon inside quotes"
        );
        assert_eq!(physics.weight, 40);
        assert_eq!(physics.quota.max_running_jobs, Some(20));
        assert_eq!(physics.quota.max_submit_jobs, Some(500));
        assert_eq!(physics.quota.max_gpus_per_job, Some(16));
        assert_eq!(physics.quota.max_gpus, Some(64), "GrpTRES=gres/gpu");
        assert_eq!(
            physics.quota.max_run_time,
            Some(DurationSpec::from_secs(2 * 86_400))
        );
        let lattice = &physics.projects[0];
        assert_eq!(lattice.id.as_str(), "lattice");
        assert_eq!(
            lattice.name, None,
            "a description equal to the name adds nothing"
        );
        assert_eq!(lattice.quota.gpu_hours_per_week, Some(100));
        assert_eq!(
            lattice.quota.max_run_time,
            Some(DurationSpec::from_secs(86_400))
        );
        let report = report(&import);
        for expected in [
            "line 5: GrpTRES cpu: not mapped",
            "line 5: MaxJobs=4: not mapped",
            "line 5: MaxTRESPerJob cpu: not mapped",
            "line 5: QOS=normal,high: not mapped",
            "line 8: user alice MaxJobs=2: not mapped",
            "line 10: account lattice-a (3 levels below root",
            "book its jobs to project `lattice`",
            "cluster QOS=normal",
            "1 user(s) under physics: alice",
        ] {
            assert!(
                report.contains(expected),
                "missing `{expected}` in\n{report}"
            );
        }
    }

    #[test]
    fn an_account_defined_twice_is_refused_naming_both_lines() {
        let dump = "Cluster - 'c':Fairshare=1\nParent - 'root'\nAccount - 'teama':Fairshare=5\n\
                    Account - 'teamb'\nParent - 'teamb'\nAccount - 'teama':Fairshare=3\n";
        let lines = parse_dump(dump, "d.cfg").unwrap();
        let e = import(&lines, "d.cfg").unwrap_err().to_string();
        assert_eq!(
            e,
            "d.cfg:6: account `teama` is defined twice (first on line 3)"
        );
    }

    #[test]
    fn limits_past_what_gpuledger_counts_are_refused_with_file_line_and_option() {
        for (option, expected) in [
            (
                "MaxTRESPerJob=gres/gpu=4294967296",
                "`MaxTRESPerJob` gres/gpu=4294967296: at most 4294967295 GPUs per job",
            ),
            (
                "GrpTRESMins=gres/gpu=18446744073709551616",
                "`GrpTRESMins` gres/gpu=18446744073709551616: expected a whole number",
            ),
            (
                "GrpTRESMins='gres/gpu:a=18446744073709551615,gres/gpu:b=1'",
                "`GrpTRESMins`: the typed gres/gpu counts add up past",
            ),
            ("GrpJobs=4294967296", "at most 4294967295 running jobs"),
            ("GrpSubmitJobs=0", "gpuledger takes 1 to 1000000 jobs"),
            ("MaxTRES=gres/gpu=-1", "expected a whole number"),
            (
                "MaxTRESPerJob=cpu=4,gres/gpu",
                "`gres/gpu` is not NAME=COUNT",
            ),
        ] {
            let dump = format!("Cluster - 'x'\nParent - 'root'\nAccount - 'a':{option}\n");
            let lines = parse_dump(&dump, "d.cfg").unwrap();
            let err = import(&lines, "d.cfg").unwrap_err();
            assert_eq!((err.line, err.origin.as_str()), (3, "d.cfg"), "{option}");
            assert!(err.message.contains(expected), "{option}: {err}");
        }
    }

    #[test]
    fn a_weight_of_zero_is_reported_not_changed_silently() {
        let dump = "Cluster - 'x'\nParent - 'root'\nAccount - 'a':Fairshare=0\n";
        let import = import(&parse_dump(dump, "d.cfg").unwrap(), "d.cfg").unwrap();
        assert_eq!(import.accounts[0].weight, 1);
        assert!(
            report(&import).contains(
                "line 3: Fairshare=0: not mapped: gpuledger's weights are at least 1; 1 used"
            ),
            "{}",
            report(&import)
        );
    }

    #[test]
    fn bad_lines_name_their_line() {
        let err = parse_dump("Cluster - 'x'\nAccount - 'a':Fairshare\n", "d.cfg").unwrap_err();
        assert_eq!((err.line, err.origin.as_str()), (2, "d.cfg"));
        assert!(err.message.contains("KEY=VALUE"), "{err}");
        let err = parse_dump("Parent - 'root'\nAccount - 'a'\n", "d.cfg").unwrap_err();
        assert!(err.message.contains("Cluster"), "{err}");
        let lines = parse_dump("Cluster - 'x'\nAccount - 'a':GrpJobs=many\n", "d.cfg").unwrap();
        let err = import(&lines, "d.cfg").unwrap_err();
        assert_eq!(err.line, 2);
        assert!(err.message.contains("GrpJobs=many"), "{err}");
        let lines = parse_dump("Cluster - 'x'\nAccount - 'a b'\n", "d.cfg").unwrap();
        assert!(import(&lines, "d.cfg")
            .unwrap_err()
            .message
            .contains("not a valid gpuledger id"));
    }

    #[test]
    fn the_toml_reads_back_as_the_same_accounts() {
        let lines = parse_dump(DUMP, "tux.cfg").unwrap();
        let import = import(&lines, "tux.cfg").unwrap();
        #[derive(serde::Deserialize)]
        struct Accounts {
            accounts: Vec<Account>,
        }
        let text = accounts_toml(&import.accounts);
        let back: Accounts = toml_from(&text);
        assert_eq!(back.accounts, import.accounts, "{text}");
    }

    fn toml_from<T: serde::de::DeserializeOwned>(text: &str) -> T {
        gpuledger_model::config::parse_toml(text, "t").unwrap()
    }
}
