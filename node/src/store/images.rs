//! Pulled images in the store: the images this provider pulled for leases, its bounded cache.

use gridlease_protocol::Timestamp;
use rusqlite::params;

use super::sql::{i64_of, u64_of};
use super::{Store, StoreError};

impl Store {
    /// Records that a lease started with the pulled image `reference` at `now` (`bytes`: its
    /// unpacked size; `None` keeps the stored one, for an image pulled before).
    pub fn touch_pulled_image(
        &mut self,
        reference: &str,
        bytes: Option<u64>,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let now = i64_of(now.0);
        let done = match bytes {
            Some(b) => self.conn.execute(
                "INSERT INTO pulled_images(reference, last_used, bytes) VALUES (?1, ?2, ?3)
                 ON CONFLICT(reference) DO UPDATE SET last_used = excluded.last_used,
                    bytes = excluded.bytes",
                params![reference, now, i64_of(b)],
            ),
            None => self.conn.execute(
                "UPDATE pulled_images SET last_used = ?2 WHERE reference = ?1",
                params![reference, now],
            ),
        };
        done.map_err(self.err())?;
        Ok(())
    }

    /// The pulled images: (reference, last used, bytes), most recently used first.
    pub fn pulled_images(&self) -> Result<Vec<(String, Timestamp, u64)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT reference, last_used, bytes FROM pulled_images ORDER BY last_used DESC",
            )
            .map_err(self.err())?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    Timestamp(u64_of(r.get(1)?)),
                    u64_of(r.get(2)?),
                ))
            })
            .map_err(self.err())?;
        rows.collect::<Result<_, _>>().map_err(self.err())
    }

    /// Forgets a pulled image (it was removed from the daemon).
    pub fn forget_pulled_image(&mut self, reference: &str) -> Result<(), StoreError> {
        self.conn
            .execute(
                "DELETE FROM pulled_images WHERE reference = ?1",
                [reference],
            )
            .map_err(self.err())?;
        Ok(())
    }
}
