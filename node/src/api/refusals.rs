//! A provider's refusals and failed rents (of a lease or a volume), in words and as problems.

use gridlease_contracts::Money;
use gridlease_protocol::RejectReason;

use super::problem::{ApiError, ProblemType as P};
use crate::lease::RentError;

/// A failed rent (of a lease or a volume) as a problem.
pub(super) fn rent_error(e: RentError) -> ApiError {
    match e {
        RentError::Rejected(reason) => ApiError::new(
            P::LeaseRejected,
            format!("the provider rejected the lease: {}", reject_text(&reason)),
        )
        .hint("pick another offer with `gridlease search`"),
        e @ RentError::UnknownOffer(_) => ApiError::new(P::UnknownOffer, e.to_string()),
        e @ RentError::OwnOffer(_) => ApiError::new(P::OwnOffer, e.to_string())
            .hint("rent from another provider: `gridlease search` lists their offers"),
        e @ RentError::ImageNotOffered { .. } => ApiError::new(P::BeyondOfferTerms, e.to_string())
            .hint("`gridlease offer OFFER` shows the images it runs"),
        e @ RentError::KeepOutputs { .. } => ApiError::new(P::BeyondOfferTerms, e.to_string())
            .hint("ask for less with --keep-outputs, or copy results out while it runs"),
        e @ RentError::UploadHold { .. } => ApiError::new(P::BeyondOfferTerms, e.to_string())
            .hint("upload with `gridlease cp` once the lease runs, or pick an offer that holds containers for uploads"),
        e @ RentError::Chain(_) => ApiError::new(P::ChainFailed, e.to_string()).hint(
            "check the wallet's token and gas balances (`gridlease wallet`) and chain_rpc, then retry",
        ),
        e @ RentError::Negotiation(_) => ApiError::new(P::ProviderUnreachable, e.to_string())
            .hint("check `gridlease peers`, then retry"),
        e => ApiError::internal(e),
    }
}

/// Why the renter may not set the environment variable `name`, in words.
pub fn env_text(name: &str) -> String {
    let upper = name.to_ascii_uppercase();
    if upper.starts_with("CUDA_VISIBLE_DEVICES") || upper.starts_with("NVIDIA_") {
        format!("env {name} is set by the provider to the leased GPUs")
    } else {
        format!("env {name} may not be set by the renter (it changes how every program is loaded)")
    }
}

/// A provider's refusal in words (the error message of a rejected `POST /v1/leases`).
pub(super) fn reject_text(r: &RejectReason) -> String {
    match r {
        RejectReason::UnknownOffer => "the provider does not hold this offer any more".into(),
        RejectReason::StaleOffer { current_seq } => {
            format!("the offer was replaced (now at sequence {current_seq}); search again")
        }
        RejectReason::OfferExpired => "the offer expired".into(),
        RejectReason::RequestExpired => "the request expired before the provider handled it".into(),
        RejectReason::WrongProvider => "the terms name another provider".into(),
        RejectReason::PriceBelowAsk { ask } => {
            format!(
                "the price is below the ask of {}/GPU-hour",
                Money::from_micros(*ask)
            )
        }
        RejectReason::NoCapacity { free } => format!("only {free} GPU(s) are free"),
        RejectReason::DurationOutOfBounds { min_s, max_s } => {
            format!("the duration must be between {min_s} s and {max_s} s")
        }
        RejectReason::TermsMismatch { field } => {
            format!("the terms differ from the offer in `{field}`")
        }
        RejectReason::ImageRefused { refusal } => gridlease_contracts::image::refusal_text(refusal),
        RejectReason::EnvNotAllowed { name } => env_text(name),
        RejectReason::NetworkNotAllowed => {
            "the provider's policy does not allow network access".into()
        }
        RejectReason::BudgetTooSmall { needed } => format!(
            "the budget cannot pay the minimum billed time ({} needed)",
            Money::from_micros(*needed)
        ),
        RejectReason::DuplicateNonce => "a request with this nonce had other terms".into(),
        RejectReason::Malformed { detail } => format!("the request is malformed: {detail}"),
        RejectReason::Internal => "the provider failed internally; try another offer".into(),
        RejectReason::VolumeRefused { refusal } => gridlease_contracts::volume::refusal_text(refusal),
        RejectReason::HoldBusy => "this provider already holds a container for your uploads (rent --upload) whose command has not started: begin or stop that lease first (one held container per renter)".into(),
    }
}
