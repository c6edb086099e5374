//! `gridlease wallet`: the settlement wallet's address, the chain this node settles on, and the
//! last on-chain voucher of each lease (issue 50).

use clap::Args;

use crate::api::client::ApiClient;
use crate::lease::wallet::WalletView;
use crate::output::{Printer, short};
use crate::store::redemptions::RedemptionState;

/// Arguments of `gridlease wallet`.
#[derive(Debug, Args)]
pub struct WalletArgs {}

/// Arguments of `gridlease settle`.
#[derive(Debug, Args)]
pub struct SettleArgs {
    /// Show only this lease's voucher (an id or its first digits); every pending voucher is
    /// redeemed either way.
    #[arg(value_name = "LEASE")]
    pub lease: Option<String>,
}

/// Prints the wallet.
pub async fn run(api: &ApiClient, out: &Printer, _args: &WalletArgs) -> anyhow::Result<u8> {
    let w = api.wallet().await?;
    out.emit(&w, |p| print(p, &w));
    Ok(0)
}

/// `gridlease settle [LEASE]`: a settlement pass now (queue, redeem, watch), then the wallet.
/// Fails (exit 1) when the named lease's voucher is not redeemed, saying why.
pub async fn settle(api: &ApiClient, out: &Printer, args: &SettleArgs) -> anyhow::Result<u8> {
    let body = crate::api::types::SettleBody {
        lease: args.lease.clone(),
    };
    let w: WalletView = api.post("/v1/settle", &body).await?;
    out.emit(&w, |p| print(p, &w));
    let Some(prefix) = &args.lease else {
        return Ok(0);
    };
    let unredeemed = match w.vouchers.first() {
        None => Some(format!(
            "lease {prefix} has no on-chain voucher: it settles in GLU only, nothing was paid, or it has not started"
        )),
        Some(v) if v.role == crate::store::Role::Renter => None,
        Some(v) => match &v.redemption {
            Some(r) if r.state == RedemptionState::Redeemed => None,
            Some(r) => Some(format!(
                "lease {} is not redeemed ({}): {}",
                short(&v.lease_id),
                format!("{:?}", r.state).to_lowercase(),
                r.error.as_deref().unwrap_or("no reason recorded")
            )),
            None => Some(format!(
                "lease {} is {}: its voucher is redeemed once it settles",
                short(&v.lease_id),
                v.state
            )),
        },
    };
    match unredeemed {
        Some(why) => anyhow::bail!("{why}"),
        None => Ok(0),
    }
}

fn print(p: &Printer, w: &WalletView) {
    {
        p.line(&format!("wallet {}", w.address));
        match &w.chain {
            Some(c) => p.line(&format!(
                "settles on chain {} in token {} ({} decimals) through {}",
                c.chain_id, c.token, c.token_decimals, c.channel_contract
            )),
            None => p.line(
                "settles in GLU only: no chain configured (chain_id, token, channel_contract; docs/billing.md)",
            ),
        }
        match (&w.settlement, &w.chain) {
            (Some(st), _) => {
                let reached = if st.connected {
                    "reached"
                } else {
                    "not reached"
                };
                p.line(&format!(
                    "redeems through {} ({reached}): {} pending, {} redeemed, {} refused for good",
                    st.endpoint, st.pending, st.redeemed, st.failed
                ));
                if let Some(e) = &st.last_error {
                    p.line(&format!("last error: {e}"));
                }
            }
            (None, Some(_)) => p.line(
                "does not redeem by itself (no chain_rpc): the vouchers below are what a redeem takes",
            ),
            (None, None) => {}
        }
        if let Some(o) = &w.onchain {
            p.line(&format!(
                "balances: {} token units, {} wei for gas",
                o.token.as_deref().unwrap_or("?"),
                o.gas.as_deref().unwrap_or("?")
            ));
            for c in &o.channels {
                let closing = if c.closes_at == 0 {
                    String::new()
                } else {
                    format!(", closing at chain time {}", c.closes_at)
                };
                p.line(&format!(
                    "channel {} -> {} (epoch {}): deposit {}, redeemed {}{closing}",
                    c.renter_wallet, c.provider_wallet, c.epoch, c.deposit, c.redeemed
                ));
            }
            if let Some(e) = &o.error {
                p.line(&format!("the chain could not be read: {e}"));
            }
        }
        if w.vouchers.is_empty() {
            p.line("no on-chain vouchers yet");
            return;
        }
        let rows: Vec<Vec<String>> = w
            .vouchers
            .iter()
            .map(|v| {
                vec![
                    short(&v.lease_id),
                    v.role.as_str().to_string(),
                    v.state.clone(),
                    v.voucher.amount.clone(),
                    v.voucher.claim.clone(),
                    match &v.redemption {
                        None => "-".to_string(),
                        Some(r) if r.reconciled => format!(
                            "redeemed {}",
                            r.tx.as_deref().map_or("(before)".to_string(), short)
                        ),
                        Some(r) if r.state == RedemptionState::Redeemed => format!(
                            "MISMATCH: the chain paid {}",
                            r.paid.as_deref().unwrap_or("?")
                        ),
                        Some(r) => format!("{:?}", r.state).to_lowercase(),
                    },
                    match v.role {
                        crate::store::Role::Provider => v.lane.renter_wallet.clone(),
                        crate::store::Role::Renter => v.lane.provider_wallet.clone(),
                    },
                ]
            })
            .collect();
        p.table(
            &[
                "lease",
                "role",
                "state",
                "signed (token units)",
                "claim",
                "redeem",
                "counterparty wallet",
            ],
            rows,
            &[6, 2],
            false,
        );
        p.line("`--json wallet` gives each voucher's lane, epoch and signature: what redeem(renter, lane, amount, claim, signature) takes");
    }
}
