//! Queue order: within tiers, FIFO or Slurm's multifactor priority (fair share, age, job
//! size, quota priority), ties broken by submission order.

use super::*;
use crate::fairshare::water_fill;

impl Scheduler {
    /// Each account's fair-share factor in [0, 1], in `account_ids` order: Fair Tree's rank
    /// by share over usage among the accounts with work ([`fair_tree_factors`]), the design's
    /// `weight / (1 + usage / factor)` over the largest weight, or Slurm's classic
    /// `2^(-usage share / normalised share)`.
    pub fn fair_share_factors(&self, now: UnixSeconds) -> Vec<f64> {
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
        )
    }

    /// How far each account is below its fair share of the cluster now, in share units, in
    /// `account_ids` order (negative when above it): the cluster split by weight among the
    /// accounts with running or waiting work, none given more than it holds and waits for
    /// ([`water_fill`], the measure `report.md` sets each week against). A job being
    /// preempted no longer counts for its account, a preemptor waiting for its victims
    /// already does. What `plan_to_share` plans up to and `fair_share_preemption` takes back.
    pub(super) fn share_gaps(&self) -> Vec<i64> {
        let unit = u64::from(SHARE_UNITS_PER_GPU);
        let mut held: Vec<i64> = self
            .account_ids
            .iter()
            .map(|id| self.held(&(id.clone(), None)) as i64)
            .collect();
        let mut demand = vec![0u64; held.len()];
        for job in self.pending.iter() {
            let units = job.spec.share_units_of(job.spec.min_size());
            if self.claims.contains_key(&job.spec.id) {
                if let Some(h) = held.get_mut(job.limits.account) {
                    *h += units as i64;
                }
            } else if let Some(d) = demand.get_mut(job.limits.account) {
                *d += units;
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
            .map(|(share, held)| share.floor() as i64 - held.max(0))
            .collect()
    }

    /// Which accounts have running or waiting jobs, in `account_ids` order.
    fn accounts_with_demand(&self) -> Vec<bool> {
        let mut demand = vec![false; self.account_ids.len()];
        for job in self.pending.iter() {
            if let Some(d) = demand.get_mut(job.limits.account) {
                *d = true;
            }
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
        self.job_priority(spec, fair_share, self.limits_for(spec).quota_priority, now)
    }

    /// Slurm's multifactor priority: fair share (the account's `weight / (1 + usage /
    /// factor)` over the largest weight), age (up to `max_age`), size (share of the cluster)
    /// and the quota's priority (1-100, as a fraction), each in [0, 1] times its weight.
    pub(super) fn job_priority(
        &self,
        spec: &JobSpec,
        fair_share: f64,
        quota_priority: f64,
        now: UnixSeconds,
    ) -> f64 {
        let k = &self.knobs;
        let age =
            ((now - spec.submit_s).max(0) as f64 / k.max_age.as_secs().max(1) as f64).min(1.0);
        let size = f64::from(spec.min_size()) / f64::from(self.cluster.total_gpus().max(1));
        f64::from(k.weight_fair_share) * fair_share
            + f64::from(k.weight_age) * age
            + f64::from(k.weight_job_size) * size
            + f64::from(k.weight_quota_priority) * quota_priority
    }

    pub(super) fn order_pending(&mut self, now: UnixSeconds) {
        if self.options.policy == Policy::FairShare {
            let fair_share = self.fair_share_factors(now);
            let scores: Vec<f64> = self
                .pending
                .iter()
                .map(|j| {
                    let fs = fair_share.get(j.limits.account).copied().unwrap_or(0.0);
                    self.job_priority(&j.spec, fs, j.limits.quota_priority, now)
                })
                .collect();
            for (job, score) in self.pending.iter_mut().zip(scores) {
                job.priority = score;
            }
        }
        // Under FIFO the queue stays in order as jobs arrive (see `Queue`); under fair share
        // it is mostly in order already: checking is cheaper than moving thousands of jobs.
        self.pending
            .arrange(self.options.policy == Policy::FairShare, queue_order);
    }
}

/// The scheduling order: higher tiers first, then higher priority, then earlier submission.
pub(super) fn queue_order(a: &PendingJob, b: &PendingJob) -> std::cmp::Ordering {
    b.tier
        .cmp(&a.tier)
        .then_with(|| b.priority.total_cmp(&a.priority))
        .then_with(|| a.spec.submit_s.cmp(&b.spec.submit_s))
        .then_with(|| id_order(&a.spec.id, &b.spec.id))
}

/// Job ids in submission order: numeric ids (Slurm's) by value, so `10` comes after `9`.
pub(super) fn id_order(a: &JobId, b: &JobId) -> std::cmp::Ordering {
    (a.as_str().len(), a).cmp(&(b.as_str().len(), b))
}
