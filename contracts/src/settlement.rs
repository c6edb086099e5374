//! On-chain settlement of a lease (issue 50): which leases settle on a chain, and the voucher
//! every receipt of such a lease carries.
//!
//! A lease settles on chain when its offer names a chain, token and channel contract
//! ([`gridlease_protocol::wallet::ChainTerms`]) and the renter settles on exactly the same
//! ones ([`choose`]); otherwise it stays GLU only, as before, and [`GluOnly`] says why. The
//! terms then carry a [`LeaseSettlement`]: both wallets and the renter's channel epoch. The
//! provider checks them before it signs ([`check_terms`]), and each receipt's EIP-712 voucher
//! against its total ([`check_voucher`]): lane = the lease id, cumulative amount = the
//! receipt's `total_paid` in the token's smallest units. The contract redeems the last one.
//!
//! Pure: the wallet key signs in the node; nothing here reads a chain.

use gridlease_protocol::wallet::{ChainTerms, LeaseSettlement, WalletBinding};
use gridlease_protocol::{LeaseId, LeaseTerms, NetworkId, Offer, PaymentReceipt, RejectReason};

/// Why a lease stays GLU only (no chain settlement).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GluOnly {
    /// The offer names no chain.
    #[error("the provider settles in GLU only (its offer names no chain)")]
    OfferHasNone,
    /// This node has no chain configured.
    #[error(
        "this node settles in GLU only (no chain configured: chain_id, token, channel_contract); the provider accepts {0}"
    )]
    RenterHasNone(ChainTerms),
    /// The two name different chains, tokens, contracts or decimals.
    #[error("the provider settles on {offer}; this node on {ours}")]
    DifferentChain {
        /// The offer's.
        offer: ChainTerms,
        /// This node's.
        ours: ChainTerms,
    },
    /// The offer's wallet is not bound to its provider.
    #[error("the offer's wallet binding does not hold: {0}")]
    BadProviderWallet(String),
}

/// The settlement of a lease this renter proposes on `offer`: `ours` is the renter's chain
/// and its wallet binding (possession signed over the renter's key on `network`), `epoch` its
/// channel's epoch with that provider. The offer's wallet binding is checked here, so a renter
/// never signs vouchers to a wallet the provider's key did not bind.
pub fn choose(
    network: &NetworkId,
    offer: &Offer,
    ours: Option<(&ChainTerms, &WalletBinding)>,
    epoch: u64,
) -> Result<LeaseSettlement, GluOnly> {
    let Some(theirs) = &offer.settlement else {
        return Err(GluOnly::OfferHasNone);
    };
    let Some((chain, binding)) = ours else {
        return Err(GluOnly::RenterHasNone(theirs.chain));
    };
    if *chain != theirs.chain {
        return Err(GluOnly::DifferentChain {
            offer: theirs.chain,
            ours: *chain,
        });
    }
    let provider_wallet = theirs
        .wallet
        .possessed_by(network, &offer.provider)
        .map_err(|e| GluOnly::BadProviderWallet(e.to_string()))?;
    Ok(LeaseSettlement {
        chain: *chain,
        renter_wallet: binding.clone(),
        provider_wallet: provider_wallet.0,
        epoch,
    })
}

/// The provider's check of a request's settlement against its offer: none is always fine
/// (GLU only); one must name the offer's chain and wallet, and the renter's wallet must be
/// bound to the renter (the terms' signer).
pub fn check_terms(network: &NetworkId, offer: &Offer, t: &LeaseTerms) -> Result<(), RejectReason> {
    let Some(s) = &t.settlement else {
        return Ok(());
    };
    let mismatch = || RejectReason::TermsMismatch {
        field: "settlement".into(),
    };
    let Some(ours) = &offer.settlement else {
        return Err(mismatch());
    };
    if s.chain != ours.chain || s.provider_wallet != ours.wallet.address {
        return Err(mismatch());
    }
    s.renter_wallet
        .possessed_by(network, &t.renter)
        .map_err(|e| RejectReason::Malformed {
            detail: e.to_string(),
        })?;
    Ok(())
}

/// Why a receipt's voucher is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VoucherError {
    /// A lease settled on chain, a receipt without a voucher.
    #[error("the receipt carries no voucher, and the lease settles on chain")]
    Missing,
    /// A voucher on a GLU-only lease.
    #[error("the receipt carries a voucher, and the lease settles in GLU only")]
    Unexpected,
    /// The signature is not the renter wallet's over the voucher for this total.
    #[error(
        "the voucher for {amount} token units on lane {lane} is not signed by the renter's wallet: {why}"
    )]
    BadSignature {
        /// The voucher's amount.
        amount: u128,
        /// The lane.
        lane: LeaseId,
        /// Why.
        why: String,
    },
}

/// Checks `receipt`'s voucher under `settlement` (the lease's terms'): present, and the
/// renter wallet's signature of the voucher for the receipt's total, exactly when the lease
/// settles on chain.
pub fn check_voucher(
    settlement: Option<&LeaseSettlement>,
    receipt: &PaymentReceipt,
) -> Result<(), VoucherError> {
    match (settlement, &receipt.voucher) {
        (None, None) => Ok(()),
        (None, Some(_)) => Err(VoucherError::Unexpected),
        (Some(_), None) => Err(VoucherError::Missing),
        (Some(s), Some(sig)) => {
            let v = s.voucher(&receipt.lease_id, receipt.total_paid);
            v.verify(&s.chain.domain(), sig)
                .map_err(|e| VoucherError::BadSignature {
                    amount: v.cumulative_amount,
                    lane: receipt.lease_id,
                    why: e.to_string(),
                })
        }
    }
}

/// How much a renter tops its channel up by before a new lease, so the deposit covers every
/// voucher the provider could redeem in this epoch: the larger of what the channel already
/// paid and what the renter signed on its ended leases (each ended lease's last voucher),
/// plus the caps (`max_total`, in token units) of its live leases and the new one. Amounts
/// in the token's smallest units; 0 when the deposit already covers it.
pub fn channel_top_up(deposit: u128, redeemed: u128, ended_signed: u128, live_caps: u128) -> u128 {
    redeemed
        .max(ended_signed)
        .saturating_add(live_caps)
        .saturating_sub(deposit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlease_protocol::fixtures;
    use gridlease_protocol::wallet::{OfferSettlement, WalletKey};
    use gridlease_protocol::{NodeKey, OfferId};

    fn wallet(n: u8) -> WalletKey {
        let mut s = [0u8; 32];
        s[31] = n;
        WalletKey::from_secret(s).unwrap()
    }

    fn chain() -> ChainTerms {
        ChainTerms {
            chain_id: 31_337,
            token: [0x70; 20],
            token_decimals: 18,
            channel_contract: [0xc0; 20],
        }
    }

    fn binding(node: &NodeKey, w: &WalletKey, net: &NetworkId) -> WalletBinding {
        WalletBinding::possession(&node.public(), w, net)
    }

    struct World {
        net: NetworkId,
        offer: Offer,
        renter: NodeKey,
        renter_wallet: WalletKey,
    }

    impl World {
        /// Terms of a lease on the offer, settled on its chain, and their settlement.
        fn terms(&self) -> (LeaseTerms, LeaseSettlement) {
            let b = binding(&self.renter, &self.renter_wallet, &self.net);
            let s = choose(&self.net, &self.offer, Some((&chain(), &b)), 0).unwrap();
            let mut t = fixtures::terms(
                OfferId(gridlease_protocol::Digest([1; 32])),
                &self.offer,
                self.renter.public(),
                1,
                600,
            );
            t.settlement = Some(s.clone());
            (t, s)
        }
    }

    fn world() -> World {
        let net = NetworkId::devnet();
        let (provider, renter) = (NodeKey::generate(), NodeKey::generate());
        let mut offer = fixtures::offer(provider.public(), 1, 1, 1_000_000);
        offer.settlement = Some(OfferSettlement {
            chain: chain(),
            wallet: binding(&provider, &wallet(2), &net),
        });
        World {
            net,
            offer,
            renter,
            renter_wallet: wallet(1),
        }
    }

    #[test]
    fn a_lease_settles_on_chain_only_where_both_name_the_same_one() {
        let w = world();
        let b = binding(&w.renter, &w.renter_wallet, &w.net);
        let s = choose(&w.net, &w.offer, Some((&chain(), &b)), 3).unwrap();
        assert_eq!(s.provider_wallet, wallet(2).address().0);
        assert_eq!(s.epoch, 3);
        assert_eq!(
            choose(&w.net, &w.offer, None, 0),
            Err(GluOnly::RenterHasNone(chain()))
        );
        let other = ChainTerms {
            token_decimals: 6,
            ..chain()
        };
        assert!(matches!(
            choose(&w.net, &w.offer, Some((&other, &b)), 0),
            Err(GluOnly::DifferentChain { .. })
        ));
        let mut bare = w.offer.clone();
        bare.settlement = None;
        assert_eq!(
            choose(&w.net, &bare, Some((&chain(), &b)), 0),
            Err(GluOnly::OfferHasNone)
        );
        // An offer carrying a wallet its provider's key did not bind (copied from another
        // provider's offer) is not paid into.
        let mut stolen = w.offer.clone();
        stolen.provider = NodeKey::generate().public();
        assert!(matches!(
            choose(&w.net, &stolen, Some((&chain(), &b)), 0),
            Err(GluOnly::BadProviderWallet(_))
        ));
    }

    #[test]
    fn the_provider_refuses_terms_off_its_chain_or_with_another_renters_wallet() {
        let w = world();
        let (t, _) = w.terms();
        let glu = LeaseTerms {
            settlement: None,
            ..t.clone()
        };
        assert_eq!(
            check_terms(&w.net, &w.offer, &glu),
            Ok(()),
            "GLU only is fine"
        );
        assert_eq!(check_terms(&w.net, &w.offer, &t), Ok(()));
        let mut off = t.clone();
        off.settlement.as_mut().unwrap().chain.chain_id = 1;
        assert!(matches!(
            check_terms(&w.net, &w.offer, &off),
            Err(RejectReason::TermsMismatch { .. })
        ));
        let mut redirected = t.clone();
        redirected.settlement.as_mut().unwrap().provider_wallet = [9; 20];
        assert!(matches!(
            check_terms(&w.net, &w.offer, &redirected),
            Err(RejectReason::TermsMismatch { .. })
        ));
        // Another node's wallet binding: its possession signature is over that node's key.
        let mut borrowed = t.clone();
        borrowed.settlement.as_mut().unwrap().renter_wallet =
            binding(&NodeKey::generate(), &w.renter_wallet, &w.net);
        assert!(matches!(
            check_terms(&w.net, &w.offer, &borrowed),
            Err(RejectReason::Malformed { .. })
        ));
    }

    #[test]
    fn the_providers_channel_books_a_receipt_only_with_the_renters_voucher() {
        let w = world();
        let (t, s) = w.terms();
        let id = t.lease_id().unwrap();
        let mut ch = crate::ProviderChannel::new(id, &t, fixtures::T0);
        let mut r = fixtures::receipt(id, 1, 1_000, 10_000);
        assert_eq!(
            ch.accept_receipt(&w.renter.public(), &r, fixtures::T0),
            Err(crate::ReceiptError::Voucher(VoucherError::Missing))
        );
        r.voucher = Some(
            s.voucher(&id, 1_000)
                .sign(&s.chain.domain(), &w.renter_wallet)
                .to_vec(),
        );
        assert!(
            ch.accept_receipt(&w.renter.public(), &r, fixtures::T0)
                .is_ok()
        );
        assert_eq!(ch.last_receipt().and_then(|r| r.voucher.clone()), r.voucher);
    }

    #[test]
    fn a_voucher_must_sign_the_receipts_total_on_its_lane() {
        let w = world();
        let b = binding(&w.renter, &w.renter_wallet, &w.net);
        let s = choose(&w.net, &w.offer, Some((&chain(), &b)), 0).unwrap();
        let lease = LeaseId(gridlease_protocol::Digest([7; 32]));
        let mut r = fixtures::receipt(lease, 1, 1_500_000, 10_000);
        assert_eq!(check_voucher(Some(&s), &r), Err(VoucherError::Missing));
        let v = s.voucher(&lease, r.total_paid);
        // 1.5 GLU-micro-units of an 18-decimals token: 1_500_000 * 10^12.
        assert_eq!(v.cumulative_amount, 1_500_000 * 10u128.pow(12));
        assert_eq!(v.lane, lease.0.0);
        r.voucher = Some(v.sign(&s.chain.domain(), &w.renter_wallet).to_vec());
        assert_eq!(check_voucher(Some(&s), &r), Ok(()));
        assert_eq!(check_voucher(None, &r), Err(VoucherError::Unexpected));
        // The same signature on a larger total, another lane, or by another key.
        let more = PaymentReceipt {
            total_paid: 1_500_001,
            ..r.clone()
        };
        assert!(matches!(
            check_voucher(Some(&s), &more),
            Err(VoucherError::BadSignature { .. })
        ));
        let elsewhere = PaymentReceipt {
            lease_id: LeaseId(gridlease_protocol::Digest([8; 32])),
            ..r.clone()
        };
        assert!(check_voucher(Some(&s), &elsewhere).is_err());
        let mut forged = r.clone();
        forged.voucher = Some(v.sign(&s.chain.domain(), &wallet(3)).to_vec());
        assert!(check_voucher(Some(&s), &forged).is_err());
        let mut short = r;
        short.voucher = Some(vec![0; 64]);
        assert!(check_voucher(Some(&s), &short).is_err());
    }

    #[test]
    fn a_top_up_covers_every_voucher_the_provider_could_still_redeem() {
        // A fresh channel: the new lease's cap.
        assert_eq!(channel_top_up(0, 0, 0, 500), 500);
        // Enough already: nothing.
        assert_eq!(channel_top_up(1_000, 0, 300, 500), 0);
        // An ended lease signed 300, of which 100 is redeemed: 300 stays covered.
        assert_eq!(channel_top_up(600, 100, 300, 500), 200);
        // Redeemed more than the ended leases signed (a live lease's lane was paid in part).
        assert_eq!(channel_top_up(600, 400, 300, 500), 300);
    }

    proptest::proptest! {
        /// After the top-up, the deposit left (deposit - redeemed) covers what the ended
        /// leases' vouchers can still claim plus every live cap, whatever was redeemed.
        #[test]
        fn after_a_top_up_the_channel_covers_all_it_may_owe(
            deposit in 0u128..1u128 << 80,
            redeemed_share in 0u128..=100,
            ended in 0u128..1u128 << 80,
            live in 0u128..1u128 << 80,
        ) {
            let redeemed = deposit * redeemed_share / 100;
            let top = channel_top_up(deposit, redeemed, ended, live);
            let left = deposit + top - redeemed;
            proptest::prop_assert!(left >= ended.saturating_sub(redeemed) + live);
            // Never more than needed: without the top-up's last unit it would not cover it.
            if top > 0 {
                proptest::prop_assert!(left - 1 < ended.max(redeemed) - redeemed + live);
            }
        }
    }
}
