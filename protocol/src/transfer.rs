//! Moving files into and out of a running lease's `/workspace` (`gridlease cp`), on an access
//! stream ([`crate::access`]) opened with `AccessRequest::Upload` or `Download`.
//!
//! After `Granted`, both directions carry [`TransferFrame`]s (cap [`MAX_TRANSFER_FRAME`]):
//!
//! | request    | renter -> provider                          | provider -> renter                  |
//! |------------|---------------------------------------------|-------------------------------------|
//! | `Upload`   | `Chunk`* (a tar stream), then `End`          | `Done` or `Error`                    |
//! | `Download` | `Skip`* (paths already copied) and `SkipSame`* (files the renter has, by size and time), then `Go` | `Root`, then `Chunk`* (a tar stream) and `Skipped`* in any order, then `End` or `Error` |
//!
//! `End` carries the byte count and the BLAKE3 hash of the tar bytes sent; the receiver compares
//! both with what it received before it reports success. Tar entries are relative to the
//! request's path; only regular files (sparse ones as GNU sparse entries), directories and
//! symlinks that stay inside the copied tree travel; the provider names each entry it leaves
//! out in a `Skipped` frame.

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
    /// Download: no more `Skip`; start sending, at most `max_bytes` of file data (files that
    /// would pass it are left out; `None`: no limit).
    Go {
        /// Most bytes of file data, holes not counted.
        max_bytes: Option<u64>,
    },
    /// Download: what the requested path is (sent before the first `Chunk`): a directory (its
    /// entries follow, relative to it) or a file (one entry follows).
    Root {
        /// A directory.
        directory: bool,
    },
    /// Tar bytes (at most [`MAX_CHUNK`]).
    Chunk(#[serde(with = "serde_bytes")] Vec<u8>),
    /// The sender's tar stream ended: how many bytes and their hash.
    End {
        /// Bytes of tar data sent.
        bytes: u64,
        /// BLAKE3 (32 bytes) of those bytes.
        blake3: [u8; 32],
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
    /// Download: an entry the provider left out (a symlink out of the tree, a FIFO, a file
    /// over the renter's limit...), and why.
    Skipped {
        /// Its path, relative to the requested path.
        path: String,
        /// Why, in words.
        reason: String,
    },
    /// Download, before `Go` like `Skip`: regular files the renter has, with their size and
    /// modification time; the provider leaves out each one whose size and modification time
    /// (whole seconds) are still the same, so only what changed travels (a job's checkpoints,
    /// copied home again and again). A provider older than this frame closes the stream.
    SkipSame(Vec<SameFile>),
}

/// A file the renter has ([`TransferFrame::SkipSame`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SameFile {
    /// Its path, relative to the requested path.
    pub path: String,
    /// Its size, bytes.
    pub size: u64,
    /// Its modification time, unix seconds.
    pub mtime: i64,
}

/// What one path costs in a `SkipSame` frame beyond its bytes (the length prefix, size and
/// time, rounded up).
pub const SAME_ENTRY_OVERHEAD: usize = SKIP_ENTRY_OVERHEAD + 18;

/// The codec's variant index of [`TransferFrame::Chunk`]: the first byte of a chunk frame's
/// body.
pub const CHUNK_TAG: u8 = 3;

/// The bytes a `Chunk` frame of `len` data bytes starts with (frame header, variant index,
/// byte-string length), so a sender can write the data from its own buffer right after them:
/// the result equals [`crate::access::frame`] of `TransferFrame::Chunk(data)` (tested).
/// `None` when `len` exceeds [`MAX_CHUNK`].
pub fn chunk_prefix(len: usize) -> Option<([u8; 10], usize)> {
    if len > MAX_CHUNK {
        return None;
    }
    let mut body = [0u8; 6];
    body[0] = CHUNK_TAG;
    // The codec's varint: one byte below 251, else a marker and little-endian u16/u32.
    let n = if len < 251 {
        body[1] = len as u8;
        2
    } else if let Ok(v) = u16::try_from(len) {
        body[1] = 251;
        body[2..4].copy_from_slice(&v.to_le_bytes());
        4
    } else {
        body[1] = 252;
        body[2..6].copy_from_slice(&(len as u32).to_le_bytes());
        6
    };
    let frame_len = u32::try_from(n + len).ok()?;
    let mut out = [0u8; 10];
    out[..4].copy_from_slice(&frame_len.to_be_bytes());
    out[4..4 + n].copy_from_slice(&body[..n]);
    Some((out, 4 + n))
}

/// How many more bytes of a frame body's head [`chunk_head`] needs after the first two (the
/// variant index and the varint's first byte): 0, 2, 4 or 8.
pub fn chunk_head_rest(marker: u8) -> usize {
    match marker {
        0..=250 => 0,
        251 => 2,
        252 => 4,
        _ => 8,
    }
}

/// Reads the head of a frame body of `body_len` bytes: `Some(data_len)` when it is a `Chunk`
/// whose data is exactly the rest of the body (`head` is the variant index, the varint's
/// marker and [`chunk_head_rest`] more bytes), `None` when it is another frame. `Err` for a
/// chunk whose length does not match its frame or exceeds [`MAX_CHUNK`].
pub fn chunk_head(head: &[u8], body_len: usize) -> Result<Option<usize>, String> {
    if head.first() != Some(&CHUNK_TAG) {
        return Ok(None);
    }
    let Some(&marker) = head.get(1) else {
        return Err("a chunk frame without a length".into());
    };
    let rest = &head[2..];
    let len = match (marker, rest.len()) {
        (0..=250, 0) => u64::from(marker),
        (251, 2) => u64::from(u16::from_le_bytes([rest[0], rest[1]])),
        (252, 4) => u64::from(u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]])),
        (253, 8) => u64::from_le_bytes(rest.try_into().map_err(|_| "bad length")?),
        _ => return Err("a chunk frame with a malformed length".into()),
    };
    let len = usize::try_from(len).map_err(|_| "a chunk too large")?;
    if len > MAX_CHUNK || head.len().checked_add(len) != Some(body_len) {
        return Err(format!(
            "a chunk of {len} bytes in a frame of {body_len} (at most {MAX_CHUNK})"
        ));
    }
    Ok(Some(len))
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
    fn a_chunk_prefix_is_the_codecs_own_encoding_and_its_head_reads_back() {
        for len in [0usize, 1, 250, 251, 4096, 65535, 65536, 200_000, MAX_CHUNK] {
            let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let whole =
                crate::access::frame::<_, MAX_TRANSFER_FRAME>(&TransferFrame::Chunk(data.clone()))
                    .unwrap();
            let (prefix, n) = chunk_prefix(len).unwrap();
            let mut mine = prefix[..n].to_vec();
            mine.extend_from_slice(&data);
            assert_eq!(mine, whole, "len {len}");
            // The reader's view: the body after the 4-byte frame header.
            let body = &whole[4..];
            let head_len = 2 + chunk_head_rest(body[1]);
            assert_eq!(chunk_head(&body[..head_len], body.len()), Ok(Some(len)));
        }
        assert!(chunk_prefix(MAX_CHUNK + 1).is_none());
        // Other frames are not chunks; a chunk whose length disagrees with its frame is refused.
        let end =
            crate::access::frame::<_, MAX_TRANSFER_FRAME>(&TransferFrame::Go { max_bytes: None })
                .unwrap();
        assert_eq!(chunk_head(&end[4..5], 1), Ok(None));
        assert!(chunk_head(&[3, 10], 11).is_err());
        assert!(chunk_head(&[3, 10], 13).is_err());
        assert!(chunk_head(&[3], 1).is_err());
        let too_big = (MAX_CHUNK as u32 + 1).to_le_bytes();
        let head = [3, 252, too_big[0], too_big[1], too_big[2], too_big[3]];
        assert!(chunk_head(&head, 6 + MAX_CHUNK + 1).is_err());
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
