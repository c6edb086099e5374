//! The renter's side: turning a rent request and an offer from the book into proposed terms.

use gridlease_contracts::book::BookEntry;
use gridlease_contracts::{Money, MoneyError};
use gridlease_protocol::{LeaseTerms, NetworkId, PublicKey, Timestamp};

use crate::lease::RentRequest;

/// The terms for `req` on the offer in `entry`: the offer's ask price and settings, the
/// network `req` asks for (the provider refuses one its offer does not allow), the
/// renter's grace (at least one usage interval) and `nonce`, and the budget cap asked for or,
/// by default, the cost of the whole duration (or of the minimum billed time, if longer).
/// Fails only when that cost overflows.
pub fn terms_for(
    network: &NetworkId,
    entry: &BookEntry,
    renter: PublicKey,
    req: &RentRequest,
    grace_s: u32,
    nonce: u64,
    now: Timestamp,
) -> Result<LeaseTerms, MoneyError> {
    let o = &entry.offer;
    let max_total = match req.max_total {
        Some(m) => m,
        None => gridlease_contracts::default_budget(
            req.duration_s,
            o.min_billed_s,
            req.gpus,
            Money::from_micros(o.price_per_gpu_hour),
        )?,
    };
    Ok(LeaseTerms {
        network: network.clone(),
        offer_id: entry.id,
        offer_seq: o.seq,
        provider: o.provider,
        renter,
        gpu_count: req.gpus,
        per_gpu: o.per_gpu,
        price_per_gpu_hour: o.price_per_gpu_hour,
        duration_s: req.duration_s,
        min_billed_s: o.min_billed_s,
        usage_interval_s: o.usage_interval_s,
        pay_ahead_s: o.pay_ahead_s,
        grace_s: grace_s.max(o.usage_interval_s),
        max_total: max_total.micros(),
        network_policy: req.network,
        image: req.image.clone(),
        command: req.command.clone(),
        env: req.env.clone(),
        nonce,
        created_at: now,
        output_retention_s: req.keep_outputs_s.min(o.sandbox.output_retention_s),
        upload_hold_s: req.upload_hold_s.min(o.sandbox.upload_hold_s),
        prepay_s: req.prepay_s,
    })
}

/// The offer's dialable addresses that parse.
pub fn offer_addrs(entry: &BookEntry) -> Vec<libp2p::Multiaddr> {
    entry
        .offer
        .addrs
        .iter()
        .filter_map(|a| a.parse().ok())
        .collect()
}
