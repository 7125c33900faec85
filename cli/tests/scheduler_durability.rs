//! What the live scheduler acknowledges survives `kill -9`: a submission, a cancel, a drain and
//! a reservation are in its journal before it answers, not only at its next cycle (an hour away
//! here). On a full disk (a real tmpfs, filled) the first submission and the first reservation
//! that no longer fit are refused with a 503 and leave nothing that could run or be billed; once
//! there is room again a submission is taken.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::Stdio;

use serde_json::{json, Value};

use common::{spawn, Process, Tmpfs};

const CONFIG: &str = "version = 1\n[cluster]\nname = \"two\"\n[[node_pools]]\nname = \"p\"\n\
    prefix = \"gpu\"\ncount = 2\ngpus_per_node = 4\ngpu_model = \"h100-sxm\"\n\
    [[partitions]]\nname = \"train\"\npriority_tier = 20\ndefault = true\n\
    [prices]\nversion = \"v\"\neffective_from = \"2026-01-01\"\ncurrency = \"USD\"\n\
    gpu_hour = { h100-sxm = \"1\" }\n\
    [[accounts]]\nid = \"team-a\"\nname = \"A\"\nweight = 1\nrun_as = { user = \"root\" }\n";

/// A scheduler cycling every `cycle`, with its jobs' directories under `jobs` where given.
fn start_with(data: &Path, config: &Path, cycle: &str, jobs: Option<&Path>) -> Process {
    let mut args = vec![
        "scheduler",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--cycle",
        cycle,
    ];
    if let Some(jobs) = jobs {
        args.extend(["--jobs-dir", jobs.to_str().unwrap()]);
    }
    spawn(&args, Stdio::inherit())
}

/// A scheduler whose only cycle is the one at its start.
fn start(data: &Path, config: &Path) -> Process {
    start_with(data, config, "1h", None)
}

fn call(method: &str, url: &str, body: Option<Value>) -> (u16, Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut reply = match body {
        Some(body) => agent
            .run(
                ureq::http::Request::builder()
                    .method(method)
                    .uri(url)
                    .header("content-type", "application/json")
                    .body(body.to_string())
                    .unwrap(),
            )
            .unwrap(),
        None => agent
            .run(
                ureq::http::Request::builder()
                    .method(method)
                    .uri(url)
                    .body(())
                    .unwrap(),
            )
            .unwrap(),
    };
    let text = reply.body_mut().read_to_string().unwrap();
    (
        reply.status().as_u16(),
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

fn submit(url: &str) -> (u16, Value) {
    call(
        "POST",
        &format!("{url}/api/v1/jobs"),
        Some(json!({"command": "sleep 600", "account": "team-a", "gpus": 4, "time_limit": "10m"})),
    )
}

fn job(url: &str, id: &str) -> Value {
    let (status, body) = call("GET", &format!("{url}/api/v1/jobs/{id}"), None);
    assert_eq!(status, 200, "{id}: {body}");
    body
}

/// A reservation of `node` for the hour starting `hour` hours from now.
fn reservation(name: &str, node: &str, hour: i64) -> Value {
    let start = chrono::Utc::now() + chrono::Duration::hours(hour);
    json!({
        "name": name,
        "accounts": ["team-a"],
        "node_names": [node],
        "start": start.to_rfc3339(),
        "end": (start + chrono::Duration::hours(1)).to_rfc3339(),
    })
}

/// Writes zeros to `path` until the disk holding it is full, down to the last byte.
fn fill(path: &Path) {
    let mut file = std::fs::File::create(path).unwrap();
    let mut chunk = 64 << 10;
    while chunk > 0 {
        if file.write_all(&vec![0u8; chunk]).is_err() {
            chunk /= 2;
        }
    }
}

fn reservation_names(url: &str) -> Vec<String> {
    let (_, listed) = call("GET", &format!("{url}/api/v1/reservations"), None);
    listed["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn what_the_scheduler_acknowledged_survives_kill_9_and_a_full_disk_acknowledges_nothing() {
    let disk = Tmpfs::mount("4m");
    let _jobs = gpuledger_testkit::KillJobsUnder::new(disk.path());
    let config = disk.path().join("cluster.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let data = disk.path().join("data");
    let mut sched = start(&data, &config);
    let url = sched.url.clone();

    // Both nodes out of service: no job starts, before or after the restart, so every job
    // stays as the requests left it.
    for (node, reason) in [("gpu001", "disk"), ("gpu002", "fan")] {
        let (status, body) = call(
            "POST",
            &format!("{url}/api/v1/nodes/{node}/drain"),
            Some(json!({ "reason": reason })),
        );
        assert_eq!(status, 204, "{node}: {body}");
    }
    let (status, body) = submit(&url);
    assert_eq!(
        (status, &body["job_id"]),
        (201, &json!("team-a.1")),
        "{body}"
    );
    assert_eq!(submit(&url).0, 201);
    let (status, body) = call("DELETE", &format!("{url}/api/v1/jobs/team-a.2"), None);
    assert_eq!(
        (status, &body["state"]),
        (200, &json!("cancelled")),
        "{body}"
    );
    let (status, body) = call(
        "POST",
        &format!("{url}/api/v1/reservations"),
        Some(reservation("maint", "gpu001", 1)),
    );
    assert_eq!(status, 201, "{body}");

    // The disk fills up. What still fits in the journal's last page is acknowledged; the first
    // submission and the first reservation that do not fit are refused, and neither is left
    // behind to run or to be billed.
    let filler = disk.path().join("filler");
    fill(&filler);
    let mut taken = vec!["team-a.1".to_owned()];
    let refused = loop {
        let (status, body) = submit(&url);
        let id = body["job_id"].as_str().map(str::to_owned);
        match (status, id) {
            (201, Some(id)) if taken.len() < 50 => taken.push(id),
            (503, None) => break body,
            _ => panic!("{status}: {body}"),
        }
    };
    let message = refused["error"]["message"].as_str().unwrap();
    let withdrawn_id = format!("team-a.{}", taken.len() + 2);
    assert!(
        message.contains(&format!("job {withdrawn_id} withdrawn"))
            && message.contains("journal.jsonl")
            && message.contains("No space left"),
        "{message}"
    );
    let withdrawn = job(&url, &withdrawn_id);
    assert_eq!(withdrawn["state"], "cancelled", "{withdrawn}");
    assert!(
        withdrawn["reason"]
            .as_str()
            .is_some_and(|r| r.contains("could not be saved")),
        "{withdrawn}"
    );
    let mut reserved = vec!["maint".to_owned()];
    for hour in 2.. {
        let name = format!("later-{hour}");
        let (status, body) = call(
            "POST",
            &format!("{url}/api/v1/reservations"),
            Some(reservation(&name, "gpu002", hour)),
        );
        match status {
            201 if hour < 50 => reserved.push(name),
            503 => break,
            _ => panic!("{status}: {body}"),
        }
    }
    assert_eq!(
        reservation_names(&url),
        reserved,
        "the refused one is undone"
    );

    // Room again: the next submission is taken.
    std::fs::remove_file(&filler).unwrap();
    let (status, body) = submit(&url);
    assert_eq!(status, 201, "{body}");
    taken.push(body["job_id"].as_str().unwrap().to_owned());

    sched.child.kill().unwrap();
    sched.child.wait().unwrap();
    let sched = start(&data, &config);
    let url = sched.url.clone();
    for id in &taken {
        assert_eq!(job(&url, id)["state"], "pending", "{id}");
    }
    assert_eq!(job(&url, "team-a.2")["state"], "cancelled");
    // The withdrawn job is cancelled, or unknown where not even its withdrawal fitted.
    let (status, body) = call("GET", &format!("{url}/api/v1/jobs/{withdrawn_id}"), None);
    assert!(
        status == 404 || body["state"] == "cancelled",
        "{status}: {body}"
    );
    let (_, nodes) = call("GET", &format!("{url}/api/v1/nodes"), None);
    let drained: Vec<(&str, &str)> = nodes["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["node"].as_str().unwrap(),
                n["reason"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(drained, [("gpu001", "disk"), ("gpu002", "fan")], "{nodes}");
    assert_eq!(reservation_names(&url), reserved);
    let billed = std::fs::read_to_string(data.join("reservations.toml")).unwrap();
    for name in &reserved {
        assert!(billed.contains(&format!("\"{name}\"")), "{name}: {billed}");
    }
    assert_eq!(billed.matches("id = ").count(), reserved.len(), "{billed}");
    drop(sched);
}

/// The ids of the jobs the journal file at `path` has records of (none where there is none).
fn jobs_recorded_in(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .flat_map(|record| record["jobs"].as_array().cloned().unwrap_or_default())
        .filter_map(|job| job["id"].as_str().map(str::to_owned))
        .collect()
}

/// `kill -9` while a `state.json` is written beside the scheduler (the records made meanwhile
/// in `journal.next.jsonl`): every submission it acknowledged before is there after the
/// restart. One thread submits jobs with 60 KiB commands as fast as they are answered (so
/// `state.json` is due every few cycles and takes a while to write); the test kills the
/// scheduler while the next file holds records, until a kill lands while it holds an
/// acknowledged submission (rather than after the state file was written and the next file
/// replaced the journal).
#[test]
fn kill_9_while_the_state_file_is_written_beside_the_scheduler_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let _jobs = gpuledger_testkit::KillJobsUnder::new(dir.path());
    let config = dir.path().join("cluster.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let data = dir.path().join("data");
    let next = data.join("scheduler").join("journal.next.jsonl");
    let command = format!("true # {}", "x".repeat(60 << 10));
    let mut taken: Vec<String> = Vec::new();
    let mut landed = false;
    for round in 0..12 {
        let mut sched = start_with(&data, &config, "50ms", None);
        let url = sched.url.clone();
        if round == 0 {
            for node in ["gpu001", "gpu002"] {
                let drain = format!("{url}/api/v1/nodes/{node}/drain");
                let (status, body) = call("POST", &drain, Some(json!({"reason": "bench"})));
                assert_eq!(status, 204, "{node}: {body}");
            }
        }
        let acknowledged = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let submitter = {
            let (url, command) = (url.clone(), command.clone());
            let acknowledged = std::sync::Arc::clone(&acknowledged);
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .build()
                    .into();
                let body = json!({"command": command, "account": "team-a", "gpus": 4,
                    "time_limit": "10m"})
                .to_string();
                // Until the scheduler is killed (the connection refused or cut).
                for _ in 0..400 {
                    let Ok(mut reply) = agent
                        .post(format!("{url}/api/v1/jobs"))
                        .header("content-type", "application/json")
                        .send(body.as_bytes())
                    else {
                        return;
                    };
                    let status = reply.status().as_u16();
                    let Ok(text) = reply.body_mut().read_to_string() else {
                        return;
                    };
                    assert_eq!(status, 201, "{text}");
                    let reply: Value = serde_json::from_str(&text).unwrap();
                    let id = reply["job_id"].as_str().unwrap().to_owned();
                    acknowledged.lock().unwrap().push(id);
                }
            })
        };
        // Killed once two more submissions were acknowledged after the next file held a
        // record: the later one was sent after the state file was begun.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let holds_records = || std::fs::metadata(&next).is_ok_and(|m| m.len() > 0);
        let mut seen_at = None;
        while !submitter.is_finished() && std::time::Instant::now() < until {
            let count = acknowledged.lock().unwrap().len();
            match (holds_records(), seen_at) {
                (false, _) => seen_at = None,
                (true, None) => seen_at = Some(count),
                (true, Some(at)) if count >= at + 2 => break,
                (true, Some(_)) => {}
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        sched.child.kill().unwrap();
        sched.child.wait().unwrap();
        submitter.join().unwrap();
        let acknowledged = std::mem::take(&mut *acknowledged.lock().unwrap());
        // Landed: an acknowledged submission's record is in the next file (so in no state
        // file written).
        let in_next = jobs_recorded_in(&next);
        landed = acknowledged.iter().any(|id| in_next.contains(id));
        taken.extend(acknowledged);

        let sched = start(&data, &config);
        for id in &taken {
            assert_eq!(
                job(&sched.url, id)["state"],
                "pending",
                "round {round}: {id}"
            );
        }
        drop(sched);
        if landed {
            break;
        }
    }
    assert!(
        landed,
        "no kill landed while a state file was written beside the scheduler ({} jobs)",
        taken.len()
    );
}

/// A tenant's job that writes until its disk is full: where the jobs' directories share the
/// scheduler's filesystem (the default) every request that must be saved is refused until an
/// operator frees space; with `--jobs-dir` on a filesystem of their own the scheduler goes on
/// taking and saving requests, and the filler job simply fails.
#[test]
fn a_job_that_fills_its_disk_stops_the_scheduler_only_where_jobs_share_its_filesystem() {
    for own_disk in [false, true] {
        let disk = Tmpfs::mount("4m");
        let jobs_disk = own_disk.then(|| Tmpfs::mount("4m"));
        let _jobs = gpuledger_testkit::KillJobsUnder::new(disk.path());
        let config = disk.path().join("cluster.toml");
        std::fs::write(&config, CONFIG).unwrap();
        let data = disk.path().join("data");
        let jobs = jobs_disk.as_ref().map(|d| d.path().join("jobs"));
        let sched = start_with(&data, &config, "100ms", jobs.as_deref());
        let url = sched.url.clone();
        let (status, body) = call(
            "POST",
            &format!("{url}/api/v1/jobs"),
            Some(
                json!({"command": "head -c 64M /dev/zero > fill", "account": "team-a", "gpus": 1, "time_limit": "10m"}),
            ),
        );
        assert_eq!(status, 201, "{body}");
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while job(&url, "team-a.1")["state"] != "failed" {
            assert!(
                std::time::Instant::now() < until,
                "{}",
                job(&url, "team-a.1")
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let answers: Vec<u16> = (0..20).map(|_| submit(&url).0).collect();
        if own_disk {
            assert_eq!(answers, [201; 20], "jobs on their own filesystem");
        } else {
            assert!(
                answers.contains(&503),
                "jobs on the scheduler's: {answers:?}"
            );
        }
        drop(sched);
    }
}
