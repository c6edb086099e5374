//! Issue 50, the settlement service end to end: two real nodes configured with a real EVM's
//! JSON-RPC endpoint (`settlement/rpc_harness.py`: py-evm, the channel contract from its
//! committed build) run a real lease in Docker. Before it, the renter's node opens its channel
//! to the provider's wallet by itself: exactly the lease's cap.
//!
//! The provider's node redeems only once an hour here, so it has not redeemed when the lease
//! settles; it is killed with SIGKILL. While it is down the renter starts closing its channel
//! and half the challenge period passes. The provider comes back and, in its first pass,
//! redeems the lease's voucher from its store within the challenge period: the chain pays its
//! wallet exactly the settled amount, equal to both nodes' ledgers to the micro-unit (10^12
//! token units each, an 18-decimals token), and `gridlease wallet` shows the transaction,
//! reconciled. After the challenge period the renter takes back the rest of its deposit. The
//! channel's epoch is now 1: a second lease's terms name it, the renter's node deposits again,
//! and `gridlease settle LEASE` on the provider redeems that lease at once.
//!
//! Needs Docker and `target/settlement-venv` (both made by `.ci/run`): with
//! `GRIDLEASE_REQUIRE_DOCKER=1` it fails when either is missing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod chain_support;
mod cli_support;

use std::sync::Arc;
use std::time::Duration;

use chain_support::{Harness, python_or_skip};
use cli_support::{
    json, lease_of, market_configured, probe_image_or_skip, rent_sleep, start_node, wait_for,
    wait_settled,
};
use gridlease_node::chain::ChainClient;
use gridlease_protocol::wallet::{Address, ChainTerms, WalletKey};

const CHALLENGE_S: u64 = 600;
/// 10^(18 - 6): token units per micro-unit.
const SCALE: u128 = 1_000_000_000_000;

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Runtime::new().unwrap().block_on(f)
}

#[test]
fn the_provider_redeems_from_its_store_after_kill_9_within_a_close_and_the_chain_equals_both_ledgers()
 {
    let Some(image) = probe_image_or_skip("settlement_redeem") else {
        return;
    };
    let Some(py) = python_or_skip("settlement_redeem") else {
        return;
    };
    let h = Harness::start(&py, CHALLENGE_S);
    let config = |interval: u64| {
        format!(
            "chain_id = {}\ntoken = \"{}\"\nchannel_contract = \"{}\"\ntoken_decimals = 18\nchain_rpc = \"{}\"\nredeem_interval_secs = {interval}",
            h.chain_id, h.token, h.channel_contract, h.url
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let mut m = market_configured(dir.path(), &[], None, [&config(3600), &config(1)]);
    let terms = ChainTerms {
        chain_id: h.chain_id,
        token: h.token.parse::<Address>().unwrap().0,
        token_decimals: 18,
        channel_contract: h.channel_contract.parse::<Address>().unwrap().0,
    };
    let renter_key = Arc::new(WalletKey::load_file(&rh.join("wallet.key")).unwrap());
    let provider_wallet: Address = json(&ph, &["status"])["wallet"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    for who in [renter_key.address(), provider_wallet] {
        h.fund(&who.to_string());
    }
    let minted = 10 * SCALE * 1_000_000; // 10 GLU's worth
    h.mint(&renter_key.address().to_string(), minted);
    // The test's own view of the chain, with the renter's key (its close and withdrawal).
    let renter_chain = block_on(ChainClient::connect(
        &h.url,
        renter_key.clone(),
        terms,
        Duration::from_secs(60),
    ))
    .unwrap();

    // A real lease; the renter's node opened the channel for it, by its cap; both settle.
    let id = rent(&rh, &m.offer, &image);
    let cap = u128::from(lease_of(&rh, &id)["max_total"].as_u64().unwrap()) * SCALE;
    let channel = block_on(renter_chain.channel(renter_key.address(), provider_wallet)).unwrap();
    assert_eq!((channel.deposit, channel.epoch), (cap, 0));
    let settled = wait_settled(&rh, &ph, &id);
    // Nothing redeemed yet (the provider's next pass is an hour away).
    assert_eq!(
        block_on(renter_chain.token_balance(provider_wallet)).unwrap(),
        0
    );

    // The provider is killed before it redeems; meanwhile the renter starts its close and
    // half the challenge period passes.
    let _ = m.provider.0.kill();
    let _ = m.provider.0.wait();
    block_on(renter_chain.start_close(provider_wallet)).unwrap();
    h.travel(CHALLENGE_S / 2);

    // It comes back and redeems from its store, in time.
    // Its next pass is an hour away again: the redeem below is its first pass at start.
    m.provider = start_node(&ph, &["--dev-gpus", "RTX 4090:24GiB:3.60"]);
    let mut wallet = serde_json::Value::Null;
    wait_for(Duration::from_secs(60), "the provider to redeem", || {
        wallet = json(&ph, &["wallet"]);
        wallet["vouchers"][0]["redemption"]["state"] == "redeemed"
    });
    let v = &wallet["vouchers"][0];
    assert_eq!(v["lease_id"], id.as_str(), "{wallet}");
    assert_eq!(v["redemption"]["reconciled"], true, "{wallet}");
    let tx = v["redemption"]["tx"].as_str().unwrap();
    assert!(tx.starts_with("0x") && tx.len() == 66, "{wallet}");
    assert_eq!(wallet["settlement"]["redeemed"], 1, "{wallet}");
    assert_eq!(wallet["settlement"]["connected"], true, "{wallet}");
    let expected = u128::from(settled) * SCALE;
    assert_eq!(
        v["redemption"]["paid"].as_str().unwrap(),
        expected.to_string()
    );

    // The provider's statement carries the redemption; `verify` shows it beside the claim.
    let file = dir.path().join("provider.statement");
    json(
        &ph,
        &["statement", &id[..12], "--out", file.to_str().unwrap()],
    );
    let nowhere = tempfile::tempdir().unwrap();
    let out = cli_support::bin()
        .arg("--home")
        .arg(nowhere.path())
        .args(["--json", "verify"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", cli_support::text(&out.stderr));
    let verdict: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = &verdict["settlement"]["redemption"];
    assert_eq!(r["tx"], tx, "{verdict}");
    assert_eq!(r["paid"], expected.to_string(), "{verdict}");
    assert_eq!(r["equals_claim"], true, "{verdict}");

    // `gridlease wallet` reads the balances and the channel from the chain.
    let onchain = &wallet["onchain"];
    assert_eq!(onchain["token"], expected.to_string(), "{wallet}");
    assert!(
        onchain["gas"].as_str().unwrap().parse::<u128>().unwrap() > 0,
        "{wallet}"
    );
    assert_eq!(
        onchain["channels"][0]["redeemed"],
        expected.to_string(),
        "{wallet}"
    );
    assert_eq!(
        onchain["channels"][0]["deposit"],
        cap.to_string(),
        "{wallet}"
    );
    assert!(
        onchain["channels"][0]["closes_at"].as_u64().unwrap() > 0,
        "{wallet}"
    );

    // The renter's node reads the lane back too: the chain paid what its ledger owes.
    let rw = json(&rh, &["wallet"]);
    let rv = &rw["vouchers"][0];
    assert_eq!(rv["role"], "renter", "{rw}");
    assert_eq!(rv["redemption"]["paid"], expected.to_string(), "{rw}");
    assert_eq!(rv["redemption"]["reconciled"], true, "{rw}");

    // The chain paid the provider exactly what both ledgers say, to the micro-unit.
    let paid = block_on(renter_chain.token_balance(provider_wallet)).unwrap();
    assert_eq!(paid, expected);
    let spent = json(&rh, &["ledger"]);
    let earned = json(&ph, &["ledger"]);
    assert_eq!(spent["balanced"], true);
    assert_eq!(earned["balanced"], true);
    assert_eq!(
        u128::from(spent["total_spent"].as_u64().unwrap()) * SCALE,
        paid
    );
    assert_eq!(
        u128::from(earned["total_earned"].as_u64().unwrap()) * SCALE,
        paid
    );

    // After the challenge period the renter takes back the rest.
    h.travel(CHALLENGE_S);
    block_on(renter_chain.withdraw(provider_wallet)).unwrap();
    assert_eq!(
        block_on(renter_chain.token_balance(renter_key.address())).unwrap(),
        minted - paid
    );

    // The channel's epoch is 1: the next lease's terms name it, the renter's node deposits
    // into the new epoch, and the provider redeems it too when asked.
    let second = rent(&rh, &m.offer, &image);
    let channel = block_on(renter_chain.channel(renter_key.address(), provider_wallet)).unwrap();
    assert_eq!(channel.epoch, 1);
    assert_eq!(
        channel.deposit,
        u128::from(lease_of(&rh, &second)["max_total"].as_u64().unwrap()) * SCALE
    );
    let settled2 = wait_settled(&rh, &ph, &second);
    // `gridlease settle LEASE` redeems now (the next pass is an hour away).
    let w = json(&ph, &["settle", &second[..12]]);
    let v = &w["vouchers"][0];
    assert_eq!(v["lease_id"], second.as_str(), "{w}");
    assert_eq!(v["epoch"], 1, "{w}");
    assert_eq!(v["redemption"]["reconciled"], true, "{w}");
    assert_eq!(
        block_on(renter_chain.token_balance(provider_wallet)).unwrap(),
        paid + u128::from(settled2) * SCALE
    );
    drop(m);
}

/// Rents the market's offer for a short job; its lease id.
fn rent(rh: &std::path::Path, offer: &str, image: &str) -> String {
    rent_sleep(rh, offer, image, "8")["lease_id"]
        .as_str()
        .unwrap()
        .to_string()
}
