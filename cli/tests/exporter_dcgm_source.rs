//! The exporter reading an existing dcgm-exporter over real HTTP: its fields come through under
//! the same names; a truncated page makes the source unhealthy in /metrics (GPUs `up` 0) while
//! the exporter keeps serving, and it recovers when the page does.

mod common;

use common::scrape;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PAGE: &str = include_str!("../../exporter/tests/fixtures/dcgm-exporter-h100.txt");

/// A stand-in dcgm-exporter: answers every request with the current page.
fn serve(page: Arc<Mutex<String>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/metrics", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let body = page.lock().unwrap().clone();
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

fn wait_until(url: &str, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let page = scrape(url);
        if done(&page) {
            return page;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}:\n{page}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn dcgm_fields_come_through_and_a_truncated_page_marks_the_source_unhealthy() {
    let page = Arc::new(Mutex::new(PAGE.to_owned()));
    let dcgm_url = serve(Arc::clone(&page));
    let spool = tempfile::tempdir().unwrap();
    let spool_dir = spool.path().to_str().unwrap();
    let exporter = common::spawn(
        &[
            "exporter",
            "--node",
            "gpu017",
            "--source",
            "dcgm-exporter",
            "--dcgm-url",
            &dcgm_url,
            "--listen",
            "127.0.0.1:0",
            "--spool-dir",
            spool_dir,
        ],
        Stdio::null(),
    );
    let url = exporter.url.clone();

    let healthy = wait_until(&url, "a first collection", |p| {
        p.contains("gpuledger_exporter_source_up{source=\"dcgm-exporter\"} 1")
    });
    let has = |page: &str, start: &str, end: &str| {
        page.lines()
            .any(|l| l.starts_with(start) && l.ends_with(end))
    };
    assert!(
        has(
            &healthy,
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu=\"0\",UUID=",
            "Hostname=\"gpu017\",hpc_job=\"\"} 0.453125"
        ),
        "{healthy}"
    );
    assert!(
        has(
            &healthy,
            "DCGM_FI_DEV_FB_USED{gpu=\"1\",UUID=",
            "Hostname=\"gpu017\",hpc_job=\"\"} 76067"
        ),
        "{healthy}"
    );
    assert!(
        healthy.contains("UUID=\"GPU-5f3c1b2a-9d7e-4c41-8a0b-1e2f3a4b5c6d\""),
        "{healthy}"
    );

    let cut = PAGE[..PAGE.len() / 2].rfind('{').unwrap() + 12;
    *page.lock().unwrap() = PAGE[..cut].to_owned();
    let broken = wait_until(&url, "the source to turn unhealthy", |p| {
        p.contains("gpuledger_exporter_source_up{source=\"dcgm-exporter\"} 0")
    });
    assert!(
        broken.contains("gpuledger_gpu_up{gpu=\"0\",Hostname=\"gpu017\"} 0"),
        "{broken}"
    );
    assert!(
        !broken.contains("gpuledger_exporter_source_errors_total{source=\"dcgm-exporter\"} 0\n")
    );

    *page.lock().unwrap() = PAGE.to_owned();
    wait_until(&url, "recovery", |p| {
        p.contains("gpuledger_exporter_source_up{source=\"dcgm-exporter\"} 1")
            && p.contains("gpuledger_gpu_up{gpu=\"0\",Hostname=\"gpu017\"} 1")
    });
    common::terminate(exporter);
}
