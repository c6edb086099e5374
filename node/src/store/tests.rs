//! Tests of the store: migrations and refusals, bounds, round trips.

use super::*;
use gridlease_contracts::{Actor, LeaseEvent, LeaseState};
use gridlease_protocol::OfferId;
use gridlease_protocol::completion::CompletionOutcome;
use gridlease_protocol::fixtures::{self, T0};
use gridlease_protocol::{NetworkId, NodeKey};

#[test]
fn completions_keep_a_providers_failures_apart_from_its_newest_completed() {
    use gridlease_protocol::completion::{CoSigned, Completion, CompletionAck};
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(&dir.path().join("g.db")).unwrap();
    let (p, r, net) = (
        NodeKey::from_secret([1; 32]),
        NodeKey::from_secret([2; 32]),
        NetworkId::devnet(),
    );
    let put = |s: &mut Store, lease: u32, outcome| {
        let mut id = [0u8; 32];
        id[..4].copy_from_slice(&lease.to_le_bytes());
        let c = Completion {
            lease_id: LeaseId(Digest(id)),
            provider: p.public(),
            renter: r.public(),
            gpu_seconds: 1,
            paid: 1,
            closed_at: Timestamp(1_000 + u64::from(lease)),
            outcome,
            gpu_check: gridlease_protocol::completion::GpuCheck::NotRun,
        };
        let pair = CoSigned {
            provider: Signed::sign(&p, &net, &c).unwrap(),
            renter: Signed::sign(
                &r,
                &net,
                &CompletionAck {
                    completion: c.clone(),
                },
            )
            .unwrap(),
        };
        s.put_completion(&c, &pair.to_bytes().unwrap(), T0).unwrap()
    };
    assert!(put(&mut s, 0, CompletionOutcome::ProviderFailed));
    assert!(!put(&mut s, 0, CompletionOutcome::ProviderFailed), "known");
    for lease in 1..=300 {
        put(&mut s, lease, CompletionOutcome::Completed);
    }
    let held = s.completions(Some(&p.public()), 1_000).unwrap();
    assert_eq!(held.len(), COMPLETIONS_PER_PROVIDER + 1);
    assert!(
        held.iter()
            .any(|h| h.completion.outcome == CompletionOutcome::ProviderFailed)
    );
    // The newest completed ones: 45..=300.
    assert!(
        held.iter()
            .all(|h| h.completion.closed_at.0 >= 1_045 || h.completion.closed_at.0 == 1_000)
    );
    assert!(s.has_completion(&held[0].completion.lease_id).unwrap());
}

#[test]
fn fresh_database_migrates_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("g.db");
    {
        let mut s = Store::open(&p).unwrap();
        s.set_meta("network", "devnet").unwrap();
    }
    let s = Store::open(&p).unwrap();
    assert_eq!(s.meta("network").unwrap().as_deref(), Some("devnet"));
    let v: i64 = s
        .conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, SCHEMA_VERSION);
    let mode: String = s
        .conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let sync: i64 = s
        .conn
        .query_row("PRAGMA synchronous", [], |r| r.get(0))
        .unwrap();
    assert_eq!(sync, 2, "FULL");
}

#[test]
fn newer_schema_is_refused_without_changes() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("g.db");
    drop(Store::open(&p).unwrap());
    {
        let c = Connection::open(&p).unwrap();
        c.execute_batch("PRAGMA user_version = 99").unwrap();
    }
    let err = Store::open(&p).unwrap_err();
    assert!(
        matches!(err, StoreError::NewerSchema { found: 99, .. }),
        "{err}"
    );
    let c = Connection::open(&p).unwrap();
    let v: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, 99);
}

#[test]
fn garbage_file_is_corrupt_not_reset() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("g.db");
    let junk = vec![0x5a_u8; 8192];
    std::fs::write(&p, &junk).unwrap();
    let err = Store::open(&p).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("corrupted"));
    assert_eq!(std::fs::read(&p).unwrap(), junk);
}

#[test]
fn foreign_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("g.db");
    {
        let c = Connection::open(&p).unwrap();
        c.execute_batch("CREATE TABLE t(x)").unwrap();
    }
    assert!(matches!(
        Store::open(&p).unwrap_err(),
        StoreError::ForeignDatabase { .. }
    ));
}

#[test]
fn peers_and_usage_reports_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(&dir.path().join("g.db")).unwrap();
    // Speed only (no fsync per row); usage rows without a lease row.
    s.conn
        .execute_batch("PRAGMA synchronous=OFF; PRAGMA foreign_keys=OFF;")
        .unwrap();
    let n = PEERS_KEPT + 100;
    for i in 0..n {
        s.put_peer(&format!("peer{i:05}"), &[], Timestamp(i as u64))
            .unwrap();
    }
    let kept = s.peers(usize::MAX).unwrap();
    assert_eq!(kept.len(), PEERS_KEPT);
    assert_eq!(
        kept[0].0,
        format!("peer{:05}", n - 1),
        "the newest are kept"
    );
    assert_eq!(kept[PEERS_KEPT - 1].0, format!("peer{:05}", n - PEERS_KEPT));

    let lease_id = LeaseId(Digest([9; 32]));
    for seq in 1..=40u64 {
        s.put_usage(&lease_id, seq, &[1, 2, 3], T0, lease::UsageKept::Newest)
            .unwrap();
    }
    // A provider's own reports are all kept (its evidence in a statement).
    let own = LeaseId(Digest([8; 32]));
    for seq in 1..=40u64 {
        s.put_usage(&own, seq, &[1, 2, 3], T0, lease::UsageKept::All)
            .unwrap();
    }
    let own_count: i64 = s
        .conn
        .query_row(
            "SELECT count(*) FROM usage_reports WHERE lease_id = ?1",
            [&own.0.0[..]],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(own_count, 40);
    let (count, min): (i64, i64) = s
        .conn
        .query_row(
            "SELECT count(*), min(seq) FROM usage_reports WHERE lease_id = ?1",
            [&lease_id.0.0[..]],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(count as u64, lease::USAGE_REPORTS_KEPT);
    assert_eq!(min as u64, 40 - lease::USAGE_REPORTS_KEPT + 1);
    assert_eq!(
        s.session_record(&lease_id).unwrap().last_usage.unwrap().0,
        40
    );
}

#[test]
fn offers_and_leases_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("g.db");
    let net = NetworkId::devnet();
    let provider = NodeKey::from_secret([1; 32]);
    let renter = NodeKey::from_secret([2; 32]);
    let offer = fixtures::offer(provider.public(), 3, 2, 400_000);
    let signed = Signed::sign(&provider, &net, &offer).unwrap();
    let id = OfferId(signed.envelope().content_digest());
    let mut s = Store::open(&p).unwrap();
    s.put_offers(&[(id, signed.clone(), offer.clone(), T0)], T0)
        .unwrap();
    assert_eq!(s.live_offers(T0).unwrap().len(), 1);
    assert_eq!(s.live_offers(offer.expires_at).unwrap().len(), 0);

    let terms = fixtures::terms(id, &offer, renter.public(), 1, 600);
    let lease_id = terms.lease_id().unwrap();
    let request = Signed::sign(
        &renter,
        &net,
        &LeaseRequest {
            terms: terms.clone(),
            expires_at: T0.plus_secs(30),
        },
    )
    .unwrap();
    let mut lease = Lease::propose(lease_id, terms.clone());
    lease
        .apply(LeaseEvent::Accept, Actor::Provider, T0)
        .unwrap();
    let stored = StoredLease {
        role: Role::Provider,
        lease,
        request,
        accept: None,
        gpus: vec![offer.gpus[0].spec.uuid_digest],
        created_at: T0,
    };
    s.insert_lease(&stored).unwrap();
    s.insert_lease(&stored).unwrap();
    drop(s);
    let s = Store::open(&p).unwrap();
    let all = s.leases(Some(Role::Provider)).unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].lease.terms, terms);
    assert_eq!(all[0].lease.state, LeaseState::Accepted);
    assert_eq!(all[0].gpus, stored.gpus);
    assert_eq!(s.history_len(&lease_id).unwrap(), 1);
    assert_eq!(s.lease(&lease_id).unwrap().unwrap().lease.terms, terms);
    assert!(s.lease(&LeaseId(Digest([0; 32]))).unwrap().is_none());
    assert!(s.leases(Some(Role::Renter)).unwrap().is_empty());
}

#[test]
fn amendments_are_stored_pending_then_accepted_and_set_the_current_terms() {
    use gridlease_protocol::{AmendAccept, LeaseAmendment};
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("g.db");
    let net = NetworkId::devnet();
    let provider = NodeKey::from_secret([1; 32]);
    let renter = NodeKey::from_secret([2; 32]);
    let offer = fixtures::offer(provider.public(), 3, 1, 400_000);
    let terms = fixtures::terms(OfferId(Digest([3; 32])), &offer, renter.public(), 1, 600);
    let lease_id = terms.lease_id().unwrap();
    let request = Signed::sign(
        &renter,
        &net,
        &LeaseRequest {
            terms: terms.clone(),
            expires_at: T0.plus_secs(30),
        },
    )
    .unwrap();
    let mut s = Store::open(&p).unwrap();
    s.insert_lease(&StoredLease {
        role: Role::Renter,
        lease: Lease::propose(lease_id, terms.clone()),
        request,
        accept: None,
        gpus: vec![],
        created_at: T0,
    })
    .unwrap();
    let a = |seq, duration_s, max_total| LeaseAmendment {
        lease_id,
        seq,
        duration_s,
        max_total,
        created_at: T0,
    };
    let bytes = |m: &LeaseAmendment| Signed::sign(&renter, &net, m).unwrap().to_bytes().unwrap();
    let accept = |m: &LeaseAmendment| {
        let acc = AmendAccept {
            amendment: m.clone(),
            deadline: T0.plus_secs(u64::from(m.duration_s)),
            accepted_at: T0,
        };
        Signed::sign(&provider, &net, &acc)
            .unwrap()
            .to_bytes()
            .unwrap()
    };
    // Pending: stored, not applied.
    let first = a(1, 900, 20_000_000);
    s.put_amendment(&lease_id, &first, &bytes(&first), None, T0)
        .unwrap();
    let rec = s.session_record(&lease_id).unwrap();
    let pending = rec.amendment.unwrap();
    assert_eq!((pending.seq, pending.acceptance), (1, None));
    assert_eq!(s.lease(&lease_id).unwrap().unwrap().lease.terms, terms);
    // A refused one is forgotten; a new pending one replaces a pending one.
    s.drop_pending_amendment(&lease_id, 1).unwrap();
    assert!(s.session_record(&lease_id).unwrap().amendment.is_none());
    let again = a(1, 1200, 20_000_000);
    s.put_amendment(&lease_id, &first, &bytes(&first), None, T0)
        .unwrap();
    s.put_amendment(&lease_id, &again, &bytes(&again), None, T0)
        .unwrap();
    // Accepted: the lease's terms are the amendment's, the id the original's.
    s.put_amendment(&lease_id, &again, &bytes(&again), Some(&accept(&again)), T0)
        .unwrap();
    drop(s);
    let mut s = Store::open(&p).unwrap();
    let l = s.lease(&lease_id).unwrap().unwrap();
    assert_eq!(
        (l.lease.terms.duration_s, l.lease.terms.max_total),
        (1200, 20_000_000)
    );
    assert_eq!(l.lease.extensions, 1);
    assert_eq!(l.lease.id, lease_id);
    assert_eq!(l.lease.id, terms.lease_id().unwrap());
    // An accepted row is never replaced, nor dropped as pending.
    let other = a(1, 5000, 1);
    s.put_amendment(&lease_id, &other, &bytes(&other), None, T0)
        .unwrap();
    s.drop_pending_amendment(&lease_id, 1).unwrap();
    let l = s.lease(&lease_id).unwrap().unwrap();
    assert_eq!(l.lease.terms.duration_s, 1200);
    // The second one, accepted, is the current one.
    let second = a(2, 1500, 25_000_000);
    s.put_amendment(
        &lease_id,
        &second,
        &bytes(&second),
        Some(&accept(&second)),
        T0,
    )
    .unwrap();
    let l = s.leases(None).unwrap().pop().unwrap();
    assert_eq!((l.lease.terms.duration_s, l.lease.extensions), (1500, 2));
    let rec = s.session_record(&lease_id).unwrap().amendment.unwrap();
    assert_eq!(rec.seq, 2);
    assert!(rec.acceptance.is_some());
}

#[test]
fn redemptions_queue_each_settled_lease_once_and_keep_what_the_chain_paid() {
    use super::redemptions::{Queued, RedemptionState};
    let dir = tempfile::tempdir().unwrap();
    let net = NetworkId::devnet();
    let provider = NodeKey::from_secret([1; 32]);
    let renter = NodeKey::from_secret([2; 32]);
    let offer = fixtures::offer(provider.public(), 3, 2, 400_000);
    let mut s = Store::open(&dir.path().join("g.db")).unwrap();
    let mut ids = Vec::new();
    for nonce in 1..=3 {
        let mut terms = fixtures::terms(OfferId(Digest([3; 32])), &offer, renter.public(), 1, 600);
        terms.nonce = nonce;
        let lease_id = terms.lease_id().unwrap();
        let request = Signed::sign(
            &renter,
            &net,
            &LeaseRequest {
                terms: terms.clone(),
                expires_at: T0.plus_secs(30),
            },
        )
        .unwrap();
        s.insert_lease(&StoredLease {
            role: Role::Provider,
            lease: Lease::propose(lease_id, terms),
            request,
            accept: None,
            gpus: vec![],
            created_at: T0,
        })
        .unwrap();
        ids.push(lease_id);
    }
    // Only settled leases are looked at.
    assert!(s.unqueued_settled(10).unwrap().is_empty());
    s.conn
        .execute("UPDATE leases SET state = 'settled'", [])
        .unwrap();
    assert_eq!(s.unqueued_settled(10).unwrap().len(), 3);
    let q = |id: LeaseId, contract: [u8; 20]| Queued {
        lease_id: id,
        chain_id: 7,
        contract,
        renter: [9; 20],
        epoch: 0,
        amount: 5 * 10u128.pow(20),
        claim: 4 * 10u128.pow(20),
        signature: vec![1; 65],
    };
    s.queue_redemption(&q(ids[0], [5; 20]), 10).unwrap();
    // Queued once: a second queue changes nothing.
    let mut again = q(ids[0], [5; 20]);
    again.claim = 1;
    s.queue_redemption(&again, 11).unwrap();
    s.queue_redemption(&q(ids[1], [6; 20]), 10).unwrap();
    s.mark_glu(&ids[2], 10).unwrap();
    assert!(s.unqueued_settled(10).unwrap().is_empty());
    // Pending on the configured chain and contract only; amounts beyond u64 kept exactly.
    let pending = s.pending_redemptions(7, [5; 20], 32).unwrap();
    assert_eq!(pending, vec![q(ids[0], [5; 20])]);
    // A passing error keeps it pending; a final one fails it, and then nothing moves it.
    s.mark_redeem_error(&ids[0], "no channel", false, 12)
        .unwrap();
    assert_eq!(s.pending_redemptions(7, [5; 20], 32).unwrap().len(), 1);
    s.mark_redeemed(&ids[0], Some("0xab"), 40, 4 * 10u128.pow(20), 13)
        .unwrap();
    let r = s.redemption(&ids[0]).unwrap().unwrap();
    assert_eq!(r.state, RedemptionState::Redeemed);
    assert_eq!(
        (r.tx.as_deref(), r.block, r.attempts),
        (Some("0xab"), Some(40), 2)
    );
    assert_eq!(r.paid, Some(4 * 10u128.pow(20)));
    s.mark_redeem_error(&ids[1], "not signed by the renter", true, 12)
        .unwrap();
    s.mark_redeem_error(&ids[1], "later", false, 14).unwrap();
    let r = s.redemption(&ids[1]).unwrap().unwrap();
    assert_eq!(r.state, RedemptionState::Failed);
    assert_eq!(r.error.as_deref(), Some("not signed by the renter"));
    assert_eq!(s.redemption_counts().unwrap(), (0, 1, 1));
    assert_eq!(
        s.redemption(&ids[2]).unwrap().unwrap().state,
        RedemptionState::Glu
    );
}
