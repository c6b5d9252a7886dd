//! Line charts as hand-written SVG: one file with one or more charts stacked, lines per target,
//! shaded bands for fault windows. No plotting dependency: the charts need axes, ticks, lines,
//! bands and a legend, nothing more.

use std::fmt::Write;

pub struct Line {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A shaded stretch of the x axis (e.g. a partition).
pub struct Band {
    pub from: f64,
    pub to: f64,
    pub label: String,
}

pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub lines: Vec<Line>,
    pub bands: Vec<Band>,
    /// Labelled x positions instead of numeric ticks (e.g. in-flight levels at even spacing).
    pub x_ticks: Option<Vec<(f64, String)>>,
    /// Dots at every point: for charts with few points.
    pub dots: bool,
}

const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 340.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 680.0;
const TOP: f64 = 45.0;
const BOTTOM: f64 = 285.0;

/// The colour of a target's line, the same in every chart.
fn colour(name: &str, index: usize) -> &'static str {
    const OTHERS: [&str; 4] = ["#d62728", "#9467bd", "#8c564b", "#e377c2"];
    match name {
        "echo" => "#7f7f7f",
        "cluster" => "#1f77b4",
        "etcd" => "#ff7f0e",
        "nats" => "#2ca02c",
        _ => OTHERS[index % OTHERS.len()],
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Round tick values covering `[low, high]`: steps of 1, 2 or 5 times a power of ten.
pub fn nice_ticks(low: f64, high: f64, about: usize) -> Vec<f64> {
    let span = (high - low).max(f64::EPSILON);
    let raw = span / about.max(1) as f64;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * magnitude).find(|s| *s >= raw).unwrap_or(10.0 * magnitude);
    let first = (low / step).ceil() as i64;
    let last = (high / step + 1e-9).floor() as i64;
    (first..=last).map(|i| i as f64 * step).collect()
}

fn format_tick(value: f64) -> String {
    if value.abs() >= 1000.0 {
        format!("{}k", value / 1000.0)
    } else if value.fract().abs() < 1e-9 {
        format!("{value:.0}")
    } else {
        let text = format!("{value:.3}");
        text.trim_end_matches('0').to_string()
    }
}

/// All `charts`, stacked top to bottom, as one SVG document.
pub fn render(charts: &[Chart]) -> String {
    let height = HEIGHT * charts.len() as f64;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (n, chart) in charts.iter().enumerate() {
        let _ = writeln!(svg, r#"<g transform="translate(0,{})">"#, n as f64 * HEIGHT);
        render_chart(&mut svg, chart);
        let _ = writeln!(svg, "</g>");
    }
    svg.push_str("</svg>\n");
    svg
}

fn render_chart(svg: &mut String, chart: &Chart) {
    let finite = |v: &f64| v.is_finite();
    let xs: Vec<f64> = chart.lines.iter().flat_map(|l| l.points.iter().map(|p| p.0)).filter(finite).collect();
    let ys: Vec<f64> = chart.lines.iter().flat_map(|l| l.points.iter().map(|p| p.1)).filter(finite).collect();
    // Numeric x axes start at zero (seconds, keys) unless the data go below it.
    let (mut x_low, mut x_high) =
        bounds(xs.iter().copied().chain(chart.bands.iter().flat_map(|b| [b.from, b.to])).chain([0.0]));
    if let Some(ticks) = &chart.x_ticks {
        (x_low, x_high) = bounds(ticks.iter().map(|t| t.0));
        // Half a step of room on both sides of categorical ticks.
        let pad = if ticks.len() > 1 { (x_high - x_low) / (ticks.len() - 1) as f64 / 2.0 } else { 0.5 };
        (x_low, x_high) = (x_low - pad, x_high + pad);
    }
    let y_high = ys.iter().copied().fold(0.0, f64::max).max(f64::EPSILON) * 1.08;
    let y_ticks = nice_ticks(0.0, y_high, 5);
    let y_high = y_ticks.last().copied().unwrap_or(y_high).max(y_high);
    let x_span = (x_high - x_low).max(f64::EPSILON);
    let px = |x: f64| LEFT + (x - x_low) / x_span * (RIGHT - LEFT);
    let py = |y: f64| BOTTOM - y / y_high * (BOTTOM - TOP);

    let _ =
        writeln!(svg, r#"<text x="{LEFT}" y="25" font-size="15" font-weight="bold">{}</text>"#, escape(&chart.title));
    for band in &chart.bands {
        let (from, to) = (px(band.from.max(x_low)), px(band.to.min(x_high)));
        let _ = writeln!(
            svg,
            r##"<rect x="{from:.1}" y="{TOP}" width="{:.1}" height="{}" fill="#d62728" fill-opacity="0.12"/><text x="{:.1}" y="{}" font-size="11" fill="#a02020">{}</text>"##,
            (to - from).max(0.0),
            BOTTOM - TOP,
            from + 3.0,
            TOP + 13.0,
            escape(&band.label)
        );
    }
    for tick in &y_ticks {
        let y = py(*tick);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{RIGHT}" y2="{y:.1}" stroke="#e0e0e0"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT - 6.0,
            y + 4.0,
            format_tick(*tick)
        );
    }
    let x_ticks: Vec<(f64, String)> = match &chart.x_ticks {
        Some(ticks) => ticks.clone(),
        None => nice_ticks(x_low, x_high, 8).into_iter().map(|x| (x, format_tick(x))).collect(),
    };
    for (x, label) in &x_ticks {
        let x = px(*x);
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{BOTTOM}" x2="{x:.1}" y2="{}" stroke="#444"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
            BOTTOM + 5.0,
            BOTTOM + 19.0,
            escape(label)
        );
    }
    let _ = writeln!(
        svg,
        r##"<polyline points="{LEFT},{TOP} {LEFT},{BOTTOM} {RIGHT},{BOTTOM}" fill="none" stroke="#444"/>"##
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        (LEFT + RIGHT) / 2.0,
        BOTTOM + 40.0,
        escape(&chart.x_label)
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(20,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
        (TOP + BOTTOM) / 2.0,
        escape(&chart.y_label)
    );
    for (index, line) in chart.lines.iter().enumerate() {
        let colour = colour(&line.name, index);
        let points: Vec<String> = line
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
            points.join(" ")
        );
        if chart.dots {
            for point in &points {
                let (x, y) = point.split_once(',').unwrap_or(("0", "0"));
                let _ = writeln!(svg, r#"<circle cx="{x}" cy="{y}" r="3.5" fill="{colour}"/>"#);
            }
        }
        let legend_y = TOP + 10.0 + index as f64 * 20.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{}" y1="{legend_y}" x2="{}" y2="{legend_y}" stroke="{colour}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            RIGHT + 20.0,
            RIGHT + 45.0,
            RIGHT + 52.0,
            legend_y + 4.0,
            escape(&line.name)
        );
    }
}

fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (low, high) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if low.is_finite() && high > low {
        (low, high)
    } else if low.is_finite() {
        (low - 0.5, low + 0.5)
    } else {
        (0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(nice_ticks(0.0, 10.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(nice_ticks(0.0, 23_000.0, 5), vec![0.0, 5000.0, 10_000.0, 15_000.0, 20_000.0]);
        assert_eq!(nice_ticks(0.0, 0.9, 4), vec![0.0, 0.5]);
        assert_eq!(format_tick(20_000.0), "20k");
        assert_eq!(format_tick(2500.0), "2.5k");
        assert_eq!(format_tick(0.25), "0.25");
    }

    #[test]
    fn a_chart_has_its_lines_band_and_legend_and_is_escaped() {
        let chart = Chart {
            title: "ops/s <per second>".into(),
            x_label: "s".into(),
            y_label: "ops/s".into(),
            lines: vec![
                Line { name: "cluster".into(), points: vec![(0.0, 10.0), (1.0, f64::NAN), (2.0, 30.0)] },
                Line { name: "etcd".into(), points: vec![(0.0, 5.0), (2.0, 6.0)] },
            ],
            bands: vec![Band { from: 0.5, to: 1.5, label: "cut".into() }],
            x_ticks: None,
            dots: true,
        };
        let svg = render(&[chart]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("ops/s &lt;per second&gt;"));
        assert_eq!(svg.matches("<polyline points=").count(), 3, "two lines and the axes");
        assert_eq!(svg.matches("<circle").count(), 4, "the NaN point is left out");
        assert!(svg.contains(">cut</text>") && svg.contains(">etcd</text>") && svg.contains("#1f77b4"));
    }
}
