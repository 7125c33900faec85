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
