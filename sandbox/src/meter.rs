//! Metering: cumulative Docker and GPU counters in, per-interval usage out.
//!
//! The core ([`Meter`]) is pure: it takes samples with their timestamps and never reads a
//! clock. Counters that go backwards (container restart, counter reset) are treated as having
//! restarted from zero, so usage never decreases and is never double-counted.
//!
//! Known limit: on this engine (cgroup v1) Docker's stats stream samples about once a second,
//! and once the container has exited its cgroup is gone, so up to ~1 s of CPU at the very end
//! can be missed. Wall time does not have this problem: [`Meter::finish`] takes the run time
//! from the daemon's `StartedAt`/`FinishedAt` when available.

use std::collections::BTreeMap;
use std::sync::Arc;

use bollard::models::ContainerStatsResponse;
use bollard::query_parameters::StatsOptionsBuilder;
use futures_util::StreamExt;
use gridlease_protocol::{LeaseId, Timestamp, UsageReport};
use tokio::sync::{mpsc, oneshot};

use crate::runtime::{ExitInfo, Sandbox, SandboxError};

/// One stats sample, reduced to the counters billing uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSample {
    /// When it was taken (unix ms, local clock).
    pub at: Timestamp,
    /// Cumulative CPU time of the container, nanoseconds (`cpu_usage.total_usage`).
    pub cpu_total_ns: u64,
    /// Current memory usage, bytes (the larger of `usage` and `max_usage`).
    pub mem_bytes: u64,
    /// Cumulative bytes received over all interfaces.
    pub net_rx: u64,
    /// Cumulative bytes sent over all interfaces.
    pub net_tx: u64,
    /// The container's memory limit, bytes (0 when Docker reports none).
    pub mem_limit_bytes: u64,
}

impl StatsSample {
    /// Reduces a Docker stats response. Returns `None` for the empty sample Docker sends once
    /// the container has stopped (all counters zero, no `read` time).
    pub fn from_docker(at: Timestamp, s: &ContainerStatsResponse) -> Option<Self> {
        let cpu = s
            .cpu_stats
            .as_ref()
            .and_then(|c| c.cpu_usage.as_ref())
            .and_then(|u| u.total_usage)
            .unwrap_or(0);
        let mem = s
            .memory_stats
            .as_ref()
            .map(|m| m.usage.unwrap_or(0).max(m.max_usage.unwrap_or(0)))
            .unwrap_or(0);
        let (rx, tx) = s
            .networks
            .as_ref()
            .map(|n| {
                n.values().fold((0u64, 0u64), |(rx, tx), v| {
                    (
                        rx.saturating_add(v.rx_bytes.unwrap_or(0)),
                        tx.saturating_add(v.tx_bytes.unwrap_or(0)),
                    )
                })
            })
            .unwrap_or((0, 0));
        if cpu == 0 && mem == 0 && rx == 0 && tx == 0 {
            return None;
        }
        let limit = s.memory_stats.as_ref().and_then(|m| m.limit).unwrap_or(0);
        Some(Self {
            at,
            cpu_total_ns: cpu,
            mem_bytes: mem,
            net_rx: rx,
            net_tx: tx,
            mem_limit_bytes: limit,
        })
    }
}

/// One GPU sample for a leased UUID.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuSample {
    /// GPU utilization, percent (0..=100).
    pub util_percent: u32,
    /// VRAM in use, MiB.
    pub vram_used_mib: u32,
    /// Cumulative energy counter of the board, millijoules.
    pub energy_mj: u64,
    /// VRAM on the board, MiB (`None`: not reported).
    pub vram_total_mib: Option<u32>,
    /// Power draw, milliwatts (`None`: not reported).
    pub power_mw: Option<u32>,
    /// Enforced power limit, milliwatts (`None`: not reported).
    pub power_limit_mw: Option<u32>,
    /// Core temperature, degrees Celsius (`None`: not reported).
    pub temp_c: Option<u32>,
    /// SM clock, MHz (`None`: not reported).
    pub sm_clock_mhz: Option<u32>,
    /// Compute processes on the GPU (`None`: not reported). On a GPU no lease holds, any is
    /// the owner's: the node withdraws the GPU from its offer.
    pub processes: Option<u32>,
    /// Of those, the ones that run outside any container (`None`: not known). On a GPU a
    /// lease holds, the tenant's processes run in its container; one outside is the owner's
    /// (an interruptible lease is then stopped for the owner).
    pub host_processes: Option<u32>,
}

/// What [`meter_run`] saw at one stats sample: the container's counters and the GPU samples
/// taken with them, for live telemetry (not billing).
#[derive(Clone, Debug)]
pub struct LiveSample<'a> {
    /// The container's counters.
    pub stats: StatsSample,
    /// The previous counters, if any (for rates).
    pub prev: Option<StatsSample>,
    /// The GPU samples taken with it, by UUID (empty without a sampler).
    pub gpus: &'a [(String, GpuSample)],
}

/// A GPU sampling failed.
#[derive(Debug, thiserror::Error)]
#[error("sampling gpu {uuid} failed: {detail}")]
pub struct GpuSampleError {
    /// Which GPU.
    pub uuid: String,
    /// What went wrong.
    pub detail: String,
}

/// Source of GPU samples (NVML in production, scripted in tests).
pub trait GpuSampler: Send + Sync {
    /// Samples one GPU by UUID.
    fn sample(&self, uuid: &str) -> Result<GpuSample, GpuSampleError>;
}

/// Usage over one interval (and the running totals after it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Wall milliseconds.
    pub wall_ms: u64,
    /// GPU milliseconds (wall x leased GPUs).
    pub gpu_ms: u64,
    /// CPU milliseconds.
    pub cpu_ms: u64,
    /// GPU energy, millijoules.
    pub energy_mj: u64,
    /// Bytes received.
    pub net_rx_bytes: u64,
    /// Bytes sent.
    pub net_tx_bytes: u64,
    /// Mean GPU utilization, per mille (over GPU samples in the interval).
    pub gpu_util_permille: u16,
    /// Peak VRAM used, MiB (summed over leased GPUs per sample).
    pub vram_peak_mib: u32,
    /// Peak container memory, MiB.
    pub mem_peak_mib: u32,
}

/// Delta of a cumulative counter; a decrease means the counter restarted from zero.
fn counter_delta(prev: u64, now: u64) -> u64 {
    if now >= prev { now - prev } else { now }
}

/// Turns cumulative samples into per-interval usage. Pure.
#[derive(Clone, Debug)]
pub struct Meter {
    gpus: u32,
    started: Timestamp,
    last_at: Timestamp,
    prev: Option<StatsSample>,
    prev_energy: BTreeMap<String, u64>,
    cpu_ns: u64,
    rx: u64,
    tx: u64,
    energy_mj: u64,
    // Interval accumulators.
    iv_start: Timestamp,
    iv_cpu_ns: u64,
    iv_rx: u64,
    iv_tx: u64,
    iv_energy: u64,
    iv_mem_peak: u64,
    iv_vram_peak: u32,
    iv_util_sum: u64,
    iv_util_n: u64,
    total_mem_peak: u64,
    total_vram_peak: u32,
}

impl Meter {
    /// A meter for a container that started at `started` with `gpus` leased GPUs.
    pub fn new(started: Timestamp, gpus: u32) -> Self {
        Self {
            gpus,
            started,
            last_at: started,
            prev: None,
            prev_energy: BTreeMap::new(),
            cpu_ns: 0,
            rx: 0,
            tx: 0,
            energy_mj: 0,
            iv_start: started,
            iv_cpu_ns: 0,
            iv_rx: 0,
            iv_tx: 0,
            iv_energy: 0,
            iv_mem_peak: 0,
            iv_vram_peak: 0,
            iv_util_sum: 0,
            iv_util_n: 0,
            total_mem_peak: 0,
            total_vram_peak: 0,
        }
    }

    /// Adds a container stats sample. The first sample counts from zero (the container's
    /// counters start at zero when it starts).
    pub fn on_stats(&mut self, s: StatsSample) {
        let base = self.prev.unwrap_or_default();
        let d_cpu = counter_delta(base.cpu_total_ns, s.cpu_total_ns);
        let d_rx = counter_delta(base.net_rx, s.net_rx);
        let d_tx = counter_delta(base.net_tx, s.net_tx);
        self.cpu_ns = self.cpu_ns.saturating_add(d_cpu);
        self.rx = self.rx.saturating_add(d_rx);
        self.tx = self.tx.saturating_add(d_tx);
        self.iv_cpu_ns = self.iv_cpu_ns.saturating_add(d_cpu);
        self.iv_rx = self.iv_rx.saturating_add(d_rx);
        self.iv_tx = self.iv_tx.saturating_add(d_tx);
        self.iv_mem_peak = self.iv_mem_peak.max(s.mem_bytes);
        self.total_mem_peak = self.total_mem_peak.max(s.mem_bytes);
        self.last_at = self.last_at.max(s.at);
        self.prev = Some(s);
    }

    /// Adds one round of GPU samples (one per leased UUID). The first energy reading of a GPU
    /// is the baseline: energy before the lease is not billed.
    pub fn on_gpu(&mut self, samples: &[(String, GpuSample)]) {
        let mut vram = 0u32;
        for (uuid, g) in samples {
            if let Some(prev) = self.prev_energy.get(uuid) {
                let d = counter_delta(*prev, g.energy_mj);
                self.energy_mj = self.energy_mj.saturating_add(d);
                self.iv_energy = self.iv_energy.saturating_add(d);
            }
            self.prev_energy.insert(uuid.clone(), g.energy_mj);
            vram = vram.saturating_add(g.vram_used_mib);
            self.iv_util_sum += u64::from(g.util_percent.min(100)) * 10;
            self.iv_util_n += 1;
        }
        self.iv_vram_peak = self.iv_vram_peak.max(vram);
        self.total_vram_peak = self.total_vram_peak.max(vram);
    }

    fn wall_until(&self, at: Timestamp) -> u64 {
        at.ms_since(self.started)
    }

    /// Closes the interval at `at`: returns (this interval's usage, totals so far).
    pub fn cut(&mut self, at: Timestamp) -> (Usage, Usage) {
        let at = at.max(self.iv_start);
        let iv_wall = at.ms_since(self.iv_start);
        let util = self
            .iv_util_sum
            .checked_div(self.iv_util_n)
            .map_or(0, |u| u.min(1000) as u16);
        let interval = Usage {
            wall_ms: iv_wall,
            gpu_ms: iv_wall.saturating_mul(u64::from(self.gpus)),
            cpu_ms: self.iv_cpu_ns / 1_000_000,
            energy_mj: self.iv_energy,
            net_rx_bytes: self.iv_rx,
            net_tx_bytes: self.iv_tx,
            gpu_util_permille: util,
            vram_peak_mib: self.iv_vram_peak,
            mem_peak_mib: (self.iv_mem_peak / (1024 * 1024)) as u32,
        };
        let wall = self.wall_until(at);
        let totals = Usage {
            wall_ms: wall,
            gpu_ms: wall.saturating_mul(u64::from(self.gpus)),
            cpu_ms: self.cpu_ns / 1_000_000,
            energy_mj: self.energy_mj,
            net_rx_bytes: self.rx,
            net_tx_bytes: self.tx,
            gpu_util_permille: util,
            vram_peak_mib: self.total_vram_peak,
            mem_peak_mib: (self.total_mem_peak / (1024 * 1024)) as u32,
        };
        self.iv_start = at;
        self.iv_cpu_ns = 0;
        self.iv_rx = 0;
        self.iv_tx = 0;
        self.iv_energy = 0;
        self.iv_mem_peak = 0;
        self.iv_vram_peak = 0;
        self.iv_util_sum = 0;
        self.iv_util_n = 0;
        (interval, totals)
    }

    /// Final totals once the container has exited. `daemon_run_ms` (from inspect's
    /// `StartedAt`/`FinishedAt`) overrides the locally observed wall time when given.
    pub fn finish(&mut self, ended: Timestamp, daemon_run_ms: Option<u64>) -> Usage {
        let (_, mut totals) = self.cut(ended);
        if let Some(ms) = daemon_run_ms {
            totals.wall_ms = ms;
            totals.gpu_ms = ms.saturating_mul(u64::from(self.gpus));
        }
        totals
    }

    /// When the meter started.
    pub fn started(&self) -> Timestamp {
        self.started
    }
}

/// Builds the protocol report from cumulative totals and the interval they close.
#[allow(clippy::too_many_arguments)]
pub fn to_usage_report(
    lease_id: LeaseId,
    seq: u64,
    interval_start: Timestamp,
    interval_end: Timestamp,
    totals: &Usage,
    interval: &Usage,
    amount_due: u64,
    exit_code: Option<i32>,
) -> UsageReport {
    UsageReport {
        lease_id,
        seq,
        interval_start,
        interval_end,
        wall_ms: totals.wall_ms,
        gpu_ms: totals.gpu_ms,
        cpu_ms: totals.cpu_ms,
        energy_mj: totals.energy_mj,
        net_rx_bytes: totals.net_rx_bytes,
        net_tx_bytes: totals.net_tx_bytes,
        gpu_util_permille: interval.gpu_util_permille,
        vram_peak_mib: interval.vram_peak_mib,
        mem_peak_mib: interval.mem_peak_mib,
        amount_due,
        exit_code,
    }
}

/// Samples each of `gpu_uuids` (a failed sample is logged and left out), for [`Meter::on_gpu`].
pub fn sample_gpus(gpu_uuids: &[String], sampler: &dyn GpuSampler) -> Vec<(String, GpuSample)> {
    gpu_uuids
        .iter()
        .filter_map(|u| match sampler.sample(u) {
            Ok(g) => Some((u.clone(), g)),
            Err(e) => {
                tracing::warn!(gpu = %u, error = %e, "gpu sample failed");
                None
            }
        })
        .collect()
}

/// A request to close the current metering interval at `at`, answered with (this interval's
/// usage, totals so far): what a usage report is built from.
#[derive(Debug)]
pub struct Cut {
    /// When the interval closes.
    pub at: Timestamp,
    /// Where the answer goes.
    pub reply: oneshot::Sender<(Usage, Usage)>,
}

/// What [`MeterControl::live`] calls at every stats sample.
pub type LiveHook = Box<dyn FnMut(LiveSample<'_>) + Send>;

/// How a caller steers [`meter_run`] while it runs: interval cuts, and the clock that stamps
/// stats samples (the same clock the caller's report times come from).
pub struct MeterControl {
    /// Interval cuts, answered between stats samples.
    pub cuts: mpsc::Receiver<Cut>,
    /// Now, in unix ms.
    pub now: Arc<dyn Fn() -> Timestamp + Send + Sync>,
    /// Called at every stats sample with what was seen (live telemetry); must not block.
    pub live: Option<LiveHook>,
}

impl MeterControl {
    /// A control that never cuts, stamping samples with the system clock.
    pub fn idle() -> Self {
        let (_tx, cuts) = mpsc::channel(1);
        Self {
            cuts,
            now: Arc::new(crate::runtime::now_ms),
            live: None,
        }
    }
}

impl std::fmt::Debug for MeterControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MeterControl")
    }
}

/// Follows a started container's stats stream into `meter` until the container exits, and
/// returns how it exited plus the number of stats samples used. GPU samples for `gpu_uuids`
/// are taken alongside each stats sample when a sampler is given. Interval cuts asked for on
/// `control.cuts` are answered as they come (the provider's usage reports are built from
/// them: this is the production metering loop). On exit the meter is finished with the
/// daemon's run time (see [`Meter::finish`]); the returned [`Usage`] is the final total.
///
/// On this engine the stats stream does not end when the container exits (it keeps sending
/// empty samples), so the container's `wait` runs alongside and ends metering.
pub async fn meter_run(
    sandbox: &Sandbox,
    id: &str,
    meter: &mut Meter,
    gpu_uuids: &[String],
    sampler: Option<&dyn GpuSampler>,
    control: &mut MeterControl,
) -> Result<(ExitInfo, Usage, usize), SandboxError> {
    let opts = StatsOptionsBuilder::default()
        .stream(true)
        .one_shot(false)
        .build();
    let mut stream = sandbox.docker().stats(id, Some(opts));
    let wait = sandbox.wait(id);
    tokio::pin!(wait);
    let mut n = 0usize;
    let mut stream_done = false;
    let mut cuts_open = true;
    let mut prev: Option<StatsSample> = None;
    let exit = loop {
        tokio::select! {
            biased;
            exit = &mut wait => break exit?,
            cut = control.cuts.recv(), if cuts_open => match cut {
                Some(Cut { at, reply }) => {
                    let _ = reply.send(meter.cut(at));
                }
                None => cuts_open = false,
            },
            item = stream.next(), if !stream_done => {
                let resp = match item {
                    Some(Ok(resp)) => resp,
                    _ => { stream_done = true; continue; }
                };
                let now = (control.now)();
                let stats = StatsSample::from_docker(now, &resp);
                match stats {
                    Some(s) => {
                        meter.on_stats(s);
                        n += 1;
                    }
                    // Empty sample after real ones: the container has stopped.
                    None if n > 0 => stream_done = true,
                    None => {}
                }
                let gpus = match sampler {
                    Some(sampler) => sample_gpus(gpu_uuids, sampler),
                    None => Vec::new(),
                };
                if sampler.is_some() {
                    meter.on_gpu(&gpus);
                }
                if let (Some(live), Some(s)) = (control.live.as_mut(), stats) {
                    live(LiveSample { stats: s, prev, gpus: &gpus });
                }
                if stats.is_some() {
                    prev = stats;
                }
            }
        }
    };
    let totals = meter.finish((control.now)(), exit.run_ms);
    tracing::debug!(
        container = id,
        samples = n,
        cpu_ms = totals.cpu_ms,
        wall_ms = totals.wall_ms,
        "metering finished"
    );
    Ok((exit, totals, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlease_protocol::Digest;

    fn s(at: u64, cpu_ms: u64, mem_mib: u64, rx: u64, tx: u64) -> StatsSample {
        StatsSample {
            at: Timestamp(at),
            cpu_total_ns: cpu_ms * 1_000_000,
            mem_bytes: mem_mib * 1024 * 1024,
            net_rx: rx,
            net_tx: tx,
            mem_limit_bytes: 0,
        }
    }

    #[test]
    fn deltas_and_intervals() {
        let mut m = Meter::new(Timestamp(1000), 2);
        m.on_stats(s(2000, 900, 10, 100, 50));
        m.on_stats(s(3000, 1900, 30, 300, 60));
        let (iv, tot) = m.cut(Timestamp(3000));
        assert_eq!(iv.cpu_ms, 1900);
        assert_eq!(iv.wall_ms, 2000);
        assert_eq!(iv.gpu_ms, 4000);
        assert_eq!(iv.mem_peak_mib, 30);
        assert_eq!((iv.net_rx_bytes, iv.net_tx_bytes), (300, 60));
        assert_eq!(tot, iv);
        m.on_stats(s(4000, 2400, 20, 400, 60));
        let (iv, tot) = m.cut(Timestamp(4000));
        assert_eq!(iv.cpu_ms, 500);
        assert_eq!(iv.mem_peak_mib, 20);
        assert_eq!(iv.net_rx_bytes, 100);
        assert_eq!(tot.cpu_ms, 2400);
        assert_eq!(tot.mem_peak_mib, 30);
        assert_eq!(tot.wall_ms, 3000);
    }

    #[test]
    fn counter_reset_counts_from_zero_and_never_decreases() {
        let mut m = Meter::new(Timestamp(0), 0);
        m.on_stats(s(1000, 5000, 1, 1000, 1000));
        // Container restarted: counters went back to small values.
        m.on_stats(s(2000, 300, 1, 10, 20));
        m.on_stats(s(3000, 800, 1, 30, 20));
        let (_, tot) = m.cut(Timestamp(3000));
        assert_eq!(tot.cpu_ms, 5800);
        assert_eq!(tot.net_rx_bytes, 1030);
        assert_eq!(tot.net_tx_bytes, 1020);
    }

    #[test]
    fn gpu_energy_util_and_vram() {
        let mut m = Meter::new(Timestamp(0), 2);
        let g = |u, v, e| GpuSample {
            util_percent: u,
            vram_used_mib: v,
            energy_mj: e,
            ..GpuSample::default()
        };
        m.on_gpu(&[
            ("A".into(), g(100, 1000, 50_000)),
            ("B".into(), g(0, 10, 9_000)),
        ]);
        m.on_gpu(&[
            ("A".into(), g(50, 3000, 60_000)),
            ("B".into(), g(50, 20, 9_500)),
        ]);
        // A's counter reset.
        m.on_gpu(&[("A".into(), g(0, 0, 100)), ("B".into(), g(0, 0, 9_500))]);
        let (iv, tot) = m.cut(Timestamp(1000));
        assert_eq!(tot.energy_mj, 10_000 + 500 + 100);
        assert_eq!(iv.gpu_util_permille, 333); // (1000+0+500+500+0+0)/6
        assert_eq!(iv.vram_peak_mib, 3020);
        assert_eq!(tot.gpu_ms, 2000);
    }

    #[test]
    fn finish_prefers_daemon_wall_time_and_maps_to_protocol() {
        let mut m = Meter::new(Timestamp(0), 1);
        m.on_stats(s(1000, 700, 5, 0, 0));
        let tot = m.finish(Timestamp(5200), Some(5000));
        assert_eq!(tot.wall_ms, 5000);
        assert_eq!(tot.gpu_ms, 5000);
        let lease = LeaseId(Digest::of("t", b"l"));
        let r = to_usage_report(
            lease,
            1,
            Timestamp(0),
            Timestamp(5200),
            &tot,
            &tot,
            42,
            Some(0),
        );
        assert_eq!(r.cpu_ms, 700);
        assert_eq!(r.wall_ms, 5000);
        assert_eq!(r.mem_peak_mib, 5);
        assert_eq!(r.exit_code, Some(0));
        assert_eq!(r.amount_due, 42);
    }

    #[test]
    fn empty_docker_sample_after_exit_is_ignored() {
        let resp = ContainerStatsResponse::default();
        assert_eq!(StatsSample::from_docker(Timestamp(1), &resp), None);
    }
}
