//! This node's routes: status, peers, GPUs.

use axum::Json;
use axum::extract::State;
use gridlease_contracts::Money;
use gridlease_contracts::query::ProviderNumbers;

use super::ApiState;
use super::problem::{ApiError, Problem};
use super::types::{
    ConnectionView, GpusView, ImageCacheView, KeptVolumeView, OwnOfferView, PeerView, ScheduleView,
    StatusView,
};
/// `GET /v1/status`.
#[utoipa::path(
    get,
    path = "/v1/status",
    operation_id = "getStatus",
    tag = "node",
    summary = "Identity, addresses, reachability, peers, offers known, own offer, image cache",
    responses(
        (status = 200, description = "This node now", body = StatusView),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
pub(super) async fn status(State(s): State<ApiState>) -> Result<Json<StatusView>, ApiError> {
    let c = &s.client;
    // Asked at once: the network loop answers them in one pass, so a busy node (a flood of
    // connections) still answers `status` in one wait, not six.
    let own_with_numbers = async {
        let own = c.own_offer().await?;
        // The own offer's summary in the own book carries the score search shows.
        let numbers = match &own {
            Some(o) => c.offer(o.id).await?.map(|e| e.summary.numbers),
            None => None,
        };
        Ok::<_, crate::net::NegotiationError>((own, numbers))
    };
    let (listen, peers, offers, (own, own_numbers), reach) = tokio::try_join!(
        c.listen_addrs(),
        c.connected_peers(),
        c.book_len(),
        own_with_numbers,
        c.reachability(),
    )
    .map_err(ApiError::internal)?;
    // This node's own numbers, as its book carries them (the prior when it has no offer).
    let own_numbers = own_numbers.map_or(ProviderNumbers::PRIOR, |n| n.provider);
    let (cache, limits) = s.leases.image_cache().await;
    let mut kept_volumes: Vec<KeptVolumeView> = s
        .leases
        .live_leases()
        .await
        .map_err(ApiError::internal)?
        .into_iter()
        .filter(|v| v.role == crate::store::Role::Provider)
        .filter_map(|v| {
            let vol = v.volume.as_ref()?;
            Some(KeptVolumeView {
                lease_id: v.lease_id.to_string(),
                name: vol.name.clone(),
                renter: v.counterparty.clone(),
                size_gib: vol.size_gib,
                state: v.state.as_str().to_string(),
                paid: v.paid,
                authorised: v.authorised,
                time_left_s: v.time_left_s,
            })
        })
        .collect();
    kept_volumes.sort_by_key(|k| k.time_left_s.unwrap_or(u64::MAX));
    let text = |v: &[libp2p::Multiaddr]| v.iter().map(ToString::to_string).collect();
    Ok(Json(StatusView {
        kept_volumes,
        image_cache: ImageCacheView {
            images: cache.images,
            bytes: cache.bytes,
            max_images: limits.max_images,
            max_bytes: limits.max_bytes,
        },
        peer_id: c.peer_id().to_string(),
        wallet: s.wallet.to_string(),
        network: c.network().to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        uptime_s: s.started.elapsed().as_secs(),
        listen_addrs: listen.iter().map(ToString::to_string).collect(),
        connected_peers: peers.len(),
        offers_known: offers,
        offers_restoring: {
            let p = c.restore_progress();
            (!p.done).then(|| p.left())
        },
        nat_status: reach.nat_status.to_string(),
        reachable_addrs: text(&reach.reachable),
        unreachable_addrs: text(&reach.unreachable),
        external_addrs: text(&reach.external),
        relays: reach.relays.iter().map(ToString::to_string).collect(),
        schedule: s.leases.schedule().map(|n| ScheduleView {
            text: n.sentence(),
            hours: n.hours,
            tz: n.zone,
            offered: n.availability.offered,
            until_ms: n.availability.until.map(|t| t.0),
        }),
        own_offer: own.map(|o| OwnOfferView {
            id: o.id.to_string(),
            seq: o.offer.seq,
            gpus: o.offer.gpus.len(),
            price_per_gpu_hour: Money::from_micros(o.offer.price_per_gpu_hour).to_string(),
            expires_at_ms: o.offer.expires_at.0,
            ram_mib_per_gpu: o.offer.per_gpu.ram_mib,
            cpu_millicores_per_gpu: o.offer.per_gpu.cpu_millicores,
            disk_gib_per_gpu: o.offer.per_gpu.disk_gib,
            rep: f64::from(own_numbers.rep_permille) / 1000.0,
            completed: own_numbers.completed,
            interruptible: o.offer.interruptible,
        }),
    }))
}

/// `GET /v1/peers`.
#[utoipa::path(
    get,
    path = "/v1/peers",
    operation_id = "listPeers",
    tag = "node",
    summary = "Connected peers with gossip score and mesh membership",
    responses(
        (status = 200, description = "Connected peers, by peer id", body = Vec<PeerView>),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
pub(super) async fn peers(State(s): State<ApiState>) -> Result<Json<Vec<PeerView>>, ApiError> {
    let c = &s.client;
    let connected = c.connected_peers().await.map_err(ApiError::internal)?;
    let mesh = c.mesh_peers().await.map_err(ApiError::internal)?;
    let mut out = Vec::with_capacity(connected.len());
    for p in connected {
        let score = c.peer_score(p).await.map_err(ApiError::internal)?;
        let connections = c
            .connections(p)
            .await
            .map_err(ApiError::internal)?
            .into_iter()
            .map(|k| ConnectionView {
                remote_addr: k.remote.to_string(),
                relayed: k.relayed,
            })
            .collect();
        out.push(PeerView {
            peer_id: p.to_string(),
            score,
            in_mesh: mesh.contains(&p),
            connections,
        });
    }
    out.sort_by(|a, b| a.peer_id.cmp(&b.peer_id));
    Ok(Json(out))
}

/// `GET /v1/gpus`.
#[utoipa::path(
    get,
    path = "/v1/gpus",
    operation_id = "listGpus",
    tag = "node",
    summary = "GPUs found (NVML) or declared (--dev-gpus)",
    responses((status = 200, description = "This node's GPUs", body = GpusView))
)]
pub(super) async fn gpus(State(s): State<ApiState>) -> Json<GpusView> {
    Json((*s.gpus).clone())
}

/// `GET /v1/wallet`.
#[utoipa::path(
    get,
    path = "/v1/wallet",
    operation_id = "getWallet",
    tag = "node",
    summary = "The settlement wallet, the chain it settles on, and the on-chain vouchers of its leases",
    responses(
        (status = 200, description = "The wallet: address, chain (null: GLU only) and the last voucher of each lease settled on chain", body = crate::lease::wallet::WalletView),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
pub(super) async fn wallet(
    State(s): State<ApiState>,
) -> Result<Json<crate::lease::wallet::WalletView>, ApiError> {
    wallet_view(&s, None).await.map(Json)
}

/// The wallet as `GET /v1/wallet` shows it; only lease `only`'s voucher when given.
async fn wallet_view(
    s: &ApiState,
    only: Option<gridlease_protocol::LeaseId>,
) -> Result<crate::lease::wallet::WalletView, ApiError> {
    let mut vouchers = s.leases.vouchers().await.map_err(ApiError::internal)?;
    if let Some(id) = only {
        vouchers.retain(|v| v.lease_id == id.to_string());
    }
    Ok(crate::lease::wallet::WalletView {
        address: s.wallet.to_string(),
        chain: s
            .leases
            .chain()
            .as_ref()
            .map(crate::lease::wallet::ChainView::of),
        settlement: s
            .settlement
            .as_ref()
            .and_then(|h| h.status.lock().ok().map(|g| g.clone())),
        onchain: onchain(s, &mut vouchers).await,
        vouchers,
    })
}

/// The wallet's balances and channels, read from the chain now (`None` without `chain_rpc`):
/// the channels of the (renter, provider) wallet pairs of the vouchers, at most 32; and, on a
/// renter, what the chain paid on the lanes of its settled leases (at most 32), reconciled with
/// the claim its own ledger says is owed.
async fn onchain(
    s: &ApiState,
    vouchers: &mut [crate::lease::wallet::VoucherView],
) -> Option<crate::lease::wallet::OnChainView> {
    use gridlease_protocol::wallet::Address;
    let mut view = crate::lease::wallet::OnChainView::default();
    let c = match s.leases.chain_client().await? {
        Ok(c) => c,
        Err(e) => {
            view.error = Some(e.to_string());
            return Some(view);
        }
    };
    let read = async {
        view.gas = Some(c.gas_balance().await?.to_string());
        view.token = Some(c.token_balance(c.wallet()).await?.to_string());
        let mut pairs: Vec<(String, String)> = vouchers
            .iter()
            .map(|v| (v.lane.renter_wallet.clone(), v.lane.provider_wallet.clone()))
            .collect();
        pairs.sort();
        pairs.dedup();
        for (r, p) in pairs.into_iter().take(32) {
            let (Ok(ra), Ok(pa)) = (r.parse::<Address>(), p.parse::<Address>()) else {
                continue;
            };
            let ch = c.channel(ra, pa).await?;
            view.channels.push(crate::lease::wallet::ChannelView {
                renter_wallet: r,
                provider_wallet: p,
                deposit: ch.deposit.to_string(),
                redeemed: ch.redeemed.to_string(),
                closes_at: ch.closes_at,
                epoch: ch.epoch,
            });
        }
        renter_lanes(&c, vouchers).await?;
        Ok::<(), crate::chain::ChainError>(())
    }
    .await;
    if let Err(e) = read {
        view.error = Some(e.to_string());
    }
    Some(view)
}

/// A renter's side of reconciliation: each settled lease's lane as the chain paid it, beside
/// the claim (what this node's ledger owes). More than the claim is a mismatch, logged and
/// shown; less is a redeem not (fully) made yet.
async fn renter_lanes(
    c: &crate::chain::ChainClient,
    vouchers: &mut [crate::lease::wallet::VoucherView],
) -> Result<(), crate::chain::ChainError> {
    use crate::lease::wallet::RedemptionView;
    use crate::store::redemptions::RedemptionState;
    use gridlease_protocol::wallet::Address;
    let settled = vouchers
        .iter_mut()
        .filter(|v| v.role == crate::store::Role::Renter && v.state == "settled")
        .take(32);
    for v in settled {
        let (Ok(r), Ok(p), Ok(lane), Ok(claim)) = (
            v.lane.renter_wallet.parse::<Address>(),
            v.lane.provider_wallet.parse::<Address>(),
            v.lease_id.parse::<gridlease_protocol::LeaseId>(),
            v.voucher.claim.parse::<u128>(),
        ) else {
            continue;
        };
        let paid = c.lane_redeemed(r, p, v.lane.epoch, lane.0.0).await?;
        if paid > claim {
            tracing::error!(lease = %v.lease_id, paid = %paid, claim = %claim, "the provider redeemed more than this node's ledger owes");
        }
        v.redemption = Some(RedemptionView {
            state: if paid == 0 || paid < claim {
                RedemptionState::Pending
            } else {
                RedemptionState::Redeemed
            },
            tx: None,
            block: None,
            paid: Some(paid.to_string()),
            reconciled: paid == claim,
            error: (paid > 0 && paid < claim)
                .then(|| format!("the chain paid {paid} of the claim {claim} so far")),
            attempts: 0,
        });
    }
    Ok(())
}

/// `POST /v1/settle`.
#[utoipa::path(
    post,
    path = "/v1/settle",
    operation_id = "settle",
    tag = "node",
    summary = "Runs a settlement pass now: queue settled leases, redeem their vouchers, watch for closes",
    request_body = crate::api::types::SettleBody,
    responses(
        (status = 200, description = "The wallet after the pass (only the lease's voucher when one was named)", body = crate::lease::wallet::WalletView),
        (status = 400, description = "The body is not JSON (`malformed-body`), or `lease` is not a lease id (`invalid-parameter`)", content_type = "application/problem+json", body = Problem),
        (status = 404, description = "No such lease (`unknown-lease`)", content_type = "application/problem+json", body = Problem),
        (status = 409, description = "The node does not settle on a chain by itself (`no-chain`), or the lease id prefix is ambiguous (`ambiguous-id`)", content_type = "application/problem+json", body = Problem),
        (status = 415, description = "The body is not application/json (`unsupported-media-type`)", content_type = "application/problem+json", body = Problem),
        (status = 422, description = "The body is not a valid settle request (`invalid-body`)", content_type = "application/problem+json", body = Problem),
        (status = 502, description = "The chain could not be reached or refused (`chain-failed`)", content_type = "application/problem+json", body = Problem),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
pub(super) async fn settle(
    State(s): State<ApiState>,
    super::problem::ApiJson(body): super::problem::ApiJson<crate::api::types::SettleBody>,
) -> Result<Json<crate::lease::wallet::WalletView>, ApiError> {
    let only = match body.lease.as_deref() {
        Some(prefix) => Some(super::resolve::resolve_lease(&s, prefix).await?),
        None => None,
    };
    let Some(h) = &s.settlement else {
        return Err(ApiError::new(
            crate::api::problem::ProblemType::NoChain,
            "this node does not redeem or settle on a chain by itself: no chain_rpc",
        )
        .hint("set chain_rpc (with chain_id, token and channel_contract) and restart the node; `gridlease wallet` lists the vouchers to redeem by hand"));
    };
    h.pass_now().await.map_err(|e| {
        ApiError::new(crate::api::problem::ProblemType::ChainFailed, e)
            .hint("check chain_rpc and the wallet's gas balance, then retry")
    })?;
    wallet_view(&s, only).await.map(Json)
}
