//! Leases in the store: storing a lease with its GPUs and history, and reading leases back
//! (one, all, the live ones) with their current terms. Sessions, receipts and the ledger are
//! in [`super::lease`].

use gridlease_contracts::{Lease, LeaseState};
use gridlease_protocol::{Digest, LeaseAccept, LeaseId, LeaseRequest, Signed, Timestamp};
use rusqlite::{OptionalExtension, params};

use super::lease::SessionRecord;
use super::sql::{actor_str, classify, event_str, i64_of, u64_of};
use super::{Role, Store, StoreError, StoredLease};

impl Store {
    /// Stores a new lease with its GPUs and its history so far, in one transaction: `true`.
    /// Storing the identical lease again is a no-op: `false`. Another lease with the same
    /// (role, renter, nonce) is [`StoreError::NonceConflict`].
    pub fn insert_lease(&mut self, l: &StoredLease) -> Result<bool, StoreError> {
        let path = self.path.clone();
        let e = |source| classify(&path, source);
        let id = &l.lease.id.0.0[..];
        let request = l
            .request
            .to_bytes()
            .map_err(|err| self.bad_row("request", err))?;
        let accept = l
            .accept
            .as_ref()
            .map(|a| a.to_bytes())
            .transpose()
            .map_err(|err| self.bad_row("accept", err))?;
        let t = &l.lease.terms;
        let tx = self.conn.transaction().map_err(e)?;
        let existing: Option<Vec<u8>> = tx
            .query_row(
                "SELECT lease_id FROM leases WHERE role = ?1 AND renter = ?2 AND nonce = ?3",
                params![l.role.as_str(), &t.renter.0[..], i64_of(t.nonce)],
                |r| r.get(0),
            )
            .optional()
            .map_err(e)?;
        match existing {
            Some(other) if other == id => return Ok(false),
            Some(_) => {
                return Err(StoreError::NonceConflict {
                    lease_id: l.lease.id,
                });
            }
            None => {}
        }
        tx.execute(
            "INSERT INTO leases(lease_id, role, provider, renter, nonce, offer_id, gpu_count,
                duration_s, request, accept, state, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            params![
                id,
                l.role.as_str(),
                &t.provider.0[..],
                &t.renter.0[..],
                i64_of(t.nonce),
                &t.offer_id.0.0[..],
                i64::from(t.gpu_count),
                i64::from(t.duration_s),
                request,
                accept,
                l.lease.state.as_str(),
                i64_of(l.created_at.0),
            ],
        )
        .map_err(e)?;
        for g in &l.gpus {
            tx.execute(
                "INSERT INTO lease_gpus(lease_id, uuid_digest) VALUES (?1, ?2)",
                params![id, &g.0[..]],
            )
            .map_err(e)?;
        }
        for (seq, h) in l.lease.history.iter().enumerate() {
            tx.execute(
                "INSERT INTO lease_history(lease_id, seq, at, actor, event, to_state)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    id,
                    i64::try_from(seq).unwrap_or(i64::MAX),
                    i64_of(h.at.0),
                    actor_str(h.actor),
                    event_str(&h.event),
                    h.to.as_str()
                ],
            )
            .map_err(e)?;
        }
        tx.commit().map_err(e)?;
        Ok(true)
    }

    /// Every stored lease in `role` (all roles with `None`), oldest first.
    pub fn leases(&self, role: Option<Role>) -> Result<Vec<StoredLease>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT lease_id, role, request, accept, state, created_at FROM leases
                 WHERE ?1 IS NULL OR role = ?1 ORDER BY created_at, lease_id",
            )
            .map_err(self.err())?;
        let rows = stmt
            .query_map([role.map(Role::as_str)], lease_row)
            .map_err(self.err())?;
        let mut out = Vec::new();
        for row in rows {
            let (id, role, request, accept, state, created_at) = row.map_err(self.err())?;
            out.push(self.decode_lease(id, &role, &request, accept, &state, created_at)?);
        }
        Ok(out)
    }

    /// Every lease not in a terminal state, with its session record, oldest first (what a
    /// restarted node resumes). One call however many leases ever settled before.
    pub fn live_leases(&self) -> Result<Vec<(StoredLease, SessionRecord)>, StoreError> {
        // Fixed state names, never input.
        let terminal: Vec<String> = LeaseState::ALL
            .iter()
            .filter(|s| s.is_terminal())
            .map(|s| format!("'{}'", s.as_str()))
            .collect();
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT lease_id, role, request, accept, state, created_at FROM leases
                 WHERE state NOT IN ({}) ORDER BY created_at, lease_id",
                terminal.join(", ")
            ))
            .map_err(self.err())?;
        let rows = stmt.query_map([], lease_row).map_err(self.err())?;
        let mut out = Vec::new();
        for row in rows {
            let (id, role, request, accept, state, created_at) = row.map_err(self.err())?;
            let l = self.decode_lease(id, &role, &request, accept, &state, created_at)?;
            let rec = self.session_record(&l.lease.id)?;
            out.push((l, rec));
        }
        Ok(out)
    }

    /// Every lease with its session record, oldest first: one store call for a whole
    /// `leases` listing or metrics scrape.
    pub fn leases_with_records(&self) -> Result<Vec<(StoredLease, SessionRecord)>, StoreError> {
        self.leases(None)?
            .into_iter()
            .map(|l| {
                let rec = self.session_record(&l.lease.id)?;
                Ok((l, rec))
            })
            .collect()
    }

    /// One lease by id.
    pub fn lease(&self, id: &LeaseId) -> Result<Option<StoredLease>, StoreError> {
        let row = self
            .conn
            .query_row(
                "SELECT lease_id, role, request, accept, state, created_at FROM leases
                 WHERE lease_id = ?1",
                [&id.0.0[..]],
                lease_row,
            )
            .optional()
            .map_err(self.err())?;
        row.map(|(id, role, request, accept, state, created_at)| {
            self.decode_lease(id, &role, &request, accept, &state, created_at)
        })
        .transpose()
    }

    fn decode_lease(
        &self,
        id: Vec<u8>,
        role: &str,
        request: &[u8],
        accept: Option<Vec<u8>>,
        state: &str,
        created_at: i64,
    ) -> Result<StoredLease, StoreError> {
        let id_arr: [u8; 32] = id
            .as_slice()
            .try_into()
            .map_err(|_| self.bad_row("lease id", "not 32 bytes"))?;
        let lease_id = LeaseId(Digest(id_arr));
        let role = Role::parse(role).ok_or_else(|| self.bad_row("lease role", role))?;
        let request = Signed::<LeaseRequest>::from_bytes(request)
            .map_err(|err| self.bad_row("request", err))?;
        let accept = accept
            .map(|a| Signed::<LeaseAccept>::from_bytes(&a))
            .transpose()
            .map_err(|err| self.bad_row("accept", err))?;
        // The request was verified before it was stored; decode its payload for the terms.
        let terms = gridlease_protocol::WireMessage::decode_payload(&request.envelope().payload)
            .map(|r: LeaseRequest| r.terms)
            .map_err(|err| self.bad_row("request payload", err))?;
        let mut lease = Lease::propose(lease_id, terms);
        // The current duration and budget cap: the last accepted amendment's.
        if let Some((seq, duration_s, max_total)) = self.accepted_amendment(&lease_id)? {
            lease.terms.duration_s = duration_s;
            lease.terms.max_total = max_total;
            lease.extensions = seq;
        }
        lease.state = state
            .parse::<LeaseState>()
            .map_err(|_| self.bad_row("lease state", state))?;
        let mut gpus = Vec::new();
        {
            let mut stmt = self
                .conn
                .prepare_cached(
                    "SELECT uuid_digest FROM lease_gpus WHERE lease_id = ?1 ORDER BY uuid_digest",
                )
                .map_err(self.err())?;
            let rows = stmt
                .query_map([&id_arr[..]], |r| r.get::<_, Vec<u8>>(0))
                .map_err(self.err())?;
            for row in rows {
                let b = row.map_err(self.err())?;
                let arr: [u8; 32] = b
                    .as_slice()
                    .try_into()
                    .map_err(|_| self.bad_row("gpu digest", "not 32 bytes"))?;
                gpus.push(Digest(arr));
            }
        }
        Ok(StoredLease {
            role,
            lease,
            request,
            accept,
            gpus,
            created_at: Timestamp(u64_of(created_at)),
        })
    }

    /// Number of rows in the lease state history of `id`.
    pub fn history_len(&self, id: &LeaseId) -> Result<u64, StoreError> {
        let n: i64 = self
            .conn
            .query_row(
                "SELECT count(*) FROM lease_history WHERE lease_id = ?1",
                [&id.0.0[..]],
                |r| r.get(0),
            )
            .map_err(self.err())?;
        Ok(u64_of(n))
    }
}
/// The columns `lease_id, role, request, accept, state, created_at` of a `leases` row, as
/// [`Store::decode_lease`] takes them.
type LeaseRow = (Vec<u8>, String, Vec<u8>, Option<Vec<u8>>, String, i64);

fn lease_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<LeaseRow> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
    ))
}
