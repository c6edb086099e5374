//! All CLI output goes through [`Printer`]: tables for people, `--json` for scripts,
//! `--quiet` for neither. Broken pipes (`gridlease search | head`) end output silently.

use std::io::Write;

use comfy_table::presets::UTF8_BORDERS_ONLY;
use comfy_table::{ContentArrangement, Table};
use serde::Serialize;

/// How to print.
#[derive(Clone, Copy, Debug, Default)]
pub struct Printer {
    /// Machine-readable JSON instead of tables and prose.
    pub json: bool,
    /// Print nothing but errors.
    pub quiet: bool,
}

impl Printer {
    /// Prints `value` as pretty JSON (in `--json` mode) or calls `human` (otherwise).
    pub fn emit<T: Serialize>(&self, value: &T, human: impl FnOnce(&Self)) {
        if self.quiet {
            return;
        }
        if self.json {
            match serde_json::to_string_pretty(value) {
                Ok(s) => self.raw_line(&s),
                Err(e) => self.raw_line(&format!("{{\"error\": \"cannot render JSON: {e}\"}}")),
            }
        } else {
            human(self);
        }
    }

    /// A line of prose (not in `--json` or `--quiet` mode).
    pub fn line(&self, text: &str) {
        if !self.quiet && !self.json {
            self.raw_line(text);
        }
    }

    /// A note for the person at the terminal, on stderr so that stdout stays parseable (also in
    /// `--json` mode; not in `--quiet` mode).
    pub fn note(&self, text: &str) {
        if !self.quiet {
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "note: {text}");
        }
    }

    /// A message about what the command is doing, e.g. that Ctrl-C is stopping a lease: on
    /// stderr so that stdout stays parseable (also in `--json` mode; not in `--quiet` mode).
    pub fn status(&self, text: &str) {
        if !self.quiet {
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "{text}");
        }
    }

    /// A table with `headers` and `rows` (not in `--json` or `--quiet` mode).
    pub fn table(&self, headers: &[&str], rows: Vec<Vec<String>>) {
        if self.quiet || self.json {
            return;
        }
        let mut t = Table::new();
        t.load_preset(UTF8_BORDERS_ONLY)
            .set_content_arrangement(ContentArrangement::Dynamic)
            .set_header(headers.iter().copied());
        for r in rows {
            t.add_row(r);
        }
        self.raw_line(&t.to_string());
    }

    /// Writes bytes to stdout as they are (log streaming), ignoring a closed pipe.
    pub fn bytes(&self, data: &[u8]) {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(data);
        let _ = out.flush();
    }

    fn raw_line(&self, text: &str) {
        let mut out = std::io::stdout().lock();
        // A closed pipe is not an error for a CLI.
        let _ = writeln!(out, "{text}");
    }
}

/// Micro-units as a decimal amount (`60000` -> `0.06`).
pub fn money(micros: u64) -> String {
    gridlease_contracts::Money::from_micros(micros).to_string()
}

/// A short form of a long hex id or peer id for tables.
pub fn short(id: &str) -> String {
    if id.len() > 12 {
        format!("{}…", &id[..12])
    } else {
        id.to_string()
    }
}
