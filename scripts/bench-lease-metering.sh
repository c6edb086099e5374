#!/usr/bin/env bash
# CPU cost of metering one running lease, measured on the provider process.
#
#   cargo build --release -p gridlease-node --example lease_node
#   scripts/bench-lease-metering.sh            # INTERVAL=10 SECS=30 by default
#
# Starts a provider (`lease_node --provide`) and a connected renter that rents nothing, and
# reads the provider's CPU time (utime+stime from /proc) over SECS seconds: the idle baseline.
# Then replaces the renter by one that rents a lease running `sleep` (image local) and reads the
# provider's CPU over SECS seconds again while the lease runs: Docker stats stream, meter, a
# signed usage report every INTERVAL seconds, receipt verification and booking. The metering
# cost is the difference, as a fraction of one core.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/examples/lease_node}
INTERVAL=${INTERVAL:-10}
SECS=${SECS:-30}
IMAGE=${IMAGE:-gridlease-probe:0.1.0}
tmp=$(mktemp -d)
pids=()
lease=""
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ -n "$lease" ]; then docker rm -f "gridlease-$lease" >/dev/null 2>&1 || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
tick=$(getconf CLK_TCK)
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
wait_line() { # file prefix
  for _ in $(seq 1 600); do
    if grep -q "^$2" "$1"; then grep -m1 "^$2" "$1" | cut -d' ' -f2; return; fi
    sleep 0.1
  done
  echo "timed out waiting for $2 in $1" >&2; exit 1
}
RUST_LOG=warn "$BIN" --home "$tmp/p" --listen /ip4/127.0.0.1/tcp/0 --provide \
  --interval "$INTERVAL" --window $((INTERVAL * 6)) >"$tmp/p.out" 2>"$tmp/p.err" &
P=$!; pids+=("$P")
addr=$(wait_line "$tmp/p.out" LISTEN)
RUST_LOG=warn "$BIN" --home "$tmp/r1" --listen /ip4/127.0.0.1/tcp/0 --bootstrap "$addr" \
  >"$tmp/r1.out" 2>"$tmp/r1.err" &
R1=$!; pids+=("$R1")
sleep 3
c0=$(cpu "$P"); sleep "$SECS"; c1=$(cpu "$P")
kill "$R1"
RUST_LOG=warn "$BIN" --home "$tmp/r2" --listen /ip4/127.0.0.1/tcp/0 --bootstrap "$addr" \
  --rent-image "$IMAGE" --rent-duration $((SECS + 60)) -- sleep $((SECS + 50)) \
  >"$tmp/r2.out" 2>"$tmp/r2.err" &
R2=$!; pids+=("$R2")
lease=$(wait_line "$tmp/r2.out" LEASE)
sleep 3
c2=$(cpu "$P"); r2=$(cpu "$R2"); sleep "$SECS"; c3=$(cpu "$P"); r3=$(cpu "$R2")
awk -v t="$tick" -v s="$SECS" -v a="$c0" -v b="$c1" -v c="$c2" -v d="$c3" -v e="$r2" -v f="$r3" \
  -v l="$lease" -v i="$INTERVAL" 'BEGIN {
  idle = (b - a) / t / s * 100; busy = (d - c) / t / s * 100; renter = (f - e) / t / s * 100
  printf "lease %s, report interval %d s, measured over %d s each\n", substr(l, 1, 12), i, s
  printf "provider CPU idle:          %.2f%% of a core\n", idle
  printf "provider CPU, lease running: %.2f%% of a core\n", busy
  printf "metering one lease:          %.2f%% of a core\n", busy - idle
  printf "renter CPU, lease running:   %.2f%% of a core\n", renter
}'
