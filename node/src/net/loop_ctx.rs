//! What every child state machine of the network loop reads ([`LoopCtx`]): the node's key,
//! settings, store, book and event channel. Children take it as a parameter; none owns it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gridlease_protocol::{NodeKey, PeerId, Timestamp};
use libp2p::Multiaddr;
use libp2p::multiaddr::Protocol;
use tokio::sync::broadcast;

use super::shared_book::SharedBook;
use super::{NetworkEvent, NodeConfig};
use crate::store::StoreHandle;

/// The shared, read-mostly part of the network loop: handed to the children's methods.
pub(super) struct LoopCtx {
    /// This node's identity (signs the own offer and lease rejections).
    pub(super) key: Arc<NodeKey>,
    /// The node's network settings.
    pub(super) config: NodeConfig,
    /// The store (best-effort writes from the loop).
    pub(super) store: StoreHandle,
    /// The offer book; the loop is its one writer.
    pub(super) book: SharedBook,
    /// Where node events go.
    pub(super) events: broadcast::Sender<NetworkEvent>,
}

impl LoopCtx {
    /// Sends a node event. No subscriber is fine; a lagging one loses old events.
    pub(super) fn emit(&self, event: NetworkEvent) {
        let _ = self.events.send(event);
    }

    /// The time now, from the injected clock ([`NodeConfig::clock`]).
    pub(super) fn now(&self) -> Timestamp {
        self.config.clock.now()
    }

    /// The monotonic instant now, moved ahead as far as the injected clock runs ahead of the
    /// wall clock (not at all with the system clock): what the children's periods compare.
    pub(super) fn instant(&self) -> Instant {
        let ahead = self.config.clock.now().ms_since(crate::clock::now());
        Instant::now() + Duration::from_millis(ahead)
    }
}

/// Cuts a peer-supplied text to at most 200 bytes (on a character boundary).
pub(super) fn truncate(mut s: String) -> String {
    if s.len() > 200 {
        let mut cut = 200;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// `addr` ending with `/p2p/<peer>` (added when missing).
pub(super) fn with_peer(addr: Multiaddr, peer: PeerId) -> Multiaddr {
    if matches!(addr.iter().last(), Some(Protocol::P2p(_))) {
        addr
    } else {
        addr.with(Protocol::P2p(peer))
    }
}

/// Most tracked peers in each rate limiter.
pub(super) const RATE_KEYS: usize = 10_000;
