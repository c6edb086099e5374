//! The database's schema: its migrations, keyed by `PRAGMA user_version`, and the connection
//! settings every open applies (WAL, `synchronous=FULL`, foreign keys, a busy timeout, the
//! integrity check and the `application_id` tag).

use super::sql::classify;
use super::{Store, StoreError};

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
    // 10: the GPU check of a lease (issue 44, proof of GPU): the `ProofRecord` in the
    // project's codec (every signed message of the check, the renter's report, the
    // provider's co-signature of a pass), with its verdict and backend read off it. One per
    // lease: the check at its start (a mid-lease re-check replaces it only when it passed).
    r#"
    CREATE TABLE lease_proofs (
        lease_id BLOB PRIMARY KEY REFERENCES leases(lease_id),
        provider BLOB NOT NULL,
        passed   INTEGER NOT NULL CHECK (passed IN (0, 1)),
        backend  TEXT NOT NULL,
        at       INTEGER NOT NULL,
        record   BLOB NOT NULL
    ) STRICT;
    CREATE INDEX lease_proofs_by_provider ON lease_proofs(provider);
    "#,
    // 11: jobs (issue 46): the renter's scheduler over leases. A job (its checked spec as
    // JSON), its tasks, every attempt of each (one lease each, with its cap for the budget and
    // why it ended), and the providers excluded for the job.
    r#"
    CREATE TABLE jobs (
        job_id     TEXT PRIMARY KEY,
        name       TEXT NOT NULL,
        spec       TEXT NOT NULL,
        out_dir    TEXT NOT NULL,
        state      TEXT NOT NULL CHECK (state IN
                       ('running', 'completed', 'failed', 'cancelled', 'budget_reached')),
        created_at INTEGER NOT NULL,
        ended_at   INTEGER,
        message    TEXT
    ) STRICT;
    CREATE TABLE job_tasks (
        job_id    TEXT NOT NULL REFERENCES jobs(job_id),
        task      INTEGER NOT NULL,
        state     TEXT NOT NULL CHECK (state IN
                      ('pending', 'running', 'succeeded', 'failed', 'cancelled', 'not_started')),
        attempts  INTEGER NOT NULL,
        exit_code INTEGER,
        message   TEXT,
        PRIMARY KEY (job_id, task)
    ) STRICT;
    CREATE TABLE job_attempts (
        job_id     TEXT NOT NULL REFERENCES jobs(job_id),
        task       INTEGER NOT NULL,
        attempt    INTEGER NOT NULL,
        provider   TEXT NOT NULL,
        offer      TEXT NOT NULL,
        price      INTEGER NOT NULL,
        cap        INTEGER NOT NULL,
        lease_id   TEXT,
        phase      TEXT NOT NULL CHECK (phase IN ('renting', 'starting', 'running', 'ended')),
        started_at INTEGER NOT NULL,
        ended_at   INTEGER,
        verdict    TEXT,
        reason     TEXT,
        exit_code  INTEGER,
        spent      INTEGER,
        PRIMARY KEY (job_id, task, attempt)
    ) STRICT;
    CREATE TABLE job_excluded (
        job_id   TEXT NOT NULL REFERENCES jobs(job_id),
        provider TEXT NOT NULL,
        reason   TEXT NOT NULL,
        PRIMARY KEY (job_id, provider)
    ) STRICT;
    "#,
    // 12: a lease that runs several of a job's tasks one after another (`tasks_per_lease`):
    // where each attempt's output starts in its lease's log, and when its task was handed to
    // the lease (its timeout counts from then).
    r#"
    ALTER TABLE job_attempts ADD COLUMN log_from INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE job_attempts ADD COLUMN run_at INTEGER;
    "#,
    // 13: on-chain redemptions (issue 50): every settled provider lease, once. A lease that
    // settles on chain keeps its last voucher and the claim (what its statement owes, in the
    // token's smallest units, decimal) until the channel contract paid it; one in GLU only is
    // marked `glu` so it is looked at once.
    r#"
    CREATE TABLE redemptions (
        lease_id   BLOB PRIMARY KEY REFERENCES leases(lease_id),
        state      TEXT NOT NULL CHECK (state IN ('glu', 'pending', 'redeemed', 'failed')),
        chain_id   INTEGER,
        contract   BLOB,
        renter     BLOB,
        epoch      INTEGER,
        amount     TEXT,
        claim      TEXT,
        signature  BLOB,
        attempts   INTEGER NOT NULL DEFAULT 0,
        tx         TEXT,
        block      INTEGER,
        paid       TEXT,
        error      TEXT,
        updated_at INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX redemptions_pending ON redemptions(state) WHERE state = 'pending';
    "#,
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;
impl Store {
    pub(super) fn configure(&mut self) -> Result<(), StoreError> {
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

    pub(super) fn migrate(&mut self) -> Result<(), StoreError> {
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
}
