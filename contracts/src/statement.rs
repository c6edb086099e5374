//! Checking a lease's statement ([`gridlease_protocol::statement::Statement`]) with nothing but
//! the statement: every signature, who signed what, and the arithmetic of what is owed.
//!
//! The rules, in order (the first one broken is the answer, naming the message):
//! 1. The request verifies (strict ed25519 over the exact bytes, on the network its terms name)
//!    and is signed by the terms' renter; the acceptance verifies, is signed by the terms'
//!    provider, carries identical terms, and names the lease id the terms hash to.
//! 2. The offer, when included, verifies, is signed by the provider, and is the one the terms
//!    name (its content id and sequence).
//! 3. Amendments are numbered 1, 2, ... for this lease; each proposal is signed by the renter,
//!    each acceptance by the provider over the identical amendment; durations grow and caps do
//!    not fall. The terms in force are the last amendment's ([`crate::amend::amended_terms`]).
//! 4. Usage reports are signed by the provider, for this lease, consecutive by sequence (a
//!    missing one is refused), and each passes the renter's own check
//!    ([`crate::channel::check_usage`]: meters never fall, GPU time within wall time x GPUs,
//!    wall time within the lease's duration, the amount due exactly the tariff's) under the
//!    terms in force or an earlier version of them (a report signed before an amendment).
//! 5. The receipt is signed by the renter, for this lease, within the budget cap, and pays
//!    exactly what the report it answers (which must be included) says is due plus the terms'
//!    prepay ([`Tariff::receipt_total`]), or the cap where the cap bound it; or, covering no
//!    usage, exactly the failed-start fee.
//!
//! What is owed ([`crate::channel::owed`]) is the receipt's `total_paid` (the renter signed
//! it), at most what the last usage report says is due (a prepaid receipt authorises more than
//! was used). Usage reported after the receipt (at most one pay-ahead window, by the channel's
//! rules) is shown as unpaid; no renter signature backs it.
//!
//! Pure: no clock, no I/O.

use gridlease_protocol::statement::Statement;
use gridlease_protocol::{
    LeaseId, LeaseTerms, NetworkId, OfferId, PaymentReceipt, PublicKey, Signed, UsageReport,
    Verified, WireMessage,
};

use crate::amend::amended_terms;
use crate::billing::Tariff;
use crate::channel::check_usage;
use crate::money::Money;

/// What is wrong with a statement: which part, and the problem in words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{part}: {problem}")]
pub struct StatementError {
    /// The message at fault (`the request`, `usage report 7`, ...).
    pub part: String,
    /// What is wrong with it.
    pub problem: String,
}

fn fail<T>(part: impl Into<String>, problem: impl std::fmt::Display) -> Result<T, StatementError> {
    Err(StatementError {
        part: part.into(),
        problem: problem.to_string(),
    })
}

/// What a valid statement says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The lease.
    pub lease_id: LeaseId,
    /// Its network.
    pub network: NetworkId,
    /// The terms in force (the last amendment applied).
    pub terms: LeaseTerms,
    /// Accepted amendments.
    pub amendments: usize,
    /// Whether the offer was included (and matched).
    pub offer_included: bool,
    /// The usage reports included.
    pub reports: usize,
    /// The first and last report's sequence numbers.
    pub report_seqs: Option<(u64, u64)>,
    /// The last report (the cumulative totals).
    pub last_report: Option<UsageReport>,
    /// The last receipt.
    pub receipt: Option<PaymentReceipt>,
    /// The amount owed: what the renter signed to pay, at most what the last report says is
    /// due ([`crate::channel::owed`]).
    pub owed: Money,
    /// What the last report says is due.
    pub reported_due: Money,
    /// Reported but not paid: `reported_due - owed` (no renter signature backs it).
    pub unpaid: Money,
    /// The GPU check at the lease's start, re-checked (`None`: none ran; the terms'
    /// `verify_window_s` says whether one was asked).
    pub gpu_check: Option<gridlease_protocol::proof::ProofVerdict>,
    /// The backend the check ran on (what its challenge named).
    pub gpu_backend: Option<gridlease_protocol::proof::ProofBackend>,
    /// The chain's payment of the last voucher, as the provider's node recorded it (checked
    /// here only against the terms' chain: the chain itself is its evidence).
    pub redemption: Option<gridlease_protocol::statement::Redemption>,
}

fn verified<T: WireMessage>(
    signed: &Signed<T>,
    network: &NetworkId,
    part: &str,
    signer: &PublicKey,
    role: &str,
) -> Result<Verified<T>, StatementError> {
    let v = match signed.verify(network) {
        Ok(v) => v,
        Err(e) => return fail(part, e),
    };
    if &v.signer != signer {
        return fail(
            part,
            format!("signed by {}, not by the lease's {role}", v.signer),
        );
    }
    Ok(v)
}

/// Checks `s` by the rules above; the verdict, or the first rule broken.
pub fn verify(s: &Statement) -> Result<Verdict, StatementError> {
    // 1. The lease.
    let network = s.request.envelope().network.clone();
    let claimed_renter = s.request.signer();
    let request = verified(
        &s.request,
        &network,
        "the request",
        &claimed_renter,
        "renter",
    )?;
    let terms = request.message.terms;
    if terms.network != network {
        return fail(
            "the request",
            format!(
                "signed for network {network}, its terms name {}",
                terms.network
            ),
        );
    }
    if request.signer != terms.renter {
        return fail(
            "the request",
            format!("signed by {}, not by the terms' renter", request.signer),
        );
    }
    let lease_id = match terms.lease_id() {
        Ok(id) => id,
        Err(e) => return fail("the terms", e),
    };
    let accept = verified(
        &s.accept,
        &network,
        "the acceptance",
        &terms.provider,
        "provider",
    )?;
    if accept.message.terms != terms {
        return fail("the acceptance", "its terms differ from the request's");
    }
    if accept.message.lease_id != lease_id {
        return fail(
            "the acceptance",
            format!(
                "names lease {}, the terms hash to {lease_id}",
                accept.message.lease_id
            ),
        );
    }

    // 2. The offer.
    if let Some(offer) = &s.offer {
        let v = verified(offer, &network, "the offer", &terms.provider, "provider")?;
        let id = OfferId(offer.envelope().content_digest());
        if id != terms.offer_id || v.message.seq != terms.offer_seq {
            return fail(
                "the offer",
                format!(
                    "is offer {id} seq {}, the terms name {} seq {}",
                    v.message.seq, terms.offer_id, terms.offer_seq
                ),
            );
        }
    }

    // 3. Amendments.
    let mut versions = vec![terms.clone()];
    for (i, a) in s.amendments.iter().enumerate() {
        let part = format!("amendment {}", i + 1);
        let p = verified(&a.proposal, &network, &part, &terms.renter, "renter")?;
        let acc = verified(&a.acceptance, &network, &part, &terms.provider, "provider")?;
        let current = versions.last().cloned().unwrap_or_else(|| terms.clone());
        let am = &p.message;
        if am.lease_id != lease_id {
            return fail(part, format!("is for lease {}", am.lease_id));
        }
        if am.seq != i as u64 + 1 {
            return fail(part, format!("is numbered {}", am.seq));
        }
        if acc.message.amendment != *am {
            return fail(part, "the provider's acceptance is of another amendment");
        }
        if am.duration_s <= current.duration_s || am.max_total < current.max_total {
            return fail(
                part,
                format!(
                    "{} s and cap {} do not extend {} s and cap {}",
                    am.duration_s, am.max_total, current.duration_s, current.max_total
                ),
            );
        }
        versions.push(amended_terms(&current, am));
    }
    let in_force = versions.last().cloned().unwrap_or_else(|| terms.clone());

    // 4. Usage reports.
    let mut reports: Vec<UsageReport> = Vec::with_capacity(s.usage.len());
    for signed in &s.usage {
        let part = format!("usage report {}", reports.len() + 1);
        let v = verified(signed, &network, &part, &terms.provider, "provider")?;
        let r = v.message;
        let part = format!("usage report {}", r.seq);
        let prev = reports.last();
        if let Some(p) = prev
            && r.seq != p.seq.saturating_add(1)
        {
            return fail(
                part,
                format!(
                    "follows report {}: the report(s) in between are missing",
                    p.seq
                ),
            );
        }
        // The newest terms first; a report signed before an amendment passes under the
        // terms it was signed under.
        let mut first_error = None;
        let ok = versions.iter().rev().any(|t| {
            match check_usage(t, lease_id, prev, &r, &v.signer, u64::MAX) {
                Ok(()) => true,
                Err(e) => {
                    first_error.get_or_insert(e);
                    false
                }
            }
        });
        if !ok {
            let e = first_error.map_or_else(String::new, |e| e.to_string());
            return fail(part, e);
        }
        reports.push(r);
    }

    // 5. The receipt.
    let receipt = match &s.receipt {
        None => None,
        Some(signed) => {
            let v = verified(signed, &network, "the receipt", &terms.renter, "renter")?;
            let r = v.message;
            if r.lease_id != lease_id {
                return fail("the receipt", format!("is for lease {}", r.lease_id));
            }
            if let Err(e) = crate::settlement::check_voucher(terms.settlement.as_ref(), &r) {
                return fail("the receipt", e);
            }
            let paid = Money::from_micros(r.total_paid);
            let cap = Money::from_micros(in_force.max_total);
            if paid > cap {
                return fail(
                    "the receipt",
                    format!("pays {paid}, over the budget cap {cap}"),
                );
            }
            let fee = Tariff::of(&in_force).failed_start_fee();
            let is_fee = r.covers_wall_ms == 0 && fee.as_ref().is_ok_and(|f| *f == paid);
            if !is_fee {
                let Some(report) = reports.iter().find(|u| u.seq == r.usage_seq) else {
                    return fail(
                        "the receipt",
                        format!(
                            "answers usage report {}, which is not in the statement",
                            r.usage_seq
                        ),
                    );
                };
                let due = Money::from_micros(report.amount_due);
                // What the receipt must pay for that report: its due, plus the prepay, capped
                // (under the terms in force or the version the report was signed under).
                let capped = versions
                    .iter()
                    .any(|t| paid == Tariff::of(t).receipt_total(due));
                if !capped || r.covers_wall_ms != report.wall_ms {
                    return fail(
                        "the receipt",
                        format!(
                            "pays {paid} for {} ms; usage report {} says {due} is due for {} ms",
                            r.covers_wall_ms, report.seq, report.wall_ms
                        ),
                    );
                }
            }
            Some(r)
        }
    };
    // 6. The GPU check: every signature, every hash, the verdict recomputed; a failed check
    // means nothing was billed (the command never started).
    let gpu_check = match &s.proof {
        None => None,
        Some(record) => {
            let v = match crate::proof::check_record(
                record,
                &network,
                &terms.renter,
                &terms.provider,
            ) {
                Ok(v) => v,
                Err(e) => return fail("the GPU check", e),
            };
            let names_lease = record
                .report
                .verify(&network)
                .is_ok_and(|r| r.message.lease_id == lease_id);
            if !names_lease {
                return fail("the GPU check", "it is of another lease");
            }
            if !v.passed()
                && (!reports.is_empty() || receipt.as_ref().is_some_and(|r| r.total_paid > 0))
            {
                return fail(
                    "the GPU check",
                    "it failed, yet the statement bills usage: a failed check ends the lease before its command",
                );
            }
            Some(v)
        }
    };
    let gpu_backend = s
        .proof
        .as_ref()
        .and_then(|r| r.challenge.verify(&network).ok().map(|c| c.message.backend));
    let last_report = reports.last().cloned();
    let owed = receipt.as_ref().map_or(Money::ZERO, |r| {
        crate::channel::owed(Money::from_micros(r.total_paid), last_report.as_ref())
    });
    let reported_due = last_report
        .as_ref()
        .map_or(Money::ZERO, |r| Money::from_micros(r.amount_due));
    // 6. The redemption names the terms' chain, and a voucher was paid.
    if let Some(r) = &s.redemption {
        match in_force.settlement.as_ref() {
            Some(st) if st.chain.chain_id == r.chain_id => {}
            Some(st) => {
                return fail(
                    "the redemption",
                    format!(
                        "on chain {}, but the lease settles on chain {}",
                        r.chain_id, st.chain.chain_id
                    ),
                );
            }
            None => return fail("the redemption", "the lease settles in GLU only"),
        }
        if receipt.as_ref().and_then(|x| x.voucher.as_ref()).is_none() {
            return fail("the redemption", "no receipt with a voucher was paid");
        }
    }
    Ok(Verdict {
        redemption: s.redemption.clone(),
        lease_id,
        network,
        amendments: s.amendments.len(),
        offer_included: s.offer.is_some(),
        reports: reports.len(),
        report_seqs: reports
            .first()
            .zip(reports.last())
            .map(|(a, b)| (a.seq, b.seq)),
        last_report,
        receipt,
        owed,
        unpaid: reported_due.saturating_sub(owed),
        reported_due,
        terms: in_force,
        gpu_check,
        gpu_backend,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlease_protocol::fixtures::{self, T0};
    use gridlease_protocol::statement::SignedAmendment;
    use gridlease_protocol::{
        AmendAccept, LeaseAccept, LeaseAmendment, LeaseRequest, NodeKey, OfferId,
    };

    struct Parties {
        provider: NodeKey,
        renter: NodeKey,
        net: NetworkId,
    }

    /// A finished lease: offer, terms, `n` reports 10 s apart, the receipt for the last, and
    /// one amendment when `amend`.
    fn statement(n: u64, amend: bool) -> (Parties, Statement) {
        statement_prepaid(n, amend, 0)
    }

    /// [`statement`] for terms prepaying `prepay_s` seconds: the receipt pays ahead.
    fn statement_prepaid(n: u64, amend: bool, prepay_s: u32) -> (Parties, Statement) {
        let p = Parties {
            provider: NodeKey::generate(),
            renter: NodeKey::generate(),
            net: NetworkId::devnet(),
        };
        let offer = fixtures::offer(p.provider.public(), 3, 2, 3_600_000);
        let signed_offer = Signed::sign(&p.provider, &p.net, &offer).unwrap();
        let offer_id = OfferId(signed_offer.envelope().content_digest());
        let mut terms = fixtures::terms(offer_id, &offer, p.renter.public(), 1, 600);
        terms.prepay_s = prepay_s;
        let lease_id = terms.lease_id().unwrap();
        let request = LeaseRequest {
            terms: terms.clone(),
            expires_at: T0.plus_secs(30),
        };
        let accept = LeaseAccept {
            lease_id,
            terms: terms.clone(),
            gpus: vec![],
            accepted_at: T0,
        };
        let mut in_force = terms.clone();
        let mut amendments = vec![];
        if amend {
            let a = LeaseAmendment {
                lease_id,
                seq: 1,
                duration_s: 1200,
                max_total: terms.max_total + 1_000_000,
                created_at: T0.plus_secs(5),
            };
            let acc = AmendAccept {
                amendment: a.clone(),
                deadline: T0.plus_secs(1200),
                accepted_at: T0.plus_secs(5),
            };
            in_force = amended_terms(&terms, &a);
            amendments.push(SignedAmendment {
                proposal: Signed::sign(&p.renter, &p.net, &a).unwrap(),
                acceptance: Signed::sign(&p.provider, &p.net, &acc).unwrap(),
            });
        }
        let tariff = Tariff::of(&in_force);
        let mut usage = vec![];
        let mut last = None;
        for seq in 1..=n {
            let mut u = fixtures::usage(lease_id, seq, seq * 10_000, 1);
            u.amount_due = tariff.due(u.wall_ms).unwrap().micros();
            usage.push(Signed::sign(&p.provider, &p.net, &u).unwrap());
            last = Some(u);
        }
        let receipt = last.map(|u| {
            let r = PaymentReceipt {
                lease_id,
                seq: u.seq,
                total_paid: tariff
                    .receipt_total(Money::from_micros(u.amount_due))
                    .micros(),
                covers_wall_ms: u.wall_ms,
                usage_seq: u.seq,
                issued_at: u.interval_end,
                voucher: None,
            };
            Signed::sign(&p.renter, &p.net, &r).unwrap()
        });
        let s = Statement {
            redemption: None,
            proof: Default::default(),
            offer: Some(signed_offer),
            request: Signed::sign(&p.renter, &p.net, &request).unwrap(),
            accept: Signed::sign(&p.provider, &p.net, &accept).unwrap(),
            amendments,
            usage,
            receipt,
        };
        (p, s)
    }

    #[test]
    fn a_redemption_on_a_lease_in_glu_only_is_refused() {
        let (_, mut s) = statement(6, true);
        s.redemption = Some(gridlease_protocol::statement::Redemption {
            chain_id: 1,
            tx: Some([7; 32]),
            block: 9,
            paid: 60_000,
        });
        let e = verify(&s).unwrap_err().to_string();
        assert!(
            e.contains("the redemption") && e.contains("GLU only"),
            "{e}"
        );
        // It round-trips in the file (layout 3).
        let bytes = s.to_bytes().unwrap();
        assert_eq!(Statement::from_bytes(&bytes).unwrap(), s);
    }

    #[test]
    fn statements_of_the_earlier_layouts_still_read() {
        use gridlease_protocol::codec::encode;
        use gridlease_protocol::statement::{
            MAX_STATEMENT_BYTES, STATEMENT_MAGIC_V1, STATEMENT_MAGIC_V2,
        };
        const N: usize = MAX_STATEMENT_BYTES - 8;
        let (_, s) = statement(3, true);
        // A struct encodes as its fields in order: the earlier layouts are these tuples.
        let v2 = (
            &s.offer,
            &s.request,
            &s.accept,
            &s.amendments,
            &s.usage,
            &s.receipt,
            &s.proof,
        );
        let v1 = (
            &s.offer,
            &s.request,
            &s.accept,
            &s.amendments,
            &s.usage,
            &s.receipt,
        );
        for (magic, body, proof) in [
            (
                STATEMENT_MAGIC_V2,
                encode::<_, N>(&v2).unwrap(),
                s.proof.clone(),
            ),
            (STATEMENT_MAGIC_V1, encode::<_, N>(&v1).unwrap(), None),
        ] {
            let read = Statement::from_bytes(&[&magic[..], &body].concat()).unwrap();
            assert_eq!(read.request, s.request);
            assert_eq!(read.usage, s.usage);
            assert_eq!(read.proof, proof);
            assert_eq!(read.redemption, None);
            assert_eq!(verify(&read).unwrap().owed, verify(&s).unwrap().owed);
        }
    }

    #[test]
    fn a_whole_statement_verifies_and_says_what_is_owed() {
        let (_, s) = statement(6, true);
        let v = verify(&s).unwrap();
        // 60 s of one GPU at 3.6 units per GPU-hour: 0.06 units.
        assert_eq!(v.owed, Money::from_micros(60_000));
        assert_eq!(v.reported_due, v.owed);
        assert_eq!(v.unpaid, Money::ZERO);
        assert_eq!(v.reports, 6);
        assert_eq!(v.report_seqs, Some((1, 6)));
        assert_eq!(v.amendments, 1);
        assert_eq!(v.terms.duration_s, 1200);
        assert!(v.offer_included);
        // The file round-trips byte for byte.
        let bytes = s.to_bytes().unwrap();
        assert_eq!(Statement::from_bytes(&bytes).unwrap(), s);
    }

    #[test]
    fn a_prepaid_statement_owes_the_last_reported_due_and_a_receipt_off_the_prepay_is_named() {
        // 60 s used, 120 s prepaid: the receipt pays 180 s, 0.06 units are owed.
        let (p, s) = statement_prepaid(6, false, 120);
        let v = verify(&s).unwrap();
        assert_eq!(v.receipt.as_ref().unwrap().total_paid, 180_000);
        assert_eq!(v.owed, Money::from_micros(60_000));
        assert_eq!(v.unpaid, Money::ZERO);
        // Prepaid in full: the whole budget cap (the fixture's 10 units), still 0.06 owed.
        let (_, all) = statement_prepaid(6, false, gridlease_protocol::PREPAY_ALL);
        let v = verify(&all).unwrap();
        assert_eq!(v.receipt.as_ref().unwrap().total_paid, 10_000_000);
        assert_eq!(v.owed, Money::from_micros(60_000));
        // A receipt that pays in arrears although the terms prepay does not match the terms.
        let mut bad = s.clone();
        let mut r = bad
            .receipt
            .as_ref()
            .unwrap()
            .verify(&p.net)
            .unwrap()
            .message;
        r.total_paid = 60_000;
        bad.receipt = Some(Signed::sign(&p.renter, &p.net, &r).unwrap());
        let e = verify(&bad).unwrap_err();
        assert!(e.to_string().contains("the receipt"), "{e}");
    }

    #[test]
    fn flipping_any_byte_of_the_file_is_refused() {
        let (_, s) = statement(2, true);
        let bytes = s.to_bytes().unwrap();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x01;
            if let Ok(t) = Statement::from_bytes(&b) {
                assert!(
                    verify(&t).is_err(),
                    "byte {i} of {} flipped: still valid",
                    b.len()
                );
            }
        }
    }

    #[test]
    fn a_dropped_report_is_named() {
        let (_, mut s) = statement(5, false);
        s.usage.remove(2);
        let e = verify(&s).unwrap_err();
        assert_eq!(e.part, "usage report 4");
        assert!(e.problem.contains("follows report 2"), "{e}");
        // The report the receipt answers, dropped.
        let (_, mut s) = statement(5, false);
        s.usage.pop();
        let e = verify(&s).unwrap_err();
        assert_eq!(e.part, "the receipt");
        assert!(e.problem.contains("usage report 5"), "{e}");
    }

    #[test]
    fn an_altered_amount_is_named_even_when_re_signed_by_its_own_signer() {
        // The provider re-signs a report claiming more than the tariff.
        let (p, mut s) = statement(3, false);
        let mut u = s.usage[1].verify(&p.net).unwrap().message;
        u.amount_due += 1;
        s.usage[1] = Signed::sign(&p.provider, &p.net, &u).unwrap();
        let e = verify(&s).unwrap_err();
        assert_eq!(e.part, "usage report 2");
        assert!(e.problem.contains("tariff"), "{e}");
        // The renter's receipt for more or less than the report it answers.
        for delta in [1i64, -1] {
            let (p, mut s) = statement(3, false);
            let mut r = s.receipt.as_ref().unwrap().verify(&p.net).unwrap().message;
            r.total_paid = r.total_paid.saturating_add_signed(delta);
            s.receipt = Some(Signed::sign(&p.renter, &p.net, &r).unwrap());
            let e = verify(&s).unwrap_err();
            assert_eq!(e.part, "the receipt");
        }
        // A receipt signed by the provider instead of the renter.
        let (p, mut s) = statement(3, false);
        let r = s.receipt.as_ref().unwrap().verify(&p.net).unwrap().message;
        s.receipt = Some(Signed::sign(&p.provider, &p.net, &r).unwrap());
        let e = verify(&s).unwrap_err();
        assert!(e.problem.contains("not by the lease's renter"), "{e}");
    }

    #[test]
    fn reports_past_the_receipt_are_unpaid_not_owed() {
        let (p, mut s) = statement(4, false);
        let r4 = s.usage.pop().unwrap();
        let r3 = s.usage[2].verify(&p.net).unwrap().message;
        let receipt = PaymentReceipt {
            lease_id: r3.lease_id,
            seq: 3,
            total_paid: r3.amount_due,
            covers_wall_ms: r3.wall_ms,
            usage_seq: 3,
            issued_at: r3.interval_end,
            voucher: None,
        };
        s.receipt = Some(Signed::sign(&p.renter, &p.net, &receipt).unwrap());
        s.usage.push(r4);
        let v = verify(&s).unwrap();
        assert_eq!(v.owed, Money::from_micros(r3.amount_due));
        assert_eq!(v.unpaid, Money::from_micros(10_000));
    }

    #[test]
    fn another_lease_s_acceptance_or_offer_is_refused() {
        let (p, mut s) = statement(1, false);
        let mut a = s.accept.verify(&p.net).unwrap().message;
        a.terms.nonce += 1;
        s.accept = Signed::sign(&p.provider, &p.net, &a).unwrap();
        assert_eq!(verify(&s).unwrap_err().part, "the acceptance");

        let (p, mut s) = statement(1, false);
        let other = fixtures::offer(p.provider.public(), 4, 2, 3_600_000);
        s.offer = Some(Signed::sign(&p.provider, &p.net, &other).unwrap());
        assert_eq!(verify(&s).unwrap_err().part, "the offer");
    }
}
