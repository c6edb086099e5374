//! One session request to the other side of a lease, answered or timed out.

use gridlease_protocol::PeerId;

use super::ctx::Ctx;
use super::error::SessionRpcError;
use super::wire::{SessionRequest, SessionResponse};

/// Sends one session request and returns the answer (or why there is none).
pub(crate) async fn session_rpc(
    ctx: &Ctx,
    peer: PeerId,
    req: SessionRequest,
) -> Result<SessionResponse, SessionRpcError> {
    session_rpc_within(ctx, peer, req, ctx.config.rpc_timeout).await
}

/// [`session_rpc`] with its own timeout (a request whose answer takes work: the GPU check's
/// challenge).
pub(crate) async fn session_rpc_within(
    ctx: &Ctx,
    peer: PeerId,
    req: SessionRequest,
    timeout: std::time::Duration,
) -> Result<SessionResponse, SessionRpcError> {
    use crate::net::codec::{LeaseRpc, LeaseRpcResponse};
    let call = ctx
        .client
        .lease_rpc(peer, Vec::new(), LeaseRpc::Session(req));
    match tokio::time::timeout(timeout, call).await {
        Err(_) => Err(SessionRpcError::TimedOut),
        Ok(Err(e)) => Err(e.into()),
        Ok(Ok(LeaseRpcResponse::Session(r))) => Ok(r),
        Ok(Ok(_)) => Err(SessionRpcError::NotSession),
    }
}
