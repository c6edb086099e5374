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

use gridlease_contracts::Lease;
use gridlease_protocol::{Digest, LeaseAccept, LeaseId, LeaseRequest, Offer, Signed, Timestamp};
use rusqlite::{Connection, OptionalExtension, params};

use sql::classify;

mod completions;
mod handle;
mod images;
pub mod jobs;
pub mod lease;
mod leases;
mod offers;
mod peers;
mod proofs;
pub mod redemptions;
pub use proofs::CheckCounts;
mod schema;
mod sql;
#[cfg(test)]
mod tests;

pub use completions::{COMPLETIONS_KEPT, COMPLETIONS_PER_PROVIDER, StoredCompletion};
pub use handle::{STORE_QUEUE, StoreHandle};
pub use peers::PEERS_KEPT;
pub use schema::{APPLICATION_ID, SCHEMA_VERSION};

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
    fn bad_row(&self, what: &'static str, err: impl std::fmt::Display) -> StoreError {
        StoreError::BadRow {
            path: self.path.clone(),
            what,
            detail: err.to_string(),
        }
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
}
