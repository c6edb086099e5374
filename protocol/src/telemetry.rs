//! Live telemetry of a running lease (`gridlease top`): what the provider samples about the
//! leased GPUs and the container about once a second, asked for by the lease's renter on the
//! lease stream ([`crate::session::SessionRequest::Telemetry`]).
//!
//! Telemetry is not billing: usage reports (signed, cumulative) are what is paid for; these
//! samples are unsigned (the libp2p connection authenticates the provider) and only shown.
//! Every value a provider cannot measure is `None` and shown as "n/a", never as 0: a
//! declared GPU has no driver to ask.

use serde::{Deserialize, Serialize};

use crate::messages::MAX_GPUS_PER_OFFER;
use crate::types::Timestamp;

/// Most samples in one answer (a minute at 1 Hz, with room).
pub const MAX_TELEMETRY_SAMPLES: usize = 64;
/// Longest GPU model name in an answer, bytes.
pub const MAX_MODEL_LEN: usize = 96;
/// Cap on a telemetry answer's encoded size, bytes: every sample at its largest.
pub const MAX_TELEMETRY_BYTES: usize = 16
    + MAX_GPUS_PER_OFFER * (MAX_MODEL_LEN + 10)
    + MAX_TELEMETRY_SAMPLES * (40 + MAX_GPUS_PER_OFFER * GPU_TELEMETRY_MAX_BYTES);
/// One [`GpuTelemetry`] at its largest (options and varints at their longest).
const GPU_TELEMETRY_MAX_BYTES: usize = 32;

/// Where the GPU values come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TelemetrySource {
    /// The NVIDIA driver (NVML) of the provider's machine.
    Driver,
    /// A scripted probe (development and tests): not a real GPU, and labelled so.
    Scripted,
    /// Nothing samples the GPUs (declared GPUs): every GPU value is `None`.
    None,
}

/// One leased GPU at one instant; `None` (`null` in the control API) where the provider
/// cannot measure a value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(as = GpuTelemetryView))]
pub struct GpuTelemetry {
    /// Utilisation, percent (0..=100).
    #[cfg_attr(feature = "openapi", schema(maximum = 100))]
    pub util_percent: Option<u8>,
    /// VRAM in use, MiB.
    pub vram_used_mib: Option<u32>,
    /// VRAM on the board, MiB.
    pub vram_total_mib: Option<u32>,
    /// Power draw, watts.
    pub power_w: Option<u16>,
    /// Enforced power limit, watts.
    pub power_limit_w: Option<u16>,
    /// Core temperature, degrees Celsius.
    pub temp_c: Option<u8>,
    /// SM clock, MHz.
    pub sm_clock_mhz: Option<u16>,
}

/// The lease's GPUs and container at one instant.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TelemetrySample {
    /// When it was taken (provider's clock, unix ms).
    pub at: Timestamp,
    /// One entry per leased GPU, in the lease's order.
    pub gpus: Vec<GpuTelemetry>,
    /// Container CPU use since the previous sample, millicores (1000 = one core busy).
    pub cpu_millicores: Option<u32>,
    /// Container memory in use, MiB.
    pub mem_used_mib: Option<u32>,
    /// Container memory limit, MiB.
    pub mem_limit_mib: Option<u32>,
}

/// A provider's answer: the samples taken after the time asked for, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TelemetryBatch {
    /// Where the GPU values come from.
    pub source: TelemetrySource,
    /// The leased GPUs' model names, in the lease's order.
    pub models: Vec<String>,
    /// At most [`MAX_TELEMETRY_SAMPLES`], oldest first.
    pub samples: Vec<TelemetrySample>,
}

/// Why a telemetry answer is refused by its receiver.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TelemetryError {
    /// More samples than [`MAX_TELEMETRY_SAMPLES`].
    #[error("{0} telemetry samples (at most {MAX_TELEMETRY_SAMPLES})")]
    TooManySamples(usize),
    /// More GPUs than an offer can have, or a sample whose GPUs differ from the models'.
    #[error("telemetry for {got} GPUs where the lease has {want}")]
    GpuCount {
        /// GPUs in the sample or the model list.
        got: usize,
        /// GPUs the lease has.
        want: usize,
    },
    /// A model name over [`MAX_MODEL_LEN`] bytes.
    #[error("a GPU model name of {0} bytes (at most {MAX_MODEL_LEN})")]
    ModelTooLong(usize),
    /// Samples not in time order.
    #[error("telemetry samples out of time order")]
    OutOfOrder,
    /// A utilisation over 100 %.
    #[error("a GPU utilisation of {0} %")]
    Utilisation(u8),
}

impl TelemetryBatch {
    /// Checks what a renter must not take on trust before showing it: counts within the caps,
    /// every sample for exactly `gpus` GPUs, samples in time order, utilisation at most 100.
    pub fn validate(&self, gpus: usize) -> Result<(), TelemetryError> {
        if self.samples.len() > MAX_TELEMETRY_SAMPLES {
            return Err(TelemetryError::TooManySamples(self.samples.len()));
        }
        if self.models.len() != gpus || gpus > MAX_GPUS_PER_OFFER {
            return Err(TelemetryError::GpuCount {
                got: self.models.len(),
                want: gpus,
            });
        }
        if let Some(m) = self.models.iter().find(|m| m.len() > MAX_MODEL_LEN) {
            return Err(TelemetryError::ModelTooLong(m.len()));
        }
        let mut last = None;
        for s in &self.samples {
            if s.gpus.len() != gpus {
                return Err(TelemetryError::GpuCount {
                    got: s.gpus.len(),
                    want: gpus,
                });
            }
            if last.is_some_and(|t| s.at <= t) {
                return Err(TelemetryError::OutOfOrder);
            }
            last = Some(s.at);
            if let Some(u) = s
                .gpus
                .iter()
                .filter_map(|g| g.util_percent)
                .find(|u| *u > 100)
            {
                return Err(TelemetryError::Utilisation(u));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec;

    fn largest() -> TelemetryBatch {
        let gpu = GpuTelemetry {
            util_percent: Some(u8::MAX),
            vram_used_mib: Some(u32::MAX),
            vram_total_mib: Some(u32::MAX),
            power_w: Some(u16::MAX),
            power_limit_w: Some(u16::MAX),
            temp_c: Some(u8::MAX),
            sm_clock_mhz: Some(u16::MAX),
        };
        TelemetryBatch {
            source: TelemetrySource::Scripted,
            models: vec!["m".repeat(MAX_MODEL_LEN); MAX_GPUS_PER_OFFER],
            samples: (0..MAX_TELEMETRY_SAMPLES)
                .map(|i| TelemetrySample {
                    at: Timestamp(u64::MAX - i as u64),
                    gpus: vec![gpu; MAX_GPUS_PER_OFFER],
                    cpu_millicores: Some(u32::MAX),
                    mem_used_mib: Some(u32::MAX),
                    mem_limit_mib: Some(u32::MAX),
                })
                .collect(),
        }
    }

    #[test]
    fn the_largest_answer_fits_its_cap() {
        let b = largest();
        let bytes = codec::encode::<TelemetryBatch, MAX_TELEMETRY_BYTES>(&b).unwrap();
        assert!(bytes.len() <= MAX_TELEMETRY_BYTES, "{}", bytes.len());
        let back = codec::decode::<TelemetryBatch, MAX_TELEMETRY_BYTES>(&bytes).unwrap();
        assert_eq!(back, b);
    }

    #[test]
    fn validation_refuses_what_a_renter_must_not_show() {
        let ok = TelemetryBatch {
            source: TelemetrySource::Driver,
            models: vec!["A".into(), "B".into()],
            samples: vec![
                TelemetrySample {
                    at: Timestamp(1),
                    gpus: vec![GpuTelemetry::default(); 2],
                    ..Default::default()
                },
                TelemetrySample {
                    at: Timestamp(2),
                    gpus: vec![
                        GpuTelemetry {
                            util_percent: Some(100),
                            ..Default::default()
                        };
                        2
                    ],
                    ..Default::default()
                },
            ],
        };
        assert_eq!(ok.validate(2), Ok(()));
        assert!(matches!(
            ok.validate(3),
            Err(TelemetryError::GpuCount { got: 2, want: 3 })
        ));
        let mut b = ok.clone();
        b.samples[1].at = Timestamp(1);
        assert_eq!(b.validate(2), Err(TelemetryError::OutOfOrder));
        let mut b = ok.clone();
        b.samples[1].gpus.pop();
        assert!(matches!(
            b.validate(2),
            Err(TelemetryError::GpuCount { got: 1, want: 2 })
        ));
        let mut b = ok.clone();
        b.samples[0].gpus[1].util_percent = Some(101);
        assert_eq!(b.validate(2), Err(TelemetryError::Utilisation(101)));
        let mut b = ok.clone();
        b.models[0] = "x".repeat(MAX_MODEL_LEN + 1);
        assert_eq!(
            b.validate(2),
            Err(TelemetryError::ModelTooLong(MAX_MODEL_LEN + 1))
        );
        let mut b = ok;
        let s = b.samples[0].clone();
        b.samples = (0..=MAX_TELEMETRY_SAMPLES)
            .map(|i| TelemetrySample {
                at: Timestamp(i as u64),
                ..s.clone()
            })
            .collect();
        assert_eq!(
            b.validate(2),
            Err(TelemetryError::TooManySamples(MAX_TELEMETRY_SAMPLES + 1))
        );
    }
}
