//! What `gridlease wallet` (`GET /v1/wallet`) shows of on-chain settlement (issue 50): this
//! node's wallet, the chain it settles on, and the last voucher of each of its leases settled
//! on chain: what the channel contract's `redeem(renter, lane, amount, signature)` takes
//! (a provider redeems its own; a renter sees what it signed).

use gridlease_protocol::wallet::{Address, ChainTerms};
use serde::{Deserialize, Serialize};

use crate::store::lease::SessionRecord;
use crate::store::{Role, StoredLease};

/// This node's wallet and its on-chain vouchers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WalletView {
    /// The wallet's address (`<home>/wallet.key`, EIP-55).
    pub address: String,
    /// The chain this node settles on; `null`: GLU only (no chain configured).
    pub chain: Option<ChainView>,
    /// The last voucher of every lease of this node settled on chain, oldest lease first.
    pub vouchers: Vec<VoucherView>,
}

/// A chain, token and channel contract.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChainView {
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// The ERC-20 token (EIP-55).
    pub token: String,
    /// Its decimals.
    pub token_decimals: u8,
    /// The payment channel contract (EIP-55).
    pub channel_contract: String,
}

impl ChainView {
    /// The view of `c`.
    pub fn of(c: &ChainTerms) -> Self {
        Self {
            chain_id: c.chain_id,
            token: Address(c.token).to_string(),
            token_decimals: c.token_decimals,
            channel_contract: Address(c.channel_contract).to_string(),
        }
    }
}

/// The last voucher of a lease settled on chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VoucherView {
    /// The lease (hex).
    pub lease_id: String,
    /// This node's part: `provider` redeems it, `renter` signed it.
    pub role: Role,
    /// The lease's state (`running`, `settled`, ...).
    pub state: String,
    /// The chain, token and contract of the lease's terms.
    pub chain: ChainView,
    /// The renter's wallet (the signer; the channel's depositor).
    pub renter_wallet: String,
    /// The provider's wallet (who redeems).
    pub provider_wallet: String,
    /// The renter's channel epoch the voucher is for.
    pub epoch: u64,
    /// The lane: the lease id as a `bytes32` (`0x` and 64 hex digits).
    pub lane: String,
    /// The cumulative amount, in the token's smallest units (decimal).
    pub amount: String,
    /// The renter wallet's EIP-712 signature (`0x` and 130 hex digits).
    pub signature: String,
    /// The receipt it rides on.
    pub receipt_seq: u64,
}

/// The last voucher of each of `leases` settled on chain (its last stored receipt's), in the
/// order given. A lease whose stored receipt does not decode is left out (and logged).
pub fn vouchers(leases: &[(StoredLease, SessionRecord)]) -> Vec<VoucherView> {
    leases
        .iter()
        .filter_map(|(l, rec)| {
            let s = l.lease.terms.settlement.as_ref()?;
            let (_, bytes) = rec.last_receipt.as_ref()?;
            let Some((_, receipt)) = super::view::decode_receipt(bytes) else {
                tracing::warn!(lease = %l.lease.id, "a stored receipt does not decode");
                return None;
            };
            let signature = receipt.voucher.as_ref()?;
            let v = s.voucher(&l.lease.id, receipt.total_paid);
            Some(VoucherView {
                lease_id: l.lease.id.to_string(),
                role: l.role,
                state: l.lease.state.as_str().to_string(),
                chain: ChainView::of(&s.chain),
                renter_wallet: v.renter.to_string(),
                provider_wallet: v.provider.to_string(),
                epoch: v.epoch,
                lane: format!("0x{}", hex::encode(v.lane)),
                amount: v.cumulative_amount.to_string(),
                signature: format!("0x{}", hex::encode(signature)),
                receipt_seq: receipt.seq,
            })
        })
        .collect()
}
