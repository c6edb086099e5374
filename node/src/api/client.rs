//! The CLI's typed client of the control API (HTTP/1.1 over the home's Unix socket).

use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::problem::{Problem, ProblemType};
use super::types::{
    BegunView, ExtendRequest, Extended, RentRequest, RentedView, StatusView, StoppingView,
};
use crate::lease::{LeaseView, Ledger};

/// Socket file name inside the home.
pub const SOCKET_FILE: &str = "api.sock";

/// The socket path of a home.
pub fn socket_path(home: &Path) -> PathBuf {
    home.join(SOCKET_FILE)
}

/// Most bytes of one API answer the CLI accepts.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;
/// Most bytes of a statement answer (`GET /v1/leases/{id}/statement`).
pub const MAX_STATEMENT_RESPONSE: usize = gridlease_protocol::statement::MAX_STATEMENT_BYTES;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No daemon listens on this home.
    #[error(
        "no node is running for {home} (no answer on {socket}); start one with `gridlease node --home {home}`"
    )]
    NoNode {
        /// The home directory.
        home: String,
        /// The socket tried.
        socket: String,
    },
    /// The daemon answered with an error (a [`Problem`]).
    #[error("{message}{}", hint.as_ref().map(|h| format!("\nhint: {h}")).unwrap_or_default())]
    Api {
        /// HTTP status.
        status: u16,
        /// The problem's kind (`None`: one this CLI does not know, or no problem body).
        kind: Option<ProblemType>,
        /// What went wrong (the problem's `detail`).
        message: String,
        /// What to do.
        hint: Option<String>,
    },
    /// Transport failure after connecting.
    #[error("control API: {0}")]
    Transport(String),
}

impl ClientError {
    /// The process exit code for this error: 3 when no node runs, 4 when the other side
    /// refused ([`ProblemType::is_refusal`]: a rejected lease, a refused extension or
    /// access), 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::NoNode { .. } => 3,
            Self::Api { kind: Some(k), .. } if k.is_refusal() => 4,
            _ => 1,
        }
    }

    /// The error for a non-success answer: its problem body, or (from something that is not
    /// this API) the status and the text.
    fn from_answer(status: StatusCode, body: &[u8]) -> Self {
        match serde_json::from_slice::<Problem>(body) {
            Ok(p) => Self::Api {
                status: status.as_u16(),
                kind: p.problem_type(),
                message: p.detail,
                hint: p.hint,
            },
            Err(_) => Self::Api {
                status: status.as_u16(),
                kind: None,
                message: format!("HTTP {status}: {}", String::from_utf8_lossy(body)),
                hint: None,
            },
        }
    }
}

/// A client bound to one home.
#[derive(Clone, Debug)]
pub struct ApiClient {
    home: PathBuf,
    socket: PathBuf,
}

impl ApiClient {
    /// A client for the daemon of `home`.
    pub fn new(home: &Path) -> Self {
        Self {
            home: home.to_path_buf(),
            socket: socket_path(home),
        }
    }

    /// The home directory this client talks to.
    pub fn home(&self) -> &Path {
        &self.home
    }

    /// `GET /v1/status`.
    pub async fn status(&self) -> Result<StatusView, ClientError> {
        self.get("/v1/status").await
    }

    /// `POST /v1/leases`: negotiates a lease; answers once both sides signed (or the provider
    /// refused: [`ClientError::Api`] with status 409).
    pub async fn rent(&self, body: &RentRequest) -> Result<RentedView, ClientError> {
        self.post("/v1/leases", body).await
    }

    /// `GET /v1/leases`: every lease of this node, oldest first.
    pub async fn leases(&self) -> Result<Vec<LeaseView>, ClientError> {
        self.get("/v1/leases").await
    }

    /// `GET /v1/leases/{lease}`; `lease` is an id or a unique prefix of one.
    pub async fn lease(&self, lease: &str) -> Result<LeaseView, ClientError> {
        self.get(&format!("/v1/leases/{lease}")).await
    }

    /// `POST /v1/leases/{lease}/stop`: ends the lease now; answers before it has settled.
    pub async fn stop(&self, lease: &str) -> Result<StoppingView, ClientError> {
        /// The route takes no body; `{}` keeps it valid JSON.
        #[derive(Serialize)]
        struct NoBody {}
        self.post(&format!("/v1/leases/{lease}/stop"), &NoBody {})
            .await
    }

    /// `POST /v1/leases/{lease}/begin`: starts the command of a lease held for uploads.
    pub async fn begin(&self, lease: &str) -> Result<BegunView, ClientError> {
        /// The route takes no body; `{}` keeps it valid JSON.
        #[derive(Serialize)]
        struct NoBody {}
        self.post(&format!("/v1/leases/{lease}/begin"), &NoBody {})
            .await
    }

    /// `POST /v1/leases/{lease}/verify-gpu`: re-checks a running lease's GPUs.
    pub async fn verify_gpu(
        &self,
        lease: &str,
    ) -> Result<crate::lease::gpu_check::GpuCheckView, ClientError> {
        /// The route takes no body; `{}` keeps it valid JSON.
        #[derive(Serialize)]
        struct NoBody {}
        self.post(&format!("/v1/leases/{lease}/verify-gpu"), &NoBody {})
            .await
    }

    /// `POST /v1/leases/{lease}/extend`: extends a running lease this node rents; answers once
    /// the provider accepted ([`ClientError::Api`] with status 409 when refused).
    pub async fn extend(&self, lease: &str, body: &ExtendRequest) -> Result<Extended, ClientError> {
        self.post(&format!("/v1/leases/{lease}/extend"), body).await
    }

    /// `GET /v1/leases/{lease}/statement`: the statement file's bytes.
    pub async fn statement(&self, lease: &str) -> Result<Bytes, ClientError> {
        let path = format!("/v1/leases/{lease}/statement");
        let (_, body) = self
            .request_capped(Method::GET, &path, None::<&()>, MAX_STATEMENT_RESPONSE)
            .await?;
        Ok(body)
    }

    /// `GET /v1/ledger`.
    pub async fn ledger(&self) -> Result<Ledger, ClientError> {
        self.get("/v1/ledger").await
    }

    /// `GET /v1/wallet`.
    pub async fn wallet(&self) -> Result<crate::lease::wallet::WalletView, ClientError> {
        self.get("/v1/wallet").await
    }

    /// `POST path` with a JSON body and `Upgrade: gridlease-access`: answers the upgraded
    /// connection once the daemon switched protocols (an interactive access stream), or the
    /// daemon's error (a refusal is [`ClientError::Api`] with status 409).
    pub async fn upgrade<B: Serialize>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<TokioIo<hyper::upgrade::Upgraded>, ClientError> {
        let transport = |e: &dyn std::fmt::Display| ClientError::Transport(e.to_string());
        let (mut sender, conn) = self.connect().await?;
        tokio::spawn(conn.with_upgrades());
        let bytes = serde_json::to_vec(body).map_err(|e| transport(&e))?;
        let req = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header("host", "gridlease")
            .header("content-type", "application/json")
            .header(hyper::header::CONNECTION, "upgrade")
            .header(hyper::header::UPGRADE, super::types::ACCESS_UPGRADE)
            .body(Full::new(Bytes::from(bytes)))
            .map_err(|e| transport(&e))?;
        let resp = sender.send_request(req).await.map_err(|e| transport(&e))?;
        let status = resp.status();
        if status == StatusCode::SWITCHING_PROTOCOLS {
            let up = hyper::upgrade::on(resp).await.map_err(|e| transport(&e))?;
            return Ok(TokioIo::new(up));
        }
        let body = http_body_util::Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| transport(&e))?
            .to_bytes();
        Err(ClientError::from_answer(status, &body))
    }

    /// [`ApiClient::upgrade`], answering the control socket itself (for a process that hands
    /// the connection on, as `ssh-proxy` hands it to `ssh`). Fails if the daemon wrote past its
    /// 101 before this end spoke (those bytes would be lost with hyper's buffer).
    pub async fn upgrade_socket<B: Serialize>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<tokio::net::UnixStream, ClientError> {
        let up = self.upgrade(path, body).await?.into_inner();
        let parts = up
            .downcast::<TokioIo<tokio::net::UnixStream>>()
            .map_err(|_| {
                ClientError::Transport("the upgraded connection is not the socket".into())
            })?;
        if !parts.read_buf.is_empty() {
            return Err(ClientError::Transport(
                "the node spoke before the client after switching protocols".into(),
            ));
        }
        Ok(parts.io.into_inner())
    }

    /// `GET path`.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.call(Method::GET, path, None::<&()>).await
    }

    /// `POST path` with a JSON body.
    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        self.call(Method::POST, path, Some(body)).await
    }

    /// `PUT path` with a JSON body.
    pub async fn put<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        self.call(Method::PUT, path, Some(body)).await
    }

    /// `DELETE path`.
    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.call(Method::DELETE, path, None::<&()>).await
    }

    /// `GET path`, answering the raw body and headers (log bytes).
    pub async fn get_raw(&self, path: &str) -> Result<(hyper::HeaderMap, Bytes), ClientError> {
        let (headers, body) = self.request(Method::GET, path, None::<&()>).await?;
        Ok((headers, body))
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        let (_, bytes) = self.request(method, path, body).await?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Transport(e.to_string()))
    }

    /// An HTTP/1.1 connection to the daemon's socket.
    async fn connect(
        &self,
    ) -> Result<
        (
            hyper::client::conn::http1::SendRequest<Full<Bytes>>,
            hyper::client::conn::http1::Connection<TokioIo<tokio::net::UnixStream>, Full<Bytes>>,
        ),
        ClientError,
    > {
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|_| ClientError::NoNode {
                home: self.home.display().to_string(),
                socket: self.socket.display().to_string(),
            })?;
        hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| ClientError::Transport(e.to_string()))
    }

    async fn request<B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<(hyper::HeaderMap, Bytes), ClientError> {
        self.request_capped(method, path, body, MAX_RESPONSE_BYTES)
            .await
    }

    /// [`ApiClient::request`] reading at most `max` bytes of the answer.
    async fn request_capped<B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        max: usize,
    ) -> Result<(hyper::HeaderMap, Bytes), ClientError> {
        let transport = |e: &dyn std::fmt::Display| ClientError::Transport(e.to_string());
        let (mut sender, conn) = self.connect().await?;
        let driver = tokio::spawn(conn);
        let bytes = match body {
            Some(b) => serde_json::to_vec(b).map_err(|e| transport(&e))?,
            None => Vec::new(),
        };
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "gridlease")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(bytes)))
            .map_err(|e| transport(&e))?;
        let resp = sender.send_request(req).await.map_err(|e| transport(&e))?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = http_body_util::Limited::new(resp.into_body(), max)
            .collect()
            .await
            .map_err(|e| transport(&e))?
            .to_bytes();
        driver.abort();
        if !status.is_success() {
            return Err(ClientError::from_answer(status, &body));
        }
        Ok((headers, body))
    }
}
