#!/usr/bin/env bash
# The whole test suite, as CI runs it on a fresh clone: `./.ci/run`.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# Docker-backed tests fail (not skip) when the daemon is unreachable, gVisor tests when the
# daemon has no runsc runtime (registered below).
export GRIDLEASE_REQUIRE_DOCKER=1
export GRIDLEASE_REQUIRE_RUNSC=1
# The dashboard's browser test fails (not skips) without chromium and chromedriver.
export GRIDLEASE_REQUIRE_BROWSER=1

step() { printf '\n==> %s\n' "$*"; }

# Debian packages the tests need, installed only when missing:
#   tmux             the Ctrl-C tests of `gridlease rent` press keys in a real terminal
#                    (node/tests/cli_rent_ctrl_c.rs).
#   docker-registry  a real image registry: tests start their own on a free 127.0.0.1 port
#                    with a temporary store (node/tests/registry_support); the package's own
#                    service (which would listen on :5000 on every interface) is disabled.
#   busybox-static   the shell, exec and forward tests run a from-scratch image of its static
#                    busybox (sh, stty, httpd; node/tests/cli_access.rs).
#   curl             those tests fetch through a forwarded port with it.
#   runsc            gVisor: the escape suite runs under runc and under runsc
#                    (sandbox/tests/escape.rs, isolation.rs, node/tests/lease_gvisor.rs).
#   python3-venv     venvs for PyPI packages: py-libp2p, the independent peer of the interop
#                    test (node/tests/interop_py.rs), and schemathesis, the API fuzzer
#                    (scripts/api-fuzz.sh; pinned there, installed under target/).
#   systemd          `systemd-analyze verify` checks the unit `gridlease service install`
#                    writes (node/tests/cli_service.rs); nothing is started.
#   socat            bridges a test daemon's control API (a Unix socket) to 127.0.0.1 for
#                    the API fuzzer (scripts/api-fuzz.sh), for that run only.
#   iproute2         the network lab (node/tests/lab_support, lab_leases.rs): `ip netns`,
#                    veth links and bridges for hosts and home routers.
#   iptables         the lab's home routers NAT (MASQUERADE, --random-fully) and firewall
#                    inside their own namespaces, and drop traffic for partitions.
#   nftables         the lab's packet loss on internet links (`nft`, netdev ingress).
#   ethtool          the lab's latency switch (lab_support/delay_switch.py: this kernel has
#                    no sch_netem) needs checksum offload off on the veths (lab_leases.rs,
#                    the lossy lease; node/tests/lab_bench.rs, run by hand).
#   chromium         the headless browser that loads `gridlease dashboard` (node/tests/dashboard.rs).
#   chromium-driver  chromedriver: that test drives the browser over WebDriver with it.
#   openssh-client   ssh, scp and sftp: the OpenSSH tools reach a lease through
#                    `gridlease ssh-proxy` (node/tests/cli_ssh.rs).
#   rsync            `rsync -e ssh` both ways in that test; the test image carries the host's
#                    rsync (and bash) with the libraries they load.
#   debootstrap      a fresh Debian bookworm root the Debian package is installed into
#                    (scripts/deb-root.sh, scripts/deb-check.sh).
need=()
command -v tmux >/dev/null 2>&1 || need+=(tmux)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v docker-registry >/dev/null 2>&1 || need+=(docker-registry)
[ -x /usr/bin/runsc ] || need+=(runsc)
command -v socat >/dev/null 2>&1 || need+=(socat)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v ethtool >/dev/null 2>&1 || need+=(ethtool)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
command -v rsync >/dev/null 2>&1 || need+=(rsync)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
if [ "${#need[@]}" -gt 0 ]; then
  step "apt-get install ${need[*]}"
  $sudo apt-get update
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}"
  if command -v systemctl >/dev/null 2>&1; then
    $sudo systemctl disable --now docker-registry >/dev/null 2>&1 || true
  fi
fi

# gVisor's runtime, registered with the Docker daemon as "runsc" with the arguments
# docs/security-model.md ("Isolation") explains. The daemon reloads its runtimes on SIGHUP:
# nothing restarts, running containers are untouched.
step "register runsc with dockerd"
$sudo python3 - <<'PY'
import json, os
path = "/etc/docker/daemon.json"
want = {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=host", "--oci-seccomp"]}
conf = {}
if os.path.exists(path):
    with open(path) as f:
        text = f.read().strip()
    conf = json.loads(text) if text else {}
if conf.get("runtimes", {}).get("runsc") != want:
    conf.setdefault("runtimes", {})["runsc"] = want
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".gridlease-tmp"
    with open(tmp, "w") as f:
        json.dump(conf, f, indent=2)
    os.replace(tmp, path)
    print("runsc registered in", path)
PY
pid="$(pidof dockerd || true)"
if [ -n "$pid" ]; then
  $sudo kill -HUP $pid
  for _ in $(seq 1 50); do
    docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"' && break
    sleep 0.2
  done
fi
docker info --format '{{json .Runtimes}}' | grep -q '"runsc"' \
  || { echo "dockerd did not load the runsc runtime" >&2; exit 1; }

# py-libp2p, pinned, in a venv under target/ (kept between runs): the interop test's peer.
PY_LIBP2P_VERSION=0.8.1
venv="$PWD/target/py-interop"
if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('libp2p') != '$PY_LIBP2P_VERSION')" >/dev/null 2>&1; then
  step "py-libp2p $PY_LIBP2P_VERSION (PyPI) in $venv"
  mkdir -p target
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "libp2p==$PY_LIBP2P_VERSION"
fi
export GRIDLEASE_PY_LIBP2P="$venv/bin/python"
export GRIDLEASE_REQUIRE_PY_INTEROP=1

# pandas + matplotlib, pinned (simulations/analysis/requirements.txt), in a venv under target/
# (kept between runs): the simulator's Python analysis example, run by a test on a small output.
py_analysis_req="$PWD/simulations/analysis/requirements.txt"
py_analysis="$PWD/target/py-analysis"
if ! "$py_analysis/bin/python" - "$py_analysis_req" >/dev/null 2>&1 <<'PY'
import importlib.metadata as m, sys
pins = [l.split("==") for l in open(sys.argv[1]) if "==" in l and not l.startswith("#")]
sys.exit(any(m.version(n.strip()) != v.strip() for n, v in pins))
PY
then
  step "pandas + matplotlib (PyPI, simulations/analysis/requirements.txt) in $py_analysis"
  mkdir -p target
  python3 -m venv "$py_analysis"
  "$py_analysis/bin/pip" install --quiet --disable-pip-version-check -r "$py_analysis_req"
fi
export GRIDLEASE_PY_ANALYSIS="$py_analysis/bin/python"
