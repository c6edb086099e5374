//! Prints the Debian package's `/etc/gridlease/config.toml` (every default, commented):
//! `cargo run -p gridlease-node --example default_config > packaging/deb/config.toml`.
#![allow(clippy::print_stdout)]

fn main() {
    print!("{}", gridlease_node::config::Config::commented_defaults());
}
