//! Decodes arbitrary bytes as every wire message, as an envelope, and as a signed envelope of
//! every kind (owned and in place, which must agree). Nothing may panic or allocate without bound; whatever decodes must re-encode to
//! a value that decodes to the same thing.
#![no_main]

use gridlease_protocol::*;
use libfuzzer_sys::fuzz_target;

fn payload<T: WireMessage + PartialEq + std::fmt::Debug>(data: &[u8]) {
    if let Ok(v) = T::decode_payload(data) {
        let again = v.encode_payload().expect("a decoded value re-encodes");
        assert_eq!(T::decode_payload(&again).expect("re-encoding decodes"), v);
    }
    let net = NetworkId::devnet();
    let owned = Signed::<T>::from_bytes(data)
        .and_then(|s| s.verify_with(&net, &mut VerifyCache::new(1, 1)));
    // The in-place decoder used for ingestion must agree with the owned one on every input.
    let in_place = Signed::<T>::verify_frame(data, &net, &mut VerifyCache::new(1, 1));
    match (owned, in_place) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(a), Err(b)) => assert_eq!(std::mem::discriminant(&a), std::mem::discriminant(&b)),
        (a, b) => panic!("owned ok={} but in place ok={}", a.is_ok(), b.is_ok()),
    }
}

fuzz_target!(|data: &[u8]| {
    payload::<Offer>(data);
    payload::<LeaseRequest>(data);
    payload::<LeaseAccept>(data);
    payload::<LeaseReject>(data);
    payload::<UsageReport>(data);
    payload::<PaymentReceipt>(data);
    payload::<LeaseClose>(data);
    payload::<BenchReport>(data);
    payload::<LeaseAmendment>(data);
    payload::<AmendAccept>(data);
    let _ = Envelope::from_bytes(data, MessageKind::Offer);
});
