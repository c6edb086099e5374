//! Book sync (`/gridlease/book/1`): a node that connects asks the peer which live offers it
//! holds (their content ids, one page at a time, in id order) and fetches only the ones it
//! lacks, as the signed envelopes the peer received. The receiver verifies each envelope
//! exactly as if it had come by gossip; nothing here is trusted.
//!
//! | request                        | response                                            |
//! |--------------------------------|-----------------------------------------------------|
//! | `Ids { after }`                | `Ids { ids, more }`: at most [`MAX_SYNC_IDS`] ids > `after` |
//! | `Get { ids }` (<= [`MAX_SYNC_GET`]) | `Offers { envelopes }`: those still held, as received |
//! | anything else / over a cap     | `Refused`                                           |

use serde::{Deserialize, Serialize};

use crate::envelope::ENVELOPE_OVERHEAD;
use crate::messages::MAX_OFFER_BYTES;
use crate::types::OfferId;

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
    }
}
