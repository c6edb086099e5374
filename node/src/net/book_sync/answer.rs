//! What this node answers a syncing peer ([`answer`]): its live offers' ids, bucket digests,
//! envelopes, completion record ids and pairs, within a rate per peer.

use gridlease_protocol::sync::{BookRequest, BookResponse, MAX_SYNC_GET, MAX_SYNC_IDS};
use gridlease_protocol::{PeerId, Timestamp, class};

use crate::net::loop_ctx::LoopCtx;
use crate::net::ratelimit::RateLimiter;
use crate::net::reputation::Completions;

/// Whether a sync request's classes are acceptable: at most the followed-class limit, each a
/// class name; `None` (every class) always.
fn valid_classes(classes: Option<&[String]>) -> bool {
    classes.is_none_or(|cs| {
        cs.len() <= class::MAX_FOLLOWED_CLASSES && cs.iter().all(|c| class::is_class(c))
    })
}

/// What this node answers `peer`'s sync `request` at `now` (refused beyond its rate,
/// `limits`).
pub(super) fn answer(
    ctx: &LoopCtx,
    limits: &mut RateLimiter<PeerId>,
    completions: &Completions,
    peer: &PeerId,
    request: BookRequest,
    now: Timestamp,
) -> BookResponse {
    if !limits.check(peer, now) {
        return BookResponse::Refused;
    }
    match request {
        BookRequest::Ids { after } => {
            let (ids, more) = ctx
                .book
                .view(|b| b.ids_after(after.as_ref(), MAX_SYNC_IDS, now));
            BookResponse::Ids { ids, more }
        }
        BookRequest::ClassIds { classes, after }
            if classes.len() <= class::MAX_FOLLOWED_CLASSES
                && classes.iter().all(|c| class::is_class(c)) =>
        {
            let (ids, more) = ctx
                .book
                .view(|b| b.class_ids_after(&classes, after.as_ref(), MAX_SYNC_IDS, now));
            BookResponse::Ids { ids, more }
        }
        BookRequest::ClassIds { .. } => BookResponse::Refused,
        BookRequest::Digests { classes } if valid_classes(classes.as_deref()) => {
            let digests = ctx.book.view(|b| b.bucket_digests(classes.as_deref(), now));
            BookResponse::Digests { digests }
        }
        BookRequest::BucketIds {
            classes,
            bucket,
            after,
        } if valid_classes(classes.as_deref()) => {
            let (ids, more) = ctx.book.view(|b| {
                b.bucket_ids_after(
                    classes.as_deref(),
                    bucket,
                    after.as_ref(),
                    MAX_SYNC_IDS,
                    now,
                )
            });
            BookResponse::Ids { ids, more }
        }
        BookRequest::Digests { .. } | BookRequest::BucketIds { .. } => BookResponse::Refused,
        // A test fault: a peer that no longer holds what it listed.
        BookRequest::Get { ids } if ctx.config.answers_gets_empty() => {
            tracing::debug!(
                asked = ids.len(),
                "book sync Get answered empty (test fault)"
            );
            BookResponse::Offers {
                envelopes: Vec::new(),
            }
        }
        BookRequest::Get { ids } if ids.len() <= MAX_SYNC_GET => {
            let envelopes = ctx.book.view(|book| {
                ids.iter()
                    .filter_map(|id| book.envelope(id))
                    .filter_map(|s| s.to_bytes().ok())
                    .map(serde_bytes::ByteBuf::from)
                    .collect()
            });
            BookResponse::Offers { envelopes }
        }
        BookRequest::Get { .. } => BookResponse::Refused,
        BookRequest::CompletionIds { after } => {
            let (ids, more) = completions.ids_after(after.as_ref(), MAX_SYNC_IDS);
            BookResponse::CompletionIds { ids, more }
        }
        BookRequest::GetCompletions { leases } if leases.len() <= MAX_SYNC_GET => {
            let pairs = completions
                .pairs_of(&leases)
                .map(|b| serde_bytes::ByteBuf::from(b.to_vec()))
                .collect();
            BookResponse::Completions { pairs }
        }
        BookRequest::GetCompletions { .. } => BookResponse::Refused,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_lists_are_bounded_and_named() {
        assert!(valid_classes(None));
        assert!(valid_classes(Some(&["rtx-4090".to_string()])));
        assert!(!valid_classes(Some(&["Not A Class".to_string()])));
        let many: Vec<String> = (0..=class::MAX_FOLLOWED_CLASSES)
            .map(|i| format!("c{i}"))
            .collect();
        assert!(!valid_classes(Some(&many)));
    }
}
