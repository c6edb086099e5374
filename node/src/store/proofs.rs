//! GPU checks in the store (issue 44, proof of GPU): the record of each lease's check, kept
//! with the lease (`lease_proofs`), read into its statement and counted per provider.

use gridlease_protocol::proof::{ProofRecord, ProofVerdict};
use gridlease_protocol::{LeaseId, PublicKey, Timestamp, WireMessage};
use rusqlite::{OptionalExtension, params};

use super::sql::i64_of;
use super::{Store, StoreError};

/// A provider's checks as this node knows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckCounts {
    /// Checks that passed.
    pub passed: u64,
    /// Checks that failed.
    pub failed: u64,
}

impl Store {
    /// Stores the GPU check of lease `id` (whose provider is `provider`): a record of the
    /// same lease is replaced (a mid-lease re-check), except that a failure is never
    /// replaced (the evidence stays).
    pub fn put_proof(
        &mut self,
        id: &LeaseId,
        provider: &PublicKey,
        record: &ProofRecord,
        at: Timestamp,
    ) -> Result<(), StoreError> {
        let bytes = record
            .to_bytes()
            .map_err(|err| self.bad_row("GPU check", err))?;
        let (passed, backend) = summary(record);
        self.conn
            .execute(
                "INSERT INTO lease_proofs(lease_id, provider, passed, backend, at, record)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT(lease_id) DO UPDATE SET
                    passed = excluded.passed, backend = excluded.backend, at = excluded.at,
                    record = excluded.record
                 WHERE lease_proofs.passed = 1",
                params![
                    &id.0.0[..],
                    &provider.0[..],
                    i64::from(passed),
                    backend,
                    i64_of(at.0),
                    bytes
                ],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// The GPU check of lease `id`, if one ran.
    pub fn proof(&self, id: &LeaseId) -> Result<Option<ProofRecord>, StoreError> {
        let bytes: Option<Vec<u8>> = self
            .conn
            .query_row(
                "SELECT record FROM lease_proofs WHERE lease_id = ?1",
                [&id.0.0[..]],
                |r| r.get(0),
            )
            .optional()
            .map_err(self.err())?;
        bytes
            .map(|b| ProofRecord::from_bytes(&b))
            .transpose()
            .map_err(|err| self.bad_row("GPU check", err))
    }

    /// The GPU checks of `provider`'s leases this node kept, passed and failed.
    pub fn proof_counts(&self, provider: &PublicKey) -> Result<CheckCounts, StoreError> {
        self.conn
            .query_row(
                "SELECT COALESCE(SUM(passed), 0), COALESCE(SUM(1 - passed), 0)
                 FROM lease_proofs WHERE provider = ?1",
                [&provider.0[..]],
                |r| {
                    Ok(CheckCounts {
                        passed: u64::try_from(r.get::<_, i64>(0)?).unwrap_or(0),
                        failed: u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0),
                    })
                },
            )
            .map_err(self.err())
    }
}

/// A record's verdict and backend, as the table's columns hold them.
fn summary(r: &ProofRecord) -> (bool, &'static str) {
    let report =
        gridlease_protocol::proof::ProofReport::decode_payload(&r.report.envelope().payload);
    let challenge =
        gridlease_protocol::proof::ProofChallenge::decode_payload(&r.challenge.envelope().payload);
    let passed = report.is_ok_and(|rep| rep.verdict == ProofVerdict::Passed);
    let backend = challenge.map_or("unknown", |c| c.backend.as_str());
    (passed, backend)
}
