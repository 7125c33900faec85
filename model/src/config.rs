//! The cluster configuration file: nodes, partitions with priority tiers, fair share, the price
//! book and the tenant tree, loaded from TOML. Unknown keys are errors, and every error names
//! the field and its line and says what would be valid.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use chrono::NaiveDate;
use rust_decimal::Decimal;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::gpu::{GpuModel, GpuType};
use crate::ids::{AccountId, NodeId};
use crate::money::Currency;
use crate::tenant::{Account, TenantTree};
use crate::units::DurationSpec;

/// The config format version this build reads.
pub const CONFIG_VERSION: u32 = 1;

/// Most GPU types one cluster may have (the scheduler holds a job's types as a bit mask).
pub const MAX_GPU_TYPES: usize = 64;

/// Most nodes one pool may have (node names are `{prefix}{001..count}`).
pub const MAX_NODES_PER_POOL: u32 = 100_000;

/// The whole cluster configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Format version; must be [`CONFIG_VERSION`].
    pub version: u32,
    pub cluster: ClusterSection,
    pub node_pools: Vec<NodePool>,
    pub partitions: Vec<Partition>,
    #[serde(default)]
    pub fair_share: FairShareConfig,
    #[serde(default)]
    pub scheduler: SchedulerConfig,
    pub prices: PriceBookConfig,
    pub accounts: Vec<Account>,
    #[serde(default)]
    pub telemetry: TelemetryConfig,
}

/// How the aggregator treats what the exporters report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// A sample row or a job event labelled with an account, or a project of its account,
    /// that the config does not define: `refuse` the batch (422, naming the row), or book the
    /// row to the `platform` account (`platform`; an unknown project of a known account is
    /// dropped to the account itself), counted per node.
    pub unknown_tenants: UnknownTenants,
    /// Where each job's allocation (which GPUs it held, and when) comes from: `events` (the
    /// scheduler's or the Slurm follower's job events; a sample row counts for a job only on a
    /// GPU the job held then) or `none` (no allocation source, as dcgm-exporter on Kubernetes:
    /// rows are billed as labelled, the nodes trusted for which job ran).
    pub allocations: AllocationSource,
}

/// See [`TelemetryConfig::allocations`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AllocationSource {
    #[default]
    Events,
    None,
}

/// See [`TelemetryConfig::unknown_tenants`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum UnknownTenants {
    #[default]
    Refuse,
    Platform,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    pub name: String,
}

/// A set of identical nodes, named `{prefix}{001..count}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodePool {
    pub name: String,
    pub prefix: String,
    pub count: u32,
    pub gpus_per_node: u32,
    pub gpu_model: GpuModel,
    /// The type jobs ask for to run here (Slurm's GRES type in `--gres=gpu:TYPE:N`); the
    /// model's key when absent. Prices and MFU go by the model, scheduling by the type. Two pools of one model may be told apart by type (`a100_40g`,
    /// `a100_80g`); a type never names two models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<GpuType>,
    /// An account that owns this pool outright (a dedicated node pool); others may not use it.
    #[serde(default)]
    pub dedicated_to: Option<AccountId>,
}

/// A partition (queue) with a priority tier, as Slurm's `PriorityTier`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Partition {
    pub name: String,
    /// Higher tiers are considered first and may preempt lower ones.
    pub priority_tier: u32,
    /// Longest time limit a job may ask for here.
    #[serde(default)]
    pub max_time: Option<DurationSpec>,
    /// Jobs that name no partition go to the default one.
    #[serde(default)]
    pub default: bool,
    /// Time between SIGTERM and SIGKILL when a job here is preempted, unless the job asks for
    /// its own (Slurm `GraceTime`); the scheduler's `default_grace` when unset.
    #[serde(default)]
    pub grace_time: Option<DurationSpec>,
    /// The longest grace a job here may have, whatever it asks ([`DEFAULT_MAX_GRACE_S`] when
    /// unset): a job that traps its stop signal holds its GPUs at most this long.
    #[serde(default)]
    pub max_grace: Option<DurationSpec>,
    /// The accounts that may submit here (Slurm `AllowAccounts`); every account when unset.
    #[serde(default)]
    pub allowed_accounts: Option<Vec<AccountId>>,
}

/// A partition's `max_grace` when the config sets none: ten minutes.
pub const DEFAULT_MAX_GRACE_S: u64 = 600;

impl Partition {
    /// The longest grace a job here may have.
    pub fn max_grace_s(&self) -> u64 {
        self.max_grace.map_or(DEFAULT_MAX_GRACE_S, |g| g.as_secs())
    }

    /// Whether `account` may submit here.
    pub fn allows(&self, account: &AccountId) -> bool {
        self.allowed_accounts
            .as_ref()
            .is_none_or(|allowed| allowed.contains(account))
    }
}

/// Fair share from decayed usage: by default each account's usage against its share of the
/// accounts with work (`fair_tree`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FairShareConfig {
    /// Half-life of the exponential decay of past usage (Slurm `PriorityDecayHalfLife`).
    pub half_life: DurationSpec,
    /// How many decayed GPU-hours halve an account's priority (`weighted` only).
    pub usage_factor_gpu_hours: u64,
    /// `fair_tree` (default: accounts ranked by their normalised share over their normalised
    /// usage among the accounts with work, as Slurm's Fair Tree), `weighted` (the design's
    /// `weight / (1 + usage / factor)`) or `slurm_classic` (Slurm's `2^(-usage share /
    /// normalised share)`).
    #[serde(default)]
    pub formula: FairShareFormula,
}

/// How decayed usage turns into an account's fair-share factor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FairShareFormula {
    #[default]
    FairTree,
    Weighted,
    SlurmClassic,
}

impl Default for FairShareConfig {
    fn default() -> Self {
        FairShareConfig {
            half_life: DurationSpec::from_secs(7 * 86_400),
            usage_factor_gpu_hours: 1_000,
            formula: FairShareFormula::FairTree,
        }
    }
}

/// The scheduler's knobs: preemption, backfill and the weights of a job's priority (Slurm's
/// multifactor plugin: `PriorityWeightFairshare`, `PriorityWeightAge`, `PriorityWeightJobSize`,
/// `PriorityWeightQOS`). Every key has a default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerConfig {
    /// A job runs at least this long before it may be preempted (Slurm `PreemptExemptTime`).
    pub min_run_time: DurationSpec,
    /// Grace between SIGTERM and SIGKILL where neither job nor partition sets one.
    pub default_grace: DurationSpec,
    /// How many pending jobs get a planned start under conservative backfill (Slurm
    /// `bf_max_job_test`); later ones may only start where they delay none of those.
    pub backfill_depth: u32,
    /// Whether a higher tier may preempt a lower one.
    pub preemption: bool,
    /// Age at which a job's age factor reaches 1 (Slurm `PriorityMaxAge`).
    pub max_age: DurationSpec,
    pub weight_fair_share: u32,
    pub weight_age: u32,
    pub weight_job_size: u32,
    /// Weight of the quota's `priority` (1-100) dimension.
    pub weight_quota_priority: u32,
    /// The starvation bound: under backfill a job that has waited this long gets a planned
    /// start (a backfill reservation) whatever its priority, so that jobs behind it cannot keep
    /// starting in front of it.
    pub max_wait: DurationSpec,
    /// How many of the jobs past `max_wait` (the oldest) get planned starts in a cycle; 0 (the
    /// default) turns the bound off. Each plan keeps GPUs from everyone else's backfill: on the
    /// Philly months one at a time tripled the mean wait, and all at once turned the queue into
    /// FIFO by age (docs/benchmarks.md). That cost comes with overload: where demand stays
    /// below about three quarters of the cluster, `1` with a `max_wait` of `"5d"` kept every
    /// wait under 7 days at no cost in mean wait or weekly shares.
    pub max_wait_plans: u32,
    /// Under fair share with backfill, each account's first waiting job gets a planned start
    /// too, so that a small tenant's large job is not skipped for ever by smaller ones of
    /// others. Under FIFO, where age alone brings a job to the head, EASY plans each
    /// partition's first waiting job instead, whatever this says.
    pub plan_each_account: bool,
    /// Under fair share with backfill, the waiting jobs of an account holding less than its
    /// fair share of the cluster now (the cluster split by weight among the accounts with
    /// running or waiting work, none given more than it asks for) get planned starts, in
    /// queue order, until held and planned reach that share: an account under its share is
    /// not left waiting while smaller jobs of accounts over theirs take every GPU that frees
    /// up.
    pub plan_to_share: bool,
    /// Under fair share with the `fair_tree` formula, the accounts holding less than their
    /// fair share of the cluster now (the split `plan_to_share` plans up to) rank above every
    /// account holding its share or more, and by share over decayed usage among themselves.
    /// Without it an account that used much last week ranks below one that used little
    /// while holding several times its share today, and waits its payback out week after week.
    pub below_share_first: bool,
    /// The relief, under fair share with `fair_tree` and `below_share_first`: a job that has
    /// waited `relief_after` for GPUs (not for its own quota) ranks above every account holding
    /// at least `relief_floor_percent` of its fair share now, and below those holding less;
    /// such jobs go in their accounts' order among themselves, then by submission. Without it
    /// an account asking for several times its share waits its own backlog out at its share,
    /// for weeks; with it that account takes what the others hold above the floor (the weekly
    /// goal's 0.8), through each of its jobs that has waited that long, never its later jobs.
    /// Under backfill each lifted job gets a planned start in its place in the queue, while
    /// those planned in a cycle hold less than `100 - relief_floor_percent` percent of the
    /// cluster (at least one job).
    pub relief: bool,
    /// How long a job waits before the relief lifts it.
    pub relief_after: DurationSpec,
    /// The share (percent) below which an account still ranks above the jobs the relief lifts;
    /// what is left above it (percent of the cluster) bounds the lifted jobs' planned starts.
    pub relief_floor_percent: u32,
    /// Fair-share preemption (Kueue's reclaim within a cohort), under the fair-share policy:
    /// a job of an account below its fair share of the cluster now that stays within it once
    /// started, waiting at least `fair_share_preemption_after`, may preempt jobs of its tier
    /// or lower of accounts above theirs, only as far as each of those stays at or above its
    /// share. An account's room below its share goes to its waiting jobs in queue order: one
    /// that does not fit the room yet keeps it from the account's later jobs. Off by default:
    /// a preempted job loses its work since its last checkpoint.
    pub fair_share_preemption: bool,
    /// How long a job waits before it may preempt for its account's fair share.
    pub fair_share_preemption_after: DurationSpec,
    /// The most work a job may lose to fair-share preemption: only jobs whose time since
    /// their last checkpoint (reported, or by their `checkpoint_every`; since their start
    /// when they have none) is at most this are taken. A job that never checkpoints is safe
    /// once it has run this long: on the Philly months, whose jobs never do, taking any job
    /// redid a tenth of the cluster's work (docs/benchmarks.md). Tier preemption is not bound
    /// by it.
    pub fair_share_preemption_max_loss: DurationSpec,
    /// How long the scheduler keeps an ended job in its state (`scheduler jobs`, `GET
    /// /api/v1/jobs`); older ones are dropped, so the state file stays the size of the recent
    /// past. The aggregator keeps every job's events and usage for good (`GET
    /// /api/v1/jobs/{id}`, SQL).
    pub job_history: DurationSpec,
    /// The jobs one account may have pending or running at once, unless its quota sets its
    /// own `max_submit_jobs` (Slurm's `MaxSubmitJobs`; its `MaxJobCount` bounds the whole
    /// cluster): past it a submission is refused (429) until some end, so one tenant's script
    /// cannot fill the scheduler's memory and state file for everyone. The live scheduler's
    /// admission only; a replayed trace is not held to it.
    pub max_submit_jobs: u32,
}

/// The most jobs [`SchedulerConfig::max_submit_jobs`] (or a quota's) may allow one account.
pub const MAX_SUBMIT_JOBS: u32 = 1_000_000;

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            min_run_time: DurationSpec::from_secs(600),
            default_grace: DurationSpec::from_secs(300),
            backfill_depth: 100,
            preemption: true,
            max_age: DurationSpec::from_secs(7 * 86_400),
            weight_fair_share: 10_000,
            weight_age: 1_000,
            weight_job_size: 100,
            weight_quota_priority: 1_000,
            max_wait: DurationSpec::from_secs(86_400),
            max_wait_plans: 0,
            plan_each_account: true,
            plan_to_share: true,
            below_share_first: true,
            relief: true,
            relief_after: DurationSpec::from_secs(3 * 86_400),
            relief_floor_percent: 80,
            fair_share_preemption: false,
            fair_share_preemption_after: DurationSpec::from_secs(3600),
            fair_share_preemption_max_loss: DurationSpec::from_secs(3600),
            job_history: DurationSpec::from_secs(30 * 86_400),
            max_submit_jobs: 10_000,
        }
    }
}

/// Prices, versioned and effective from a date. Amounts are written as strings (`"10.00"`) so
/// that no float ever touches money.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PriceBookConfig {
    pub version: String,
    /// The date the prices take effect (`2026-06-01`).
    #[schemars(with = "String")]
    pub effective_from: NaiveDate,
    pub currency: Currency,
    /// Price of one GPU-hour, per GPU model; written as strings, a TOML float is refused.
    #[serde(deserialize_with = "decimals_from_strings")]
    #[schemars(with = "BTreeMap<GpuModel, String>")]
    pub gpu_hour: BTreeMap<GpuModel, Decimal>,
}

/// Reads one decimal written as a string (`"0.50"`); a TOML float is refused, since it lost
/// exactness when it was parsed.
pub fn decimal_from_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Decimal, D::Error> {
    use serde::de::Error as _;
    let text = String::deserialize(d)
        .map_err(|e| D::Error::custom(format!("{e}; write decimals as strings, e.g. \"0.50\"")))?;
    text.trim()
        .parse::<Decimal>()
        .map_err(|e| D::Error::custom(format!("`{text}` is not a decimal number: {e}")))
}

/// Reads a map of prices written as strings (`"10.00"`): a float would have lost exactness
/// before gpuledger ever saw it, so it is refused.
pub fn decimals_from_strings<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<GpuModel, Decimal>, D::Error> {
    use serde::de::Error as _;
    let raw: BTreeMap<GpuModel, String> = BTreeMap::deserialize(d).map_err(|e| {
        D::Error::custom(format!(
            "{e}; write prices as strings, e.g. h100-sxm = \"10.00\""
        ))
    })?;
    raw.into_iter()
        .map(|(model, text)| {
            text.trim()
                .parse::<Decimal>()
                .map(|price| (model, price))
                .map_err(|e| {
                    D::Error::custom(format!(
                        "price `{text}` for `{model}` is not a decimal number: {e}"
                    ))
                })
        })
        .collect()
}

/// A pool's type names its own model only: not another model's key, and not a type another
/// pool gives to GPUs of another model (a job asking for it would not know what it gets).
fn check_gpu_type(
    v: &mut Validator,
    at: &str,
    pool: &NodePool,
    type_models: &mut BTreeMap<GpuType, GpuModel>,
) {
    let gpu_type = pool.gpu_type();
    if let Some(named) = gpu_type.model().filter(|m| *m != pool.gpu_model) {
        return v.err(
            at,
            format!(
                "`{gpu_type}` is the key of the model {named}, not of this pool's {}",
                pool.gpu_model
            ),
        );
    }
    match type_models.get(&gpu_type) {
        Some(model) if *model != pool.gpu_model => v.err(
            at,
            format!(
                "type `{gpu_type}` already names {model} in another pool, not {}",
                pool.gpu_model
            ),
        ),
        _ => {
            type_models.insert(gpu_type, pool.gpu_model);
        }
    }
}

impl NodePool {
    /// What jobs ask for to run on this pool's nodes: its `gpu_type`, or its model's key.
    pub fn gpu_type(&self) -> GpuType {
        self.gpu_type
            .clone()
            .unwrap_or_else(|| GpuType::from(self.gpu_model))
    }
}

/// One node of the cluster, as the config expands it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    pub id: NodeId,
    pub gpus: u32,
    pub gpu_model: GpuModel,
    /// What jobs ask for to run here (the pool's `gpu_type`, or its model's key).
    pub gpu_type: GpuType,
    pub pool: String,
    pub dedicated_to: Option<AccountId>,
}

/// One problem with one field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// The field's path, e.g. `accounts[2].quota.priority`.
    pub field: String,
    /// 1-based line of the field in the file, where it could be found.
    pub line: Option<usize>,
    pub message: String,
}

impl FieldError {
    /// A problem with `field`, its line found later ([`ConfigError::invalid_in`]).
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            line: None,
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: `{}`: {}", self.field, self.message),
            None => write!(f, "`{}`: {}", self.field, self.message),
        }
    }
}

/// Why a config file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Not TOML, an unknown key, or a value of the wrong type.
    #[error("{origin}:{line}:{column}: {message}")]
    Syntax {
        origin: String,
        line: usize,
        column: usize,
        message: String,
    },
    /// Parsed, but some values are not valid together or alone.
    #[error("{origin}: {} invalid field(s):\n{}", errors.len(), list(errors))]
    Invalid {
        origin: String,
        errors: Vec<FieldError>,
    },
}

fn list(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(|e| format!("  {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl ConfigError {
    /// The refusal of `src` (read from `origin`) for `errors`, each with its field's line.
    pub fn invalid_in(src: &str, origin: &str, mut errors: Vec<FieldError>) -> Self {
        locate_lines(src, &mut errors);
        ConfigError::Invalid {
            origin: origin.to_owned(),
            errors,
        }
    }

    /// The field errors (empty for a syntax error).
    pub fn field_errors(&self) -> &[FieldError] {
        match self {
            ConfigError::Invalid { errors, .. } => errors,
            ConfigError::Syntax { .. } => &[],
        }
    }
}

impl ClusterConfig {
    /// Parses and validates a config. `origin` (usually the file name) prefixes every message.
    pub fn from_toml_str(src: &str, origin: &str) -> Result<Self, ConfigError> {
        let config: ClusterConfig = parse_toml(src, origin)?;
        let errors = config.validate();
        if errors.is_empty() {
            return Ok(config);
        }
        Err(ConfigError::invalid_in(src, origin, errors))
    }

    /// Every problem found, with field paths (lines are filled in by [`Self::from_toml_str`]).
    pub fn validate(&self) -> Vec<FieldError> {
        let mut v = Validator::default();
        if self.version != CONFIG_VERSION {
            v.err(
                "version",
                format!(
                    "version {} is not supported; this build reads version {CONFIG_VERSION}",
                    self.version
                ),
            );
        }
        if self.cluster.name.trim().is_empty() {
            v.err("cluster.name", "must not be empty".into());
        }
        self.validate_node_pools(&mut v);
        self.validate_partitions(&mut v);
        if self.fair_share.half_life.as_secs() == 0 {
            v.err(
                "fair_share.half_life",
                "must be longer than 0s, e.g. \"7d\"".into(),
            );
        }
        if self.fair_share.usage_factor_gpu_hours == 0 {
            v.err(
                "fair_share.usage_factor_gpu_hours",
                "must be at least 1".into(),
            );
        }
        if self.scheduler.max_age.as_secs() == 0 {
            v.err(
                "scheduler.max_age",
                "must be longer than 0s, e.g. \"7d\"".into(),
            );
        }
        if self.scheduler.max_wait.as_secs() < 60 {
            v.err(
                "scheduler.max_wait",
                "must be at least 1m, e.g. \"1d\" (every job older than it is planned a start)"
                    .into(),
            );
        }
        if self.scheduler.relief_after.as_secs() < 60 {
            v.err(
                "scheduler.relief_after",
                "must be at least 1m, e.g. \"3d\" (set relief = false to turn the relief off)"
                    .into(),
            );
        }
        if self.scheduler.relief_floor_percent > 100 {
            v.err(
                "scheduler.relief_floor_percent",
                format!(
                    "is {}; must be between 0 and 100 (percent of an account's fair share)",
                    self.scheduler.relief_floor_percent
                ),
            );
        }
        let history = self.scheduler.job_history.as_secs();
        if !(3600..=3650 * 86_400).contains(&history) {
            v.err(
                "scheduler.job_history",
                "must be between 1h and 3650d, e.g. \"30d\"".into(),
            );
        }
        check_submit_jobs(
            &mut v,
            "scheduler.max_submit_jobs",
            Some(self.scheduler.max_submit_jobs),
        );
        self.validate_prices(&mut v);
        self.validate_accounts(&mut v);
        v.errors
    }

    fn validate_node_pools(&self, v: &mut Validator) {
        if self.node_pools.is_empty() {
            v.err("node_pools", "at least one node pool is needed".into());
        }
        let mut prefixes = HashSet::new();
        let accounts: HashSet<&AccountId> = self.accounts.iter().map(|a| &a.id).collect();
        let mut type_models = BTreeMap::new();
        for (i, pool) in self.node_pools.iter().enumerate() {
            let at = |f: &str| format!("node_pools[{i}].{f}");
            if !(1..=MAX_NODES_PER_POOL).contains(&pool.count) {
                v.err(
                    &at("count"),
                    format!(
                        "{} is out of range; use 1 to {MAX_NODES_PER_POOL}",
                        pool.count
                    ),
                );
            }
            if !(1..=64).contains(&pool.gpus_per_node) {
                v.err(
                    &at("gpus_per_node"),
                    format!("{} is out of range; use 1 to 64", pool.gpus_per_node),
                );
            }
            if let Err(e) = NodeId::new(format!("{}001", pool.prefix)) {
                v.err(
                    &at("prefix"),
                    format!("node names built from it are not valid: {e}"),
                );
            }
            if !prefixes.insert(pool.prefix.as_str()) {
                v.err(
                    &at("prefix"),
                    format!(
                        "prefix `{}` is used by another pool; node names must be unique",
                        pool.prefix
                    ),
                );
            }
            if let Some(owner) = &pool.dedicated_to {
                if !accounts.contains(owner) {
                    v.err(
                        &at("dedicated_to"),
                        format!("account `{owner}` is not defined in [[accounts]]"),
                    );
                }
            }
            check_gpu_type(v, &at("gpu_type"), pool, &mut type_models);
        }
        if type_models.len() > MAX_GPU_TYPES {
            v.err(
                "node_pools",
                format!(
                    "{} GPU types; at most {MAX_GPU_TYPES} in one cluster",
                    type_models.len()
                ),
            );
        }
    }

    fn validate_partitions(&self, v: &mut Validator) {
        if self.partitions.is_empty() {
            v.err("partitions", "at least one partition is needed".into());
        }
        let mut names = HashSet::new();
        for (i, p) in self.partitions.iter().enumerate() {
            if !names.insert(p.name.as_str()) {
                v.err(
                    &format!("partitions[{i}].name"),
                    format!("partition `{}` is defined twice", p.name),
                );
            }
            if !(1..=100).contains(&p.priority_tier) {
                v.err(
                    &format!("partitions[{i}].priority_tier"),
                    format!("{} is out of range; use 1 to 100", p.priority_tier),
                );
            }
            if let Some(grace) = p.grace_time.filter(|g| g.as_secs() > p.max_grace_s()) {
                v.err(
                    &format!("partitions[{i}].grace_time"),
                    format!(
                        "{grace} is longer than the partition's max_grace ({})",
                        DurationSpec::from_secs(p.max_grace_s())
                    ),
                );
            }
            let accounts: HashSet<&AccountId> = self.accounts.iter().map(|a| &a.id).collect();
            for (j, account) in p.allowed_accounts.iter().flatten().enumerate() {
                if !accounts.contains(account) {
                    v.err(
                        &format!("partitions[{i}].allowed_accounts[{j}]"),
                        format!("account `{account}` is not defined in [[accounts]]"),
                    );
                }
            }
        }
        let defaults = self.partitions.iter().filter(|p| p.default).count();
        if defaults > 1 {
            v.err(
                "partitions",
                format!("{defaults} partitions say `default = true`; at most one may"),
            );
        }
    }

    fn validate_prices(&self, v: &mut Validator) {
        for (model, price) in &self.prices.gpu_hour {
            if price.is_sign_negative() {
                v.err(
                    &format!("prices.gpu_hour.{model}"),
                    format!("{price} is negative; a price is 0 or more"),
                );
            }
        }
        let mut missing: Vec<GpuModel> = self
            .node_pools
            .iter()
            .map(|p| p.gpu_model)
            .filter(|m| !self.prices.gpu_hour.contains_key(m))
            .collect();
        missing.dedup();
        for model in missing {
            v.err(
                "prices.gpu_hour",
                format!("no price for `{model}`, which node pools use; add `{model} = \"10.00\"`"),
            );
        }
    }

    fn validate_accounts(&self, v: &mut Validator) {
        if self.accounts.is_empty() {
            v.err("accounts", "at least one account is needed".into());
        }
        let mut ids = HashSet::new();
        for (i, acc) in self.accounts.iter().enumerate() {
            let at = |f: &str| format!("accounts[{i}].{f}");
            if !ids.insert(&acc.id) {
                v.err(&at("id"), format!("account `{}` is defined twice", acc.id));
            }
            if acc.weight == 0 {
                v.err(
                    &at("weight"),
                    "must be at least 1 (weights are relative shares)".into(),
                );
            }
            check_priority(v, &at("quota.priority"), acc.quota.priority);
            check_gpu_hours(v, &at("quota"), &acc.quota);
            check_submit_jobs(v, &at("quota.max_submit_jobs"), acc.quota.max_submit_jobs);
            let mut project_ids = HashSet::new();
            for (j, proj) in acc.projects.iter().enumerate() {
                let pat = |f: &str| format!("accounts[{i}].projects[{j}].{f}");
                if !project_ids.insert(&proj.id) {
                    v.err(
                        &pat("id"),
                        format!(
                            "project `{}` is defined twice in account `{}`",
                            proj.id, acc.id
                        ),
                    );
                }
                check_priority(v, &pat("quota.priority"), proj.quota.priority);
                check_gpu_hours(v, &pat("quota"), &proj.quota);
                check_submit_jobs(v, &pat("quota.max_submit_jobs"), proj.quota.max_submit_jobs);
                for dim in proj.quota.exceeded_dimensions(&acc.quota) {
                    v.err(
                        &pat(&format!("quota.{}", dim.field())),
                        format!(
                            "exceeds account `{}`'s limit; a project never exceeds its account",
                            acc.id
                        ),
                    );
                }
            }
        }
    }

    /// Every node, expanded from the pools in order.
    pub fn nodes(&self) -> Vec<NodeSpec> {
        let mut nodes = Vec::new();
        for pool in &self.node_pools {
            for n in 1..=pool.count {
                let Ok(id) = NodeId::new(format!("{}{n:03}", pool.prefix)) else {
                    continue; // refused by validate()
                };
                nodes.push(NodeSpec {
                    id,
                    gpus: pool.gpus_per_node,
                    gpu_model: pool.gpu_model,
                    gpu_type: pool.gpu_type(),
                    pool: pool.name.clone(),
                    dedicated_to: pool.dedicated_to.clone(),
                });
            }
        }
        nodes
    }

    pub fn total_gpus(&self) -> u64 {
        self.node_pools
            .iter()
            .map(|p| u64::from(p.count) * u64::from(p.gpus_per_node))
            .sum()
    }

    pub fn tenants(&self) -> TenantTree {
        TenantTree::new(self.accounts.iter().cloned())
    }

    pub fn partition(&self, name: &str) -> Option<&Partition> {
        self.partitions.iter().find(|p| p.name == name)
    }

    /// The partition jobs go to when they name none: the one marked default, else the first.
    pub fn default_partition(&self) -> Option<&Partition> {
        self.partitions
            .iter()
            .find(|p| p.default)
            .or(self.partitions.first())
    }
}

/// The most GPU-hours a quota window may allow: far past any cluster, and small enough that
/// the window in GPU-seconds fits the signed arithmetic that checks it.
pub const MAX_QUOTA_GPU_HOURS: u64 = 1_000_000_000_000;

fn check_gpu_hours(v: &mut Validator, quota_field: &str, quota: &crate::quota::Quota) {
    for (name, value) in [
        ("gpu_hours_per_day", quota.gpu_hours_per_day),
        ("gpu_hours_per_week", quota.gpu_hours_per_week),
    ] {
        if let Some(hours) = value.filter(|h| *h > MAX_QUOTA_GPU_HOURS) {
            v.err(
                &format!("{quota_field}.{name}"),
                format!("{hours} is out of range; use at most {MAX_QUOTA_GPU_HOURS}"),
            );
        }
    }
}

fn check_submit_jobs(v: &mut Validator, field: &str, jobs: Option<u32>) {
    if let Some(n) = jobs.filter(|n| !(1..=MAX_SUBMIT_JOBS).contains(n)) {
        v.err(
            field,
            format!("{n} is out of range; use 1 to {MAX_SUBMIT_JOBS}"),
        );
    }
}

fn check_priority(v: &mut Validator, field: &str, priority: Option<u8>) {
    if let Some(p) = priority {
        if !(1..=100).contains(&p) {
            v.err(field, format!("{p} is out of range; use 1 to 100"));
        }
    }
}

#[derive(Default)]
struct Validator {
    errors: Vec<FieldError>,
}

impl Validator {
    fn err(&mut self, field: &str, message: String) {
        self.errors.push(FieldError::new(field, message));
    }
}

/// Deserialises TOML, turning serde's error into one with a line and column.
pub fn parse_toml<T: serde::de::DeserializeOwned>(
    src: &str,
    origin: &str,
) -> Result<T, ConfigError> {
    toml::from_str(src).map_err(|e| {
        let offset = e.span().map(|s| s.start).unwrap_or(0);
        let (line, column) = line_col(src, offset);
        ConfigError::Syntax {
            origin: origin.to_owned(),
            line,
            column,
            message: e.message().trim().to_owned(),
        }
    })
}

/// 1-based line and column of a byte offset.
pub fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let before = &src[..offset.min(src.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
    (line, column)
}

/// Fills in the line of each field error by walking the document to the field's path.
pub fn locate_lines(src: &str, errors: &mut [FieldError]) {
    let Ok(doc) = toml_edit::Document::parse(src) else {
        return;
    };
    for err in errors.iter_mut() {
        err.line = locate::span_of(doc.as_item(), &err.field).map(|offset| line_col(src, offset).0);
    }
}

mod locate {
    use toml_edit::{Item, Value};

    enum Seg<'a> {
        Key(&'a str),
        Index(usize),
    }

    fn segments(path: &str) -> Vec<Seg<'_>> {
        let mut out = Vec::new();
        for part in path.split('.') {
            let (key, rest) = part.split_once('[').unwrap_or((part, ""));
            if !key.is_empty() {
                out.push(Seg::Key(key));
            }
            for idx in rest.split('[') {
                if let Ok(i) = idx.trim_end_matches(']').parse() {
                    out.push(Seg::Index(i));
                }
            }
        }
        out
    }

    #[derive(Clone, Copy)]
    enum Node<'a> {
        Item(&'a Item),
        Value(&'a Value),
        Table(&'a toml_edit::Table),
    }

    impl<'a> Node<'a> {
        fn span_start(self) -> Option<usize> {
            match self {
                Node::Item(i) => i.span().map(|s| s.start),
                Node::Value(v) => v.span().map(|s| s.start),
                Node::Table(t) => t.span().map(|s| s.start),
            }
        }

        fn child(self, seg: &Seg<'_>) -> Option<(Node<'a>, Option<usize>)> {
            match (self, seg) {
                (Node::Item(Item::Table(t)), Seg::Key(k)) | (Node::Table(t), Seg::Key(k)) => {
                    let key_span = t.key(k).and_then(|key| key.span()).map(|s| s.start);
                    t.get(k).map(|i| (Node::Item(i), key_span))
                }
                (Node::Item(Item::Value(v)), seg) => Node::Value(v).child(seg),
                (Node::Value(Value::InlineTable(t)), Seg::Key(k)) => {
                    let key_span = t.key(k).and_then(|key| key.span()).map(|s| s.start);
                    t.get(k).map(|v| (Node::Value(v), key_span))
                }
                (Node::Item(Item::ArrayOfTables(a)), Seg::Index(i)) => {
                    a.get(*i).map(|t| (Node::Table(t), None))
                }
                (Node::Value(Value::Array(a)), Seg::Index(i)) => {
                    a.get(*i).map(|v| (Node::Value(v), None))
                }
                _ => None,
            }
        }
    }

    /// Byte offset of the deepest part of `path` that exists in the document.
    pub(super) fn span_of(root: &Item, path: &str) -> Option<usize> {
        let mut node = Node::Item(root);
        let mut best = None;
        for seg in segments(path) {
            match node.child(&seg) {
                Some((child, key_span)) => {
                    best = key_span.or(child.span_start()).or(best);
                    node = child;
                }
                None => break,
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"version = 1
[cluster]
name = "t"

[[node_pools]]
name = "p"
prefix = "n"
count = 2
gpus_per_node = 8
gpu_model = "h100-sxm"

[[partitions]]
name = "train"
priority_tier = 20

[prices]
version = "v1"
effective_from = "2026-01-01"
currency = "CNY"
gpu_hour = { h100-sxm = "10.00" }

[[accounts]]
id = "a"
name = "A"
weight = 1
"#;

    #[test]
    fn minimal_config_loads() {
        let c = ClusterConfig::from_toml_str(MINIMAL, "t.toml").unwrap();
        assert_eq!(c.total_gpus(), 16);
        assert_eq!(c.nodes()[1].id.as_str(), "n002");
    }

    #[test]
    fn unknown_key_is_an_error_with_its_line() {
        let src = MINIMAL.replace("weight = 1", "weight = 1\nwieght = 2");
        let err = ClusterConfig::from_toml_str(&src, "t.toml").unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("t.toml:26:1:"), "{text}");
        assert!(text.contains("unknown field `wieght`"), "{text}");
    }

    #[test]
    fn out_of_range_values_name_field_and_line() {
        let src = MINIMAL.replace("priority_tier = 20", "priority_tier = 500");
        let err = ClusterConfig::from_toml_str(&src, "t.toml").unwrap_err();
        let errors = err.field_errors();
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].field, "partitions[0].priority_tier");
        assert_eq!(errors[0].line, Some(14));
        assert_eq!(errors[0].message, "500 is out of range; use 1 to 100");
    }

    #[test]
    fn the_relief_is_on_by_default_and_its_bounds_name_field_and_line() {
        let c = ClusterConfig::from_toml_str(MINIMAL, "t.toml").unwrap();
        let s = &c.scheduler;
        assert!(s.relief);
        assert_eq!(
            (s.relief_after.as_secs(), s.relief_floor_percent),
            (3 * 86_400, 80)
        );
        let src =
            format!("{MINIMAL}[scheduler]\nrelief_after = \"30s\"\nrelief_floor_percent = 120\n");
        let err = ClusterConfig::from_toml_str(&src, "t.toml").unwrap_err();
        let fields: Vec<(&str, Option<usize>)> = err
            .field_errors()
            .iter()
            .map(|e| (e.field.as_str(), e.line))
            .collect();
        assert_eq!(
            fields,
            [
                ("scheduler.relief_after", Some(27)),
                ("scheduler.relief_floor_percent", Some(28)),
            ],
            "{err}"
        );
        let src = format!("{MINIMAL}[scheduler]\nrelief = false\nrelief_floor_percent = 0\n");
        let c = ClusterConfig::from_toml_str(&src, "t.toml").unwrap();
        assert!(!c.scheduler.relief);
    }

    #[test]
    fn numbers_past_what_the_arithmetic_holds_are_refused_by_field_and_line() {
        for (from, to, field, says) in [
            (
                "count = 2",
                "count = 4000000000",
                "node_pools[0].count",
                "out of range",
            ),
            (
                "weight = 1",
                "weight = 1\nquota = { gpu_hours_per_week = 9223372036854775807 }",
                "accounts[0].quota.gpu_hours_per_week",
                "use at most 1000000000000",
            ),
            (
                "weight = 1",
                "weight = 1\nquota = { max_submit_jobs = 0 }",
                "accounts[0].quota.max_submit_jobs",
                "use 1 to 1000000",
            ),
            (
                "weight = 1",
                "weight = 1\nquota = { max_submit_jobs = 10 }\n\
                 projects = [{ id = \"p\", quota = { max_submit_jobs = 11 } }]",
                "accounts[0].projects[0].quota.max_submit_jobs",
                "a project never exceeds its account",
            ),
            (
                "name = \"t\"\n",
                "name = \"t\"\n[scheduler]\nmax_submit_jobs = 2000000\n",
                "scheduler.max_submit_jobs",
                "use 1 to 1000000",
            ),
        ] {
            let src = MINIMAL.replace(from, to);
            let err = ClusterConfig::from_toml_str(&src, "t.toml").unwrap_err();
            let errors = err.field_errors();
            assert_eq!(errors.len(), 1, "{err}");
            assert_eq!(errors[0].field, field);
            assert!(errors[0].line.is_some(), "{err}");
            assert!(errors[0].message.contains(says), "{err}");
        }
        // Wider than the field's type: refused by the parser, with its line.
        let src = MINIMAL.replace("count = 2", "count = 40000000000");
        let err = ClusterConfig::from_toml_str(&src, "t.toml")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("t.toml:8:"), "{err}");
        // A duration past a hundred years (it would wrap the signed seconds it is used in).
        let src = MINIMAL.replace(
            "priority_tier = 20",
            "priority_tier = 20\nmax_time = \"15000000000000w\"",
        );
        let err = ClusterConfig::from_toml_str(&src, "t.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("at most 100 years"), "{err}");
    }

    #[test]
    fn a_partition_bounds_its_grace_and_names_only_known_accounts() {
        let src = MINIMAL.replace(
            "priority_tier = 20",
            "priority_tier = 20\ngrace_time = \"1h\"\nallowed_accounts = [\"a\", \"zz\"]",
        );
        let err = ClusterConfig::from_toml_str(&src, "t.toml").unwrap_err();
        let fields: Vec<(&str, &str)> = err
            .field_errors()
            .iter()
            .map(|e| (e.field.as_str(), e.message.as_str()))
            .collect();
        assert_eq!(
            fields,
            [
                (
                    "partitions[0].grace_time",
                    "1h is longer than the partition's max_grace (10m)"
                ),
                (
                    "partitions[0].allowed_accounts[1]",
                    "account `zz` is not defined in [[accounts]]"
                ),
            ]
        );
        let src = MINIMAL.replace(
            "priority_tier = 20",
            "priority_tier = 20\ngrace_time = \"1h\"\nmax_grace = \"2h\"\nallowed_accounts = [\"a\"]",
        );
        let config = ClusterConfig::from_toml_str(&src, "t.toml").unwrap();
        assert_eq!(config.partitions[0].max_grace_s(), 7200);
        assert!(config.partitions[0].allows(&"a".parse().unwrap()));
    }

    #[test]
    fn a_pools_gpu_type_names_its_own_model_only() {
        let pool = |name: &str, model: &str, gpu_type: &str| {
            format!(
                "[[node_pools]]\nname = \"{name}\"\nprefix = \"{name}\"\ncount = 1\n\
                 gpus_per_node = 4\ngpu_model = \"{model}\"\n{gpu_type}\n"
            )
        };
        let with = |pools: &[String]| {
            MINIMAL
                .replace(
                    "[[partitions]]",
                    &format!("{}\n[[partitions]]", pools.concat()),
                )
                .replace(
                    "gpu_hour = { h100-sxm = \"10.00\" }",
                    "gpu_hour = { h100-sxm = \"10.00\", a100 = \"4.00\", h200 = \"12.00\" }",
                )
        };
        let config = ClusterConfig::from_toml_str(
            &with(&[
                pool("x", "a100", "gpu_type = \"a100_80g\""),
                pool("y", "a100", "gpu_type = \"A100\""),
            ]),
            "t.toml",
        )
        .unwrap();
        let types: Vec<String> = config
            .nodes()
            .iter()
            .map(|n| n.gpu_type.to_string())
            .collect();
        assert_eq!(types, ["h100-sxm", "h100-sxm", "a100_80g", "a100"]);

        let refused = |pools: &[String]| {
            let err = ClusterConfig::from_toml_str(&with(pools), "t.toml").unwrap_err();
            err.field_errors()
                .iter()
                .map(|e| format!("{}: {}", e.field, e.message))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            refused(&[pool("x", "a100", "gpu_type = \"h100\"")]),
            ["node_pools[1].gpu_type: `h100-sxm` is the key of the model h100-sxm, not of this pool's a100"]
        );
        assert_eq!(
            refused(&[
                pool("x", "a100", "gpu_type = \"big\""),
                pool("y", "h200", "gpu_type = \"big\""),
            ]),
            ["node_pools[2].gpu_type: type `big` already names a100 in another pool, not h200"]
        );
        let many: Vec<String> = (0..64)
            .map(|i| pool(&format!("k{i}-"), "a100", &format!("gpu_type = \"k{i}\"")))
            .collect();
        assert_eq!(
            refused(&many),
            ["node_pools: 65 GPU types; at most 64 in one cluster"]
        );
        let err = ClusterConfig::from_toml_str(
            &with(&[pool("x", "a100", "gpu_type = \"a:b\"")]),
            "t.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("t.toml:18:") && err.contains("not a GPU type"),
            "{err}"
        );
    }
}
