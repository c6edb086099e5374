//! The node's SQLite database (`gridlease.db` in the home directory).
//!
//! - WAL journal, `synchronous=FULL` (leases and receipts must survive power loss once
//!   acknowledged), foreign keys on, a busy timeout.
//! - Schema migrations keyed by `PRAGMA user_version`; the file is tagged with
//!   `PRAGMA application_id`. A database from a newer gridlease, a foreign database or a
//!   corrupted file is an error that names the file; the store never resets anything by itself.
//! - Every multi-row change runs in one transaction.
//!
//! [`Store`] is synchronous. Async code talks to it through [`StoreHandle`], which runs the store
//! on its own thread behind a bounded queue, so SQLite never blocks the network event loop.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;

use gridlease_contracts::{Actor, Lease, LeaseEvent, LeaseState};
use gridlease_protocol::completion::CompletionOutcome;
use gridlease_protocol::{
    Digest, LeaseAccept, LeaseId, LeaseRequest, Offer, OfferId, Signed, Timestamp,
};
use rusqlite::{Connection, OptionalExtension, params};

use crate::store::lease::SessionRecord;
use tokio::sync::oneshot;

pub mod lease;

/// `PRAGMA application_id` of a gridlease database ("grls").
pub const APPLICATION_ID: i32 = 0x6772_6c73;

/// Migrations, in order; `user_version` is the number applied.
const MIGRATIONS: &[&str] = &[
    // 1: initial schema.
    r#"
    CREATE TABLE meta (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    ) STRICT;

    -- Offers held in the book (one per provider), exactly as received.
    CREATE TABLE offers (
        provider    BLOB PRIMARY KEY,
        offer_id    BLOB NOT NULL UNIQUE,
        seq         INTEGER NOT NULL,
        expires_at  INTEGER NOT NULL,
        received_at INTEGER NOT NULL,
        envelope    BLOB NOT NULL
    ) STRICT;
    CREATE INDEX offers_expiry ON offers(expires_at);

    -- This node's own offers as a provider: the sequence must never go backwards.
    CREATE TABLE own_offer (
        id        INTEGER PRIMARY KEY CHECK (id = 1),
        seq       INTEGER NOT NULL,
        offer_id  BLOB NOT NULL,
        envelope  BLOB NOT NULL
    ) STRICT;

    CREATE TABLE peers (
        peer_id   TEXT PRIMARY KEY,
        addrs     TEXT NOT NULL,
        last_seen INTEGER NOT NULL
    ) STRICT;

    CREATE TABLE leases (
        lease_id   BLOB PRIMARY KEY,
        role       TEXT NOT NULL CHECK (role IN ('provider', 'renter')),
        provider   BLOB NOT NULL,
        renter     BLOB NOT NULL,
        nonce      INTEGER NOT NULL,
        offer_id   BLOB NOT NULL,
        gpu_count  INTEGER NOT NULL,
        duration_s INTEGER NOT NULL,
        request    BLOB NOT NULL,
        accept     BLOB,
        state      TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        UNIQUE (role, renter, nonce)
    ) STRICT;

    CREATE TABLE lease_gpus (
        lease_id    BLOB NOT NULL REFERENCES leases(lease_id),
        uuid_digest BLOB NOT NULL,
        PRIMARY KEY (lease_id, uuid_digest)
    ) STRICT;

    CREATE TABLE lease_history (
        lease_id BLOB NOT NULL REFERENCES leases(lease_id),
        seq      INTEGER NOT NULL,
        at       INTEGER NOT NULL,
        actor    TEXT NOT NULL,
        event    TEXT NOT NULL,
        to_state TEXT NOT NULL,
        PRIMARY KEY (lease_id, seq)
    ) STRICT;

    CREATE TABLE usage_reports (
        lease_id    BLOB NOT NULL REFERENCES leases(lease_id),
        seq         INTEGER NOT NULL,
        envelope    BLOB NOT NULL,
        received_at INTEGER NOT NULL,
        PRIMARY KEY (lease_id, seq)
    ) STRICT;

    CREATE TABLE receipts (
        lease_id    BLOB NOT NULL REFERENCES leases(lease_id),
        seq         INTEGER NOT NULL,
        total_paid  INTEGER NOT NULL,
        envelope    BLOB NOT NULL,
        received_at INTEGER NOT NULL,
        PRIMARY KEY (lease_id, seq)
    ) STRICT;

    -- Double-entry ledger; amounts in micro-units.
    CREATE TABLE ledger (
        id           INTEGER PRIMARY KEY,
        lease_id     BLOB NOT NULL REFERENCES leases(lease_id),
        counterparty BLOB NOT NULL,
        account      TEXT NOT NULL,
        debit        INTEGER NOT NULL DEFAULT 0 CHECK (debit >= 0),
        credit       INTEGER NOT NULL DEFAULT 0 CHECK (credit >= 0),
        receipt_seq  INTEGER,
        at           INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX ledger_lease ON ledger(lease_id);
    "#,
    // 2: lease sessions (issue 5): container, clock, close and settlement of each lease.
    r#"
    CREATE TABLE lease_session (
        lease_id      BLOB PRIMARY KEY REFERENCES leases(lease_id),
        container_id  TEXT,
        started_at    INTEGER,
        closed_at     INTEGER,
        close_reason  TEXT,
        exit_code     INTEGER,
        settled_total INTEGER
    ) STRICT;
    "#,
    // 3: bounded peer memory (issue 11): the least recently seen are forgotten first.
    r#"
    CREATE INDEX peers_last_seen ON peers(last_seen);
    "#,
    // 4: why a start failed (issue 13): kind and sentence, JSON, for the renter and `status`.
    r#"
    ALTER TABLE lease_session ADD COLUMN failure TEXT;
    "#,
    // 5: images this provider pulled for leases (issue 12): its bounded cache.
    r#"
    CREATE TABLE pulled_images (
        reference TEXT PRIMARY KEY,
        last_used INTEGER NOT NULL,
        bytes     INTEGER NOT NULL CHECK (bytes >= 0)
    ) STRICT;
    "#,
    // 6: lease amendments (issue 13, `extend`): the renter's signed proposal and, once
    // accepted, the provider's signed acceptance. A lease's current duration and budget cap
    // are those of its last accepted amendment; `leases.duration_s` and the stored request
    // keep the original terms (whose hash is the lease id). A renter's proposal without an
    // acceptance is pending (sent, its answer not seen yet).
    r#"
    CREATE TABLE lease_amendments (
        lease_id   BLOB NOT NULL REFERENCES leases(lease_id),
        seq        INTEGER NOT NULL CHECK (seq >= 1),
        duration_s INTEGER NOT NULL CHECK (duration_s >= 1),
        max_total  INTEGER NOT NULL CHECK (max_total >= 0),
        proposal   BLOB NOT NULL,
        acceptance BLOB,
        at         INTEGER NOT NULL,
        PRIMARY KEY (lease_id, seq)
    ) STRICT;
    "#,
    // 7: finished leases whose container and workspace the provider keeps for the renter's
    // downloads (issue 13, `LeaseTerms::output_retention_s`), until this time; NULL once
    // removed (or never kept). The partial index makes the sweep read only kept ones.
    r#"
    ALTER TABLE lease_session ADD COLUMN outputs_until INTEGER;
    CREATE INDEX lease_session_outputs ON lease_session(outputs_until)
        WHERE outputs_until IS NOT NULL;
    "#,
    // 8: the signed offer a lease's terms were made from (issue 16, `gridlease statement`),
    // as the node had it when the lease was made: the renter's from its book, the provider's
    // own (when the terms name the offer it advertised then, not an earlier signature).
    r#"
    CREATE TABLE lease_offers (
        lease_id BLOB PRIMARY KEY REFERENCES leases(lease_id),
        envelope BLOB NOT NULL
    ) STRICT;
    "#,
    // 9: co-signed lease completions (issue 16, reputation): this node's own (as provider or
    // renter) and those other nodes gossip, each verified before it is stored. `record` is
    // the `CoSigned` pair in the project's codec; the other columns are read off it. Not
    // tied to `leases`: most are other nodes' leases.
    r#"
    CREATE TABLE completions (
        lease_id    BLOB PRIMARY KEY,
        provider    BLOB NOT NULL,
        renter      BLOB NOT NULL,
        paid        INTEGER NOT NULL CHECK (paid >= 0),
        outcome     TEXT NOT NULL,
        closed_at   INTEGER NOT NULL,
        received_at INTEGER NOT NULL,
        record      BLOB NOT NULL
    ) STRICT;
    CREATE INDEX completions_by_provider ON completions(provider, closed_at);
    "#,
];

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

/// Peers remembered (most recently seen first); older ones are forgotten when more are seen.
pub const PEERS_KEPT: usize = 1024;

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Store failures.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed.
    #[error("database {path}: {source}")]
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// The SQLite error.
        #[source]
        source: rusqlite::Error,
    },
    /// The file is not a readable SQLite database, or fails its integrity check.
    #[error(
        "database {path} is corrupted ({detail}); move it away and restore a backup (nothing was changed)"
    )]
    Corrupt {
        /// The database file.
        path: PathBuf,
        /// What SQLite reported.
        detail: String,
    },
    /// Written by a newer gridlease.
    #[error(
        "database {path} has schema version {found}, this gridlease understands up to {supported}; upgrade gridlease"
    )]
    NewerSchema {
        /// The database file.
        path: PathBuf,
        /// Its version.
        found: i64,
        /// Ours.
        supported: i64,
    },
    /// Some other application's database.
    #[error("database {path} belongs to another application (application_id {found:#x})")]
    ForeignDatabase {
        /// The database file.
        path: PathBuf,
        /// Its id.
        found: i32,
    },
    /// A stored blob did not decode.
    #[error("database {path}: stored {what} does not decode: {detail}")]
    BadRow {
        /// The database file.
        path: PathBuf,
        /// What was being read.
        what: &'static str,
        /// Why.
        detail: String,
    },
    /// A uniqueness rule: the renter's nonce is already used for other terms.
    #[error("lease {lease_id} conflicts with an existing lease for the same renter nonce")]
    NonceConflict {
        /// The lease that could not be stored.
        lease_id: LeaseId,
    },
    /// The store thread is gone.
    #[error("the store thread has stopped")]
    Closed,
}

/// Which side of a lease this node is. Serializes as `"provider"` / `"renter"` (the control
/// API's JSON), the same text as in the database.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// This node runs the container.
    Provider,
    /// This node pays.
    Renter,
}

impl Role {
    /// `provider` or `renter`, as in the database and the control API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Provider => "provider",
            Self::Renter => "renter",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "provider" => Some(Self::Provider),
            "renter" => Some(Self::Renter),
            _ => None,
        }
    }
}

/// A lease as stored: both signed halves and the state.
#[derive(Clone, Debug)]
pub struct StoredLease {
    /// Provider or renter.
    pub role: Role,
    /// The lease (terms, state, history).
    pub lease: Lease,
    /// The renter's signed request.
    pub request: Signed<LeaseRequest>,
    /// The provider's signed acceptance.
    pub accept: Option<Signed<LeaseAccept>>,
    /// GPUs assigned (UUID digests).
    pub gpus: Vec<Digest>,
    /// When this node stored it.
    pub created_at: Timestamp,
}

/// An offer as stored.
#[derive(Clone, Debug)]
pub struct StoredOffer {
    /// The envelope as received.
    pub signed: Signed<Offer>,
    /// When this node admitted it.
    pub received_at: Timestamp,
}

/// The synchronous store.
pub struct Store {
    conn: Connection,
    path: PathBuf,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

fn i64_of(v: u64) -> i64 {
    // Timestamps, sequences and amounts are far below 2^63; saturate rather than wrap.
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn u64_of(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl Store {
    /// Opens (creating if needed) the database at `path` and migrates it.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let path = path.to_path_buf();
        let conn = Connection::open(&path).map_err(|source| classify(&path, source))?;
        let mut store = Self { conn, path };
        store.configure()?;
        store.migrate()?;
        Ok(store)
    }

    fn err(&self) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        |source| classify(&self.path, source)
    }

    fn configure(&mut self) -> Result<(), StoreError> {
        let e = self.err();
        self.conn
            .busy_timeout(std::time::Duration::from_secs(5))
            .map_err(&e)?;
        // Reading the header first surfaces "file is not a database" as Corrupt.
        let check: String = self
            .conn
            .query_row("PRAGMA quick_check", [], |r| r.get(0))
            .map_err(&e)?;
        if check != "ok" {
            return Err(StoreError::Corrupt {
                path: self.path.clone(),
                detail: check,
            });
        }
        let mode: String = self
            .conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .map_err(&e)?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(path = %self.path.display(), mode, "WAL journal not available");
        }
        self.conn
            .execute_batch("PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;")
            .map_err(&e)?;
        Ok(())
    }

    fn migrate(&mut self) -> Result<(), StoreError> {
        let path = self.path.clone();
        let e = |source| classify(&path, source);
        let app_id: i32 = self
            .conn
            .query_row("PRAGMA application_id", [], |r| r.get(0))
            .map_err(e)?;
        let version: i64 = self
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(e)?;
        if app_id != 0 && app_id != APPLICATION_ID {
            return Err(StoreError::ForeignDatabase {
                path,
                found: app_id,
            });
        }
        if app_id == 0 && version == 0 {
            // A fresh file must be empty: refuse to adopt someone else's tables.
            let tables: i64 = self
                .conn
                .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
                .map_err(e)?;
            if tables != 0 {
                return Err(StoreError::ForeignDatabase {
                    path,
                    found: app_id,
                });
            }
        }
        if version > SCHEMA_VERSION {
            return Err(StoreError::NewerSchema {
                path,
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        for (i, sql) in MIGRATIONS
            .iter()
            .enumerate()
            .skip(usize::try_from(version).unwrap_or(0))
        {
            let tx = self.conn.transaction().map_err(e)?;
            tx.execute_batch(sql).map_err(e)?;
            tx.execute_batch(&format!(
                "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {};",
                i + 1
            ))
            .map_err(e)?;
            tx.commit().map_err(e)?;
            tracing::info!(path = %path.display(), version = i + 1, "database migrated");
        }
        Ok(())
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sets a metadata value.
    pub fn set_meta(&mut self, key: &str, value: &str) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT INTO meta(key, value) VALUES (?1, ?2)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![key, value],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// Reads a metadata value.
    pub fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.conn
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()
            .map_err(self.err())
    }

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

    fn bad_row(&self, what: &'static str, err: impl std::fmt::Display) -> StoreError {
        StoreError::BadRow {
            path: self.path.clone(),
            what,
            detail: err.to_string(),
        }
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

    /// Makes this connection refuse every write (`PRAGMA query_only`), or write again. For
    /// tests of what the node does when its database cannot be written (a full disk, a file
    /// made read-only): writes then fail with a real SQLite error.
    #[doc(hidden)]
    pub fn set_query_only(&self, on: bool) -> Result<(), StoreError> {
        self.conn
            .pragma_update(None, "query_only", on)
            .map_err(self.err())
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

fn actor_str(a: Actor) -> &'static str {
    match a {
        Actor::Renter => "renter",
        Actor::Provider => "provider",
        Actor::Local => "local",
    }
}

fn event_str(e: &LeaseEvent) -> String {
    format!("{e:?}")
}

/// Maps SQLite's "not a database" / "corrupt" codes to [`StoreError::Corrupt`].
fn classify(path: &Path, source: rusqlite::Error) -> StoreError {
    use rusqlite::ffi::ErrorCode;
    if let rusqlite::Error::SqliteFailure(f, msg) = &source
        && matches!(f.code, ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt)
    {
        return StoreError::Corrupt {
            path: path.to_path_buf(),
            detail: msg.clone().unwrap_or_else(|| f.to_string()),
        };
    }
    StoreError::Sqlite {
        path: path.to_path_buf(),
        source,
    }
}

type Job = Box<dyn FnOnce(&mut Store) + Send>;

/// Queue depth of the store thread.
pub const STORE_QUEUE: usize = 1024;

/// An async handle to a [`Store`] running on its own thread. Cloneable; the thread stops when
/// the last handle is dropped.
#[derive(Clone, Debug)]
pub struct StoreHandle {
    tx: mpsc::SyncSender<Job>,
}

impl StoreHandle {
    /// Moves `store` onto a new thread.
    pub fn spawn(mut store: Store) -> Self {
        let (tx, rx) = mpsc::sync_channel::<Job>(STORE_QUEUE);
        let name = format!("store:{}", store.path.display());
        let spawned = thread::Builder::new()
            .name("gridlease-store".into())
            .spawn(move || {
                let span = tracing::info_span!("store", db = %name);
                let _guard = span.enter();
                while let Ok(job) = rx.recv() {
                    job(&mut store);
                }
            });
        if let Err(err) = spawned {
            tracing::error!(error = %err, "cannot spawn the store thread");
        }
        Self { tx }
    }

    /// Runs `f` on the store thread and awaits its result. Waits for room in the queue on a
    /// blocking-pool thread, so a full queue never blocks an async worker.
    pub async fn call<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        F: FnOnce(&mut Store) -> Result<R, StoreError> + Send + 'static,
        R: Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let job: Job = Box::new(move |s| {
            let _ = reply.send(f(s));
        });
        match self.tx.try_send(job) {
            Ok(()) => {}
            Err(mpsc::TrySendError::Full(job)) => {
                let tx = self.tx.clone();
                tokio::task::spawn_blocking(move || tx.send(job))
                    .await
                    .map_err(|_| StoreError::Closed)?
                    .map_err(|_| StoreError::Closed)?;
            }
            Err(mpsc::TrySendError::Disconnected(_)) => return Err(StoreError::Closed),
        }
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Queues `f` without waiting; returns false (and drops the job) when the queue is full.
    /// For best-effort writes such as caching gossiped offers.
    pub fn try_submit<F>(&self, f: F) -> bool
    where
        F: FnOnce(&mut Store) + Send + 'static,
    {
        self.tx.try_send(Box::new(f)).is_ok()
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

#[cfg(test)]
mod tests {
    use super::*;
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
        let bytes =
            |m: &LeaseAmendment| Signed::sign(&renter, &net, m).unwrap().to_bytes().unwrap();
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
}
