//! Clients that try to exhaust a service's memory, against a real aggregator with tokens on
//! (issue 20): a request is answered from its headers before a byte of its body is read, so
//! anonymous clients sending large bodies cost nothing, and the bodies of callers with a token
//! share one budget, past which a request is told 503 with Retry-After at once.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::ingest::batch;
use common::{gpuledger_ok, spawn, terminate};

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
    let node = gpuledger_ok(&[
        "token", "add", "--file", tokens_arg, "--role", "node", "--node", "gpu001", "--name",
        "gpu001",
    ]);
    let aggregator = spawn(
        &[
            "aggregator",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.path().join("data").to_str().unwrap(),
            "--tokens",
            tokens_arg,
            "--max-buffered-bytes",
            "8MiB",
        ],
        Stdio::inherit(),
    );
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
