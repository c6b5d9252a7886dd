#!/usr/bin/env bash
# Side-by-side benchmark of the state store against the broker alone (echo), etcd and NATS KV,
# on this machine, with the same load. Builds the release binaries, then runs `compare`.
# etcd is driven through its gRPC API (etcd-client), one HTTP/2 connection per 16 in-flight
# slots, as MQTT connections are shared; --targets etcd-json drives it through the JSON gateway.
#
#   bash benches/compare.sh [MODE] [OPTIONS]
#
#   sweep      (default) closed loop at in-flight levels 1,16,64,256, SET then GET (keys written
#              first): ops/s, p50/p99/p99.9, CPU; the cluster's p50 at 1 in flight vs its floor
#   rate       open loop at a fixed rate (--rate OPS), latency from the scheduled send time
#   fill       write --to N distinct keys (cluster), then RSS and a follower's restart time
#   sustained  --minutes T at 16 in flight: ops/s every second, p99 every minute
#   partition  cut a follower, then the leader, off from their peers under load (cluster)
#   snapshot   fill --to N keys, then latency under an open loop (--rate) while every node builds
#              a snapshot and a restarted follower installs one (cluster)
#   scorecard  all of the above in one run (about 30 minutes), then every target of the project
#              beside its figure: met, missed or not measured (scorecard.csv)
#   floods     hostile clients (dedup records, large values with a follower stopped, KEYNOTIFY
#              registrations, slow HTTP connections), each for --flood-secs on a fresh cluster:
#              RSS, disk and gauges before, at the peak and after, a well-behaved client's p99
#              quiet and during the flood, and whether each bound held (cluster)
#
# The cluster runs with a cluster secret; --targets cluster,cluster-open compares it with the same
# nodes without one (--insecure-no-auth): `sweep --levels 16,64 --rounds 3 --targets
# cluster,cluster-open` gives cluster/cluster-open ops per round and their median.
# Common options: --targets echo,cluster,cluster-open,etcd,nats,etcd-json  --out DIR  --nodes-binary PATH
# --keys N  --value-size BYTES  --message-expiry SECS  --timeout SECS  --time-limit SECS.
# `bash benches/compare.sh MODE --help` lists every option. Results (summary.txt, CSV, SVG,
# process logs) go to benches/results/<UTC time>-<mode>/ unless --out says otherwise.
# COMPARE_SKIP_BUILD=1 runs the binaries already built.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/statestore-target}"

mode=sweep
case "${1:-}" in
  sweep | rate | fill | sustained | partition | snapshot | scorecard | floods) mode="$1"; shift ;;
  -h | --help | help) sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "" | -*) ;;
  *) echo "compare.sh: unknown mode $1 (sweep, rate, fill, sustained, partition, snapshot, scorecard, floods)" >&2; exit 2 ;;
esac

if [[ "${COMPARE_SKIP_BUILD:-0}" != 1 ]]; then
  echo "building the release binaries (the first build compiles RocksDB: ~15 minutes)" >&2
  cargo build --release -p statestore-node -p statestore-benches
fi
exec "$CARGO_TARGET_DIR/release/compare" "$mode" "$@"
