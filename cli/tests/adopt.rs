//! Adopting gpuledger on a cluster that already has a scheduler: `gpuledger import
//! slurm-assoc` turns a `sacctmgr dump` of ten accounts with limits into the same quotas,
//! checked field by field, and says what it could not map; `gpuledger export kubernetes`
//! writes the Kueue objects of the seed cluster.

use std::process::Command;

use gpuledger_model::units::DurationSpec;
use gpuledger_model::ClusterConfig;

const DUMP: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/slurm/dump-ten-accounts.cfg"
);
const SEED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/seed-cluster.toml");

fn gpuledger(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpuledger"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_sacctmgr_dump_of_ten_accounts_gives_the_same_quotas() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cluster.toml");
    let map = dir.path().join("slurm-accounts");
    let run = gpuledger(&[
        "import",
        "slurm-assoc",
        DUMP,
        "--config",
        SEED,
        "--out",
        out.to_str().unwrap(),
        "--account-map",
        map.to_str().unwrap(),
    ]);
    let report = String::from_utf8_lossy(&run.stderr).to_string();
    assert!(run.status.success(), "{report}");
    let config =
        ClusterConfig::from_toml_str(&std::fs::read_to_string(&out).unwrap(), "out").unwrap();
    assert_eq!(config.total_gpus(), 512, "the base's nodes are kept");
    assert_eq!(config.partitions.len(), 3, "and its partitions");
    let h = |h: u64| Some(DurationSpec::from_secs(h * 3600));
    // account, name, weight, GrpJobs, GrpTRESMins gres/gpu in hours, MaxTRESPerJob gres/gpu,
    // MaxWallDurationPerJob, Priority
    type Row = (
        &'static str,
        &'static str,
        u32,
        Option<u32>,
        Option<u64>,
        Option<u32>,
        Option<DurationSpec>,
        Option<u8>,
    );
    let expected: [Row; 10] = [
        (
            "team-a",
            "Research (pre-training)",
            30,
            Some(8),
            Some(60_000),
            Some(256),
            h(14 * 24),
            Some(50),
        ),
        (
            "team-b",
            "Product (fine-tuning)",
            15,
            Some(10),
            None,
            Some(64),
            h(48),
            Some(70),
        ),
        (
            "team-c",
            "Algorithms (experiments)",
            12,
            Some(40),
            None,
            Some(64),
            h(24),
            Some(50),
        ),
        (
            "team-d",
            "Data (preprocessing)",
            5,
            Some(10),
            None,
            Some(8),
            h(24),
            Some(30),
        ),
        (
            "team-e",
            "Leadership project",
            20,
            Some(2),
            None,
            Some(512),
            h(7 * 24),
            Some(90),
        ),
        (
            "team-f",
            "Vision",
            8,
            Some(12),
            None,
            Some(64),
            h(72),
            Some(50),
        ),
        (
            "team-g",
            "Speech",
            4,
            Some(8),
            None,
            Some(32),
            h(48),
            Some(50),
        ),
        (
            "team-h",
            "Recommendation",
            3,
            Some(8),
            None,
            Some(16),
            h(24),
            Some(50),
        ),
        (
            "team-i",
            "Safety and evaluation",
            2,
            Some(20),
            None,
            Some(8),
            h(12),
            Some(50),
        ),
        (
            "team-j",
            "Platform and infrastructure",
            1,
            Some(6),
            None,
            Some(8),
            h(4),
            Some(40),
        ),
    ];
    assert_eq!(config.accounts.len(), 10);
    for (a, (id, name, weight, jobs, week, per_job, wall, priority)) in
        config.accounts.iter().zip(expected)
    {
        assert_eq!(a.id.as_str(), id);
        assert_eq!(a.name, name, "{id}.name");
        assert_eq!(a.weight, weight, "{id}.weight");
        assert_eq!(a.quota.max_running_jobs, jobs, "{id}.max_running_jobs");
        assert_eq!(a.quota.gpu_hours_per_week, week, "{id}.gpu_hours_per_week");
        assert_eq!(a.quota.max_gpus_per_job, per_job, "{id}.max_gpus_per_job");
        assert_eq!(a.quota.max_run_time, wall, "{id}.max_run_time");
        assert_eq!(a.quota.priority, priority, "{id}.priority");
        assert_eq!(
            a.quota.max_gpus,
            (id == "team-c").then_some(64),
            "{id}.max_gpus: GrpTRES=gres/gpu"
        );
        assert_eq!(
            a.quota.gpu_hours_per_day, None,
            "{id}: Slurm has no daily GPU-hours"
        );
    }
    let team_a = &config.accounts[0];
    let projects: Vec<&str> = team_a.projects.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(projects, ["pretrain", "eval"]);
    assert_eq!(team_a.projects[1].quota.max_gpus_per_job, Some(16));
    assert_eq!(team_a.projects[1].quota.gpu_hours_per_week, Some(2000));
    assert_eq!(
        config.accounts[2].projects[0].quota.max_running_jobs,
        Some(30)
    );
    for said in [
        "10 accounts, 3 projects imported",
        "MaxTRESPerJob cpu: not mapped",
        "MaxJobs=4: not mapped: a per-user limit",
        "QOS=normal,urgent: not mapped",
        "account sweeps (3 levels below root: sweeps < experiments < team-c)",
        "user carol MaxJobs=10: not mapped",
        "user(s) under team-a: alice",
    ] {
        assert!(
            report.contains(said),
            "the report misses `{said}`:\n{report}"
        );
    }
    let map = std::fs::read_to_string(&map).unwrap();
    for line in [
        "team-a team-a\n",
        "pretrain team-a pretrain\n",
        "experiments team-c experiments\n",
    ] {
        assert!(map.contains(line), "{map}");
    }
}

#[test]
fn a_bad_dump_names_its_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("bad.cfg");
    std::fs::write(
        &dump,
        "Cluster - 'x'\nParent - 'root'\nAccount - 'ok':GrpJobs=4\nAccount - 'bad':GrpJobs=four\n",
    )
    .unwrap();
    let run = gpuledger(&["import", "slurm-assoc", dump.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(
        err.contains("bad.cfg:4:") && err.contains("GrpJobs=four"),
        "{err}"
    );
}

#[test]
fn the_seed_cluster_exports_to_kueue() {
    let run = gpuledger(&["export", "kubernetes"]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let yaml = String::from_utf8(run.stdout).unwrap();
    let kinds = |k: &str| yaml.matches(&format!("kind: {k}\n")).count();
    assert_eq!(kinds("Namespace"), 10);
    assert_eq!(kinds("ResourceQuota"), 10);
    assert_eq!(kinds("ClusterQueue"), 10);
    assert_eq!(kinds("LocalQueue"), 11, "one per project: team-a has two");
    assert_eq!(kinds("ResourceFlavor"), 1);
    assert_eq!(kinds("WorkloadPriorityClass"), 3);
    // Nominal quotas are each account's weight share of the 512 GPUs, never more in total.
    let nominal: Vec<u64> = yaml
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nominalQuota: "))
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(nominal.len(), 10);
    assert_eq!(nominal[0], 512 * 30 / 100, "team-a's weight is 30 of 100");
    assert!(nominal.iter().sum::<u64>() <= 512);
}
