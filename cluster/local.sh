#!/usr/bin/env bash
# A 3-node state store cluster on this machine, without Docker.
#
#   cluster/local.sh up [--clean] [--broker HOST:PORT]   start Mosquitto (unless --broker) and nodes 1-3
#   cluster/local.sh down                                 stop everything (SIGTERM: graceful)
#   cluster/local.sh kill N                               SIGKILL node N (a crash)
#   cluster/local.sh start N                              start node N again with its data
#   cluster/local.sh status                               processes, leader, membership
#
# Nodes serve HTTP on 127.0.0.1:7401..7403; the broker listens on 127.0.0.1:1883 (MQTT_PORT to
# change it). Data, logs and pid files live under cluster/data (STATESTORE_DATA to change it).
# `--clean` starts from empty data. Nothing is installed: missing packages are named, with the
# command that installs them.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/statestore-target}"
data="${STATESTORE_DATA:-cluster/data}"
mqtt_port="${MQTT_PORT:-1883}"
members="1=http://127.0.0.1:7401,2=http://127.0.0.1:7402,3=http://127.0.0.1:7403"
binary="$CARGO_TARGET_DIR/release/statestore"
# The three nodes share this machine's cores: each gets a third of them (at least one) for its
# async runtime, which serves more than each taking every core (docs/benchmarks.md).
worker_threads="${STATESTORE_WORKER_THREADS:-$(( $(nproc) / 3 > 1 ? $(nproc) / 3 : 1 ))}"

die() { echo "local.sh: $*" >&2; exit 1; }

alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

broker_address() { cat "$data/broker" 2>/dev/null || echo "127.0.0.1:$mqtt_port"; }

mosquitto_bin() {
  command -v mosquitto 2>/dev/null || { [[ -x /usr/sbin/mosquitto ]] && echo /usr/sbin/mosquitto; } || true
}

start_broker() {
  local bin
  bin="$(mosquitto_bin)"
  [[ -n "$bin" ]] || die "mosquitto is not installed (apt-get install -y mosquitto), or pass --broker HOST:PORT"
  alive "$data/mosquitto.pid" && return 0
  if (exec 3<>"/dev/tcp/127.0.0.1/$mqtt_port") 2>/dev/null; then
    die "port $mqtt_port is taken; is a broker running? Use it with: $0 up --broker 127.0.0.1:$mqtt_port"
  fi
  mkdir -p "$data/mosquitto"
  sed -e "s|^listener .*|listener $mqtt_port 127.0.0.1|" \
      -e "s|^persistence_location .*|persistence_location $(cd "$data" && pwd)/mosquitto/|" \
      cluster/mosquitto.conf >"$data/mosquitto.conf"
  "$bin" -c "$data/mosquitto.conf" >>"$data/mosquitto.log" 2>&1 &
  echo "$!" >"$data/mosquitto.pid"
  for _ in $(seq 1 50); do
    (exec 3<>"/dev/tcp/127.0.0.1/$mqtt_port") 2>/dev/null && return 0
    sleep 0.1
  done
  die "mosquitto did not start; see $data/mosquitto.log"
}

start_node() {
  local id="$1"
  alive "$data/node-$id.pid" && { echo "node $id is running"; return 0; }
  "$binary" --id "$id" --listen "127.0.0.1:740$id" --data-dir "$data/node-$id" \
    --initial-members "$members" --broker "$(broker_address)" --worker-threads "$worker_threads" \
    >>"$data/node-$id.log" 2>&1 &
  echo "$!" >"$data/node-$id.pid"
}

# Every node ready (a leader known, caught up, connected to the broker), or the reason one is not.
wait_ready() {
  local pending=()
  for _ in $(seq 1 300); do
    pending=()
    for id in 1 2 3; do
      if ! alive "$data/node-$id.pid"; then
        tail -n 5 "$data/node-$id.log" >&2 || true
        down >/dev/null 2>&1 || true
        die "node $id exited while starting (everything started is stopped again); see $data/node-$id.log"
      fi
      curl -sf "http://127.0.0.1:740$id/ready" >/dev/null 2>&1 || pending+=("$id")
    done
    ((${#pending[@]} == 0)) && return 0
    sleep 0.2
  done
  for id in "${pending[@]}"; do
    echo "node $id: $(curl -s "http://127.0.0.1:740$id/ready" 2>&1 || echo 'no answer')" >&2
  done
  down >/dev/null 2>&1 || true
  die "node(s) ${pending[*]} not ready after 60 s (everything started is stopped again); see $data/node-N.log"
}

up() {
  local broker=""
  while (($#)); do
    case "$1" in
      --clean) [[ -d "$data" ]] && { down >/dev/null 2>&1 || true; rm -rf "$data"; } ;;
      --broker) broker="${2:?--broker needs HOST:PORT}"; shift ;;
      *) die "unknown option $1" ;;
    esac
    shift
  done
  bash cluster/packages.sh --check || die "install the packages above, then run this again"
  command -v cargo >/dev/null || die "cargo is missing: install Rust with rustup (https://rustup.rs)"
  mkdir -p "$data"
  echo "building the release binaries (the first build compiles RocksDB: ~15 minutes)"
  cargo build --locked --release --workspace --bins
  if [[ -n "$broker" ]]; then
    echo "$broker" >"$data/broker"
  else
    rm -f "$data/broker"
    start_broker
  fi
  for id in 1 2 3; do start_node "$id"; done
  wait_ready
  local host="${broker%:*}" port="${broker##*:}"
  [[ -n "$broker" ]] || { host=127.0.0.1; port="$mqtt_port"; }
  cat <<INFO
state store running: broker mqtt://$(broker_address), nodes http://127.0.0.1:7401..7403
  point an SDK client at host $host port $port (MQTT 5, no TLS)
  cluster status:  curl -s http://127.0.0.1:7401/cluster
  metrics:         curl -s http://127.0.0.1:7401/metrics
  logs:            $data/node-N.log${broker:+}$( [[ -n "$broker" ]] || echo ", $data/mosquitto.log")
  stop:            $0 down
INFO
}

down() {
  for id in 1 2 3; do
    if alive "$data/node-$id.pid"; then kill -TERM "$(cat "$data/node-$id.pid")"; fi
  done
  for id in 1 2 3; do
    while alive "$data/node-$id.pid"; do sleep 0.1; done
    rm -f "$data/node-$id.pid"
  done
  if alive "$data/mosquitto.pid"; then
    kill -TERM "$(cat "$data/mosquitto.pid")"
    while alive "$data/mosquitto.pid"; do sleep 0.1; done
  fi
  rm -f "$data/mosquitto.pid"
  echo "stopped"
}

status() {
  alive "$data/mosquitto.pid" && echo "mosquitto: running (pid $(cat "$data/mosquitto.pid"))" \
    || echo "broker: $(broker_address) ($( [[ -f "$data/broker" ]] && echo external || echo "not running"))"
  for id in 1 2 3; do
    if alive "$data/node-$id.pid"; then
      echo "node $id: running (pid $(cat "$data/node-$id.pid")), $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:740$id/ready" | sed 's/200/ready/;s/503/not ready/')"
    else
      echo "node $id: stopped"
    fi
  done
  for id in 1 2 3; do
    curl -sf "http://127.0.0.1:740$id/cluster" 2>/dev/null && { echo; return 0; }
  done
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  kill) [[ "${2:-}" =~ ^[123]$ ]] || die "kill N: N is 1, 2 or 3"
        alive "$data/node-$2.pid" || die "node $2 is not running"
        kill -KILL "$(cat "$data/node-$2.pid")"; rm -f "$data/node-$2.pid"; echo "killed node $2" ;;
  start) [[ "${2:-}" =~ ^[123]$ ]] || die "start N: N is 1, 2 or 3"
         [[ -x "$binary" ]] || die "run '$0 up' first"
         start_node "$2"; echo "started node $2" ;;
  status) status ;;
  *) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
