//! Small self-contained SVG charts: a line over time and bars per category (the simulator's
//! report), several lines with a legend, bars against a target, stacked bars and a pie (the
//! status page and the dashboards preview). No scripts, no external fonts: they render the same
//! in a browser and on GitHub. Every chart is a [`Markup`] built by maud, which escapes every
//! name and label it is given (account, job and project names come from tenants); it embeds in
//! a page as it is, or is written out as an `.svg` file with [`Markup::into_string`].
//!
//! A chart names every series it draws: the legend wraps onto more rows (the chart grows) rather
//! than dropping names. Additive charts (stacked bars, the pie) draw at most [`PALETTE`]'s
//! length of series, the largest, and fold the rest into one `other (N)`, so no two series share
//! a colour; lines past the palette repeat its colours dashed.

use maud::html;
pub use maud::Markup;

const W: f64 = 720.0;
const H: f64 = 240.0;
const PAD_L: f64 = 56.0;
const PAD_R: f64 = 16.0;
const PAD_T: f64 = 28.0;
const PAD_B: f64 = 40.0;
/// Width of one legend entry, and the height of one legend row.
const LEGEND_W: f64 = 82.0;
const LEGEND_ROW: f64 = 14.0;

/// Colours of successive series (a colour-blind-safe palette).
pub const PALETTE: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// The colour of series `i`.
pub fn colour(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// A coordinate as drawn: one decimal.
fn c(v: f64) -> String {
    format!("{v:.1}")
}

/// The `<svg>` element of a chart `height` high, its title, and `body`.
fn frame(title: &str, height: f64, body: Markup) -> Markup {
    html! {
        svg xmlns="http://www.w3.org/2000/svg" width=(W) height=(height)
            viewBox=(format!("0 0 {W} {height}")) role="img" aria-label=(title)
            font-family="sans-serif" font-size="11" {
            rect width=(W) height=(height) fill="white" {}
            text x=(PAD_L) y="16" font-size="13" { (title) }
            (body)
        }
    }
}

fn axes(y_max: f64, y_label: &str) -> Markup {
    let (x0, y0, y1) = (PAD_L, H - PAD_B, PAD_T);
    let mid = (y0 + y1) / 2.0;
    html! {
        line x1=(x0) y1=(y0) x2=(W - PAD_R) y2=(y0) stroke="#333" {}
        line x1=(x0) y1=(y0) x2=(x0) y2=(y1) stroke="#333" {}
        @for k in 0..=4 {
            @let y = y0 - (y0 - y1) * f64::from(k) / 4.0;
            line x1=(x0 - 4.0) y1=(c(y)) x2=(x0) y2=(c(y)) stroke="#333" {}
            text x=(x0 - 6.0) y=(c(y + 4.0)) text-anchor="end" { (short(y_max * f64::from(k) / 4.0)) }
        }
        text x="12" y=(c(mid)) transform=(format!("rotate(-90 12 {})", c(mid))) text-anchor="middle" { (y_label) }
    }
}

fn short(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else if v >= 0.1 {
        format!("{v:.2}")
    } else {
        format!("{v:.1e}")
    }
}

/// Text below the x axis at the left and right ends.
fn x_ends(first: &str, last: &str) -> Markup {
    let y = H - PAD_B + 14.0;
    html! {
        text x=(PAD_L) y=(y) { (first) }
        text x=(W - PAD_R) y=(y) text-anchor="end" { (last) }
    }
}

/// A line of `points` (x, y), x in days from 0, y from 0 to `y_max`.
pub fn line_chart(
    title: &str,
    y_label: &str,
    x_label: &str,
    points: &[(f64, f64)],
    y_max: f64,
) -> Markup {
    let y_max = if y_max > 0.0 { y_max } else { 1.0 };
    let x_max = points.last().map(|p| p.0).unwrap_or(1.0).max(1e-9);
    let sx = |x: f64| PAD_L + (W - PAD_L - PAD_R) * x / x_max;
    let sy = |y: f64| H - PAD_B - (H - PAD_B - PAD_T) * (y / y_max).clamp(0.0, 1.0);
    let path = points
        .iter()
        .enumerate()
        .map(|(k, (x, y))| {
            format!(
                "{}{:.1},{:.1}",
                if k == 0 { "M" } else { "L" },
                sx(*x),
                sy(*y)
            )
        })
        .collect::<Vec<_>>()
        .join(" ");
    frame(
        title,
        H,
        html! {
            (axes(y_max, y_label))
            path d=(path) fill="none" stroke=(colour(0)) stroke-width="1.2" {}
            @for k in 0..=4 {
                @let x = x_max * f64::from(k) / 4.0;
                text x=(c(sx(x))) y=(H - PAD_B + 14.0) text-anchor="middle" { (short(x)) }
            }
            text x=(c((PAD_L + W - PAD_R) / 2.0)) y=(H - 6.0) text-anchor="middle" { (x_label) }
        },
    )
}

/// Two bars per category (e.g. mean and p99), with a legend.
pub fn paired_bars(
    title: &str,
    y_label: &str,
    series: (&str, &str),
    bars: &[(String, f64, f64)],
) -> Markup {
    let y_max = bars
        .iter()
        .map(|b| b.1.max(b.2))
        .fold(0.0, f64::max)
        .max(1.0);
    let slot = (W - PAD_L - PAD_R) / bars.len().max(1) as f64;
    let bw = (slot * 0.35).min(24.0);
    let sy = |y: f64| (H - PAD_B - PAD_T) * (y / y_max);
    let lx = W - PAD_R - 150.0;
    frame(
        title,
        H,
        html! {
            (axes(y_max, y_label))
            @for (k, (name, a, b)) in bars.iter().enumerate() {
                @let x = PAD_L + slot * k as f64 + slot / 2.0;
                @for (off, v, i) in [(-bw, *a, 0), (0.0, *b, 1)] {
                    rect x=(c(x + off)) y=(c(H - PAD_B - sy(v))) width=(c(bw)) height=(c(sy(v))) fill=(colour(i)) {}
                }
                text x=(c(x)) y=(H - PAD_B + 14.0) text-anchor="middle" { (name) }
            }
            rect x=(lx) y="8" width="10" height="10" fill=(colour(0)) {}
            text x=(lx + 14.0) y="17" { (series.0) }
            rect x=(lx + 75.0) y="8" width="10" height="10" fill=(colour(1)) {}
            text x=(lx + 89.0) y="17" { (series.1) }
        },
    )
}

/// One named series of (x, y) points.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

impl Series {
    fn total(&self) -> f64 {
        self.points
            .iter()
            .map(|p| p.1)
            .filter(|v| v.is_finite() && *v > 0.0)
            .sum()
    }
}

/// Legend entries per row.
fn legend_per_row() -> usize {
    ((W - PAD_L - PAD_R) / LEGEND_W).floor().max(1.0) as usize
}

/// How much taller than [`H`] a chart with `entries` legend entries below its axis is.
fn legend_extra_height(entries: usize) -> f64 {
    entries.div_ceil(legend_per_row()).saturating_sub(1) as f64 * LEGEND_ROW
}

/// Every entry's colour key and name, in rows below the x-axis labels; a name cut short keeps
/// its whole text in a tooltip.
fn legend(entries: &[(&str, &'static str, bool)]) -> Markup {
    let per_row = legend_per_row();
    html! {
        @for (i, (name, colour, dashed)) in entries.iter().enumerate() {
            @let x = PAD_L + LEGEND_W * (i % per_row) as f64;
            @let y = H - 14.0 + LEGEND_ROW * (i / per_row) as f64;
            g data-legend=(name) {
                title { (name) }
                @if *dashed {
                    line x1=(c(x)) y1=(c(y + 4.0)) x2=(c(x + 8.0)) y2=(c(y + 4.0)) stroke=(colour) stroke-width="2" stroke-dasharray="2 2" {}
                } @else {
                    rect x=(c(x)) y=(c(y)) width="8" height="8" fill=(colour) {}
                }
                text x=(c(x + 11.0)) y=(c(y + 8.0)) font-size="9" { (truncate(name, 12)) }
            }
        }
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        s.chars().take(n - 1).collect::<String>() + "\u{2026}"
    }
}

fn target_line(y: f64, label: &str) -> Markup {
    html! {
        line x1=(PAD_L) y1=(c(y)) x2=(W - PAD_R) y2=(c(y)) stroke="#d62728" stroke-dasharray="4 3" {}
        text x=(W - PAD_R) y=(c(y - 3.0)) text-anchor="end" fill="#d62728" { (label) }
    }
}

/// At most [`PALETTE`]'s length of series, so that no two share a colour: the largest by their
/// total keep their place, the others are summed point by point into one `other (N)` series
/// last. For charts whose values add up (stacked bars, a pie).
pub fn fold_smallest(series: &[Series]) -> Vec<Series> {
    if series.len() <= PALETTE.len() {
        return series.to_vec();
    }
    let mut by_total: Vec<usize> = (0..series.len()).collect();
    by_total.sort_by(|a, b| {
        series[*b]
            .total()
            .total_cmp(&series[*a].total())
            .then(a.cmp(b))
    });
    let keep: std::collections::BTreeSet<usize> =
        by_total.iter().copied().take(PALETTE.len() - 1).collect();
    let mut kept: Vec<Series> = keep.iter().map(|i| series[*i].clone()).collect();
    let rest: Vec<&Series> = (0..series.len())
        .filter(|i| !keep.contains(i))
        .map(|i| &series[i])
        .collect();
    let mut other: Vec<(f64, f64)> = Vec::new();
    for s in &rest {
        for (j, (x, y)) in s.points.iter().enumerate() {
            let y = if y.is_finite() { y.max(0.0) } else { 0.0 };
            match other.get_mut(j) {
                Some(p) => p.1 += y,
                None => other.push((*x, y)),
            }
        }
    }
    kept.push(Series {
        name: format!("other ({})", rest.len()),
        points: other,
    });
    kept
}

/// Several lines over a shared x axis (`x_ticks` labels the first and last x), y from 0 to
/// `y_max` (the data's maximum when `None`), with an optional dashed target line.
pub fn multi_line_chart(
    title: &str,
    y_label: &str,
    x_ticks: (&str, &str),
    series: &[Series],
    y_max: Option<f64>,
    target: Option<(f64, &str)>,
) -> Markup {
    let data_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .filter(|y| y.is_finite())
        .fold(0.0, f64::max);
    let y_max = match y_max {
        Some(m) => m,
        None if data_max <= 0.0 && target.is_none() => 1.0,
        None => data_max.max(target.map_or(0.0, |t| t.0)) * 1.1,
    }
    .max(1e-9);
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (x_min, x_max) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    });
    let span = if x_max > x_min { x_max - x_min } else { 1.0 };
    let sx = |x: f64| PAD_L + (W - PAD_L - PAD_R) * (x - x_min) / span;
    let sy = |y: f64| H - PAD_B - (H - PAD_B - PAD_T) * (y / y_max).clamp(0.0, 1.0);
    let path = |s: &Series| {
        let mut d = Vec::new();
        let mut pen_down = false;
        for (x, y) in &s.points {
            if !y.is_finite() {
                pen_down = false;
                continue;
            }
            d.push(format!(
                "{}{:.1},{:.1}",
                if pen_down { "L" } else { "M" },
                sx(*x),
                sy(*y)
            ));
            pen_down = true;
        }
        d.join(" ")
    };
    // Past the palette, colours repeat dashed.
    let dashed = |i: usize| i >= PALETTE.len();
    let entries: Vec<(&str, &'static str, bool)> = series
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), colour(i), dashed(i)))
        .collect();
    frame(
        title,
        H + legend_extra_height(entries.len()),
        html! {
            (axes(y_max, y_label))
            @for (i, s) in series.iter().enumerate() {
                path d=(path(s)) fill="none" stroke=(colour(i)) stroke-width="1.4"
                    stroke-dasharray=[dashed(i).then_some("5 3")] {}
            }
            @if let Some((t, label)) = target { (target_line(sy(t), label)) }
            (legend(&entries))
            (x_ends(x_ticks.0, x_ticks.1))
        },
    )
}

/// One bar per category, scaled to `y_max` (the data's maximum when `None`), with an optional
/// dashed target line; `label` formats each bar's value above it.
pub fn bars_with_target(
    title: &str,
    y_label: &str,
    bars: &[(String, f64)],
    y_max: Option<f64>,
    target: Option<(f64, &str)>,
    label: impl Fn(f64) -> String,
) -> Markup {
    let data_max = bars
        .iter()
        .map(|b| b.1)
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let y_max = y_max
        .unwrap_or(data_max.max(target.map_or(0.0, |t| t.0)) * 1.15)
        .max(1e-9);
    let slot = (W - PAD_L - PAD_R) / bars.len().max(1) as f64;
    let bw = (slot * 0.6).min(40.0);
    let sy = |y: f64| (H - PAD_B - PAD_T) * (y / y_max).clamp(0.0, 1.0);
    // Names are cut to what a slot can hold; the whole name stays in a tooltip.
    let name_chars = ((slot / 6.0) as usize).clamp(4, 14);
    frame(
        title,
        H,
        html! {
            (axes(y_max, y_label))
            @for (k, (name, v)) in bars.iter().enumerate() {
                @let x = PAD_L + slot * k as f64 + slot / 2.0;
                @let h = if v.is_finite() { sy(*v) } else { 0.0 };
                g data-bar=(name) {
                    title { (name) }
                    rect x=(c(x - bw / 2.0)) y=(c(H - PAD_B - h)) width=(c(bw)) height=(c(h)) fill=(colour(k)) {}
                    text x=(c(x)) y=(c(H - PAD_B - h - 3.0)) text-anchor="middle" font-size="9" { (label(*v)) }
                    text x=(c(x)) y=(H - PAD_B + 14.0) text-anchor="middle" { (truncate(name, name_chars)) }
                }
            }
            @if let Some((t, text)) = target { (target_line(H - PAD_B - sy(t), text)) }
        },
    )
}

/// Bars per x category (`columns`), stacked by series (`series[i].points[j].1` is series i's
/// value in column j); past the palette the smallest series are folded ([`fold_smallest`]).
pub fn stacked_bars(title: &str, y_label: &str, columns: &[String], series: &[Series]) -> Markup {
    let series = fold_smallest(series);
    let value = |s: &Series, j: usize| s.points.get(j).map_or(0.0, |p| p.1.max(0.0));
    let totals: Vec<f64> = (0..columns.len())
        .map(|j| series.iter().map(|s| value(s, j)).sum())
        .collect();
    let y_max = totals.iter().copied().fold(0.0, f64::max).max(1e-9) * 1.05;
    let slot = (W - PAD_L - PAD_R) / columns.len().max(1) as f64;
    let bw = (slot * 0.8).max(1.0);
    let scale = (H - PAD_B - PAD_T) / y_max;
    let mut rects = Vec::new();
    for j in 0..columns.len() {
        let x = PAD_L + slot * j as f64 + (slot - bw) / 2.0;
        let mut top = H - PAD_B;
        for (i, s) in series.iter().enumerate() {
            let v = value(s, j);
            if v > 0.0 {
                top -= v * scale;
                rects.push((x, top, v * scale, colour(i)));
            }
        }
    }
    let entries: Vec<(&str, &'static str, bool)> = series
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), colour(i), false))
        .collect();
    frame(
        title,
        H + legend_extra_height(entries.len()),
        html! {
            (axes(y_max, y_label))
            @for (x, y, h, fill) in &rects {
                rect x=(c(*x)) y=(c(*y)) width=(c(bw)) height=(c(*h)) fill=(fill) {}
            }
            @if let (Some(first), Some(last)) = (columns.first(), columns.last()) {
                (x_ends(first, last))
            }
            (legend(&entries))
        },
    )
}

/// A pie of each slice's share of the total, with a legend giving the shares; past the palette
/// the smallest slices are folded into one ([`fold_smallest`]).
pub fn pie_chart(title: &str, slices: &[(String, f64)]) -> Markup {
    let as_series: Vec<Series> = slices
        .iter()
        .map(|(name, v)| Series {
            name: name.clone(),
            points: vec![(0.0, *v)],
        })
        .collect();
    let slices: Vec<(String, f64)> = fold_smallest(&as_series)
        .into_iter()
        .map(|s| (s.name, s.points.first().map_or(0.0, |p| p.1.max(0.0))))
        .collect();
    let total: f64 = slices.iter().map(|s| s.1).sum();
    let (cx, cy, r) = (H / 2.0 + 20.0, H / 2.0 + 8.0, H / 2.0 - 30.0);
    let mut angle = -std::f64::consts::FRAC_PI_2;
    let mut wedges = Vec::new();
    for (i, (_, v)) in slices.iter().enumerate() {
        let share = v / total.max(1e-12);
        if share <= 0.0 {
            continue;
        }
        if share >= 0.9999 {
            wedges.push((None, colour(i)));
            continue;
        }
        let end = angle + share * std::f64::consts::TAU;
        let d = format!(
            "M{cx:.1},{cy:.1} L{:.1},{:.1} A{r:.1},{r:.1} 0 {} 1 {:.1},{:.1} Z",
            cx + r * angle.cos(),
            cy + r * angle.sin(),
            u8::from(share > 0.5),
            cx + r * end.cos(),
            cy + r * end.sin()
        );
        wedges.push((Some(d), colour(i)));
        angle = end;
    }
    let x = cx + r + 40.0;
    frame(
        title,
        H.max(PAD_T + 14.0 * slices.len() as f64 + 8.0),
        html! {
            @if total <= 0.0 {
                circle cx=(cx) cy=(cy) r=(r) fill="#eee" {}
                text x=(cx) y=(cy) text-anchor="middle" { "no use" }
            }
            @for (d, fill) in &wedges {
                @if let Some(d) = d {
                    path d=(d) fill=(fill) stroke="white" {}
                } @else {
                    circle cx=(cx) cy=(cy) r=(r) fill=(fill) {}
                }
            }
            @for (i, (name, v)) in slices.iter().enumerate() {
                @let y = PAD_T + 14.0 * i as f64;
                rect x=(c(x)) y=(c(y)) width="10" height="10" fill=(colour(i)) {}
                text x=(c(x + 14.0)) y=(c(y + 9.0)) { (name) " " (format!("{:.1}%", 100.0 * v / total.max(1e-12))) }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_well_formed_svg_with_their_data() {
        let line = line_chart(
            "u",
            "busy",
            "days",
            &[(0.0, 0.0), (1.0, 0.5), (2.0, 1.0)],
            1.0,
        )
        .into_string();
        assert!(line.starts_with("<svg") && line.trim_end().ends_with("</svg>"));
        assert!(line.contains("M56.0,200.0 L380.0,114.0 L704.0,28.0"));
        let bars =
            paired_bars("w", "s", ("mean", "p99"), &[("vc-a".into(), 10.0, 20.0)]).into_string();
        assert_eq!(
            bars.matches("<rect x=").count(),
            2 + 2,
            "two bars, two legend keys"
        );
        assert!(bars.contains(">vc-a<"));
    }

    #[test]
    fn the_status_charts_draw_every_series_and_their_target() {
        let series = vec![
            Series {
                name: "team-a".into(),
                points: vec![(0.0, 1.0), (1.0, f64::NAN), (2.0, 3.0)],
            },
            Series {
                name: "team-b".into(),
                points: vec![(0.0, 2.0), (2.0, 2.0)],
            },
        ];
        let lines = multi_line_chart("w", "s", ("a", "b"), &series, None, Some((2.5, "target")))
            .into_string();
        assert_eq!(lines.matches("<path d=").count(), 2);
        assert_eq!(
            lines.matches(" M").count() + lines.matches("\"M").count(),
            3,
            "a NaN lifts the pen"
        );
        assert!(lines.contains("stroke-dasharray") && lines.contains(">team-b<"));
        let bars = bars_with_target(
            "m",
            "mfu",
            &[("team-a".into(), 0.4), ("team-b".into(), 0.6)],
            Some(1.0),
            Some((0.5, "50%")),
            |v| format!("{:.0}%", v * 100.0),
        )
        .into_string();
        assert!(bars.contains(">40%<") && bars.contains(">60%<") && bars.contains(">50%<"));
        let pie = pie_chart("share", &[("a".into(), 3.0), ("b".into(), 1.0)]).into_string();
        assert!(pie.contains("a 75.0%") && pie.contains("b 25.0%"));
        assert_eq!(pie.matches("<path").count(), 2);
        let stacked =
            stacked_bars("d", "h", &["d1".into(), "d2".into()], &series[1..]).into_string();
        assert_eq!(
            stacked.matches("<rect x=").count(),
            2 + 1,
            "two bars, one legend key"
        );
    }

    fn accounts(n: usize) -> Vec<Series> {
        (0..n)
            .map(|i| Series {
                name: format!("team-{i:02}"),
                points: vec![(0.0, i as f64 + 1.0), (1.0, 1.0)],
            })
            .collect()
    }

    #[test]
    fn every_series_drawn_is_named_in_the_legend_however_many() {
        let days = ["d1".to_owned(), "d2".to_owned()];
        let stacked = stacked_bars("d", "h", &days, &accounts(9)).into_string();
        for i in 0..9 {
            assert!(
                stacked.contains(&format!("data-legend=\"team-{i:02}\"")),
                "{i}"
            );
        }
        assert!(
            stacked.contains("height=\"254\""),
            "two legend rows: {stacked}"
        );
        let lines = multi_line_chart("w", "s", ("a", "b"), &accounts(12), None, None).into_string();
        assert_eq!(lines.matches("data-legend=").count(), 12);
        assert_eq!(
            lines.matches("stroke-dasharray=\"5 3\"").count(),
            2,
            "11th and 12th dashed"
        );
    }

    #[test]
    fn additive_charts_fold_the_smallest_series_past_the_palette() {
        let many = accounts(13);
        let folded = fold_smallest(&many);
        assert_eq!(folded.len(), PALETTE.len());
        let names: Vec<&str> = folded.iter().map(|s| s.name.as_str()).collect();
        // The four smallest (team-00..03, totals 2..5) are folded; the order of the rest kept.
        assert_eq!(names[0], "team-04");
        assert_eq!(names[9], "other (4)");
        assert_eq!(
            folded[9].points,
            vec![(0.0, 1.0 + 2.0 + 3.0 + 4.0), (1.0, 4.0)]
        );
        let total = |s: &[Series]| s.iter().map(Series::total).sum::<f64>();
        assert_eq!(total(&folded), total(&many), "nothing lost");
        let pie = pie_chart(
            "share",
            &many
                .iter()
                .map(|s| (s.name.clone(), s.total()))
                .collect::<Vec<_>>(),
        )
        .into_string();
        assert!(pie.contains("other (4) 13.5%"), "14 of 104: {pie}");
    }

    #[test]
    fn names_from_tenants_are_escaped() {
        let hostile = "<script>alert(1)</script>\"&";
        let bars = bars_with_target("t", "y", &[(hostile.into(), 1.0)], None, None, |v| {
            v.to_string()
        })
        .into_string();
        let stacked = stacked_bars(
            hostile,
            "h",
            &["d".into()],
            &[Series {
                name: hostile.into(),
                points: vec![(0.0, 1.0)],
            }],
        )
        .into_string();
        for svg in [bars, stacked] {
            assert!(!svg.contains("<script>"), "{svg}");
            assert!(
                svg.contains("&lt;script&gt;alert(1)&lt;/script&gt;&quot;&amp;"),
                "{svg}"
            );
        }
    }
}
