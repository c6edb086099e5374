//! What the simulator's binary tests share: the binary, and one run of it that prints the
//! command line, its exit code and its output (shown when a test fails).

#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::process::{Command, Output};

/// The `gridlease-sim` binary of this build.
pub(crate) fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gridlease-sim"))
}

/// Runs `gridlease-sim ARGS`, printing the command, its exit code, stdout and stderr.
pub(crate) fn run(args: &[&str]) -> Output {
    let out = bin().args(args).output().unwrap();
    println!(
        "$ gridlease-sim {}\n-> {:?}\n{}{}",
        args.join(" "),
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
