//! Provider: live telemetry of a running lease (`gridlease top`). The session's metering task
//! is the only writer: at every stats sample (about once a second) it turns what it saw into a
//! [`TelemetrySample`] and pushes it onto the lease's [`Ring`]; the service answers the
//! renter's `Telemetry` requests from the ring, never through the session.
//!
//! Bounded: the ring keeps the newest [`RING`] samples; an answer carries at most
//! [`MAX_TELEMETRY_SAMPLES`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use gridlease_protocol::Timestamp;
use gridlease_protocol::telemetry::{
    GpuTelemetry, MAX_MODEL_LEN, MAX_TELEMETRY_SAMPLES, TelemetryBatch, TelemetrySample,
    TelemetrySource,
};
use gridlease_sandbox::meter::{GpuSample, LiveSample};

/// Samples a lease's ring keeps (a minute at 1 Hz).
pub const RING: usize = MAX_TELEMETRY_SAMPLES;

/// The newest telemetry samples of one lease, with what describes them.
#[derive(Clone, Debug)]
pub struct Ring {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    source: TelemetrySource,
    models: Vec<String>,
    samples: VecDeque<TelemetrySample>,
}

impl Ring {
    /// An empty ring for a lease of the GPUs `models` (in the lease's order).
    pub fn new(source: TelemetrySource, models: Vec<String>) -> Self {
        let models = models
            .into_iter()
            .map(|m| gridlease_protocol::session::truncated(m, MAX_MODEL_LEN))
            .collect();
        Self {
            inner: Arc::new(Mutex::new(Inner {
                source,
                models,
                samples: VecDeque::with_capacity(RING),
            })),
        }
    }

    /// Adds the newest sample (dropping the oldest beyond [`RING`]); a sample not newer than
    /// the last is ignored, so answers stay in time order.
    pub fn push(&self, s: TelemetrySample) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.samples.back().is_some_and(|b| b.at >= s.at) {
            return;
        }
        if g.samples.len() == RING {
            g.samples.pop_front();
        }
        g.samples.push_back(s);
    }

    /// The samples taken after `after`, oldest first (at most [`MAX_TELEMETRY_SAMPLES`]).
    pub fn after(&self, after: Timestamp) -> TelemetryBatch {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let newer = g.samples.iter().filter(|s| s.at > after);
        let skip = newer.clone().count().saturating_sub(MAX_TELEMETRY_SAMPLES);
        TelemetryBatch {
            source: g.source,
            models: g.models.clone(),
            samples: newer.skip(skip).cloned().collect(),
        }
    }
}

/// The telemetry sample for what the meter saw: one entry per leased GPU (`ids`: the id the
/// sampler knows each by, in the lease's order; a GPU without a sample gets `None`s).
pub fn sample(live: &LiveSample<'_>, ids: &[String], gpus: usize) -> TelemetrySample {
    let s = live.stats;
    let cpu_millicores = live.prev.and_then(|p| {
        let wall_ms = s.at.0.checked_sub(p.at.0).filter(|d| *d > 0)?;
        let cpu_ns = s.cpu_total_ns.checked_sub(p.cpu_total_ns)?;
        // ns / (ms * 1e6) cores = ns / ms / 1000 millicores.
        u32::try_from(cpu_ns / wall_ms / 1000).ok()
    });
    let mib = |b: u64| u32::try_from(b / (1024 * 1024)).unwrap_or(u32::MAX);
    let of = |g: &GpuSample| GpuTelemetry {
        util_percent: u8::try_from(g.util_percent.min(100)).ok(),
        vram_used_mib: Some(g.vram_used_mib),
        vram_total_mib: g.vram_total_mib,
        power_w: g
            .power_mw
            .map(|w| u16::try_from(w / 1000).unwrap_or(u16::MAX)),
        power_limit_w: g
            .power_limit_mw
            .map(|w| u16::try_from(w / 1000).unwrap_or(u16::MAX)),
        temp_c: g.temp_c.map(|t| u8::try_from(t).unwrap_or(u8::MAX)),
        sm_clock_mhz: g.sm_clock_mhz.map(|c| u16::try_from(c).unwrap_or(u16::MAX)),
    };
    let gpus = (0..gpus)
        .map(|i| {
            ids.get(i)
                .and_then(|id| live.gpus.iter().find(|(u, _)| u == id))
                .map(|(_, g)| of(g))
                .unwrap_or_default()
        })
        .collect();
    TelemetrySample {
        at: s.at,
        gpus,
        cpu_millicores,
        mem_used_mib: Some(mib(s.mem_bytes)),
        mem_limit_mib: (s.mem_limit_bytes > 0).then(|| mib(s.mem_limit_bytes)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use gridlease_sandbox::meter::StatsSample;

    use super::*;

    fn at(ms: u64) -> TelemetrySample {
        TelemetrySample {
            at: Timestamp(ms),
            gpus: vec![GpuTelemetry::default()],
            ..Default::default()
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_in_order_and_answers_after_a_time() {
        let r = Ring::new(TelemetrySource::Scripted, vec!["RTX".into()]);
        for t in 1..=(RING as u64 + 10) {
            r.push(at(t * 1000));
        }
        r.push(at(5)); // older than the last: ignored
        let all = r.after(Timestamp(0));
        assert_eq!(all.samples.len(), RING);
        assert_eq!(all.samples[0].at, Timestamp(11_000));
        assert_eq!(all.validate(1), Ok(()));
        let tail = r.after(Timestamp((RING as u64 + 8) * 1000));
        let times: Vec<u64> = tail.samples.iter().map(|s| s.at.0).collect();
        assert_eq!(times, [(RING as u64 + 9) * 1000, (RING as u64 + 10) * 1000]);
    }

    #[test]
    fn samples_rate_cpu_and_leave_what_is_unmeasured_empty() {
        let stats = |at, cpu_ms: u64| StatsSample {
            at: Timestamp(at),
            cpu_total_ns: cpu_ms * 1_000_000,
            mem_bytes: 512 << 20,
            mem_limit_bytes: 2 << 30,
            ..Default::default()
        };
        let gpus = [(
            "GPU-b".to_string(),
            GpuSample {
                util_percent: 73,
                vram_used_mib: 4096,
                power_mw: Some(215_500),
                ..Default::default()
            },
        )];
        // 1.5 s of CPU in 1 s of wall time: 1500 millicores.
        let live = LiveSample {
            stats: stats(2000, 2500),
            prev: Some(stats(1000, 1000)),
            gpus: &gpus,
        };
        let s = sample(&live, &["GPU-a".into(), "GPU-b".into()], 2);
        assert_eq!(s.cpu_millicores, Some(1500));
        assert_eq!((s.mem_used_mib, s.mem_limit_mib), (Some(512), Some(2048)));
        assert_eq!(s.gpus[0], GpuTelemetry::default(), "GPU-a was not sampled");
        assert_eq!(s.gpus[1].util_percent, Some(73));
        assert_eq!(s.gpus[1].power_w, Some(215));
        assert_eq!(s.gpus[1].temp_c, None);
        let first = LiveSample { prev: None, ..live };
        assert_eq!(sample(&first, &[], 1).cpu_millicores, None);
    }
}
