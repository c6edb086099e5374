//! Decodes arbitrary bytes as every wire message, as an envelope, and as a signed envelope of
//! every kind. Nothing may panic or allocate without bound; whatever decodes must re-encode to
//! a value that decodes to the same thing.
#![no_main]

use gridlease_protocol::*;
use libfuzzer_sys::fuzz_target;

fn payload<T: WireMessage + PartialEq + std::fmt::Debug>(data: &[u8]) {
    if let Ok(v) = T::decode_payload(data) {
        let again = v.encode_payload().expect("a decoded value re-encodes");
        assert_eq!(T::decode_payload(&again).expect("re-encoding decodes"), v);
    }
    if let Ok(signed) = Signed::<T>::from_bytes(data) {
        let _ = signed.verify(&NetworkId::devnet());
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
    let _ = Envelope::from_bytes(data, MessageKind::Offer);
});
