//! The stream multiplexer: yamux (`/yamux/1.0.0`, the same wire protocol as `libp2p-yamux`),
//! driven through the `yamux` crate's own configuration.
//!
//! Why not `libp2p::yamux::Config`: it exposes only the stream limit, and its fixed 16 KiB
//! split size means that every 16 KiB of a bulk transfer (`gridlease cp`, a forwarded port) is
//! one yamux frame, one noise message (sealed, sent and opened on its own) and one TCP write:
//! about 65,000 of each per GiB on each side. Frames of [`SPLIT_SEND_SIZE`] fill a noise
//! message (at most 65,519 bytes of payload) instead. The split size is the sender's own choice
//! (yamux frames carry their length; peers with libp2p's default interoperate).
//!
//! The cost: a small frame of another stream (a gossip message, a ping) can wait behind one
//! whole data frame, 64 KiB instead of 16 KiB: 52 ms instead of 13 ms on a 10 Mbit/s uplink.
//! A bulk stream keeps the TCP send buffer full anyway (hundreds of KiB by default on Linux),
//! and every small frame waits behind all of it, so the frame size adds little to that wait.
//!
//! Under TLS, which the transport prefers to noise ([`super::tls`]), a record holds at most
//! 16 KiB, so a 64 KiB frame is four records sealed separately and written together. Measured
//! with TLS (`node/examples/bench_ssh.rs`, 2026-12-06, docs/benchmarks-history.md): 16 KiB
//! frames changed nothing consistently (under load 4.5, a forward's download 1.03x, upload
//! 0.66x of `ssh -L` in one run; 64 KiB frames in two runs beside it: 1.08-1.12x, 0.88-0.98x),
//! so the split stays at 64 KiB, which noise peers need. Windows are yamux 0.14's: a stream's starts at 256 KiB and grows with the
//! measured round trip, up to the connection's 1 GiB (not changed, not measured here).
//!
//! What this keeps of libp2p's muxer: inbound streams that arrive while the connection is
//! polled for progress are buffered (at most [`MAX_BUFFERED_INBOUND`], then reset), the
//! connection's defaults for windows and the stream limit.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use futures::{AsyncRead, AsyncWrite};
use libp2p::core::muxing::{StreamMuxer, StreamMuxerEvent};
use libp2p::core::upgrade::{InboundConnectionUpgrade, OutboundConnectionUpgrade, UpgradeInfo};

/// Payload of one yamux data frame: a noise message holds 65,535 bytes, 16 of them the tag,
/// and the 12-byte yamux header travels in the same message.
pub const SPLIT_SEND_SIZE: usize = 65_535 - 16 - 12;

/// Inbound streams kept while nobody asks for them (yamux's own ack backlog: a peer stops
/// opening streams before this many wait unacknowledged).
pub const MAX_BUFFERED_INBOUND: usize = 256;

/// The yamux upgrade with the node's settings.
#[derive(Clone, Debug)]
pub struct Config(yamux::Config);

impl Default for Config {
    fn default() -> Self {
        let mut c = yamux::Config::default();
        c.set_split_send_size(SPLIT_SEND_SIZE);
        Self(c)
    }
}

impl Config {
    /// The connection over `io`: yamux needs no handshake, so the upgrade is ready at once.
    fn open<C>(self, io: C, mode: yamux::Mode) -> futures::future::Ready<io::Result<Muxer<C>>>
    where
        C: AsyncRead + AsyncWrite + Unpin,
    {
        futures::future::ready(Ok(Muxer::new(yamux::Connection::new(io, self.0, mode))))
    }
}

impl UpgradeInfo for Config {
    type Info = &'static str;
    type InfoIter = std::iter::Once<Self::Info>;

    fn protocol_info(&self) -> Self::InfoIter {
        std::iter::once("/yamux/1.0.0")
    }
}

impl<C> InboundConnectionUpgrade<C> for Config
where
    C: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    type Output = Muxer<C>;
    type Error = io::Error;
    type Future = futures::future::Ready<Result<Self::Output, Self::Error>>;

    fn upgrade_inbound(self, io: C, _: Self::Info) -> Self::Future {
        self.open(io, yamux::Mode::Server)
    }
}

impl<C> OutboundConnectionUpgrade<C> for Config
where
    C: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    type Output = Muxer<C>;
    type Error = io::Error;
    type Future = futures::future::Ready<Result<Self::Output, Self::Error>>;

    fn upgrade_outbound(self, io: C, _: Self::Info) -> Self::Future {
        self.open(io, yamux::Mode::Client)
    }
}

/// One multiplexed connection.
#[derive(Debug)]
pub struct Muxer<C> {
    conn: yamux::Connection<C>,
    /// Inbound streams taken from the connection by [`StreamMuxer::poll`] (the only way the
    /// connection makes progress) before [`StreamMuxer::poll_inbound`] asked for them.
    inbound: VecDeque<yamux::Stream>,
    inbound_waker: Option<Waker>,
}

impl<C> Muxer<C> {
    fn new(conn: yamux::Connection<C>) -> Self {
        Self {
            conn,
            inbound: VecDeque::new(),
            inbound_waker: None,
        }
    }
}

/// A yamux connection error.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct Error(#[from] yamux::ConnectionError);

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        match e.0 {
            yamux::ConnectionError::Io(e) => e,
            other => io::Error::other(other),
        }
    }
}

impl<C> Muxer<C>
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    fn next_inbound(&mut self, cx: &mut Context<'_>) -> Poll<Result<yamux::Stream, Error>> {
        match self.conn.poll_next_inbound(cx) {
            Poll::Ready(Some(r)) => Poll::Ready(r.map_err(Error)),
            Poll::Ready(None) => Poll::Ready(Err(Error(yamux::ConnectionError::Closed))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<C> StreamMuxer for Muxer<C>
where
    C: AsyncRead + AsyncWrite + Unpin + 'static,
{
    type Substream = yamux::Stream;
    type Error = Error;

    fn poll_inbound(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::Substream, Self::Error>> {
        let this = self.get_mut();
        if let Some(s) = this.inbound.pop_front() {
            return Poll::Ready(Ok(s));
        }
        if let Poll::Ready(r) = this.next_inbound(cx) {
            return Poll::Ready(r);
        }
        this.inbound_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    fn poll_outbound(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::Substream, Self::Error>> {
        self.get_mut().conn.poll_new_outbound(cx).map_err(Error)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.get_mut().conn.poll_close(cx).map_err(Error)
    }

    fn poll(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<StreamMuxerEvent, Self::Error>> {
        let this = self.get_mut();
        let stream = match this.next_inbound(cx) {
            Poll::Ready(r) => r?,
            Poll::Pending => return Poll::Pending,
        };
        if this.inbound.len() >= MAX_BUFFERED_INBOUND {
            tracing::warn!(%stream, "inbound stream reset: too many waiting");
            drop(stream);
        } else {
            this.inbound.push_back(stream);
            if let Some(w) = this.inbound_waker.take() {
                w.wake();
            }
        }
        // More may be ready: come back at once rather than wait for the next wake-up.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::{AsyncReadExt, AsyncWriteExt, FutureExt};
    use libp2p::core::muxing::StreamMuxerExt;
    use tokio_util::compat::TokioAsyncReadCompatExt;

    /// Polls a muxer's connection (the swarm does this in the node) until it fails.
    async fn drive<M>(muxer: &mut M) -> String
    where
        M: StreamMuxer + Unpin,
        M::Error: std::fmt::Display,
    {
        futures::future::poll_fn(|cx| {
            loop {
                match muxer.poll_unpin(cx) {
                    Poll::Ready(Ok(_)) => continue,
                    Poll::Ready(Err(e)) => return Poll::Ready(e.to_string()),
                    Poll::Pending => return Poll::Pending,
                }
            }
        })
        .await
    }

    /// A socket that records the largest single write through it.
    struct Largest<T> {
        inner: T,
        largest: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl<T: AsyncRead + Unpin> AsyncRead for Largest<T> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut [u8],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl<T: AsyncWrite + Unpin> AsyncWrite for Largest<T> {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let r = Pin::new(&mut self.inner).poll_write(cx, buf);
            if let Poll::Ready(Ok(n)) = r {
                self.largest
                    .fetch_max(n, std::sync::atomic::Ordering::Relaxed);
            }
            r
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }

        fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_close(cx)
        }
    }

    #[tokio::test]
    async fn our_64_kib_frames_cross_to_libp2ps_default_muxer_and_back() {
        let (a, b) = tokio::io::duplex(1 << 20);
        let largest = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let a = Largest {
            inner: a.compat(),
            largest: largest.clone(),
        };
        let mut ours = Config::default()
            .upgrade_outbound(a, "/yamux/1.0.0")
            .now_or_never()
            .expect("ready")
            .expect("upgrade");
        let mut theirs = libp2p::yamux::Config::default()
            .upgrade_inbound(b.compat(), "/yamux/1.0.0")
            .now_or_never()
            .expect("ready")
            .expect("upgrade");
        // 3 MiB: our 64 KiB frames one way, libp2p's 16 KiB frames back, both far past the
        // 256 KiB initial window (so window updates work between the two as well).
        let data: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8).collect();
        let mut out = futures::future::poll_fn(|cx| ours.poll_outbound_unpin(cx))
            .await
            .expect("outbound stream");
        let (inbound_tx, inbound_rx) = tokio::sync::oneshot::channel();
        let theirs_side = async {
            let s = futures::future::poll_fn(|cx| theirs.poll_inbound_unpin(cx))
                .await
                .expect("inbound stream");
            let _ = inbound_tx.send(s);
            drive(&mut theirs).await
        };
        let sender = async {
            out.write_all(&data).await.unwrap();
            out.close().await.unwrap();
            let mut back = Vec::new();
            out.read_to_end(&mut back).await.unwrap();
            back
        };
        let echo = async {
            let mut s = inbound_rx.await.unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            s.write_all(&got).await.unwrap();
            s.close().await.unwrap();
            got
        };
        let exchange = async { tokio::join!(sender, echo) };
        let (back, got) = tokio::select! {
            e = drive(&mut ours) => panic!("our side failed: {e}"),
            e = theirs_side => panic!("libp2p's side failed: {e}"),
            r = tokio::time::timeout(std::time::Duration::from_secs(20), exchange) => {
                r.expect("the exchange stalled")
            }
        };
        assert!(got == data, "libp2p's muxer received other bytes");
        assert!(back == data, "our muxer received other bytes back");
        // The frames we sent were of the split size (a frame's body is one write).
        assert_eq!(
            largest.load(std::sync::atomic::Ordering::Relaxed),
            SPLIT_SEND_SIZE
        );
    }
}
