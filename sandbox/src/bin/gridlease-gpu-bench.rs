//! `gridlease-gpu-bench`: GPU inventory and benchmark as JSON, run as a child process by the
//! node so that a driver fault cannot crash the daemon.
//!
//! Usage: `gridlease-gpu-bench inventory` | `gridlease-gpu-bench bench [--device D] [--n N]
//! [--repeats R]` | `gridlease-gpu-bench challenge [--gpus UUID[,UUID...]]`. Prints JSON on
//! stdout; on error prints the message on stderr and exits 2 (no GPU / no CUDA) or 1 (other
//! failures). `challenge` runs the proof-of-GPU prover (`proof::Cuda`) on the GPUs (all of
//! them by default) for a challenge sized as a renter would size it, checks the result with
//! the contracts' rules on the CPU and prints the verdict and the rate reached; it exits 1
//! when the check fails.

// A thin binary whose product is its output.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

use gridlease_sandbox::bench::{self, BenchConfig, BenchError};
use gridlease_sandbox::gpu::{GpuError, GpuProbe, NvmlProbe};
use gridlease_sandbox::proof::selfcheck::{self, SelfCheck};
use gridlease_sandbox::proof::{Cuda, Prover, ProverError, cuda};

fn usage() -> ExitCode {
    eprintln!(
        "usage: gridlease-gpu-bench inventory | bench [--device D] [--n N] [--repeats R] | challenge [--gpus UUID[,UUID...]]"
    );
    ExitCode::from(64)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("inventory") => inventory(),
        Some("challenge") => match args.get(1..).unwrap_or_default() {
            [] => challenge(&[]),
            [flag, list] if flag == "--gpus" => {
                let gpus: Vec<String> = list
                    .split(',')
                    .filter(|u| !u.is_empty())
                    .map(str::to_string)
                    .collect();
                challenge(&gpus)
            }
            _ => usage(),
        },
        Some("bench") | None => {
            let mut cfg = BenchConfig::default();
            let mut it = args.iter().skip(1);
            while let Some(flag) = it.next() {
                let Some(v) = it.next().and_then(|v| v.parse::<usize>().ok()) else {
                    return usage();
                };
                match flag.as_str() {
                    "--device" => cfg.device = v,
                    "--n" => cfg.n = v,
                    "--repeats" => cfg.repeats = v,
                    _ => return usage(),
                }
            }
            run_bench(&cfg)
        }
        _ => usage(),
    }
}

fn inventory() -> ExitCode {
    let result = NvmlProbe::new().and_then(|p| p.list());
    match result {
        Ok(gpus) => match serde_json::to_string_pretty(&gpus) {
            Ok(s) => {
                println!("{s}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        },
        Err(e @ GpuError::NoGpu { .. }) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn run_bench(cfg: &BenchConfig) -> ExitCode {
    match bench::run_in_process(cfg) {
        Ok(r) => match serde_json::to_string_pretty(&r) {
            Ok(s) => {
                println!("{s}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        },
        Err(e @ BenchError::NoCuda { .. }) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

/// The GPUs named (all of them when none is), the renter's parameters for them, the prover's
/// computation and the contracts' check.
fn run_challenge(gpus: &[String]) -> Result<SelfCheck, ProverError> {
    let all = cuda::list_devices()?;
    let chosen = if gpus.is_empty() {
        all
    } else {
        cuda::select(&all, gpus)?
    };
    if chosen.is_empty() {
        return Err(ProverError::CudaUnavailable {
            detail: "the CUDA driver lists no device".into(),
        });
    }
    let uuids: Vec<String> = chosen.iter().map(|d| d.uuid.clone()).collect();
    let models: Vec<String> = chosen.iter().map(|d| d.name.clone()).collect();
    let vram: u64 = chosen.iter().map(|d| d.total_mem).sum();
    let prover = Cuda::new();
    // The prover's own rate: what a renter uses for a model the table lacks. Measuring also
    // opens the GPUs and loads the kernels, so the timed challenge starts warm.
    let measured = prover.measure(&uuids)?;
    let p = selfcheck::params_for(prover.backend(), &models, measured, vram);
    selfcheck::self_check(&prover, &uuids, &models, p, selfcheck::fresh_seed())
}

fn challenge(gpus: &[String]) -> ExitCode {
    match run_challenge(gpus) {
        Ok(r) => match serde_json::to_string_pretty(&r) {
            Ok(s) => {
                println!("{s}");
                if r.passed {
                    ExitCode::SUCCESS
                } else {
                    eprintln!("error: {}", r.verdict);
                    ExitCode::from(1)
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        },
        Err(e @ (ProverError::CudaUnavailable { .. } | ProverError::NoDevices)) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
