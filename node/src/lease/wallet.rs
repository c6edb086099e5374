//! What `gridlease wallet` (`GET /v1/wallet`) shows of on-chain settlement (issue 50): this
//! node's wallet, the chain it settles on, and the last voucher of each of its leases settled
//! on chain: what the channel contract's `redeem(renter, lane, amount, claim, signature)` takes
//! (a provider redeems its own; a renter sees what it signed).

use gridlease_contracts::money::Money;
use gridlease_protocol::LeaseId;
use gridlease_protocol::messages::{PaymentReceipt, UsageReport};
use gridlease_protocol::wallet::{Address, ChainTerms, LeaseSettlement};
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

/// Where a lease settles on chain: the chain, the two wallets, the renter's channel epoch and
/// the lane its vouchers pay (the same in `gridlease wallet` and in a statement).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LaneView {
    /// The chain, token and contract of the lease's terms.
    pub chain: ChainView,
    /// The renter's wallet (the signer; the channel's depositor).
    pub renter_wallet: String,
    /// The provider's wallet (who redeems).
    pub provider_wallet: String,
    /// The renter's channel epoch the vouchers are for.
    pub epoch: u64,
    /// The lane: the lease id as a `bytes32` (`0x` and 64 hex digits).
    pub lane: String,
}

impl LaneView {
    /// The lane of lease `lease` settled by `s`.
    pub fn of(s: &LeaseSettlement, lease: &LeaseId) -> Self {
        Self {
            chain: ChainView::of(&s.chain),
            renter_wallet: Address(s.renter_wallet.address).to_string(),
            provider_wallet: Address(s.provider_wallet).to_string(),
            epoch: s.epoch,
            lane: format!("0x{}", hex::encode(lease.0.0)),
        }
    }
}

/// A voucher as the contract's `redeem(renter, lane, amount, claim, signature)` takes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SignedVoucher {
    /// The cumulative amount the renter signed, in the token's smallest units (decimal).
    pub amount: String,
    /// What the provider claims of it: what the lease owes so far (`channel::owed`: the
    /// receipt's total, at most the last usage report's amount due), in the same units. Less
    /// than `amount` only when the voucher prepaid time not used.
    pub claim: String,
    /// The renter wallet's EIP-712 signature (`0x` and 130 hex digits).
    pub signature: String,
}

impl SignedVoucher {
    /// The voucher `receipt` of lease `lease` carries, if any; `report` is the provider's
    /// last usage report.
    pub fn of(
        s: &LeaseSettlement,
        lease: &LeaseId,
        receipt: &PaymentReceipt,
        report: Option<&UsageReport>,
    ) -> Option<Self> {
        let signature = receipt.voucher.as_ref()?;
        let owed =
            gridlease_contracts::channel::owed(Money::from_micros(receipt.total_paid), report);
        Some(Self {
            amount: s
                .voucher(lease, receipt.total_paid)
                .cumulative_amount
                .to_string(),
            claim: s.chain.token_amount(owed.micros()).to_string(),
            signature: format!("0x{}", hex::encode(signature)),
        })
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
    /// Where it settles.
    #[serde(flatten)]
    pub lane: LaneView,
    /// The voucher.
    #[serde(flatten)]
    pub voucher: SignedVoucher,
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
            let report = rec
                .last_usage
                .as_ref()
                .and_then(|(_, b)| super::view::decode_usage(b))
                .map(|(_, r)| r);
            Some(VoucherView {
                lease_id: l.lease.id.to_string(),
                role: l.role,
                state: l.lease.state.as_str().to_string(),
                lane: LaneView::of(s, &l.lease.id),
                voucher: SignedVoucher::of(s, &l.lease.id, &receipt, report.as_ref())?,
                receipt_seq: receipt.seq,
            })
        })
        .collect()
}
