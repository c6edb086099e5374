//! `gridlease cp LEASE:PATH DST`: a path of a lease's workspace onto this machine.
//!
//! What arrives is never trusted more than the provider's own checks: every name must be
//! relative and stay below the destination (a parent that resolves elsewhere refuses the
//! file), symlinks must stay inside it, files are created anew (never written through), runs of
//! zeros become holes (a sparse file stays sparse here), and no more than the limit of data
//! is written. What cannot land safely is left out with a warning, not the whole copy.

use std::collections::BTreeMap;
use std::path::{Component, Path};
use std::time::{Duration, Instant};

use anyhow::Context;
use gridlease_protocol::transfer::{
    MAX_SKIP_BYTES, MAX_TRANSFER_FRAME, SAME_ENTRY_OVERHEAD, SKIP_ENTRY_OVERHEAD, SameFile,
    TransferFrame, workspace_relative,
};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use backon::RetryableWithContext;

use super::{CopyReport, FILE_BUFFER, Journal, LeftOut, Lost, bar, retry_delays, retryable};
use crate::access::frames;
use crate::api::client::ApiClient;
use crate::output::Printer;

/// Blocks of zeros this long (or a file's zero tail) are left as holes.
const HOLE_BLOCK: usize = 4096;
/// A block of zeros to compare with (a slice comparison is one `memcmp`).
static ZERO_BLOCK: [u8; HOLE_BLOCK] = [0; HOLE_BLOCK];

/// Whether `block` (at most [`HOLE_BLOCK`] bytes) is all zeros.
fn zeros(block: &[u8]) -> bool {
    block == &ZERO_BLOCK[..block.len()]
}

/// What a download has done so far, over its attempts.
#[derive(Default)]
struct Progress {
    files: u64,
    bytes: u64,
    /// Left out, by path (an attempt after a lost connection may name one again).
    left_out: BTreeMap<String, String>,
}

impl Progress {
    /// Records an entry left out and warns about it (on stderr, above the progress bar).
    fn leave_out(
        &mut self,
        out: &Printer,
        bar: &indicatif::ProgressBar,
        path: String,
        reason: String,
    ) {
        if let std::collections::btree_map::Entry::Vacant(slot) = self.left_out.entry(path) {
            let path = slot.key();
            bar.suspend(|| out.status(&format!("warning: left out {path}: {reason}")));
            slot.insert(reason);
        }
    }
}

pub(crate) async fn download(
    api: &ApiClient,
    out: &Printer,
    lease: &str,
    path: &str,
    dst: &Path,
    max_size: Option<u64>,
) -> anyhow::Result<CopyReport> {
    download_with(api, out, lease, path, dst, max_size, &[]).await
}

/// [`download`] of a directory into a local copy of it made by an earlier download: files
/// the copy has with the same size and modification time are not sent again (only what
/// changed travels; files gone on the provider stay here). For a job's checkpoints.
pub(crate) async fn download_changed(
    api: &ApiClient,
    out: &Printer,
    lease: &str,
    path: &str,
    dst: &Path,
) -> anyhow::Result<CopyReport> {
    let dir = dst.to_path_buf();
    let same = tokio::task::spawn_blocking(move || local_files(&dir))
        .await
        .map_err(anyhow::Error::msg)??;
    download_with(api, out, lease, path, dst, None, &same).await
}

/// The regular files under `dir` (none when it does not exist), relative to it, with their
/// size and modification time; at most [`super::MAX_ENTRIES`].
fn local_files(dir: &Path) -> anyhow::Result<Vec<SameFile>> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", d.display())),
        };
        for e in entries {
            let e = e?;
            let meta = e.path().symlink_metadata()?;
            if meta.is_dir() {
                stack.push(e.path());
            } else if meta.is_file() {
                let rel = e.path().strip_prefix(dir)?.to_string_lossy().into_owned();
                out.push(SameFile {
                    path: rel,
                    size: meta.len(),
                    mtime: meta.mtime(),
                });
                anyhow::ensure!(
                    out.len() <= super::MAX_ENTRIES,
                    "{} holds more than {} files",
                    dir.display(),
                    super::MAX_ENTRIES
                );
            }
        }
    }
    Ok(out)
}

/// [`download`], leaving out the files of `same` that did not change.
async fn download_with(
    api: &ApiClient,
    out: &Printer,
    lease: &str,
    path: &str,
    dst: &Path,
    max_size: Option<u64>,
    same: &[SameFile],
) -> anyhow::Result<CopyReport> {
    let started = Instant::now();
    let rel = workspace_relative(path).map_err(anyhow::Error::msg)?;
    let view = api.lease(lease).await?;
    let id = view.lease_id.to_string();
    // Never more data than the lease's disk could hold, unless the renter says otherwise.
    let limit = max_size.or((view.disk_bytes > 0).then_some(view.disk_bytes));
    let target = std::path::absolute(dst)?;
    let journal = Journal::open(
        api.home(),
        &format!("download\n{id}\n{rel}\n{}", target.display()),
    )?;
    let skipped = journal.done.len() as u64;
    let progress = bar(out, None, "downloading");
    let mut retries = 0u64;
    // Each attempt resumes where the last one stopped: the journal and the progress so far
    // pass from one attempt to the next.
    let (id_ref, rel_ref, target_ref, progress_ref) = (&id, &rel, &target, &progress);
    let attempt = move |(mut journal, mut done): (Journal, Progress)| async move {
        let left = limit.map(|l| l.saturating_sub(done.bytes));
        let r = download_once(
            api,
            out,
            id_ref,
            rel_ref,
            target_ref,
            (left, same),
            &mut journal,
            progress_ref,
            &mut done,
        )
        .await;
        ((journal, done), r)
    };
    let ((journal, done), result) = attempt
        .retry(retry_delays())
        .context((journal, Progress::default()))
        .when(retryable)
        .notify(|e, _| {
            retries += 1;
            progress.println(format!("{e:#}; resuming"));
        })
        .await;
    if let Err(e) = result {
        progress.abandon();
        let files = done.files;
        return Err(if retryable(&e) {
            e.context(format!(
                "download interrupted; run the same `gridlease cp` again to resume ({files} file(s) copied so far)"
            ))
        } else if files > 0 {
            e.context(format!("download failed after {files} file(s)"))
        } else {
            e.context("download failed")
        });
    }
    progress.finish_and_clear();
    journal.finish();
    Ok(CopyReport {
        direction: "download",
        files: done.files,
        skipped,
        bytes: done.bytes,
        seconds: started.elapsed().as_secs_f64(),
        retries,
        left_out: done
            .left_out
            .into_iter()
            .map(|(path, reason)| LeftOut { path, reason })
            .collect(),
    })
}

/// Checks a name from the provider: relative, plain components only.
fn safe_relative(p: &Path) -> bool {
    p.components().all(|c| matches!(c, Component::Normal(_)))
}

/// Whether symlink `target` at `name` (relative to the destination) stays below it: relative,
/// never climbing above the destination from the link's directory.
fn link_stays_below(name: &Path, target: &Path) -> bool {
    if target.is_absolute() || target.as_os_str().is_empty() {
        return false;
    }
    let mut depth = name.parent().map_or(0, |p| p.components().count());
    for c in target.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return false,
            },
            _ => return false,
        }
    }
    true
}

/// Writes the regular file `entry` at `dest` (below `root`, or `root` itself), the way
/// `unpack_in` would but in large writes (see [`FILE_BUFFER`]): the parent must resolve inside
/// `root` (an earlier entry's symlink cannot redirect it), whatever is at `dest` is replaced
/// (never written through: the file is created anew, `O_EXCL`), mode bits and mtime kept.
/// Blocks of zeros are skipped over, so they stay holes. Returns the bytes of data written.
async fn write_file<R: tokio::io::AsyncRead + Unpin>(
    entry: &mut tokio_tar::Entry<R>,
    root: &Path,
    dest: &Path,
) -> anyhow::Result<u64> {
    use std::os::unix::fs::OpenOptionsExt;
    let header = entry.header();
    let mode = header.mode().unwrap_or(0o644) & 0o777;
    let mtime = header.mtime().ok();
    if dest != root {
        let parent = dest.parent().unwrap_or(root);
        tokio::fs::create_dir_all(parent)
            .await
            .with_context(|| format!("cannot create {}", parent.display()))?;
        let (real_parent, real_root) = (
            tokio::fs::canonicalize(parent).await?,
            tokio::fs::canonicalize(root).await?,
        );
        anyhow::ensure!(
            real_parent.starts_with(&real_root),
            "the provider sent {} through a symlink that leaves the destination",
            dest.display()
        );
    }
    match tokio::fs::symlink_metadata(dest).await {
        Ok(m) if m.is_dir() => anyhow::bail!("{} is a directory", dest.display()),
        Ok(_) => tokio::fs::remove_file(dest).await?,
        Err(_) => {}
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true).mode(mode);
    let mut f = tokio::fs::OpenOptions::from(opts)
        .open(dest)
        .await
        .with_context(|| format!("cannot create {}", dest.display()))?;
    let mut buf = vec![0u8; FILE_BUFFER];
    // Where the next byte of the file goes, and where the file's position is.
    let (mut at, mut pos) = (0u64, 0u64);
    let mut written = 0u64;
    loop {
        let mut n = 0;
        while n < buf.len() {
            let k = entry.read(&mut buf[n..]).await?;
            if k == 0 {
                break;
            }
            n += k;
        }
        if n == 0 {
            break;
        }
        let mut i = 0;
        while i < n {
            // A run of blocks that hold data, written at once; a block of zeros is skipped.
            let mut end = i;
            while end < n && !zeros(&buf[end..(end + HOLE_BLOCK).min(n)]) {
                end = (end + HOLE_BLOCK).min(n);
            }
            if end > i {
                let from = at + i as u64;
                if pos != from {
                    f.seek(std::io::SeekFrom::Start(from)).await?;
                }
                f.write_all(&buf[i..end]).await?;
                pos = from + (end - i) as u64;
                written += (end - i) as u64;
                i = end;
            } else {
                i = (i + HOLE_BLOCK).min(n);
            }
        }
        at += n as u64;
    }
    f.flush().await?;
    let f = f.into_std().await;
    tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::PermissionsExt;
        // A file that ends in zeros ends in a hole: its size is set, not written.
        f.set_len(at)?;
        // The umask may have narrowed the mode at creation.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        if let Some(t) = mtime {
            f.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(t))?;
        }
        Ok::<_, std::io::Error>(())
    })
    .await??;
    Ok(written)
}

/// Sends the journal's files as `Skip` frames of bounded size, then `Go`.
async fn ask<W: tokio::io::AsyncWrite + Unpin>(
    wr: &mut W,
    journal: &Journal,
    max_bytes: Option<u64>,
    same: &[SameFile],
) -> std::io::Result<()> {
    let mut batch = Vec::new();
    let mut size = 0;
    for p in journal.done.iter() {
        if size + p.len() + SKIP_ENTRY_OVERHEAD > MAX_SKIP_BYTES {
            frames::write::<_, MAX_TRANSFER_FRAME, _>(
                wr,
                &TransferFrame::Skip(std::mem::take(&mut batch)),
            )
            .await?;
            size = 0;
        }
        size += p.len() + SKIP_ENTRY_OVERHEAD;
        batch.push(p.clone());
    }
    if !batch.is_empty() {
        frames::write::<_, MAX_TRANSFER_FRAME, _>(wr, &TransferFrame::Skip(batch)).await?;
    }
    let mut batch = Vec::new();
    let mut size = 0;
    for f in same.iter().filter(|f| !journal.done.contains(&f.path)) {
        if size + f.path.len() + SAME_ENTRY_OVERHEAD > MAX_SKIP_BYTES {
            frames::write::<_, MAX_TRANSFER_FRAME, _>(
                wr,
                &TransferFrame::SkipSame(std::mem::take(&mut batch)),
            )
            .await?;
            size = 0;
        }
        size += f.path.len() + SAME_ENTRY_OVERHEAD;
        batch.push(f.clone());
    }
    if !batch.is_empty() {
        frames::write::<_, MAX_TRANSFER_FRAME, _>(wr, &TransferFrame::SkipSame(batch)).await?;
    }
    frames::send::<_, MAX_TRANSFER_FRAME, _>(wr, &TransferFrame::Go { max_bytes }).await
}

/// One download attempt; what it wrote and left out is added to `done`.
#[allow(clippy::too_many_arguments)]
async fn download_once(
    api: &ApiClient,
    out: &Printer,
    id: &str,
    rel: &str,
    target: &Path,
    (max_bytes, same): (Option<u64>, &[SameFile]),
    journal: &mut Journal,
    progress: &indicatif::ProgressBar,
    done: &mut Progress,
) -> anyhow::Result<()> {
    #[derive(Serialize)]
    struct Body<'a> {
        path: &'a str,
    }
    let io = api
        .upgrade(&format!("/v1/leases/{id}/download"), &Body { path: rel })
        .await?;
    let (mut rd, mut wr) = tokio::io::split(io);
    let lost = |e: std::io::Error| anyhow::Error::from(Lost(e.to_string()));
    ask(&mut wr, journal, max_bytes, same).await.map_err(lost)?;
    let directory = match frames::read::<TransferFrame, MAX_TRANSFER_FRAME, _>(&mut rd).await {
        Ok(Some(TransferFrame::Root { directory })) => directory,
        Ok(Some(TransferFrame::Error(e))) => anyhow::bail!("the provider: {e}"),
        Ok(Some(other)) => anyhow::bail!("the provider answered {other:?}"),
        Ok(None) => return Err(Lost("no answer to the download".into()).into()),
        Err(e) => return Err(lost(e)),
    };
    if directory {
        std::fs::create_dir_all(target)
            .with_context(|| format!("cannot create {}", target.display()))?;
    } else if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)?;
    }
    // Chunks go to the unpacker as they came (no copy), a few at a time; what the provider
    // left out is reported as it is named.
    let (tar_w, tar_r) = frames::chunk_pipe(8);
    let (left_tx, mut left_rx) = tokio::sync::mpsc::channel::<(String, String)>(64);
    let receive = async move {
        let mut tally = frames::Tally::default();
        loop {
            match frames::read_transfer(&mut rd).await {
                Ok(Some(frames::Incoming::Chunk(b))) => {
                    tally.update(&b);
                    // An unpacker that stopped gives its own error; the stream is still
                    // read to its end and checked.
                    let _ = tar_w.send(Ok(b)).await;
                }
                Ok(Some(frames::Incoming::Frame(TransferFrame::Skipped { path, reason }))) => {
                    let _ = left_tx.send((path, reason)).await;
                }
                Ok(Some(frames::Incoming::Frame(TransferFrame::End { bytes, blake3 }))) => {
                    let n = tally.bytes();
                    if !tally.matches(bytes, &blake3) {
                        // The unpacker must not take a damaged stream's end for a clean one.
                        let _ = tar_w
                            .send(Err(std::io::Error::other("the download arrived damaged")))
                            .await;
                        anyhow::bail!(
                            "the download arrived damaged ({n} bytes received, {bytes} sent, or the checksum differs)"
                        );
                    }
                    return Ok(());
                }
                Ok(Some(frames::Incoming::Frame(TransferFrame::Error(e)))) => {
                    anyhow::bail!("the provider: {e}")
                }
                Ok(Some(frames::Incoming::Frame(other))) => {
                    anyhow::bail!("the provider sent {other:?}")
                }
                Ok(None) => return Err(Lost("the stream ended early".into()).into()),
                Err(e) => return Err(Lost(e.to_string()).into()),
            }
        }
    };
    let before = done.bytes;
    let unpack = async {
        let mut archive = tokio_tar::ArchiveBuilder::new(tar_r)
            .set_allow_external_symlinks(false)
            .set_preserve_permissions(true)
            .build();
        let mut entries = archive.entries()?;
        use futures::StreamExt;
        loop {
            // The provider's own list of what it left out, as it comes.
            while let Ok((path, reason)) = left_rx.try_recv() {
                done.leave_out(out, progress, path, reason);
            }
            let Some(e) = entries.next().await else { break };
            let mut e = e?;
            let name = e.path()?.into_owned();
            let shown = name.display().to_string();
            if !safe_relative(&name) {
                done.leave_out(
                    out,
                    progress,
                    shown,
                    "its name leaves the destination".into(),
                );
                continue;
            }
            let kind = e.header().entry_type();
            if kind.is_file() || kind.is_gnu_sparse() {
                let size = e.effective_size();
                // Stored bytes: a sparse file's holes cost nothing here.
                let stored = e.header().raw_entry_size().unwrap_or(size);
                if max_bytes.is_some_and(|m| (done.bytes - before).saturating_add(stored) > m) {
                    let max = max_bytes.unwrap_or(0);
                    done.leave_out(
                        out,
                        progress,
                        shown,
                        format!("it would pass the download's limit of {max} bytes (gridlease cp --max-size)"),
                    );
                    continue;
                }
                let dest = if directory {
                    target.join(&name)
                } else {
                    target.to_path_buf()
                };
                let written = write_file(&mut e, target, &dest).await?;
                done.files += 1;
                done.bytes += written;
                progress.inc(size);
                journal.record([shown])?;
            } else if kind.is_symlink() {
                let link = e.link_name()?.map(|l| l.into_owned()).unwrap_or_default();
                if !directory || !link_stays_below(&name, &link) {
                    done.leave_out(
                        out,
                        progress,
                        shown,
                        format!("a symlink to {}, outside the destination", link.display()),
                    );
                    continue;
                }
                e.unpack_in(target).await?;
            } else if kind.is_dir() {
                if directory {
                    e.unpack_in(target).await?;
                }
            } else {
                done.leave_out(
                    out,
                    progress,
                    shown,
                    "not a file, directory or symlink".into(),
                );
            }
        }
        Ok::<_, anyhow::Error>(())
    };
    let r = tokio::try_join!(receive, unpack);
    while let Ok((path, reason)) = left_rx.try_recv() {
        done.leave_out(out, progress, path, reason);
    }
    r.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn tar_with(name: &str, data: &[u8], mode: u32) -> Vec<u8> {
        let mut b = tokio_tar::Builder::new(Vec::new());
        let mut h = tokio_tar::Header::new_gnu();
        h.set_entry_type(tokio_tar::EntryType::Regular);
        h.set_mode(mode);
        h.set_mtime(1_600_000_000);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, name, data).await.unwrap();
        b.into_inner().await.unwrap()
    }

    async fn write_first(tar: Vec<u8>, root: &Path, dest: &Path) -> anyhow::Result<u64> {
        use futures::StreamExt;
        let mut a = tokio_tar::Archive::new(tar.as_slice());
        let mut es = a.entries().unwrap();
        let mut e = es.next().await.unwrap().unwrap();
        write_file(&mut e, root, dest).await
    }

    #[tokio::test]
    async fn downloaded_files_keep_mode_and_time_and_never_leave_the_destination() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("dst");
        std::fs::create_dir_all(&root).unwrap();
        let dest = root.join("sub/f.bin");
        write_first(tar_with("sub/f.bin", b"hello", 0o750).await, &root, &dest)
            .await
            .unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"hello");
        let m = std::fs::metadata(&dest).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o750);
        assert_eq!(m.mtime(), 1_600_000_000);
        // An existing file is replaced, a symlink in its place is not written through.
        let outside = d.path().join("outside");
        std::fs::write(&outside, b"keep").unwrap();
        let link = root.join("l");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        write_first(tar_with("l", b"new", 0o644).await, &root, &link)
            .await
            .unwrap();
        assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
        assert_eq!(std::fs::read(&link).unwrap(), b"new");
        // A parent that is a symlink out of the destination is refused.
        let away = d.path().join("away");
        std::fs::create_dir_all(&away).unwrap();
        std::os::unix::fs::symlink(&away, root.join("esc")).unwrap();
        let err = write_first(
            tar_with("esc/x", b"x", 0o644).await,
            &root,
            &root.join("esc/x"),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("leaves the destination"), "{err}");
        assert!(!away.join("x").exists());
    }

    #[tokio::test]
    async fn zeros_are_written_as_holes() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let mut data = vec![0u8; 8 << 20];
        data[3 << 20..(3 << 20) + 10].copy_from_slice(b"0123456789");
        let dest = d.path().join("f");
        let written = write_first(tar_with("f", &data, 0o644).await, d.path(), &dest)
            .await
            .unwrap();
        assert_eq!(written, HOLE_BLOCK as u64, "one block of data");
        assert_eq!(std::fs::read(&dest).unwrap(), data);
        let m = std::fs::metadata(&dest).unwrap();
        assert!(m.blocks() * 512 <= 64 * 1024, "{} blocks", m.blocks());
    }

    #[test]
    fn links_must_stay_below_the_destination() {
        assert!(link_stays_below(Path::new("a/l"), Path::new("../b")));
        assert!(!link_stays_below(Path::new("a/l"), Path::new("../../b")));
        assert!(!link_stays_below(Path::new("l"), Path::new("/etc")));
        assert!(!link_stays_below(Path::new("l"), Path::new("")));
    }
}
