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
use crate::store::redemptions::{Redemption, RedemptionState};
use crate::store::{Role, StoredLease};

/// This node's wallet and its on-chain vouchers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WalletView {
    /// The wallet's address (`<home>/wallet.key`, EIP-55).
    pub address: String,
    /// The chain this node settles on; `null`: GLU only (no chain configured).
    pub chain: Option<ChainView>,
    /// The settlement service (`chain_rpc`): `null` when the node does not redeem by itself.
    pub settlement: Option<SettlementStatus>,
    /// The wallet's balances and its channels, read from the chain now (`null` without
    /// `chain_rpc`).
    pub onchain: Option<OnChainView>,
    /// The last voucher of every lease of this node settled on chain, oldest lease first.
    pub vouchers: Vec<VoucherView>,
}

/// The wallet on the chain, read when asked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OnChainView {
    /// The chain's own coin (wei, decimal): what pays gas.
    pub gas: Option<String>,
    /// The token (its smallest units, decimal).
    pub token: Option<String>,
    /// The channels between this wallet and the wallets of its leases' counterparties.
    pub channels: Vec<ChannelView>,
    /// Why the chain could not be read (the fields above are then missing or partial).
    pub error: Option<String>,
}

/// A channel as the contract holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChannelView {
    /// The depositor.
    pub renter_wallet: String,
    /// Who redeems.
    pub provider_wallet: String,
    /// Deposited in this epoch (token units, decimal).
    pub deposit: String,
    /// Paid to the provider in this epoch (token units, decimal).
    pub redeemed: String,
    /// When the renter's close ends (chain time, seconds; 0: not closing).
    pub closes_at: u64,
    /// The epoch.
    pub epoch: u64,
}

/// What the settlement service shows (`crate::settlement`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SettlementStatus {
    /// The chain's endpoint (scheme, host, port only).
    pub endpoint: String,
    /// Whether the last pass reached the chain.
    pub connected: bool,
    /// Vouchers waiting to be redeemed.
    pub pending: u64,
    /// Vouchers the contract paid.
    pub redeemed: u64,
    /// Vouchers the contract refuses for good.
    pub failed: u64,
    /// The last pass's error, if it had one.
    pub last_error: Option<String>,
    /// The last redeem transaction.
    pub last_tx: Option<String>,
}

/// Where a provider's redeem of a voucher stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RedemptionView {
    /// `pending`, `redeemed` or `failed`.
    pub state: RedemptionState,
    /// The transaction that paid it (none: paid before, unseen).
    pub tx: Option<String>,
    /// Its block.
    pub block: Option<u64>,
    /// What the chain says the lane was paid in all (token units, decimal).
    pub paid: Option<String>,
    /// Whether that equals the claim (the ledger's amount): false is a mismatch to look at.
    pub reconciled: bool,
    /// Why it failed, or what it waits for.
    pub error: Option<String>,
    /// Redeems tried.
    pub attempts: u64,
}

impl RedemptionView {
    fn of(r: &Redemption, claim: u128) -> Option<Self> {
        if r.state == RedemptionState::Glu {
            return None;
        }
        Some(Self {
            state: r.state,
            tx: r.tx.clone(),
            block: r.block,
            paid: r.paid.map(|p| p.to_string()),
            reconciled: r.state == RedemptionState::Redeemed && r.paid == Some(claim),
            error: r.error.clone(),
            attempts: r.attempts,
        })
    }
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
        Redeemable::of(s, lease, receipt, report).map(Self::from)
    }
}

impl From<Redeemable> for SignedVoucher {
    fn from(r: Redeemable) -> Self {
        Self {
            amount: r.amount.to_string(),
            claim: r.claim.to_string(),
            signature: format!("0x{}", hex::encode(&r.signature)),
        }
    }
}

/// A lease's last voucher as the provider redeems it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redeemable {
    /// The cumulative amount the renter signed (token units).
    pub amount: u128,
    /// What the lease owes of it (`channel::owed`, token units): the provider's claim.
    pub claim: u128,
    /// The renter's EIP-712 signature.
    pub signature: Vec<u8>,
}

impl Redeemable {
    /// The voucher `receipt` of lease `lease` carries (none without one); `report` is the
    /// provider's last usage report.
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
            amount: s.voucher(lease, receipt.total_paid).cumulative_amount,
            claim: s.chain.token_amount(owed.micros()),
            signature: signature.clone(),
        })
    }

    /// The last voucher of a stored lease settled on chain, with its settlement: `None` for a
    /// lease in GLU only or one nothing was paid on.
    pub fn of_stored(l: &StoredLease, rec: &SessionRecord) -> Option<(LeaseSettlement, Self)> {
        let s = l.lease.terms.settlement.as_ref()?;
        let (_, bytes) = rec.last_receipt.as_ref()?;
        let (_, receipt) = super::view::decode_receipt(bytes)?;
        let report = rec
            .last_usage
            .as_ref()
            .and_then(|(_, b)| super::view::decode_usage(b))
            .map(|(_, r)| r);
        Some((
            s.clone(),
            Self::of(s, &l.lease.id, &receipt, report.as_ref())?,
        ))
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
    /// The provider's redeem of it (a provider's settled lease, once the settlement service
    /// queued it).
    pub redemption: Option<RedemptionView>,
}

/// The last voucher of each of `leases` settled on chain (its last stored receipt's), in the
/// order given. A lease whose stored receipt does not decode is left out (and logged).
pub fn vouchers(leases: &[(StoredLease, SessionRecord, Option<Redemption>)]) -> Vec<VoucherView> {
    leases
        .iter()
        .filter_map(|(l, rec, redemption)| {
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
            let r = Redeemable::of(s, &l.lease.id, &receipt, report.as_ref())?;
            Some(VoucherView {
                lease_id: l.lease.id.to_string(),
                role: l.role,
                state: l.lease.state.as_str().to_string(),
                lane: LaneView::of(s, &l.lease.id),
                redemption: redemption
                    .as_ref()
                    .and_then(|d| RedemptionView::of(d, r.claim)),
                voucher: SignedVoucher::from(r),
                receipt_seq: receipt.seq,
            })
        })
        .collect()
}
