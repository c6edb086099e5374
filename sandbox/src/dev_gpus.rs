//! `--dev-gpus`: declared (unverified) GPUs, so a market can run on machines without GPUs.
//!
//! Format: a comma-separated list of `[Nx]MODEL:VRAM:PRICE`, for example
//! `RTX 4090:24GiB:0.40,2x RTX 3090:24GiB:0.25`.
//! - `Nx` (optional) repeats the GPU N times (1..=16);
//! - `VRAM` is `24GiB`, `24576MiB` or a bare number of GiB;
//! - `PRICE` is units per GPU-hour (`0.40`), at most 6 decimals.
//!
//! Every GPU is marked [`Attestation::Declared`]. Benchmark numbers are filled from a small table
//! of published dense fp32/fp16 rates for well-known models (0 when the model is unknown), so
//! searches by TFLOPS work on a devnet; they are labels, not measurements.
//!
//! One offer per provider is a protocol rule (a higher `seq` replaces every lower one), so a
//! node advertises one *group* of identical GPUs (same model, VRAM and price): the first group
//! listed. [`DevGpus::groups`] returns all of them so callers can say what was left out.

use gridlease_contracts::Money;
use gridlease_protocol::{
    Attestation, BenchReport, ComputeCapability, Digest, GpuSpec, MAX_GPUS_PER_OFFER,
    MAX_MODEL_LEN, OfferedGpu, PublicKey, Timestamp,
};

/// A `--dev-gpus` entry that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--dev-gpus entry {entry:?}: {problem} (expected [Nx]MODEL:VRAM:PRICE, e.g. \"RTX 4090:24GiB:0.40\")"
)]
pub struct DevGpuError {
    /// The entry.
    pub entry: String,
    /// What is wrong.
    pub problem: String,
}

/// One declared GPU type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevGpu {
    /// Model name.
    pub model: String,
    /// VRAM in MiB.
    pub vram_mib: u32,
    /// Price per GPU-hour.
    pub price: Money,
    /// How many.
    pub count: u8,
}

/// Parsed `--dev-gpus`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevGpus {
    /// The entries as listed.
    pub entries: Vec<DevGpu>,
}

/// Published dense rates (GFLOP/s fp32, fp16 tensor with fp32 accumulate), compute capability.
const KNOWN: &[(&str, u32, u32, (u8, u8))] = &[
    ("4090", 82_600, 165_200, (8, 9)),
    ("4080", 48_700, 97_500, (8, 9)),
    ("3090", 35_600, 71_000, (8, 6)),
    ("3080", 29_800, 59_500, (8, 6)),
    ("a100", 19_500, 312_000, (8, 0)),
    ("h100", 67_000, 989_000, (9, 0)),
    ("l40s", 91_600, 362_000, (8, 9)),
    ("a6000", 38_700, 154_800, (8, 6)),
];

impl DevGpus {
    /// Parses the flag's value.
    pub fn parse(spec: &str) -> Result<Self, DevGpuError> {
        let mut entries = Vec::new();
        for raw in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let err = |problem: &str| DevGpuError {
                entry: raw.to_string(),
                problem: problem.to_string(),
            };
            let parts: Vec<&str> = raw.rsplitn(3, ':').collect();
            let [price, vram, model] = parts[..] else {
                return Err(err("needs three fields separated by ':'"));
            };
            let (count, model) = match model.split_once(['x', 'X']) {
                Some((n, rest)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                    let n: u8 = n.parse().map_err(|_| err("bad count"))?;
                    (n, rest.trim())
                }
                _ => (1, model.trim()),
            };
            if count == 0 || usize::from(count) > MAX_GPUS_PER_OFFER {
                return Err(err("count must be 1..=16"));
            }
            if model.is_empty() || model.len() > MAX_MODEL_LEN {
                return Err(err("model name must be 1..=64 bytes"));
            }
            let vram = vram.trim();
            let vram_mib = if let Some(g) =
                vram.strip_suffix("GiB").or_else(|| vram.strip_suffix("G"))
            {
                g.trim()
                    .parse::<u32>()
                    .ok()
                    .and_then(|g| g.checked_mul(1024))
            } else if let Some(m) = vram.strip_suffix("MiB").or_else(|| vram.strip_suffix("M")) {
                m.trim().parse::<u32>().ok()
            } else {
                vram.parse::<u32>().ok().and_then(|g| g.checked_mul(1024))
            }
            .filter(|v| *v > 0)
            .ok_or_else(|| err("VRAM must look like 24GiB or 24576MiB"))?;
            let price: Money = price
                .trim()
                .parse()
                .map_err(|_| err("price must be a decimal amount like 0.40"))?;
            entries.push(DevGpu {
                model: model.to_string(),
                vram_mib,
                price,
                count,
            });
        }
        if entries.is_empty() {
            return Err(DevGpuError {
                entry: spec.to_string(),
                problem: "no GPUs listed".into(),
            });
        }
        Ok(Self { entries })
    }

    /// Groups of identical GPUs (model, VRAM, price), in order of first appearance, each with
    /// its total count (capped at the per-offer maximum).
    pub fn groups(&self) -> Vec<DevGpu> {
        let mut out: Vec<DevGpu> = Vec::new();
        for e in &self.entries {
            match out
                .iter_mut()
                .find(|g| g.model == e.model && g.vram_mib == e.vram_mib && g.price == e.price)
            {
                Some(g) => {
                    g.count = g
                        .count
                        .saturating_add(e.count)
                        .min(MAX_GPUS_PER_OFFER as u8);
                }
                None => out.push(e.clone()),
            }
        }
        out
    }
}

impl DevGpu {
    /// The declared GPUs of this group, with UUID digests unique to `provider`.
    pub fn offered(&self, provider: &PublicKey, now: Timestamp) -> Vec<OfferedGpu> {
        let lower = self.model.to_lowercase();
        let (fp32, fp16, cc) = KNOWN
            .iter()
            .find(|(k, ..)| lower.contains(k))
            .map(|(_, a, b, cc)| (*a, *b, *cc))
            .unwrap_or((0, 0, (0, 0)));
        (0..self.count)
            .map(|i| {
                let mut seed = provider.0.to_vec();
                seed.extend_from_slice(self.model.as_bytes());
                seed.push(i);
                OfferedGpu {
                    spec: GpuSpec {
                        model: self.model.clone(),
                        vram_mib: self.vram_mib,
                        uuid_digest: Digest::of("gridlease/v1/dev-gpu", &seed),
                        compute_capability: ComputeCapability {
                            major: cc.0,
                            minor: cc.1,
                        },
                        driver_version: "declared".into(),
                        cuda_version: "declared".into(),
                        pcie_gen: 0,
                        pcie_width: 0,
                        power_limit_w: 0,
                    },
                    bench: BenchReport {
                        fp32_gflops: fp32,
                        fp16_gflops: fp16,
                        device_mem_mbps: 0,
                        h2d_mbps: 0,
                        tool_version: "declared".into(),
                        measured_at: now,
                        attestation: Attestation::Declared,
                    },
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example() {
        let g = DevGpus::parse("RTX 4090:24GiB:0.40, 2x RTX 3090:24576MiB:0.25").unwrap();
        assert_eq!(g.entries.len(), 2);
        assert_eq!(g.entries[0].model, "RTX 4090");
        assert_eq!(g.entries[0].vram_mib, 24 * 1024);
        assert_eq!(g.entries[0].price.micros(), 400_000);
        assert_eq!(g.entries[1].count, 2);
        assert_eq!(g.entries[1].model, "RTX 3090");
        let offered = g.groups()[0].offered(&PublicKey([1; 32]), Timestamp(0));
        assert_eq!(offered[0].bench.attestation, Attestation::Declared);
        assert_eq!(offered[0].bench.fp16_gflops, 165_200);
    }

    #[test]
    fn groups_merge_identical_entries() {
        let g = DevGpus::parse("A:8:0.1,A:8:0.1,B:8:0.1").unwrap();
        let groups = g.groups();
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].count, 2);
    }

    #[test]
    fn errors_name_the_entry() {
        for bad in [
            "",
            "RTX 4090:24GiB",
            "X:lots:0.1",
            "X:24:free",
            "0x X:24:0.1",
            "RTX:24GB:0.4",
            "RTX:24GiB:-1",
            "RTX:24GiB:1e3",
            "RTX:24GiB:0.1234567",
            ":24GiB:1",
            "RTX:0GiB:1",
            "RTX:24GiB:.",
            "17x RTX:24GiB:1",
        ] {
            assert!(DevGpus::parse(bad).is_err(), "{bad}");
        }
        let e = DevGpus::parse("ok:1:1,bad").unwrap_err();
        assert_eq!(e.entry, "bad");
    }
}
