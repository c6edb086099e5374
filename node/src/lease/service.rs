//! [`LeaseService`]: the cloneable handle the control API calls, its start-up
//! ([`LeaseService::start`], [`start_for_daemon`]) and its operations.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gridlease_contracts::image::ImagePolicy;
use gridlease_protocol::{Digest, LeaseId, OfferId, PeerId};
use gridlease_sandbox::Sandbox;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::actor::{Actor, Cmd};
use super::config::{INBOUND_QUEUE, LeaseServiceConfig, SERVICE_QUEUE, SharedGpuSampler};
use super::ctx::Ctx;
use super::error::{LeaseError, RemoteError, RentError};
use super::extend::{self, ExtendError, ExtendRequest, Extended};
use super::negotiate::{self, NegotiateError, NegotiationOutcome, fresh_nonce};
use super::rpc::session_rpc;
use super::session::SessionMsg;
use super::settings::{ProvideError, ProvideSettings};
use super::view::{self, LeaseView, Ledger};
use super::wire::{self, LogChunk, SessionRequest, SessionResponse};
use super::{capacity, completion, hours, images, logs, outputs, owner, retention};
use crate::net::{Client, NetworkEvent, OfferTemplate};
use crate::renter::{RentRequest, offer_addrs, terms_for};
use crate::store::{Role, StoredLease};

/// The cloneable handle to the lease service.
#[derive(Clone, Debug)]
pub struct LeaseService {
    tx: mpsc::Sender<Cmd>,
    pub(super) ctx: Arc<Ctx>,
}

impl LeaseService {
    /// Now, by the service's clock (what its sessions and holds read).
    pub fn now(&self) -> gridlease_protocol::Timestamp {
        self.ctx.now()
    }

    /// Starts the service: reconciles this node's containers with its stored leases, holds
    /// the GPUs of live provider leases, resumes every live lease, then takes inbound
    /// lease-stream requests from the network. Stops with `cancel`. (`events` is no longer
    /// needed: nothing is learned from network events; kept so callers need not change.)
    pub async fn start(
        client: Client,
        _events: &broadcast::Sender<NetworkEvent>,
        config: LeaseServiceConfig,
        sandbox: Option<Sandbox>,
        cancel: CancellationToken,
    ) -> Result<Self, LeaseError> {
        if let Err(e) = std::fs::create_dir_all(&config.data_dir) {
            tracing::warn!(dir = %config.data_dir.display(), error = %e, "cannot create the lease output directory");
        }
        let store = client.store().clone();
        let node_id = client.peer_id().to_string();
        let (released_tx, released) = mpsc::channel(SERVICE_QUEUE);
        let (handovers_tx, handovers) = mpsc::channel(SERVICE_QUEUE);
        let ctx = Arc::new(Ctx {
            client: client.clone(),
            store,
            config,
            sandbox,
            node_id,
            cancel: cancel.clone(),
            log_reads: Arc::new(tokio::sync::Semaphore::new(logs::LOG_READERS)),
            holds: watch::Sender::new(std::collections::BTreeSet::new()),
            volume_gib: watch::Sender::new(0),
            kept_outputs_gib: watch::Sender::new(0),
            owner_busy: watch::Sender::new(std::collections::BTreeSet::new()),
            hours: watch::Sender::new(None),
            released: released_tx,
            handovers: handovers_tx,
            log_sweep: tokio::sync::Notify::new(),
        });
        // The hours a restarted provider offers in are those it last saved.
        if let Some(path) = &ctx.config.provide_file {
            match ProvideSettings::load(path) {
                Ok(Some(saved)) if saved.enabled => match hours::Hours::resolve(&saved) {
                    Ok(h) => {
                        ctx.hours.send_replace(Some(h));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "saved provide hours not applied: offering always");
                    }
                },
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "ignoring unreadable provide settings"),
            }
        }
        let (tx, rx) = mpsc::channel(SERVICE_QUEUE);
        let (in_tx, in_rx) = mpsc::channel(INBOUND_QUEUE);
        let mut actor = Actor::new(ctx.clone(), rx, in_rx, released, handovers);
        actor.resume_all().await?;
        actor.publish_holds();
        tokio::spawn(capacity::run(ctx.clone()));
        if ctx.sandbox.is_some() {
            tokio::spawn(outputs::run(ctx.clone(), ctx.config.outputs_sweep));
        }
        tokio::spawn(retention::run(ctx.clone(), ctx.config.logs_sweep));
        client.set_lease_handler(in_tx).await?;
        let span = tracing::info_span!("leases", node = %ctx.client.peer_id());
        tokio::spawn(tracing::Instrument::instrument(actor.run(), span));
        let svc = Self { tx, ctx };
        let reclaimer = svc.clone();
        tokio::spawn(owner::run(
            svc.ctx.clone(),
            svc.ctx.config.owner_idle,
            svc.ctx.config.owner_util_percent,
            move |id| {
                let svc = reclaimer.clone();
                async move { svc.reclaim(id).await }
            },
        ));
        Ok(svc)
    }

    /// Where this provider's lease workspaces live (`gridlease_sandbox::workspace`): what
    /// file copies open.
    pub fn workspace_dir(&self) -> PathBuf {
        self.ctx.workspace_dir()
    }

    /// The Docker sandbox this node runs leases in (`None`: Docker unreachable, renting only).
    pub fn sandbox(&self) -> Option<Sandbox> {
        self.ctx.sandbox.clone()
    }

    /// Resolves once the service has stopped (after its `cancel`) and finished its shutdown
    /// work (the egress teardown): the daemon waits for it before exiting.
    pub async fn stopped(&self) {
        self.tx.closed().await;
    }

    async fn ask<R>(&self, make: impl FnOnce(oneshot::Sender<R>) -> Cmd) -> Result<R, LeaseError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(make(reply))
            .await
            .map_err(|_| LeaseError::Closed)?;
        rx.await.map_err(|_| LeaseError::Closed)
    }

    /// Rents from `req.offer`: returns once the lease is accepted and stored on both sides;
    /// the container starts and is paid for in the background.
    ///
    /// Cancel-safe: the negotiation and the session's registration run in their own task, so
    /// a caller that stops waiting (a dropped HTTP request, Ctrl-C) still leaves a lease that
    /// runs and settles, never one that is stored with no session.
    pub async fn rent(&self, req: RentRequest) -> Result<LeaseId, RentError> {
        let this = self.clone();
        tokio::spawn(async move { this.rent_inner(req).await })
            .await
            .map_err(|_| RentError::Closed)?
    }

    async fn rent_inner(&self, req: RentRequest) -> Result<LeaseId, RentError> {
        let client = &self.ctx.client;
        let id: OfferId = req
            .offer
            .parse()
            .map_err(|_| RentError::BadOffer(req.offer.clone()))?;
        let entry = match client.offer(id).await.map_err(NegotiateError::from)? {
            Some(e) => e,
            // Re-signed meanwhile (its expiry, addresses or free GPUs): the provider's current
            // offer, if it has the same GPUs at the same or a lower price.
            None => client
                .replaced_offers(id.to_string())
                .await
                .map_err(NegotiateError::from)?
                .into_iter()
                .find(|r| r.old == id && r.equivalent)
                .map(|r| r.current)
                .ok_or(RentError::UnknownOffer(id))?,
        };
        if entry.offer.provider == client.key().public() {
            return Err(RentError::OwnOffer(id));
        }
        // A volume lease (issue 47) runs no container: only the offer's volume terms apply.
        if req.volume.is_some() {
            if !entry.offer.sandbox.volumes.offered() {
                return Err(RentError::Rejected(
                    gridlease_protocol::RejectReason::VolumeRefused {
                        refusal: gridlease_protocol::VolumeRefusal::NotOffered,
                    },
                ));
            }
            return self.negotiate_and_register(req, entry).await;
        }
        // The offer states the provider's image rules: a name they refuse is said here, before
        // anything is signed, in the provider's own words.
        let sb = &entry.offer.sandbox;
        let policy = gridlease_contracts::image::ImagePolicy {
            registries: sb.registries.clone(),
            prefixes: sb.image_prefixes.clone(),
            local_images: sb.local_images.clone(),
            ..Default::default()
        };
        if let Err(refusal) = gridlease_contracts::image::check_reference(&policy, &req.image) {
            return Err(RentError::ImageNotOffered {
                image: req.image.clone(),
                refusal,
                allowed: gridlease_contracts::image::policy_text(
                    &sb.registries,
                    &sb.image_prefixes,
                    &sb.local_images,
                ),
            });
        }
        let most = entry.offer.sandbox.output_retention_s;
        if req.keep_outputs_s > most {
            return Err(RentError::KeepOutputs {
                asked: req.keep_outputs_s,
                most,
            });
        }
        let most = entry.offer.sandbox.upload_hold_s;
        if req.upload_hold_s > most {
            return Err(RentError::UploadHold {
                asked: req.upload_hold_s,
                most,
            });
        }
        self.negotiate_and_register(req, entry).await
    }

    /// How a lease on `offer` would settle: on chain where this node and the offer name the
    /// same chain, token and contract (the offer's wallet checked); GLU only, and why,
    /// otherwise. The channel's epoch is 0 until the node reads it from the chain.
    pub fn settlement_for(
        &self,
        offer: &gridlease_protocol::Offer,
    ) -> Result<gridlease_protocol::wallet::LeaseSettlement, gridlease_contracts::settlement::GluOnly>
    {
        let ours = self.ctx.config.settlement.as_ref();
        gridlease_contracts::settlement::choose(
            self.ctx.client.network(),
            offer,
            ours.map(|s| (&s.chain, &s.binding)),
            0,
        )
    }

    /// The chain this node settles on (`None`: GLU only).
    pub fn chain(&self) -> Option<gridlease_protocol::wallet::ChainTerms> {
        self.ctx.config.settlement.as_ref().map(|s| s.chain)
    }

    /// A client of the chain this node settles on, when it has `chain_rpc`.
    pub async fn chain_client(
        &self,
    ) -> Option<Result<crate::chain::ChainClient, crate::chain::ChainError>> {
        super::channel::client(&self.ctx).await
    }

    /// Whether this node settles on a chain (its configuration names one).
    pub fn settles_on_chain(&self) -> bool {
        self.chain().is_some()
    }

    /// The last voucher of each of this node's leases settled on chain (`gridlease wallet`).
    pub async fn vouchers(&self) -> Result<Vec<super::wallet::VoucherView>, LeaseError> {
        let leases = self
            .ctx
            .store
            .call(|s| {
                s.leases_with_records()?
                    .into_iter()
                    .filter(|(l, _)| l.lease.terms.settlement.is_some())
                    .map(|(l, rec)| {
                        let redemption = s.redemption(&l.lease.id)?;
                        Ok((l, rec, redemption))
                    })
                    .collect::<Result<Vec<_>, crate::store::StoreError>>()
            })
            .await?;
        Ok(super::wallet::vouchers(&leases))
    }

    /// The terms for `req` on `entry`, negotiated with its provider; an accepted lease is
    /// stored and its renter session started.
    async fn negotiate_and_register(
        &self,
        req: RentRequest,
        entry: gridlease_contracts::book::BookEntry,
    ) -> Result<LeaseId, RentError> {
        let client = &self.ctx.client;
        let grace_s = self.ctx.config.renter_grace_s;
        let now = self.ctx.now();
        let mut terms = terms_for(
            client.network(),
            &entry,
            client.key().public(),
            &req,
            grace_s,
            fresh_nonce(),
            now,
        )?;
        match self.settlement_for(&entry.offer) {
            Ok(s) => {
                terms.settlement = Some(super::channel::fund(&self.ctx, s, terms.max_total).await?);
            }
            Err(why) => tracing::info!(offer = %entry.id, "this lease settles in GLU only: {why}"),
        }
        let clock = &*self.ctx.config.clock;
        let outcome =
            negotiate::negotiate(client, clock, terms, now.plus_secs(30), offer_addrs(&entry))
                .await?;
        match outcome {
            NegotiationOutcome::Accepted {
                lease_id, stored, ..
            } => {
                // The offer the terms were made from, for the lease's statement.
                if stored.lease.terms.offer_id == entry.id
                    && let Ok(bytes) = entry.signed.to_bytes()
                    && let Err(e) = self
                        .ctx
                        .store
                        .call(move |s| s.put_lease_offer(&lease_id, &bytes))
                        .await
                {
                    tracing::warn!(lease = %lease_id, error = %e, "cannot keep the lease's offer: its statement will lack it");
                }
                let declared = entry
                    .offer
                    .gpus
                    .iter()
                    .any(gridlease_protocol::OfferedGpu::declared);
                self.ask(|r| Cmd::Register(stored, declared, r))
                    .await
                    .map_err(|_| RentError::Closed)?;
                Ok(lease_id)
            }
            NegotiationOutcome::Rejected { reason, .. } => Err(RentError::Rejected(reason)),
        }
    }

    /// Every lease this node knows, live ones with their current metering (one ask to the
    /// actor, one store call).
    pub async fn leases(&self) -> Result<Vec<LeaseView>, LeaseError> {
        let live: HashMap<LeaseId, LeaseView> = self
            .ask(Cmd::Views)
            .await?
            .into_iter()
            .map(|v| (v.lease_id, v))
            .collect();
        let stored = self.ctx.store.call(|s| s.leases_with_records()).await?;
        let now = self.ctx.now();
        Ok(stored
            .into_iter()
            .map(|(l, rec)| match live.get(&l.lease.id) {
                Some(v) => v.clone().at(now),
                None => view::from_store(&l, &rec, now),
            })
            .collect())
    }

    /// The leases with a session on this node now (live ones), from memory.
    pub async fn live_leases(&self) -> Result<Vec<LeaseView>, LeaseError> {
        let now = self.ctx.now();
        Ok(self
            .ask(Cmd::Views)
            .await?
            .into_iter()
            .map(|v| v.at(now))
            .collect())
    }

    /// The peers that may open access streams here now: the renters of this provider's live
    /// leases and of finished ones whose outputs are still kept. The access server admits no
    /// one else to a stream slot (`access::authorize` then decides each request).
    pub async fn access_peers(&self) -> Result<std::collections::HashSet<PeerId>, LeaseError> {
        let mut out = std::collections::HashSet::new();
        for v in self.ask(Cmd::Views).await? {
            if v.role == Role::Provider
                && let Ok(p) = v.counterparty.parse()
            {
                out.insert(p);
            }
        }
        let now = self.ctx.now();
        let kept = self
            .ctx
            .store
            .call(move |s| {
                let mut renters = Vec::new();
                for (id, until) in s.kept_outputs()? {
                    if until > now
                        && let Some(l) = s.lease(&id)?
                        && l.role == Role::Provider
                    {
                        renters.push(l.lease.terms.renter);
                    }
                }
                Ok(renters)
            })
            .await?;
        out.extend(kept.into_iter().filter_map(|k| k.peer_id().ok()));
        Ok(out)
    }

    /// Lease `id`'s statement (`gridlease statement`): what this node keeps of it, signed.
    pub async fn statement(
        &self,
        id: LeaseId,
    ) -> Result<gridlease_protocol::statement::Statement, LeaseError> {
        self.ctx
            .store
            .call(move |s| s.statement(&id))
            .await?
            .ok_or(LeaseError::Unknown(id))
    }

    /// Total earned and spent, micro-units (one aggregate query).
    pub async fn ledger_totals(&self) -> Result<(u64, u64), LeaseError> {
        Ok(self.ctx.store.call(|s| s.ledger_totals()).await?)
    }

    /// One lease.
    pub async fn lease(&self, id: LeaseId) -> Result<Option<LeaseView>, LeaseError> {
        if let Some(w) = self.ask(|r| Cmd::Watch(id, r)).await? {
            return Ok(Some(w.borrow().clone().at(self.ctx.now())));
        }
        let found = self
            .ctx
            .store
            .call(move |s| {
                s.lease(&id)?
                    .map(|l| Ok((s.session_record(&id)?, l)))
                    .transpose()
            })
            .await?;
        Ok(found.map(|(rec, l)| view::from_store(&l, &rec, self.ctx.now())))
    }

    /// The view of lease `id` as its session publishes it, each change as it happens; `None`
    /// when no session runs the lease here (not live, or not this node's).
    pub async fn watch(
        &self,
        id: LeaseId,
    ) -> Result<Option<watch::Receiver<LeaseView>>, LeaseError> {
        self.ask(|r| Cmd::Watch(id, r)).await
    }

    /// Who provides lease `id`: `None` when this node has no such lease, `Some(None)` when
    /// this node is its provider, else the provider's peer id (read from the signed terms).
    pub async fn provider_of(&self, id: LeaseId) -> Result<Option<Option<PeerId>>, LeaseError> {
        let Some(l) = self.ctx.store.call(move |s| s.lease(&id)).await? else {
            return Ok(None);
        };
        match l.role {
            Role::Provider => Ok(Some(None)),
            Role::Renter => l
                .lease
                .terms
                .provider
                .peer_id()
                .map(|p| Some(Some(p)))
                .map_err(|e| LeaseError::Remote {
                    lease_id: id,
                    cause: e.into(),
                }),
        }
    }

    /// Resolves when the lease is settled or failed, with its final view. A lease stored but
    /// not yet running a session here (a rent still registering it, a restart resuming it) is
    /// waited for too.
    pub async fn wait_closed(&self, id: LeaseId) -> Result<LeaseView, LeaseError> {
        loop {
            if let Some(mut w) = self.ask(|r| Cmd::Watch(id, r)).await? {
                loop {
                    if w.borrow().is_terminal() {
                        return Ok(w.borrow().clone());
                    }
                    if w.changed().await.is_err() {
                        break;
                    }
                }
            }
            // No session (any more): the store has the state.
            let v = self.lease(id).await?.ok_or(LeaseError::Unknown(id))?;
            if v.is_terminal() {
                return Ok(v);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The live telemetry of a running lease taken after `after` (provider's clock): a
    /// provider's from its own ring, a renter's asked of the provider and checked
    /// ([`TelemetryBatch::validate`]) before it is answered. [`LeaseError::NotRunning`] when
    /// the lease does not run (any more).
    ///
    /// [`TelemetryBatch::validate`]: gridlease_protocol::telemetry::TelemetryBatch::validate
    pub async fn telemetry(
        &self,
        id: LeaseId,
        after: gridlease_protocol::Timestamp,
    ) -> Result<gridlease_protocol::telemetry::TelemetryBatch, LeaseError> {
        let l = self.ctx.stored_lease(id).await?;
        if l.lease.state.is_terminal() {
            return Err(LeaseError::NotRunning(id));
        }
        match l.role {
            Role::Provider => match self.ask(|r| Cmd::Telemetry(id, r)).await? {
                Some(ring) => Ok(ring.after(after)),
                None => Err(LeaseError::NotRunning(id)),
            },
            Role::Renter => {
                let req = SessionRequest::Telemetry {
                    lease_id: id,
                    after,
                };
                match self.provider_rpc(&l, req).await? {
                    SessionResponse::Telemetry(b) => {
                        b.validate(usize::from(l.lease.terms.gpu_count))
                            .map_err(|e| LeaseError::Remote {
                                lease_id: id,
                                cause: e.into(),
                            })?;
                        Ok(b)
                    }
                    SessionResponse::UnknownLease => Err(LeaseError::NotRunning(id)),
                    other => Err(unexpected(id, &other)),
                }
            }
        }
    }

    /// Container output from `from_offset`, at most [`wire::MAX_LOG_CHUNK`] bytes.
    pub async fn logs(&self, id: LeaseId, from_offset: u64) -> Result<LogChunk, LeaseError> {
        let max = wire::MAX_LOG_CHUNK;
        let live = self.ask(|r| Cmd::Watch(id, r)).await?;
        if let Some(l) = live.and_then(|w| logs::LiveLog::of(&w.borrow())) {
            return Ok(l.read(&self.ctx, &id, from_offset, max).await);
        }
        let l = self.ctx.stored_lease(id).await?;
        match l.role {
            Role::Provider => logs::logs_from_file(&self.ctx, &l, from_offset, max).await,
            Role::Renter => {
                let req = SessionRequest::Logs {
                    lease_id: id,
                    offset: from_offset,
                    max: wire::MAX_LOG_CHUNK,
                };
                match self.provider_rpc(&l, req).await? {
                    SessionResponse::Logs(chunk) => Ok(chunk),
                    other => Err(unexpected(id, &other)),
                }
            }
        }
    }

    /// Renter: tells the provider to start the command of a container held for uploads
    /// (`rent --upload`: the uploads are done). Also fine once it runs (the hold ran out).
    pub async fn begin(&self, id: LeaseId) -> Result<(), LeaseError> {
        let l = self.ctx.stored_lease(id).await?;
        if l.role != Role::Renter {
            return Err(LeaseError::Remote {
                lease_id: id,
                cause: RemoteError::NotRenter,
            });
        }
        match self
            .provider_rpc(&l, SessionRequest::Begin { lease_id: id })
            .await?
        {
            SessionResponse::NothingDue => Ok(()),
            other => Err(unexpected(id, &other)),
        }
    }

    /// Renter: one session request to the provider of `l`; an unreachable provider (or a key
    /// that is no peer id) is [`LeaseError::Remote`].
    async fn provider_rpc(
        &self,
        l: &StoredLease,
        req: SessionRequest,
    ) -> Result<SessionResponse, LeaseError> {
        let remote = |cause: RemoteError| LeaseError::Remote {
            lease_id: l.lease.id,
            cause,
        };
        let peer = l
            .lease
            .terms
            .provider
            .peer_id()
            .map_err(|e| remote(e.into()))?;
        session_rpc(&self.ctx, peer, req)
            .await
            .map_err(|e| remote(e.into()))
    }

    /// Stops a lease: a renter closes it (signed `LeaseClose`), a provider stops the container.
    pub async fn stop(&self, id: LeaseId) -> Result<(), LeaseError> {
        let (reply, rx) = oneshot::channel();
        if self
            .ask(|r| Cmd::ToSession(id, Box::new(SessionMsg::Stop(reply)), r))
            .await?
        {
            match rx.await {
                Ok(()) => Ok(()),
                // The session ended before it read the stop: the lease closed meanwhile (as
                // when it was already over); only a session that ended with the lease still
                // open (the node shutting down) leaves it unstopped.
                Err(_) => match self.ctx.store.call(move |s| s.lease(&id)).await? {
                    Some(l) if l.lease.state.is_terminal() => Ok(()),
                    Some(l) if l.lease.state == gridlease_contracts::LeaseState::Closing => Ok(()),
                    _ => Err(LeaseError::Closed),
                },
            }
        } else {
            match self.ctx.store.call(move |s| s.lease(&id)).await? {
                Some(_) => Ok(()), // already over
                None => Err(LeaseError::Unknown(id)),
            }
        }
    }

    /// Provider: stops a running lease because its owner takes the GPU back ([`owner`]; only
    /// for an interruptible offer). The same path as [`LeaseService::stop`], with close reason
    /// `OwnerReclaimed`; a lease already over is left as it is.
    pub(crate) async fn reclaim(&self, id: LeaseId) -> Result<(), LeaseError> {
        let (reply, rx) = oneshot::channel();
        if self
            .ask(|r| Cmd::ToSession(id, Box::new(SessionMsg::Reclaim(reply)), r))
            .await?
        {
            rx.await.map_err(|_| LeaseError::Closed)
        } else {
            Ok(())
        }
    }

    /// Extends a running lease this node rents ([`extend`]): answers once the provider has
    /// accepted (and both sides stored) the amendment, or with why not.
    pub async fn extend(&self, id: LeaseId, req: ExtendRequest) -> Result<Extended, ExtendError> {
        let add_s = req.added_s()?;
        let (reply, rx) = oneshot::channel();
        let ask = extend::ExtendAsk {
            add_s,
            max_total: req.max_total,
            reply,
        };
        let msg = Box::new(SessionMsg::Extend(Box::new(ask)));
        let sent = self
            .ask(|r| Cmd::ToSession(id, msg, r))
            .await
            .map_err(|_| ExtendError::Closed)?;
        if sent {
            return rx.await.map_err(|_| ExtendError::Closed)?;
        }
        // No session: the lease is over (or not this node's).
        match self.ctx.store.call(move |s| s.lease(&id)).await? {
            Some(l) if l.role == Role::Provider => Err(ExtendError::NotRenter(id)),
            Some(l) => Err(ExtendError::Refused(
                gridlease_protocol::AmendRefusal::NotRunning {
                    state: l.lease.state.as_str().to_string(),
                },
            )),
            None => Err(ExtendError::Unknown(id)),
        }
    }

    /// Co-signed completion records this node holds (its own and gossiped ones), newest
    /// first, at most `limit`: each record and the signed pair.
    pub async fn completions(
        &self,
        limit: usize,
    ) -> Vec<(
        gridlease_protocol::completion::Completion,
        gridlease_protocol::completion::CoSigned,
    )> {
        completion::list(&self.ctx, limit).await
    }

    /// Re-checks the GPUs of running lease `id` (`gridlease verify-gpu`): the renter's GPU
    /// check again, billed as usage. The lease runs on whatever it finds.
    pub async fn verify_gpu(
        &self,
        id: LeaseId,
    ) -> Result<super::gpu_check::GpuCheckView, LeaseError> {
        let (reply, rx) = oneshot::channel();
        let msg = Box::new(SessionMsg::VerifyGpu(reply));
        let sent = self.ask(|r| Cmd::ToSession(id, msg, r)).await?;
        if !sent {
            return match self.ctx.store.call(move |s| s.lease(&id)).await? {
                Some(_) => Err(LeaseError::NotRunning(id)),
                None => Err(LeaseError::Unknown(id)),
            };
        }
        rx.await
            .map_err(|_| LeaseError::Closed)?
            .map_err(|why| LeaseError::NoGpuCheck(id, why))
    }

    /// The GPU checks of `provider`'s leases this node kept (issue 44): passed and failed.
    pub async fn gpu_checks(
        &self,
        provider: gridlease_protocol::PublicKey,
    ) -> Result<crate::store::CheckCounts, LeaseError> {
        Ok(self
            .ctx
            .store
            .call(move |s| s.proof_counts(&provider))
            .await?)
    }

    /// The ledger: statements per lease and counterparty, totals earned and spent.
    pub async fn ledger(&self) -> Result<Ledger, LeaseError> {
        let rows = self.ctx.store.call(|s| s.ledger_rows()).await?;
        let leases = self.ctx.store.call(|s| s.leases(None)).await?;
        Ok(view::ledger(&rows, &leases))
    }

    /// Sets what this node offers and republishes it (withdraws it with `enabled: false`). A
    /// daemon keeps the settings in `<home>/provide.json`; `gridlease node` starts from them.
    pub async fn provide(&self, s: ProvideSettings) -> Result<(), ProvideError> {
        self.apply_provide(&s).await?;
        if let Some(path) = &self.ctx.config.provide_file
            && let Err(e) = s.save(path)
        {
            tracing::warn!(path = %path.display(), error = %e, "provide settings not saved: a restart will not keep them");
        }
        Ok(())
    }

    /// The settings last applied: from `<home>/provide.json` in a daemon (what `provide`
    /// saved), `None` before the first `provide`.
    pub fn provide_settings(&self) -> Option<ProvideSettings> {
        let path = self.ctx.config.provide_file.as_ref()?;
        match ProvideSettings::load(path) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "provide settings unreadable");
                None
            }
        }
    }

    /// The provider's schedule now (`None` when it does not provide): the hours, their zone,
    /// whether they offer the GPUs now and until when (by the service's clock).
    pub fn schedule(&self) -> Option<hours::ScheduleNow> {
        let now = self.ctx.now();
        self.ctx.hours.borrow().as_ref().map(|h| h.now(now))
    }

    /// The cache of images pulled for leases: what it holds and its bounds.
    pub async fn image_cache(
        &self,
    ) -> (images::CacheUsage, gridlease_contracts::image::CacheLimits) {
        (
            images::usage(&self.ctx.store).await,
            self.ctx.config.image_cache,
        )
    }

    /// The image rules of the node's start-up offer template (its configuration).
    pub fn base_images(&self) -> ImagePolicy {
        self.ctx
            .config
            .base_template
            .as_ref()
            .map(|t| t.images.clone())
            .unwrap_or_default()
    }

    async fn apply_provide(&self, s: &ProvideSettings) -> Result<(), ProvideError> {
        let t = s.template(self.ctx.config.base_template.as_ref())?;
        let hours = if s.enabled {
            Some(hours::Hours::resolve(s).map_err(ProvideError::Hours)?)
        } else {
            None
        };
        self.ctx.client.set_offer(t).await?;
        self.ctx.hours.send_replace(hours);
        // Other GPUs may be offered now: count the free ones again.
        self.ctx.holds.send_modify(|_| {});
        Ok(())
    }
}

/// Starts the lease service of a daemon with `config` (the daemon's settings laid over
/// [`LeaseServiceConfig::new`]`(<home>/leases)` by the caller): Docker if reachable (without
/// it, leases this node provides fail to start with `StartFailed`; renting works).
pub async fn start_for_daemon(
    node: &crate::net::Node,
    home: &std::path::Path,
    mut config: LeaseServiceConfig,
    base_template: Option<OfferTemplate>,
    gpu_uuids: BTreeMap<Digest, String>,
    gpu_sampler: Option<SharedGpuSampler>,
) -> Result<LeaseService, LeaseError> {
    config.base_template = base_template;
    config.gpu_uuids = gpu_uuids;
    config.gpu_sampler = gpu_sampler;
    config.provide_file = Some(ProvideSettings::path(home));
    // The daemon is the `gridlease` binary, which runs `__watchdog`.
    config.watchdog = std::env::current_exe().ok();
    let sandbox = match Sandbox::connect().await {
        Ok(sb) => Some(sb),
        Err(e) => {
            tracing::warn!(error = %e, "Docker is unreachable: this node cannot run leases");
            None
        }
    };
    LeaseService::start(
        node.client.clone(),
        &node.events,
        config,
        sandbox,
        node.cancel.child_token(),
    )
    .await
}

/// A provider's answer that does not fit the request, as an error.
pub(super) fn unexpected(lease_id: LeaseId, answer: &SessionResponse) -> LeaseError {
    let cause = match answer {
        // The provider's per-renter rate (logs::PEER_LOG_RATE) or its queues are full.
        SessionResponse::Busy => RemoteError::Busy,
        other => RemoteError::Unexpected(Box::new(other.clone())),
    };
    LeaseError::Remote { lease_id, cause }
}
