//! `gridlease ledger`: earnings and spend, per lease and in total.

use clap::Args;

use crate::api::client::ApiClient;
use crate::output::{Printer, money, short};

/// Arguments of `gridlease ledger`.
#[derive(Debug, Args)]
pub struct LedgerArgs {}

/// Prints the ledger.
pub async fn run(api: &ApiClient, out: &Printer, _args: &LedgerArgs) -> anyhow::Result<u8> {
    let l = api.ledger().await?;
    out.emit(&l, |p| {
        let rows: Vec<Vec<String>> = l
            .leases
            .iter()
            .map(|s| {
                vec![
                    short(&s.lease_id.to_string()),
                    s.role.as_str().to_string(),
                    short(&s.counterparty),
                    money(s.total),
                    s.entries.to_string(),
                ]
            })
            .collect();
        if rows.is_empty() {
            p.line("no ledger entries yet");
        } else {
            p.table(
                &["lease", "role", "counterparty", "amount", "entries"],
                rows,
                &[4, 2, 1],
                false,
            );
        }
        p.line(&format!(
            "earned {}   spent {}   {}",
            money(l.total_earned),
            money(l.total_spent),
            if l.balanced {
                "(balanced)"
            } else {
                "(NOT balanced)"
            }
        ));
    });
    Ok(0)
}
