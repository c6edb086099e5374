#!/usr/bin/env bash
# The worked example of docs/jobs.md: four local providers with declared GPUs (prices 0.40 to
# 0.70) and a renter on loopback, as `gridlease devnet` starts them, and the 12-task sweep of
# docs/examples/sweep/ run over them.
#
#   scripts/jobs-demo.sh [--keep]        (needs Docker, root and Debian's busybox-static)
#
# Outputs land in ./sweep-out. Every node, container and the demo image are removed at the
# end (the nodes' homes too, unless --keep).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

cargo build --quiet -p gridlease-node --bin gridlease
gl="$(realpath -m "${CARGO_TARGET_DIR:-target}")/debug/gridlease"
image=gridlease-demo-busybox:1
work="$(mktemp -d /tmp/gridlease-jobs-demo.XXXXXX)"
pids=()
peers=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for peer in "${peers[@]}"; do
    ids="$(docker ps -aq --filter "label=gridlease.node=$peer")"
    [ -z "$ids" ] || docker rm -f $ids >/dev/null 2>&1 || true
  done
  docker rmi "$image" >/dev/null 2>&1 || true
  # The providers' workspaces (kept outputs stay mounted when a node is killed): unmounted,
  # their loop devices let go.
  findmnt -rn -o TARGET,SOURCE | awk -v w="$work/" 'index($1, w) == 1 {print $1, $2}' |
    while read -r mnt dev; do
      umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
      losetup -d "$dev" 2>/dev/null || true
    done
  if [ "${1:-}" != --keep ]; then rm -rf "$work"; else echo "homes kept in $work"; fi
}
trap 'cleanup "${KEEP:-}"' EXIT
[ "${1:-}" = --keep ] && KEEP=--keep

# A from-scratch image: busybox and the applets the sweep's script uses.
root="$work/rootfs"
mkdir -p "$root/bin" "$root/tmp" "$root/workspace"
cp /bin/busybox "$root/bin/busybox"
for a in sh echo sleep cat mkdir mv sha256sum; do ln -sf busybox "$root/bin/$a"; done
chmod 1777 "$root/tmp"
tar -C "$root" -c . | docker import --change 'ENV PATH=/bin' - "$image" >/dev/null

node() { # HOME ARGS...
  local home="$1"; shift
  "$gl" --home "$home" init >/dev/null
  "$gl" --home "$home" node --no-mdns --listen /ip4/127.0.0.1/tcp/0 --announce-secs 1 "$@" \
    >/dev/null 2>"$home.log" &
  pids+=($!)
  for _ in $(seq 100); do "$gl" --home "$home" status >/dev/null 2>&1 && return; sleep 0.2; done
  echo "the node of $home did not start; its log: $home.log" >&2
  exit 1
}

bootstrap=""
i=0
for price in 0.40 0.50 0.60 0.70; do
  home="$work/provider-$i"
  mkdir -p "$home"
  echo "usage_interval_secs = 2" >"$home/config.toml"
  if [ -z "$bootstrap" ]; then
    node "$home" --dev-gpus "RTX 4090:24GiB:$price" --local-image "$image"
    bootstrap="$("$gl" --home "$home" --json status | python3 -c 'import json,sys; print(json.load(sys.stdin)["listen_addrs"][0])')"
  else
    node "$home" --dev-gpus "RTX 4090:24GiB:$price" --local-image "$image" --bootstrap "$bootstrap"
  fi
  peers+=("$("$gl" --home "$home" --json status | python3 -c 'import json,sys; print(json.load(sys.stdin)["peer_id"])')")
  i=$((i + 1))
done
renter="$work/renter"
node "$renter" --bootstrap "$bootstrap"
for _ in $(seq 150); do
  n="$("$gl" --home "$renter" --json search gpu~4090 | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')"
  [ "$n" = 4 ] && break
  sleep 0.2
done
"$gl" --home "$renter" search gpu~4090
echo
echo "\$ gridlease job run docs/examples/sweep/sweep.yaml --out ./sweep-out"
"$gl" --home "$renter" job run "$repo/docs/examples/sweep/sweep.yaml" --out "$repo/sweep-out"
