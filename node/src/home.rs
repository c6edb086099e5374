//! The node's home directory: identity key, network name, database.
//!
//! ```text
//! <home>/identity.key   ed25519 secret, mode 0600 (refuses to load if group/other can read)
//! <home>/wallet.key     secp256k1 secret of the settlement wallet, mode 0600, same rules
//!                       (made by `init`; a home made before it gets one when its node
//!                       next starts, as the user the node runs as)
//! <home>/network        the network id, one line
//! <home>/gridlease.db   SQLite store (see `store`)
//! ```

use std::fs;
use std::path::{Path, PathBuf};

use gridlease_protocol::envelope::InvalidNetworkId;
use gridlease_protocol::wallet::WalletKey;
use gridlease_protocol::{IdentityError, NetworkId, NodeKey};

use crate::store::{Store, StoreError};

/// Key file name inside the home.
pub const IDENTITY_FILE: &str = "identity.key";
/// Wallet key file name inside the home.
pub const WALLET_FILE: &str = "wallet.key";
/// Network file name inside the home.
pub const NETWORK_FILE: &str = "network";
/// Database file name inside the home.
pub const DB_FILE: &str = "gridlease.db";

/// Problems with the home directory.
#[derive(Debug, thiserror::Error)]
pub enum HomeError {
    /// `init` on a home that already has an identity.
    #[error("{path} already holds an identity; refusing to overwrite it (use another --home)")]
    AlreadyInitialized {
        /// The key file.
        path: PathBuf,
    },
    /// No identity: `init` was never run.
    #[error("no identity in {home}; run `gridlease init --home {home}` first")]
    NotInitialized {
        /// The home directory.
        home: PathBuf,
    },
    /// File system failure.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The key file could not be used.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The network file holds an invalid name.
    #[error("{path}: {source}")]
    Network {
        /// The network file.
        path: PathBuf,
        /// Why.
        #[source]
        source: InvalidNetworkId,
    },
    /// The database could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// An opened home directory.
#[derive(Debug)]
pub struct Home {
    /// The directory.
    pub dir: PathBuf,
    /// The node's key.
    pub key: NodeKey,
    /// The network it is on.
    pub network: NetworkId,
}

/// Picks the home directory: the flag, else `GRIDLEASE_HOME` (clap handles both), else
/// `$HOME/.gridlease`, else `./.gridlease`.
pub fn default_home() -> PathBuf {
    std::env::var_os(crate::env_vars::HOME)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
        .join(".gridlease")
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> HomeError + '_ {
    move |source| HomeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The home's wallet key: loaded, or made (0600) where there is none yet. Two processes
/// opening a home at once agree: one makes the file, the other loads it.
fn load_or_make_wallet(dir: &Path) -> Result<WalletKey, HomeError> {
    let path = dir.join(WALLET_FILE);
    match WalletKey::load_file(&path) {
        Err(IdentityError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            let key = WalletKey::generate().map_err(|e| HomeError::Io {
                path: path.clone(),
                source: std::io::Error::other(format!("no randomness for a wallet key: {e}")),
            })?;
            match key.create_file(&path) {
                Ok(()) => {
                    tracing::info!(address = %key.address(), "made the settlement wallet key {}", path.display());
                    Ok(key)
                }
                Err(IdentityError::AlreadyExists { .. }) => Ok(WalletKey::load_file(&path)?),
                Err(e) => Err(e.into()),
            }
        }
        other => Ok(other?),
    }
}

impl Home {
    /// Creates a new identity in `dir` (creating the directory) on `network`, and the database.
    pub fn init(dir: &Path, network: &NetworkId) -> Result<Self, HomeError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io_err(dir))?;
        }
        let key_path = dir.join(IDENTITY_FILE);
        if key_path.exists() {
            return Err(HomeError::AlreadyInitialized { path: key_path });
        }
        let key = NodeKey::generate();
        key.create_file(&key_path).map_err(|e| match e {
            IdentityError::AlreadyExists { path } => HomeError::AlreadyInitialized { path },
            other => HomeError::Identity(other),
        })?;
        load_or_make_wallet(dir)?;
        let net_path = dir.join(NETWORK_FILE);
        fs::write(&net_path, format!("{network}\n")).map_err(io_err(&net_path))?;
        let mut store = Store::open(&dir.join(DB_FILE))?;
        store.set_meta("peer_id", &key.peer_id().to_string())?;
        store.set_meta("network", network.as_str())?;
        Ok(Self {
            dir: dir.to_path_buf(),
            key,
            network: network.clone(),
        })
    }

    /// Opens an initialized home.
    pub fn open(dir: &Path) -> Result<Self, HomeError> {
        let key_path = dir.join(IDENTITY_FILE);
        if !key_path.exists() {
            return Err(HomeError::NotInitialized {
                home: dir.to_path_buf(),
            });
        }
        let key = NodeKey::load_file(&key_path)?;
        let net_path = dir.join(NETWORK_FILE);
        let text = fs::read_to_string(&net_path).map_err(io_err(&net_path))?;
        let network = NetworkId::new(text.trim()).map_err(|source| HomeError::Network {
            path: net_path.clone(),
            source,
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
            key,
            network,
        })
    }

    /// The settlement wallet's key: loaded, or made where the home has none yet (a home made
    /// before wallets). Only the node (and `init`) call it, as the user the node runs as, so
    /// the file is that user's.
    pub fn wallet(&self) -> Result<WalletKey, HomeError> {
        load_or_make_wallet(&self.dir)
    }

    /// The database path.
    pub fn db_path(&self) -> PathBuf {
        self.dir.join(DB_FILE)
    }

    /// Opens the database.
    pub fn open_store(&self) -> Result<Store, HomeError> {
        Ok(Store::open(&self.db_path())?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_twice_refuses_and_open_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("h");
        let net = NetworkId::new("testnet").unwrap();
        let a = Home::init(&home, &net).unwrap();
        let err = Home::init(&home, &net).unwrap_err();
        assert!(matches!(err, HomeError::AlreadyInitialized { .. }), "{err}");
        let b = Home::open(&home).unwrap();
        assert_eq!(a.key.public(), b.key.public());
        assert_eq!(b.network, net);
        // `init` made the wallet; it is the same key every time, and a home without one
        // (made before wallets) gets one, private.
        let w = a.wallet().unwrap().address();
        assert_eq!(b.wallet().unwrap().address(), w);
        std::fs::remove_file(home.join(WALLET_FILE)).unwrap();
        let fresh = b.wallet().unwrap().address();
        assert_ne!(fresh, w);
        assert_eq!(b.wallet().unwrap().address(), fresh);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(home.join(WALLET_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let empty = dir.path().join("none");
        assert!(matches!(
            Home::open(&empty).unwrap_err(),
            HomeError::NotInitialized { .. }
        ));
    }
}
