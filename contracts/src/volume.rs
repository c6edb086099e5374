//! Volumes (issue 47): storage a provider keeps for a renter beyond any one lease, in a lease
//! of its own (a *volume lease*, `LeaseTerms::volume`), billed per second of kept GiB through
//! the same payment channel as a GPU lease.
//!
//! The tariff of a volume lease counts the volume's GiB where a lease counts GPUs
//! ([`crate::Tariff::of`]): `floor(price_per_gib_hour x size_gib x seconds / 3600)`, capped
//! at the budget. Its duration is the keep period: at its end the provider deletes the volume.
//! Prepaid (`prepay_s`: the whole keep period, or a window) or in arrears like any lease; a
//! renter who stops paying loses the volume when the channel says stop. Both sides' exposure
//! is that of the channel rules (`channel`'s properties), checked for volume tariffs here.
//!
//! What the node decides with I/O (free disk, the renter's other volumes, whether a mounted
//! volume is the renter's and free) is in the provider's desk; here is what the terms and the
//! offer alone decide.

use gridlease_protocol::{LeaseTerms, Offer, RejectReason, VolumeRefusal, VolumeTerms};

/// The provider's decision on a volume lease's terms against its offer (after the checks
/// every request gets: shape, signer, network, expiry, provider, offer, and the payment
/// channel's interval, pay-ahead window and grace).
pub fn check_volume_terms(
    offer: &Offer,
    t: &LeaseTerms,
    v: &VolumeTerms,
) -> Result<(), RejectReason> {
    let policy = &offer.sandbox.volumes;
    let refuse = |refusal| Err(RejectReason::VolumeRefused { refusal });
    if !policy.offered() {
        return refuse(VolumeRefusal::NotOffered);
    }
    if v.price_per_gib_hour < policy.price_per_gib_hour {
        return Err(RejectReason::PriceBelowAsk {
            ask: policy.price_per_gib_hour,
        });
    }
    if v.size_gib > policy.max_gib {
        return refuse(VolumeRefusal::TooLarge {
            max_gib: policy.max_gib,
        });
    }
    if t.duration_s > policy.max_keep_s {
        return refuse(VolumeRefusal::KeepTooLong {
            max_s: policy.max_keep_s,
        });
    }
    let mismatch = |f: &str| RejectReason::TermsMismatch {
        field: f.to_string(),
    };
    // Kept storage is billed to the second it is kept: no minimum. (The channel's terms,
    // interval, pay-ahead window and grace, are checked as any lease's: `crate::terms`.)
    if t.min_billed_s != 0 {
        return Err(mismatch("min_billed_s"));
    }
    if !t
        .per_gpu
        .fits_within(&gridlease_protocol::ResourcesPerGpu::default())
    {
        return Err(mismatch("per_gpu"));
    }
    // At least one second of the volume must be payable.
    let one_second = crate::billing::cost(
        1,
        gib_units(v),
        crate::Money::from_micros(v.price_per_gib_hour),
    )
    .map_err(|_| RejectReason::Malformed {
        detail: "price overflows".into(),
    })?;
    if t.max_total == 0 || t.max_total < one_second.micros() {
        return Err(RejectReason::BudgetTooSmall {
            needed: one_second.micros().max(1),
        });
    }
    Ok(())
}

/// The units a volume's tariff counts: its GiB (at most `MAX_VOLUME_GIB`, which fits).
pub fn gib_units(v: &VolumeTerms) -> u16 {
    u16::try_from(v.size_gib).unwrap_or(u16::MAX)
}

/// The cost of keeping `size_gib` for `keep_s` seconds at `price_per_gib_hour`: the budget a
/// volume lease prepaid for its whole keep period needs.
pub fn keep_cost(
    size_gib: u32,
    keep_s: u32,
    price_per_gib_hour: u64,
) -> Result<crate::Money, crate::MoneyError> {
    crate::billing::cost(
        u64::from(keep_s),
        u16::try_from(size_gib).map_err(|_| crate::MoneyError::Overflow)?,
        crate::Money::from_micros(price_per_gib_hour),
    )
}

/// A volume refusal in words (the renter's error message).
pub fn refusal_text(r: &VolumeRefusal) -> String {
    match r {
        VolumeRefusal::NotOffered => {
            "this provider keeps no volumes (its offer's volume price is 0)".into()
        }
        VolumeRefusal::TooLarge { max_gib } => {
            format!("larger than this provider's largest volume ({max_gib} GiB)")
        }
        VolumeRefusal::KeepTooLong { max_s } => {
            format!("a keep period longer than this provider's longest ({max_s} s)")
        }
        VolumeRefusal::NoSpace { free_gib } => {
            format!("this provider has only {free_gib} GiB free for volumes now")
        }
        VolumeRefusal::TooMany { max } => {
            format!("this provider keeps its most volumes already ({max})")
        }
        VolumeRefusal::NameTaken => {
            "you have a volume of this name on this provider already".into()
        }
        VolumeRefusal::NotYours { volume } => format!(
            "volume {} is not a running volume of yours on this provider",
            short(volume)
        ),
        VolumeRefusal::InUse { volume } => format!(
            "volume {} is mounted in another lease now (one lease at a time)",
            short(volume)
        ),
        VolumeRefusal::EndsTooSoon { volume } => format!(
            "volume {}'s keep period ends before this lease would: extend it first (volume extend)",
            short(volume)
        ),
        VolumeRefusal::NotAdoptable { lease } => format!(
            "lease {} is not a running lease of yours on this provider with a /workspace of its own, or its disk is being kept already",
            short(lease)
        ),
    }
}

fn short(id: &gridlease_protocol::LeaseId) -> String {
    id.to_string().chars().take(12).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::{Decision, ProviderChannel, RenterChannel};
    use crate::{Money, Tariff};
    use gridlease_protocol::fixtures::{self, T0};
    use gridlease_protocol::{NodeKey, OfferId, PREPAY_ALL, VolumePolicy};
    use proptest::prelude::*;

    /// An offer keeping volumes, and volume terms on it.
    fn volume_terms(size_gib: u32, price: u64, keep_s: u32, prepay_s: u32) -> (Offer, LeaseTerms) {
        let p = NodeKey::from_secret([7; 32]);
        let r = NodeKey::from_secret([8; 32]);
        let mut offer = fixtures::offer(p.public(), 1, 2, 400_000);
        offer.sandbox.volumes = VolumePolicy {
            price_per_gib_hour: 1_000,
            max_gib: 100_000,
            max_keep_s: 30 * 86_400,
        };
        let mut t = fixtures::volume_terms(
            OfferId(gridlease_protocol::Digest([1; 32])),
            &offer,
            r.public(),
            "data",
            size_gib,
            price,
            keep_s,
        );
        t.prepay_s = prepay_s;
        t.max_total = keep_cost(size_gib, keep_s, price).unwrap().micros().max(1);
        (offer, t)
    }

    #[test]
    fn a_volume_is_billed_per_second_of_kept_gib() {
        let (_, t) = volume_terms(50, 10_000, 7 * 86_400, 0);
        let tariff = Tariff::of(&t);
        // 50 GiB at 0.01/GiB-hour: 0.5 an hour, 0.000138 a second (floored per whole second).
        assert_eq!(tariff.due(3_600_000).unwrap(), Money::from_micros(500_000));
        assert_eq!(tariff.due(1_000).unwrap(), Money::from_micros(138));
        assert_eq!(tariff.due(999).unwrap(), Money::ZERO);
        // No minimum: kept storage is billed to the second.
        assert_eq!(tariff.final_due(1_000).unwrap(), Money::from_micros(138));
        assert_eq!(t.workspace_bytes(), 50 << 30);
        // The whole keep period is the budget here.
        assert_eq!(
            tariff.due(u64::from(t.duration_s) * 1000).unwrap().micros(),
            t.max_total
        );
    }

    #[test]
    fn the_offer_decides_price_size_keep_and_channel_terms() {
        let (offer, t) = volume_terms(50, 1_000, 86_400, 0);
        let v = t.volume.clone().unwrap();
        assert_eq!(check_volume_terms(&offer, &t, &v), Ok(()));
        let mut none = offer.clone();
        none.sandbox.volumes = VolumePolicy::default();
        assert_eq!(
            check_volume_terms(&none, &t, &v),
            Err(RejectReason::VolumeRefused {
                refusal: VolumeRefusal::NotOffered
            })
        );
        let mut cheap = v.clone();
        cheap.price_per_gib_hour = 999;
        assert_eq!(
            check_volume_terms(&offer, &t, &cheap),
            Err(RejectReason::PriceBelowAsk { ask: 1_000 })
        );
        let mut small = offer.clone();
        small.sandbox.volumes.max_gib = 10;
        assert_eq!(
            check_volume_terms(&small, &t, &v),
            Err(RejectReason::VolumeRefused {
                refusal: VolumeRefusal::TooLarge { max_gib: 10 }
            })
        );
        let mut short = offer.clone();
        short.sandbox.volumes.max_keep_s = 3_600;
        assert_eq!(
            check_volume_terms(&short, &t, &v),
            Err(RejectReason::VolumeRefused {
                refusal: VolumeRefusal::KeepTooLong { max_s: 3_600 }
            })
        );
        let mut min = t.clone();
        min.min_billed_s = 60;
        assert!(matches!(
            check_volume_terms(&offer, &min, &v),
            Err(RejectReason::TermsMismatch { .. })
        ));
        let mut broke = t.clone();
        broke.max_total = 0;
        assert!(matches!(
            check_volume_terms(&offer, &broke, &v),
            Err(RejectReason::BudgetTooSmall { .. })
        ));
    }

    #[test]
    fn a_volume_lease_carries_nothing_of_a_container() {
        use gridlease_protocol::Shape;
        let (_, t) = volume_terms(5, 1_000, 3_600, 0);
        assert!(t.check_shape().is_ok());
        let mut gpus = t.clone();
        gpus.gpu_count = 1;
        assert!(gpus.check_shape().is_err());
        let mut image = t.clone();
        image.image = "x".into();
        assert!(image.check_shape().is_err());
        let mut name = t.clone();
        name.volume.as_mut().unwrap().name = "../etc".into();
        assert!(name.check_shape().is_err());
        let mut huge = t.clone();
        huge.volume.as_mut().unwrap().size_gib = 70_000;
        assert!(huge.check_shape().is_err());
    }

    proptest! {
        /// For any size, price, keep period and prepay, and any interleaving of reports,
        /// losses and silence: the renter never pays more than the storage it was shown plus
        /// what it pre-authorised; the provider, following `decide`, never keeps the volume
        /// with more than one window unpaid; the settlement is at most what was paid and what
        /// the last report claims; nothing is billed past the keep period.
        #[test]
        fn volume_exposure_is_bounded_on_both_sides(
            size_gib in 1u32..4_096,
            price in 1u64..200_000,
            keep_s in 60u32..30 * 86_400,
            prepay in prop_oneof![Just(0u32), 1u32..7_200, Just(PREPAY_ALL)],
            plan in proptest::collection::vec((100u64..600_000, any::<bool>(), any::<bool>()), 1..60),
        ) {
            let (_, t) = volume_terms(size_gib, price, keep_s, prepay);
            let id = t.lease_id().unwrap();
            let tariff = Tariff::of(&t);
            let (provider_key, renter_key) = (t.provider, t.renter);
            let mut renter = RenterChannel::new(id, t.clone());
            let mut provider = ProviderChannel::new(id, &t, T0);
            let (mut now, mut wall, mut seq) = (T0, 0u64, 0u64);
            let mut last = None;
            for (dt, lost, away) in plan {
                now = now.plus_ms(dt);
                wall = (wall + dt).min(tariff.max_wall_ms);
                if let Decision::Stop(_) = provider.decide(wall, now).unwrap() {
                    break;
                }
                prop_assert!(provider.unpaid_exposure(wall).unwrap() <= provider.exposure_bound().unwrap());
                seq += 1;
                let mut u = fixtures::usage(id, seq, wall, 0);
                u.amount_due = tariff.due(wall).unwrap().micros();
                last = Some(u.clone());
                if lost || away {
                    continue;
                }
                if let Some(r) = renter.on_usage(&u, &provider_key, now.ms_since(T0), now).unwrap() {
                    let shown = tariff.due(wall).unwrap();
                    prop_assert!(renter.paid() <= tariff.receipt_total(shown));
                    prop_assert!(renter.paid().micros() <= t.max_total);
                    provider.accept_receipt(&renter_key, &r, now).unwrap();
                } else {
                    provider.heard_from_renter(now);
                }
            }
            let settled = provider.settlement(last.as_ref());
            prop_assert!(settled <= provider.paid());
            if let Some(u) = &last {
                prop_assert!(settled.micros() <= u.amount_due);
                prop_assert!(u.amount_due <= keep_cost(size_gib, keep_s, price).unwrap().micros());
            }
        }
    }
}
