//! Small self-contained SVG charts: a line over time and bars per category (the simulator's
//! report), several lines with a legend, bars against a target, stacked bars and a pie (the
//! status page and the dashboards preview). No scripts, no external fonts: they render the same
//! in a browser and on GitHub.

use std::fmt::Write as _;

const W: f64 = 720.0;
const H: f64 = 240.0;
const PAD_L: f64 = 56.0;
const PAD_R: f64 = 16.0;
const PAD_T: f64 = 28.0;
const PAD_B: f64 = 40.0;

/// Colours of successive series (a colour-blind-safe palette).
pub const PALETTE: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// The colour of series `i`.
pub fn colour(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// Escapes text for XML and HTML.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn open(title: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"{t}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"{W}\" height=\"{H}\" fill=\"white\"/>\n\
         <text x=\"{PAD_L}\" y=\"16\" font-size=\"13\">{t}</text>\n",
        t = escape(title)
    )
}

fn axes(svg: &mut String, y_max: f64, y_label: &str) {
    let (x0, y0, y1) = (PAD_L, H - PAD_B, PAD_T);
    let _ = writeln!(
        svg,
        "<line x1=\"{x0}\" y1=\"{y0}\" x2=\"{}\" y2=\"{y0}\" stroke=\"#333\"/>\n<line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x0}\" y2=\"{y1}\" stroke=\"#333\"/>",
        W - PAD_R
    );
    for k in 0..=4 {
        let v = y_max * f64::from(k) / 4.0;
        let y = y0 - (y0 - y1) * f64::from(k) / 4.0;
        let _ = writeln!(
            svg,
            "<line x1=\"{}\" y1=\"{y:.1}\" x2=\"{x0}\" y2=\"{y:.1}\" stroke=\"#333\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            x0 - 4.0,
            x0 - 6.0,
            y + 4.0,
            short(v)
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"12\" y=\"{:.1}\" transform=\"rotate(-90 12 {:.1})\" text-anchor=\"middle\">{}</text>",
        (y0 + y1) / 2.0,
        (y0 + y1) / 2.0,
        escape(y_label)
    );
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

/// A line of `points` (x, y), x in days from 0, y from 0 to `y_max`.
pub fn line_chart(
    title: &str,
    y_label: &str,
    x_label: &str,
    points: &[(f64, f64)],
    y_max: f64,
) -> String {
    let mut svg = open(title);
    let y_max = if y_max > 0.0 { y_max } else { 1.0 };
    axes(&mut svg, y_max, y_label);
    let x_max = points.last().map(|p| p.0).unwrap_or(1.0).max(1e-9);
    let sx = |x: f64| PAD_L + (W - PAD_L - PAD_R) * x / x_max;
    let sy = |y: f64| H - PAD_B - (H - PAD_B - PAD_T) * (y / y_max).clamp(0.0, 1.0);
    let mut path = String::new();
    for (k, (x, y)) in points.iter().enumerate() {
        let _ = write!(
            path,
            "{}{:.1},{:.1} ",
            if k == 0 { "M" } else { "L" },
            sx(*x),
            sy(*y)
        );
    }
    let _ = writeln!(
        svg,
        "<path d=\"{}\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.2\"/>",
        path.trim_end()
    );
    for k in 0..=4 {
        let x = x_max * f64::from(k) / 4.0;
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            sx(x),
            H - PAD_B + 14.0,
            short(x)
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n</svg>",
        (PAD_L + W - PAD_R) / 2.0,
        H - 6.0,
        escape(x_label)
    );
    svg
}

/// Two bars per category (e.g. mean and p99), with a legend.
pub fn paired_bars(
    title: &str,
    y_label: &str,
    series: (&str, &str),
    bars: &[(String, f64, f64)],
) -> String {
    let mut svg = open(title);
    let y_max = bars
        .iter()
        .map(|b| b.1.max(b.2))
        .fold(0.0, f64::max)
        .max(1.0);
    axes(&mut svg, y_max, y_label);
    let slot = (W - PAD_L - PAD_R) / bars.len().max(1) as f64;
    let bw = (slot * 0.35).min(24.0);
    let sy = |y: f64| (H - PAD_B - PAD_T) * (y / y_max);
    for (k, (name, a, b)) in bars.iter().enumerate() {
        let x = PAD_L + slot * k as f64 + slot / 2.0;
        for (off, v, colour) in [(-bw, *a, "#1f77b4"), (0.0, *b, "#ff7f0e")] {
            let h = sy(v);
            let _ = writeln!(
                svg,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{bw:.1}\" height=\"{h:.1}\" fill=\"{colour}\"/>",
                x + off,
                H - PAD_B - h
            );
        }
        let _ = writeln!(
            svg,
            "<text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            H - PAD_B + 14.0,
            escape(name)
        );
    }
    let lx = W - PAD_R - 150.0;
    let _ = writeln!(
        svg,
        "<rect x=\"{lx}\" y=\"8\" width=\"10\" height=\"10\" fill=\"#1f77b4\"/><text x=\"{}\" y=\"17\">{}</text>\n<rect x=\"{}\" y=\"8\" width=\"10\" height=\"10\" fill=\"#ff7f0e\"/><text x=\"{}\" y=\"17\">{}</text>\n</svg>",
        lx + 14.0,
        escape(series.0),
        lx + 75.0,
        lx + 89.0,
        escape(series.1)
    );
    svg
}

/// One named series of (x, y) points.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Up to eight series names along the bottom, below the x-axis labels.
fn legend(svg: &mut String, names: &[&str]) {
    for (i, name) in names.iter().enumerate().take(8) {
        let x = PAD_L + 82.0 * i as f64;
        let y = H - 14.0;
        let _ = writeln!(
            svg,
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"8\" height=\"8\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"9\">{}</text>",
            colour(i),
            x + 11.0,
            y + 8.0,
            escape(&truncate(name, 12))
        );
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        s.chars().take(n - 1).collect::<String>() + "\u{2026}"
    }
}

fn target_line(svg: &mut String, y: f64, label: &str) {
    let _ = writeln!(
        svg,
        "<line x1=\"{PAD_L}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"#d62728\" stroke-dasharray=\"4 3\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#d62728\">{}</text>",
        W - PAD_R,
        W - PAD_R,
        y - 3.0,
        escape(label)
    );
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
) -> String {
    let mut svg = open(title);
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
    axes(&mut svg, y_max, y_label);
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (x_min, x_max) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    });
    let span = if x_max > x_min { x_max - x_min } else { 1.0 };
    let sx = |x: f64| PAD_L + (W - PAD_L - PAD_R) * (x - x_min) / span;
    let sy = |y: f64| H - PAD_B - (H - PAD_B - PAD_T) * (y / y_max).clamp(0.0, 1.0);
    for (i, s) in series.iter().enumerate() {
        let mut path = String::new();
        let mut pen_down = false;
        for (x, y) in &s.points {
            if !y.is_finite() {
                pen_down = false;
                continue;
            }
            let _ = write!(
                path,
                "{}{:.1},{:.1} ",
                if pen_down { "L" } else { "M" },
                sx(*x),
                sy(*y)
            );
            pen_down = true;
        }
        let _ = writeln!(
            svg,
            "<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.4\"/>",
            path.trim_end(),
            colour(i)
        );
    }
    if let Some((t, label)) = target {
        target_line(&mut svg, sy(t), label);
    }
    let names: Vec<&str> = series.iter().map(|s| s.name.as_str()).collect();
    legend(&mut svg, &names);
    let _ = writeln!(
        svg,
        "<text x=\"{PAD_L}\" y=\"{}\">{}</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n</svg>",
        H - PAD_B + 14.0,
        escape(x_ticks.0),
        W - PAD_R,
        H - PAD_B + 14.0,
        escape(x_ticks.1)
    );
    svg
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
) -> String {
    let mut svg = open(title);
    let data_max = bars
        .iter()
        .map(|b| b.1)
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let y_max = y_max
        .unwrap_or(data_max.max(target.map_or(0.0, |t| t.0)) * 1.15)
        .max(1e-9);
    axes(&mut svg, y_max, y_label);
    let slot = (W - PAD_L - PAD_R) / bars.len().max(1) as f64;
    let bw = (slot * 0.6).min(40.0);
    let sy = |y: f64| (H - PAD_B - PAD_T) * (y / y_max).clamp(0.0, 1.0);
    for (k, (name, v)) in bars.iter().enumerate() {
        let x = PAD_L + slot * k as f64 + slot / 2.0;
        let h = if v.is_finite() { sy(*v) } else { 0.0 };
        let _ = writeln!(
            svg,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{bw:.1}\" height=\"{h:.1}\" fill=\"{}\"/><text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"9\">{}</text><text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x - bw / 2.0,
            H - PAD_B - h,
            colour(k),
            H - PAD_B - h - 3.0,
            escape(&label(*v)),
            H - PAD_B + 14.0,
            escape(&truncate(name, 14))
        );
    }
    if let Some((t, text)) = target {
        target_line(&mut svg, H - PAD_B - sy(t), text);
    }
    svg.push_str("</svg>\n");
    svg
}

/// Bars per x category (`columns`), stacked by series (`series[i].points[j].1` is series i's
/// value in column j).
pub fn stacked_bars(title: &str, y_label: &str, columns: &[String], series: &[Series]) -> String {
    let mut svg = open(title);
    let totals: Vec<f64> = (0..columns.len())
        .map(|j| {
            series
                .iter()
                .map(|s| s.points.get(j).map_or(0.0, |p| p.1.max(0.0)))
                .sum()
        })
        .collect();
    let y_max = totals.iter().copied().fold(0.0, f64::max).max(1e-9) * 1.05;
    axes(&mut svg, y_max, y_label);
    let slot = (W - PAD_L - PAD_R) / columns.len().max(1) as f64;
    let bw = (slot * 0.8).max(1.0);
    let scale = (H - PAD_B - PAD_T) / y_max;
    for j in 0..columns.len() {
        let x = PAD_L + slot * j as f64 + (slot - bw) / 2.0;
        let mut top = H - PAD_B;
        for (i, s) in series.iter().enumerate() {
            let v = s.points.get(j).map_or(0.0, |p| p.1.max(0.0));
            if v <= 0.0 {
                continue;
            }
            let h = v * scale;
            top -= h;
            let _ = writeln!(
                svg,
                "<rect x=\"{x:.1}\" y=\"{top:.1}\" width=\"{bw:.1}\" height=\"{h:.1}\" fill=\"{}\"/>",
                colour(i)
            );
        }
    }
    if let (Some(first), Some(last)) = (columns.first(), columns.last()) {
        let _ = writeln!(
            svg,
            "<text x=\"{PAD_L}\" y=\"{}\">{}</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
            H - PAD_B + 14.0,
            escape(first),
            W - PAD_R,
            H - PAD_B + 14.0,
            escape(last)
        );
    }
    let names: Vec<&str> = series.iter().map(|s| s.name.as_str()).collect();
    legend(&mut svg, &names);
    svg.push_str("</svg>\n");
    svg
}

/// A pie of each slice's share of the total, with a legend giving the shares.
pub fn pie_chart(title: &str, slices: &[(String, f64)]) -> String {
    let mut svg = open(title);
    let total: f64 = slices.iter().map(|s| s.1.max(0.0)).sum();
    let (cx, cy, r) = (H / 2.0 + 20.0, H / 2.0 + 8.0, H / 2.0 - 30.0);
    if total <= 0.0 {
        let _ = writeln!(
            svg,
            "<circle cx=\"{cx}\" cy=\"{cy}\" r=\"{r}\" fill=\"#eee\"/><text x=\"{cx}\" y=\"{cy}\" text-anchor=\"middle\">no use</text>"
        );
    }
    let mut angle = -std::f64::consts::FRAC_PI_2;
    for (i, (_, v)) in slices.iter().enumerate() {
        let share = v.max(0.0) / total.max(1e-12);
        if share <= 0.0 {
            continue;
        }
        let colour = colour(i);
        if share >= 0.9999 {
            let _ = writeln!(
                svg,
                "<circle cx=\"{cx}\" cy=\"{cy}\" r=\"{r}\" fill=\"{colour}\"/>"
            );
            continue;
        }
        let end = angle + share * std::f64::consts::TAU;
        let large = u8::from(share > 0.5);
        let _ = writeln!(
            svg,
            "<path d=\"M{cx:.1},{cy:.1} L{:.1},{:.1} A{r:.1},{r:.1} 0 {large} 1 {:.1},{:.1} Z\" fill=\"{colour}\" stroke=\"white\"/>",
            cx + r * angle.cos(),
            cy + r * angle.sin(),
            cx + r * end.cos(),
            cy + r * end.sin()
        );
        angle = end;
    }
    for (i, (name, v)) in slices.iter().enumerate().take(14) {
        let y = PAD_T + 14.0 * i as f64;
        let x = cx + r + 40.0;
        let _ = writeln!(
            svg,
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\">{} {:.1}%</text>",
            colour(i),
            x + 14.0,
            y + 9.0,
            escape(name),
            100.0 * v.max(0.0) / total.max(1e-12)
        );
    }
    svg.push_str("</svg>\n");
    svg
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
        );
        assert!(line.starts_with("<svg") && line.trim_end().ends_with("</svg>"));
        assert!(line.contains("M56.0,200.0 L380.0,114.0 L704.0,28.0"));
        let bars = paired_bars("w", "s", ("mean", "p99"), &[("vc-a".into(), 10.0, 20.0)]);
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
        let lines = multi_line_chart("w", "s", ("a", "b"), &series, None, Some((2.5, "target")));
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
        );
        assert!(bars.contains(">40%<") && bars.contains(">60%<") && bars.contains(">50%<"));
        let pie = pie_chart("share", &[("a".into(), 3.0), ("b".into(), 1.0)]);
        assert!(pie.contains("a 75.0%") && pie.contains("b 25.0%"));
        assert_eq!(pie.matches("<path").count(), 2);
        let stacked = stacked_bars("d", "h", &["d1".into(), "d2".into()], &series[1..]);
        assert_eq!(
            stacked.matches("<rect x=").count(),
            2 + 1,
            "two bars, one legend key"
        );
    }
}
