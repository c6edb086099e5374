//! Length-prefixed bincode frames of the access protocol over any tokio byte stream (a
//! libp2p stream through `compat`, or the CLI's upgraded control-API connection).

use gridlease_protocol::codec;
use gridlease_protocol::transfer::{self, TransferFrame};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Writes `value` as one frame of at most `MAX` body bytes (not flushed).
pub async fn write<T: Serialize, const MAX: usize, W: AsyncWrite + Unpin>(
    w: &mut W,
    value: &T,
) -> std::io::Result<()> {
    let f = gridlease_protocol::access::frame::<T, MAX>(value).map_err(std::io::Error::other)?;
    w.write_all(&f).await
}

/// Writes one frame and flushes it.
pub async fn send<T: Serialize, const MAX: usize, W: AsyncWrite + Unpin>(
    w: &mut W,
    value: &T,
) -> std::io::Result<()> {
    write::<T, MAX, W>(w, value).await?;
    w.flush().await
}

/// Reads a frame's length (checked against `max` before anything is allocated); `Ok(None)`
/// at a clean end of the stream before a frame starts.
async fn read_header<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
) -> std::io::Result<Option<usize>> {
    let mut header = [0u8; 4];
    match r.read_exact(&mut header[..1]).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    r.read_exact(&mut header[1..]).await?;
    codec::check_frame_header(header, max)
        .map(Some)
        .map_err(invalid)
}

/// Reads one frame of at most `MAX` body bytes; `Ok(None)` at a clean end of the stream
/// before a frame starts. The length is checked before the body is allocated.
pub async fn read<T: DeserializeOwned, const MAX: usize, R: AsyncRead + Unpin>(
    r: &mut R,
) -> std::io::Result<Option<T>> {
    let Some(len) = read_header(r, MAX).await? else {
        return Ok(None);
    };
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    codec::decode::<T, MAX>(&body).map(Some).map_err(invalid)
}

/// Writes a `TransferFrame::Chunk` of `data` straight from the caller's buffer (the same bytes
/// as [`write`] of `TransferFrame::Chunk(data.to_vec())`, without the two copies).
pub async fn write_chunk<W: AsyncWrite + Unpin>(w: &mut W, data: &[u8]) -> std::io::Result<()> {
    let (prefix, n) = transfer::chunk_prefix(data.len())
        .ok_or_else(|| invalid(format!("a chunk of {} bytes", data.len())))?;
    w.write_all(&prefix[..n]).await?;
    w.write_all(data).await
}

/// Room kept before a frame's data for its prefix (at most 10 bytes, see
/// [`transfer::chunk_prefix`]).
const PREFIX_ROOM: usize = 10;

/// The byte count and BLAKE3 hash of a transfer's tar bytes, kept by the sender for its `End`
/// frame and by the receiver to check that frame.
#[derive(Default)]
pub struct Tally {
    hash: blake3::Hasher,
    bytes: u64,
}

impl Tally {
    /// Adds bytes sent or received.
    pub fn update(&mut self, data: &[u8]) {
        self.hash.update(data);
        self.bytes += data.len() as u64;
    }

    /// The `End` frame for what was added.
    pub fn end(&self) -> TransferFrame {
        TransferFrame::End {
            bytes: self.bytes,
            blake3: *self.hash.finalize().as_bytes(),
        }
    }

    /// Whether the sender's `End { bytes, blake3 }` matches what was added.
    pub fn matches(&self, bytes: u64, blake3: &[u8; 32]) -> bool {
        bytes == self.bytes && self.hash.finalize() == *blake3
    }

    /// Bytes added.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Fills `Chunk` frames of [`transfer::MAX_CHUNK`] bytes from pieces of any size and writes each
/// frame, prefix and data, in one write; counts and hashes the data ([`Tally`]) for the `End`
/// frame. One copy per byte: into the frame being filled.
pub struct ChunkWriter {
    frame: Vec<u8>,
    tally: Tally,
}

impl Default for ChunkWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkWriter {
    /// An empty writer.
    pub fn new() -> Self {
        let mut frame = Vec::with_capacity(PREFIX_ROOM + transfer::MAX_CHUNK);
        frame.resize(PREFIX_ROOM, 0);
        ChunkWriter {
            frame,
            tally: Tally::default(),
        }
    }

    /// Adds `data`, writing every frame it fills.
    pub async fn put<W: AsyncWrite + Unpin>(
        &mut self,
        w: &mut W,
        mut data: &[u8],
    ) -> std::io::Result<()> {
        self.tally.update(data);
        while !data.is_empty() {
            let room = PREFIX_ROOM + transfer::MAX_CHUNK - self.frame.len();
            let (now, rest) = data.split_at(room.min(data.len()));
            self.frame.extend_from_slice(now);
            data = rest;
            if self.frame.len() == PREFIX_ROOM + transfer::MAX_CHUNK {
                self.flush(w).await?;
            }
        }
        Ok(())
    }

    /// Writes the frame being filled, if it holds anything (before another frame is sent).
    pub async fn flush<W: AsyncWrite + Unpin>(&mut self, w: &mut W) -> std::io::Result<()> {
        let len = self.frame.len() - PREFIX_ROOM;
        if len == 0 {
            return Ok(());
        }
        let (prefix, n) = transfer::chunk_prefix(len)
            .ok_or_else(|| invalid(format!("a chunk of {len} bytes")))?;
        self.frame[PREFIX_ROOM - n..PREFIX_ROOM].copy_from_slice(&prefix[..n]);
        w.write_all(&self.frame[PREFIX_ROOM - n..]).await?;
        self.frame.truncate(PREFIX_ROOM);
        Ok(())
    }

    /// Bytes put so far.
    pub fn bytes(&self) -> u64 {
        self.tally.bytes()
    }

    /// Writes what is left; the `End` frame for all data put.
    pub async fn finish<W: AsyncWrite + Unpin>(
        mut self,
        w: &mut W,
    ) -> std::io::Result<TransferFrame> {
        self.flush(w).await?;
        Ok(self.tally.end())
    }
}

/// A bounded hand-off of chunks to a reader: the sender side takes each chunk's buffer as it
/// came off the stream, the reader side is an `AsyncRead` over them (no copy between).
pub fn chunk_pipe(
    depth: usize,
) -> (
    tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
    impl tokio::io::AsyncRead + Unpin + Send + 'static,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(depth);
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    (tx, tokio_util::io::StreamReader::new(Box::pin(stream)))
}

/// A transfer frame as [`read_transfer`] gives it.
#[derive(Debug)]
pub enum Incoming {
    /// A chunk's data, read into a buffer of its own (no zeroing, no decoding copy).
    Chunk(bytes::Bytes),
    /// Any other frame.
    Frame(TransferFrame),
}

/// Reads one transfer frame (cap `MAX_TRANSFER_FRAME`); `Ok(None)` at a clean end before a
/// frame starts. A chunk's data is read once, into its own buffer.
pub async fn read_transfer<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Option<Incoming>> {
    let Some(len) = read_header(r, transfer::MAX_TRANSFER_FRAME).await? else {
        return Ok(None);
    };
    let mut head = [0u8; 10];
    if len >= 2 {
        r.read_exact(&mut head[..1]).await?;
        if head[0] == transfer::CHUNK_TAG {
            r.read_exact(&mut head[1..2]).await?;
            let rest = transfer::chunk_head_rest(head[1]);
            let head_len = 2 + rest;
            if head_len > len {
                return Err(invalid("a chunk frame shorter than its length"));
            }
            r.read_exact(&mut head[2..head_len]).await?;
            let data_len = transfer::chunk_head(&head[..head_len], len)
                .map_err(invalid)?
                .ok_or_else(|| invalid("not a chunk"))?;
            let mut buf = bytes::BytesMut::with_capacity(data_len);
            let mut take = (&mut *r).take(data_len as u64);
            while buf.len() < data_len {
                if take.read_buf(&mut buf).await? == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
            }
            return Ok(Some(Incoming::Chunk(buf.freeze())));
        }
        let mut body = vec![0u8; len];
        body[0] = head[0];
        r.read_exact(&mut body[1..]).await?;
        return codec::decode::<TransferFrame, { transfer::MAX_TRANSFER_FRAME }>(&body)
            .map(|f| Some(Incoming::Frame(f)))
            .map_err(invalid);
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    codec::decode::<TransferFrame, { transfer::MAX_TRANSFER_FRAME }>(&body)
        .map(|f| Some(Incoming::Frame(f)))
        .map_err(invalid)
}

fn invalid(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlease_protocol::access::{ExecOutput, MAX_EXEC_FRAME, MAX_REPLY_FRAME};

    #[tokio::test]
    async fn chunks_written_in_place_read_back_as_every_other_frame_does() {
        let (mut a, mut b) = tokio::io::duplex(1 << 20);
        let data: Vec<u8> = (0..transfer::MAX_CHUNK).map(|i| (i * 7) as u8).collect();
        let frames = [
            TransferFrame::Go { max_bytes: Some(7) },
            TransferFrame::Chunk(data.clone()),
            TransferFrame::Chunk(vec![]),
            TransferFrame::Chunk(vec![9; 300]),
            TransferFrame::End {
                bytes: 3,
                blake3: [1; 32],
            },
        ];
        let writer = async {
            for f in &frames {
                match f {
                    TransferFrame::Chunk(d) => write_chunk(&mut a, d).await.unwrap(),
                    other => write::<_, { transfer::MAX_TRANSFER_FRAME }, _>(&mut a, other)
                        .await
                        .unwrap(),
                }
            }
            drop(a);
        };
        let reader = async {
            let mut got = Vec::new();
            while let Some(f) = read_transfer(&mut b).await.unwrap() {
                got.push(match f {
                    Incoming::Chunk(d) => TransferFrame::Chunk(d.to_vec()),
                    Incoming::Frame(f) => f,
                });
            }
            got
        };
        let ((), got) = tokio::join!(writer, reader);
        assert_eq!(got, frames);
        // A chunk frame whose length disagrees with its data is refused.
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&[0, 0, 0, 4, transfer::CHUNK_TAG, 5, 1, 2])
            .await
            .unwrap();
        let err = read_transfer(&mut b).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    }

    #[tokio::test]
    async fn a_tally_matches_the_senders_end_however_the_bytes_were_split_and_nothing_else() {
        let data: Vec<u8> = (0..700_000u32).map(|i| (i * 31 + i / 997) as u8).collect();
        // The sender: a ChunkWriter fed in odd pieces.
        let mut out = Vec::new();
        let mut w = ChunkWriter::new();
        for piece in data.chunks(100_003) {
            w.put(&mut out, piece).await.unwrap();
        }
        let TransferFrame::End { bytes, blake3 } = w.finish(&mut out).await.unwrap() else {
            panic!("not an End frame");
        };
        assert_eq!(bytes, data.len() as u64);
        assert_eq!(&blake3, blake3::hash(&data).as_bytes());
        // The receiver: the chunks as they arrive.
        let mut rd = &out[..];
        let mut tally = Tally::default();
        while let Some(Incoming::Chunk(c)) = read_transfer(&mut rd).await.unwrap() {
            tally.update(&c);
        }
        assert!(tally.matches(bytes, &blake3));
        assert!(!tally.matches(bytes + 1, &blake3), "a count that differs");
        // One byte changed in transit.
        let mut damaged = data.clone();
        damaged[654_321] ^= 0x40;
        let mut other = Tally::default();
        other.update(&damaged);
        assert_eq!(other.bytes(), bytes);
        assert!(!other.matches(bytes, &blake3), "a byte that differs");
    }

    #[tokio::test]
    async fn frames_cross_a_pipe_and_an_oversized_header_is_refused_unread() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        send::<_, MAX_EXEC_FRAME, _>(&mut a, &ExecOutput::Stdout(b"hi".to_vec()))
            .await
            .unwrap();
        send::<_, MAX_EXEC_FRAME, _>(&mut a, &ExecOutput::Exit(3))
            .await
            .unwrap();
        drop(a);
        let one: Option<ExecOutput> = read::<_, MAX_EXEC_FRAME, _>(&mut b).await.unwrap();
        assert_eq!(one, Some(ExecOutput::Stdout(b"hi".to_vec())));
        let two: Option<ExecOutput> = read::<_, MAX_EXEC_FRAME, _>(&mut b).await.unwrap();
        assert_eq!(two, Some(ExecOutput::Exit(3)));
        let end: Option<ExecOutput> = read::<_, MAX_EXEC_FRAME, _>(&mut b).await.unwrap();
        assert_eq!(end, None);

        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
        let err = read::<ExecOutput, MAX_REPLY_FRAME, _>(&mut b)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    }
}
