//! The swarm's construction ([`build_swarm`]): transports, security, multiplexing, relay
//! client, and the composite behaviour.

use std::time::Duration;

use gridlease_protocol::NodeKey;
use libp2p::{Swarm, noise, tcp};

use super::behaviour::Behaviour;
use super::{BuildError, NodeConfig};

/// How long a new connection may take (transport, security, multiplexing). Shorter than
/// libp2p's 10 s default because an AutoNAT v2 client waits 10 s for its server's verdict: a
/// dial-back to an address behind a router that drops unsolicited packets (most home routers)
/// must fail before that, or the client sees a timeout, learns nothing, and its NAT status
/// stays unknown.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);

/// Builds the swarm: TCP + QUIC, noise, yamux ([`super::muxer`]), DNS, relay client, the composite behaviour.
pub(super) fn build_swarm(
    key: &NodeKey,
    config: &NodeConfig,
    book_codec: super::codec::BookCodec,
) -> Result<Swarm<Behaviour>, BuildError> {
    let t = |e: &dyn std::fmt::Display| BuildError::Transport(e.to_string());
    let swarm = libp2p::SwarmBuilder::with_existing_identity(key.keypair().clone())
        .with_tokio()
        .with_tcp(
            tcp::Config::default().nodelay(true),
            noise::Config::new,
            super::muxer::Config::default,
        )
        .map_err(|e| t(&e))?
        .with_quic()
        .with_dns()
        .map_err(|e| t(&e))?
        .with_relay_client(noise::Config::new, super::muxer::Config::default)
        .map_err(|e| t(&e))?
        .with_behaviour(|kp, relay_client| {
            Behaviour::new(kp, relay_client, config, book_codec)
                .map_err(|e| -> Box<dyn std::error::Error + Send + Sync> { Box::new(e) })
        })
        .map_err(|e| t(&e))?
        .with_swarm_config(|c| c.with_idle_connection_timeout(config.idle_connection_timeout))
        .with_connection_timeout(CONNECTION_TIMEOUT)
        .build();
    Ok(swarm)
}
