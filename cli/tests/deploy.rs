//! The deployment files pass arguments the binary accepts: a renamed flag breaks this test,
//! not a node at install time.

use clap::Args;
use gpuledger_aggregator::serve::ServeOptions as AggregatorOptions;
use gpuledger_exporter::daemon::ExporterOptions;
use gpuledger_schedd::serve::ServeOptions as SchedulerOptions;

/// The ExecStart line's arguments after the binary and, for `gpuledger`, its subcommand.
fn exec_start_args(unit: &str) -> Vec<String> {
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("an ExecStart line");
    let mut words = line.split_whitespace();
    let binary = words.next().expect("a binary");
    let skip = usize::from(binary.ends_with("/gpuledger"));
    words.skip(skip).map(str::to_owned).collect()
}

fn daemonset_args(yaml: &str) -> Vec<String> {
    let mut lines = yaml.lines().skip_while(|l| l.trim() != "args:").skip(1);
    let mut out = Vec::new();
    for l in lines.by_ref() {
        let Some(item) = l.trim().strip_prefix("- ") else {
            break;
        };
        out.push(item.trim_matches('"').to_owned());
    }
    out
}

fn accepts<A: Args>(name: &'static str, args: &[String]) {
    let command = A::augment_args(clap::Command::new(name).no_binary_name(true));
    if let Err(e) = command.try_get_matches_from(args) {
        panic!("{name} refuses {args:?}: {e}");
    }
}

#[test]
fn systemd_units_pass_accepted_arguments() {
    let mut exporter = exec_start_args(include_str!(
        "../../deploy/systemd/gpuledger-exporter.service"
    ));
    assert_eq!(exporter.first().map(String::as_str), Some("--source"));
    exporter.extend(["--node".into(), "gpu001".into()]);
    accepts::<ExporterOptions>("exporter", &exporter);
    let aggregator = exec_start_args(include_str!(
        "../../deploy/systemd/gpuledger-aggregator.service"
    ));
    accepts::<AggregatorOptions>("aggregator", &aggregator);
    let unit = include_str!("../../deploy/systemd/gpuledger-scheduler.service");
    let scheduler = exec_start_args(unit);
    assert_eq!(scheduler.first().map(String::as_str), Some("serve"));
    accepts::<SchedulerOptions>("scheduler serve", &scheduler[1..]);
    assert!(
        unit.contains("KillMode=process"),
        "stopping the scheduler must not kill its jobs"
    );
    assert!(
        unit.contains("\nDelegate=yes\n"),
        "the scheduler makes a cgroup per job below its own"
    );
    for hiding in ["ProtectHome=", "ProtectSystem=", "PrivateTmp="] {
        assert!(
            !unit.lines().any(|l| l.starts_with(hiding)),
            "jobs start in the scheduler's mount namespace: its {hiding} would be theirs"
        );
    }
}

#[test]
fn the_daemonset_passes_accepted_arguments() {
    let yaml = include_str!("../../deploy/kubernetes/exporter-daemonset.yaml");
    assert!(yaml.contains("- /usr/local/bin/gpuledger-exporter"));
    let mut args = daemonset_args(yaml);
    assert!(args.len() > 10, "{args:?}");
    args.extend(["--node".into(), "gpu001".into()]);
    accepts::<ExporterOptions>("exporter", &args);
}

/// The items of the first YAML list under `key:` (one level, `- item` lines).
fn yaml_list(yaml: &str, key: &str) -> Vec<String> {
    let mut lines = yaml
        .lines()
        .skip_while(|l| l.trim() != format!("{key}:"))
        .skip(1);
    let mut out = Vec::new();
    for l in lines.by_ref() {
        let Some(item) = l.trim().strip_prefix("- ") else {
            break;
        };
        out.push(item.trim_matches('"').to_owned());
    }
    out
}

const IMAGE: &str = "ghcr.io/gpuledger/gpuledger:0.1.0";

#[test]
fn the_kubernetes_manifests_name_the_dockerfiles_image_and_pass_accepted_arguments() {
    let dockerfile = include_str!("../../Dockerfile");
    assert!(dockerfile.contains(&format!("docker build -t {IMAGE} .")));
    let workspace = include_str!("../../Cargo.toml");
    for package in ["gpuledger", "gpuledger-exporter"] {
        assert!(dockerfile.contains(&format!("-p {package}")));
        assert!(
            dockerfile.contains(&format!("target/release/{package} "))
                || dockerfile.contains(&format!("target/release/{package}\n")),
            "the image holds {package}"
        );
        let manifest = if package == "gpuledger" {
            include_str!("../Cargo.toml")
        } else {
            include_str!("../../exporter/Cargo.toml")
        };
        assert!(
            manifest.contains(&format!("name = \"{package}\"")),
            "{package}"
        );
    }
    assert!(workspace.contains("\"exporter\"") && workspace.contains("\"cli\""));
    for (name, yaml) in [
        (
            "exporter",
            include_str!("../../deploy/kubernetes/exporter-daemonset.yaml"),
        ),
        (
            "aggregator",
            include_str!("../../deploy/kubernetes/aggregator.yaml"),
        ),
        (
            "scheduler",
            include_str!("../../deploy/kubernetes/scheduler.yaml"),
        ),
    ] {
        assert!(yaml.contains(&format!("image: {IMAGE}\n")), "{name}");
        let command = yaml_list(yaml, "command");
        let binary = command.first().expect("a command");
        assert!(
            binary == "/usr/local/bin/gpuledger" || binary == "/usr/local/bin/gpuledger-exporter",
            "{name}: {binary} is in the image"
        );
        let mut args = yaml_list(yaml, "args");
        match name {
            "exporter" => {
                args.extend(["--node".into(), "gpu001".into()]);
                accepts::<ExporterOptions>("exporter", &args);
            }
            "aggregator" => {
                assert_eq!(command[1..], ["aggregator"]);
                accepts::<AggregatorOptions>("aggregator", &args);
            }
            _ => {
                assert_eq!(command[1..], ["scheduler", "serve"]);
                accepts::<SchedulerOptions>("scheduler serve", &args);
            }
        }
        // Every file an argument names is on a mounted volume.
        let mounts: Vec<&str> = yaml
            .lines()
            .filter_map(|l| l.trim().strip_prefix("mountPath: "))
            .collect();
        for path in args.iter().filter(|a| a.starts_with('/')) {
            let path = path.split("$(").next().unwrap();
            assert!(
                mounts.iter().any(|m| path.starts_with(m)),
                "{name}: {path} is on no volume ({mounts:?})"
            );
        }
        assert!(
            yaml.contains("path: /healthz") && yaml.contains("path: /readyz"),
            "{name}"
        );
    }
}
