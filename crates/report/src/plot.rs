//! SVG plots: line plots (one polyline per series, optional log axes) and grouped bar charts.
//! Each series is a `<g data-series="NAME">` holding a `<title>`, so a test or a reader can find
//! the series by name; the legend names every series.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use byte_size::format_size;

const WIDTH: f64 = 820.0;
const HEIGHT: f64 = 500.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 210.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
/// Tableau 10: distinguishable colours, also for most colour-blind readers.
const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

/// How tick values are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum TickLabels {
    /// Plain numbers: `0.25`, `100`, `1e+06`.
    #[default]
    Number,
    /// Byte sizes: `512 B`, `8 KiB`.
    Bytes,
}

/// A named sequence of (x, y) points drawn as one polyline with markers.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

impl Series {
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.into(),
            points,
        }
    }
}

/// A line plot. Points that cannot be drawn (non-finite, or not positive on a log axis) are
/// left out.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LinePlot {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// x axis in powers of two (buffer sizes).
    pub x_log2: bool,
    /// y axis in powers of ten.
    pub y_log: bool,
    pub x_ticks: TickLabels,
    pub y_ticks: TickLabels,
    pub series: Vec<Series>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Scale {
    Linear,
    Log2,
    Log10,
}

/// One axis: maps data values to a pixel span and chooses ticks.
#[derive(Debug, Clone, Copy)]
struct Axis {
    scale: Scale,
    /// Domain in transformed units (log2/log10 of the value for log scales).
    lo: f64,
    hi: f64,
    /// Tick step in transformed units.
    step: f64,
}

impl Axis {
    fn fit(scale: Scale, values: impl Iterator<Item = f64>, include_zero: bool) -> Axis {
        let transform = |v: f64| match scale {
            Scale::Linear => v,
            Scale::Log2 => v.log2(),
            Scale::Log10 => v.log10(),
        };
        let (mut lo, mut hi) = values
            .map(transform)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            });
        if !lo.is_finite() || !hi.is_finite() {
            // No drawable point: an arbitrary unit range (1..10 or 1..2 on log axes).
            (lo, hi) = (0.0, 1.0);
        }
        if scale == Scale::Linear && include_zero {
            lo = lo.min(0.0);
            hi = hi.max(0.0);
        }
        if hi - lo < 1e-12 {
            let pad = if lo.abs() > 1e-12 {
                lo.abs() * 0.1
            } else {
                1.0
            };
            lo -= pad;
            hi += pad;
        }
        match scale {
            Scale::Linear => {
                let step = nice_step((hi - lo) / 5.0);
                Axis {
                    scale,
                    lo: (lo / step).floor() * step,
                    hi: (hi / step).ceil() * step,
                    step,
                }
            }
            Scale::Log2 | Scale::Log10 => {
                let (lo, hi) = (lo.floor(), hi.ceil());
                // At most about 12 labelled ticks.
                let step = ((hi - lo) / 12.0).ceil().max(1.0);
                Axis {
                    scale,
                    lo,
                    hi,
                    step,
                }
            }
        }
    }

    fn transform(&self, v: f64) -> Option<f64> {
        let t = match self.scale {
            Scale::Linear => v,
            Scale::Log2 if v > 0.0 => v.log2(),
            Scale::Log10 if v > 0.0 => v.log10(),
            _ => return None,
        };
        t.is_finite().then_some(t)
    }

    /// Position as a fraction of the axis length, 0 at `lo`.
    fn fraction(&self, v: f64) -> Option<f64> {
        self.transform(v)
            .map(|t| (t - self.lo) / (self.hi - self.lo))
    }

    /// Tick values in data units. A log10 axis spanning at most three decades also gets ticks
    /// at 2x and 5x each power of ten, so short ranges are still readable.
    fn ticks(&self) -> Vec<f64> {
        let count = ((self.hi - self.lo) / self.step).round() as i64;
        if self.scale == Scale::Log10 && self.step == 1.0 && count <= 3 {
            let mut ticks = Vec::new();
            for decade in 0..=count {
                let base = 10f64.powf(self.lo + decade as f64);
                ticks.push(base);
                if decade < count {
                    ticks.extend([2.0 * base, 5.0 * base]);
                }
            }
            return ticks;
        }
        (0..=count.min(50))
            .map(|i| {
                let t = self.lo + i as f64 * self.step;
                match self.scale {
                    Scale::Linear => t,
                    Scale::Log2 => t.exp2(),
                    Scale::Log10 => 10f64.powf(t),
                }
            })
            .collect()
    }
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let magnitude = 10f64.powf(raw.log10().floor());
    let r = raw / magnitude;
    let m = if r <= 1.0 {
        1.0
    } else if r <= 2.0 {
        2.0
    } else if r <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * magnitude
}

fn tick_label(v: f64, kind: TickLabels) -> String {
    match kind {
        TickLabels::Bytes if v >= 0.0 => format_size(v.round() as u64),
        _ => format_number(v),
    }
}

fn format_number(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if !(1e-3..1e6).contains(&a) {
        return format!("{v:e}");
    }
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Escapes text for XML content and attribute values (SVG, HTML).
pub fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Control characters other than tab/newline are not allowed in XML 1.0.
            c if (c as u32) < 0x20 && c != '\t' && c != '\n' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

fn colour(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

struct Frame {
    x0: f64,
    y0: f64,
    w: f64,
    h: f64,
}

impl Frame {
    fn new() -> Frame {
        Frame {
            x0: LEFT,
            y0: TOP,
            w: WIDTH - LEFT - RIGHT,
            h: HEIGHT - TOP - BOTTOM,
        }
    }
}

fn svg_open(out: &mut String, title: &str) {
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">
<title>{t}</title>
<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="white"/>
<text x="{cx:.1}" y="28" text-anchor="middle" font-size="16" font-weight="bold">{t}</text>
"#,
        t = xml_escape(title),
        cx = LEFT + (WIDTH - LEFT - RIGHT) / 2.0,
    );
}

/// Axis labels, the frame, and the y ticks with grid lines.
fn draw_y_axis(out: &mut String, f: &Frame, axis: &Axis, kind: TickLabels, label: &str) {
    out.push_str("<g class=\"y-axis\">\n");
    for v in axis.ticks() {
        let Some(fr) = axis.fraction(v) else { continue };
        let y = f.y0 + f.h * (1.0 - fr);
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e0e0e0"/><line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="black"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            f.x0,
            f.x0 + f.w,
            f.x0 - 5.0,
            f.x0,
            f.x0 - 8.0,
            y + 4.0,
            xml_escape(&tick_label(v, kind)),
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="18" y="{cy:.1}" text-anchor="middle" transform="rotate(-90 18 {cy:.1})">{}</text>"#,
        xml_escape(label),
        cy = f.y0 + f.h / 2.0,
    );
    out.push_str("</g>\n");
}

fn draw_frame(out: &mut String, f: &Frame, x_label: &str) {
    let _ = writeln!(
        out,
        r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="black"/>
<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        f.x0,
        f.y0,
        f.w,
        f.h,
        f.x0 + f.w / 2.0,
        HEIGHT - 15.0,
        xml_escape(x_label),
    );
}

/// The legend, right of the plot: a swatch and the name of every series.
fn draw_legend<'a>(out: &mut String, f: &Frame, names: impl Iterator<Item = &'a str>, bars: bool) {
    out.push_str("<g class=\"legend\">\n");
    let x = f.x0 + f.w + 15.0;
    for (i, name) in names.enumerate() {
        let y = f.y0 + 10.0 + i as f64 * 20.0;
        let c = colour(i);
        let swatch = if bars {
            format!(
                r#"<rect x="{x:.1}" y="{:.1}" width="20" height="10" fill="{c}"/>"#,
                y - 5.0
            )
        } else {
            format!(
                r#"<line x1="{x:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{c}" stroke-width="2"/><circle cx="{:.1}" cy="{y:.1}" r="3" fill="{c}"/>"#,
                x + 20.0,
                x + 10.0
            )
        };
        let _ = writeln!(
            out,
            r#"<g class="legend-entry" data-legend="{n}">{swatch}<text x="{:.1}" y="{:.1}">{n}</text></g>"#,
            x + 26.0,
            y + 4.0,
            n = xml_escape(name),
        );
    }
    out.push_str("</g>\n");
}

impl LinePlot {
    /// Renders the plot as a standalone SVG document.
    pub fn to_svg(&self) -> String {
        let xs = if self.x_log2 {
            Scale::Log2
        } else {
            Scale::Linear
        };
        let ys = if self.y_log {
            Scale::Log10
        } else {
            Scale::Linear
        };
        let drawable = |&(x, y): &(f64, f64)| {
            x.is_finite()
                && y.is_finite()
                && (xs == Scale::Linear || x > 0.0)
                && (ys == Scale::Linear || y > 0.0)
        };
        let points = || {
            self.series
                .iter()
                .flat_map(|s| s.points.iter().copied().filter(drawable))
        };
        let x_axis = Axis::fit(xs, points().map(|p| p.0), false);
        let y_axis = Axis::fit(ys, points().map(|p| p.1), true);
        let f = Frame::new();

        let mut out = String::new();
        svg_open(&mut out, &self.title);
        out.push_str("<g class=\"x-axis\">\n");
        for v in x_axis.ticks() {
            let Some(fr) = x_axis.fraction(v) else {
                continue;
            };
            let x = f.x0 + f.w * fr;
            let _ = writeln!(
                out,
                r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#e0e0e0"/><line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="black"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                f.y0,
                f.y0 + f.h,
                f.y0 + f.h,
                f.y0 + f.h + 5.0,
                f.y0 + f.h + 19.0,
                xml_escape(&tick_label(v, self.x_ticks)),
            );
        }
        out.push_str("</g>\n");
        draw_y_axis(&mut out, &f, &y_axis, self.y_ticks, &self.y_label);
        draw_frame(&mut out, &f, &self.x_label);

        for (i, s) in self.series.iter().enumerate() {
            let c = colour(i);
            let name = xml_escape(&s.name);
            let pixels: Vec<(f64, f64)> = s
                .points
                .iter()
                .filter(|p| drawable(p))
                .filter_map(|&(x, y)| {
                    Some((
                        f.x0 + f.w * x_axis.fraction(x)?,
                        f.y0 + f.h * (1.0 - y_axis.fraction(y)?),
                    ))
                })
                .collect();
            let coords: Vec<String> = pixels
                .iter()
                .map(|(x, y)| format!("{x:.1},{y:.1}"))
                .collect();
            let _ = writeln!(
                out,
                r#"<g class="series" data-series="{name}"><title>{name}</title>
<polyline data-series="{name}" points="{}" fill="none" stroke="{c}" stroke-width="2"/>"#,
                coords.join(" ")
            );
            for ((x, y), (dx, dy)) in pixels.iter().zip(s.points.iter().filter(|p| drawable(p))) {
                let _ = writeln!(
                    out,
                    r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{c}"><title>{name}: ({}, {})</title></circle>"#,
                    xml_escape(&tick_label(*dx, self.x_ticks)),
                    xml_escape(&format_number(*dy)),
                );
            }
            out.push_str("</g>\n");
        }
        draw_legend(
            &mut out,
            &f,
            self.series.iter().map(|s| s.name.as_str()),
            false,
        );
        out.push_str("</svg>\n");
        out
    }
}

/// One bar per category for a named series.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct BarSeries {
    pub name: String,
    /// One value per category, in category order; missing or non-finite values draw no bar.
    pub values: Vec<f64>,
}

/// A grouped bar chart: for each category, one bar per series side by side; y axis from zero.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct BarChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub categories: Vec<String>,
    pub series: Vec<BarSeries>,
}

impl BarChart {
    /// Renders the chart as a standalone SVG document.
    pub fn to_svg(&self) -> String {
        let values = self
            .series
            .iter()
            .flat_map(|s| s.values.iter().copied().filter(|v| v.is_finite()));
        let y_axis = Axis::fit(Scale::Linear, values, true);
        let f = Frame::new();
        let mut out = String::new();
        svg_open(&mut out, &self.title);
        draw_y_axis(&mut out, &f, &y_axis, TickLabels::Number, &self.y_label);
        draw_frame(&mut out, &f, &self.x_label);

        let ncat = self.categories.len().max(1) as f64;
        let group_w = f.w / ncat;
        let bar_w = group_w * 0.8 / self.series.len().max(1) as f64;
        out.push_str("<g class=\"x-axis\">\n");
        for (k, cat) in self.categories.iter().enumerate() {
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                f.x0 + group_w * (k as f64 + 0.5),
                f.y0 + f.h + 19.0,
                xml_escape(cat),
            );
        }
        out.push_str("</g>\n");
        let y_of = |v: f64| f.y0 + f.h * (1.0 - y_axis.fraction(v).unwrap_or(0.0));
        let base = y_of(0.0);
        for (i, s) in self.series.iter().enumerate() {
            let name = xml_escape(&s.name);
            let _ = writeln!(
                out,
                r#"<g class="series" data-series="{name}" fill="{}"><title>{name}</title>"#,
                colour(i)
            );
            for (k, &v) in s.values.iter().enumerate().take(self.categories.len()) {
                if !v.is_finite() {
                    continue;
                }
                let x = f.x0 + group_w * (k as f64 + 0.1) + bar_w * i as f64;
                let (top, bottom) = (y_of(v).min(base), y_of(v).max(base));
                let _ = writeln!(
                    out,
                    r#"<rect x="{x:.1}" y="{top:.1}" width="{bar_w:.1}" height="{:.1}"><title>{name}, {}: {}</title></rect>"#,
                    bottom - top,
                    xml_escape(&self.categories[k]),
                    xml_escape(&format_number(v)),
                );
            }
            out.push_str("</g>\n");
        }
        draw_legend(
            &mut out,
            &f,
            self.series.iter().map(|s| s.name.as_str()),
            true,
        );
        out.push_str("</svg>\n");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series_names(doc: &roxmltree::Document) -> Vec<String> {
        doc.descendants()
            .filter(|n| n.has_tag_name("g"))
            .filter_map(|n| n.attribute("data-series").map(str::to_string))
            .collect()
    }

    fn legend_names(doc: &roxmltree::Document) -> Vec<String> {
        doc.descendants()
            .filter_map(|n| n.attribute("data-legend").map(str::to_string))
            .collect()
    }

    fn crc_like_plot() -> LinePlot {
        let sizes = [512.0, 1024.0, 4096.0, 8192.0, 65536.0];
        LinePlot {
            title: "CRC32C cost <per byte> & size".into(),
            x_label: "buffer size".into(),
            y_label: "cycles/byte".into(),
            x_log2: true,
            y_log: true,
            x_ticks: TickLabels::Bytes,
            y_ticks: TickLabels::Number,
            series: vec![
                Series::new("sarwate", sizes.iter().map(|&s| (s, 6.7)).collect()),
                Series::new("slicing-by-8", sizes.iter().map(|&s| (s, 1.9)).collect()),
                Series::new("hw \"3-stream\"", sizes.iter().map(|&s| (s, 0.1)).collect()),
            ],
        }
    }

    #[test]
    fn line_plot_is_well_formed_and_names_every_series() {
        let svg = crc_like_plot().to_svg();
        let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
        let expected = ["sarwate", "slicing-by-8", "hw \"3-stream\""];
        assert_eq!(series_names(&doc), expected);
        assert_eq!(legend_names(&doc), expected);
        // Every series polyline has one coordinate pair per point.
        for p in doc.descendants().filter(|n| n.has_tag_name("polyline")) {
            assert_eq!(p.attribute("points").unwrap().split(' ').count(), 5);
        }
        // Byte-size x tick labels and the escaped title survive parsing.
        let texts: Vec<&str> = doc.descendants().filter_map(|n| n.text()).collect();
        assert!(texts.contains(&"8 KiB"), "{texts:?}");
        assert!(texts.contains(&"512 B"));
        assert!(texts.contains(&"CRC32C cost <per byte> & size"));
    }

    #[test]
    fn log_y_orders_points_by_value() {
        let svg = crc_like_plot().to_svg();
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let first_y = |name: &str| -> f64 {
            let p = doc
                .descendants()
                .find(|n| n.has_tag_name("polyline") && n.attribute("data-series") == Some(name))
                .unwrap();
            let first = p.attribute("points").unwrap().split(' ').next().unwrap();
            first.split(',').nth(1).unwrap().parse().unwrap()
        };
        // SVG y grows downwards: the slowest method is drawn highest.
        assert!(first_y("sarwate") < first_y("slicing-by-8"));
        assert!(first_y("slicing-by-8") < first_y("hw \"3-stream\""));
    }

    #[test]
    fn undrawable_points_are_dropped_and_empty_plots_render() {
        let plot = LinePlot {
            y_log: true,
            series: vec![Series::new(
                "s",
                vec![(1.0, 0.0), (2.0, f64::NAN), (3.0, 5.0), (4.0, -1.0)],
            )],
            ..Default::default()
        };
        let doc_text = plot.to_svg();
        let doc = roxmltree::Document::parse(&doc_text).unwrap();
        let p = doc
            .descendants()
            .find(|n| n.has_tag_name("polyline"))
            .unwrap();
        assert_eq!(p.attribute("points").unwrap().split(' ').count(), 1);
        let empty = LinePlot::default().to_svg();
        roxmltree::Document::parse(&empty).unwrap();
    }

    #[test]
    fn bar_chart_is_well_formed_with_one_bar_per_value() {
        let chart = BarChart {
            title: "throughput".into(),
            x_label: "block size".into(),
            y_label: "MB/s".into(),
            categories: vec!["4 KiB".into(), "64 KiB".into()],
            series: vec![
                BarSeries {
                    name: "tcp".into(),
                    values: vec![100.0, 900.0],
                },
                BarSeries {
                    name: "iser".into(),
                    values: vec![150.0, f64::NAN],
                },
            ],
        };
        let svg = chart.to_svg();
        let doc = roxmltree::Document::parse(&svg).unwrap();
        assert_eq!(series_names(&doc), ["tcp", "iser"]);
        assert_eq!(legend_names(&doc), ["tcp", "iser"]);
        let bars = |name: &str| {
            doc.descendants()
                .find(|n| n.attribute("data-series") == Some(name))
                .unwrap()
                .children()
                .filter(|c| c.has_tag_name("rect"))
                .count()
        };
        assert_eq!(bars("tcp"), 2);
        assert_eq!(bars("iser"), 1);
    }

    #[test]
    fn linear_axis_has_nice_ticks_covering_data() {
        let axis = Axis::fit(Scale::Linear, [0.3, 7.2].into_iter(), true);
        assert_eq!(axis.ticks(), vec![0.0, 2.0, 4.0, 6.0, 8.0]);
        let axis = Axis::fit(Scale::Log10, [0.05, 6.0].into_iter(), false);
        let ticks: Vec<String> = axis.ticks().iter().map(|&t| format_number(t)).collect();
        assert_eq!(
            ticks,
            ["0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "1", "2", "5", "10"]
        );
        let axis = Axis::fit(Scale::Log2, [512.0, 65536.0].into_iter(), false);
        assert_eq!(axis.ticks().first(), Some(&512.0));
        assert_eq!(axis.ticks().last(), Some(&65536.0));
    }

    #[test]
    fn numbers_format_compactly() {
        assert_eq!(format_number(0.1), "0.1");
        assert_eq!(format_number(2.0), "2");
        assert_eq!(format_number(1e7), "1e7");
        assert_eq!(tick_label(8192.0, TickLabels::Bytes), "8 KiB");
    }
}
