//! Prints the control API's OpenAPI document, the text `GET /v1/openapi.json` serves:
//! `cargo run -p gridlease-node --example openapi > docs/openapi.json` (the `openapi_document`
//! test fails until the committed copy equals it).

use std::io::Write;

fn main() -> std::io::Result<()> {
    std::io::stdout().write_all(gridlease_node::api::document().as_bytes())
}
