//! `gridlease cp SRC LEASE:PATH`: a local tree into a lease's workspace, in batches.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use gridlease_protocol::transfer::{
    MAX_CHUNK, MAX_TRANSFER_FRAME, TransferFrame, workspace_relative,
};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use backon::Retryable;

use super::{
    BATCH_BYTES, BATCH_ENTRIES, CopyReport, FILE_BUFFER, IN_FLIGHT, Journal, Lost, MAX_ENTRIES,
    bar, retry_delays, retryable,
};
use crate::access::frames;
use crate::api::client::ApiClient;
use crate::output::Printer;

/// One local entry to upload.
#[derive(Clone, Debug)]
struct Item {
    /// Name inside the workspace.
    name: String,
    /// Local path.
    path: PathBuf,
    kind: Kind,
    /// Modification time, unix seconds (kept on the provider's side).
    mtime: u64,
    /// Journal line (name, size, mtime): a changed file is sent again.
    key: String,
}

#[derive(Clone, Debug)]
enum Kind {
    File { size: u64, mode: u32 },
    Dir { mode: u32 },
    Symlink(PathBuf),
}

fn item(name: String, path: PathBuf) -> anyhow::Result<Item> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let m = std::fs::symlink_metadata(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let mode = m.permissions().mode() & 0o777;
    let kind = if m.file_type().is_symlink() {
        Kind::Symlink(std::fs::read_link(&path)?)
    } else if m.is_dir() {
        Kind::Dir { mode }
    } else if m.is_file() {
        Kind::File {
            size: m.len(),
            mode,
        }
    } else {
        anyhow::bail!(
            "{} is not a file, directory or symlink; cp copies only those",
            path.display()
        );
    };
    let key = format!(
        "{name}\t{}\t{}",
        m.len(),
        m.mtime_nsec() + m.mtime() * 1_000_000_000
    );
    Ok(Item {
        name,
        path,
        kind,
        mtime: u64::try_from(m.mtime()).unwrap_or(0),
        key,
    })
}

/// The entries of `src` named below `dest` (a workspace-relative path), parents first.
fn walk(src: &Path, dest: &str) -> anyhow::Result<Vec<Item>> {
    let mut out = Vec::new();
    // The destination's ancestors, as directories the tenant owns.
    let parts: Vec<&str> = dest.split('/').filter(|p| !p.is_empty()).collect();
    let root = item(dest.to_string(), src.to_path_buf())?;
    for i in 1..parts.len() {
        out.push(Item {
            name: parts[..i].join("/"),
            path: PathBuf::new(),
            kind: Kind::Dir { mode: 0o755 },
            mtime: 0,
            key: String::new(),
        });
    }
    if dest.is_empty() && !matches!(root.kind, Kind::Dir { .. }) {
        anyhow::bail!(
            "copying a file to the workspace root needs a file name: LEASE:/workspace/NAME"
        );
    }
    let mut stack = vec![root];
    while let Some(it) = stack.pop() {
        if let Kind::Dir { .. } = it.kind {
            let mut children: Vec<_> = std::fs::read_dir(&it.path)
                .with_context(|| format!("cannot list {}", it.path.display()))?
                .collect::<Result<_, _>>()?;
            children.sort_by_key(|e| e.file_name());
            for c in children.into_iter().rev() {
                let n = c.file_name();
                let n = n
                    .to_str()
                    .with_context(|| format!("{:?} is not UTF-8", c.path()))?;
                let name = if it.name.is_empty() {
                    n.to_string()
                } else {
                    format!("{}/{n}", it.name)
                };
                stack.push(item(name, c.path())?);
            }
        }
        if !it.name.is_empty() {
            out.push(it);
        }
        anyhow::ensure!(
            out.len() <= MAX_ENTRIES,
            "{} has more than {MAX_ENTRIES} entries",
            src.display()
        );
    }
    Ok(out)
}

pub(crate) async fn upload(
    api: &ApiClient,
    out: &Printer,
    src: &Path,
    lease: &str,
    path: &str,
) -> anyhow::Result<CopyReport> {
    let started = Instant::now();
    let dest = workspace_relative(path).map_err(anyhow::Error::msg)?;
    let view = api.lease(lease).await?;
    let id = view.lease_id.to_string();
    let items = walk(src, &dest)?;
    let mut journal = Journal::open(
        api.home(),
        &format!("upload\n{id}\n{}\n{dest}", src.canonicalize()?.display()),
    )?;
    let todo: Vec<&Item> = items
        .iter()
        .filter(|i| i.key.is_empty() || !journal.done.contains(&i.key))
        .collect();
    let skipped = items
        .iter()
        .filter(|i| matches!(i.kind, Kind::File { .. }) && journal.done.contains(&i.key))
        .count() as u64;
    let total: u64 = todo
        .iter()
        .map(|i| match i.kind {
            Kind::File { size, .. } => size,
            _ => 0,
        })
        .sum();
    let progress = bar(out, Some(total), "uploading");
    let mut batches: Vec<Vec<&Item>> = Vec::new();
    let mut current: Vec<&Item> = Vec::new();
    let mut batch_bytes = 0u64;
    for it in todo {
        let size = match it.kind {
            Kind::File { size, .. } => size,
            _ => 0,
        };
        if !current.is_empty()
            && (batch_bytes + size > BATCH_BYTES || current.len() >= BATCH_ENTRIES)
        {
            batches.push(std::mem::take(&mut current));
            batch_bytes = 0;
        }
        current.push(it);
        batch_bytes += size;
    }
    if !current.is_empty() {
        batches.push(current);
    }
    // Each batch also carries the directories above its entries, so it extracts the same
    // whichever batch Docker finishes first.
    let dirs: std::collections::HashMap<&str, &Item> = items
        .iter()
        .filter(|i| matches!(i.kind, Kind::Dir { .. }))
        .map(|i| (i.name.as_str(), i))
        .collect();
    let sends: Vec<Vec<&Item>> = batches
        .iter()
        .map(|batch| with_ancestors(batch, &dirs))
        .collect();
    use futures::StreamExt;
    let retries = std::sync::atomic::AtomicU64::new(0);
    let progress = &progress;
    let retries_ref = &retries;
    let id = id.as_str();
    // Batches go [`IN_FLIGHT`] at a time (a batch's end waits for Docker to finish extracting
    // it; the next one streams meanwhile) and are recorded in order as each is confirmed.
    let mut confirmed = futures::stream::iter(sends.iter().map(|send| async move {
        // A failed attempt's error comes with the bytes it had counted on the bar, which a
        // retry takes back off it.
        (|| async move {
            let counted = std::sync::atomic::AtomicU64::new(0);
            upload_batch(api, id, send, progress, &counted)
                .await
                .map_err(|e| (e, counted.into_inner()))
        })
        .retry(retry_delays())
        .when(|(e, _)| retryable(e))
        .notify(|(e, counted), _| {
            retries_ref.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            progress.dec(*counted);
            progress.println(format!("{e:#}; retrying"));
        })
        .await
        .map_err(|(e, _)| e)
    }))
    .buffered(IN_FLIGHT);
    let (mut files, mut bytes) = (0u64, 0u64);
    for batch in &batches {
        match confirmed.next().await {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                progress.abandon();
                return Err(if retryable(&e) {
                    e.context(format!(
                        "upload interrupted; run the same `gridlease cp` again to resume ({files} file(s) copied so far)"
                    ))
                } else if files > 0 {
                    e.context(format!("upload failed after {files} file(s)"))
                } else {
                    e.context("upload failed")
                });
            }
            None => anyhow::bail!("internal: fewer upload results than batches"),
        }
        for it in batch {
            if let Kind::File { size, .. } = it.kind {
                files += 1;
                bytes += size;
            }
        }
        journal.record(
            batch
                .iter()
                .filter(|i| !i.key.is_empty())
                .map(|i| i.key.clone()),
        )?;
    }
    drop(confirmed);
    let retries = retries.into_inner();
    progress.finish_and_clear();
    journal.finish();
    Ok(CopyReport {
        direction: "upload",
        files,
        skipped,
        bytes,
        seconds: started.elapsed().as_secs_f64(),
        retries,
        left_out: Vec::new(),
    })
}

/// `batch` preceded by the directories above its entries that it does not hold itself,
/// parents first.
fn with_ancestors<'a>(
    batch: &[&'a Item],
    dirs: &std::collections::HashMap<&str, &'a Item>,
) -> Vec<&'a Item> {
    let inside: HashSet<&str> = batch.iter().map(|i| i.name.as_str()).collect();
    let mut above: Vec<&'a Item> = Vec::new();
    let mut seen = HashSet::new();
    for it in batch {
        let mut name = it.name.as_str();
        while let Some((parent, _)) = name.rsplit_once('/') {
            name = parent;
            if inside.contains(parent) || !seen.insert(parent) {
                continue;
            }
            if let Some(d) = dirs.get(parent) {
                above.push(d);
            }
        }
    }
    above.sort_by_key(|d| d.name.matches('/').count());
    above.extend(batch.iter().copied());
    above
}

/// Sends one batch as a tar stream on a fresh access stream; returns once the provider
/// extracted it and confirmed the checksum.
async fn upload_batch(
    api: &ApiClient,
    id: &str,
    batch: &[&Item],
    progress: &indicatif::ProgressBar,
    counted: &std::sync::atomic::AtomicU64,
) -> anyhow::Result<()> {
    #[derive(Serialize)]
    struct Body<'a> {
        dest: &'a str,
    }
    let io = api
        .upgrade(&format!("/v1/leases/{id}/upload"), &Body { dest: "" })
        .await?;
    let (mut rd, mut wr) = tokio::io::split(io);
    let (tar_w, mut tar_r) = tokio::io::duplex(256 * 1024);
    let build = async move {
        // Buffered: the tar code copies in 8 KiB steps, each a wake-up on the pipe otherwise.
        let mut b =
            tokio_tar::Builder::new(tokio::io::BufWriter::with_capacity(FILE_BUFFER, tar_w));
        for it in batch {
            let mut h = tokio_tar::Header::new_gnu();
            // The file's own time: a tool that compares times (Python's bytecode cache, make)
            // must see an upload as new.
            h.set_mtime(it.mtime);
            match &it.kind {
                Kind::Dir { mode } => {
                    h.set_entry_type(tokio_tar::EntryType::Directory);
                    h.set_mode(*mode);
                    h.set_size(0);
                    b.append_data(&mut h, &it.name, tokio::io::empty()).await?;
                }
                Kind::Symlink(target) => {
                    h.set_entry_type(tokio_tar::EntryType::Symlink);
                    h.set_mode(0o777);
                    h.set_size(0);
                    h.set_link_name(target).with_context(|| {
                        format!("symlink {} -> {}", it.path.display(), target.display())
                    })?;
                    b.append_data(&mut h, &it.name, tokio::io::empty()).await?;
                }
                Kind::File { size, mode } => {
                    let f = tokio::fs::File::open(&it.path)
                        .await
                        .with_context(|| format!("cannot read {}", it.path.display()))?;
                    h.set_entry_type(tokio_tar::EntryType::Regular);
                    h.set_mode(*mode);
                    h.set_size(*size);
                    // Read in large blocks: each read of a tokio file is a trip to the
                    // blocking pool.
                    let f = tokio::io::BufReader::with_capacity(FILE_BUFFER, f.take(*size));
                    b.append_data(&mut h, &it.name, f).await?;
                }
            }
        }
        let mut w = b.into_inner().await?;
        w.flush().await?;
        w.into_inner().shutdown().await?;
        Ok::<_, anyhow::Error>(())
    };
    let pump = async {
        let mut tally = frames::Tally::default();
        let mut buf = vec![0u8; MAX_CHUNK];
        loop {
            let k = tar_r.read(&mut buf).await?;
            if k == 0 {
                break;
            }
            tally.update(&buf[..k]);
            progress.inc(k as u64);
            counted.fetch_add(k as u64, std::sync::atomic::Ordering::Relaxed);
            frames::write_chunk(&mut wr, &buf[..k])
                .await
                .map_err(|e| Lost(e.to_string()))?;
        }
        frames::send::<_, MAX_TRANSFER_FRAME, _>(&mut wr, &tally.end())
            .await
            .map_err(|e| Lost(e.to_string()))?;
        Ok::<_, anyhow::Error>(())
    };
    // The provider answers once it has everything, or at once when it refuses an entry (it
    // then reads no more): the answer is awaited while sending.
    let answer = frames::read::<TransferFrame, MAX_TRANSFER_FRAME, _>(&mut rd);
    tokio::pin!(answer);
    let sending = async { tokio::try_join!(build, pump) };
    let answered = tokio::select! {
        sent = sending => match sent {
            Ok(_) => answer.await,
            // The send broke: a refusal may be why, and may have arrived.
            Err(e) => match tokio::time::timeout(Duration::from_secs(5), &mut answer).await {
                Ok(Ok(Some(TransferFrame::Error(reason)))) => {
                    anyhow::bail!("the provider: {reason}")
                }
                _ => return Err(e),
            },
        },
        a = &mut answer => a,
    };
    match answered {
        Ok(Some(TransferFrame::Done { .. })) => Ok(()),
        Ok(Some(TransferFrame::Error(e))) => anyhow::bail!("the provider: {e}"),
        Ok(Some(other)) => anyhow::bail!("the provider answered {other:?}"),
        Ok(None) => Err(Lost("no answer to the upload".into()).into()),
        Err(e) => Err(Lost(e.to_string()).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_upload_batch_carries_the_directories_above_it() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("src/sub/deep")).unwrap();
        std::fs::write(d.path().join("src/a"), b"a").unwrap();
        std::fs::write(d.path().join("src/sub/deep/b"), b"bb").unwrap();
        let items = walk(&d.path().join("src"), "x/data").unwrap();
        let dirs: std::collections::HashMap<&str, &Item> = items
            .iter()
            .filter(|i| matches!(i.kind, Kind::Dir { .. }))
            .map(|i| (i.name.as_str(), i))
            .collect();
        let b = items
            .iter()
            .find(|i| i.name == "x/data/sub/deep/b")
            .unwrap();
        let sent = with_ancestors(&[b], &dirs);
        let names: Vec<&str> = sent.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "x",
                "x/data",
                "x/data/sub",
                "x/data/sub/deep",
                "x/data/sub/deep/b"
            ]
        );
        // A directory the batch holds itself is not sent twice.
        let deep = items.iter().find(|i| i.name == "x/data/sub/deep").unwrap();
        let sent = with_ancestors(&[deep, b], &dirs);
        let names: Vec<&str> = sent.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "x",
                "x/data",
                "x/data/sub",
                "x/data/sub/deep",
                "x/data/sub/deep/b"
            ]
        );
    }

    #[test]
    fn a_tree_walks_parents_first_below_its_destination() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("src/sub")).unwrap();
        std::fs::write(d.path().join("src/a"), b"a").unwrap();
        std::fs::write(d.path().join("src/sub/b"), b"bb").unwrap();
        std::os::unix::fs::symlink("a", d.path().join("src/link")).unwrap();
        let items = walk(&d.path().join("src"), "x/data").unwrap();
        let names: Vec<&str> = items.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "x",
                "x/data",
                "x/data/a",
                "x/data/link",
                "x/data/sub",
                "x/data/sub/b"
            ]
        );
        assert!(matches!(items[3].kind, Kind::Symlink(_)));
        // A file needs a name in the workspace.
        assert!(walk(&d.path().join("src/a"), "").is_err());
        let one = walk(&d.path().join("src/a"), "m/a.bin").unwrap();
        assert_eq!(
            one.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
            ["m", "m/a.bin"]
        );
    }
}
