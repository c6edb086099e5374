//! `gridlease __watchdog` (hidden, not for users): the per-container deadline watchdog a
//! provider node spawns right after it starts a tenant container, so the container stops at
//! its deadline even if the node is killed. See [`crate::lease::watchdog`].

pub use crate::lease::watchdog::WatchdogArgs;

/// Runs the watchdog until its container no longer runs.
pub async fn run(args: &WatchdogArgs) -> anyhow::Result<u8> {
    crate::lease::watchdog::run(args).await?;
    Ok(0)
}
