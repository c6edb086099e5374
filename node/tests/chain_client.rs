//! Issue 50, the node's chain client (`gridlease_node::chain`) against a real EVM served as
//! standard JSON-RPC (`settlement/rpc_harness.py`: py-evm through eth-tester, the channel
//! contract from its committed build). Two node wallets sign their own transactions: the
//! renter deposits (approving the token first), the provider redeems a batch of vouchers the
//! renter's key signed (claiming less than a prepaid one), the refusals come back as the
//! contract's reasons before any gas is spent, the provider sees the renter's close and still
//! redeems in the challenge period, and after it the renter takes the rest back. Token balances
//! are checked to the unit at each step. A wrong chain id and an endpoint that does not answer
//! are clear errors that never show the RPC address's path.
//!
//! Needs `target/settlement-venv` (made by `.ci/run`): with `GRIDLEASE_REQUIRE_DOCKER=1` it
//! fails when it is missing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod chain_support;

use std::sync::Arc;
use std::time::Duration;

use chain_support::{Harness, python_or_skip};
use gridlease_node::chain::{ChainClient, ChainError, MAX_BATCH, Redeem};
use gridlease_protocol::wallet::{Address, ChainTerms, Voucher, WalletKey};

const CHALLENGE_S: u64 = 600;

fn terms(h: &Harness) -> ChainTerms {
    ChainTerms {
        chain_id: h.chain_id,
        token: h.token.parse::<Address>().unwrap().0,
        token_decimals: 18,
        channel_contract: h.channel_contract.parse::<Address>().unwrap().0,
    }
}

/// The renter's voucher for `lane` up to `amount`, signed by its wallet key.
fn voucher(
    t: &ChainTerms,
    renter: &WalletKey,
    provider: Address,
    epoch: u64,
    lane: [u8; 32],
    amount: u128,
) -> Vec<u8> {
    Voucher {
        renter: renter.address(),
        provider,
        epoch,
        lane,
        cumulative_amount: amount,
    }
    .sign(&t.domain(), renter)
    .to_vec()
}

fn refused(e: ChainError, reason: &str) {
    match &e {
        ChainError::Refused { reason: r, .. } if r.contains(reason) => {}
        _ => panic!("expected a refusal with {reason:?}, got: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_wallet_deposits_redeems_and_closes_through_json_rpc() {
    let Some(py) = python_or_skip("chain_client") else {
        return;
    };
    let h = Harness::start(&py, CHALLENGE_S);
    let t = terms(&h);
    let renter_key = Arc::new(WalletKey::generate().unwrap());
    let provider_key = Arc::new(WalletKey::generate().unwrap());
    let (r, p) = (renter_key.address(), provider_key.address());
    for who in [r, p] {
        h.fund(&who.to_string());
    }
    let minted: u128 = 5_000_000;
    h.mint(&r.to_string(), minted);
    let confirm = Duration::from_secs(60);
    let renter = ChainClient::connect(&h.url, renter_key.clone(), t, confirm)
        .await
        .unwrap();
    let provider = ChainClient::connect(&h.url, provider_key.clone(), t, confirm)
        .await
        .unwrap();
    assert_eq!(renter.wallet(), r);

    // The renter opens its channel to the provider: approve, then deposit.
    renter.deposit(p, 1_000_000).await.unwrap();
    let ch = renter.channel(r, p).await.unwrap();
    assert_eq!(
        (ch.deposit, ch.redeemed, ch.closes_at, ch.epoch),
        (1_000_000, 0, 0, 0)
    );
    assert_eq!(renter.token_balance(r).await.unwrap(), minted - 1_000_000);

    // The provider redeems two lanes in one batch: a prepaid voucher of 400,000 of which the
    // lease used 300,000 (its claim), and one of 100,000 in full.
    let (lane_a, lane_b) = ([0xa1; 32], [0xb2; 32]);
    let va = voucher(&t, &renter_key, p, 0, lane_a, 400_000);
    let vb = voucher(&t, &renter_key, p, 0, lane_b, 100_000);
    let batch = vec![
        Redeem {
            renter: r,
            lane: lane_a,
            amount: 400_000,
            claim: 300_000,
            signature: va.clone(),
        },
        Redeem {
            renter: r,
            lane: lane_b,
            amount: 100_000,
            claim: 100_000,
            signature: vb.clone(),
        },
    ];
    let (mined, paid) = provider.redeem(&batch).await.unwrap();
    assert!(
        mined.tx.starts_with("0x") && mined.tx.len() == 66,
        "{mined:?}"
    );
    assert!(mined.gas_used > 0 && mined.block > 0, "{mined:?}");
    let got: Vec<(u8, u128, u128)> = paid.iter().map(|l| (l.lane[0], l.paid, l.unpaid)).collect();
    assert_eq!(got, vec![(0xa1, 300_000, 0), (0xb2, 100_000, 0)]);
    assert!(paid.iter().all(|l| l.renter == r && l.epoch == 0));
    assert_eq!(provider.token_balance(p).await.unwrap(), 400_000);
    assert_eq!(
        provider.lane_redeemed(r, p, 0, lane_a).await.unwrap(),
        300_000
    );

    // Refusals carry the contract's reason and are found before anything is sent: the
    // provider's gas balance does not move.
    let gas = provider.gas_balance().await.unwrap();
    refused(
        provider.redeem(&batch[1..]).await.unwrap_err(),
        "nothing new on this lane",
    );
    let mut beyond = batch[0].clone();
    beyond.claim = 400_001;
    refused(
        provider.redeem(&[beyond]).await.unwrap_err(),
        "claim beyond the voucher",
    );
    let mut forged = batch[0].clone();
    forged.signature = voucher(&t, &provider_key, p, 0, lane_a, 400_000);
    refused(
        provider.redeem(&[forged]).await.unwrap_err(),
        "not signed by the renter",
    );
    assert_eq!(provider.gas_balance().await.unwrap(), gas);
    let too_many = vec![batch[0].clone(); MAX_BATCH + 1];
    assert!(matches!(
        provider.redeem(&too_many).await.unwrap_err(),
        ChainError::Invalid(_)
    ));

    // The renter closes; the provider sees it and redeems the rest of lane A in time.
    let from = provider.block().await.unwrap();
    renter.start_close(p).await.unwrap();
    let head = provider.block().await.unwrap();
    let closes = provider.closes_between(from, head).await.unwrap();
    assert_eq!(closes.len(), 1, "{closes:?}");
    assert_eq!((closes[0].renter, closes[0].epoch), (r, 0));
    let ch = provider.channel(r, p).await.unwrap();
    assert_eq!(closes[0].closes_at, ch.closes_at);
    assert!(ch.closes_at > 0);
    refused(
        renter.withdraw(p).await.unwrap_err(),
        "challenge period not over",
    );
    let mut rest = batch[0].clone();
    rest.claim = 400_000;
    let (_, paid) = provider.redeem(&[rest.clone()]).await.unwrap();
    assert_eq!(paid[0].paid, 100_000);

    // After the challenge period the renter takes back what was not redeemed; the channel's
    // epoch grows and its old vouchers are void.
    h.travel(CHALLENGE_S + 1);
    renter.withdraw(p).await.unwrap();
    assert_eq!(renter.token_balance(r).await.unwrap(), minted - 500_000);
    assert_eq!(provider.token_balance(p).await.unwrap(), 500_000);
    let ch = renter.channel(r, p).await.unwrap();
    assert_eq!((ch.deposit, ch.epoch), (0, 1));
    refused(provider.redeem(&[rest]).await.unwrap_err(), "no channel");
}

#[tokio::test]
async fn a_wrong_chain_or_a_silent_endpoint_is_a_clear_error_without_the_rpc_path() {
    let Some(py) = python_or_skip("chain_client") else {
        return;
    };
    let h = Harness::start(&py, CHALLENGE_S);
    let key = Arc::new(WalletKey::generate().unwrap());
    let mut t = terms(&h);
    t.chain_id += 1;
    let e = ChainClient::connect(&h.url, key.clone(), t, Duration::from_secs(5))
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, ChainError::WrongChain { got, .. } if got == h.chain_id),
        "{text}"
    );
    assert!(
        text.contains(&format!("chain_id is {}", h.chain_id + 1)),
        "{text}"
    );

    // Nothing listens there (a port just closed): the error names the endpoint, not the path
    // that may hold an API key.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let e = ChainClient::connect(
        &format!("http://127.0.0.1:{port}/v3/SECRET-API-KEY"),
        key,
        terms(&h),
        Duration::from_secs(5),
    )
    .await
    .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, ChainError::Rpc { .. }), "{text}");
    assert!(text.contains(&format!("http://127.0.0.1:{port}")), "{text}");
    assert!(!text.contains("SECRET"), "{text}");
}
