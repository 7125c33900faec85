//! Job traces: the Philly format of `../shared/data` (`timestamp,duration,num_gpus,gpu_time,
//! cluster`, the cluster column being the tenant) and its VC-size file (`vc,node num`);
//! Alibaba's 2023 GPU-sharing pod list (`num_gpu,gpu_milli,...`, [`parse_alibaba`]); and
//! gpuledger's own job format ([`parse_jobs`]). Parsing is pure: the caller reads the files.
//! Every error names the line and the field.

use std::collections::BTreeMap;

use chrono::NaiveDateTime;

use gpuledger_model::job::Outcome;
use gpuledger_model::units::MAX_DURATION_S;
use gpuledger_model::{AccountId, GpuShare, JobId, ProjectId};

use crate::core::JobSpec;
use crate::sim::SimJob;

mod alibaba;
pub use alibaba::{
    is_alibaba_header, parse_alibaba, parse_alibaba_nodes, AlibabaNodes, AlibabaTrace, GpuSpec,
};

/// Why a trace line was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}:{line}: `{field}`: {message}")]
pub struct TraceError {
    pub origin: String,
    pub line: usize,
    pub field: String,
    pub message: String,
}

/// How a job's time limit is estimated from its true run time (traces have no limits, and
/// backfill needs them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitEstimate {
    /// The true run time: a perfect user.
    Exact,
    /// The run time rounded up to the next whole hour, as users ask for round limits.
    NextHour,
    /// Twice the run time, rounded up to the next hour: a careless user.
    Double,
}

impl LimitEstimate {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "exact" => Some(LimitEstimate::Exact),
            "hour" => Some(LimitEstimate::NextHour),
            "double" => Some(LimitEstimate::Double),
            _ => None,
        }
    }

    pub fn limit_s(self, run_time_s: u64) -> u64 {
        match self {
            LimitEstimate::Exact => run_time_s.max(1),
            LimitEstimate::NextHour => crate::workload::round_up_to_hour(run_time_s),
            LimitEstimate::Double => crate::workload::round_up_to_hour(run_time_s * 2),
        }
    }
}

/// Errors of line `line` of `origin`: `err(field, message)`.
fn error_at(origin: &str, line: usize) -> impl Fn(&str, String) -> TraceError + '_ {
    move |field, message| TraceError {
        origin: origin.to_owned(),
        line,
        field: field.to_owned(),
        message,
    }
}

/// The latest submission a trace may hold (9999-12-31T23:59:59Z, as far as RFC 3339 goes):
/// the simulator's clock adds run times and limits to it.
pub(crate) const LATEST_SUBMIT_S: i64 = 253_402_300_799;

/// A submission time within 1970 to [`LATEST_SUBMIT_S`].
pub(crate) fn submit_in_range(
    err: &dyn Fn(&str, String) -> TraceError,
    field: &str,
    submit: i64,
) -> Result<i64, TraceError> {
    if (0..=LATEST_SUBMIT_S).contains(&submit) {
        Ok(submit)
    } else {
        Err(err(
            field,
            format!("{submit} is not a time from 1970 to the year 9999"),
        ))
    }
}

/// A duration of at most [`MAX_DURATION_S`] (100 years): longer ones would overflow the
/// simulator's time arithmetic.
pub(crate) fn seconds_in_range(
    err: &dyn Fn(&str, String) -> TraceError,
    field: &str,
    seconds: u64,
) -> Result<u64, TraceError> {
    if seconds <= MAX_DURATION_S {
        Ok(seconds)
    } else {
        Err(err(
            field,
            format!("{seconds} s is more than 100 years ({MAX_DURATION_S} s)"),
        ))
    }
}

/// The non-empty lines after the header, numbered from 2, split into trimmed cells.
fn data_rows<'a>(
    lines: impl Iterator<Item = &'a str>,
) -> impl Iterator<Item = (usize, Vec<&'a str>)> {
    lines
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(n, line)| (n + 2, line.split(',').map(str::trim).collect()))
}

fn header_index(origin: &str, header: &str, wanted: &[&str]) -> Result<Vec<usize>, TraceError> {
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    wanted
        .iter()
        .map(|w| {
            cols.iter().position(|c| c == w).ok_or_else(|| TraceError {
                origin: origin.to_owned(),
                line: 1,
                field: (*w).to_owned(),
                message: format!("column missing from the header `{header}`"),
            })
        })
        .collect()
}

/// Tenant id of a Philly VC hash (`vc-7f04ca`).
pub fn vc_account(vc: &str) -> Result<AccountId, gpuledger_model::IdError> {
    AccountId::new(format!("vc-{vc}"))
}

/// Reads a Philly trace into jobs (all completing; the trace has no outcomes).
pub fn parse_philly(
    text: &str,
    origin: &str,
    estimate: LimitEstimate,
) -> Result<Vec<SimJob>, TraceError> {
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    let idx = header_index(
        origin,
        header,
        &["timestamp", "duration", "num_gpus", "cluster"],
    )?;
    let mut jobs = Vec::new();
    for (line_no, cells) in data_rows(lines) {
        let err = error_at(origin, line_no);
        let cell = |i: usize, field: &str| {
            cells
                .get(idx[i])
                .copied()
                .ok_or_else(|| err(field, "missing".into()))
        };
        let ts = cell(0, "timestamp")?;
        let submit = NaiveDateTime::parse_from_str(ts, "%Y-%m-%d %H:%M:%S")
            .map_err(|e| {
                err(
                    "timestamp",
                    format!("`{ts}` is not YYYY-MM-DD HH:MM:SS: {e}"),
                )
            })?
            .and_utc()
            .timestamp();
        let submit = submit_in_range(&err, "timestamp", submit)?;
        let dur = cell(1, "duration")?;
        let duration: f64 = dur
            .parse()
            .map_err(|_| err("duration", format!("`{dur}` is not a number of seconds")))?;
        if !duration.is_finite() || duration < 0.0 {
            return Err(err(
                "duration",
                format!("`{dur}` is not a non-negative number of seconds"),
            ));
        }
        if duration > MAX_DURATION_S as f64 {
            return Err(err(
                "duration",
                format!("`{dur}` s is more than 100 years ({MAX_DURATION_S} s)"),
            ));
        }
        let g = cell(2, "num_gpus")?;
        let gpus: u32 = g
            .parse()
            .map_err(|_| err("num_gpus", format!("`{g}` is not a whole number")))?;
        let vc = cell(3, "cluster")?;
        let account = vc_account(vc).map_err(|e| err("cluster", e.to_string()))?;
        let run_time_s = (duration.ceil() as u64).max(1);
        let id = JobId::new(format!("p{:06}", jobs.len() + 1))
            .map_err(|e| err("timestamp", e.to_string()))?;
        jobs.push(SimJob {
            spec: JobSpec::new(id, account, gpus, estimate.limit_s(run_time_s), submit),
            run_time_s,
            outcome: Outcome::Completed,
            checkpoint_save_s: None,
        });
    }
    Ok(jobs)
}

/// Reads the VC-size file: nodes per VC, used as fair-share weights.
pub fn parse_vc_nodes(text: &str, origin: &str) -> Result<BTreeMap<String, u32>, TraceError> {
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    let idx = header_index(origin, header, &["vc", "node num"])?;
    let mut out = BTreeMap::new();
    for (n, line) in lines.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        let vc = cells.get(idx[0]).copied().unwrap_or_default();
        let nodes = cells.get(idx[1]).copied().unwrap_or_default();
        let nodes: u32 = nodes.parse().map_err(|_| TraceError {
            origin: origin.to_owned(),
            line: n + 2,
            field: "node num".into(),
            message: format!("`{nodes}` is not a whole number"),
        })?;
        out.insert(vc.to_owned(), nodes);
    }
    Ok(out)
}

/// The columns of gpuledger's own job format; the first four are required.
pub const JOB_COLUMNS: [&str; 18] = [
    "submit",
    "account",
    "gpus",
    "run_time_s",
    "job_id",
    "project",
    "partition",
    "min_gpus",
    "time_limit_s",
    "grace_s",
    "checkpoint_every_s",
    "checkpoint_save_s",
    "outcome",
    "gpus_per_node",
    "nodes",
    "gpu_types",
    "gpu_models",
    "gpu_share",
];

/// A job's `gpu_types` cell (or `gpu_models`, its older name; not both): types joined by `|`.
fn gpu_types<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
    err: &impl Fn(&str, String) -> TraceError,
) -> Result<Vec<gpuledger_model::GpuType>, TraceError> {
    let (field, cell) = match (get("gpu_types"), get("gpu_models")) {
        (Some(_), Some(_)) => {
            return Err(err(
                "gpu_models",
                "the older name of `gpu_types`, given beside it; give one".into(),
            ))
        }
        (Some(cell), None) => ("gpu_types", cell),
        (None, Some(cell)) => ("gpu_models", cell),
        (None, None) => return Ok(Vec::new()),
    };
    cell.split('|')
        .map(|t| gpuledger_model::GpuType::new(t).map_err(|e| err(field, e.to_string())))
        .collect()
}

/// Reads gpuledger's own job format: a CSV with a header naming any of [`JOB_COLUMNS`] in any
/// order (`submit,account,gpus,run_time_s` required). `submit` is seconds since the epoch or
/// RFC 3339; `time_limit_s` defaults to the run time rounded up to the hour; `outcome` is
/// `completed` (default) or `failed`; `gpus_per_node`, `nodes` and `gpu_types` (GPU types joined
/// by `|`, e.g. `h100-sxm|h200`; `gpu_models`, its older name, is read the same) and `gpu_share` (a part of one GPU, `250m` or a MIG profile
/// `3g`, with `gpus` 1) are the job's [`crate::cluster::Shape`]; empty cells take the default.
pub fn parse_jobs(text: &str, origin: &str) -> Result<Vec<SimJob>, TraceError> {
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    let head_err = error_at(origin, 1);
    if let Some(unknown) = cols.iter().find(|c| !JOB_COLUMNS.contains(c)) {
        return Err(head_err(
            unknown,
            format!("unknown column; known: {}", JOB_COLUMNS.join(", ")),
        ));
    }
    header_index(origin, header, &JOB_COLUMNS[..4])?;
    let mut jobs = Vec::new();
    for (n, line) in lines.enumerate() {
        let line_no = n + 2;
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        let err = error_at(origin, line_no);
        let get = |name: &str| -> Option<&str> {
            cols.iter()
                .position(|c| *c == name)
                .and_then(|i| cells.get(i).copied())
                .filter(|v| !v.is_empty())
        };
        let required = |name: &str| get(name).ok_or_else(|| err(name, "missing".into()));
        let number = |name: &str| -> Result<Option<u64>, TraceError> {
            get(name)
                .map(|v| {
                    v.parse::<u64>()
                        .map_err(|_| err(name, format!("`{v}` is not a whole number")))
                })
                .transpose()
        };
        let seconds = |name: &str| -> Result<Option<u64>, TraceError> {
            number(name)?
                .map(|v| seconds_in_range(&err, name, v))
                .transpose()
        };
        let submit_text = required("submit")?;
        let submit = match submit_text.parse::<i64>() {
            Ok(s) => s,
            Err(_) => chrono::DateTime::parse_from_rfc3339(submit_text)
                .map_err(|e| {
                    err(
                        "submit",
                        format!("`{submit_text}` is neither epoch seconds nor RFC 3339: {e}"),
                    )
                })?
                .timestamp(),
        };
        let submit = submit_in_range(&err, "submit", submit)?;
        let account_text = required("account")?;
        let account = AccountId::new(account_text).map_err(|e| err("account", e.to_string()))?;
        let gpus = number("gpus")?.ok_or_else(|| err("gpus", "missing".into()))?;
        let gpus = u32::try_from(gpus).map_err(|_| err("gpus", format!("{gpus} is too large")))?;
        let run_time_s =
            seconds("run_time_s")?.ok_or_else(|| err("run_time_s", "missing".into()))?;
        let id = match get("job_id") {
            Some(v) => JobId::new(v).map_err(|e| err("job_id", e.to_string()))?,
            None => JobId::new(format!("j{:06}", jobs.len() + 1))
                .map_err(|e| err("job_id", e.to_string()))?,
        };
        let mut spec = JobSpec::new(
            id,
            account,
            gpus,
            seconds("time_limit_s")?
                .unwrap_or_else(|| crate::workload::round_up_to_hour(run_time_s)),
            submit,
        );
        spec.project = get("project")
            .map(|v| ProjectId::new(v).map_err(|e| err("project", e.to_string())))
            .transpose()?;
        spec.partition = get("partition").map(str::to_owned);
        let small = |name: &str| -> Result<Option<u32>, TraceError> {
            number(name)?
                .map(|v| u32::try_from(v).map_err(|_| err(name, format!("{v} is too large"))))
                .transpose()
        };
        spec.min_gpus = small("min_gpus")?;
        spec.grace_s = seconds("grace_s")?;
        spec.checkpoint_every_s = seconds("checkpoint_every_s")?;
        spec.shape = crate::cluster::Shape {
            gpus_per_node: small("gpus_per_node")?,
            max_nodes: small("nodes")?,
            gpu_types: gpu_types(&get, &err)?,
            gpu_share: get("gpu_share")
                .map(|v| {
                    v.parse::<GpuShare>()
                        .map_err(|e| err("gpu_share", e.to_string()))
                })
                .transpose()?,
        };
        let outcome = match get("outcome") {
            None | Some("completed") => Outcome::Completed,
            Some("failed") => Outcome::Failed,
            Some(other) => {
                return Err(err(
                    "outcome",
                    format!("`{other}` is not `completed` or `failed`"),
                ))
            }
        };
        jobs.push(SimJob {
            spec,
            run_time_s,
            outcome,
            checkpoint_save_s: seconds("checkpoint_save_s")?,
        });
    }
    Ok(jobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_philly_lines() {
        let text = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-09-04 10:30:41,2240194.0,8,17921552.0,7f04ca\n";
        let jobs = parse_philly(text, "t.csv", LimitEstimate::NextHour).unwrap();
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].spec.account.as_str(), "vc-7f04ca");
        assert_eq!(jobs[0].run_time_s, 2_240_194);
        assert_eq!(jobs[0].spec.time_limit_s, 2_242_800);
    }

    #[test]
    fn times_past_what_the_simulator_counts_are_refused_naming_line_and_field() {
        let philly = |row: &str| {
            parse_philly(
                &format!("timestamp,duration,num_gpus,gpu_time,cluster\n{row}\n"),
                "t.csv",
                LimitEstimate::NextHour,
            )
            .unwrap_err()
            .to_string()
        };
        let own = |row: &str| {
            parse_jobs(
                &format!("submit,account,gpus,run_time_s,time_limit_s,min_gpus\n{row}\n"),
                "j.csv",
            )
            .unwrap_err()
            .to_string()
        };
        for (err, says) in [
            (
                philly("2017-09-04 10:30:41,1e300,8,1,7f04ca"),
                "t.csv:2: `duration`: `1e300` s is more than 100 years",
            ),
            (
                own("1780272000,team-a,1,18446744073709551615,,"),
                "j.csv:2: `run_time_s`: 18446744073709551615 s is more than 100 years",
            ),
            (
                own("1780272000,team-a,1,60,3153600001,"),
                "j.csv:2: `time_limit_s`: 3153600001 s is more than 100 years",
            ),
            (
                own("9223372036854775807,team-a,1,60,,"),
                "j.csv:2: `submit`: 9223372036854775807 is not a time from 1970",
            ),
            (
                own("-5,team-a,1,60,,"),
                "j.csv:2: `submit`: -5 is not a time from 1970",
            ),
            (
                own("1780272000,team-a,8,60,,4294967297"),
                "j.csv:2: `min_gpus`: 4294967297 is too large",
            ),
        ] {
            assert!(err.starts_with(says), "{err}");
        }
    }

    #[test]
    fn reads_the_own_job_format() {
        let text = "submit,account,gpus,run_time_s,partition,min_gpus,checkpoint_every_s,job_id\n\
                    1780272000,team-a,32,7200,urgent,,600,x1\n\
                    2026-06-01T01:00:00Z,team-b,64,100,,16,,\n";
        let jobs = parse_jobs(text, "j.csv").unwrap();
        assert_eq!(jobs[0].spec.id.as_str(), "x1");
        assert_eq!(jobs[0].spec.partition.as_deref(), Some("urgent"));
        assert_eq!(jobs[0].spec.checkpoint_every_s, Some(600));
        assert_eq!(jobs[0].spec.time_limit_s, 7200);
        assert_eq!(jobs[1].spec.submit_s, 1_780_275_600);
        assert_eq!(jobs[1].spec.min_gpus, Some(16));
        assert_eq!(jobs[1].spec.time_limit_s, 3600);
        assert_eq!(jobs[1].spec.id.as_str(), "j000002");
        assert_eq!(jobs[1].spec.shape, crate::cluster::Shape::default());
    }

    #[test]
    fn the_own_job_format_carries_a_shape() {
        use gpuledger_model::GpuModel;
        let text = "submit,account,gpus,run_time_s,gpus_per_node,nodes,gpu_models,gpu_share
                    0,team-a,16,60,4,4,h100-sxm|h200,
                    0,team-a,2,60,,,a100,
                    0,team-a,1,60,,,,3g.40gb
";
        let jobs = parse_jobs(text, "j.csv").unwrap();
        assert_eq!(
            jobs[0].spec.shape,
            crate::cluster::Shape {
                gpus_per_node: Some(4),
                max_nodes: Some(4),
                gpu_types: vec![GpuModel::H100Sxm.into(), GpuModel::H200.into()],
                gpu_share: None,
            }
        );
        assert_eq!(jobs[1].spec.shape.gpu_types, [GpuModel::A100.into()]);
        assert_eq!(jobs[2].spec.shape.gpu_share, Some(GpuShare::Mig(3)));
        let err = parse_jobs(
            "submit,account,gpus,run_time_s,gpu_share\n0,a,1,1,1200m\n",
            "j.csv",
        )
        .unwrap_err();
        assert_eq!((err.line, err.field.as_str()), (2, "gpu_share"));
        let err = parse_jobs(
            "submit,account,gpus,run_time_s,gpu_models
0,a,1,1,h100|b:300
",
            "j.csv",
        )
        .unwrap_err();
        assert_eq!((err.line, err.field.as_str()), (2, "gpu_models"));
        assert!(err.message.contains("b:300"), "{}", err.message);
        // The newer column name, and a type a site names itself.
        let jobs = parse_jobs(
            "submit,account,gpus,run_time_s,gpu_types\n0,a,1,1,a100_80g|H100\n",
            "j.csv",
        )
        .unwrap();
        let types: Vec<String> = jobs[0]
            .spec
            .shape
            .gpu_types
            .iter()
            .map(|t| t.to_string())
            .collect();
        assert_eq!(types, ["a100_80g", "h100-sxm"]);
        let err = parse_jobs(
            "submit,account,gpus,run_time_s,gpu_types,gpu_models\n0,a,1,1,a100,h200\n",
            "j.csv",
        )
        .unwrap_err();
        assert_eq!((err.line, err.field.as_str()), (2, "gpu_models"));
    }

    #[test]
    fn bad_lines_name_line_and_field() {
        let text = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-09-04 10:30:41,12,x,1,a\n";
        let err = parse_philly(text, "t.csv", LimitEstimate::Exact).unwrap_err();
        assert_eq!(
            err.to_string(),
            "t.csv:2: `num_gpus`: `x` is not a whole number"
        );
        let err = parse_jobs("submit,account,gpus,run_time_s,colour\n", "j.csv").unwrap_err();
        assert_eq!(err.field, "colour");
        let err = parse_jobs(
            "submit,account,gpus,run_time_s\n2026-06-01T00:00:00Z,a,8,3600\nyesterday,a,8,1\n",
            "j.csv",
        )
        .unwrap_err();
        assert_eq!((err.line, err.field.as_str()), (3, "submit"));
        let err = parse_vc_nodes("vc,node num\nab,many\n", "vc.csv").unwrap_err();
        assert_eq!(err.line, 2);
        assert_eq!(err.field, "node num");
    }
}
