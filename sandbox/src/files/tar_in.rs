//! [`TarReader`]: a push parser over the pieces of a tar stream as they arrive from the
//! network, checking every header before anything is done with an entry.

use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;

use super::{BLOCK, MAX_ENTRIES, MAX_LINK, TransferError, bad_header, padding};

/// Most bytes of a GNU long name or long link entry.
pub const MAX_LONG_NAME: u64 = 64 * 1024;
/// Most bytes of one PAX extended header (per entry or global).
pub const MAX_PAX: u64 = 1 << 20;

/// What an entry is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file; its data follows as [`Event::Data`].
    File,
    /// A directory.
    Dir,
    /// A symbolic link to this target (bytes as sent).
    Symlink(Vec<u8>),
    /// Anything else (hard link, device, FIFO, GNU sparse file...): the tar type byte.
    Other(u8),
}

/// One checked entry header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its path: relative, plain components only (no root, no `..`, no `.`), never empty.
    pub path: PathBuf,
    /// What it is.
    pub kind: EntryKind,
    /// Its permission bits (the low 12 bits of the header's mode).
    pub mode: u32,
    /// Its modification time, unix seconds.
    pub mtime: u64,
    /// Bytes of data that follow (files only; other entries' data is dropped).
    pub size: u64,
}

/// What the parser found in a piece of input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// An entry starts.
    Entry(Entry),
    /// A piece of the current file's data: a slice of the input, not a copy.
    Data(Bytes),
}

/// Where a [`TarReader`] is in its input.
#[derive(Clone, Copy, Debug)]
enum State {
    /// Collecting a 512-byte header.
    Header,
    /// Collecting the data of an extension entry (GNU long name `L` or link `K`, PAX `x` or
    /// `g`) of `size` bytes.
    Extension { kind: u8, size: usize },
    /// Passing (`emit`) or dropping `left` bytes of an entry's data, then `pad` bytes of
    /// padding.
    Data { left: u64, pad: usize, emit: bool },
    /// Dropping `left` bytes of padding.
    Padding { left: usize },
    /// Past the end-of-archive block: the rest is ignored.
    End,
}

/// What extension entries said about the next entry.
#[derive(Debug, Default)]
struct Pending {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
}

/// Checks a tar entry path: relative, no `..` and no root; `.` components are dropped. The
/// empty path (`.` or `./`) is `Ok(None)`: the archive's own root directory.
pub fn entry_path(raw: &Path) -> Result<Option<PathBuf>, String> {
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir => {}
            _ => return Err("the path leaves the destination".into()),
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// The tar format as a push parser: [`push`](Self::push) takes the next piece of the stream and
/// appends what it found to `out` (checked entry headers, and the current file's data as slices
/// of the very buffers it was given). Headers are checked (checksum, size, path); GNU long
/// names and links and PAX `path`, `linkpath` and `size` are understood; nothing else of a
/// header reaches the caller. Memory is bounded: a header, or one extension entry (at most
/// 64 KiB for long names, 1 MiB for PAX headers). At most [`MAX_ENTRIES`] entries.
#[derive(Debug)]
pub struct TarReader {
    state: State,
    /// A header or an extension's data, being collected.
    acc: bytes::BytesMut,
    pending: Pending,
    seen: u64,
}

impl Default for TarReader {
    fn default() -> Self {
        Self::new()
    }
}

impl TarReader {
    /// A reader at the start of a stream.
    pub fn new() -> Self {
        TarReader {
            state: State::Header,
            acc: bytes::BytesMut::new(),
            pending: Pending::default(),
            seen: 0,
        }
    }

    /// Entries read so far.
    pub fn entries(&self) -> u64 {
        self.seen
    }

    /// Takes the next piece of the stream. An error refuses the whole stream.
    pub fn push(&mut self, mut input: Bytes, out: &mut Vec<Event>) -> Result<(), TransferError> {
        while !input.is_empty() {
            match self.state {
                State::Header => {
                    if self.collect(&mut input, BLOCK) {
                        let block = self.acc.split().freeze();
                        self.header(&block, out)?;
                    }
                }
                State::Extension { kind, size } => {
                    if self.collect(&mut input, size) {
                        let data = self.acc.split().freeze();
                        self.extension(kind, &data)?;
                        self.state = State::Padding {
                            left: padding(size as u64),
                        };
                    }
                }
                State::Data { left, pad, emit } => {
                    let take = usize::try_from(left).unwrap_or(usize::MAX).min(input.len());
                    let piece = input.split_to(take);
                    if emit {
                        out.push(Event::Data(piece));
                    }
                    let left = left - take as u64;
                    self.state = if left > 0 {
                        State::Data { left, pad, emit }
                    } else {
                        State::Padding { left: pad }
                    };
                }
                State::Padding { left } => {
                    let take = left.min(input.len());
                    let _ = input.split_to(take);
                    self.state = State::Padding { left: left - take };
                }
                State::End => return Ok(()),
            }
            if let State::Padding { left: 0 } = self.state {
                self.state = State::Header;
            }
        }
        Ok(())
    }

    /// The stream ended. One that ended inside an entry is refused (a truncated stream); one
    /// that ends between entries without an end block is accepted, as tar readers do.
    pub fn finish(&self) -> Result<u64, TransferError> {
        let between_entries = matches!(self.state, State::Header)
            && self.acc.is_empty()
            && self.pending.path.is_none()
            && self.pending.link.is_none()
            && self.pending.size.is_none();
        if !(between_entries || matches!(self.state, State::End)) {
            return Err(TransferError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the archive ended inside an entry",
            )));
        }
        Ok(self.seen)
    }

    /// Moves bytes from `input` into `acc` until it holds `want`; whether it does.
    fn collect(&mut self, input: &mut Bytes, want: usize) -> bool {
        let take = (want - self.acc.len()).min(input.len());
        self.acc.extend_from_slice(&input.split_to(take));
        self.acc.len() == want
    }

    fn extension(&mut self, kind: u8, data: &[u8]) -> Result<(), TransferError> {
        match kind {
            b'L' => self.pending.path = Some(until_nul(data).to_vec()),
            b'K' => self.pending.link = Some(until_nul(data).to_vec()),
            b'x' => {
                for ext in tar::PaxExtensions::new(data) {
                    let ext = ext.map_err(|e| bad_header(format!("a PAX header: {e}")))?;
                    match ext.key_bytes() {
                        b"path" => self.pending.path = Some(ext.value_bytes().to_vec()),
                        b"linkpath" => self.pending.link = Some(ext.value_bytes().to_vec()),
                        b"size" => {
                            let size = ext
                                .value()
                                .ok()
                                .and_then(|v| v.parse::<u64>().ok())
                                .ok_or_else(|| bad_header("a PAX size that is not a number"))?;
                            self.pending.size = Some(size);
                        }
                        _ => {}
                    }
                }
            }
            // A global PAX header carries nothing for us.
            _ => {}
        }
        Ok(())
    }

    fn header(&mut self, block: &[u8], out: &mut Vec<Event>) -> Result<(), TransferError> {
        if block.iter().all(|b| *b == 0) {
            self.state = State::End;
            return Ok(());
        }
        let h = tar::Header::from_byte_slice(block);
        let sum: u32 = block[..148]
            .iter()
            .chain(&[b' '; 8])
            .chain(&block[156..])
            .map(|b| u32::from(*b))
            .sum();
        if h.cksum().ok() != Some(sum) {
            return Err(bad_header("a header's checksum does not match"));
        }
        let kind = h.entry_type().as_byte();
        let size = h.entry_size().map_err(|e| bad_header(e.to_string()))?;
        let cap = match kind {
            b'L' | b'K' => Some(MAX_LONG_NAME),
            b'x' | b'g' => Some(MAX_PAX),
            _ => None,
        };
        if let Some(cap) = cap {
            if size > cap {
                return Err(bad_header(format!(
                    "an extension header of {size} bytes (at most {cap})"
                )));
            }
            self.state = if size == 0 {
                State::Header
            } else {
                State::Extension {
                    kind,
                    size: size as usize,
                }
            };
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending);
        let size = pending.size.unwrap_or(size);
        let raw_bytes = pending.path.unwrap_or_else(|| h.path_bytes().into_owned());
        let link = pending
            .link
            .or_else(|| h.link_name_bytes().map(|l| l.into_owned()));
        // Whatever happens to the entry, its data is consumed.
        let pad = padding(size);
        self.state = if size == 0 {
            State::Header
        } else {
            State::Data {
                left: size,
                pad,
                emit: false,
            }
        };
        let raw = Path::new(std::ffi::OsStr::from_bytes(&raw_bytes));
        let refuse = |problem: String| TransferError::Refused {
            path: raw.display().to_string(),
            problem,
        };
        self.seen += 1;
        if self.seen > MAX_ENTRIES {
            return Err(refuse(format!("more than {MAX_ENTRIES} entries")));
        }
        let kind = match kind {
            b'0' | b'\0' | b'7' => EntryKind::File,
            b'5' => EntryKind::Dir,
            b'2' => {
                let target = link.ok_or_else(|| refuse("a symlink without a target".into()))?;
                if target.is_empty() || target.len() > MAX_LINK {
                    return Err(refuse(format!(
                        "a symlink target must be 1 to {MAX_LINK} bytes"
                    )));
                }
                EntryKind::Symlink(target)
            }
            other => EntryKind::Other(other),
        };
        let Some(path) = entry_path(raw).map_err(refuse)? else {
            // The archive's root directory (`./`): nothing to make.
            if kind == EntryKind::Dir {
                return Ok(());
            }
            return Err(refuse("an entry without a name".into()));
        };
        let is_file = kind == EntryKind::File;
        out.push(Event::Entry(Entry {
            path,
            kind,
            mode: h.mode().unwrap_or(0o644) & 0o7777,
            mtime: h.mtime().unwrap_or(0),
            size: if is_file { size } else { 0 },
        }));
        if is_file && size > 0 {
            self.state = State::Data {
                left: size,
                pad,
                emit: true,
            };
        }
        Ok(())
    }
}

fn until_nul(data: &[u8]) -> &[u8] {
    data.iter()
        .position(|b| *b == 0)
        .map_or(data, |n| &data[..n])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `tar` in pieces of `piece` bytes; the events with data pieces joined per file.
    fn read_in_pieces(tar: &[u8], piece: usize) -> Result<Vec<(Entry, Vec<u8>)>, TransferError> {
        let mut r = TarReader::new();
        let mut events = Vec::new();
        for p in tar.chunks(piece.max(1)) {
            r.push(Bytes::copy_from_slice(p), &mut events)?;
        }
        r.finish()?;
        let mut out: Vec<(Entry, Vec<u8>)> = Vec::new();
        for e in events {
            match e {
                Event::Entry(en) => out.push((en, Vec::new())),
                Event::Data(d) => out.last_mut().unwrap().1.extend_from_slice(&d),
            }
        }
        Ok(out)
    }

    /// An archive with what real ones carry: GNU long names and long link targets, PAX
    /// headers (a path, a size, an xattr), a file whose size is not a multiple of 512, an
    /// empty file, a directory with data, a root entry and a tail after the end blocks.
    /// (path, kind, data) of an expected entry.
    type Want = (String, EntryKind, Vec<u8>);

    fn awkward_tar() -> (Vec<u8>, Vec<Want>) {
        let long_dir = "d".repeat(120);
        let long_file = format!("{long_dir}/{}", "f".repeat(150));
        let long_target = format!("{}x", "t/".repeat(90));
        let big: Vec<u8> = (0..70_001u32).map(|i| (i * 31 % 251) as u8).collect();
        let mut b = tar::Builder::new(Vec::new());
        let mut dir = tar::Header::new_gnu();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_mode(0o755);
        dir.set_size(0);
        b.append_data(&mut dir.clone(), "./", std::io::empty())
            .unwrap();
        b.append_data(&mut dir.clone(), &long_dir, std::io::empty())
            .unwrap();
        let mut f = tar::Header::new_gnu();
        f.set_entry_type(tar::EntryType::Regular);
        f.set_mode(0o6755);
        f.set_size(big.len() as u64);
        b.append_data(&mut f.clone(), &long_file, big.as_slice())
            .unwrap();
        f.set_size(0);
        b.append_data(&mut f.clone(), "empty", std::io::empty())
            .unwrap();
        let mut l = tar::Header::new_gnu();
        l.set_entry_type(tar::EntryType::Symlink);
        l.set_size(0);
        b.append_link(&mut l, "link", &long_target).unwrap();
        b.append_pax_extensions([
            ("path", &b"pax/named"[..]),
            ("SCHILY.xattr.user.x", &b"v"[..]),
        ])
        .unwrap();
        f.set_size(5);
        b.append_data(&mut f.clone(), "ignored-name", &b"hello"[..])
            .unwrap();
        // A directory entry that (wrongly) carries data: the data is dropped.
        dir.set_size(3);
        dir.set_path("withdata").unwrap();
        dir.set_cksum();
        b.append(&dir, &b"xyz"[..]).unwrap();
        let mut tar = b.into_inner().unwrap();
        tar.extend_from_slice(&[7; 300]);
        let want = vec![
            (long_dir.clone(), EntryKind::Dir, vec![]),
            (long_file, EntryKind::File, big),
            ("empty".into(), EntryKind::File, vec![]),
            (
                "link".into(),
                EntryKind::Symlink(long_target.into_bytes()),
                vec![],
            ),
            ("pax/named".into(), EntryKind::File, b"hello".to_vec()),
            ("withdata".into(), EntryKind::Dir, vec![]),
        ];
        (tar, want)
    }

    #[test]
    fn the_reader_gives_the_same_entries_however_the_input_is_cut() {
        let (tar, want) = awkward_tar();
        for piece in [1, 2, 7, 100, 511, 512, 513, 1000, 4096, 65_536, tar.len()] {
            let got = read_in_pieces(&tar, piece).unwrap();
            assert_eq!(got.len(), want.len(), "pieces of {piece}");
            for ((e, data), (path, kind, wdata)) in got.iter().zip(&want) {
                assert_eq!(e.path, PathBuf::from(path), "pieces of {piece}");
                assert_eq!(&e.kind, kind, "{path}");
                assert_eq!(data, wdata, "{path}");
            }
        }
        let got = read_in_pieces(&tar, 4096).unwrap();
        assert_eq!(
            got[1].0.mode, 0o6755,
            "mode bits as sent; the writer drops them"
        );
    }

    #[test]
    fn file_data_leaves_the_reader_as_slices_of_its_input() {
        let data = vec![5u8; 300_000];
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, "f", data.as_slice()).unwrap();
        let input = Bytes::from(b.into_inner().unwrap());
        let range = input.as_ptr() as usize..input.as_ptr() as usize + input.len();
        let mut r = TarReader::new();
        let mut out = Vec::new();
        r.push(input.clone(), &mut out).unwrap();
        let Some(Event::Data(d)) = out.get(1) else {
            panic!("{out:?}")
        };
        assert_eq!(d.len(), data.len());
        assert!(range.contains(&(d.as_ptr() as usize)), "not copied");
    }

    #[test]
    fn damaged_truncated_escaping_or_oversized_archives_are_refused() {
        let (tar, _) = awkward_tar();
        // Cut inside the big file's data, inside a header, inside an extension.
        for cut in [1200, 2500, 40_000, 1024 + 100] {
            let err = read_in_pieces(&tar[..cut], 4096).unwrap_err();
            assert!(err.to_string().contains("ended inside"), "{cut}: {err}");
        }
        let mut bad = tar.clone();
        bad[3] ^= 1;
        let err = read_in_pieces(&bad, 4096).unwrap_err();
        assert!(err.to_string().contains("checksum"), "{err}");
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
        h.set_entry_type(tar::EntryType::new(b'L'));
        h.set_size(MAX_LONG_NAME + 1);
        h.set_cksum();
        let err = read_in_pieces(h.as_bytes(), 512).unwrap_err();
        assert!(err.to_string().contains("extension header"), "{err}");
        // Paths that leave the destination, written raw (the tar crate refuses to write them).
        for name in [&b"../etc/passwd"[..], b"/etc/passwd", b"a/../../b"] {
            let mut h = tar::Header::new_old();
            h.as_old_mut().name[..name.len()].copy_from_slice(name);
            h.set_size(0);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            h.set_cksum();
            let err = read_in_pieces(h.as_bytes(), 512).unwrap_err();
            assert!(
                matches!(err, TransferError::Refused { .. }),
                "{}: {err}",
                String::from_utf8_lossy(name)
            );
        }
        // No entries and no end block: an empty archive, as tar readers take it.
        assert!(read_in_pieces(&[], 1).unwrap().is_empty());
    }

    #[test]
    fn entry_paths_are_plain_and_relative() {
        assert_eq!(
            entry_path(Path::new("./b//c")).unwrap(),
            Some(PathBuf::from("b/c"))
        );
        assert_eq!(entry_path(Path::new("./")).unwrap(), None);
        assert!(entry_path(Path::new("../etc/passwd")).is_err());
        assert!(entry_path(Path::new("/etc/passwd")).is_err());
    }
}
