#!/usr/bin/env bash
# The Debian packages the build, the tests and the local cluster need: libclang for RocksDB's
# bindgen, a C++ compiler and make for RocksDB itself, libssl-dev and pkg-config for the SDK
# crates the conformance tests use, protobuf-compiler (protoc) for the etcd gRPC client of the
# benchmarks, mosquitto as the broker, procps for `kill`, curl for the
# scripts; with `--tests` also prometheus (the scrape test, and the air-gapped Prometheus image)
# faketime (the clock-offset test runs a node with its wall clock shifted), python3-paho-mqtt
# (the test that runs docs/examples/quickstart.py) and fuse3 (the power-cut suite mounts its
# file system, crates/powercut-fs, through /dev/fuse; fuser needs no libfuse to build).
# `--check` only reports what is missing (exit 1); without it, missing ones are installed with
# apt-get (as root, or through sudo).
#
#   cluster/packages.sh [--tests] [--check]
set -euo pipefail

PACKAGES=(libclang-dev g++ make pkg-config libssl-dev protobuf-compiler mosquitto procps curl)
check=false
for arg in "$@"; do
  case "$arg" in
    --tests) PACKAGES+=(prometheus faketime python3 python3-paho-mqtt fuse3) ;;
    --check) check=true ;;
    *) echo "usage: $0 [--tests] [--check]" >&2; exit 64 ;;
  esac
done

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
((${#missing[@]})) || exit 0

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo "
if $check; then
  echo "missing Debian packages: ${missing[*]}" >&2
  echo "install them with:  ${SUDO}apt-get update && ${SUDO}apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing: ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
