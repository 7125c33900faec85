//! Preemption: which running jobs of lower tiers (or elastic jobs above their minimum) make
//! room for a waiting job, their checkpoint grace, and the preemptor's claim on what they free.

use super::*;

/// Whose jobs a waiting job may preempt.
pub(super) enum Victims<'a> {
    /// Jobs of lower tiers (and elastic jobs of its tier or lower above their minimum).
    LowerTiers,
    /// Jobs of its tier or lower of accounts above their fair share that would lose at most
    /// `fair_share_preemption_max_loss` of work, each account no further than its share: the
    /// distances below it, in share units by account index (negative above), updated with the
    /// victims chosen.
    OverShare(&'a mut [i64]),
}

impl Scheduler {
    /// True while a preemptor waits for victims that have not exited yet.
    pub(super) fn claim_draining(&self, id: &JobId) -> bool {
        let Some(claim) = self.claims.get(id) else {
            return false;
        };
        let still_exiting = claim.victims.iter().any(|v| {
            self.running
                .get(v)
                .and_then(|r| r.preempting.as_ref())
                .is_some_and(|p| &p.by == id)
        });
        still_exiting
    }

    /// The job's grace: its own, else its partition's, else the default; never more than its
    /// partition's `max_grace`.
    pub(super) fn grace_s(&self, job: &RunningJob) -> u64 {
        let partition = self.partitions.get(
            job.spec
                .partition
                .as_deref()
                .unwrap_or(&self.default_partition),
        );
        let grace = job
            .spec
            .grace_s
            .or_else(|| partition.and_then(|p| p.grace_s))
            .unwrap_or(self.knobs.default_grace.as_secs());
        grace.min(partition.map_or(DEFAULT_MAX_GRACE_S, |p| p.max_grace_s))
    }

    /// Frees GPUs for `job` when it cannot start otherwise. Elastic jobs above their minimum
    /// shrink first (they lose nothing, and a job of the same tier may take back what an
    /// elastic job borrowed); then whole jobs `rule` allows that have run at least
    /// `min_run_time`, those that would lose the least work first; then the set is pruned so no
    /// more is freed than needed. Returns a placement when the job can start now (only shrinks
    /// were needed); otherwise the victims are signalled and the job waits for them.
    pub(super) fn preempt_for(
        &mut self,
        job: &PendingJob,
        now: UnixSeconds,
        mut rule: Victims<'_>,
        cycle: &mut Cycle,
        plan: &mut Option<Plan>,
    ) -> Option<Placement> {
        struct Candidate {
            id: JobId,
            frees: Placement,
            shrink_to: Option<u32>,
            cost: i64,
            tier: u32,
            start_s: UnixSeconds,
            /// The account index whose fair share it counts against, for `OverShare`.
            account: Option<usize>,
        }
        let min_run = self.knobs.min_run_time.as_secs() as i64;
        let max_loss =
            i64::try_from(self.knobs.fair_share_preemption_max_loss.as_secs()).unwrap_or(i64::MAX);
        let mut candidates: Vec<Candidate> = self
            .running
            .values()
            .filter(|r| r.preempting.is_none())
            .filter_map(|r| {
                let count = r.placement.gpu_count();
                let account = self.account_index.get(&r.spec.account).copied();
                if r.spec.is_elastic() && count > r.spec.min_size() && r.tier <= job.tier {
                    let mut kept = r.placement.clone();
                    let frees = kept.shrink_to(r.spec.min_size());
                    return Some(Candidate {
                        id: r.spec.id.clone(),
                        frees,
                        shrink_to: Some(r.spec.min_size()),
                        cost: 0,
                        tier: r.tier,
                        start_s: r.start_s,
                        account,
                    });
                }
                let allowed = match &rule {
                    Victims::LowerTiers => r.tier < job.tier,
                    Victims::OverShare(gap) => {
                        r.tier <= job.tier
                            && r.work_at_risk_s(now) <= max_loss
                            && r.spec.account != job.spec.account
                            && account
                                .and_then(|a| gap.get(a))
                                .is_some_and(|g| -*g >= r.placement.share_units() as i64)
                    }
                };
                (allowed && now - r.start_s >= min_run).then(|| Candidate {
                    id: r.spec.id.clone(),
                    frees: r.placement.clone(),
                    shrink_to: None,
                    cost: i64::from(count) * r.work_at_risk_s(now),
                    tier: r.tier,
                    start_s: r.start_s,
                    account,
                })
            })
            .collect();
        if candidates.is_empty() {
            return None;
        }
        // The cluster as it is now with the other jobs' planned starts held.
        let mut trial = match plan.as_ref() {
            Some(p) => {
                let limit = job.spec.time_limit_s;
                p.with_window_now(&self.cluster, limit, Some(&job.spec.id), Cluster::clone)
            }
            None => self.cluster.clone(),
        };
        candidates.sort_by(|a, b| {
            (a.cost, a.tier, std::cmp::Reverse(a.start_s), &a.id).cmp(&(
                b.cost,
                b.tier,
                std::cmp::Reverse(b.start_s),
                &b.id,
            ))
        });
        let (min, limit) = (job.spec.min_size(), job.spec.time_limit_s);
        let filter = self.filter_for(&job.spec, now, now.saturating_add(limit as i64));
        let fits = |c: &Cluster| {
            c.find(min, &job.spec.account, &filter, &job.spec.shape)
                .is_some()
        };
        let mut chosen: Vec<Candidate> = Vec::new();
        for c in candidates {
            release_into(&mut trial, &c.frees);
            chosen.push(c);
            if fits(&trial) {
                break;
            }
        }
        if !fits(&trial) {
            return None;
        }
        // Prune: give back, most costly first, every victim the job can do without.
        let mut i = chosen.len();
        while i > 0 {
            i -= 1;
            trial.hold(&chosen[i].frees);
            if fits(&trial) {
                chosen.remove(i);
            } else {
                release_into(&mut trial, &chosen[i].frees);
            }
        }
        // Under OverShare no account may be taken below its share by the victims together.
        if let Victims::OverShare(gap) = &rule {
            let mut lost = vec![0i64; gap.len()];
            for c in chosen.iter().filter(|c| c.shrink_to.is_none()) {
                if let Some(l) = c.account.and_then(|a| lost.get_mut(a)) {
                    *l += c.frees.share_units() as i64;
                }
            }
            if lost.iter().zip(gap.iter()).any(|(l, g)| *l > (-*g).max(0)) {
                return None;
            }
        }
        // Shrink elastic jobs no further than needed: the largest size that still lets the job
        // fit.
        for c in chosen.iter_mut() {
            let (Some(min_keep), Some(r)) = (c.shrink_to, self.running.get(&c.id)) else {
                continue;
            };
            trial.hold(&c.frees);
            let count = r.placement.gpu_count();
            let step = if count > self.cluster.gpus_per_node_max() {
                self.cluster.gpus_per_node_max().max(1)
            } else {
                1
            };
            let mut keep = count.saturating_sub(step).max(min_keep);
            loop {
                let mut kept = r.placement.clone();
                let frees = kept.shrink_to(keep);
                release_into(&mut trial, &frees);
                if fits(&trial) || keep == min_keep {
                    c.frees = frees;
                    c.shrink_to = Some(keep);
                    break;
                }
                trial.hold(&frees);
                keep = keep.saturating_sub(step).max(min_keep);
            }
        }
        let mut victims = Vec::new();
        for c in chosen {
            let grace = self
                .running
                .get(&c.id)
                .map(|r| self.grace_s(r))
                .unwrap_or(0);
            let Some(r) = self.running.get_mut(&c.id) else {
                continue;
            };
            match c.shrink_to {
                Some(keep) => {
                    self.tiers.remove(r);
                    let freed = r.placement.shrink_to(keep);
                    self.tiers.add(r);
                    accrue(&mut self.ledger, &mut self.windows, r, now);
                    self.cluster.release(&freed);
                    let spec = r.spec.clone();
                    self.count_held(&spec, -(freed.share_units() as i64));
                    let Some(r) = self.running.get_mut(&c.id) else {
                        continue;
                    };
                    cycle.resized.push(Resized {
                        job_id: c.id.clone(),
                        allocation: self.cluster.to_allocation(&r.placement),
                        gpus: r.placement.gpu_count(),
                    });
                    self.releases.set(&c.id, r.release_key(), &r.placement);
                    if let Some(plan) = plan.as_mut() {
                        plan.released_at(&c.id, r.release_s(now), r.placement.clone());
                    }
                }
                None => {
                    if let (Victims::OverShare(gap), Some(a)) = (&mut rule, c.account) {
                        if let Some(g) = gap.get_mut(a) {
                            *g += r.placement.share_units() as i64;
                        }
                    }
                    let kill_s = now + grace as i64;
                    r.preempting = Some(Preempting {
                        by: job.spec.id.clone(),
                        signal_s: now,
                        kill_s,
                    });
                    cycle.preempted.push(Preemption {
                        job_id: c.id.clone(),
                        by: job.spec.id.clone(),
                        kill_s,
                    });
                    self.releases.set(&c.id, kill_s, &r.placement);
                    if let Some(plan) = plan.as_mut() {
                        plan.released_at(&c.id, kill_s, r.placement.clone());
                    }
                    victims.push(c.id);
                }
            }
        }
        if victims.is_empty() {
            return self.place_now(&job.spec, now, plan.as_ref(), true);
        }
        self.claims.insert(
            job.spec.id.clone(),
            Claim {
                account: job.spec.account.clone(),
                project: job.spec.project.clone(),
                victims,
            },
        );
        None
    }
}

/// An elastic job above its minimum: preemption may shrink it.
fn shrinkable(job: &RunningJob) -> bool {
    job.spec.is_elastic() && job.placement.gpu_count() > job.spec.min_size()
}

/// How many running jobs there are of each tier, and of elastic ones above their minimum, so
/// that whether preemption could help ([`RunningTiers::may_help`]) is asked without walking the
/// running jobs. Kept as jobs start, end and change size ([`RunningTiers::add`] after,
/// [`RunningTiers::remove`] before).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct RunningTiers {
    all: BTreeMap<u32, u32>,
    shrinkable: BTreeMap<u32, u32>,
}

impl RunningTiers {
    pub(super) fn add(&mut self, job: &RunningJob) {
        *self.all.entry(job.tier).or_default() += 1;
        if shrinkable(job) {
            *self.shrinkable.entry(job.tier).or_default() += 1;
        }
    }

    pub(super) fn remove(&mut self, job: &RunningJob) {
        fn take(counts: &mut BTreeMap<u32, u32>, tier: u32) {
            if let Some(n) = counts.get_mut(&tier) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(&tier);
                }
            }
        }
        take(&mut self.all, job.tier);
        if shrinkable(job) {
            take(&mut self.shrinkable, job.tier);
        }
    }

    /// Whether preemption could free anything for a job of `tier`: only when a lower tier
    /// runs, or an elastic job of no higher tier is above its minimum. Checked before the
    /// search, which looks at every running job.
    pub(super) fn may_help(&self, tier: u32) -> bool {
        self.all.keys().next().is_some_and(|t| *t < tier)
            || self.shrinkable.keys().next().is_some_and(|t| *t <= tier)
    }
}

/// Frees GPUs in a trial copy, where some may already be free.
pub(super) fn release_into(trial: &mut Cluster, placement: &Placement) {
    trial.release_held(placement);
}
