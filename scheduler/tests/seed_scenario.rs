//! The seed's day (DESIGN.md, "The users and their day") as a script on the seed cluster of
//! `examples/seed-cluster.toml` (64 nodes x 8 H100), one assertion per question, with the
//! scheduler's invariants checked after every step:
//! 1. team A holds 200 GPUs on day 3;
//! 2. team E's 512-GPU request pends with its reason and a planned start, then runs in a
//!    reservation;
//! 3. team B's urgent 32 GPUs start at once, preempting with a grace;
//! 4. team C's many small jobs lose priority as its usage grows (and its daily GPU-hours
//!    quota holds the rest with its reason);
//! 5. backfill fills the free GPUs without delaying the head job.

mod common;

use common::{Harness, H};
use gpuledger_model::{AccountId, ClusterConfig, JobId, ProjectId};
use gpuledger_scheduler::{JobSpec, NodeRequest, PendingReason, ReservationRequest};

const DAY: i64 = 86_400;
/// 2026-06-01T00:00:00Z.
const T0: i64 = 1_780_272_000;

fn seed() -> ClusterConfig {
    ClusterConfig::from_toml_str(
        include_str!("../../examples/seed-cluster.toml"),
        "seed-cluster.toml",
    )
    .expect("the seed cluster parses")
}

struct Script {
    h: Harness,
    /// (end, job) of running jobs, each run to its time limit.
    ends: Vec<(i64, JobId)>,
    now: i64,
}

impl Script {
    fn job(&mut self, account: &str, project: &str, gpus: u32, limit_s: u64) -> JobSpec {
        let mut spec = self.h.spec_s(account, gpus, limit_s, self.now);
        spec.project = Some(ProjectId::new(project).unwrap());
        spec
    }

    fn submit(&mut self, spec: JobSpec) -> JobId {
        self.h.submit_spec(spec)
    }

    /// Runs every event up to `t` (jobs ending at their limits), then a cycle at `t`.
    fn advance_to(&mut self, t: i64) -> gpuledger_scheduler::Cycle {
        loop {
            self.ends.sort();
            match self.ends.first().cloned() {
                Some((end, id)) if end <= t => {
                    self.ends.remove(0);
                    if !self.h.is_running(&id) {
                        continue;
                    }
                    self.h.sched.accrue_usage(end);
                    self.h.finish(&id, end);
                    self.now = end;
                    let cycle = self.h.cycle(end);
                    self.track(&cycle, end);
                }
                _ => break,
            }
        }
        self.now = t;
        self.h.sched.accrue_usage(t);
        let cycle = self.h.cycle(t);
        self.track(&cycle, t);
        cycle
    }

    fn track(&mut self, cycle: &gpuledger_scheduler::Cycle, t: i64) {
        for s in &cycle.started {
            let limit = self
                .h
                .sched
                .running_job(&s.job_id)
                .unwrap()
                .spec
                .time_limit_s as i64;
            self.ends.push((t + limit, s.job_id.clone()));
        }
    }

    fn gpus_of_account(&self, account: &str) -> u32 {
        self.h
            .sched
            .running()
            .filter(|r| r.spec.account.as_str() == account)
            .map(|r| r.placement.gpu_count())
            .sum()
    }
}

#[test]
fn the_seed_day() {
    let mut s = Script {
        h: Harness::with_config(&seed(), "fairshare+backfill"),
        ends: Vec::new(),
        now: T0,
    };
    let day3 = T0 + 3 * DAY;

    // 1. Team A holds 200 GPUs on day 3.
    s.now = day3 + 8 * H;
    let a1 = s.job("team-a", "pretrain", 128, 3 * DAY as u64);
    let a2 = s.job("team-a", "pretrain", 64, 3 * DAY as u64);
    let a3 = s.job("team-a", "eval", 8, DAY as u64);
    for j in [a1, a2, a3] {
        s.submit(j);
    }
    s.advance_to(day3 + 8 * H);
    assert_eq!(s.gpus_of_account("team-a"), 200, "A holds 200 GPUs");
    assert_eq!(s.h.sched.cluster().free_gpus(), 312);

    // 2. E asks for 512 GPUs while 312 are free: it pends, says why, and gets a planned start
    //    when A's three-day runs reach their limits.
    s.now = day3 + 8 * H + 1800;
    let e_spec = s.job("team-e", "flagship", 512, 2 * DAY as u64);
    let e = s.submit(e_spec);
    s.advance_to(s.now);
    let planned = day3 + 8 * H + 3 * DAY;
    let e_job = s.h.pending_job(&e).unwrap();
    assert_eq!(e_job.reason, PendingReason::Resources);
    assert_eq!(e_job.estimated_start_s, Some(planned));

    // 5. Backfill: C's short jobs fill the 312 free GPUs now; F's long job, which would still
    //    run at E's planned start, waits; E's start does not move.
    s.now = day3 + 9 * H;
    let mut c_jobs = Vec::new();
    for _ in 0..39 {
        let mut spec = s.job("team-c", "experiments", 8, 4 * H as u64);
        spec.checkpoint_every_s = Some(H as u64);
        c_jobs.push(s.submit(spec));
    }
    let f_spec = s.job("team-f", "vision", 64, 3 * DAY as u64);
    let f_long = s.submit(f_spec);
    let c_probe_before = {
        let probe = s.job("team-c", "experiments", 1, H as u64);
        s.h.sched.priority_of(&probe, s.now)
    };
    let cycle = s.advance_to(s.now);
    assert_eq!(cycle.started.len(), 39);
    assert!(
        cycle.started.iter().all(|st| st.backfilled),
        "they start ahead of E"
    );
    assert_eq!(s.h.sched.cluster().free_gpus(), 0);
    assert_eq!(s.h.reason(&f_long), Some(PendingReason::Priority));
    assert_eq!(
        s.h.pending_job(&e).unwrap().estimated_start_s,
        Some(planned)
    );

    // 3. B's urgent 32 GPUs on a full cluster: lower-tier jobs are signalled with a grace
    //    (the ones that lose least: C's, checkpointed on the hour), no more than needed.
    s.now = day3 + 9 * H + 1800;
    let mut b_spec = s.job("team-b", "finetune", 32, 2 * H as u64);
    b_spec.partition = Some("urgent".into());
    let b = s.submit(b_spec);
    let cycle = s.advance_to(s.now);
    assert_eq!(cycle.preempted.len(), 4, "4 x 8 GPUs, no more");
    for p in &cycle.preempted {
        assert!(c_jobs.contains(&p.job_id), "a C job, not A's long runs");
        assert_eq!(p.kill_s, s.now + 300, "SIGKILL after the 5-minute grace");
    }
    // They checkpoint and exit within a minute; B starts then.
    let exit = s.now + 60;
    for p in &cycle.preempted {
        s.h.requeue(&p.job_id, exit);
    }
    let cycle = s.advance_to(exit);
    assert_eq!(cycle.started.len(), 1);
    assert_eq!(cycle.started[0].job_id, b);
    assert_eq!(
        s.h.pending_job(&cycle_victim(&s, &c_jobs))
            .unwrap()
            .preemptions,
        1
    );
    assert_eq!(
        s.h.pending_job(&e).unwrap().estimated_start_s,
        Some(planned)
    );

    // 4. C's priority falls as its usage grows: two days on C has used thousands of
    //    GPU-hours and a fresh job of C ranks below one of F (weight 8 against C's 12). Its
    //    daily GPU-hours quota (1536) holds further jobs with its reason.
    s.advance_to(day3 + 14 * H);
    for _ in 0..39 {
        let spec = s.job("team-c", "experiments", 8, 4 * H as u64);
        s.submit(spec);
    }
    s.advance_to(day3 + 14 * H);
    let held =
        s.h.sched
            .pending()
            .filter(|p| p.spec.account.as_str() == "team-c")
            .filter(|p| p.reason == PendingReason::AssocGrpGpuHoursDay)
            .count();
    assert!(held > 0, "the day's GPU-hours hold C's second wave");
    let (day4, day5) = (day3 + DAY, day3 + 2 * DAY);
    for wave in [day4 + 8 * H, day5] {
        s.advance_to(wave);
        for _ in 0..39 {
            let spec = s.job("team-c", "experiments", 8, 4 * H as u64);
            s.submit(spec);
        }
    }
    s.advance_to(day5 + 20 * H);
    let c_probe = s.job("team-c", "experiments", 1, H as u64);
    let f_probe = s.job("team-f", "vision", 1, H as u64);
    let c_after = s.h.sched.priority_of(&c_probe, s.now);
    let f_after = s.h.sched.priority_of(&f_probe, s.now);
    let c_usage =
        s.h.sched
            .ledger()
            .gpu_hours(&AccountId::new("team-c").unwrap(), s.now);
    assert!(c_usage > 2500.0, "C used {c_usage} decayed GPU-hours");
    assert!(
        c_after < c_probe_before,
        "C's priority fell: {c_probe_before} -> {c_after}"
    );
    assert!(
        c_after < f_after,
        "C now ranks below F: {c_after} < {f_after}"
    );

    // 2 (cont.). An operator reserves the whole cluster for E from its planned start; nobody
    //    else may run into the window, and E starts in it on time.
    let res =
        s.h.sched
            .add_reservation(ReservationRequest {
                name: "flagship".into(),
                start_s: planned,
                end_s: planned + 2 * DAY,
                accounts: vec![AccountId::new("team-e").unwrap()],
                nodes: NodeRequest::Count(64),
            })
            .expect("every node is free from the planned start");
    assert_eq!(res.nodes.len(), 64);
    s.now = day5 + 21 * H;
    let crossing = s.job("team-f", "vision", 8, 2 * DAY as u64);
    let crossing = s.submit(crossing);
    s.advance_to(planned - 1);
    assert!(
        !s.h.is_running(&crossing),
        "F's job would run into the window"
    );
    s.advance_to(planned);
    let e_run = s.h.sched.running_job(&e).expect("E runs");
    assert_eq!(e_run.start_s, planned, "E starts at its planned time");
    assert_eq!(s.gpus_of_account("team-e"), 512);
}

/// One of the C jobs that was preempted and waits again.
fn cycle_victim(s: &Script, c_jobs: &[JobId]) -> JobId {
    c_jobs
        .iter()
        .find(|id| s.h.pending_job(id).is_some_and(|p| p.preemptions > 0))
        .cloned()
        .expect("a requeued C job")
}
