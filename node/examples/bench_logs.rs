//! Serving a lease's container output to a follower (issue 11, "Must show": a follower of a
//! 200 MiB log costs O(size) in total, time and bytes read within 1.5x of the log's size).
//!
//! ```text
//! cargo run --release -p gridlease-node --example bench_logs -- [MIB] [ROUNDS] [OLD_MAX_MIB]
//! ```
//!
//! 1. Writes a `MIB` (default 200) MiB log through the writer path: `logs::append_stream`, the
//!    function a lease's `LogWriter` runs, fed a Docker-like stream of 16 KiB frames of
//!    pseudo-random bytes (cap = the size, so nothing is dropped).
//! 2. Follows it as `gridlease logs -f` does: `logs::read_chunk(offset, MAX_LOG_CHUNK)` until `eof`,
//!    `ROUNDS` (default 5) times; reports the median wall time and the bytes read, from
//!    `/proc/self/io` before and after: `rchar` (bytes returned by read syscalls, page cache
//!    included) and `read_bytes` (bytes fetched from the block device), as ratios to the size;
//!    and, as the time baseline, the file read once sequentially (one open, reads of MAX_LOG_CHUNK).
//! 3. For comparison, the approach before issue 11 (`logs_from_file` read the whole file for
//!    every chunk) on 1, 2, 4, ... `OLD_MAX_MIB` (default 8) MiB, and its cost extrapolated to
//!    `MIB` (chunks x size: quadratic). The live path before issue 11 re-streamed the Docker log
//!    from byte 0 for every chunk: the same shape, through the daemon.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use gridlease_node::lease::logs::{Caps, Progress, WriteMode, append_stream, read_chunk};
use gridlease_node::lease::wire::MAX_LOG_CHUNK;
use gridlease_sandbox::SandboxError;
use tokio_util::sync::CancellationToken;

const MIB: u64 = 1024 * 1024;
const FRAME: usize = 16 * 1024;

/// (rchar, read_bytes) of this process.
fn io_counters() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/io").expect("/proc/self/io (Linux)");
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (field("rchar:"), field("read_bytes:"))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Pseudo-random frames (xorshift64), `size` bytes in all.
fn frames(size: u64) -> impl futures::Stream<Item = Result<Bytes, SandboxError>> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let n = size.div_ceil(FRAME as u64);
    futures::stream::iter((0..n).map(move |i| {
        let len = (size - i * FRAME as u64).min(FRAME as u64) as usize;
        let mut buf = Vec::with_capacity(len + 8);
        while buf.len() < len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf.extend_from_slice(&x.to_le_bytes());
        }
        buf.truncate(len);
        Ok(Bytes::from(buf))
    }))
}

struct Cost {
    wall: Duration,
    chunks: u64,
    rchar: u64,
    read_bytes: u64,
}

/// Follows `path` from 0 to its end with `read_chunk`, as a renter's `logs -f` does: of a
/// running lease (`live`: the file as the writer leaves it, read from the page cache on the
/// calling task when it holds the chunk) until `size` bytes came, or of a finished one (read on
/// the blocking pool) until `eof`.
async fn follow(path: &Path, size: u64, live: bool) -> Cost {
    let (r0, b0) = io_counters();
    let t = Instant::now();
    let (mut offset, mut chunks, mut got) = (0u64, 0u64, 0u64);
    loop {
        let c = read_chunk(path, offset, MAX_LOG_CHUNK, !live, Some(0)).await;
        chunks += 1;
        got += c.data.len() as u64;
        offset = c.next_offset;
        if c.eof || (live && got >= size) {
            break;
        }
    }
    let wall = t.elapsed();
    let (r1, b1) = io_counters();
    assert_eq!(got, size, "followed the whole log");
    Cost {
        wall,
        chunks,
        rchar: r1 - r0,
        read_bytes: b1 - b0,
    }
}

/// Baseline: the file read once, sequentially, in reads of `MAX_LOG_CHUNK` through one open file.
async fn read_once(path: &Path) -> Duration {
    let p = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let t = Instant::now();
        let mut f = std::fs::File::open(&p).unwrap();
        let mut buf = vec![0u8; MAX_LOG_CHUNK as usize];
        while f.read(&mut buf).unwrap() > 0 {}
        t.elapsed()
    })
    .await
    .unwrap()
}

/// The file read once like [`read_once`], but into a fresh buffer per chunk, as a server that
/// hands each chunk out as its own buffer must.
async fn read_once_fresh(path: &Path) -> Duration {
    let p = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let t = Instant::now();
        let mut f = std::fs::File::open(&p).unwrap();
        loop {
            let mut buf = Vec::with_capacity(MAX_LOG_CHUNK as usize);
            let n = (&mut f)
                .take(u64::from(MAX_LOG_CHUNK))
                .read_to_end(&mut buf)
                .unwrap();
            std::hint::black_box(&buf);
            if n == 0 {
                break;
            }
        }
        t.elapsed()
    })
    .await
    .unwrap()
}

/// The same requests as [`follow`] without the blocking-pool hop: per chunk, open, fstat,
/// seek and read on this thread (to split the per-request cost).
async fn follow_inline(path: &Path) -> Duration {
    use std::io::{Read, Seek, SeekFrom};
    let t = Instant::now();
    let mut offset = 0u64;
    loop {
        let mut f = std::fs::File::open(path).unwrap();
        let len = f.metadata().unwrap().len();
        let n = (len - offset).min(u64::from(MAX_LOG_CHUNK));
        let mut data = Vec::with_capacity(n as usize);
        f.seek(SeekFrom::Start(offset)).unwrap();
        (&mut f).take(n).read_to_end(&mut data).unwrap();
        offset += n;
        if offset >= len {
            break;
        }
    }
    t.elapsed()
}

/// The approach before issue 11: the whole file read for every chunk.
async fn follow_old(path: &Path, size: u64) -> Cost {
    let (r0, b0) = io_counters();
    let t = Instant::now();
    let (mut offset, mut chunks, mut got) = (0u64, 0u64, 0u64);
    loop {
        let bytes = tokio::fs::read(path).await.unwrap();
        let len = bytes.len() as u64;
        let start = offset.min(len);
        let end = (start + u64::from(MAX_LOG_CHUNK)).min(len);
        let data = bytes[start as usize..end as usize].to_vec();
        chunks += 1;
        got += data.len() as u64;
        offset = end;
        if end >= len {
            break;
        }
    }
    let wall = t.elapsed();
    let (r1, b1) = io_counters();
    assert_eq!(got, size);
    Cost {
        wall,
        chunks,
        rchar: r1 - r0,
        read_bytes: b1 - b0,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let arg = |i: usize, d: u64| {
        std::env::args()
            .nth(i)
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let (mib, rounds, old_max) = (arg(1, 200), arg(2, 5).max(1), arg(3, 8));
    let size = mib * MIB;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lease.log");
    let stop = CancellationToken::new();

    let t = Instant::now();
    // The whole log as the head (the bench measures serving a file of `size` bytes).
    let caps = Caps {
        head: size,
        tail: 0,
    };
    let progress = Progress::default();
    let written = append_stream(
        frames(size),
        &path,
        caps,
        WriteMode::Truncate,
        &stop,
        &progress,
    )
    .await
    .unwrap();
    let w = t.elapsed().as_secs_f64();
    assert_eq!(written.stats.kept, size);
    println!(
        "write {mib} MiB through append_stream: {:.2} s ({:.0} MiB/s)",
        w,
        mib as f64 / w
    );

    // Rounds interleave the follow and its baseline, so that both see the same load.
    let (mut walls, mut rchars, mut blocks) = (Vec::new(), Vec::new(), Vec::new());
    let (mut once, mut ratios) = (Vec::new(), Vec::new());
    let mut chunks = 0;
    for _ in 0..rounds {
        let c = follow(&path, size, true).await;
        let o = read_once(&path).await.as_secs_f64();
        chunks = c.chunks;
        walls.push(c.wall.as_secs_f64());
        once.push(o);
        ratios.push(c.wall.as_secs_f64() / o);
        rchars.push(c.rchar as f64 / size as f64);
        blocks.push(c.read_bytes as f64 / size as f64);
    }
    let wall = median(&mut walls);
    let once = median(&mut once);
    let ratio = median(&mut ratios);
    let mut pooled: Vec<f64> = Vec::new();
    for _ in 0..rounds {
        pooled.push(follow(&path, size, false).await.wall.as_secs_f64());
    }
    let pooled = median(&mut pooled);
    println!(
        "follow {mib} MiB of a finished lease (every read on the blocking pool), median of {rounds}: {pooled:.3} s ({:.1} us/chunk)",
        pooled * 1e6 / chunks as f64
    );
    let mut fresh: Vec<f64> = Vec::new();
    for _ in 0..rounds {
        fresh.push(read_once_fresh(&path).await.as_secs_f64());
    }
    let fresh = median(&mut fresh);
    println!("read {mib} MiB once into a fresh buffer per chunk, median of {rounds}: {fresh:.3} s");
    let mut inline: Vec<f64> = Vec::new();
    for _ in 0..rounds {
        inline.push(follow_inline(&path).await.as_secs_f64());
    }
    let inline = median(&mut inline);
    println!(
        "follow {mib} MiB of a running lease with read_chunk ({} KiB, {chunks} chunks), median of {rounds}: \
         {wall:.3} s ({:.0} MiB/s, {:.1} us/chunk), rchar/size {:.4}, read_bytes/size {:.4}",
        MAX_LOG_CHUNK / 1024,
        mib as f64 / wall,
        wall * 1e6 / chunks as f64,
        median(&mut rchars),
        median(&mut blocks),
    );
    println!(
        "read {mib} MiB once (one open, {} KiB reads), median of {rounds}: {once:.3} s; \
         follow / read once, median of the rounds' ratios = {ratio:.2}",
        MAX_LOG_CHUNK / 1024,
    );
    println!(
        "the same {chunks} requests without the blocking-pool hop (open, fstat, seek, read on \
         the caller's thread), median of {rounds}: {inline:.3} s ({:.1} us/chunk)",
        inline * 1e6 / chunks as f64
    );

    println!("before issue 11 (whole file read per chunk), median of 3:");
    let mut m = 1;
    let mut last = None;
    while m <= old_max {
        let s = m * MIB;
        let p = dir.path().join(format!("old-{m}.log"));
        let caps = Caps { head: s, tail: 0 };
        append_stream(frames(s), &p, caps, WriteMode::Truncate, &stop, &progress)
            .await
            .unwrap();
        let (mut walls, mut rchars) = (Vec::new(), Vec::new());
        let mut chunks = 0;
        for _ in 0..3 {
            let c = follow_old(&p, s).await;
            chunks = c.chunks;
            walls.push(c.wall.as_secs_f64());
            rchars.push(c.rchar as f64 / s as f64);
        }
        let (wall, ratio) = (median(&mut walls), median(&mut rchars));
        let mut new = Vec::new();
        for _ in 0..3 {
            new.push(follow(&p, s, true).await.wall.as_secs_f64());
        }
        println!(
            "  {m:>4} MiB: {chunks:>5} chunks, {wall:8.3} s, rchar/size {ratio:8.1}; \
             read_chunk on the same file: {:.4} s",
            median(&mut new)
        );
        last = Some((m, wall));
        m *= 2;
    }
    if let Some((m, wall)) = last {
        // Chunks and bytes per chunk both grow with the size: cost ~ size^2.
        let k = mib as f64 / m as f64;
        println!(
            "  extrapolated to {mib} MiB: ~{:.0} s, rchar/size ~{:.0} ({} chunks of a {mib} MiB read each)",
            wall * k * k,
            size as f64 / f64::from(MAX_LOG_CHUNK),
            size / u64::from(MAX_LOG_CHUNK),
        );
    }
}
