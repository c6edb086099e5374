//! Prints the JSON Schema of a job spec, for editors:
//! `cargo run -p gridlease-node --example job_schema > docs/job-spec.schema.json` (a test fails
//! until the committed copy equals it).

use std::io::Write;

fn main() -> std::io::Result<()> {
    let schema = gridlease_node::jobs::spec::json_schema();
    let mut text = serde_json::to_string_pretty(&schema).map_err(std::io::Error::other)?;
    text.push('\n');
    std::io::stdout().write_all(text.as_bytes())
}
