//! Property tests over every wire message: round trips, tamper detection, domain and network
//! separation, hostile bytes.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::collections::BTreeMap;

use gridlease_protocol::codec::{self, CodecError};
use gridlease_protocol::envelope::{Envelope, MessageKind, signing_input};
use gridlease_protocol::*;
use proptest::prelude::*;

fn text(max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(any::<char>(), 0..max).prop_map(|v| v.into_iter().collect())
}

fn digest() -> impl Strategy<Value = Digest> {
    any::<[u8; 32]>().prop_map(Digest)
}

fn ts() -> impl Strategy<Value = Timestamp> {
    any::<u64>().prop_map(Timestamp)
}

fn public_key() -> impl Strategy<Value = PublicKey> {
    any::<[u8; 32]>().prop_map(PublicKey)
}

fn network() -> impl Strategy<Value = NetworkId> {
    "[a-z0-9-]{1,32}".prop_map(|s| NetworkId::new(&s).unwrap())
}

fn attestation() -> impl Strategy<Value = Attestation> {
    prop_oneof![Just(Attestation::Measured), Just(Attestation::Declared)]
}

fn bench() -> impl Strategy<Value = BenchReport> {
    (
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        text(16),
        ts(),
        attestation(),
    )
        .prop_map(
            |(a, b, c, d, tool_version, measured_at, attestation)| BenchReport {
                fp32_gflops: a,
                fp16_gflops: b,
                device_mem_mbps: c,
                h2d_mbps: d,
                tool_version,
                measured_at,
                attestation,
            },
        )
}

fn gpu() -> impl Strategy<Value = OfferedGpu> {
    (
        text(20),
        any::<u32>(),
        digest(),
        any::<(u8, u8)>(),
        text(10),
        text(10),
        any::<(u8, u8, u32)>(),
        bench(),
    )
        .prop_map(
            |(
                model,
                vram_mib,
                uuid_digest,
                (major, minor),
                driver_version,
                cuda_version,
                (g, w, p),
                bench,
            )| {
                OfferedGpu {
                    spec: GpuSpec {
                        model,
                        vram_mib,
                        uuid_digest,
                        compute_capability: ComputeCapability { major, minor },
                        driver_version,
                        cuda_version,
                        pcie_gen: g,
                        pcie_width: w,
                        power_limit_w: p,
                    },
                    bench,
                }
            },
        )
}

fn resources() -> impl Strategy<Value = ResourcesPerGpu> {
    any::<(u32, u32, u32, u32)>().prop_map(|(a, b, c, d)| ResourcesPerGpu {
        cpu_millicores: a,
        ram_mib: b,
        disk_gib: c,
        net_mbps: d,
    })
}

fn net_policy() -> impl Strategy<Value = NetworkPolicy> {
    prop_oneof![Just(NetworkPolicy::None), Just(NetworkPolicy::Egress)]
}

fn chain_terms() -> impl Strategy<Value = gridlease_protocol::wallet::ChainTerms> {
    (any::<u64>(), any::<[u8; 20]>(), 6u8..=24, any::<[u8; 20]>()).prop_map(
        |(chain_id, token, token_decimals, channel_contract)| {
            gridlease_protocol::wallet::ChainTerms {
                chain_id,
                token,
                token_decimals,
                channel_contract,
            }
        },
    )
}

fn wallet_binding() -> impl Strategy<Value = gridlease_protocol::wallet::WalletBinding> {
    (
        any::<[u8; 20]>(),
        proptest::collection::vec(any::<u8>(), 65..=65),
    )
        .prop_map(
            |(address, possession)| gridlease_protocol::wallet::WalletBinding {
                address,
                possession,
            },
        )
}

fn offer() -> impl Strategy<Value = Offer> {
    (
        (
            public_key(),
            any::<u64>(),
            ts(),
            ts(),
            proptest::collection::vec(gpu(), 0..4),
        ),
        (
            resources(),
            any::<u64>(),
            any::<(u32, u32, u32, u32, u32)>(),
        ),
        (
            net_policy(),
            proptest::collection::vec(text(12), 0..3),
            proptest::collection::vec(text(30), 0..3),
            text(8),
            proptest::option::of((chain_terms(), wallet_binding())),
        ),
    )
        .prop_map(
            |(
                (provider, seq, created_at, expires_at, gpus),
                (per_gpu, price, d),
                (network, image_prefixes, addrs, region, settlement),
            )| Offer {
                proof: Default::default(),
                provider,
                seq,
                created_at,
                expires_at,
                gpus,
                per_gpu,
                price_per_gpu_hour: price,
                min_duration_s: d.0,
                max_duration_s: d.1,
                min_billed_s: d.2,
                usage_interval_s: d.3,
                pay_ahead_s: d.4,
                sandbox: SandboxPolicy {
                    volumes: gridlease_protocol::VolumePolicy::default(),
                    network,
                    image_prefixes,
                    access: gridlease_protocol::access::AccessPolicy::ALL,
                    isolation: gridlease_protocol::Isolation::Runc,
                    output_retention_s: 0,
                    upload_hold_s: 0,
                    registries: vec!["docker.io".into()],
                    local_images: Vec::new(),
                },
                free_gpus: 0,
                interruptible: seq % 2 == 1,
                settlement: settlement.map(|(chain, wallet)| {
                    gridlease_protocol::wallet::OfferSettlement { chain, wallet }
                }),
                addrs,
                region,
            },
        )
}

fn terms() -> impl Strategy<Value = LeaseTerms> {
    (
        (
            network(),
            digest(),
            any::<u64>(),
            public_key(),
            public_key(),
            any::<u16>(),
            resources(),
        ),
        (
            any::<u64>(),
            any::<(u32, u32, u32, u32, u32)>(),
            any::<u64>(),
            net_policy(),
        ),
        (
            text(30),
            proptest::collection::vec(text(12), 0..5),
            proptest::collection::btree_map(text(8), text(12), 0..4),
        ),
        (
            any::<u64>(),
            ts(),
            proptest::option::of((
                chain_terms(),
                wallet_binding(),
                any::<[u8; 20]>(),
                any::<u64>(),
            )),
        ),
    )
        .prop_map(
            |(
                (network, offer, offer_seq, provider, renter, gpu_count, per_gpu),
                (price, d, max_total, network_policy),
                (image, command, env),
                (nonce, created_at, settlement),
            )| {
                LeaseTerms {
                    volume: None,
                    mounts: Vec::new(),
                    verify_window_s: 0,
                    settlement: settlement.map(|(chain, renter_wallet, provider_wallet, epoch)| {
                        gridlease_protocol::wallet::LeaseSettlement {
                            chain,
                            renter_wallet,
                            provider_wallet,
                            epoch,
                        }
                    }),
                    network,
                    offer_id: OfferId(offer),
                    offer_seq,
                    provider,
                    renter,
                    gpu_count,
                    per_gpu,
                    price_per_gpu_hour: price,
                    duration_s: d.0,
                    min_billed_s: d.1,
                    usage_interval_s: d.2,
                    pay_ahead_s: d.3,
                    grace_s: d.4,
                    max_total,
                    network_policy,
                    image,
                    command,
                    env: env.into_iter().collect::<BTreeMap<_, _>>(),
                    nonce,
                    created_at,
                    output_retention_s: d.4,
                    upload_hold_s: d.4 / 2,
                    prepay_s: d.4 / 3,
                }
            },
        )
}

fn reject_reason() -> impl Strategy<Value = RejectReason> {
    prop_oneof![
        Just(RejectReason::UnknownOffer),
        any::<u64>().prop_map(|current_seq| RejectReason::StaleOffer { current_seq }),
        Just(RejectReason::OfferExpired),
        Just(RejectReason::HoldBusy),
        any::<u64>().prop_map(|free_gib| RejectReason::VolumeRefused {
            refusal: gridlease_protocol::VolumeRefusal::NoSpace { free_gib }
        }),
        any::<[u8; 32]>().prop_map(|d| RejectReason::VolumeRefused {
            refusal: gridlease_protocol::VolumeRefusal::NotYours {
                volume: gridlease_protocol::LeaseId(gridlease_protocol::Digest(d))
            }
        }),
        any::<[u8; 32]>().prop_map(|d| RejectReason::VolumeRefused {
            refusal: gridlease_protocol::VolumeRefusal::NotAdoptable {
                lease: gridlease_protocol::LeaseId(gridlease_protocol::Digest(d))
            }
        }),
        Just(RejectReason::RequestExpired),
        Just(RejectReason::WrongProvider),
        any::<u64>().prop_map(|ask| RejectReason::PriceBelowAsk { ask }),
        any::<u16>().prop_map(|free| RejectReason::NoCapacity { free }),
        any::<(u32, u32)>()
            .prop_map(|(min_s, max_s)| RejectReason::DurationOutOfBounds { min_s, max_s }),
        text(20).prop_map(|field| RejectReason::TermsMismatch { field }),
        Just(RejectReason::ImageRefused {
            refusal: ImageRefusal::BareId
        }),
        text(20).prop_map(|detail| RejectReason::ImageRefused {
            refusal: ImageRefusal::Unavailable { detail }
        }),
        (text(8), text(8)).prop_map(|(needs, host)| RejectReason::ImageRefused {
            refusal: ImageRefusal::CudaTooNew { needs, host }
        }),
        text(20).prop_map(|name| RejectReason::EnvNotAllowed { name }),
        Just(RejectReason::NetworkNotAllowed),
        any::<u64>().prop_map(|needed| RejectReason::BudgetTooSmall { needed }),
        Just(RejectReason::DuplicateNonce),
        text(20).prop_map(|detail| RejectReason::Malformed { detail }),
        Just(RejectReason::Internal),
    ]
}

fn close_reason() -> impl Strategy<Value = CloseReason> {
    prop_oneof![
        Just(CloseReason::Expired),
        Just(CloseReason::RenterStop),
        Just(CloseReason::ProviderStop),
        Just(CloseReason::OwnerReclaimed),
        Just(CloseReason::ContainerExited),
        Just(CloseReason::PaymentLagging),
        Just(CloseReason::RenterUnreachable),
        Just(CloseReason::ProviderUnreachable),
        Just(CloseReason::ImplausibleUsage),
        Just(CloseReason::BadReceipt),
        Just(CloseReason::BudgetExhausted),
        Just(CloseReason::StartFailed),
    ]
}

fn usage() -> impl Strategy<Value = UsageReport> {
    (
        (digest(), any::<u64>(), ts(), ts()),
        any::<(u64, u64, u64, u64, u64, u64)>(),
        (
            any::<u16>(),
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            any::<Option<i32>>(),
        ),
    )
        .prop_map(
            |((id, seq, a, b), m, (util, vram, mem, due, exit_code))| UsageReport {
                lease_id: LeaseId(id),
                seq,
                interval_start: a,
                interval_end: b,
                wall_ms: m.0,
                gpu_ms: m.1,
                cpu_ms: m.2,
                energy_mj: m.3,
                net_rx_bytes: m.4,
                net_tx_bytes: m.5,
                gpu_util_permille: util,
                vram_peak_mib: vram,
                mem_peak_mib: mem,
                amount_due: due,
                exit_code,
            },
        )
}

fn receipt() -> impl Strategy<Value = PaymentReceipt> {
    (
        digest(),
        any::<(u64, u64, u64, u64)>(),
        ts(),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 65..=65)),
    )
        .prop_map(
            |(id, (seq, total, covers, useq), issued_at, voucher)| PaymentReceipt {
                lease_id: LeaseId(id),
                seq,
                total_paid: total,
                covers_wall_ms: covers,
                usage_seq: useq,
                issued_at,
                voucher,
            },
        )
}

fn amendment() -> impl Strategy<Value = LeaseAmendment> {
    (digest(), any::<(u64, u32, u64)>(), ts()).prop_map(
        |(id, (seq, duration_s, max_total), created_at)| LeaseAmendment {
            lease_id: LeaseId(id),
            seq,
            duration_s,
            max_total,
            created_at,
        },
    )
}

/// Round trip through the codec and through a signed envelope, then decode exactly.
fn round_trip<T: WireMessage + PartialEq + std::fmt::Debug + Clone>(
    msg: &T,
) -> Result<(), TestCaseError> {
    let bytes = msg
        .encode_payload()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&T::decode_payload(&bytes).unwrap(), msg);
    let key = NodeKey::from_secret([7; 32]);
    let net = NetworkId::devnet();
    let signed = Signed::sign(&key, &net, msg).unwrap();
    let wire = signed.to_bytes().unwrap();
    let back = Signed::<T>::from_bytes(&wire).unwrap();
    let v = back.verify(&net).unwrap();
    prop_assert_eq!(&v.message, msg);
    prop_assert_eq!(v.signer, key.public());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn offers_round_trip(m in offer()) { round_trip(&m)?; }

    #[test]
    fn lease_requests_round_trip(terms in terms(), expires_at in ts()) {
        round_trip(&LeaseRequest { terms, expires_at })?;
    }

    #[test]
    fn lease_accepts_round_trip(terms in terms(), gpus in proptest::collection::vec(digest(), 0..4), at in ts()) {
        let lease_id = terms.lease_id().unwrap();
        round_trip(&LeaseAccept { lease_id, terms, gpus, accepted_at: at })?;
    }

    #[test]
    fn lease_rejects_round_trip(id in digest(), nonce in any::<u64>(), reason in reject_reason(), at in ts()) {
        round_trip(&LeaseReject { lease_id: LeaseId(id), nonce, reason, at })?;
    }

    #[test]
    fn usage_reports_round_trip(m in usage()) { round_trip(&m)?; }

    #[test]
    fn receipts_round_trip(m in receipt()) { round_trip(&m)?; }

    #[test]
    fn closes_round_trip(id in digest(), reason in close_reason(), at in ts(), exit_code in any::<Option<i32>>(), detail in proptest::option::of(text(40))) {
        let failure = detail.map(|message| StartFailure::new(StartFailureKind::ImagePull, message));
        round_trip(&LeaseClose { lease_id: LeaseId(id), reason, at, exit_code, failure })?;
    }

    #[test]
    fn bench_reports_round_trip(m in bench()) { round_trip(&m)?; }

    #[test]
    fn amendments_round_trip(m in amendment()) { round_trip(&m)?; }

    #[test]
    fn amendment_acceptances_round_trip(amendment in amendment(), deadline in ts(), accepted_at in ts()) {
        round_trip(&AmendAccept { amendment, deadline, accepted_at })?;
    }

    /// Flipping any single bit of a signed envelope's bytes makes it fail: either it no longer
    /// decodes, or it fails verification, or (a bit in a field the signature covers) verify fails.
    #[test]
    fn any_single_bit_flip_is_detected(m in receipt(), bit in any::<prop::sample::Index>()) {
        let key = NodeKey::from_secret([3; 32]);
        let net = NetworkId::devnet();
        let wire = Signed::sign(&key, &net, &m).unwrap().to_bytes().unwrap();
        let mut bad = wire.clone();
        let i = bit.index(bad.len() * 8);
        bad[i / 8] ^= 1 << (i % 8);
        let outcome = Signed::<PaymentReceipt>::from_bytes(&bad).and_then(|s| s.verify(&net));
        prop_assert!(outcome.is_err(), "flip of bit {} accepted", i);
    }

    /// Same, over an offer: large payload, every bit position possible.
    #[test]
    fn any_single_bit_flip_in_an_offer_is_detected(m in offer(), bit in any::<prop::sample::Index>()) {
        let key = NodeKey::from_secret([3; 32]);
        let net = NetworkId::devnet();
        let wire = Signed::sign(&key, &net, &m).unwrap().to_bytes().unwrap();
        let mut bad = wire.clone();
        let i = bit.index(bad.len() * 8);
        bad[i / 8] ^= 1 << (i % 8);
        let outcome = Signed::<Offer>::from_bytes(&bad).and_then(|s| s.verify(&net));
        prop_assert!(outcome.is_err(), "flip of bit {} accepted", i);
        // The in-place path, with the genuine frame already in the dedup cache: a flipped
        // variant is never taken for the verified one.
        let mut cache = VerifyCache::new(4, 4);
        prop_assert!(Signed::<Offer>::verify_frame(&wire, &net, &mut cache).is_ok());
        let outcome = Signed::<Offer>::verify_frame(&bad, &net, &mut cache);
        prop_assert!(outcome.is_err(), "flip of bit {} accepted in place", i);
    }

    /// The in-place frame path and the owned path agree on every input: same message, or both
    /// refuse with the same error. Inputs: valid frames with any one byte replaced.
    #[test]
    fn frame_and_owned_verification_agree(m in offer(), at in any::<prop::sample::Index>(), byte in any::<u8>(), other_net in network()) {
        let key = NodeKey::from_secret([3; 32]);
        let net = NetworkId::devnet();
        for signed_for in [&net, &other_net] {
            let mut wire = Signed::sign(&key, signed_for, &m).unwrap().to_bytes().unwrap();
            if signed_for == &net {
                let framed = Signed::<Offer>::verify_frame(&wire, &net, &mut VerifyCache::new(1, 1));
                prop_assert_eq!(&framed.unwrap().message, &m);
            }
            let i = at.index(wire.len());
            wire[i] = byte;
            let owned = Signed::<Offer>::from_bytes(&wire)
                .and_then(|s| s.verify_with(&net, &mut VerifyCache::new(1, 1)));
            let framed = Signed::<Offer>::verify_frame(&wire, &net, &mut VerifyCache::new(1, 1));
            match (owned, framed) {
                (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
                (Err(a), Err(b)) => prop_assert_eq!(
                    std::mem::discriminant(&a),
                    std::mem::discriminant(&b),
                    "{} vs {}", a, b
                ),
                (a, b) => prop_assert!(false, "owned {:?} but in place {:?}", a.is_ok(), b.is_ok()),
            }
        }
    }

    /// A message signed for another network id is rejected, even if relabelled.
    #[test]
    fn other_network_ids_are_rejected(m in receipt(), a in network(), b in network()) {
        prop_assume!(a != b);
        let key = NodeKey::from_secret([4; 32]);
        let signed = Signed::sign(&key, &a, &m).unwrap();
        let wrong = matches!(signed.verify(&b), Err(EnvelopeError::WrongNetwork { .. }));
        prop_assert!(wrong, "not refused as wrong network");
        let mut env = signed.into_envelope();
        env.network = b.clone();
        let relabelled = Signed::<PaymentReceipt>::from_envelope(env);
        let bad_sig = matches!(relabelled.verify(&b), Err(EnvelopeError::BadSignature { .. }));
        prop_assert!(bad_sig, "relabelled network accepted");
    }

    /// A signature made under one domain tag never verifies under another: a receipt cannot be
    /// passed off as a close, even with identical payload bytes.
    #[test]
    fn other_domain_tags_are_rejected(payload in proptest::collection::vec(any::<u8>(), 0..200)) {
        let key = NodeKey::from_secret([5; 32]);
        let net = NetworkId::devnet();
        let kinds = [
            MessageKind::Offer, MessageKind::LeaseRequest, MessageKind::LeaseAccept,
            MessageKind::LeaseReject, MessageKind::UsageReport, MessageKind::PaymentReceipt,
            MessageKind::LeaseClose, MessageKind::BenchReport, MessageKind::LeaseAmendment,
            MessageKind::AmendAccept, MessageKind::Completion, MessageKind::CompletionAck,
        ];
        let sig = ed25519_sign([5; 32], MessageKind::PaymentReceipt, &net, &payload);
        for kind in kinds {
            let env = Envelope {
                version: PROTOCOL_VERSION,
                kind,
                network: net.clone(),
                signer: key.public(),
                signature: sig,
                payload: payload.clone(),
            };
            let forged = Signed::<LeaseClose>::from_envelope(env);
            // Either the kind check or the signature check must refuse it.
            prop_assert!(forged.verify(&net).is_err());
        }
    }

    /// Any bytes at all: decoding never panics and never yields trailing garbage.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = Signed::<Offer>::from_bytes(&bytes).map(|s| s.verify(&NetworkId::devnet()));
        let _ = Signed::<Offer>::verify_frame(&bytes, &NetworkId::devnet(), &mut VerifyCache::new(1, 1));
        let _ = Offer::decode_payload(&bytes);
        let _ = LeaseRequest::decode_payload(&bytes);
        let _ = UsageReport::decode_payload(&bytes);
        let _ = PaymentReceipt::decode_payload(&bytes);
    }
}

/// Signs `payload` under `kind`'s domain tag with the raw secret, following the documented
/// signing input (used to forge cross-domain envelopes and to check the documented layout).
fn ed25519_sign(
    secret: [u8; 32],
    kind: MessageKind,
    net: &NetworkId,
    payload: &[u8],
) -> gridlease_protocol::envelope::SignatureBytes {
    use ed25519_dalek::Signer;
    let input = signing_input(kind, net, payload);
    let sig = ed25519_dalek::SigningKey::from_bytes(&secret).sign(&input);
    gridlease_protocol::envelope::SignatureBytes(sig.to_bytes())
}

#[test]
fn signing_input_is_what_the_envelope_signs() {
    // A hand-made signature over the documented signing input verifies: the layout in the docs
    // is the layout in the code.
    let key = NodeKey::from_secret([9; 32]);
    let net = NetworkId::devnet();
    let msg = fixtures::receipt(LeaseId(Digest([1; 32])), 1, 100, 1000);
    let payload = msg.encode_payload().unwrap();
    let env = Envelope {
        version: PROTOCOL_VERSION,
        kind: MessageKind::PaymentReceipt,
        network: net.clone(),
        signer: key.public(),
        signature: ed25519_sign([9; 32], MessageKind::PaymentReceipt, &net, &payload),
        payload,
    };
    assert_eq!(
        Signed::<PaymentReceipt>::from_envelope(env)
            .verify(&net)
            .unwrap()
            .message,
        msg
    );
}

#[test]
fn hostile_length_prefixes_and_truncation_are_errors() {
    // An envelope whose payload length claims 2^60 bytes.
    let mut bytes = vec![1, 0]; // version 1 (varint), kind 0
    bytes.extend([6]);
    bytes.extend(b"devnet");
    bytes.push(32); // signer: length-prefixed 32 bytes
    bytes.extend([0u8; 32]);
    bytes.push(64); // signature: length-prefixed 64 bytes
    bytes.extend([0u8; 64]);
    bytes.push(0xFD);
    bytes.extend((1u64 << 60).to_le_bytes());
    let err = Envelope::from_bytes(&bytes, MessageKind::Offer).unwrap_err();
    assert!(
        matches!(&err, EnvelopeError::Codec { source, .. } if source.is_limit()),
        "{err}"
    );
    // The in-place decoder refuses it the same way (nothing to copy, nothing allocated).
    let err =
        Signed::<Offer>::verify_frame(&bytes, &NetworkId::devnet(), &mut VerifyCache::new(1, 1))
            .unwrap_err();
    assert!(
        matches!(&err, EnvelopeError::Codec { source, .. } if source.is_limit()),
        "{err}"
    );
    // The same prefix with a small payload length decodes up to the payload: the bytes above
    // are a well-formed envelope header, so the errors above are about the length claim.
    let mut ok_len = bytes[..bytes.len() - 9].to_vec();
    ok_len.push(0);
    assert!(Envelope::from_bytes(&ok_len, MessageKind::Offer).is_ok());

    // Every truncation of a valid signed offer is an error, never a panic.
    let key = NodeKey::from_secret([1; 32]);
    let offer = fixtures::offer(key.public(), 1, 2, 100);
    let wire = Signed::sign(&key, &NetworkId::devnet(), &offer)
        .unwrap()
        .to_bytes()
        .unwrap();
    let net = NetworkId::devnet();
    for cut in 0..wire.len() {
        assert!(
            Signed::<Offer>::from_bytes(&wire[..cut]).is_err(),
            "cut {cut}"
        );
        assert!(
            Signed::<Offer>::verify_frame(&wire[..cut], &net, &mut VerifyCache::new(1, 1)).is_err(),
            "cut {cut}"
        );
    }
    // Trailing bytes.
    let mut long = wire.clone();
    long.push(0);
    assert!(Signed::<Offer>::from_bytes(&long).is_err());
    assert!(Signed::<Offer>::verify_frame(&long, &net, &mut VerifyCache::new(1, 1)).is_err());
    // Oversize input is refused before decoding.
    let huge = vec![0u8; MAX_OFFER_BYTES + 4096];
    let err = Signed::<Offer>::from_bytes(&huge).unwrap_err();
    assert!(
        matches!(
            err,
            EnvelopeError::Codec {
                source: CodecError::TooLarge { .. },
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn envelope_overhead_bounds_the_largest_envelope() {
    // Longest network id, largest version number, a payload at the cap: the frame still fits
    // `MAX_BYTES + ENVELOPE_OVERHEAD`, which transports use as their frame caps.
    let net = NetworkId::new(&"n".repeat(NetworkId::MAX_LEN)).unwrap();
    let env = Envelope {
        version: u16::MAX,
        kind: MessageKind::BenchReport,
        network: net,
        signer: NodeKey::from_secret([1; 32]).public(),
        signature: gridlease_protocol::envelope::SignatureBytes([0xFF; 64]),
        payload: vec![0xFF; MAX_OFFER_BYTES],
    };
    let len = env.to_bytes().unwrap().len();
    assert!(
        len <= MAX_OFFER_BYTES + envelope::ENVELOPE_OVERHEAD,
        "{len} > {} + {}",
        MAX_OFFER_BYTES,
        envelope::ENVELOPE_OVERHEAD
    );
    assert!(len >= MAX_OFFER_BYTES + envelope::ENVELOPE_OVERHEAD - 2);
}

#[test]
fn oversize_payload_inside_a_valid_envelope_is_refused_before_verifying() {
    let key = NodeKey::from_secret([1; 32]);
    let net = NetworkId::devnet();
    let mut env = Signed::sign(
        &key,
        &net,
        &fixtures::receipt(LeaseId(Digest([1; 32])), 1, 1, 1),
    )
    .unwrap()
    .into_envelope();
    env.payload = vec![0; MAX_PAYMENT_RECEIPT_BYTES + 1];
    let err = Signed::<PaymentReceipt>::from_envelope(env)
        .verify(&net)
        .unwrap_err();
    assert!(
        matches!(
            err,
            EnvelopeError::Codec {
                source: CodecError::TooLarge { .. },
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn lease_terms_encoding_is_canonical() {
    // Same struct, same bytes, same id, however it was built (BTreeMap env: insertion order
    // does not matter).
    let key = NodeKey::from_secret([1; 32]);
    let offer = fixtures::offer(key.public(), 1, 2, 100);
    let mut a = fixtures::terms(OfferId(Digest([2; 32])), &offer, key.public(), 1, 60);
    let mut b = a.clone();
    a.env.insert("A".into(), "1".into());
    a.env.insert("B".into(), "2".into());
    b.env.insert("B".into(), "2".into());
    b.env.insert("A".into(), "1".into());
    assert_eq!(a.canonical_bytes().unwrap(), b.canonical_bytes().unwrap());
    assert_eq!(a.lease_id().unwrap(), b.lease_id().unwrap());
    let _ = codec::MAX_FRAME_BYTES;
}

/// The largest offer its shape check lets through (every list at its most, every string at its
/// longest, every integer at its widest) encodes within `MAX_OFFER_BYTES`: the image policy
/// the offer carries (registries, prefixes, local images) never makes a valid offer unsendable.
#[test]
fn the_largest_valid_offer_fits_its_cap() {
    use gridlease_protocol::{
        MAX_ADDR_LEN, MAX_GPUS_PER_OFFER, MAX_IMAGE_LEN, MAX_IMAGE_PREFIXES, MAX_MODEL_LEN,
        MAX_OFFER_ADDRS, MAX_OFFER_BYTES, MAX_OFFER_LOCAL_IMAGES, MAX_OFFER_REGISTRIES,
        MAX_REGION_LEN, MAX_REGISTRY_LEN, MAX_VERSION_LEN, Shape, fixtures,
    };
    let long = |n: usize| "x".repeat(n);
    let mut o = fixtures::offer(
        NodeKey::from_secret([1; 32]).public(),
        u64::MAX,
        1,
        u64::MAX,
    );
    let mut g = o.gpus[0].clone();
    g.spec.model = long(MAX_MODEL_LEN);
    g.spec.driver_version = long(MAX_VERSION_LEN);
    g.spec.cuda_version = long(MAX_VERSION_LEN);
    g.spec.vram_mib = u32::MAX;
    g.spec.power_limit_w = u32::MAX;
    g.bench.tool_version = long(MAX_VERSION_LEN);
    g.bench.fp32_gflops = u32::MAX;
    g.bench.fp16_gflops = u32::MAX;
    g.bench.device_mem_mbps = u32::MAX;
    g.bench.h2d_mbps = u32::MAX;
    g.bench.measured_at = Timestamp(u64::MAX);
    o.gpus = vec![g; MAX_GPUS_PER_OFFER];
    o.created_at = Timestamp(u64::MAX);
    o.expires_at = Timestamp(u64::MAX);
    o.per_gpu = ResourcesPerGpu {
        cpu_millicores: u32::MAX,
        ram_mib: u32::MAX,
        disk_gib: u32::MAX,
        net_mbps: u32::MAX,
    };
    o.min_duration_s = u32::MAX;
    o.max_duration_s = u32::MAX;
    o.min_billed_s = u32::MAX;
    o.usage_interval_s = u32::MAX;
    o.pay_ahead_s = u32::MAX;
    o.sandbox.image_prefixes = vec![long(MAX_IMAGE_LEN); MAX_IMAGE_PREFIXES];
    o.sandbox.registries = vec![long(MAX_REGISTRY_LEN); MAX_OFFER_REGISTRIES];
    o.sandbox.local_images = vec![long(MAX_IMAGE_LEN); MAX_OFFER_LOCAL_IMAGES];
    o.sandbox.output_retention_s = u32::MAX;
    o.sandbox.upload_hold_s = u32::MAX;
    o.addrs = vec![long(MAX_ADDR_LEN); MAX_OFFER_ADDRS];
    o.region = long(MAX_REGION_LEN);
    o.free_gpus = u16::MAX;
    o.check_shape().unwrap();
    let bytes = o.encode_payload().unwrap();
    assert!(
        bytes.len() <= MAX_OFFER_BYTES,
        "{} bytes > {MAX_OFFER_BYTES}",
        bytes.len()
    );
    eprintln!(
        "largest valid offer: {} of {MAX_OFFER_BYTES} bytes",
        bytes.len()
    );
}
