//! Tenants' jobs against the real `gpuledger scheduler serve`, run as root as the systemd unit
//! runs it (tokens on, a secret in its environment, a real aggregator taking its events): a
//! tenant's job, run as its account's user, tries to read the token file, the state file and
//! another job's directory, to signal another tenant's job, to move itself out of its cgroup and
//! to read the service's environment; another escapes with `setsid` and a double fork and
//! ignores SIGTERM past its grace; one reads what the other left in `/tmp` and `/dev/shm`, and
//! forks without end. Every attempt fails, and the job's end (time, outcome, the aggregator's
//! events) is exact.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{add_token, spawn, spawn_command, terminate, wait_for};

const CONFIG: &str = "version = 1\n[cluster]\nname = \"one\"\n[[node_pools]]\nname = \"p\"\n\
    prefix = \"gpu\"\ncount = 1\ngpus_per_node = 4\ngpu_model = \"h100-sxm\"\n\
    [[partitions]]\nname = \"train\"\npriority_tier = 20\ndefault = true\nmax_grace = \"2s\"\n\
    [prices]\nversion = \"v\"\neffective_from = \"2026-01-01\"\ncurrency = \"USD\"\n\
    gpu_hour = { h100-sxm = \"1\" }\n\
    [[accounts]]\nid = \"team-a\"\nname = \"A\"\nweight = 1\nrun_as = { user = \"daemon\" }\n\
    [[accounts]]\nid = \"team-b\"\nname = \"B\"\nweight = 1\nrun_as = { user = \"nobody\" }\n";

/// `GET url` with a bearer token, as JSON.
fn get(url: &str, token: &str) -> serde_json::Value {
    let text = ureq::get(url)
        .header("authorization", format!("Bearer {token}"))
        .call()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .body_mut()
        .read_to_string()
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// `gpuledger scheduler ARGS` as the holder of `token`; its standard output.
fn as_tenant(token: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuledger"))
        .arg("scheduler")
        .args(args)
        .env("GPULEDGER_TOKEN", token)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The first line of `file`, once a job has written it whole.
fn read_when_written(file: &Path) -> String {
    let mut text = String::new();
    wait_for(&format!("{}", file.display()), 30, || {
        text = std::fs::read_to_string(file).unwrap_or_default();
        text.ends_with('\n')
    });
    text.trim().to_owned()
}

fn running(pid: &str) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state != "Z")
}

#[test]
fn tenants_jobs_reach_nothing_of_the_service_or_each_other_and_none_outlives_its_stop() {
    // Not below /tmp, which each job's own /tmp would hide (as an operator's /var/lib is not).
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    // As an operator's /var/lib: passable by the jobs' users, listable by none of them.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let config = dir.path().join("cluster.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let tokens = dir.path().join("tokens.toml");
    let tokens_arg = tokens.to_str().unwrap();
    let operator = add_token(tokens_arg, "operator", "ops", &[]);
    let a = add_token(tokens_arg, "tenant", "a", &["--account", "team-a"]);
    let b = add_token(tokens_arg, "tenant", "b", &["--account", "team-b"]);
    let operator_file = dir.path().join("operator-token");
    std::fs::write(&operator_file, &operator).unwrap();
    std::fs::set_permissions(&operator_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let aggregator = spawn(
        &[
            "aggregator",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.path().join("agg").to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--tokens",
            tokens_arg,
            "--flush-interval",
            "1s",
        ],
        Stdio::inherit(),
    );
    let data = dir.path().join("data");
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpuledger"));
    command
        .args([
            "scheduler",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--cycle",
            "100ms",
            "--job-tmp",
            "private",
            "--job-tasks-max",
            "64",
        ])
        .args(["--data-dir", data.to_str().unwrap()])
        .args(["--config", config.to_str().unwrap()])
        .args(["--tokens", tokens_arg, "--aggregator", &aggregator.url])
        .arg("--aggregator-token-file")
        .arg(&operator_file)
        // What systemd's LoadCredential= gives the service; a job must see none of it.
        .env("CREDENTIALS_DIRECTORY", dir.path())
        .env("GPULEDGER_TOKEN", &operator);
    let sched = spawn_command(command, Stdio::inherit());
    let url = sched.url.as_str();
    let jobs = data.join("scheduler/jobs");

    // team-a's job ignores SIGTERM, and leaves a daemon that does too (setsid and a double
    // fork: outside its process group and session, its parent gone).
    let stubborn = "echo team-a > /tmp/secret; echo team-a > /dev/shm/secret; \
        (setsid sh -c 'trap \"\" TERM; echo $$ > daemon; while :; do sleep 0.1; done' &); \
        trap '' TERM; echo $$ > pid; while :; do sleep 0.1; done";
    let submitted = as_tenant(
        &a,
        &[
            "submit",
            "--url",
            url,
            "--account",
            "team-a",
            "--gpus",
            "2",
            "--time-limit",
            "1h",
            "--grace",
            "2s",
            "--",
            stubborn,
        ],
    );
    assert_eq!(submitted, "Submitted job team-a.1");
    let victim = read_when_written(&jobs.join("team-a.1/pid"));
    let daemon = read_when_written(&jobs.join("team-a.1/daemon"));

    // team-b's job, run as nobody, tries what a hostile tenant would.
    let snoop = "id -u; \
        cat \"$TOKEN_FILE\" >/dev/null 2>&1 && echo READ-TOKENS; \
        cat \"$SCHEDULER_TOKEN_FILE\" >/dev/null 2>&1 && echo READ-SCHEDULERS-TOKEN; \
        cat ../../state.json >/dev/null 2>&1 && echo READ-STATE; \
        ls ../team-a.1 >/dev/null 2>&1 && echo LISTED-OTHER-JOB; \
        cat ../team-a.1/stdout >/dev/null 2>&1 && echo READ-OTHER-JOB; \
        ls .. >/dev/null 2>&1 && echo LISTED-JOBS; \
        kill -9 \"$VICTIM\" 2>/dev/null && echo KILLED-OTHER-JOB; \
        kill -9 -- \"-$VICTIM\" 2>/dev/null && echo KILLED-OTHER-GROUP; \
        kill -9 \"$DAEMON\" 2>/dev/null && echo KILLED-OTHER-DAEMON; \
        touch ../../planted 2>/dev/null && echo WROTE-STATE-DIR; \
        for root in /sys/fs/cgroup /sys/fs/cgroup/unified /sys/fs/cgroup/freezer; do \
          echo $$ > $root/cgroup.procs 2>/dev/null && echo LEFT-CGROUP; done; \
        env | grep -E '^(CREDENTIALS_DIRECTORY|GPULEDGER_TOKEN|GPULEDGER_AGGREGATOR_TOKEN)' && echo SAW-SECRETS; \
        cat /tmp/secret /dev/shm/secret 2>/dev/null && echo READ-OTHER-TMP; \
        echo done; \
        (for i in $(seq 200); do sleep 1 & done; echo FORKED-ALL) 2>/dev/null; true";
    let submitted = as_tenant(
        &b,
        &[
            "submit",
            "--url",
            url,
            "--account",
            "team-b",
            "--gpus",
            "1",
            "--time-limit",
            "1h",
            "--export",
            &format!("TOKEN_FILE={}", tokens.display()),
            "--export",
            &format!("SCHEDULER_TOKEN_FILE={}", operator_file.display()),
            "--export",
            &format!("VICTIM={victim}"),
            "--export",
            &format!("DAEMON={daemon}"),
            "--",
            snoop,
        ],
    );
    assert_eq!(submitted, "Submitted job team-b.1");
    wait_for("team-b's job to end", 30, || {
        get(&format!("{url}/api/v1/jobs/team-b.1"), &b)["state"] == "completed"
    });
    let out = std::fs::read_to_string(jobs.join("team-b.1/stdout")).unwrap();
    assert_eq!(out, "65534\ndone\n", "what team-b's job reached");
    assert!(!data.join("scheduler/planted").exists());
    for host in ["/tmp/secret", "/dev/shm/secret"] {
        assert!(
            std::fs::read_to_string(host).map_or(true, |t| t != "team-a\n"),
            "team-a's {host} is its own, not the host's"
        );
    }
    assert!(
        running(&victim) && running(&daemon),
        "team-a's job is untouched"
    );

    // Cancelled by its owner: SIGTERM, ignored; SIGKILL at the end of its 2 s grace reaches
    // the daemon too, and only then does the job end.
    let cancelled = as_tenant(&a, &["cancel", "team-a.1", "--url", url]);
    assert_eq!(cancelled, "team-a.1: running");
    let job_url = format!("{url}/api/v1/jobs/team-a.1");
    wait_for("team-a's job to end", 30, || {
        get(&job_url, &a)["state"] == "cancelled"
    });
    assert!(
        !running(&victim) && !running(&daemon),
        "a process outlived the job"
    );
    let job = get(&job_url, &a);
    let (start_s, signal_s, kill_s, end_s) = (
        job["start_s"].as_i64().unwrap(),
        job["signal_s"].as_i64().unwrap(),
        job["kill_s"].as_i64().unwrap(),
        job["end_s"].as_i64().unwrap(),
    );
    assert_eq!(kill_s - signal_s, 2, "{job}");
    assert!((kill_s..=kill_s + 2).contains(&end_s), "{job}");
    assert_eq!(job["exit_code"], 137, "{job}");

    // The aggregator has the same start and end: what billing counts as allocated.
    let detail_url = format!("{}/api/v1/jobs/team-a.1", aggregator.url);
    let mut events = Vec::new();
    wait_for("the aggregator to store team-a's end", 30, || {
        let detail = ureq::get(&detail_url)
            .header("authorization", format!("Bearer {operator}"))
            .call();
        events = match detail {
            Ok(mut reply) => {
                let value: serde_json::Value =
                    serde_json::from_str(&reply.body_mut().read_to_string().unwrap()).unwrap();
                value["events"].as_array().cloned().unwrap_or_default()
            }
            Err(_) => Vec::new(),
        };
        events.iter().any(|e| e["kind"] == "finished")
    });
    let at = |kind: &str| {
        let event = events.iter().find(|e| e["kind"] == kind).unwrap();
        event["time_ms"]
            .as_i64()
            .unwrap_or_else(|| panic!("{event}"))
            / 1000
    };
    assert_eq!(at("started"), start_s, "{events:?}");
    assert_eq!(at("finished"), end_s, "{events:?}");
    let finished = events.iter().find(|e| e["kind"] == "finished").unwrap();
    assert_eq!(finished["outcome"], "cancelled", "{finished}");
    terminate(sched);
    terminate(aggregator);
}
