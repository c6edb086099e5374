//! `gridlease-sim`: the market simulator's command line.
fn main() {}
