//! The node's chain client (issue 50): the payment channel contract
//! (`settlement/contracts/GridleaseChannels.vy`) and its ERC-20 token, over standard Ethereum
//! JSON-RPC (HTTP or HTTPS) through `alloy`.
//!
//! The contract's bindings come from its committed build (`settlement/build/GridleaseChannels.json`,
//! which `.ci/run` checks against the source), so the node and the contract cannot drift apart.
//! Transactions are signed by the node's wallet key ([`WalletKey`], `<home>/wallet.key`): the key
//! never leaves `gridlease_protocol::wallet`, which signs the transaction's hash here as it signs
//! vouchers. Every call is bounded in time ([`RPC_TIMEOUT`] per request, the confirmation
//! timeout per transaction). Errors name the endpoint by its scheme, host and port only: an RPC
//! address often carries an API key in its path.
//!
//! Amounts are in the token's smallest units (`u128`: a voucher's cumulative amount is one).

use std::sync::Arc;
use std::time::Duration;

use alloy::consensus::SignableTransaction;
use alloy::network::{EthereumWallet, TxSigner};
use alloy::primitives::{Address as EvmAddress, B256, Bytes, Signature, U256};
use alloy::providers::{DynProvider, Provider, ProviderBuilder};
use alloy::rpc::types::TransactionReceipt;
use gridlease_protocol::wallet::{Address, ChainTerms, WalletKey};

mod bindings {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    alloy::sol!(
        #[sol(rpc)]
        GridleaseChannels,
        "../settlement/build/GridleaseChannels.json"
    );

    alloy::sol! {
        /// The ERC-20 calls the node makes.
        #[sol(rpc)]
        interface IERC20 {
            function balanceOf(address owner) external view returns (uint256);
            function allowance(address owner, address spender) external view returns (uint256);
            function approve(address spender, uint256 amount) external returns (bool);
        }
    }
}

use bindings::{GridleaseChannels, IERC20};

/// The most a single JSON-RPC request may take.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(30);

/// The contract's largest `redeem_batch`.
pub const MAX_BATCH: usize = 32;

/// What went wrong talking to the chain.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    /// The configured RPC address is not an `http://` or `https://` URL.
    #[error("chain_rpc {0:?} is not an http:// or https:// URL")]
    BadUrl(String),
    /// The endpoint serves another chain than the configuration names.
    #[error("the chain RPC at {endpoint} serves chain {got}, but chain_id is {want}")]
    WrongChain {
        /// The endpoint (scheme, host, port).
        endpoint: String,
        /// Its chain id.
        got: u64,
        /// The configured one.
        want: u64,
    },
    /// The endpoint failed, or did not answer in time.
    #[error("the chain RPC at {endpoint} failed ({what}): {message}")]
    Rpc {
        /// The endpoint.
        endpoint: String,
        /// The call.
        what: &'static str,
        /// Its error.
        message: String,
    },
    /// The contract (or the token) refused the transaction; nothing was spent but the
    /// estimate (a refusal found when estimating gas is never sent).
    #[error("the chain refused {what}: {reason}")]
    Refused {
        /// The call.
        what: &'static str,
        /// The revert reason as the endpoint gave it.
        reason: String,
    },
    /// A transaction was sent but not confirmed in time (it may still be mined).
    #[error("{what} was sent as {tx} but not confirmed within {secs} s")]
    Unconfirmed {
        /// The call.
        what: &'static str,
        /// Its hash.
        tx: String,
        /// The wait.
        secs: u64,
    },
    /// A caller's mistake: more vouchers than one batch takes, a bad signature length.
    #[error("{0}")]
    Invalid(String),
}

/// A channel as the contract holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelState {
    /// Tokens deposited in this epoch.
    pub deposit: u128,
    /// Tokens paid to the provider in this epoch.
    pub redeemed: u128,
    /// When the renter's close ends (chain time, seconds); 0: not closing.
    pub closes_at: u64,
    /// The channel's epoch.
    pub epoch: u64,
}

/// One voucher to redeem: what the renter signed, and the provider's claim of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redeem {
    /// The renter's wallet.
    pub renter: Address,
    /// The lane (the lease id).
    pub lane: [u8; 32],
    /// The cumulative amount signed.
    pub amount: u128,
    /// What the provider takes on this lane in all (at most `amount`).
    pub claim: u128,
    /// The renter's EIP-712 signature (65 bytes).
    pub signature: Vec<u8>,
}

/// What one lane was paid by a redeem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LanePaid {
    /// The renter's wallet.
    pub renter: Address,
    /// The lane.
    pub lane: [u8; 32],
    /// The channel's epoch.
    pub epoch: u64,
    /// Paid by this transaction.
    pub paid: u128,
    /// Claimed but not paid (the deposit ran out; redeemable after a top-up).
    pub unpaid: u128,
}

/// A confirmed transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mined {
    /// Its hash (`0x` and 64 hex digits).
    pub tx: String,
    /// The block it is in.
    pub block: u64,
    /// Gas it used.
    pub gas_used: u64,
}

/// A close a renter started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CloseStarted {
    /// The renter's wallet.
    pub renter: Address,
    /// The epoch being closed.
    pub epoch: u64,
    /// When the challenge period ends (chain time, seconds).
    pub closes_at: u64,
    /// The block the close is in.
    pub block: u64,
}

/// Signs transactions with the node's wallet key.
struct NodeSigner {
    key: Arc<WalletKey>,
    address: EvmAddress,
}

#[async_trait::async_trait]
impl TxSigner<Signature> for NodeSigner {
    fn address(&self) -> EvmAddress {
        self.address
    }

    async fn sign_transaction(
        &self,
        tx: &mut dyn SignableTransaction<Signature>,
    ) -> alloy::signers::Result<Signature> {
        let hash = tx.signature_hash();
        let raw = self.key.sign_digest(&hash.0);
        Signature::from_raw_array(&raw).map_err(alloy::signers::Error::other)
    }
}

/// A connection to the chain the node settles on.
pub struct ChainClient {
    provider: DynProvider,
    endpoint: String,
    /// The whole address, only to take it out of error messages.
    url: String,
    terms: ChainTerms,
    wallet: EvmAddress,
    confirm: Duration,
}

impl std::fmt::Debug for ChainClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChainClient")
            .field("endpoint", &self.endpoint)
            .field("chain_id", &self.terms.chain_id)
            .field("wallet", &self.wallet)
            .finish_non_exhaustive()
    }
}

fn evm(a: Address) -> EvmAddress {
    EvmAddress::from(a.0)
}

fn ours(a: EvmAddress) -> Address {
    Address(a.into_array())
}

fn amount(v: U256) -> u128 {
    u128::try_from(v).unwrap_or(u128::MAX)
}

fn seconds(v: U256) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// `scheme://host:port` of `url`: what errors and logs show of an endpoint.
fn endpoint_of(url: &alloy::transports::http::reqwest::Url) -> String {
    match (url.host_str(), url.port()) {
        (Some(h), Some(p)) => format!("{}://{h}:{p}", url.scheme()),
        (Some(h), None) => format!("{}://{h}", url.scheme()),
        _ => url.scheme().to_string(),
    }
}

impl ChainClient {
    /// Connects to `rpc` and checks that it serves `terms.chain_id`. Transactions are signed
    /// by `key` and waited for at most `confirm` each.
    pub async fn connect(
        rpc: &str,
        key: Arc<WalletKey>,
        terms: ChainTerms,
        confirm: Duration,
    ) -> Result<Self, ChainError> {
        let url: alloy::transports::http::reqwest::Url =
            rpc.parse().map_err(|_| ChainError::BadUrl(redact(rpc)))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(ChainError::BadUrl(redact(rpc)));
        }
        let endpoint = endpoint_of(&url);
        let wallet = evm(key.address());
        let signer = NodeSigner {
            key,
            address: wallet,
        };
        // The nonce is asked of the chain for every transaction (never cached): a refused
        // estimate, another wallet on the same key or a restart cannot leave it wrong.
        let provider = ProviderBuilder::new()
            .disable_recommended_fillers()
            .with_gas_estimation()
            .with_simple_nonce_management()
            .fetch_chain_id()
            .wallet(EthereumWallet::from(signer))
            .connect_http(url)
            .erased();
        let client = Self {
            provider,
            endpoint,
            url: rpc.to_string(),
            terms,
            wallet,
            confirm,
        };
        let got = client
            .rpc("eth_chainId", client.provider.get_chain_id())
            .await?;
        if got != terms.chain_id {
            return Err(ChainError::WrongChain {
                endpoint: client.endpoint,
                got,
                want: terms.chain_id,
            });
        }
        Ok(client)
    }

    /// The endpoint, as errors show it (scheme, host, port).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// This node's wallet.
    pub fn wallet(&self) -> Address {
        ours(self.wallet)
    }

    /// The chain's latest block number.
    pub async fn block(&self) -> Result<u64, ChainError> {
        self.rpc("eth_blockNumber", self.provider.get_block_number())
            .await
    }

    /// The wallet's balance of the chain's own currency (wei): what pays gas.
    pub async fn gas_balance(&self) -> Result<u128, ChainError> {
        let b = self
            .rpc(
                "eth_getBalance",
                self.provider.get_balance(self.wallet).into_future(),
            )
            .await?;
        Ok(amount(b))
    }

    /// `who`'s balance of the token.
    pub async fn token_balance(&self, who: Address) -> Result<u128, ChainError> {
        let token = IERC20::new(EvmAddress::from(self.terms.token), &self.provider);
        let b = self
            .call("balanceOf", token.balanceOf(evm(who)).call())
            .await?;
        Ok(amount(b))
    }

    /// The channel from `renter` to `provider`.
    pub async fn channel(
        &self,
        renter: Address,
        provider: Address,
    ) -> Result<ChannelState, ChainError> {
        let c = self.channels();
        let s = self
            .call("channels", c.channels(evm(renter), evm(provider)).call())
            .await?;
        // The getter's tuple: (deposit, redeemed, closes_at, epoch), the contract's `Channel`
        // (Vyper's ABI names no structs).
        Ok(ChannelState {
            deposit: amount(s.0),
            redeemed: amount(s.1),
            closes_at: seconds(s.2),
            epoch: seconds(s.3),
        })
    }

    /// What `lane` of the channel from `renter` to `provider` has redeemed in `epoch`.
    pub async fn lane_redeemed(
        &self,
        renter: Address,
        provider: Address,
        epoch: u64,
        lane: [u8; 32],
    ) -> Result<u128, ChainError> {
        let c = self.channels();
        let v = self
            .call(
                "lane_redeemed",
                c.lane_redeemed(
                    evm(renter),
                    evm(provider),
                    U256::from(epoch),
                    B256::from(lane),
                )
                .call(),
            )
            .await?;
        Ok(amount(v))
    }

    /// The renter (this wallet) deposits `amount` into its channel to `provider`, approving
    /// the contract first when its allowance is short.
    pub async fn deposit(&self, provider: Address, amount: u128) -> Result<Mined, ChainError> {
        let token = IERC20::new(EvmAddress::from(self.terms.token), &self.provider);
        let spender = EvmAddress::from(self.terms.channel_contract);
        let allowed = self
            .call("allowance", token.allowance(self.wallet, spender).call())
            .await?;
        if allowed < U256::from(amount) {
            self.send("approve", token.approve(spender, U256::from(amount)).send())
                .await?;
        }
        let c = self.channels();
        let (mined, _) = self
            .send(
                "deposit",
                c.deposit(evm(provider), U256::from(amount)).send(),
            )
            .await?;
        Ok(mined)
    }

    /// The provider (this wallet) redeems up to [`MAX_BATCH`] vouchers in one transaction;
    /// what each lane was paid comes from the contract's `Redeemed` events.
    pub async fn redeem(&self, vouchers: &[Redeem]) -> Result<(Mined, Vec<LanePaid>), ChainError> {
        if vouchers.is_empty() || vouchers.len() > MAX_BATCH {
            return Err(ChainError::Invalid(format!(
                "a redeem takes 1 to {MAX_BATCH} vouchers, not {}",
                vouchers.len()
            )));
        }
        let mut batch = Vec::with_capacity(vouchers.len());
        for v in vouchers {
            if v.signature.len() != gridlease_protocol::wallet::SIGNATURE_LEN {
                return Err(ChainError::Invalid(format!(
                    "a voucher signature is {} bytes, not {}",
                    v.signature.len(),
                    gridlease_protocol::wallet::SIGNATURE_LEN
                )));
            }
            // The contract's `Voucher`: (renter, lane, cumulative_amount, claim, signature).
            batch.push((
                evm(v.renter),
                B256::from(v.lane),
                U256::from(v.amount),
                U256::from(v.claim),
                Bytes::copy_from_slice(&v.signature),
            ));
        }
        let c = self.channels();
        let (mined, receipt) = self
            .send("redeem_batch", c.redeem_batch(batch).send())
            .await?;
        let paid = receipt
            .inner
            .logs()
            .iter()
            .filter_map(|l| l.log_decode::<GridleaseChannels::Redeemed>().ok())
            .map(|l| {
                let e = l.inner.data;
                LanePaid {
                    renter: ours(e.renter),
                    lane: e.lane.0,
                    epoch: seconds(e.epoch),
                    paid: amount(e.paid),
                    unpaid: amount(e.unpaid),
                }
            })
            .collect();
        Ok((mined, paid))
    }

    /// The renter (this wallet) starts closing its channel to `provider`.
    pub async fn start_close(&self, provider: Address) -> Result<Mined, ChainError> {
        let c = self.channels();
        Ok(self
            .send("start_close", c.start_close(evm(provider)).send())
            .await?
            .0)
    }

    /// The renter (this wallet), after the challenge period, takes back what was not redeemed.
    pub async fn withdraw(&self, provider: Address) -> Result<Mined, ChainError> {
        let c = self.channels();
        Ok(self
            .send("withdraw", c.withdraw(evm(provider)).send())
            .await?
            .0)
    }

    /// The closes renters started on their channels to this wallet in blocks `from..=to`
    /// (endpoints limit a log query's range: ask for a few thousand blocks at a time).
    pub async fn closes_between(
        &self,
        from: u64,
        to: u64,
    ) -> Result<Vec<CloseStarted>, ChainError> {
        let c = self.channels();
        let filter = c
            .CloseStarted_filter()
            .topic2(self.wallet)
            .from_block(from)
            .to_block(to);
        let found = self.rpc("eth_getLogs", filter.query()).await?;
        Ok(found
            .into_iter()
            .map(|(e, log)| CloseStarted {
                renter: ours(e.renter),
                epoch: seconds(e.epoch),
                closes_at: seconds(e.closes_at),
                block: log.block_number.unwrap_or_default(),
            })
            .collect())
    }

    fn channels(&self) -> GridleaseChannels::GridleaseChannelsInstance<&DynProvider> {
        GridleaseChannels::new(
            EvmAddress::from(self.terms.channel_contract),
            &self.provider,
        )
    }

    /// A request, bounded by [`RPC_TIMEOUT`].
    async fn rpc<T, E: std::fmt::Display>(
        &self,
        what: &'static str,
        fut: impl std::future::IntoFuture<Output = Result<T, E>>,
    ) -> Result<T, ChainError> {
        match tokio::time::timeout(RPC_TIMEOUT, fut.into_future()).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.rpc_error(what, &e)),
            Err(_) => Err(self.timed_out(what)),
        }
    }

    /// A request that got no answer within [`RPC_TIMEOUT`].
    fn timed_out(&self, what: &'static str) -> ChainError {
        ChainError::Rpc {
            endpoint: self.endpoint.clone(),
            what,
            message: format!("no answer within {} s", RPC_TIMEOUT.as_secs()),
        }
    }

    /// An endpoint's failure, its message without the RPC address's path.
    fn rpc_error(&self, what: &'static str, e: &dyn std::fmt::Display) -> ChainError {
        ChainError::Rpc {
            endpoint: self.endpoint.clone(),
            what,
            message: self.redacted(&e.to_string()),
        }
    }

    /// `text` with the RPC address (as given, and as a URL prints it) replaced by the endpoint.
    fn redacted(&self, text: &str) -> String {
        let mut out = text.replace(&self.url, &self.endpoint);
        if let Ok(u) = self.url.parse::<alloy::transports::http::reqwest::Url>() {
            out = out.replace(u.as_str(), &self.endpoint);
        }
        out
    }

    /// A contract call (`eth_call`), bounded by [`RPC_TIMEOUT`]; a revert is [`ChainError::Refused`].
    async fn call<T>(
        &self,
        what: &'static str,
        fut: impl std::future::IntoFuture<Output = Result<T, alloy::contract::Error>>,
    ) -> Result<T, ChainError> {
        match tokio::time::timeout(RPC_TIMEOUT, fut.into_future()).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.contract_error(what, &e)),
            Err(_) => Err(self.timed_out(what)),
        }
    }

    /// Sends a transaction (estimated first: a refusal is found before anything is spent) and
    /// waits for its receipt; a mined revert is [`ChainError::Refused`] too.
    async fn send(
        &self,
        what: &'static str,
        fut: impl std::future::IntoFuture<
            Output = Result<
                alloy::providers::PendingTransactionBuilder<alloy::network::Ethereum>,
                alloy::contract::Error,
            >,
        >,
    ) -> Result<(Mined, TransactionReceipt), ChainError> {
        let pending = self.call(what, fut).await?;
        let tx = format!("{:#x}", pending.tx_hash());
        let receipt = match tokio::time::timeout(self.confirm, pending.get_receipt()).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Err(self.rpc_error(what, &e)),
            Err(_) => {
                return Err(ChainError::Unconfirmed {
                    what,
                    tx,
                    secs: self.confirm.as_secs(),
                });
            }
        };
        if !receipt.status() {
            return Err(ChainError::Refused {
                what,
                reason: format!("transaction {tx} reverted"),
            });
        }
        let mined = Mined {
            tx,
            block: receipt.block_number.unwrap_or_default(),
            gas_used: receipt.gas_used,
        };
        Ok((mined, receipt))
    }

    fn contract_error(&self, what: &'static str, e: &alloy::contract::Error) -> ChainError {
        let text = e.to_string();
        match text.find("execution reverted") {
            Some(at) => ChainError::Refused {
                what,
                reason: self.redacted(&text[at..]),
            },
            None => self.rpc_error(what, &text),
        }
    }
}

/// An RPC address as errors, logs and status show it: without its path and query (an API key
/// often rides there).
pub fn redact(rpc: &str) -> String {
    match rpc.parse::<alloy::transports::http::reqwest::Url>() {
        Ok(u) => endpoint_of(&u),
        Err(_) => rpc.chars().take(40).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_never_show_a_path_or_query() {
        assert_eq!(
            redact("https://mainnet.example/v3/SECRETKEY?x=1"),
            "https://mainnet.example"
        );
        assert_eq!(redact("http://127.0.0.1:8545/abc"), "http://127.0.0.1:8545");
    }

    #[tokio::test]
    async fn a_bad_url_is_refused_before_any_request() {
        let key = Arc::new(WalletKey::from_secret([7; 32]).unwrap());
        let terms = ChainTerms {
            chain_id: 1,
            token: [1; 20],
            token_decimals: 6,
            channel_contract: [2; 20],
        };
        for bad in ["ftp://x/y", "not a url", "unix:/tmp/sock"] {
            let e = ChainClient::connect(bad, key.clone(), terms, Duration::from_secs(1))
                .await
                .unwrap_err();
            assert!(matches!(e, ChainError::BadUrl(_)), "{bad}: {e}");
        }
    }
}
