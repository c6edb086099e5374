//! The one place that knows the byte encoding.
//!
//! bincode 2.0.1 (pinned) through its serde path, varint integers, little endian. Every decode:
//! 1. refuses input longer than the caller's cap before touching it,
//! 2. runs with `with_limit`, so a length prefix can never claim more than the cap
//!    (without it, a `String` claiming 2^60 bytes makes bincode allocate and abort the process),
//! 3. rejects trailing bytes: one message is exactly one encoding.
//!
//! bincode accepts non-canonical varints, so signatures are always checked over the exact
//! received bytes and never over a re-encoding (see [`crate::envelope`]). Encoding is
//! deterministic for our types (no floats, no hash maps), so hashing an encoding is a stable id.
//!
//! Swapping the codec (postcard, borsh) means changing this file only.

use bincode::config::{Configuration, Limit, LittleEndian, Varint};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Hard ceiling for any single frame on any transport, whatever the message kind.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;

/// Errors from encoding or decoding.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The input is longer than the cap for its kind; nothing was decoded.
    #[error("input of {len} bytes exceeds the cap of {max} bytes")]
    TooLarge {
        /// Input length.
        len: usize,
        /// The cap.
        max: usize,
    },
    /// A value decoded but bytes were left over.
    #[error("{trailing} trailing bytes after a complete message")]
    TrailingBytes {
        /// How many bytes were left.
        trailing: usize,
    },
    /// The bytes are not a valid encoding (truncated, bad tag, bad UTF-8, over limit...).
    #[error("malformed input: {0}")]
    Malformed(#[from] bincode::error::DecodeError),
    /// The value could not be encoded.
    #[error("cannot encode: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    /// The encoding of a value is larger than its kind allows.
    #[error("encoded value of {len} bytes exceeds the cap of {max} bytes")]
    EncodedTooLarge {
        /// Encoded length.
        len: usize,
        /// The cap.
        max: usize,
    },
}

impl CodecError {
    /// True when the failure was a size cap or allocation limit, not a malformed structure.
    pub fn is_limit(&self) -> bool {
        matches!(
            self,
            Self::TooLarge { .. }
                | Self::EncodedTooLarge { .. }
                | Self::Malformed(bincode::error::DecodeError::LimitExceeded)
        )
    }
}

type Cfg<const MAX: usize> = Configuration<LittleEndian, Varint, Limit<MAX>>;

const fn config<const MAX: usize>() -> Cfg<MAX> {
    bincode::config::standard().with_limit::<MAX>()
}

/// Encodes `value`, refusing results larger than `MAX` bytes.
pub fn encode<T: Serialize, const MAX: usize>(value: &T) -> Result<Vec<u8>, CodecError> {
    let bytes = bincode::serde::encode_to_vec(value, config::<MAX>())?;
    if bytes.len() > MAX {
        return Err(CodecError::EncodedTooLarge {
            len: bytes.len(),
            max: MAX,
        });
    }
    Ok(bytes)
}

/// Decodes exactly one `T` from `bytes`, which must be at most `MAX` bytes long.
pub fn decode<T: DeserializeOwned, const MAX: usize>(bytes: &[u8]) -> Result<T, CodecError> {
    decode_borrowed::<T, MAX>(bytes)
}

/// [`decode`] for types that may also borrow from the input (`&str`, `&[u8]` fields): nothing is
/// copied or allocated for those. bincode's slice decoder reads strings and byte strings in
/// place, so owned types go through here too (one copy into the `String`, no staging buffer).
pub fn decode_borrowed<'de, T: Deserialize<'de>, const MAX: usize>(
    bytes: &'de [u8],
) -> Result<T, CodecError> {
    if bytes.len() > MAX {
        return Err(CodecError::TooLarge {
            len: bytes.len(),
            max: MAX,
        });
    }
    let (value, consumed) = bincode::serde::borrow_decode_from_slice(bytes, config::<MAX>())?;
    if consumed != bytes.len() {
        return Err(CodecError::TrailingBytes {
            trailing: bytes.len() - consumed,
        });
    }
    Ok(value)
}

/// Encodes a length-prefixed frame header: 4 bytes, big endian. Transports write this, then
/// the body; readers check the length against their cap *before* allocating the body.
pub fn frame_header(len: usize, max: usize) -> Result<[u8; 4], CodecError> {
    if len > max || len > MAX_FRAME_BYTES {
        return Err(CodecError::EncodedTooLarge {
            len,
            max: max.min(MAX_FRAME_BYTES),
        });
    }
    // len <= MAX_FRAME_BYTES < u32::MAX, so the cast cannot truncate.
    Ok((len as u32).to_be_bytes())
}

/// Reads a frame header and checks it against `max` (and [`MAX_FRAME_BYTES`]).
pub fn check_frame_header(header: [u8; 4], max: usize) -> Result<usize, CodecError> {
    let len = u32::from_be_bytes(header) as usize;
    let cap = max.min(MAX_FRAME_BYTES);
    if len > cap {
        return Err(CodecError::TooLarge { len, max: cap });
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Sample {
        name: String,
        values: Vec<u64>,
    }

    const CAP: usize = 4096;

    fn sample() -> Sample {
        Sample {
            name: "rtx".into(),
            values: vec![1, 2, 300],
        }
    }

    #[test]
    fn round_trips() {
        let bytes = encode::<_, CAP>(&sample()).unwrap();
        assert_eq!(decode::<Sample, CAP>(&bytes).unwrap(), sample());
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let mut bytes = encode::<_, CAP>(&sample()).unwrap();
        bytes.push(0);
        let err = decode::<Sample, CAP>(&bytes).unwrap_err();
        assert!(
            matches!(err, CodecError::TrailingBytes { trailing: 1 }),
            "{err}"
        );
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = encode::<_, CAP>(&sample()).unwrap();
        for cut in 0..bytes.len() {
            assert!(
                decode::<Sample, CAP>(&bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn oversize_input_is_refused_before_decoding() {
        let bytes = vec![0u8; CAP + 1];
        let err = decode::<Sample, CAP>(&bytes).unwrap_err();
        assert!(matches!(err, CodecError::TooLarge { len, max: CAP } if len == CAP + 1));
    }

    /// Varint encoding of a u64 as bincode writes it: 0xFD marker then 8 bytes little endian.
    fn varint_u64(v: u64) -> Vec<u8> {
        let mut out = vec![0xFD];
        out.extend_from_slice(&v.to_le_bytes());
        out
    }

    #[test]
    fn string_claiming_2_pow_60_bytes_is_a_limit_error() {
        // Without `with_limit`, bincode's serde path allocates `vec![0u8; len]` for a string
        // before reading it: this input would abort the whole process. Keep this test.
        let mut bytes = varint_u64(1 << 60);
        bytes.extend_from_slice(b"abc");
        let err = decode::<Sample, CAP>(&bytes).unwrap_err();
        assert!(err.is_limit(), "expected a limit error, got {err}");
    }

    #[test]
    fn vec_claiming_2_pow_60_elements_is_an_error_without_allocation() {
        let mut bytes = vec![3, b'r', b't', b'x'];
        bytes.extend(varint_u64(1 << 60));
        bytes.extend_from_slice(&[1, 2, 3]);
        let err = decode::<Sample, CAP>(&bytes).unwrap_err();
        assert!(matches!(err, CodecError::Malformed(_)), "{err}");
    }

    #[test]
    fn encode_refuses_values_over_the_cap() {
        let big = Sample {
            name: "x".repeat(100),
            values: vec![],
        };
        let err = encode::<_, 16>(&big).unwrap_err();
        assert!(err.is_limit(), "{err}");
    }

    #[derive(Debug, PartialEq, Deserialize)]
    struct SampleRef<'a> {
        name: &'a str,
        values: Vec<u64>,
    }

    #[test]
    fn borrowed_decoding_reads_the_same_bytes_with_the_same_checks() {
        let mut bytes = encode::<_, CAP>(&sample()).unwrap();
        let r = decode_borrowed::<SampleRef<'_>, CAP>(&bytes).unwrap();
        assert_eq!((r.name, r.values.as_slice()), ("rtx", &[1u64, 2, 300][..]));
        for cut in 0..bytes.len() {
            assert!(decode_borrowed::<SampleRef<'_>, CAP>(&bytes[..cut]).is_err());
        }
        bytes.push(0);
        assert!(matches!(
            decode_borrowed::<SampleRef<'_>, CAP>(&bytes),
            Err(CodecError::TrailingBytes { trailing: 1 })
        ));
        let mut huge = varint_u64(1 << 60);
        huge.extend_from_slice(b"abc");
        assert!(decode_borrowed::<SampleRef<'_>, CAP>(&huge).is_err());
        assert!(matches!(
            decode_borrowed::<SampleRef<'_>, 4>(&[0u8; 5]),
            Err(CodecError::TooLarge { len: 5, max: 4 })
        ));
    }

    #[test]
    fn frame_headers_are_checked_against_the_cap() {
        let h = frame_header(100, 200).unwrap();
        assert_eq!(check_frame_header(h, 200).unwrap(), 100);
        assert!(check_frame_header(h, 99).is_err());
        assert!(frame_header(201, 200).is_err());
        assert!(check_frame_header(u32::MAX.to_be_bytes(), usize::MAX).is_err());
    }
}
