//! The network loop's lease-stream child ([`LeaseRpcs`]): requests this node sends on the
//! lease stream and their replies (one retry after a failed dial), and inbound requests
//! (proposals verified first, sessions) forwarded to the lease service without waiting for
//! its answer.

use std::collections::HashMap;

use gridlease_protocol::session::SessionResponse;
use gridlease_protocol::{
    Digest, LeaseId, LeaseRequest, PeerId, PublicKey, RejectReason, Signed, Timestamp, Verified,
};
use libp2p::request_response::{self, OutboundRequestId, ResponseChannel};
use libp2p::{Multiaddr, Swarm};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use super::behaviour::Behaviour;
use super::codec::{Incoming, LeaseRpc, LeaseRpcResponse};
use super::ingest::Ingest;
use super::loop_ctx::{LoopCtx, truncate};
use super::provider::{self, OwnOffer};
use super::{InboundLease, InboundRequest, NetError, NetworkEvent, Proposal};

/// Most lease-stream requests awaiting the lease service at once; more are answered `Busy`
/// (sessions) or refused (proposals).
const MAX_LEASE_IN_FLIGHT: usize = 1024;

/// The lease service answered a forwarded lease-stream request: the answer to send.
#[derive(Debug)]
pub(super) struct LeaseAnswered {
    peer: PeerId,
    channel: ResponseChannel<LeaseRpcResponse>,
    response: LeaseRpcResponse,
}

/// A lease-stream request sent and not answered yet.
#[derive(Debug)]
struct PendingRpc {
    reply: oneshot::Sender<Result<LeaseRpcResponse, NetError>>,
    /// Kept for one more try when the first dial fails (see [`LeaseRpcs::send_rpc`]).
    retry: Option<(PeerId, Vec<Multiaddr>, LeaseRpc)>,
}

/// Lease-stream requests, outbound and inbound.
#[derive(Default)]
pub(super) struct LeaseRpcs {
    /// Sent requests awaiting their answer.
    pending: HashMap<OutboundRequestId, PendingRpc>,
    /// Lease-stream requests forwarded to the lease service; each yields the answer.
    pub(super) tasks: JoinSet<LeaseAnswered>,
    /// Where inbound lease-stream requests go (the lease service), once registered.
    handler: Option<mpsc::Sender<InboundLease>>,
}

impl LeaseRpcs {
    /// Routes inbound requests to `tx` from now on.
    pub(super) fn set_handler(&mut self, tx: mpsc::Sender<InboundLease>) {
        self.handler = Some(tx);
    }

    /// Sends `rpc` to `peer` ([`crate::net::Client::lease_rpc`]); `reply` gets the answer.
    /// A peer not connected now is dialed at `addrs`, and once more if that dial fails.
    pub(super) fn send(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        listen: &[Multiaddr],
        peer: PeerId,
        addrs: Vec<Multiaddr>,
        rpc: LeaseRpc,
        reply: oneshot::Sender<Result<LeaseRpcResponse, NetError>>,
    ) {
        let retry = (!swarm.is_connected(&peer)).then(|| (peer, addrs.clone(), rpc.clone()));
        self.send_rpc(
            swarm,
            listen,
            peer,
            &addrs,
            rpc,
            PendingRpc { reply, retry },
        );
    }

    /// Sends a lease-stream request to `peer`, dialing it first at `addrs` (never one of our
    /// own, `listen`: `reach::dialable`) when not connected. The explicit dial matters:
    /// request-response would otherwise join a dial already under way (kad's, with the
    /// peer's LAN addresses only) and fail the request with it.
    fn send_rpc(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        listen: &[Multiaddr],
        peer: PeerId,
        addrs: &[Multiaddr],
        rpc: LeaseRpc,
        pending: PendingRpc,
    ) {
        let addrs = super::reach::dialable(addrs, listen);
        for a in &addrs {
            swarm.add_peer_address(peer, a.clone());
        }
        if !swarm.is_connected(&peer) && !addrs.is_empty() {
            let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(peer)
                .addresses(addrs)
                .condition(libp2p::swarm::dial_opts::PeerCondition::Always)
                .build();
            if let Err(e) = swarm.dial(opts) {
                tracing::debug!(%peer, error = %e, "lease request dial not started");
            }
        }
        let id = swarm
            .behaviour_mut()
            .lease
            .send_request(&peer, Incoming::Valid(rpc));
        self.pending.insert(id, pending);
    }

    /// The lease service answered: the answer goes to the peer (a rejection is emitted).
    pub(super) fn on_answered(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        ctx: &LoopCtx,
        done: LeaseAnswered,
    ) {
        let LeaseAnswered {
            peer,
            channel,
            response,
        } = done;
        if let LeaseRpcResponse::Rejected(r) = &response
            && let Ok(v) = r.verify(&ctx.config.network)
        {
            ctx.emit(NetworkEvent::LeaseRejected {
                peer,
                reason: v.message.reason,
            });
        }
        let _ = swarm.behaviour_mut().lease.send_response(channel, response);
    }

    /// A lease-stream event. `own`: the offer this node advertises now (goes with a
    /// proposal); `listen`: our listen addresses (never dialed on a retry).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_event(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        ctx: &LoopCtx,
        ingest: &mut Ingest,
        own: Option<&OwnOffer>,
        listen: &[Multiaddr],
        event: request_response::Event<Incoming<LeaseRpc>, LeaseRpcResponse>,
    ) {
        match event {
            request_response::Event::Message { peer, message, .. } => match message {
                request_response::Message::Request {
                    request, channel, ..
                } => match request {
                    Incoming::Valid(request) => {
                        self.on_request(swarm, ctx, own, peer, request, channel, ctx.now())
                    }
                    Incoming::Malformed(detail) => {
                        let now = ctx.now();
                        ingest.probed(&peer, "lease", &detail, now);
                        let blank = LeaseId(Digest::default());
                        let reason = RejectReason::Malformed {
                            detail: truncate(detail),
                        };
                        let answer =
                            provider::reject(&ctx.key, &ctx.config.network, blank, 0, reason, now);
                        let _ = swarm.behaviour_mut().lease.send_response(channel, answer);
                    }
                },
                request_response::Message::Response {
                    request_id,
                    response,
                } => {
                    if let Some(p) = self.pending.remove(&request_id) {
                        let _ = p.reply.send(Ok(response));
                    }
                }
            },
            request_response::Event::OutboundFailure {
                request_id, error, ..
            } => self.on_failure(swarm, listen, request_id, error),
            request_response::Event::InboundFailure { peer, error, .. } => {
                tracing::debug!(%peer, %error, "inbound lease request failed");
            }
            request_response::Event::ResponseSent { .. } => {}
        }
    }

    /// A sent request failed: tried once more after a failed dial, else the error replied.
    fn on_failure(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        listen: &[Multiaddr],
        request_id: OutboundRequestId,
        error: request_response::OutboundFailure,
    ) {
        let Some(p) = self.pending.remove(&request_id) else {
            return;
        };
        match (error, p.retry) {
            // The first dial that failed may have been another one (a request joins
            // any dial to its peer); once more, dialing the given addresses.
            (request_response::OutboundFailure::DialFailure, Some((peer, addrs, rpc))) => {
                tracing::debug!(%peer, "lease request's dial failed; trying once more");
                let pending = PendingRpc {
                    reply: p.reply,
                    retry: None,
                };
                self.send_rpc(swarm, listen, peer, &addrs, rpc, pending);
            }
            (error, _) => {
                let _ = p.reply.send(Err(error.into()));
            }
        }
    }

    /// Forwards a lease-stream request to the lease service without waiting for it; the
    /// answer comes back as a [`LeaseAnswered`]. A proposal is verified first (envelope,
    /// and signed by the sending peer) and goes with the offer this node advertises now.
    #[allow(clippy::too_many_arguments)]
    fn on_request(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        ctx: &LoopCtx,
        own: Option<&OwnOffer>,
        peer: PeerId,
        request: LeaseRpc,
        channel: ResponseChannel<LeaseRpcResponse>,
        now: Timestamp,
    ) {
        let refuse = |lease_id, nonce, reason| {
            provider::reject(&ctx.key, &ctx.config.network, lease_id, nonce, reason, now)
        };
        let (request, unavailable) = match request {
            LeaseRpc::Propose(signed) => match verify_request(ctx, &peer, &signed) {
                Ok(verified) => {
                    let id = verified
                        .message
                        .terms
                        .lease_id()
                        .unwrap_or(LeaseId(Digest::default()));
                    let busy = refuse(id, verified.message.terms.nonce, RejectReason::Internal);
                    let offer = own.cloned();
                    let proposal = Proposal {
                        signed,
                        verified,
                        offer,
                    };
                    (InboundRequest::Propose(Box::new(proposal)), busy)
                }
                Err((lease_id, nonce, reason)) => {
                    let response = refuse(lease_id, nonce, reason.clone());
                    ctx.emit(NetworkEvent::LeaseRejected { peer, reason });
                    let _ = swarm.behaviour_mut().lease.send_response(channel, response);
                    return;
                }
            },
            LeaseRpc::Session(request) => (
                InboundRequest::Session(request),
                LeaseRpcResponse::Session(SessionResponse::Busy),
            ),
        };
        let (reply, rx) = oneshot::channel();
        let forwarded = self.tasks.len() < MAX_LEASE_IN_FLIGHT
            && self.handler.as_ref().is_some_and(|tx| {
                tx.try_send(InboundLease {
                    peer,
                    request,
                    reply,
                })
                .is_ok()
            });
        if !forwarded {
            let _ = swarm
                .behaviour_mut()
                .lease
                .send_response(channel, unavailable);
            return;
        }
        self.tasks.spawn(async move {
            let response = rx.await.unwrap_or(unavailable);
            LeaseAnswered {
                peer,
                channel,
                response,
            }
        });
    }
}

/// Verifies a request's envelope and that it was signed by the peer that sent it.
fn verify_request(
    ctx: &LoopCtx,
    peer: &PeerId,
    signed: &Signed<LeaseRequest>,
) -> Result<Verified<LeaseRequest>, (LeaseId, u64, RejectReason)> {
    let blank = LeaseId(Digest::default());
    let v = signed.verify(&ctx.config.network).map_err(|e| {
        (
            blank,
            0,
            RejectReason::Malformed {
                detail: truncate(e.to_string()),
            },
        )
    })?;
    let lease_id = v.message.terms.lease_id().unwrap_or(blank);
    let nonce = v.message.terms.nonce;
    match PublicKey::from_peer_id(peer) {
        Ok(k) if k == v.signer => Ok(v),
        _ => Err((
            lease_id,
            nonce,
            RejectReason::Malformed {
                detail: "request not signed by the sending peer".into(),
            },
        )),
    }
}
