//! Clients that try to exhaust a service, against a real aggregator and scheduler (issue 20):
//! a request is answered from its headers before a byte of its body is read, so anonymous
//! clients sending large bodies cost nothing, and the bodies of callers with a token share one
//! budget, past which a request is told 503 with Retry-After at once; half-sent requests from
//! one address, however many, keep no other client out, over HTTP or HTTPS.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::ingest::batch;
use common::{add_token, spawn, terminate};

/// An aggregator on a loopback port with its data in `dir/data`, the token file `tokens` and
/// `options`.
fn aggregator_with_tokens(
    dir: &std::path::Path,
    tokens: &str,
    options: &[&str],
) -> common::Process {
    let data = dir.join("data");
    let args = [
        "aggregator",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
        "--tokens",
        tokens,
    ];
    let args: Vec<&str> = args.iter().chain(options).copied().collect();
    spawn(&args, Stdio::inherit())
}

/// Sends a request's head (and `body_bytes` of its body, if any), then reads the answer's
/// status line; how long the answer took.
fn head_only(addr: &str, head: &str, body_bytes: usize) -> (String, Duration, TcpStream) {
    head_within(addr, head, body_bytes, Duration::from_secs(20))
}

/// [`head_only`], waiting at most `wait` for the answer (none: an empty text).
fn head_within(
    addr: &str,
    head: &str,
    body_bytes: usize,
    wait: Duration,
) -> (String, Duration, TcpStream) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(wait)).unwrap();
    let started = Instant::now();
    stream.write_all(head.as_bytes()).unwrap();
    if body_bytes > 0 {
        // Only what the socket takes at once: a refused request is not read.
        let _ = stream.write_all(&vec![b'x'; body_bytes]);
    }
    let mut answer = vec![0u8; 4096];
    let n = stream.read(&mut answer).unwrap_or(0);
    let text = String::from_utf8_lossy(&answer[..n]).into_owned();
    (text, started.elapsed(), stream)
}

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .unwrap()
        * 1024
}

#[test]
fn bodies_wait_for_their_caller_and_share_one_budget() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let tokens_arg = tokens.to_str().unwrap();
    let node = add_token(tokens_arg, "node", "gpu001", &["--node", "gpu001"]);
    let aggregator =
        aggregator_with_tokens(dir.path(), tokens_arg, &["--max-buffered-bytes", "8MiB"]);
    let addr = aggregator.url.trim_start_matches("http://").to_owned();
    let pid = aggregator.child.id();
    let ingest_head = |token: Option<&str>, length: usize| {
        let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
        format!(
            "POST /api/v1/ingest HTTP/1.1\r\nhost: x\r\nx-gpuledger-node: gpu001\r\nx-gpuledger-seq: 1\r\n\
             {auth}content-type: application/vnd.apache.arrow.stream\r\ncontent-length: {length}\r\n\r\n"
        )
    };

    // Anonymous pushes of 32 MiB each, eight at once: each is answered 401 from its headers,
    // at once, and the service holds none of their bytes.
    let before = rss_bytes(pid);
    let anonymous: Vec<_> = (0..8)
        .map(|_| {
            let (head, addr) = (ingest_head(None, 32 << 20), addr.clone());
            std::thread::spawn(move || head_only(&addr, &head, 1 << 20))
        })
        .collect();
    for t in anonymous {
        let (answer, took, _) = t.join().unwrap();
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
        assert!(took < Duration::from_secs(5), "answered in {took:?}");
    }
    let grown = rss_bytes(pid).saturating_sub(before);
    assert!(
        grown < 48 << 20,
        "the aggregator grew by {} MiB",
        grown >> 20
    );

    // A node's token, bodies of 6 MiB not yet sent: the first holds 6 of the 8 MiB budget, the
    // second is told 503 with Retry-After at once, and a body over the largest is 413 at once.
    let mut holder = TcpStream::connect(&addr).unwrap();
    holder
        .write_all(ingest_head(Some(&node), 6 << 20).as_bytes())
        .unwrap();
    holder.write_all(&[0u8; 1024]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let (answer, took, _) = head_only(&addr, &ingest_head(Some(&node), 6 << 20), 0);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    assert!(took < Duration::from_secs(5), "answered in {took:?}");
    let (answer, _, _) = head_only(&addr, &ingest_head(Some(&node), 65 << 20), 0);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    // A real push that fits in what is left is served meanwhile.
    let now = chrono::Utc::now().timestamp_millis();
    let body = batch("gpu001", 0, now - now.rem_euclid(1000) - 600_000, 80);
    let mut small = TcpStream::connect(&addr).unwrap();
    small
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let head =
        ingest_head(Some(&node), body.len()).replace("x-gpuledger-seq: 1", "x-gpuledger-seq: 2");
    small.write_all(head.as_bytes()).unwrap();
    small.write_all(&body).unwrap();
    let mut answer = vec![0u8; 4096];
    let n = small.read(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // When the holder goes, its share comes back: a 6 MiB body is admitted again (and waits
    // for its bytes instead of being told 503).
    drop(holder);
    let mut freed = false;
    for _ in 0..50 {
        let (answer, _, _) = head_within(
            &addr,
            &ingest_head(Some(&node), 6 << 20),
            0,
            Duration::from_millis(500),
        );
        if answer.is_empty() {
            freed = true;
            break;
        }
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    }
    assert!(freed, "the budget came back when the holder left");
    terminate(aggregator);
}

/// Holds `count` half-sent requests open to `addr` from the loopback address `source` (over
/// plain HTTP: a request line and half a header; over TLS: a connection that never says
/// hello), opening another whenever the service closes one, until `stop`; counts in `closed`
/// those the service closed.
fn flood(
    addr: std::net::SocketAddr,
    source: [u8; 4],
    count: usize,
    tls: bool,
    stop: Arc<AtomicBool>,
    closed: Arc<AtomicUsize>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let open = || {
            let mut s = gpuledger_testkit::connect_from(source, addr);
            if !tls {
                let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: ");
            }
            s.set_nonblocking(true).unwrap();
            s
        };
        let mut held: Vec<TcpStream> = (0..count).map(|_| open()).collect();
        while !stop.load(Ordering::Relaxed) {
            for s in &mut held {
                let mut buf = [0; 256];
                let gone = match s.read(&mut buf) {
                    Ok(_) => true,
                    Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                };
                if gone {
                    closed.fetch_add(1, Ordering::Relaxed);
                    *s = open();
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    })
}

#[test]
fn half_sent_requests_from_one_address_keep_no_other_client_out() {
    let dir = tempfile::tempdir().unwrap();
    let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    let pair = rcgen::generate_simple_self_signed(names).unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert, pair.cert.pem()).unwrap();
    std::fs::write(&key, pair.signing_key.serialize_pem()).unwrap();
    let config = dir.path().join("cluster.toml");
    std::fs::write(
        &config,
        "version = 1\n[cluster]\nname = \"one\"\n[[node_pools]]\nname = \"p\"\n\
         prefix = \"gpu\"\ncount = 1\ngpus_per_node = 4\ngpu_model = \"h100-sxm\"\n\
         [[partitions]]\nname = \"train\"\npriority_tier = 20\ndefault = true\n\
         [prices]\nversion = \"v\"\neffective_from = \"2026-01-01\"\ncurrency = \"USD\"\n\
         gpu_hour = { h100-sxm = \"1\" }\n[[accounts]]\nid = \"team-a\"\nname = \"A\"\nweight = 1\n",
    )
    .unwrap();
    let limits = [
        "--max-connections",
        "64",
        "--max-connections-per-address",
        "16",
    ];
    let (data, state) = (dir.path().join("data"), dir.path().join("sched"));
    let aggregator: Vec<&str> = ["aggregator", "--listen", "127.0.0.1:0", "--data-dir"]
        .into_iter()
        .chain([data.to_str().unwrap()])
        .chain(limits)
        .collect();
    let scheduler: Vec<&str> = [
        "scheduler",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        state.to_str().unwrap(),
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ]
    .into_iter()
    .chain(limits)
    .collect();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .tls_config(gpuledger_auth::tls::client_tls(Some(&cert)).unwrap())
        .build()
        .into();
    for args in [aggregator, scheduler] {
        let service = spawn(&args, Stdio::inherit());
        let tls = service.url.starts_with("https://");
        let addr: std::net::SocketAddr = service.url.split("://").nth(1).unwrap().parse().unwrap();
        // Twelve times the address's limit and three times the total, from 127.0.0.2.
        let stop = Arc::new(AtomicBool::new(false));
        let closed = Arc::new(AtomicUsize::new(0));
        let attacker = flood(
            addr,
            [127, 0, 0, 2],
            200,
            tls,
            Arc::clone(&stop),
            Arc::clone(&closed),
        );
        // The flood reaches the limits: all but the address's 16 are closed as they come.
        let started = Instant::now();
        while closed.load(Ordering::Relaxed) < 184 {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{}: only {} of the flood's connections were closed",
                service.url,
                closed.load(Ordering::Relaxed)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        for _ in 0..20 {
            let answer = agent
                .get(format!("{}/healthz", service.url))
                .call()
                .unwrap()
                .body_mut()
                .read_to_string()
                .unwrap();
            assert_eq!(answer, "ok\n", "{}", service.url);
        }
        stop.store(true, Ordering::Relaxed);
        attacker.join().unwrap();
        terminate(service);
    }
}

#[test]
fn operator_sql_cannot_take_the_aggregator_down_and_a_metrics_token_cannot_run_it() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let tokens_arg = tokens.to_str().unwrap();
    let operator = add_token(tokens_arg, "operator", "ops", &[]);
    let scraper = add_token(tokens_arg, "metrics", "prometheus", &[]);
    let aggregator = aggregator_with_tokens(
        dir.path(),
        tokens_arg,
        &["--sql-memory-limit", "64MiB", "--sql-timeout", "3s"],
    );
    let pid = aggregator.child.id();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let sql = |token: &str, sql: &str| -> (u16, serde_json::Value) {
        let mut response = agent
            .post(format!("{}/api/v1/query", aggregator.url))
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .send(serde_json::json!({ "sql": sql }).to_string())
            .unwrap();
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or_default();
        (status, body)
    };
    let before = rss_bytes(pid);
    let deep = format!("SELECT 1{}", "+1".repeat(8000));
    for (attack, says) in [
        ("SELECT length(repeat('x', 500000000))", "repeat() would build"),
        ("SELECT length(repeat('x', 1000000000))", "repeat() would build"),
        ("SELECT length(lpad('', 2000000000, 'ab'))", "lpad() would build"),
        (
            "SELECT count(*) FROM generate_series(1, 20000000) a(v) JOIN generate_series(1, 20000000) b(w) ON v = w",
            "needs more memory than the 64MiB",
        ),
        (
            "SELECT sum(v % 3) FROM generate_series(1, 100000000000) t(v)",
            "did not finish within 3s",
        ),
        (deep.as_str(), "nest deeper than"),
    ] {
        let (status, body) = sql(&operator, attack);
        assert_eq!(status, 400, "{attack}: {body}");
        assert_eq!(body["errors"][0]["field"], "sql", "{body}");
        let message = body["error"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{attack}: {message}");
    }
    let grown = rss_bytes(pid).saturating_sub(before);
    assert!(
        grown < 256 << 20,
        "the aggregator grew by {} MiB",
        grown >> 20
    );
    // Still serving, and a plain query answers.
    let (status, body) = sql(&operator, "SELECT 6 * 7 AS answer");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rows"][0]["answer"], 42);
    // Prometheus's token scrapes but runs no SQL.
    assert_eq!(sql(&scraper, "SELECT 1").0, 403);
    let scrape = agent
        .get(format!("{}/metrics", aggregator.url))
        .header("authorization", format!("Bearer {scraper}"))
        .call()
        .unwrap();
    assert_eq!(scrape.status().as_u16(), 200);
    terminate(aggregator);
}
