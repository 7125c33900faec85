//! The aggregator's status page in a real headless Chromium (Debian's `chromium` through
//! `chromedriver`), with authentication on: tokens made by `gpuledger token add`, an exporter
//! pushing with its node token, job events posted with the operator's. A tenant signs in with
//! its token and sees its own account only, with the figures `/api/v1/accounts/{a}/summary`
//! gives; an operator sees every account and the cluster's utilization as SQL over the stored
//! rollups gives it, and the queue. Screenshots of both views are saved.

mod common;

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use common::browser::{screenshot_dir, Browser};
use common::{gpuledger_ok, terminate, wait_for};

const CONFIG: &str = r#"version = 1
[cluster]
name = "status"
[[node_pools]]
name = "p"
prefix = "node"
count = 2
gpus_per_node = 4
gpu_model = "h100-sxm"
[[partitions]]
name = "train"
priority_tier = 20
default = true
[prices]
version = "v1"
effective_from = "2026-01-01"
currency = "CNY"
gpu_hour = { h100-sxm = "10.00" }
[[accounts]]
id = "team-a"
name = "Research"
weight = 3
projects = [{ id = "pretrain" }]
[[accounts]]
id = "team-b"
name = "Product"
weight = 1
projects = [{ id = "finetune" }]
"#;

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into()
}

fn get(url: &str, token: &str) -> (u16, Value) {
    let mut r = agent()
        .get(url)
        .header("authorization", format!("Bearer {token}"))
        .call()
        .unwrap();
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// What the page shows: indicator values, per-account cells (value and text), queue rows.
const EXTRACT: &str = r#"
const cells = (root) => { const o = {}; root.querySelectorAll('[data-field]').forEach(c => {
  o[c.dataset.field] = {value: c.dataset.value === undefined ? null : Number(c.dataset.value), text: c.innerText.trim()}; }); return o; };
const indicators = {}; document.querySelectorAll('tr[data-indicator]').forEach(r => {
  const v = r.querySelector('[data-value]'); indicators[r.dataset.indicator] = v ? Number(v.dataset.value) : null; });
const accounts = {}; document.querySelectorAll('tr[data-account]').forEach(r => { accounts[r.dataset.account] = cells(r); });
const queue = {}; document.querySelectorAll('tr[data-job]').forEach(r => { queue[r.dataset.job] = r.dataset.state; });
const finished = {}; document.querySelectorAll('tr[data-finished-job]').forEach(r => { finished[r.dataset.finishedJob] = r.dataset.outcome; });
return {scope: document.body.dataset.scope, from: Number(document.body.dataset.fromMs), to: Number(document.body.dataset.toMs),
        indicators, accounts, queue, finished, invoicesLink: !!document.querySelector('header a[href="/invoices"]'),
        svgs: document.querySelectorAll('svg').length, text: document.body.innerText};
"#;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// Every figure of an account row equals the API's summary of the same window, and reads as
/// the page formats it.
fn assert_row_matches_summary(row: &Value, summary: &Value, account: &str) {
    let pct = |v: f64| format!("{:.1}%", v * 100.0);
    for (field, api_field, text) in [
        ("jobs", "jobs", None),
        (
            "gpu_hours",
            "gpu_hours",
            Some(format!("{:.1}", summary["gpu_hours"].as_f64().unwrap())),
        ),
        (
            "mean_mfu",
            "mean_mfu",
            summary["mean_mfu"].as_f64().map(pct),
        ),
        (
            "mean_gpu_util_pct",
            "mean_gpu_util_pct",
            summary["mean_gpu_util_pct"]
                .as_f64()
                .map(|v| format!("{v:.1}%")),
        ),
        (
            "mean_mem_util",
            "mean_mem_util",
            summary["mean_mem_util"].as_f64().map(pct),
        ),
        ("p95_queue_wait_s", "p95_queue_wait_s", None),
        (
            "success_rate",
            "success_rate",
            summary["success_rate"].as_f64().map(pct),
        ),
    ] {
        let shown = &row[field];
        match summary[api_field].as_f64() {
            Some(expected) => {
                let got = shown["value"]
                    .as_f64()
                    .unwrap_or_else(|| panic!("{account}.{field}: no value in {shown}"));
                assert!(
                    close(got, expected),
                    "{account}.{field}: page {got}, API {expected}"
                );
            }
            None => assert!(
                shown["value"].is_null(),
                "{account}.{field}: page {shown}, API null"
            ),
        }
        if let Some(text) = text {
            assert_eq!(
                shown["text"].as_str(),
                Some(text.as_str()),
                "{account}.{field}"
            );
        }
    }
}

#[test]
fn the_status_page_shows_each_token_its_own_figures_in_a_real_browser() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cluster.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let tokens = dir.path().join("tokens.toml");
    let tokens_arg = tokens.to_str().unwrap();
    let operator = gpuledger_ok(&[
        "token", "add", "--file", tokens_arg, "--role", "operator", "--name", "ops",
    ]);
    let tenant = gpuledger_ok(&[
        "token",
        "add",
        "--file",
        tokens_arg,
        "--role",
        "tenant",
        "--account",
        "team-a",
        "--name",
        "a-lead",
    ]);
    let node = gpuledger_ok(&[
        "token", "add", "--file", tokens_arg, "--role", "node", "--node", "node001", "--name",
        "node001",
    ]);
    let listed = gpuledger_ok(&["token", "list", "--file", tokens_arg]);
    assert!(
        listed.contains("a-lead") && listed.contains("team-a") && !listed.contains(&tenant[16..]),
        "{listed}"
    );
    let node_token_file = dir.path().join("node-token");
    std::fs::write(&node_token_file, format!("{node}\n")).unwrap();

    let aggregator = common::spawn_aggregator_with_tokens(dir.path(), &config, &tokens);
    let url = aggregator.url.clone();
    // Without a token nothing but the sign-in page and /healthz.
    assert_eq!(
        agent()
            .get(format!("{url}/metrics"))
            .call()
            .unwrap()
            .status()
            .as_u16(),
        401
    );
    assert_eq!(
        agent()
            .get(format!("{url}/healthz"))
            .call()
            .unwrap()
            .status()
            .as_u16(),
        200
    );

    // Jobs: team-a's job 7 on GPUs 0-1, team-b's job 8 on GPU 2, team-a's job 9 done, its
    // job 10 waiting.
    let t = now_ms();
    let ev = |time_ms: i64, job: &str, account: &str, kind: &str, extra: Value| {
        let mut e = json!({"time_ms": time_ms, "job_id": job, "account": account, "kind": kind});
        e.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        e
    };
    let events = json!({"source": "test", "seq": 0, "events": [
        ev(t - 900_000, "7", "team-a", "submitted", json!({"gpus": 2, "project": "pretrain"})),
        ev(t - 600_000, "7", "team-a", "started", json!({"gpus": 2, "project": "pretrain"})),
        ev(t - 200_000, "8", "team-b", "submitted", json!({"gpus": 1, "project": "finetune"})),
        ev(t - 120_000, "8", "team-b", "started", json!({"gpus": 1, "project": "finetune"})),
        ev(t - 800_000, "9", "team-a", "submitted", json!({"gpus": 1})),
        ev(t - 790_000, "9", "team-a", "started", json!({"gpus": 1})),
        ev(t - 700_000, "9", "team-a", "finished", json!({"outcome": "completed"})),
        ev(t - 60_000, "10", "team-a", "submitted", json!({"gpus": 8, "project": "pretrain"})),
    ]});
    let post = |token: &str| {
        agent()
            .post(format!("{url}/api/v1/events"))
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .send(events.to_string().as_bytes())
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(post(&tenant), 403, "a tenant may not post events");
    assert_eq!(post(&operator), 200);

    let mapping = dir.path().join("mapping");
    std::fs::create_dir_all(&mapping).unwrap();
    for (gpu, line) in [
        (0, "7 team-a pretrain"),
        (1, "7 team-a pretrain"),
        (2, "8 team-b finetune"),
    ] {
        std::fs::write(mapping.join(gpu.to_string()), format!("{line}\n")).unwrap();
    }
    let exporter =
        common::spawn_mapped_exporter("node001", 4, &url, &node_token_file, &mapping, dir.path());
    let window = format!("from={}&to={}", t - 3_600_000, t + 3_600_000);
    wait_for("both tenants' GPU-hours to be stored", 60, || {
        ["team-a", "team-b"].iter().all(|a| {
            let (_, s) = get(
                &format!("{url}/api/v1/accounts/{a}/summary?{window}"),
                &operator,
            );
            s["gpu_seconds"].as_i64().unwrap_or(0) >= 8
        })
    });
    // Nothing more comes in: the page and the API read the same stored data.
    terminate(exporter);
    std::thread::sleep(Duration::from_millis(2500));

    let browser = Browser::start(1280, 1000);
    browser.open(&format!("{url}/"));
    browser.wait_for_text("Sign in", true);
    browser.type_into("input[name=token]", &tenant);
    browser.click("button[type=submit]");
    browser.wait_for_text("Sign in", false);
    browser.open(&format!("{url}/?{window}"));
    let page = browser.script(EXTRACT);
    assert_eq!(page["scope"], "team-a", "{page}");
    let accounts = page["accounts"].as_object().unwrap();
    assert_eq!(
        accounts.keys().collect::<Vec<_>>(),
        vec!["team-a"],
        "a tenant sees its account only"
    );
    let text = page["text"].as_str().unwrap();
    assert!(
        !text.contains("team-b") && !text.contains("Product"),
        "{text}"
    );
    let (status, summary) = get(
        &format!("{url}/api/v1/accounts/team-a/summary?{window}"),
        &tenant,
    );
    assert_eq!(status, 200, "{summary}");
    assert_row_matches_summary(&page["accounts"]["team-a"], &summary, "team-a");
    assert!(close(
        page["indicators"]["mean_mfu"].as_f64().unwrap(),
        summary["mean_mfu"].as_f64().unwrap()
    ));
    assert_eq!(
        page["indicators"]["jobs"], 3,
        "jobs 7, 9 and 10 were submitted in the window"
    );
    assert_eq!(
        page["queue"],
        json!({"7": "running", "10": "pending"}),
        "its own jobs only"
    );
    assert_eq!(
        page["finished"],
        json!({"9": "completed"}),
        "a finished job stays on the page"
    );
    assert_eq!(page["invoicesLink"], true, "a tenant reads its invoices");
    assert!(page["svgs"].as_u64().unwrap() >= 3, "{page}");
    // Another tenant's account is answered as one that does not exist.
    let (b_status, b_body) = get(&format!("{url}/api/v1/accounts/team-b/summary"), &tenant);
    let (n_status, n_body) = get(&format!("{url}/api/v1/accounts/team-z/summary"), &tenant);
    assert_eq!((b_status, n_status), (404, 404));
    assert_eq!(
        b_body["error"].as_str().unwrap().replace("team-b", "X"),
        n_body["error"].as_str().unwrap().replace("team-z", "X")
    );
    let shots = screenshot_dir();
    browser.fit_height(1280);
    browser.screenshot(&shots.join("status-page-tenant.png"));

    browser.click("header form button[type=submit]");
    browser.wait_for_text("Sign in", true);
    browser.type_into("input[name=token]", &operator);
    browser.click("button[type=submit]");
    browser.wait_for_text("Sign in", false);
    browser.open(&format!("{url}/?{window}"));
    let page = browser.script(EXTRACT);
    assert_eq!(page["scope"], "all", "{page}");
    for account in ["team-a", "team-b"] {
        let (status, summary) = get(
            &format!("{url}/api/v1/accounts/{account}/summary?{window}"),
            &operator,
        );
        assert_eq!(status, 200);
        assert_row_matches_summary(&page["accounts"][account], &summary, account);
    }
    let sql = format!(
        "SELECT CAST(SUM(CASE WHEN job_id IS NOT NULL THEN gpu_seconds ELSE 0 END) AS DOUBLE) / CAST(SUM(gpu_seconds) AS DOUBLE) AS u \
         FROM rollups_hourly WHERE CAST(hour AS BIGINT) >= {} AND CAST(hour AS BIGINT) < {}",
        page["from"], page["to"]
    );
    let mut r = agent()
        .post(format!("{url}/api/v1/query"))
        .header("authorization", format!("Bearer {operator}"))
        .send(json!({ "sql": sql }).to_string().as_bytes())
        .unwrap();
    let reply: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    let utilization = reply["rows"][0]["u"]
        .as_f64()
        .unwrap_or_else(|| panic!("{reply}"));
    assert!(
        close(
            page["indicators"]["utilization"].as_f64().unwrap(),
            utilization
        ),
        "{page} vs {utilization}"
    );
    assert!(
        (utilization - 0.75).abs() < 0.01,
        "three of node001's four GPUs work for a job: {utilization}"
    );
    assert_eq!(
        page["queue"],
        json!({"7": "running", "8": "running", "10": "pending"})
    );
    assert!(page["text"]
        .as_str()
        .unwrap()
        .contains("Cluster indicators against their targets"));
    assert_eq!(page["finished"], json!({"9": "completed"}));
    browser.fit_height(1280);
    browser.screenshot(&shots.join("status-page.png"));
    assert!(Path::new(&shots.join("status-page.png")).exists());

    // Invoices: `gpuledger invoice` writes the month's beside the tables; the invoices page
    // lists every account's to an operator and a tenant's own to a tenant.
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    gpuledger_ok(&[
        "invoice",
        "--month",
        &month,
        "--data-dir",
        dir.path().join("data").to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
    ]);
    browser.open(&format!("{url}/invoices"));
    let listed = browser.script(
        "return Array.from(document.querySelectorAll('tr[data-invoice]')).map(r => r.dataset.account);",
    );
    assert_eq!(
        listed,
        json!(["platform", "team-a", "team-b"]),
        "an operator sees every account's, the platform's (idle GPUs) too"
    );
    browser.fit_height(1280);
    browser.screenshot(&shots.join("invoices-page.png"));
    browser.click("tr[data-account=team-a] td a");
    browser.wait_for_text("Charges", true);
    let total = browser.script("return document.getElementById('total').innerText;");
    let (status, invoices) = get(&format!("{url}/api/v1/invoices"), &tenant);
    assert_eq!(status, 200, "{invoices}");
    let invoices = invoices.as_array().unwrap();
    assert_eq!(invoices.len(), 1, "a tenant lists its own: {invoices:?}");
    assert_eq!(invoices[0]["account"], "team-a");
    assert_eq!(
        invoices[0]["total"].as_str(),
        total.as_str(),
        "the page's total"
    );
    let invoice_url = format!("{url}/invoices/{month}/team-a");
    let (status, csv) = get(&format!("{invoice_url}?format=csv"), &tenant);
    assert_eq!(status, 200);
    assert!(csv.as_str().unwrap().starts_with("invoice_id,"), "{csv}");
    let (status, json_invoice) = get(&format!("{invoice_url}?format=json&revision=1"), &tenant);
    assert_eq!((status, json_invoice["revision"].as_u64()), (200, Some(1)));
    // Another tenant's invoice is one that does not exist; bad paths are refused by name;
    // no token is the sign-in page; a node's token reads no invoices.
    let (status, _) = get(&format!("{url}/invoices/{month}/team-b"), &tenant);
    assert_eq!(status, 404);
    let (status, body) = get(
        &format!("{url}/invoices/{month}/team-a%2F..%2F..%2Fetc"),
        &operator,
    );
    assert_eq!(
        (status, body["errors"][0]["field"].as_str()),
        (400, Some("account")),
        "{body}"
    );
    let (status, body) = get(&format!("{url}/invoices/2026-13/team-a"), &operator);
    assert_eq!(
        (status, body["errors"][0]["field"].as_str()),
        (400, Some("month")),
        "{body}"
    );
    let anonymous = agent().get(&invoice_url).call().unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
    let (status, _) = get(&format!("{url}/api/v1/invoices"), &node);
    assert_eq!(status, 403);
    drop(browser);
    terminate(aggregator);
}
