//! Plots (PNG and SVG, via plotters), drawn from the written tables so that `merge` redraws
//! them: lease price per class and provider population over time, utilization over time, the
//! wait-time distribution (one panel per sweep point), honest providers' revenue Gini, and
//! (with network reputation) the providers' network scores and the attackers' lease share.
//!
//! Every axis names its quantity and unit (money in GLU). Series are labelled with the sweep
//! point's parameter names and values. Colours are the Okabe-Ito palette (distinguishable
//! with the common colour-vision deficiencies), cycled with solid, dashed and dotted lines,
//! so 24 series stay apart. A series with several replications is drawn as the mean over them
//! with a band for the 95 % percentile-bootstrap interval of the mean. The double-auction
//! experiments' figures are in [`zi`].
//!
//! Text needs a TrueType font, rasterised by pure-Rust `ab_glyph` (no fontconfig or
//! freetype): the file named by `GRIDLEASE_SIM_FONT`, else the first common system font found.
//! Without one, plots are skipped with a warning and every CSV is still written.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;

use crate::metrics::WAIT_BINS_S;
use crate::stats;
use crate::table::Table;

/// Environment variable naming a .ttf file for plot text.
pub const FONT_ENV: &str = "GRIDLEASE_SIM_FONT";

const FONT_CANDIDATES: [&str; 5] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

/// Okabe & Ito (2008) colour-blind-safe palette, yellow last (weakest on white).
const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),   // blue
    RGBColor(230, 159, 0),   // orange
    RGBColor(0, 158, 115),   // bluish green
    RGBColor(213, 94, 0),    // vermillion
    RGBColor(204, 121, 167), // reddish purple
    RGBColor(86, 180, 233),  // sky blue
    RGBColor(0, 0, 0),       // black
    RGBColor(240, 228, 66),  // yellow
];

/// Line styles cycled after the palette: solid, dashed, dotted.
#[derive(Clone, Copy)]
enum Dash {
    Solid,
    Dashed,
    Dotted,
}

fn style_of(i: usize) -> (RGBColor, Dash) {
    let dash = match (i / PALETTE.len()) % 3 {
        0 => Dash::Solid,
        1 => Dash::Dashed,
        _ => Dash::Dotted,
    };
    (PALETTE[i % PALETTE.len()], dash)
}

/// Registers a font once; false when none is available.
fn font_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        let from_env = std::env::var(FONT_ENV).ok();
        let paths = from_env.iter().map(String::as_str).chain(FONT_CANDIDATES);
        for p in paths {
            if let Ok(bytes) = std::fs::read(p) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

/// One x position of a series: the mean over replications and its 95 % percentile-bootstrap
/// interval (the summary's recommended one; none, low = high = mean, below
/// [`stats::MIN_N_FOR_INTERVAL`] values). The band is clipped to the chart's metric bounds.
#[derive(Clone, Copy, Debug)]
struct Stat {
    x: f64,
    mean: f64,
    low: f64,
    high: f64,
    n: usize,
}

impl Stat {
    fn of(x: f64, values: &[f64]) -> Self {
        let (mean, _) = stats::mean_sd(values);
        let ci = if values.len() < stats::MIN_N_FOR_INTERVAL {
            stats::Interval {
                low: mean,
                high: mean,
            }
        } else {
            // Seeded by the values themselves: the same data draw the same band.
            let key = values.iter().fold(stats::key(&format!("{x}")), |h, v| {
                crate::rng::mix64(h ^ v.to_bits())
            });
            let mut rng = crate::rng::stream(0, key, crate::rng::StreamKind::Statistics, 0);
            stats::bootstrap_interval(values, 0.95, 1000, &mut rng)
        };
        Self {
            x,
            mean,
            low: ci.low,
            high: ci.high,
            n: values.len(),
        }
    }
}

/// A labelled series.
struct Line {
    label: String,
    pts: Vec<Stat>,
}

/// Axis and title text of one chart.
struct Labels<'a> {
    title: &'a str,
    x: &'a str,
    y: &'a str,
}

/// `k1=v1, k2=v2` per sweep point, from the parameter columns between `point` and
/// `replication` (keys with one value in the whole sweep are left out unless all are);
/// empty for a run without a sweep.
fn point_labels(t: &Table) -> BTreeMap<u64, String> {
    let (Some(pi), Some(ri)) = (t.col("point"), t.col("replication")) else {
        return BTreeMap::new();
    };
    let varying: Vec<usize> = (pi + 1..ri)
        .filter(|&c| t.rows.iter().any(|r| r[c] != t.rows[0][c]))
        .collect();
    let cols: Vec<usize> = if varying.is_empty() {
        (pi + 1..ri).collect()
    } else {
        varying
    };
    let mut out = BTreeMap::new();
    for r in &t.rows {
        let point: u64 = r[pi].parse().unwrap_or(0);
        out.entry(point).or_insert_with(|| {
            cols.iter()
                .map(|&c| format!("{}={}", t.header[c], r[c]))
                .collect::<Vec<_>>()
                .join(", ")
        });
    }
    out
}

fn join_label(what: &str, params: &str) -> String {
    match (what.is_empty(), params.is_empty()) {
        (_, true) => what.to_string(),
        (true, false) => params.to_string(),
        (false, false) => format!("{what}, {params}"),
    }
}

fn range(lo: f64, hi: f64) -> (f64, f64) {
    if !(lo.is_finite() && hi.is_finite()) || lo > hi {
        (0.0, 1.0)
    } else if hi - lo < 1e-12 {
        let pad = if lo.abs() > 1e-12 {
            lo.abs() * 0.1
        } else {
            0.5
        };
        (lo - pad, hi + pad)
    } else {
        (lo, hi)
    }
}

/// Legend width in pixels for these labels (drawn right of the chart, never over data): the
/// widest label as the font sets it, the key before it and a margin; no wider than that.
fn legend_width(series: &[Line]) -> u32 {
    let font = ("sans-serif", 14).into_font();
    let widest = series
        .iter()
        .map(|l| {
            font.box_size(&l.label)
                .map_or(l.label.chars().count() as u32 * 8, |(w, _)| w)
        })
        .max()
        .unwrap_or(0);
    (widest + 44 + 16).clamp(100, 640)
}

/// One panel of a figure: a caption and its series.
struct Panel {
    caption: String,
    lines: Vec<Line>,
}

fn panel_height(p: &Panel) -> u32 {
    (110 + 20 * p.lines.len() as u32).max(if p.caption.is_empty() { 520 } else { 400 })
}

/// Image size of a figure: room for each panel's legend, one row per entry.
fn figure_size(panels: &[Panel]) -> (u32, u32) {
    let legend = panels
        .iter()
        .map(|p| legend_width(&p.lines))
        .max()
        .unwrap_or(160);
    (
        900 + legend,
        40 + panels.iter().map(panel_height).sum::<u32>(),
    )
}

/// A figure of panels stacked vertically, each a [`line_chart`].
fn line_figure<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    text: &Labels<'_>,
    panels: &[Panel],
    markers_only: bool,
    y_range: (f64, f64),
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("plot {}: {e:?}", text.title);
    root.fill(&WHITE).map_err(e)?;
    let mut rest = root.titled(text.title, ("sans-serif", 20)).map_err(e)?;
    for panel in panels {
        let (area, below) = rest.split_vertically(panel_height(panel));
        rest = below;
        let area = if panel.caption.is_empty() {
            area
        } else {
            area.titled(&panel.caption, ("sans-serif", 16)).map_err(e)?
        };
        line_chart(&area, text, &panel.lines, markers_only, y_range)?;
    }
    root.present().map_err(e)?;
    Ok(())
}

/// A line chart of `series` with 95 % bands where a point has replications (clipped to
/// `y_range` when given: the metric's own bounds). With `markers_only` (x = replication
/// index), points are not joined.
fn line_chart<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    text: &Labels<'_>,
    series: &[Line],
    markers_only: bool,
    y_range: (f64, f64),
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("plot {}: {e:?}", text.title);
    let (w, _) = root.dim_in_pixel();
    let (plot, legend) = root.split_horizontally(w.saturating_sub(legend_width(series)));
    let clip = |v: f64| v.clamp(y_range.0, y_range.1);
    let all = || series.iter().flat_map(|l| l.pts.iter());
    let xs = (
        all().map(|p| p.x).fold(f64::MAX, f64::min),
        all().map(|p| p.x).fold(f64::MIN, f64::max),
    );
    let (x0, x1) = if markers_only && xs.0 <= xs.1 {
        (xs.0 - 0.5, xs.1 + 0.5)
    } else {
        range(xs.0, xs.1)
    };
    // Metrics bounded below (>= 0) keep 0 on the axis; others (an efficiency, which can be
    // below 0) start at their lowest value, so that close values stay apart.
    let floor = if y_range.0.is_finite() {
        0.0f64
    } else {
        f64::INFINITY
    };
    let y_lo = all().map(|p| clip(p.low.min(p.mean))).fold(floor, f64::min);
    let y_hi = all()
        .map(|p| clip(p.high.max(p.mean)))
        .fold(f64::MIN, f64::max);
    let (y0, y1) = range(y_lo, y_hi);
    let y1 = y1 + (y1 - y0) * 0.05;
    let y0 = if floor == 0.0 {
        y0
    } else {
        y0 - (y1 - y0) * 0.05
    };
    let mut chart = ChartBuilder::on(&plot)
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(e)?;
    let int_fmt = |x: &f64| {
        if (x - x.round()).abs() < 1e-9 {
            format!("{x:.0}")
        } else {
            String::new()
        }
    };
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(text.x).y_desc(text.y);
    if markers_only {
        mesh.x_label_formatter(&int_fmt);
    }
    mesh.draw().map_err(e)?;
    for (i, line) in series.iter().enumerate() {
        let (color, dash) = style_of(i);
        if markers_only {
            // Categories, not a line: each mean's interval as a whisker.
            chart.draw_series(whiskers(line, color, clip)).map_err(e)?;
        } else if line.pts.iter().any(|p| p.n >= 2) {
            let mut poly: Vec<(f64, f64)> = line.pts.iter().map(|p| (p.x, clip(p.high))).collect();
            poly.extend(line.pts.iter().rev().map(|p| (p.x, clip(p.low))));
            chart
                .draw_series(std::iter::once(Polygon::new(
                    poly,
                    color.mix(0.15).filled(),
                )))
                .map_err(e)?;
        }
        let pts: Vec<(f64, f64)> = line.pts.iter().map(|p| (p.x, p.mean)).collect();
        if pts.len() <= 12 || markers_only {
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(e)?;
        }
        if markers_only {
            continue;
        }
        let stroke = color.stroke_width(2);
        match dash {
            Dash::Solid => chart
                .draw_series(LineSeries::new(pts.iter().copied(), stroke))
                .map_err(e)?,
            Dash::Dashed => chart
                .draw_series(DashedLineSeries::new(pts.iter().copied(), 9, 5, stroke))
                .map_err(e)?,
            Dash::Dotted => chart
                .draw_series(DashedLineSeries::new(pts.iter().copied(), 2, 4, stroke))
                .map_err(e)?,
        };
    }
    draw_legend(&legend, series, markers_only).map_err(e)
}

/// Each point's interval of `line` as a vertical whisker (points without one: none), clipped.
fn whiskers<'a>(
    line: &'a Line,
    color: RGBColor,
    clip: impl Fn(f64) -> f64 + 'a,
) -> impl Iterator<Item = PathElement<(f64, f64)>> + 'a {
    line.pts.iter().filter(|p| p.high > p.low).map(move |p| {
        PathElement::new(
            vec![(p.x, clip(p.low)), (p.x, clip(p.high))],
            color.stroke_width(2),
        )
    })
}

/// The legend, right of a chart: one entry per series in drawing order (a dot for markers,
/// else the series' line style) and its label.
fn draw_legend<DB: DrawingBackend>(
    legend: &DrawingArea<DB, Shift>,
    series: &[Line],
    markers_only: bool,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    for (i, line) in series.iter().enumerate() {
        let (color, dash) = style_of(i);
        let y = 30 + 20 * i as i32;
        let stroke = color.stroke_width(2);
        let seg = vec![(8, y), (36, y)];
        match (markers_only, dash) {
            (true, _) => legend.draw(&Circle::new((22, y), 4, color.filled()))?,
            (false, Dash::Solid) => legend.draw(&PathElement::new(seg, stroke))?,
            (false, Dash::Dashed) => legend.draw(&DashedPathElement::new(seg, 9, 5, stroke))?,
            (false, Dash::Dotted) => legend.draw(&DashedPathElement::new(seg, 2, 4, stroke))?,
        }
        legend.draw(&Text::new(
            line.label.clone(),
            (44, y - 7),
            ("sans-serif", 14).into_font(),
        ))?;
    }
    Ok(())
}

/// Renders `draw` to `<stem>.png` and `<stem>.svg`.
fn both(
    dir: &Path,
    stem: &str,
    size: (u32, u32),
    draw: &dyn Fn(Canvas) -> Result<()>,
) -> Result<Vec<String>> {
    draw(Canvas::Png(dir.join(format!("{stem}.png")), size))?;
    draw(Canvas::Svg(dir.join(format!("{stem}.svg")), size))?;
    Ok(vec![format!("{stem}.png"), format!("{stem}.svg")])
}

/// Where a chart goes.
enum Canvas {
    Png(std::path::PathBuf, (u32, u32)),
    Svg(std::path::PathBuf, (u32, u32)),
}

macro_rules! on_canvas {
    ($canvas:expr, |$root:ident| $body:expr) => {
        match $canvas {
            Canvas::Png(path, size) => {
                let $root = BitMapBackend::new(&path, size).into_drawing_area();
                $body
            }
            Canvas::Svg(path, size) => {
                let $root = SVGBackend::new(&path, size).into_drawing_area();
                $body
            }
        }
    };
}

// After `on_canvas!`: a macro is in scope only below its definition.
pub mod zi;

/// Per (point, t): the values of column `col` over replications, from `buckets.csv`; with
/// `weight`, only buckets where that column is above zero (a price where leases started).
fn bucket_series(
    b: &Table,
    col: usize,
    weight: Option<usize>,
) -> BTreeMap<u64, BTreeMap<u64, Vec<f64>>> {
    let mut acc: BTreeMap<u64, BTreeMap<u64, Vec<f64>>> = BTreeMap::new();
    let (Some(ti), Some(pi)) = (b.col("t_start_h"), b.col("point")) else {
        return acc;
    };
    for r in &b.rows {
        if weight.is_some_and(|w| r[w].parse::<f64>().unwrap_or(0.0) <= 0.0) {
            continue;
        }
        let (Ok(point), Ok(t), Ok(v)) = (
            r[pi].parse::<u64>(),
            r[ti].parse::<f64>(),
            r[col].parse::<f64>(),
        ) else {
            continue;
        };
        acc.entry(point)
            .or_default()
            .entry((t * 1000.0).round() as u64)
            .or_default()
            .push(v);
    }
    acc
}

fn lines_from(
    acc: BTreeMap<u64, BTreeMap<u64, Vec<f64>>>,
    what: &str,
    labels: &BTreeMap<u64, String>,
) -> Vec<Line> {
    acc.into_iter()
        .map(|(point, by_t)| Line {
            label: join_label(what, labels.get(&point).map_or("", String::as_str)),
            pts: by_t
                .into_iter()
                .map(|(t, vs)| Stat::of(t as f64 / 1000.0, &vs))
                .collect(),
        })
        .collect()
}

fn replications(t: &Table) -> usize {
    let Some(ri) = t.col("replication") else {
        return 0;
    };
    let mut reps: Vec<&str> = t.rows.iter().map(|r| r[ri].as_str()).collect();
    reps.sort_unstable();
    reps.dedup();
    reps.len()
}

fn band_note(reps: usize) -> String {
    if reps >= stats::MIN_N_FOR_INTERVAL {
        format!("mean of {reps} replications, band: 95 % bootstrap interval")
    } else if reps >= 2 {
        format!(
            "mean of {reps} replications (no band: fewer than {})",
            stats::MIN_N_FOR_INTERVAL
        )
    } else {
        "1 replication".to_string()
    }
}

/// Adds `lines` (labelled by their sweep point's parameters) as a panel captioned `what`
/// when `own_panel`, else into one shared panel with `what` joined to each label.
fn add_panel(panels: &mut Vec<Panel>, own_panel: bool, what: String, mut lines: Vec<Line>) {
    if own_panel {
        panels.push(Panel {
            caption: what,
            lines,
        });
        return;
    }
    for l in &mut lines {
        l.label = join_label(&what, &l.label);
    }
    match panels.first_mut() {
        Some(p) => p.lines.extend(lines),
        None => panels.push(Panel {
            caption: String::new(),
            lines,
        }),
    }
}

/// Draws every plot into `dir`; returns the files written (none without a font).
pub fn all(dir: &Path, runs: &Table, buckets: &Table, waits: &Table) -> Result<Vec<String>> {
    if !font_ready() {
        tracing_warn("no TrueType font found (set GRIDLEASE_SIM_FONT); plots skipped");
        return Ok(Vec::new());
    }
    let labels = point_labels(runs);
    let reps = replications(runs);
    let note = band_note(reps);
    let mut files = Vec::new();

    // Lease price per class and population; a population without leases is left out, and
    // without attackers the population is not named.
    let attackers = runs
        .col("attacker_leases")
        .is_some_and(|c| runs.rows.iter().any(|r| r[c] != "0"));
    // Without a sweep every series shares one panel; with one, each (population, class) gets
    // a panel whose series are the sweep points (same style for a point in every panel).
    let swept = labels.values().any(|l| !l.is_empty());
    let mut price: Vec<Panel> = Vec::new();
    for (i, h) in buckets.header.iter().enumerate() {
        let Some((pop, class)) = h.split_once("_price_") else {
            continue;
        };
        let Some(w) = buckets.col(&format!("{pop}_gpus_{class}")) else {
            continue;
        };
        let what = if attackers {
            format!("{pop} {class}")
        } else {
            class.to_string()
        };
        let lines = lines_from(bucket_series(buckets, i, Some(w)), "", &labels);
        if lines.is_empty() {
            continue;
        }
        add_panel(&mut price, swept, what, lines);
    }
    let title = format!("Mean lease price per GPU-hour by class ({note})");
    files.extend(both(dir, "price", figure_size(&price), &|canvas| {
        on_canvas!(canvas, |root| line_figure(
            &root,
            &Labels {
                title: &title,
                x: "time since start (h)",
                y: "price (GLU per GPU-hour)",
            },
            &price,
            false,
            (0.0, f64::INFINITY),
        ))
    })?);

    // Utilization; per population when the market has attackers.
    let cols: &[(&str, &str)] = if attackers {
        &[
            ("honest_utilization", "honest providers"),
            ("attacker_utilization", "attacker providers"),
        ]
    } else {
        &[("utilization", "all providers")]
    };
    let mut util: Vec<Panel> = Vec::new();
    for &(c, what) in cols {
        if let Some(ci) = buckets.col(c) {
            let lines = lines_from(bucket_series(buckets, ci, None), "", &labels);
            add_panel(&mut util, swept && attackers, what.to_string(), lines);
        }
    }
    let title = format!("GPU utilization ({note})");
    files.extend(both(dir, "utilization", figure_size(&util), &|canvas| {
        on_canvas!(canvas, |root| line_figure(
            &root,
            &Labels {
                title: &title,
                x: "time since start (h)",
                y: "utilization (leased / online GPU-time, ratio)",
            },
            &util,
            false,
            (0.0, 1.0),
        ))
    })?);

    files.extend(wait_plot(dir, waits, &labels)?);
    files.extend(gini_plot(dir, runs, &labels)?);
    files.extend(welfare_plot(dir, runs, &labels)?);
    files.extend(reputation_plot(dir, buckets, &labels, &note)?);
    Ok(files)
}

/// Network reputation (only when `buckets.csv` has its columns): the mean network score of
/// honest and of attacker providers, and the attackers' share of the leases started, over
/// time; a panel each, a series per sweep point.
fn reputation_plot(
    dir: &Path,
    buckets: &Table,
    labels: &BTreeMap<u64, String>,
    note: &str,
) -> Result<Vec<String>> {
    if buckets.col("honest_score").is_none() {
        return Ok(Vec::new());
    }
    let mut panels: Vec<Panel> = Vec::new();
    for (c, what) in [
        ("honest_score", "honest providers: mean network score"),
        ("attacker_score", "attacker providers: mean network score"),
        (
            "attacker_share",
            "attacker providers: share of leases started",
        ),
    ] {
        if let Some(ci) = buckets.col(c) {
            let lines = lines_from(bucket_series(buckets, ci, None), "", labels);
            add_panel(&mut panels, true, what.to_string(), lines);
        }
    }
    let title = format!("Network reputation ({note})");
    both(dir, "reputation", figure_size(&panels), &|canvas| {
        on_canvas!(canvas, |root| line_figure(
            &root,
            &Labels {
                title: &title,
                x: "time since start (h)",
                y: "score or share (ratio)",
            },
            &panels,
            false,
            (0.0, 1.0),
        ))
    })
}

/// One histogram per sweep point: per bin, the share of matched jobs (pooled over
/// replications) as a bar spanning the bin's real edges on a log axis, with the 95 % t
/// interval of the per-replication shares as an error bar.
struct WaitPanel {
    label: String,
    /// Per bin (as in `WAIT_BINS_S`, plus the open bin): per replication share, percent.
    shares: Vec<Vec<f64>>,
    pooled: Vec<f64>,
    jobs: f64,
}

fn wait_panels(waits: &Table, labels: &BTreeMap<u64, String>) -> Vec<WaitPanel> {
    let (Some(pi), Some(ri), Some(bi), Some(ci)) = (
        waits.col("point"),
        waits.col("replication"),
        waits.col("bin_upper_s"),
        waits.col("count"),
    ) else {
        return Vec::new();
    };
    let nbins = WAIT_BINS_S.len() + 1;
    // point -> replication -> counts per bin
    let mut acc: BTreeMap<u64, BTreeMap<u64, Vec<f64>>> = BTreeMap::new();
    for r in &waits.rows {
        let bin = WAIT_BINS_S
            .iter()
            .position(|e| e.to_string() == r[bi])
            .unwrap_or(nbins - 1);
        let counts = acc
            .entry(r[pi].parse().unwrap_or(0))
            .or_default()
            .entry(r[ri].parse().unwrap_or(0))
            .or_insert_with(|| vec![0.0; nbins]);
        counts[bin] += r[ci].parse::<f64>().unwrap_or(0.0);
    }
    acc.into_iter()
        .map(|(point, by_rep)| {
            let mut shares = vec![Vec::new(); nbins];
            let mut pooled = vec![0.0; nbins];
            for counts in by_rep.values() {
                let total: f64 = counts.iter().sum();
                for (b, &c) in counts.iter().enumerate() {
                    pooled[b] += c;
                    if total > 0.0 {
                        shares[b].push(100.0 * c / total);
                    }
                }
            }
            let jobs: f64 = pooled.iter().sum();
            for p in &mut pooled {
                *p = if jobs > 0.0 { 100.0 * *p / jobs } else { 0.0 };
            }
            WaitPanel {
                label: labels.get(&point).cloned().unwrap_or_default(),
                shares,
                pooled,
                jobs,
            }
        })
        .collect()
}

/// Where the zero-wait bar is drawn on the log wait axis (seconds; the axis starts at its left
/// edge and is labelled from 1 s).
const WAIT_ZERO_SLOT: (f64, f64) = (0.15, 0.45);
/// The wait figure's lowest share, percent (its log axis cannot start at 0).
const WAIT_SHARE_FLOOR: f64 = 0.01;

/// `area` below `text`, drawn centred in as many lines of `size` pixels as it needs to fit the
/// area's width (broken after commas, else at spaces): a caption never runs past its panel.
fn titled_lines<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    text: &str,
    size: u32,
) -> Result<DrawingArea<DB, Shift>, DrawingAreaErrorKind<DB::ErrorType>> {
    let (w, _) = area.dim_in_pixel();
    let font = ("sans-serif", size).into_font();
    let fits = |s: &str| {
        font.box_size(s)
            .map_or(s.chars().count() as u32 * size * 6 / 10, |(x, _)| x)
            + 16
            <= w
    };
    let mut out = area.clone();
    for line in wrap(text, &fits) {
        out = out.titled(&line, font.clone())?;
    }
    Ok(out)
}

/// `text` in lines that each `fits`, broken after a comma or semicolon where one does, else at a
/// space; a single word longer than a line stays whole.
fn wrap(text: &str, fits: &dyn Fn(&str) -> bool) -> Vec<String> {
    let words: Vec<&str> = text.split(' ').collect();
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    for (i, w) in words.iter().enumerate() {
        let next = if cur.is_empty() {
            w.to_string()
        } else {
            format!("{cur} {w}")
        };
        if fits(&next) || cur.is_empty() {
            cur = next;
            continue;
        }
        // Break at the last comma or semicolon of this line when there is one.
        match cur.rfind([',', ';']) {
            Some(at) if at + 1 < cur.len() && i > 0 => {
                let rest = cur[at + 1..].trim().to_string();
                cur.truncate(at + 1);
                lines.push(std::mem::take(&mut cur));
                cur = format!("{rest} {w}");
                if !fits(&cur) {
                    lines.push(rest);
                    cur = w.to_string();
                }
            }
            _ => {
                lines.push(std::mem::take(&mut cur));
                cur = w.to_string();
            }
        }
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines
}

/// Bin `b`'s edges in seconds on the plot: (previous edge, edge]; the open bin is drawn to
/// twice the last edge. Bin 0 (a wait of exactly 0 s) has no width and is given as text.
fn bin_edges(b: usize) -> (f64, f64) {
    let last = WAIT_BINS_S[WAIT_BINS_S.len() - 1] as f64;
    match b {
        0 => (0.0, 0.0),
        _ if b >= WAIT_BINS_S.len() => (last, 2.0 * last),
        _ => (WAIT_BINS_S[b - 1] as f64, WAIT_BINS_S[b] as f64),
    }
}

fn wait_chart<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    panels: &[WaitPanel],
    reps: usize,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("plot waits: {e:?}");
    root.fill(&WHITE).map_err(e)?;
    let title = format!(
        "Wait to lease of first submissions ({})",
        if reps >= 2 {
            format!("{reps} replications pooled; whiskers: 95 % t interval of the share")
        } else {
            "1 replication".into()
        }
    );
    let root = titled_lines(root, &title, 20).map_err(e)?;
    let cols = (panels.len() as f64).sqrt().ceil().max(1.0) as usize;
    let rows = panels.len().div_ceil(cols).max(1);
    let last = WAIT_BINS_S[WAIT_BINS_S.len() - 1] as f64;
    // The zero-wait bar's slot, left of the first bin (0 s has no width on a log axis).
    let zero = (WAIT_ZERO_SLOT.0, WAIT_ZERO_SLOT.1);
    for (k, area) in root.split_evenly((rows, cols)).iter().enumerate() {
        let Some(panel) = panels.get(k) else {
            continue;
        };
        let (color, _) = style_of(k);
        let caption = format!(
            "{}: {} matched jobs, {:.1} % with no wait (grey bar)",
            if panel.label.is_empty() {
                "all jobs"
            } else {
                panel.label.as_str()
            },
            panel.jobs,
            panel.pooled[0]
        );
        let area = titled_lines(area, &caption, 15).map_err(e)?;
        // Shares on a log axis from 0.01 %: a bin with one job in ten thousand still shows
        // beside a zero-wait bar of 99.8 %.
        let floor = WAIT_SHARE_FLOOR;
        let mut chart = ChartBuilder::on(&area)
            .margin(10)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(
                (zero.0..2.0 * last).log_scale(),
                (floor..100.0f64).log_scale(),
            )
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc("wait (s, log scale; last bar: over 28800 s)")
            .y_desc("share of matched jobs (%, log scale)")
            .x_label_formatter(&|x| {
                if *x >= 1.0 {
                    format!("{x:.0}")
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|y| format!("{y}"))
            .light_line_style(TRANSPARENT)
            .draw()
            .map_err(e)?;
        // Bin 1, (0 s, 1 s], is drawn from 0.5 s: right of the zero-wait slot.
        let bar = |b: usize| {
            let (lo, hi) = bin_edges(b);
            [(lo.max(0.5), floor), (hi, panel.pooled[b].max(floor))]
        };
        let zero_bar = [(zero.0, floor), (zero.1, panel.pooled[0].max(floor))];
        chart
            .draw_series(std::iter::once(Rectangle::new(
                zero_bar,
                RGBColor(120, 120, 120).mix(0.8).filled(),
            )))
            .map_err(e)?;
        chart
            .draw_series(
                (1..panel.pooled.len()).map(|b| Rectangle::new(bar(b), color.mix(0.55).filled())),
            )
            .map_err(e)?;
        chart
            .draw_series((1..panel.pooled.len()).map(|b| Rectangle::new(bar(b), color)))
            .map_err(e)?;
        if reps >= 2 {
            chart
                .draw_series((0..panel.pooled.len()).filter_map(|b| {
                    let ci = stats::t_interval(&panel.shares[b], 0.95);
                    let (lo, hi) = if b == 0 { zero } else { bin_edges(b) };
                    let mid = (lo.max(zero.0) * hi).sqrt();
                    (ci.high > ci.low && ci.high > floor).then(|| {
                        PathElement::new(
                            vec![(mid, ci.low.clamp(floor, 100.0)), (mid, ci.high.min(100.0))],
                            BLACK.stroke_width(1),
                        )
                    })
                }))
                .map_err(e)?;
        }
    }
    root.present().map_err(e)?;
    Ok(())
}

fn wait_plot(dir: &Path, waits: &Table, labels: &BTreeMap<u64, String>) -> Result<Vec<String>> {
    let panels = wait_panels(waits, labels);
    if panels.is_empty() {
        return Ok(Vec::new());
    }
    let reps = replications(waits);
    let cols = (panels.len() as f64).sqrt().ceil().max(1.0) as u32;
    let rows = (panels.len() as u32).div_ceil(cols);
    let size = (
        (560 * cols).clamp(1000, 2400),
        (40 + 420 * rows).clamp(560, 2400),
    );
    both(dir, "waits", size, &|canvas| {
        on_canvas!(canvas, |root| wait_chart(&root, &panels, reps))
    })
}

/// Honest providers' revenue Gini. When the first swept key is numeric with several values:
/// against that value, the mean over replications with its 95 % band, one series per setting
/// of the other swept keys. Otherwise (a run, or a first key that is not a number): each sweep
/// point's mean over replications as a dot at its number (1, 2, ...), its 95 % bootstrap
/// interval as a whisker, one series per point (no plot against the replication index: its
/// order means nothing).
fn gini_plot(dir: &Path, runs: &Table, labels: &BTreeMap<u64, String>) -> Result<Vec<String>> {
    point_plot(
        dir,
        runs,
        labels,
        &PointPlot {
            column: "revenue_gini",
            stem: "revenue_gini",
            title: "Revenue Gini across honest providers (0 = equal, 1 = one takes all)",
            y: "Gini coefficient (ratio)",
            bounds: (0.0, 1.0),
        },
    )
}

/// Allocative efficiency of each run (realised / maximum surplus, `crate::welfare`), drawn as
/// the Gini is: against the first swept value, or a dot per sweep point with its interval.
fn welfare_plot(dir: &Path, runs: &Table, labels: &BTreeMap<u64, String>) -> Result<Vec<String>> {
    point_plot(
        dir,
        runs,
        labels,
        &PointPlot {
            column: "welfare_efficiency",
            stem: "welfare",
            title: "Allocative efficiency (realised / maximum surplus of each period's GPU-hour market)",
            y: "efficiency (ratio)",
            bounds: (f64::NEG_INFINITY, 1.0),
        },
    )
}

/// A per-run metric plotted per sweep point.
struct PointPlot<'a> {
    column: &'a str,
    stem: &'a str,
    title: &'a str,
    y: &'a str,
    bounds: (f64, f64),
}

/// `what`'s column of `runs.csv` per sweep point: against the first swept value when it is a
/// number with several values (a series per setting of the other keys, the mean over
/// replications with its band), else a dot per point with its interval as a whisker. Runs
/// without a value (an empty cell) are left out.
fn point_plot(
    dir: &Path,
    runs: &Table,
    labels: &BTreeMap<u64, String>,
    what: &PointPlot<'_>,
) -> Result<Vec<String>> {
    let (Some(pi), Some(ri), Some(gi)) = (
        runs.col("point"),
        runs.col("replication"),
        runs.col(what.column),
    ) else {
        return Ok(Vec::new());
    };
    let rows: Vec<&Vec<String>> = runs
        .rows
        .iter()
        .filter(|r| r[gi].parse::<f64>().is_ok())
        .collect();
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let value = |r: &Vec<String>| r[gi].parse::<f64>().unwrap_or(0.0);
    let first_numeric = ri > pi + 1 && rows.iter().all(|r| r[pi + 1].parse::<f64>().is_ok());
    let distinct = {
        let mut v: Vec<&str> = rows.iter().map(|r| r[(pi + 1).min(ri)].as_str()).collect();
        v.sort_unstable();
        v.dedup();
        v.len()
    };
    let mut series: Vec<Line> = Vec::new();
    let (x_label, markers_only) = if first_numeric && distinct > 1 {
        let key = runs.header[pi + 1].clone();
        // other keys' setting -> x -> values
        let mut acc: BTreeMap<String, BTreeMap<u64, (f64, Vec<f64>)>> = BTreeMap::new();
        for r in &rows {
            let rest = (pi + 2..ri)
                .map(|c| format!("{}={}", runs.header[c], r[c]))
                .collect::<Vec<_>>()
                .join(", ");
            let x: f64 = r[pi + 1].parse().unwrap_or(0.0);
            acc.entry(rest)
                .or_default()
                .entry(x.to_bits())
                .or_insert((x, Vec::new()))
                .1
                .push(value(r));
        }
        for (rest, by_x) in acc {
            let mut pts: Vec<Stat> = by_x.values().map(|(x, gs)| Stat::of(*x, gs)).collect();
            pts.sort_by(|a, b| a.x.total_cmp(&b.x));
            series.push(Line {
                label: if rest.is_empty() {
                    "mean over replications".into()
                } else {
                    rest
                },
                pts,
            });
        }
        (format!("{key} (swept value)"), false)
    } else {
        let mut by_point: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
        for r in &rows {
            let p: u64 = r[pi].parse().unwrap_or(0);
            by_point.entry(p).or_default().push(value(r));
        }
        let points = by_point.len();
        for (k, (p, gs)) in by_point.into_iter().enumerate() {
            let label = labels.get(&p).cloned().unwrap_or_default();
            series.push(Line {
                label: if label.is_empty() {
                    "mean over replications".into()
                } else {
                    label
                },
                pts: vec![Stat::of((k + 1) as f64, &gs)],
            });
        }
        let x = if points > 1 {
            "sweep point (mean over replications)"
        } else {
            "the run (mean over replications)"
        };
        (x.to_string(), true)
    };
    let title = what.title;
    let panels = [Panel {
        caption: String::new(),
        lines: series,
    }];
    both(dir, what.stem, figure_size(&panels), &|canvas| {
        on_canvas!(canvas, |root| line_figure(
            &root,
            &Labels {
                title,
                x: &x_label,
                y: what.y,
            },
            &panels,
            markers_only,
            what.bounds,
        ))
    })
}

#[allow(clippy::print_stderr)]
fn tracing_warn(msg: &str) {
    eprintln!("warning: {msg}");
}

#[cfg(test)]
mod tests {
    use super::wrap;

    #[test]
    fn captions_wrap_after_commas_and_keep_every_word() {
        let fits = |s: &str| s.chars().count() <= 30;
        let text = "providers.count=30, renter_rate=0.5: 1537 matched jobs, 99.9 % with no wait";
        let lines = wrap(text, &fits);
        assert!(lines.iter().all(|l| fits(l)), "{lines:?}");
        assert_eq!(lines.join(" "), text);
        assert_eq!(lines[0], "providers.count=30,");
        // A word longer than a line stays whole, on its own line.
        let long = wrap("a very-very-very-very-long-word-indeed b", &fits);
        assert_eq!(long, ["a", "very-very-very-very-long-word-indeed", "b"]);
        assert_eq!(wrap("short", &fits), ["short"]);
    }
}
