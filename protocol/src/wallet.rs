//! The wallet of on-chain settlement (issue 50): a node's secp256k1 key beside its ed25519
//! identity, its Ethereum address, and the EIP-712 vouchers a renter signs for the payment
//! channel contract (`settlement/contracts/GridleaseChannels.vy`).
//!
//! A voucher is the typed data
//! `Voucher(address renter,address provider,uint256 epoch,bytes32 lane,uint256 cumulativeAmount)`
//! in the domain `EIP712Domain(string name,string version,uint256 chainId,address
//! verifyingContract)` with name [`DOMAIN_NAME`] and version [`DOMAIN_VERSION`], hashed as
//! EIP-712 says: `keccak256(0x1901 || domainSeparator || hashStruct(voucher))`. The digest and
//! the signature are byte for byte what wallets (eth-account) and the contract compute: the
//! tests check both against vectors made with eth-account.
//!
//! Signatures are 65 bytes `r || s || v`, `v` 27 or 28, `s` in the lower half of the group
//! order (what the contract accepts, EIP-2): [`recover`] refuses anything else, as the contract
//! does. Signing is deterministic (RFC 6979).
//!
//! The key file is 32 bytes with mode 0600, read and written as the identity's key file is.

use std::fmt;
use std::path::Path;

use k256::ecdsa::{RecoveryId, Signature, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha3::{Digest, Keccak256};

use crate::envelope::{EnvelopeError, MessageKind, NetworkId, Signed, wire_message};
use crate::identity::{IdentityError, NodeKey, PublicKey, read_secret_file, write_secret_file};
use crate::shape::{Shape, ShapeError};

/// The EIP-712 domain name of the channel contract.
pub const DOMAIN_NAME: &str = "gridlease channels";
/// The EIP-712 domain version of the channel contract.
pub const DOMAIN_VERSION: &str = "1";
/// A signature's length: `r || s || v`.
pub const SIGNATURE_LEN: usize = 65;

const DOMAIN_TYPE: &str =
    "EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)";
const VOUCHER_TYPE: &str =
    "Voucher(address renter,address provider,uint256 epoch,bytes32 lane,uint256 cumulativeAmount)";

/// Why a wallet signature does not stand.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WalletError {
    /// Not 65 bytes.
    #[error("a wallet signature is 65 bytes, not {0}")]
    Length(usize),
    /// `v` is not 27 or 28.
    #[error("a wallet signature's v is 27 or 28, not {0}")]
    BadV(u8),
    /// `s` is in the upper half of the group order (a malleable twin).
    #[error("a wallet signature's s must be in the lower half of the group order")]
    HighS,
    /// `r` or `s` is zero or not below the group order, or no key recovers from it.
    #[error("not a valid secp256k1 signature")]
    Invalid,
}

/// A 20-byte Ethereum address. Shown and parsed as `0x` and 40 hex digits, shown with the
/// EIP-55 checksum (mixed case); parsing accepts any case.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Address(pub [u8; 20]);

impl Address {
    /// The address of a public key: the last 20 bytes of the Keccak-256 of its uncompressed
    /// point (without the 0x04 prefix).
    pub fn of(key: &VerifyingKey) -> Self {
        let point = key.to_sec1_point(false);
        let hash = Keccak256::digest(&point.as_bytes()[1..]);
        let mut a = [0u8; 20];
        a.copy_from_slice(&hash[12..]);
        Self(a)
    }

    /// As a 32-byte ABI word (left-padded with zeros).
    fn word(&self) -> [u8; 32] {
        let mut w = [0u8; 32];
        w[12..].copy_from_slice(&self.0);
        w
    }
}

impl fmt::Display for Address {
    /// EIP-55: a hex digit is upper case where the Keccak-256 of the lower-case hex has a
    /// nibble of 8 or more at that place.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lower = hex::encode(self.0);
        let hash = Keccak256::digest(lower.as_bytes());
        let mut out = String::with_capacity(42);
        out.push_str("0x");
        for (i, c) in lower.chars().enumerate() {
            let nibble = (hash[i / 2] >> (if i % 2 == 0 { 4 } else { 0 })) & 0xf;
            out.push(if nibble >= 8 {
                c.to_ascii_uppercase()
            } else {
                c
            });
        }
        f.write_str(&out)
    }
}

impl fmt::Debug for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Why text is not an address.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not an address (0x and 40 hex digits)")]
pub struct BadAddress(pub String);

impl std::str::FromStr for Address {
    type Err = BadAddress;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadAddress(s.chars().take(64).collect());
        let digits = s.strip_prefix("0x").ok_or_else(bad)?;
        if digits.len() != 40 {
            return Err(bad());
        }
        let mut a = [0u8; 20];
        hex::decode_to_slice(digits, &mut a).map_err(|_| bad())?;
        Ok(Self(a))
    }
}

/// A node's wallet key (secp256k1). Never serialized; persisted only through
/// [`WalletKey::create_file`]; `Debug` shows only its address.
pub struct WalletKey {
    signing: SigningKey,
}

impl fmt::Debug for WalletKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WalletKey({})", self.address())
    }
}

impl WalletKey {
    /// A fresh random key from the OS's randomness.
    pub fn generate() -> Result<Self, getrandom::Error> {
        loop {
            let mut secret = [0u8; 32];
            getrandom::fill(&mut secret)?;
            // Zero or not below the group order: about 2^-128 likely; draw again.
            if let Some(k) = Self::from_secret(secret) {
                return Ok(k);
            }
        }
    }

    /// The key with this secret; `None` when it is zero or not below the group order.
    pub fn from_secret(secret: [u8; 32]) -> Option<Self> {
        SigningKey::from_slice(&secret)
            .ok()
            .map(|signing| Self { signing })
    }

    /// Writes a new key file with mode 0600. Fails if the file exists.
    pub fn create_file(&self, path: &Path) -> Result<(), IdentityError> {
        let secret: [u8; 32] = self.signing.to_bytes().into();
        write_secret_file(path, &secret)
    }

    /// Loads a key file, refusing wrong lengths, files readable by group or others, and a
    /// secret that is not a secp256k1 key.
    pub fn load_file(path: &Path) -> Result<Self, IdentityError> {
        let secret = read_secret_file(path)?;
        Self::from_secret(secret).ok_or_else(|| IdentityError::BadSecret {
            path: path.to_path_buf(),
        })
    }

    /// The wallet's address.
    pub fn address(&self) -> Address {
        Address::of(self.signing.verifying_key())
    }

    /// Signs a 32-byte digest (an EIP-712 hash): `r || s || v` with a low `s`, `v` 27 or 28.
    pub fn sign_digest(&self, digest: &[u8; 32]) -> [u8; SIGNATURE_LEN] {
        let (sig, recid) = self.signing.sign_prehash_recoverable(digest);
        let mut out = [0u8; SIGNATURE_LEN];
        out[..64].copy_from_slice(&sig.to_bytes());
        out[64] = 27 + recid.to_byte();
        out
    }
}

/// Recovers the address that signed `digest` (a signature as [`WalletKey::sign_digest`]
/// makes), refusing what the contract refuses.
pub fn recover(digest: &[u8; 32], signature: &[u8]) -> Result<Address, WalletError> {
    if signature.len() != SIGNATURE_LEN {
        return Err(WalletError::Length(signature.len()));
    }
    let v = signature[64];
    if v != 27 && v != 28 {
        return Err(WalletError::BadV(v));
    }
    let sig = Signature::from_slice(&signature[..64]).map_err(|_| WalletError::Invalid)?;
    if sig.normalize_s() != sig {
        return Err(WalletError::HighS);
    }
    let recid = RecoveryId::from_byte(v - 27).ok_or(WalletError::Invalid)?;
    let key = VerifyingKey::recover_from_prehash(digest, &sig, recid)
        .map_err(|_| WalletError::Invalid)?;
    Ok(Address::of(&key))
}

/// The EIP-712 domain of a channel contract on a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Domain {
    /// The chain's id (EIP-155).
    pub chain_id: u64,
    /// The channel contract's address.
    pub contract: Address,
}

impl Domain {
    /// `hashStruct(EIP712Domain)`: the domain separator.
    pub fn separator(&self) -> [u8; 32] {
        let mut h = Keccak256::new();
        h.update(Keccak256::digest(DOMAIN_TYPE.as_bytes()));
        h.update(Keccak256::digest(DOMAIN_NAME.as_bytes()));
        h.update(Keccak256::digest(DOMAIN_VERSION.as_bytes()));
        h.update(u256_word(u128::from(self.chain_id)));
        h.update(self.contract.word());
        h.finalize().into()
    }
}

/// A renter's promise to pay up to `cumulative_amount` token units on one lane (a lease) of
/// its channel to `provider`, in the channel's `epoch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Voucher {
    /// The renter's wallet address (the channel's depositor and the voucher's signer).
    pub renter: Address,
    /// The provider's wallet address (the only one that can redeem it).
    pub provider: Address,
    /// The channel's epoch (it grows at each withdrawal; older vouchers are void).
    pub epoch: u64,
    /// The lane: one per lease.
    pub lane: [u8; 32],
    /// Everything paid on this lane so far, in the token's smallest units.
    pub cumulative_amount: u128,
}

impl Voucher {
    /// The EIP-712 digest the renter signs and the contract checks.
    pub fn digest(&self, domain: &Domain) -> [u8; 32] {
        let mut s = Keccak256::new();
        s.update(Keccak256::digest(VOUCHER_TYPE.as_bytes()));
        s.update(self.renter.word());
        s.update(self.provider.word());
        s.update(u256_word(u128::from(self.epoch)));
        s.update(self.lane);
        s.update(u256_word(self.cumulative_amount));
        let struct_hash: [u8; 32] = s.finalize().into();
        let mut h = Keccak256::new();
        h.update([0x19, 0x01]);
        h.update(domain.separator());
        h.update(struct_hash);
        h.finalize().into()
    }

    /// Signs it with the renter's wallet key.
    pub fn sign(&self, domain: &Domain, key: &WalletKey) -> [u8; SIGNATURE_LEN] {
        key.sign_digest(&self.digest(domain))
    }

    /// Whether `signature` is the renter's on this voucher in `domain`.
    pub fn verify(&self, domain: &Domain, signature: &[u8]) -> Result<(), WalletError> {
        if recover(&self.digest(domain), signature)? == self.renter {
            Ok(())
        } else {
            Err(WalletError::Invalid)
        }
    }
}

/// Cap on an encoded [`WalletBinding`].
pub const MAX_WALLET_BINDING_BYTES: usize = 256;
/// What the wallet key signs to show it belongs to the node (with the network and the node's
/// public key after it, hashed with Keccak-256).
const POSSESSION_TAG: &[u8] = b"gridlease/v1/wallet-possession";

/// A node's binding of a wallet address to its identity: signed by the identity (as a
/// [`Signed`] envelope), and holding the wallet's own signature over the node's public key
/// and network, so neither key can be claimed by a node that does not hold both. Offers and
/// leases are to carry it, so a voucher is bound to the lease's renter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalletBinding {
    /// The wallet's address.
    pub address: [u8; 20],
    /// The wallet key's signature (65 bytes) over [`possession_digest`].
    #[serde(with = "serde_bytes")]
    pub possession: Vec<u8>,
}

impl Shape for WalletBinding {
    fn check_shape(&self) -> Result<(), ShapeError> {
        if self.possession.len() != SIGNATURE_LEN {
            return Err(ShapeError {
                field: "possession",
                problem: format!("{} bytes, a signature is 65", self.possession.len()),
            });
        }
        Ok(())
    }
}

wire_message!(
    WalletBinding,
    MessageKind::WalletBinding,
    MAX_WALLET_BINDING_BYTES
);

/// What the wallet key signs for a [`WalletBinding`]: Keccak-256 of the tag, the network and
/// the node's public key.
pub fn possession_digest(network: &NetworkId, node: &PublicKey) -> [u8; 32] {
    let mut h = Keccak256::new();
    h.update(POSSESSION_TAG);
    h.update([0]);
    h.update(network.as_str().as_bytes());
    h.update([0]);
    h.update(node.0);
    h.finalize().into()
}

impl WalletBinding {
    /// `wallet`'s half of its binding to the node `node` on `network`: its address and its
    /// signature over the node's key (carried inside a message the node signs, such as its
    /// offer or a lease's terms, that signature is the other half).
    pub fn possession(node: &PublicKey, wallet: &WalletKey, network: &NetworkId) -> Self {
        let possession = wallet.sign_digest(&possession_digest(network, node));
        Self {
            address: wallet.address().0,
            possession: possession.to_vec(),
        }
    }

    /// The node `node` binds `wallet` on `network`.
    pub fn sign(
        node: &NodeKey,
        wallet: &WalletKey,
        network: &NetworkId,
    ) -> Result<Signed<Self>, crate::codec::CodecError> {
        Signed::sign(
            node,
            network,
            &Self::possession(&node.public(), wallet, network),
        )
    }
}

/// Why a wallet binding does not stand.
#[derive(Debug, thiserror::Error)]
pub enum BindingError {
    /// The identity's envelope does not verify.
    #[error("wallet binding: {0}")]
    Envelope(#[from] EnvelopeError),
    /// The wallet's signature is not the address's, over this node and network.
    #[error("wallet binding: the wallet's signature is not {address}'s over this node: {why}")]
    Possession {
        /// The address claimed.
        address: Address,
        /// Why.
        why: String,
    },
}

/// Checks a binding: the identity signed it on `network`, and the address's key signed the
/// identity. Returns the signer's public key and the address.
pub fn verify_binding(
    signed: &Signed<WalletBinding>,
    network: &NetworkId,
) -> Result<(PublicKey, Address), BindingError> {
    let verified = signed.verify(network)?;
    let node = verified.signer;
    let address = verified.message.possessed_by(network, &node)?;
    Ok((node, address))
}

impl WalletBinding {
    /// Whether the address's key signed `node` on `network` (the possession half of a
    /// binding; a binding carried inside a message `node` signed, such as its offer or a
    /// lease's terms, has the other half from that signature). Returns the address.
    pub fn possessed_by(
        &self,
        network: &NetworkId,
        node: &PublicKey,
    ) -> Result<Address, BindingError> {
        let address = Address(self.address);
        self.check_shape().map_err(|e| BindingError::Possession {
            address,
            why: e.to_string(),
        })?;
        let got = recover(&possession_digest(network, node), &self.possession).map_err(|e| {
            BindingError::Possession {
                address,
                why: e.to_string(),
            }
        })?;
        if got != address {
            return Err(BindingError::Possession {
                address,
                why: format!("it recovers {got}"),
            });
        }
        Ok(address)
    }
}

/// The fewest decimals a settlement token may have: a price's micro-unit must be a whole
/// number of the token's smallest units.
pub const MIN_TOKEN_DECIMALS: u8 = 6;
/// The most decimals a settlement token may have: any `u64` of micro-units converts into a
/// `u128` of token units.
pub const MAX_TOKEN_DECIMALS: u8 = 24;

/// A chain, an ERC-20 token on it and the channel contract (`GridleaseChannels.vy`) a node
/// settles through (issue 50). Two nodes settle a lease on chain only when these are equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChainTerms {
    /// The chain's id (EIP-155).
    pub chain_id: u64,
    /// The token's address.
    pub token: [u8; 20],
    /// The token's decimals (ERC-20 `decimals()`): one micro-unit of a price is
    /// `10^(decimals - 6)` of its smallest units.
    pub token_decimals: u8,
    /// The channel contract's address.
    pub channel_contract: [u8; 20],
}

impl ChainTerms {
    /// The EIP-712 domain of its vouchers.
    pub fn domain(&self) -> Domain {
        Domain {
            chain_id: self.chain_id,
            contract: Address(self.channel_contract),
        }
    }

    /// `micros` micro-units in the token's smallest units (exact; the shape check keeps the
    /// decimals where it cannot overflow).
    pub fn token_amount(&self, micros: u64) -> u128 {
        let scale = 10u128.pow(u32::from(
            self.token_decimals.saturating_sub(MIN_TOKEN_DECIMALS),
        ));
        u128::from(micros).saturating_mul(scale)
    }

    fn check_shape(&self) -> Result<(), ShapeError> {
        if !(MIN_TOKEN_DECIMALS..=MAX_TOKEN_DECIMALS).contains(&self.token_decimals) {
            return Err(ShapeError {
                field: "settlement.chain.token_decimals",
                problem: format!(
                    "{}; {MIN_TOKEN_DECIMALS} to {MAX_TOKEN_DECIMALS}",
                    self.token_decimals
                ),
            });
        }
        if self.chain_id == 0 {
            return Err(ShapeError {
                field: "settlement.chain.chain_id",
                problem: "0 is no chain".into(),
            });
        }
        Ok(())
    }
}

impl fmt::Display for ChainTerms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "chain {} token {} channel contract {}",
            self.chain_id,
            Address(self.token),
            Address(self.channel_contract)
        )
    }
}

/// What an offer says about on-chain settlement: the chain it accepts and the provider's
/// wallet (the possession half of its binding; the offer's own signature is the other).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfferSettlement {
    /// The chain, token and contract.
    pub chain: ChainTerms,
    /// The provider's wallet, which redeems.
    pub wallet: WalletBinding,
}

impl Shape for OfferSettlement {
    fn check_shape(&self) -> Result<(), ShapeError> {
        self.chain.check_shape()?;
        self.wallet.check_shape()
    }
}

/// What a lease's terms say about on-chain settlement: each receipt carries an EIP-712
/// voucher ([`LeaseSettlement::voucher`]) by the renter's wallet on lane = the lease id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseSettlement {
    /// The chain, token and contract (the offer's).
    pub chain: ChainTerms,
    /// The renter's wallet (the channel's depositor, the vouchers' signer), bound to the
    /// renter by the terms' signature and its own possession signature.
    pub renter_wallet: WalletBinding,
    /// The provider's wallet address (the offer's).
    pub provider_wallet: [u8; 20],
    /// The renter's channel epoch with that provider when it asked (the contract voids the
    /// vouchers of earlier epochs).
    pub epoch: u64,
}

impl Shape for LeaseSettlement {
    fn check_shape(&self) -> Result<(), ShapeError> {
        self.chain.check_shape()?;
        self.renter_wallet.check_shape()
    }
}

impl LeaseSettlement {
    /// The voucher a receipt of `lease` paying `total_paid` micro-units carries.
    pub fn voucher(&self, lease: &crate::types::LeaseId, total_paid: u64) -> Voucher {
        Voucher {
            renter: Address(self.renter_wallet.address),
            provider: Address(self.provider_wallet),
            epoch: self.epoch,
            lane: lease.0.0,
            cumulative_amount: self.chain.token_amount(total_paid),
        }
    }
}

/// A `uint256` ABI word of a value that fits in 128 bits (big-endian, left-padded).
fn u256_word(v: u128) -> [u8; 32] {
    let mut w = [0u8; 32];
    w[16..].copy_from_slice(&v.to_be_bytes());
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u16) -> WalletKey {
        let mut s = [0u8; 32];
        s[30..].copy_from_slice(&n.to_be_bytes());
        WalletKey::from_secret(s).unwrap()
    }

    /// Made with eth-account 0.14 (`Account.from_key`, `encode_typed_data`, `sign_message`):
    /// keys 0x1001 and 0x2002, chain 137, contract 0x1111..11, epoch 2, lane 0x0a..0a,
    /// amount 1234567.
    const RENTER: &str = "0x123ABAF7a75FE084F7F5Bf8dd7e3e6D9E6027B3b";
    const PROVIDER: &str = "0x91C57F34a4f6C45127bdD511ff4bEc9ee6dEA0CE";
    const DIGEST: &str = "01427ca823266512c73b706c39b598ebea44b541f3cc06a70ddd581a3c9994a8";
    const SIGNATURE: &str = "364de381b4a89757ffebb3b739bda7ae2ed701091e04e45df51c700ab391ebbd528a547002aa33ba010ee38d87a8a5bf1025276f324e7adfd08f2de4dc0169121c";

    fn vector() -> (Domain, Voucher) {
        let domain = Domain {
            chain_id: 137,
            contract: "0x1111111111111111111111111111111111111111"
                .parse()
                .unwrap(),
        };
        let voucher = Voucher {
            renter: RENTER.parse().unwrap(),
            provider: PROVIDER.parse().unwrap(),
            epoch: 2,
            lane: [0x0a; 32],
            cumulative_amount: 1_234_567,
        };
        (domain, voucher)
    }

    #[test]
    fn addresses_digests_and_signatures_match_eth_account() {
        assert_eq!(key(0x1001).address().to_string(), RENTER);
        assert_eq!(key(0x2002).address().to_string(), PROVIDER);
        let (domain, voucher) = vector();
        assert_eq!(hex::encode(voucher.digest(&domain)), DIGEST);
        let sig = voucher.sign(&domain, &key(0x1001));
        assert_eq!(hex::encode(sig), SIGNATURE);
        assert_eq!(voucher.verify(&domain, &sig), Ok(()));
    }

    #[test]
    fn what_the_contract_refuses_is_refused() {
        let (domain, voucher) = vector();
        let sig = voucher.sign(&domain, &key(0x1001));
        // Another amount, lane, epoch, chain or contract: another digest, another signer.
        let other = Voucher {
            cumulative_amount: 1_234_568,
            ..voucher
        };
        assert_eq!(other.verify(&domain, &sig), Err(WalletError::Invalid));
        let elsewhere = Domain {
            chain_id: 1,
            ..domain
        };
        assert_eq!(voucher.verify(&elsewhere, &sig), Err(WalletError::Invalid));
        // Someone else's signature.
        let forged = voucher.sign(&domain, &key(0x3003));
        assert_eq!(voucher.verify(&domain, &forged), Err(WalletError::Invalid));
        // The high-s twin (valid ECDSA, refused as malleable), a bad v, a short one.
        let n = hex::decode("fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141")
            .unwrap();
        let mut twin = sig;
        let mut borrow = 0i16;
        for i in (0..32).rev() {
            let d = i16::from(n[i]) - i16::from(sig[32 + i]) - borrow;
            borrow = i16::from(d < 0);
            twin[32 + i] = d.rem_euclid(256) as u8;
        }
        twin[64] = 55 - sig[64];
        assert_eq!(voucher.verify(&domain, &twin), Err(WalletError::HighS));
        let mut bad_v = sig;
        bad_v[64] = 1;
        assert_eq!(voucher.verify(&domain, &bad_v), Err(WalletError::BadV(1)));
        assert_eq!(
            voucher.verify(&domain, &sig[..64]),
            Err(WalletError::Length(64))
        );
    }

    #[test]
    fn a_binding_holds_both_keys_and_nothing_else() {
        let net = NetworkId::devnet();
        let node = NodeKey::from_secret([7; 32]);
        let wallet = key(0x1001);
        let signed = WalletBinding::sign(&node, &wallet, &net).unwrap();
        let (who, address) = verify_binding(&signed, &net).unwrap();
        assert_eq!((who, address), (node.public(), wallet.address()));
        // Another network: the envelope does not verify.
        let other_net = NetworkId::new("other").unwrap();
        assert!(matches!(
            verify_binding(&signed, &other_net),
            Err(BindingError::Envelope(_))
        ));
        // A node claiming someone else's address with its own wallet's signature, or
        // replaying another node's possession signature: refused.
        let thief = NodeKey::from_secret([8; 32]);
        let stolen = WalletBinding {
            address: wallet.address().0,
            possession: signed.verify(&net).unwrap().message.possession,
        };
        let replayed = Signed::sign(&thief, &net, &stolen).unwrap();
        assert!(matches!(
            verify_binding(&replayed, &net),
            Err(BindingError::Possession { .. })
        ));
        let claimed = WalletBinding {
            address: wallet.address().0,
            possession: key(0x3003)
                .sign_digest(&possession_digest(&net, &thief.public()))
                .to_vec(),
        };
        let claimed = Signed::sign(&thief, &net, &claimed).unwrap();
        assert!(matches!(
            verify_binding(&claimed, &net),
            Err(BindingError::Possession { .. })
        ));
    }

    #[test]
    fn addresses_parse_in_any_case_and_refuse_the_rest() {
        let a: Address = RENTER.to_lowercase().parse().unwrap();
        assert_eq!(a.to_string(), RENTER);
        assert!(
            "123ABAF7a75FE084F7F5Bf8dd7e3e6D9E6027B3b"
                .parse::<Address>()
                .is_err()
        );
        assert!("0x123".parse::<Address>().is_err());
        assert!(format!("0x{}", "g".repeat(40)).parse::<Address>().is_err());
    }

    #[test]
    fn the_key_file_round_trips_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wallet.key");
        let k = WalletKey::generate().unwrap();
        k.create_file(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(WalletKey::load_file(&path).unwrap().address(), k.address());
        assert!(k.create_file(&path).is_err(), "never overwritten");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(WalletKey::load_file(&path).is_err(), "readable by others");
        let zero = dir.path().join("zero.key");
        std::fs::write(&zero, [0u8; 32]).unwrap();
        std::fs::set_permissions(&zero, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            WalletKey::load_file(&zero),
            Err(IdentityError::BadSecret { .. })
        ));
    }
}
