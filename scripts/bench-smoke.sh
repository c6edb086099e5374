#!/usr/bin/env bash
# Every benchmark once, at its smallest size (issue 42 item 11: a benchmark that cannot run is
# a defect; `bench_negotiation` had panicked on its second lease unnoticed).
#
#   scripts/bench-smoke.sh        (.ci/run calls it; needs Docker, root, busybox-static, runsc)
#
# Debug builds: the numbers printed here mean nothing (docs/benchmarks.md's come from release
# builds, with the commands it gives); what is checked is that each benchmark runs to its end
# and exits 0. Each run is bounded in time; the output of a failing one is shown.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --locked --quiet -p gridlease-node -p gridlease-sandbox --bins --examples
ex="$(realpath -m "${CARGO_TARGET_DIR:-target}")/debug/examples"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

run() { # SECONDS EXAMPLE ARGS...
  local limit="$1" name="$2"; shift 2
  local started=$SECONDS
  if ! timeout "$limit" "$ex/$name" "$@" >"$log" 2>&1; then
    echo "bench-smoke: $name $* failed (or ran past ${limit} s); its output:" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
  echo "    $name $* ($((SECONDS - started)) s)"
}

echo "==> node benchmarks (debug, smallest sizes)"
run 120 bench_telemetry 1000
run 180 bench_negotiation 3
run 180 bench_lease_start 1
run 180 bench_logs 1 1 1
run 180 bench_book_sync 100 1
run 180 bench_propagation 3 1
run 180 bench_restore 100 1
run 180 bench_api_search 100 10 1 10
run 120 bench_scale 3 10 5 10
BENCH_ACCESS_MIB=64 run 300 bench_access 1
# Without the GPU check: four leases' CPU-reference checks at once on a loaded 2-core machine
# can overrun their allowance, fail as provider faults and leave the job no provider.
BENCH_JOBS_VERIFY_WINDOW=0 run 300 bench_jobs 1 8
echo "==> sandbox benchmarks"
run 180 sandbox_latency 1
run 180 isolation_overhead 1
echo "==> criterion benchmarks, each once (test mode)"
cargo test --locked --quiet -p gridlease-protocol -p gridlease-contracts --benches
