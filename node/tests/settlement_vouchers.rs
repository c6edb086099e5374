//! Issue 50, vouchers beside receipts: two real nodes configured with the same chain, token
//! and channel contract run a real lease (Docker); every receipt carries the renter wallet's
//! EIP-712 voucher, which the provider checks; the statement carries the last one, which
//! `gridlease verify` checks and shows; and the channel contract, compiled by the pinned Vyper
//! and run on a real EVM (py-evm through eth-tester, `settlement/tests/redeem_voucher.py`),
//! pays the provider exactly that voucher: the settled amount to the micro-unit, in an
//! 18-decimals token. `gridlease wallet` shows the chain and that voucher on both sides. A
//! renter on no chain leases from the same provider in GLU only, and `rent`, the statement and
//! its wallet say so.
//!
//! Needs Docker and `target/settlement-venv` (both made by `.ci/run`): with
//! `GRIDLEASE_REQUIRE_DOCKER=1` it fails when either is missing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod chain_support;
mod cli_support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use chain_support::{python_or_skip, workspace};
use cli_support::{
    bin, json, market_configured, probe_image_or_skip, rent_sleep, start_node, text, wait_for,
    wait_settled,
};
use serde_json::Value;

fn redeem_voucher(py: &Path, args: &[&str]) -> Value {
    let out = Command::new(py)
        .arg(workspace().join("settlement/tests/redeem_voucher.py"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `gridlease --json verify FILE` with a home where no node runs.
fn verify(file: &Path) -> Value {
    let nowhere = tempfile::tempdir().unwrap();
    let out = bin()
        .arg("--home")
        .arg(nowhere.path())
        .args(["--json", "verify"])
        .arg(file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn wallet_key(home: &Path) -> String {
    hex::encode(std::fs::read(home.join("wallet.key")).unwrap())
}

/// Rents the market's offer for a short job and waits until both sides settled; the lease id,
/// the settled total (micro-units) and what `rent` noted.
fn lease(renter: &Path, provider: &Path, offer: &str, image: &str) -> (String, u64, String) {
    let rented = rent_sleep(renter, offer, image, "12");
    let id = rented["lease_id"].as_str().unwrap().to_string();
    let settled = wait_settled(renter, provider, &id);
    let note = rented["note"].as_str().unwrap_or_default().to_string();
    (id, settled, note)
}

#[test]
fn vouchers_from_a_real_lease_are_checked_and_the_contract_pays_the_settled_amount() {
    let Some(image) = probe_image_or_skip("settlement_vouchers") else {
        return;
    };
    let Some(py) = python_or_skip("settlement_vouchers") else {
        return;
    };
    let chain = redeem_voucher(&py, &["addresses"]);
    let config = format!(
        "chain_id = {}\ntoken = \"{}\"\nchannel_contract = \"{}\"\ntoken_decimals = 18",
        chain["chain_id"],
        chain["token"].as_str().unwrap(),
        chain["channel_contract"].as_str().unwrap()
    );
    let dir = tempfile::tempdir().unwrap();
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let m = market_configured(dir.path(), &[], None, [&config, &config]);
    let (id, settled, note) = lease(&rh, &ph, &m.offer, &image);
    assert!(
        note.contains(&format!("settles on chain {}", chain["chain_id"])),
        "rent says how the lease is paid: {note:?}"
    );

    // Both statements carry the last receipt's voucher, checked by `verify`.
    let scale = 10u128.pow(12);
    let mut vouchers = Vec::new();
    for (who, home) in [("provider", &ph), ("renter", &rh)] {
        let f = dir.path().join(format!("{who}.statement"));
        json(
            home,
            &["statement", &id[..12], "--out", f.to_str().unwrap()],
        );
        let v = verify(&f);
        let s = &v["settlement"];
        assert_eq!(s["chain"]["chain_id"], chain["chain_id"], "{who}: {v}");
        assert_eq!(
            s["chain"]["channel_contract"], chain["channel_contract"],
            "{who}: {v}"
        );
        assert_eq!(s["lane"], format!("0x{id}"), "{who}: {v}");
        assert_eq!(s["epoch"], 0, "{who}: {v}");
        let amount: u128 = s["voucher"]["amount"].as_str().unwrap().parse().unwrap();
        assert_eq!(amount, u128::from(settled) * scale, "{who}: {v}");
        // In arrears (no prepay) the provider claims the whole voucher.
        assert_eq!(s["voucher"]["claim"], s["voucher"]["amount"], "{who}: {v}");
        vouchers.push(s.clone());
        let shown = text(
            &bin()
                .arg("--home")
                .arg(dir.path().join("nowhere"))
                .arg("verify")
                .arg(&f)
                .output()
                .unwrap()
                .stdout,
        );
        assert!(
            shown.contains("settles on chain") && shown.contains("signature checked"),
            "{shown}"
        );
    }
    assert_eq!(vouchers[0], vouchers[1], "both sides hold the same voucher");
    // Without chain_rpc the node does not redeem: `settle` says so (exit 1).
    let out = cli_support::cli(&ph, &["settle"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no chain_rpc"),
        "{}",
        text(&out.stderr)
    );
    // `gridlease wallet` shows the chain and the same voucher on both sides: the provider's
    // to redeem, the renter's as signed.
    for (home, role) in [(&ph, "provider"), (&rh, "renter")] {
        let w = json(home, &["wallet"]);
        assert_eq!(w["address"], json(home, &["status"])["wallet"], "{w}");
        assert_eq!(w["chain"]["chain_id"], chain["chain_id"], "{w}");
        assert_eq!(w["chain"]["token_decimals"], 18, "{w}");
        let v = &w["vouchers"][0];
        assert_eq!(w["vouchers"].as_array().map(Vec::len), Some(1), "{w}");
        assert_eq!(v["role"], role, "{w}");
        assert_eq!(v["state"], "settled", "{w}");
        for k in ["amount", "claim", "signature"] {
            assert_eq!(v[k], vouchers[0]["voucher"][k], "{k}: {w}");
        }
        for k in ["chain", "lane", "epoch", "renter_wallet", "provider_wallet"] {
            assert_eq!(v[k], vouchers[0][k], "{k}: {w}");
        }
        let shown = text(&cli_support::cli(home, &["wallet"]).stdout);
        assert!(
            shown.contains("settles on chain") && shown.contains(v["amount"].as_str().unwrap()),
            "{shown}"
        );
    }

    // The contract pays the provider's wallet exactly the voucher, from the renter's deposit.
    let s = &vouchers[0];
    let amount = s["voucher"]["amount"].as_str().unwrap();
    let deposit = (u128::from(settled) * scale + 5 * scale).to_string();
    let paid = redeem_voucher(
        &py,
        &[
            "redeem",
            "--renter-key",
            &wallet_key(&rh),
            "--provider-key",
            &wallet_key(&ph),
            "--deposit",
            &deposit,
            "--lane",
            s["lane"].as_str().unwrap(),
            "--amount",
            amount,
            "--claim",
            s["voucher"]["claim"].as_str().unwrap(),
            "--signature",
            s["voucher"]["signature"].as_str().unwrap(),
        ],
    );
    let amount: u128 = amount.parse().unwrap();
    assert_eq!(paid["paid"].to_string(), amount.to_string(), "{paid}");
    assert_eq!(paid["provider"].to_string(), amount.to_string(), "{paid}");
    assert_eq!(paid["unpaid"], 0, "{paid}");
    assert_eq!(paid["renter"], 0, "{paid}");
    assert_eq!(
        paid["channel"].to_string(),
        (5 * scale).to_string(),
        "the rest stays in the channel: {paid}"
    );
    // The wallets the contract paid and took from are the ones the nodes show.
    let provider_wallet = json(&ph, &["status"])["wallet"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(s["provider_wallet"], provider_wallet.as_str());
    let renter_wallet = json(&rh, &["status"])["wallet"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(s["renter_wallet"], renter_wallet.as_str());

    // A renter on no chain: the same provider leases to it in GLU only, and says so.
    let gh = dir.path().join("glu-renter");
    cli_support::init(&gh);
    let addr = json(&ph, &["status"])["listen_addrs"][0]
        .as_str()
        .unwrap()
        .to_string();
    let _glu = start_node(&gh, &["--bootstrap", &addr]);
    // The provider's current offer (re-signed since: the lease took its GPU and gave it back).
    let mut current = String::new();
    wait_for(
        Duration::from_secs(30),
        "the offer to reach the GLU renter",
        || {
            let own = json(&ph, &["status"])["own_offer"]["id"].clone();
            let rows = json(&gh, &["search"]);
            let fits = rows[0]["id"] == own && rows[0]["free_gpus"] == 1;
            if fits {
                current = own.as_str().unwrap().to_string();
            }
            fits
        },
    );
    let (gid, _, note) = lease(&gh, &ph, &current[..12], &image);
    assert!(
        note.contains("settles in GLU only: this node settles in GLU only (no chain configured"),
        "{note:?}"
    );
    let f = dir.path().join("glu.statement");
    json(
        &ph,
        &["statement", &gid[..12], "--out", f.to_str().unwrap()],
    );
    let v = verify(&f);
    assert_eq!(v["settlement"], Value::Null, "{v}");
    let w = json(&gh, &["wallet"]);
    assert_eq!(w["chain"], Value::Null, "{w}");
    assert_eq!(w["vouchers"], serde_json::json!([]), "{w}");
    let shown = text(&cli_support::cli(&gh, &["wallet"]).stdout);
    assert!(shown.contains("settles in GLU only"), "{shown}");
}
