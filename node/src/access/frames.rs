//! Length-prefixed bincode frames of the access protocol over any tokio byte stream (a
//! libp2p stream through `compat`, or the CLI's upgraded control-API connection).

use gridlease_protocol::codec;
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

/// Reads one frame of at most `MAX` body bytes; `Ok(None)` at a clean end of the stream
/// before a frame starts. The length is checked before the body is allocated.
pub async fn read<T: DeserializeOwned, const MAX: usize, R: AsyncRead + Unpin>(
    r: &mut R,
) -> std::io::Result<Option<T>> {
    let mut header = [0u8; 4];
    match r.read_exact(&mut header[..1]).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    r.read_exact(&mut header[1..]).await?;
    let len = codec::check_frame_header(header, MAX).map_err(invalid)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    codec::decode::<T, MAX>(&body).map(Some).map_err(invalid)
}

fn invalid(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlease_protocol::access::{ExecOutput, MAX_EXEC_FRAME, MAX_REPLY_FRAME};

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
