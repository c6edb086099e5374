//! The swarm's construction ([`build_swarm`]): transports, security, multiplexing, relay
//! client, and the composite behaviour.
//!
//! Security on TCP and on relayed connections: TLS 1.3 (`/tls/1.0.0`, [`super::tls`]: AES-GCM
//! where the CPU has AES instructions) offered first, noise (`/noise`, ChaCha20-Poly1305)
//! second, chosen by multistream-select: the dialer proposes TLS and falls back to noise when
//! the listener answers `na`, so a peer that speaks only noise (py-libp2p, gridlease nodes before
//! TLS) still connects, at one more round trip. Both authenticate the peer's libp2p key. QUIC
//! has TLS 1.3 built in (libp2p-quic's own configuration).

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

/// Builds the swarm: TCP + QUIC, TLS or noise, yamux ([`super::muxer`]), DNS, relay client, the
/// composite behaviour.
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
            security(),
            super::muxer::Config::default,
        )
        .map_err(|e| t(&e))?
        .with_quic()
        .with_dns()
        .map_err(|e| t(&e))?
        .with_relay_client(security(), super::muxer::Config::default)
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

/// The security upgrades offered on TCP and relayed connections, in order of preference.
#[allow(clippy::type_complexity)]
pub(super) fn security() -> (
    fn(&libp2p::identity::Keypair) -> Result<super::tls::Config, super::tls::ConfigError>,
    fn(&libp2p::identity::Keypair) -> Result<noise::Config, noise::Error>,
) {
    (super::tls::Config::new, noise::Config::new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use libp2p::swarm::{SwarmEvent, dummy};

    /// A swarm on loopback TCP with our upgrades, or (`noise_only`) one that speaks only
    /// noise, as py-libp2p and gridlease nodes before TLS do.
    fn swarm(noise_only: bool) -> Swarm<dummy::Behaviour> {
        let b = libp2p::SwarmBuilder::with_new_identity().with_tokio();
        let cfg =
            |c: libp2p::swarm::Config| c.with_idle_connection_timeout(Duration::from_secs(30));
        if noise_only {
            b.with_tcp(
                tcp::Config::default(),
                noise::Config::new,
                super::super::muxer::Config::default,
            )
            .unwrap()
            .with_behaviour(|_| dummy::Behaviour)
            .unwrap()
            .with_swarm_config(cfg)
            .build()
        } else {
            b.with_tcp(
                tcp::Config::default(),
                security(),
                super::super::muxer::Config::default,
            )
            .unwrap()
            .with_behaviour(|_| dummy::Behaviour)
            .unwrap()
            .with_swarm_config(cfg)
            .build()
        }
    }

    /// `dialer` dials `listener` on loopback; both must see the connection established.
    async fn connects(mut dialer: Swarm<dummy::Behaviour>, mut listener: Swarm<dummy::Behaviour>) {
        listener
            .listen_on("/ip4/127.0.0.1/tcp/0".parse().unwrap())
            .unwrap();
        let addr = loop {
            if let SwarmEvent::NewListenAddr { address, .. } = listener.select_next_some().await {
                break address;
            }
        };
        let want = *listener.local_peer_id();
        dialer.dial(addr).unwrap();
        let both = async {
            let (mut d, mut l) = (false, false);
            while !(d && l) {
                tokio::select! {
                    e = dialer.select_next_some() => match e {
                        SwarmEvent::ConnectionEstablished { peer_id, .. } => {
                            assert_eq!(peer_id, want);
                            d = true;
                        }
                        SwarmEvent::OutgoingConnectionError { error, .. } => panic!("dial: {error}"),
                        _ => {}
                    },
                    e = listener.select_next_some() => match e {
                        SwarmEvent::ConnectionEstablished { .. } => l = true,
                        SwarmEvent::IncomingConnectionError { error, .. } => panic!("accept: {error}"),
                        _ => {}
                    },
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), both)
            .await
            .expect("no connection within 10 s");
    }

    #[tokio::test]
    async fn a_noise_only_peer_connects_both_ways() {
        connects(swarm(false), swarm(true)).await;
        connects(swarm(true), swarm(false)).await;
    }

    #[tokio::test]
    async fn two_of_ours_connect() {
        connects(swarm(false), swarm(false)).await;
    }
}
