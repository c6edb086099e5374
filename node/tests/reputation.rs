//! Network reputation over real swarms on loopback (issue 16): co-signed completion records
//! spread by gossip, every node computes the same scores, search filters and sorts on them,
//! and a provider that rents to itself from fresh keys stays below one honest completion. The
//! records' GPU checks (issue 44) are counted (`verified`) and filter search (`verified>=N`).
// Test helpers unwrap: a failed step is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;
mod lease_support;

use common::*;
use gridlease_contracts::query::Query;
use gridlease_contracts::reputation::{CompletionRecord, ScoreParams, provider_scores};
use gridlease_node::home::Home;
use gridlease_protocol::completion::{
    CoSigned, Completion, CompletionAck, CompletionOutcome, GpuCheck,
};
use gridlease_protocol::{Digest, LeaseId, NodeKey, PublicKey, Signed, Timestamp};

/// A record of a lease between `p` and `r` that ran no GPU check, signed by both.
fn cosigned(
    p: &NodeKey,
    r: &NodeKey,
    lease: u32,
    paid: u64,
    outcome: CompletionOutcome,
) -> CoSigned {
    checked(p, r, lease, paid, outcome, GpuCheck::NotRun)
}

/// A record of a lease between `p` and `r` with its GPU check, signed by both.
fn checked(
    p: &NodeKey,
    r: &NodeKey,
    lease: u32,
    paid: u64,
    outcome: CompletionOutcome,
    gpu_check: GpuCheck,
) -> CoSigned {
    let mut id = [0u8; 32];
    id[..4].copy_from_slice(&lease.to_le_bytes());
    let c = Completion {
        lease_id: LeaseId(Digest(id)),
        provider: p.public(),
        renter: r.public(),
        gpu_seconds: 3600,
        paid,
        closed_at: Timestamp(1_700_000_000_000 + u64::from(lease)),
        outcome,
        gpu_check,
    };
    CoSigned {
        provider: Signed::sign(p, &net(), &c).unwrap(),
        renter: Signed::sign(r, &net(), &CompletionAck { completion: c }).unwrap(),
    }
}

/// A provider as search shows it: key, reputation per mille, completed, passed GPU checks.
type Seen = (PublicKey, u32, u32, u32);

/// Every provider as `node` searches them, best first.
async fn view(node: &TestNode) -> Vec<Seen> {
    let q = Query::parse("free>=0 sort:-rep").unwrap();
    node.node
        .client
        .search(q, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| {
            let n = e.summary.numbers.provider;
            (e.offer.provider, n.rep_permille, n.completed, n.verified)
        })
        .collect()
}

/// Waits until `node`'s view equals `expected` (or the deadline passes), then asserts it.
async fn converges(node: &TestNode, expected: &[Seen], what: &str) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut got = view(node).await;
    while got != expected && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        got = view(node).await;
    }
    assert_eq!(got, expected, "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_nodes_agree_on_reputation_and_a_self_dealer_stays_below_one_honest_lease() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x5eed_0016);
    // Nodes 0-5 offer GPUs; 10-12 are renters who have rented before; the rest only relay.
    let mut nodes = Vec::new();
    for i in 0..20 {
        let mut c = config();
        // Offers published before the topology exists reach the nodes that synced before their
        // neighbours held them only by anti-entropy, one peer a round: every 2 s here, not
        // every 10 s (the six-offer wait took 30 s and more at 10 s, at the test's deadline).
        c.offer_resync = std::time::Duration::from_secs(2);
        if i < 6 {
            c.offer = Some(template(1, 100_000 + 10_000 * i as u64));
        }
        nodes.push(start(dir.path(), &format!("n{i}"), c).await);
    }
    let keys: Vec<NodeKey> = nodes
        .iter()
        .map(|n| Home::open(&n.home).unwrap().key)
        .collect();
    // A random connected topology (a tree plus 10 edges), from a fixed seed.
    random_topology(&nodes, &mut rng, 10).await;
    wait_mesh(&nodes).await;
    // Every node holds the six offers (at the prior) before any record is published.
    for n in &nodes {
        let c = n.node.client.clone();
        eventually("six offers everywhere", || {
            let c = c.clone();
            async move {
                c.search(Query::parse("free>=0").unwrap(), 100)
                    .await
                    .unwrap()
                    .len()
                    == 6
            }
        })
        .await;
    }

    let (renters, p) = (&keys[10..13], &keys[..6]);
    let mut lease = 0u32;
    let mut next = || {
        lease += 1;
        lease
    };
    let mut by_provider: Vec<Vec<CoSigned>> = vec![Vec::new(); 6];
    // Renters 10-12 each rented from providers 0 and 1 (0.6 GLU each): they are established
    // with respect to any third provider.
    for r in renters {
        for (i, pk) in p.iter().enumerate().take(2) {
            by_provider[i].push(cosigned(
                pk,
                r,
                next(),
                600_000,
                CompletionOutcome::Completed,
            ));
        }
    }
    // Provider 0 served them six more times, the last four with a GPU check that passed.
    for k in 0..6 {
        let r = &renters[k % 3];
        by_provider[0].push(checked(
            &p[0],
            r,
            next(),
            200_000,
            CompletionOutcome::Completed,
            if k < 2 {
                GpuCheck::NotRun
            } else {
                GpuCheck::Passed
            },
        ));
    }
    // Provider 2: one completed lease from an established renter.
    by_provider[2].push(cosigned(
        &p[2],
        &renters[0],
        next(),
        100_000,
        CompletionOutcome::Completed,
    ));
    // Provider 3 rents to itself from 10 fresh keys, paying itself 50 GLU each time, and
    // "passes" a GPU check each time.
    for _ in 0..10 {
        let fresh = NodeKey::generate();
        by_provider[3].push(checked(
            &p[3],
            &fresh,
            next(),
            50_000_000,
            CompletionOutcome::Completed,
            GpuCheck::Passed,
        ));
    }
    // Provider 4 failed an established renter's GPU check (the lease closed `GpuCheckFailed`:
    // provider-failed).
    by_provider[4].push(checked(
        &p[4],
        &renters[1],
        next(),
        0,
        CompletionOutcome::ProviderFailed,
        GpuCheck::Failed,
    ));
    // Provider 5 has no record.

    // Each provider's node hands its records to its network loop, as its lease service does
    // after co-signing: kept, persisted, published.
    for (i, records) in by_provider.iter().enumerate() {
        for pair in records {
            assert!(
                nodes[i]
                    .node
                    .client
                    .add_completion(pair.clone())
                    .await
                    .unwrap()
            );
        }
    }
    // A record whose renter part another key signed is refused.
    let mut forged = cosigned(&p[5], &renters[0], next(), 1, CompletionOutcome::Completed);
    forged.renter = cosigned(&p[5], &keys[19], 999, 1, CompletionOutcome::Completed).renter;
    assert!(nodes[5].node.client.add_completion(forged).await.is_err());

    // Every node comes to the scores the formula gives for all 24 records (the contracts code,
    // run here on the records as generated), each provider's exactly.
    let records: Vec<CompletionRecord<PublicKey, LeaseId>> = by_provider
        .iter()
        .flatten()
        .map(|pair| CompletionRecord::from(&pair.verify(&net()).unwrap()))
        .collect();
    assert_eq!(records.len(), 24);
    let formula = provider_scores(&records, &ScoreParams::default());
    let mut expected: Vec<Seen> = p
        .iter()
        .map(|k| {
            formula
                .get(&k.public())
                .map_or((k.public(), 500, 0, 0), |s| {
                    (
                        k.public(),
                        (s.score * 1000.0).round() as u32,
                        s.completed,
                        s.checks_passed,
                    )
                })
        })
        .collect();
    expected.sort_by_key(|e| std::cmp::Reverse(e.1));
    for (i, n) in nodes.iter().enumerate() {
        converges(n, &expected, &format!("node {i}'s scores")).await;
    }
    let score = |k: &NodeKey| {
        expected
            .iter()
            .find(|(pk, _, _, _)| *pk == k.public())
            .map(|&(_, rep, done, _)| (rep, done))
            .unwrap()
    };
    eprintln!(
        "scores (per mille, completed): established 0 {:?}, 1 {:?}, one honest lease 2 {:?}, self-dealer 3 {:?}, failed 4 {:?}, none 5 {:?}",
        score(&p[0]),
        score(&p[1]),
        score(&p[2]),
        score(&p[3]),
        score(&p[4]),
        score(&p[5])
    );
    // The numbers docs/reputation.md states.
    assert_eq!(score(&p[0]), (855, 9));
    assert_eq!(score(&p[1]), (724, 3));
    assert_eq!(score(&p[2]), (667, 1));
    assert_eq!(score(&p[3]), (545, 10));
    assert_eq!(score(&p[4]), (333, 0));
    assert_eq!(score(&p[5]), (500, 0));
    // The checks: counted, not weighed (the scores above are those without them).
    let checks = |k: &NodeKey| {
        formula
            .get(&k.public())
            .map(|s| (s.checks_passed, s.checks_failed))
    };
    assert_eq!(checks(&p[0]), Some((4, 0)));
    assert_eq!(checks(&p[3]), Some((10, 0)));
    assert_eq!(checks(&p[4]), Some((0, 1)));
    // The self-dealer gains less than one honest completion from an established renter.
    assert!(score(&p[3]).0 - 500 < score(&p[2]).0 - 500);
    assert_eq!(
        expected[0].0,
        p[0].public(),
        "sort:-rep puts the best first"
    );

    // `rep>=0.8` on every node: provider 0 alone; `completed>=10`: the self-dealer's count
    // is a plain count, which is why the score, not the count, is the filter to trust.
    for n in &nodes {
        let hits = n
            .node
            .client
            .search(Query::parse("free>=0 rep>=0.8").unwrap(), 100)
            .await
            .unwrap();
        let who: Vec<PublicKey> = hits.iter().map(|e| e.offer.provider).collect();
        assert_eq!(who, vec![p[0].public()]);
    }
    let hits = nodes[19]
        .node
        .client
        .search(Query::parse("free>=0 completed>=3 rep>=0.6").unwrap(), 100)
        .await
        .unwrap();
    assert_eq!(hits.len(), 2, "providers 0 and 1");
    // `verified>=3`: providers 0 and 3 (cheapest first); like `completed`, a plain count the
    // self-dealer inflates, so `rep` beside it is what tells them apart.
    let who = |q: &str| {
        let c = nodes[19].node.client.clone();
        let q = Query::parse(q).unwrap();
        async move {
            c.search(q, 100)
                .await
                .unwrap()
                .iter()
                .map(|e| e.offer.provider)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        who("free>=0 verified>=3").await,
        vec![p[0].public(), p[3].public()]
    );
    assert_eq!(who("free>=0 verified>=5").await, vec![p[3].public()]);
    assert_eq!(
        who("free>=0 verified>=3 rep>=0.6").await,
        vec![p[0].public()]
    );
    assert_eq!(who("free>=0 verified=true").await.len(), 2);
    assert_eq!(who("free>=0 verified=false").await.len(), 4);

    // A node that joins later, through a node that neither provides nor rents (so no
    // republished batch reaches it: its neighbour knows every record and forwards none),
    // learns every record by book sync on connecting and scores the same.
    let late = start(dir.path(), "late", config()).await;
    connect(&late, &nodes[15]).await;
    converges(&late, &expected, "the late joiner's scores").await;

    // The records survive a restart: node 19 learnt every one of the 24 from gossip and
    // stored it (each verifies); restarted, it scores the same.
    let last = nodes.pop().unwrap();
    let home = stop(last).await;
    {
        let db = gridlease_node::store::Store::open(&Home::open(&home).unwrap().db_path()).unwrap();
        let stored = db.completions(None, 1000).unwrap();
        assert_eq!(stored.len(), 24);
        for r in &stored {
            let pair = CoSigned::from_bytes(&r.record).unwrap();
            assert_eq!(pair.verify(&net()).unwrap(), r.completion);
        }
    }
    let alone = start_from_home(&home, config()).await;
    converges(&alone, &expected, "scores after a restart").await;
}

/// A lease whose GPU check passed (issue 44: the CPU reference answers, real Docker, the probe
/// image) leaves the same co-signed record on both nodes, saying so; the renter's search
/// counts the provider's passed check (`verified`) and shows the offer's check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passed_gpu_check_is_co_signed_and_counted_by_search() {
    use lease_support::*;
    let Some(sb) = docker_or_skip("a_passed_gpu_check_is_co_signed").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ready = tokio::task::spawn_blocking(|| gridlease_node::provider_proof::cpu_reference(30))
        .await
        .unwrap()
        .expect("the CPU reference passes its self-test");
    let mut t = lease_template(1, 1, 30);
    t.proof = ready.policy;
    let prover = ready.prover;
    let provider = provider_with(dir.path(), &sb, t, 5, move |svc| {
        svc.prover = Some(prover);
    })
    .await;
    let (renter, offer) = renter_of(dir.path(), &provider, 5).await;
    let before = Query::parse("free>=0 verified=false").unwrap();
    assert_eq!(
        renter
            .node
            .node
            .client
            .search(before, 10)
            .await
            .unwrap()
            .len(),
        1
    );

    let id = renter
        .leases
        .rent(probe_rent(offer, &image, 30, &["exit", "0"]))
        .await
        .unwrap();
    let done = closed(&renter.leases, id, 90).await;
    assert_eq!(
        done.close_reason.as_deref(),
        Some("container_exited"),
        "{done:#?}"
    );
    assert_eq!(
        done.gpu_check.as_ref().map(|c| c.state.as_str()),
        Some("passed"),
        "{done:#?}"
    );
    closed(&provider.leases, id, 30).await;

    // Both nodes hold the same pair, and its record says the check passed.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let (mine, theirs) = loop {
        let (p, r) = (
            provider.leases.completions(10).await,
            renter.leases.completions(10).await,
        );
        if (!p.is_empty() && !r.is_empty()) || tokio::time::Instant::now() > deadline {
            break (p, r);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!((mine.len(), theirs.len()), (1, 1), "{mine:?} {theirs:?}");
    assert_eq!(mine[0].1, theirs[0].1, "the same signed pair on both nodes");
    let record = mine[0].1.verify(&net()).unwrap();
    assert_eq!(record.lease_id, id);
    assert_eq!(record.outcome, CompletionOutcome::Completed);
    assert_eq!(record.gpu_check, GpuCheck::Passed);

    // The renter's search counts it (the book is rescored within a second of the record).
    let client = renter.node.node.client.clone();
    eventually("the renter's search counts the passed check", || {
        let client = client.clone();
        async move {
            let q = Query::parse("free>=0 verified>=1").unwrap();
            client
                .search(q, 10)
                .await
                .unwrap()
                .first()
                .is_some_and(|e| e.summary.numbers.provider.verified == 1)
        }
    })
    .await;
    let kept = renter
        .leases
        .gpu_checks(provider.node.node.client.key().public())
        .await
        .unwrap();
    assert_eq!((kept.passed, kept.failed), (1, 0));

    renter.cancel.cancel();
    provider.cancel.cancel();
    remove_container(&sb, id).await;
}
