//! `gridlease bench`: GPU benchmark (cuBLAS GEMM fp32/fp16, device and host-to-device
//! bandwidth) on this machine, with a progress spinner. Without CUDA: a clear error, exit 2.

use std::time::Duration;

use clap::Args;
use gridlease_sandbox::bench::{BenchConfig, BenchError, BenchResult, run_in_process};

use crate::output::Printer;

/// Arguments of `gridlease bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// GPU index.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
}

/// Exit code when no CUDA/GPU is available.
pub const EXIT_NO_GPU: u8 = 2;

/// Runs the benchmark.
pub async fn run(out: &Printer, args: &BenchArgs) -> anyhow::Result<u8> {
    let cfg = BenchConfig {
        device: args.device,
        ..BenchConfig::default()
    };
    let bar = (!out.quiet && !out.json).then(|| {
        let b = indicatif::ProgressBar::new_spinner();
        b.set_message(format!(
            "benchmarking GPU {} (GEMM fp32/fp16, bandwidth)",
            args.device
        ));
        b.enable_steady_tick(Duration::from_millis(120));
        b
    });
    let result: Result<BenchResult, BenchError> =
        tokio::task::spawn_blocking(move || run_in_process(&cfg)).await?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    match result {
        Ok(r) => {
            out.emit(&r, |p| {
                p.line(&format!(
                    "{} (compute {}.{})",
                    r.name, r.compute_capability.0, r.compute_capability.1
                ));
                p.line(&format!(
                    "fp32 GEMM      {:>8.1} TFLOPS",
                    f64::from(r.fp32_gflops) / 1000.0
                ));
                p.line(&format!(
                    "fp16 GEMM      {:>8.1} TFLOPS",
                    f64::from(r.fp16_gflops) / 1000.0
                ));
                p.line(&format!(
                    "device memory  {:>8.1} GB/s",
                    f64::from(r.device_mem_mbps) / 1000.0
                ));
                p.line(&format!(
                    "host to device {:>8.1} GB/s",
                    f64::from(r.h2d_mbps) / 1000.0
                ));
            });
            Ok(0)
        }
        Err(e @ BenchError::NoCuda { .. }) => {
            anyhow::bail!(NoGpu(e.to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

/// "No GPU" failure, mapped to [`EXIT_NO_GPU`].
#[derive(Debug, thiserror::Error)]
#[error("{0}; no GPU benchmark is possible on this machine (renting works without a GPU)")]
pub struct NoGpu(pub String);
