//! The Slurm prolog and epilog of `deploy/slurm/`, run as slurmd runs them (a shell with the
//! job's environment): the prolog writes the exporter's job-mapping directory with the job's
//! gpuledger account and project, the exporter reads it, the epilog removes only its own job's
//! files.

use std::path::Path;
use std::process::Command;

use gpuledger_exporter::agent::{read_job_mapping, MappedJob};
use gpuledger_exporter::synthetic::synthetic_devices;
use gpuledger_model::GpuModel;

const SLURM_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/slurm");

fn run(script: &str, dir: &Path, map: &Path, env: &[(&str, &str)]) {
    let out = Command::new("sh")
        .arg(Path::new(SLURM_DIR).join(script))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("GPULEDGER_JOB_MAPPING_DIR", dir)
        .env("GPULEDGER_ACCOUNT_MAP", map)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn label(job: &str, account: &str, project: Option<&str>) -> Option<MappedJob> {
    Some(MappedJob {
        job_id: job.into(),
        tenant: Some((account.into(), project.map(str::to_owned))),
    })
}

#[test]
fn the_prolog_labels_the_jobs_gpus_and_the_epilog_clears_them() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, map) = (tmp.path().join("jobs"), tmp.path().join("slurm-accounts"));
    std::fs::write(
        &map,
        "# slurm_account gpuledger_account [project]\nteam-a team-a\nlattice physics lattice\n",
    )
    .unwrap();
    let devices = synthetic_devices(1, "gpu001", 8, GpuModel::H100Sxm);
    run(
        "prolog.sh",
        &dir,
        &map,
        &[
            ("SLURM_JOB_ID", "41"),
            ("SLURM_JOB_ACCOUNT", "team-a"),
            ("SLURM_JOB_GPUS", "0,1"),
        ],
    );
    run(
        "prolog.sh",
        &dir,
        &map,
        &[
            ("SLURM_JOB_ID", "42"),
            ("SLURM_JOB_ACCOUNT", "lattice"),
            ("SLURM_JOB_GPUS", "2-4"),
        ],
    );
    run(
        "prolog.sh",
        &dir,
        &map,
        &[
            ("SLURM_JOB_ID", "43"),
            ("SLURM_JOB_ACCOUNT", "unmapped"),
            ("CUDA_VISIBLE_DEVICES", "7"),
        ],
    );
    run(
        "prolog.sh",
        &dir,
        &map,
        &[("SLURM_JOB_ID", "44"), ("SLURM_JOB_ACCOUNT", "team-a")],
    );
    let labels = read_job_mapping(&dir, &devices);
    assert_eq!(labels[0], label("41", "team-a", None));
    assert_eq!(labels[1], label("41", "team-a", None));
    assert_eq!(
        labels[2],
        label("42", "physics", Some("lattice")),
        "a sub-account is a project"
    );
    assert_eq!(labels[4], label("42", "physics", Some("lattice")));
    assert_eq!((labels[5].clone(), labels[6].clone()), (None, None));
    assert_eq!(
        labels[7],
        label("43", "unmapped", None),
        "an account the map lacks stays as it is"
    );
    // GPU 1 goes to job 45 before job 41's epilog runs: that epilog must leave it.
    run(
        "prolog.sh",
        &dir,
        &map,
        &[
            ("SLURM_JOB_ID", "45"),
            ("SLURM_JOB_ACCOUNT", "team-a"),
            ("SLURM_JOB_GPUS", "1"),
        ],
    );
    run("epilog.sh", &dir, &map, &[("SLURM_JOB_ID", "41")]);
    let labels = read_job_mapping(&dir, &devices);
    assert_eq!(labels[0], None);
    assert_eq!(labels[1], label("45", "team-a", None));
    assert_eq!(labels[3], label("42", "physics", Some("lattice")));
    run("epilog.sh", &dir, &map, &[("SLURM_JOB_ID", "42")]);
    assert!(read_job_mapping(&dir, &devices)[2..5]
        .iter()
        .all(Option::is_none));
}
