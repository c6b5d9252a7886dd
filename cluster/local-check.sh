#!/usr/bin/env bash
# Checks cluster/local.sh as README.md and cluster/README.md use it: `up` starts three ready
# nodes and a broker, the CLI writes and reads a key through them, `kill` and `start` bring a
# node down and back, `down` stops everything; and `up` fails, naming the node and stopping what
# it started, when a node cannot start. Uses its own data directory and MQTT port; the nodes
# take 127.0.0.1:7401-7403, which must be free.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/statestore-target}"
scratch="$(mktemp -d)"
export STATESTORE_DATA="$scratch/data"
export MQTT_PORT=$((20000 + RANDOM % 20000))
cli="$CARGO_TARGET_DIR/release/statestore-cli"
trap 'bash cluster/local.sh down >/dev/null 2>&1 || true; rm -rf "$scratch"' EXIT
fail() { echo "local-check: $*" >&2; exit 1; }

cargo build --locked --release --workspace --bins
bash cluster/local.sh up
"$cli" -p "$MQTT_PORT" set local-check works >/dev/null
[[ "$("$cli" -p "$MQTT_PORT" get local-check)" == works ]] || fail "the key did not read back"
bash cluster/local.sh kill 1
"$cli" -p "$MQTT_PORT" --timeout 20 set local-check again >/dev/null || fail "no write after node 1 was killed"
bash cluster/local.sh start 1
bash cluster/local.sh status
bash cluster/local.sh down

# A node that cannot start: its data directory is a file.
rm -rf "$STATESTORE_DATA" && mkdir -p "$STATESTORE_DATA" && : >"$STATESTORE_DATA/node-3"
if bash cluster/local.sh up >"$scratch/up.out" 2>&1; then
  cat "$scratch/up.out"
  fail "'up' reported success although node 3 could not start"
fi
grep -q "node 3" "$scratch/up.out" || { cat "$scratch/up.out"; fail "'up' did not name node 3"; }
for id in 1 2; do
  ! curl -sf "http://127.0.0.1:740$id/health" >/dev/null 2>&1 || fail "node $id still runs after a failed 'up'"
done
echo "local-check: passed"
