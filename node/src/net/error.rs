//! Why a request to the network loop failed ([`NetError`]): the typed replies of
//! [`super::Client`].

/// Why the network loop could not do what a [`super::Client`] asked. Each variant keeps the
/// error libp2p (or the record check) gave, and reads as it does.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// A dial could not be started.
    #[error(transparent)]
    Dial(#[from] libp2p::swarm::DialError),
    /// A gossip publication failed.
    #[error(transparent)]
    Publish(#[from] libp2p::gossipsub::PublishError),
    /// A completion record was refused.
    #[error(transparent)]
    Completion(#[from] gridlease_protocol::completion::CompletionError),
    /// A lease-stream request was not answered.
    #[error(transparent)]
    Request(#[from] libp2p::request_response::OutboundFailure),
    /// The network task has stopped (the text [`super::NegotiationError::Closed`] reads).
    #[error("the network task has stopped")]
    Closed,
}
