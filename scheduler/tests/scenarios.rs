//! Scheduler scenarios built from a small harness; the scheduler's invariants are checked after
//! every step (no GPU held twice, allocations match requests, quotas kept).

use gpuledger_model::{AccountId, ClusterConfig, JobId, ProjectId};
use gpuledger_scheduler::{
    Cycle, JobSpec, PendingReason, Refusal, Scheduler, SchedulerOptions, Started,
};
use proptest::prelude::*;

fn config(nodes: u32) -> ClusterConfig {
    let src = format!(
        r#"version = 1
[cluster]
name = "t"
[[node_pools]]
name = "p"
prefix = "n"
count = {nodes}
gpus_per_node = 8
gpu_model = "h100-sxm"
[[partitions]]
name = "train"
priority_tier = 20
default = true
[[partitions]]
name = "urgent"
priority_tier = 50
[fair_share]
half_life = "7d"
usage_factor_gpu_hours = 100
[prices]
version = "v"
effective_from = "2026-01-01"
currency = "CNY"
gpu_hour = {{ h100-sxm = "10" }}
[[accounts]]
id = "a"
name = "A"
weight = 1
quota = {{ max_running_jobs = 3, max_gpus_per_job = 64, max_run_time = "3d" }}
projects = [{{ id = "p1", quota = {{ max_running_jobs = 2 }} }}]
[[accounts]]
id = "b"
name = "B"
weight = 1
[[accounts]]
id = "c"
name = "C"
weight = 1
"#
    );
    ClusterConfig::from_toml_str(&src, "t.toml").expect("valid test config")
}

struct Harness {
    sched: Scheduler,
    next: u32,
}

impl Harness {
    fn new(nodes: u32, policy: &str) -> Self {
        Harness {
            sched: Scheduler::new(&config(nodes), SchedulerOptions::parse(policy).unwrap()),
            next: 1,
        }
    }

    fn spec(&mut self, account: &str, gpus: u32, limit_h: u64, t: i64) -> JobSpec {
        let id = JobId::new(self.next.to_string()).unwrap();
        self.next += 1;
        JobSpec::new(id, AccountId::new(account).unwrap(), gpus, limit_h * 3600, t)
    }

    fn submit(&mut self, account: &str, gpus: u32, limit_h: u64, t: i64) -> JobId {
        let spec = self.spec(account, gpus, limit_h, t);
        let id = spec.id.clone();
        self.sched.submit(spec).expect("admitted");
        id
    }

    fn step(&mut self, t: i64) -> Vec<Started> {
        self.cycle(t).started
    }

    fn cycle(&mut self, t: i64) -> Cycle {
        let cycle = self.sched.schedule(t);
        self.sched.check_invariants().expect("invariants hold");
        cycle
    }

    fn finish(&mut self, id: &JobId, t: i64) {
        assert!(self.sched.finish(id, t).is_some());
        self.sched.check_invariants().expect("invariants hold");
    }

    fn reason(&self, id: &JobId) -> Option<PendingReason> {
        self.sched
            .pending()
            .iter()
            .find(|p| &p.spec.id == id)
            .map(|p| p.reason)
    }

    fn is_running(&self, id: &JobId) -> bool {
        self.sched.running_job(id).is_some()
    }
}

const H: i64 = 3600;

#[test]
fn without_backfill_the_head_job_blocks_the_queue() {
    let mut h = Harness::new(2, "fifo");
    let first = h.submit("a", 8, 10, 0);
    let big = h.submit("b", 16, 10, 1);
    let small = h.submit("c", 1, 1, 2);
    h.step(2);
    assert!(h.is_running(&first));
    assert_eq!(h.reason(&big), Some(PendingReason::Resources));
    assert_eq!(
        h.reason(&small),
        Some(PendingReason::Priority),
        "7 GPUs are free but FIFO waits"
    );
}

#[test]
fn backfill_fills_the_gap_without_delaying_the_head_job() {
    let mut h = Harness::new(2, "fifo+backfill");
    let first = h.submit("a", 8, 10, 0);
    h.step(0);
    let head = h.submit("b", 16, 10, 1);
    let too_long = h.submit("c", 4, 20, 2); // would still hold GPUs at 10 h
    let short = h.submit("c", 4, 5, 3); // done before 10 h
    let started = h.step(3);
    assert_eq!(
        started.iter().map(|s| &s.job_id).collect::<Vec<_>>(),
        vec![&short]
    );
    assert!(started[0].backfilled);
    assert_eq!(h.reason(&head), Some(PendingReason::Resources));
    assert_eq!(h.reason(&too_long), Some(PendingReason::Priority));
    h.finish(&short, 5 * H);
    h.step(5 * H);
    assert!(!h.is_running(&too_long), "still would delay the head");
    h.finish(&first, 10 * H);
    let started = h.step(10 * H);
    assert_eq!(
        started[0].job_id, head,
        "the head starts at its reserved time"
    );
}

#[test]
fn fair_share_puts_the_light_user_first() {
    let mut h = Harness::new(1, "fairshare");
    // b has used the whole node for 100 hours; c nothing.
    let hog = h.submit("b", 8, 200, 0);
    h.step(0);
    h.sched.accrue_usage(100 * H);
    h.finish(&hog, 100 * H);
    let from_b = h.submit("b", 8, 1, 100 * H);
    let from_c = h.submit("c", 8, 1, 100 * H + 10);
    let started = h.step(100 * H + 10);
    assert_eq!(
        started[0].job_id, from_c,
        "c submitted later but ranks first"
    );
    assert_eq!(h.reason(&from_b), Some(PendingReason::Resources));
    let ledger = h.sched.ledger();
    assert!(ledger.gpu_hours(&AccountId::new("b").unwrap(), 100 * H) > 700.0);
}

#[test]
fn a_higher_tier_goes_first() {
    let mut h = Harness::new(1, "fairshare");
    let running = h.submit("a", 8, 1, 0);
    h.step(0);
    let train = h.submit("b", 8, 1, 10);
    let mut urgent = h.spec("c", 8, 1, 20);
    urgent.partition = Some("urgent".into());
    let urgent_id = urgent.id.clone();
    h.sched.submit(urgent).unwrap();
    h.finish(&running, H);
    let started = h.step(H);
    assert_eq!(started[0].job_id, urgent_id);
    assert!(!h.is_running(&train));
}

#[test]
fn jobs_that_can_never_run_are_refused_with_the_reason() {
    let mut h = Harness::new(2, "fifo");
    let too_big = h.spec("a", 65, 1, 0);
    assert_eq!(
        h.sched.submit(too_big),
        Err(Refusal::TooManyGpus {
            asked: 65,
            limit: 64
        })
    );
    let bigger_than_cluster = h.spec("b", 24, 1, 0);
    assert_eq!(
        h.sched.submit(bigger_than_cluster),
        Err(Refusal::LargerThanCluster {
            asked: 24,
            capacity: 16
        })
    );
    let too_long = h.spec("a", 1, 24 * 4, 0);
    assert!(matches!(
        h.sched.submit(too_long),
        Err(Refusal::TimeLimit {
            what: "quota max_run_time",
            ..
        })
    ));
    let mut nowhere = h.spec("a", 1, 1, 0);
    nowhere.partition = Some("gpu-xl".into());
    assert_eq!(
        h.sched.submit(nowhere),
        Err(Refusal::UnknownPartition("gpu-xl".into()))
    );
    let mut ghost = h.spec("a", 1, 1, 0);
    ghost.project = Some(ProjectId::new("nope").unwrap());
    assert!(matches!(
        h.sched.submit(ghost),
        Err(Refusal::UnknownProject { .. })
    ));
}

#[test]
fn the_running_jobs_quota_holds_jobs_with_its_reason() {
    let mut h = Harness::new(2, "fifo");
    let ids: Vec<JobId> = (0..4).map(|i| h.submit("a", 1, 1, i)).collect();
    let other = h.submit("b", 1, 1, 10);
    h.step(10);
    assert_eq!(ids.iter().filter(|id| h.is_running(id)).count(), 3);
    assert_eq!(h.reason(&ids[3]), Some(PendingReason::AssocMaxJobsLimit));
    assert!(
        h.is_running(&other),
        "a quota-held job does not block others"
    );
    // The project limit (2) is tighter than the account's (3).
    let mut in_project = Vec::new();
    for i in 0..3 {
        let mut s = h.spec("a", 1, 1, 20 + i);
        s.project = Some(ProjectId::new("p1").unwrap());
        in_project.push(s.id.clone());
        h.sched.submit(s).unwrap();
    }
    for id in &ids[..3] {
        h.finish(id, H);
    }
    h.step(H);
    assert_eq!(in_project.iter().filter(|id| h.is_running(id)).count(), 2);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn invariants_hold_on_random_workloads(
        jobs in proptest::collection::vec((0usize..3, prop_oneof![Just(1u32), Just(2), Just(4), Just(8), Just(16), Just(24)], 1u64..12, 0i64..48), 1..60),
        policy in prop_oneof![Just("fifo"), Just("fairshare"), Just("fifo+backfill"), Just("fairshare+backfill")],
    ) {
        let mut h = Harness::new(4, policy);
        let accounts = ["a", "b", "c"];
        let mut submitted: Vec<(i64, usize, u32, u64)> = jobs.iter().map(|(a, g, l, t)| (*t * H / 4, *a, *g, *l)).collect();
        submitted.sort();
        let mut running: Vec<(i64, JobId)> = Vec::new();
        let mut times: Vec<i64> = submitted.iter().map(|j| j.0).collect();
        times.dedup();
        let mut k = 0;
        let mut t = 0;
        let mut started_total = 0;
        let admitted = submitted.len();
        while started_total < admitted {
            running.sort();
            while let Some((end, id)) = running.first().cloned() {
                if end > t { break; }
                h.finish(&id, end);
                running.remove(0);
            }
            while k < submitted.len() && submitted[k].0 <= t {
                let (st, a, g, l) = submitted[k];
                h.submit(accounts[a], g, l, st);
                k += 1;
            }
            for s in h.step(t) {
                let limit = h.sched.running_job(&s.job_id).unwrap().spec.time_limit_s as i64;
                running.push((t + limit, s.job_id));
                started_total += 1;
            }
            let next_finish = running.iter().map(|r| r.0).min().unwrap_or(i64::MAX);
            let next_submit = submitted.get(k).map(|s| s.0).unwrap_or(i64::MAX);
            let next = next_finish.min(next_submit);
            prop_assert!(next != i64::MAX || started_total == admitted, "jobs left pending with nothing running");
            if next == i64::MAX { break; }
            t = next;
        }
        prop_assert_eq!(started_total, admitted, "every admitted job eventually ran");
    }
}
