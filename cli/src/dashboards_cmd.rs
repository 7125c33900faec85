//! `gpuledger dashboards`: the Grafana dashboards (`gpuledger-dashboards`) written out,
//! checked against a running Prometheus (every panel's queries must return data), or previewed
//! as HTML without Grafana.

use std::path::PathBuf;

use anyhow::{bail, Context};
use gpuledger_dashboards::{load, preview_page, problems, run_dashboard, Prometheus, QueryArgs};

#[derive(clap::Subcommand, Debug)]
pub enum DashboardsCommand {
    /// Write the Grafana dashboards (JSON) and their provisioning files to a directory.
    Export {
        #[arg(long)]
        out: PathBuf,
    },
    /// Run every panel's queries against a Prometheus; fail when one returns no data.
    Check(QueryArgs),
    /// Write an HTML page per dashboard with each panel's queries and what they returned.
    Preview {
        #[command(flatten)]
        query: QueryArgs,
        #[arg(long)]
        out: PathBuf,
    },
}

fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

pub fn run(command: DashboardsCommand) -> anyhow::Result<()> {
    match command {
        DashboardsCommand::Export { out } => {
            for path in gpuledger_dashboards::export(&out)? {
                println!("{}", path.display());
            }
            Ok(())
        }
        DashboardsCommand::Check(args) => {
            let prom = Prometheus::new(&args.prometheus);
            let known = prom.known_names()?;
            let now = now_s();
            let mut all = Vec::new();
            let mut queries = 0;
            for d in load(args.dir.as_deref())? {
                let results = run_dashboard(&prom, &d, &args, now)?;
                for r in &results {
                    for (t, q) in &r.results {
                        queries += 1;
                        println!(
                            "{:<14} {:<48} {:<2} {:>4} series {:>6} points",
                            d.file,
                            truncate(&r.panel.title, 48),
                            t.ref_id,
                            q.series.len(),
                            q.finite_points()
                        );
                    }
                }
                all.extend(problems(&d, &results, &known));
            }
            if !all.is_empty() {
                bail!(
                    "{} of {queries} queries have problems:\n{}",
                    all.len(),
                    all.join("\n")
                );
            }
            println!("all {queries} queries returned data");
            Ok(())
        }
        DashboardsCommand::Preview { query, out } => {
            let prom = Prometheus::new(&query.prometheus);
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            let now = now_s();
            for d in load(query.dir.as_deref())? {
                let results = run_dashboard(&prom, &d, &query, now)?;
                let page = preview_page(&d, &results, now);
                let path = out.join(format!("{}.html", d.uid));
                std::fs::write(&path, page)
                    .with_context(|| format!("writing {}", path.display()))?;
                println!("{}", path.display());
            }
            Ok(())
        }
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        s.chars().take(n - 1).collect::<String>() + "…"
    }
}
