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

    /// A table with `headers` and `rows` (not in `--json` or `--quiet` mode). A cell is never
    /// wrapped (no value is split across lines); when the table is wider than the terminal
    /// (`COLUMNS`, else the terminal's width), columns are left out in `drop_order` (indexes
    /// into `headers`, least important first) until it fits. `wide` keeps every column.
    pub fn table(
        &self,
        headers: &[&str],
        rows: Vec<Vec<String>>,
        drop_order: &[usize],
        wide: bool,
    ) {
        if self.quiet || self.json {
            return;
        }
        let limit = if wide { None } else { terminal_width() };
        let mut shown: Vec<usize> = (0..headers.len()).collect();
        let mut dropping = drop_order.iter();
        loop {
            let text = render(headers, &rows, &shown);
            let width = text.lines().map(|l| l.chars().count()).max().unwrap_or(0);
            match (limit, dropping.next()) {
                (Some(max), Some(col)) if width > max && shown.len() > 1 => {
                    shown.retain(|c| c != col);
                }
                _ => {
                    self.raw_line(&text);
                    return;
                }
            }
        }
    }

    /// Writes bytes to stdout as they are (log streaming), ignoring a closed pipe.
    pub fn bytes(&self, data: &[u8]) {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(data);
        let _ = out.flush();
    }

    /// `value` as one line of compact JSON (a stream of objects, `top --json`); not in
    /// `--quiet` mode.
    pub fn json_line<T: Serialize>(&self, value: &T) {
        if self.quiet {
            return;
        }
        match serde_json::to_string(value) {
            Ok(s) => self.raw_line(&s),
            Err(e) => self.raw_line(&format!("{{\"error\": \"cannot render JSON: {e}\"}}")),
        }
    }

    fn raw_line(&self, text: &str) {
        let mut out = std::io::stdout().lock();
        // A closed pipe is not an error for a CLI.
        let _ = writeln!(out, "{text}");
    }
}

/// The terminal's width in columns: `COLUMNS` when set (as shells and test harnesses set it),
/// else the width of the terminal on stdout; `None` when neither is known (a pipe).
pub fn terminal_width() -> Option<usize> {
    if let Some(c) = std::env::var(crate::env_vars::COLUMNS)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|c| *c > 0)
    {
        return Some(c);
    }
    Table::new().width().map(usize::from)
}

fn render(headers: &[&str], rows: &[Vec<String>], shown: &[usize]) -> String {
    let pick = |cells: Vec<String>| -> Vec<String> {
        shown
            .iter()
            .map(|i| cells.get(*i).cloned().unwrap_or_default())
            .collect()
    };
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(pick(headers.iter().map(|h| h.to_string()).collect()));
    for r in rows {
        t.add_row(pick(r.clone()));
    }
    t.to_string()
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
