//! Files into and out of a tenant's `/workspace` (`gridlease cp`), from the host side.
//!
//! The node never hands a renter's bytes to Docker's archive API: that API resolves paths
//! inside the container's root and follows symlinks there (a tenant's link in `/workspace`
//! sends an upload into the rootfs layer or a tmpfs, outside every quota), and a download
//! whose stream is not read to its end blocks `docker-tar` and with it the daemon. Instead the
//! node mounts the lease's workspace filesystem (its own loop device, see
//! [`crate::workspace::open_workspace_fs`]) and reads and writes it directly, every name
//! resolved beneath its root without following any link ([`host`]).
//!
//! - Upload: the renter's tar stream is parsed as it arrives ([`TarReader`]: checked headers,
//!   paths relative and without `..`) and applied by [`Upload`]: plain files, directories
//!   and symlinks that stay inside the workspace, owned by the tenant, without setuid bits.
//!   The workspace's filesystem is the quota: a full one fails the upload (`ENOSPC`).
//! - Download: [`download`] walks the path and writes the tar stream itself (GNU format;
//!   files with holes as sparse entries, so a sparse file costs neither side its size);
//!   symlinks that would leave the copied tree, and anything that is not a file, directory or
//!   symlink, are left out with a reason the renter is told.
//! - Single operations ([`ops`]: stat, list, open, read and write at offsets, set attributes,
//!   rename, make and remove, links) for a file protocol served by the node (SFTP), on the
//!   same rules: resolved beneath the root, no link followed, new files the tenant's.

mod host;
mod ops;
mod tar_in;
mod tar_out;

pub use host::{
    DownloadRules, DownloadSummary, MAX_DEPTH, MAX_EXTENTS, OUT_PIECE, Out, Upload, WorkspaceFs,
    download, link_stays_inside,
};
pub use ops::{
    DirEntry, DirReader, FileStat, FsError, FsErrorKind, OpenFile, OpenHow, PERMISSION_BITS,
    SetAttrs,
};
pub use tar_in::{Entry, EntryKind, Event, MAX_LONG_NAME, MAX_PAX, TarReader, entry_path};

/// The tenant's user and group (see `spec::NOBODY`); the owner written into download headers.
pub const TENANT_ID: u64 = 65534;
/// Most entries one upload or download may hold.
pub const MAX_ENTRIES: u64 = 1_000_000;
/// Longest symlink target accepted, bytes.
pub const MAX_LINK: usize = 4096;

/// A tar block.
pub(crate) const BLOCK: usize = 512;
/// Zeros for padding and the end of an archive.
pub(crate) static ZEROS: [u8; 2 * BLOCK] = [0; 2 * BLOCK];

/// Why a transfer failed.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// Reading or writing failed, or the stream is malformed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// An entry broke a rule; nothing after it is applied.
    #[error("{path}: {problem}")]
    Refused {
        /// The entry's path (workspace-relative, or as sent).
        path: String,
        /// What is wrong.
        problem: String,
    },
    /// The workspace's filesystem is full.
    #[error(
        "the lease's workspace is full (writing {path}); free space in it or rent a larger disk"
    )]
    Full {
        /// What was being written.
        path: String,
    },
    /// The path does not exist.
    #[error("/workspace/{path} does not exist in the lease's workspace")]
    Missing {
        /// Workspace-relative.
        path: String,
    },
}

/// Padding after `size` bytes of data, to the next block.
pub(crate) fn padding(size: u64) -> usize {
    ((BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64) as usize
}

pub(crate) fn bad_header(problem: impl Into<String>) -> TransferError {
    TransferError::Io(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        problem.into(),
    ))
}
