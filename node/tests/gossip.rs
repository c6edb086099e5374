//! Offer gossip between real swarms on loopback.
// Test helpers unwrap: a failed step is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use gridlease_node::clock;
use gridlease_node::net::gossip::thresholds;
use gridlease_node::net::{NetworkEvent, NodeConfig};
use gridlease_protocol::envelope::Envelope;
use gridlease_protocol::{NetworkId, NodeKey, Offer, OfferId, PeerId, Signed};

async fn learn_everywhere(nodes: &mut [TestNode], provider: usize) {
    let offer = nodes[provider]
        .node
        .client
        .set_offer(Some(template(2, 350_000)))
        .await
        .unwrap()
        .expect("own offer");
    let id = offer.id;
    for (i, n) in nodes.iter_mut().enumerate() {
        if i == provider {
            continue;
        }
        wait_event(&mut n.events, |e| match e {
            NetworkEvent::OfferAdmitted { id: got, .. } if *got == id => Some(()),
            _ => None,
        })
        .await;
        assert!(n.node.client.offer(id).await.unwrap().is_some());
    }
}

/// `g` publishes `n` live offers of `n` providers (keys from `seed`) on the offer topic.
async fn publish_offers(g: &TestNode, seed: u8, n: u32) {
    publish_offers_on(g, seed, n, None, gridlease_node::net::RawTopic::Followed).await;
}

/// `g` publishes `n` live offers of `n` providers (keys from `seed`) with GPUs of `model`, on
/// the topic of every offer.
async fn publish_model_offers(g: &TestNode, seed: u8, n: u32, model: &str) {
    publish_offers_on(
        g,
        seed,
        n,
        Some(model),
        gridlease_node::net::RawTopic::Every,
    )
    .await;
}

/// `g` publishes `n` live offers of `n` providers (keys from `seed`), their GPUs of `model`
/// when given, on topic `on`.
async fn publish_offers_on(
    g: &TestNode,
    seed: u8,
    n: u32,
    model: Option<&str>,
    on: gridlease_node::net::RawTopic,
) {
    let now = clock::now();
    for i in 0..n {
        let mut secret = [seed; 32];
        secret[..4].copy_from_slice(&i.to_be_bytes());
        let key = NodeKey::from_secret(secret);
        let mut offer = live_offer(&key, 1, 100_000, now, 300);
        if let Some(model) = model {
            for g in &mut offer.gpus {
                g.spec.model = model.to_string();
            }
        }
        let bytes = Signed::sign(&key, &net(), &offer)
            .unwrap()
            .to_bytes()
            .unwrap();
        g.node
            .client
            .publish_raw_on(on.clone(), bytes)
            .await
            .unwrap()
            .unwrap();
    }
}

/// Once `f` subscribes at provider `p`, `p` offers one GPU of `model` at `price`; returns the
/// new offer's id once `f` has admitted it (by gossip: the two are connected).
async fn new_offer_heard_by(
    p: &mut TestNode,
    f: &mut TestNode,
    model: &str,
    price: u64,
) -> OfferId {
    let fpeer = f.peer;
    subscribed(p, fpeer).await;
    let new = p
        .node
        .client
        .set_offer(Some(template_of(model, price)))
        .await
        .unwrap()
        .unwrap()
        .id;
    wait_event(&mut f.events, |e| match e {
        NetworkEvent::OfferAdmitted { id, .. } if *id == new => Some(()),
        _ => None,
    })
    .await;
    new
}

/// Waits until `n` hears that `peer` subscribed to an offer topic.
async fn subscribed(n: &mut TestNode, peer: PeerId) {
    wait_event(&mut n.events, |e| match e {
        NetworkEvent::PeerSubscribed { peer: s } if *s == peer => Some(()),
        _ => None,
    })
    .await;
}

/// Waits until the node's book holds `n` offers.
async fn holds(c: &gridlease_node::net::Client, n: usize) {
    let c = c.clone();
    eventually(&format!("{n} offers in the book"), || {
        let c = c.clone();
        async move { c.book_len().await.unwrap() == n }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_nodes_in_a_line_all_learn_a_new_offer() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = Vec::new();
    for i in 0..20 {
        nodes.push(start(dir.path(), &format!("n{i}"), config()).await);
    }
    for i in 0..19 {
        connect(&nodes[i], &nodes[i + 1]).await;
    }
    wait_mesh(&nodes).await;
    // The provider sits at one end: the offer crosses 19 hops.
    learn_everywhere(&mut nodes, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_nodes_in_a_random_topology_all_learn_a_new_offer() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x5eed_0001);
    let mut nodes = Vec::new();
    for i in 0..20 {
        nodes.push(start(dir.path(), &format!("n{i}"), config()).await);
    }
    // A random tree (connected) plus 10 random extra edges, from a fixed seed.
    random_topology(&nodes, &mut rng, 10).await;
    wait_mesh(&nodes).await;
    let provider = rng.below(20);
    learn_everywhere(&mut nodes, provider).await;
}

/// Offers are published when they are signed, not periodically (issue 19, `docs/protocol.md`
/// 3c): nodes that learned an offer hear nothing more of it while it does not change; a node
/// that joins later gets it by book sync when it connects; and a node that could hear of it
/// only from a peer that learned it by sync (synced offers are not re-gossiped) gets it from
/// the anti-entropy round, a whole book sync with a connected peer each `offer_resync`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_offer_is_not_republished_and_book_sync_reaches_who_missed_it() {
    let dir = tempfile::tempdir().unwrap();
    let resync = Duration::from_secs(2);
    let quick = || {
        let mut c = config();
        c.offer_resync = resync;
        c
    };
    let mut nodes = Vec::new();
    for i in 0..4 {
        nodes.push(start(dir.path(), &format!("n{i}"), quick()).await);
    }
    for i in 0..3 {
        connect(&nodes[i], &nodes[i + 1]).await;
    }
    wait_mesh(&nodes).await;
    learn_everywhere(&mut nodes, 0).await;
    let id = nodes[0].node.client.own_offer().await.unwrap().unwrap().id;

    // Three announce periods: not one message about the unchanged offer reaches the far end.
    let far = nodes[3].node.client.clone();
    let heard = |g: gridlease_node::net::GossipStats| g.accepted + g.ignored + g.rejected;
    let before = far.gossip_stats().await.unwrap();
    tokio::time::sleep(ANNOUNCE * 3 + ANNOUNCE / 2).await;
    let after = far.gossip_stats().await.unwrap();
    assert_eq!(
        heard(after),
        heard(before),
        "the unchanged offer was announced again: {before:?} -> {after:?}"
    );

    // An island of two nodes joins at the far end: `edge` gets the offer by syncing with n3
    // when it connects; `beyond`, connected only to `edge`, has nobody to gossip it (synced
    // offers are not re-gossiped, the provider does not announce it again) until its
    // anti-entropy round syncs with `edge`.
    let mut beyond = start(dir.path(), "beyond", quick()).await;
    let edge = start(dir.path(), "edge", quick()).await;
    connect(&beyond, &edge).await;
    let joined = tokio::time::Instant::now();
    connect(&edge, &nodes[3]).await;
    let edge_client = edge.node.client.clone();
    eventually("the edge node holds the offer by sync", || {
        let c = edge_client.clone();
        async move { c.offer(id).await.unwrap().is_some() }
    })
    .await;
    let synced = edge_client.sync_stats().await.unwrap();
    assert!(synced.offers_admitted >= 1, "{synced:?}");
    assert!(
        joined.elapsed() < Duration::from_secs(2),
        "book sync on connecting took {:?}",
        joined.elapsed()
    );
    wait_event(&mut beyond.events, |e| match e {
        NetworkEvent::OfferAdmitted { id: got, .. } if *got == id => Some(()),
        _ => None,
    })
    .await;
    let took = joined.elapsed();
    let st = beyond.node.client.sync_stats().await.unwrap();
    let g = beyond.node.client.gossip_stats().await.unwrap();
    eprintln!("the node beyond held the offer {took:?} after the island joined; {st:?} {g:?}");
    assert!(
        took <= resync * 2 + Duration::from_secs(1),
        "anti-entropy brought the offer after {took:?}"
    );
    assert_eq!(st.offers_admitted, 1, "by sync, not gossip: {st:?} {g:?}");
    assert_eq!(heard(g), 0, "{g:?}");
    // By a round that compared bucket digests and listed the one bucket that differed.
    assert!(st.digest_rounds >= 1 && st.buckets_differing >= 1, "{st:?}");
    assert_eq!(st.ids_received, 1, "{st:?}");
}

/// Anti-entropy compares bucket digests first (`docs/protocol.md` 3c step 3): between two
/// nodes that hold the same 300 offers, rounds list no id at all (a whole listing would be 300
/// ids, 33 bytes each, every round).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anti_entropy_between_books_in_step_lists_no_ids() {
    let dir = tempfile::tempdir().unwrap();
    let quick = || {
        let mut c = config();
        c.offer_resync = Duration::from_millis(500);
        c
    };
    let ab = vec![
        start(dir.path(), "a", quick()).await,
        start(dir.path(), "b", quick()).await,
    ];
    let g = start(dir.path(), "g", config()).await;
    connect(&ab[0], &ab[1]).await;
    connect(&g, &ab[0]).await;
    connect(&g, &ab[1]).await;
    wait_mesh(&ab).await;
    publish_offers(&g, 5, 300).await;
    for n in &ab {
        holds(&n.node.client, 300).await;
    }
    // Only the two stay connected: a and b hold the same book.
    stop(g).await;
    let ac = ab[0].node.client.clone();
    let before = ac.sync_stats().await.unwrap();
    // Waits for two anti-entropy rounds (500 ms apart) instead of sleeping a fixed 3 s.
    eventually("two more digest rounds", || {
        let ac = ac.clone();
        async move { ac.sync_stats().await.unwrap().digest_rounds >= before.digest_rounds + 2 }
    })
    .await;
    let after = ac.sync_stats().await.unwrap();
    assert_eq!(
        after.buckets_differing, before.buckets_differing,
        "{after:?}"
    );
    assert_eq!(after.ids_received, before.ids_received, "{after:?}");
    for n in ab {
        stop(n).await;
    }
}

/// The sync on connecting compares bucket digests first too: a node that restarts with its
/// book lists no id of a peer in step with it (it listed every id, 33 bytes each, before), and
/// a new node, for which every bucket differs, lists whole pages and gets everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_with_its_book_lists_no_ids_when_it_reconnects() {
    let dir = tempfile::tempdir().unwrap();
    // No anti-entropy round in the test's time: every sync here is one on connecting.
    let slow = || {
        let mut c = config();
        c.offer_resync = Duration::from_secs(3600);
        c
    };
    let ab = vec![
        start(dir.path(), "a", slow()).await,
        start(dir.path(), "b", slow()).await,
    ];
    let g = start(dir.path(), "g", slow()).await;
    connect(&ab[0], &ab[1]).await;
    connect(&g, &ab[0]).await;
    connect(&g, &ab[1]).await;
    wait_mesh(&ab).await;
    publish_offers(&g, 6, 300).await;
    for n in &ab {
        holds(&n.node.client, 300).await;
    }
    stop(g).await;
    let mut ab = ab;
    let b = ab.pop().unwrap();
    let home = stop(b).await;
    let b = start_from_home(&home, slow()).await;
    // Restored before it connects.
    holds(&b.node.client, 300).await;
    connect(&b, &ab[0]).await;
    // b syncs with a (a synced with b's peer id before, on their first connection).
    let bc = b.node.client.clone();
    eventually("b to compare a's digests", || {
        let c = bc.clone();
        async move { c.sync_stats().await.unwrap().digest_rounds >= 1 }
    })
    .await;
    // Time for any listing the comparison would start (loopback answers take milliseconds).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let st = bc.sync_stats().await.unwrap();
    assert_eq!(
        (st.digest_rounds, st.buckets_differing, st.whole_listings),
        (1, 0, 0),
        "{st:?}"
    );
    assert_eq!(st.ids_received, 0, "ids listed: {st:?}");

    // A new node: every bucket differs, whole pages are listed.
    let c = start(dir.path(), "c", slow()).await;
    connect(&c, &ab[0]).await;
    holds(&c.node.client, 300).await;
    let st = c.node.client.sync_stats().await.unwrap();
    assert_eq!(st.whole_listings, 1, "{st:?}");
    assert_eq!(st.ids_received, 300, "{st:?}");
    for n in [b, c, ab.pop().unwrap()] {
        stop(n).await;
    }
}

/// Book syncs wait for the restore of the stored offers, and then run: a node whose restore is
/// held for a second gets its peer's offers by its connection's sync once the restore is done.
/// No offer anti-entropy or completion-records round runs in the test's time (either would
/// also start the queued sync), so the end of the restore alone must start it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn book_syncs_wait_for_the_restore_and_then_run() {
    let dir = tempfile::tempdir().unwrap();
    let slow = || {
        let mut c = config();
        c.offer_resync = Duration::from_secs(3600);
        c
    };
    let full = start(dir.path(), "full", slow()).await;
    let g = start(dir.path(), "g", slow()).await;
    connect(&g, &full).await;
    wait_mesh(std::slice::from_ref(&full)).await;
    publish_offers(&g, 7, 50).await;
    holds(&full.node.client, 50).await;
    stop(g).await;
    let mut c = slow();
    c.completions_republish = Duration::from_secs(3600);
    c.faults.hold_restore = Some(Duration::from_secs(1));
    let new = start(dir.path(), "new", c).await;
    connect(&new, &full).await;
    let nc = new.node.client.clone();
    holds(&nc, 50).await;
    let st = nc.sync_stats().await.unwrap();
    assert_eq!(st.offers_admitted, 50, "{st:?}");
    for n in [new, full] {
        stop(n).await;
    }
}

/// Offers a sync asked for and did not get (the peer listed them and no longer holds them) are
/// asked for again from the next peer that lists them: a new node synced first with a peer
/// that answers its `Get`s empty still gets every offer from a second, full peer. (Before,
/// the ids of a `Get` stayed "wanted" forever and every later listing skipped them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offers_a_peer_listed_and_did_not_send_are_fetched_from_the_next_peer() {
    let dir = tempfile::tempdir().unwrap();
    // Every sync here is a connection's: no anti-entropy or completion-records round.
    let slow = || {
        let mut c = config();
        c.offer_resync = Duration::from_secs(3600);
        c.completions_republish = Duration::from_secs(3600);
        c
    };
    let mut lossy = slow();
    lossy.faults.answer_gets_empty = true;
    let lossy = start(dir.path(), "lossy", lossy).await;
    let full = start(dir.path(), "full", slow()).await;
    let g = start(dir.path(), "g", slow()).await;
    connect(&lossy, &full).await;
    connect(&g, &lossy).await;
    connect(&g, &full).await;
    let peers = vec![lossy, full];
    wait_mesh(&peers).await;
    let (lossy, full) = (&peers[0], &peers[1]);
    publish_offers(&g, 8, 60).await;
    holds(&lossy.node.client, 60).await;
    holds(&full.node.client, 60).await;
    stop(g).await;

    let new = start(dir.path(), "new", slow()).await;
    let nc = new.node.client.clone();
    connect(&new, lossy).await;
    eventually("the lossy peer's empty answers", || {
        let c = nc.clone();
        async move { c.sync_stats().await.unwrap().asked_not_admitted == 60 }
    })
    .await;
    assert_eq!(nc.book_len().await.unwrap(), 0);
    connect(&new, full).await;
    holds(&nc, 60).await;
    let st = nc.sync_stats().await.unwrap();
    assert_eq!(st.offers_admitted, 60, "{st:?}");
    stop(new).await;
    for n in peers {
        stop(n).await;
    }
}

/// A provider whose publication reached nobody (it had no peer yet) publishes it again when a
/// peer subscribes to the offer topic, so nodes beyond that peer hear of it at once rather
/// than at the next anti-entropy round (an hour away here) or the re-sign before expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_first_published_to_nobody_is_published_when_a_peer_subscribes() {
    let dir = tempfile::tempdir().unwrap();
    let slow = || {
        let mut c = NodeConfig::local(net(), Duration::from_secs(60));
        c.offer_resync = Duration::from_secs(3600);
        c
    };
    let mut ab = vec![
        start(dir.path(), "a", slow()).await,
        start(dir.path(), "b", slow()).await,
    ];
    connect(&ab[0], &ab[1]).await;
    wait_mesh(&ab).await;
    let mut pc = slow();
    pc.offer = Some(template(1, 300_000));
    let provider = start(dir.path(), "provider", pc).await;
    let own = provider.node.client.clone();
    eventually("the provider's own offer", || {
        let c = own.clone();
        async move { c.own_offer().await.unwrap().is_some() }
    })
    .await;
    let id = own.own_offer().await.unwrap().unwrap().id;
    let t = tokio::time::Instant::now();
    connect(&provider, &ab[0]).await;
    let b = &mut ab[1];
    wait_event(&mut b.events, |e| match e {
        NetworkEvent::OfferAdmitted { id: got, .. } if *got == id => Some(()),
        _ => None,
    })
    .await;
    eprintln!(
        "the node beyond held the offer {:?} after the provider connected",
        t.elapsed()
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let st = b.node.client.sync_stats().await.unwrap();
    assert_eq!(st.offers_admitted, 0, "it came by gossip: {st:?}");
}

/// A provider that stops providing, or shuts down, withdraws its offer (re-signed with no free
/// GPU and a short life): other nodes' searches leave it out at once instead of listing it
/// until it expires (an hour at the defaults, now that unchanged offers are not announced
/// again). Started again from the same home, it offers afresh with a higher sequence, which
/// the others take (the withdrawn offer is not restored: they would refuse it as a replay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_stops_withdraws_its_offer_and_offers_afresh_when_started_again() {
    use gridlease_contracts::query::Query;
    let dir = tempfile::tempdir().unwrap();
    // Long periods: nothing but the provider's own publications changes what the observer holds.
    let slow = || {
        let mut c = NodeConfig::local(net(), Duration::from_secs(60));
        c.offer_resync = Duration::from_secs(3600);
        c
    };
    let observer = start(dir.path(), "observer", slow()).await;
    let mut pc = slow();
    pc.offer = Some(template(1, 300_000));
    // The same address after the restart, so its offer is not re-signed for new addresses.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    pc.listen = vec![format!("/ip4/127.0.0.1/tcp/{port}").parse().unwrap()];
    let provider = start(dir.path(), "provider", pc.clone()).await;
    let who = provider.key_public;
    connect(&observer, &provider).await;
    let client = observer.node.client.clone();
    let listed = || {
        let c = client.clone();
        async move {
            // What `search` shows by default (the API adds `free>=1`).
            c.search(Query::parse("free>=1").unwrap(), 10)
                .await
                .unwrap()
                .iter()
                .find(|e| e.offer.provider == who)
                .map(|e| e.offer.seq)
        }
    };
    let until = |want: bool, what: &'static str| {
        let c = client.clone();
        async move {
            let t = tokio::time::Instant::now();
            while listed().await.is_some() != want {
                if t.elapsed() > Duration::from_secs(3) {
                    let g = c.gossip_stats().await.unwrap();
                    let st = c.sync_stats().await.unwrap();
                    panic!("{what}: not within 3 s; {g:?} {st:?}");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            eprintln!("{what} after {:?}", t.elapsed());
        }
    };
    until(true, "listed").await;
    let first = listed().await.unwrap();

    provider.node.client.set_offer(None).await.unwrap();
    until(false, "left out after `provide` was turned off").await;
    let held = client
        .search(Query::parse("free>=0").unwrap(), 10)
        .await
        .unwrap();
    let w = held.iter().find(|e| e.offer.provider == who).unwrap();
    assert!(
        w.offer.seq > first && w.offer.free_gpus == 0,
        "{:?}",
        w.offer
    );
    assert!(w.offer.expires_at.ms_since(w.offer.created_at) <= 90_000);

    provider
        .node
        .client
        .set_offer(Some(template(1, 300_000)))
        .await
        .unwrap();
    until(true, "listed again after `provide` was turned on").await;

    let home = stop(provider).await;
    until(false, "left out after the provider shut down").await;
    let gone = client
        .search(Query::parse("free>=0").unwrap(), 10)
        .await
        .unwrap()
        .iter()
        .find(|e| e.offer.provider == who)
        .map(|e| e.offer.seq)
        .unwrap();

    let provider = start_from_home(&home, pc).await;
    connect(&observer, &provider).await;
    until(true, "listed after the provider started again").await;
    assert!(listed().await.unwrap() > gone);
    let g = client.gossip_stats().await.unwrap();
    let st = client.sync_stats().await.unwrap();
    assert_eq!((g.rejected, st.offers_rejected), (0, 0), "{g:?} {st:?}");
    stop(provider).await;
    stop(observer).await;
}

fn tampered(signed: &Signed<Offer>, f: impl FnOnce(&mut Envelope)) -> Vec<u8> {
    let mut env = signed.envelope().clone();
    f(&mut env);
    env.to_bytes().unwrap()
}

async fn rejected_by(node: &mut TestNode, from: PeerId) -> String {
    wait_event(&mut node.events, |e| match e {
        NetworkEvent::OfferRejected { from: f, reason } if *f == from => Some(reason.clone()),
        _ => None,
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_offers_are_rejected_everywhere_and_their_senders_lose_score() {
    let dir = tempfile::tempdir().unwrap();
    // Honest line h0 - h1 - h2; each attacker is connected to h0 and h1.
    let mut honest = Vec::new();
    for i in 0..3 {
        honest.push(start(dir.path(), &format!("h{i}"), config()).await);
    }
    connect(&honest[0], &honest[1]).await;
    connect(&honest[1], &honest[2]).await;
    let mut attackers = Vec::new();
    for i in 0..4 {
        let a = start(dir.path(), &format!("a{i}"), config()).await;
        connect(&a, &honest[0]).await;
        connect(&a, &honest[1]).await;
        attackers.push(a);
    }
    wait_mesh(&honest).await;
    wait_mesh(&attackers).await;

    let now = clock::now();
    let net = net();
    let keys: Vec<NodeKey> = (0..4).map(|i| NodeKey::from_secret([40 + i; 32])).collect();

    // 1. bad signature
    let good = Signed::sign(&keys[0], &net, &live_offer(&keys[0], 1, 100_000, now, 300)).unwrap();
    let bad_sig = tampered(&good, |e| e.signature.0[7] ^= 1);
    // 2. wrong network id (correctly signed for another network)
    let other = NetworkId::new("othernet").unwrap();
    let wrong_net = Signed::sign(
        &keys[1],
        &other,
        &live_offer(&keys[1], 1, 100_000, now, 300),
    )
    .unwrap()
    .to_bytes()
    .unwrap();
    // 3. expired well beyond the clock-skew allowance
    let mut old = live_offer(&keys[2], 1, 100_000, now, 300);
    old.created_at = gridlease_protocol::Timestamp(now.0 - 900_000);
    old.expires_at = gridlease_protocol::Timestamp(now.0 - 300_000);
    let expired = Signed::sign(&keys[2], &net, &old)
        .unwrap()
        .to_bytes()
        .unwrap();
    // 4. replayed sequence: seq 10 is accepted, then seq 9 is a replay
    let seq10 = Signed::sign(&keys[3], &net, &live_offer(&keys[3], 10, 100_000, now, 300)).unwrap();
    let seq9 = Signed::sign(&keys[3], &net, &live_offer(&keys[3], 9, 90_000, now, 300))
        .unwrap()
        .to_bytes()
        .unwrap();

    let seq10_id = OfferId(seq10.envelope().content_digest());
    attackers[3]
        .node
        .client
        .publish_raw(seq10.to_bytes().unwrap())
        .await
        .unwrap()
        .unwrap();
    for h in honest.iter_mut() {
        wait_event(&mut h.events, |e| match e {
            NetworkEvent::OfferAdmitted { id, .. } if *id == seq10_id => Some(()),
            _ => None,
        })
        .await;
    }

    let cases = [
        ("bad signature", bad_sig, "signature"),
        ("wrong network", wrong_net, "network"),
        ("expired", expired, "expired"),
        ("replayed sequence", seq9, "replayed"),
    ];
    for (i, (what, bytes, needle)) in cases.into_iter().enumerate() {
        let a = attackers[i].peer;
        attackers[i]
            .node
            .client
            .publish_raw(bytes)
            .await
            .unwrap()
            .unwrap();
        for h in honest.iter_mut().take(2) {
            let reason = rejected_by(h, a).await;
            assert!(reason.contains(needle), "{what}: {reason}");
            let score = h.node.client.peer_score(a).await.unwrap().unwrap();
            assert!(score < 0.0, "{what}: score of the sender is {score}");
        }
    }
    // h2 is not connected to any attacker: h0 and h1 never forwarded the invalid offers.
    let mut seen_by_h2 = Vec::new();
    while let Ok(ev) = honest[2].events.try_recv() {
        if let NetworkEvent::OfferRejected { reason, .. } = ev {
            seen_by_h2.push(reason);
        }
    }
    assert!(seen_by_h2.is_empty(), "h2 saw {seen_by_h2:?}");
    for h in honest.iter().take(2) {
        let g = h.node.client.gossip_stats().await.unwrap();
        assert!(g.rejected >= 4, "rejections counted: {g:?}");
    }
    for h in &honest {
        assert_eq!(h.node.client.book_len().await.unwrap(), 1, "only seq 10");
        let held = h.node.client.offer(seq10_id).await.unwrap().unwrap();
        assert_eq!(held.offer.seq, 10);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_invalid_offers_does_not_stop_honest_offers() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = Vec::new();
    for i in 0..5 {
        nodes.push(start(dir.path(), &format!("n{i}"), config()).await);
    }
    for i in 0..4 {
        connect(&nodes[i], &nodes[i + 1]).await;
    }
    let flooder = start(dir.path(), "flooder", config()).await;
    connect(&flooder, &nodes[0]).await;
    connect(&flooder, &nodes[1]).await;
    wait_mesh(&nodes).await;

    let net = net();
    let now = clock::now();
    let key = NodeKey::from_secret([66; 32]);
    let mut watch = nodes[0].node.events.subscribe();
    // One signature, then 1000 distinct corruptions of it: the flood costs the flooder nothing
    // (so the test measures the receivers), and every message needs a signature check.
    let signed = Signed::sign(&key, &net, &live_offer(&key, 1, 1, now, 300)).unwrap();
    let junk: Vec<Vec<u8>> = (0..1000usize)
        .map(|i| tampered(&signed, |e| e.signature.0[i % 64] ^= (i / 64 + 1) as u8))
        .collect();
    let flood = tokio::spawn({
        let client = flooder.node.client.clone();
        async move {
            for bytes in junk {
                // The flooder's own queue may refuse some; that is its problem.
                let _ = client.publish_raw(bytes).await.unwrap();
            }
        }
    });
    // Honest provider at the far end publishes while the flood is on.
    learn_everywhere(&mut nodes, 4).await;
    flood.await.unwrap();
    let score = nodes[0]
        .node
        .client
        .peer_score(flooder.peer)
        .await
        .unwrap()
        .unwrap();
    assert!(
        score < thresholds().graylist_threshold,
        "flooder score {score} should be below the graylist threshold"
    );
    for n in &nodes {
        assert_eq!(n.node.client.book_len().await.unwrap(), 1);
    }
    // Verification work on the flood is bounded: three rejections (-10, -40, -90) graylist the
    // flooder, after which its offers are dropped unverified.
    let mut rejected = 0;
    while let Ok(ev) = watch.try_recv() {
        if matches!(ev, NetworkEvent::OfferRejected { from, .. } if from == flooder.peer) {
            rejected += 1;
        }
    }
    assert!(
        (1..=3).contains(&rejected),
        "{rejected} offers from the flooder were verified and rejected"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_at_every_shape_limit_fits_the_gossip_size_cap() {
    use gridlease_protocol::{
        MAX_ADDR_LEN, MAX_GPUS_PER_OFFER, MAX_IMAGE_LEN, MAX_IMAGE_PREFIXES, MAX_MODEL_LEN,
        MAX_OFFER_ADDRS, MAX_OFFER_BYTES, MAX_REGION_LEN, MAX_VERSION_LEN, WireMessage,
    };
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = Vec::new();
    for i in 0..3 {
        nodes.push(start(dir.path(), &format!("n{i}"), config()).await);
    }
    connect(&nodes[0], &nodes[1]).await;
    connect(&nodes[1], &nodes[2]).await;
    wait_mesh(&nodes).await;

    let key = NodeKey::from_secret([77; 32]);
    let now = clock::now();
    let mut offer = live_offer(&key, 1, 100_000, now, 300);
    offer.gpus = (0..MAX_GPUS_PER_OFFER as u8)
        .map(|i| {
            let mut g = gridlease_protocol::fixtures::gpu(i);
            g.spec.model = "M".repeat(MAX_MODEL_LEN);
            g.spec.driver_version = "d".repeat(MAX_VERSION_LEN);
            g.spec.cuda_version = "c".repeat(MAX_VERSION_LEN);
            g.bench.tool_version = "t".repeat(MAX_VERSION_LEN);
            g
        })
        .collect();
    offer.sandbox.image_prefixes = vec!["i".repeat(MAX_IMAGE_LEN); MAX_IMAGE_PREFIXES];
    offer.addrs = vec!["a".repeat(MAX_ADDR_LEN); MAX_OFFER_ADDRS];
    offer.region = "r".repeat(MAX_REGION_LEN);
    // On-chain settlement: the chain and the provider wallet's binding.
    let wallet = gridlease_protocol::wallet::WalletKey::from_secret([78; 32]).unwrap();
    offer.settlement = Some(gridlease_protocol::wallet::OfferSettlement {
        chain: gridlease_protocol::wallet::ChainTerms {
            chain_id: u64::MAX,
            token: [0xff; 20],
            token_decimals: 24,
            channel_contract: [0xff; 20],
        },
        wallet: gridlease_protocol::wallet::WalletBinding::possession(
            &key.public(),
            &wallet,
            &net(),
        ),
    });
    let payload = offer.encode_payload().unwrap().len();
    assert!(payload <= MAX_OFFER_BYTES, "{payload} bytes");
    let signed = Signed::sign(&key, &net(), &offer).unwrap();
    let id = OfferId(signed.envelope().content_digest());
    nodes[0]
        .node
        .client
        .publish_raw(signed.to_bytes().unwrap())
        .await
        .unwrap()
        .unwrap();
    // Two hops: node 1 validated and forwarded it, node 2 received it whole.
    for n in nodes.iter_mut().skip(1) {
        wait_event(&mut n.events, |e| match e {
            NetworkEvent::OfferAdmitted { id: got, .. } if *got == id => Some(()),
            _ => None,
        })
        .await;
    }
}

/// Book sync on connect (issue 21): twenty providers that announced before anyone listened
/// (announce period 60 s, so no re-announcement comes during the test) are each synced by a
/// hub they connect to; a renter that joins later holds every live offer within 2 s of its
/// first connection, without any announcement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_joiner_holds_the_live_offers_within_2_s_of_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let slow = || {
        let mut c = NodeConfig::local(net(), Duration::from_secs(60));
        c.offer = Some(template(1, 350_000));
        c
    };
    let mut nodes = Vec::new();
    for i in 0..20 {
        nodes.push(start(dir.path(), &format!("p{i}"), slow()).await);
    }
    let hub = nodes[0].node.client.clone();
    for n in &nodes[1..] {
        connect(n, &nodes[0]).await;
    }
    eventually("the hub to hold all 20 offers", || {
        let hub = hub.clone();
        async move { hub.book_len().await.unwrap() == 20 }
    })
    .await;

    let late = start(
        dir.path(),
        "late",
        NodeConfig::local(net(), Duration::from_secs(60)),
    )
    .await;
    let joined = tokio::time::Instant::now();
    connect(&late, &nodes[0]).await;
    let c = late.node.client.clone();
    loop {
        if c.book_len().await.unwrap() >= 20 {
            break;
        }
        assert!(
            joined.elapsed() < Duration::from_secs(2),
            "after 2 s the late joiner holds {} of 20 offers",
            c.book_len().await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = joined.elapsed();
    let st = c.sync_stats().await.unwrap();
    eprintln!("late joiner held 20 offers {took:?} after connecting; {st:?}");
    assert_eq!(st.offers_admitted, 20, "{st:?}");
    assert_eq!(st.offers_rejected, 0);
    assert_eq!(st.ids_received, 20, "{st:?}");
    assert!(st.bytes_received > 0, "{st:?}");
    for n in nodes {
        stop(n).await;
    }
    stop(late).await;
}

/// Issue 21: a peer whose gossip with its bootstrap never started (here it subscribes only
/// after its first connection closed: a stand-in for gossipsub giving up on a connection's
/// stream, which leaves the two connected and the peer deaf) is disconnected by the other
/// node once the grace has passed, dials its bootstrap again, and then hears the provider's
/// announcements by gossip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_whose_gossip_never_started_is_reconnected_and_then_hears_offers() {
    let dir = tempfile::tempdir().unwrap();
    let mut pc = config();
    pc.gossip_grace = Duration::from_secs(1);
    pc.offer = Some(template(1, 400_000));
    let provider = start(dir.path(), "provider", pc).await;
    let mut watch = provider.node.events.subscribe();
    let mut rc = config();
    rc.bootstrap = vec![provider.addr.clone()];
    rc.faults.subscribe_after_first_disconnect = true;
    let renter = start(dir.path(), "renter", rc).await;
    let t = tokio::time::Instant::now();
    // The provider sees: connected, no subscription, disconnected after the grace, connected
    // again (the renter redials its bootstrap), subscribed.
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match watch.recv().await {
                Ok(NetworkEvent::PeerConnected { peer }) if peer == renter.peer => {
                    seen.push("connected")
                }
                Ok(NetworkEvent::PeerDisconnected { peer }) if peer == renter.peer => {
                    seen.push("disconnected")
                }
                Ok(NetworkEvent::PeerSubscribed { peer }) if peer == renter.peer => {
                    seen.push("subscribed");
                    break;
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no recovery within 20 s: {seen:?}"));
    assert_eq!(
        seen,
        ["connected", "disconnected", "connected", "subscribed"]
    );
    assert!(
        t.elapsed() >= Duration::from_secs(1),
        "not before the grace: {:?}",
        t.elapsed()
    );
    // Gossip works now: the renter accepts the provider's periodic announcements.
    let client = renter.node.client.clone();
    eventually("an offer accepted from gossip", || {
        let c = client.clone();
        async move { c.gossip_stats().await.unwrap().accepted >= 1 }
    })
    .await;
}

/// Issue 21: a provider whose capacity changes faster than receivers take new sequences from
/// one provider (the per-provider rate: a burst, then one per `per_token`) paces its re-signs
/// to that rate instead of having receivers ignore the newest ones: after 40 quick changes an
/// observer's book holds the last count within a few pace intervals, not at the next
/// periodic announcement (30 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_churn_is_paced_to_what_receivers_take_and_the_last_count_arrives() {
    let dir = tempfile::tempdir().unwrap();
    // A long announce period, so no periodic re-announcement brings the last count late;
    // receivers take a burst of 5 new sequences per provider, then one per 200 ms.
    let paced = || {
        let mut c = NodeConfig::local(net(), Duration::from_secs(30));
        c.provider_rate = gridlease_node::net::ratelimit::RateLimit {
            burst: 5,
            per_token: Duration::from_millis(200),
        };
        c
    };
    let mut pc = paced();
    pc.offer = Some(template(2, 400_000));
    let provider = start(dir.path(), "provider", pc).await;
    let observer = start(dir.path(), "observer", paced()).await;
    connect(&observer, &provider).await;
    let client = observer.node.client.clone();
    let free_seen = || {
        let c = client.clone();
        async move {
            let q = gridlease_contracts::query::Query::parse("free>=0").unwrap();
            c.search(q, 10)
                .await
                .unwrap()
                .first()
                .map(|e| e.offer.free_gpus)
        }
    };
    eventually("the offer at the observer", || {
        let f = free_seen();
        async move { f.await.is_some() }
    })
    .await;
    let before = client.gossip_stats().await.unwrap();
    // 40 changes at once: more than the burst the observer takes from one provider.
    // 39 between 0 and 1, then 2: a count no earlier sequence had.
    for i in 0..39u16 {
        provider.node.client.set_free_gpus(i % 2).await.unwrap();
    }
    let last = 2;
    provider.node.client.set_free_gpus(last).await.unwrap();
    let t = tokio::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(5), async {
        while free_seen().await != Some(last) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the last count did not reach the observer within 5 s");
    eprintln!("last count at the observer after {:?}", t.elapsed());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(free_seen().await, Some(last), "and it stays");
    let after = client.gossip_stats().await.unwrap();
    assert_eq!(after.rejected, before.rejected, "{after:?}");
    let sync = client.sync_stats().await.unwrap();
    eprintln!("gossip before {before:?} after {after:?}; sync {sync:?}");
}

/// Searches read the book off the event loop (issue 19): while searches with a large limit
/// run back to back on the receiver, a burst of offers arrives and is all admitted; the book
/// pages through cursor to cursor in order; and with the loop stopped a search still answers
/// (it never queues behind the loop) while a loop command does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn searches_read_the_book_off_the_event_loop_and_page_through_it() {
    use gridlease_contracts::query::Query;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    const N: usize = 200;
    let dir = tempfile::tempdir().unwrap();
    let nodes = vec![
        start(dir.path(), "a", config()).await,
        start(dir.path(), "b", config()).await,
    ];
    connect(&nodes[0], &nodes[1]).await;
    wait_mesh(&nodes).await;
    let net = net();
    let now = clock::now();
    let burst: Vec<Vec<u8>> = (0..N)
        .map(|i| {
            let mut secret = [7u8; 32];
            secret[..8].copy_from_slice(&(i as u64).to_le_bytes());
            let key = NodeKey::from_secret(secret);
            let offer = live_offer(&key, 1, 100_000 + (i as u64 % 7) * 1_000, now, 300);
            Signed::sign(&key, &net, &offer)
                .unwrap()
                .to_bytes()
                .unwrap()
        })
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let searches = Arc::new(AtomicUsize::new(0));
    let mut searchers = Vec::new();
    for _ in 0..2 {
        let (client, stop, searches) =
            (nodes[1].node.client.clone(), stop.clone(), searches.clone());
        searchers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                client
                    .search(Query::parse("").unwrap(), 10_000)
                    .await
                    .unwrap();
                searches.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for bytes in burst {
        nodes[0]
            .node
            .client
            .publish_raw(bytes)
            .await
            .unwrap()
            .unwrap();
    }
    let b = &nodes[1].node.client;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while b.book_len().await.unwrap() < N {
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {N} offers admitted while searching",
            b.book_len().await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for s in searchers {
        s.await.unwrap();
    }
    assert!(searches.load(Ordering::Relaxed) > 0);

    let query = Query::parse("sort:-price").unwrap();
    let all: Vec<OfferId> = b
        .search(query.clone(), 10_000)
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(all.len(), N);
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let (page, next) = b.search_page(query.clone(), 30, after).await.unwrap();
        paged.extend(page.iter().map(|e| e.id));
        match next {
            Some(c) => after = Some(c),
            None => break,
        }
    }
    assert_eq!(paged, all);

    let mut nodes = nodes;
    let b = nodes.pop().unwrap();
    let client = b.node.client.clone();
    b.node.shutdown().await;
    assert!(client.gossip_stats().await.is_err(), "the loop has stopped");
    assert_eq!(
        client
            .search(Query::parse("").unwrap(), 10_000)
            .await
            .unwrap()
            .len(),
        N,
        "a search answers without the loop"
    );
}

/// A template of one GPU of `model`.
fn template_of(model: &str, price: u64) -> gridlease_node::net::OfferTemplate {
    let mut t = template(1, price);
    for g in &mut t.gpus {
        g.spec.model = model.to_string();
    }
    t
}

/// Topics by GPU class (`docs/protocol.md` 3c step 1): a node that follows one class learns
/// that class's offers, by book sync (which lists only that class) and by gossip on the
/// class's topic, and never holds another class's; a node that follows every class holds
/// both; an offer published on another class's topic is rejected and its sender penalised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_follows_one_class_holds_only_that_class_by_sync_and_by_gossip() {
    let dir = tempfile::tempdir().unwrap();
    let provider = |model: &str, price| {
        let mut c = config();
        c.offer = Some(template_of(model, price));
        c
    };
    let follower = || {
        let mut c = config();
        c.follow = Some(vec!["rtx-4090".to_string()]);
        c
    };
    let mut p4090 = start(
        dir.path(),
        "p4090",
        provider("NVIDIA GeForce RTX 4090", 350_000),
    )
    .await;
    let mut pa100 = start(
        dir.path(),
        "pa100",
        provider("NVIDIA A100-SXM4-80GB", 900_000),
    )
    .await;
    let hub = start(dir.path(), "hub", config()).await;
    connect(&p4090, &hub).await;
    connect(&pa100, &hub).await;
    let h = hub.node.client.clone();
    eventually("the hub to hold both classes' offers", || {
        let h = h.clone();
        async move { h.book_len().await.unwrap() == 2 }
    })
    .await;
    assert_eq!(h.followed_classes().await.unwrap(), None);

    // Book sync: the follower joins after the offers were published.
    let mut f = start(dir.path(), "f", follower()).await;
    let fc = f.node.client.clone();
    assert_eq!(
        fc.followed_classes().await.unwrap(),
        Some(vec!["rtx-4090".to_string()])
    );
    let own4090 = p4090.node.client.own_offer().await.unwrap().unwrap().id;
    let own_a100 = pa100.node.client.own_offer().await.unwrap().unwrap().id;
    connect(&f, &hub).await;
    eventually("the follower to sync the rtx-4090 offer", || {
        let fc = fc.clone();
        async move { fc.offer(own4090).await.unwrap().is_some() }
    })
    .await;
    let st = fc.sync_stats().await.unwrap();
    assert_eq!(
        st.ids_received, 1,
        "only the followed class is listed: {st:?}"
    );
    assert_eq!(st.offers_admitted, 1, "{st:?}");
    assert!(fc.offer(own_a100).await.unwrap().is_none());

    // Gossip: connected to both providers, the follower hears the rtx-4090 provider's new
    // offer on the class's topic, and not the a100 one's.
    connect(&f, &p4090).await;
    connect(&f, &pa100).await;
    for p in [&mut p4090, &mut pa100] {
        let peer = f.peer;
        subscribed(p, peer).await;
    }
    let new4090 = p4090
        .node
        .client
        .set_offer(Some(template_of("NVIDIA GeForce RTX 4090", 300_000)))
        .await
        .unwrap()
        .unwrap()
        .id;
    let new_a100 = pa100
        .node
        .client
        .set_offer(Some(template_of("NVIDIA A100-SXM4-80GB", 800_000)))
        .await
        .unwrap()
        .unwrap()
        .id;
    wait_event(&mut f.events, |e| match e {
        NetworkEvent::OfferAdmitted { id, .. } if *id == new4090 => Some(()),
        _ => None,
    })
    .await;
    // (Either may arrive first: checked in the book, not from the event order.)
    eventually("the hub to hold both new offers", || {
        let h = h.clone();
        async move {
            h.offer(new4090).await.unwrap().is_some() && h.offer(new_a100).await.unwrap().is_some()
        }
    })
    .await;
    // The hub got the a100 offer, over the same connections the follower has to its provider.
    assert_eq!(fc.book_len().await.unwrap(), 1);
    assert!(fc.offer(new_a100).await.unwrap().is_none());
    assert!(fc.offer(new4090).await.unwrap().is_some());

    // A peer on the rtx-4090 topic publishes a valid a100 offer there: rejected.
    let mut liar = start(dir.path(), "liar", follower()).await;
    connect(&liar, &f).await;
    let (peer, fpeer) = (liar.peer, f.peer);
    // The liar publishes once it knows the follower subscribes to the rtx-4090 topic.
    subscribed(&mut liar, fpeer).await;
    let key = NodeKey::from_secret([77; 32]);
    let mut offer = live_offer(&key, 1, 100_000, clock::now(), 300);
    for g in &mut offer.gpus {
        g.spec.model = "NVIDIA A100-SXM4-80GB".to_string();
    }
    let bytes = Signed::sign(&key, &net(), &offer)
        .unwrap()
        .to_bytes()
        .unwrap();
    liar.node.client.publish_raw(bytes).await.unwrap().unwrap();
    let why = rejected_by(&mut f, peer).await;
    assert!(
        why.contains("class a100-sxm4-80gb on the topic of class rtx-4090"),
        "{why}"
    );
    assert_eq!(fc.book_len().await.unwrap(), 1);
    for n in [p4090, pa100, hub, f, liar] {
        stop(n).await;
    }
}

/// DHT lookup of a class's nodes (`docs/protocol.md` 3c step 4): a node that follows a class
/// and is connected only to a hub that follows every class (so it forwards nothing on class
/// topics) finds a node of its class in the DHT (a provider that put a record under the
/// class's key, being reachable at a confirmed address), connects to it, and then hears its
/// next offer by gossip on the class's topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_finds_its_classes_nodes_in_the_dht_and_hears_them_by_gossip() {
    let dir = tempfile::tempdir().unwrap();
    let mut hub_config = config();
    hub_config.relay_server = true;
    let hub = start(dir.path(), "hub", hub_config).await;

    let port = free_port();
    let addr: libp2p::Multiaddr = format!("/ip4/127.0.0.1/tcp/{port}").parse().unwrap();
    let mut p_config = config();
    p_config.listen = vec![addr.clone()];
    p_config.external_addrs = vec![addr];
    p_config.bootstrap = vec![hub.addr.clone()];
    p_config.offer = Some(template_of("NVIDIA GeForce RTX 4090", 350_000));
    let mut p = start(dir.path(), "p", p_config).await;

    let mut f_config = config();
    f_config.follow = Some(vec!["rtx-4090".to_string()]);
    f_config.bootstrap = vec![hub.addr.clone()];
    let mut f = start(dir.path(), "f", f_config).await;
    let (fc, ppeer) = (f.node.client.clone(), p.peer);
    // The lookup finds the provider (kad's own bootstrap may already have connected the two
    // in a network this small: the lookup is what is asserted).
    let found = wait_event(&mut f.events, |e| match e {
        NetworkEvent::ClassNodesFound { class, peers } if peers.contains(&ppeer) => {
            Some(class.clone())
        }
        _ => None,
    })
    .await;
    assert_eq!(found, "rtx-4090");
    eventually(
        "the follower to connect to the provider it found in the DHT",
        || {
            let fc = fc.clone();
            async move { fc.connected_peers().await.unwrap().contains(&ppeer) }
        },
    )
    .await;
    let new = new_offer_heard_by(&mut p, &mut f, "NVIDIA GeForce RTX 4090", 300_000).await;
    assert!(fc.offer(new).await.unwrap().is_some());
    for n in [hub, p, f] {
        stop(n).await;
    }
}

/// A search that names a class the node does not follow (`docs/protocol.md` 3c step 4): the
/// node follows the class, syncs its offers (that class only) from a connected peer that
/// holds them, and answers once they are in its book; it then hears the class's new offers
/// by gossip; a search goes on naming the class keeps it followed, and once no search has
/// named it for `search_follow` the node unsubscribes and its offers leave the book.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_for_a_class_the_node_does_not_follow_fetches_it_and_follows_it_a_while() {
    let dir = tempfile::tempdir().unwrap();
    let provider = |model: &str, price| {
        let mut c = config();
        c.offer = Some(template_of(model, price));
        c
    };
    let p4090 = start(
        dir.path(),
        "p4090",
        provider("NVIDIA GeForce RTX 4090", 350_000),
    )
    .await;
    let pa100 = start(
        dir.path(),
        "pa100",
        provider("NVIDIA A100-SXM4-80GB", 900_000),
    )
    .await;
    let hub = start(dir.path(), "hub", config()).await;
    connect(&p4090, &hub).await;
    connect(&pa100, &hub).await;
    wait_mesh(std::slice::from_ref(&hub)).await;
    wait_mesh(std::slice::from_ref(&pa100)).await;
    // 50 more a100 offers, so the fetch is more than one message (published by a provider:
    // a node's own raw publications reach other books, not its own).
    let h = hub.node.client.clone();
    publish_model_offers(&pa100, 9, 50, "NVIDIA A100-SXM4-80GB").await;
    eventually("the hub to hold both classes' offers", || {
        let h = h.clone();
        async move { h.book_len().await.unwrap() == 52 }
    })
    .await;

    let mut c = config();
    c.follow = Some(vec!["rtx-4090".to_string()]);
    c.search_follow = Duration::from_secs(3);
    // The follower's loop reads this clock: the test moves it past `search_follow` instead
    // of sleeping.
    let clock = gridlease_node::clock::ManualClock::new();
    c.clock = clock.clone();
    let mut f = start(dir.path(), "f", c).await;
    let fc = f.node.client.clone();
    connect(&f, &hub).await;
    holds(&fc, 1).await;
    // The connection's sync has ended (a fetch while it runs waits for it and then syncs every
    // followed class, listing the rtx-4090 offer again).
    eventually("the connection's sync to end", || {
        let fc = fc.clone();
        async move { fc.sync_stats().await.unwrap().ended == 1 }
    })
    .await;
    let before = fc.sync_stats().await.unwrap();
    assert_eq!(before.ids_received, 1, "{before:?}");

    let a100 = "a100-sxm4-80gb".to_string();
    tokio::time::timeout(Duration::from_secs(10), fc.search_class(a100.clone()))
        .await
        .expect("the fetch ends")
        .unwrap();
    // Answered once the class's offers are in the book (read at once, not eventually).
    assert_eq!(fc.book_len().await.unwrap(), 52);
    let after = fc.sync_stats().await.unwrap();
    assert_eq!(
        after.ids_received - before.ids_received,
        51,
        "the fetch lists the searched class only: {after:?}"
    );
    let followed = fc.followed().unwrap();
    assert_eq!(followed.searched, vec![a100.clone()]);
    assert!(followed.classes.contains(&a100), "{followed:?}");

    // Followed now: the provider's next a100 offer arrives by gossip.
    fc.search_class(a100.clone()).await.unwrap();
    connect(&f, &pa100).await;
    let mut pa100 = pa100;
    new_offer_heard_by(&mut pa100, &mut f, "NVIDIA A100-SXM4-80GB", 800_000).await;

    // Searched again within `search_follow` (3 s), it stays followed past 3 s from the
    // search before.
    fc.search_class(a100.clone()).await.unwrap();
    clock.advance(2_000);
    fc.search_class(a100.clone()).await.unwrap();
    clock.advance(2_000);
    fc.announce().await.unwrap();
    assert_eq!(fc.followed().unwrap().searched, vec![a100.clone()]);
    // No search for 3 s: an announce round drops the class and its offers.
    clock.advance(3_100);
    fc.announce().await.unwrap();
    let followed = fc.followed().unwrap();
    assert!(followed.searched.is_empty(), "{followed:?}");
    assert_eq!(followed.classes, vec!["rtx-4090".to_string()]);
    assert_eq!(fc.book_len().await.unwrap(), 1);
    for n in [p4090, pa100, hub, f] {
        stop(n).await;
    }
}

/// A search that names a class no connected peer holds (`docs/protocol.md` 3c step 4, the
/// DHT path): the node looks the class's key up in the DHT, dials the node it finds, and
/// answers the search once that connection's sync has brought the class's offers into its
/// book. Here the a100 provider is reachable at a confirmed direct address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_for_a_class_no_connected_peer_holds_finds_its_nodes_in_the_dht() {
    search_finds_a_provider_through_the_dht(|c| {
        let port = free_port();
        let addr: libp2p::Multiaddr = format!("/ip4/127.0.0.1/tcp/{port}").parse().unwrap();
        c.listen = vec![addr.clone()];
        c.external_addrs = vec![addr];
    })
    .await;
}

/// The same with a provider behind a NAT: no listener, reachable only through its relay
/// reservation at the hub. Its record carries its relayed address (a relay's reservation is
/// a confirmed external address), and the searching node reaches it through the relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_finds_a_provider_behind_a_nat_through_the_dht_and_its_relay() {
    search_finds_a_provider_through_the_dht(|c| {
        c.listen.clear();
        c.use_relays = true;
    })
    .await;
}

/// A node `f` follows rtx-4090 and is connected only to a hub that follows rtx-4090 too (so
/// it holds no a100 offer and forwards none, and `f` looks nothing up for its own class). An
/// a100 provider configured by `reachable` is started after `f` has settled (so no DHT query
/// of `f` met it), bootstrapped from the hub, and puts its class's record there. A search of
/// a100 on `f` must find the provider in the DHT, connect, and answer with its offer in the
/// book.
async fn search_finds_a_provider_through_the_dht(reachable: impl FnOnce(&mut NodeConfig)) {
    let dir = tempfile::tempdir().unwrap();
    let rtx = || Some(vec!["rtx-4090".to_string()]);
    let mut hub_config = config();
    hub_config.relay_server = true;
    hub_config.follow = rtx();
    let mut hub = start(dir.path(), "hub", hub_config).await;

    let mut f_config = config();
    f_config.follow = rtx();
    f_config.bootstrap = vec![hub.addr.clone()];
    let mut f = start(dir.path(), "f", f_config).await;
    let fc = f.node.client.clone();
    let (fpeer, hpeer) = (f.peer, hub.peer);
    // Settled: each has the other's subscription, and the connection's sync has ended.
    subscribed(&mut f, hpeer).await;
    subscribed(&mut hub, fpeer).await;
    eventually("the follower's sync with the hub to end", || {
        let fc = fc.clone();
        async move { fc.sync_stats().await.unwrap().ended >= 1 }
    })
    .await;

    let mut p_config = config();
    reachable(&mut p_config);
    p_config.bootstrap = vec![hub.addr.clone()];
    p_config.offer = Some(template_of("NVIDIA A100-SXM4-80GB", 900_000));
    let mut p = start(dir.path(), "p", p_config).await;
    let a100 = "a100-sxm4-80gb".to_string();
    let put = wait_event(&mut p.events, |e| match e {
        NetworkEvent::ClassRecordPut { class } => Some(class.clone()),
        _ => None,
    })
    .await;
    assert_eq!(put, a100);
    let ppeer = p.peer;
    assert!(
        !fc.connected_peers().await.unwrap().contains(&ppeer),
        "the follower met the provider before searching: the DHT path is not what is tested"
    );
    // The follower's book is empty: nobody it knows holds an rtx-4090 offer.
    assert_eq!(fc.book_len().await.unwrap(), 0);

    tokio::time::timeout(Duration::from_secs(20), fc.search_class(a100.clone()))
        .await
        .expect("the fetch ends")
        .unwrap();
    // Answered once the provider's offer is in the book (read at once, not eventually; by
    // its provider, not its id: a provider behind a NAT re-signs its offer with its relayed
    // address once its reservation is up, which may be after its record was put).
    let held = fc.offer_ids(String::new()).await.unwrap();
    assert_eq!(
        held.len(),
        1,
        "the search was answered before the class's offers arrived"
    );
    let entry = fc.offer(held[0]).await.unwrap().expect("held");
    assert_eq!(entry.offer.provider, p.key_public);
    let found = wait_event(&mut f.events, |e| match e {
        NetworkEvent::ClassNodesFound { class, peers } if peers.contains(&ppeer) => {
            Some(class.clone())
        }
        _ => None,
    })
    .await;
    assert_eq!(found, a100);
    assert!(fc.connected_peers().await.unwrap().contains(&ppeer));
    for n in [hub, p, f] {
        stop(n).await;
    }
}

/// A search whose class fetch outlasts the API's wait is answered from the book as it is and
/// names the class still arriving (`x-gridlease-fetching-classes`); once the fetch ends, the
/// same search waits for nothing and finds the class's offers. The fetch is held up by the
/// searching node's own restore (book syncs wait for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_fetch_that_outlasts_the_wait_is_named_and_a_later_search_finds_its_offers() {
    let dir = tempfile::tempdir().unwrap();
    let hub = start(dir.path(), "hub", config()).await;
    let g = start(dir.path(), "g", config()).await;
    connect(&g, &hub).await;
    wait_mesh(std::slice::from_ref(&g)).await;
    publish_model_offers(&g, 11, 20, "NVIDIA A100-SXM4-80GB").await;
    holds(&hub.node.client, 20).await;
    stop(g).await;

    let mut c = config();
    c.follow = Some(vec!["rtx-4090".to_string()]);
    c.faults.hold_restore = Some(Duration::from_secs(3));
    let f = start(dir.path(), "f", c).await;
    let fc = f.node.client.clone();
    connect(&f, &hub).await;
    let query =
        gridlease_contracts::query::Query::parse(r#"gpu="NVIDIA A100-SXM4-80GB" vram>=1"#).unwrap();
    let fetch = |wait| gridlease_node::api::fetch_named_classes(&fc, &query, wait);
    let still = fetch(Duration::from_millis(300)).await;
    assert_eq!(still, vec!["a100-sxm4-80gb".to_string()]);
    assert_eq!(fc.book_len().await.unwrap(), 0);
    // A query that names no class waits for nothing.
    let any = gridlease_contracts::query::Query::parse("gpu~a100").unwrap();
    assert!(
        gridlease_node::api::fetch_named_classes(&fc, &any, Duration::from_millis(300))
            .await
            .is_empty()
    );
    // The restore ends within 3 s; the fetch then runs, and the search waits for it.
    let still = fetch(Duration::from_secs(10)).await;
    assert!(still.is_empty(), "{still:?}");
    assert_eq!(fc.book_len().await.unwrap(), 20);
    for n in [f, hub] {
        stop(n).await;
    }
}
