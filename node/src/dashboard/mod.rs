//! `gridlease dashboard`: a local web page for one node, served on 127.0.0.1.
//!
//! The page (plain HTML, CSS and JS bundled into the binary, no external resources) reads
//! everything through the node's control API: this server passes `/v1/...` requests through to
//! `<home>/api.sock` unchanged ([`forward`]), so the page and the CLI read the same answers and
//! there is no second source of truth. Only the reads the page makes (`GET`) and the one write
//! its settings make (`PUT /v1/provide`) are passed on; nothing else reaches the node.
//!
//! Access: every request must name the loopback address and port it was sent to in `Host`
//! (a page of another site that rebinds its DNS name to 127.0.0.1 is refused), and every
//! request but the static page itself must carry the home's access token
//! (`<home>/dashboard.token`, 0600, [`load_or_create_token`]) as `Authorization: Bearer ...`,
//! compared in constant time. Refusals are problems (`application/problem+json`) like the
//! control API's.
//!
//! What it must never do: listen on anything but loopback, pass on a request outside `/v1/`
//! or an upgrade (interactive access), or hold state of its own about the node.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;

use crate::api::Problem;
use crate::api::problem::{PROBLEM_CONTENT_TYPE, PROBLEM_TYPE_PREFIX};

/// The token's file name inside the home.
pub const TOKEN_FILE: &str = "dashboard.token";
/// Random bytes in a token (hex in the file and the URL).
pub const TOKEN_BYTES: usize = 32;
/// Most bytes of a request body passed on (the settings' `PUT /v1/provide`).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// Most bytes of an answer passed back.
pub const MAX_RESPONSE_BYTES: usize = crate::api::client::MAX_RESPONSE_BYTES;

/// The page's Content-Security-Policy: its own script and style only, API calls to itself
/// only, no frames, no forms posted elsewhere, no plugins.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

/// Why the dashboard cannot start.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    /// The home directory does not exist.
    #[error("no node home at {0}; create one with `gridlease init --home {0}`")]
    NoHome(String),
    /// Reading or writing the token file failed.
    #[error("access token {path}: {source}")]
    TokenIo {
        /// The token file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The token file is not a token, or others may read it.
    #[error("access token {path}: {why}; remove it and a new one is made")]
    TokenBad {
        /// The token file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The operating system gave no randomness.
    #[error("no randomness for the access token: {0}")]
    Random(String),
    /// The port could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The access token of `home`: read from `<home>/dashboard.token`, or made from 32 bytes of
/// OS randomness and written there (mode 0600, created exclusively) when the file is missing.
/// A file others may read, or that is not 64 hex digits, is refused.
pub fn load_or_create_token(home: &Path) -> Result<String, DashboardError> {
    use std::io::Write as _;
    use std::os::unix::fs::PermissionsExt as _;
    if !home.is_dir() {
        return Err(DashboardError::NoHome(home.display().to_string()));
    }
    let path = home.join(TOKEN_FILE);
    let io = |source| DashboardError::TokenIo {
        path: path.clone(),
        source,
    };
    let bad = |why: String| DashboardError::TokenBad {
        path: path.clone(),
        why,
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let mode = std::fs::metadata(&path).map_err(io)?.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(bad(format!(
                    "mode {mode:o} lets others read it (must be 600)"
                )));
            }
            let token = text.trim();
            if token.len() != 2 * TOKEN_BYTES || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad(format!("not {} hex digits", 2 * TOKEN_BYTES)));
            }
            Ok(token.to_ascii_lowercase())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut raw = [0u8; TOKEN_BYTES];
            getrandom::fill(&mut raw).map_err(|e| DashboardError::Random(e.to_string()))?;
            let token = hex::encode(raw);
            // Written whole to a 0600 temporary file, then linked in place unless one is there:
            // a dashboard started at the same moment reads a complete token, the same one.
            let mut f = tempfile::Builder::new()
                .prefix(".dashboard.token.")
                .permissions(std::fs::Permissions::from_mode(0o600))
                .tempfile_in(home)
                .map_err(io)?;
            writeln!(f, "{token}").map_err(io)?;
            f.as_file().sync_all().map_err(io)?;
            match f.persist_noclobber(&path) {
                Ok(_) => Ok(token),
                Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => {
                    load_or_create_token(home)
                }
                Err(e) => Err(io(e.error)),
            }
        }
        Err(e) => Err(io(e)),
    }
}

/// Whether `given` is the token, in time that does not depend on where they differ.
pub fn token_matches(expected: &str, given: &str) -> bool {
    use subtle::ConstantTimeEq as _;
    // The length is public (always 64 hex digits); the bytes are compared in constant time.
    expected.len() == given.len() && bool::from(expected.as_bytes().ct_eq(given.as_bytes()))
}

/// The bearer token of a request's `Authorization` header, if it has one.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Whether a `Host` header names the loopback address and port the dashboard listens on
/// (`127.0.0.1:PORT` or `localhost:PORT`); anything else (another name resolving to
/// 127.0.0.1: DNS rebinding) is refused.
pub fn host_allowed(host: Option<&str>, port: u16) -> bool {
    let Some(host) = host else {
        return false;
    };
    let Some((name, p)) = host.rsplit_once(':') else {
        return false;
    };
    p.parse::<u16>().ok() == Some(port)
        && (name == "127.0.0.1" || name.eq_ignore_ascii_case("localhost"))
}

/// What the server needs.
#[derive(Clone, Debug)]
pub struct DashState {
    /// The access token.
    token: String,
    /// The port it listens on (for the `Host` check).
    port: u16,
    /// The control API's socket.
    socket: PathBuf,
}

/// A problem answer of the dashboard itself (same shape as the control API's).
fn problem(
    status: StatusCode,
    slug: &str,
    title: &str,
    detail: &str,
    hint: Option<&str>,
) -> Response {
    let p = Problem {
        kind: format!("{PROBLEM_TYPE_PREFIX}{slug}"),
        title: title.into(),
        status: status.as_u16(),
        detail: detail.into(),
        hint: hint.map(Into::into),
    };
    let body = serde_json::to_vec(&p).unwrap_or_default();
    let mut r = (status, [(header::CONTENT_TYPE, PROBLEM_CONTENT_TYPE)], body).into_response();
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    r
}

/// The static page and its files: the only requests that need no token.
fn is_static(path: &str) -> bool {
    matches!(path, "/" | "/index.html" | "/app.js" | "/style.css")
}

/// Checks `Host` (every request) and the token (all but the static page), and adds the
/// security headers to every answer.
async fn guard(State(s): State<DashState>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok());
    let mut resp = if !host_allowed(host, s.port) {
        problem(
            StatusCode::MISDIRECTED_REQUEST,
            "dashboard-wrong-host",
            "the request names another host",
            &format!(
                "the dashboard answers only requests to 127.0.0.1:{} (Host was {:?})",
                s.port,
                host.unwrap_or("")
            ),
            Some("open the URL `gridlease dashboard` printed"),
        )
    } else if !is_static(req.uri().path())
        && !bearer(req.headers()).is_some_and(|t| token_matches(&s.token, t))
    {
        problem(
            StatusCode::UNAUTHORIZED,
            "dashboard-unauthorized",
            "wrong or missing token",
            "the request carries no access token, or a wrong one",
            Some("open the URL `gridlease dashboard` printed (it ends in #token=...)"),
        )
    } else {
        next.run(req).await
    };
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// Whether a request may be passed on: any `GET` under `/v1/`, and the settings' write
/// (`PUT /v1/provide`). Paths with `..` segments are never passed on.
pub fn may_forward(method: &Method, path: &str) -> bool {
    if !path.starts_with("/v1/") || path.split('/').any(|seg| seg == ".." || seg == ".") {
        return false;
    }
    *method == Method::GET || (*method == Method::PUT && path == "/v1/provide")
}

/// Passes `/v1/...` to the control API, unchanged: method, path and query, `Content-Type`
/// and body; the answer's status, `Content-Type`, `x-gridlease-*` headers and body come back.
async fn forward(State(s): State<DashState>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path_q = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string());
    if !may_forward(&parts.method, parts.uri.path()) {
        return problem(
            StatusCode::FORBIDDEN,
            "dashboard-not-passed-on",
            "the dashboard does not pass this request on",
            &format!(
                "{} {} is not one of the dashboard's calls",
                parts.method,
                parts.uri.path()
            ),
            Some("use the gridlease CLI for it"),
        );
    }
    let bytes = match Limited::new(body, MAX_REQUEST_BYTES).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return problem(
                StatusCode::PAYLOAD_TOO_LARGE,
                "dashboard-body-too-large",
                "the request body is too large",
                &format!("at most {MAX_REQUEST_BYTES} bytes are passed on"),
                None,
            );
        }
    };
    match upstream(
        &s.socket,
        parts.method,
        &path_q,
        parts.headers.get(header::CONTENT_TYPE),
        bytes,
    )
    .await
    {
        Ok(r) => r,
        Err(Upstream::NoNode) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "dashboard-no-node",
            "no node is running for this home",
            &format!("nothing answers on {}", s.socket.display()),
            Some("start the node: `gridlease node`"),
        ),
        Err(Upstream::Transport(e)) => problem(
            StatusCode::BAD_GATEWAY,
            "dashboard-upstream",
            "the node's control API gave no usable answer",
            &e,
            None,
        ),
    }
}

enum Upstream {
    NoNode,
    Transport(String),
}

/// One request to the control API's socket.
async fn upstream(
    socket: &Path,
    method: Method,
    path: &str,
    content_type: Option<&HeaderValue>,
    body: Bytes,
) -> Result<Response, Upstream> {
    let t = |e: &dyn std::fmt::Display| Upstream::Transport(e.to_string());
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|_| Upstream::NoNode)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| t(&e))?;
    let driver = tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, "gridlease");
    if let Some(ct) = content_type {
        req = req.header(header::CONTENT_TYPE, ct);
    }
    let req = req.body(Full::new(body)).map_err(|e| t(&e))?;
    let resp = sender.send_request(req).await.map_err(|e| t(&e))?;
    let (parts, body) = resp.into_parts();
    let bytes = Limited::new(body, MAX_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(|e| t(&e))?
        .to_bytes();
    driver.abort();
    let mut out = Response::new(Body::from(bytes));
    *out.status_mut() = parts.status;
    for (name, value) in &parts.headers {
        if name == header::CONTENT_TYPE || name.as_str().starts_with("x-gridlease-") {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    Ok(out)
}

async fn not_found() -> Response {
    problem(
        StatusCode::NOT_FOUND,
        "not-found",
        "no such route",
        "the dashboard serves its page and passes /v1/ on; nothing else",
        None,
    )
}

/// The dashboard's routes, checked by [`guard`].
pub fn router(token: String, port: u16, home: &Path) -> Router {
    let state = DashState {
        token,
        port,
        socket: crate::api::socket_path(home),
    };
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/index.html",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE_CSS) }),
        )
        .route("/v1/{*rest}", axum::routing::any(forward))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// A dashboard bound to 127.0.0.1, ready to serve.
#[derive(Debug)]
pub struct Bound {
    listener: tokio::net::TcpListener,
    /// Where it listens.
    pub addr: SocketAddr,
    /// The access token.
    pub token: String,
    home: PathBuf,
}

impl Bound {
    /// The URL to open: the page, with the token in the fragment (never sent to the server).
    pub fn url(&self) -> String {
        format!("http://{}/#token={}", self.addr, self.token)
    }

    /// Serves until `cancel`.
    pub async fn serve(self, cancel: CancellationToken) -> std::io::Result<()> {
        let app = router(self.token, self.addr.port(), &self.home);
        axum::serve(self.listener, app)
            .with_graceful_shutdown(async move { cancel.cancelled().await })
            .await
    }
}

/// Reads (or makes) the token of `home` and binds `127.0.0.1:port` (0: any free port).
pub async fn bind(home: &Path, port: u16) -> Result<Bound, DashboardError> {
    let token = load_or_create_token(home)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| DashboardError::Bind { addr, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| DashboardError::Bind { addr, source })?;
    Ok(Bound {
        listener,
        addr,
        token,
        home: home.to_path_buf(),
    })
}

#[cfg(test)]
mod tests;
