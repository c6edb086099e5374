//! What this node announces as a provider: the offer template, the current signed offer and
//! its sequence. Deciding lease requests (GPU holds, nonces) is not the network's business: the
//! lease service's desk (`crate::lease::desk`) does it, and the event loop forwards requests
//! to it with the offer it currently advertises.

use gridlease_protocol::{
    LeaseId, LeaseReject, NetworkId, NetworkPolicy, NodeKey, Offer, OfferId, OfferedGpu, PublicKey,
    RejectReason, ResourcesPerGpu, SandboxPolicy, Signed, Timestamp,
};

use std::sync::Arc;

use gridlease_contracts::image::ImagePolicy;

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
    /// Sandbox rules (advertised).
    pub sandbox: SandboxPolicy,
    /// The provider's image rules (not advertised but the prefixes, which are mirrored into
    /// `sandbox.image_prefixes`); requests are decided against them before signing.
    pub images: ImagePolicy,
    /// Region label.
    pub region: String,
    /// Whether a running lease may be stopped for the owner (`Offer::interruptible`).
    pub interruptible: bool,
    /// Proof of GPU: the verification window, the backend and its claimed rate (none by
    /// default; the daemon sets it when its prover passed its self-test).
    pub proof: gridlease_protocol::proof::ProofPolicy,
    /// On-chain settlement: the chain this provider is paid on and its wallet binding (none:
    /// GLU only; the daemon sets it from the chain configuration).
    pub settlement: Option<gridlease_protocol::wallet::OfferSettlement>,
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
                volumes: gridlease_protocol::VolumePolicy::default(),
                network: NetworkPolicy::None,
                image_prefixes: Vec::new(),
                access: gridlease_protocol::access::AccessPolicy::ALL,
                isolation: gridlease_protocol::Isolation::Runc,
                output_retention_s: 0,
                upload_hold_s: 0,
                registries: Vec::new(),
                local_images: Vec::new(),
            },
            images: ImagePolicy::default(),
            region: String::new(),
            interruptible: false,
            proof: gridlease_protocol::proof::ProofPolicy::default(),
            settlement: None,
        }
    }

    /// The offer with sequence `seq`, created at `now`, living `ttl_ms`.
    /// `free`: how many of the GPUs the lease side says are free (`None`: all of them).
    #[allow(clippy::too_many_arguments)]
    pub fn offer(
        &self,
        provider: PublicKey,
        seq: u64,
        now: Timestamp,
        ttl_ms: u64,
        addrs: Vec<String>,
        free: Option<u16>,
        kept_gib: u64,
    ) -> Offer {
        let all = u16::try_from(self.gpus.len()).unwrap_or(u16::MAX);
        // The GiB kept beyond leases (volumes, kept outputs: issue 47) come out of the disk
        // the GPUs share.
        let mut per_gpu = self.per_gpu;
        let share = kept_gib.div_ceil(u64::from(all.max(1)));
        per_gpu.disk_gib =
            u32::try_from(u64::from(per_gpu.disk_gib).saturating_sub(share)).unwrap_or(0);
        Offer {
            proof: self.proof,
            provider,
            seq,
            created_at: now,
            expires_at: now.plus_ms(ttl_ms),
            gpus: self.gpus.clone(),
            per_gpu,
            price_per_gpu_hour: self.price_per_gpu_hour,
            min_duration_s: self.min_duration_s,
            max_duration_s: self.max_duration_s,
            min_billed_s: self.min_billed_s,
            usage_interval_s: self.usage_interval_s,
            pay_ahead_s: self.pay_ahead_s,
            sandbox: SandboxPolicy {
                // The image rules renters check a name against before asking: the template's.
                image_prefixes: self.images.prefixes.clone(),
                registries: self.images.registries.clone(),
                local_images: self.images.local_images.clone(),
                ..self.sandbox.clone()
            },
            addrs,
            region: self.region.clone(),
            free_gpus: free.map_or(all, |f| f.min(all)),
            interruptible: self.interruptible,
            settlement: self.settlement.clone(),
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
    /// The image rules of the template it was signed from.
    pub images: Arc<ImagePolicy>,
    /// Earlier signatures of the same template (id, sequence), newest first, at most
    /// [`EARLIER_KEPT`]: re-signed only for expiry, addresses or the free GPU count, so a
    /// request made from one of them is still decided (against this offer).
    pub earlier: Vec<(OfferId, u64)>,
}

/// Earlier signatures of the current template that requests may still name.
pub const EARLIER_KEPT: usize = 8;

/// The announcing state owned by the event loop.
#[derive(Debug, Default)]
pub struct ProviderState {
    /// What to offer; `None` for a renter-only node.
    pub template: Option<OfferTemplate>,
    /// The current signed offer.
    pub current: Option<OwnOffer>,
    /// Highest sequence ever used (persisted).
    pub last_seq: u64,
    /// The current offer must be re-signed at the next announce (its free GPU count changed).
    pub resign: bool,
    /// How many GPUs the lease side last said are free (`None`: not said, all): the offer
    /// carries it. The count is the lease side's business (its desk holds the GPUs); the
    /// network loop only signs what it is told.
    pub free_gpus: Option<u16>,
    /// GiB kept beyond leases, the volumes' and the kept outputs' (issue 47): out of the
    /// offer's disk.
    pub kept_gib: u64,
}

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
