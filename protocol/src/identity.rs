//! Node identity: one ed25519 key per node.
//!
//! The same key is the libp2p transport identity (its [`PeerId`] *is* the public key) and signs
//! every application message (offers, leases, usage reports, receipts). Signing goes through
//! `ed25519-dalek` directly; libp2p-identity wraps the same secret for the transport.
//!
//! The key file is the only file this crate touches: 32 raw secret bytes, mode 0600, created
//! with `O_EXCL` so an existing identity is never overwritten.

use std::fmt;
use std::fs;
use std::io::{self, Write};
#[cfg(unix)]
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
pub use libp2p_identity::PeerId;
use serde::{Deserialize, Serialize};

/// Length in bytes of an ed25519 secret key file.
pub const SECRET_KEY_LEN: usize = 32;

/// Errors about identities and key files.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The key file could not be read or written.
    #[error("key file {path}: {source}")]
    Io {
        /// The key file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// A key file already exists where a new one was to be created.
    #[error("key file {path} already exists; refusing to overwrite an identity")]
    AlreadyExists {
        /// The key file.
        path: PathBuf,
    },
    /// The key file has the wrong length.
    #[error(
        "key file {path} holds {len} bytes, expected {SECRET_KEY_LEN}; it is not a gridlease key"
    )]
    BadLength {
        /// The key file.
        path: PathBuf,
        /// Its length.
        len: u64,
    },
    /// Group or others can read the key file.
    #[error(
        "key file {path} has mode {mode:o}, readable by others; run `chmod 600 {path}` if you trust it"
    )]
    Permissions {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A wallet key file whose 32 bytes are not a secp256k1 secret (zero, or not below the
    /// group order).
    #[error("{path} does not hold a valid secp256k1 key")]
    BadSecret {
        /// The file.
        path: PathBuf,
    },
    /// Bytes that are not a valid ed25519 public key.
    #[error("not a valid ed25519 public key")]
    BadPublicKey,
    /// A peer id that does not embed an ed25519 public key.
    #[error("peer id {0} does not embed an ed25519 public key")]
    NotEd25519PeerId(String),
}

/// Writes a new 32-byte secret key file with mode 0600. Fails if the file exists (an
/// identity or a wallet key is never overwritten).
pub(crate) fn write_secret_file(
    path: &Path,
    secret: &[u8; SECRET_KEY_LEN],
) -> Result<(), IdentityError> {
    let io_err = |source| IdentityError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    opts.mode(0o600);
    let mut file = opts.open(path).map_err(|e| {
        if e.kind() == io::ErrorKind::AlreadyExists {
            IdentityError::AlreadyExists {
                path: path.to_path_buf(),
            }
        } else {
            io_err(e)
        }
    })?;
    file.write_all(secret).map_err(io_err)?;
    file.sync_all().map_err(io_err)
}

/// Reads a 32-byte secret key file, refusing wrong lengths and files readable by group or
/// others.
pub(crate) fn read_secret_file(path: &Path) -> Result<[u8; SECRET_KEY_LEN], IdentityError> {
    let io_err = |source| IdentityError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = fs::metadata(path).map_err(io_err)?;
    #[cfg(unix)]
    {
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(IdentityError::Permissions {
                path: path.to_path_buf(),
                mode,
            });
        }
    }
    if meta.len() != SECRET_KEY_LEN as u64 {
        return Err(IdentityError::BadLength {
            path: path.to_path_buf(),
            len: meta.len(),
        });
    }
    let bytes = fs::read(path).map_err(io_err)?;
    let secret: [u8; SECRET_KEY_LEN] =
        bytes
            .as_slice()
            .try_into()
            .map_err(|_| IdentityError::BadLength {
                path: path.to_path_buf(),
                len: bytes.len() as u64,
            })?;
    Ok(secret)
}

/// A node's secret identity. Never serialized; persisted only through [`NodeKey::create_file`].
pub struct NodeKey {
    signing: SigningKey,
    keypair: libp2p_identity::Keypair,
}

impl NodeKey {
    /// A fresh random identity.
    pub fn generate() -> Self {
        let keypair = libp2p_identity::Keypair::generate_ed25519();
        let secret = secret_of(&keypair);
        Self::from_secret(secret)
    }

    /// The identity with this 32-byte secret (tests and simulations use fixed secrets).
    pub fn from_secret(secret: [u8; SECRET_KEY_LEN]) -> Self {
        let signing = SigningKey::from_bytes(&secret);
        let mut copy = secret;
        // `ed25519_from_bytes` zeroizes its input; only infallible for a 32-byte slice.
        let keypair = match libp2p_identity::Keypair::ed25519_from_bytes(&mut copy) {
            Ok(k) => k,
            Err(_) => unreachable!("a 32-byte slice is always a valid ed25519 secret"),
        };
        Self { signing, keypair }
    }

    /// Writes a new key file with mode 0600. Fails if the file exists.
    pub fn create_file(&self, path: &Path) -> Result<(), IdentityError> {
        write_secret_file(path, &self.signing.to_bytes())
    }

    /// Loads a key file, refusing wrong lengths and files readable by group or others.
    pub fn load_file(path: &Path) -> Result<Self, IdentityError> {
        read_secret_file(path).map(Self::from_secret)
    }

    /// The public half.
    pub fn public(&self) -> PublicKey {
        PublicKey(self.signing.verifying_key().to_bytes())
    }

    /// The libp2p peer id (identical to `self.public().peer_id()`).
    pub fn peer_id(&self) -> PeerId {
        self.keypair.public().to_peer_id()
    }

    /// The libp2p keypair for the transport (noise, gossipsub signing).
    pub fn keypair(&self) -> &libp2p_identity::Keypair {
        &self.keypair
    }

    /// Signs raw bytes. Callers sign through [`crate::envelope`], which adds domain separation.
    pub(crate) fn sign_raw(&self, msg: &[u8]) -> [u8; 64] {
        self.signing.sign(msg).to_bytes()
    }
}

impl fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeKey")
            .field("public", &self.public())
            .finish_non_exhaustive()
    }
}

fn secret_of(keypair: &libp2p_identity::Keypair) -> [u8; SECRET_KEY_LEN] {
    match keypair.clone().try_into_ed25519() {
        Ok(ed) => match ed.secret().as_ref().try_into() {
            Ok(bytes) => bytes,
            Err(_) => unreachable!("an ed25519 secret is 32 bytes"),
        },
        Err(_) => unreachable!("generate_ed25519 returns an ed25519 keypair"),
    }
}

/// An ed25519 public key: the identity of a provider or renter on the wire.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PublicKey(#[serde(with = "serde_bytes")] pub [u8; 32]);

impl PublicKey {
    /// The libp2p peer id embedding this key.
    pub fn peer_id(&self) -> Result<PeerId, IdentityError> {
        let ed = libp2p_identity::ed25519::PublicKey::try_from_bytes(&self.0)
            .map_err(|_| IdentityError::BadPublicKey)?;
        Ok(libp2p_identity::PublicKey::from(ed).to_peer_id())
    }

    /// Recovers the public key embedded in an ed25519 peer id.
    pub fn from_peer_id(peer: &PeerId) -> Result<Self, IdentityError> {
        let not_ed = || IdentityError::NotEd25519PeerId(peer.to_string());
        let public = libp2p_identity::PublicKey::try_decode_protobuf(peer.as_ref().digest())
            .map_err(|_| not_ed())?;
        let ed = public.try_into_ed25519().map_err(|_| not_ed())?;
        Ok(Self(ed.to_bytes()))
    }

    /// The dalek verifying key, rejecting bytes that are not a curve point.
    pub fn verifying_key(&self) -> Result<VerifyingKey, IdentityError> {
        VerifyingKey::from_bytes(&self.0).map_err(|_| IdentityError::BadPublicKey)
    }

    /// Short human form: the first 8 hex digits.
    pub fn short(&self) -> String {
        hex::encode(&self.0[..4])
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", hex::encode(self.0))
    }
}

impl fmt::Display for PublicKey {
    /// Displays as the libp2p peer id, the form users see everywhere.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.peer_id() {
            Ok(p) => write!(f, "{p}"),
            Err(_) => write!(f, "invalid-key:{}", hex::encode(self.0)),
        }
    }
}

impl FromStr for PublicKey {
    type Err = IdentityError;

    /// Parses a peer id (`12D3Koo…`) or 64 hex digits.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() == 64
            && let Ok(bytes) = hex::decode(s)
        {
            let arr: [u8; 32] = bytes
                .as_slice()
                .try_into()
                .map_err(|_| IdentityError::BadPublicKey)?;
            let key = Self(arr);
            key.verifying_key()?;
            return Ok(key);
        }
        let peer: PeerId = s
            .parse()
            .map_err(|_| IdentityError::NotEd25519PeerId(s.to_string()))?;
        Self::from_peer_id(&peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_id_round_trips_through_public_key() {
        let key = NodeKey::generate();
        let public = key.public();
        assert_eq!(public.peer_id().unwrap(), key.peer_id());
        assert_eq!(PublicKey::from_peer_id(&key.peer_id()).unwrap(), public);
        assert_eq!(public.to_string().parse::<PublicKey>().unwrap(), public);
        assert_eq!(hex::encode(public.0).parse::<PublicKey>().unwrap(), public);
    }

    #[test]
    fn key_file_is_0600_and_reloads_to_the_same_identity() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.key");
        let key = NodeKey::generate();
        key.create_file(&path).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(NodeKey::load_file(&path).unwrap().public(), key.public());
    }

    #[test]
    fn existing_key_file_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.key");
        let first = NodeKey::generate();
        first.create_file(&path).unwrap();
        let err = NodeKey::generate().create_file(&path).unwrap_err();
        assert!(matches!(err, IdentityError::AlreadyExists { .. }), "{err}");
        assert_eq!(NodeKey::load_file(&path).unwrap().public(), first.public());
    }

    #[test]
    fn key_file_readable_by_others_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.key");
        NodeKey::generate().create_file(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let err = NodeKey::load_file(&path).unwrap_err();
        assert!(
            matches!(err, IdentityError::Permissions { mode: 0o644, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("chmod 600"));
    }

    #[test]
    fn key_file_of_wrong_length_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.key");
        fs::write(&path, [7u8; 31]).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let err = NodeKey::load_file(&path).unwrap_err();
        assert!(
            matches!(err, IdentityError::BadLength { len: 31, .. }),
            "{err}"
        );
    }

    #[test]
    fn garbage_strings_are_not_public_keys() {
        assert!("not-a-peer".parse::<PublicKey>().is_err());
        assert!("zz".repeat(32).parse::<PublicKey>().is_err());
    }
}
