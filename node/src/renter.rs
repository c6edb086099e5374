//! The renter's side: turning an offer from the book into proposed lease terms.

use std::collections::BTreeMap;

use gridlease_contracts::book::BookEntry;
use gridlease_protocol::{LeaseTerms, NetworkId, NetworkPolicy, PublicKey, Timestamp};

/// What a renter wants from an offer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseAsk {
    /// GPUs wanted.
    pub gpu_count: u16,
    /// Seconds.
    pub duration_s: u32,
    /// Container image.
    pub image: String,
    /// Command; empty runs the image's own.
    pub command: Vec<String>,
    /// Environment.
    pub env: BTreeMap<String, String>,
    /// Most to pay in total, micro-units.
    pub max_total: u64,
    /// Seconds the provider waits for a silent renter.
    pub grace_s: u32,
    /// Unique per request of this renter; makes retries idempotent.
    pub nonce: u64,
}

/// Terms that take `ask` from the offer in `entry` at the offer's ask price and settings.
pub fn terms_for(
    network: &NetworkId,
    entry: &BookEntry,
    renter: PublicKey,
    ask: &LeaseAsk,
    now: Timestamp,
) -> LeaseTerms {
    let o = &entry.offer;
    LeaseTerms {
        network: network.clone(),
        offer_id: entry.id,
        offer_seq: o.seq,
        provider: o.provider,
        renter,
        gpu_count: ask.gpu_count,
        per_gpu: o.per_gpu,
        price_per_gpu_hour: o.price_per_gpu_hour,
        duration_s: ask.duration_s,
        min_billed_s: o.min_billed_s,
        usage_interval_s: o.usage_interval_s,
        pay_ahead_s: o.pay_ahead_s,
        grace_s: ask.grace_s.max(o.usage_interval_s),
        max_total: ask.max_total,
        network_policy: NetworkPolicy::None,
        image: ask.image.clone(),
        command: ask.command.clone(),
        env: ask.env.clone(),
        nonce: ask.nonce,
        created_at: now,
    }
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
