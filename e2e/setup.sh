#!/usr/bin/env bash
# Installs what building eddy needs on a fresh Debian machine (Rust, Java 17, Maven and Go are
# expected to be there) and prints the shared cache locations. Idempotent and quiet when done.
set -euo pipefail

need=()
for pkg in libclang-dev cmake libcurl4-openssl-dev libssl-dev libsasl2-dev pkg-config; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if ((${#need[@]})); then
  echo "setup: installing ${need[*]}" >&2
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
for tool in cargo java mvn; do
  command -v "$tool" >/dev/null || { echo "setup: $tool not found: install it first" >&2; exit 1; }
done
