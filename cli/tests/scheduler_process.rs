//! The live scheduler as a real process beside a real aggregator, over loopback HTTP: a job
//! submitted with the CLI runs as a process with its GPUs in `CUDA_VISIBLE_DEVICES`, its events
//! reach the aggregator, an exporter labels its GPUs from the scheduler's allocation feed, a
//! running job survives a scheduler restart and is then cancelled, and a job that can never run
//! is refused with its reason.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{scrape, spawn, terminate, wait_for, Process};

const CONFIG: &str = "version = 1\n[cluster]\nname = \"one\"\n[[node_pools]]\nname = \"p\"\n\
    prefix = \"gpu\"\ncount = 1\ngpus_per_node = 4\ngpu_model = \"h100-sxm\"\n\
    [[partitions]]\nname = \"train\"\npriority_tier = 20\ndefault = true\n\
    [prices]\nversion = \"v\"\neffective_from = \"2026-01-01\"\ncurrency = \"USD\"\n\
    gpu_hour = { h100-sxm = \"1\" }\n\
    [[accounts]]\nid = \"team-a\"\nname = \"A\"\nweight = 1\nrun_as = { user = \"root\" }\n";

fn cli(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpuledger"))
        .args(args)
        .output()
        .expect("runs")
}

fn start_scheduler(data: &Path, config: &Path, aggregator: &str) -> Process {
    spawn(
        &[
            "scheduler",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--aggregator",
            aggregator,
            "--cycle",
            "100ms",
        ],
        Stdio::inherit(),
    )
}

fn job(url: &str, id: &str) -> serde_json::Value {
    let text = ureq::get(format!("{url}/api/v1/jobs/{id}"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn jobs_run_report_to_the_aggregator_and_survive_a_scheduler_restart() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let config = dir.path().join("cluster.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let agg_dir = dir.path().join("agg");
    let aggregator = spawn(
        &[
            "aggregator",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            agg_dir.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ],
        Stdio::inherit(),
    );
    let data = dir.path().join("data");
    let sched = start_scheduler(&data, &config, &aggregator.url);
    let url = sched.url.clone();

    let out = cli(&[
        "scheduler",
        "submit",
        "--url",
        &url,
        "--account",
        "team-a",
        "--gpus",
        "2",
        "--time-limit",
        "1h",
        "--",
        "echo $CUDA_VISIBLE_DEVICES > seen; sleep 0.3",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "Submitted job team-a.1\n"
    );
    wait_for("job team-a.1 to complete", 30, || {
        job(&url, "team-a.1")["state"] == "completed"
    });
    assert_eq!(job(&url, "team-a.1")["exit_code"], 0);
    let seen = std::fs::read_to_string(data.join("scheduler/jobs/team-a.1/seen")).unwrap();
    assert_eq!(seen, "0,1\n");
    wait_for("the aggregator to count the finished job", 30, || {
        scrape(&aggregator.url)
            .contains("gpuledger_jobs_finished_total{account=\"team-a\",outcome=\"completed\"} 1")
    });

    // A long job; the scheduler stops (SIGTERM) and comes back: the job still runs.
    let out = cli(&[
        "scheduler",
        "submit",
        "--url",
        &url,
        "--account",
        "team-a",
        "--gpus",
        "4",
        "--time-limit",
        "1h",
        "--grace",
        "10s",
        "--",
        // It leaves a daemon behind (a new session: outside its process group).
        "setsid sh -c 'echo $$ > daemon; exec sleep 1000' & trap 'exit 0' TERM; while :; do sleep 0.1; done",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for("job 2 to run", 30, || {
        job(&url, "team-a.2")["state"] == "running"
    });
    // The status page names the default partition of a job that named none.
    wait_for(
        "the status page to list job 2 in partition train",
        30,
        || {
            let text = ureq::get(format!("{}/api/v1/status", aggregator.url))
                .call()
                .ok()
                .and_then(|mut r| r.body_mut().read_to_string().ok())
                .unwrap_or_default();
            let status: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            status["queue"].as_array().is_some_and(|q| {
                q.iter()
                    .any(|j| j["job_id"] == "team-a.2" && j["partition"] == "train")
            })
        },
    );
    let queue = cli(&["scheduler", "queue", "--url", &url]);
    let table = String::from_utf8_lossy(&queue.stdout).to_string();
    assert!(
        table.contains("NODELIST(REASON)") && table.contains("gpu001:0-3"),
        "{table}"
    );
    // An exporter on gpu001 labels its GPUs from the scheduler's allocation feed.
    let spool = dir.path().join("spool");
    let exporter = spawn(
        &[
            "exporter",
            "--node",
            "gpu001",
            "--gpus",
            "4",
            "--sample-interval",
            "1s",
            "--listen",
            "127.0.0.1:0",
            "--scheduler-url",
            &url,
            "--spool-dir",
            spool.to_str().unwrap(),
        ],
        Stdio::inherit(),
    );
    wait_for("the exporter to label GPU 3 with job team-a.2", 30, || {
        scrape(&exporter.url).lines().any(|l| {
            l.starts_with("DCGM_FI_DEV_GPU_UTIL{gpu=\"3\",UUID=")
                && l.contains(
                    "Hostname=\"gpu001\",hpc_job=\"team-a.2\",account=\"team-a\",project=\"\"}",
                )
        })
    });
    terminate(exporter);
    let pid = job(&url, "team-a.2")["pid"].as_u64().unwrap();
    terminate(sched);
    let sched = start_scheduler(&data, &config, &aggregator.url);
    let url = sched.url.clone();
    assert_eq!(job(&url, "team-a.2")["state"], "running");
    assert_eq!(
        job(&url, "team-a.2")["pid"].as_u64(),
        Some(pid),
        "adopted, not restarted"
    );
    let share = cli(&["scheduler", "share", "--url", &url]);
    assert!(String::from_utf8_lossy(&share.stdout).contains("team-a"));

    // A job waiting for team-a.2's GPUs: its priority and what it is made of (as sprio).
    let submitted = cli(&[
        "scheduler",
        "submit",
        "--url",
        &url,
        "--account",
        "team-a",
        "--gpus",
        "1",
        "--time-limit",
        "1h",
        "--",
        "true",
    ]);
    assert!(submitted.status.success(), "{submitted:?}");
    let said = String::from_utf8_lossy(&submitted.stdout).to_string();
    let waiting = said
        .trim()
        .strip_prefix("Submitted job ")
        .unwrap()
        .to_owned();
    let priority = cli(&[
        "scheduler",
        "priority",
        "--url",
        &url,
        "--format",
        "jobid,account,priority,fairshare,age,jobsize,quota,relief",
    ]);
    let table = String::from_utf8_lossy(&priority.stdout).to_string();
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "JOBID",
            "ACCOUNT",
            "PRIORITY",
            "FAIRSHARE",
            "AGE",
            "JOBSIZE",
            "QUOTA",
            "RELIEF"
        ],
        "{table}"
    );
    let row: Vec<&str> = table.lines().nth(2).unwrap().split_whitespace().collect();
    assert_eq!(
        (row[0], row[1], row[7]),
        (waiting.as_str(), "team-a", "no"),
        "{table}"
    );
    let json = cli(&["scheduler", "priority", "--url", &url, "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let row = &json["jobs"][0];
    let part = |name: &str| row[name].as_f64().unwrap();
    assert_eq!(
        part("priority"),
        part("fair_share") + part("age") + part("job_size") + part("quota"),
        "{json}"
    );
    // One GPU of the cluster's four times the size weight, 100.
    assert_eq!(part("job_size"), 25.0, "{json}");
    let cancelled = cli(&["scheduler", "cancel", &waiting, "--url", &url]);
    assert!(cancelled.status.success(), "{cancelled:?}");

    let out = cli(&["scheduler", "cancel", "team-a.2", "--url", &url]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for("job 2 to be cancelled", 30, || {
        job(&url, "team-a.2")["state"] == "cancelled"
    });
    // Its daemon went with it, though it left the job's process group and the scheduler that
    // started it was restarted since: the job's cgroup holds it.
    let daemon = std::fs::read_to_string(data.join("scheduler/jobs/team-a.2/daemon")).unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", daemon.trim())).unwrap_or_default();
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    assert!(
        state.is_none_or(|s| s == "Z"),
        "the job's daemon still runs: {stat}"
    );

    // Five GPUs on a four-GPU cluster can never run.
    let out = cli(&[
        "scheduler",
        "submit",
        "--url",
        &url,
        "--account",
        "team-a",
        "--gpus",
        "5",
        "--time-limit",
        "1h",
        "--",
        "true",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("422") && err.contains("5 GPUs"), "{err}");

    // The history (as sacct), its filters and formats; the queue's and the share's too.
    let stdout = |args: &[&str]| {
        let out = cli(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let all = stdout(&["scheduler", "jobs", "--url", &url]);
    assert!(all.contains("EXIT") && all.contains("team-a.1"), "{all}");
    assert!(
        all.contains("completed") && all.contains("cancelled"),
        "{all}"
    );
    let done: serde_json::Value = serde_json::from_str(&stdout(&[
        "scheduler",
        "jobs",
        "--url",
        &url,
        "--state",
        "completed",
        "--json",
    ]))
    .unwrap();
    let ids: Vec<&str> = done["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["team-a.1"]);
    let recent = stdout(&[
        "scheduler",
        "jobs",
        "--url",
        &url,
        "--since",
        "1h",
        "--format",
        "jobid,state,exit_code,totalcpu,maxrss",
    ]);
    assert_eq!(
        recent
            .lines()
            .next()
            .map(str::split_whitespace)
            .map(Iterator::collect::<Vec<_>>),
        Some(vec!["JOBID", "STATE", "EXIT", "TOTALCPU", "MAXRSS"]),
        "{recent}"
    );
    // CPU time from the job's cgroup v2 (this host tracks jobs there); memory is not limited,
    // so no peak is kept.
    let first: Vec<&str> = recent
        .lines()
        .find(|l| l.starts_with("team-a.1 "))
        .unwrap_or_else(|| panic!("{recent}"))
        .split_whitespace()
        .collect();
    assert!(first[3].ends_with('s') && first[3] != "-", "{recent}");
    assert_eq!(first[4], "-", "{recent}");
    assert!(recent.contains("team-a.2"), "{recent}");
    let future = stdout(&["scheduler", "jobs", "--url", &url, "--since", "2099-01-01"]);
    assert_eq!(
        future.lines().count(),
        2,
        "only the header and its rule: {future}"
    );
    // As sinfo: each node with the GPU type jobs ask for (`--gpu-type`).
    let nodes = stdout(&["scheduler", "nodes", "--url", &url]);
    let header: Vec<&str> = nodes.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header[..4],
        ["NODE", "STATE", "TYPE", "GPUS(A/P/T)"],
        "{nodes}"
    );
    assert!(
        nodes.lines().nth(2).unwrap().contains(" h100-sxm "),
        "{nodes}"
    );
    assert_eq!(
        stdout(&["scheduler", "queue", "--url", &url, "--account", "team-b"])
            .lines()
            .count(),
        2
    );
    let share: serde_json::Value = serde_json::from_str(&stdout(&[
        "scheduler",
        "share",
        "--url",
        &url,
        "--account",
        "team-a",
        "--json",
    ]))
    .unwrap();
    assert_eq!(share["accounts"].as_array().unwrap().len(), 1, "{share}");
    let out = cli(&[
        "scheduler",
        "queue",
        "--url",
        &url,
        "--format",
        "jobid,bogus",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no column `bogus`") && err.contains("est_start"),
        "{err}"
    );
    for (query, field) in [
        ("state=bogus", "state"),
        ("limit=0", "limit"),
        ("since=yesterday", "since"),
        ("colour=red", "colour"),
    ] {
        let mut r = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .new_agent()
            .get(format!("{url}/api/v1/jobs?{query}"))
            .call()
            .unwrap();
        let body: serde_json::Value =
            serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        assert_eq!(r.status().as_u16(), 400, "{query}: {body}");
        assert_eq!(body["error"]["field"], field, "{query}: {body}");
    }
    terminate(sched);
    terminate(aggregator);
}

/// Tokens from `gpuledger token add`, one token file for both services.
fn token(file: &Path, role: &str, who: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuledger"))
        .args([
            "token",
            "add",
            "--file",
            file.to_str().unwrap(),
            "--role",
            role,
            "--name",
            role,
        ])
        .args(who)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
/// Every service over HTTPS with tokens: each client proves who it is and checks whom it
/// talks to (the cluster's CA), and a real Prometheus scrapes an exporter over TLS with a token.
fn with_tokens_and_tls_each_service_and_client_proves_who_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let config = dir.path().join("cluster.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let tokens = dir.path().join("tokens.toml");
    let operator = token(&tokens, "operator", &[]);
    let tenant = token(&tokens, "tenant", &["--account", "team-a"]);
    let node = token(&tokens, "node", &["--node", "gpu001"]);
    let scraper = token(&tokens, "metrics", &[]);
    let (op_file, node_file) = (dir.path().join("op-token"), dir.path().join("node-token"));
    let scraper_file = dir.path().join("metrics-token");
    std::fs::write(&scraper_file, &scraper).unwrap();
    std::fs::write(&op_file, &operator).unwrap();
    std::fs::write(&node_file, &node).unwrap();
    let (cert, key) = certificate(dir.path());
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let tls = ["--tls-cert", cert, "--tls-key", key];
    let with_tls =
        |args: &[&str]| -> Vec<String> { args.iter().chain(&tls).map(|a| a.to_string()).collect() };
    let spawn_tls = |args: &[&str]| {
        let args = with_tls(args);
        spawn(
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
            Stdio::inherit(),
        )
    };
    let aggregator = spawn_tls(&[
        "aggregator",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        dir.path().join("agg").to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--tokens",
        tokens.to_str().unwrap(),
    ]);
    assert!(aggregator.url.starts_with("https://"), "{}", aggregator.url);
    let sched = spawn_tls(&[
        "scheduler",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        dir.path().join("data").to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--aggregator",
        &aggregator.url,
        "--cycle",
        "100ms",
        "--tokens",
        tokens.to_str().unwrap(),
        "--aggregator-token-file",
        op_file.to_str().unwrap(),
        "--ca-file",
        cert,
    ]);
    let url = sched.url.clone();
    let submit = |token: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpuledger"));
        cmd.args([
            "scheduler",
            "submit",
            "--url",
            &url,
            "--account",
            "team-a",
            "--gpus",
            "2",
            "--time-limit",
            "1h",
            "--",
            "trap 'exit 0' TERM; while :; do sleep 0.1; done",
        ]);
        if let Some(t) = token {
            cmd.env("GPULEDGER_TOKEN", t);
        }
        cmd.env("GPULEDGER_CA_FILE", cert).output().unwrap()
    };
    let refused = submit(None);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("401"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let out = submit(Some(&tenant));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .tls_config(gpuledger_auth::tls::client_tls(Some(Path::new(cert))).unwrap())
        .build()
        .into();
    let get = |u: &str, t: &str| -> String {
        agent
            .get(u)
            .header("authorization", format!("Bearer {t}"))
            .call()
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap()
    };
    wait_for("job 1 to run", 30, || {
        get(&format!("{url}/api/v1/jobs/team-a.1"), &tenant).contains("\"running\"")
    });
    // The exporter reads its GPUs from the feed with its node token and pushes with it.
    let exporter = spawn_tls(&[
        "exporter",
        "--node",
        "gpu001",
        "--gpus",
        "4",
        "--sample-interval",
        "1s",
        "--push-interval",
        "1s",
        "--listen",
        "127.0.0.1:0",
        "--scheduler-url",
        &url,
        "--aggregator-url",
        &aggregator.url,
        "--aggregator-token-file",
        node_file.to_str().unwrap(),
        "--spool-dir",
        dir.path().join("spool").to_str().unwrap(),
        "--ca-file",
        cert,
        "--tokens",
        tokens.to_str().unwrap(),
    ]);
    let metrics = |t: Option<&str>| {
        let mut request = agent.get(format!("{}/metrics", exporter.url));
        if let Some(t) = t {
            request = request.header("authorization", format!("Bearer {t}"));
        }
        let mut response = request.call().unwrap();
        let body = response.body_mut().read_to_string().unwrap();
        (response.status().as_u16(), body)
    };
    wait_for("the exporter to label job 1's GPUs", 30, || {
        metrics(Some(&operator))
            .1
            .contains("hpc_job=\"team-a.1\",account=\"team-a\"")
    });
    // The exporter's page is an operator's: no token is 401, a tenant's is 403.
    let (status, body) = metrics(None);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("bearer token"), "{body}");
    assert_eq!(metrics(Some(&tenant)).0, 403);
    // Plain HTTP to a TLS listener gets nothing back.
    let plain = agent
        .get(exporter.url.replace("https://", "http://") + "/metrics")
        .call();
    assert!(plain.is_err(), "{plain:?}");
    // A real Prometheus scrapes it over TLS with a `metrics` token, which reads nothing else.
    assert_eq!(metrics(Some(&scraper)).0, 200);
    let prometheus = start_prometheus(dir.path(), &exporter.url, cert, &scraper_file);
    wait_for("Prometheus to scrape the exporter over TLS", 30, || {
        let answer = prometheus_query(&prometheus.1, "count(DCGM_FI_DEV_GPU_UTIL)");
        answer.contains("\"4\"")
    });
    let status_as = |u: String, t: &str| {
        agent
            .get(u)
            .header("authorization", format!("Bearer {t}"))
            .call()
            .unwrap()
            .status()
            .as_u16()
    };
    for (page, expected) in [
        (format!("{}/metrics", aggregator.url), 200),
        (format!("{url}/metrics"), 200),
        (format!("{url}/api/v1/queue"), 403),
        (format!("{}/api/v1/status", aggregator.url), 403),
        (
            format!("{}/api/v1/accounts/team-a/summary", aggregator.url),
            403,
        ),
    ] {
        assert_eq!(status_as(page.clone(), &scraper), expected, "{page}");
    }
    // The scheduler's events reach the aggregator with the operator's token, the samples with
    // the node's.
    wait_for(
        "the aggregator to count the running job and the samples",
        30,
        || {
            let page = get(&format!("{}/metrics", aggregator.url), &operator);
            page.contains("gpuledger_jobs_running{account=\"team-a\"} 1")
                && page.contains("gpuledger_ingest_batches_total{outcome=\"accepted\"}")
        },
    );
    terminate(exporter);
    let cancel = Command::new(env!("CARGO_BIN_EXE_gpuledger"))
        .args(["scheduler", "cancel", "team-a.1", "--url", &url])
        .env("GPULEDGER_TOKEN", &tenant)
        .env("GPULEDGER_CA_FILE", cert)
        .output()
        .unwrap();
    assert!(
        cancel.status.success(),
        "{}",
        String::from_utf8_lossy(&cancel.stderr)
    );
    wait_for("job 1 to be cancelled", 30, || {
        get(&format!("{url}/api/v1/jobs/team-a.1"), &tenant).contains("\"cancelled\"")
    });
    // A revoked token is refused by both running services, without a restart.
    let revoke = Command::new(env!("CARGO_BIN_EXE_gpuledger"))
        .args([
            "token",
            "revoke",
            "--file",
            tokens.to_str().unwrap(),
            "tenant",
        ])
        .output()
        .unwrap();
    assert!(
        revoke.status.success(),
        "{}",
        String::from_utf8_lossy(&revoke.stderr)
    );
    let status = |u: String| {
        agent
            .get(u)
            .header("authorization", format!("Bearer {tenant}"))
            .call()
            .unwrap()
            .status()
            .as_u16()
    };
    wait_for("both services to refuse the revoked token", 30, || {
        status(format!("{url}/api/v1/jobs/team-a.1")) == 401
            && status(format!("{}/api/v1/accounts/team-a/summary", aggregator.url)) == 401
    });
    terminate(sched);
    terminate(aggregator);
}

/// A certificate for `localhost` and 127.0.0.1 (its own CA): (cert, key) paths.
fn certificate(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    let pair = rcgen::generate_simple_self_signed(names).unwrap();
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert, pair.cert.pem()).unwrap();
    std::fs::write(&key, pair.signing_key.serialize_pem()).unwrap();
    (cert, key)
}

/// Debian's Prometheus scraping `target_url` (https) every second with the bearer token in
/// `token_file`, trusting `ca_file`; killed when dropped. Returns it and its URL.
fn start_prometheus(
    dir: &Path,
    target_url: &str,
    ca_file: &str,
    token_file: &Path,
) -> (Process, String) {
    let target = target_url.trim_start_matches("https://");
    let config = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n\
         \x20 - job_name: gpuledger-exporter\n    scheme: https\n\
         \x20   tls_config:\n      ca_file: {ca_file}\n\
         \x20   authorization:\n      credentials_file: {}\n\
         \x20   static_configs:\n      - targets: [\"{target}\"]\n",
        token_file.display()
    );
    let process = common::start_prometheus(dir, &config);
    let url = process.url.clone();
    (process, url)
}

/// The JSON answer of an instant query.
fn prometheus_query(url: &str, query: &str) -> String {
    ureq::get(format!("{url}/api/v1/query"))
        .query("query", query)
        .call()
        .ok()
        .and_then(|mut r| r.body_mut().read_to_string().ok())
        .unwrap_or_default()
}
