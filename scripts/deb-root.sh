#!/usr/bin/env bash
# A fresh Debian bookworm root (minbase, with systemd for `systemd-analyze verify`) as a tar
# for `docker import`, made with debootstrap from deb.debian.org and kept at
# target/deb-root/bookworm.tar (made once per machine; about two minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
tar_out=target/deb-root/bookworm.tar
if [ -s "$tar_out" ]; then
  echo "deb-root: $tar_out exists"
  exit 0
fi
mkdir -p target/deb-root
dir="$(mktemp -d target/deb-root/root.XXXXXX)"
trap 'rm -rf "$dir"' EXIT
debootstrap --variant=minbase --include=systemd bookworm "$dir" http://deb.debian.org/debian
tar -C "$dir" -cf "$tar_out.tmp" .
mv "$tar_out.tmp" "$tar_out"
echo "deb-root: wrote $tar_out ($(du -h "$tar_out" | cut -f1))"
