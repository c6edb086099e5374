//! GPU inventory: the [`GpuProbe`] trait, NVML ([`NvmlProbe`]) and scripted ([`ScriptedProbe`],
//! also behind `--dev-gpus`) implementations, and conversion to protocol types.
//!
//! Invariant: no NVIDIA library or no GPU is an error value ([`GpuError::NoGpu`]), never a
//! panic; the node then runs renter-only. Scripted GPUs are always [`Attestation::Declared`].

use std::collections::BTreeMap;

use gridlease_protocol::{
    Attestation, BenchReport, ComputeCapability, Digest, GpuSpec, OfferedGpu, Timestamp,
};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use serde::{Deserialize, Serialize};

use crate::dev_gpus::DevGpus;
use crate::meter::{GpuSample, GpuSampleError, GpuSampler};

/// Domain tag for the UUID digest published in offers.
pub const UUID_DIGEST_DOMAIN: &str = "gridlease/v1/gpu-uuid";

/// Inventory or sampling failed.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No NVIDIA driver/library or no device: the node can only rent.
    #[error("no NVIDIA GPU found ({detail})")]
    NoGpu {
        /// Why (e.g. the dlopen error for libnvidia-ml.so.1).
        detail: String,
    },
    /// An NVML call failed.
    #[error("nvml {op} failed for gpu {gpu}: {source}")]
    Nvml {
        /// Which call.
        op: &'static str,
        /// Index or UUID.
        gpu: String,
        /// NVML's error.
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    /// Asked about a GPU this probe does not have.
    #[error("unknown gpu {uuid}")]
    UnknownGpu {
        /// The UUID asked for.
        uuid: String,
    },
    /// A `--dev-gpus` spec did not parse.
    #[error("invalid --dev-gpus entry {entry:?}: {reason}")]
    BadDevSpec {
        /// The offending entry.
        entry: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// One GPU as the provider's machine reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Device index.
    pub index: u32,
    /// Marketing name.
    pub name: String,
    /// NVML UUID (`GPU-...`). Private to the provider: offers carry only its digest.
    pub uuid: String,
    /// Total VRAM, MiB.
    pub vram_mib: u32,
    /// Driver version.
    pub driver_version: String,
    /// Highest CUDA version the driver supports, e.g. `12.8`.
    pub cuda_version: String,
    /// Compute capability.
    pub compute_capability: ComputeCapability,
    /// Current PCIe generation.
    pub pcie_gen: u8,
    /// Current PCIe width (lanes).
    pub pcie_width: u8,
    /// Enforced power limit, watts.
    pub power_limit_w: u32,
    /// Current graphics / SM / memory clocks, MHz (0 if unknown).
    pub clocks_mhz: [u32; 3],
    /// Maximum graphics / SM / memory clocks, MHz (0 if unknown).
    pub max_clocks_mhz: [u32; 3],
    /// GPU utilization now, percent.
    pub util_percent: u32,
    /// Board energy counter, millijoules (None if the board does not report it).
    pub energy_mj: Option<u64>,
    /// Declared price per GPU-hour in micro-units (`--dev-gpus` only).
    pub price_micros_per_hour: Option<u64>,
    /// Whether this inventory came from the driver (Measured) or was typed in (Declared).
    pub attestation: Attestation,
}

/// `Digest::of("gridlease/v1/gpu-uuid", uuid bytes)`.
pub fn uuid_digest(uuid: &str) -> Digest {
    Digest::of(UUID_DIGEST_DOMAIN, uuid.as_bytes())
}

impl GpuInfo {
    /// The protocol description of this GPU.
    pub fn to_spec(&self) -> GpuSpec {
        GpuSpec {
            model: self.name.clone(),
            vram_mib: self.vram_mib,
            uuid_digest: uuid_digest(&self.uuid),
            compute_capability: self.compute_capability,
            driver_version: self.driver_version.clone(),
            cuda_version: self.cuda_version.clone(),
            pcie_gen: self.pcie_gen,
            pcie_width: self.pcie_width,
            power_limit_w: self.power_limit_w,
        }
    }

    /// The offer entry. A declared GPU never carries a measured benchmark: its bench is
    /// replaced by a zero [`Attestation::Declared`] report.
    pub fn to_offered(&self, bench: Option<BenchReport>, now: Timestamp) -> OfferedGpu {
        let bench = match (self.attestation, bench) {
            (Attestation::Measured, Some(b)) => b,
            (_, b) => BenchReport {
                attestation: Attestation::Declared,
                measured_at: now,
                tool_version: b
                    .map(|b| b.tool_version)
                    .unwrap_or_else(|| "declared".into()),
                fp32_gflops: 0,
                fp16_gflops: 0,
                device_mem_mbps: 0,
                h2d_mbps: 0,
            },
        };
        OfferedGpu {
            spec: self.to_spec(),
            bench,
        }
    }
}

/// Source of the GPU inventory.
pub trait GpuProbe: Send + Sync {
    /// All GPUs, or [`GpuError::NoGpu`].
    fn list(&self) -> Result<Vec<GpuInfo>, GpuError>;
    /// Current utilization, VRAM used and energy of one GPU.
    fn sample(&self, uuid: &str) -> Result<GpuSample, GpuError>;
}

/// NVML-backed probe. Holds the library handle; devices are looked up per call (a `Device`
/// borrows `Nvml`).
pub struct NvmlProbe {
    nvml: Nvml,
}

impl std::fmt::Debug for NvmlProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NvmlProbe")
    }
}

impl NvmlProbe {
    /// Loads NVML. Any failure (library missing, driver not loaded, ...) is
    /// [`GpuError::NoGpu`].
    pub fn new() -> Result<Self, GpuError> {
        match Nvml::init() {
            Ok(nvml) => Ok(Self { nvml }),
            Err(e) => Err(GpuError::NoGpu {
                detail: format!("NVML unavailable: {e}"),
            }),
        }
    }
}

fn nvml_err(
    op: &'static str,
    gpu: impl ToString,
) -> impl FnOnce(nvml_wrapper::error::NvmlError) -> GpuError {
    let gpu = gpu.to_string();
    move |source| GpuError::Nvml { op, gpu, source }
}

fn clamp_u8(v: u32) -> u8 {
    u8::try_from(v).unwrap_or(u8::MAX)
}

impl GpuProbe for NvmlProbe {
    fn list(&self) -> Result<Vec<GpuInfo>, GpuError> {
        let count = self
            .nvml
            .device_count()
            .map_err(nvml_err("device_count", "-"))?;
        if count == 0 {
            return Err(GpuError::NoGpu {
                detail: "NVML reports 0 devices".into(),
            });
        }
        let driver = self
            .nvml
            .sys_driver_version()
            .map_err(nvml_err("sys_driver_version", "-"))?;
        let cuda = self
            .nvml
            .sys_cuda_driver_version()
            .map(|v| {
                format!(
                    "{}.{}",
                    nvml_wrapper::cuda_driver_version_major(v),
                    nvml_wrapper::cuda_driver_version_minor(v)
                )
            })
            .unwrap_or_default();
        let mut out = Vec::new();
        for i in 0..count {
            let d = self
                .nvml
                .device_by_index(i)
                .map_err(nvml_err("device_by_index", i))?;
            let cc = d
                .cuda_compute_capability()
                .map_err(nvml_err("cuda_compute_capability", i))?;
            let mem = d.memory_info().map_err(nvml_err("memory_info", i))?;
            let clock = |c: Clock| d.clock_info(c).unwrap_or(0);
            let max_clock = |c: Clock| d.max_clock_info(c).unwrap_or(0);
            out.push(GpuInfo {
                index: i,
                name: d.name().map_err(nvml_err("name", i))?,
                uuid: d.uuid().map_err(nvml_err("uuid", i))?,
                vram_mib: u32::try_from(mem.total / (1024 * 1024)).unwrap_or(u32::MAX),
                driver_version: driver.clone(),
                cuda_version: cuda.clone(),
                compute_capability: ComputeCapability {
                    major: u8::try_from(cc.major).unwrap_or(0),
                    minor: u8::try_from(cc.minor).unwrap_or(0),
                },
                pcie_gen: clamp_u8(d.current_pcie_link_gen().unwrap_or(0)),
                pcie_width: clamp_u8(d.current_pcie_link_width().unwrap_or(0)),
                power_limit_w: d.enforced_power_limit().unwrap_or(0) / 1000,
                clocks_mhz: [
                    clock(Clock::Graphics),
                    clock(Clock::SM),
                    clock(Clock::Memory),
                ],
                max_clocks_mhz: [
                    max_clock(Clock::Graphics),
                    max_clock(Clock::SM),
                    max_clock(Clock::Memory),
                ],
                util_percent: d.utilization_rates().map(|u| u.gpu).unwrap_or(0),
                energy_mj: d.total_energy_consumption().ok(),
                price_micros_per_hour: None,
                attestation: Attestation::Measured,
            });
        }
        Ok(out)
    }

    fn sample(&self, uuid: &str) -> Result<GpuSample, GpuError> {
        let d = self
            .nvml
            .device_by_uuid(uuid)
            .map_err(nvml_err("device_by_uuid", uuid))?;
        let util = d
            .utilization_rates()
            .map_err(nvml_err("utilization_rates", uuid))?;
        let mem = d.memory_info().map_err(nvml_err("memory_info", uuid))?;
        let mib = |b: u64| u32::try_from(b / (1024 * 1024)).unwrap_or(u32::MAX);
        // What the board does not report stays `None` (shown as n/a, never as 0).
        Ok(GpuSample {
            util_percent: util.gpu,
            vram_used_mib: mib(mem.used),
            energy_mj: d.total_energy_consumption().unwrap_or(0),
            vram_total_mib: Some(mib(mem.total)),
            power_mw: d.power_usage().ok(),
            power_limit_mw: d.enforced_power_limit().ok(),
            temp_c: d.temperature(TemperatureSensor::Gpu).ok(),
            sm_clock_mhz: d.clock_info(Clock::SM).ok(),
            // Compute processes only: a desktop's compositor is a graphics process on the GPU
            // that drives the display, always there; a game shows as utilisation instead.
            processes: d.running_compute_processes_count().ok(),
            host_processes: d.running_compute_processes().ok().map(|ps| {
                let n = ps.iter().filter(|p| outside_containers(p.pid)).count();
                u32::try_from(n).unwrap_or(u32::MAX)
            }),
        })
    }
}

/// Whether host process `pid` runs outside any container, from its cgroup path (Docker,
/// containerd, Podman and Kubernetes put their containers' processes under a cgroup naming
/// them). A process that cannot be read (gone, or another PID namespace) does not count as
/// outside: a lease is never interrupted on a guess.
fn outside_containers(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
        Ok(cg) => !["docker", "containerd", "libpod", "kubepods", "crio"]
            .iter()
            .any(|m| cg.contains(m)),
        Err(_) => false,
    }
}

impl GpuSampler for NvmlProbe {
    fn sample(&self, uuid: &str) -> Result<GpuSample, GpuSampleError> {
        GpuProbe::sample(self, uuid).map_err(|e| GpuSampleError {
            uuid: uuid.to_string(),
            detail: e.to_string(),
        })
    }
}

/// A scripted inventory for tests and `--dev-gpus`. Every GPU is [`Attestation::Declared`].
/// Samples are scripted per GPU as a curve: the n-th sample of a GPU is the curve's
/// `n % len`-th point (a GPU without one samples as zeros).
#[derive(Clone, Debug, Default)]
pub struct ScriptedProbe {
    gpus: Vec<GpuInfo>,
    curves: BTreeMap<String, Curve>,
}

#[derive(Clone, Debug)]
struct Curve {
    points: Vec<GpuSample>,
    next: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    owner_file: Option<std::path::PathBuf>,
}

/// One scripted GPU's series in a curves file (`--dev-gpu-samples`): JSON, one object per
/// declared GPU in order; each series repeats from its start when it runs out.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CurveSpec {
    /// Utilisation, percent (required, 0..=100).
    pub util_percent: Vec<u32>,
    /// VRAM in use, MiB (required).
    pub vram_used_mib: Vec<u32>,
    /// Power draw, watts.
    #[serde(default)]
    pub power_w: Vec<u32>,
    /// Core temperature, degrees Celsius.
    #[serde(default)]
    pub temp_c: Vec<u32>,
    /// SM clock, MHz.
    #[serde(default)]
    pub sm_clock_mhz: Vec<u32>,
    /// Processes on the GPU besides a tenant's (the owner's own use).
    #[serde(default)]
    pub processes: Vec<u32>,
    /// While this file exists the GPU has one more process (the owner at the machine): lets a
    /// test start and end the owner's use when it chooses.
    #[serde(default)]
    pub owner_file: Option<std::path::PathBuf>,
}

/// Most points in one scripted series.
pub const MAX_CURVE_POINTS: usize = 10_000;

impl ScriptedProbe {
    /// A probe returning exactly `gpus` (their attestation is forced to Declared).
    pub fn new(gpus: Vec<GpuInfo>) -> Self {
        let gpus = gpus
            .into_iter()
            .map(|mut g| {
                g.attestation = Attestation::Declared;
                g
            })
            .collect();
        Self {
            gpus,
            curves: BTreeMap::new(),
        }
    }

    /// From a `--dev-gpus` spec ([`DevGpus`]: `[Nx]MODEL:VRAM:PRICE,...`), one GPU per unit of
    /// count. UUIDs are synthetic and deterministic (`GPU-de000000-...`).
    pub fn from_dev_spec(spec: &str) -> Result<Self, GpuError> {
        let parsed = DevGpus::parse(spec).map_err(|e| GpuError::BadDevSpec {
            entry: e.entry,
            reason: e.problem,
        })?;
        let gpus = parsed
            .entries
            .iter()
            .flat_map(|g| (0..g.count).map(move |_| g))
            .enumerate()
            .map(|(i, g)| GpuInfo {
                index: i as u32,
                uuid: format!("GPU-de{i:06x}-0000-4000-8000-{:012x}", i),
                name: g.model.clone(),
                vram_mib: g.vram_mib,
                driver_version: "declared".into(),
                cuda_version: String::new(),
                compute_capability: ComputeCapability { major: 0, minor: 0 },
                pcie_gen: 0,
                pcie_width: 0,
                power_limit_w: 0,
                clocks_mhz: [0; 3],
                max_clocks_mhz: [0; 3],
                util_percent: 0,
                energy_mj: None,
                price_micros_per_hour: Some(g.price.micros()),
                attestation: Attestation::Declared,
            })
            .collect();
        Ok(Self::new(gpus))
    }

    /// Scripts what [`GpuProbe::sample`] returns for `uuid`.
    pub fn set_sample(&mut self, uuid: &str, sample: GpuSample) {
        self.set_curve(uuid, vec![sample]);
    }

    /// Scripts the samples of `uuid`: the n-th call returns `points[n % len]` (no points: zeros).
    pub fn set_curve(&mut self, uuid: &str, points: Vec<GpuSample>) {
        self.curves.insert(
            uuid.to_string(),
            Curve {
                points,
                next: std::sync::Arc::default(),
                owner_file: None,
            },
        );
    }

    /// Scripts every GPU from a curves file's text (JSON: an array of [`CurveSpec`], one per
    /// GPU of this inventory, in order). Refused: a count other than the GPUs', an empty or
    /// over-long required series, a utilisation over 100, unknown fields.
    pub fn set_curves_json(&mut self, text: &str) -> Result<(), GpuError> {
        let bad = |reason: String| GpuError::BadDevSpec {
            entry: "--dev-gpu-samples".into(),
            reason,
        };
        let specs: Vec<CurveSpec> =
            serde_json::from_str(text).map_err(|e| bad(format!("not a curves file: {e}")))?;
        if specs.len() != self.gpus.len() {
            return Err(bad(format!(
                "{} curves for {} declared GPUs (one per GPU, in order)",
                specs.len(),
                self.gpus.len()
            )));
        }
        let uuids: Vec<(String, u32)> = self
            .gpus
            .iter()
            .map(|g| (g.uuid.clone(), g.vram_mib))
            .collect();
        for (i, (spec, (uuid, vram_total))) in specs.iter().zip(uuids).enumerate() {
            let series = [
                ("util_percent", &spec.util_percent, true),
                ("vram_used_mib", &spec.vram_used_mib, true),
                ("power_w", &spec.power_w, false),
                ("temp_c", &spec.temp_c, false),
                ("sm_clock_mhz", &spec.sm_clock_mhz, false),
                ("processes", &spec.processes, false),
            ];
            for (name, s, required) in series {
                if (required && s.is_empty()) || s.len() > MAX_CURVE_POINTS {
                    return Err(bad(format!(
                        "GPU {i}: {name} needs 1 to {MAX_CURVE_POINTS} points, has {}",
                        s.len()
                    )));
                }
            }
            if let Some(u) = spec.util_percent.iter().find(|u| **u > 100) {
                return Err(bad(format!("GPU {i}: utilisation {u} % is over 100")));
            }
            let len = series.iter().map(|(_, s, _)| s.len()).max().unwrap_or(1);
            let at = |s: &Vec<u32>, k: usize| (!s.is_empty()).then(|| s[k % s.len()]);
            let points = (0..len)
                .map(|k| GpuSample {
                    util_percent: spec.util_percent[k % spec.util_percent.len()],
                    vram_used_mib: spec.vram_used_mib[k % spec.vram_used_mib.len()],
                    energy_mj: 0,
                    vram_total_mib: Some(vram_total),
                    power_mw: at(&spec.power_w, k).map(|w| w.saturating_mul(1000)),
                    power_limit_mw: None,
                    temp_c: at(&spec.temp_c, k),
                    sm_clock_mhz: at(&spec.sm_clock_mhz, k),
                    processes: at(&spec.processes, k).or(spec.owner_file.as_ref().map(|_| 0)),
                    // Scripted processes are the owner's (besides a tenant's): on the host.
                    host_processes: at(&spec.processes, k).or(spec.owner_file.as_ref().map(|_| 0)),
                })
                .collect();
            self.set_curve(&uuid, points);
            if let Some(c) = self.curves.get_mut(&uuid) {
                c.owner_file.clone_from(&spec.owner_file);
            }
        }
        Ok(())
    }
}

impl GpuProbe for ScriptedProbe {
    fn list(&self) -> Result<Vec<GpuInfo>, GpuError> {
        if self.gpus.is_empty() {
            return Err(GpuError::NoGpu {
                detail: "scripted inventory is empty".into(),
            });
        }
        Ok(self.gpus.clone())
    }

    fn sample(&self, uuid: &str) -> Result<GpuSample, GpuError> {
        if !self.gpus.iter().any(|g| g.uuid == uuid) {
            return Err(GpuError::UnknownGpu {
                uuid: uuid.to_string(),
            });
        }
        Ok(self
            .curves
            .get(uuid)
            .and_then(|c| {
                let k = c.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut s = c.points.get(k % c.points.len().max(1)).copied()?;
                if c.owner_file.as_ref().is_some_and(|f| f.exists()) {
                    s.processes = Some(s.processes.unwrap_or(0).saturating_add(1));
                    s.host_processes = Some(s.host_processes.unwrap_or(0).saturating_add(1));
                }
                Some(s)
            })
            .unwrap_or_default())
    }
}

impl GpuSampler for ScriptedProbe {
    fn sample(&self, uuid: &str) -> Result<GpuSample, GpuSampleError> {
        GpuProbe::sample(self, uuid).map_err(|e| GpuSampleError {
            uuid: uuid.to_string(),
            detail: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_spec_counts_expand_to_distinct_declared_gpus() {
        let p =
            ScriptedProbe::from_dev_spec("2x RTX 3090:24GiB:0.25, RTX 4090:24GiB:0.40").unwrap();
        let gpus = p.list().unwrap();
        assert_eq!(gpus.len(), 3);
        assert_eq!(gpus[1].name, "RTX 3090");
        assert_eq!(gpus[2].name, "RTX 4090");
        assert_eq!(gpus[2].price_micros_per_hour, Some(400_000));
        assert_ne!(gpus[0].uuid, gpus[1].uuid);
        assert!(matches!(
            ScriptedProbe::from_dev_spec("RTX:24GiB"),
            Err(GpuError::BadDevSpec { entry, .. }) if entry == "RTX:24GiB"
        ));
    }

    #[test]
    fn scripted_gpus_are_declared_and_convert_to_protocol() {
        let p = ScriptedProbe::from_dev_spec("RTX 4090:24GiB:0.40").unwrap();
        let gpus = p.list().unwrap();
        assert_eq!(gpus[0].attestation, Attestation::Declared);
        assert!(gpus[0].uuid.starts_with("GPU-"));
        let spec = gpus[0].to_spec();
        assert_eq!(spec.vram_mib, 24576);
        assert_eq!(
            spec.uuid_digest,
            Digest::of("gridlease/v1/gpu-uuid", gpus[0].uuid.as_bytes())
        );
        // Even a "measured" bench handed in is replaced: declared GPUs are never Measured.
        let measured = BenchReport {
            fp32_gflops: 80_000,
            fp16_gflops: 160_000,
            device_mem_mbps: 1,
            h2d_mbps: 1,
            tool_version: "x".into(),
            measured_at: Timestamp(1),
            attestation: Attestation::Measured,
        };
        let offered = gpus[0].to_offered(Some(measured), Timestamp(5));
        assert_eq!(offered.bench.attestation, Attestation::Declared);
        assert_eq!(offered.bench.fp32_gflops, 0);
        // The generated UUID is acceptable to the container spec.
        let body = crate::spec::build_create_body(&crate::spec::SandboxSpec {
            lease_id: gridlease_protocol::LeaseId(Digest::of("t", b"x")),
            node_id: "n".into(),
            volumes: Vec::new(),
            expires_at: Timestamp(1),
            image: "i".into(),
            command: vec![],
            env: Default::default(),
            gpu_uuids: vec![gpus[0].uuid.clone()],
            cpu_millicores: 1000,
            memory_mib: 64,
            pids_limit: 10,
            scratch_mib: 10,
            shm_mib: 32,
            workspace_bytes: 0,
            workspace: None,
            nofile: crate::spec::DEFAULT_NOFILE,
            network: gridlease_protocol::NetworkPolicy::None,
            egress_network: String::new(),
            run_as_root: false,
            log_file_mib: crate::spec::LOG_FILE_MIB_MIN,
            runtime: None,
            isolation: gridlease_protocol::Isolation::Runc,
        });
        assert!(body.is_ok());
    }

    #[test]
    fn curves_files_script_every_gpu_and_refuse_what_does_not_fit() {
        let mut p = ScriptedProbe::from_dev_spec("2x A:24GiB:1").unwrap();
        let uuids: Vec<String> = p.list().unwrap().into_iter().map(|g| g.uuid).collect();
        p.set_curves_json(
            r#"[{"util_percent":[10,90],"vram_used_mib":[1000,2000,3000],"power_w":[150]},
                {"util_percent":[0],"vram_used_mib":[5]}]"#,
        )
        .unwrap();
        let s = |u: &str| GpuProbe::sample(&p, u).unwrap();
        let first: Vec<(u32, u32)> = (0..4)
            .map(|_| s(&uuids[0]))
            .map(|g| (g.util_percent, g.vram_used_mib))
            .collect();
        assert_eq!(first, [(10, 1000), (90, 2000), (10, 3000), (10, 1000)]);
        let g = s(&uuids[0]);
        assert_eq!(
            (g.power_mw, g.temp_c, g.vram_total_mib),
            (Some(150_000), None, Some(24 * 1024))
        );
        assert_eq!(s(&uuids[1]).vram_used_mib, 5);
        for (bad, why) in [
            (
                r#"[{"util_percent":[1],"vram_used_mib":[1]}]"#,
                "1 curves for 2",
            ),
            (
                r#"[{"util_percent":[],"vram_used_mib":[1]},{"util_percent":[1],"vram_used_mib":[1]}]"#,
                "util_percent needs",
            ),
            (
                r#"[{"util_percent":[101],"vram_used_mib":[1]},{"util_percent":[1],"vram_used_mib":[1]}]"#,
                "over 100",
            ),
            (
                r#"[{"util_percent":[1],"vram_used_mib":[1],"watts":[1]},{"util_percent":[1],"vram_used_mib":[1]}]"#,
                "unknown field",
            ),
            ("nope", "not a curves file"),
        ] {
            let e = p.set_curves_json(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn scripted_samples_and_unknown_gpu() {
        let mut p = ScriptedProbe::from_dev_spec("A:1GiB:1").unwrap();
        let uuid = p.list().unwrap()[0].uuid.clone();
        p.set_sample(
            &uuid,
            GpuSample {
                util_percent: 50,
                vram_used_mib: 10,
                energy_mj: 7,
                ..GpuSample::default()
            },
        );
        assert_eq!(GpuProbe::sample(&p, &uuid).unwrap().util_percent, 50);
        assert!(matches!(
            GpuProbe::sample(&p, "GPU-0"),
            Err(GpuError::UnknownGpu { .. })
        ));
        assert!(matches!(
            ScriptedProbe::new(vec![]).list(),
            Err(GpuError::NoGpu { .. })
        ));
    }
}
