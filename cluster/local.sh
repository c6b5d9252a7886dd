#!/usr/bin/env bash
# Runs a 3-node cluster on loopback: nodes 1..3 on http://127.0.0.1:7401..7403, data and logs in
# cluster/data/. Ctrl-C stops the nodes (SIGTERM, a graceful stop); run it again to restart them
# with their data. `--clean` starts from empty data directories.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/statestore-target}"
profile="${PROFILE:-release}"
data="cluster/data"

if [[ "${1:-}" == "--clean" ]]; then
  rm -rf "$data"
fi
mkdir -p "$data"

bash cluster/packages.sh

cargo build --locked --profile "$profile" --bin statestore
dir="$profile"
[[ "$profile" == "dev" ]] && dir="debug"
binary="$CARGO_TARGET_DIR/$dir/statestore"

members="1=http://127.0.0.1:7401,2=http://127.0.0.1:7402,3=http://127.0.0.1:7403"
pids=()
stop() {
  echo "stopping nodes: ${pids[*]}"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
}
trap stop EXIT
trap 'exit 130' INT TERM

for id in 1 2 3; do
  "$binary" --id "$id" --listen "127.0.0.1:740$id" --data-dir "$data/node-$id" \
    --initial-members "$members" >>"$data/node-$id.log" 2>&1 &
  pids+=("$!")
done

for _ in $(seq 1 100); do
  curl -sf http://127.0.0.1:7401/ready >/dev/null 2>&1 && break
  sleep 0.1
done
curl -s http://127.0.0.1:7401/cluster && echo
echo "cluster running: http://127.0.0.1:7401 .. 7403; logs in $data/; Ctrl-C stops it"
wait
