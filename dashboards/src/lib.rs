//! The Grafana dashboards of `grafana/` beside this crate (built into the binary), their model
//! (panels, queries, variables), a small Prometheus client, and what `gpuledger dashboards` does
//! with them:
//!
//! - [`export`] writes the dashboards and their provisioning files;
//! - [`run_dashboard`] runs every query of every panel (variables resolved as Grafana would:
//!   `label_values(...)` asked of Prometheus, `$__range`, `$__rate_interval`), and [`problems`]
//!   names a query that returns no data or a metric Prometheus has never seen;
//! - [`preview_page`] draws one HTML page per dashboard: each panel with its queries and a chart
//!   or table of what they returned.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use gpuledger_charts::{self as svg, Series};
use maud::{html, Markup, DOCTYPE};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A dashboard file that is not what Grafana reads.
    #[error("{0}")]
    Invalid(String),
    /// Prometheus did not answer, or answered with an error.
    #[error("{0}")]
    Prometheus(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }
}

/// The Prometheus recording and alerting rules, as shipped (`prometheus/gpuledger-rules.yml`;
/// their selectors name the scrape jobs `gpuledger-exporter`, `gpuledger-aggregator` and
/// `gpuledger-scheduler`).
pub const PROMETHEUS_RULES: &str = include_str!("../prometheus/gpuledger-rules.yml");

/// The dashboards and provisioning files, as shipped.
pub const EMBEDDED: [(&str, &str); 6] = [
    ("cluster.json", include_str!("../grafana/cluster.json")),
    ("tenants.json", include_str!("../grafana/tenants.json")),
    ("jobs.json", include_str!("../grafana/jobs.json")),
    ("nodes.json", include_str!("../grafana/nodes.json")),
    (
        "provisioning/datasources/gpuledger.yaml",
        include_str!("../grafana/provisioning/datasources/gpuledger.yaml"),
    ),
    (
        "provisioning/dashboards/gpuledger.yaml",
        include_str!("../grafana/provisioning/dashboards/gpuledger.yaml"),
    ),
];

#[derive(clap::Args, Debug, Clone)]
pub struct QueryArgs {
    /// The Prometheus to ask, e.g. http://localhost:9090.
    #[arg(long)]
    pub prometheus: String,
    /// Dashboards to read instead of the built-in ones (a directory of Grafana JSON files).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// A variable's value, NAME=VALUE (repeat); others take "All".
    #[arg(long = "var", value_parser = parse_var)]
    pub vars: Vec<(String, String)>,
    /// The dashboards' time range, ending now (`$__range`).
    #[arg(long, default_value = "1h")]
    pub range: gpuledger_model::units::DurationSpec,
    /// Prometheus's scrape interval, from which `$__rate_interval` follows (4 x it).
    #[arg(long, default_value = "15s")]
    pub scrape_interval: gpuledger_model::units::DurationSpec,
}

fn parse_var(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.to_owned()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("`{text}`: expected NAME=VALUE"))
}

/// One query of a panel.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub ref_id: String,
    pub expr: String,
    pub instant: bool,
    pub legend: String,
}

/// One panel and its queries.
#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    pub id: u64,
    pub title: String,
    pub kind: String,
    pub description: String,
    /// A relative time override such as `now/M` (the month so far).
    pub time_from: Option<String>,
    pub targets: Vec<Target>,
}

/// A template variable.
#[derive(Clone, Debug, PartialEq)]
pub struct Variable {
    pub name: String,
    pub query: Option<String>,
    pub all_value: Option<String>,
}

/// A dashboard as far as its queries go.
#[derive(Clone, Debug, PartialEq)]
pub struct Dashboard {
    pub file: String,
    pub uid: String,
    pub title: String,
    pub description: String,
    pub panels: Vec<Panel>,
    pub variables: Vec<Variable>,
}

fn text(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_owned()
}

fn collect_panels(list: &[Value], out: &mut Vec<Panel>) {
    for p in list {
        if let Some(inner) = p.get("panels").and_then(Value::as_array) {
            collect_panels(inner, out);
        }
        let targets: Vec<Target> = p
            .get("targets")
            .and_then(Value::as_array)
            .map(|ts| {
                ts.iter()
                    .filter(|t| t.get("expr").is_some())
                    .map(|t| Target {
                        ref_id: text(t, "refId"),
                        expr: text(t, "expr"),
                        instant: t.get("instant").and_then(Value::as_bool) == Some(true),
                        legend: text(t, "legendFormat"),
                    })
                    .collect()
            })
            .unwrap_or_default();
        if p.get("type").and_then(Value::as_str) == Some("row") && targets.is_empty() {
            continue;
        }
        out.push(Panel {
            id: p.get("id").and_then(Value::as_u64).unwrap_or(0),
            title: text(p, "title"),
            kind: text(p, "type"),
            description: text(p, "description"),
            time_from: p.get("timeFrom").and_then(Value::as_str).map(str::to_owned),
            targets,
        });
    }
}

impl Dashboard {
    /// Reads a Grafana dashboard's JSON.
    pub fn parse(file: &str, json: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(json)
            .map_err(|e| Error::Invalid(format!("{file}: not JSON: {e}")))?;
        let mut panels = Vec::new();
        collect_panels(
            v.get("panels")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or(&[]),
            &mut panels,
        );
        let variables = v
            .pointer("/templating/list")
            .and_then(Value::as_array)
            .map(|vars| {
                vars.iter()
                    .filter(|x| x.get("type").and_then(Value::as_str) == Some("query"))
                    .map(|x| Variable {
                        name: text(x, "name"),
                        query: x
                            .get("definition")
                            .and_then(Value::as_str)
                            .or_else(|| x.pointer("/query/query").and_then(Value::as_str))
                            .map(str::to_owned),
                        all_value: x.get("allValue").and_then(Value::as_str).map(str::to_owned),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Dashboard {
            file: file.to_owned(),
            uid: text(&v, "uid"),
            title: text(&v, "title"),
            description: text(&v, "description"),
            panels,
            variables,
        })
    }
}

/// The dashboards in `dir`, or the built-in ones.
pub fn load(dir: Option<&Path>) -> Result<Vec<Dashboard>> {
    let mut out = Vec::new();
    match dir {
        None => {
            for (name, json) in EMBEDDED.iter().filter(|(n, _)| n.ends_with(".json")) {
                out.push(Dashboard::parse(name, json)?);
            }
        }
        Some(dir) => {
            let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(Error::io(dir))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect();
            files.sort();
            for f in files {
                let json = std::fs::read_to_string(&f).map_err(Error::io(&f))?;
                out.push(Dashboard::parse(&f.display().to_string(), &json)?);
            }
        }
    }
    Ok(out)
}

/// The metric and recording-rule names an expression reads (those gpuledger and
/// dcgm-exporter name: `gpuledger_*`, `gpuledger:*`, `DCGM_*`), quoted strings skipped.
pub fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut chars = expr.char_indices().peekable();
    let mut word = String::new();
    let flush = |word: &mut String, names: &mut Vec<String>| {
        if (word.starts_with("gpuledger_")
            || word.starts_with("gpuledger:")
            || word.starts_with("DCGM_"))
            && !names.contains(word)
        {
            names.push(word.clone());
        }
        word.clear();
    };
    while let Some((_, c)) = chars.next() {
        if c == '"' {
            flush(&mut word, &mut names);
            while let Some((_, d)) = chars.next() {
                match d {
                    '\\' => {
                        chars.next();
                    }
                    '"' => break,
                    _ => {}
                }
            }
        } else if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
        } else {
            flush(&mut word, &mut names);
        }
    }
    flush(&mut word, &mut names);
    names
}

/// Replaces Grafana's variables in an expression: `$name` / `${name}` from `values`, and the
/// built-ins `$__range`, `$__rate_interval`, `$__interval`.
pub fn substitute(
    expr: &str,
    values: &BTreeMap<String, String>,
    range_s: u64,
    rate_s: u64,
) -> String {
    let mut out = expr
        .replace("$__range", &format!("{range_s}s"))
        .replace("$__rate_interval", &format!("{rate_s}s"))
        .replace("$__interval", &format!("{}s", (range_s / 200).max(1)));
    let mut names: Vec<&String> = values.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for name in names {
        out = out
            .replace(&format!("${{{name}}}"), &values[name])
            .replace(&format!("${name}"), &values[name]);
    }
    out
}

/// A Prometheus HTTP API client, just enough for the dashboards.
#[derive(Debug)]
pub struct Prometheus {
    base: String,
    agent: ureq::Agent,
}

/// What one query returned.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueryResult {
    pub expr: String,
    pub series: Vec<(String, Vec<(f64, f64)>)>,
    pub error: Option<String>,
}

impl QueryResult {
    pub fn finite_points(&self) -> usize {
        self.series
            .iter()
            .map(|(_, pts)| pts.iter().filter(|p| p.1.is_finite()).count())
            .sum()
    }
}

fn labels_text(metric: &Value) -> String {
    metric
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| k.as_str() != "__name__")
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

/// A series' name as Grafana's legend format writes it: `{{label}}` replaced by the label's
/// value (the labels come as `k=v,k=v`); `__auto` or nothing keeps the labels.
pub fn legend_name(format: &str, labels: &str) -> String {
    if format.is_empty() || format == "__auto" {
        return labels.to_owned();
    }
    let mut out = format.to_owned();
    for pair in labels.split(',') {
        if let Some((k, v)) = pair.split_once('=') {
            out = out.replace(&format!("{{{{{k}}}}}"), v);
        }
    }
    out
}

fn sample_value(pair: &Value) -> Option<(f64, f64)> {
    let t = pair.get(0)?.as_f64()?;
    let v = pair.get(1)?.as_str()?.parse::<f64>().ok()?;
    Some((t, v))
}

impl Prometheus {
    pub fn new(base: &str) -> Self {
        Prometheus {
            base: base.trim_end_matches('/').to_owned(),
            agent: ureq::Agent::config_builder()
                .timeout_global(Some(std::time::Duration::from_secs(30)))
                .http_status_as_error(false)
                .build()
                .into(),
        }
    }

    fn get(&self, path: &str, params: &[(&str, String)]) -> Result<Value> {
        let mut request = self.agent.get(format!("{}{path}", self.base));
        for (k, v) in params {
            request = request.query(*k, v);
        }
        let asking = || format!("asking {}{path}", self.base);
        let mut response = request
            .call()
            .map_err(|e| Error::Prometheus(format!("{}: {e}", asking())))?;
        let body = response
            .body_mut()
            .read_to_string()
            .map_err(|e| Error::Prometheus(format!("{}: {e}", asking())))?;
        let v: Value = serde_json::from_str(&body).map_err(|e| {
            Error::Prometheus(format!("{}{path}: not JSON ({e}): {body}", self.base))
        })?;
        if v.get("status").and_then(Value::as_str) != Some("success") {
            return Err(Error::Prometheus(
                v.get("error")
                    .and_then(Value::as_str)
                    .unwrap_or(&body)
                    .to_owned(),
            ));
        }
        Ok(v)
    }

    /// Values of a label, optionally only on series matching `selector`.
    pub fn label_values(&self, label: &str, selector: Option<&str>) -> Result<Vec<String>> {
        let params: Vec<(&str, String)> = selector
            .map(|s| vec![("match[]", s.to_owned())])
            .unwrap_or_default();
        let v = self.get(&format!("/api/v1/label/{label}/values"), &params)?;
        Ok(v["data"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Every metric name Prometheus knows: those with series, and the families its targets
    /// declared (`# TYPE`) even without a sample yet (a counter of XID errors on a healthy
    /// cluster).
    pub fn known_names(&self) -> Result<Vec<String>> {
        let mut names = self.label_values("__name__", None)?;
        let metadata = self.get("/api/v1/metadata", &[])?;
        if let Some(families) = metadata["data"].as_object() {
            names.extend(families.keys().cloned());
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Runs `expr` at `end_s` (instant) or over `[end_s - range_s, end_s]`.
    pub fn query(&self, expr: &str, instant: bool, end_s: f64, range_s: u64) -> QueryResult {
        let result = if instant {
            self.get(
                "/api/v1/query",
                &[("query", expr.to_owned()), ("time", format!("{end_s:.3}"))],
            )
        } else {
            let step = (range_s / 240).max(1);
            self.get(
                "/api/v1/query_range",
                &[
                    ("query", expr.to_owned()),
                    ("start", format!("{:.3}", end_s - range_s as f64)),
                    ("end", format!("{end_s:.3}")),
                    ("step", format!("{step}")),
                ],
            )
        };
        let mut out = QueryResult {
            expr: expr.to_owned(),
            ..QueryResult::default()
        };
        match result {
            Err(e) => out.error = Some(format!("{e:#}")),
            Ok(v) => {
                for s in v["data"]["result"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or(&[])
                {
                    let name = labels_text(&s["metric"]);
                    let points: Vec<(f64, f64)> = match s.get("values") {
                        Some(vals) => vals
                            .as_array()
                            .map(|a| a.iter().filter_map(sample_value).collect())
                            .unwrap_or_default(),
                        None => s.get("value").and_then(sample_value).into_iter().collect(),
                    };
                    out.series.push((name, points));
                }
                if let Some(scalar) = v["data"]["result"]
                    .as_array()
                    .is_none()
                    .then(|| sample_value(&v["data"]["result"]))
                    .flatten()
                {
                    out.series.push((String::new(), vec![scalar]));
                }
            }
        }
        out
    }
}

/// The value each variable takes: `--var`, else "All" (its `allValue`, or every value of its
/// `label_values(...)` query as a regex).
pub fn resolve_variables(
    prom: &Prometheus,
    dashboard: &Dashboard,
    given: &[(String, String)],
) -> Result<BTreeMap<String, String>> {
    let mut values = BTreeMap::new();
    for var in &dashboard.variables {
        if let Some((_, v)) = given.iter().find(|(k, _)| *k == var.name) {
            values.insert(var.name.clone(), v.clone());
            continue;
        }
        let options = match var.query.as_deref().and_then(parse_label_values) {
            Some((metric, label)) => prom.label_values(&label, metric.as_deref())?,
            None => Vec::new(),
        };
        let value = match &var.all_value {
            Some(all) => all.clone(),
            None => format!("({})", options.join("|")),
        };
        values.insert(var.name.clone(), value);
    }
    Ok(values)
}

/// `label_values(metric, label)` or `label_values(label)`.
fn parse_label_values(q: &str) -> Option<(Option<String>, String)> {
    let inner = q.trim().strip_prefix("label_values(")?.strip_suffix(')')?;
    match inner.rsplit_once(',') {
        Some((metric, label)) => Some((Some(metric.trim().to_owned()), label.trim().to_owned())),
        None => Some((None, inner.trim().to_owned())),
    }
}

/// One panel's queries and what each returned.
#[derive(Debug)]
pub struct PanelResult {
    pub panel: Panel,
    pub results: Vec<(Target, QueryResult)>,
    pub range_s: u64,
}

/// Seconds from the start of the UTC month of `now_s` to `now_s`.
fn month_so_far_s(now_s: f64) -> u64 {
    use chrono::Datelike;
    let now = chrono::DateTime::from_timestamp(now_s as i64, 0).unwrap_or_default();
    let start = now
        .date_naive()
        .with_day(1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|d| d.and_utc().timestamp())
        .unwrap_or(now.timestamp());
    (now.timestamp() - start).max(1) as u64
}

/// Runs every panel of `dashboard`.
pub fn run_dashboard(
    prom: &Prometheus,
    dashboard: &Dashboard,
    args: &QueryArgs,
    now_s: f64,
) -> Result<Vec<PanelResult>> {
    let values = resolve_variables(prom, dashboard, &args.vars)?;
    let scrape = args.scrape_interval.as_secs().max(1);
    let rate_s = (4 * scrape).max(args.range.as_secs() / 240 + scrape);
    let mut out = Vec::new();
    for panel in &dashboard.panels {
        let range_s = match panel.time_from.as_deref() {
            Some("now/M") => month_so_far_s(now_s),
            Some(other) => other
                .parse::<gpuledger_model::units::DurationSpec>()
                .map(|d| d.as_secs())
                .unwrap_or(args.range.as_secs()),
            None => args.range.as_secs(),
        }
        .max(1);
        let results = panel
            .targets
            .iter()
            .map(|t| {
                let expr = substitute(&t.expr, &values, range_s, rate_s);
                (t.clone(), prom.query(&expr, t.instant, now_s, range_s))
            })
            .collect();
        out.push(PanelResult {
            panel: panel.clone(),
            results,
            range_s,
        });
    }
    Ok(out)
}

/// Problems with one dashboard's results: queries without data, metrics Prometheus lacks.
pub fn problems(dashboard: &Dashboard, results: &[PanelResult], known: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for r in results {
        for (target, result) in &r.results {
            let at = format!("{} / {} / {}", dashboard.file, r.panel.title, target.ref_id);
            if let Some(e) = &result.error {
                out.push(format!("{at}: query failed: {e}\n    {}", result.expr));
            } else if result.finite_points() == 0 {
                out.push(format!("{at}: no data\n    {}", result.expr));
            }
            for name in metric_names(&target.expr) {
                // An OpenMetrics scrape declares a counter's family without `_total`.
                let declared = |n: &str| known.iter().any(|k| k == n);
                if !declared(&name) && !name.strip_suffix("_total").is_some_and(declared) {
                    out.push(format!("{at}: Prometheus has no series named `{name}`"));
                }
            }
        }
    }
    out
}

/// Writes the dashboards and their provisioning files under `out`; the paths written.
pub fn export(out: &Path) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for (name, body) in EMBEDDED {
        let path = out.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(Error::io(parent))?;
        }
        std::fs::write(&path, body).map_err(Error::io(&path))?;
        written.push(path);
    }
    Ok(written)
}

fn short_number(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    let a = v.abs();
    if a != 0.0 && !(0.001..1e6).contains(&a) {
        format!("{v:.3e}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

const PREVIEW_STYLE: &str = "body{font-family:sans-serif;margin:16px;background:#f4f5f7;color:#222}\
.grid{display:grid;grid-template-columns:repeat(2,1fr);gap:12px}\
.panel{background:white;border:1px solid #ddd;border-radius:4px;padding:8px 10px}\
.panel h2{font-size:14px;margin:0 0 4px} .kind{color:#888;font-weight:normal}\
.desc{font-size:11px;color:#555;margin:0 0 6px} code{font-size:10px;display:block;white-space:pre-wrap;background:#f7f7f7;padding:3px;margin:2px 0}\
.nodata{color:#b00;font-weight:bold} table{font-size:11px;border-collapse:collapse} td,th{border-bottom:1px solid #eee;padding:1px 6px;text-align:left}\
svg{max-width:100%;height:auto}";

/// One panel of the preview: its queries, what each returned, and the lines drawn.
fn preview_panel(r: &PanelResult, now_s: f64) -> Markup {
    let mut lines: Vec<Series> = Vec::new();
    for (target, q) in &r.results {
        if q.error.is_none() && q.finite_points() > 0 && !target.instant {
            for (name, pts) in &q.series {
                lines.push(Series {
                    name: legend_name(&target.legend, name),
                    points: pts.iter().map(|(t, v)| (t - now_s, *v)).collect(),
                });
            }
        }
    }
    let from = format!(
        "-{}",
        gpuledger_model::units::DurationSpec::from_secs(r.range_s)
    );
    html! {
        div.panel data-panel=(r.panel.id) {
            h2 {
                (r.panel.title) " "
                span.kind {
                    (r.panel.kind)
                    @if let Some(t) = &r.panel.time_from { ", range " (t) }
                }
            }
            p.desc { (r.panel.description) }
            @for (target, q) in &r.results {
                code { (target.ref_id) ": " (q.expr) }
                @if let Some(e) = &q.error {
                    p.nodata { "error: " (e) }
                } @else if q.finite_points() == 0 {
                    p.nodata { "no data" }
                } @else if target.instant {
                    table {
                        @for (name, pts) in q.series.iter().take(12) {
                            tr {
                                td { (legend_name(&target.legend, name)) }
                                td { (pts.last().map(|p| short_number(p.1)).unwrap_or_default()) }
                            }
                        }
                    }
                }
            }
            @if !lines.is_empty() {
                (svg::multi_line_chart("", "", (&from, "now"), &lines, None, None))
            }
        }
    }
}

/// The preview of one dashboard: its panels in order, each with its queries and results.
pub fn preview_page(dashboard: &Dashboard, results: &[PanelResult], now_s: f64) -> String {
    let when = chrono::DateTime::from_timestamp(now_s as i64, 0)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_default();
    html! {
        (DOCTYPE)
        html {
            head {
                meta charset="utf-8";
                title { (dashboard.title) }
                style { (PREVIEW_STYLE) }
            }
            body {
                h1 { (dashboard.title) }
                p { (dashboard.description) }
                p.desc { (results.len()) " panels; queried " (when) "; the data each query returned is drawn below it." }
                div.grid {
                    @for r in results { (preview_panel(r, now_s)) }
                }
            }
        }
    }
    .into_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_dashboards_parse_with_queries_in_every_panel() {
        let dashboards = load(None).unwrap();
        assert_eq!(dashboards.len(), 4);
        for d in &dashboards {
            assert!(d.uid.starts_with("gpuledger-"), "{}", d.file);
            assert!(!d.panels.is_empty());
            let mut ids: Vec<u64> = d.panels.iter().map(|p| p.id).collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(
                ids.len(),
                d.panels.len(),
                "{}: panel ids are unique",
                d.file
            );
            for p in &d.panels {
                assert!(
                    !p.targets.is_empty(),
                    "{} / {} has no query",
                    d.file,
                    p.title
                );
                assert!(
                    !p.description.is_empty() || p.kind == "stat",
                    "{} / {}",
                    d.file,
                    p.title
                );
            }
        }
    }

    #[test]
    fn metric_names_skip_strings_and_labels() {
        assert_eq!(
            metric_names(
                r#"sum by (account) (rate(gpuledger_account_cost_total{account=~"gpuledger_x"}[5m])) / gpuledger:account_mfu:ratio_1h or DCGM_FI_DEV_GPU_UTIL"#
            ),
            vec![
                "gpuledger_account_cost_total".to_owned(),
                "gpuledger:account_mfu:ratio_1h".to_owned(),
                "DCGM_FI_DEV_GPU_UTIL".to_owned()
            ]
        );
    }

    #[test]
    fn legends_take_label_values() {
        assert_eq!(
            legend_name("{{hpc_job}} ({{account}})", "account=team-a,hpc_job=7"),
            "7 (team-a)"
        );
        assert_eq!(legend_name("__auto", "state=idle"), "state=idle");
    }

    #[test]
    fn variables_and_built_ins_are_substituted() {
        let values = BTreeMap::from([
            ("account".to_owned(), "team-a".to_owned()),
            ("acc".to_owned(), "x".to_owned()),
        ]);
        assert_eq!(
            substitute(
                r#"increase(m{account=~"$account",a="${acc}"}[$__range]) / rate(m[$__rate_interval])"#,
                &values,
                3600,
                60
            ),
            r#"increase(m{account=~"team-a",a="x"}[3600s]) / rate(m[60s])"#
        );
        assert_eq!(
            parse_label_values("label_values(DCGM_FI_DEV_GPU_UTIL, Hostname)"),
            Some((Some("DCGM_FI_DEV_GPU_UTIL".into()), "Hostname".into()))
        );
    }
}
