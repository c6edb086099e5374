//! The provider side of negotiation, as state owned by the event loop: the node's own offer,
//! which GPUs are held by leases, and the nonce index that makes requests idempotent.
//!
//! Decisions are synchronous and never touch SQLite; persisting an accepted lease is handed to
//! the store thread and the response is sent only after the write committed.

use std::collections::BTreeMap;

use gridlease_contracts::terms::{ProviderView, check_request};
use gridlease_contracts::{Actor, Lease, LeaseEvent};
use gridlease_protocol::{
    Digest, LeaseAccept, LeaseId, LeaseReject, LeaseRequest, NetworkId, NetworkPolicy, NodeKey,
    Offer, OfferId, OfferedGpu, PublicKey, RejectReason, ResourcesPerGpu, SandboxPolicy, Signed,
    Timestamp, Verified,
};

use crate::store::{Role, StoredLease};

use super::codec::LeaseRpcResponse;

/// What this node offers, before sequence and timestamps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OfferTemplate {
    /// GPUs offered.
    pub gpus: Vec<OfferedGpu>,
    /// Asking price per GPU-hour, micro-units.
    pub price_per_gpu_hour: u64,
    /// Host resources per GPU.
    pub per_gpu: ResourcesPerGpu,
    /// Shortest lease, seconds.
    pub min_duration_s: u32,
    /// Longest lease, seconds.
    pub max_duration_s: u32,
    /// Minimum billed seconds.
    pub min_billed_s: u32,
    /// Usage report interval, seconds.
    pub usage_interval_s: u32,
    /// Pay-ahead window, seconds.
    pub pay_ahead_s: u32,
    /// Sandbox rules.
    pub sandbox: SandboxPolicy,
    /// Region label.
    pub region: String,
}

impl OfferTemplate {
    /// Defaults for declared GPUs: 1 min .. 24 h, 60 s minimum billing, 10 s reports, 60 s window.
    pub fn new(gpus: Vec<OfferedGpu>, price_per_gpu_hour: u64) -> Self {
        Self {
            gpus,
            price_per_gpu_hour,
            per_gpu: ResourcesPerGpu {
                cpu_millicores: 4000,
                ram_mib: 16 * 1024,
                disk_gib: 50,
                net_mbps: 0,
            },
            min_duration_s: 60,
            max_duration_s: 24 * 3600,
            min_billed_s: 60,
            usage_interval_s: 10,
            pay_ahead_s: 60,
            sandbox: SandboxPolicy {
                network: NetworkPolicy::None,
                image_prefixes: Vec::new(),
            },
            region: String::new(),
        }
    }

    /// The offer with sequence `seq`, created at `now`, living `ttl_ms`.
    pub fn offer(
        &self,
        provider: PublicKey,
        seq: u64,
        now: Timestamp,
        ttl_ms: u64,
        addrs: Vec<String>,
    ) -> Offer {
        Offer {
            provider,
            seq,
            created_at: now,
            expires_at: now.plus_ms(ttl_ms),
            gpus: self.gpus.clone(),
            per_gpu: self.per_gpu,
            price_per_gpu_hour: self.price_per_gpu_hour,
            min_duration_s: self.min_duration_s,
            max_duration_s: self.max_duration_s,
            min_billed_s: self.min_billed_s,
            usage_interval_s: self.usage_interval_s,
            pay_ahead_s: self.pay_ahead_s,
            sandbox: self.sandbox.clone(),
            addrs,
            region: self.region.clone(),
        }
    }
}

/// The node's own current offer.
#[derive(Clone, Debug)]
pub struct OwnOffer {
    /// Signed.
    pub signed: Signed<Offer>,
    /// Decoded.
    pub offer: Offer,
    /// Content id.
    pub id: OfferId,
}

/// A lease holding GPUs until `until`.
#[derive(Clone, Debug)]
struct Holding {
    gpus: Vec<Digest>,
    until: Timestamp,
}

/// The answer for a (renter, nonce), once known.
#[derive(Clone, Debug)]
enum NonceState {
    /// Accepted and being persisted; the response waits for the commit.
    Persisting { lease_id: LeaseId },
    /// Accepted and persisted: the same request gets the same answer again.
    Accepted {
        lease_id: LeaseId,
        accept: Signed<LeaseAccept>,
    },
}

/// What to do with an inbound request.
#[derive(Debug)]
pub enum Decision {
    /// Answer now.
    Respond(LeaseRpcResponse),
    /// Persist this lease, then answer with the accept.
    Persist {
        /// The lease to store.
        stored: Box<StoredLease>,
        /// The answer once stored.
        accept: Signed<LeaseAccept>,
    },
    /// The same request is being persisted; answer when that finishes.
    Wait {
        /// The lease being persisted.
        lease_id: LeaseId,
    },
}

/// Provider state owned by the event loop.
#[derive(Debug, Default)]
pub struct ProviderState {
    /// What to offer; `None` for a renter-only node.
    pub template: Option<OfferTemplate>,
    /// The current signed offer.
    pub current: Option<OwnOffer>,
    /// Highest sequence ever used (persisted).
    pub last_seq: u64,
    holdings: BTreeMap<LeaseId, Holding>,
    nonces: BTreeMap<(PublicKey, u64), NonceState>,
}

/// Most remembered (renter, nonce) pairs; the oldest accepted ones are forgotten first (their
/// leases are in the database, where the unique index still refuses reuse).
pub const MAX_NONCES: usize = 100_000;

impl ProviderState {
    /// State for a node offering `template` (nothing with `None`).
    pub fn new(template: Option<OfferTemplate>) -> Self {
        Self {
            template,
            ..Self::default()
        }
    }

    /// The next sequence: above every used one and at least the clock, so a node that lost its
    /// database still moves forward.
    pub fn next_seq(&mut self, now: Timestamp) -> u64 {
        self.last_seq = (self.last_seq + 1).max(now.0);
        self.last_seq
    }

    /// Restores a stored provider lease (at startup).
    pub fn restore(&mut self, l: &StoredLease) {
        if l.role != Role::Provider {
            return;
        }
        let t = &l.lease.terms;
        if let Some(accept) = &l.accept {
            self.nonces.insert(
                (t.renter, t.nonce),
                NonceState::Accepted {
                    lease_id: l.lease.id,
                    accept: accept.clone(),
                },
            );
        }
        if !l.lease.state.is_terminal() {
            self.holdings.insert(
                l.lease.id,
                Holding {
                    gpus: l.gpus.clone(),
                    until: l.created_at.plus_secs(u64::from(t.duration_s)),
                },
            );
        }
    }

    /// Releases the GPUs held by a lease that ended.
    pub fn release(&mut self, lease_id: &LeaseId) {
        self.holdings.remove(lease_id);
    }

    /// GPUs of the current offer not held by a lease at `now`.
    pub fn free_gpus(&self, now: Timestamp) -> Vec<Digest> {
        let Some(cur) = &self.current else {
            return Vec::new();
        };
        cur.offer
            .gpus
            .iter()
            .map(|g| g.spec.uuid_digest)
            .filter(|d| {
                !self
                    .holdings
                    .values()
                    .any(|h| h.until > now && h.gpus.contains(d))
            })
            .collect()
    }

    /// Decides on a verified request from the connected peer `peer_key`.
    pub fn decide(
        &mut self,
        key: &NodeKey,
        network: &NetworkId,
        request: &Signed<LeaseRequest>,
        verified: Verified<LeaseRequest>,
        now: Timestamp,
    ) -> Decision {
        let terms = &verified.message.terms;
        let lease_id = terms.lease_id().unwrap_or(LeaseId(Digest::default()));
        let reject = |reason: RejectReason| -> Decision {
            Decision::Respond(reject(key, network, lease_id, terms.nonce, reason, now))
        };
        match self.nonces.get(&(verified.signer, terms.nonce)) {
            Some(NonceState::Accepted {
                lease_id: held,
                accept,
            }) if *held == lease_id => {
                return Decision::Respond(LeaseRpcResponse::Accepted(accept.clone()));
            }
            Some(NonceState::Persisting { lease_id: held }) if *held == lease_id => {
                return Decision::Wait { lease_id };
            }
            Some(_) => return reject(RejectReason::DuplicateNonce),
            None => {}
        }
        let Some(cur) = &self.current else {
            return reject(RejectReason::UnknownOffer);
        };
        let free = self.free_gpus(now);
        let view = ProviderView {
            network,
            offer: &cur.offer,
            offer_id: cur.id,
            free_gpus: u16::try_from(free.len()).unwrap_or(u16::MAX),
            now,
        };
        let lease_id = match check_request(&view, &verified.message, &verified.signer) {
            Ok(id) => id,
            Err(reason) => return reject(reason),
        };
        let gpus: Vec<Digest> = free
            .into_iter()
            .take(usize::from(terms.gpu_count))
            .collect();
        let accept_msg = LeaseAccept {
            lease_id,
            terms: terms.clone(),
            gpus: gpus.clone(),
            accepted_at: now,
        };
        let accept = match Signed::sign(key, network, &accept_msg) {
            Ok(a) => a,
            Err(_) => return reject(RejectReason::Internal),
        };
        let mut lease = Lease::propose(lease_id, terms.clone());
        if lease
            .apply(LeaseEvent::Accept, Actor::Provider, now)
            .is_err()
        {
            return reject(RejectReason::Internal);
        }
        if self.nonces.len() >= MAX_NONCES {
            self.forget_oldest_nonce();
        }
        self.nonces.insert(
            (verified.signer, terms.nonce),
            NonceState::Persisting { lease_id },
        );
        self.holdings.insert(
            lease_id,
            Holding {
                gpus: gpus.clone(),
                until: now.plus_secs(u64::from(terms.duration_s)),
            },
        );
        Decision::Persist {
            stored: Box::new(StoredLease {
                role: Role::Provider,
                lease,
                request: request.clone(),
                accept: Some(accept.clone()),
                gpus,
                created_at: now,
            }),
            accept,
        }
    }

    fn forget_oldest_nonce(&mut self) {
        let victim = self
            .nonces
            .iter()
            .find(|(_, s)| matches!(s, NonceState::Accepted { .. }))
            .map(|(k, _)| *k);
        if let Some(k) = victim {
            self.nonces.remove(&k);
        }
    }

    /// The lease was committed: later duplicates get the same accept.
    pub fn persisted(
        &mut self,
        renter: PublicKey,
        nonce: u64,
        lease_id: LeaseId,
        accept: Signed<LeaseAccept>,
    ) {
        self.nonces
            .insert((renter, nonce), NonceState::Accepted { lease_id, accept });
    }

    /// Persisting failed: release the GPUs and the nonce.
    pub fn persist_failed(&mut self, renter: PublicKey, nonce: u64, lease_id: LeaseId) {
        self.holdings.remove(&lease_id);
        self.nonces.remove(&(renter, nonce));
    }
}

/// A signed rejection (an unsigned one if signing fails, which only an encoding bug can cause).
pub fn reject(
    key: &NodeKey,
    network: &NetworkId,
    lease_id: LeaseId,
    nonce: u64,
    reason: RejectReason,
    now: Timestamp,
) -> LeaseRpcResponse {
    let msg = LeaseReject {
        lease_id,
        nonce,
        reason,
        at: now,
    };
    match Signed::sign(key, network, &msg) {
        Ok(s) => LeaseRpcResponse::Rejected(s),
        Err(_) => {
            let fallback = LeaseReject {
                lease_id,
                nonce,
                reason: RejectReason::Internal,
                at: now,
            };
            // A fixed-size message always encodes.
            LeaseRpcResponse::Rejected(
                Signed::sign(key, network, &fallback).unwrap_or_else(|_| unreachable!()),
            )
        }
    }
}
