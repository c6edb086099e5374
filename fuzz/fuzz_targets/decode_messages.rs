//! Decodes arbitrary bytes as every wire message (the access and transfer frames too), as an
//! envelope, and as a signed envelope of every kind (owned and in place, which must agree). Nothing may panic or allocate without bound; whatever decodes must re-encode to
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

/// An unsigned frame body (access and transfer frames): decodes under its cap, re-encodes to
/// the same value. Evaluates to the decoded value, if any.
macro_rules! frame {
    ($t:ty, $max:expr, $data:expr) => {{
        let v: Option<$t> = codec::decode::<$t, { $max }>($data).ok();
        if let Some(v) = &v {
            let again = codec::encode::<$t, { $max }>(v).expect("a decoded frame re-encodes");
            assert_eq!(
                &codec::decode::<$t, { $max }>(&again).expect("re-encoding decodes"),
                v
            );
        }
        v
    }};
}

fuzz_target!(|data: &[u8]| {
    // A decoded request's bound check never panics either.
    if let Some(r) = frame!(access::AccessRequest, access::MAX_REQUEST_FRAME, data) {
        let _ = r.check();
    }
    frame!(access::AccessReply, access::MAX_REPLY_FRAME, data);
    frame!(access::ExecInput, access::MAX_EXEC_FRAME, data);
    frame!(access::ExecOutput, access::MAX_EXEC_FRAME, data);
    frame!(transfer::TransferFrame, transfer::MAX_TRANSFER_FRAME, data);
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
