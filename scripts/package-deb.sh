#!/usr/bin/env bash
# Builds the Debian package `gridlease` (and its `gridlease-dbgsym` with the debug symbols)
# with cargo-deb (`cargo install cargo-deb --locked`) from binaries built as a user's
# `cargo build` makes them (no dev-dependencies: no test hooks).
#
#   scripts/package-deb.sh                 # release: target/debian/gridlease_<v>_amd64.deb
#   scripts/package-deb.sh --profile dev   # what CI checks (a debug build, same contents)
#
# The package: /usr/bin/gridlease and gridlease-gpu-bench (stripped), the system unit, the
# commented /etc/gridlease/config.toml (a conffile), completions, man pages, and the
# maintainer scripts of packaging/deb/. docs/install.md says what it does on a machine.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
out=target/debian
fast=()
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --fast) fast=(--fast); shift ;;
    *) echo "usage: $0 [--profile release|dev] [--out DIR] [--fast]" >&2; exit 2 ;;
  esac
done
target="${CARGO_TARGET_DIR:-target}"
case "$profile" in
  dev) dir=debug ;;
  *) dir="$profile" ;;
esac

cargo build --locked --profile "$profile" -p gridlease-node --bin gridlease
cargo build --locked --profile "$profile" -p gridlease-sandbox --bin gridlease-gpu-bench
bin="$target/$dir/gridlease"
if [ "$target" != target ]; then
  # cargo-deb reads the binaries under ./target.
  mkdir -p "target/$dir"
  cp "$bin" "$target/$dir/gridlease-gpu-bench" "target/$dir/"
fi

# Completions and man pages, generated from the CLI definition of the binary packaged.
assets=target/deb-assets
rm -rf "$assets"
mkdir -p "$assets/completions" "$assets/man"
"$bin" completions bash > "$assets/completions/gridlease"
"$bin" completions zsh > "$assets/completions/_gridlease"
"$bin" completions fish > "$assets/completions/gridlease.fish"
"$bin" man --out "$assets/man" >/dev/null
gzip -9n "$assets"/man/*.1

mkdir -p "$out"
cargo deb -p gridlease-node --no-build --profile "$profile" --dbgsym --output "$out" "${fast[@]}"
ls -l "$out"
