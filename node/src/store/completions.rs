//! Co-signed lease completions in the store (issue 16, reputation): this node's own and those
//! other nodes gossip, each verified before it is stored; bounded per provider and in all.

use gridlease_protocol::completion::CompletionOutcome;
use gridlease_protocol::{LeaseId, Timestamp};
use rusqlite::params;

use super::sql::{classify, i64_of};
use super::{Store, StoreError};

/// Most completions kept per provider and class: its newest completed ones, and apart its
/// newest others (failed, disputed); older ones are forgotten.
pub const COMPLETIONS_PER_PROVIDER: usize = 256;
/// Most completions kept in all; the oldest (by close time) are forgotten.
pub const COMPLETIONS_KEPT: usize = 100_000;

/// One stored completion: its fields and the co-signed record.
#[derive(Clone, Debug)]
pub struct StoredCompletion {
    /// The verified record.
    pub completion: gridlease_protocol::completion::Completion,
    /// The co-signed pair, encoded.
    pub record: Vec<u8>,
}
impl Store {
    /// Stores a co-signed completion the caller verified; `false` if its lease had one
    /// already. Keeps at most [`COMPLETIONS_PER_PROVIDER`] per provider and class and
    /// [`COMPLETIONS_KEPT`] in all (ordered by close time, then lease, as the network loop).
    pub fn put_completion(
        &mut self,
        c: &gridlease_protocol::completion::Completion,
        record: &[u8],
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let e = |source| classify(&self.path, source);
        let tx = self.conn.transaction().map_err(e)?;
        let n = tx
            .execute(
                "INSERT OR IGNORE INTO completions
                   (lease_id, provider, renter, paid, outcome, closed_at, received_at, record)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    &c.lease_id.0.0[..],
                    &c.provider.0[..],
                    &c.renter.0[..],
                    i64_of(c.paid),
                    c.outcome.name(),
                    i64_of(c.closed_at.0),
                    i64_of(now.0),
                    record,
                ],
            )
            .map_err(e)?;
        if n > 0 {
            // Per provider and class (completed, or not), as the network loop keeps them:
            // completed records never push a provider's failures out.
            let completed = i64::from(c.outcome == CompletionOutcome::Completed);
            tx.execute(
                "DELETE FROM completions WHERE provider = ?1 AND (outcome = 'completed') = ?3
                   AND lease_id NOT IN
                   (SELECT lease_id FROM completions
                    WHERE provider = ?1 AND (outcome = 'completed') = ?3
                    ORDER BY closed_at DESC, lease_id DESC LIMIT ?2)",
                params![
                    &c.provider.0[..],
                    COMPLETIONS_PER_PROVIDER as i64,
                    completed
                ],
            )
            .map_err(e)?;
            tx.execute(
                "DELETE FROM completions WHERE lease_id NOT IN
                   (SELECT lease_id FROM completions
                    ORDER BY closed_at DESC, lease_id DESC LIMIT ?1)",
                params![COMPLETIONS_KEPT as i64],
            )
            .map_err(e)?;
        }
        tx.commit().map_err(e)?;
        Ok(n > 0)
    }

    /// Whether the completion record of `lease` is held.
    pub fn has_completion(&self, lease: &LeaseId) -> Result<bool, StoreError> {
        let n: i64 = self
            .conn
            .query_row(
                "SELECT count(*) FROM completions WHERE lease_id = ?1",
                [&lease.0.0[..]],
                |r| r.get(0),
            )
            .map_err(self.err())?;
        Ok(n > 0)
    }

    /// Stored completions: of `provider` only (newest first, at most `limit`), or all.
    pub fn completions(
        &self,
        provider: Option<&gridlease_protocol::PublicKey>,
        limit: usize,
    ) -> Result<Vec<StoredCompletion>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut stmt = self
            .conn
            .prepare(
                "SELECT record FROM completions WHERE ?1 IS NULL OR provider = ?1
                 ORDER BY closed_at DESC, lease_id LIMIT ?2",
            )
            .map_err(self.err())?;
        let key = provider.map(|k| k.0.to_vec());
        let rows = stmt
            .query_map(params![key, limit], |r| r.get::<_, Vec<u8>>(0))
            .map_err(self.err())?;
        let mut out = Vec::new();
        for row in rows {
            let record = row.map_err(self.err())?;
            // Verified before it was stored; a row that no longer decodes is skipped.
            let Ok(completion) = gridlease_protocol::completion::CoSigned::from_bytes(&record)
                .and_then(|pair| pair.record_unchecked())
            else {
                continue;
            };
            out.push(StoredCompletion { completion, record });
        }
        Ok(out)
    }
}
