//! The desk's volume rules (issue 47), decided as a hostile renter would ask: a volume's
//! count, name and disk; a lease's mounts of a volume that is not the renter's (or is not
//! running, or is mounted, or ends too soon) refused with the same answer for a stranger.

use std::sync::Arc;

use gridlease_protocol::fixtures::{self, T0};
use gridlease_protocol::session::LeaseRpcResponse;
use gridlease_protocol::{
    LeaseId, LeaseRequest, NetworkId, NodeKey, OfferId, RejectReason, Signed, Timestamp,
    VolumeMount, VolumePolicy, VolumeRefusal,
};

use super::{Decision, Desk, VolumeContext, VolumeRoom};
use crate::net::OwnOffer;

struct Fx {
    net: NetworkId,
    provider: NodeKey,
    offer: OwnOffer,
}

fn fx() -> Fx {
    let net = NetworkId::devnet();
    let provider = NodeKey::from_secret([1; 32]);
    let mut offer = fixtures::offer(provider.public(), 1, 2, 400_000);
    offer.expires_at = T0.plus_secs(3_000);
    offer.sandbox.volumes = VolumePolicy {
        price_per_gib_hour: 1_000,
        max_gib: 100,
        max_keep_s: 86_400,
    };
    let signed = Signed::sign(&provider, &net, &offer).unwrap();
    let id = OfferId(signed.envelope().content_digest());
    Fx {
        net,
        provider,
        offer: OwnOffer {
            signed,
            offer,
            id,
            images: Arc::new(Default::default()),
            earlier: Vec::new(),
        },
    }
}

/// A volume lease `name` of `size` GiB by `renter`.
fn volume_request(f: &Fx, renter: &NodeKey, name: &str, size: u32, nonce: u64) -> LeaseRequest {
    let mut t = fixtures::volume_terms(
        f.offer.id,
        &f.offer.offer,
        renter.public(),
        name,
        size,
        1_000,
        3_600,
    );
    t.network = f.net.clone();
    t.nonce = nonce;
    LeaseRequest {
        terms: t,
        expires_at: T0.plus_secs(60),
    }
}

/// A lease of `renter` for 600 s that mounts `volumes` at /v0, /v1, ...
fn mount_request(f: &Fx, renter: &NodeKey, volumes: &[LeaseId], nonce: u64) -> LeaseRequest {
    let mut t = fixtures::terms(f.offer.id, &f.offer.offer, renter.public(), 1, 600);
    t.network = f.net.clone();
    t.nonce = nonce;
    t.image = "docker.io/library/busybox:1".into();
    t.mounts = volumes
        .iter()
        .enumerate()
        .map(|(i, v)| VolumeMount {
            volume: *v,
            path: format!("/v{i}"),
        })
        .collect();
    LeaseRequest {
        terms: t,
        expires_at: T0.plus_secs(60),
    }
}

fn decide(
    desk: &mut Desk,
    f: &Fx,
    renter: &NodeKey,
    req: LeaseRequest,
    room: VolumeRoom,
    live: &dyn Fn(&LeaseId) -> Option<Timestamp>,
) -> Result<LeaseId, RejectReason> {
    let signed = Signed::sign(renter, &f.net, &req).unwrap();
    let verified = signed.verify(&f.net).unwrap();
    match desk.decide(
        &f.provider,
        &f.net,
        Some(&f.offer),
        &signed,
        &verified,
        Ok(()),
        VolumeContext { room, live },
        T0,
    ) {
        Decision::Persist { stored, .. } => Ok(stored.lease.id),
        Decision::Respond(LeaseRpcResponse::Rejected(r)) => {
            Err(r.verify(&f.net).unwrap().message.reason)
        }
        other => panic!("{other:?}"),
    }
}

const ROOM: VolumeRoom = VolumeRoom {
    max_volumes: 2,
    free_gib: 50,
};

fn refused(r: VolumeRefusal) -> Result<LeaseId, RejectReason> {
    Err(RejectReason::VolumeRefused { refusal: r })
}

#[test]
fn a_volume_needs_room_a_free_name_and_disk() {
    let f = fx();
    let (alice, bob) = (NodeKey::from_secret([2; 32]), NodeKey::from_secret([3; 32]));
    let mut desk = Desk::new();
    let none = |_: &LeaseId| None;
    let big = volume_request(&f, &alice, "big", 51, 1);
    assert_eq!(
        decide(&mut desk, &f, &alice, big, ROOM, &none),
        refused(VolumeRefusal::NoSpace { free_gib: 50 })
    );
    let a = decide(
        &mut desk,
        &f,
        &alice,
        volume_request(&f, &alice, "data", 10, 2),
        ROOM,
        &none,
    );
    assert!(a.is_ok(), "{a:?}");
    // The same name: refused for the same renter, not for another.
    assert_eq!(
        decide(
            &mut desk,
            &f,
            &alice,
            volume_request(&f, &alice, "data", 10, 3),
            ROOM,
            &none
        ),
        refused(VolumeRefusal::NameTaken)
    );
    assert!(
        decide(
            &mut desk,
            &f,
            &bob,
            volume_request(&f, &bob, "data", 10, 4),
            ROOM,
            &none
        )
        .is_ok()
    );
    // Two kept: a third is one too many.
    assert_eq!(
        decide(
            &mut desk,
            &f,
            &bob,
            volume_request(&f, &bob, "more", 1, 5),
            ROOM,
            &none
        ),
        refused(VolumeRefusal::TooMany { max: 2 })
    );
    // A volume holds no GPU.
    assert!(desk.held_gpus().is_empty());
    assert_eq!(desk.volumes().len(), 2);
    // Its end frees its place (and its name).
    desk.release(&a.unwrap());
    assert!(
        decide(
            &mut desk,
            &f,
            &alice,
            volume_request(&f, &alice, "data", 10, 6),
            ROOM,
            &none
        )
        .is_ok()
    );
}

#[test]
fn only_its_renter_mounts_a_running_volume_one_lease_at_a_time_within_its_keep() {
    let f = fx();
    let (alice, mallory) = (NodeKey::from_secret([2; 32]), NodeKey::from_secret([4; 32]));
    let mut desk = Desk::new();
    let none = |_: &LeaseId| None;
    let vol = decide(
        &mut desk,
        &f,
        &alice,
        volume_request(&f, &alice, "data", 10, 1),
        ROOM,
        &none,
    )
    .unwrap();
    let deadline = T0.plus_secs(3_600);
    let running = move |id: &LeaseId| (*id == vol).then_some(deadline);
    // A stranger naming it: the answer it would get for a volume that does not exist.
    let unknown = LeaseId(gridlease_protocol::Digest([9; 32]));
    assert_eq!(
        decide(
            &mut desk,
            &f,
            &mallory,
            mount_request(&f, &mallory, &[vol], 1),
            ROOM,
            &running
        ),
        refused(VolumeRefusal::NotYours { volume: vol })
    );
    assert_eq!(
        decide(
            &mut desk,
            &f,
            &alice,
            mount_request(&f, &alice, &[unknown], 2),
            ROOM,
            &running
        ),
        refused(VolumeRefusal::NotYours { volume: unknown })
    );
    // Not running (being made, or ending): not mounted.
    assert_eq!(
        decide(
            &mut desk,
            &f,
            &alice,
            mount_request(&f, &alice, &[vol], 3),
            ROOM,
            &none
        ),
        refused(VolumeRefusal::NotYours { volume: vol })
    );
    // Ends before the lease could: refused.
    let soon = move |id: &LeaseId| (*id == vol).then_some(T0.plus_secs(300));
    assert_eq!(
        decide(
            &mut desk,
            &f,
            &alice,
            mount_request(&f, &alice, &[vol], 4),
            ROOM,
            &soon
        ),
        refused(VolumeRefusal::EndsTooSoon { volume: vol })
    );
    // Its renter mounts it; a second lease may not while the first holds it.
    let first = decide(
        &mut desk,
        &f,
        &alice,
        mount_request(&f, &alice, &[vol], 5),
        ROOM,
        &running,
    )
    .unwrap();
    assert_eq!(
        decide(
            &mut desk,
            &f,
            &alice,
            mount_request(&f, &alice, &[vol], 6),
            ROOM,
            &running
        ),
        refused(VolumeRefusal::InUse { volume: vol })
    );
    // The first lease's container gone: free again.
    desk.release(&first);
    assert!(
        decide(
            &mut desk,
            &f,
            &alice,
            mount_request(&f, &alice, &[vol], 7),
            ROOM,
            &running
        )
        .is_ok()
    );
}

/// A volume lease adopting lease `from`'s workspace (`stop --keep-disk`).
fn adopt_request(
    f: &Fx,
    renter: &NodeKey,
    name: &str,
    size: u32,
    from: LeaseId,
    nonce: u64,
) -> LeaseRequest {
    let mut req = volume_request(f, renter, name, size, nonce);
    if let Some(v) = req.terms.volume.as_mut() {
        v.adopts = Some(from);
    }
    req
}

#[test]
fn a_lease_disk_is_kept_only_by_its_renter_while_it_runs_at_its_size_and_once() {
    let f = fx();
    let (alice, mallory) = (NodeKey::from_secret([2; 32]), NodeKey::from_secret([4; 32]));
    let mut desk = Desk::new();
    let none = |_: &LeaseId| None;
    let mut req = mount_request(&f, &alice, &[], 1);
    req.terms.per_gpu.disk_gib = 8;
    let gib = u32::try_from(req.terms.workspace_bytes() >> 30).unwrap();
    assert!(gib > 0);
    let lease = decide(&mut desk, &f, &alice, req, ROOM, &none).unwrap();
    let running = move |id: &LeaseId| (*id == lease).then_some(T0.plus_secs(600));
    let not_adoptable = refused(VolumeRefusal::NotAdoptable { lease });
    // Not running (being started, or ending): refused.
    assert_eq!(
        decide(
            &mut desk,
            &f,
            &alice,
            adopt_request(&f, &alice, "kept", gib, lease, 2),
            ROOM,
            &none
        ),
        not_adoptable
    );
    // Another renter's lease: the answer any unknown lease gets.
    assert_eq!(
        decide(
            &mut desk,
            &f,
            &mallory,
            adopt_request(&f, &mallory, "kept", gib, lease, 3),
            ROOM,
            &running
        ),
        not_adoptable
    );
    // Another size than the workspace's: refused, saying which.
    let other = decide(
        &mut desk,
        &f,
        &alice,
        adopt_request(&f, &alice, "kept", gib + 1, lease, 4),
        ROOM,
        &running,
    );
    assert!(
        matches!(&other, Err(RejectReason::TermsMismatch { field }) if field.starts_with("volume.size_gib")),
        "{other:?}"
    );
    // Its renter keeps it, needing no free disk (the workspace is there already).
    let no_disk = VolumeRoom {
        max_volumes: 2,
        free_gib: 0,
    };
    let kept = decide(
        &mut desk,
        &f,
        &alice,
        adopt_request(&f, &alice, "kept", gib, lease, 5),
        no_disk,
        &running,
    );
    assert!(kept.is_ok(), "{kept:?}");
    assert_eq!(desk.volumes()[&kept.unwrap()].adopts, Some(lease));
    // Once: a second volume of the same workspace is refused.
    assert_eq!(
        decide(
            &mut desk,
            &f,
            &alice,
            adopt_request(&f, &alice, "again", gib, lease, 6),
            ROOM,
            &running
        ),
        not_adoptable
    );
    // A lease whose /workspace is a volume already has no workspace of its own to keep.
    let vol = decide(
        &mut desk,
        &f,
        &alice,
        volume_request(&f, &alice, "data", gib, 7),
        ROOM,
        &none,
    );
    let vol = vol.unwrap();
    let vol_running = move |id: &LeaseId| (*id == vol).then_some(T0.plus_secs(3_600));
    let mut on_volume = mount_request(&f, &alice, &[vol], 8);
    on_volume.terms.per_gpu.disk_gib = 8;
    on_volume.terms.mounts[0].path = "/workspace".into();
    let resumed = decide(&mut desk, &f, &alice, on_volume, ROOM, &vol_running).unwrap();
    let both = move |id: &LeaseId| (*id == resumed || *id == vol).then_some(T0.plus_secs(600));
    assert_eq!(
        decide(
            &mut desk,
            &f,
            &alice,
            adopt_request(&f, &alice, "third", gib, resumed, 9),
            VolumeRoom {
                max_volumes: 5,
                free_gib: 50
            },
            &both
        ),
        refused(VolumeRefusal::NotAdoptable { lease: resumed })
    );
}
