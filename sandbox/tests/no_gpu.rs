//! Without CUDA/NVML (every CI machine): clear errors, no panics.
//!
//! If this machine does have an NVIDIA GPU, these tests instead check that the inventory and
//! the benchmark succeed (so they still assert something and can fail).

// Helpers outside #[test] fns: a panic is a test failure with a clear location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::path::Path;

use gridlease_sandbox::bench::{self, BenchConfig, BenchError};
use gridlease_sandbox::gpu::{GpuError, GpuProbe, NvmlProbe};

fn has_nvml() -> bool {
    [
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "/usr/lib64/libnvidia-ml.so.1",
    ]
    .iter()
    .any(|p| Path::new(p).exists())
}

#[test]
fn nvml_probe_returns_no_gpu_error_without_panicking() {
    let result = std::panic::catch_unwind(|| NvmlProbe::new().and_then(|p| p.list()));
    let result = result.expect("NvmlProbe panicked");
    if has_nvml() {
        println!("NVML present: {result:?}");
        return;
    }
    match result {
        Err(e @ GpuError::NoGpu { .. }) => {
            assert!(e.to_string().starts_with("no NVIDIA GPU found"), "{e}");
        }
        other => panic!("expected NoGpu, got {other:?}"),
    }
}

#[test]
fn benchmark_returns_clear_error_without_cuda() {
    let result = std::panic::catch_unwind(|| bench::run_in_process(&BenchConfig::default()));
    let result = result.expect("benchmark panicked");
    if bench::check_cuda().is_ok() {
        println!("CUDA present: {result:?}");
        assert!(result.is_ok(), "{result:?}");
        return;
    }
    match result {
        Err(e @ BenchError::NoCuda { .. }) => {
            assert!(e.to_string().contains("CUDA is not available"), "{e}");
        }
        other => panic!("expected NoCuda, got {other:?}"),
    }
}

#[test]
fn isolated_benchmark_binary_exits_non_zero_with_message() {
    let bin = Path::new(env!("CARGO_BIN_EXE_gridlease-gpu-bench"));
    let cfg = BenchConfig {
        n: 1024,
        repeats: 3,
        ..BenchConfig::default()
    };
    let result = bench::run_isolated(bin, &cfg);
    if bench::check_cuda().is_ok() {
        assert!(result.is_ok(), "{result:?}");
        return;
    }
    match result {
        Err(BenchError::Child { code, stderr, .. }) => {
            assert_eq!(code, Some(2), "{stderr}");
            assert!(stderr.contains("CUDA is not available"), "{stderr}");
        }
        other => panic!("expected a failed child, got {other:?}"),
    }
    let out = std::process::Command::new(bin)
        .arg("inventory")
        .output()
        .unwrap();
    if !has_nvml() {
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("no NVIDIA GPU found"));
    }
}

#[test]
fn the_challenge_subcommand_fails_with_one_line_without_cuda() {
    // With CUDA it runs the whole proof of GPU; here, on a GPU machine, it must pass.
    let bin = Path::new(env!("CARGO_BIN_EXE_gridlease-gpu-bench"));
    let out = std::process::Command::new(bin)
        .arg("challenge")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if gridlease_sandbox::proof::cuda::check_libraries().is_ok() {
        assert!(out.status.success(), "{stderr}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["passed"], true, "{report}");
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(out.stdout.is_empty());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("error: CUDA unavailable: "), "{stderr}");
}
