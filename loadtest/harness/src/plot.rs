//! Line charts as standalone SVG: time on x, one or more series on y, marks as dashed vertical lines.

use std::fmt::Write as _;

const W: f64 = 920.0;
const H: f64 = 340.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 36.0;
const BOTTOM: f64 = 44.0;
const COLORS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// One line.
#[derive(Debug, Clone)]
pub struct Line<'a> {
    /// Legend text.
    pub label: String,
    /// (seconds, value).
    pub points: &'a [(f64, f64)],
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" step for about `n` ticks over `span`.
fn nice_step(span: f64, n: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / n;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let nice = if norm < 1.5 {
        1.0
    } else if norm < 3.0 {
        2.0
    } else if norm < 7.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn fmt_num(v: f64) -> String {
    if v.abs() >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v.abs() >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if v.abs() >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// Renders a chart.
pub fn chart(title: &str, y_unit: &str, lines: &[Line<'_>], marks: &[(f64, String)]) -> String {
    let pts = lines.iter().flat_map(|l| l.points.iter());
    let (mut x_max, mut y_max) = (1.0f64, 0.0f64);
    for (x, y) in pts {
        if x.is_finite() {
            x_max = x_max.max(*x);
        }
        if y.is_finite() {
            y_max = y_max.max(*y);
        }
    }
    for (t, _) in marks {
        x_max = x_max.max(*t);
    }
    if y_max <= 0.0 {
        y_max = 1.0;
    }
    let y_step = nice_step(y_max, 5.0);
    let y_top = (y_max / y_step).ceil() * y_step;
    let x_step = nice_step(x_max, 8.0);
    let x_top = (x_max / x_step).ceil() * x_step;
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let sx = |x: f64| LEFT + x / x_top * pw;
    let sy = |y: f64| TOP + ph - (y / y_top).clamp(0.0, 1.05) * ph;

    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{}</text>"#,
        esc(title)
    );
    // grid and axes
    let mut y = 0.0;
    while y <= y_top + y_step / 2.0 {
        let py = sy(y);
        let _ = write!(
            s,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            py + 4.0,
            fmt_num(y)
        );
        y += y_step;
    }
    let mut x = 0.0;
    while x <= x_top + x_step / 2.0 {
        let px = sx(x);
        let _ = write!(
            s,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#f0f0f0"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + ph,
            TOP + ph + 16.0,
            fmt_num(x)
        );
        x += x_step;
    }
    let _ = write!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#999"/><text x="{:.1}" y="{:.1}" text-anchor="middle">seconds since start</text><text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"##,
        LEFT + pw / 2.0,
        H - 8.0,
        TOP + ph / 2.0,
        esc(y_unit)
    );
    // marks
    for (i, (t, what)) in marks.iter().enumerate() {
        let px = sx(*t);
        let _ = write!(
            s,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#555" stroke-dasharray="4 3"/><text x="{:.1}" y="{:.1}" font-size="10" fill="#555">{}</text>"##,
            TOP + ph,
            px + 3.0,
            TOP + 10.0 + (i % 4) as f64 * 11.0,
            esc(what)
        );
    }
    // lines and legend
    for (i, l) in lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = l
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y)))
            .collect();
        if path.len() == 1 {
            let (cx, cy) = path[0].split_once(',').unwrap_or(("0", "0"));
            let _ = write!(s, r#"<circle cx="{cx}" cy="{cy}" r="3" fill="{color}"/>"#);
        } else if !path.is_empty() {
            let _ = write!(
                s,
                r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
                path.join(" ")
            );
        }
        let ly = TOP + 8.0 + i as f64 * 16.0;
        let _ = write!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="12" height="3" fill="{color}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            LEFT + pw + 12.0,
            ly,
            LEFT + pw + 30.0,
            ly + 5.0,
            esc(&l.label)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_lines_marks_and_escapes() {
        let a = [(0.0, 1.0), (10.0, 5.0), (20.0, 2.0)];
        let b = [(5.0, 3.0)];
        let svg = chart(
            "rates <in>",
            "msgs/s",
            &[
                Line {
                    label: "a".into(),
                    points: &a,
                },
                Line {
                    label: "b & c".into(),
                    points: &b,
                },
            ],
            &[(12.0, "NATS down".into())],
        );
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("rates &lt;in&gt;"));
        assert!(svg.contains("b &amp; c"));
        assert!(svg.contains("<polyline"));
        assert!(svg.contains("<circle"));
        assert!(svg.contains("NATS down"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn steps_are_nice() {
        assert_eq!(nice_step(100.0, 5.0), 20.0);
        assert_eq!(nice_step(7.0, 5.0), 1.0);
        assert_eq!(nice_step(0.0, 5.0), 1.0);
    }
}
