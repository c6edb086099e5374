//! The double-auction experiments' figures (`gridlease-sim zi`), after Gode & Sunder (1993):
//!
//! - `prices`: one session's transaction prices in trade order across its periods, a panel per
//!   (treatment, period length), the equilibrium price range as a grey band and the periods
//!   parted by dashed lines (the paper's figures of price paths);
//! - `efficiency`: each market's allocative efficiency, the mean over replications with its
//!   95 % percentile-bootstrap interval as a whisker, one series per (treatment, period
//!   length) (the paper's table 1 as a figure).

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;

use super::{Canvas, Line, Stat, both, font_ready, legend_width, range, style_of, tracing_warn};
use crate::zi::Equilibrium;
use crate::zi::experiment::{Experiment, Replication, length_label};

/// Height of one price panel, pixels.
const PRICE_PANEL: u32 = 300;

/// `prices.png`/`.svg`: replication 1's price path of every (treatment, period length).
pub fn prices(dir: &Path, e: &Experiment, reps: &[Replication]) -> Result<Vec<String>> {
    if !font_ready() {
        tracing_warn("no TrueType font found (set GRIDLEASE_SIM_FONT); plots skipped");
        return Ok(Vec::new());
    }
    let eq = e.equilibrium();
    let mut panels: Vec<(String, &Replication)> = Vec::new();
    for (ti, tr) in e.treatments.iter().enumerate() {
        for length in e.lengths() {
            if let Some(r) = reps
                .iter()
                .find(|r| r.treatment == ti && r.length == length && r.replication == 0)
            {
                let caption = format!(
                    "{}, periods of {}: replication 1, {} trades in {} periods",
                    tr.name,
                    length_label(length),
                    r.prices().count(),
                    r.periods.len()
                );
                panels.push((caption, r));
            }
        }
    }
    let band = if eq.price_low == eq.price_high {
        format!("equilibrium price {}", eq.price_low)
    } else {
        format!("equilibrium prices {}..{}", eq.price_low, eq.price_high)
    };
    let title = format!("{}: transaction prices by trade (grey: {band})", e.name);
    let size = (1000, 50 + PRICE_PANEL * panels.len().max(1) as u32);
    let (lo, hi) = (e.min_price as f64, e.max_price as f64);
    both(dir, "prices", size, &|canvas| {
        on_canvas!(canvas, |root| price_figure(
            &root, &title, &panels, eq, lo, hi
        ))
    })
}

fn price_figure<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    panels: &[(String, &Replication)],
    eq: Equilibrium,
    lo: f64,
    hi: f64,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("plot prices: {e:?}");
    root.fill(&WHITE).map_err(e)?;
    let mut rest = root.titled(title, ("sans-serif", 20)).map_err(e)?;
    let grey = RGBColor(150, 150, 150);
    for (caption, r) in panels {
        let (area, below) = rest.split_vertically(PRICE_PANEL);
        rest = below;
        let area = area.titled(caption, ("sans-serif", 16)).map_err(e)?;
        let prices: Vec<f64> = r.prices().map(|p| p as f64).collect();
        let n = prices.len().max(1) as f64;
        // The y range: the prices and the band, with room; never past the admissible prices.
        let (y0, y1) = range(
            prices
                .iter()
                .copied()
                .fold(eq.price_low as f64, f64::min)
                .max(lo),
            prices
                .iter()
                .copied()
                .fold(eq.price_high as f64, f64::max)
                .min(hi),
        );
        let pad = (y1 - y0) * 0.08;
        let mut chart = ChartBuilder::on(&area)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.5..n + 0.5, (y0 - pad).max(0.0)..y1 + pad)
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc("transaction (in trade order, all periods)")
            .y_desc("price")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .light_line_style(TRANSPARENT)
            .draw()
            .map_err(e)?;
        // The equilibrium range: a band, drawn at least 6 pixels high so that a narrow range
        // stays visible.
        let (b0, b1) = (eq.price_low as f64, eq.price_high as f64);
        chart
            .draw_series(LineSeries::new(
                [(0.5, (b0 + b1) / 2.0), (n + 0.5, (b0 + b1) / 2.0)],
                grey.mix(0.6).stroke_width(6),
            ))
            .map_err(e)?;
        if b1 > b0 {
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(0.5, b0), (n + 0.5, b1)],
                    grey.mix(0.6).filled(),
                )))
                .map_err(e)?;
        }
        // Period boundaries after each period's last trade.
        let mut at = 0usize;
        for p in r.periods.iter().take(r.periods.len().saturating_sub(1)) {
            at += p.prices.len();
            let x = at as f64 + 0.5;
            chart
                .draw_series(std::iter::once(DashedPathElement::new(
                    vec![(x, (y0 - pad).max(0.0)), (x, y1 + pad)],
                    6,
                    4,
                    BLACK.mix(0.5).stroke_width(1),
                )))
                .map_err(e)?;
        }
        let (color, _) = style_of(0);
        let pts: Vec<(f64, f64)> = prices
            .iter()
            .enumerate()
            .map(|(i, &p)| ((i + 1) as f64, p))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(e)?;
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(e)?;
    }
    root.present().map_err(e)?;
    Ok(())
}

/// One market's efficiencies: per (treatment, period length) label, the replications' values.
pub struct MarketEfficiency {
    /// The market's name.
    pub market: String,
    /// `(series label, per-replication efficiencies)`.
    pub series: Vec<(String, Vec<f64>)>,
}

impl MarketEfficiency {
    /// The replications' efficiencies of each (treatment, period length) of `e`.
    pub fn of(e: &Experiment, reps: &[Replication]) -> Self {
        let mut series = Vec::new();
        for (ti, t) in e.treatments.iter().enumerate() {
            for l in e.lengths() {
                let xs = reps
                    .iter()
                    .filter(|r| r.treatment == ti && r.length == l)
                    .map(Replication::efficiency)
                    .collect();
                series.push((format!("{}, {}", t.name, length_label(l)), xs));
            }
        }
        Self {
            market: e.name.clone(),
            series,
        }
    }
}

/// `efficiency.png`/`.svg`: allocative efficiency per market, a whisker per series.
pub fn efficiency(dir: &Path, markets: &[MarketEfficiency]) -> Result<Vec<String>> {
    if !font_ready() {
        tracing_warn("no TrueType font found (set GRIDLEASE_SIM_FONT); plots skipped");
        return Ok(Vec::new());
    }
    // Series in first-seen order; each market's point at x = market number, spread a little
    // so the whiskers of one market do not overlap.
    let mut labels: Vec<String> = Vec::new();
    for m in markets {
        for (l, _) in &m.series {
            if !labels.contains(l) {
                labels.push(l.clone());
            }
        }
    }
    let k = labels.len().max(1) as f64;
    let lines: Vec<Line> = labels
        .iter()
        .enumerate()
        .map(|(j, label)| Line {
            label: label.clone(),
            pts: markets
                .iter()
                .enumerate()
                .filter_map(|(i, m)| {
                    let (_, xs) = m.series.iter().find(|(l, _)| l == label)?;
                    let x = (i + 1) as f64 + 0.6 * ((j as f64 + 0.5) / k - 0.5);
                    Some(Stat::of(x, xs))
                })
                .collect(),
        })
        .collect();
    let names: Vec<String> = markets.iter().map(|m| m.market.clone()).collect();
    let size = (900 + legend_width(&lines), 560);
    both(dir, "efficiency", size, &|canvas| {
        on_canvas!(canvas, |root| efficiency_figure(&root, &lines, &names))
    })
}

fn efficiency_figure<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    lines: &[Line],
    names: &[String],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("plot efficiency: {e:?}");
    root.fill(&WHITE).map_err(e)?;
    let root = root
        .titled(
            "Allocative efficiency by market (mean of replications, whisker: 95 % bootstrap interval)",
            ("sans-serif", 18),
        )
        .map_err(e)?;
    let (w, _) = root.dim_in_pixel();
    let (plot, legend) = root.split_horizontally(w.saturating_sub(legend_width(lines)));
    let all = || lines.iter().flat_map(|l| l.pts.iter());
    let low = all().map(|p| p.low.min(p.mean)).fold(1.0f64, f64::min);
    let y0 = (low - 0.05).min(0.9);
    let mut chart = ChartBuilder::on(&plot)
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0.5..names.len().max(1) as f64 + 0.5, y0..1.0)
        .map_err(e)?;
    let name_of = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-9 && i >= 1.0 {
            names.get(i as usize - 1).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .x_desc("market")
        .y_desc("efficiency (realised / maximum surplus)")
        .x_labels(names.len().max(1) * 4 + 1)
        .x_label_formatter(&name_of)
        .disable_x_mesh()
        .light_line_style(TRANSPARENT)
        .draw()
        .map_err(e)?;
    for (i, line) in lines.iter().enumerate() {
        let (color, _) = style_of(i);
        let clip = |v: f64| v.clamp(y0, 1.0);
        chart
            .draw_series(super::whiskers(line, color, clip))
            .map_err(e)?;
        chart
            .draw_series(
                line.pts
                    .iter()
                    .map(|p| Circle::new((p.x, clip(p.mean)), 4, color.filled())),
            )
            .map_err(e)?;
    }
    super::draw_legend(&legend, lines, true).map_err(e)
}
