#!/usr/bin/env bash
# Installs the package into a fresh Debian bookworm root (scripts/deb-root.sh, imported into
# Docker as a local image: no registry) and checks, inside it, what a provider gets:
# `gridlease --version` runs; `systemd-analyze verify` accepts the unit; the config is in
# place as a conffile and parses; the `gridlease` system user exists, in the docker group,
# with an identity in its home; completions and man pages are installed. Then `dpkg -r`
# removes it and leaves the conffile, as Debian policy says.
#
#   scripts/deb-check.sh target/debian/gridlease_0.1.0-1_amd64.deb
set -euo pipefail
cd "$(dirname "$0")/.."
deb="$(realpath "$1")"
scripts/deb-root.sh >/dev/null
image="gl-deb-check-$$:bookworm"
name="gl-deb-check-$$"
trap 'docker rm -f "$name" >/dev/null 2>&1 || true; docker rmi -f "$image" >/dev/null 2>&1 || true' EXIT
docker import - "$image" < target/deb-root/bookworm.tar >/dev/null

# No network inside: nothing is fetched, only the package is installed.
docker run --rm --name "$name" --network none -v "$deb:/tmp/gridlease.deb:ro" "$image" \
  /bin/sh -c '
set -e
fail() { echo "deb-check: FAIL: $*" >&2; exit 1; }
ok() { echo "deb-check: ok: $*"; }
dpkg -i /tmp/gridlease.deb || fail "dpkg -i"
ok "dpkg -i installed $(dpkg-query -W -f="\${Package} \${Version}" gridlease)"
v="$(gridlease --version)" || fail "gridlease --version"
ok "gridlease --version: $v"
test -x /usr/bin/gridlease-gpu-bench || fail "no /usr/bin/gridlease-gpu-bench"
systemd-analyze verify /lib/systemd/system/gridlease.service 2>/tmp/verify || { cat /tmp/verify >&2; fail "systemd-analyze verify"; }
ok "systemd-analyze verify accepts the unit"
test -f /etc/gridlease/config.toml || fail "no /etc/gridlease/config.toml"
dpkg-query -W -f="\${Conffiles}\n" gridlease | grep -q "/etc/gridlease/config.toml" || fail "config.toml is not a conffile"
ok "/etc/gridlease/config.toml is in place, a conffile"
gridlease --home /var/lib/gridlease node --config /etc/gridlease/config.toml --dump-config >/dev/null || fail "the shipped config does not parse"
ok "the node reads it"
getent passwd gridlease >/dev/null || fail "no gridlease user"
[ "$(getent passwd gridlease | cut -d: -f6)" = /var/lib/gridlease ] || fail "the user s home is not /var/lib/gridlease"
id -nG gridlease | tr " " "\n" | grep -qx docker || fail "gridlease is not in the docker group"
ok "system user: $(id gridlease)"
test -f /var/lib/gridlease/identity.key || fail "no node identity in /var/lib/gridlease"
[ "$(stat -c %U:%a /var/lib/gridlease)" = gridlease:700 ] || fail "/var/lib/gridlease is $(stat -c %U:%a /var/lib/gridlease)"
ok "the node identity is in /var/lib/gridlease (gridlease, 700)"
test -s /usr/share/bash-completion/completions/gridlease || fail "no bash completion"
test -s /usr/share/man/man1/gridlease.1.gz || fail "no man page"
test -s /usr/share/man/man1/gridlease-doctor.1.gz || fail "no doctor man page"
ok "completions and man pages"
dpkg -r gridlease >/dev/null || fail "dpkg -r"
test ! -e /usr/bin/gridlease || fail "/usr/bin/gridlease left after dpkg -r"
test -f /etc/gridlease/config.toml || fail "dpkg -r removed the conffile"
dpkg-query -W -f="\${db:Status-Abbrev}" gridlease | grep -q "^rc" || fail "not in the config-files state: $(dpkg-query -W -f="\${db:Status-Abbrev}" gridlease)"
ok "dpkg -r removed the package and kept /etc/gridlease/config.toml (state rc)"
'
echo "deb-check: $(basename "$deb") passed"
