//! Lease sessions in the store (issue 5): state transitions, usage reports, receipts and the
//! double-entry ledger.
//!
//! Invariant: a receipt and the ledger rows it causes are written in ONE transaction
//! ([`Store::book_receipt`]); a receipt that is not strictly above the last stored one (sequence
//! and total) books nothing.

use gridlease_contracts::LeaseState;
use gridlease_contracts::lease::Transition;
use gridlease_protocol::statement::{SignedAmendment, Statement};
use gridlease_protocol::{
    CloseReason, LeaseAmendment, LeaseId, Offer, PaymentReceipt, PublicKey, Signed, Timestamp,
    WireMessage,
};
use rusqlite::{OptionalExtension, params};

use super::sql::{actor_str, classify, event_str, i64_of, u64_of};
use super::{Role, Store, StoreError};

/// Ledger account: the renter's spending on a lease (debit side).
pub const ACCOUNT_LEASE_SPEND: &str = "lease_spend";
/// Ledger account: what the renter owes the provider (credit side of the renter's entries).
pub const ACCOUNT_PAYABLE: &str = "payable";
/// Ledger account: what the provider is owed by the renter (debit side of the provider's).
pub const ACCOUNT_RECEIVABLE: &str = "receivable";
/// Ledger account: the provider's revenue from a lease (credit side).
pub const ACCOUNT_LEASE_REVENUE: &str = "lease_revenue";

/// Session fields of a lease beyond its state; `None` fields are left unchanged on update.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionPatch {
    /// Docker container id (provider).
    pub container_id: Option<String>,
    /// When the container started.
    pub started_at: Option<Timestamp>,
    /// When the lease closed.
    pub closed_at: Option<Timestamp>,
    /// Why.
    pub close_reason: Option<CloseReason>,
    /// The container's exit code.
    pub exit_code: Option<i32>,
    /// The settled total, micro-units.
    pub settled_total: Option<u64>,
    /// Why the start failed (kind and sentence).
    pub failure: Option<gridlease_protocol::StartFailure>,
    /// Provider: the finished lease's container and workspace are kept until then.
    pub outputs_until: Option<Timestamp>,
}

/// An amendment of a lease's terms as stored (`extend`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredAmendment {
    /// Its sequence (1, 2, ...).
    pub seq: u64,
    /// The renter's signed `LeaseAmendment` (envelope bytes).
    pub proposal: Vec<u8>,
    /// The provider's signed `AmendAccept` (envelope bytes); `None`: pending.
    pub acceptance: Option<Vec<u8>>,
}

/// What the store knows about a lease's session.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionRecord {
    /// Stored fields.
    pub fields: SessionPatch,
    /// The lease's latest amendment (accepted, or a renter's pending one).
    pub amendment: Option<StoredAmendment>,
    /// The last usage report (signed envelope bytes) and its sequence.
    pub last_usage: Option<(u64, Vec<u8>)>,
    /// The last receipt (signed envelope bytes) and its sequence.
    pub last_receipt: Option<(u64, Vec<u8>)>,
    /// The offer the lease was made from (when this node kept it) declared its GPUs
    /// (`--dev-gpus`): no driver measures them, so their usage is unknown, not 0.
    pub gpus_declared: bool,
    /// That offer (signed envelope bytes), when this node kept it.
    pub offer: Option<Vec<u8>>,
    /// The lease's GPU check, when one ran (issue 44).
    pub proof: Option<gridlease_protocol::proof::ProofRecord>,
}

/// One ledger row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerRow {
    /// The lease.
    pub lease_id: LeaseId,
    /// The other party.
    pub counterparty: PublicKey,
    /// Account name.
    pub account: String,
    /// Debit, micro-units.
    pub debit: u64,
    /// Credit, micro-units.
    pub credit: u64,
    /// The receipt that caused it.
    pub receipt_seq: Option<u64>,
    /// When it was booked.
    pub at: Timestamp,
}

/// Stable text for a close reason in the database.
pub fn reason_str(r: CloseReason) -> &'static str {
    match r {
        CloseReason::Expired => "expired",
        CloseReason::RenterStop => "renter_stop",
        CloseReason::ProviderStop => "provider_stop",
        CloseReason::ContainerExited => "container_exited",
        CloseReason::PaymentLagging => "payment_lagging",
        CloseReason::RenterUnreachable => "renter_unreachable",
        CloseReason::ProviderUnreachable => "provider_unreachable",
        CloseReason::ImplausibleUsage => "implausible_usage",
        CloseReason::BadReceipt => "bad_receipt",
        CloseReason::BudgetExhausted => "budget_exhausted",
        CloseReason::StartFailed => "start_failed",
        CloseReason::OwnerReclaimed => "owner_reclaimed",
        CloseReason::GpuCheckFailed => "gpu_check_failed",
    }
}

/// Inverse of [`reason_str`].
pub fn parse_reason(s: &str) -> Option<CloseReason> {
    CloseReason::ALL.into_iter().find(|r| reason_str(*r) == s)
}

/// Whether a stored offer (signed envelope bytes, verified before it was stored) declares any
/// of its GPUs rather than measuring them. An envelope this build cannot read declares none.
fn declares_gpus(envelope: &[u8]) -> bool {
    Signed::<Offer>::from_bytes(envelope)
        .ok()
        .and_then(|s| Offer::decode_payload(&s.envelope().payload).ok())
        .is_some_and(|o| o.gpus.iter().any(gridlease_protocol::OfferedGpu::declared))
}

/// Usage reports a renter keeps per lease (the newest; see [`Store::put_usage`]).
pub const USAGE_REPORTS_KEPT: u64 = 16;

/// Which of a lease's usage reports the store keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsageKept {
    /// Every one: a provider's own reports, one per usage interval of a lease whose duration
    /// both sides signed (so at most `duration_s / usage_interval_s` and the final one). They
    /// are the provider's evidence in a statement (`gridlease statement`).
    All,
    /// The newest [`USAGE_REPORTS_KEPT`]: a renter's, received from the provider (a provider
    /// that sends reports faster than agreed cannot fill the renter's disk). Reports are
    /// cumulative: the last one carries the totals.
    Newest,
}

/// Inserts a usage report; with [`UsageKept::Newest`] drops the lease's reports older than the
/// last [`USAGE_REPORTS_KEPT`] (the primary key makes both index lookups).
fn insert_usage(
    tx: &rusqlite::Transaction<'_>,
    lid: &[u8],
    seq: u64,
    envelope: &[u8],
    at: Timestamp,
    kept: UsageKept,
) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT OR IGNORE INTO usage_reports(lease_id, seq, envelope, received_at)
         VALUES (?1, ?2, ?3, ?4)",
        params![lid, i64_of(seq), envelope, i64_of(at.0)],
    )?;
    if kept == UsageKept::Newest {
        tx.execute(
            "DELETE FROM usage_reports WHERE lease_id = ?1 AND seq <= ?2",
            params![lid, i64_of(seq.saturating_sub(USAGE_REPORTS_KEPT))],
        )?;
    }
    Ok(())
}

/// At settlement: when the receipts booked for a lease come to more than it settles at (a
/// prepaid receipt authorised more than was used, see `gridlease_contracts::channel::owed`),
/// books the difference back (two reversal rows, no receipt) so the lease's spend or revenue
/// is exactly `total`. Idempotent: a second settlement finds nothing to reverse.
fn reverse_unowed(
    tx: &rusqlite::Transaction<'_>,
    lid: &[u8],
    total: u64,
    at: Timestamp,
) -> rusqlite::Result<()> {
    let Some((role, provider, renter)) = tx
        .query_row(
            "SELECT role, provider, renter FROM leases WHERE lease_id = ?1",
            [lid],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, Vec<u8>>(1)?,
                    r.get::<_, Vec<u8>>(2)?,
                ))
            },
        )
        .optional()?
    else {
        return Ok(());
    };
    let renter_side = role == "renter";
    let (account, other) = if renter_side {
        (ACCOUNT_LEASE_SPEND, ACCOUNT_PAYABLE)
    } else {
        (ACCOUNT_LEASE_REVENUE, ACCOUNT_RECEIVABLE)
    };
    // Spend is booked as debits, revenue as credits; a reversal is the opposite entry.
    let booked: i64 = tx.query_row(
        "SELECT COALESCE(SUM(CASE WHEN ?2 THEN debit - credit ELSE credit - debit END), 0)
         FROM ledger WHERE lease_id = ?1 AND account = ?3",
        params![lid, renter_side, account],
        |r| r.get(0),
    )?;
    let excess = u64_of(booked).saturating_sub(total);
    if excess == 0 {
        return Ok(());
    }
    let counterparty = if renter_side { provider } else { renter };
    let (main, contra) = if renter_side {
        ((0, excess), (excess, 0))
    } else {
        ((excess, 0), (0, excess))
    };
    for (acct, (debit, credit)) in [(account, main), (other, contra)] {
        tx.execute(
            "INSERT INTO ledger(lease_id, counterparty, account, debit, credit, receipt_seq, at)
             VALUES (?1, ?2, ?3, ?4, ?5, NULL, ?6)",
            params![
                lid,
                &counterparty,
                acct,
                i64_of(debit),
                i64_of(credit),
                i64_of(at.0)
            ],
        )?;
    }
    tracing::info!(excess, total, "prepaid beyond use reversed at settlement");
    Ok(())
}

fn key_of(b: &[u8]) -> Option<PublicKey> {
    <[u8; 32]>::try_from(b).ok().map(PublicKey)
}

impl Store {
    /// Records a state transition (state column + history row) and session fields, in one
    /// transaction.
    pub fn lease_transition(
        &mut self,
        id: &LeaseId,
        t: Option<&Transition>,
        state: LeaseState,
        patch: &SessionPatch,
    ) -> Result<(), StoreError> {
        let path = self.path.clone();
        let e = |source| classify(&path, source);
        let lid = &id.0.0[..];
        let tx = self.conn.transaction().map_err(e)?;
        tx.execute(
            "UPDATE leases SET state = ?2 WHERE lease_id = ?1",
            params![lid, state.as_str()],
        )
        .map_err(e)?;
        if let Some(t) = t {
            let n: i64 = tx
                .query_row(
                    "SELECT count(*) FROM lease_history WHERE lease_id = ?1",
                    [lid],
                    |r| r.get(0),
                )
                .map_err(e)?;
            tx.execute(
                "INSERT INTO lease_history(lease_id, seq, at, actor, event, to_state)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    lid,
                    n,
                    i64_of(t.at.0),
                    actor_str(t.actor),
                    event_str(&t.event),
                    t.to.as_str()
                ],
            )
            .map_err(e)?;
        }
        tx.execute(
            "INSERT INTO lease_session(lease_id, container_id, started_at, closed_at, close_reason,
                exit_code, settled_total, failure, outputs_until)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT(lease_id) DO UPDATE SET
                container_id = COALESCE(excluded.container_id, container_id),
                started_at = COALESCE(excluded.started_at, started_at),
                closed_at = COALESCE(excluded.closed_at, closed_at),
                close_reason = COALESCE(excluded.close_reason, close_reason),
                exit_code = COALESCE(excluded.exit_code, exit_code),
                settled_total = COALESCE(excluded.settled_total, settled_total),
                failure = COALESCE(excluded.failure, failure),
                outputs_until = COALESCE(excluded.outputs_until, outputs_until)",
            params![
                lid,
                patch.container_id,
                patch.started_at.map(|t| i64_of(t.0)),
                patch.closed_at.map(|t| i64_of(t.0)),
                patch.close_reason.map(reason_str),
                patch.exit_code,
                patch.settled_total.map(i64_of),
                patch
                    .failure
                    .as_ref()
                    .and_then(|f| serde_json::to_string(f).ok()),
                patch.outputs_until.map(|t| i64_of(t.0)),
            ],
        )
        .map_err(e)?;
        if let Some(total) = patch.settled_total {
            let at = t.map(|t| t.at).or(patch.closed_at).unwrap_or_default();
            reverse_unowed(&tx, lid, total, at).map_err(e)?;
        }
        tx.commit().map_err(e)
    }

    /// Provider: the finished leases whose outputs are kept, with the time they are kept until
    /// (an index scan of only those rows).
    pub fn kept_outputs(&self) -> Result<Vec<(LeaseId, Timestamp)>, StoreError> {
        let path = self.path.clone();
        let e = |source| classify(&path, source);
        let mut stmt = self
            .conn
            .prepare(
                "SELECT lease_id, outputs_until FROM lease_session
                 WHERE outputs_until IS NOT NULL ORDER BY outputs_until",
            )
            .map_err(e)?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, i64>(1)?)))
            .map_err(e)?;
        let mut out = Vec::new();
        for row in rows {
            let (id, until) = row.map_err(e)?;
            if let Ok(d) = <[u8; 32]>::try_from(id.as_slice()) {
                out.push((
                    LeaseId(gridlease_protocol::Digest(d)),
                    Timestamp(u64_of(until)),
                ));
            }
        }
        Ok(out)
    }

    /// Provider: the lease's kept outputs are gone (removed after their time).
    pub fn outputs_removed(&mut self, id: &LeaseId) -> Result<(), StoreError> {
        let path = self.path.clone();
        self.conn
            .execute(
                "UPDATE lease_session SET outputs_until = NULL WHERE lease_id = ?1",
                [&id.0.0[..]],
            )
            .map_err(|source| classify(&path, source))?;
        Ok(())
    }

    /// Stores a usage report (sent by a provider or accepted by a renter). Idempotent by seq.
    /// `kept`: which of the lease's reports stay ([`UsageKept`]).
    pub fn put_usage(
        &mut self,
        id: &LeaseId,
        seq: u64,
        envelope: &[u8],
        at: Timestamp,
        kept: UsageKept,
    ) -> Result<(), StoreError> {
        let path = self.path.clone();
        let e = |source| classify(&path, source);
        let tx = self.conn.transaction().map_err(e)?;
        insert_usage(&tx, &id.0.0[..], seq, envelope, at, kept).map_err(e)?;
        tx.commit().map_err(e)
    }

    /// The lease's stored usage reports with a sequence above `after_seq`, oldest first, at
    /// most `limit` (envelope bytes): what a renter that was away asks for (a provider keeps
    /// every report it sent).
    pub fn usage_after(
        &self,
        id: &LeaseId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT envelope FROM usage_reports WHERE lease_id = ?1 AND seq > ?2
                 ORDER BY seq LIMIT ?3",
            )
            .map_err(self.err())?;
        let rows = stmt
            .query_map(
                params![
                    &id.0.0[..],
                    i64_of(after_seq),
                    i64::try_from(limit).unwrap_or(i64::MAX)
                ],
                |r| r.get::<_, Vec<u8>>(0),
            )
            .map_err(self.err())?;
        rows.collect::<Result<_, _>>().map_err(self.err())
    }

    /// Books a receipt: stores it (with the usage report it answers, for a renter) and the two
    /// ledger rows of its delta over the previous receipt, in one transaction. Returns the
    /// delta. A receipt whose seq or total is not above the stored last one books nothing and
    /// returns `Ok(None)`.
    #[allow(clippy::too_many_arguments)]
    pub fn book_receipt(
        &mut self,
        role: Role,
        id: &LeaseId,
        counterparty: &PublicKey,
        receipt: &PaymentReceipt,
        envelope: &[u8],
        usage: Option<(u64, &[u8])>,
        at: Timestamp,
    ) -> Result<Option<u64>, StoreError> {
        let path = self.path.clone();
        let e = |source| classify(&path, source);
        let lid = &id.0.0[..];
        let tx = self.conn.transaction().map_err(e)?;
        if let Some((seq, bytes)) = usage {
            insert_usage(&tx, lid, seq, bytes, at, UsageKept::Newest).map_err(e)?;
        }
        let last: Option<(i64, i64)> = tx
            .query_row(
                "SELECT seq, total_paid FROM receipts WHERE lease_id = ?1
                 ORDER BY seq DESC LIMIT 1",
                [lid],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(e)?;
        let (last_seq, last_total) = last.map_or((0, 0), |(s, t)| (u64_of(s), u64_of(t)));
        if receipt.seq <= last_seq || receipt.total_paid <= last_total {
            tx.commit().map_err(e)?;
            return Ok(None);
        }
        let delta = receipt.total_paid - last_total;
        tx.execute(
            "INSERT INTO receipts(lease_id, seq, total_paid, envelope, received_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                lid,
                i64_of(receipt.seq),
                i64_of(receipt.total_paid),
                envelope,
                i64_of(at.0)
            ],
        )
        .map_err(e)?;
        let (debit_acct, credit_acct) = match role {
            Role::Renter => (ACCOUNT_LEASE_SPEND, ACCOUNT_PAYABLE),
            Role::Provider => (ACCOUNT_RECEIVABLE, ACCOUNT_LEASE_REVENUE),
        };
        for (account, debit, credit) in [(debit_acct, delta, 0), (credit_acct, 0, delta)] {
            tx.execute(
                "INSERT INTO ledger(lease_id, counterparty, account, debit, credit, receipt_seq, at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    lid,
                    &counterparty.0[..],
                    account,
                    i64_of(debit),
                    i64_of(credit),
                    i64_of(receipt.seq),
                    i64_of(at.0)
                ],
            )
            .map_err(e)?;
        }
        tx.commit().map_err(e)?;
        Ok(Some(delta))
    }

    /// The session record of a lease.
    pub fn session_record(&self, id: &LeaseId) -> Result<SessionRecord, StoreError> {
        let lid = &id.0.0[..];
        let e = self.err();
        type Row = (
            Option<String>,
            Option<i64>,
            Option<i64>,
            Option<String>,
            Option<i32>,
            Option<i64>,
            Option<String>,
            Option<i64>,
        );
        let row: Option<Row> = self
            .conn
            .query_row(
                "SELECT container_id, started_at, closed_at, close_reason, exit_code,
                    settled_total, failure, outputs_until FROM lease_session WHERE lease_id = ?1",
                [lid],
                |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        r.get(6)?,
                        r.get(7)?,
                    ))
                },
            )
            .optional()
            .map_err(&e)?;
        let fields = row
            .map(|(c, s, cl, r, x, t, f, o)| SessionPatch {
                container_id: c,
                started_at: s.map(|v| Timestamp(u64_of(v))),
                closed_at: cl.map(|v| Timestamp(u64_of(v))),
                close_reason: r.as_deref().and_then(parse_reason),
                exit_code: x,
                settled_total: t.map(u64_of),
                // A row this build cannot read is no failure worth losing the lease over.
                failure: f.and_then(|j| serde_json::from_str(&j).ok()),
                outputs_until: o.map(|v| Timestamp(u64_of(v))),
            })
            .unwrap_or_default();
        // The latest (seq, envelope) of a lease in `table` (a fixed name, never input).
        let latest = |table: &str| {
            self.conn
                .query_row(
                    &format!(
                        "SELECT seq, envelope FROM {table} WHERE lease_id = ?1
                         ORDER BY seq DESC LIMIT 1"
                    ),
                    [lid],
                    |r| Ok((u64_of(r.get(0)?), r.get(1)?)),
                )
                .optional()
                .map_err(&e)
        };
        let last_usage = latest("usage_reports")?;
        let last_receipt = latest("receipts")?;
        let amendment = self
            .conn
            .query_row(
                "SELECT seq, proposal, acceptance FROM lease_amendments WHERE lease_id = ?1
                 ORDER BY seq DESC LIMIT 1",
                [lid],
                |r| {
                    Ok(StoredAmendment {
                        seq: u64_of(r.get(0)?),
                        proposal: r.get(1)?,
                        acceptance: r.get(2)?,
                    })
                },
            )
            .optional()
            .map_err(&e)?;
        let offer: Option<Vec<u8>> = self
            .conn
            .query_row(
                "SELECT envelope FROM lease_offers WHERE lease_id = ?1",
                [lid],
                |r| r.get(0),
            )
            .optional()
            .map_err(&e)?;
        let proof = self.proof(id)?;
        Ok(SessionRecord {
            fields,
            amendment,
            last_usage,
            last_receipt,
            gpus_declared: offer.as_deref().is_some_and(declares_gpus),
            offer,
            proof,
        })
    }

    /// Keeps the signed offer (envelope bytes) lease `id`'s terms were made from. The first
    /// one stays.
    pub fn put_lease_offer(&mut self, id: &LeaseId, envelope: &[u8]) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT OR IGNORE INTO lease_offers(lease_id, envelope) VALUES (?1, ?2)",
                params![&id.0.0[..], envelope],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// Lease `id`'s statement ([`Statement`]) from what this node keeps: the offer (if kept),
    /// the signed request and acceptance, the accepted amendments, the usage reports and the
    /// last receipt. `None`: no such lease, or one without an acceptance.
    pub fn statement(&self, id: &LeaseId) -> Result<Option<Statement>, StoreError> {
        let Some(l) = self.lease(id)? else {
            return Ok(None);
        };
        let Some(accept) = l.accept else {
            return Ok(None);
        };
        let lid = &id.0.0[..];
        let e = self.err();
        // One envelope of the lease from `sql` (a fixed query, never input), decoded.
        fn one<T: WireMessage>(
            s: &Store,
            sql: &str,
            lid: &[u8],
            what: &'static str,
        ) -> Result<Option<Signed<T>>, StoreError> {
            s.conn
                .query_row(sql, [lid], |r| r.get::<_, Vec<u8>>(0))
                .optional()
                .map_err(s.err())?
                .map(|b| Signed::<T>::from_bytes(&b))
                .transpose()
                .map_err(|err| s.bad_row(what, err))
        }
        let offer = one::<Offer>(
            self,
            "SELECT envelope FROM lease_offers WHERE lease_id = ?1",
            lid,
            "lease offer",
        )?;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT proposal, acceptance FROM lease_amendments
                 WHERE lease_id = ?1 AND acceptance IS NOT NULL ORDER BY seq",
            )
            .map_err(&e)?;
        let rows = stmt
            .query_map([lid], |r| {
                Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, Vec<u8>>(1)?))
            })
            .map_err(&e)?;
        let mut amendments = Vec::new();
        for row in rows {
            let (p, a) = row.map_err(&e)?;
            amendments.push(SignedAmendment {
                proposal: Signed::from_bytes(&p).map_err(|err| self.bad_row("amendment", err))?,
                acceptance: Signed::from_bytes(&a)
                    .map_err(|err| self.bad_row("amendment acceptance", err))?,
            });
        }
        let mut stmt = self
            .conn
            .prepare("SELECT envelope FROM usage_reports WHERE lease_id = ?1 ORDER BY seq")
            .map_err(&e)?;
        let rows = stmt
            .query_map([lid], |r| r.get::<_, Vec<u8>>(0))
            .map_err(&e)?;
        let mut usage = Vec::new();
        for row in rows {
            let b = row.map_err(&e)?;
            usage.push(Signed::from_bytes(&b).map_err(|err| self.bad_row("usage report", err))?);
        }
        let receipt = one::<PaymentReceipt>(
            self,
            "SELECT envelope FROM receipts WHERE lease_id = ?1 ORDER BY seq DESC LIMIT 1",
            lid,
            "receipt",
        )?;
        let proof = self.proof(id)?;
        let redemption = self.statement_redemption(id)?;
        Ok(Some(Statement {
            redemption,
            proof,
            offer,
            request: l.request,
            accept,
            amendments,
            usage,
            receipt,
        }))
    }

    /// Stores an amendment of lease `id` (persist before act): the renter's signed proposal
    /// (`proposal`, envelope bytes) and, once accepted, the provider's signed acceptance. A
    /// pending row of the same sequence is replaced (a renter re-proposing, or learning of
    /// the acceptance); an accepted one never is. In one statement.
    pub fn put_amendment(
        &mut self,
        id: &LeaseId,
        a: &LeaseAmendment,
        proposal: &[u8],
        acceptance: Option<&[u8]>,
        at: Timestamp,
    ) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT INTO lease_amendments(lease_id, seq, duration_s, max_total, proposal,
                    acceptance, at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT(lease_id, seq) DO UPDATE SET
                    duration_s = excluded.duration_s, max_total = excluded.max_total,
                    proposal = excluded.proposal, acceptance = excluded.acceptance,
                    at = excluded.at
                 WHERE lease_amendments.acceptance IS NULL",
                params![
                    &id.0.0[..],
                    i64_of(a.seq),
                    i64::from(a.duration_s),
                    i64_of(a.max_total),
                    proposal,
                    acceptance,
                    i64_of(at.0)
                ],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// Forgets a renter's pending amendment `seq` of lease `id` (the provider refused it);
    /// an accepted one stays.
    pub fn drop_pending_amendment(&mut self, id: &LeaseId, seq: u64) -> Result<(), StoreError> {
        self.conn
            .execute(
                "DELETE FROM lease_amendments
                 WHERE lease_id = ?1 AND seq = ?2 AND acceptance IS NULL",
                params![&id.0.0[..], i64_of(seq)],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// The last accepted amendment of lease `id`: (seq, duration_s, max_total).
    pub(crate) fn accepted_amendment(
        &self,
        id: &LeaseId,
    ) -> Result<Option<(u64, u32, u64)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT seq, duration_s, max_total FROM lease_amendments
                 WHERE lease_id = ?1 AND acceptance IS NOT NULL ORDER BY seq DESC LIMIT 1",
            )
            .map_err(self.err())?;
        stmt.query_row([&id.0.0[..]], |r| {
            Ok((
                u64_of(r.get(0)?),
                u32::try_from(r.get::<_, i64>(1)?).unwrap_or(u32::MAX),
                u64_of(r.get(2)?),
            ))
        })
        .optional()
        .map_err(self.err())
    }

    /// Total earned (lease revenue credited) and spent (lease spend debited), micro-units: one
    /// aggregate query, for metrics.
    pub fn ledger_totals(&self) -> Result<(u64, u64), StoreError> {
        self.conn
            .query_row(
                "SELECT COALESCE(SUM(CASE WHEN account = ?1 THEN credit - debit END), 0),
                        COALESCE(SUM(CASE WHEN account = ?2 THEN debit - credit END), 0)
                 FROM ledger",
                [ACCOUNT_LEASE_REVENUE, ACCOUNT_LEASE_SPEND],
                |r| Ok((u64_of(r.get(0)?), u64_of(r.get(1)?))),
            )
            .map_err(self.err())
    }

    /// Every ledger row, oldest first.
    pub fn ledger_rows(&self) -> Result<Vec<LedgerRow>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT lease_id, counterparty, account, debit, credit, receipt_seq, at
                 FROM ledger ORDER BY id",
            )
            .map_err(self.err())?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, Vec<u8>>(0)?,
                    r.get::<_, Vec<u8>>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, i64>(4)?,
                    r.get::<_, Option<i64>>(5)?,
                    r.get::<_, i64>(6)?,
                ))
            })
            .map_err(self.err())?;
        let mut out = Vec::new();
        for row in rows {
            let (lid, cp, account, debit, credit, seq, at) = row.map_err(self.err())?;
            let lease_id = <[u8; 32]>::try_from(lid.as_slice())
                .map(|a| LeaseId(gridlease_protocol::Digest(a)))
                .map_err(|_| self.bad_row("ledger lease id", "not 32 bytes"))?;
            let counterparty =
                key_of(&cp).ok_or_else(|| self.bad_row("ledger counterparty", "not 32 bytes"))?;
            out.push(LedgerRow {
                lease_id,
                counterparty,
                account,
                debit: u64_of(debit),
                credit: u64_of(credit),
                receipt_seq: seq.map(u64_of),
                at: Timestamp(u64_of(at)),
            });
        }
        Ok(out)
    }
}
