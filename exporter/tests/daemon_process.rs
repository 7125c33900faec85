//! The node agent's own binary, `gpuledger-exporter`, as a real process: it takes its options
//! from a TOML file, samples, serves `/metrics`, and at SIGTERM spools what it holds and exits
//! cleanly. The exporter with an aggregator is tested in `cli/tests/exporter_process.rs`.

use std::process::{Command, Stdio};

use gpuledger_testkit::{spawn_binary, terminate, Process};
use std::time::{Duration, Instant};

/// Starts the binary and reads the address it announced.
fn spawn(args: &[&str]) -> Process {
    spawn_binary(
        env!("CARGO_BIN_EXE_gpuledger-exporter"),
        args,
        Stdio::inherit(),
    )
}

fn scrape(url: &str) -> String {
    ureq::get(format!("{url}/metrics"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap()
}

fn metric(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn the_exporter_alone_samples_serves_and_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("exporter.toml");
    let spool = dir.path().join("spool");
    std::fs::write(
        &config,
        format!(
            "node = \"gpu042\"\ngpus = 2\nlisten = \"127.0.0.1:0\"\nspool_dir = \"{}\"\n",
            spool.display()
        ),
    )
    .unwrap();
    let exporter = spawn(&["--config", config.to_str().unwrap()]);
    let until = Instant::now() + Duration::from_secs(60);
    let page = loop {
        let page = scrape(&exporter.url);
        if metric(&page, "gpuledger_exporter_samples_total").is_some_and(|n| n >= 2.0) {
            break page;
        }
        assert!(Instant::now() < until, "no collection within 60 s:\n{page}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        page.contains("gpuledger_gpu_up{gpu=\"1\",Hostname=\"gpu042\"} 1"),
        "{page}"
    );
    terminate(exporter);
    assert!(
        spool.join("next-seq").exists(),
        "the last samples were spooled at shutdown"
    );
}

#[test]
fn a_config_file_with_an_unknown_key_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("exporter.toml");
    std::fs::write(&config, "node = \"gpu042\"\nspool_dri = \"/tmp/x\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpuledger-exporter"))
        .args(["--config", config.to_str().unwrap()])
        // One line and status 1, never a backtrace, whatever the environment asks for.
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("exporter.toml:2: unknown key `spool_dri`"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
}

#[test]
fn synthetic_exporters_of_two_nodes_share_a_host_on_their_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let start = |node: &str| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_gpuledger-exporter"));
        command
            .args(["--node", node, "--gpus", "1"])
            .current_dir(dir.path());
        gpuledger_testkit::spawn_command(command, Stdio::inherit())
    };
    // Neither --listen nor --spool-dir: each takes its node's port and spool.
    let (a, b) = (start("gpu057"), start("gpu058"));
    assert!(a.url.ends_with(":9457"), "{}", a.url);
    assert!(b.url.ends_with(":9458"), "{}", b.url);
    let local = |url: &str| url.replace("0.0.0.0", "127.0.0.1");
    assert!(scrape(&local(&a.url)).contains("Hostname=\"gpu057\""));
    assert!(scrape(&local(&b.url)).contains("Hostname=\"gpu058\""));
    terminate(a);
    terminate(b);
    for node in ["gpu057", "gpu058"] {
        assert!(
            dir.path().join("gpuledger-spool").join(node).is_dir(),
            "{node}'s spool"
        );
    }
    // A node name that would leave the spool directory is refused as a usage error.
    let out = Command::new(env!("CARGO_BIN_EXE_gpuledger-exporter"))
        .args(["--node", "../etc", "--listen", "127.0.0.1:0"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--node"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
