//! Book sync (`/gridlease/book/1`): a node that connects asks the peer which live offers it
//! holds (their content ids, one page at a time, in id order) and fetches only the ones it
//! lacks, as the signed envelopes the peer received. The receiver verifies each envelope
//! exactly as if it had come by gossip; nothing here is trusted.
//!
//! | request                        | response                                            |
//! |--------------------------------|-----------------------------------------------------|
//! | `Ids { after }`                | `Ids { ids, more }`: at most [`MAX_SYNC_IDS`] ids > `after` |
//! | `ClassIds { classes, after }`  | `Ids { ids, more }`: the same, only offers of those GPU classes |
//! | `Digests { classes }`          | `Digests { digests }`: one per id bucket (first byte), [`BUCKETS`] |
//! | `BucketIds { classes, bucket, after }` | `Ids { ids, more }`: the ids of one bucket |
//! | `Get { ids }` (<= [`MAX_SYNC_GET`]) | `Offers { envelopes }`: those still held, as received |
//! | `CompletionIds { after }`      | `CompletionIds { ids, more }`: leases of the completion records held, > `after` |
//! | `GetCompletions { leases }` (<= [`MAX_SYNC_GET`]) | `Completions { pairs }`: those held, as `CoSigned` bytes |
//! | anything else / over a cap     | `Refused`                                           |
//!
//! The completion records (reputation, `crate::completion`) are synced after the offers, the
//! same way: ids first, then only the missing ones, each verified by the receiver.

use serde::{Deserialize, Serialize};

use crate::envelope::ENVELOPE_OVERHEAD;
use crate::messages::MAX_OFFER_BYTES;
use crate::types::{LeaseId, OfferId};

/// Most ids in one `Ids` answer.
pub const MAX_SYNC_IDS: usize = 4096;
/// Most offers asked for (and answered) in one `Get`.
pub const MAX_SYNC_GET: usize = 64;
/// Cap on a request frame body.
pub const MAX_SYNC_REQUEST_FRAME: usize = MAX_SYNC_GET * 40 + 256;
/// Cap on a response frame body: a full `Get` of largest offers, or a full `Ids` page.
pub const MAX_SYNC_RESPONSE_FRAME: usize =
    MAX_SYNC_GET * (MAX_OFFER_BYTES + ENVELOPE_OVERHEAD + 8) + 64;

/// What a syncing node asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BookRequest {
    /// The ids of the live offers held, in id order, after `after` (from the start: `None`).
    Ids {
        /// The last id of the previous page.
        after: Option<OfferId>,
    },
    /// These offers' signed envelopes.
    Get {
        /// At most [`MAX_SYNC_GET`].
        ids: Vec<OfferId>,
    },
    /// The leases of the completion records held, in order, after `after`.
    CompletionIds {
        /// The last lease of the previous page.
        after: Option<LeaseId>,
    },
    /// These leases' co-signed completion records.
    GetCompletions {
        /// At most [`MAX_SYNC_GET`].
        leases: Vec<LeaseId>,
    },
    /// Like `Ids`, only the offers of these GPU classes (`crate::class`): what a node that
    /// follows some classes asks. Answered with `Ids` pages.
    ClassIds {
        /// At most [`crate::class::MAX_FOLLOWED_CLASSES`], each a class name
        /// ([`crate::class::is_class`]); otherwise `Refused`.
        classes: Vec<String>,
        /// The last id of the previous page.
        after: Option<OfferId>,
    },
    /// The [`BUCKETS`] digests of the live offer ids held (of these classes, or of all with
    /// `None`): what an anti-entropy round compares first (`docs/protocol.md` 3c step 3).
    /// Answered with `Digests`.
    Digests {
        /// As in `ClassIds`; `None`: every class.
        classes: Option<Vec<String>>,
    },
    /// Like `Ids` (or `ClassIds` with `classes`), only the ids of one bucket (first byte
    /// `bucket`). Answered with `Ids` pages.
    BucketIds {
        /// As in `Digests`.
        classes: Option<Vec<String>>,
        /// The bucket: the ids' first byte.
        bucket: u8,
        /// The last id of the previous page.
        after: Option<OfferId>,
    },
}

/// Buckets of a digest answer: ids by their first byte.
pub const BUCKETS: usize = 256;

/// The digest of one bucket: the XOR of bytes 8..16 (big-endian) of each of its ids (ids are
/// SHA-256 digests, so any difference between two sets changes it but with probability
/// 2^-64), 0 for an empty bucket.
pub fn id_digest(id: &OfferId) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&id.0.0[8..16]);
    u64::from_be_bytes(b)
}

/// What the peer answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BookResponse {
    /// A page of ids.
    Ids {
        /// In increasing order, at most [`MAX_SYNC_IDS`].
        ids: Vec<OfferId>,
        /// More pages follow (ask again after the last id).
        more: bool,
    },
    /// Envelopes (as received, each one a `Signed<Offer>` in its wire form) of the asked offers
    /// still held; gone ones are left out.
    Offers {
        /// Encoded envelopes.
        envelopes: Vec<serde_bytes::ByteBuf>,
    },
    /// Not answered (over a limit, or asked too often).
    Refused,
    /// A page of the leases whose completion records are held.
    CompletionIds {
        /// In increasing order, at most [`MAX_SYNC_IDS`].
        ids: Vec<LeaseId>,
        /// More pages follow.
        more: bool,
    },
    /// The asked records still held, each a `CoSigned` pair in its encoding.
    Completions {
        /// Encoded pairs (each at most `crate::completion::MAX_COSIGNED_BYTES`).
        pairs: Vec<serde_bytes::ByteBuf>,
    },
    /// The digest of each bucket of live ids held (see [`id_digest`]), exactly [`BUCKETS`].
    Digests {
        /// Bucket `b`'s digest at index `b`.
        digests: Vec<u64>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec;
    use crate::types::Digest;

    #[test]
    fn a_full_page_of_ids_and_a_full_get_fit_their_frames() {
        let ids: Vec<OfferId> = (0..MAX_SYNC_IDS)
            .map(|i| OfferId(Digest::of("t", &i.to_be_bytes())))
            .collect();
        let page = BookResponse::Ids { ids, more: true };
        let bytes = codec::encode::<BookResponse, MAX_SYNC_RESPONSE_FRAME>(&page).unwrap();
        assert_eq!(
            codec::decode::<BookResponse, MAX_SYNC_RESPONSE_FRAME>(&bytes).unwrap(),
            page
        );
        let get = BookRequest::Get {
            ids: (0..MAX_SYNC_GET)
                .map(|i| OfferId(Digest::of("t", &i.to_be_bytes())))
                .collect(),
        };
        let bytes = codec::encode::<BookRequest, MAX_SYNC_REQUEST_FRAME>(&get).unwrap();
        assert_eq!(
            codec::decode::<BookRequest, MAX_SYNC_REQUEST_FRAME>(&bytes).unwrap(),
            get
        );
        let offers = BookResponse::Offers {
            envelopes: vec![
                serde_bytes::ByteBuf::from(vec![
                    7u8;
                    MAX_OFFER_BYTES + ENVELOPE_OVERHEAD
                ]);
                MAX_SYNC_GET
            ],
        };
        assert!(codec::encode::<BookResponse, MAX_SYNC_RESPONSE_FRAME>(&offers).is_ok());
        // The completion pages and gets fit the same frames.
        let lease = |i: usize| LeaseId(Digest::of("t", &i.to_be_bytes()));
        let page = BookResponse::CompletionIds {
            ids: (0..MAX_SYNC_IDS).map(lease).collect(),
            more: true,
        };
        assert!(codec::encode::<BookResponse, MAX_SYNC_RESPONSE_FRAME>(&page).is_ok());
        let get = BookRequest::GetCompletions {
            leases: (0..MAX_SYNC_GET).map(lease).collect(),
        };
        assert!(codec::encode::<BookRequest, MAX_SYNC_REQUEST_FRAME>(&get).is_ok());
        let pairs = BookResponse::Completions {
            pairs: vec![
                serde_bytes::ByteBuf::from(vec![7u8; crate::completion::MAX_COSIGNED_BYTES]);
                MAX_SYNC_GET
            ],
        };
        assert!(codec::encode::<BookResponse, MAX_SYNC_RESPONSE_FRAME>(&pairs).is_ok());
        // The most classes, each of the longest name, after an id.
        let classes = BookRequest::ClassIds {
            classes: vec![
                "x".repeat(crate::class::MAX_CLASS_LEN);
                crate::class::MAX_FOLLOWED_CLASSES
            ],
            after: Some(OfferId(Digest::of("t", b"after"))),
        };
        let bytes = codec::encode::<BookRequest, MAX_SYNC_REQUEST_FRAME>(&classes).unwrap();
        assert_eq!(
            codec::decode::<BookRequest, MAX_SYNC_REQUEST_FRAME>(&bytes).unwrap(),
            classes
        );
        // Digests: the request with the most classes, the answer of every bucket.
        let many = Some(vec![
            "x".repeat(crate::class::MAX_CLASS_LEN);
            crate::class::MAX_FOLLOWED_CLASSES
        ]);
        for req in [
            BookRequest::Digests {
                classes: many.clone(),
            },
            BookRequest::BucketIds {
                classes: many,
                bucket: 255,
                after: Some(OfferId(Digest::of("t", b"after"))),
            },
        ] {
            let bytes = codec::encode::<BookRequest, MAX_SYNC_REQUEST_FRAME>(&req).unwrap();
            assert_eq!(
                codec::decode::<BookRequest, MAX_SYNC_REQUEST_FRAME>(&bytes).unwrap(),
                req
            );
        }
        let digests = BookResponse::Digests {
            digests: vec![u64::MAX; BUCKETS],
        };
        assert!(codec::encode::<BookResponse, MAX_SYNC_RESPONSE_FRAME>(&digests).is_ok());
    }
}
