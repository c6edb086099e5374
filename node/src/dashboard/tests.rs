//! The token file, the token and `Host` checks and the pass-through, against a real listener
//! and a stand-in control API on a Unix socket that records what reaches it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt as _;
use std::sync::{Arc, Mutex};

use super::*;

#[test]
fn token_file_is_created_0600_and_reused() {
    let dir = tempfile::tempdir().unwrap();
    let token = load_or_create_token(dir.path()).unwrap();
    assert_eq!(token.len(), 64);
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
    let path = dir.path().join(TOKEN_FILE);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{mode:o}");
    assert_eq!(load_or_create_token(dir.path()).unwrap(), token, "reused");
    // Another home gets another token (OS randomness, not a constant).
    let other = tempfile::tempdir().unwrap();
    assert_ne!(load_or_create_token(other.path()).unwrap(), token);
}

#[test]
fn dashboards_starting_together_share_one_token() {
    let dir = tempfile::tempdir().unwrap();
    let tokens: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|_| s.spawn(|| load_or_create_token(dir.path()).unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(tokens.iter().all(|t| *t == tokens[0]), "{tokens:?}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, [TOKEN_FILE], "no temporary files left");
}

#[test]
fn token_file_others_may_read_or_not_a_token_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(TOKEN_FILE);
    load_or_create_token(dir.path()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = load_or_create_token(dir.path()).unwrap_err().to_string();
    assert!(e.contains("lets others read it"), "{e}");
    std::fs::write(&path, "short\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let e = load_or_create_token(dir.path()).unwrap_err().to_string();
    assert!(e.contains("not 64 hex digits"), "{e}");
    let e = load_or_create_token(&dir.path().join("missing"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("gridlease init"), "{e}");
}

#[test]
fn token_comparison() {
    let t = "ab".repeat(32);
    assert!(token_matches(&t, &t));
    assert!(!token_matches(&t, &"ab".repeat(31)), "a prefix");
    assert!(!token_matches(&t, &format!("{t}00")), "longer");
    assert!(!token_matches(&t, ""), "empty");
    let mut last = t.clone().into_bytes();
    last[63] = b'c';
    assert!(
        !token_matches(&t, std::str::from_utf8(&last).unwrap()),
        "last digit"
    );
}

#[test]
fn host_check() {
    assert!(host_allowed(Some("127.0.0.1:8080"), 8080));
    assert!(host_allowed(Some("localhost:8080"), 8080));
    assert!(!host_allowed(Some("127.0.0.1:8081"), 8080), "another port");
    assert!(!host_allowed(Some("127.0.0.1"), 8080), "no port");
    assert!(
        !host_allowed(Some("evil.example:8080"), 8080),
        "rebound name"
    );
    assert!(!host_allowed(Some("127.0.0.1.evil.example:8080"), 8080));
    assert!(!host_allowed(None, 8080), "no Host");
}

#[test]
fn what_is_passed_on() {
    assert!(may_forward(&Method::GET, "/v1/status"));
    assert!(may_forward(&Method::GET, "/v1/leases/ab12/telemetry"));
    assert!(may_forward(&Method::PUT, "/v1/provide"));
    assert!(
        !may_forward(&Method::POST, "/v1/leases"),
        "renting is the CLI's"
    );
    assert!(
        !may_forward(&Method::POST, "/v1/leases/ab12/exec"),
        "no access upgrades"
    );
    assert!(!may_forward(&Method::PUT, "/v1/status"));
    assert!(!may_forward(&Method::GET, "/v2/status"));
    assert!(!may_forward(&Method::GET, "/v1"));
    assert!(!may_forward(&Method::GET, "/metrics"));
    assert!(!may_forward(&Method::GET, "/v1/../metrics"));
}

/// A stand-in control API on `<home>/api.sock`: answers every request with JSON naming its
/// method and path, and records them.
async fn fake_api(home: &Path) -> Arc<Mutex<Vec<String>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let listener = tokio::net::UnixListener::bind(crate::api::socket_path(home)).unwrap();
    let log = seen.clone();
    let app = Router::new().fallback(move |req: Request| {
        let log = log.clone();
        async move {
            let line = format!(
                "{} {}",
                req.method(),
                req.uri().path_and_query().map(|p| p.as_str()).unwrap_or("")
            );
            let ct = req
                .headers()
                .get(header::CONTENT_TYPE)
                .map(|v| v.to_str().unwrap().to_string());
            let body = req.into_body().collect().await.unwrap().to_bytes();
            log.lock().unwrap().push(line.clone());
            (
                [("x-gridlease-eof", "true")],
                axum::Json(serde_json::json!({
                    "seen": line,
                    "content_type": ct,
                    "body": String::from_utf8_lossy(&body),
                })),
            )
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    seen
}

/// Sends one request to the dashboard at `addr`: `(status, headers, body)`.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    host: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (StatusCode, HeaderMap, String) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, host);
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    if body.is_some() {
        req = req.header(header::CONTENT_TYPE, "application/json");
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or("").to_string())))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

#[tokio::test]
async fn token_host_and_pass_through() {
    let dir = tempfile::tempdir().unwrap();
    let seen = fake_api(dir.path()).await;
    let bound = bind(dir.path(), 0).await.unwrap();
    let (addr, token) = (bound.addr, bound.token.clone());
    assert!(addr.ip().is_loopback(), "{addr}");
    assert!(bound.url().ends_with(&format!("/#token={token}")));
    let cancel = CancellationToken::new();
    tokio::spawn(bound.serve(cancel.clone()));
    let host = format!("127.0.0.1:{}", addr.port());

    // The static page needs no token, and says what it may load.
    let (st, h, page) = send(addr, "GET", "/", &host, None, None).await;
    assert_eq!(st, StatusCode::OK);
    assert!(page.contains("<script src=\"app.js\""), "{page}");
    assert_eq!(h[header::CONTENT_SECURITY_POLICY], CSP);
    assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    let (st, _, js) = send(addr, "GET", "/app.js", &host, None, None).await;
    assert_eq!(st, StatusCode::OK);
    assert!(js.contains("Authorization"), "the page sends the token");

    // Missing or wrong token: 401 problems, nothing reaches the node.
    let wrong = "0".repeat(64);
    for t in [None, Some(wrong.as_str()), Some("")] {
        let (st, h, body) = send(addr, "GET", "/v1/status", &host, t, None).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED, "{t:?}: {body}");
        assert_eq!(h[header::CONTENT_TYPE], PROBLEM_CONTENT_TYPE);
        assert_eq!(h[header::WWW_AUTHENTICATE], "Bearer");
        let p: Problem = serde_json::from_str(&body).unwrap();
        assert_eq!(p.kind, "urn:gridlease:problem:dashboard-unauthorized");
        assert_eq!(p.title, "wrong or missing token");
        assert_eq!(p.status, 401);
    }

    // Another Host (DNS rebinding), even with the token and for the page: refused.
    for h in [
        "evil.example:1234",
        &format!("evil.example:{}", addr.port()),
    ] {
        for path in ["/", "/v1/status"] {
            let (st, _, body) = send(addr, "GET", path, h, Some(&token), None).await;
            assert_eq!(st, StatusCode::MISDIRECTED_REQUEST, "{h} {path}: {body}");
            assert!(body.contains("dashboard-wrong-host"), "{body}");
        }
    }
    assert!(
        seen.lock().unwrap().is_empty(),
        "{:?}",
        seen.lock().unwrap()
    );

    // With the token: /v1/ passes through unchanged, query, body and headers too.
    let (st, h, body) = send(addr, "GET", "/v1/leases?x=1", &host, Some(&token), None).await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(h["x-gridlease-eof"], "true");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["seen"], "GET /v1/leases?x=1");
    let put = r#"{"price":"0.50"}"#;
    let (st, _, body) = send(addr, "PUT", "/v1/provide", &host, Some(&token), Some(put)).await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["seen"], "PUT /v1/provide");
    assert_eq!(v["body"], put);
    assert_eq!(v["content_type"], "application/json");

    // Outside /v1/, or a write the settings do not make: not passed on.
    for (m, path, want) in [
        ("GET", "/metrics", StatusCode::NOT_FOUND),
        ("GET", "/v2/status", StatusCode::NOT_FOUND),
        ("GET", "/api.sock", StatusCode::NOT_FOUND),
        ("POST", "/v1/leases", StatusCode::FORBIDDEN),
        ("POST", "/v1/leases/ab/stop", StatusCode::FORBIDDEN),
        ("GET", "/v1/../metrics", StatusCode::FORBIDDEN),
    ] {
        let (st, _, body) = send(addr, m, path, &host, Some(&token), Some("{}")).await;
        assert_eq!(st, want, "{m} {path}: {body}");
    }
    assert_eq!(
        *seen.lock().unwrap(),
        ["GET /v1/leases?x=1", "PUT /v1/provide"],
        "only the two passed-on requests reached the node"
    );
    cancel.cancel();
}

#[tokio::test]
async fn no_node_is_a_problem_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    let bound = bind(dir.path(), 0).await.unwrap();
    let (addr, token) = (bound.addr, bound.token.clone());
    let cancel = CancellationToken::new();
    tokio::spawn(bound.serve(cancel.clone()));
    let host = format!("localhost:{}", addr.port());
    let (st, _, body) = send(addr, "GET", "/v1/status", &host, Some(&token), None).await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("dashboard-no-node"), "{body}");
    cancel.cancel();
}
