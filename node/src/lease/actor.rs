//! The service's actor: one task that owns the provider's desk, the live sessions and the
//! inbound lease-stream requests; [`super::LeaseService`] talks to it with [`Cmd`]s.

use std::collections::HashMap;
use std::sync::Arc;

use gridlease_protocol::session::LeaseRpcResponse;
use gridlease_protocol::{Digest, LeaseId, NetworkPolicy, PeerId, PublicKey, RejectReason, Signed};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;

use super::config::SESSION_QUEUE;
use super::ctx::Ctx;
use super::error::LeaseError;
use super::session::{InboundSession, SessionMsg, SessionReply};
use super::view::{self, LeaseView};
use super::wire::{SessionRequest, SessionResponse};
use super::{completion, desk, egress, images, logs, outputs, provider, renter, telemetry};
use crate::net::{InboundLease, InboundRequest};
use crate::store::lease::SessionRecord;
use crate::store::{Role, StoreError, StoredLease};

/// What the [`super::LeaseService`] handle asks of the actor.
pub(super) enum Cmd {
    /// A renter lease negotiated and stored by this node: start its session.
    /// A lease just made here as the renter, and whether its offer declared its GPUs.
    Register(Box<StoredLease>, bool, oneshot::Sender<()>),
    Views(oneshot::Sender<Vec<LeaseView>>),
    Watch(LeaseId, oneshot::Sender<Option<watch::Receiver<LeaseView>>>),
    ToSession(LeaseId, Box<SessionMsg>, oneshot::Sender<bool>),
    /// A provider lease's telemetry ring, while its session runs.
    Telemetry(LeaseId, oneshot::Sender<Option<telemetry::Ring>>),
}

impl std::fmt::Debug for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cmd")
    }
}

struct Entry {
    inbox: mpsc::Sender<SessionMsg>,
    view: watch::Receiver<LeaseView>,
    /// Provider: the lease's renter and its live telemetry (`None` on the renter side).
    telemetry: Option<(Option<PeerId>, telemetry::Ring)>,
    /// Provider: the terms hold the container for the renter's uploads before its command.
    upload_hold: bool,
}

/// A provider lease's store write, finished.
struct Persisted {
    stored: Box<StoredLease>,
    accept: Signed<gridlease_protocol::LeaseAccept>,
    result: Result<Option<StoredLease>, StoreError>,
}

/// Provider: what the daemon or the registry said about a request's image.
struct Vetted {
    proposal: Box<crate::net::Proposal>,
    reply: oneshot::Sender<LeaseRpcResponse>,
    image: gridlease_contracts::image::ImageRef,
    facts: Result<gridlease_contracts::image::ImageFacts, gridlease_protocol::ImageRefusal>,
}

/// How a session task ended.
struct SessionEnd {
    id: LeaseId,
    /// Provider: the container is gone (or never existed), so the GPUs are free.
    released: bool,
}

/// The actor: owns the sessions and the provider's desk (see the module docs).
pub(super) struct Actor {
    ctx: Arc<Ctx>,
    cmds: mpsc::Receiver<Cmd>,
    inbound: mpsc::Receiver<InboundLease>,
    /// Provider: sessions whose GPUs are free ([`Ctx::gpus_free`]).
    released: mpsc::Receiver<LeaseId>,
    /// Provider: leases whose workspace a volume adopts ([`Ctx::hand_over`]).
    handovers: mpsc::Receiver<LeaseId>,
    sessions: HashMap<LeaseId, Entry>,
    tasks: JoinSet<SessionEnd>,
    /// Provider: decisions, GPU holds, nonces.
    desk: desk::Desk,
    /// Provider: accepted leases being stored.
    persists: JoinSet<Persisted>,
    /// Provider: requests whose image is being asked about (at most [`images::MAX_VETTING`]).
    vets: JoinSet<Vetted>,
    /// Provider: facts about images asked about recently.
    facts: images::FactsCache,
    /// Provider: log requests per peer ([`logs::PEER_LOG_RATE`]); over it a peer gets `Busy`.
    log_rate: crate::net::ratelimit::RateLimiter<gridlease_protocol::PeerId>,
    /// Provider: answers waiting for a lease's store write (the first request and identical
    /// retries that came meanwhile).
    waiting: HashMap<LeaseId, Vec<oneshot::Sender<LeaseRpcResponse>>>,
}

impl Actor {
    /// An actor with no sessions yet, taking `cmds` from the handle, `inbound` from the
    /// network loop and `released` from provider sessions ([`Ctx::gpus_free`]).
    pub(super) fn new(
        ctx: Arc<Ctx>,
        cmds: mpsc::Receiver<Cmd>,
        inbound: mpsc::Receiver<InboundLease>,
        released: mpsc::Receiver<LeaseId>,
        handovers: mpsc::Receiver<LeaseId>,
    ) -> Self {
        Self {
            ctx,
            cmds,
            inbound,
            released,
            handovers,
            sessions: HashMap::new(),
            tasks: JoinSet::new(),
            desk: desk::Desk::new(),
            persists: JoinSet::new(),
            vets: JoinSet::new(),
            facts: images::FactsCache::default(),
            log_rate: crate::net::ratelimit::RateLimiter::new(logs::PEER_LOG_RATE, 1024),
            waiting: HashMap::new(),
        }
    }

    /// Runs until the service is cancelled (or its handle and the network loop are gone),
    /// then ends the sessions and tears down the egress fence.
    pub(super) async fn run(mut self) {
        loop {
            tokio::select! {
                biased;
                () = self.ctx.cancel.cancelled() => break,
                Some(id) = self.released.recv() => {
                    self.desk.release(&id);
                    self.publish_holds();
                }
                Some(id) = self.handovers.recv() => {
                    // Never waits on a session: a full inbox is asked again.
                    if let Some(e) = self.sessions.get(&id) {
                        let _ = e.inbox.try_send(SessionMsg::HandOver);
                    }
                }
                Some(done) = self.vets.join_next(), if !self.vets.is_empty() => match done {
                    Ok(v) => self.on_vetted(v),
                    Err(e) => tracing::error!(error = %e, "image check task failed"),
                },
                Some(done) = self.persists.join_next(), if !self.persists.is_empty() => match done {
                    Ok(p) => {
                        self.on_persisted(p);
                        self.publish_holds();
                    }
                    Err(e) => tracing::error!(error = %e, "lease write task failed"),
                },
                Some(done) = self.tasks.join_next(), if !self.tasks.is_empty() => match done {
                    Ok(end) => self.on_session_end(end),
                    Err(e) => tracing::error!(error = %e, "lease session task failed"),
                },
                cmd = self.cmds.recv() => match cmd {
                    Some(cmd) => self.on_cmd(cmd).await,
                    None => break,
                },
                msg = self.inbound.recv() => match msg {
                    Some(m) => self.on_inbound(m),
                    None => break,
                },
            }
        }
        self.tasks.shutdown().await;
        // Containers of live leases keep running across a restart; the teardown keeps the
        // egress fence for them and removes it otherwise.
        if let Some(sb) = &self.ctx.sandbox {
            egress::teardown(&self.ctx, sb).await;
        }
    }

    /// Publishes the desk's held GPUs (to [`capacity::run`]) when they changed.
    pub(super) fn publish_holds(&self) {
        let held = self.desk.held_gpus();
        self.ctx.holds.send_if_modified(|cur| {
            let changed = *cur != held;
            *cur = held;
            changed
        });
        let gib: u64 = self
            .desk
            .volumes()
            .values()
            .map(|v| u64::from(v.size_gib))
            .sum();
        self.ctx.volume_gib.send_if_modified(|cur| {
            let changed = *cur != gib;
            *cur = gib;
            changed
        });
    }

    fn on_session_end(&mut self, end: SessionEnd) {
        self.sessions.remove(&end.id);
        self.ctx.log_sweep.notify_one();
        if end.released {
            self.desk.release(&end.id);
            self.publish_holds();
            self.evict_images();
        } else if self.desk.holds(&end.id) && !self.ctx.cancel.is_cancelled() {
            tracing::error!(lease = %end.id, "the lease's container could not be removed: its GPUs stay held until the next start reconciles it");
        }
    }

    /// Provider: trims the image cache in the background, sparing the live leases' images.
    fn evict_images(&mut self) {
        let Some(sb) = self.ctx.sandbox.clone() else {
            return;
        };
        let in_use: std::collections::BTreeSet<String> = self
            .sessions
            .values()
            .map(|e| images::canonical(&e.view.borrow().image))
            .collect();
        let (store, limits) = (self.ctx.store.clone(), self.ctx.config.image_cache);
        tokio::spawn(async move {
            images::evict(&store, &sb, limits, &in_use).await;
        });
    }

    async fn on_cmd(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Register(stored, gpus_declared, reply) => {
                if !self.sessions.contains_key(&stored.lease.id) {
                    let rec = SessionRecord {
                        gpus_declared,
                        ..SessionRecord::default()
                    };
                    self.spawn(*stored, rec);
                }
                let _ = reply.send(());
            }
            Cmd::Views(reply) => {
                let v = self.sessions.values().map(|e| e.view.borrow().clone());
                let _ = reply.send(v.collect());
            }
            Cmd::Watch(id, reply) => {
                let _ = reply.send(self.sessions.get(&id).map(|e| e.view.clone()));
            }
            Cmd::Telemetry(id, reply) => {
                let ring = self.sessions.get(&id).and_then(|e| e.telemetry.as_ref());
                let _ = reply.send(ring.map(|(_, r)| r.clone()));
            }
            Cmd::ToSession(id, msg, reply) => {
                let ok = match self.sessions.get(&id) {
                    Some(e) => e.inbox.send(*msg).await.is_ok(),
                    None => false,
                };
                let _ = reply.send(ok);
            }
        }
    }

    fn on_inbound(&mut self, m: InboundLease) {
        let InboundLease {
            peer,
            request,
            reply,
        } = m;
        match request {
            InboundRequest::Propose(p) => self.on_propose(p, reply),
            InboundRequest::Session(request) => self.on_session(InboundSession {
                peer,
                request,
                reply: SessionReply(reply),
            }),
        }
    }

    /// Provider: a request arrived. Its image is checked first (before anything is signed):
    /// the reference against the offer's image rules, then what the daemon or the registry
    /// says about the image (cached, or asked in a bounded task); then the desk decides.
    fn on_propose(
        &mut self,
        p: Box<crate::net::Proposal>,
        reply: oneshot::Sender<LeaseRpcResponse>,
    ) {
        use gridlease_contracts::image::{admit, check_reference};
        let Some(cur) = p.offer.as_ref() else {
            return self.decide(&p, Ok(()), reply);
        };
        let terms = &p.verified.message.terms;
        let Ok(image) = check_reference(&cur.images, &terms.image) else {
            // The desk refuses it with the reference's own reason.
            return self.decide(&p, Ok(()), reply);
        };
        if let Some(f) = self.facts.get(&image.canonical()) {
            let cuda = images::host_cuda(&cur.offer, terms.gpu_count);
            let admitted = admit(&cur.images, &image, f, cuda.as_deref());
            return self.decide(&p, admitted, reply);
        }
        if self.vets.len() >= images::MAX_VETTING {
            let busy = gridlease_protocol::ImageRefusal::Unavailable {
                detail: "the provider is checking too many images now; try again shortly".into(),
            };
            return self.decide(&p, Err(busy), reply);
        }
        let (sandbox, policy) = (self.ctx.sandbox.clone(), cur.images.clone());
        self.vets.spawn(async move {
            let facts = images::facts(sandbox, image.clone(), &policy).await;
            Vetted {
                proposal: p,
                reply,
                image,
                facts,
            }
        });
    }

    fn on_vetted(&mut self, v: Vetted) {
        let Vetted {
            proposal,
            reply,
            image,
            facts,
        } = v;
        let admitted = match (&facts, proposal.offer.as_ref()) {
            (Ok(f), Some(cur)) => {
                let cuda = images::host_cuda(&cur.offer, proposal.verified.message.terms.gpu_count);
                gridlease_contracts::image::admit(&cur.images, &image, f, cuda.as_deref())
            }
            (Ok(_), None) => Ok(()),
            (Err(r), _) => Err(r.clone()),
        };
        if let Ok(f) = facts {
            self.facts.put(image.canonical(), f);
        }
        if let Err(r) = &admitted {
            tracing::info!(image = %image.canonical(), reason = ?r, "image refused before signing");
        }
        self.decide(&proposal, admitted, reply);
    }

    /// Provider: whether `renter` has a lease here whose container is (or is about to be) held
    /// for its uploads, its command not started.
    fn holds_uploads_for(&self, renter: &PublicKey) -> bool {
        let peer = renter.peer_id().ok();
        self.sessions.values().any(|e| {
            e.upload_hold
                && e.telemetry.as_ref().is_some_and(|(p, _)| *p == peer)
                && matches!(
                    e.view.borrow().state,
                    gridlease_contracts::LeaseState::Accepted
                        | gridlease_contracts::LeaseState::Starting
                )
        })
    }

    /// Provider: the desk decides; an accepted lease is stored before it is answered.
    fn decide(
        &mut self,
        p: &crate::net::Proposal,
        image: Result<(), gridlease_protocol::ImageRefusal>,
        reply: oneshot::Sender<LeaseRpcResponse>,
    ) {
        let (signed, verified, offer) = (&p.signed, &p.verified, p.offer.as_ref());
        let key = self.ctx.client.key();
        let network = self.ctx.client.network();
        let now = self.ctx.now();
        // One held container per renter: a held container keeps its GPUs from everyone, and
        // many of them from one renter would let it take the provider's GPUs for nothing.
        let terms = &verified.message.terms;
        if terms.upload_hold_s > 0 && self.holds_uploads_for(&verified.signer) {
            let lease_id = terms.lease_id().unwrap_or(LeaseId(Digest::default()));
            let _ = reply.send(crate::net::reject(
                key,
                network,
                lease_id,
                terms.nonce,
                gridlease_protocol::RejectReason::HoldBusy,
                now,
            ));
            return;
        }
        self.desk
            .set_owner_busy(self.ctx.owner_busy.borrow().clone());
        let room = desk::VolumeRoom {
            max_volumes: self.ctx.config.volumes.max_volumes,
            free_gib: if terms.volume.is_some() {
                self.volume_free_gib()
            } else {
                0
            },
        };
        let sessions = &self.sessions;
        let live = |id: &LeaseId| {
            let v = sessions.get(id)?.view.borrow().clone();
            (v.role == crate::store::Role::Provider
                && v.state == gridlease_contracts::LeaseState::Running)
                .then(|| {
                    v.started_at
                        .map(|s| s.saturating_add(u64::from(v.duration_s) * 1000))
                })
                .flatten()
                .map(gridlease_protocol::Timestamp)
        };
        let volumes = desk::VolumeContext { room, live: &live };
        match self
            .desk
            .decide(key, network, offer, signed, verified, image, volumes, now)
        {
            desk::Decision::Respond(r) => {
                let _ = reply.send(r);
            }
            desk::Decision::Wait { lease_id } => {
                self.waiting.entry(lease_id).or_default().push(reply);
            }
            desk::Decision::Persist { stored, accept } => {
                self.waiting.entry(stored.lease.id).or_default().push(reply);
                let store = self.ctx.store.clone();
                // The offer the terms name, for the lease's statement: the one advertised now
                // (a request made from an earlier signature of it keeps none).
                let offer_bytes = offer
                    .filter(|o| o.id == stored.lease.terms.offer_id)
                    .and_then(|o| o.signed.to_bytes().ok());
                self.persists.spawn(async move {
                    let row = (*stored).clone();
                    // An identical lease already stored (a retry after a restart forgot its
                    // nonce) is answered with its stored acceptance, and not started again.
                    let result = store
                        .call(move |s| {
                            if s.insert_lease(&row)? {
                                if let Some(b) = &offer_bytes {
                                    s.put_lease_offer(&row.lease.id, b)?;
                                }
                                Ok(None)
                            } else {
                                s.lease(&row.lease.id)
                            }
                        })
                        .await;
                    Persisted {
                        stored,
                        accept,
                        result,
                    }
                });
            }
        }
    }

    /// Provider: GiB of disk a new volume may take now: the workspaces' filesystem's free
    /// space less the reserve, the kept volumes and every live lease's workspace (each counted
    /// whole, though sparse until written: a promise is kept, never overbooked).
    fn volume_free_gib(&self) -> u64 {
        let dir = self.ctx.workspace_dir();
        let at = dir.ancestors().find(|p| p.is_dir()).unwrap_or(&dir);
        let Ok(space) = gridlease_sandbox::host::disk_space(at) else {
            return 0;
        };
        let mut promised: u64 = 0;
        for e in self.sessions.values() {
            let v = e.view.borrow();
            if v.role == crate::store::Role::Provider && !v.state.is_terminal() {
                promised = promised.saturating_add(v.disk_bytes);
            }
        }
        for (id, k) in self.desk.volumes() {
            if !self.sessions.contains_key(id) {
                promised = promised.saturating_add(u64::from(k.size_gib) << 30);
            }
        }
        let gib = 1u64 << 30;
        (space.free_bytes / gib)
            .saturating_sub(self.ctx.config.volumes.reserve_disk_gib)
            .saturating_sub(promised.div_ceil(gib))
    }

    fn on_persisted(&mut self, p: Persisted) {
        let Persisted {
            stored,
            accept,
            result,
        } = p;
        let id = stored.lease.id;
        let waiters = self.waiting.remove(&id).unwrap_or_default();
        let now = self.ctx.now();
        let (key, network) = (self.ctx.client.key(), self.ctx.client.network());
        let t = &stored.lease.terms;
        let response = match result {
            Ok(None) => {
                self.desk.persisted(&stored, accept.clone());
                tracing::info!(lease = %id.short(), gpus = stored.gpus.len(), "lease accepted");
                let rec = SessionRecord {
                    gpus_declared: self.ctx.config.base_template.as_ref().is_some_and(|t| {
                        t.gpus.iter().any(gridlease_protocol::OfferedGpu::declared)
                    }),
                    ..SessionRecord::default()
                };
                self.spawn(*stored, rec);
                LeaseRpcResponse::Accepted(accept)
            }
            Ok(Some(existing)) => {
                // Stored before: its own holds (if live) were restored at start.
                self.desk.persist_failed(&stored);
                match existing.accept.clone() {
                    Some(a) => {
                        if !existing.lease.state.is_terminal() {
                            self.desk.restore(&existing);
                        }
                        LeaseRpcResponse::Accepted(a)
                    }
                    None => {
                        crate::net::reject(key, network, id, t.nonce, RejectReason::Internal, now)
                    }
                }
            }
            Err(e) => {
                tracing::error!(lease = %id, error = %e, "cannot persist lease");
                self.desk.persist_failed(&stored);
                let reason = match e {
                    StoreError::NonceConflict { .. } => RejectReason::DuplicateNonce,
                    _ => RejectReason::Internal,
                };
                crate::net::reject(key, network, id, t.nonce, reason, now)
            }
        };
        for w in waiters {
            let _ = w.send(response.clone());
        }
    }

    fn on_session(&mut self, m: InboundSession) {
        if let SessionRequest::Telemetry { lease_id, after } = m.request {
            // Answered from the lease's ring, never by the session; only to its renter, while
            // it runs here; rate-limited with the log reads.
            if !self.log_rate.check(&m.peer, self.ctx.now()) {
                let _ = m.reply.send(SessionResponse::Busy);
                return;
            }
            let answer = match self
                .sessions
                .get(&lease_id)
                .and_then(|e| e.telemetry.as_ref())
            {
                Some((renter, ring)) if *renter == Some(m.peer) => {
                    SessionResponse::Telemetry(ring.after(after))
                }
                _ => SessionResponse::UnknownLease,
            };
            let _ = m.reply.send(answer);
            return;
        }
        if let SessionRequest::Logs {
            lease_id,
            offset,
            max,
        } = m.request
        {
            // Answered from the output file by a task of its own, never by the session; a
            // peer over its rate, or more readers than the pool, get `Busy` (renters retry).
            if !self.log_rate.check(&m.peer, self.ctx.now()) {
                let _ = m.reply.send(SessionResponse::Busy);
                return;
            }
            let Ok(permit) = self.ctx.log_reads.clone().try_acquire_owned() else {
                let _ = m.reply.send(SessionResponse::Busy);
                return;
            };
            let live = self
                .sessions
                .get(&lease_id)
                .map(|e| e.view.borrow().clone());
            let ctx = self.ctx.clone();
            tokio::spawn(async move {
                let r = logs::serve_renter(&ctx, live, m.peer, lease_id, offset, max).await;
                let _ = m.reply.send(r);
                drop(permit);
            });
            return;
        }
        if let SessionRequest::Complete(_) = m.request {
            // A settled lease's record: answered from the store, never by a session.
            if !self.log_rate.check(&m.peer, self.ctx.now()) {
                let _ = m.reply.send(SessionResponse::Busy);
                return;
            }
            let ctx = self.ctx.clone();
            tokio::spawn(async move {
                let r = completion::answer(&ctx, m.peer, &m.request).await;
                let _ = m.reply.send(r);
            });
            return;
        }
        let entry = m.request.lease_hint().and_then(|id| self.sessions.get(&id));
        if let (
            None,
            SessionRequest::Reports {
                lease_id,
                after_seq,
            },
        ) = (entry, &m.request)
        {
            // A finished lease's reports and close, from the store (a running one's session
            // answers, noting that its renter is back).
            if !self.log_rate.check(&m.peer, self.ctx.now()) {
                let _ = m.reply.send(SessionResponse::Busy);
                return;
            }
            let (ctx, lease_id, after_seq) = (self.ctx.clone(), *lease_id, *after_seq);
            tokio::spawn(async move {
                let r = provider::serve_reports(&ctx, m.peer, lease_id, after_seq).await;
                let over =
                    matches!(&r, SessionResponse::Reports(b) if b.close.is_some() && !b.more);
                let _ = m.reply.send(r);
                if over {
                    // A renter that was away at the settlement is back: the lease's record
                    // can be co-signed now (once).
                    completion::propose_stored(ctx, m.peer, lease_id).await;
                }
            });
            return;
        }
        match entry {
            Some(e) => {
                if let Err(mpsc::error::TrySendError::Full(SessionMsg::Inbound(m))) =
                    e.inbox.try_send(SessionMsg::Inbound(Box::new(m)))
                {
                    let _ = m.reply.send(SessionResponse::Busy);
                }
            }
            None => {
                if let SessionRequest::Close(_) = m.request {
                    // A renter that already settled (e.g. it gave up on a provider that then
                    // came back) still returns its last receipt, so both statements agree.
                    let ctx = self.ctx.clone();
                    tokio::spawn(async move {
                        let r = renter::answer_late_close(&ctx, m.peer, &m.request).await;
                        let _ = m.reply.send(r);
                    });
                } else {
                    let _ = m.reply.send(SessionResponse::UnknownLease);
                }
            }
        }
    }

    /// At start-up: reconciles containers with the live stored leases, holds the GPUs of the
    /// live provider leases and starts their sessions. Reads live leases only.
    pub(super) async fn resume_all(&mut self) -> Result<(), LeaseError> {
        let live = self.ctx.store.call(|s| s.live_leases()).await?;
        if let Some(sb) = &self.ctx.sandbox {
            // Finished leases whose outputs are still kept stay too (expired ones go first).
            let mut keep = outputs::sweep(&self.ctx).await;
            keep.extend(
                live.iter()
                    .filter(|(l, _)| l.role == Role::Provider)
                    .map(|(l, _)| l.lease.id),
            );
            match sb.reconcile(&self.ctx.node_id, &keep).await {
                Ok(r) => tracing::info!(
                    removed = r.removed.len(),
                    kept = r.kept.len(),
                    missing = r.missing.len(),
                    "containers reconciled"
                ),
                Err(e) => tracing::warn!(error = %e, "container reconciliation failed"),
            }
            // After the containers: a workspace still mounted by one cannot be removed.
            let dir = self.ctx.workspace_dir();
            // A live volume made of a lease's workspace keeps that workspace until it is
            // handed over, though its lease is over.
            let mut workspaces = keep.clone();
            workspaces.extend(
                live.iter()
                    .filter(|(l, _)| l.role == Role::Provider)
                    .filter_map(|(l, _)| l.lease.terms.volume.as_ref()?.adopts),
            );
            match sb
                .reconcile_workspaces(&dir, &self.ctx.node_id, &workspaces)
                .await
            {
                Ok(r) => tracing::info!(
                    removed = r.removed.len(),
                    kept = r.kept.len(),
                    "workspaces reconciled"
                ),
                Err(e) => tracing::warn!(error = %e, "workspace reconciliation failed"),
            }
            let egress = live.iter().any(|(l, _)| {
                l.role == Role::Provider && l.lease.terms.network_policy == NetworkPolicy::Egress
            });
            egress::reconcile(&self.ctx, sb, egress).await;
        }
        for (l, rec) in live {
            self.desk.restore(&l);
            self.spawn(l, rec);
        }
        Ok(())
    }

    fn spawn(&mut self, l: StoredLease, rec: SessionRecord) {
        let id = l.lease.id;
        let (inbox_tx, inbox) = mpsc::channel(SESSION_QUEUE);
        let initial = view::from_store(&l, &rec, self.ctx.now());
        let (view_tx, view_rx) = watch::channel(initial);
        let ctx = self.ctx.clone();
        let role = l.role;
        // A provider lease's telemetry: the session writes it, the service serves the renter.
        let ring = (role == Role::Provider).then(|| self.ctx.telemetry_ring(&l.gpus));
        let entry_ring = ring
            .clone()
            .map(|r| (l.lease.terms.renter.peer_id().ok(), r));
        let upload_hold_s = l.lease.terms.upload_hold_s;
        let span = tracing::info_span!("lease", lease = %id.short(), role = ?role);
        let fut = async move {
            // A ring exactly for provider leases.
            let released = match ring {
                Some(ring) => provider::run(ctx, l, rec, inbox, view_tx, ring).await,
                None => {
                    renter::run(ctx, l, rec, inbox, view_tx).await;
                    true
                }
            };
            SessionEnd { id, released }
        };
        self.tasks.spawn(tracing::Instrument::instrument(fut, span));
        let upload_hold = role == Role::Provider && upload_hold_s > 0;
        self.sessions.insert(
            id,
            Entry {
                inbox: inbox_tx,
                view: view_rx,
                telemetry: entry_ring,
                upload_hold,
            },
        );
    }
}
