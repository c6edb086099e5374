//! The lease negotiation stream: `/gridlease/lease/1`, request-response with length-prefixed
//! bincode frames.
//!
//! Frame = 4-byte big-endian length + body (see `gridlease_protocol::codec::frame_header`).
//! The length is checked against the direction's cap *before* the body is allocated; the body is
//! decoded with the same cap and trailing bytes are refused. Signed payloads inside are verified
//! by the event loop (requests) or the client (responses), not here.

use std::io;

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use gridlease_protocol::codec::{self, check_frame_header, frame_header};
use libp2p::StreamProtocol;

/// The protocol name of the lease stream.
pub const LEASE_PROTOCOL: StreamProtocol = StreamProtocol::new("/gridlease/lease/1");

pub use gridlease_protocol::session::{
    LeaseRpc, LeaseRpcResponse, MAX_REQUEST_FRAME, MAX_RESPONSE_FRAME,
};

/// An inbound request as the codec read it: a request, or the reason its frame was not one
/// (so the node can answer a malformed request instead of just closing the stream).
#[derive(Clone, Debug)]
pub enum Incoming<Req> {
    /// A well-formed request.
    Valid(Req),
    /// A frame that was not a request: over the cap, truncated, or not decodable.
    Malformed(String),
}

/// A length-prefixed bincode request-response codec for `Req` / `Resp`, with a frame cap per
/// direction checked before any body is allocated.
pub struct FramedCodec<Req, Resp, const MAX_REQ: usize, const MAX_RESP: usize> {
    /// Response body bytes read (shared by the clones libp2p makes per stream).
    received: std::sync::Arc<std::sync::atomic::AtomicU64>,
    _types: std::marker::PhantomData<fn() -> (Req, Resp)>,
}

impl<Req, Resp, const A: usize, const B: usize> FramedCodec<Req, Resp, A, B> {
    /// Response body bytes this codec (and its clones) have read.
    pub fn received(&self) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
        self.received.clone()
    }
}

impl<Req, Resp, const A: usize, const B: usize> Clone for FramedCodec<Req, Resp, A, B> {
    fn clone(&self) -> Self {
        Self {
            received: self.received.clone(),
            _types: std::marker::PhantomData,
        }
    }
}

impl<Req, Resp, const A: usize, const B: usize> Default for FramedCodec<Req, Resp, A, B> {
    fn default() -> Self {
        Self {
            received: Default::default(),
            _types: std::marker::PhantomData,
        }
    }
}

impl<Req, Resp, const A: usize, const B: usize> std::fmt::Debug for FramedCodec<Req, Resp, A, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FramedCodec")
    }
}

/// The lease stream's codec.
pub type LeaseCodec =
    FramedCodec<LeaseRpc, LeaseRpcResponse, MAX_REQUEST_FRAME, MAX_RESPONSE_FRAME>;

/// The protocol name of book sync.
pub const BOOK_PROTOCOL: StreamProtocol = StreamProtocol::new("/gridlease/book/1");

/// Book sync's codec.
pub type BookCodec = FramedCodec<
    gridlease_protocol::sync::BookRequest,
    gridlease_protocol::sync::BookResponse,
    { gridlease_protocol::sync::MAX_SYNC_REQUEST_FRAME },
    { gridlease_protocol::sync::MAX_SYNC_RESPONSE_FRAME },
>;

fn invalid(e: impl std::error::Error + Send + Sync + 'static) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Reads one frame of at most `max` body bytes; the cap is checked before allocating.
pub async fn read_frame<T: AsyncRead + Unpin + Send>(
    io: &mut T,
    max: usize,
) -> io::Result<Vec<u8>> {
    let mut header = [0u8; 4];
    io.read_exact(&mut header).await?;
    let len = check_frame_header(header, max).map_err(invalid)?;
    let mut body = vec![0u8; len];
    io.read_exact(&mut body).await?;
    Ok(body)
}

/// Writes one frame and closes the write side.
pub async fn write_frame<T: AsyncWrite + Unpin + Send>(
    io: &mut T,
    body: &[u8],
    max: usize,
) -> io::Result<()> {
    let header = frame_header(body.len(), max).map_err(invalid)?;
    io.write_all(&header).await?;
    io.write_all(body).await?;
    io.close().await
}

impl<Req, Resp, const MAX_REQ: usize, const MAX_RESP: usize> libp2p::request_response::Codec
    for FramedCodec<Req, Resp, MAX_REQ, MAX_RESP>
where
    Req: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
    Resp: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
{
    type Protocol = StreamProtocol;
    type Request = Incoming<Req>;
    type Response = Resp;

    /// A frame that is not a request (over the cap, not decodable) is handed on as
    /// [`Incoming::Malformed`] to be answered; only a stream that breaks mid-frame is an error.
    async fn read_request<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<Incoming<Req>>
    where
        T: AsyncRead + Unpin + Send,
    {
        let mut header = [0u8; 4];
        io.read_exact(&mut header).await?;
        let len = match check_frame_header(header, MAX_REQ) {
            Ok(len) => len,
            Err(e) => return Ok(Incoming::Malformed(e.to_string())),
        };
        let mut body = vec![0u8; len];
        io.read_exact(&mut body).await?;
        Ok(match codec::decode::<Req, MAX_REQ>(&body) {
            Ok(r) => Incoming::Valid(r),
            Err(e) => Incoming::Malformed(e.to_string()),
        })
    }

    async fn read_response<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<Resp>
    where
        T: AsyncRead + Unpin + Send,
    {
        let body = read_frame(io, MAX_RESP).await?;
        self.received.fetch_add(
            u64::try_from(body.len() + 4).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
        codec::decode::<Resp, MAX_RESP>(&body).map_err(invalid)
    }

    async fn write_request<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        req: Incoming<Req>,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        let Incoming::Valid(req) = req else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a malformed request is never sent",
            ));
        };
        let body = codec::encode::<Req, MAX_REQ>(&req).map_err(invalid)?;
        write_frame(io, &body, MAX_REQ).await
    }

    async fn write_response<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        res: Resp,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        let body = codec::encode::<Resp, MAX_RESP>(&res).map_err(invalid)?;
        write_frame(io, &body, MAX_RESP).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::io::Cursor;

    #[tokio::test]
    async fn oversized_length_is_refused_before_allocation() {
        let mut bytes = Vec::from(u32::MAX.to_be_bytes());
        bytes.extend_from_slice(&[0; 8]);
        let err = read_frame(&mut Cursor::new(bytes), MAX_REQUEST_FRAME)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    proptest::proptest! {
        /// Arbitrary frames never panic the decoder, and a request that decodes re-encodes to
        /// the same bytes.
        #[test]
        fn arbitrary_request_bodies(body in proptest::collection::vec(proptest::num::u8::ANY, 0..4096)) {
            if let Ok(rpc) = codec::decode::<LeaseRpc, MAX_REQUEST_FRAME>(&body) {
                let again = codec::encode::<LeaseRpc, MAX_REQUEST_FRAME>(&rpc).unwrap();
                let back = codec::decode::<LeaseRpc, MAX_REQUEST_FRAME>(&again).unwrap();
                let twice = codec::encode::<LeaseRpc, MAX_REQUEST_FRAME>(&back).unwrap();
                proptest::prop_assert_eq!(again, twice);
            }
            let _ = codec::decode::<LeaseRpcResponse, MAX_RESPONSE_FRAME>(&body);
        }
    }

    #[tokio::test]
    async fn a_signed_request_round_trips_through_the_codec() {
        use gridlease_protocol::fixtures::{self, T0};
        use gridlease_protocol::{Digest, LeaseRequest, NetworkId, NodeKey, OfferId, Signed};
        use libp2p::request_response::Codec as _;
        let p = NodeKey::from_secret([1; 32]);
        let r = NodeKey::from_secret([2; 32]);
        let offer = fixtures::offer(p.public(), 1, 2, 100_000);
        let terms = fixtures::terms(OfferId(Digest([3; 32])), &offer, r.public(), 1, 600);
        let req = LeaseRequest {
            terms,
            expires_at: T0.plus_secs(60),
        };
        let signed = Signed::sign(&r, &NetworkId::devnet(), &req).unwrap();
        let mut buf = Cursor::new(Vec::new());
        LeaseCodec::default()
            .write_request(
                &LEASE_PROTOCOL,
                &mut buf,
                Incoming::Valid(LeaseRpc::Propose(signed.clone())),
            )
            .await
            .unwrap();
        let bytes = buf.into_inner();
        let Incoming::Valid(LeaseRpc::Propose(back)) = LeaseCodec::default()
            .read_request(&LEASE_PROTOCOL, &mut Cursor::new(bytes))
            .await
            .unwrap()
        else {
            panic!("not a proposal");
        };
        assert_eq!(back, signed);
        assert_eq!(back.verify(&NetworkId::devnet()).unwrap().message, req);
    }

    #[tokio::test]
    async fn frames_round_trip_and_truncation_fails() {
        let mut buf = Cursor::new(Vec::new());
        write_frame(&mut buf, b"hello", 16).await.unwrap();
        let bytes = buf.into_inner();
        let got = read_frame(&mut Cursor::new(bytes.clone()), 16)
            .await
            .unwrap();
        assert_eq!(got, b"hello");
        let err = read_frame(&mut Cursor::new(bytes[..6].to_vec()), 16)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(read_frame(&mut Cursor::new(bytes), 4).await.is_err());
    }
}
