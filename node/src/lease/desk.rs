//! The provider's desk: decides lease requests against the node's current offer, holds the
//! GPUs of each accepted lease for its real life, and makes identical retries idempotent.
//!
//! Owned by the lease service's actor (one owner): the network loop forwards each verified
//! request with the offer it currently advertises and answers with what the actor replies.
//! Decisions are synchronous and never touch SQLite; persisting an accepted lease is done by
//! the actor, which answers the renter only after the write committed.
//!
//! # Holds
//! A GPU is held from the accept until the lease's session has ended with its container gone
//! (stopped and removed), or the lease was refused or could not be stored. Nothing here
//! expires by the clock: a slow image pull can never let a second lease take a GPU whose first
//! container still runs.

use std::collections::BTreeMap;

use gridlease_contracts::terms::{ProviderView, check_request};
use gridlease_contracts::{Actor, Lease, LeaseEvent};
use gridlease_protocol::session::LeaseRpcResponse;
use gridlease_protocol::{
    Digest, ImageRefusal, LeaseAccept, LeaseId, LeaseRequest, NetworkId, NodeKey, PublicKey,
    RejectReason, Signed, Timestamp, Verified, VolumeRefusal,
};

use crate::net::OwnOffer;
use crate::store::{Role, StoredLease};

/// Most remembered (renter, nonce) pairs; the oldest accepted ones are forgotten first (their
/// leases are in the database, where the unique index still refuses reuse and an identical
/// retry still gets the stored acceptance).
pub const MAX_NONCES: usize = 100_000;

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

/// A live volume lease this provider keeps (issue 47): whose, its name and size, and the
/// lease that mounts it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptVolume {
    /// Its renter.
    pub renter: PublicKey,
    /// The renter's name for it.
    pub name: String,
    /// Size, GiB.
    pub size_gib: u32,
    /// The lease whose container mounts it now (until that container is gone).
    pub mounted_by: Option<LeaseId>,
    /// The lease whose `/workspace` it is made from (`stop --keep-disk`).
    pub adopts: Option<LeaseId>,
}

/// What the desk keeps of an accepted lease until its container is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Held {
    /// Its GPUs (none for a volume lease).
    gpus: Vec<Digest>,
    /// Its renter.
    renter: PublicKey,
    /// GiB of its own `/workspace` (none for a volume lease, or a lease whose `/workspace`
    /// is one of the renter's volumes): what a volume adopting it must measure.
    own_workspace_gib: Option<u32>,
}

impl Held {
    fn of(l: &gridlease_protocol::LeaseTerms, gpus: Vec<Digest>) -> Self {
        let on_volume = l
            .mounts
            .iter()
            .any(|m| m.path == gridlease_sandbox::spec::WORKSPACE_PATH);
        Self {
            gpus,
            renter: l.renter,
            own_workspace_gib: (l.volume.is_none() && !on_volume)
                .then(|| u32::try_from(l.workspace_bytes() >> 30).unwrap_or(u32::MAX)),
        }
    }
}

/// What volumes may take now, measured by the actor before the desk decides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumeRoom {
    /// Most volumes at once (`max_volumes`).
    pub max_volumes: u32,
    /// GiB of disk free for new volumes (free disk less the reserve, the kept volumes and
    /// the live leases' workspaces).
    pub free_gib: u64,
}

/// GPU holds and the nonce index of a provider.
#[derive(Debug, Default)]
pub struct Desk {
    holds: BTreeMap<LeaseId, Held>,
    /// Live volume leases (issue 47), from the accept until their session ended.
    volumes: BTreeMap<LeaseId, KeptVolume>,
    /// Offered GPUs their owner uses now: never given to a lease ([`super::owner`]).
    owner_busy: std::collections::BTreeSet<Digest>,
    nonces: BTreeMap<(PublicKey, u64), NonceState>,
}

impl Desk {
    /// An empty desk.
    pub fn new() -> Self {
        Self::default()
    }

    /// Holds the GPUs of a stored live provider lease (at start-up, before any request).
    pub fn restore(&mut self, l: &StoredLease) {
        if l.role != Role::Provider || l.lease.state.is_terminal() {
            return;
        }
        self.holds
            .insert(l.lease.id, Held::of(&l.lease.terms, l.gpus.clone()));
        if let Some(v) = &l.lease.terms.volume {
            self.volumes
                .insert(l.lease.id, kept(&l.lease.terms.renter, v));
        }
        for m in &l.lease.terms.mounts {
            if let Some(v) = self.volumes.get_mut(&m.volume) {
                v.mounted_by = Some(l.lease.id);
            }
        }
        if let Some(accept) = &l.accept {
            let t = &l.lease.terms;
            self.nonces.insert(
                (t.renter, t.nonce),
                NonceState::Accepted {
                    lease_id: l.lease.id,
                    accept: accept.clone(),
                },
            );
        }
    }

    /// Releases the GPUs of a lease whose container is gone (or that never got one), the
    /// volumes it mounted, and, for a volume lease, the volume.
    pub fn release(&mut self, lease_id: &LeaseId) {
        self.holds.remove(lease_id);
        self.volumes.remove(lease_id);
        for v in self.volumes.values_mut() {
            if v.mounted_by == Some(*lease_id) {
                v.mounted_by = None;
            }
        }
    }

    /// The live volume leases.
    pub fn volumes(&self) -> &BTreeMap<LeaseId, KeptVolume> {
        &self.volumes
    }

    /// A new volume of `renter` within `room`: not one too many, its name not taken by the
    /// renter's other live volumes, and disk free for it (a volume made of a lease's
    /// workspace takes no more: [`Desk::check_adoption`]).
    fn admit_volume(
        &self,
        renter: &PublicKey,
        v: &gridlease_protocol::VolumeTerms,
        room: VolumeRoom,
    ) -> Result<(), VolumeRefusal> {
        if u32::try_from(self.volumes.len()).unwrap_or(u32::MAX) >= room.max_volumes {
            return Err(VolumeRefusal::TooMany {
                max: room.max_volumes,
            });
        }
        if self
            .volumes
            .values()
            .any(|k| k.renter == *renter && k.name == v.name)
        {
            return Err(VolumeRefusal::NameTaken);
        }
        if v.adopts.is_none() && u64::from(v.size_gib) > room.free_gib {
            return Err(VolumeRefusal::NoSpace {
                free_gib: room.free_gib,
            });
        }
        Ok(())
    }

    /// A volume made of lease `lease`'s `/workspace`: a running lease of `renter` here (`live`
    /// gives a running lease's deadline), with a workspace of its own of the volume's size,
    /// that no other volume takes already.
    fn check_adoption(
        &self,
        renter: &PublicKey,
        v: &gridlease_protocol::VolumeTerms,
        lease: LeaseId,
        live: &dyn Fn(&LeaseId) -> Option<Timestamp>,
    ) -> Result<(), RejectReason> {
        let refused = Err(RejectReason::VolumeRefused {
            refusal: VolumeRefusal::NotAdoptable { lease },
        });
        let Some(gib) = self
            .holds
            .get(&lease)
            .filter(|h| h.renter == *renter)
            .and_then(|h| h.own_workspace_gib)
        else {
            return refused;
        };
        if live(&lease).is_none() || self.volumes.values().any(|k| k.adopts == Some(lease)) {
            return refused;
        }
        if gib != v.size_gib {
            return Err(RejectReason::TermsMismatch {
                field: format!("volume.size_gib (the lease's workspace is {gib} GiB)"),
            });
        }
        Ok(())
    }

    /// A lease's mounts: each a live volume of the same renter (`live` gives a running
    /// volume lease's deadline), mounted by no other lease, kept at least as long as this
    /// lease could run.
    fn check_mounts(
        &self,
        renter: &PublicKey,
        terms: &gridlease_protocol::LeaseTerms,
        live: &dyn Fn(&LeaseId) -> Option<Timestamp>,
        now: Timestamp,
    ) -> Result<(), VolumeRefusal> {
        // The latest this lease could end: held for uploads and checked first, then its run.
        let latest = now.plus_secs(
            u64::from(terms.duration_s)
                + u64::from(terms.upload_hold_s)
                + u64::from(terms.verify_window_s),
        );
        for m in &terms.mounts {
            let volume = m.volume;
            let Some(k) = self.volumes.get(&volume).filter(|k| k.renter == *renter) else {
                return Err(VolumeRefusal::NotYours { volume });
            };
            let Some(deadline) = live(&volume) else {
                return Err(VolumeRefusal::NotYours { volume });
            };
            if k.mounted_by.is_some() {
                return Err(VolumeRefusal::InUse { volume });
            }
            if deadline < latest {
                return Err(VolumeRefusal::EndsTooSoon { volume });
            }
        }
        Ok(())
    }

    /// Leases holding GPUs now.
    pub fn held_leases(&self) -> usize {
        self.holds.len()
    }

    /// Whether `lease_id` holds GPUs.
    pub fn holds(&self, lease_id: &LeaseId) -> bool {
        self.holds.contains_key(lease_id)
    }

    /// Every GPU a lease holds now.
    pub fn held_gpus(&self) -> std::collections::BTreeSet<Digest> {
        self.holds
            .values()
            .flat_map(|h| h.gpus.iter())
            .copied()
            .collect()
    }

    /// The GPUs the owner uses now (they are not free).
    pub fn set_owner_busy(&mut self, busy: std::collections::BTreeSet<Digest>) {
        self.owner_busy = busy;
    }

    /// GPUs of `offer` neither held by any lease nor used by their owner.
    pub fn free_gpus(&self, offer: &OwnOffer) -> Vec<Digest> {
        offer
            .offer
            .gpus
            .iter()
            .map(|g| g.spec.uuid_digest)
            .filter(|d| !self.holds.values().any(|h| h.gpus.contains(d)))
            .filter(|d| !self.owner_busy.contains(d))
            .collect()
    }

    /// Decides on a request whose envelope verified and whose signer is the sending peer,
    /// against `offer`, the offer the node advertises now (`None`: not providing). `image` is
    /// the admission of the terms' image from what the registry or the daemon said about it
    /// (`gridlease_contracts::image::admit`, checked by the actor before it asks); it refuses
    /// the request only once every rule of the terms themselves passed.
    /// A volume lease (`terms.volume`) is decided within `volumes.room`; a lease's mounts
    /// against the desk's live volumes and `volumes.live` (a running volume lease's
    /// deadline).
    #[allow(clippy::too_many_arguments)]
    pub fn decide(
        &mut self,
        key: &NodeKey,
        network: &NetworkId,
        offer: Option<&OwnOffer>,
        request: &Signed<LeaseRequest>,
        verified: &Verified<LeaseRequest>,
        image: Result<(), ImageRefusal>,
        volumes: VolumeContext<'_>,
        now: Timestamp,
    ) -> Decision {
        let terms = &verified.message.terms;
        let lease_id = terms.lease_id().unwrap_or(LeaseId(Digest::default()));
        let reject = |reason: RejectReason| -> Decision {
            Decision::Respond(crate::net::reject(
                key,
                network,
                lease_id,
                terms.nonce,
                reason,
                now,
            ))
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
        let Some(cur) = offer else {
            return reject(RejectReason::UnknownOffer);
        };
        let free = self.free_gpus(cur);
        let view = ProviderView {
            network,
            offer: &cur.offer,
            offer_id: cur.id,
            equivalent: &cur.earlier,
            free_gpus: u16::try_from(free.len()).unwrap_or(u16::MAX),
            now,
            images: &cur.images,
        };
        let lease_id = match check_request(&view, &verified.message, &verified.signer) {
            Ok(id) => id,
            Err(reason) => return reject(reason),
        };
        let volume_refusal = match &terms.volume {
            Some(v) => self.admit_volume(&verified.signer, v, volumes.room).err(),
            None => self
                .check_mounts(&verified.signer, terms, volumes.live, now)
                .err(),
        };
        if let Some(refusal) = volume_refusal {
            return reject(RejectReason::VolumeRefused { refusal });
        }
        if let Some(v) = &terms.volume
            && let Some(from) = v.adopts
            && let Err(reason) = self.check_adoption(&verified.signer, v, from, volumes.live)
        {
            return reject(reason);
        }
        if let Err(refusal) = image
            && terms.volume.is_none()
        {
            return reject(RejectReason::ImageRefused { refusal });
        }
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
        let Ok(accept) = Signed::sign(key, network, &accept_msg) else {
            return reject(RejectReason::Internal);
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
        self.holds.insert(lease_id, Held::of(terms, gpus.clone()));
        if let Some(v) = &terms.volume {
            self.volumes.insert(lease_id, kept(&verified.signer, v));
        }
        for m in &terms.mounts {
            if let Some(v) = self.volumes.get_mut(&m.volume) {
                v.mounted_by = Some(lease_id);
            }
        }
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
    pub fn persisted(&mut self, l: &StoredLease, accept: Signed<LeaseAccept>) {
        let t = &l.lease.terms;
        self.nonces.insert(
            (t.renter, t.nonce),
            NonceState::Accepted {
                lease_id: l.lease.id,
                accept,
            },
        );
    }

    /// Persisting failed: release the GPUs, volumes and the nonce.
    pub fn persist_failed(&mut self, l: &StoredLease) {
        let t = &l.lease.terms;
        self.release(&l.lease.id);
        self.nonces.remove(&(t.renter, t.nonce));
    }
}

/// What the desk needs to decide on volumes (issue 47).
#[derive(Clone, Copy)]
pub struct VolumeContext<'a> {
    /// Room for a new volume.
    pub room: VolumeRoom,
    /// A running volume lease's deadline (`None`: not running here).
    pub live: &'a dyn Fn(&LeaseId) -> Option<Timestamp>,
}

impl std::fmt::Debug for VolumeContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeContext")
            .field("room", &self.room)
            .finish_non_exhaustive()
    }
}

fn kept(renter: &PublicKey, v: &gridlease_protocol::VolumeTerms) -> KeptVolume {
    KeptVolume {
        renter: *renter,
        name: v.name.clone(),
        size_gib: v.size_gib,
        mounted_by: None,
        adopts: v.adopts,
    }
}

#[cfg(test)]
mod tests;
