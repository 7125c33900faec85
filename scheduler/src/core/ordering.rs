//! Queue order: within tiers, FIFO or Slurm's multifactor priority (fair share, age, job
//! size, quota priority), ties broken by submission order.

use super::*;
use crate::fairshare::{relief_factor, water_fill, Standing};

impl Scheduler {
    /// Each account's fair-share factor in [0, 1], in `account_ids` order: Fair Tree's rank
    /// by share over usage among the accounts with work ([`fair_tree_factors`]), the design's
    /// `weight / (1 + usage / factor)` over the largest weight, or Slurm's classic
    /// `2^(-usage share / normalised share)`. With `below_share_first` the accounts holding
    /// less than their share now rank first (under `fair_tree`).
    pub fn fair_share_factors(&self, now: UnixSeconds) -> Vec<f64> {
        self.fair_share_factors_given(now, &self.standings(None))
    }

    /// Whether accounts below their share now rank first (`below_share_first`, `fair_tree`).
    pub(super) fn ranks_below_share_first(&self) -> bool {
        self.knobs.below_share_first && self.formula == FairShareFormula::FairTree
    }

    /// How long a job waits for GPUs before the relief lifts it, where the relief is on (it
    /// needs the standings `below_share_first` ranks by).
    pub(super) fn relief_after_s(&self) -> Option<i64> {
        (self.knobs.relief && self.ranks_below_share_first())
            .then(|| self.knobs.relief_after.as_secs() as i64)
    }

    /// Share units the relief's planned starts may hold in one cycle: what the relief may take
    /// from the accounts above its floor, `100 - relief_floor_percent` percent of the cluster.
    pub(super) fn relief_plan_units(&self) -> u64 {
        let percent = 100u64.saturating_sub(u64::from(self.knobs.relief_floor_percent));
        u64::from(self.cluster.total_gpus()) * u64::from(SHARE_UNITS_PER_GPU) * percent / 100
    }

    /// Where each account stands against its share now, in `account_ids` order, from this
    /// cycle's [`Scheduler::fair_shares`] when the cycle has them (`None`: worked out here);
    /// empty where the ranking does not look at shares.
    fn standings(&self, split: Option<&[(i64, i64)]>) -> Vec<Standing> {
        if !self.ranks_below_share_first() {
            return Vec::new();
        }
        let floor = self
            .relief_after_s()
            .map(|_| self.knobs.relief_floor_percent);
        let of = |(share, held): &(i64, i64)| Standing::of(*share, *held, floor);
        match split {
            Some(split) => split.iter().map(of).collect(),
            None => self.fair_shares().iter().map(of).collect(),
        }
    }

    fn fair_share_factors_given(&self, now: UnixSeconds, standings: &[Standing]) -> Vec<f64> {
        let weights: Vec<f64> = self
            .account_ids
            .iter()
            .map(|id| f64::from(self.tenants.account(id).map_or(0, |a| a.weight)))
            .collect();
        let usage: Vec<f64> = self
            .account_ids
            .iter()
            .map(|id| self.ledger.gpu_hours(id, now))
            .collect();
        account_factors(
            self.formula,
            self.ledger.params().factor_gpu_hours,
            &weights,
            &usage,
            &self.accounts_with_demand(),
            standings,
        )
    }

    /// Each account's fair share of the cluster now and what it holds, in share units, in
    /// `account_ids` order: the cluster split by weight among the accounts with running or
    /// waiting work, none given more than it holds and waits for ([`water_fill`], the measure
    /// `report.md` sets each week against). A job being preempted no longer counts for its
    /// account, a preemptor waiting for its victims already does. Their difference is what
    /// `plan_to_share` plans up to and `fair_share_preemption` takes back.
    pub(super) fn fair_shares(&self) -> Vec<(i64, i64)> {
        let unit = u64::from(SHARE_UNITS_PER_GPU);
        let mut held: Vec<i64> = self
            .account_ids
            .iter()
            .map(|id| self.held(&(id.clone(), None)) as i64)
            .collect();
        let mut demand = vec![0u64; held.len()];
        for (d, units) in demand.iter_mut().zip(self.pending.waiting_units()) {
            *d = *units;
        }
        if !self.claims.is_empty() {
            for hot in self.pending.hot() {
                if hot.claimed() {
                    let account = hot.account;
                    if let (Some(h), Some(d)) = (held.get_mut(account), demand.get_mut(account)) {
                        *h += hot.units as i64;
                        *d = d.saturating_sub(hot.units);
                    }
                }
            }
        }
        for job in self.running.values().filter(|r| r.preempting.is_some()) {
            if let Some(&i) = self.account_index.get(&job.spec.account) {
                held[i] -= job.placement.share_units() as i64;
            }
        }
        let claims: Vec<(f64, f64)> = self
            .account_ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let weight = f64::from(self.tenants.account(id).map_or(0, |a| a.weight));
                let capacity = u64::from(self.capacity.get(id).copied().unwrap_or(0)) * unit;
                let asks = held[i].max(0) as u64 + demand[i];
                (weight, asks.min(capacity) as f64)
            })
            .collect();
        let total = u64::from(self.cluster.total_gpus()) * unit;
        water_fill(total as f64, &claims)
            .into_iter()
            .zip(held)
            .map(|(share, held)| (share.floor() as i64, held.max(0)))
            .collect()
    }

    /// Which accounts have running or waiting jobs, in `account_ids` order.
    fn accounts_with_demand(&self) -> Vec<bool> {
        let mut demand = vec![false; self.account_ids.len()];
        for (d, units) in demand.iter_mut().zip(self.pending.waiting_units()) {
            *d = *units > 0;
        }
        for (account, running) in &self.running_per_account {
            if *running > 0 {
                if let Some(&i) = self.account_index.get(account) {
                    demand[i] = true;
                }
            }
        }
        demand
    }

    /// The fair-share factor of one account now, in [0, 1].
    pub fn fair_share_of(&self, account: &AccountId, now: UnixSeconds) -> f64 {
        self.account_index
            .get(account)
            .and_then(|i| self.fair_share_factors(now).get(*i).copied())
            .unwrap_or(0.0)
    }

    /// The priority a job of this shape would have now under fair share.
    pub fn priority_of(&self, spec: &JobSpec, now: UnixSeconds) -> f64 {
        let fair_share = self.fair_share_of(&spec.account, now);
        let quota_priority = self.limits_for(spec).quota_priority;
        self.priority_weights()
            .parts(
                spec.submit_s,
                spec.min_size(),
                fair_share,
                quota_priority,
                now,
            )
            .total()
    }

    /// The weights and scales of the multifactor priority, read once for a queue's jobs.
    fn priority_weights(&self) -> PriorityWeights {
        let k = &self.knobs;
        PriorityWeights {
            fair_share: f64::from(k.weight_fair_share),
            age: f64::from(k.weight_age),
            job_size: f64::from(k.weight_job_size),
            quota_priority: f64::from(k.weight_quota_priority),
            max_age_s: k.max_age.as_secs().max(1) as f64,
            total_gpus: f64::from(self.cluster.total_gpus().max(1)),
        }
    }

    /// Sets priorities and puts the queue in order; `split` is this cycle's
    /// [`Scheduler::fair_shares`] where the cycle needs it anyway.
    ///
    /// A job the relief lifts (it has waited `relief_after` for GPUs, its quota not holding it
    /// since, `Hot::gpu_wait_from`) takes [`relief_factor`] where that is above its
    /// account's, and no age: among lifted jobs their accounts' order decides, then
    /// submission. Ordered by age they would make the queue FIFO by age under overload, which
    /// left more jobs past 7 days (docs/benchmarks.md, session 34).
    pub(super) fn order_pending(&mut self, now: UnixSeconds, split: Option<&[(i64, i64)]>) {
        let mut descents = None;
        if self.options.policy == Policy::FairShare {
            let factors = self.priority_factors(now, split);
            let mut pending = std::mem::take(&mut self.pending);
            descents = Some(pending.set_priorities(|job| factors.parts(job, now).total()));
            self.pending = pending;
        }
        // Under FIFO the queue stays in order as jobs arrive (see `Queue`); under fair share
        // it is mostly in order already: checking is cheaper than moving thousands of jobs.
        self.pending.arrange(descents);
    }

    /// What the priorities of waiting jobs are made of now: each account's fair-share factor
    /// (and the relief's, where it lifts a job), the weights. `split` as in
    /// [`Scheduler::order_pending`].
    fn priority_factors(&self, now: UnixSeconds, split: Option<&[(i64, i64)]>) -> PriorityFactors {
        let standings = self.standings(split);
        let fair_share = self.fair_share_factors_given(now, &standings);
        let relief_after = self.relief_after_s();
        let lifted: Vec<f64> = match relief_after {
            Some(_) => fair_share
                .iter()
                .map(|f| relief_factor(&standings, *f))
                .collect(),
            None => Vec::new(),
        };
        PriorityFactors {
            weights: self.priority_weights(),
            standings,
            fair_share,
            lifted,
            relief_after,
        }
    }

    /// Every waiting job's priority now and what it is made of (as Slurm's `sprio`), in the
    /// order a cycle run now would take them: higher tiers first, then higher priority, then
    /// earlier submission. Under FIFO every part is zero. The same numbers a cycle sets, bit
    /// for bit: a view for operators and tenants asking why one job goes before another.
    pub fn priorities(&self, now: UnixSeconds) -> Vec<PriorityParts> {
        let fair_share = self.options.policy == Policy::FairShare;
        let factors = fair_share.then(|| self.priority_factors(now, None));
        let mut rows: Vec<PriorityParts> = self
            .pending
            .hot()
            .zip(self.pending.iter())
            .map(|(hot, job)| {
                let parts = factors
                    .as_ref()
                    .map_or_else(Parts::default, |f| f.parts(hot, now));
                let standing = factors
                    .as_ref()
                    .and_then(|f| f.standings.get(hot.account).copied());
                PriorityParts {
                    job: job.spec.id.clone(),
                    account: job.spec.account.clone(),
                    tier: hot.tier,
                    submit_s: hot.submit_s,
                    priority: parts.total(),
                    fair_share: parts.fair_share,
                    age: parts.age,
                    job_size: parts.job_size,
                    quota: parts.quota,
                    relieved: parts.relieved,
                    standing,
                }
            })
            .collect();
        rows.sort_by(|a, b| {
            b.tier
                .cmp(&a.tier)
                .then_with(|| b.priority.total_cmp(&a.priority))
                .then_with(|| a.submit_s.cmp(&b.submit_s))
                .then_with(|| id_order(&a.job, &b.job))
        });
        rows
    }
}

/// One waiting job's multifactor priority and its weighted parts, as `sprio -l` shows them
/// ([`Scheduler::priorities`]); `priority` is the parts' sum.
#[derive(Clone, Debug, PartialEq)]
pub struct PriorityParts {
    pub job: JobId,
    pub account: AccountId,
    /// Its partition's priority tier: a higher tier goes first whatever the priority.
    pub tier: u32,
    pub submit_s: UnixSeconds,
    pub priority: f64,
    /// `weight_fair_share` times its account's fair-share factor (the relief's, when lifted).
    pub fair_share: f64,
    /// `weight_age` times its wait over `max_age` (at most 1); none while the relief lifts it.
    pub age: f64,
    /// `weight_job_size` times its smallest size over the cluster's GPUs.
    pub job_size: f64,
    /// `weight_quota_priority` times its quota's priority (1-100) over 100.
    pub quota: f64,
    /// It has waited `relief_after` for GPUs and the relief ranks it above the accounts at
    /// the floor or more of their share.
    pub relieved: bool,
    /// Where its account stands against its share now, where the ranking looks at shares
    /// (`below_share_first` under `fair_tree`).
    pub standing: Option<Standing>,
}

/// The accounts' factors and the weights, worked out once for every waiting job.
struct PriorityFactors {
    weights: PriorityWeights,
    standings: Vec<Standing>,
    fair_share: Vec<f64>,
    lifted: Vec<f64>,
    relief_after: Option<i64>,
}

impl PriorityFactors {
    /// A job the relief lifts (it has waited `relief_after` for GPUs, its quota not holding
    /// it since, `Hot::gpu_wait_from`) takes [`relief_factor`] where that is above its
    /// account's, and no age: among lifted jobs their accounts' order decides, then
    /// submission. Ordered by age they would make the queue FIFO by age under overload, which
    /// left more jobs past 7 days (docs/benchmarks.md, session 34).
    fn parts(&self, job: &Hot, now: UnixSeconds) -> Parts {
        let fs = self.fair_share.get(job.account).copied().unwrap_or(0.0);
        match self.lifted.get(job.account) {
            // Submitted now: no age.
            Some(l) if job.relieved(now, self.relief_after) && *l > fs => Parts {
                relieved: true,
                ..self
                    .weights
                    .parts(now, job.min, *l, job.quota_priority, now)
            },
            _ => self
                .weights
                .parts(job.submit_s, job.min, fs, job.quota_priority, now),
        }
    }
}

/// A priority's four weighted parts.
#[derive(Clone, Copy, Debug, Default)]
struct Parts {
    fair_share: f64,
    age: f64,
    job_size: f64,
    quota: f64,
    relieved: bool,
}

impl Parts {
    /// Their sum, added in the one order every priority is.
    fn total(&self) -> f64 {
        self.fair_share + self.age + self.job_size + self.quota
    }
}

/// Slurm's multifactor priority's weights (`[scheduler]`) and scales, as numbers.
struct PriorityWeights {
    fair_share: f64,
    age: f64,
    job_size: f64,
    quota_priority: f64,
    /// `max_age`, at least a second.
    max_age_s: f64,
    /// The cluster's GPUs, at least one.
    total_gpus: f64,
}

impl PriorityWeights {
    /// The priority's parts for a job submitted at `submit_s` of `min_size` GPUs at least:
    /// fair share (its account's factor, [`Scheduler::fair_share_factors`]), age (up to
    /// `max_age`), size (share of the cluster) and the quota's priority (1-100, as a
    /// fraction), each in [0, 1] times its weight.
    fn parts(
        &self,
        submit_s: UnixSeconds,
        min_size: u32,
        fair_share: f64,
        quota_priority: f64,
        now: UnixSeconds,
    ) -> Parts {
        let age = ((now - submit_s).max(0) as f64 / self.max_age_s).min(1.0);
        let size = f64::from(min_size) / self.total_gpus;
        Parts {
            fair_share: self.fair_share * fair_share,
            age: self.age * age,
            job_size: self.job_size * size,
            quota: self.quota_priority * quota_priority,
            relieved: false,
        }
    }
}

/// The scheduling order: higher tiers first, then higher priority, then earlier submission
/// (the job ids break ties, in [`Queue`]).
pub(super) fn queue_order(a: &Hot, b: &Hot) -> std::cmp::Ordering {
    b.tier
        .cmp(&a.tier)
        .then_with(|| b.priority.total_cmp(&a.priority))
        .then_with(|| a.submit_s.cmp(&b.submit_s))
}

/// Job ids in submission order: numeric ids (Slurm's) by value, so `10` comes after `9`.
pub(super) fn id_order(a: &JobId, b: &JobId) -> std::cmp::Ordering {
    (a.as_str().len(), a).cmp(&(b.as_str().len(), b))
}

/// [`id_order`] as one number, for ids of up to 15 bytes (every Slurm id and trace id): the
/// length in the top byte, then the bytes, so that comparing two keys is comparing the ids.
pub(super) fn id_key(id: &JobId) -> Option<u128> {
    let bytes = id.as_str().as_bytes();
    if bytes.len() > 15 {
        return None;
    }
    let mut key = [0u8; 16];
    key[0] = bytes.len() as u8;
    key[1..=bytes.len()].copy_from_slice(bytes);
    Some(u128::from_be_bytes(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_keys_order_ids_as_id_order_does() {
        let ids = [
            "9",
            "10",
            "a",
            "ab",
            "b",
            "p000001",
            "p000002",
            "123456789012345",
        ];
        for a in ids {
            for b in ids {
                let (ja, jb) = (JobId::new(a).unwrap(), JobId::new(b).unwrap());
                assert_eq!(
                    id_key(&ja).cmp(&id_key(&jb)),
                    id_order(&ja, &jb),
                    "{a} against {b}"
                );
            }
        }
        assert_eq!(id_key(&JobId::new("1234567890123456").unwrap()), None);
    }
}
