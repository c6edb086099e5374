//! The control API as a contract: the committed `docs/openapi.json` and the document a real
//! daemon serves are byte for byte the one generated from the handlers; every operation has an
//! id and documents its answers, errors as problems; and a real daemon answers the requests
//! the issue found undocumented or unchecked with the documented problem.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cli_support;

use std::io::{Read, Write};
use std::path::Path;

use cli_support::{init, start_node};
use serde_json::{Value, json};

fn committed() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
    std::fs::read_to_string(&path).unwrap_or_default()
}

#[test]
fn the_committed_document_is_the_generated_one() {
    assert!(
        committed() == gridlease_node::api::document(),
        "docs/openapi.json differs from the document the handlers generate; regenerate it with\n  \
         cargo run -p gridlease-node --example openapi > docs/openapi.json"
    );
}

/// One HTTP/1.1 exchange on the daemon's socket: status, content type, body.
fn http(home: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, String, Vec<u8>) {
    let mut s = std::os::unix::net::UnixStream::connect(home.join("api.sock")).unwrap();
    let body = body.unwrap_or("");
    // One write of the whole request: `write!` would send it in pieces, and a daemon that
    // answers once it has the head (and closes) could break the pipe before the body.
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: gridlease\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    let mut body = raw[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    (status, content_type, body)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = b.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(std::str::from_utf8(&b[..line_end]).unwrap(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[line_end + 2..line_end + 2 + size]);
        b = &b[line_end + 2 + size + 2..];
    }
}

/// A problem answer: status, `application/problem+json`, the RFC 9457 members, this slug.
fn assert_problem(answer: (u16, String, Vec<u8>), status: u16, slug: &str) -> Value {
    let (got, content_type, body) = answer;
    let text = String::from_utf8_lossy(&body).to_string();
    assert_eq!(got, status, "{text}");
    assert_eq!(content_type, "application/problem+json", "{text}");
    let p: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(p["type"], format!("urn:gridlease:problem:{slug}"), "{p}");
    assert_eq!(p["status"], status, "{p}");
    assert!(p["title"].is_string() && p["detail"].is_string(), "{p}");
    p
}

#[test]
fn a_daemon_serves_the_generated_document_and_answers_errors_as_documented_problems() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("h");
    init(&home);
    let _node = start_node(&home, &["--dev-gpus", "2x RTX 4090:24GiB:0.40"]);

    let (status, content_type, body) = http(&home, "GET", "/v1/openapi.json", None);
    assert_eq!(status, 200);
    assert_eq!(content_type, "application/json");
    assert!(
        body == gridlease_node::api::document().as_bytes(),
        "the served document differs from the generated one"
    );
    assert!(body == committed().as_bytes(), "and from docs/openapi.json");

    // The issue's findings, each now the documented answer.
    let p = assert_problem(
        http(&home, "GET", "/v1/offers?limit=10001", None),
        400,
        "invalid-parameter",
    );
    assert!(p["detail"].as_str().unwrap().contains("10000"), "{p}");
    assert_problem(
        http(&home, "GET", "/v1/offers?limit=-4221", None),
        400,
        "invalid-parameter",
    );
    let p = assert_problem(
        http(&home, "GET", "/v1/offers?q=vram%3E%3E24", None),
        400,
        "invalid-query",
    );
    assert!(p["hint"].as_str().unwrap().contains("fp16_tflops"), "{p}");
    let rent = json!({"offer": "abcd", "gpus": 0, "duration_s": 0, "image": ""}).to_string();
    assert_problem(
        http(&home, "POST", "/v1/leases", Some(&rent)),
        422,
        "invalid-body",
    );
    assert_problem(
        http(&home, "POST", "/v1/leases", Some("{not json")),
        400,
        "malformed-body",
    );
    let rent = json!({"offer": "abcd", "gpus": 1, "duration_s": 60, "image": "busybox"});
    assert_problem(
        http(&home, "POST", "/v1/leases", Some(&rent.to_string())),
        404,
        "unknown-offer",
    );
    let lease = "ab".repeat(32);
    assert_problem(
        http(&home, "GET", &format!("/v1/leases/{lease}/logs"), None),
        404,
        "unknown-lease",
    );
    assert_problem(
        http(&home, "GET", "/v1/leases/xyz/logs", None),
        400,
        "invalid-parameter",
    );
    assert_problem(
        http(
            &home,
            "GET",
            &format!("/v1/leases/{lease}/logs?from=-1"),
            None,
        ),
        400,
        "invalid-parameter",
    );
    assert_problem(
        http(&home, "POST", &format!("/v1/leases/{lease}/stop"), None),
        404,
        "unknown-lease",
    );
    assert_problem(
        http(
            &home,
            "POST",
            &format!("/v1/leases/{lease}/exec"),
            Some("{}"),
        ),
        400,
        "upgrade-required",
    );
    assert_problem(http(&home, "GET", "/v1/nope", None), 404, "not-found");
    assert_problem(
        http(&home, "DELETE", "/v1/status", None),
        405,
        "method-not-allowed",
    );
    // `PUT /v1/provide` with `{}`: a price is needed the first time (a state, not a schema
    // rule: 409), later ones keep what was set.
    assert_problem(
        http(&home, "PUT", "/v1/provide", Some("{}")),
        409,
        "price-needed",
    );
    let (status, _, body) = http(&home, "PUT", "/v1/provide", Some(r#"{"price": "0.30"}"#));
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let (status, _, body) = http(&home, "PUT", "/v1/provide", Some("{}"));
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let s: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(s["own_offer"]["price_per_gpu_hour"], "0.30", "{s}");
    for (bad, slug) in [
        (json!({"price": "0"}), "invalid-body"),
        (json!({"max_hours": 0}), "invalid-body"),
        (json!({"registries": ["not a host"]}), "invalid-body"),
        (json!({"price": 5}), "invalid-body"),
        (json!({"gpus": ["no-such-gpu"]}), "no-gpus"),
    ] {
        let status = if slug == "no-gpus" { 409 } else { 422 };
        assert_problem(
            http(&home, "PUT", "/v1/provide", Some(&bad.to_string())),
            status,
            slug,
        );
    }
}

/// `docs/api.md` lists every problem kind with its status, and every operation by its id.
#[test]
fn the_api_doc_lists_every_problem_kind_and_operation() {
    use gridlease_node::api::ProblemType;
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/api.md"))
            .unwrap();
    for k in ProblemType::ALL {
        let row = format!("| `{}` | {} |", k.slug(), k.status().as_u16());
        assert!(text.contains(&row), "docs/api.md lacks the row {row}");
    }
    let doc: Value = serde_json::from_str(gridlease_node::api::document()).unwrap();
    for item in doc["paths"].as_object().unwrap().values() {
        for op in item.as_object().unwrap().values() {
            let id = op["operationId"].as_str().unwrap();
            assert!(text.contains(&format!("`{id}`")), "docs/api.md lacks {id}");
        }
    }
}

/// Every operation has an id; every answer it documents has a description, and every error
/// answer is a `Problem` in `application/problem+json`; the links from renting a lease reach
/// reading it, its logs and stopping it.
#[test]
fn every_operation_documents_its_answers_and_links_a_new_lease_onward() {
    let doc: Value = serde_json::from_str(gridlease_node::api::document()).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let mut ids = std::collections::BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path}"));
            assert!(ids.insert(id.to_string()), "operationId {id} twice");
            let responses = op["responses"].as_object().unwrap();
            assert!(
                responses.keys().any(|s| s.starts_with('2') || s == "101"),
                "{id}"
            );
            for (status, r) in responses {
                assert!(r["description"].is_string(), "{id} {status}");
                if status.starts_with('4') || status.starts_with('5') {
                    assert_eq!(
                        r["content"]["application/problem+json"]["schema"]["$ref"],
                        "#/components/schemas/Problem",
                        "{id} {status}"
                    );
                }
            }
        }
    }
    let links = &doc["paths"]["/v1/leases"]["post"]["responses"]["200"]["links"];
    for target in ["getLease", "getLeaseLogs", "stopLease"] {
        assert_eq!(links[target]["operationId"], target, "{links}");
        assert_eq!(
            links[target]["parameters"]["id"],
            "$response.body#/lease_id"
        );
    }
    // The constraints the handlers enforce are stated.
    let rent = &doc["components"]["schemas"]["RentRequest"];
    for f in ["offer", "gpus", "duration_s", "image"] {
        assert!(
            rent["required"].as_array().unwrap().contains(&json!(f)),
            "{f}"
        );
    }
    assert_eq!(rent["properties"]["gpus"]["minimum"], 1);
    assert_eq!(rent["properties"]["duration_s"]["minimum"], 1);
    assert_eq!(rent["properties"]["image"]["minLength"], 1);
    let limit = doc["paths"]["/v1/offers"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "limit")
        .unwrap();
    assert_eq!(
        limit["schema"]["maximum"],
        gridlease_node::api::MAX_SEARCH_LIMIT
    );
}
