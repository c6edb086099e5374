//! What finished leases leave on the provider's disk: their output logs (`<lease>.log`, up to
//! [`super::MAX_LOG_BYTES`] each) and their watchdogs' logs (`<lease>.watchdog.log`). Kept
//! for the renter's `gridlease logs` and for disputes, but not for ever: a sweep every
//! [`SWEEP`] (at start-up, and when a lease ends) removes a finished lease's logs once they are older than
//! [`LogRetention::keep_for`], and the oldest finished ones beyond [`LogRetention::max_bytes`]
//! in all. A live lease's logs are never removed. The budget is part of the disk the node
//! keeps back from offers (`Config::host_reserve`).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use gridlease_protocol::LeaseId;

use super::ctx::Ctx;

pub use super::config::{LOGS_SWEEP as SWEEP, LogRetention};

/// A lease's log file as found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogFile {
    /// The file.
    pub path: PathBuf,
    /// Its lease.
    pub lease: LeaseId,
    /// Last written, unix ms.
    pub modified_ms: u64,
    /// Bytes on disk.
    pub bytes: u64,
}

/// The lease a file in the data directory is a log of: `<lease>.log` or
/// `<lease>.watchdog.log`.
pub fn lease_of_log(file_name: &str) -> Option<LeaseId> {
    let stem = file_name
        .strip_suffix(".watchdog.log")
        .or_else(|| file_name.strip_suffix(".log"))?;
    stem.parse().ok()
}

/// Which of `files` to remove at `now_ms` (pure): those of leases not in `live` last written
/// more than `keep_for` ago, then, while all that remain take more than `max_bytes`, the
/// oldest of those not in `live`.
pub fn plan(
    files: &[LogFile],
    live: &BTreeSet<LeaseId>,
    rules: LogRetention,
    now_ms: u64,
) -> Vec<PathBuf> {
    let keep_ms = u64::try_from(rules.keep_for.as_millis()).unwrap_or(u64::MAX);
    let (old, mut rest): (Vec<&LogFile>, Vec<&LogFile>) = files
        .iter()
        .partition(|f| !live.contains(&f.lease) && now_ms.saturating_sub(f.modified_ms) > keep_ms);
    let mut out: Vec<PathBuf> = old.iter().map(|f| f.path.clone()).collect();
    let mut total: u64 = rest.iter().map(|f| f.bytes).sum();
    rest.sort_by_key(|f| (f.modified_ms, f.path.clone()));
    for f in rest {
        if total <= rules.max_bytes {
            break;
        }
        if live.contains(&f.lease) {
            continue;
        }
        total -= f.bytes;
        out.push(f.path.clone());
    }
    out
}

/// The lease log files in the lease service's data directory.
fn list(dir: &std::path::Path) -> Vec<LogFile> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(lease) = name.to_str().and_then(lease_of_log) else {
            continue;
        };
        let Ok(m) = e.metadata() else { continue };
        if !m.is_file() {
            continue;
        }
        let modified_ms = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        use std::os::unix::fs::MetadataExt;
        out.push(LogFile {
            path: e.path(),
            lease,
            modified_ms,
            bytes: m.blocks().saturating_mul(512),
        });
    }
    out
}

/// One sweep: removes what [`plan`] says; how many files it removed.
pub(crate) async fn sweep(ctx: &Ctx) -> usize {
    let live: BTreeSet<LeaseId> = match ctx.store.call(|s| s.live_leases()).await {
        Ok(l) => l.into_iter().map(|(l, _)| l.lease.id).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list live leases; lease logs kept");
            return 0;
        }
    };
    let dir = ctx.config.data_dir.clone();
    let rules = ctx.config.log_retention;
    let now = crate::clock::now().0;
    let removed = tokio::task::spawn_blocking(move || {
        let doomed = plan(&list(&dir), &live, rules, now);
        let mut n = 0;
        for p in doomed {
            match std::fs::remove_file(&p) {
                Ok(()) => n += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(path = %p.display(), error = %e, "cannot remove a lease log")
                }
            }
        }
        n
    })
    .await
    .unwrap_or(0);
    if removed > 0 {
        tracing::info!(removed, "finished leases' logs removed (retention)");
    }
    removed
}

/// Runs [`sweep`] every `every` ([`SWEEP`] in a daemon), and whenever a lease ends
/// (`Ctx::log_sweep`), until the service stops.
pub(crate) async fn run(ctx: std::sync::Arc<Ctx>, every: Duration) {
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = ctx.cancel.cancelled() => return,
            _ = tick.tick() => {}
            () = ctx.log_sweep.notified() => {}
        }
        sweep(&ctx).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> LeaseId {
        LeaseId(gridlease_protocol::Digest([n; 32]))
    }

    fn file(n: u8, name: &str, modified_ms: u64, bytes: u64) -> LogFile {
        LogFile {
            path: PathBuf::from(format!("{}{name}", id(n))),
            lease: id(n),
            modified_ms,
            bytes,
        }
    }

    #[test]
    fn names_are_a_lease_and_a_log_suffix() {
        let l = id(7);
        assert_eq!(lease_of_log(&format!("{l}.log")), Some(l));
        assert_eq!(lease_of_log(&format!("{l}.watchdog.log")), Some(l));
        assert_eq!(lease_of_log(&format!("{l}.term")), None);
        assert_eq!(lease_of_log("notes.log"), None);
    }

    #[test]
    fn old_and_over_budget_logs_of_finished_leases_go_and_live_ones_stay() {
        let day = 86_400_000;
        let now = 100 * day;
        let rules = LogRetention {
            keep_for: Duration::from_secs(7 * 86_400),
            max_bytes: 20,
        };
        let files = vec![
            file(1, ".log", now - 8 * day, 5),          // finished, old: goes
            file(1, ".watchdog.log", now - 8 * day, 1), // with its watchdog log
            file(2, ".log", now - 30 * day, 50),        // live and old: stays
            file(3, ".log", now - 3 * day, 10),         // finished, young, oldest: over budget
            file(4, ".log", now - 2 * day, 10),         // finished, young
            file(5, ".log", now - day, 1),              // finished, youngest
        ];
        let live = BTreeSet::from([id(2)]);
        let doomed = plan(&files, &live, rules, now);
        let names: Vec<String> = doomed.iter().map(|p| p.display().to_string()).collect();
        // After the old ones, 50 + 10 + 10 + 1 = 71 bytes: the finished ones go oldest first
        // (3, 4, 5), the live 50 stays even over the budget.
        assert!(names.contains(&format!("{}.log", id(1))));
        assert!(names.contains(&format!("{}.watchdog.log", id(1))));
        assert!(names.contains(&format!("{}.log", id(3))));
        assert!(names.contains(&format!("{}.log", id(4))));
        assert!(names.contains(&format!("{}.log", id(5))));
        assert!(
            !names.iter().any(|n| n.starts_with(&id(2).to_string())),
            "live kept"
        );
        // Within budget and young: nothing goes.
        let rules = LogRetention {
            max_bytes: 1000,
            ..rules
        };
        let doomed = plan(&files[2..], &live, rules, now);
        assert!(doomed.is_empty(), "{doomed:?}");
    }
}
