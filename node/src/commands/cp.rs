//! `gridlease cp SRC LEASE:PATH` and `gridlease cp LEASE:PATH DST`: files and directories into
//! and out of a running lease's `/workspace`, over the P2P link (an access stream, see
//! `gridlease_protocol::transfer`), streamed (fixed buffers), checksummed (SHA-256 of each
//! transfer's tar bytes, checked by the receiver), and resumable: what was copied is recorded in
//! a journal under `<home>/transfers/`, so after a lost connection (retried at once) or a
//! killed command (run it again) completed files are not sent again.
//!
//! `SRC` lands at `PATH` (like `cp -r SRC PATH` when `PATH` does not exist; an existing
//! directory is merged into). Uploads go in batches of at most [`BATCH_BYTES`] or
//! [`BATCH_ENTRIES`]: a batch is recorded once the provider extracted it and the checksum
//! matched, so an interrupted upload resends at most one batch. Downloads record each file as
//! it is written.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use gridlease_protocol::transfer::{
    MAX_CHUNK, MAX_SKIP_BYTES, MAX_TRANSFER_FRAME, SKIP_ENTRY_OVERHEAD, TransferFrame,
    workspace_relative,
};
use serde::Serialize;
use sha2::Digest as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::access::frames;
use crate::api::client::{ApiClient, ClientError};
use crate::output::Printer;

/// Most file bytes in one upload batch.
pub const BATCH_BYTES: u64 = 64 << 20;
/// Most entries in one upload batch.
pub const BATCH_ENTRIES: usize = 2048;
/// Attempts per batch (or download) before giving up on a lost connection.
pub const ATTEMPTS: usize = 5;
/// Most entries of a local tree sent in one `cp`.
pub const MAX_ENTRIES: usize = 1_000_000;

/// Arguments of `gridlease cp`.
#[derive(Debug, Args)]
pub struct CpArgs {
    /// Source: a local path, or `LEASE:PATH` (PATH inside `/workspace`).
    #[arg(value_name = "SRC")]
    pub src: String,
    /// Destination: `LEASE:PATH`, or a local path.
    #[arg(value_name = "DST")]
    pub dst: String,
}

/// One side of a copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Loc {
    /// A path on this machine.
    Local(PathBuf),
    /// A path in a lease's workspace.
    Remote {
        /// Lease id or unique prefix.
        lease: String,
        /// Path inside `/workspace`.
        path: String,
    },
}

impl Loc {
    /// `LEASE:PATH` when the part before the first `:` is 4 or more hex digits, else local.
    pub fn parse(s: &str) -> Self {
        if let Some((lease, path)) = s.split_once(':')
            && lease.len() >= 4
            && lease.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Self::Remote {
                lease: lease.to_ascii_lowercase(),
                path: path.to_string(),
            };
        }
        Self::Local(PathBuf::from(s))
    }
}

/// What a `cp` did (`--json`).
#[derive(Clone, Debug, Serialize)]
pub struct CopyReport {
    /// `upload` or `download`.
    pub direction: &'static str,
    /// Files copied by this run.
    pub files: u64,
    /// Files left out because an earlier, interrupted run of the same copy had copied them.
    pub skipped: u64,
    /// Bytes of file data copied by this run.
    pub bytes: u64,
    /// Wall time, seconds.
    pub seconds: f64,
    /// Connections lost and retried.
    pub retries: u64,
}

/// `gridlease cp`.
pub async fn run(api: &ApiClient, out: &Printer, a: &CpArgs) -> anyhow::Result<u8> {
    let report = match (Loc::parse(&a.src), Loc::parse(&a.dst)) {
        (Loc::Local(src), Loc::Remote { lease, path }) => {
            upload(api, out, &src, &lease, &path).await?
        }
        (Loc::Remote { lease, path }, Loc::Local(dst)) => {
            download(api, out, &lease, &path, &dst).await?
        }
        (Loc::Remote { .. }, Loc::Remote { .. }) => {
            anyhow::bail!("both sides are leases; copy through this machine in two steps")
        }
        (Loc::Local(_), Loc::Local(_)) => {
            anyhow::bail!(
                "neither side is a lease: write one as LEASE:PATH (e.g. 5612757b:/workspace/data)"
            )
        }
    };
    out.emit(&report, |p| {
        p.line(&format!(
            "{} {} file(s), {:.1} MiB in {:.1} s ({:.1} MiB/s){}",
            if report.direction == "upload" {
                "uploaded"
            } else {
                "downloaded"
            },
            report.files,
            report.bytes as f64 / 1048576.0,
            report.seconds,
            report.bytes as f64 / 1048576.0 / report.seconds.max(1e-3),
            if report.skipped > 0 {
                format!("; {} already copied by an earlier run", report.skipped)
            } else {
                String::new()
            }
        ));
    });
    Ok(0)
}

/// The journal of one copy: the entries already copied, one per line, appended and synced.
struct Journal {
    path: PathBuf,
    done: HashSet<String>,
}

impl Journal {
    fn open(home: &Path, key: &str) -> anyhow::Result<Self> {
        let dir = home.join("transfers");
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let digest = sha2::Sha256::digest(key.as_bytes());
        let path = dir.join(format!("{}.journal", hex::encode(&digest[..12])));
        let done = match std::fs::read_to_string(&path) {
            Ok(t) => t.lines().map(str::to_string).collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => HashSet::new(),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        Ok(Self { path, done })
    }

    fn record(&mut self, lines: impl IntoIterator<Item = String>) -> anyhow::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        let mut text = String::new();
        for l in lines {
            text.push_str(&l);
            text.push('\n');
            self.done.insert(l);
        }
        f.write_all(text.as_bytes())?;
        f.sync_data()?;
        Ok(())
    }

    fn finish(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One local entry to upload.
#[derive(Clone, Debug)]
struct Item {
    /// Name inside the workspace.
    name: String,
    /// Local path.
    path: PathBuf,
    kind: Kind,
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

fn bar(out: &Printer, total: Option<u64>, what: &str) -> indicatif::ProgressBar {
    let b = match total {
        Some(t) => indicatif::ProgressBar::new(t),
        None => indicatif::ProgressBar::new_spinner(),
    };
    let template = if total.is_some() {
        format!("{what} {{bar:30}} {{bytes}}/{{total_bytes}} {{bytes_per_sec}} {{eta}}")
    } else {
        format!("{what} {{spinner}} {{bytes}} {{bytes_per_sec}}")
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(&template) {
        b.set_style(style);
    }
    if out.quiet || out.json || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        b.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    b
}

/// Whether a failed attempt is worth another: the connection, not the provider's answer.
fn retryable(e: &anyhow::Error) -> bool {
    match e.downcast_ref::<ClientError>() {
        Some(ClientError::Transport(_)) | Some(ClientError::Api { status: 502, .. }) => true,
        Some(_) => false,
        None => e.downcast_ref::<Lost>().is_some(),
    }
}

/// The stream broke before the transfer ended.
#[derive(Debug, thiserror::Error)]
#[error("the connection to the provider was lost: {0}")]
struct Lost(String);

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
    let (mut files, mut bytes, mut retries) = (0u64, 0u64, 0u64);
    for batch in &batches {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let position = progress.position();
            match upload_batch(api, &id, batch, &progress).await {
                Ok(()) => break,
                Err(e) if retryable(&e) && attempt < ATTEMPTS => {
                    retries += 1;
                    progress.set_position(position);
                    progress.println(format!("{e:#}; retrying"));
                    tokio::time::sleep(Duration::from_millis(500 * attempt as u64)).await;
                }
                Err(e) => {
                    progress.abandon();
                    return Err(e.context(format!(
                        "upload interrupted; run the same `gridlease cp` again to resume ({files} file(s) copied so far)"
                    )));
                }
            }
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
    progress.finish_and_clear();
    journal.finish();
    Ok(CopyReport {
        direction: "upload",
        files,
        skipped,
        bytes,
        seconds: started.elapsed().as_secs_f64(),
        retries,
    })
}

/// Sends one batch as a tar stream on a fresh access stream; returns once the provider
/// extracted it and confirmed the checksum.
async fn upload_batch(
    api: &ApiClient,
    id: &str,
    batch: &[&Item],
    progress: &indicatif::ProgressBar,
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
        let mut b = tokio_tar::Builder::new(tar_w);
        for it in batch {
            let mut h = tokio_tar::Header::new_gnu();
            h.set_mtime(0);
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
                    b.append_data(&mut h, &it.name, f.take(*size)).await?;
                }
            }
        }
        b.into_inner().await?.shutdown().await?;
        Ok::<_, anyhow::Error>(())
    };
    let pump = async {
        let mut sha = sha2::Sha256::new();
        let mut n = 0u64;
        let mut buf = vec![0u8; MAX_CHUNK];
        loop {
            let k = tar_r.read(&mut buf).await?;
            if k == 0 {
                break;
            }
            sha.update(&buf[..k]);
            n += k as u64;
            progress.inc(k as u64);
            frames::write::<_, MAX_TRANSFER_FRAME, _>(
                &mut wr,
                &TransferFrame::Chunk(buf[..k].to_vec()),
            )
            .await
            .map_err(|e| Lost(e.to_string()))?;
        }
        frames::send::<_, MAX_TRANSFER_FRAME, _>(
            &mut wr,
            &TransferFrame::End {
                bytes: n,
                sha256: sha.finalize().into(),
            },
        )
        .await
        .map_err(|e| Lost(e.to_string()))?;
        Ok::<_, anyhow::Error>(())
    };
    tokio::try_join!(build, pump)?;
    match frames::read::<TransferFrame, MAX_TRANSFER_FRAME, _>(&mut rd).await {
        Ok(Some(TransferFrame::Done { .. })) => Ok(()),
        Ok(Some(TransferFrame::Error(e))) => anyhow::bail!("the provider: {e}"),
        Ok(Some(other)) => anyhow::bail!("the provider answered {other:?}"),
        Ok(None) => Err(Lost("no answer to the upload".into()).into()),
        Err(e) => Err(Lost(e.to_string()).into()),
    }
}

pub(crate) async fn download(
    api: &ApiClient,
    out: &Printer,
    lease: &str,
    path: &str,
    dst: &Path,
) -> anyhow::Result<CopyReport> {
    let started = Instant::now();
    let rel = workspace_relative(path).map_err(anyhow::Error::msg)?;
    let view = api.lease(lease).await?;
    let id = view.lease_id.to_string();
    let target = std::path::absolute(dst)?;
    let mut journal = Journal::open(
        api.home(),
        &format!("download\n{id}\n{rel}\n{}", target.display()),
    )?;
    let skipped = journal.done.len() as u64;
    let progress = bar(out, None, "downloading");
    let (mut files, mut bytes, mut retries) = (0u64, 0u64, 0u64);
    let mut attempt = 0;
    loop {
        attempt += 1;
        match download_once(api, &id, &rel, &target, &mut journal, &progress).await {
            Ok((f, b)) => {
                files += f;
                bytes += b;
                break;
            }
            Err((e, f, b)) => {
                files += f;
                bytes += b;
                if retryable(&e) && attempt < ATTEMPTS {
                    retries += 1;
                    progress.println(format!("{e:#}; resuming"));
                    tokio::time::sleep(Duration::from_millis(500 * attempt as u64)).await;
                    continue;
                }
                progress.abandon();
                return Err(e.context(format!(
                    "download interrupted; run the same `gridlease cp` again to resume ({files} file(s) copied so far)"
                )));
            }
        }
    }
    progress.finish_and_clear();
    journal.finish();
    Ok(CopyReport {
        direction: "download",
        files,
        skipped,
        bytes,
        seconds: started.elapsed().as_secs_f64(),
        retries,
    })
}

/// Checks a name from the provider: relative, plain components only.
fn safe_relative(p: &Path) -> bool {
    p.components().all(|c| matches!(c, Component::Normal(_)))
}

/// One download attempt: files and bytes written, and on failure why.
async fn download_once(
    api: &ApiClient,
    id: &str,
    rel: &str,
    target: &Path,
    journal: &mut Journal,
    progress: &indicatif::ProgressBar,
) -> Result<(u64, u64), (anyhow::Error, u64, u64)> {
    #[derive(Serialize)]
    struct Body<'a> {
        path: &'a str,
    }
    let io = api
        .upgrade(&format!("/v1/leases/{id}/download"), &Body { path: rel })
        .await
        .map_err(|e| (e.into(), 0, 0))?;
    let (mut rd, mut wr) = tokio::io::split(io);
    let lost = |e: std::io::Error| (anyhow::Error::from(Lost(e.to_string())), 0, 0);
    // What earlier attempts wrote, in frames of bounded size.
    let mut batch = Vec::new();
    let mut size = 0;
    for p in journal.done.iter() {
        if size + p.len() + SKIP_ENTRY_OVERHEAD > MAX_SKIP_BYTES {
            frames::write::<_, MAX_TRANSFER_FRAME, _>(
                &mut wr,
                &TransferFrame::Skip(std::mem::take(&mut batch)),
            )
            .await
            .map_err(lost)?;
            size = 0;
        }
        size += p.len() + SKIP_ENTRY_OVERHEAD;
        batch.push(p.clone());
    }
    if !batch.is_empty() {
        frames::write::<_, MAX_TRANSFER_FRAME, _>(&mut wr, &TransferFrame::Skip(batch))
            .await
            .map_err(lost)?;
    }
    frames::send::<_, MAX_TRANSFER_FRAME, _>(&mut wr, &TransferFrame::Go)
        .await
        .map_err(lost)?;
    let directory = match frames::read::<TransferFrame, MAX_TRANSFER_FRAME, _>(&mut rd).await {
        Ok(Some(TransferFrame::Root { directory })) => directory,
        Ok(Some(TransferFrame::Error(e))) => {
            return Err((anyhow::anyhow!("the provider: {e}"), 0, 0));
        }
        Ok(Some(other)) => return Err((anyhow::anyhow!("the provider answered {other:?}"), 0, 0)),
        Ok(None) => return Err((Lost("no answer to the download".into()).into(), 0, 0)),
        Err(e) => return Err(lost(e)),
    };
    if directory {
        std::fs::create_dir_all(target)
            .with_context(|| format!("cannot create {}", target.display()))
            .map_err(|e| (e, 0, 0))?;
    } else if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|e| (e.into(), 0, 0))?;
    }
    let (mut tar_w, tar_r) = tokio::io::duplex(256 * 1024);
    let receive = async move {
        let mut sha = sha2::Sha256::new();
        let mut n = 0u64;
        loop {
            match frames::read::<TransferFrame, MAX_TRANSFER_FRAME, _>(&mut rd).await {
                Ok(Some(TransferFrame::Chunk(b))) => {
                    sha.update(&b);
                    n += b.len() as u64;
                    tar_w.write_all(&b).await?;
                }
                Ok(Some(TransferFrame::End { bytes, sha256 })) => {
                    let got: [u8; 32] = sha.finalize().into();
                    anyhow::ensure!(
                        bytes == n && sha256 == got,
                        "the download arrived damaged ({n} bytes received, {bytes} sent, or the SHA-256 differs)"
                    );
                    tar_w.shutdown().await?;
                    return Ok(());
                }
                Ok(Some(TransferFrame::Error(e))) => anyhow::bail!("the provider: {e}"),
                Ok(Some(other)) => anyhow::bail!("the provider sent {other:?}"),
                Ok(None) => return Err(Lost("the stream ended early".into()).into()),
                Err(e) => return Err(Lost(e.to_string()).into()),
            }
        }
    };
    let mut files = 0u64;
    let mut bytes = 0u64;
    let unpack = async {
        let mut archive = tokio_tar::ArchiveBuilder::new(tar_r)
            .set_allow_external_symlinks(false)
            .set_preserve_permissions(true)
            .build();
        let mut entries = archive.entries()?;
        use futures::StreamExt;
        while let Some(e) = entries.next().await {
            let mut e = e?;
            let name = e.path()?.into_owned();
            anyhow::ensure!(
                safe_relative(&name),
                "the provider sent an entry {name:?} outside the destination"
            );
            let size = e.effective_size();
            let regular = e.header().entry_type().is_file();
            if directory {
                e.unpack_in(target).await?;
            } else {
                e.unpack(target).await?;
            }
            if regular {
                files += 1;
                bytes += size;
                progress.inc(size);
                journal.record([name.display().to_string()])?;
            }
        }
        Ok::<_, anyhow::Error>(())
    };
    let r = tokio::try_join!(receive, unpack);
    match r {
        Ok(_) => Ok((files, bytes)),
        Err(e) => Err((e, files, bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_paths_and_local_paths_are_told_apart() {
        assert_eq!(
            Loc::parse("5612abcd:/workspace/x"),
            Loc::Remote {
                lease: "5612abcd".into(),
                path: "/workspace/x".into()
            }
        );
        assert_eq!(Loc::parse("./data"), Loc::Local("./data".into()));
        assert_eq!(Loc::parse("C:/x"), Loc::Local("C:/x".into()));
        assert_eq!(Loc::parse("notes:today"), Loc::Local("notes:today".into()));
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
