//! `gridlease ledger`: earnings and spend, per lease and in total.

use clap::Args;

use super::rent::money;
use crate::api::client::ApiClient;
use crate::output::{Printer, short};

/// Arguments of `gridlease ledger`.
#[derive(Debug, Args)]
pub struct LedgerArgs {}

/// Prints the ledger.
pub async fn run(api: &ApiClient, out: &Printer, _args: &LedgerArgs) -> anyhow::Result<u8> {
    let l: serde_json::Value = api.get("/v1/ledger").await?;
    out.emit(&l, |p| {
        let rows: Vec<Vec<String>> = l["leases"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|s| {
                        vec![
                            short(s["lease_id"].as_str().unwrap_or("?")),
                            s["role"].as_str().unwrap_or("?").to_string(),
                            short(s["counterparty"].as_str().unwrap_or("?")),
                            money(&s["total"]),
                            s["entries"].to_string(),
                        ]
                    })
                    .collect()
            })
            .unwrap_or_default();
        if rows.is_empty() {
            p.line("no ledger entries yet");
        } else {
            p.table(
                &["lease", "role", "counterparty", "amount", "entries"],
                rows,
            );
        }
        p.line(&format!(
            "earned {}   spent {}   {}",
            money(&l["total_earned"]),
            money(&l["total_spent"]),
            if l["balanced"].as_bool() == Some(true) {
                "(balanced)"
            } else {
                "(NOT balanced)"
            }
        ));
    });
    Ok(0)
}
