#!/usr/bin/env bash
# The daemon a user builds has no test hooks (issue 43): `lease::Faults`, `net::NetFaults` and
# the code that acts on them compile only with the `faults` feature, which only the node's tests
# switch on (a dev-dependency on the crate itself). This builds the `gridlease` binary as
# `cargo build`/`cargo install` do (no dev-dependencies, so no feature) and fails if any of
# their symbols or field names is in it. A debug build is checked: without optimisation
# nothing is dropped as dead code, so a hook compiled in would show.
set -euo pipefail
cd "$(dirname "$0")/.."

target="${CARGO_TARGET_DIR:-target}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
# The shared target directory: the dependencies are built already; the node's library is built
# once more without the feature (cargo keeps both). The binary is copied out at once, since a
# test build links `target/debug/gridlease` again with the feature on.
cargo build -p gridlease-node --bin gridlease --locked --message-format short >/dev/null
cp "$target/debug/gridlease" "$out/gridlease"
bin="$out/gridlease"

# Names that exist only in the fault hooks: the types, and each field (Debug derives and
# field accesses leave them as strings and symbols).
pattern='lease::faults|NetFaults|inflate_usage_from_seq|bad_receipt_after|stop_after_create|hold_sessions|lose_first_extend_answer|subscribe_after_first_disconnect|hold_restore|answer_gets_empty'
found=0
if nm -C "$bin" 2>/dev/null | grep -E "$pattern" >"$out/nm"; then found=1; fi
if strings -n 6 "$bin" | grep -oE ".{0,40}($pattern).{0,40}" >"$out/strings"; then found=1; fi
if [ "$found" -ne 0 ]; then
  echo "check-no-faults: the gridlease binary built without the 'faults' feature contains test hooks:" >&2
  head -20 "$out/nm" "$out/strings" >&2 || true
  exit 1
fi
echo "check-no-faults: no test hook in the gridlease binary built without the feature ($(du -h "$bin" | cut -f1))"
