#!/usr/bin/env bash
# The control API against an independent fuzzer: schemathesis (from PyPI, pinned) reads the
# document a real daemon serves (GET /v1/openapi.json) and runs every check it has, the
# stateful phase included, against that daemon. Zero failures or this exits non-zero.
#
#   scripts/api-fuzz.sh            (.ci/run calls it; needs docker, socat, python3 -m venv)
#
# Two nodes on loopback: a provider with a declared GPU and a renter bootstrapped from it, the
# provider's offer in the renter's book and one running lease of a tiny local image, so the links
# (searchOffers -> rentOffer -> getLease/getLeaseLogs/extendLease/stopLease, listLeases ->
# ...) reach real leases. Each node's API (a Unix socket) is bridged to 127.0.0.1 with socat
# for its run only; nothing listens on another interface.
#
# Bounded: at most GRIDLEASE_FUZZ_EXAMPLES (default 100) cases per operation and phase, each
# of the two runs (renter, provider) killed after GRIDLEASE_FUZZ_TIMEOUT seconds (default 120). The seed is fixed
# (GRIDLEASE_FUZZ_SEED, default 20) so a CI failure reproduces; set another to explore.
# The access routes (tag `access`: exec, forward, upload, download, sftp) switch protocols with an
# HTTP upgrade once granted, which a request/response client cannot follow (it would reuse the
# switched connection): they are fuzzed, all checks, on the provider only, where no request
# can be granted (a provider does not open access to its own tenants: `not-renter`), and left
# out on the renter; what happens after 101 is tested by node/tests/cli_access.rs, cli_cp.rs, cli_ssh.rs
# and hostile_transfers.rs.
set -euo pipefail
cd "$(dirname "$0")/.."

SCHEMATHESIS_VERSION=4.32.5
examples="${GRIDLEASE_FUZZ_EXAMPLES:-100}"
limit_s="${GRIDLEASE_FUZZ_TIMEOUT:-120}"
seed="${GRIDLEASE_FUZZ_SEED:-20}"
repo="$(pwd)"
target="$(realpath -m "${CARGO_TARGET_DIR:-target}")"
venv="$target/api-fuzz/venv"
# Per run, so parallel or leftover runs never share (or remove) each other's image.
image="gridlease-fuzz-$$-$(date +%s)/busybox:1"

for tool in socat docker python3; do
  command -v "$tool" >/dev/null 2>&1 || { echo "api-fuzz: $tool is needed" >&2; exit 1; }
done

if ! "$venv/bin/st" --version 2>/dev/null | grep -qx ".*, version $SCHEMATHESIS_VERSION"; then
  echo "==> schemathesis $SCHEMATHESIS_VERSION into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
fi

cargo build --quiet --locked -p gridlease-node --bin gridlease
bin="$target/debug/gridlease"

work="$(mktemp -d)"
pids=()
provider_peer=""
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ -n "$provider_peer" ]; then
    # The lease's container, then its workspace: the volume and the loop device under it.
    docker ps -aq --filter "label=gridlease.node=$provider_peer" | xargs -r docker rm -f -v >/dev/null
    docker volume ls -q --filter "label=gridlease.node=$provider_peer" | xargs -r docker volume rm -f >/dev/null
  fi
  find "$work" -name '*.img' -print0 2>/dev/null | while IFS= read -r -d '' img; do
    losetup -j "$img" | cut -d: -f1 | xargs -r -n1 losetup -d 2>/dev/null || true
  done
  docker rmi -f "$image" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# Every GRIDLEASE_* setting of the caller's environment is left out of the nodes'.
for v in $(compgen -e | grep '^GRIDLEASE_' || true); do unset "$v"; done
gl() { RUST_LOG=warn "$bin" "$@"; }
json_field() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }
wait_until() { # SECONDS WHAT COMMAND...
  local until=$((SECONDS + $1)) what="$2"; shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$until" ] || { echo "api-fuzz: timed out waiting for $what" >&2; exit 1; }
    sleep 0.2
  done
}
node() { # HOME LOG ARGS...
  local home="$1" log="$2"; shift 2
  gl --home "$home" init >/dev/null
  # The binary itself in the background (not a function: its pid is the node's).
  RUST_LOG=warn GRIDLEASE_LOCAL_IMAGES="$image" "$bin" --home "$home" node --no-mdns \
    --listen /ip4/127.0.0.1/tcp/0 --announce-secs 1 "$@" 2>"$log" &
  pids+=($!)
  wait_until 30 "the node at $home" gl --home "$home" status
}

# A from-scratch image of the static busybox: a container that runs without any registry.
tar -C / -cf - bin/busybox | docker import - "$image" >/dev/null

echo "==> provider and renter on loopback"
# Its only registry is a closed loopback port: a fuzzed image reference is refused, or tried
# on 127.0.0.1:9, never pulled from the internet.
node "$work/provider" "$work/provider.log" --dev-gpus "RTX 4090:24GiB:3.60" \
  --image-registry 127.0.0.1:9
provider_peer="$(gl --home "$work/provider" --json status | json_field "['peer_id']")"
addr="$(gl --home "$work/provider" --json status | json_field "['listen_addrs'][0]")"
node "$work/renter" "$work/renter.log" --bootstrap "$addr"
has_offer() { [ "$(gl --home "$work/renter" --json search | json_field '.__len__()')" = 1 ]; }
wait_until 30 "the offer to reach the renter" has_offer
offer="$(gl --home "$work/renter" --json search | json_field "[0]['id']")"
gl --home "$work/renter" --json rent "$offer" --minutes 30 --image "$image" --detach \
  -- /bin/busybox sleep 1800 >/dev/null

# One run per node: the renter (its leases are rented) and the provider (its lease is
# provided; `PUT /v1/provide` finds GPUs there).
status=0
for side in renter provider; do
  # The access routes on the provider only (see above).
  access=(--exclude-tag access)
  [ "$side" = provider ] && access=()
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  socat "TCP-LISTEN:$port,bind=127.0.0.1,reuseaddr,fork" "UNIX-CONNECT:$work/$side/api.sock" &
  pids+=($!)
  wait_until 10 "the loopback bridge" python3 -c "import socket; socket.create_connection(('127.0.0.1', $port)).close()"

  echo "==> schemathesis $SCHEMATHESIS_VERSION on the $side: all checks, all phases (stateful included), seed $seed"
  # From the scratch directory: schemathesis keeps its crash cache in the working directory.
  (cd "$work" && timeout "$limit_s" "$venv/bin/st" --config-file "$repo/scripts/api-fuzz.toml" \
    run "http://127.0.0.1:$port/v1/openapi.json" \
    --url "http://127.0.0.1:$port" \
    --checks all \
    --phases examples,coverage,fuzzing,stateful \
    "${access[@]}" \
    --max-examples "$examples" \
    --seed "$seed" \
    --workers 1 \
    --request-timeout 30 \
    --report junit --report-dir "$target/api-fuzz/report-$side") || status=$?
  [ "$status" -eq 0 ] || break
done
if [ "$status" -ne 0 ]; then
  echo "api-fuzz: schemathesis failed (exit $status); node logs follow" >&2
  tail -n 40 "$work/provider.log" "$work/renter.log" >&2 || true
fi
exit "$status"
