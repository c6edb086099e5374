//! `gridlease cp SRC LEASE:PATH` and `gridlease cp LEASE:PATH DST`: files and directories into
//! and out of a running lease's `/workspace`, over the P2P link (an access stream, see
//! `gridlease_protocol::transfer`), streamed (fixed buffers), checksummed (BLAKE3 of each
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
/// Upload batches streaming or awaiting their confirmation at once.
pub const IN_FLIGHT: usize = 2;
/// Most entries in one upload batch.
pub const BATCH_ENTRIES: usize = 2048;
/// Attempts per batch (or download) before giving up on a lost connection.
pub const ATTEMPTS: usize = 5;
/// Read and write buffer for local files (each read or write of a tokio file is a trip to the
/// blocking pool: in 8 KiB steps they cost more CPU than the rest of a copy together).
const FILE_BUFFER: usize = 1 << 20;
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
        let mut attempt = 0;
        loop {
            attempt += 1;
            let counted = std::sync::atomic::AtomicU64::new(0);
            match upload_batch(api, id, send, progress, &counted).await {
                Ok(()) => return Ok(()),
                Err(e) if retryable(&e) && attempt < ATTEMPTS => {
                    retries_ref.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    progress.dec(counted.into_inner());
                    progress.println(format!("{e:#}; retrying"));
                    tokio::time::sleep(Duration::from_millis(500 * attempt as u64)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }))
    .buffered(IN_FLIGHT);
    let (mut files, mut bytes) = (0u64, 0u64);
    for batch in &batches {
        match confirmed.next().await {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                progress.abandon();
                return Err(e.context(format!(
                    "upload interrupted; run the same `gridlease cp` again to resume ({files} file(s) copied so far)"
                )));
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

/// Writes the regular file `entry` at `dest` (below `root`, or `root` itself), the way
/// `unpack_in` would but in large writes (see [`FILE_BUFFER`]): the parent must resolve inside
/// `root` (an earlier entry's symlink cannot redirect it), whatever is at `dest` is replaced
/// (never written through: the file is created anew, `O_EXCL`), mode bits and mtime kept.
async fn write_file<R: tokio::io::AsyncRead + Unpin>(
    entry: &mut tokio_tar::Entry<R>,
    root: &Path,
    dest: &Path,
) -> anyhow::Result<()> {
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
    let f = tokio::fs::OpenOptions::from(opts)
        .open(dest)
        .await
        .with_context(|| format!("cannot create {}", dest.display()))?;
    let mut w = tokio::io::BufWriter::with_capacity(FILE_BUFFER, f);
    tokio::io::copy(entry, &mut w).await?;
    w.flush().await?;
    let f = w.into_inner().into_std().await;
    tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::PermissionsExt;
        // The umask may have narrowed the mode at creation.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        if let Some(t) = mtime {
            f.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(t))?;
        }
        Ok::<_, std::io::Error>(())
    })
    .await??;
    Ok(())
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
    // Chunks go to the unpacker as they came (no copy), a few at a time.
    let (tar_w, tar_r) = frames::chunk_pipe(8);
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
            if regular {
                let dest = if directory {
                    target.join(&name)
                } else {
                    target.to_path_buf()
                };
                write_file(&mut e, target, &dest).await?;
            } else if directory {
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

    async fn write_first(tar: Vec<u8>, root: &Path, dest: &Path) -> anyhow::Result<()> {
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
