//! Lease negotiation between real nodes on loopback, and restarts from the home directory.
// Test helpers unwrap: a failed step is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;

use common::*;
use gridlease_contracts::LeaseState;
use gridlease_contracts::book::BookEntry;
use gridlease_node::clock;
use gridlease_node::lease::RentRequest;
use gridlease_node::lease::{NegotiationOutcome, negotiate_signed};
use gridlease_node::net::{NetworkEvent, NodeConfig};
use gridlease_node::renter::{offer_addrs, terms_for};
use gridlease_node::store::Role;
use gridlease_protocol::{LeaseAccept, LeaseId, LeaseRequest, LeaseTerms, RejectReason, Signed};

fn provider_config(gpus: u8, price: u64) -> NodeConfig {
    let mut c = config();
    c.offer = Some(template(gpus, price));
    c
}

/// A rent request for `gpus` GPUs, with the nonce its terms will carry.
fn ask(gpus: u16, nonce: u64) -> (RentRequest, u64) {
    let req = RentRequest {
        volumes: Vec::new(),
        mounts: Vec::new(),
        volume: None,
        verify: true,
        offer: String::new(),
        gpus,
        duration_s: 600,
        image: "gridlease-probe:0.1.0".into(),
        command: vec!["burn".into(), "15".into()],
        env: BTreeMap::new(),
        max_total: Some(gridlease_contracts::Money::from_micros(10_000_000)),
        network: gridlease_protocol::NetworkPolicy::None,
        keep_outputs_s: 0,
        upload_hold_s: 0,
        prepay_s: 0,
    };
    (req, nonce)
}

/// Provider with `gpus` GPUs at 0.35/h and a renter that has learned its offer.
async fn market(root: &std::path::Path, gpus: u8) -> (TestNode, TestNode, BookEntry) {
    let provider = start_provider(root, "provider", provider_config(gpus, 350_000)).await;
    let mut renter = start(root, "renter", config()).await;
    connect(&renter, &provider).await;
    let p = provider.key_public;
    let id = wait_event(&mut renter.events, |e| match e {
        NetworkEvent::OfferAdmitted { id, provider, .. } if *provider == p => Some(*id),
        _ => None,
    })
    .await;
    let entry = renter.node.client.offer(id).await.unwrap().unwrap();
    (provider, renter, entry)
}

fn terms(renter: &TestNode, entry: &BookEntry, ask: &(RentRequest, u64)) -> LeaseTerms {
    terms_for(
        &net(),
        entry,
        renter.key_public,
        &ask.0,
        30,
        ask.1,
        clock::now(),
    )
    .unwrap()
}

async fn negotiate(renter: &TestNode, entry: &BookEntry, t: LeaseTerms) -> NegotiationOutcome {
    gridlease_node::lease::negotiate(
        &renter.node.client,
        &clock::SystemClock,
        t,
        clock::now().plus_secs(60),
        offer_addrs(entry),
    )
    .await
    .unwrap()
}

fn accepted(o: NegotiationOutcome) -> (LeaseId, Signed<LeaseRequest>, Signed<LeaseAccept>) {
    match o {
        NegotiationOutcome::Accepted {
            lease_id,
            request,
            accept,
            ..
        } => (lease_id, request, accept),
        NegotiationOutcome::Rejected { reason, .. } => panic!("rejected: {reason:?}"),
    }
}

fn rejected(o: NegotiationOutcome) -> RejectReason {
    match o {
        NegotiationOutcome::Rejected { reason, .. } => reason,
        NegotiationOutcome::Accepted { lease_id, .. } => panic!("accepted {lease_id:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_lease_is_stored_with_identical_signed_terms_on_both_sides() {
    let dir = tempfile::tempdir().unwrap();
    let (provider, renter, entry) = market(dir.path(), 2).await;
    let t = terms(&renter, &entry, &ask(1, 1));
    let (lease_id, request, accept) = accepted(negotiate(&renter, &entry, t.clone()).await);
    assert_eq!(lease_id, t.lease_id().unwrap());
    let on_provider = provider
        .store
        .call(move |s| s.lease(&lease_id))
        .await
        .unwrap()
        .expect("provider stored the lease before answering");
    let on_renter = renter
        .store
        .call(move |s| s.lease(&lease_id))
        .await
        .unwrap()
        .expect("renter stored the lease");
    assert_eq!(on_provider.role, Role::Provider);
    assert_eq!(on_renter.role, Role::Renter);
    for side in [&on_provider, &on_renter] {
        assert_eq!(side.lease.terms, t);
        assert_eq!(side.lease.state, LeaseState::Accepted);
        assert_eq!(
            side.request.to_bytes().unwrap(),
            request.to_bytes().unwrap()
        );
        assert_eq!(
            side.accept.as_ref().unwrap().to_bytes().unwrap(),
            accept.to_bytes().unwrap()
        );
        assert_eq!(side.gpus.len(), 1);
    }
    let v = accept.verify(&net()).unwrap();
    assert_eq!(v.signer, provider.key_public);
    assert_eq!(v.message.terms, t);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejections_carry_their_reason_and_nonces_are_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let (provider, renter, entry) = market(dir.path(), 2).await;

    // Price below the ask.
    let mut cheap = terms(&renter, &entry, &ask(1, 10));
    cheap.price_per_gpu_hour = 349_999;
    assert_eq!(
        rejected(negotiate(&renter, &entry, cheap).await),
        RejectReason::PriceBelowAsk { ask: 350_000 }
    );

    // Accepted; the very same signed request again gets the very same acceptance.
    let t = terms(&renter, &entry, &ask(1, 11));
    let first = negotiate(&renter, &entry, t.clone()).await;
    let NegotiationOutcome::Accepted {
        lease_id,
        request,
        accept,
        ..
    } = first
    else {
        panic!("rejected");
    };
    let again = negotiate_signed(
        &renter.node.client,
        &clock::SystemClock,
        request.clone(),
        t.clone(),
        offer_addrs(&entry),
    )
    .await
    .unwrap();
    let NegotiationOutcome::Accepted {
        lease_id: again_id,
        accept: again_accept,
        ..
    } = again
    else {
        panic!("idempotent retry rejected");
    };
    assert_eq!(again_id, lease_id);
    assert_eq!(again_accept.to_bytes().unwrap(), accept.to_bytes().unwrap());
    let leases = provider
        .store
        .call(|s| s.leases(Some(Role::Provider)))
        .await
        .unwrap();
    assert_eq!(leases.len(), 1, "the retry did not create a second lease");

    // Same nonce, other terms.
    let mut other = t.clone();
    other.duration_s = 1200;
    assert_eq!(
        rejected(negotiate(&renter, &entry, other).await),
        RejectReason::DuplicateNonce
    );

    // One of two GPUs is leased: asking for two finds no capacity.
    assert_eq!(
        rejected(negotiate(&renter, &entry, terms(&renter, &entry, &ask(2, 12))).await),
        RejectReason::NoCapacity { free: 1 }
    );

    // The provider changes its offer: the old one is stale.
    let new = provider
        .node
        .client
        .set_offer(Some(template(2, 400_000)))
        .await
        .unwrap()
        .unwrap();
    assert!(new.offer.seq > entry.offer.seq);
    assert_eq!(
        rejected(negotiate(&renter, &entry, terms(&renter, &entry, &ask(1, 13))).await),
        RejectReason::StaleOffer {
            current_seq: new.offer.seq
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_nodes_still_know_their_leases_and_offers() {
    let dir = tempfile::tempdir().unwrap();
    let (provider, renter, entry) = market(dir.path(), 2).await;
    let t = terms(&renter, &entry, &ask(1, 7));
    let (lease_id, request, accept) = accepted(negotiate(&renter, &entry, t.clone()).await);
    // Restart on the same address (an offer names its addresses, so a provider that moves
    // re-signs it anyway).
    let provider_listen: libp2p::Multiaddr = provider
        .addr
        .iter()
        .filter(|p| !matches!(p, libp2p::multiaddr::Protocol::P2p(_)))
        .collect();
    // The lease took one of the two GPUs: the provider re-signed its offer with one free
    // (issue 21); that is the offer it has when it stops.
    let pc = provider.node.client.clone();
    eventually("the offer re-signed with the GPUs still free", || {
        let pc = pc.clone();
        async move {
            pc.own_offer()
                .await
                .unwrap()
                .is_some_and(|o| o.offer.free_gpus == 1)
        }
    })
    .await;
    let signed_before = provider.node.client.own_offer().await.unwrap().unwrap();
    let provider_home = stop(provider).await;
    let renter_home = stop(renter).await;

    // The renter comes back alone: its book and its lease are there, without any peer. (It
    // holds the provider's first or its re-signed offer, whichever reached it before it
    // stopped.)
    let renter = start_from_home(&renter_home, config()).await;
    // The stored offers are restored after start, off the loop: wait for it.
    assert!(renter.node.client.restored().await.done);
    let held = renter
        .node
        .client
        .search(
            gridlease_contracts::query::Query::parse("free>=0").unwrap(),
            10,
        )
        .await
        .unwrap();
    assert!(
        held.iter()
            .any(|e| e.offer.provider == entry.offer.provider),
        "offer book restored from the store"
    );
    let mine = renter
        .store
        .call(|s| s.leases(Some(Role::Renter)))
        .await
        .unwrap();
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].lease.id, lease_id);

    // The provider comes back: the same lease, and the retry is still idempotent. Its offer
    // was withdrawn when it stopped (`docs/protocol.md` 3, Withdrawal), so it signs a new one,
    // with a higher sequence, rather than announce the withdrawn one again.
    let mut restart_cfg = provider_config(2, 350_000);
    restart_cfg.listen = vec![provider_listen];
    let provider = start_provider_from_home(&provider_home, restart_cfg).await;
    // Signed first with every GPU free, then again once the lease side has counted its hold.
    let pc = provider.node.client.clone();
    eventually(
        "the new offer signed with the GPU the lease holds taken",
        || {
            let pc = pc.clone();
            async move {
                pc.own_offer()
                    .await
                    .unwrap()
                    .is_some_and(|o| o.offer.free_gpus == 1)
            }
        },
    )
    .await;
    let own = provider.node.client.own_offer().await.unwrap().unwrap();
    assert!(
        own.id != signed_before.id && own.offer.seq > signed_before.offer.seq,
        "the withdrawn offer is not restored: {:?} after {:?}",
        own.offer,
        signed_before.offer
    );
    assert!(
        provider.node.client.offer(own.id).await.unwrap().is_some(),
        "the new own offer is in the provider's own book"
    );
    provider.node.client.restored().await;
    assert_eq!(provider.node.client.book_len().await.unwrap(), 1);
    let theirs = provider
        .store
        .call(|s| s.leases(Some(Role::Provider)))
        .await
        .unwrap();
    assert_eq!(theirs.len(), 1);
    assert_eq!(theirs[0].lease.id, lease_id);
    connect(&renter, &provider).await;
    let again = negotiate_signed(
        &renter.node.client,
        &clock::SystemClock,
        request,
        t,
        vec![provider.addr.clone()],
    )
    .await
    .unwrap();
    let (_, _, again_accept) = accepted(again);
    assert_eq!(again_accept.to_bytes().unwrap(), accept.to_bytes().unwrap());
    // Its GPU is still held: a two-GPU request (made from the provider's current offer, which
    // the renter learns on connecting) finds one free.
    let (rc, current) = (renter.node.client.clone(), own.id);
    eventually("the renter holds the provider's current offer", || {
        let rc = rc.clone();
        async move { rc.offer(current).await.unwrap().is_some() }
    })
    .await;
    let now_entry = renter.node.client.offer(own.id).await.unwrap().unwrap();
    assert_eq!(now_entry.offer.free_gpus, 1);
    assert_eq!(
        rejected(negotiate(&renter, &now_entry, terms(&renter, &now_entry, &ask(2, 8))).await),
        RejectReason::NoCapacity { free: 1 }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_without_listeners_is_reached_through_a_relay() {
    let dir = tempfile::tempdir().unwrap();
    let mut relay_cfg = config();
    relay_cfg.relay_server = true;
    let relay = start(dir.path(), "relay", relay_cfg).await;
    // Outbound-only provider (as behind a NAT): no listener, so no direct route exists.
    let mut p_cfg = provider_config(1, 350_000);
    p_cfg.use_relays = true;
    p_cfg.listen.clear();
    let mut provider = start_provider(dir.path(), "provider", p_cfg).await;
    let mut renter = start(dir.path(), "renter", config()).await;

    connect(&provider, &relay).await;
    let r = relay.peer;
    wait_event(&mut provider.events, |e| match e {
        NetworkEvent::RelayReservation { relay } if *relay == r => Some(()),
        _ => None,
    })
    .await;

    // The renter knows only the relay; the offer, re-signed with the relayed address once the
    // reservation is up, reaches it through the relay's gossip.
    connect(&renter, &relay).await;
    let p = provider.key_public;
    let entry = loop {
        let id = wait_event(&mut renter.events, |e| match e {
            NetworkEvent::OfferAdmitted { id, provider, .. } if *provider == p => Some(*id),
            _ => None,
        })
        .await;
        if let Some(e) = renter.node.client.offer(id).await.unwrap()
            && !e.offer.addrs.is_empty()
        {
            break e;
        }
    };
    assert!(
        entry
            .offer
            .addrs
            .iter()
            .all(|a| a.contains("/p2p-circuit/")),
        "{:?}",
        entry.offer.addrs
    );
    let t = terms(&renter, &entry, &ask(1, 1));
    let out = negotiate(&renter, &entry, t).await;
    assert!(
        matches!(out, NegotiationOutcome::Accepted { .. }),
        "{out:?}"
    );
    while provider.events.try_recv().is_ok() {}
}

/// The store is not a trust boundary the node skips: offers restored at start are verified again
/// (in batches), and a stored offer whose signature was altered on disk is not restored, while
/// its valid neighbours in the same batch are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_offers_are_verified_again_and_a_tampered_one_is_dropped() {
    use gridlease_node::home::Home;
    use gridlease_node::store::Store;
    use gridlease_protocol::{NodeKey, OfferId};

    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("n");
    Home::init(&home, &net()).unwrap();
    let now = clock::now();
    let mut rows = Vec::new();
    for i in 0..5u8 {
        let key = NodeKey::from_secret([40 + i; 32]);
        let offer = live_offer(&key, 1, 100_000 + u64::from(i), now, 600);
        let signed = Signed::sign(&key, &net(), &offer).unwrap();
        let id = OfferId(signed.verify(&net()).unwrap().digest);
        rows.push((id, signed, offer, now));
    }
    // Offer 2's signature altered in the database.
    let mut env = rows[2].1.clone().into_envelope();
    env.signature.0[9] ^= 1;
    rows[2].1 = Signed::from_envelope(env);
    {
        let mut store = Store::open(&Home::open(&home).unwrap().db_path()).unwrap();
        store.put_offers(&rows, now).unwrap();
        assert_eq!(store.live_offers(now).unwrap().len(), 5);
    }
    let node = start_from_home(&home, config()).await;
    let progress = node.node.client.restored().await;
    assert_eq!(
        (
            progress.stored,
            progress.checked,
            progress.restored,
            progress.done
        ),
        (5, 5, 4, true),
        "{progress:?}"
    );
    for (i, (id, ..)) in rows.iter().enumerate() {
        let held = node.node.client.offer(*id).await.unwrap();
        assert_eq!(
            held.is_some(),
            i != 2,
            "offer {i} restored: {}",
            held.is_some()
        );
    }
    stop(node).await;
}

/// A restart does not wait for its stored offers (issue 19): `Node::start` returns with the
/// restore still under way (the node answers searches and lookups meanwhile, seeing what is
/// restored so far), the progress counts up, and in the end every stored offer is in the book.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_answers_before_its_stored_offers_are_restored() {
    use gridlease_node::home::Home;
    use gridlease_node::store::Store;
    use gridlease_protocol::{NodeKey, OfferId};

    const N: u64 = 6_000;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("n");
    Home::init(&home, &net()).unwrap();
    let now = clock::now();
    let rows: Vec<_> = (0..N)
        .map(|i| {
            let mut secret = [9u8; 32];
            secret[..8].copy_from_slice(&i.to_le_bytes());
            let key = NodeKey::from_secret(secret);
            let offer = live_offer(&key, 1, 100_000 + i, now, 600);
            let signed = Signed::sign(&key, &net(), &offer).unwrap();
            let id = OfferId(signed.envelope().content_digest());
            (id, signed, offer, now)
        })
        .collect();
    Store::open(&Home::open(&home).unwrap().db_path())
        .unwrap()
        .put_offers(&rows, now)
        .unwrap();
    let node = start_from_home(&home, config()).await;
    let c = &node.node.client;
    let early = c.restore_progress();
    let held_early = c.book_len().await.unwrap();
    assert!(
        !early.done && (held_early as u64) < N,
        "start returned before the restore finished: {early:?}, {held_early} held"
    );
    // Searches answer meanwhile.
    c.search(gridlease_contracts::query::Query::parse("").unwrap(), 10)
        .await
        .unwrap();
    let done = c.restored().await;
    assert_eq!(
        (done.stored, done.checked, done.restored, done.left()),
        (N, N, N, 0),
        "{done:?}"
    );
    assert_eq!(c.book_len().await.unwrap() as u64, N);
    for (id, ..) in rows.iter().step_by(997) {
        assert!(c.offer(*id).await.unwrap().is_some());
    }
    stop(node).await;
}

/// Providers re-sign their offer before it expires, so an id from an earlier search ages out.
/// The renter's node remembers replaced ids: the same GPUs at the same (or a lower) price is the
/// offer the renter meant; a higher price is reported as a change, with the old price.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_id_from_an_earlier_search_leads_to_the_providers_current_offer() {
    let dir = tempfile::tempdir().unwrap();
    let (provider, mut renter, first) = market(dir.path(), 2).await;
    let p = provider.key_public;
    let mut learn = async |price: u64| {
        provider
            .node
            .client
            .set_offer(Some(template(2, price)))
            .await
            .unwrap();
        wait_event(&mut renter.events, |e| match e {
            NetworkEvent::OfferAdmitted { id, provider, .. } if *provider == p => Some(*id),
            _ => None,
        })
        .await
    };
    let resigned = learn(350_000).await;
    assert_ne!(resigned, first.id);
    let prefix = first.id.to_string()[..12].to_string();
    let found = renter
        .node
        .client
        .replaced_offers(prefix.clone())
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].old, first.id);
    assert_eq!(found[0].current.id, resigned);
    assert!(found[0].equivalent, "same GPUs, same price");

    let dearer = learn(500_000).await;
    let found = renter.node.client.replaced_offers(prefix).await.unwrap();
    assert_eq!(found[0].current.id, dearer);
    assert!(!found[0].equivalent, "a higher price is a change");
    assert_eq!(found[0].old_price_per_gpu_hour, 350_000);
    // Current ids are not "replaced".
    let now = dearer.to_string();
    assert!(
        renter
            .node
            .client
            .replaced_offers(now)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A peer that speaks `/gridlease/lease/1` with raw frames (another implementation, or a
/// prober): what it sends is written as is.
#[derive(Clone, Default)]
struct RawCodec;

impl libp2p::request_response::Codec for RawCodec {
    type Protocol = libp2p::StreamProtocol;
    type Request = Vec<u8>;
    type Response = Vec<u8>;

    async fn read_request<T>(&mut self, _: &Self::Protocol, io: &mut T) -> std::io::Result<Vec<u8>>
    where
        T: futures::AsyncRead + Unpin + Send,
    {
        gridlease_node::net::codec::read_frame(io, 1 << 20).await
    }

    async fn read_response<T>(&mut self, _: &Self::Protocol, io: &mut T) -> std::io::Result<Vec<u8>>
    where
        T: futures::AsyncRead + Unpin + Send,
    {
        gridlease_node::net::codec::read_frame(io, 1 << 20).await
    }

    async fn write_request<T>(
        &mut self,
        _: &Self::Protocol,
        io: &mut T,
        req: Vec<u8>,
    ) -> std::io::Result<()>
    where
        T: futures::AsyncWrite + Unpin + Send,
    {
        gridlease_node::net::codec::write_frame(io, &req, 1 << 20).await
    }

    async fn write_response<T>(
        &mut self,
        _: &Self::Protocol,
        io: &mut T,
        res: Vec<u8>,
    ) -> std::io::Result<()>
    where
        T: futures::AsyncWrite + Unpin + Send,
    {
        gridlease_node::net::codec::write_frame(io, &res, 1 << 20).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_lease_request_gets_a_signed_malformed_answer() {
    use futures::StreamExt;
    use gridlease_node::net::codec::{LEASE_PROTOCOL, LeaseRpcResponse, MAX_RESPONSE_FRAME};
    use libp2p::request_response::{self, ProtocolSupport};
    let dir = tempfile::tempdir().unwrap();
    let provider = start_provider(dir.path(), "provider", provider_config(1, 350_000)).await;
    let mut prober = libp2p::SwarmBuilder::with_new_identity()
        .with_tokio()
        .with_tcp(
            libp2p::tcp::Config::default(),
            libp2p::noise::Config::new,
            libp2p::yamux::Config::default,
        )
        .unwrap()
        .with_behaviour(|_| {
            request_response::Behaviour::with_codec(
                RawCodec,
                [(LEASE_PROTOCOL, ProtocolSupport::Outbound)],
                request_response::Config::default(),
            )
        })
        .unwrap()
        .build();
    prober.dial(provider.addr.clone()).unwrap();
    prober
        .behaviour_mut()
        .send_request(&provider.peer, b"\x07not a lease request".to_vec());
    let answer = tokio::time::timeout(DEADLINE, async {
        loop {
            match prober.select_next_some().await {
                libp2p::swarm::SwarmEvent::Behaviour(request_response::Event::Message {
                    message: request_response::Message::Response { response, .. },
                    ..
                }) => break Ok(response),
                libp2p::swarm::SwarmEvent::Behaviour(
                    request_response::Event::OutboundFailure { error, .. },
                ) => break Err(error.to_string()),
                _ => {}
            }
        }
    })
    .await
    .expect("no answer")
    .expect("the stream was closed without an answer");
    let decoded =
        gridlease_protocol::codec::decode::<LeaseRpcResponse, MAX_RESPONSE_FRAME>(&answer).unwrap();
    let LeaseRpcResponse::Rejected(signed) = decoded else {
        panic!("not a rejection: {decoded:?}");
    };
    let v = signed.verify(&net()).unwrap();
    assert_eq!(v.signer, provider.key_public, "signed by the provider");
    assert!(
        matches!(v.message.reason, RejectReason::Malformed { .. }),
        "{:?}",
        v.message.reason
    );
}
