//! The Debian package as an operator gets it: `scripts/package-deb.sh` builds it with cargo-deb
//! from this test build's binaries (the dev profile, stripped by cargo-deb; a release package
//! is the same script with the release profile), `dpkg -i` installs it on this machine, the
//! installed binaries run (the config check on the shipped `/etc/gpuledger/cluster.toml`, the
//! exporter serving `/metrics`), systemd accepts the installed units, and `dpkg --purge`
//! removes it all but the data under `/var/lib/gpuledger`.
//!
//! It installs into the real system, so it needs root (CI runs as root); elsewhere it says so
//! and fails.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use gpuledger_testkit::{spawn_binary, terminate};

/// The target directory this test was built in (`.../target/debug/gpuledger` is two levels
/// below it).
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_gpuledger"))
        .ancestors()
        .nth(2)
        .expect("target directory")
        .to_path_buf()
}

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

fn ok(program: &str, args: &[&str]) -> String {
    let out = run(program, args);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn is_root() -> bool {
    ok("id", &["-u"]).trim() == "0"
}

/// Builds the package into `out` and returns its path.
fn build_package(out: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let exporter = target_dir().join("debug/gpuledger-exporter");
    assert!(
        exporter.exists(),
        "{} is missing: `cargo test --workspace` builds it (or cargo build -p gpuledger-exporter)",
        exporter.display()
    );
    let built = Command::new("bash")
        .arg(root.join("scripts/package-deb.sh"))
        .args(["--profile", "dev", "--no-build", "--fast", "--out"])
        .arg(out)
        .env("CARGO_TARGET_DIR", target_dir())
        .current_dir(&root)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "scripts/package-deb.sh (cargo-deb: scripts/test.sh installs it): {}\n{}",
        built.status,
        String::from_utf8_lossy(&built.stderr)
    );
    let debs: Vec<PathBuf> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    assert_eq!(debs.len(), 1, "one package in {}: {debs:?}", out.display());
    debs[0].clone()
}

/// Purges the package however the test ends, so a failed run leaves no half-installed
/// package behind.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = run("dpkg", &["--purge", "gpuledger"]);
    }
}

#[test]
fn the_debian_package_installs_runs_and_purges() {
    assert!(
        is_root(),
        "this test installs a Debian package with dpkg -i: run it as root (CI does)"
    );
    let dir = tempfile::tempdir().unwrap();
    let deb = build_package(dir.path());
    let deb = deb.to_str().unwrap();

    // What is in it.
    let control = ok(
        "dpkg-deb",
        &["--field", deb, "Package", "Depends", "Section"],
    );
    assert!(control.contains("Package: gpuledger"), "{control}");
    assert!(
        control.contains("libc6"),
        "dependencies computed: {control}"
    );
    let contents = ok("dpkg-deb", &["--contents", deb]);
    for path in [
        "./usr/bin/gpuledger",
        "./usr/bin/gpuledger-exporter",
        "./usr/lib/systemd/system/gpuledger-aggregator.service",
        "./usr/lib/systemd/system/gpuledger-scheduler.service",
        "./usr/lib/systemd/system/gpuledger-exporter.service",
        "./etc/gpuledger/cluster.toml",
        "./etc/gpuledger/exporter.env",
        "./usr/share/man/man1/gpuledger.1.gz",
        "./usr/share/man/man1/gpuledger-scheduler-submit.1.gz",
        "./usr/share/bash-completion/completions/gpuledger",
        "./usr/share/zsh/vendor-completions/_gpuledger",
        "./usr/share/doc/gpuledger/examples/seed-prices.toml",
        "./usr/share/doc/gpuledger/README.Debian",
    ] {
        assert!(
            contents.lines().any(|l| l.contains(&format!(" {path}"))),
            "{path} not in the package:\n{contents}"
        );
    }
    let control_dir = dir.path().join("control");
    ok(
        "dpkg-deb",
        &["--control", deb, control_dir.to_str().unwrap()],
    );
    let conffiles = std::fs::read_to_string(control_dir.join("conffiles")).unwrap();
    assert!(
        conffiles.contains("/etc/gpuledger/cluster.toml")
            && conffiles.contains("/etc/gpuledger/exporter.env"),
        "an operator's edits survive upgrades: {conffiles}"
    );

    // Installed.
    let installed = Installed;
    ok("dpkg", &["--install", deb]);
    let status = ok(
        "dpkg-query",
        &["--show", "--showformat=${Status}", "gpuledger"],
    );
    assert_eq!(status, "install ok installed");
    let version = ok("/usr/bin/gpuledger", &["--version"]);
    assert!(version.starts_with("gpuledger "), "{version}");
    let checked = ok(
        "/usr/bin/gpuledger",
        &["check-config", "/etc/gpuledger/cluster.toml"],
    );
    assert!(checked.contains("cluster"), "{checked}");
    let page = ok("zcat", &["/usr/share/man/man1/gpuledger-exporter.1.gz"]);
    assert!(
        page.contains(".TH gpuledger-exporter 1"),
        "a man page: {}",
        &page[..page.len().min(200)]
    );
    // systemd accepts the units as installed (it checks, among the rest, that each ExecStart's
    // binary is there and executable; it said so for /usr/local/bin before the package).
    let units: Vec<String> = ["aggregator", "scheduler", "exporter"]
        .iter()
        .map(|u| format!("/usr/lib/systemd/system/gpuledger-{u}.service"))
        .collect();
    for unit in &units {
        let text = std::fs::read_to_string(unit).unwrap();
        let exec = text
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .unwrap_or_else(|| panic!("{unit}: no ExecStart"));
        let binary = exec.split_whitespace().next().unwrap();
        assert!(
            Path::new(binary).exists(),
            "{unit} runs {binary}, which the package does not install"
        );
    }
    let verify = run(
        "systemd-analyze",
        &[
            &["verify", "--man=no"][..],
            &units.iter().map(String::as_str).collect::<Vec<_>>(),
        ]
        .concat(),
    );
    assert!(
        verify.status.success(),
        "systemd-analyze verify: {}",
        String::from_utf8_lossy(&verify.stderr)
    );

    // The installed node agent runs: samples, serves /metrics, spools at SIGTERM.
    let spool = dir.path().join("spool");
    let exporter = spawn_binary(
        "/usr/bin/gpuledger-exporter",
        &[
            "--node",
            "pkg001",
            "--gpus",
            "2",
            "--listen",
            "127.0.0.1:0",
            "--spool-dir",
            spool.to_str().unwrap(),
        ],
        Stdio::inherit(),
    );
    common::wait_for("the installed exporter's samples", 60, || {
        common::scrape(&exporter.url).contains("gpuledger_gpu_up{gpu=\"1\",Hostname=\"pkg001\"} 1")
    });
    terminate(exporter);

    // Purged: binaries, units and configuration gone.
    drop(installed);
    let status = run(
        "dpkg-query",
        &["--show", "--showformat=${Status}", "gpuledger"],
    );
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.is_empty() || status.contains("not-installed"),
        "{status}"
    );
    for gone in [
        "/usr/bin/gpuledger",
        "/usr/bin/gpuledger-exporter",
        "/usr/lib/systemd/system/gpuledger-exporter.service",
        "/etc/gpuledger/cluster.toml",
    ] {
        assert!(!Path::new(gone).exists(), "{gone} left after purge");
    }
}
