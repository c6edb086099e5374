//! Headers of the tar stream a download sends: GNU format, GNU long-name and long-link
//! entries where a path or a link target does not fit, and GNU (old format) sparse entries for
//! files with holes, as GNU tar writes them.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::{BLOCK, ZEROS, padding};

/// The tar type of an entry a download sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OutKind<'a> {
    /// A directory.
    Dir,
    /// A regular file of this many bytes, stored whole.
    File {
        /// Bytes.
        size: u64,
    },
    /// A regular file of `size` bytes of which only `extents` (offset, length: sorted, not
    /// overlapping, each but the last a multiple of 512 bytes long) are stored.
    Sparse {
        /// The file's size, bytes.
        size: u64,
        /// Its data extents.
        extents: &'a [(u64, u64)],
    },
    /// A symbolic link to this target.
    Symlink(&'a [u8]),
}

/// Owner written into every header: the tenant's user (the renter's side ignores it).
const OWNER: u64 = super::TENANT_ID;

/// Appends to `out` the header blocks of an entry at `path` (relative) with permission bits
/// `mode` and modification time `mtime`. A file's data (its extents, for a sparse one) follows,
/// then [`padding`] to the next block.
pub(super) fn header(out: &mut Vec<u8>, path: &Path, kind: OutKind<'_>, mode: u32, mtime: u64) {
    let mut h = tar::Header::new_gnu();
    h.set_uid(OWNER);
    h.set_gid(OWNER);
    h.set_mtime(mtime);
    let mut path_bytes = path.as_os_str().as_bytes().to_vec();
    let mut ext: Vec<[u8; BLOCK]> = Vec::new();
    match kind {
        OutKind::Dir => {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(mode & 0o777);
            h.set_size(0);
            path_bytes.push(b'/');
        }
        OutKind::File { size } => {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(mode & 0o777);
            h.set_size(size);
        }
        OutKind::Sparse { size, extents } => {
            h.set_entry_type(tar::EntryType::GNUSparse);
            h.set_mode(mode & 0o777);
            let stored: u64 = extents.iter().map(|(_, l)| l).sum();
            h.set_size(stored);
            // An empty list, or a file that ends in a hole, ends with an entry of no length at
            // its size (so the reader knows where the file ends).
            let mut list: Vec<(u64, u64)> = extents.to_vec();
            if list.last().is_none_or(|(o, l)| o + l < size) {
                list.push((size, 0));
            }
            let gnu = h
                .as_gnu_mut()
                .unwrap_or_else(|| unreachable!("a GNU header"));
            octal(&mut gnu.realsize, size);
            let (first, rest) = list.split_at(list.len().min(4));
            for (slot, (o, l)) in gnu.sparse.iter_mut().zip(first) {
                octal(&mut slot.offset, *o);
                octal(&mut slot.numbytes, *l);
            }
            gnu.isextended[0] = u8::from(!rest.is_empty());
            let chunks: Vec<&[(u64, u64)]> = rest.chunks(21).collect();
            for (i, chunk) in chunks.iter().enumerate() {
                let mut block = tar::GnuExtSparseHeader::new();
                for (slot, (o, l)) in block.sparse.iter_mut().zip(chunk.iter()) {
                    octal(&mut slot.offset, *o);
                    octal(&mut slot.numbytes, *l);
                }
                block.isextended[0] = u8::from(i + 1 < chunks.len());
                let mut b = [0u8; BLOCK];
                b.copy_from_slice(block.as_bytes());
                ext.push(b);
            }
        }
        OutKind::Symlink(target) => {
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_mode(0o777);
            h.set_size(0);
            if h.set_link_name_literal(target).is_err() {
                out.extend_from_slice(&long_entry(b'K', target));
                let keep = h.as_old().linkname.len();
                h.as_old_mut().linkname.copy_from_slice(&target[..keep]);
            }
        }
    }
    let name_len = h.as_old().name.len();
    if path_bytes.len() > name_len {
        out.extend_from_slice(&long_entry(b'L', &path_bytes));
        h.as_old_mut().name.copy_from_slice(&path_bytes[..name_len]);
    } else {
        h.as_old_mut().name[..path_bytes.len()].copy_from_slice(&path_bytes);
    }
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    for b in ext {
        out.extend_from_slice(&b);
    }
}

/// The end-of-archive marker.
pub(super) fn end(out: &mut Vec<u8>) {
    out.extend_from_slice(&ZEROS);
}

/// Zeros that pad `size` bytes of data to the next block.
pub(super) fn pad(out: &mut Vec<u8>, size: u64) {
    out.extend_from_slice(&ZEROS[..padding(size)]);
}

/// A GNU long-name (`L`) or long-link (`K`) entry carrying `value`, as GNU tar writes it.
fn long_entry(kind: u8, value: &[u8]) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    let name = b"././@LongLink";
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(value.len() as u64 + 1);
    h.set_entry_type(tar::EntryType::new(kind));
    h.set_cksum();
    let mut b = Vec::with_capacity(2 * BLOCK + value.len());
    b.extend_from_slice(h.as_bytes());
    b.extend_from_slice(value);
    b.push(0);
    b.extend_from_slice(&ZEROS[..padding(value.len() as u64 + 1)]);
    b
}

/// Writes `v` as a NUL-terminated octal number filling `field` (12 bytes: up to 8 GiB - 1...
/// and beyond, as GNU tar does, in base-256 when it does not fit).
fn octal(field: &mut [u8], v: u64) {
    let digits = field.len() - 1;
    let s = format!("{v:o}");
    if s.len() <= digits {
        let start = digits - s.len();
        field[..start].fill(b'0');
        field[start..digits].copy_from_slice(s.as_bytes());
        field[digits] = 0;
    } else {
        // GNU base-256: the first byte's high bit set, the value big-endian in the rest.
        field.fill(0);
        let n = field.len();
        field[n - 8..].copy_from_slice(&v.to_be_bytes());
        field[0] |= 0x80;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Reads a tar back with the `tar` crate: (path, kind byte, contents, link target).
    fn entries_of(tar: &[u8]) -> Vec<(String, u8, Vec<u8>, Option<String>)> {
        let mut a = tar::Archive::new(tar);
        a.entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let mut data = Vec::new();
                e.read_to_end(&mut data).unwrap();
                (
                    e.path().unwrap().display().to_string(),
                    e.header().entry_type().as_byte(),
                    data,
                    e.link_name().unwrap().map(|l| l.display().to_string()),
                )
            })
            .collect()
    }

    #[test]
    fn long_names_links_and_sparse_files_read_back_with_the_tar_crate() {
        let mut out = Vec::new();
        let long = format!("{}/{}", "d".repeat(120), "f".repeat(150));
        let target = "t/".repeat(90);
        header(&mut out, Path::new("dir"), OutKind::Dir, 0o755, 7);
        header(
            &mut out,
            Path::new(&long),
            OutKind::File { size: 3 },
            0o644,
            7,
        );
        out.extend_from_slice(b"abc");
        pad(&mut out, 3);
        header(
            &mut out,
            Path::new("l"),
            OutKind::Symlink(target.as_bytes()),
            0,
            7,
        );
        // A sparse file of 1 MiB + 10 bytes with 30 extents (so two extension blocks) and a
        // hole at its end, then one that is all hole.
        let extents: Vec<(u64, u64)> = (0..30).map(|i| (i * 32_768, 512)).collect();
        let size = (1 << 20) + 10;
        header(
            &mut out,
            Path::new("sparse"),
            OutKind::Sparse {
                size,
                extents: &extents,
            },
            0o600,
            7,
        );
        for i in 0..30u8 {
            out.extend_from_slice(&[i + 1; 512]);
        }
        header(
            &mut out,
            Path::new("hole"),
            OutKind::Sparse {
                size: 50 << 20,
                extents: &[],
            },
            0o600,
            7,
        );
        end(&mut out);
        let got = entries_of(&out);
        assert_eq!(got[0].0, "dir/");
        assert_eq!(got[0].1, b'5');
        assert_eq!(
            (got[1].0.as_str(), got[1].2.as_slice()),
            (long.as_str(), &b"abc"[..])
        );
        assert_eq!(got[2].3.as_deref(), Some(target.as_str()));
        let sparse = &got[3].2;
        assert_eq!(sparse.len() as u64, size);
        for i in 0..30usize {
            let at = i * 32_768;
            assert!(
                sparse[at..at + 512].iter().all(|b| *b == i as u8 + 1),
                "{i}"
            );
            assert!(sparse[at + 512..at + 1024].iter().all(|b| *b == 0));
        }
        assert!(sparse[30 * 32_768..].iter().all(|b| *b == 0));
        assert_eq!(got[4].2.len() as u64, 50 << 20, "50 MiB of hole");
    }

    #[test]
    fn octal_fields_fall_back_to_base_256() {
        let mut f = [0u8; 12];
        octal(&mut f, 0o1234);
        assert_eq!(&f, b"00000001234\0");
        octal(&mut f, 1 << 40);
        assert_eq!(f[0], 0x80);
        assert_eq!(u64::from_be_bytes(f[4..].try_into().unwrap()), 1 << 40);
    }
}
