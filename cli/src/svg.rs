//! Small self-contained SVG charts for the simulator's report: a line over time and bars per
//! category. No scripts, no external fonts: they render the same in a browser and on GitHub.

use std::fmt::Write as _;

const W: f64 = 720.0;
const H: f64 = 240.0;
const PAD_L: f64 = 56.0;
const PAD_R: f64 = 16.0;
const PAD_T: f64 = 28.0;
const PAD_B: f64 = 40.0;

fn escape(s: &str) -> String {
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
    } else {
        format!("{v:.2}")
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
}
