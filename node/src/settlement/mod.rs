//! The settlement service (issue 50): a provider's node redeems the last voucher of each of
//! its leases settled on chain, through the chain client ([`crate::chain`]).
//!
//! Every pass (at start, then every `redeem_interval_secs`):
//! 1. **queue**: each settled provider lease not looked at yet is looked at once
//!    (`store::redemptions`): one settled on chain with a voucher is queued with its claim (what
//!    its statement owes, `lease::wallet::Redeemable`), any other is marked `glu`. The queue is
//!    in the database, so a node killed before redeeming redeems after its restart.
//! 2. **redeem**: the pending vouchers on the configured chain, up to [`crate::chain::MAX_BATCH`]
//!    per transaction and [`MAX_BATCHES_PER_PASS`] transactions per pass. When the contract
//!    refuses a batch, its vouchers are redeemed one by one so one bad voucher holds up no
//!    other. A voucher the contract refuses for good (not the renter's signature, a claim beyond
//!    it, a channel already closed) is marked failed with the reason; one that waits on the
//!    renter (no channel yet, an empty one) stays pending with the reason.
//! 3. **reconcile**: after a redeem the lane's total on chain is read back and kept; it must
//!    equal the claim (the ledger's amount in token units): a difference is logged as an error
//!    and shown by `gridlease wallet`, never absorbed.
//! 4. **watch**: the closes renters started on channels to this wallet since the last pass are
//!    logged (at most 2,000 blocks a pass); every pass redeems the pending vouchers anyway, well
//!    inside any challenge period longer than the interval.
//!
//! The status (endpoint, connection, counts, the last error) is shared with the control API.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gridlease_protocol::LeaseId;
use gridlease_protocol::wallet::{Address, ChainTerms, WalletKey};
use tokio_util::sync::CancellationToken;

use crate::chain::{ChainClient, ChainError, MAX_BATCH, Redeem};
use crate::lease::wallet::{Redeemable, SettlementStatus};
use crate::store::StoreHandle;
use crate::store::redemptions::Queued;

/// Most redeem transactions per pass.
pub const MAX_BATCHES_PER_PASS: usize = 8;

/// Most settled leases looked at per pass.
const QUEUE_PER_PASS: usize = 512;

/// How long a transaction may wait for its confirmation.
const CONFIRM: Duration = Duration::from_secs(120);

/// Most blocks one close watch reads (endpoints refuse larger log queries).
const WATCH_BLOCKS: u64 = 2_000;

/// The store's key of the block the close watch has read up to.
const WATCHED_BLOCK: &str = "settlement.watched_block";

/// What the service needs.
#[derive(Clone, Debug)]
pub struct SettlementConfig {
    /// The chain's JSON-RPC endpoint.
    pub rpc: String,
    /// The chain, token and contract.
    pub chain: ChainTerms,
    /// The node's wallet.
    pub wallet: Arc<WalletKey>,
    /// Between passes.
    pub interval: Duration,
}

/// The status, shared.
pub type SharedStatus = Arc<Mutex<SettlementStatus>>;

/// Asks for a pass now; answered with that pass's error, if any.
type PassNow = tokio::sync::oneshot::Sender<Result<(), String>>;

/// The running service: its status, and a way to ask for a pass now (`gridlease settle`).
#[derive(Clone, Debug)]
pub struct SettlementHandle {
    /// What it shows.
    pub status: SharedStatus,
    now: tokio::sync::mpsc::Sender<PassNow>,
}

impl SettlementHandle {
    /// Runs a pass now (after the one under way, if any) and waits for it: its error, if any.
    pub async fn pass_now(&self) -> Result<(), String> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.now.try_send(tx).map_err(|_| {
            "a settlement pass is already asked for; try again in a moment".to_string()
        })?;
        rx.await
            .map_err(|_| "the settlement service has stopped".to_string())?
    }
}

/// Starts the service; it runs until `cancel`.
pub fn spawn(
    config: SettlementConfig,
    store: StoreHandle,
    cancel: CancellationToken,
) -> (SettlementHandle, tokio::task::JoinHandle<()>) {
    let status: SharedStatus = Arc::new(Mutex::new(SettlementStatus {
        endpoint: crate::chain::redact(&config.rpc),
        ..SettlementStatus::default()
    }));
    let (now, mut asked) = tokio::sync::mpsc::channel::<PassNow>(1);
    let shared = status.clone();
    let task = tokio::spawn(async move {
        let mut client: Option<ChainClient> = None;
        let mut reply: Option<PassNow> = None;
        loop {
            let outcome = pass(&config, &store, &mut client, &shared).await;
            if let Ok(mut s) = shared.lock() {
                s.connected = client.is_some() && outcome.is_ok();
                s.last_error = outcome.clone().err();
            }
            if let Ok((pending, redeemed, failed)) = store.call(|s| s.redemption_counts()).await
                && let Ok(mut s) = shared.lock()
            {
                (s.pending, s.redeemed, s.failed) = (pending, redeemed, failed);
            }
            if let Some(r) = reply.take() {
                let _ = r.send(outcome);
            }
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep(config.interval) => {}
                r = asked.recv() => reply = r,
            }
        }
    });
    (SettlementHandle { status, now }, task)
}

fn now_s() -> u64 {
    crate::clock::now().0 / 1000
}

/// One pass; the error is what the status shows.
async fn pass(
    config: &SettlementConfig,
    store: &StoreHandle,
    client: &mut Option<ChainClient>,
    status: &SharedStatus,
) -> Result<(), String> {
    let ours = config.wallet.address();
    queue(store, ours).await.map_err(|e| e.to_string())?;
    if client.is_none() {
        match ChainClient::connect(&config.rpc, config.wallet.clone(), config.chain, CONFIRM).await
        {
            Ok(c) => {
                tracing::info!(
                    endpoint = c.endpoint(),
                    chain_id = config.chain.chain_id,
                    "settlement: connected to the chain"
                );
                *client = Some(c);
            }
            Err(e) => {
                tracing::warn!(error = %e, "settlement: cannot reach the chain; vouchers stay queued");
                return Err(e.to_string());
            }
        }
    }
    let Some(c) = client.as_ref() else {
        return Ok(());
    };
    // Redeem first: a close watch that fails (an endpoint refusing a log query) never holds
    // up a redeem.
    let mut result = redeem(c, store, config.chain, status).await;
    if result.is_ok() {
        result = watch(c, store).await;
    }
    if let Err(e) = &result
        && matches!(e, ChainError::Rpc { .. })
    {
        // Connect again next pass (the endpoint may have changed, or come back).
        *client = None;
    }
    result.map_err(|e| e.to_string())
}

/// Looks at each settled provider lease once: queues its voucher, or marks it `glu`.
async fn queue(store: &StoreHandle, ours: Address) -> Result<(), crate::store::StoreError> {
    store
        .call(move |s| {
            let at = now_s();
            for id in s.unqueued_settled(QUEUE_PER_PASS)? {
                let Some(l) = s.lease(&id)? else { continue };
                let rec = s.session_record(&id)?;
                match Redeemable::of_stored(&l, &rec) {
                    Some((settlement, r))
                        if settlement.provider_wallet == ours.0 && r.claim > 0 =>
                    {
                        s.queue_redemption(
                            &Queued {
                                lease_id: id,
                                chain_id: settlement.chain.chain_id,
                                contract: settlement.chain.channel_contract,
                                renter: settlement.renter_wallet.address,
                                epoch: settlement.epoch,
                                amount: r.amount,
                                claim: r.claim,
                                signature: r.signature,
                            },
                            at,
                        )?;
                        tracing::info!(lease = %id, claim = %r.claim, "settlement: voucher queued for redeeming");
                    }
                    _ => s.mark_glu(&id, at)?,
                }
            }
            Ok(())
        })
        .await
}

/// Logs the closes renters started since the last pass (at most [`WATCH_BLOCKS`]).
async fn watch(c: &ChainClient, store: &StoreHandle) -> Result<(), ChainError> {
    let from = store
        .call(|s| s.meta(WATCHED_BLOCK))
        .await
        .ok()
        .flatten()
        .and_then(|b| b.parse::<u64>().ok());
    let head = c.block().await?;
    let Some(from) = from else {
        // First pass on this chain: watch from here on.
        let _ = store
            .call(move |s| s.set_meta(WATCHED_BLOCK, &head.to_string()))
            .await;
        return Ok(());
    };
    if head < from {
        return Ok(());
    }
    // At most WATCH_BLOCKS a pass: a node back after a long outage catches up over passes
    // (its vouchers are redeemed every pass anyway).
    let to = head.min(from.saturating_add(WATCH_BLOCKS - 1));
    for close in c.closes_between(from, to).await? {
        tracing::warn!(renter = %close.renter, epoch = close.epoch, closes_at = close.closes_at, block = close.block, "settlement: a renter started closing its channel; its pending vouchers are redeemed every pass");
    }
    let next = to.saturating_add(1);
    let _ = store
        .call(move |s| s.set_meta(WATCHED_BLOCK, &next.to_string()))
        .await;
    Ok(())
}

/// Whether the contract's refusal `reason` is final for a voucher.
fn refused_for_good(reason: &str) -> bool {
    [
        "not signed by the renter",
        "claim beyond the voucher",
        "channel closed",
        "malleable",
        "bad signature",
    ]
    .iter()
    .any(|r| reason.contains(r))
}

/// Redeems the pending vouchers, batch by batch.
async fn redeem(
    c: &ChainClient,
    store: &StoreHandle,
    chain: ChainTerms,
    status: &SharedStatus,
) -> Result<(), ChainError> {
    let provider = c.wallet();
    let mut skip: Vec<LeaseId> = Vec::new();
    for _ in 0..MAX_BATCHES_PER_PASS {
        let limit = MAX_BATCH + skip.len();
        let mut batch = store
            .call(move |s| s.pending_redemptions(chain.chain_id, chain.channel_contract, limit))
            .await
            .map_err(|e| ChainError::Invalid(e.to_string()))?;
        batch.retain(|q| !skip.contains(&q.lease_id));
        batch.truncate(MAX_BATCH);
        if batch.is_empty() {
            return Ok(());
        }
        let vouchers: Vec<Redeem> = batch.iter().map(redeem_of).collect();
        match c.redeem(&vouchers).await {
            Ok((mined, _)) => {
                if let Ok(mut s) = status.lock() {
                    s.last_tx = Some(mined.tx.clone());
                }
                for q in &batch {
                    record(c, store, provider, q, Some(&mined.tx), mined.block).await?;
                }
            }
            Err(ChainError::Refused { .. }) if batch.len() > 1 => {
                // One voucher fails the whole batch: each on its own.
                for q in &batch {
                    one(c, store, provider, q, status).await?;
                    skip.push(q.lease_id);
                }
            }
            Err(ChainError::Refused { reason, .. }) => {
                settle_refusal(c, store, provider, &batch[0], &reason).await?;
                skip.push(batch[0].lease_id);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn one(
    c: &ChainClient,
    store: &StoreHandle,
    provider: Address,
    q: &Queued,
    status: &SharedStatus,
) -> Result<(), ChainError> {
    match c.redeem(&[redeem_of(q)]).await {
        Ok((mined, _)) => {
            if let Ok(mut s) = status.lock() {
                s.last_tx = Some(mined.tx.clone());
            }
            record(c, store, provider, q, Some(&mined.tx), mined.block).await
        }
        Err(ChainError::Refused { reason, .. }) => {
            settle_refusal(c, store, provider, q, &reason).await
        }
        Err(e) => Err(e),
    }
}

/// A voucher the contract refused: already paid (recorded as redeemed), refused for good
/// (failed), or waiting on the renter (stays pending, with the reason).
async fn settle_refusal(
    c: &ChainClient,
    store: &StoreHandle,
    provider: Address,
    q: &Queued,
    reason: &str,
) -> Result<(), ChainError> {
    if reason.contains("nothing new on this lane") {
        // Paid before (a redeem whose receipt this node never saw, before a restart).
        return record(c, store, provider, q, None, 0).await;
    }
    let permanent = refused_for_good(reason);
    if permanent {
        tracing::error!(lease = %q.lease_id, reason, "settlement: the contract refuses this voucher for good");
    } else {
        tracing::warn!(lease = %q.lease_id, reason, "settlement: the voucher waits on the renter's channel");
    }
    let (id, reason) = (q.lease_id, reason.to_string());
    store
        .call(move |s| s.mark_redeem_error(&id, &reason, permanent, now_s()))
        .await
        .map_err(|e| ChainError::Invalid(e.to_string()))
}

/// Reads the lane's total back and records it: redeemed when it reaches the claim (a
/// difference is reported), pending while the channel ran short.
async fn record(
    c: &ChainClient,
    store: &StoreHandle,
    provider: Address,
    q: &Queued,
    tx: Option<&str>,
    block: u64,
) -> Result<(), ChainError> {
    let paid = c
        .lane_redeemed(Address(q.renter), provider, q.epoch, q.lease_id.0.0)
        .await?;
    let (id, tx) = (q.lease_id, tx.map(str::to_string));
    if paid < q.claim {
        let why = format!(
            "the channel paid {paid} of the claim {}: the rest is redeemed after the renter tops it up",
            q.claim
        );
        tracing::warn!(lease = %id, "settlement: {why}");
        return store
            .call(move |s| s.mark_redeem_error(&id, &why, false, now_s()))
            .await
            .map_err(|e| ChainError::Invalid(e.to_string()));
    }
    if paid != q.claim {
        tracing::error!(lease = %id, paid = %paid, claim = %q.claim, "settlement: the chain paid this lane more than the ledger's amount");
    } else {
        tracing::info!(lease = %id, paid = %paid, tx = tx.as_deref().unwrap_or("-"), "settlement: voucher redeemed");
    }
    store
        .call(move |s| s.mark_redeemed(&id, tx.as_deref(), block, paid, now_s()))
        .await
        .map_err(|e| ChainError::Invalid(e.to_string()))
}

fn redeem_of(q: &Queued) -> Redeem {
    Redeem {
        renter: Address(q.renter),
        lane: q.lease_id.0.0,
        amount: q.amount,
        claim: q.claim,
        signature: q.signature.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_that_wait_on_the_renter_are_not_final() {
        assert!(refused_for_good(
            "execution reverted: not signed by the renter"
        ));
        assert!(refused_for_good("execution reverted: channel closed"));
        assert!(!refused_for_good("execution reverted: no channel"));
        assert!(!refused_for_good("execution reverted: channel is empty"));
    }

    #[test]
    fn the_status_shows_no_path_of_the_endpoint() {
        assert_eq!(
            crate::chain::redact("https://rpc.example:8443/v3/KEY"),
            "https://rpc.example:8443"
        );
    }
}
