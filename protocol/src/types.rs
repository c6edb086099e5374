//! Small value types shared by the wire messages.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// A SHA-256 digest.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
pub struct Digest(#[serde(with = "serde_bytes")] pub [u8; 32]);

impl Digest {
    /// SHA-256 of `domain || 0 || data`.
    pub fn of(domain: &str, data: &[u8]) -> Self {
        let mut h = Sha256::new();
        h.update(domain.as_bytes());
        h.update([0]);
        h.update(data);
        Self(h.finalize().into())
    }

    /// First 6 bytes in hex: what tables show.
    pub fn short(&self) -> String {
        hex::encode(&self.0[..6])
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.short())
    }
}

/// A hex string that is not a 32-byte digest.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a 64-digit hex id")]
pub struct BadDigest(pub String);

impl FromStr for Digest {
    type Err = BadDigest;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bytes = hex::decode(s).map_err(|_| BadDigest(s.to_string()))?;
        let arr: [u8; 32] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| BadDigest(s.to_string()))?;
        Ok(Self(arr))
    }
}

macro_rules! id_type {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(pub Digest);

        impl $name {
            /// Short hex form for tables.
            pub fn short(&self) -> String {
                self.0.short()
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0.short())
            }
        }
        impl FromStr for $name {
            type Err = BadDigest;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Digest::from_str(s).map(Self)
            }
        }
    };
}

id_type!(
    /// An offer's id: the content digest of its signed envelope.
    OfferId
);
id_type!(
    /// A lease's id: the hash of its canonical term bytes. Both sides compute the same id.
    LeaseId
);

/// Unix time in milliseconds. Always passed in; the protocol never reads a clock.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Debug, Serialize, Deserialize,
)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// `self + secs`, saturating at the end of time.
    pub fn plus_secs(self, secs: u64) -> Self {
        Self(self.0.saturating_add(secs.saturating_mul(1000)))
    }

    /// `self + ms`, saturating.
    pub fn plus_ms(self, ms: u64) -> Self {
        Self(self.0.saturating_add(ms))
    }

    /// Milliseconds from `earlier` to `self`; zero if `earlier` is later.
    pub fn ms_since(self, earlier: Self) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:03}", self.0 / 1000, self.0 % 1000)
    }
}

/// What computes the challenge on the provider's side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum ProofBackend {
    /// int8 GEMMs with int32 accumulation on the leased NVIDIA GPUs (cuBLASLt), rows hashed
    /// on the GPU.
    Cuda,
    /// The same arithmetic on the provider's CPU: for `--dev-gpus` providers, which have no
    /// GPU. Shown as "cpu-reference: not a GPU" wherever it appears; its rate never counts as
    /// a GPU's.
    CpuReference,
}

impl ProofBackend {
    /// The name in tables, transcripts and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cuda => "cuda",
            Self::CpuReference => "cpu-reference",
        }
    }

    /// The label users see next to a result: what the backend proves.
    pub fn label(self) -> &'static str {
        match self {
            Self::Cuda => "cuda",
            Self::CpuReference => "cpu-reference: not a GPU",
        }
    }
}

impl std::fmt::Display for ProofBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a provider's offer says about proof of GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ProofPolicy {
    /// Seconds of unbilled verification the provider grants each lease between creating its
    /// container and starting its command; 0: this provider runs no challenge.
    pub window_s: u32,
    /// The backend that answers (`None` with `window_s` 0).
    pub backend: Option<ProofBackend>,
    /// The challenge rate the provider claims per offered GPU, int8 multiply-accumulates per
    /// second (millions). A renter uses it only where it has no published figure for the
    /// model (and always for `cpu-reference`).
    pub claimed_mmacs: u64,
}
