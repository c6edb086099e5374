//! TLS 1.3 as libp2p's `/tls/1.0.0` security upgrade (the libp2p TLS handshake spec), with the
//! cipher suites in the order this machine runs fastest: AES-GCM first where the CPU has AES
//! and carry-less multiply instructions (AES-NI and PCLMULQDQ on x86, the crypto extension on
//! ARM), ChaCha20-Poly1305 first elsewhere.
//!
//! Why not `libp2p::tls::Config`: it lists ChaCha20-Poly1305 first on every machine and its
//! fields are private, so a connection between two rust-libp2p peers always gets ChaCha20 (a
//! TLS 1.3 server takes the client's order), the cipher noise is fixed to, and on this project's
//! x86 machines AES-128-GCM (aws-lc-rs, AES-NI) seals several times faster. Everything else is
//! libp2p-tls's own: the certificate carrying the libp2p key's signature
//! ([`libp2p::tls::certificate`]: generated, parsed and checked there), TLS 1.3 only, one
//! self-signed certificate each way (client authentication is mandatory), the `libp2p` ALPN
//! and no SNI, aws-lc-rs as the crypto provider. The wire protocol is the same, so a peer on
//! libp2p's own TLS config (or go-libp2p, js-libp2p) connects and the two agree on a suite in
//! the handshake; a peer without TLS (py-libp2p, older gridlease nodes) gets noise, which the
//! transport offers second ([`super::transport`]).
//!
//! The verifier below follows libp2p-tls 0.7's `verifier.rs` (MIT licence): the peer's chain is
//! exactly one certificate, parsed (which checks its self-signature, validity period and the
//! libp2p extension's signature), and the handshake signature is checked against its key.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{AsyncRead, AsyncWrite, FutureExt};
use futures_rustls::TlsStream;
use libp2p::PeerId;
use libp2p::core::upgrade::{InboundConnectionUpgrade, OutboundConnectionUpgrade, UpgradeInfo};
use libp2p::identity::Keypair;
use libp2p::tls::certificate;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::aws_lc_rs::cipher_suite::{
    TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256,
};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, OtherError, SignatureScheme,
    SupportedCipherSuite,
};

/// The protocol name multistream-select negotiates (libp2p's TLS spec).
pub const PROTOCOL: &str = "/tls/1.0.0";

/// The ALPN both sides send (libp2p's TLS spec).
const P2P_ALPN: &[u8] = b"libp2p";

/// Whether this CPU has AES and carry-less multiply instructions (what makes AES-GCM fast).
pub fn has_aes_hardware() -> bool {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
            && std::arch::is_aarch64_feature_detected!("pmull")
    }
    #[cfg(not(any(target_arch = "x86", target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// The TLS 1.3 suites in this machine's order of preference ([`has_aes_hardware`]).
pub fn cipher_suites() -> Vec<SupportedCipherSuite> {
    if has_aes_hardware() {
        vec![
            TLS13_AES_128_GCM_SHA256,
            TLS13_AES_256_GCM_SHA384,
            TLS13_CHACHA20_POLY1305_SHA256,
        ]
    } else {
        vec![
            TLS13_CHACHA20_POLY1305_SHA256,
            TLS13_AES_128_GCM_SHA256,
            TLS13_AES_256_GCM_SHA384,
        ]
    }
}

/// Setting up the upgrade failed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The certificate could not be made from the node's key.
    #[error("TLS certificate: {0}")]
    Certificate(#[from] certificate::GenError),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// A connection's TLS upgrade failed.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// The handshake (as the server) failed.
    #[error("TLS handshake (inbound): {0}")]
    Inbound(std::io::Error),
    /// The handshake (as the client) failed.
    #[error("TLS handshake (outbound): {0}")]
    Outbound(std::io::Error),
    /// The peer's certificate did not parse (checked in the handshake already).
    #[error("TLS peer certificate: {0}")]
    Certificate(#[from] certificate::ParseError),
}

/// The `/tls/1.0.0` upgrade with this node's certificate and suite order.
#[derive(Clone)]
pub struct Config {
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("tls::Config").finish_non_exhaustive()
    }
}

impl Config {
    /// The upgrade for `keypair` (a certificate is generated and signed with it).
    pub fn new(keypair: &Keypair) -> Result<Self, ConfigError> {
        Self::with_suites(keypair, cipher_suites())
    }

    /// The upgrade offering `suites`, in that order.
    pub fn with_suites(
        keypair: &Keypair,
        suites: Vec<SupportedCipherSuite>,
    ) -> Result<Self, ConfigError> {
        let (cert, key) = certificate::generate(keypair)?;
        let provider = Arc::new(rustls::crypto::CryptoProvider {
            cipher_suites: suites,
            ..rustls::crypto::aws_lc_rs::default_provider()
        });
        // Not `with_single_cert`: rustls would parse the certificate with webpki to match its key,
        // and webpki refuses the libp2p extension (critical, unknown to it).
        let own = Arc::new(OwnCert(Arc::new(rustls::sign::CertifiedKey::new(
            vec![cert],
            provider.key_provider.load_private_key(key)?,
        ))));
        let versions: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)?
            .with_client_cert_verifier(Arc::new(Verifier))
            .with_cert_resolver(own.clone());
        server.alpn_protocols = vec![P2P_ALPN.to_vec()];
        // Session tickets: libp2p connections are not resumed (each handshake authenticates the
        // peer's key anew), so do not send any.
        server.send_tls13_tickets = 0;
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Verifier))
            .with_client_cert_resolver(own);
        client.alpn_protocols = vec![P2P_ALPN.to_vec()];
        client.resumption = rustls::client::Resumption::disabled();
        Ok(Self {
            server: Arc::new(server),
            client: Arc::new(client),
        })
    }

    /// The suite a connection made with this config would prefer (the first offered).
    pub fn preferred_suite(&self) -> rustls::CipherSuite {
        self.client.crypto_provider().cipher_suites[0].suite()
    }
}

impl UpgradeInfo for Config {
    type Info = &'static str;
    type InfoIter = std::iter::Once<Self::Info>;

    fn protocol_info(&self) -> Self::InfoIter {
        std::iter::once(PROTOCOL)
    }
}

impl<C> InboundConnectionUpgrade<C> for Config
where
    C: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    type Output = (PeerId, TlsStream<C>);
    type Error = UpgradeError;
    type Future = BoxFuture<'static, Result<Self::Output, Self::Error>>;

    fn upgrade_inbound(self, socket: C, _: Self::Info) -> Self::Future {
        async move {
            let stream = futures_rustls::TlsAcceptor::from(self.server)
                .accept(socket)
                .await
                .map_err(UpgradeError::Inbound)?;
            let peer = peer_of(stream.get_ref().1)?;
            Ok((peer, stream.into()))
        }
        .boxed()
    }
}

impl<C> OutboundConnectionUpgrade<C> for Config
where
    C: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    type Output = (PeerId, TlsStream<C>);
    type Error = UpgradeError;
    type Future = BoxFuture<'static, Result<Self::Output, Self::Error>>;

    fn upgrade_outbound(self, socket: C, _: Self::Info) -> Self::Future {
        async move {
            // The spec: no SNI (an unspecified address is how rustls is told so).
            let name = ServerName::IpAddress(rustls::pki_types::IpAddr::from(
                std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            ));
            let stream = futures_rustls::TlsConnector::from(self.client)
                .connect(name, socket)
                .await
                .map_err(UpgradeError::Outbound)?;
            let peer = peer_of(stream.get_ref().1)?;
            Ok((peer, stream.into()))
        }
        .boxed()
    }
}

/// This node's certificate, whatever the peer asks for (as libp2p-tls's `AlwaysResolvesCert`).
#[derive(Debug)]
struct OwnCert(Arc<rustls::sign::CertifiedKey>);

impl rustls::client::ResolvesClientCert for OwnCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

impl rustls::server::ResolvesServerCert for OwnCert {
    fn resolve(
        &self,
        _client_hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// The peer id in the certificate the handshake verified.
fn peer_of(state: &rustls::CommonState) -> Result<PeerId, UpgradeError> {
    match state.peer_certificates() {
        Some([cert]) => Ok(certificate::parse(cert)?.peer_id()),
        // The verifier accepts exactly one certificate, and client authentication is
        // mandatory: a handshake that completed has one.
        _ => Err(UpgradeError::Inbound(std::io::Error::other(
            "no single peer certificate after the handshake",
        ))),
    }
}

/// libp2p's certificate rules, as client and as server: exactly one self-signed certificate
/// with a valid libp2p extension; the handshake signed by its key.
/// libp2p's dialer does not tell the upgrade which peer it dialed (as with libp2p-tls): the
/// swarm compares the authenticated peer id with the one dialed.
#[derive(Debug)]
struct Verifier;

fn rustls_err(e: impl std::error::Error + Send + Sync + 'static) -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(e))))
}

impl Verifier {
    fn presented(
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
    ) -> Result<(), rustls::Error> {
        if !intermediates.is_empty() {
            return Err(rustls::Error::General(
                "libp2p TLS requires exactly one certificate".into(),
            ));
        }
        certificate::parse(end_entity).map_err(rustls_err)?;
        Ok(())
    }

    fn tls13_signature(
        cert: &CertificateDer<'_>,
        message: &[u8],
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        certificate::parse(cert)
            .map_err(rustls_err)?
            .verify_signature(dss.scheme, message, dss.signature())
            .map_err(rustls_err)?;
        Ok(HandshakeSignatureValid::assertion())
    }

    /// libp2p-tls's list (elliptic curves first; RSA only for peers that have nothing else).
    fn schemes() -> Vec<SignatureScheme> {
        vec![
            SignatureScheme::ECDSA_NISTP384_SHA384,
            SignatureScheme::ECDSA_NISTP256_SHA256,
            SignatureScheme::ED25519,
            SignatureScheme::RSA_PSS_SHA512,
            SignatureScheme::RSA_PSS_SHA384,
            SignatureScheme::RSA_PSS_SHA256,
            SignatureScheme::RSA_PKCS1_SHA512,
            SignatureScheme::RSA_PKCS1_SHA384,
            SignatureScheme::RSA_PKCS1_SHA256,
        ]
    }
}

/// TLS 1.2 is not offered (TLS 1.3 only), so a TLS 1.2 signature is never asked for.
fn no_tls12() -> Result<HandshakeSignatureValid, rustls::Error> {
    Err(rustls::Error::General("TLS 1.2 is not offered".into()))
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Self::presented(end_entity, intermediates)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        no_tls12()
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Self::tls13_signature(cert, message, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        Self::schemes()
    }
}

impl ClientCertVerifier for Verifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Self::presented(end_entity, intermediates)?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        no_tls12()
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Self::tls13_signature(cert, message, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        Self::schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libp2p::core::upgrade::{InboundConnectionUpgrade, OutboundConnectionUpgrade};
    use tokio_util::compat::TokioAsyncReadCompatExt;

    /// Runs one handshake over an in-memory pipe: the dialer's (`client`) and the listener's
    /// (`server`) peer ids as each side authenticated them, and the suite negotiated.
    async fn handshake<A, B>(client: A, server: B) -> (PeerId, PeerId, rustls::CipherSuite)
    where
        A: OutboundConnectionUpgrade<
                tokio_util::compat::Compat<tokio::io::DuplexStream>,
                Output = (
                    PeerId,
                    futures_rustls::TlsStream<tokio_util::compat::Compat<tokio::io::DuplexStream>>,
                ),
            >,
        A::Error: std::fmt::Debug,
        B: InboundConnectionUpgrade<
                tokio_util::compat::Compat<tokio::io::DuplexStream>,
                Output = (
                    PeerId,
                    futures_rustls::TlsStream<tokio_util::compat::Compat<tokio::io::DuplexStream>>,
                ),
            >,
        B::Error: std::fmt::Debug,
        A: UpgradeInfo<Info = &'static str>,
        B: UpgradeInfo<Info = &'static str>,
    {
        let (a, b) = tokio::io::duplex(1 << 16);
        let (c, s) = tokio::join!(
            client.upgrade_outbound(a.compat(), PROTOCOL),
            server.upgrade_inbound(b.compat(), PROTOCOL)
        );
        let (server_seen_by_client, stream) = c.expect("client handshake");
        let (client_seen_by_server, _) = s.expect("server handshake");
        let suite = match &stream {
            futures_rustls::TlsStream::Client(t) => t.get_ref().1.negotiated_cipher_suite(),
            futures_rustls::TlsStream::Server(t) => t.get_ref().1.negotiated_cipher_suite(),
        }
        .expect("a suite")
        .suite();
        (server_seen_by_client, client_seen_by_server, suite)
    }

    fn fastest() -> rustls::CipherSuite {
        if has_aes_hardware() {
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
        } else {
            rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
        }
    }

    #[tokio::test]
    async fn two_gridlease_peers_agree_on_this_machines_fastest_suite() {
        let (ka, kb) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
        let (a, b) = (Config::new(&ka).unwrap(), Config::new(&kb).unwrap());
        assert_eq!(a.preferred_suite(), fastest());
        let (seen_b, seen_a, suite) = handshake(a, b).await;
        assert_eq!(seen_b, kb.public().to_peer_id());
        assert_eq!(seen_a, ka.public().to_peer_id());
        assert_eq!(suite, fastest());
    }

    #[tokio::test]
    async fn libp2ps_own_tls_config_connects_both_ways() {
        let (ka, kb) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
        // Ours dialing libp2p's: the server takes the client's order, so ours decides.
        let (seen_b, seen_a, suite) = handshake(
            Config::new(&ka).unwrap(),
            libp2p::tls::Config::new(&kb).unwrap(),
        )
        .await;
        assert_eq!(
            (seen_b, seen_a),
            (kb.public().to_peer_id(), ka.public().to_peer_id())
        );
        assert_eq!(suite, fastest());
        // libp2p's dialing ours: its order (ChaCha20 first) wins.
        let (seen_a, seen_b, suite) = handshake(
            libp2p::tls::Config::new(&kb).unwrap(),
            Config::new(&ka).unwrap(),
        )
        .await;
        assert_eq!(
            (seen_a, seen_b),
            (ka.public().to_peer_id(), kb.public().to_peer_id())
        );
        assert_eq!(suite, rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256);
    }

    #[tokio::test]
    async fn a_client_without_a_certificate_is_refused() {
        // libp2p's TLS authenticates both sides: a client that presents no certificate (a
        // plain TLS client) must not get a connection.
        let server = Config::new(&Keypair::generate_ed25519()).unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Verifier))
            .with_no_client_auth();
        client.alpn_protocols = vec![P2P_ALPN.to_vec()];
        let (a, b) = tokio::io::duplex(1 << 16);
        let name = ServerName::IpAddress(rustls::pki_types::IpAddr::from(std::net::IpAddr::V4(
            std::net::Ipv4Addr::UNSPECIFIED,
        )));
        let client = async {
            let mut s = futures_rustls::TlsConnector::from(Arc::new(client))
                .connect(name, a.compat())
                .await?;
            // TLS 1.3: the client finishes before the server has checked it; the refusal
            // arrives as an alert on the first read.
            let mut buf = [0u8; 1];
            futures::AsyncReadExt::read(&mut s, &mut buf).await
        };
        let (c, s) = tokio::join!(client, server.upgrade_inbound(b.compat(), PROTOCOL));
        assert!(
            s.is_err(),
            "the server accepted a client without a certificate"
        );
        assert!(c.is_err(), "the client was not told: {c:?}");
    }
}
