#!/usr/bin/env bash
# Checks gradsync's Debian build and test dependencies; installs the missing ones when run as root,
# otherwise prints the exact apt-get line and fails. Usage: bash cmake/deps.sh [extra packages...]
set -euo pipefail
pkgs=(cmake make g++ libtrilinos-kokkos-dev libopenmpi-dev openmpi-bin doctest-dev "$@")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
  echo "gradsync: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "gradsync: missing packages; run:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
