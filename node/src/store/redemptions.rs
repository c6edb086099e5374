//! On-chain redemptions in the store (issue 50): each settled provider lease is looked at
//! once; one that settles on chain is kept with its last voucher and claim until the channel
//! contract paid it (`crate::settlement`), so a provider killed before redeeming redeems after
//! its restart.

use gridlease_protocol::LeaseId;
use rusqlite::{OptionalExtension, params};

use super::sql::{i64_of, u64_of};
use super::{Store, StoreError};

/// Where a lease's redemption stands.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum RedemptionState {
    /// The lease settles in GLU only: nothing to redeem.
    Glu,
    /// Waiting for the next redeem (or retrying one that failed for a passing reason).
    Pending,
    /// The contract paid it.
    Redeemed,
    /// The contract refuses it for good (the reason is kept).
    Failed,
}

impl RedemptionState {
    fn as_str(self) -> &'static str {
        match self {
            Self::Glu => "glu",
            Self::Pending => "pending",
            Self::Redeemed => "redeemed",
            Self::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "glu" => Self::Glu,
            "pending" => Self::Pending,
            "redeemed" => Self::Redeemed,
            "failed" => Self::Failed,
            _ => return None,
        })
    }
}

/// A voucher to redeem, as queued.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queued {
    /// The lease (its lane).
    pub lease_id: LeaseId,
    /// The chain.
    pub chain_id: u64,
    /// The channel contract.
    pub contract: [u8; 20],
    /// The renter's wallet.
    pub renter: [u8; 20],
    /// The channel's epoch the voucher is for.
    pub epoch: u64,
    /// The cumulative amount signed.
    pub amount: u128,
    /// What the provider claims of it.
    pub claim: u128,
    /// The renter's signature.
    pub signature: Vec<u8>,
}

/// A lease's redemption as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redemption {
    /// The lease.
    pub lease_id: LeaseId,
    /// Its state.
    pub state: RedemptionState,
    /// Redeems tried.
    pub attempts: u64,
    /// The transaction that paid it.
    pub tx: Option<String>,
    /// Its block.
    pub block: Option<u64>,
    /// What the chain says the lane was paid in all.
    pub paid: Option<u128>,
    /// The last error (a failed redeem's reason).
    pub error: Option<String>,
    /// When this row last changed (Unix seconds).
    pub updated_at: u64,
}

fn amount_of(text: Option<String>) -> Option<u128> {
    text.and_then(|t| t.parse().ok())
}

impl Store {
    /// Settled provider leases not looked at yet, oldest first, at most `limit`.
    pub fn unqueued_settled(&self, limit: usize) -> Result<Vec<LeaseId>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT l.lease_id FROM leases l
                 WHERE l.role = 'provider' AND l.state = 'settled'
                   AND NOT EXISTS (SELECT 1 FROM redemptions r WHERE r.lease_id = l.lease_id)
                 ORDER BY l.created_at LIMIT ?1",
            )
            .map_err(self.err())?;
        let rows = stmt
            .query_map([i64_of(limit as u64)], |r| r.get::<_, Vec<u8>>(0))
            .map_err(self.err())?;
        let mut out = Vec::new();
        for row in rows {
            let bytes = row.map_err(self.err())?;
            let id: [u8; 32] = bytes
                .try_into()
                .map_err(|_| self.bad_row("redemption", "a lease id is not 32 bytes"))?;
            out.push(LeaseId(gridlease_protocol::Digest(id)));
        }
        Ok(out)
    }

    /// Marks lease `id` as settled in GLU only (nothing to redeem).
    pub fn mark_glu(&mut self, id: &LeaseId, at: u64) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT OR IGNORE INTO redemptions(lease_id, state, updated_at) VALUES (?1, 'glu', ?2)",
                params![&id.0.0[..], i64_of(at)],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// Queues a voucher to redeem (once per lease: a second call changes nothing).
    pub fn queue_redemption(&mut self, q: &Queued, at: u64) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT OR IGNORE INTO redemptions(lease_id, state, chain_id, contract, renter, epoch,
                    amount, claim, signature, updated_at)
                 VALUES (?1, 'pending', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    &q.lease_id.0.0[..],
                    i64_of(q.chain_id),
                    &q.contract[..],
                    &q.renter[..],
                    i64_of(q.epoch),
                    q.amount.to_string(),
                    q.claim.to_string(),
                    &q.signature[..],
                    i64_of(at)
                ],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// Pending vouchers on `chain_id`'s `contract`, oldest first, at most `limit`.
    pub fn pending_redemptions(
        &self,
        chain_id: u64,
        contract: [u8; 20],
        limit: usize,
    ) -> Result<Vec<Queued>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT lease_id, renter, epoch, amount, claim, signature FROM redemptions
                 WHERE state = 'pending' AND chain_id = ?1 AND contract = ?2
                 ORDER BY updated_at, lease_id LIMIT ?3",
            )
            .map_err(self.err())?;
        let rows = stmt
            .query_map(
                params![i64_of(chain_id), &contract[..], i64_of(limit as u64)],
                |r| {
                    Ok((
                        r.get::<_, Vec<u8>>(0)?,
                        r.get::<_, Vec<u8>>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, String>(4)?,
                        r.get::<_, Vec<u8>>(5)?,
                    ))
                },
            )
            .map_err(self.err())?;
        let mut out = Vec::new();
        for row in rows {
            let (id, renter, epoch, amount, claim, signature) = row.map_err(self.err())?;
            let bad = |what: &str| self.bad_row("redemption", what);
            out.push(Queued {
                lease_id: LeaseId(gridlease_protocol::Digest(
                    id.try_into()
                        .map_err(|_| bad("a lease id is not 32 bytes"))?,
                )),
                chain_id,
                contract,
                renter: renter
                    .try_into()
                    .map_err(|_| bad("a wallet is not 20 bytes"))?,
                epoch: u64_of(epoch),
                amount: amount
                    .parse()
                    .map_err(|_| bad("an amount is not a number"))?,
                claim: claim.parse().map_err(|_| bad("a claim is not a number"))?,
                signature,
            });
        }
        Ok(out)
    }

    /// Records that the contract paid lease `id`'s lane `paid` in all, by `tx` in `block`
    /// (none: paid before, by a transaction this node did not see confirmed).
    pub fn mark_redeemed(
        &mut self,
        id: &LeaseId,
        tx: Option<&str>,
        block: u64,
        paid: u128,
        at: u64,
    ) -> Result<(), StoreError> {
        self.conn
            .execute(
                "UPDATE redemptions SET state = 'redeemed', tx = ?2, block = ?3, paid = ?4,
                    attempts = attempts + 1, error = NULL, updated_at = ?5
                 WHERE lease_id = ?1",
                params![
                    &id.0.0[..],
                    tx,
                    tx.map(|_| i64_of(block)),
                    paid.to_string(),
                    i64_of(at)
                ],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// Records a redeem of lease `id` that failed: `permanent` marks it failed for good,
    /// otherwise it stays pending (tried again later, after the others).
    pub fn mark_redeem_error(
        &mut self,
        id: &LeaseId,
        error: &str,
        permanent: bool,
        at: u64,
    ) -> Result<(), StoreError> {
        let state = if permanent {
            RedemptionState::Failed
        } else {
            RedemptionState::Pending
        };
        let error: String = error.chars().take(500).collect();
        self.conn
            .execute(
                "UPDATE redemptions SET state = ?2, error = ?3, attempts = attempts + 1,
                    updated_at = ?4
                 WHERE lease_id = ?1 AND state = 'pending'",
                params![&id.0.0[..], state.as_str(), error, i64_of(at)],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// Lease `id`'s redemption, if it was looked at.
    pub fn redemption(&self, id: &LeaseId) -> Result<Option<Redemption>, StoreError> {
        let row = self
            .conn
            .query_row(
                "SELECT state, attempts, tx, block, paid, error, updated_at FROM redemptions
                 WHERE lease_id = ?1",
                [&id.0.0[..]],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, Option<String>>(2)?,
                        r.get::<_, Option<i64>>(3)?,
                        r.get::<_, Option<String>>(4)?,
                        r.get::<_, Option<String>>(5)?,
                        r.get::<_, i64>(6)?,
                    ))
                },
            )
            .optional()
            .map_err(self.err())?;
        row.map(|(state, attempts, tx, block, paid, error, at)| {
            Ok(Redemption {
                lease_id: *id,
                state: RedemptionState::parse(&state)
                    .ok_or_else(|| self.bad_row("redemption", "an unknown state"))?,
                attempts: u64_of(attempts),
                tx,
                block: block.map(u64_of),
                paid: amount_of(paid),
                error,
                updated_at: u64_of(at),
            })
        })
        .transpose()
    }

    /// Lease `id`'s redemption as its statement carries it: only once redeemed.
    pub fn statement_redemption(
        &self,
        id: &LeaseId,
    ) -> Result<Option<gridlease_protocol::statement::Redemption>, StoreError> {
        let chain: Option<Option<i64>> = self
            .conn
            .query_row(
                "SELECT chain_id FROM redemptions WHERE lease_id = ?1 AND state = 'redeemed'",
                [&id.0.0[..]],
                |r| r.get(0),
            )
            .optional()
            .map_err(self.err())?;
        let (Some(Some(chain_id)), Some(r)) = (chain, self.redemption(id)?) else {
            return Ok(None);
        };
        let tx = match r.tx.as_deref() {
            None => None,
            Some(t) => {
                let bytes = hex::decode(t.trim_start_matches("0x"))
                    .ok()
                    .and_then(|b| <[u8; 32]>::try_from(b).ok())
                    .ok_or_else(|| {
                        self.bad_row("redemption", "a transaction hash is not 32 bytes")
                    })?;
                Some(bytes)
            }
        };
        Ok(Some(gridlease_protocol::statement::Redemption {
            chain_id: u64_of(chain_id),
            tx,
            block: r.block.unwrap_or(0),
            paid: r.paid.unwrap_or(0),
        }))
    }

    /// How many redemptions are in each state: (pending, redeemed, failed).
    pub fn redemption_counts(&self) -> Result<(u64, u64, u64), StoreError> {
        let count = |state: &str| -> Result<u64, StoreError> {
            self.conn
                .query_row(
                    "SELECT count(*) FROM redemptions WHERE state = ?1",
                    [state],
                    |r| r.get::<_, i64>(0),
                )
                .map(u64_of)
                .map_err(self.err())
        };
        Ok((count("pending")?, count("redeemed")?, count("failed")?))
    }
}
