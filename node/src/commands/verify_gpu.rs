//! `gridlease verify-gpu LEASE`: the renter's GPU check again, on a running lease (proof of
//! GPU, `docs/gpu.md`). Billed as usage; the lease runs on whatever it finds.

use clap::Args;

use crate::api::client::ApiClient;
use crate::output::Printer;

/// Arguments of `gridlease verify-gpu`.
#[derive(Debug, Args)]
pub struct VerifyGpuArgs {
    /// Lease id (or its first digits).
    #[arg(value_name = "LEASE")]
    pub lease: String,
}

/// Exit status when the check failed.
pub const EXIT_CHECK_FAILED: u8 = super::rent::EXIT_GPU_CHECK_FAILED;

/// Runs the check and says what it found; exit 0 when it passed, 7 when it failed.
pub async fn run(api: &ApiClient, out: &Printer, args: &VerifyGpuArgs) -> anyhow::Result<u8> {
    let v = api.verify_gpu(&args.lease).await?;
    let passed = v.state == "passed";
    out.emit(&v, |p| {
        let timing = match (v.took_ms, v.limit_ms) {
            (Some(t), Some(l)) => format!(
                " ({:.2} s, limit {:.2} s)",
                t as f64 / 1000.0,
                l as f64 / 1000.0
            ),
            _ => String::new(),
        };
        if passed {
            p.line(&format!("{}{timing}", v.summary));
        } else {
            p.status(&format!(
                "error: {}{timing}; the lease runs on and was billed as usual: stop it with `gridlease stop {}`",
                v.summary, args.lease
            ));
        }
    });
    Ok(if passed { 0 } else { EXIT_CHECK_FAILED })
}
