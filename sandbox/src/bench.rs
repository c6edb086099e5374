//! GPU benchmark through cudarc (dynamic loading): fp32 and fp16 GEMM via cuBLAS, device
//! memory bandwidth (device-to-device copy) and pinned host-to-device bandwidth, each with
//! warm-up and the median of repeats.
//!
//! Invariant: never panics the caller on a machine without CUDA. [`check_cuda`] looks for the
//! driver and cuBLAS libraries before any context is created (cudarc panics otherwise),
//! [`run_in_process`] adds `catch_unwind` as a second guard, and the node runs the benchmark
//! in a child process ([`run_isolated`], the `gridlease-gpu-bench` binary) so a driver crash
//! cannot take the daemon down.

// cudarc's library probes, GEMM calls and pinned allocations are `unsafe fn`; each use below
// carries a SAFETY note.
#![allow(unsafe_code)]

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use gridlease_protocol::{Attestation, BenchReport, Timestamp};
use serde::{Deserialize, Serialize};

/// Name and version written into reports.
pub const TOOL_VERSION: &str = concat!("gridlease-gpu-bench/", env!("CARGO_PKG_VERSION"));

/// The benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The CUDA driver library (`libcuda.so`) or cuBLAS is not installed.
    #[error(
        "CUDA is not available: {detail}; install the NVIDIA driver and CUDA 12 runtime libraries (libcuda, libcublas) to benchmark"
    )]
    NoCuda {
        /// Which library is missing.
        detail: String,
    },
    /// A CUDA driver call failed (e.g. `CUDA_ERROR_NO_DEVICE`).
    #[error("cuda {op} failed: {detail}")]
    Driver {
        /// Which call.
        op: &'static str,
        /// The driver's error.
        detail: String,
    },
    /// A cuBLAS call failed.
    #[error("cublas {op} failed: {detail}")]
    Cublas {
        /// Which call.
        op: &'static str,
        /// The error.
        detail: String,
    },
    /// The benchmark panicked (caught).
    #[error("benchmark panicked: {detail}")]
    Panicked {
        /// The panic message.
        detail: String,
    },
    /// The child process could not run or failed.
    #[error("benchmark process {program} failed (exit {code:?}): {stderr}")]
    Child {
        /// The binary.
        program: String,
        /// Its exit code.
        code: Option<i32>,
        /// What it printed on stderr (trimmed, bounded).
        stderr: String,
    },
    /// The child printed something that is not a result.
    #[error("benchmark output is not valid JSON: {detail}")]
    BadOutput {
        /// The parse error.
        detail: String,
    },
}

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BenchConfig {
    /// CUDA device ordinal.
    pub device: usize,
    /// GEMM size (n x n x n).
    pub n: usize,
    /// Untimed warm-up runs.
    pub warmup: usize,
    /// Timed repeats; the median is reported.
    pub repeats: usize,
    /// GEMMs per timed repeat.
    pub gemms_per_repeat: usize,
    /// Bytes per bandwidth copy.
    pub copy_bytes: usize,
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            device: 0,
            n: 8192,
            warmup: 3,
            repeats: 7,
            gemms_per_repeat: 5,
            copy_bytes: 512 << 20,
        }
    }
}

/// Benchmark results for one device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    /// Device ordinal.
    pub device: usize,
    /// Device name from the driver.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Total memory, bytes.
    pub total_mem: u64,
    /// Median fp32 GEMM rate, GFLOP/s.
    pub fp32_gflops: u32,
    /// Median fp16 GEMM (fp32 accumulate) rate, GFLOP/s.
    pub fp16_gflops: u32,
    /// Median device-to-device copy bandwidth (read + write), MB/s.
    pub device_mem_mbps: u32,
    /// Median pinned host-to-device bandwidth, MB/s.
    pub h2d_mbps: u32,
    /// The configuration used.
    pub config: BenchConfig,
    /// Tool name and version.
    pub tool_version: String,
    /// Wall time of the whole run, ms.
    pub elapsed_ms: u64,
}

impl BenchResult {
    /// The protocol report (Measured).
    pub fn to_bench_report(&self, measured_at: Timestamp) -> BenchReport {
        BenchReport {
            fp32_gflops: self.fp32_gflops,
            fp16_gflops: self.fp16_gflops,
            device_mem_mbps: self.device_mem_mbps,
            h2d_mbps: self.h2d_mbps,
            tool_version: self.tool_version.clone(),
            measured_at,
            attestation: Attestation::Measured,
        }
    }
}

/// Median of the values (mean of the middle two for even lengths); 0 for none.
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

fn to_u32_rate(v: f64) -> u32 {
    if v.is_finite() && v > 0.0 {
        v.min(f64::from(u32::MAX)) as u32
    } else {
        0
    }
}

/// Checks that the CUDA driver and cuBLAS libraries can be loaded.
pub fn check_cuda() -> Result<(), BenchError> {
    // SAFETY: `is_culib_present` only tries to dlopen the library by name and reports whether
    // that worked; it does not call into CUDA.
    let driver = unsafe { cudarc::driver::sys::is_culib_present() };
    if !driver {
        return Err(BenchError::NoCuda {
            detail: "the CUDA driver library (libcuda.so) was not found".into(),
        });
    }
    // SAFETY: as above, for libcublas.
    let cublas = unsafe { cudarc::cublas::sys::is_culib_present() };
    if !cublas {
        return Err(BenchError::NoCuda {
            detail: "the cuBLAS library (libcublas.so) was not found".into(),
        });
    }
    Ok(())
}

/// Runs the benchmark in this process: library checks first, then the measurement under
/// `catch_unwind`.
pub fn run_in_process(cfg: &BenchConfig) -> Result<BenchResult, BenchError> {
    check_cuda()?;
    let cfg = *cfg;
    match std::panic::catch_unwind(move || measure(&cfg)) {
        Ok(r) => r,
        Err(p) => {
            let detail = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(BenchError::Panicked { detail })
        }
    }
}

/// Runs `program bench --device D --n N ...` as a child process and parses its JSON. A
/// non-zero exit becomes [`BenchError::Child`] with the child's error message.
pub fn run_isolated(program: &Path, cfg: &BenchConfig) -> Result<BenchResult, BenchError> {
    let out = Command::new(program)
        .arg("bench")
        .arg("--device")
        .arg(cfg.device.to_string())
        .arg("--n")
        .arg(cfg.n.to_string())
        .arg("--repeats")
        .arg(cfg.repeats.to_string())
        .output()
        .map_err(|e| BenchError::Child {
            program: program.display().to_string(),
            code: None,
            stderr: e.to_string(),
        })?;
    if !out.status.success() {
        let mut stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        stderr.truncate(4096);
        return Err(BenchError::Child {
            program: program.display().to_string(),
            code: out.status.code(),
            stderr,
        });
    }
    serde_json::from_slice(&out.stdout).map_err(|e| BenchError::BadOutput {
        detail: e.to_string(),
    })
}

fn drv(op: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> BenchError {
    move |e| BenchError::Driver {
        op,
        detail: format!("{e:?}"),
    }
}

fn blas(op: &'static str) -> impl FnOnce(cudarc::cublas::result::CublasError) -> BenchError {
    move |e| BenchError::Cublas {
        op,
        detail: format!("{e:?}"),
    }
}

/// Deterministic pseudo-random values in [-1, 1) (no RNG dependency; values only need to be
/// non-trivial so clocks and power behave as in real work).
fn host_data(len: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn measure(cfg: &BenchConfig) -> Result<BenchResult, BenchError> {
    use cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N;
    use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
    use cudarc::driver::CudaContext;
    use cudarc::driver::sys::CUevent_flags;

    let t_start = Instant::now();
    let ctx = CudaContext::new(cfg.device).map_err(drv("context"))?;
    let name = ctx.name().map_err(drv("name"))?;
    let cc = ctx
        .compute_capability()
        .map_err(drv("compute_capability"))?;
    let total_mem = ctx.total_mem().map_err(drv("total_mem"))? as u64;
    let stream = ctx.default_stream();
    let cublas = CudaBlas::new(stream.clone()).map_err(blas("create"))?;

    // Shrink the problem on small cards: fp32 needs 3 n^2 * 4 bytes.
    let mut n = cfg.n.max(256);
    while n > 1024 && (3 * n * n * 4) as u64 > total_mem / 3 {
        n /= 2;
    }
    let n_i32 = i32::try_from(n).map_err(|_| BenchError::Driver {
        op: "size",
        detail: format!("n = {n} too large"),
    })?;
    let flops_per_gemm = 2.0 * (n as f64).powi(3);
    let event = || Some(CUevent_flags::CU_EVENT_DEFAULT);

    let time_repeats =
        |f: &mut dyn FnMut() -> Result<(), BenchError>| -> Result<Vec<f64>, BenchError> {
            for _ in 0..cfg.warmup {
                f()?;
            }
            stream.synchronize().map_err(drv("synchronize"))?;
            let mut ms = Vec::with_capacity(cfg.repeats);
            for _ in 0..cfg.repeats.max(1) {
                let e0 = stream.record_event(event()).map_err(drv("record_event"))?;
                f()?;
                let e1 = stream.record_event(event()).map_err(drv("record_event"))?;
                e1.synchronize().map_err(drv("event_synchronize"))?;
                ms.push(f64::from(e0.elapsed_ms(&e1).map_err(drv("elapsed"))?));
            }
            Ok(ms)
        };

    // fp32 GEMM.
    let a = stream
        .clone_htod(&host_data(n * n, 1))
        .map_err(drv("alloc_a"))?;
    let b = stream
        .clone_htod(&host_data(n * n, 2))
        .map_err(drv("alloc_b"))?;
    let mut c = stream.alloc_zeros::<f32>(n * n).map_err(drv("alloc_c"))?;
    let g32 = GemmConfig {
        transa: CUBLAS_OP_N,
        transb: CUBLAS_OP_N,
        m: n_i32,
        n: n_i32,
        k: n_i32,
        alpha: 1.0f32,
        lda: n_i32,
        ldb: n_i32,
        beta: 0.0f32,
        ldc: n_i32,
    };
    let ms32 = time_repeats(&mut || {
        for _ in 0..cfg.gemms_per_repeat {
            // SAFETY: a, b, c are n*n device buffers matching the m/n/k/ld values in g32.
            unsafe { cublas.gemm(g32, &a, &b, &mut c) }.map_err(blas("sgemm"))?;
        }
        Ok(())
    })?;
    drop((a, b, c));
    let fp32_gflops = flops_per_gemm * cfg.gemms_per_repeat as f64 / (median(&ms32) / 1e3) / 1e9;

    // fp16 GEMM (fp32 accumulate).
    let h: Vec<half::f16> = host_data(n * n, 3)
        .into_iter()
        .map(half::f16::from_f32)
        .collect();
    let a = stream.clone_htod(&h).map_err(drv("alloc_a16"))?;
    let b = stream.clone_htod(&h).map_err(drv("alloc_b16"))?;
    let mut c = stream
        .clone_htod(&vec![half::f16::ZERO; n * n])
        .map_err(drv("alloc_c16"))?;
    drop(h);
    let g16 = GemmConfig {
        transa: CUBLAS_OP_N,
        transb: CUBLAS_OP_N,
        m: n_i32,
        n: n_i32,
        k: n_i32,
        alpha: half::f16::ONE,
        lda: n_i32,
        ldb: n_i32,
        beta: half::f16::ZERO,
        ldc: n_i32,
    };
    let ms16 = time_repeats(&mut || {
        for _ in 0..cfg.gemms_per_repeat {
            // SAFETY: as above, f16 buffers of n*n elements.
            unsafe { cublas.gemm(g16, &a, &b, &mut c) }.map_err(blas("hgemm"))?;
        }
        Ok(())
    })?;
    drop((a, b, c));
    let fp16_gflops = flops_per_gemm * cfg.gemms_per_repeat as f64 / (median(&ms16) / 1e3) / 1e9;

    // Device-to-device copy: each byte is read once and written once.
    let bytes = cfg.copy_bytes.min((total_mem / 4) as usize).max(1 << 20);
    let src = stream.alloc_zeros::<u8>(bytes).map_err(drv("alloc_src"))?;
    let mut dst = stream.alloc_zeros::<u8>(bytes).map_err(drv("alloc_dst"))?;
    let ms_d2d = time_repeats(&mut || stream.memcpy_dtod(&src, &mut dst).map_err(drv("dtod")))?;
    let device_mem_mbps = 2.0 * bytes as f64 / (median(&ms_d2d) / 1e3) / 1e6;
    drop(src);

    // Pinned host-to-device.
    // SAFETY: the pinned buffer is only used as a copy source; its contents do not matter.
    let pinned = unsafe { ctx.alloc_pinned::<u8>(bytes) }.map_err(drv("alloc_pinned"))?;
    let ms_h2d = time_repeats(&mut || stream.memcpy_htod(&pinned, &mut dst).map_err(drv("htod")))?;
    let h2d_mbps = bytes as f64 / (median(&ms_h2d) / 1e3) / 1e6;

    Ok(BenchResult {
        device: cfg.device,
        name,
        compute_capability: cc,
        total_mem,
        fp32_gflops: to_u32_rate(fp32_gflops),
        fp16_gflops: to_u32_rate(fp16_gflops),
        device_mem_mbps: to_u32_rate(device_mem_mbps),
        h2d_mbps: to_u32_rate(h2d_mbps),
        config: BenchConfig { n, ..*cfg },
        tool_version: TOOL_VERSION.to_string(),
        elapsed_ms: t_start.elapsed().as_millis() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_and_nan() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[f64::NAN, 5.0]), 5.0);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn report_is_measured() {
        let r = BenchResult {
            device: 0,
            name: "x".into(),
            compute_capability: (8, 9),
            total_mem: 1,
            fp32_gflops: 82_000,
            fp16_gflops: 165_000,
            device_mem_mbps: 900_000,
            h2d_mbps: 25_000,
            config: BenchConfig::default(),
            tool_version: TOOL_VERSION.into(),
            elapsed_ms: 1,
        };
        let b = r.to_bench_report(Timestamp(7));
        assert_eq!(b.attestation, Attestation::Measured);
        assert_eq!(b.fp32_gflops, 82_000);
        assert_eq!(b.measured_at, Timestamp(7));
    }
}
