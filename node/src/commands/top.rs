//! `gridlease top [LEASE]`: a running lease's GPUs and container, live, like nvitop: per GPU a
//! utilisation bar, VRAM used / total, power, temperature and SM clock; the container's CPU and
//! memory; cost so far and time left. It asks the node once a second
//! (`GET /v1/leases/{id}/telemetry`, `GET /v1/leases/{id}`), and the renter's node asks the
//! provider over the lease's P2P connection.
//!
//! In a terminal: a full-screen view (ratatui), `q` or Ctrl-C to leave; it ends by itself when
//! the lease does. `--json` streams each new sample as one JSON object per line; `--once` (and
//! any stdout that is not a terminal) prints the view once as text. A value the provider cannot
//! measure is "n/a", never 0: declared GPUs have no driver to ask, and GPUs sampled from a
//! scripted probe (development, tests) are labelled as not real.

use std::io::IsTerminal as _;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use gridlease_contracts::Money;
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph};
use serde::Serialize;

use crate::api::client::{ApiClient, ClientError};
use crate::api::problem::ProblemType;
use crate::api::types::{TelemetrySampleView, TelemetrySourceView, TelemetryView};
use crate::lease::LeaseView;
use crate::output::Printer;

/// Arguments of `gridlease top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// Lease id (or its first digits); without one, the only running lease of this node.
    #[arg(value_name = "LEASE")]
    pub lease: Option<String>,
    /// Print the view once and exit (also when stdout is not a terminal).
    #[arg(long)]
    pub once: bool,
    /// Seconds between refreshes.
    #[arg(long, value_name = "SECS", default_value_t = 1.0, value_parser = interval)]
    pub interval: f64,
}

fn interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.2..=60.0).contains(&v) => Ok(v),
        _ => Err("an interval of 0.2 to 60 seconds".into()),
    }
}

/// One line of `top --json`: a new sample of the lease.
#[derive(Debug, Serialize)]
pub struct SampleLine<'a> {
    /// The lease.
    pub lease_id: &'a str,
    /// Where the GPU values come from.
    pub source: TelemetrySourceView,
    /// The leased GPUs' model names.
    pub gpus: &'a [String],
    /// The sample.
    pub sample: &'a TelemetrySampleView,
}

/// What the screen shows.
#[derive(Debug, Clone)]
pub struct Screen {
    /// The lease as the node sees it.
    pub lease: LeaseView,
    /// Where the GPU values come from.
    pub source: TelemetrySourceView,
    /// The leased GPUs' model names.
    pub models: Vec<String>,
    /// The newest sample (`None` before the first).
    pub sample: Option<TelemetrySampleView>,
    /// Why the last refresh failed, if it did.
    pub problem: Option<String>,
}

/// Runs `gridlease top`.
pub async fn run(api: &ApiClient, out: &Printer, a: &TopArgs) -> anyhow::Result<u8> {
    let id = match &a.lease {
        Some(l) => api.lease(l).await?.lease_id.to_string(),
        None => only_running(api).await?,
    };
    let every = Duration::from_secs_f64(a.interval);
    if out.json {
        return stream_json(api, out, &id, every, a.once).await;
    }
    let mut screen = first_screen(api, &id).await?;
    if a.once || !std::io::stdout().is_terminal() {
        out.line(&lines(&screen, 80).join("\n"));
        return Ok(0);
    }
    full_screen(api, out, &id, &mut screen, every).await
}

/// The only lease of this node that is not over, or an error naming them.
async fn only_running(api: &ApiClient) -> anyhow::Result<String> {
    let live: Vec<LeaseView> = api
        .leases()
        .await?
        .into_iter()
        .filter(|l| !l.state.is_terminal())
        .collect();
    match live.as_slice() {
        [one] => Ok(one.lease_id.to_string()),
        [] => anyhow::bail!("no lease of this node is running: `gridlease top LEASE` for one"),
        many => anyhow::bail!(
            "{} leases are running; name one: {}",
            many.len(),
            many.iter()
                .map(|l| l.lease_id.short())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The telemetry taken after `after_ms`; `None` when the lease does not run (yet or any more).
async fn telemetry(
    api: &ApiClient,
    id: &str,
    after_ms: u64,
) -> Result<Option<TelemetryView>, ClientError> {
    match api
        .get::<TelemetryView>(&format!("/v1/leases/{id}/telemetry?after_ms={after_ms}"))
        .await
    {
        Ok(t) => Ok(Some(t)),
        Err(ClientError::Api {
            kind: Some(ProblemType::LeaseNotRunning),
            ..
        }) => Ok(None),
        Err(e) => Err(e),
    }
}

async fn first_screen(api: &ApiClient, id: &str) -> anyhow::Result<Screen> {
    let lease = api.lease(id).await?;
    let mut s = Screen {
        source: TelemetrySourceView::None,
        models: Vec::new(),
        sample: None,
        problem: None,
        lease,
    };
    refresh(api, id, &mut s).await;
    Ok(s)
}

/// Updates `s` from the node; a failure is shown on the screen, not fatal.
async fn refresh(api: &ApiClient, id: &str, s: &mut Screen) {
    let after = s.sample.as_ref().map_or(0, |x| x.at_ms);
    let (lease, t) = tokio::join!(api.lease(id), telemetry(api, id, after));
    s.problem = None;
    match lease {
        Ok(l) => s.lease = l,
        Err(e) => s.problem = Some(e.to_string()),
    }
    match t {
        Ok(Some(t)) => {
            s.source = t.source;
            s.models = t.gpus;
            if let Some(last) = t.samples.into_iter().last() {
                s.sample = Some(last);
            }
        }
        Ok(None) => {}
        Err(e) => s.problem = Some(e.to_string()),
    }
}

async fn stream_json(
    api: &ApiClient,
    out: &Printer,
    id: &str,
    every: Duration,
    once: bool,
) -> anyhow::Result<u8> {
    if once {
        let t = telemetry(api, id, 0)
            .await?
            .with_context(|| format!("lease {id} is not running"))?;
        out.emit(&t, |_| {});
        return Ok(0);
    }
    let mut after = 0u64;
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = tokio::signal::ctrl_c() => return Ok(0),
        }
        match telemetry(api, id, after).await? {
            Some(t) => {
                for s in &t.samples {
                    let line = SampleLine {
                        lease_id: &t.lease_id,
                        source: t.source,
                        gpus: &t.gpus,
                        sample: s,
                    };
                    out.json_line(&line);
                    after = s.at_ms;
                }
            }
            None if api.lease(id).await?.state.is_terminal() => return Ok(0),
            None => {}
        }
    }
}

/// The terminal is restored when this is dropped, also on an error or a panic.
struct Restore;
impl Drop for Restore {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

async fn full_screen(
    api: &ApiClient,
    out: &Printer,
    id: &str,
    screen: &mut Screen,
    every: Duration,
) -> anyhow::Result<u8> {
    let mut term = ratatui::try_init().context("cannot take over the terminal")?;
    let _restore = Restore;
    // Keys come from a thread of their own (crossterm's reads block).
    let (keys_tx, mut keys) = tokio::sync::mpsc::channel::<()>(1);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            use crossterm::event::{Event, KeyCode, KeyModifiers, poll, read};
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if !poll(Duration::from_millis(100)).unwrap_or(false) {
                    continue;
                }
                if let Ok(Event::Key(k)) = read() {
                    let quit = matches!(k.code, KeyCode::Char('q') | KeyCode::Esc)
                        || (k.code == KeyCode::Char('c')
                            && k.modifiers.contains(KeyModifiers::CONTROL));
                    if quit {
                        let _ = keys_tx.blocking_send(());
                        return;
                    }
                }
            }
        })
    };
    let mut tick = tokio::time::interval(every);
    let result = loop {
        let width = term.size().map_or(80, |s| usize::from(s.width));
        let text: Vec<Line<'_>> = lines(screen, width.saturating_sub(2))
            .into_iter()
            .map(Line::from)
            .collect();
        if let Err(e) = term.draw(|f| {
            let area: Rect = f.area();
            let block = Block::bordered().title(" gridlease top  (q to quit) ");
            f.render_widget(Paragraph::new(text).block(block), area);
        }) {
            break Err(anyhow::Error::from(e).context("cannot draw"));
        }
        if screen.lease.state.is_terminal() {
            break Ok(0);
        }
        tokio::select! {
            _ = tick.tick() => refresh(api, id, screen).await,
            _ = keys.recv() => break Ok(0),
        }
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = reader.join();
    drop(_restore);
    // What it ended with stays on the terminal.
    out.line(&headline(screen));
    result
}

fn na<T: std::fmt::Display>(v: Option<T>, unit: &str) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| format!("{v}{unit}"))
}

/// `[|||||     ]` of `width` cells for `part` of `whole` (`None`: a bar of `?`s' absence).
fn bar(part: Option<u64>, whole: Option<u64>, width: usize) -> String {
    match (part, whole) {
        (Some(p), Some(w)) if w > 0 => {
            let filled = usize::try_from(p.min(w) * width as u64 / w).unwrap_or(width);
            format!("[{}{}]", "|".repeat(filled), " ".repeat(width - filled))
        }
        _ => format!("[{}]", " ".repeat(width)),
    }
}

fn hms(s: u64) -> String {
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

fn headline(s: &Screen) -> String {
    let l = &s.lease;
    format!(
        "lease {} ({}) {}, {} left, cost {} {}",
        l.lease_id.short(),
        l.role.as_str(),
        l.state.as_str(),
        l.time_left_s.map_or_else(|| "n/a".into(), hms),
        Money::from_micros(l.cost_so_far),
        gridlease_contracts::money::UNIT,
    )
}

/// The screen as text lines of at most `width` characters (80 columns hold everything).
pub fn lines(s: &Screen, width: usize) -> Vec<String> {
    let mut out = vec![headline(s)];
    // The GPU check: what answered it, labelled (`cpu-reference: not a GPU`), and how it went.
    if let Some(c) = &s.lease.gpu_check {
        out.push(format!("GPU check {} ({})", c.state, c.backend));
    }
    out.push(match s.source {
        TelemetrySourceView::Driver => "GPUs sampled by the provider's NVIDIA driver".to_string(),
        TelemetrySourceView::Scripted => {
            "GPU values from a SCRIPTED probe (development/test): not a real GPU".to_string()
        }
        TelemetrySourceView::None => {
            "declared GPUs: no driver samples them, GPU values are n/a".to_string()
        }
    });
    let bar_w = width.saturating_sub(40).clamp(10, 40);
    let gpus = usize::from(s.lease.gpus).max(s.models.len());
    for i in 0..gpus {
        let g = s
            .sample
            .as_ref()
            .and_then(|x| x.gpus.get(i).copied())
            .unwrap_or_default();
        let model = s.models.get(i).map_or("GPU", String::as_str);
        out.push(String::new());
        out.push(format!(
            "GPU {i}  {model}  power {} / {}  temp {}  sm {}",
            na(g.power_w, " W"),
            na(g.power_limit_w, " W"),
            na(g.temp_c, " C"),
            na(g.sm_clock_mhz, " MHz"),
        ));
        out.push(format!(
            "  util {} {}",
            bar(g.util_percent.map(u64::from), Some(100), bar_w),
            na(g.util_percent, " %"),
        ));
        out.push(format!(
            "  vram {} {} / {}",
            bar(
                g.vram_used_mib.map(u64::from),
                g.vram_total_mib.map(u64::from),
                bar_w
            ),
            na(g.vram_used_mib, " MiB"),
            na(g.vram_total_mib, " MiB"),
        ));
    }
    let cpu = s
        .sample
        .as_ref()
        .and_then(|x| x.cpu_millicores)
        .map(|m| format!("{:.2} cores", f64::from(m) / 1000.0));
    let (mem, limit) = s
        .sample
        .as_ref()
        .map_or((None, None), |x| (x.mem_used_mib, x.mem_limit_mib));
    out.push(String::new());
    out.push(format!(
        "container  cpu {}  mem {} / {}",
        cpu.unwrap_or_else(|| "n/a".into()),
        na(mem, " MiB"),
        na(limit, " MiB"),
    ));
    out.push(match &s.sample {
        Some(x) => format!(
            "sampled {:.1} s ago",
            (crate::clock::now().0.saturating_sub(x.at_ms)) as f64 / 1000.0
        ),
        None if s.lease.state.is_terminal() => "the lease is over".into(),
        None => "no sample yet (the container has not started)".into(),
    });
    if let Some(p) = &s.problem {
        out.push(format!("refresh failed: {p}"));
    }
    out.into_iter()
        .map(|l| l.chars().take(width.max(20)).collect())
        .collect()
}
