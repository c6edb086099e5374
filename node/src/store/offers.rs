//! Offers in the store: the book's offers other providers advertise, and this node's own.

use gridlease_protocol::{Offer, OfferId, Signed, Timestamp};
use rusqlite::{OptionalExtension, params};

use super::sql::{classify, i64_of, u64_of};
use super::{Store, StoreError, StoredOffer};

impl Store {
    /// Upserts offers held in the book (one row per provider) and deletes the expired ones, in
    /// one transaction.
    pub fn put_offers(
        &mut self,
        offers: &[(OfferId, Signed<Offer>, Offer, Timestamp)],
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let path = self.path.clone();
        let e = |source| classify(&path, source);
        let tx = self.conn.transaction().map_err(e)?;
        {
            let mut stmt = tx
                .prepare_cached(
                    "INSERT INTO offers(provider, offer_id, seq, expires_at, received_at, envelope)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                     ON CONFLICT(provider) DO UPDATE SET offer_id = excluded.offer_id,
                        seq = excluded.seq, expires_at = excluded.expires_at,
                        received_at = excluded.received_at, envelope = excluded.envelope
                     WHERE excluded.seq >= offers.seq",
                )
                .map_err(e)?;
            for (id, signed, offer, received_at) in offers {
                let bytes = signed.to_bytes().map_err(|err| StoreError::BadRow {
                    path: path.clone(),
                    what: "offer",
                    detail: err.to_string(),
                })?;
                // Another provider's older offer may hold this id only if contents collide,
                // which a content hash rules out; drop a stale row with the same id first.
                tx.execute(
                    "DELETE FROM offers WHERE offer_id = ?1 AND provider != ?2",
                    params![&id.0.0[..], &offer.provider.0[..]],
                )
                .map_err(e)?;
                stmt.execute(params![
                    &offer.provider.0[..],
                    &id.0.0[..],
                    i64_of(offer.seq),
                    i64_of(offer.expires_at.0),
                    i64_of(received_at.0),
                    bytes
                ])
                .map_err(e)?;
            }
        }
        tx.execute("DELETE FROM offers WHERE expires_at <= ?1", [i64_of(now.0)])
            .map_err(e)?;
        tx.commit().map_err(e)
    }

    /// Offers not expired at `now`, as received.
    pub fn live_offers(&self, now: Timestamp) -> Result<Vec<StoredOffer>, StoreError> {
        let mut out = Vec::new();
        let mut after = None;
        loop {
            let (page, next) = self.live_offers_page(now, after.as_ref(), 4096)?;
            out.extend(page);
            match next {
                Some(n) => after = Some(n),
                None => return Ok(out),
            }
        }
    }

    /// How many stored offers are not expired at `now`.
    pub fn count_live_offers(&self, now: Timestamp) -> Result<u64, StoreError> {
        self.conn
            .query_row(
                "SELECT count(*) FROM offers WHERE expires_at > ?1",
                [i64_of(now.0)],
                |r| r.get::<_, i64>(0),
            )
            .map(u64_of)
            .map_err(self.err())
    }

    /// At most `limit` offers not expired at `now` whose provider key sorts after `after`, in
    /// provider-key order, as received; and the key to pass as `after` for the next page when
    /// the page is full (the primary key's index: each page costs its own rows, not the rows
    /// before it).
    pub fn live_offers_page(
        &self,
        now: Timestamp,
        after: Option<&[u8; 32]>,
        limit: usize,
    ) -> Result<(Vec<StoredOffer>, Option<[u8; 32]>), StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT provider, envelope, received_at FROM offers \
                 WHERE expires_at > ?1 AND provider > ?2 ORDER BY provider LIMIT ?3",
            )
            .map_err(self.err())?;
        // Every provider key is 32 bytes, so the empty blob sorts before all of them.
        let after: &[u8] = after.map_or(&[], |a| &a[..]);
        let rows = stmt
            .query_map(
                params![
                    i64_of(now.0),
                    after,
                    i64::try_from(limit).unwrap_or(i64::MAX)
                ],
                |r| {
                    Ok((
                        r.get::<_, Vec<u8>>(0)?,
                        r.get::<_, Vec<u8>>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                },
            )
            .map_err(self.err())?;
        let mut out = Vec::new();
        let mut last = None;
        for row in rows {
            let (provider, bytes, received_at) = row.map_err(self.err())?;
            let signed =
                Signed::<Offer>::from_bytes(&bytes).map_err(|err| self.bad_row("offer", err))?;
            last = Some(
                <[u8; 32]>::try_from(provider.as_slice())
                    .map_err(|_| self.bad_row("offer", "a provider key that is not 32 bytes"))?,
            );
            out.push(StoredOffer {
                signed,
                received_at: Timestamp(u64_of(received_at)),
            });
        }
        let next = if out.len() == limit { last } else { None };
        Ok((out, next))
    }

    /// Records this node's own newest offer (its sequence must never go backwards).
    pub fn put_own_offer(
        &mut self,
        id: OfferId,
        signed: &Signed<Offer>,
        seq: u64,
    ) -> Result<(), StoreError> {
        let bytes = signed
            .to_bytes()
            .map_err(|err| self.bad_row("own offer", err))?;
        self.conn
            .execute(
                "INSERT INTO own_offer(id, seq, offer_id, envelope) VALUES (1, ?1, ?2, ?3)
                 ON CONFLICT(id) DO UPDATE SET seq = excluded.seq, offer_id = excluded.offer_id,
                    envelope = excluded.envelope WHERE excluded.seq > own_offer.seq",
                params![i64_of(seq), &id.0.0[..], bytes],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// Records that the own offer was withdrawn with sequence `seq` (the withdrawal itself is
    /// not kept: [`Store::own_offer`] then reports the stored offer as superseded).
    pub fn put_own_withdrawal(&mut self, seq: u64) -> Result<(), StoreError> {
        self.conn
            .execute(
                "UPDATE own_offer SET seq = ?1 WHERE id = 1 AND seq < ?1",
                params![i64_of(seq)],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// This node's own newest offer and the highest sequence used (above the offer's own when
    /// the offer was withdrawn since).
    pub fn own_offer(&self) -> Result<Option<(Signed<Offer>, u64)>, StoreError> {
        let row: Option<(Vec<u8>, i64)> = self
            .conn
            .query_row(
                "SELECT envelope, seq FROM own_offer WHERE id = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(self.err())?;
        row.map(|(b, seq)| {
            let signed =
                Signed::<Offer>::from_bytes(&b).map_err(|err| self.bad_row("own offer", err))?;
            let seq = u64::try_from(seq).map_err(|err| self.bad_row("own offer", err))?;
            Ok((signed, seq))
        })
        .transpose()
    }
}
