#!/usr/bin/env bash
# Starts docker-compose.yml as its own project on other host ports, as a user's `docker compose
# up` would, and checks it: every node becomes healthy (its /ready through the CLI in the
# container), a key written through the published broker port reads back, every node reports
# the same leader, the CLI works inside the containers, a guarded route refuses a request from
# the host without the cluster secret (401), a membership change sent to any node with the secret
# reaches the leader, and Prometheus scrapes all three nodes. Then it removes the project and its
# volumes (KEEP=1 keeps them). First, where no registry is reachable, it checks that the failed
# build of a missing image tells the user about cluster/images.sh.
#
#   bash cluster/compose-check.sh
#
# The images must exist: `docker compose build`, or `bash cluster/images.sh` without registry
# access. Settings: COMPOSE_PROJECT_NAME (statestore-check), STATESTORE_MQTT_PORT (22883),
# STATESTORE_HTTP_PORT_1..3 (28401..28403), STATESTORE_PROMETHEUS_PORT (29090), STATESTORE_CLI.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/statestore-target}"
export COMPOSE_PROJECT_NAME="${COMPOSE_PROJECT_NAME:-statestore-check}"
export STATESTORE_MQTT_PORT="${STATESTORE_MQTT_PORT:-22883}"
export STATESTORE_HTTP_PORT_1="${STATESTORE_HTTP_PORT_1:-28401}"
export STATESTORE_HTTP_PORT_2="${STATESTORE_HTTP_PORT_2:-28402}"
export STATESTORE_HTTP_PORT_3="${STATESTORE_HTTP_PORT_3:-28403}"
export STATESTORE_PROMETHEUS_PORT="${STATESTORE_PROMETHEUS_PORT:-29090}"
cli="${STATESTORE_CLI:-$CARGO_TARGET_DIR/release/statestore-cli}"
endpoints="http://127.0.0.1:$STATESTORE_HTTP_PORT_1,http://127.0.0.1:$STATESTORE_HTTP_PORT_2,http://127.0.0.1:$STATESTORE_HTTP_PORT_3"

die() { echo "compose-check.sh: $*" >&2; echo "compose: result=fail"; exit 1; }

# shellcheck source=cluster/compose.sh
source cluster/compose.sh

[[ -x "$cli" ]] || die "$cli is missing; build it with: cargo build --release --workspace --bins --locked"

# The cluster secret copied out of a container, as README.md shows.
secret_dir="$(mktemp -d)"
cleanup() {
  local status=$?
  rm -rf "$secret_dir"
  if ((status != 0)); then
    compose ps || true
    compose logs --tail 30 2>&1 || true
  fi
  [[ "${KEEP:-0}" == 1 ]] || compose down -v --remove-orphans >/dev/null 2>&1 || true
  exit "$status"
}
trap cleanup EXIT

# Without a registry, the build that `up` starts for a missing image fails; its output names
# cluster/images.sh (the hint in each Dockerfile). With a registry, the build succeeds.
hint_tag="hint-check-$$"
if built="$(STATESTORE_IMAGE_TAG="$hint_tag" compose build mosquitto 2>&1)"; then
  docker rmi "${STATESTORE_IMAGE_REPOSITORY:-statestore}/mosquitto:$hint_tag" >/dev/null 2>&1 || true
  echo "== a registry is reachable: images build from source"
else
  grep -q "bash cluster/images.sh" <<<"$built" || die "an offline build does not name cluster/images.sh: $built"
  echo "== without a registry, building an image names cluster/images.sh"
fi

started=$(date +%s%3N)
compose up -d
echo "== up returned after $(( $(date +%s%3N) - started )) ms"

healthy() {
  local service cid state
  for service in node1 node2 node3; do
    cid="$(compose ps -q "$service")"
    [[ -n "$cid" ]] || return 1
    state="$(docker inspect -f '{{.State.Health.Status}}' "$cid" 2>/dev/null)" || return 1
    [[ "$state" == healthy ]] || return 1
  done
}
for _ in $(seq 1 240); do
  healthy && break
  sleep 0.5
done
healthy || die "the nodes did not all become healthy within 120 s"
echo "== every node healthy after $(( $(date +%s%3N) - started )) ms"

value="compose check $(date +%s%N)"
"$cli" -p "$STATESTORE_MQTT_PORT" set compose/check "$value" >/dev/null || die "SET through the broker failed"
[[ "$("$cli" -p "$STATESTORE_MQTT_PORT" get compose/check)" == "$value" ]] || die "GET did not return the value written"
status="$("$cli" --endpoint "$endpoints" --json cluster status)" || die "cluster status failed"
leaders="$(grep -o '"leader":{"address":"[^"]*","id":[0-9]*}' <<<"$status" | sort -u | wc -l)"
((leaders == 1)) || die "the nodes do not agree on one leader: $status"
"$cli" --endpoint "$endpoints" cluster status

# The CLI inside a container reaches the broker and the nodes by default (README:
# `docker compose exec node1 statestore-cli ...`).
for service in node1 node3; do
  [[ "$(compose exec -T "$service" statestore-cli get compose/check)" == "$value" ]] \
    || die "statestore-cli in $service did not read the key back"
done
compose exec -T node2 statestore-cli cluster members >/dev/null || die "statestore-cli cluster members in node2 failed"
echo "== statestore-cli works inside the containers"

# The nodes created their cluster secret: a guarded route refuses the host without it.
for route in /v1/command /cluster/learners; do
  code="$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$STATESTORE_HTTP_PORT_1$route")"
  [[ "$code" == 401 ]] || die "POST $route without the cluster secret answered $code, not 401"
done
echo "== guarded routes refuse the host without the cluster secret (401)"
docker cp "$(compose ps -q node1)":/secret/cluster-secret "$secret_dir/cluster-secret" >/dev/null \
  || die "could not copy the cluster secret out of node1 (README.md shows this step)"
export STATESTORE_CLUSTER_SECRET_FILE="$secret_dir/cluster-secret"

# A membership change sent from the host to any node reaches the leader, though the host cannot
# resolve the leader's advertised name: every node answers as the leader does.
for port in "$STATESTORE_HTTP_PORT_1" "$STATESTORE_HTTP_PORT_2" "$STATESTORE_HTTP_PORT_3"; do
  answer="$("$cli" --endpoint "http://127.0.0.1:$port" cluster promote 9 2>&1)" && die "promoting node 9 succeeded"
  grep -q "not a learner" <<<"$answer" || die "a membership change through port $port did not reach the leader: $answer"
done
echo "== every node carries membership changes to the leader"

targets=0
for _ in $(seq 1 60); do
  targets="$(curl -fsS "http://127.0.0.1:$STATESTORE_PROMETHEUS_PORT/api/v1/targets" 2>/dev/null \
    | grep -o '"health":"up"' | wc -l)" || targets=0
  ((targets >= 3)) && break
  sleep 1
done
((targets >= 3)) || die "Prometheus scrapes $targets of 3 nodes"
echo "== Prometheus scrapes 3 nodes"
echo "compose: result=pass"
