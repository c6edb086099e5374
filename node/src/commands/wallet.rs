//! `gridlease wallet`: the settlement wallet's address, the chain this node settles on, and the
//! last on-chain voucher of each lease (issue 50).

use clap::Args;

use crate::api::client::ApiClient;
use crate::output::{Printer, short};

/// Arguments of `gridlease wallet`.
#[derive(Debug, Args)]
pub struct WalletArgs {}

/// Prints the wallet.
pub async fn run(api: &ApiClient, out: &Printer, _args: &WalletArgs) -> anyhow::Result<u8> {
    let w = api.wallet().await?;
    out.emit(&w, |p| {
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
                "counterparty wallet",
            ],
            rows,
            &[5, 2],
            false,
        );
        p.line("`--json wallet` gives each voucher's lane, epoch and signature: what redeem(renter, lane, amount, claim, signature) takes");
    });
    Ok(0)
}
