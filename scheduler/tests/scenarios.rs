//! Scheduler scenarios built from a small harness; the scheduler's invariants are checked after
//! every step (no GPU held twice, allocations within each job's size, quotas kept,
//! reservations honoured).

mod common;

use common::{Harness, H};
use gpuledger_model::{AccountId, ClusterConfig, JobId, ProjectId};
use gpuledger_scheduler::{NodeRequest, PendingReason, Refusal, ReservationRequest};
use proptest::prelude::*;

fn config(nodes: u32) -> ClusterConfig {
    ClusterConfig::from_toml_str(&config_source(nodes), "t.toml").expect("valid test config")
}

fn config_source(nodes: u32) -> String {
    format!(
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
[[accounts]]
id = "d"
name = "D"
weight = 1
quota = {{ gpu_hours_per_day = 100, gpu_hours_per_week = 400, storage = "10TB" }}
"#
    )
}

fn harness(nodes: u32, policy: &str) -> Harness {
    Harness::with_config(&config(nodes), policy)
}

#[test]
fn without_backfill_the_head_job_blocks_the_queue() {
    let mut h = harness(2, "fifo");
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
    let mut h = harness(2, "fifo+backfill");
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
fn free_gpus_a_planned_start_holds_count_as_planned_until_it_starts() {
    let mut h = harness(2, "fifo+backfill");
    let first = h.submit("a", 8, 10, 0);
    h.step(0);
    let planned = |h: &Harness| h.sched.planned_idle_gpus().collect::<Vec<_>>();
    assert_eq!(planned(&h), vec![], "no job waits: nothing is planned");
    let first_node = h
        .sched
        .running()
        .find(|r| r.spec.id == first)
        .map(|r| r.placement.0[0].node)
        .unwrap();
    // Two nodes at 10 h: the node free now is held for it meanwhile.
    let head = h.submit("b", 16, 10, 1);
    h.step(1);
    assert_eq!(planned(&h), vec![(1 - first_node, 8)]);
    // A job that ends before 10 h may use them, and those it takes are not free any more.
    let short = h.submit("c", 4, 5, 2);
    h.step(2);
    assert!(h.is_running(&short));
    assert_eq!(planned(&h), vec![(1 - first_node, 4)]);
    h.finish(&short, 5 * H);
    h.step(5 * H);
    assert_eq!(planned(&h), vec![(1 - first_node, 8)]);
    h.finish(&first, 10 * H);
    h.step(10 * H);
    assert!(h.is_running(&head));
    assert_eq!(planned(&h), vec![], "it started: nothing is held any more");
}

#[test]
fn fair_share_puts_the_light_user_first() {
    let mut h = harness(1, "fairshare");
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
    let mut h = harness(1, "fairshare");
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
    let mut h = harness(2, "fifo");
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
    let mut h = harness(2, "fifo");
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

/// Account c may hold 12 GPUs at once, its project pc 4 (Slurm `GrpTRES=gres/gpu`).
fn capped_harness(policy: &str) -> Harness {
    let source = config_source(4).replace(
        "id = \"c\"\nname = \"C\"\nweight = 1\n",
        "id = \"c\"\nname = \"C\"\nweight = 1\nquota = { max_gpus = 12 }\n\
         projects = [{ id = \"pc\", quota = { max_gpus = 4 } }]\n",
    );
    assert!(source.contains("max_gpus = 12"));
    Harness::with_config(
        &ClusterConfig::from_toml_str(&source, "t.toml").unwrap(),
        policy,
    )
}

#[test]
fn the_concurrent_gpu_quota_holds_jobs_with_assoc_grp_gres() {
    for policy in ["fifo", "fairshare+backfill", "fairshare+conservative"] {
        let mut h = capped_harness(policy);
        let too_big = h.spec("c", 16, 1, 0);
        assert_eq!(
            h.sched.submit(too_big),
            Err(Refusal::MoreThanMaxGpus {
                asked: 16,
                limit: 12
            }),
            "{policy}: a job larger than the cap could never start"
        );
        let mut in_project = h.spec("c", 8, 1, 0);
        in_project.project = Some(ProjectId::new("pc").unwrap());
        assert!(
            matches!(
                h.sched.submit(in_project),
                Err(Refusal::MoreThanMaxGpus { limit: 4, .. })
            ),
            "{policy}: the project's cap is tighter"
        );
        let first = h.submit("c", 8, 1, 0);
        let second = h.submit("c", 4, 1, 1);
        let third = h.submit("c", 4, 1, 2);
        let other = h.submit("b", 8, 1, 3);
        h.step(3);
        assert!(h.is_running(&first) && h.is_running(&second), "{policy}");
        assert_eq!(
            h.reason(&third),
            Some(PendingReason::AssocGrpGres),
            "{policy}: 12 GPUs held, 12 allowed"
        );
        assert_eq!(PendingReason::AssocGrpGres.as_str(), "AssocGrpGRES");
        assert!(h.is_running(&other), "{policy}: the cap holds c only");
        // Two project jobs of 4 GPUs each: one fits under the project's 4 once room is made.
        let mut p = Vec::new();
        for t in 4..6 {
            let mut s = h.spec("c", 4, 1, t);
            s.project = Some(ProjectId::new("pc").unwrap());
            p.push(h.submit_spec(s));
        }
        h.step(6);
        assert!(p.iter().all(|id| !h.is_running(id)), "{policy}");
        h.finish(&first, H);
        h.step(H);
        assert!(
            h.is_running(&third),
            "{policy}: 4 held, 8 free under the cap"
        );
        assert_eq!(
            p.iter().filter(|id| h.is_running(id)).count(),
            1,
            "{policy}: the project's 4 take the rest"
        );
        h.finish(&second, H + 10);
        h.step(H + 10);
        let waiting = p.iter().find(|id| !h.is_running(id)).unwrap();
        assert_eq!(
            h.reason(waiting),
            Some(PendingReason::AssocGrpGres),
            "{policy}: the account has room for 4 more, its project none"
        );
    }
}

#[test]
fn an_elastic_job_starts_and_grows_only_within_the_concurrent_gpu_quota() {
    let mut h = capped_harness("fairshare+backfill");
    let small = h.submit("c", 6, 1, 0);
    h.step(0);
    assert!(h.is_running(&small));
    let mut spec = h.spec("c", 8, 10, 1);
    spec.min_gpus = Some(2);
    let elastic = h.submit_spec(spec);
    h.cycle(1);
    assert_eq!(
        h.gpus_of(&elastic),
        6,
        "26 GPUs are free but the cap of 12 leaves 6"
    );
    h.cycle(2);
    assert_eq!(h.gpus_of(&elastic), 6, "and it does not grow past the cap");
    h.finish(&small, H);
    h.cycle(H);
    assert_eq!(
        h.gpus_of(&elastic),
        8,
        "room again: it grows to its maximum"
    );
}

#[test]
fn preemption_takes_the_job_that_loses_least_and_gives_it_grace() {
    let mut h = harness(2, "fairshare+backfill");
    let old = h.submit("a", 8, 10, 0);
    let mut spec = h.spec("b", 8, 10, 0);
    spec.checkpoint_every_s = Some(1800);
    let checkpointing = h.submit_spec(spec);
    h.step(0);
    assert!(h.is_running(&old) && h.is_running(&checkpointing));
    // 50 minutes in: `old` would lose 50 min, `checkpointing` 20 (it checkpointed at 30).
    let t = 50 * 60;
    let urgent = h.urgent("c", 8, 1, t);
    let cycle = h.cycle(t);
    assert!(cycle.started.is_empty(), "waits for the victim's grace");
    assert_eq!(cycle.preempted.len(), 1, "frees no more than needed");
    assert_eq!(cycle.preempted[0].job_id, checkpointing);
    assert_eq!(cycle.preempted[0].by, urgent);
    assert_eq!(cycle.preempted[0].kill_s, t + 300, "default grace");
    assert_eq!(h.reason(&urgent), Some(PendingReason::Resources));
    // While the victim drains nothing more is preempted, and the victim is not picked twice.
    let again = h.cycle(t + 60);
    assert!(again.preempted.is_empty() && again.started.is_empty());
    h.requeue(&checkpointing, t + 90);
    let started = h.step(t + 90);
    assert_eq!(started.len(), 1);
    assert_eq!(started[0].job_id, urgent);
    let requeued = h.pending_job(&checkpointing).expect("requeued");
    assert_eq!(requeued.preemptions, 1);
    assert!(
        h.is_running(&old),
        "the job with more work at risk kept running"
    );
}

#[test]
fn preemption_respects_minimum_run_time_and_tiers() {
    let mut h = harness(1, "fifo+backfill");
    let young = h.submit("a", 8, 10, 0);
    h.step(0);
    let urgent = h.urgent("b", 8, 1, 300);
    let cycle = h.cycle(300);
    assert!(
        cycle.preempted.is_empty(),
        "ran 5 min, under min_run_time (10 min)"
    );
    assert_eq!(h.reason(&urgent), Some(PendingReason::Resources));
    // A job of the same tier never preempts.
    let same_tier = h.submit("c", 8, 1, 3600);
    let cycle = h.cycle(3600);
    assert_eq!(
        cycle.preempted.len(),
        1,
        "the urgent job preempts once old enough"
    );
    assert_eq!(cycle.preempted[0].by, urgent);
    assert_eq!(h.reason(&same_tier), Some(PendingReason::Priority));
    h.requeue(&young, 3700);
    assert_eq!(h.step(3700)[0].job_id, urgent);
    // The requeued job (tier 20) cannot preempt the urgent one back: no loop.
    let cycle = h.cycle(3700 + 3600);
    assert!(cycle.preempted.is_empty());
}

#[test]
fn a_partition_grace_and_a_job_grace_set_the_kill_deadline() {
    let src = toml_with_grace();
    let config = ClusterConfig::from_toml_str(&src, "g.toml").unwrap();
    let mut h = Harness::with_config(&config, "fifo");
    let mut spec = h.spec("a", 8, 10, 0);
    spec.grace_s = Some(45);
    let own = h.submit_spec(spec);
    let by_partition = h.submit("b", 8, 10, 0);
    h.step(0);
    h.urgent("c", 16, 1, H);
    let cycle = h.cycle(H);
    let kill: Vec<(JobId, i64)> = cycle
        .preempted
        .iter()
        .map(|p| (p.job_id.clone(), p.kill_s - H))
        .collect();
    assert_eq!(kill, vec![(own, 45), (by_partition, 120)]);
}

fn toml_with_grace() -> String {
    let base = config_source(2);
    base.replace(
        "priority_tier = 20\ndefault = true",
        "priority_tier = 20\ndefault = true\ngrace_time = \"2m\"",
    )
}

#[test]
fn elastic_jobs_start_small_grow_and_shrink_instead_of_dying() {
    let mut h = harness(4, "fairshare+backfill");
    let blocker = h.submit("a", 16, 2, 0);
    let mut spec = h.spec("b", 32, 10, 0);
    spec.min_gpus = Some(8);
    let elastic = h.submit_spec(spec);
    let started = h.step(0);
    assert_eq!(started.len(), 2);
    assert_eq!(
        h.gpus_of(&elastic),
        16,
        "starts with what is free, at least its minimum"
    );
    h.finish(&blocker, 2 * H);
    let cycle = h.cycle(2 * H);
    assert_eq!(cycle.resized.len(), 1, "{cycle:?}");
    assert_eq!(h.gpus_of(&elastic), 32, "grows into the freed nodes");
    // A job of the same tier takes back what the elastic job borrowed: a shrink, no kill.
    let newcomer = h.submit("c", 16, 1, 3 * H);
    let cycle = h.cycle(3 * H);
    assert!(cycle.preempted.is_empty());
    assert_eq!(cycle.resized.len(), 1);
    assert_eq!(cycle.resized[0].gpus, 16);
    assert!(h.is_running(&newcomer));
    assert!(h.is_running(&elastic));
    // An urgent job shrinks it to its minimum, never below.
    let urgent = h.urgent("a", 8, 1, 4 * H);
    let cycle = h.cycle(4 * H);
    assert!(cycle.preempted.is_empty(), "shrinking suffices");
    assert!(h.is_running(&urgent));
    assert_eq!(h.gpus_of(&elastic), 8);
    h.sched.check_invariants().unwrap();
}

#[test]
fn advance_reservations_keep_others_off_their_nodes_in_the_window() {
    let mut h = harness(2, "fifo+backfill");
    let res = h
        .sched
        .add_reservation(ReservationRequest {
            name: "leadership".into(),
            start_s: 10 * H,
            end_s: 20 * H,
            accounts: vec![AccountId::new("b").unwrap()],
            nodes: NodeRequest::Count(1),
        })
        .unwrap();
    assert_eq!(res.nodes, vec![1], "picked from the top");
    // Two nodes for 12 h would cross the window: not now.
    let wide = h.submit("a", 16, 12, 0);
    // One that ends before the window may use the reserved node.
    let before = h.submit("c", 8, 5, 0);
    let long = h.submit("c", 8, 12, 0);
    let started: Vec<JobId> = h.step(0).into_iter().map(|s| s.job_id).collect();
    assert_eq!(started, vec![before.clone(), long.clone()]);
    assert_eq!(h.reason(&wide), Some(PendingReason::ReqNodeNotAvail));
    let on = |h: &Harness, id: &JobId| h.sched.running_job(id).unwrap().placement.0[0].node;
    assert_eq!(on(&h, &before), 1);
    assert_eq!(on(&h, &long), 0);
    h.finish(&before, 5 * H);
    // b's job inside the window runs on the reserved node; a's job of the same shape does not.
    let outsider = h.submit("a", 8, 5, 10 * H);
    let member = h.submit("b", 8, 5, 10 * H + 1);
    let started = h.step(10 * H + 1);
    assert_eq!(started.len(), 1);
    assert_eq!(started[0].job_id, member);
    assert!(!h.is_running(&outsider));
    // Overlapping reservations of the same node, unknown nodes and accounts are refused.
    let clash = h.sched.add_reservation(ReservationRequest {
        name: "other".into(),
        start_s: 15 * H,
        end_s: 30 * H,
        accounts: vec![AccountId::new("a").unwrap()],
        nodes: NodeRequest::Names(vec!["n002".parse().unwrap()]),
    });
    assert!(clash
        .unwrap_err()
        .to_string()
        .contains("already reserved by `leadership`"));
    let ghost = h.sched.add_reservation(ReservationRequest {
        name: "ghost".into(),
        start_s: 40 * H,
        end_s: 50 * H,
        accounts: vec![AccountId::new("zz").unwrap()],
        nodes: NodeRequest::Count(1),
    });
    assert!(ghost
        .unwrap_err()
        .to_string()
        .contains("`zz` does not exist"));
}

#[test]
fn conservative_backfill_plans_every_job_and_delays_none() {
    let mut h = harness(2, "fifo+conservative");
    let first = h.submit("a", 8, 10, 0);
    h.step(0);
    let wide = h.submit("b", 16, 5, 1); // planned at 10 h
    let mid = h.submit("c", 8, 20, 2); // planned at 15 h (after wide)
    let short = h.submit("b", 4, 4, 3); // fits now, ends before 10 h
    let started = h.step(3);
    assert_eq!(started.len(), 1);
    assert_eq!(started[0].job_id, short);
    assert_eq!(
        h.pending_job(&wide).unwrap().estimated_start_s,
        Some(10 * H)
    );
    assert_eq!(h.pending_job(&mid).unwrap().estimated_start_s, Some(15 * H));
    // Under EASY the first job waiting has a plan, and so has the first waiting job of each
    // other partition (its queue's head); nothing else, whatever its account.
    let source = config_source(2).replace(
        "[fair_share]",
        "[[partitions]]\nname = \"debug\"\npriority_tier = 20\n[fair_share]",
    );
    let config = ClusterConfig::from_toml_str(&source, "t.toml").unwrap();
    let mut easy = Harness::with_config(&config, "fifo+backfill");
    easy.submit("a", 8, 10, 0);
    easy.step(0);
    let w = easy.submit("b", 16, 5, 1);
    let in_debug = |h: &mut Harness, account: &str| {
        let mut spec = h.spec(account, 8, 20, 2);
        spec.partition = Some("debug".into());
        h.submit_spec(spec)
    };
    let m = in_debug(&mut easy, "c");
    let m2 = in_debug(&mut easy, "c");
    let other_account = in_debug(&mut easy, "a");
    let same_partition = easy.submit("c", 8, 20, 2);
    easy.step(3);
    assert_eq!(
        easy.pending_job(&w).unwrap().estimated_start_s,
        Some(10 * H)
    );
    assert_eq!(
        easy.pending_job(&m).unwrap().estimated_start_s,
        Some(15 * H)
    );
    for id in [&m2, &other_account, &same_partition] {
        assert_eq!(
            easy.pending_job(id).unwrap().estimated_start_s,
            None,
            "{id}"
        );
    }
    h.finish(&first, 10 * H);
    h.finish(&short, 3 + 4 * H);
}

#[test]
fn gpu_hour_quotas_hold_jobs_with_their_reason_and_refuse_the_impossible() {
    let mut h = harness(4, "fairshare");
    // d may use 100 GPU-hours a UTC day: 8 GPUs x 10 h fits, a second one does not.
    let t0 = 3 * 86_400;
    let first = h.submit("d", 8, 10, t0);
    let second = h.submit("d", 8, 10, t0);
    h.step(t0);
    assert!(h.is_running(&first));
    assert_eq!(h.reason(&second), Some(PendingReason::AssocGrpGpuHoursDay));
    let too_big = h.spec("d", 16, 8, t0);
    assert!(matches!(
        h.sched.submit(too_big),
        Err(Refusal::GpuHours { limit: 100, .. })
    ));
    // The next UTC day the quota is fresh.
    h.sched.accrue_usage(t0 + 10 * H);
    h.finish(&first, t0 + 10 * H);
    h.step(t0 + 10 * H);
    assert_eq!(
        h.reason(&second),
        Some(PendingReason::AssocGrpGpuHoursDay),
        "80 used today"
    );
    h.sched.accrue_usage(t0 + 86_400);
    assert_eq!(h.step(t0 + 86_400)[0].job_id, second);
}

#[test]
fn an_account_over_its_storage_quota_pends_until_it_cleans_up() {
    let mut h = harness(2, "fifo");
    let d = AccountId::new("d").unwrap();
    h.sched.set_storage_used(&d, None, 12_000_000_000_000);
    let job = h.submit("d", 1, 1, 0);
    let other = h.submit("c", 1, 1, 0);
    h.step(0);
    assert_eq!(h.reason(&job), Some(PendingReason::AssocGrpStorage));
    assert!(h.is_running(&other), "only d is held");
    h.sched.set_storage_used(&d, None, 9_000_000_000_000);
    assert_eq!(h.step(60)[0].job_id, job);
}

#[test]
fn slurm_classic_fair_share_halves_at_fair_use() {
    let src = config_source(2).replace(
        "usage_factor_gpu_hours = 100",
        "usage_factor_gpu_hours = 100\nformula = \"slurm_classic\"",
    );
    let config = ClusterConfig::from_toml_str(&src, "c.toml").unwrap();
    let mut h = Harness::with_config(&config, "fairshare");
    // b uses everything for 10 hours: its usage share is 1 against a normalised share of 1/4.
    let hog = h.submit("b", 16, 20, 0);
    h.step(0);
    h.sched.accrue_usage(10 * H);
    let b = AccountId::new("b").unwrap();
    let c = AccountId::new("c").unwrap();
    let factor_b = h.sched.fair_share_of(&b, 10 * H);
    assert!((factor_b - 2f64.powf(-4.0)).abs() < 1e-9, "{factor_b}");
    assert_eq!(
        h.sched.fair_share_of(&c, 10 * H),
        1.0,
        "no usage: full factor"
    );
    h.finish(&hog, 10 * H);
}

/// What the test driver expects to happen next to a running job.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    /// Ends at its time limit, if it is still in the run that started at `started`.
    End { started: i64 },
    /// A preempted job's process exits.
    Exit,
}

/// Drives the scheduler like the simulator does: jobs run to their time limits, preempted jobs
/// exit at their kill deadline and are requeued. Returns (jobs finished, preemptions as
/// (victim, preemptor)).
fn drive(
    h: &mut Harness,
    mut submitted: Vec<(i64, gpuledger_scheduler::JobSpec)>,
) -> (usize, Vec<(JobId, JobId)>) {
    submitted.sort_by_key(|(t, s)| (*t, s.id.clone()));
    let mut due: Vec<(i64, JobId, Due)> = Vec::new();
    let mut started_at: std::collections::HashMap<JobId, i64> = Default::default();
    let mut preemptions = Vec::new();
    let mut finished = 0;
    let mut k = 0;
    let mut t = submitted.first().map(|s| s.0).unwrap_or(0);
    for _ in 0..20_000 {
        due.sort();
        while let Some((at, id, what)) = due.first().cloned() {
            if at > t {
                break;
            }
            due.remove(0);
            match what {
                Due::End { started } => {
                    if started_at.get(&id) == Some(&started) && h.is_running(&id) {
                        h.finish(&id, at);
                        finished += 1;
                    }
                }
                Due::Exit => {
                    if h.is_running(&id) {
                        h.requeue(&id, at);
                        started_at.remove(&id);
                    }
                }
            }
        }
        while k < submitted.len() && submitted[k].0 <= t {
            h.submit_spec(submitted[k].1.clone());
            k += 1;
        }
        h.sched.accrue_usage(t);
        let cycle = h.cycle(t);
        for s in cycle.started {
            let limit = h.sched.running_job(&s.job_id).unwrap().spec.time_limit_s as i64;
            started_at.insert(s.job_id.clone(), t);
            due.push((t + limit, s.job_id, Due::End { started: t }));
        }
        for p in cycle.preempted {
            preemptions.push((p.job_id.clone(), p.by.clone()));
            due.push((p.kill_s, p.job_id, Due::Exit));
        }
        let next_due = due.iter().map(|d| d.0).min().unwrap_or(i64::MAX);
        let next_submit = submitted.get(k).map(|s| s.0).unwrap_or(i64::MAX);
        let next = next_due.min(next_submit);
        if next == i64::MAX {
            break;
        }
        t = next;
    }
    (finished, preemptions)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn invariants_hold_and_preemption_never_loops(
        jobs in proptest::collection::vec(
            (0usize..3, prop_oneof![Just(1u32), Just(2), Just(4), Just(8), Just(16), Just(24)],
             1u64..12, 0i64..48, 0u8..10, any::<bool>()),
            1..50),
        policy in prop_oneof![Just("fifo"), Just("fairshare"), Just("fifo+backfill"),
                              Just("fairshare+backfill"), Just("fairshare+conservative")],
    ) {
        let mut h = harness(4, policy);
        let accounts = ["a", "b", "c"];
        let mut submitted = Vec::new();
        let mut urgent_jobs = 0;
        for (a, g, l, t, kind, elastic) in jobs {
            let mut spec = h.spec(accounts[a], g, l, t * H / 4);
            if kind == 0 {
                spec.partition = Some("urgent".into());
                urgent_jobs += 1;
            } else if kind >= 8 {
                // A part of one GPU: time-sliced or a MIG slice.
                spec.gpus = 1;
                let share = if kind == 8 { "300m" } else { "2g" };
                spec.shape.gpu_share = Some(share.parse().unwrap());
            } else if elastic && g >= 2 {
                spec.min_gpus = Some(g / 2);
            }
            spec.checkpoint_every_s = Some(1800);
            submitted.push((spec.submit_s, spec));
        }
        let admitted = submitted.len();
        let gpus: std::collections::HashMap<JobId, u32> =
            submitted.iter().map(|(_, s)| (s.id.clone(), s.gpus)).collect();
        let (finished, preemptions) = drive(&mut h, submitted);
        prop_assert_eq!(finished, admitted, "every admitted job eventually ran to its end");
        // Only urgent jobs preempt; each frees no more GPUs than it needs and never preempts
        // the same job twice: no loop.
        let mut by_preemptor: std::collections::HashMap<JobId, Vec<JobId>> = Default::default();
        for (victim, by) in &preemptions {
            prop_assert_ne!(victim, by);
            by_preemptor.entry(by.clone()).or_default().push(victim.clone());
        }
        prop_assert!(by_preemptor.len() <= urgent_jobs);
        for (by, victims) in &by_preemptor {
            let mut distinct = victims.clone();
            distinct.sort();
            distinct.dedup();
            prop_assert_eq!(distinct.len(), victims.len(), "{} preempted a job twice", by);
            // Each victim holds at least a third of a GPU (the smallest share here is 2g).
            prop_assert!(victims.len() as u32 <= 3 * gpus[by]);
        }
    }

    #[test]
    fn fair_share_preemption_never_loops_and_never_takes_from_the_preemptors_own(
        jobs in proptest::collection::vec(
            (0usize..3, prop_oneof![Just(1u32), Just(2), Just(4), Just(8), Just(16)],
             1u64..12, 0i64..48, any::<bool>()),
            1..40),
        policy in prop_oneof![Just("fairshare+backfill"), Just("fairshare+conservative")],
    ) {
        let source = format!(
            "{}[scheduler]\nfair_share_preemption = true\nfair_share_preemption_after = \"30m\"\n\
             fair_share_preemption_max_loss = \"30d\"\n",
            config_source(4)
        );
        let config = ClusterConfig::from_toml_str(&source, "t.toml").unwrap();
        let mut h = Harness::with_config(&config, policy);
        let accounts = ["a", "b", "c"];
        let mut submitted = Vec::new();
        let mut account_of = std::collections::HashMap::new();
        for (a, g, l, t, checkpoints) in jobs {
            let mut spec = h.spec(accounts[a], g, l, t * H / 4);
            if checkpoints {
                spec.checkpoint_every_s = Some(1800);
            }
            account_of.insert(spec.id.clone(), accounts[a]);
            submitted.push((spec.submit_s, spec));
        }
        let admitted = submitted.len();
        let (finished, preemptions) = drive(&mut h, submitted);
        prop_assert_eq!(finished, admitted, "every admitted job eventually ran to its end");
        // A job preempts at most once per wait: the same pair again only after the preemptor
        // was itself preempted (a new wait).
        let mut since_own_wait: std::collections::HashSet<(JobId, JobId)> = Default::default();
        for (victim, by) in &preemptions {
            prop_assert_ne!(account_of[victim], account_of[by], "took from its own account");
            prop_assert!(
                since_own_wait.insert((victim.clone(), by.clone())),
                "{} preempted {} twice in one wait", by, victim
            );
            since_own_wait.retain(|(_, b)| b != victim);
        }
    }

    #[test]
    fn backfill_never_delays_a_planned_start(
        jobs in proptest::collection::vec(
            (0usize..2, prop_oneof![Just(1u32), Just(2), Just(4), Just(8), Just(12), Just(16), Just(32)], 1u64..12),
            1..30),
        policy in prop_oneof![Just("fifo+backfill"), Just("fifo+conservative")],
    ) {
        let mut h = harness(4, policy);
        let accounts = ["b", "c"];
        let mut planned: std::collections::HashMap<JobId, i64> = Default::default();
        let ids: Vec<JobId> = jobs.iter().map(|(a, g, l)| h.submit(accounts[*a], *g, *l, 0)).collect();
        let mut ends: Vec<(i64, JobId)> = Vec::new();
        let mut t = 0;
        let mut started = 0;
        while started < ids.len() {
            ends.sort();
            while ends.first().is_some_and(|e| e.0 <= t) {
                let (at, id) = ends.remove(0);
                h.finish(&id, at);
            }
            for s in h.step(t) {
                if let Some(plan) = planned.get(&s.job_id) {
                    prop_assert!(t <= *plan, "job {} planned at {plan} started at {t}", s.job_id);
                }
                let limit = h.sched.running_job(&s.job_id).unwrap().spec.time_limit_s as i64;
                ends.push((t + limit, s.job_id));
                started += 1;
            }
            // The job first in line has the plan backfill protects: nothing that starts out of
            // order may push it back. (Plans of jobs further back may move when a job ahead of
            // them gets an earlier start.)
            for p in h.sched.pending().filter(|p| p.reason == PendingReason::Resources) {
                if let Some(e) = p.estimated_start_s {
                    planned.entry(p.spec.id.clone()).or_insert(e);
                }
            }
            let Some(next) = ends.iter().map(|e| e.0).min() else { break };
            t = next;
        }
        prop_assert_eq!(started, ids.len());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Planned starts kept from the last cycle are the starts a fresh search makes: two
    /// schedulers, one keeping plans and one searching afresh every cycle, see the same
    /// arrivals, jobs ending early or at their limits, preemptions, a node drained and back, an
    /// advance reservation added and removed, and decide the same at every cycle, down to each
    /// waiting job's planned start. Sometimes jobs past a short `max_wait` get planned starts
    /// first, and start when the queue reaches them (their plans dropped).
    #[test]
    fn kept_plans_are_the_plans_a_fresh_search_makes(
        jobs in arbitrary_jobs(),
        policy in prop_oneof![Just("fairshare+conservative"), Just("fifo+conservative"),
                              Just("fairshare+backfill")],
        (drain, reserve) in drain_and_reservation(),
        starving in any::<bool>(),
    ) {
        let source = if starving {
            format!("{}[scheduler]\nmax_wait = \"1h\"\nmax_wait_plans = 2\n", config_source(4))
        } else {
            config_source(4)
        };
        let config = ClusterConfig::from_toml_str(&source, "t.toml").unwrap();
        same_decisions(&config, policy, jobs, drain, reserve, |s| s.set_keep_plans(false))?;
    }

    /// The jobs a cycle only marks waiting, marked in stretches, are marked as the walk job by
    /// job marks them, and a plan known to fail is the one a search fails to find: two
    /// schedulers, one of them walking every job and searching every plan, decide the same at
    /// every cycle, with a shallow backfill depth (so that stretches begin early), quotas
    /// (account `a`), two partitions, parts of GPUs, jobs past `max_wait`, the relief, plans up
    /// to each account's share or not, a drain (of one node or of all, when no plan is found
    /// and stretches begin below the depth) and a reservation.
    #[test]
    fn waiting_jobs_marked_in_stretches_are_marked_as_job_by_job(
        jobs in arbitrary_jobs(),
        policy in prop_oneof![Just("fairshare+conservative"), Just("fifo+conservative"),
                              Just("fairshare+backfill"), Just("fifo+backfill")],
        (drain, reserve) in drain_and_reservation(),
        depth in 1u32..5,
        starving in any::<bool>(),
        to_share in any::<bool>(),
        each_account in any::<bool>(),
    ) {
        let mut source = format!(
            "{}[scheduler]\nbackfill_depth = {depth}\nrelief_after = \"2h\"\n\
             plan_to_share = {to_share}\nplan_each_account = {each_account}\n",
            config_source(4)
        );
        if starving {
            source.push_str("max_wait = \"1h\"\nmax_wait_plans = 2\n");
        }
        let config = ClusterConfig::from_toml_str(&source, "t.toml").unwrap();
        same_decisions(&config, policy, jobs, drain, reserve, |s| s.set_quiet_stretches(false))?;
    }
}

/// A job of the properties above: account, GPUs, limit (hours), submission (quarter hours),
/// how much of its limit it runs (quarters) and what else it asks (0: the urgent partition,
/// 1: a part of a GPU, 2: an elastic minimum).
type ArbitraryJob = (usize, u32, u64, i64, i64, u8);

/// Up to 40 such jobs.
fn arbitrary_jobs() -> impl Strategy<Value = Vec<ArbitraryJob>> {
    let gpus = prop_oneof![
        Just(1u32),
        Just(2),
        Just(4),
        Just(8),
        Just(12),
        Just(16),
        Just(24),
        // The whole cluster: with a node drained no plan is found for it.
        Just(32)
    ];
    proptest::collection::vec(
        (0usize..3, gpus, 1u64..12, 0i64..40, 1i64..=4, 0u8..12),
        1..40,
    )
}

/// Perhaps node 1 drained, or every node (the whole cluster in maintenance, where no waiting
/// job gets a planned start): from when, for how long (quarter hours), whether every node.
type Drain = Option<(i64, i64, bool)>;

/// Perhaps a reservation of one node for account b: when it is made, from when after that,
/// for how long, and how long it is kept before it is removed (quarter hours).
type Reserve = Option<(i64, i64, i64, i64)>;

/// A [`Drain`] and a [`Reserve`].
fn drain_and_reservation() -> impl Strategy<Value = (Drain, Reserve)> {
    (
        proptest::option::of((0i64..40, 1i64..20, any::<bool>())),
        proptest::option::of((0i64..40, 0i64..20, 1i64..20, 1i64..30)),
    )
}

/// Drives two schedulers of `config` under `policy`, the second changed by `change`, through
/// the same arrivals, ends, preemptions, drain and reservation, and fails where any cycle's
/// decisions or any waiting job's reason or planned start differ.
fn same_decisions(
    config: &ClusterConfig,
    policy: &str,
    jobs: Vec<ArbitraryJob>,
    drain: Drain,
    reserve: Reserve,
    change: impl Fn(&mut gpuledger_scheduler::Scheduler),
) -> Result<(), TestCaseError> {
    let mut first = Harness::with_config(config, policy);
    let mut second = Harness::with_config(config, policy);
    change(&mut second.sched);
    let accounts = ["a", "b", "c"];
    let mut submitted = Vec::new();
    let mut runs: std::collections::HashMap<JobId, i64> = Default::default();
    for (a, g, l, t, quarters, kind) in jobs {
        let mut spec = first.spec(accounts[a], g, l, t * H / 4);
        if kind == 0 {
            spec.partition = Some("urgent".into());
        } else if kind == 1 {
            spec.gpus = 1;
            spec.shape.gpu_share = Some("2g".parse().unwrap());
        } else if kind == 2 && g >= 2 {
            spec.min_gpus = Some(g / 2);
        }
        spec.checkpoint_every_s = Some(1800);
        // Most jobs end before their limit (the common case in real traces).
        runs.insert(spec.id.clone(), l as i64 * H * quarters / 4);
        submitted.push(spec);
    }
    submitted.sort_by_key(|s| (s.submit_s, s.id.clone()));
    let mut due: Vec<(i64, JobId, bool)> = Vec::new();
    let mut k = 0;
    let mut t = submitted.first().map(|s| s.submit_s).unwrap_or(0);
    // (time, what): Some(true/false) drains the drained nodes or puts them back; None adds
    // (first) or removes (then) a reservation of one node for account b.
    let mut changes: Vec<(i64, Option<bool>)> = Vec::new();
    let drained = match drain {
        Some((_, _, true)) => 0..first.sched.cluster().node_count(),
        _ => 1..2,
    };
    if let Some((from, quarters, _)) = drain {
        changes.push((from * H / 4, Some(true)));
        changes.push(((from + quarters) * H / 4, Some(false)));
    }
    let mut reservation = reserve.map(|(at, start, len, kept)| {
        changes.push((at * H / 4, None));
        changes.push(((at + kept) * H / 4, None));
        ReservationRequest {
            name: "r".into(),
            start_s: (at + start) * H / 4,
            end_s: (at + start + len) * H / 4,
            accounts: vec![AccountId::new("b").unwrap()],
            nodes: NodeRequest::Count(1),
        }
    });
    changes.sort_by_key(|c| c.0);
    for _ in 0..5_000 {
        due.sort();
        while due.first().is_some_and(|d| d.0 <= t) {
            let (at, id, exits) = due.remove(0);
            for h in [&mut first, &mut second] {
                if !h.is_running(&id) {
                    continue;
                }
                if exits {
                    h.requeue(&id, at);
                } else {
                    h.finish(&id, at);
                }
            }
        }
        while changes.first().is_some_and(|c| c.0 <= t) {
            match changes.remove(0).1 {
                Some(on) => {
                    for node in drained.clone() {
                        let name = first.sched.cluster().node_spec(node).id.to_string();
                        prop_assert!(first.sched.set_drained(&name, on));
                        prop_assert!(second.sched.set_drained(&name, on));
                    }
                }
                None => match reservation.take() {
                    Some(req) => {
                        let added = first.sched.add_reservation(req.clone());
                        prop_assert_eq!(&added, &second.sched.add_reservation(req));
                    }
                    None => {
                        let removed = first.sched.remove_reservation("r");
                        prop_assert_eq!(removed, second.sched.remove_reservation("r"));
                    }
                },
            }
        }
        while k < submitted.len() && submitted[k].submit_s <= t {
            first.submit_spec(submitted[k].clone());
            second.submit_spec(submitted[k].clone());
            k += 1;
        }
        first.sched.accrue_usage(t);
        second.sched.accrue_usage(t);
        let one = first.cycle(t);
        let two = second.cycle(t);
        prop_assert_eq!(format!("{one:?}"), format!("{two:?}"), "cycle at {}", t);
        let waiting = |h: &Harness| -> Vec<(JobId, PendingReason, Option<i64>)> {
            let mut w: Vec<_> = h
                .sched
                .pending()
                .map(|p| (p.spec.id.clone(), p.reason, p.estimated_start_s))
                .collect();
            w.sort_by(|a, b| a.0.cmp(&b.0));
            w
        };
        prop_assert_eq!(waiting(&first), waiting(&second), "plans at {}", t);
        for s in &one.started {
            due.push((t + runs[&s.job_id], s.job_id.clone(), false));
        }
        for p in &one.preempted {
            due.push((p.kill_s, p.job_id.clone(), true));
        }
        let next_due = due.iter().map(|d| d.0).min().unwrap_or(i64::MAX);
        let next_submit = submitted.get(k).map(|s| s.submit_s).unwrap_or(i64::MAX);
        let next_tick = first.sched.next_due(t).unwrap_or(i64::MAX);
        let next_change = changes.first().map(|c| c.0).unwrap_or(i64::MAX);
        let next = next_due.min(next_submit).min(next_tick).min(next_change);
        if next == i64::MAX {
            break;
        }
        t = next;
    }
    Ok(())
}

#[test]
fn a_drained_node_takes_no_new_job_nor_a_plan_and_its_running_job_runs_on() {
    // conservative backfill: plans for every waiting job, none of them on the drained node.
    let mut h = harness(2, "fairshare+conservative");
    let running = h.submit("a", 8, 10, 0);
    h.step(0);
    assert!(h.is_running(&running));
    let on = h
        .sched
        .running_job(&running)
        .map(|r| r.placement.0[0].node)
        .unwrap();
    let name = h.sched.cluster().node_spec(on).id.to_string();
    assert!(h.sched.set_drained(&name, true));
    assert!(!h.sched.set_drained("no-such-node", true));
    // Two 8-GPU jobs: one takes the other node, the next may not take the drained one, not
    // even once the job on it ends.
    let first = h.submit("b", 8, 10, 1);
    let second = h.submit("c", 8, 10, 2);
    h.step(2);
    assert!(h.is_running(&first) && h.is_running(&running));
    assert!(!h.is_running(&second));
    let planned = h.pending_job(&second).unwrap().estimated_start_s;
    assert_eq!(
        planned,
        Some(2 + 10 * 3600),
        "planned after the job on the other node, not on the drained one"
    );
    h.finish(&running, 3);
    h.step(3);
    assert!(!h.is_running(&second), "started on a drained node");
    assert!(h.sched.is_drained(on));
    // Resumed, the node takes it.
    assert!(h.sched.set_drained(&name, false));
    h.step(4);
    assert!(h.is_running(&second));
}

#[test]
fn the_starvation_bound_plans_every_job_past_max_wait() {
    let planned = |plan_each_account: bool, max_wait: &str, at: i64| {
        let config = config_with_scheduler(
            2,
            &format!(
                "plan_each_account = {plan_each_account}\nplan_to_share = false\n\
                 max_wait = \"{max_wait}\"\nmax_wait_plans = 3\n"
            ),
        );
        // FIFO order: a's running job, a's whole-cluster job at the head (EASY plans it from
        // 10 h), then b's and c's half-cluster jobs behind it.
        let mut h = held_by_a_until_10_h(&config, "fifo+backfill");
        let head = h.submit("a", 16, 10, 1);
        let b = h.submit("b", 8, 1, 2);
        let c = h.submit("c", 8, 1, 3);
        h.step(at);
        assert_eq!(
            h.pending_job(&head).unwrap().estimated_start_s,
            Some(10 * 3600)
        );
        [b, c].map(|id| h.pending_job(&id).unwrap().estimated_start_s)
    };
    // EASY plans only the queue's head: b's and c's jobs have no planned start. Under FIFO
    // each account's first job is no one's to plan (see the fair-share test below).
    assert_eq!(planned(false, "1d", 3), [None, None]);
    assert_eq!(planned(true, "1d", 3), [None, None]);
    // Past max_wait, every job gets one whatever its place.
    assert_eq!(planned(false, "1m", 3), [None, None]);
    assert_eq!(planned(false, "1m", 63), [Some(20 * 3600), Some(20 * 3600)]);
}

#[test]
fn under_fair_share_each_accounts_first_waiting_job_gets_a_planned_start() {
    // Two nodes held by a until 10 h. b (no usage) waits with a whole-cluster job, then c
    // with a one-node job, then b with another: EASY plans b's first job; with
    // `plan_each_account` c's first job is planned too (after b's), and b's second is not.
    let planned = |plan_each_account: bool| {
        let config = config_with_scheduler(
            2,
            &format!("plan_each_account = {plan_each_account}\nplan_to_share = false\n"),
        );
        let mut h = held_by_a_until_10_h(&config, "fairshare+backfill");
        let wide = h.submit("b", 16, 1, 1);
        let c = h.submit("c", 8, 1, 2);
        let b2 = h.submit("b", 8, 1, 3);
        h.step(3);
        [wide, c, b2].map(|id| h.pending_job(&id).unwrap().estimated_start_s)
    };
    assert_eq!(planned(false), [Some(10 * H), None, None]);
    assert_eq!(planned(true), [Some(10 * H), Some(11 * H), None]);
}

#[test]
fn an_account_below_its_share_gets_planned_starts_up_to_its_share_not_one_at_a_time() {
    // Four 8-GPU nodes full of b's one-GPU jobs, each node's ending one an hour apart over
    // eight hours; b keeps the queue full of eight-hour one-GPU jobs. c (weight 3 of 4: 24 of
    // the 32 GPUs) asks for three whole nodes. Every node that frees a GPU is refilled by b
    // unless a plan holds it: with one plan for c at a time its nodes drain one after another,
    // with a plan for each job up to its share all three drain at once.
    let starts = |plan_to_share: bool| {
        let source = config_source(4).replace(
            "id = \"c\"\nname = \"C\"\nweight = 1",
            "id = \"c\"\nname = \"C\"\nweight = 3",
        );
        let source = format!("{source}[scheduler]\nplan_to_share = {plan_to_share}\n");
        let config = ClusterConfig::from_toml_str(&source, "t.toml").unwrap();
        let mut h = Harness::with_config(&config, "fairshare+backfill");
        for i in 0..32 {
            h.submit("b", 1, i % 8 + 1, 0);
        }
        h.step(0);
        assert_eq!(h.sched.cluster().free_gpus(), 0);
        let wide: Vec<JobId> = (0..3).map(|_| h.submit("c", 8, 10, 60)).collect();
        let mut started = vec![None; wide.len()];
        let mut t = 0;
        while t < 3 * 86_400 && started.iter().any(Option::is_none) {
            t += 600;
            h.finish_ended(t);
            for _ in h.queued("b")..40 {
                h.submit("b", 1, 8, t);
            }
            h.step(t);
            for (s, id) in started.iter_mut().zip(&wide) {
                if s.is_none() && h.is_running(id) {
                    *s = Some(t);
                }
            }
        }
        started
            .into_iter()
            .map(|s| s.expect("started within three days"))
            .collect::<Vec<_>>()
    };
    let hour = 3600;
    // Up to its share: every node drains for c from the start and all three start at 8 h.
    assert_eq!(starts(true), vec![8 * hour; 3]);
    // One plan at a time: the second and third wait for b's refills on the other nodes.
    let one_at_a_time = starts(false);
    assert_eq!(one_at_a_time[0], 8 * hour);
    assert!(
        one_at_a_time[2] >= 15 * hour,
        "c's third node drained in {one_at_a_time:?}"
    );
}

#[test]
fn an_account_below_its_share_now_goes_before_one_above_it_whatever_their_past_use() {
    // c used the whole cluster for 100 hours; b then takes it all for a few hours while c
    // waits with nothing running. Both ask for one node more: b's light past use ranks it
    // first by usage alone, but it already holds twice its share of the two nodes.
    let run = |below_share_first: bool| {
        let config =
            config_with_scheduler(2, &format!("below_share_first = {below_share_first}\n"));
        let mut h = Harness::with_config(&config, "fairshare+backfill");
        let heavy: Vec<JobId> = (0..2).map(|_| h.submit("c", 8, 100, 0)).collect();
        h.step(0);
        h.sched.accrue_usage(100 * H);
        for id in &heavy {
            h.finish(id, 100 * H);
        }
        let first = h.submit("b", 8, 10, 100 * H);
        let second = h.submit("b", 8, 20, 100 * H);
        h.step(100 * H);
        assert!(h.is_running(&first) && h.is_running(&second));
        let from_b = h.submit("b", 8, 10, 100 * H + 60);
        let from_c = h.submit("c", 8, 10, 100 * H + 60);
        h.step(100 * H + 60);
        h.sched.accrue_usage(110 * H);
        h.finish(&first, 110 * H);
        h.step(110 * H);
        (h.is_running(&from_b), h.is_running(&from_c))
    };
    assert_eq!(
        run(true),
        (false, true),
        "c, holding nothing, takes the node"
    );
    assert_eq!(run(false), (true, false), "by usage alone b goes first");
}

#[test]
fn a_job_waiting_past_relief_after_goes_before_accounts_above_the_floor_and_no_further() {
    // Six nodes; b and c each ask for more than their half (24 GPUs). c holds 28 and has
    // waited for a node since the start; b holds 20 (or 16) and asks for a node an hour before
    // one frees, at 4 days, when c's 96-hour job ends: c then holds 20 too, having used more.
    // Who gets the node?
    let day = 24 * H;
    let run = |settings: &str, b_holds: u32, wide_c_at: i64| {
        let mut h = Harness::with_config(&config_with_scheduler(6, settings), "fairshare+backfill");
        let mut b = vec![8, 8, 4];
        if b_holds == 16 {
            b.pop();
        }
        for gpus in b {
            h.submit("b", gpus, 1000, 0);
        }
        let ending = h.submit("c", 8, 96, 0);
        for gpus in [8, 8, 4] {
            h.submit("c", gpus, 1000, 0);
        }
        h.step(0);
        assert!(h.is_running(&ending));
        let wide_c = h.submit("c", 8, 10, wide_c_at);
        let mut t = wide_c_at;
        while t < 4 * day - H {
            h.sched.accrue_usage(t);
            h.step(t);
            t += 6 * H;
        }
        let wide_b = h.submit("b", 8, 10, 4 * day - H);
        h.step(4 * day - H);
        h.sched.accrue_usage(4 * day);
        h.finish(&ending, 4 * day);
        h.step(4 * day);
        assert!(
            h.is_running(&wide_b) != h.is_running(&wide_c),
            "one node freed"
        );
        if h.is_running(&wide_c) {
            "c"
        } else {
            "b"
        }
    };
    // b is below its share, c at it: by standing b goes first...
    assert_eq!(run("relief = false\n", 20, 60), "b");
    assert_eq!(run("", 20, 4 * day - 2 * H), "b", "c's job waited 2 hours");
    // ...unless c's job has waited 3 days (the default) and b holds at least 80% of its share.
    assert_eq!(run("", 20, 60), "c");
    assert_eq!(run("relief_after = \"5d\"\n", 20, 60), "b");
    assert_eq!(run("", 16, 60), "b", "b holds two thirds of its share");
    assert_eq!(run("relief_floor_percent = 60\n", 16, 60), "c");
}

#[test]
fn jobs_the_relief_lifts_get_planned_starts_up_to_what_it_may_take() {
    // Four nodes, b and c each holding two (their shares) with jobs ending at 100, 110, 120
    // and 130 hours. c waits for three more nodes since the start; small jobs of b wait too.
    // Which of c's jobs have a planned start?
    let day = 24 * H;
    let planned = |settings: &str, at: i64| {
        let mut h = Harness::with_config(&config_with_scheduler(4, settings), "fairshare+backfill");
        for (account, hours) in [("b", 100), ("c", 110), ("b", 120), ("c", 130)] {
            h.submit(account, 8, hours, 0);
        }
        let waiting: Vec<JobId> = (0..3).map(|_| h.submit("c", 8, 10, 0)).collect();
        for _ in 0..4 {
            h.submit("b", 1, 10, 0);
        }
        h.step(0);
        h.step(at);
        waiting
            .iter()
            .map(|id| h.pending_job(id).unwrap().estimated_start_s)
            .collect::<Vec<_>>()
    };
    // Before the relief lifts them only c's first waiting job has one (each account's first).
    assert_eq!(planned("", 2 * day), [Some(100 * H), None, None]);
    // Lifted at 3 days, the next one gets one too: the relief's planned starts may hold 20%
    // of the cluster (100 - the floor's 80%), here 6.4 GPUs, and a job starts that count.
    assert_eq!(planned("", 3 * day), [Some(100 * H), Some(110 * H), None]);
    // With the floor at half, 16 GPUs: the third too (where the first's 10 hours end).
    assert_eq!(
        planned("relief_floor_percent = 50\n", 3 * day),
        [Some(100 * H), Some(110 * H), Some(110 * H)]
    );
    // Nothing to take above a floor at the share, and nothing lifted with the relief off.
    assert_eq!(
        planned("relief_floor_percent = 100\n", 3 * day),
        [Some(100 * H), None, None]
    );
    assert_eq!(
        planned("relief = false\n", 3 * day),
        [Some(100 * H), None, None]
    );
}

/// `nodes` nodes with the `[scheduler]` settings given (TOML lines).
/// Two nodes (of `config`) held by a's whole-cluster job from 0 to 10 h.
fn held_by_a_until_10_h(config: &ClusterConfig, policy: &str) -> Harness {
    let mut h = Harness::with_config(config, policy);
    let running = h.submit("a", 16, 10, 0);
    h.step(0);
    assert!(h.is_running(&running));
    h
}

fn config_with_scheduler(nodes: u32, settings: &str) -> ClusterConfig {
    let source = format!("{}[scheduler]\n{settings}", config_source(nodes));
    ClusterConfig::from_toml_str(&source, "t.toml").unwrap()
}

/// `nodes` nodes with fair-share preemption on after an hour's wait, any job a victim however
/// much work it would lose.
fn fair_share_preemption_config(nodes: u32) -> ClusterConfig {
    config_with_scheduler(
        nodes,
        "fair_share_preemption = true\nfair_share_preemption_after = \"1h\"\n\
         fair_share_preemption_max_loss = \"30d\"\n",
    )
}

#[test]
fn fair_share_preemption_takes_no_job_that_would_lose_more_than_max_loss() {
    // Two nodes, b and c of equal weight; b took all 16 GPUs while c was idle, and c waits
    // with a whole-node job. b's jobs never checkpointed: past the default `max_loss` (an hour
    // of work) they are not taken, however long c waits. Once eight of them report a
    // checkpoint those eight would lose a minute, and they are taken.
    let config = config_with_scheduler(
        2,
        "fair_share_preemption = true\nfair_share_preemption_after = \"30m\"\n",
    );
    assert_eq!(
        config.scheduler.fair_share_preemption_max_loss.as_secs(),
        3600
    );
    let mut h = Harness::with_config(&config, "fairshare+backfill");
    let b: Vec<JobId> = (0..16).map(|_| h.submit("b", 1, 10, 0)).collect();
    h.step(0);
    assert!(b.iter().all(|id| h.is_running(id)));
    let wide = h.submit("c", 8, 10, 60);
    for t in [3_601, 7_200, 20_000] {
        let cycle = h.cycle(t);
        assert!(cycle.preempted.is_empty(), "at {t}: {:?}", cycle.preempted);
    }
    // A job that checkpoints often enough is always within reach.
    let on_node = |h: &Harness, id: &JobId| h.sched.running_job(id).unwrap().placement.0[0].node;
    let first_node = on_node(&h, &b[0]);
    let saved: Vec<&JobId> = b
        .iter()
        .filter(|id| on_node(&h, id) == first_node)
        .collect();
    assert_eq!(saved.len(), 8);
    for id in &saved {
        assert!(h.sched.checkpointed(id, 20_000));
    }
    let cycle = h.cycle(20_060);
    let mut taken: Vec<&JobId> = cycle.preempted.iter().map(|p| &p.job_id).collect();
    taken.sort();
    let mut expected = saved.clone();
    expected.sort();
    assert_eq!(taken, expected, "only the jobs that checkpointed");
    assert!(cycle.preempted.iter().all(|p| p.by == wide));
}

#[test]
fn fair_share_preemption_takes_back_an_accounts_share_and_no_more() {
    // Two nodes, b and c of equal weight. b took all 16 GPUs with one-GPU jobs while c was
    // idle; c now asks for a whole node: its share is half the cluster.
    let config = fair_share_preemption_config(2);
    let run = |b_urgent: bool| {
        let mut h = Harness::with_config(&config, "fairshare+backfill");
        let b: Vec<JobId> = (0..16)
            .map(|_| {
                if b_urgent {
                    h.urgent("b", 1, 10, 0)
                } else {
                    h.submit("b", 1, 10, 0)
                }
            })
            .collect();
        h.step(0);
        assert!(b.iter().all(|id| h.is_running(id)));
        let wide = h.submit("c", 8, 10, 60);
        // Not before it has waited an hour.
        assert!(h.cycle(60).preempted.is_empty());
        assert!(h.cycle(3659).preempted.is_empty());
        (h, b, wide)
    };
    let (mut h, _, wide) = run(false);
    let cycle = h.cycle(3660);
    assert_eq!(
        cycle.preempted.len(),
        8,
        "one node's worth: {:?}",
        cycle.preempted
    );
    let nodes: std::collections::BTreeSet<usize> = cycle
        .preempted
        .iter()
        .map(|p| {
            let job = h.sched.running_job(&p.job_id).unwrap();
            assert_eq!(job.spec.account.as_str(), "b");
            assert_eq!(p.by, wide);
            job.placement.0[0].node
        })
        .collect();
    assert_eq!(nodes.len(), 1, "the victims free one whole node");
    // While they exit nothing more is taken.
    assert!(h.cycle(3700).preempted.is_empty());
    for p in &cycle.preempted {
        h.requeue(&p.job_id, p.kill_s);
    }
    h.step(3660 + 300);
    assert!(h.is_running(&wide));
    // Each holds its share now: c's next job waits for b's to end, whatever its wait.
    let next = h.submit("c", 8, 10, 4000);
    for t in [4000, 8000, 20_000] {
        assert!(h.cycle(t).preempted.is_empty(), "preempted at {t}");
    }
    assert!(!h.is_running(&next));
    // A higher tier's jobs are not taken for fair share.
    let (mut h, _, wide) = run(true);
    for t in [3660, 7200, 30_000] {
        assert!(h.cycle(t).preempted.is_empty(), "preempted at {t}");
    }
    assert!(!h.is_running(&wide));
}

#[test]
fn an_accounts_share_goes_to_its_first_waiting_job_before_later_ones_preempt() {
    // Four nodes, b and c of equal weight: a share of 16 GPUs each. b holds three nodes, c
    // one (its job ends at 2 h). c waits with a two-node job and, submitted after it, a
    // one-node job. c's room below its share (8 GPUs) is too small for the wide job and just
    // enough for the later one; the later one must not take it by preemption, or the wide
    // job waits until c's later work is done, however long it waited.
    let config = fair_share_preemption_config(4);
    let mut h = Harness::with_config(&config, "fairshare+backfill");
    let b: Vec<JobId> = (0..3).map(|_| h.submit("b", 8, 10, 0)).collect();
    let held = h.submit("c", 8, 2, 0);
    h.step(0);
    assert!(b.iter().chain([&held]).all(|id| h.is_running(id)));
    let wide = h.submit("c", 16, 10, 60);
    let later = h.submit("c", 8, 10, 120);
    for t in [3660, 3720, 5400] {
        let cycle = h.cycle(t);
        assert!(
            cycle.preempted.is_empty(),
            "c's later job took its share's room at {t}: {:?}",
            cycle.preempted
        );
    }
    // c's first job ends: its room is the wide job's size, and the wide job takes it.
    h.finish(&held, 7200);
    let cycle = h.cycle(7200);
    assert_eq!(cycle.preempted.len(), 1, "{:?}", cycle.preempted);
    assert_eq!(cycle.preempted[0].by, wide);
    for p in &cycle.preempted {
        h.requeue(&p.job_id, p.kill_s);
    }
    h.step(7200 + 300);
    assert!(h.is_running(&wide));
    assert!(!h.is_running(&later), "c holds its share");
}

#[test]
fn a_job_past_max_wait_keeps_its_planned_gpus_from_every_later_job() {
    // One node; team b keeps two urgent 4-GPU jobs queued at all times (a higher tier, ahead
    // of anything of a's), so whenever GPUs free up a b job takes them: a's whole-node job
    // never finds the node free. Past max_wait its planned start holds the node for it.
    let started_at = |max_wait: &str| {
        let source = format!(
            "{}[scheduler]\nplan_each_account = false\nplan_to_share = false\npreemption = false\nmax_wait = \"{max_wait}\"\nmax_wait_plans = 1\n",
            config_source(1)
        );
        let config = ClusterConfig::from_toml_str(&source, "t.toml").unwrap();
        let mut h = Harness::with_config(&config, "fairshare+backfill");
        let first = h.urgent("b", 4, 1, 0);
        let second = h.urgent("b", 4, 1, 0);
        h.step(0);
        assert!(h.is_running(&first) && h.is_running(&second));
        let whole = h.submit("a", 8, 1, 1);
        let mut t = 0;
        while t < 3 * 86_400 {
            t += 600;
            h.finish_ended(t);
            for _ in h.queued("b")..2 {
                h.urgent("b", 4, 1, t);
            }
            h.step(t);
            if h.is_running(&whole) {
                return Some(t);
            }
        }
        None
    };
    assert_eq!(started_at("3650d"), None, "starved for three days");
    let t = started_at("1d").expect("started within three days");
    // Planned at one day, it starts when the b jobs then running reach their limits.
    assert!(
        (86_400..=86_400 + 3600 + 600).contains(&t),
        "started at {t}"
    );
}

fn mixed_cluster() -> ClusterConfig {
    ClusterConfig::from_toml_str(
        r#"version = 1
[cluster]
name = "mixed"
[[node_pools]]
name = "small"
prefix = "a"
count = 4
gpus_per_node = 2
gpu_model = "a100"
[[node_pools]]
name = "large"
prefix = "h"
count = 2
gpus_per_node = 8
gpu_model = "h100-sxm"
[[partitions]]
name = "train"
priority_tier = 20
default = true
[prices]
version = "v"
effective_from = "2026-01-01"
currency = "CNY"
gpu_hour = { h100-sxm = "10", a100 = "6" }
[[accounts]]
id = "a"
name = "A"
weight = 1
[[accounts]]
id = "b"
name = "B"
weight = 1
"#,
        "mixed.toml",
    )
    .unwrap()
}

#[test]
fn jobs_run_in_the_shape_they_ask_for_or_are_refused_when_none_exists() {
    use gpuledger_model::GpuModel;
    use gpuledger_scheduler::cluster::Shape;
    for policy in [
        "fifo+backfill",
        "fairshare+backfill",
        "fairshare+conservative",
    ] {
        let mut h = Harness::with_config(&mixed_cluster(), policy);
        let shaped = |h: &mut Harness, gpus: u32, shape: Shape| {
            let mut spec = h.spec("a", gpus, 1, 0);
            spec.shape = shape;
            spec
        };
        let h100 = || Shape {
            gpu_types: vec![GpuModel::H100Sxm.into()],
            ..Shape::default()
        };
        // Never possible: a model the cluster lacks; 4 per node on 3 nodes (two nodes have 4);
        // an elastic job that fixes its layout.
        let h200 = shaped(
            &mut h,
            1,
            Shape {
                gpu_types: vec![GpuModel::H200.into()],
                ..Shape::default()
            },
        );
        assert!(
            matches!(h.sched.submit(h200), Err(Refusal::ShapeNeverFits { .. })),
            "{policy}"
        );
        let wide = shaped(
            &mut h,
            12,
            Shape {
                gpus_per_node: Some(4),
                ..Shape::default()
            },
        );
        assert!(matches!(
            h.sched.submit(wide),
            Err(Refusal::ShapeNeverFits { .. })
        ));
        let mut elastic = shaped(
            &mut h,
            4,
            Shape {
                max_nodes: Some(1),
                ..Shape::default()
            },
        );
        elastic.min_gpus = Some(2);
        assert_eq!(h.sched.submit(elastic), Err(Refusal::ElasticShape));

        // An H100 job of 8 takes one H100 node; a second one of 16 waits for both, though the
        // four A100 nodes are free; a 2-per-node job spreads over the A100 nodes meanwhile.
        let first = shaped(&mut h, 8, h100());
        let first = h.submit_spec(first);
        h.step(0);
        assert!(h.is_running(&first));
        let both = shaped(&mut h, 16, h100());
        let both = h.submit_spec(both);
        let spread = shaped(
            &mut h,
            6,
            Shape {
                gpus_per_node: Some(2),
                max_nodes: Some(3),
                ..Shape::default()
            },
        );
        let spread = h.submit_spec(spread);
        h.step(60);
        assert!(!h.is_running(&both), "{policy}: no second free H100 node");
        assert!(h.is_running(&spread), "{policy}");
        let nodes: Vec<String> = h
            .sched
            .running_job(&spread)
            .map(|r| h.sched.cluster().to_allocation(&r.placement).to_string())
            .into_iter()
            .collect();
        assert_eq!(nodes, ["a001:0-1;a002:0-1;a003:0-1"], "{policy}");
        h.finish(&first, H);
        h.step(H);
        assert!(h.is_running(&both), "{policy}");
        let held = h.sched.running_job(&both).unwrap();
        assert_eq!(
            h.sched.cluster().to_allocation(&held.placement).to_string(),
            "h001:0-7;h002:0-7"
        );
    }
}

#[test]
fn shares_of_a_gpu_pack_onto_one_gpu_and_wait_for_a_gpu_of_their_mode() {
    use gpuledger_scheduler::cluster::Shape;
    for policy in [
        "fifo",
        "fifo+backfill",
        "fairshare+backfill",
        "fairshare+conservative",
    ] {
        let mut h = harness(1, policy);
        let share = |h: &mut Harness, text: &str, limit_h: u64, t: i64| {
            let mut spec = h.spec("c", 1, limit_h, t);
            spec.shape = Shape {
                gpu_share: Some(text.parse().unwrap()),
                ..Shape::default()
            };
            h.submit_spec(spec)
        };
        let whole: Vec<JobId> = (0..7).map(|_| h.submit("b", 1, 1, 0)).collect();
        let quarters: Vec<JobId> = (0..4).map(|_| share(&mut h, "250m", 2, 0)).collect();
        h.step(0);
        assert!(whole.iter().all(|j| h.is_running(j)), "{policy}");
        assert!(quarters.iter().all(|j| h.is_running(j)), "{policy}");
        let gpus: std::collections::BTreeSet<String> = quarters
            .iter()
            .map(|j| {
                let r = h.sched.running_job(j).unwrap();
                h.sched.cluster().to_allocation(&r.placement).to_string()
            })
            .collect();
        assert_eq!(
            gpus.len(),
            1,
            "{policy}: four quarters share one GPU: {gpus:?}"
        );
        assert!(gpus.iter().all(|a| a.ends_with("@250m")), "{gpus:?}");
        // Every GPU is held; a fifth quarter, a whole GPU and a MIG slice all wait.
        let fifth = share(&mut h, "250m", 1, 60);
        let mig = share(&mut h, "3g", 1, 60);
        let one = h.submit("b", 1, 1, 60);
        h.step(60);
        for j in [&fifth, &mig, &one] {
            assert!(!h.is_running(j), "{policy}: {j}");
        }
        for j in &whole {
            h.finish(j, H);
        }
        h.step(H);
        for j in [&fifth, &mig, &one] {
            assert!(h.is_running(j), "{policy}: {j}");
        }
        // The MIG slice is on a GPU of its own: not the time-sliced one.
        let mig_at = h.sched.running_job(&mig).unwrap().placement.clone();
        let quarter_at = h.sched.running_job(&quarters[0]).unwrap().placement.clone();
        assert_ne!(mig_at.0[0].mask, quarter_at.0[0].mask, "{policy}");
        // A share is of one GPU: two GPUs, or an elastic share, is refused.
        let mut two = h.spec("c", 2, 1, H);
        two.shape.gpu_share = Some("250m".parse().unwrap());
        assert!(matches!(
            h.sched.submit(two),
            Err(Refusal::ShareOfOneGpu { .. })
        ));
        h.sched.check_invariants().unwrap();
    }
}

#[test]
fn a_part_of_a_gpu_is_tried_after_a_whole_gpu_of_its_account_could_not_start() {
    // One node: a 2g slice runs on one GPU, a 7-GPU job holds the rest. A whole GPU of
    // account a cannot start; a's 2g slice after it still fits on the shared GPU.
    let mut h = harness(1, "fifo+backfill");
    let mut slice = h.spec("b", 1, 10, 0);
    slice.shape.gpu_share = Some("2g".parse().unwrap());
    let slice = h.submit_spec(slice);
    let big = h.submit("c", 7, 10, 0);
    h.step(0);
    assert!(h.is_running(&slice) && h.is_running(&big));
    let whole = h.submit("a", 1, 1, 60);
    let mut part = h.spec("a", 1, 2, 61);
    part.shape.gpu_share = Some("2g".parse().unwrap());
    let part = h.submit_spec(part);
    h.step(120);
    assert!(!h.is_running(&whole));
    assert!(h.is_running(&part), "{:?}", h.reason(&part));
}

#[test]
fn a_part_of_a_gpu_counts_as_its_part_against_max_gpus() {
    for policy in ["fifo", "fairshare+backfill", "fairshare+conservative"] {
        let mut h = capped_harness(policy);
        let in_pc = |h: &mut Harness, gpus: u32, share: Option<&str>| {
            let mut spec = h.spec("c", gpus, 1, 0);
            spec.project = Some(ProjectId::new("pc").unwrap());
            spec.shape.gpu_share = share.map(|s| s.parse().unwrap());
            h.submit_spec(spec)
        };
        // Project pc may hold 4 GPUs: 3 whole and four quarters are 4.
        let whole = in_pc(&mut h, 3, None);
        let quarters: Vec<JobId> = (0..4).map(|_| in_pc(&mut h, 1, Some("250m"))).collect();
        let fifth = in_pc(&mut h, 1, Some("250m"));
        h.step(0);
        assert!(h.is_running(&whole), "{policy}");
        assert!(quarters.iter().all(|j| h.is_running(j)), "{policy}");
        assert_eq!(
            h.reason(&fifth),
            Some(PendingReason::AssocGrpGres),
            "{policy}"
        );
        h.finish(&quarters[0], 60);
        h.step(60);
        assert!(h.is_running(&fifth), "{policy}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn a_daily_gpu_hour_quota_holds_on_every_day_a_job_runs_into(
        jobs in proptest::collection::vec(
            (0usize..2, prop_oneof![Just(1u32), Just(2), Just(4), Just(8), Just(16)],
             1u64..12, 0i64..48),
            1..40),
        policy in prop_oneof![Just("fifo"), Just("fairshare+backfill")],
    ) {
        // d may use 100 GPU-hours a UTC day; its jobs start at any hour, many late in the day
        // and running past midnight. The harness checks after every step that no day is over.
        let mut h = harness(4, policy);
        let accounts = ["b", "d"];
        let mut submitted = Vec::new();
        for (a, g, l, t) in jobs {
            if a == 1 && u64::from(g) * l > 100 {
                continue; // refused at submission: larger than a day's quota
            }
            let spec = h.spec(accounts[a], g, l, t * H / 2);
            submitted.push((spec.submit_s, spec));
        }
        drive(&mut h, submitted);
    }
}

#[test]
fn a_job_restored_while_being_preempted_gives_its_gpus_back_at_its_kill_deadline() {
    // After a restart the service puts back a job that was being preempted, on its GPUs and
    // with its kill deadline: plans count its GPUs free then, not at its time limit.
    let mut h = harness(1, "fifo+backfill");
    let victim = h.spec("a", 8, 10, 0);
    let by = JobId::new("preemptor").unwrap();
    let allocation: gpuledger_model::Allocation = "n001:0-7".parse().unwrap();
    h.sched
        .restore_running(
            victim.clone(),
            0,
            &allocation,
            0,
            None,
            Some(gpuledger_scheduler::Preempting {
                by,
                signal_s: 100,
                kill_s: 400,
            }),
        )
        .expect("its GPUs are free");
    h.sched.check_invariants().expect("invariants hold");
    let waiting = h.submit("b", 8, 1, 150);
    h.step(200);
    assert!(!h.is_running(&waiting));
    assert_eq!(
        h.pending_job(&waiting).unwrap().estimated_start_s,
        Some(400)
    );
    h.finish(&victim.id, 390);
    h.step(390);
    assert!(h.is_running(&waiting));
}

/// A cycle's cost beyond the queue's own array, counted rather than timed
/// (`records_opened`): once every job has its reason, a cycle over 4,000 waiting jobs opens no
/// more of their records than one over 200, under every policy, whatever quotas the jobs'
/// accounts have, and with preemptors waiting for their victims to exit and the starvation
/// bound planning. Session 30's slip (each blocked job's partition read from its record)
/// doubled the cycle at 100,000 waiting jobs and only `bench schedule` saw it; a queue under
/// quotas, or with a preemptor or a job past `max_wait` in it, opened every record at every
/// cycle.
#[test]
fn a_cycle_opens_no_more_records_for_a_deeper_queue() {
    let plain = config(4);
    let busy = config_with_scheduler(
        4,
        "fair_share_preemption = true\nfair_share_preemption_after = \"1h\"\n\
         fair_share_preemption_max_loss = \"30d\"\nmax_wait = \"1h\"\nmax_wait_plans = 2\n",
    );
    for (config, preempting) in [(&plain, false), (&busy, true)] {
        for policy in [
            "fifo",
            "fifo+backfill",
            "fifo+conservative",
            "fairshare",
            "fairshare+backfill",
            "fairshare+conservative",
        ] {
            let cycle_at_2_h = |waiting: usize| {
                let mut h = Harness::with_config(config, policy);
                for _ in 0..32 {
                    h.submit("b", 1, 10, 0);
                }
                h.step(0);
                // b and c have no quotas; a has running-job quotas (its project p1 too), d
                // daily and weekly GPU-hour quotas and a storage quota: each queued job of
                // theirs is checked.
                for k in 0..waiting {
                    let (gpus, limit_h) = ([1, 2, 4, 8][k / 4 % 4], [1, 2, 4, 8][k / 16 % 4]);
                    let mut spec = h.spec(["a", "b", "c", "d"][k % 4], gpus, limit_h, 60);
                    if k % 8 == 0 {
                        spec.project = Some(ProjectId::new("p1").unwrap());
                    }
                    if k % 3 == 1 {
                        spec.shape.gpu_types = vec![gpuledger_model::GpuModel::H100Sxm.into()];
                    }
                    h.submit_spec(spec);
                }
                // Every job gets its reason (one write each); an hour later fair-share
                // preemption takes GPUs of b for the others, and its victims are still exiting.
                h.step(60);
                h.step(2 * H);
                let before = h.sched.records_opened();
                h.step(2 * H + 60);
                let claims = h.sched.running().any(|r| r.preempting.is_some());
                let opened = h.sched.records_opened() - before;
                // What the simulator asks after every event reads the queue's array alone.
                let before_due = h.sched.records_opened();
                let _due = h.sched.next_due(2 * H + 60);
                assert_eq!(h.sched.records_opened(), before_due, "{policy}: next_due");
                (opened, claims)
            };
            let (shallow, claims) = cycle_at_2_h(200);
            let (deep, _) = cycle_at_2_h(4_000);
            assert_eq!(
                claims,
                preempting && policy.starts_with("fairshare"),
                "{policy}: preemptors wait for victims exactly where fair-share preemption runs"
            );
            assert!(
                shallow > 0,
                "{policy}: the head's record is read to place it"
            );
            assert!(
                deep <= shallow,
                "{policy}, preemption {preempting}: a cycle opened {deep} records with 4,000 \
                 jobs waiting, {shallow} with 200"
            );
        }
    }
}

/// A cluster drained whole (maintenance) finds no planned start for any job, so the backfill
/// depth is never reached: a cycle still opens no more records for 4,000 waiting jobs than for
/// 200 (it searched a plan for every one of them, and marked each on its own), and every job
/// waits for resources with no planned start.
#[test]
fn a_wholly_drained_cluster_opens_no_more_records_for_a_deeper_queue() {
    for policy in [
        "fifo+backfill",
        "fifo+conservative",
        "fairshare+backfill",
        "fairshare+conservative",
    ] {
        let cycle = |waiting: usize| {
            let mut h = harness(4, policy);
            for node in 0..h.sched.cluster().node_count() {
                let name = h.sched.cluster().node_spec(node).id.to_string();
                assert!(h.sched.set_drained(&name, true));
            }
            for k in 0..waiting {
                let (gpus, limit_h) = ([1, 2, 4, 8][k / 4 % 4], [1, 2, 4, 8][k / 16 % 4]);
                h.submit(["a", "b", "c"][k % 3], gpus, limit_h, 60);
            }
            h.step(60);
            let before = h.sched.records_opened();
            assert!(h.step(120).is_empty());
            let opened = h.sched.records_opened() - before;
            let reasons: std::collections::HashSet<_> = h
                .sched
                .pending()
                .map(|p| (p.reason, p.estimated_start_s))
                .collect();
            assert_eq!(
                reasons,
                std::collections::HashSet::from([(PendingReason::Resources, None)]),
                "{policy}"
            );
            opened
        };
        let (shallow, deep) = (cycle(200), cycle(4_000));
        assert!(
            deep <= shallow,
            "{policy}: a cycle opened {deep} records with 4,000 jobs waiting, {shallow} with 200"
        );
    }
}

#[test]
fn a_jobs_priority_adds_its_weighted_age_size_and_fair_share() {
    // Four 8-GPU nodes, Slurm's default weights but for the quota's (`max_age` 7 days, age
    // 1,000, size 100, fair share 10,000, quota priority 300). Jobs of account b differ only
    // in age or size: the differences are those factors times their weights, and age stops
    // growing at `max_age`.
    let source = format!(
        "{}[scheduler]\nweight_quota_priority = 300\n",
        config_source(4)
    );
    let config = ClusterConfig::from_toml_str(&source, "t.toml").unwrap();
    let mut h = Harness::with_config(&config, "fairshare");
    let now = 30 * 24 * H;
    let week = 7 * 24 * H;
    let priority = |h: &mut Harness, gpus: u32, submitted: i64| {
        let spec = h.spec("b", gpus, 1, submitted);
        h.sched.priority_of(&spec, now)
    };
    let fresh = priority(&mut h, 8, now);
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    assert!(close(priority(&mut h, 8, now - week / 2) - fresh, 500.0));
    assert!(close(priority(&mut h, 8, now - week) - fresh, 1_000.0));
    assert!(close(priority(&mut h, 8, now - 3 * week) - fresh, 1_000.0));
    // 16 of the cluster's 32 GPUs against 8: a quarter more of the size weight.
    assert!(close(priority(&mut h, 16, now) - fresh, 25.0));
    // A fresh 8-GPU job of an idle account: its fair-share factor times 10,000, the size
    // (8 of 32) times 100, no age, and a quota without a priority counts as 50 of 100
    // (times 300).
    let factor = h.sched.fair_share_of(&AccountId::new("b").unwrap(), now);
    assert!(factor > 0.0);
    assert!(
        close(fresh, 10_000.0 * factor + 25.0 + 150.0),
        "{fresh} against {factor}"
    );
}

#[test]
fn the_priority_view_gives_each_parts_and_the_order_a_cycle_takes() {
    // Four nodes, full with b's and c's long jobs; b and c each wait for another node since
    // the start, d for one since day 3.5. At day 4 d holds nothing (below the relief's floor)
    // and b's and c's jobs have waited past `relief_after` (3 days): lifted, with no age.
    let day = 24 * H;
    let mut h = harness(4, "fairshare+backfill");
    for account in ["b", "b", "c", "c"] {
        h.submit(account, 8, 1000, 0);
    }
    let waiting_b = h.submit("b", 8, 10, 0);
    let waiting_c = h.submit("c", 8, 10, 0);
    h.step(0);
    let waiting_d = h.submit("d", 8, 10, 3 * day + day / 2);
    h.step(3 * day + day / 2);
    h.sched.accrue_usage(4 * day);
    let now = 4 * day;
    let rows = h.sched.priorities(now);
    let by_job = |id: &JobId| rows.iter().find(|r| &r.job == id).unwrap();
    for r in &rows {
        assert_eq!(
            r.priority,
            r.fair_share + r.age + r.job_size + r.quota,
            "{r:?}"
        );
        // 8 of 32 GPUs times the size weight, 100; a quota without a priority counts as 50
        // of 100, times the quota's weight, 1,000.
        assert_eq!((r.job_size, r.quota), (25.0, 500.0), "{r:?}");
    }
    let d = by_job(&waiting_d);
    assert!(!d.relieved);
    assert_eq!(
        d.standing,
        Some(gpuledger_scheduler::fairshare::Standing::BelowFloor)
    );
    // Half a day of the 7-day `max_age`, times the age weight, 1,000.
    assert!((d.age - 1_000.0 / 14.0).abs() < 1e-9, "{d:?}");
    for id in [&waiting_b, &waiting_c] {
        let lifted = by_job(id);
        assert!(lifted.relieved, "{lifted:?}");
        assert_eq!(lifted.age, 0.0);
        assert_eq!(
            lifted.standing,
            Some(gpuledger_scheduler::fairshare::Standing::AtShare)
        );
        let account_factor = h.sched.fair_share_of(&lifted.account, now);
        assert!(lifted.fair_share > 10_000.0 * account_factor, "{lifted:?}");
        assert!(
            lifted.priority < d.priority,
            "d is below the floor: {rows:?}"
        );
    }
    // The order the view gives is the order a cycle at the same time puts the queue in.
    h.step(now);
    let queue: Vec<&JobId> = h.sched.pending().map(|p| &p.spec.id).collect();
    let view: Vec<&JobId> = rows.iter().map(|r| &r.job).collect();
    assert_eq!(view, queue);
    assert_eq!(view[0], &waiting_d);

    // Under FIFO nothing is weighed: every part is zero and the order is submission's.
    let mut fifo = harness(4, "fifo+backfill");
    fifo.submit("b", 32, 1000, 0);
    let later = fifo.submit("d", 8, 10, 10);
    let first = fifo.submit("c", 8, 10, 5);
    fifo.step(10);
    let rows = fifo.sched.priorities(day);
    let view: Vec<&JobId> = rows.iter().map(|r| &r.job).collect();
    assert_eq!(view, [&first, &later]);
    for r in &rows {
        assert_eq!(
            (r.priority, r.fair_share, r.age, r.relieved, r.standing),
            (0.0, 0.0, 0.0, false, None),
            "{r:?}"
        );
    }
}
