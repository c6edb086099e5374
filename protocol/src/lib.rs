//! gridlease wire vocabulary.
//!
//! What this crate is for: node identity ([`identity`]), signed envelopes ([`envelope`]), the one
//! codec ([`codec`]) and every message that crosses the network ([`messages`]).
//!
//! What it must never do: network or async I/O, read the clock, or decide market rules. The only
//! file it touches is the node's key file. Every decode is size-capped, every signature is
//! checked strictly over the exact received bytes before the payload is decoded.

pub mod access;
pub mod class;
pub mod codec;
pub mod completion;
pub mod envelope;
pub mod fixtures;
pub mod identity;
pub mod messages;
pub mod proof;
pub mod session;
pub mod shape;
pub mod statement;
pub mod sync;
pub mod telemetry;
pub mod text;
pub mod transfer;
pub mod types;
pub mod wallet;

pub use codec::CodecError;
pub use envelope::{
    Envelope, EnvelopeError, FrameView, KeyCache, MessageKind, NetworkId, PROTOCOL_VERSION,
    SignatureBytes, Signed, Verified, VerifyCache, VerifyStats, WireMessage,
};
pub use identity::{IdentityError, NodeKey, PeerId, PublicKey};
pub use messages::*;
pub use types::{Digest, LeaseId, OfferId, Timestamp};
