//! The GPUs a provider node rents out when they come from the driver (NVML), not from
//! `--dev-gpus`: the offer entries, and for each the device UUID the sandbox hands to Docker
//! (offers carry only a digest of it).
//!
//! A GPU is offered as `Measured` only with a benchmark from this machine, for this GPU and this
//! driver version, kept in `<home>/bench.json`; the daemon fills that cache at start by running
//! the isolated benchmark binary (`gridlease-gpu-bench`, next to `gridlease`) for each GPU it
//! lacks. Without a result (no binary, no CUDA, a failed run) the GPU is still offered, with a
//! zero `Declared` report that search shows as unverified.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gridlease_protocol::{BenchReport, Digest, OfferedGpu, Timestamp};
use gridlease_sandbox::bench::{BenchConfig, run_isolated};
use gridlease_sandbox::gpu::{GpuInfo, uuid_digest};
use serde::{Deserialize, Serialize};

/// Cached benchmarks older than this are run again.
pub const BENCH_MAX_AGE_S: u64 = 30 * 24 * 3600;

/// What a provider offers from its driver-reported GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderGpus {
    /// Offer entries, in device order.
    pub offered: Vec<OfferedGpu>,
    /// Device UUID by the digest the offer carries.
    pub uuids: BTreeMap<Digest, String>,
}

impl ProviderGpus {
    /// Offer entries for `gpus`, with the cached benchmark of each where it is fresh at `now`.
    pub fn from_inventory(gpus: &[GpuInfo], benches: &BenchCache, now: Timestamp) -> Self {
        let offered = gpus
            .iter()
            .map(|g| g.to_offered(benches.fresh(g, now).cloned(), now))
            .collect();
        let uuids = gpus
            .iter()
            .map(|g| (uuid_digest(&g.uuid), g.uuid.clone()))
            .collect();
        Self { offered, uuids }
    }
}

/// One cached benchmark.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedBench {
    /// The driver it ran under; another driver invalidates it.
    pub driver_version: String,
    /// The result.
    pub report: BenchReport,
}

/// Benchmarks by GPU UUID (`<home>/bench.json`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BenchCache {
    /// By NVML UUID.
    pub by_uuid: BTreeMap<String, CachedBench>,
}

/// The cache file could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {path}: {source}")]
pub struct BenchCacheError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

impl BenchCache {
    /// `<home>/bench.json`.
    pub fn path(home: &Path) -> PathBuf {
        home.join("bench.json")
    }

    /// Loads the cache; a missing or unreadable file is an empty cache (it is only a cache: the
    /// benchmarks run again), and says so in the log.
    pub fn load(home: &Path) -> Self {
        let path = Self::path(home);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable benchmark cache");
                Self::default()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Self::default(),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable benchmark cache");
                Self::default()
            }
        }
    }

    /// Writes the cache atomically (temporary file, then rename).
    pub fn save(&self, home: &Path) -> Result<(), BenchCacheError> {
        let path = Self::path(home);
        let tmp = path.with_extension("json.tmp");
        let err = |source| BenchCacheError {
            path: path.clone(),
            source,
        };
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| err(std::io::Error::other(e)))?;
        std::fs::write(&tmp, bytes).map_err(err)?;
        std::fs::rename(&tmp, &path).map_err(err)
    }

    /// The cached report for `gpu` if it ran under the same driver less than
    /// [`BENCH_MAX_AGE_S`] before `now`.
    pub fn fresh(&self, gpu: &GpuInfo, now: Timestamp) -> Option<&BenchReport> {
        self.by_uuid
            .get(&gpu.uuid)
            .filter(|c| c.driver_version == gpu.driver_version)
            .filter(|c| now.ms_since(c.report.measured_at) / 1000 < BENCH_MAX_AGE_S)
            .map(|c| &c.report)
    }

    /// Benchmarks, through the isolated binary `program`, every GPU of `gpus` without a fresh
    /// result; returns how many new results were added. Failures are logged and leave the GPU
    /// unmeasured. Blocking: each run takes seconds.
    pub fn fill(&mut self, gpus: &[GpuInfo], program: &Path, now: Timestamp) -> usize {
        let mut added = 0;
        for g in gpus {
            if self.fresh(g, now).is_some() {
                continue;
            }
            let cfg = BenchConfig {
                device: g.index as usize,
                ..BenchConfig::default()
            };
            tracing::info!(gpu = %g.name, index = g.index, "benchmarking GPU (first start or new driver)");
            match run_isolated(program, &cfg) {
                Ok(r) => {
                    self.by_uuid.insert(
                        g.uuid.clone(),
                        CachedBench {
                            driver_version: g.driver_version.clone(),
                            report: r.to_bench_report(now),
                        },
                    );
                    added += 1;
                }
                Err(e) => {
                    tracing::warn!(gpu = %g.name, error = %e, "benchmark failed: offering this GPU as unverified");
                }
            }
        }
        added
    }
}

/// The isolated benchmark binary next to the running `gridlease`, if it is there.
pub fn bench_program() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let p = exe.with_file_name("gridlease-gpu-bench");
    p.is_file().then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlease_protocol::{Attestation, ComputeCapability};

    fn gpu(index: u32, uuid: &str, driver: &str) -> GpuInfo {
        GpuInfo {
            index,
            name: "NVIDIA GeForce RTX 4090".into(),
            uuid: uuid.into(),
            vram_mib: 24_564,
            driver_version: driver.into(),
            cuda_version: "12.8".into(),
            compute_capability: ComputeCapability { major: 8, minor: 9 },
            pcie_gen: 4,
            pcie_width: 16,
            power_limit_w: 450,
            clocks_mhz: [0; 3],
            max_clocks_mhz: [0; 3],
            util_percent: 0,
            energy_mj: Some(1),
            price_micros_per_hour: None,
            attestation: Attestation::Measured,
        }
    }

    fn report(at: Timestamp) -> BenchReport {
        BenchReport {
            fp32_gflops: 82_000,
            fp16_gflops: 160_000,
            device_mem_mbps: 900_000,
            h2d_mbps: 25_000,
            tool_version: "gridlease-gpu-bench/test".into(),
            measured_at: at,
            attestation: Attestation::Measured,
        }
    }

    fn cached(driver: &str, at: Timestamp) -> CachedBench {
        CachedBench {
            driver_version: driver.into(),
            report: report(at),
        }
    }

    #[test]
    fn driver_gpus_are_offered_with_their_device_uuids_and_measured_only_when_benchmarked() {
        let now = Timestamp(1_800_000_000_000);
        let gpus = [gpu(0, "GPU-aaaa", "570.1"), gpu(1, "GPU-bbbb", "570.1")];
        let mut cache = BenchCache::default();
        cache
            .by_uuid
            .insert("GPU-aaaa".into(), cached("570.1", now));
        let p = ProviderGpus::from_inventory(&gpus, &cache, now);
        assert_eq!(p.offered.len(), 2);
        assert_eq!(p.offered[0].bench.attestation, Attestation::Measured);
        assert_eq!(p.offered[0].bench.fp16_gflops, 160_000);
        // No benchmark: still offered, labelled unverified with zero rates.
        assert_eq!(p.offered[1].bench.attestation, Attestation::Declared);
        assert_eq!(p.offered[1].bench.fp16_gflops, 0);
        // The sandbox gets each leased GPU's real device UUID from the digest in the offer.
        for (o, g) in p.offered.iter().zip(&gpus) {
            assert_eq!(p.uuids[&o.spec.uuid_digest], g.uuid);
        }
        assert!(!p.offered.iter().any(|o| o.spec.model.contains("GPU-")));
    }

    #[test]
    fn cached_benchmarks_expire_with_age_and_with_a_new_driver() {
        let now = Timestamp(1_800_000_000_000);
        let mut cache = BenchCache::default();
        cache
            .by_uuid
            .insert("GPU-aaaa".into(), cached("570.1", now));
        assert!(cache.fresh(&gpu(0, "GPU-aaaa", "570.1"), now).is_some());
        assert!(cache.fresh(&gpu(0, "GPU-aaaa", "575.2"), now).is_none());
        let later = now.plus_secs(BENCH_MAX_AGE_S);
        assert!(cache.fresh(&gpu(0, "GPU-aaaa", "570.1"), later).is_none());
        assert!(cache.fresh(&gpu(0, "GPU-other", "570.1"), now).is_none());
    }

    #[test]
    fn the_cache_file_round_trips_and_a_corrupt_one_is_an_empty_cache() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(BenchCache::load(dir.path()), BenchCache::default());
        let mut cache = BenchCache::default();
        cache
            .by_uuid
            .insert("GPU-aaaa".into(), cached("570.1", Timestamp(5)));
        cache.save(dir.path()).unwrap();
        assert_eq!(BenchCache::load(dir.path()), cache);
        std::fs::write(BenchCache::path(dir.path()), b"{not json").unwrap();
        assert_eq!(BenchCache::load(dir.path()), BenchCache::default());
    }

    #[test]
    fn a_failing_benchmark_leaves_the_gpu_unmeasured() {
        // `false` exits 1 without output: the run fails, nothing is cached, nothing panics.
        let now = Timestamp(1_800_000_000_000);
        let mut cache = BenchCache::default();
        let added = cache.fill(&[gpu(0, "GPU-aaaa", "570.1")], Path::new("/bin/false"), now);
        assert_eq!(added, 0);
        assert!(cache.by_uuid.is_empty());
    }
}
