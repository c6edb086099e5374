//! The `gridlease` binary: parse, set up tracing, dispatch. Logic lives in the library.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use gridlease_node::commands::{Cli, Command, init, node};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let home = cli.home_dir();
    let result = match cli.command {
        Command::Init(args) => init::run(&home, &args).map(Some),
        Command::Node(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(node::run(&home, args)))
            .map(|()| None),
    };
    match result {
        Ok(out) => {
            if let Some(text) = out {
                let _ = writeln!(std::io::stdout(), "{text}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
