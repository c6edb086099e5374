//! Plots (PNG and SVG, via plotters): clearing price over time, utilization over time, the
//! wait-time distribution, and provider revenue Gini per replication.
//!
//! Text needs a TrueType font, rasterised by pure-Rust `ab_glyph` (no fontconfig or
//! freetype): the file named by `GRIDLEASE_SIM_FONT`, else the first common system font found.
//! Without one, plots are skipped with a warning and every CSV is still written.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::output::Table;

/// Environment variable naming a .ttf file for plot text.
pub const FONT_ENV: &str = "GRIDLEASE_SIM_FONT";

const FONT_CANDIDATES: [&str; 5] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

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

type Series = Vec<(String, Vec<(f64, f64)>)>;

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &Series,
    points_only: bool,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("plot {title}: {e:?}");
    root.fill(&WHITE).map_err(e)?;
    let all = series.iter().flat_map(|(_, v)| v.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, 0.0f64, f64::MIN);
    for &(x, y) in all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y1) = (0.0, 1.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, y0..y1 * 1.05)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .draw()
        .map_err(e)?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        if points_only {
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(e)?
                .label(name.clone())
                .legend(move |(x, y)| Circle::new((x + 10, y), 4, color.filled()));
        } else {
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                .map_err(e)?
                .label(name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

fn both(
    dir: &Path,
    stem: &str,
    title: &str,
    xl: &str,
    yl: &str,
    s: &Series,
    pts: bool,
) -> Result<Vec<String>> {
    let png = dir.join(format!("{stem}.png"));
    let svg = dir.join(format!("{stem}.svg"));
    draw(
        BitMapBackend::new(&png, (960, 540)).into_drawing_area(),
        title,
        xl,
        yl,
        s,
        pts,
    )?;
    draw(
        SVGBackend::new(&svg, (960, 540)).into_drawing_area(),
        title,
        xl,
        yl,
        s,
        pts,
    )?;
    Ok(vec![format!("{stem}.png"), format!("{stem}.svg")])
}

/// Mean over replications of column `col` per (point, time), from `buckets.csv`.
/// With `skip_zero`, zero cells (a price in a bucket without leases) are left out of the mean.
fn bucket_means(b: &Table, col: usize, label: &str, skip_zero: bool) -> Series {
    let (Some(ti), Some(pi)) = (b.col("t_start_h"), b.col("point")) else {
        return Vec::new();
    };
    // (point, t) -> (sum, n); tables are sorted by point, replication, bucket.
    let mut acc: std::collections::BTreeMap<(u64, u64), (f64, f64)> = Default::default();
    for r in &b.rows {
        let point: u64 = r[pi].parse().unwrap_or(0);
        let t: f64 = r[ti].parse().unwrap_or(0.0);
        let Ok(v) = r[col].parse::<f64>() else {
            continue;
        };
        if skip_zero && v == 0.0 {
            continue;
        }
        let e = acc.entry((point, (t * 1000.0) as u64)).or_default();
        e.0 += v;
        e.1 += 1.0;
    }
    let mut out: Series = Vec::new();
    for ((point, t), (s, n)) in acc {
        let name = format!("{label} (point {point})");
        if out.last().is_none_or(|(l, _)| *l != name) {
            out.push((name, Vec::new()));
        }
        if let Some(last) = out.last_mut() {
            last.1.push((t as f64 / 1000.0, s / n));
        }
    }
    out
}

/// Draws every plot into `dir`; returns the files written (none without a font).
pub fn all(dir: &Path, runs: &Table, buckets: &Table, waits: &Table) -> Result<Vec<String>> {
    if !font_ready() {
        tracing_warn("no TrueType font found (set GRIDLEASE_SIM_FONT); plots skipped");
        return Ok(Vec::new());
    }
    let mut files = Vec::new();
    // Price per class over time. Buckets without leases have price 0; drop them.
    let mut price: Series = Vec::new();
    for (i, h) in buckets.header.iter().enumerate() {
        if let Some(class) = h.strip_prefix("honest_price_") {
            for (name, pts) in bucket_means(buckets, i, class, true) {
                price.push((name, pts.into_iter().filter(|p| p.1 > 0.0).collect()));
            }
        }
    }
    files.extend(both(
        dir,
        "price",
        "Mean clearing price per GPU-hour",
        "hours",
        "price",
        &price,
        false,
    )?);
    if let Some(u) = buckets.col("utilization") {
        let s = bucket_means(buckets, u, "utilization", false);
        files.extend(both(
            dir,
            "utilization",
            "GPU utilization",
            "hours",
            "busy / online",
            &s,
            false,
        )?);
    }
    // Wait-time distribution: share of matched jobs per bin, per point.
    if let (Some(pi), Some(bi), Some(ci)) = (
        waits.col("point"),
        waits.col("bin_upper_s"),
        waits.col("count"),
    ) {
        let mut acc: std::collections::BTreeMap<(u64, u64), f64> = Default::default();
        let mut bins: Vec<String> = Vec::new();
        for r in &waits.rows {
            if !bins.contains(&r[bi]) {
                bins.push(r[bi].clone());
            }
            let k = bins.iter().position(|b| *b == r[bi]).unwrap_or(0) as u64;
            *acc.entry((r[pi].parse().unwrap_or(0), k)).or_default() +=
                r[ci].parse::<f64>().unwrap_or(0.0);
        }
        let mut s: Series = Vec::new();
        let mut points: Vec<u64> = acc.keys().map(|k| k.0).collect();
        points.dedup();
        for p in points {
            let total: f64 = acc.range((p, 0)..=(p, u64::MAX)).map(|(_, v)| v).sum();
            let pts = acc
                .range((p, 0)..=(p, u64::MAX))
                .map(|(&(_, k), &v)| (k as f64, if total > 0.0 { v / total } else { 0.0 }))
                .collect();
            s.push((format!("point {p}"), pts));
        }
        let xl = format!("wait bin (upper edges s: {})", bins.join(" "));
        files.extend(both(
            dir,
            "waits",
            "Wait-time distribution",
            &xl,
            "share of matched jobs",
            &s,
            false,
        )?);
    }
    if let (Some(pi), Some(gi)) = (runs.col("point"), runs.col("revenue_gini")) {
        let pts = runs
            .rows
            .iter()
            .map(|r| (r[pi].parse().unwrap_or(0.0), r[gi].parse().unwrap_or(0.0)))
            .collect();
        let s = vec![("replication".to_string(), pts)];
        files.extend(both(
            dir,
            "revenue_gini",
            "Provider revenue Gini",
            "sweep point",
            "Gini",
            &s,
            true,
        )?);
    }
    Ok(files)
}

#[allow(clippy::print_stderr)]
fn tracing_warn(msg: &str) {
    eprintln!("warning: {msg}");
}
