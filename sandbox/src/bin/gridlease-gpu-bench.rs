//! `gridlease-gpu-bench`: GPU inventory and benchmark as JSON, run as a child process by the
//! node so that a driver fault cannot crash the daemon.
//!
//! Usage: `gridlease-gpu-bench inventory` | `gridlease-gpu-bench bench [--device D] [--n N]
//! [--repeats R]`. Prints JSON on stdout; on error prints the message on stderr and exits 2
//! (no GPU / no CUDA) or 1 (other failures).

// A thin binary whose product is its output.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

use gridlease_sandbox::bench::{self, BenchConfig, BenchError};
use gridlease_sandbox::gpu::{GpuError, GpuProbe, NvmlProbe};

fn usage() -> ExitCode {
    eprintln!("usage: gridlease-gpu-bench inventory | bench [--device D] [--n N] [--repeats R]");
    ExitCode::from(64)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("inventory") => inventory(),
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
