//! Peers in the store: the addresses of the most recently seen peers, bounded.

use gridlease_protocol::Timestamp;
use rusqlite::params;

use super::sql::i64_of;
use super::{Store, StoreError};

/// Peers remembered (most recently seen first); older ones are forgotten when more are seen.
pub const PEERS_KEPT: usize = 1024;
impl Store {
    /// Records a peer's addresses.
    pub fn put_peer(
        &mut self,
        peer_id: &str,
        addrs: &[String],
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT INTO peers(peer_id, addrs, last_seen) VALUES (?1, ?2, ?3)
                 ON CONFLICT(peer_id) DO UPDATE SET addrs = excluded.addrs,
                    last_seen = excluded.last_seen",
                params![peer_id, addrs.join(" "), i64_of(now.0)],
            )
            .map_err(self.err())?;
        // Keep the PEERS_KEPT most recently seen (index range scans, no table scan).
        self.conn
            .execute(
                "DELETE FROM peers WHERE last_seen < (
                    SELECT last_seen FROM peers ORDER BY last_seen DESC LIMIT 1 OFFSET ?1)",
                [i64::try_from(PEERS_KEPT.saturating_sub(1)).unwrap_or(i64::MAX)],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// Known peers, most recently seen first, at most `limit`.
    pub fn peers(&self, limit: usize) -> Result<Vec<(String, Vec<String>)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT peer_id, addrs FROM peers ORDER BY last_seen DESC LIMIT ?1")
            .map_err(self.err())?;
        let rows = stmt
            .query_map([i64::try_from(limit).unwrap_or(i64::MAX)], |r| {
                let addrs: String = r.get(1)?;
                Ok((
                    r.get::<_, String>(0)?,
                    addrs.split_whitespace().map(str::to_string).collect(),
                ))
            })
            .map_err(self.err())?;
        rows.collect::<Result<_, _>>().map_err(self.err())
    }
}
