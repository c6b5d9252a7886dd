#!/usr/bin/env bash
# Installs the Debian packages the build and the tests need, if any is missing: libclang for
# RocksDB's bindgen, a C++ compiler and make for RocksDB itself, procps for `kill` in the process
# tests, curl for the local cluster script.
set -euo pipefail

PACKAGES=(libclang-dev g++ make procps curl)

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi
