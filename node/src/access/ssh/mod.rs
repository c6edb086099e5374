//! OpenSSH on a lease (issue 45), the node's side: an SSH server ([`server`]) that the
//! user's own `ssh` reaches through `gridlease ssh-proxy` (`POST /v1/leases/{id}/ssh` on the
//! control socket: the proxy hands ssh the connection itself, or copies it to its stdio), and
//! maps each SSH channel onto one of the lease's access streams; and the host keys it presents.
//!
//! Host keys: `<home>/ssh/host-key.seed` holds 32 random bytes (0600), from which every
//! lease's host key is derived ([`host_key`]). The key only stops OpenSSH from asking: the SSH
//! connection runs over the node's control socket (or the pipes to `ssh-proxy`), never over a
//! network, so there is nothing for a host key to authenticate. What authorizes access is the
//! control socket (0600, this user's) and the provider's check that the lease's renter asks.

pub mod server;

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;
use gridlease_protocol::LeaseId;
use russh::keys::PrivateKey;
use russh::keys::ssh_key::private::Ed25519Keypair;

/// The directory under the node's home for SSH (the seed, and `ssh-config`'s files).
pub fn ssh_dir(home: &Path) -> PathBuf {
    home.join("ssh")
}

/// Makes `dir` (and its parents) with mode 0700 where missing.
pub fn make_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))
}

/// The seed's file name in the SSH directory.
pub const SEED_FILE: &str = "host-key.seed";
const SEED_LEN: usize = 32;
/// Key-derivation context of the host keys (BLAKE3 `derive_key`).
const KEY_CONTEXT: &str = "gridlease ssh-proxy host key v1";

/// The secret the host keys are derived from: read, or made (0600) on first use.
fn host_seed(home: &Path) -> anyhow::Result<[u8; SEED_LEN]> {
    let dir = ssh_dir(home);
    make_dir(&dir)?;
    let path = dir.join(SEED_FILE);
    let mut fresh = [0u8; SEED_LEN];
    getrandom::fill(&mut fresh)
        .map_err(|e| anyhow::anyhow!("no randomness for a host key: {e}"))?;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
    {
        Ok(mut f) => {
            f.write_all(&fresh)
                .and_then(|()| f.sync_all())
                .with_context(|| format!("cannot write {}", path.display()))?;
            return Ok(fresh);
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("cannot create {}", path.display())),
    }
    let bytes = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    bytes.try_into().map_err(|_| {
        anyhow::anyhow!(
            "{} is not {SEED_LEN} bytes: delete it and run `gridlease ssh-config` again",
            path.display()
        )
    })
}

/// The SSH host key of `lease` for this home: an Ed25519 key derived from the home's seed and
/// the lease id, so `ssh-config` (the known_hosts line) and the node (the server) agree
/// without storing a key per lease.
pub fn host_key(home: &Path, lease: &LeaseId) -> anyhow::Result<PrivateKey> {
    let seed = host_seed(home)?;
    let mut input = Vec::with_capacity(SEED_LEN + 32);
    input.extend_from_slice(&seed);
    input.extend_from_slice(&lease.0.0);
    let key = blake3::derive_key(KEY_CONTEXT, &input);
    Ok(PrivateKey::from(Ed25519Keypair::from_seed(&key)))
}
