//! Feeds arbitrary receipt sequences (16 bytes each: seq, total) and arbitrary signed receipt
//! bytes to a provider's payment channel. Invariants: accepted receipts strictly increase in seq
//! and total, never exceed the budget, and what was booked equals the final statement.
#![no_main]

use gridlease_contracts::{Money, ProviderChannel};
use gridlease_protocol::fixtures::{self, T0};
use gridlease_protocol::{Digest, NetworkId, NodeKey, OfferId, PaymentReceipt, Signed};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let provider = NodeKey::from_secret([1; 32]);
    let renter = NodeKey::from_secret([2; 32]);
    let offer = fixtures::offer(provider.public(), 1, 1, 3_600_000);
    let terms = fixtures::terms(OfferId(Digest([3; 32])), &offer, renter.public(), 1, 600);
    let id = terms.lease_id().expect("fixture terms encode");
    let mut ch = ProviderChannel::new(id, &terms, T0);
    let mut booked = Money::ZERO;
    let mut last: Option<PaymentReceipt> = None;

    // Arbitrary bytes as a signed receipt: verification then the channel.
    if let Ok(signed) = Signed::<PaymentReceipt>::from_bytes(data)
        && let Ok(v) = signed.verify(&NetworkId::devnet())
        && let Ok(d) = ch.accept_receipt(&v.signer, &v.message, T0)
    {
        booked = booked.checked_add(d).expect("no overflow");
        last = Some(v.message);
    }

    for chunk in data.chunks_exact(16) {
        let seq = u64::from_le_bytes(chunk[..8].try_into().expect("8 bytes"));
        let total = u64::from_le_bytes(chunk[8..].try_into().expect("8 bytes"));
        let r = fixtures::receipt(id, seq, total, 0);
        if let Ok(d) = ch.accept_receipt(&renter.public(), &r, T0) {
            if let Some(prev) = &last {
                assert!(r.seq > prev.seq && r.total_paid > prev.total_paid);
            }
            assert!(r.total_paid <= terms.max_total);
            booked = booked.checked_add(d).expect("no overflow");
            last = Some(r);
        }
    }
    assert_eq!(booked, ch.paid());
});
