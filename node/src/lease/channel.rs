//! The renter's payment channel before a lease settled on chain (issue 50): with `chain_rpc`
//! the renter's node reads its channel to the provider's wallet, takes the channel's epoch
//! for the terms, and opens or tops the channel up so its deposit covers every voucher the
//! provider could redeem (`contracts::settlement::channel_top_up`), before anything is
//! signed. Without `chain_rpc` the terms keep epoch 0 and the renter deposits by hand.

use std::time::Duration;

use gridlease_protocol::wallet::{Address, LeaseSettlement};

use super::ctx::Ctx;
use super::error::RentError;
use super::wallet::Redeemable;
use crate::chain::ChainClient;
use crate::store::Role;

/// How long a deposit may wait for its confirmation.
const CONFIRM: Duration = Duration::from_secs(120);

/// A client of the chain this node settles on, when it has `chain_rpc` (`None` otherwise).
pub(super) async fn client(ctx: &Ctx) -> Option<Result<ChainClient, crate::chain::ChainError>> {
    let ours = ctx.config.settlement.as_ref()?;
    let rpc = ours.rpc.as_deref()?;
    Some(ChainClient::connect(rpc, ours.wallet.clone(), ours.chain, CONFIRM).await)
}

/// `s` with the channel's epoch, after the channel covers a new lease capped at `max_total`
/// micro-units. Nothing happens without `chain_rpc`.
pub(super) async fn fund(
    ctx: &Ctx,
    mut s: LeaseSettlement,
    max_total: u64,
) -> Result<LeaseSettlement, RentError> {
    let (Some(ours), Some(connected)) = (ctx.config.settlement.as_ref(), client(ctx).await) else {
        return Ok(s);
    };
    let chain_err = |e: crate::chain::ChainError| RentError::Chain(e.to_string());
    let c = connected.map_err(chain_err)?;
    let me = ours.wallet.address();
    let provider = Address(s.provider_wallet);
    let channel = c.channel(me, provider).await.map_err(chain_err)?;
    if channel.closes_at != 0 {
        return Err(RentError::Chain(format!(
            "your channel to the provider's wallet {provider} is closing (its challenge period ends at chain time {}); withdraw after it, then rent again",
            channel.closes_at
        )));
    }
    s.epoch = channel.epoch;
    // What the renter's other leases with this wallet in this epoch may still cost.
    let (epoch, chain) = (channel.epoch, ours.chain);
    let (ended_signed, live_caps) = ctx
        .store
        .call(move |st| {
            let (mut ended, mut live) = (0u128, 0u128);
            for (l, rec) in st.leases_with_records()? {
                let Some(ls) = l.lease.terms.settlement.as_ref() else {
                    continue;
                };
                if l.role != Role::Renter
                    || ls.provider_wallet != provider.0
                    || ls.epoch != epoch
                    || ls.chain != chain
                {
                    continue;
                }
                if l.lease.state.is_terminal() {
                    if let Some((_, r)) = Redeemable::of_stored(&l, &rec) {
                        ended = ended.saturating_add(r.amount);
                    }
                } else {
                    live = live.saturating_add(chain.token_amount(l.lease.terms.max_total));
                }
            }
            Ok((ended, live))
        })
        .await
        .map_err(|e| RentError::Chain(e.to_string()))?;
    let live_caps = live_caps.saturating_add(chain.token_amount(max_total));
    let top = gridlease_contracts::settlement::channel_top_up(
        channel.deposit,
        channel.redeemed,
        ended_signed,
        live_caps,
    );
    if top > 0 {
        tracing::info!(provider_wallet = %provider, epoch, deposit = %channel.deposit, top_up = %top, "opening or topping up the payment channel");
        c.deposit(provider, top).await.map_err(chain_err)?;
    }
    Ok(s)
}
