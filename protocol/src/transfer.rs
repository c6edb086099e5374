//! Moving files into and out of a running lease's `/workspace` (`gridlease cp`), on an access
//! stream ([`crate::access`]) opened with `AccessRequest::Upload` or `Download`.
//!
//! After `Granted`, both directions carry [`TransferFrame`]s (cap [`MAX_TRANSFER_FRAME`]):
//!
//! | request    | renter -> provider                          | provider -> renter                  |
//! |------------|---------------------------------------------|-------------------------------------|
//! | `Upload`   | `Chunk`* (a tar stream), then `End`          | `Done` or `Error`                    |
//! | `Download` | `Skip`* (paths already copied), then `Go`    | `Root`, `Chunk`* (a tar stream), then `End` or `Error` |
//!
//! `End` carries the byte count and the SHA-256 of the tar bytes sent; the receiver compares
//! both with what it received before it reports success. Tar entries are relative to the
//! request's path; only regular files, directories and symlinks travel.

use serde::{Deserialize, Serialize};

/// Most bytes of tar data in one `Chunk`.
pub const MAX_CHUNK: usize = 256 * 1024;
/// Most bytes of one `Skip` frame's paths, counting [`SKIP_ENTRY_OVERHEAD`] more per path.
pub const MAX_SKIP_BYTES: usize = 32 * 1024;
/// What one path costs in a `Skip` frame beyond its bytes (its length prefix, rounded up).
pub const SKIP_ENTRY_OVERHEAD: usize = 3;
/// Cap on one transfer frame's body.
pub const MAX_TRANSFER_FRAME: usize = MAX_CHUNK + 64;
/// The directory renters' files live in; transfer paths are inside it.
pub const WORKSPACE: &str = "/workspace";

/// One frame of a transfer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TransferFrame {
    /// Download: entries (paths relative to the requested path) the renter already has; the
    /// provider leaves them out.
    Skip(Vec<String>),
    /// Download: no more `Skip`; start sending.
    Go,
    /// Download: what the requested path is (sent before the first `Chunk`): a directory (its
    /// entries follow, relative to it) or a file (one entry follows).
    Root {
        /// A directory.
        directory: bool,
    },
    /// Tar bytes (at most [`MAX_CHUNK`]).
    Chunk(#[serde(with = "serde_bytes")] Vec<u8>),
    /// The sender's tar stream ended: how many bytes and their SHA-256.
    End {
        /// Bytes of tar data sent.
        bytes: u64,
        /// SHA-256 of those bytes.
        sha256: [u8; 32],
    },
    /// Upload: the provider extracted everything into the workspace (the tar bytes matched).
    Done {
        /// Bytes of tar data received.
        bytes: u64,
        /// Entries extracted.
        entries: u64,
    },
    /// The transfer failed; the last frame.
    Error(String),
}

/// Normalises a path inside the workspace: `/workspace/a/b`, `a/b` and `./a//b/` all give
/// `a/b`; `/workspace` and `.` give the empty path (the workspace itself). Refuses `..`,
/// NUL bytes, and absolute paths elsewhere.
pub fn workspace_relative(path: &str) -> Result<String, String> {
    if path.contains('\0') {
        return Err("a path contains a NUL byte".into());
    }
    let rest = if let Some(r) = path.strip_prefix(WORKSPACE) {
        if !(r.is_empty() || r.starts_with('/')) {
            return Err(format!("{path:?} is not inside {WORKSPACE}"));
        }
        r
    } else if path.starts_with('/') {
        return Err(format!(
            "{path:?} is not inside {WORKSPACE} (files move only into and out of the lease's workspace)"
        ));
    } else {
        path
    };
    let mut parts = Vec::new();
    for c in rest.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(format!("{path:?} contains `..`")),
            c => parts.push(c),
        }
    }
    Ok(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_paths_normalise_and_never_leave_it() {
        assert_eq!(workspace_relative("/workspace/a/b").unwrap(), "a/b");
        assert_eq!(workspace_relative("./a//b/").unwrap(), "a/b");
        assert_eq!(workspace_relative("/workspace").unwrap(), "");
        assert_eq!(workspace_relative(".").unwrap(), "");
        assert!(workspace_relative("/workspacex/a").is_err());
        assert!(workspace_relative("/etc/passwd").is_err());
        assert!(workspace_relative("a/../../etc").is_err());
        assert!(workspace_relative("a\0b").is_err());
    }

    #[test]
    fn a_full_chunk_and_a_full_skip_list_fit_a_frame() {
        let f = TransferFrame::Chunk(vec![0; MAX_CHUNK]);
        assert!(crate::access::frame::<_, MAX_TRANSFER_FRAME>(&f).is_ok());
        // A skip list as full as the rule allows, in the shortest and in long names.
        for len in [1usize, 200] {
            let n = MAX_SKIP_BYTES / (len + SKIP_ENTRY_OVERHEAD);
            let names: Vec<String> = (0..n).map(|_| "x".repeat(len)).collect();
            let f = TransferFrame::Skip(names);
            assert!(crate::access::frame::<_, MAX_TRANSFER_FRAME>(&f).is_ok());
        }
    }
}
