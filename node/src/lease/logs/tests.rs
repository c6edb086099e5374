//! Tests of writing and serving a lease's output.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use gridlease_sandbox::SandboxError;
use tokio_util::sync::CancellationToken;

use super::super::wire::MAX_LOG_CHUNK;
use super::serve::{read_at, read_cached};
use super::*;

fn bytes(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

#[test]
fn a_cached_read_gives_what_the_pool_read_gives() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.log");
    let data = bytes(3 * MAX_LOG_CHUNK as usize / 2);
    std::fs::write(&path, &data).unwrap();
    for (offset, max) in [
        (0, MAX_LOG_CHUNK),
        (100, 7),
        (data.len() as u64 - 3, 64),
        (1 << 40, 8),
    ] {
        // Just written: in the page cache (where RWF_NOWAIT exists, which it does on the
        // kernels this runs on: 4.14+).
        let cached = read_cached(&path, offset, max)
            .expect("in the page cache")
            .unwrap();
        assert_eq!(
            cached,
            read_at(&path, offset, max).unwrap(),
            "offset {offset}"
        );
    }
    let missing = read_cached(&dir.path().join("none"), 0, 8)
        .unwrap()
        .unwrap();
    assert_eq!(missing, (0, Vec::new(), 0));
}

fn stream_of(data: &[u8], chunk: usize) -> impl Stream<Item = Result<Bytes, SandboxError>> + use<> {
    let chunks: Vec<_> = data
        .chunks(chunk)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    futures::stream::iter(chunks)
}

#[tokio::test]
async fn read_chunk_follows_offsets_caps_max_and_sets_eof_only_when_finished() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.log");
    let size = 2 * MAX_LOG_CHUNK as usize + 100_000;
    let data = bytes(size);
    std::fs::write(&path, &data).unwrap();

    let c = read_chunk(&path, 0, 10, false, None).await;
    assert_eq!(c.data, &data[..10]);
    assert_eq!((c.next_offset, c.eof), (10, false));

    // `max` is capped at MAX_LOG_CHUNK.
    let c = read_chunk(&path, 10, u32::MAX, true, Some(3)).await;
    assert_eq!(c.data.len(), MAX_LOG_CHUNK as usize);
    assert_eq!(c.data, &data[10..10 + MAX_LOG_CHUNK as usize]);
    assert!(!c.eof, "more to read");
    assert_eq!(c.exit_code, Some(3));

    // The last bytes: eof only when finished.
    let tail = size as u64 - 100;
    let c = read_chunk(&path, tail, MAX_LOG_CHUNK, false, None).await;
    assert_eq!(
        (c.data.as_slice(), c.next_offset, c.eof),
        (&data[tail as usize..], size as u64, false)
    );
    let c = read_chunk(&path, tail, MAX_LOG_CHUNK, true, Some(0)).await;
    assert_eq!(
        (c.data.len(), c.next_offset, c.eof),
        (100, size as u64, true)
    );
    let c = read_chunk(&path, size as u64, MAX_LOG_CHUNK, true, Some(0)).await;
    assert_eq!((c.data.len(), c.next_offset, c.eof), (0, size as u64, true));
    // Past the end: clamped to the end.
    let c = read_chunk(&path, 2 * size as u64, MAX_LOG_CHUNK, false, None).await;
    assert_eq!(
        (c.data.len(), c.next_offset, c.eof),
        (0, size as u64, false)
    );

    // Following chunk by chunk gives the file back exactly.
    let (mut out, mut at) = (Vec::new(), 0);
    loop {
        let c = read_chunk(&path, at, MAX_LOG_CHUNK, true, None).await;
        out.extend_from_slice(&c.data);
        at = c.next_offset;
        if c.eof {
            break;
        }
    }
    assert_eq!(out, data);

    // No file yet: empty output, finished or not.
    let none = dir.path().join("none.log");
    let c = read_chunk(&none, 0, MAX_LOG_CHUNK, false, None).await;
    assert_eq!((c.data.len(), c.next_offset, c.eof), (0, 0, false));
    let c = read_chunk(&none, 0, MAX_LOG_CHUNK, true, None).await;
    assert!(c.eof);
}

async fn write_all(
    data: &[u8],
    chunk: usize,
    path: &Path,
    caps: Caps,
    mode: WriteMode,
) -> LogStats {
    let stop = CancellationToken::new();
    let w = append_stream(
        stream_of(data, chunk),
        path,
        caps,
        mode,
        &stop,
        &Progress::default(),
    )
    .await
    .unwrap();
    write_tail(path, w).await
}

#[tokio::test]
async fn append_stream_writes_bytes_exactly_truncates_resumes_and_keeps_head_and_tail() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.log");
    let data = bytes(10_000);
    let big = Caps {
        head: 1 << 20,
        tail: 1 << 20,
    };
    std::fs::write(&path, b"stale output of an interrupted start").unwrap();

    let s = write_all(&data, 333, &path, big, WriteMode::Truncate).await;
    assert_eq!(
        s,
        LogStats {
            kept: 10_000,
            dropped: 0
        }
    );
    assert_eq!(std::fs::read(&path).unwrap(), data);

    // Resume after a restart: the file has a prefix, the stream starts from byte 0 again.
    std::fs::write(&path, &data[..4_321]).unwrap();
    let s = write_all(&data, 1000, &path, big, WriteMode::Resume).await;
    assert_eq!(s.kept, 10_000);
    assert_eq!(std::fs::read(&path).unwrap(), data);

    // Past the head and the tail: head, notice, tail.
    let caps = Caps {
        head: 3_000,
        tail: 2_000,
    };
    let s = write_all(&data, 777, &path, caps, WriteMode::Truncate).await;
    let mut expected = data[..3_000].to_vec();
    expected.extend_from_slice(cut_notice(5_000, 2_000).as_bytes());
    expected.extend_from_slice(&data[8_000..]);
    assert_eq!(std::fs::read(&path).unwrap(), expected);
    assert_eq!(s.dropped, 5_000);
    assert_eq!(s.kept, expected.len() as u64);
    // Past the head but within the tail: nothing cut, the file is the output exactly.
    let caps = Caps {
        head: 6_000,
        tail: 5_000,
    };
    let s = write_all(&data, 500, &path, caps, WriteMode::Truncate).await;
    assert_eq!(std::fs::read(&path).unwrap(), data);
    assert_eq!(s.dropped, 0);
    // Resumed with the head full: the tail is rebuilt from the stream.
    std::fs::write(&path, &data[..3_000]).unwrap();
    let caps = Caps {
        head: 3_000,
        tail: 2_000,
    };
    write_all(&data, 999, &path, caps, WriteMode::Resume).await;
    assert_eq!(std::fs::read(&path).unwrap(), expected);
    // A completed file is never appended to again.
    write_all(&data, 999, &path, caps, WriteMode::Resume).await;
    assert_eq!(std::fs::read(&path).unwrap(), expected);

    // A broken stream is an error; what came before it is in the file.
    let stop = CancellationToken::new();
    let broken =
        stream_of(&data[..500], 100).chain(futures::stream::iter([Err(SandboxError::Build {
            image: "x".into(),
            message: "gone".into(),
        })]));
    let r = append_stream(
        broken,
        &path,
        big,
        WriteMode::Truncate,
        &stop,
        &Progress::default(),
    )
    .await;
    assert!(matches!(r, Err(LogError::Stream(_))), "{r:?}");
    assert_eq!(std::fs::read(&path).unwrap(), &data[..500]);

    // Stopped: ends at once, without waiting for the stream.
    stop.cancel();
    let w = append_stream(
        futures::stream::pending(),
        &path,
        big,
        WriteMode::Resume,
        &stop,
        &Progress::default(),
    )
    .await
    .unwrap();
    assert_eq!(w.stats.kept, 500);
}

/// Real time (the refill waits [`REFILL_IDLE`], 3 s): about 6 s.
#[tokio::test]
async fn a_silent_follow_stream_is_caught_up_from_a_full_read_without_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.log");
    let data = bytes(3_000);
    // The follow stream delivers 1000 bytes, holds the rest back for a while, then sends
    // everything after those 1000 (as Docker would once the next write wakes it).
    let late = data[1_000..].to_vec();
    let follow = stream_of(&data[..1_000], 100)
        .chain(futures::stream::once(async {
            tokio::time::sleep(Duration::from_secs(6)).await;
            Ok(Bytes::new())
        }))
        .chain(stream_of(&late, 250));
    let full = data.clone();
    let refill = move || stream_of(&full, 400).boxed();
    let stop = CancellationToken::new();
    let caps = Caps {
        head: 10_000,
        tail: 10_000,
    };
    // Look at the file 4.5 s in, while the follow stream still holds its bytes back.
    let (p, s) = (path.clone(), stop.clone());
    let early = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(4_500)).await;
        let seen = std::fs::read(&p).unwrap();
        drop(s);
        seen
    });
    let w = append_stream_refilled(
        follow,
        Some(&refill),
        &path,
        caps,
        WriteMode::Truncate,
        &stop,
        &Progress::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        early.await.unwrap(),
        data,
        "caught up while the follow stream was silent"
    );
    assert_eq!(w.stats.kept, 3_000);
    assert_eq!(
        std::fs::read(&path).unwrap(),
        data,
        "caught up once, nothing twice"
    );
}
