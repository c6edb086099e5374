//! Provider: the egress bridge and its host firewall rules ([`gridlease_sandbox::firewall`])
//! over the node's run.
//!
//! - Before every `egress` container: [`ensure`] creates the bridge if missing and installs
//!   (re-installs, replacing stale ones) its rules; if that fails the lease does not start
//!   (a typed `Create` failure the renter sees), so no egress container ever runs unfenced.
//! - At start-up, after the containers are reconciled: [`reconcile`] re-installs the rules
//!   when a live lease still uses egress (containers outlive a node restart, and rules left
//!   by a crashed node are replaced, never duplicated), else takes network and rules away.
//! - At shutdown: [`teardown`] removes network and rules unless containers are still attached
//!   (leases that keep running across the restart keep their fence).

use gridlease_protocol::{NetworkPolicy, StartFailure, StartFailureKind};
use gridlease_sandbox::Sandbox;
use gridlease_sandbox::firewall::{DnsAllow, Teardown};

use super::ctx::Ctx;

/// Makes sure the egress network and its firewall rules are in place for a lease that asks
/// for `network`; nothing to do for `None`.
pub(crate) async fn ensure(
    ctx: &Ctx,
    sb: &Sandbox,
    network: NetworkPolicy,
) -> Result<(), StartFailure> {
    if network != NetworkPolicy::Egress {
        return Ok(());
    }
    let name = &ctx.config.limits.egress_network;
    match sb.ensure_egress(name, DnsAllow::Host).await {
        Ok(net) => {
            tracing::debug!(network = %net.name, bridge = %net.bridge, "egress network ready");
            Ok(())
        }
        Err(e) => {
            tracing::error!(network = %name, error = %e, "egress firewall not installed: not starting the container");
            Err(StartFailure::new(
                StartFailureKind::Create,
                format!(
                    "the lease asks for network egress, but the provider could not install the firewall rules that keep egress containers off its LAN and host ({e}); no container was started"
                ),
            ))
        }
    }
}

/// At start-up: re-installs the rules if `egress_in_use` (a live lease has egress), else
/// removes what a previous run left (network and rules, unless containers are attached).
pub(crate) async fn reconcile(ctx: &Ctx, sb: &Sandbox, egress_in_use: bool) {
    let name = &ctx.config.limits.egress_network;
    if egress_in_use {
        match sb.ensure_egress(name, DnsAllow::Host).await {
            Ok(_) => tracing::info!(network = %name, "egress firewall rules reconciled"),
            Err(e) => {
                tracing::error!(network = %name, error = %e, "cannot reinstall the egress firewall rules for running leases")
            }
        }
    } else {
        teardown(ctx, sb).await;
    }
}

/// Removes the egress network and its rules, unless containers are still attached.
pub(crate) async fn teardown(ctx: &Ctx, sb: &Sandbox) {
    let name = &ctx.config.limits.egress_network;
    match sb.teardown_egress(name).await {
        Ok(Teardown::Removed { rules: true }) => {
            tracing::info!(network = %name, "egress network and firewall rules removed")
        }
        Ok(Teardown::Removed { rules: false }) => {}
        Ok(Teardown::InUse { containers }) => tracing::info!(
            network = %name,
            containers,
            "egress network still in use: keeping it and its firewall rules"
        ),
        Err(e) => {
            tracing::warn!(network = %name, error = %e, "cannot remove the egress firewall rules")
        }
    }
}
