#!/usr/bin/env bash
# Failover and partition drill against the docker-compose.yml cluster, under a steady write load
# from this machine (`statestore-cli load` through the published MQTT port).
#
#   bash cluster/failover.sh
#
# 1. KILLS rounds (default 10): find the leader, `docker kill` it (SIGKILL), wait until another
#    node leads and a write succeeds, `docker start` the killed node, wait until it is ready and
#    has applied what the leader had committed. The write gap of a round is the first successful
#    write completed after the kill minus the last one completed before it.
#    Then STOPS rounds (default 2) the same with `docker stop` (SIGTERM): the leader hands its
#    leadership over before it stops.
# 2. Partitions: `docker network disconnect` a follower, then the leader, for PARTITION_SECS
#    (default 5), recording what the partitioned node reports (role, term, leader, readiness), and
#    connect it again under its service name. The others must keep serving writes, a partitioned
#    follower must not lead, the old leader must step down, and both must catch up.
# It fails (exit 1) when a gap exceeds MAX_GAP_MS (5000), a node does not catch up within
# CATCH_UP_SECS (60), no leader is elected, or the load ends with a failed write.
#
# The cluster runs as compose project COMPOSE_PROJECT_NAME (default statestore-drill) on host
# ports STATESTORE_MQTT_PORT (21883) and STATESTORE_HTTP_PORT_1..3 (27401..27403), apart from a
# cluster started with the defaults. The drill starts it when the project has no containers, and
# then removes it with its volumes at the end (KEEP=1 keeps it); a running project is used as it
# is. The images must exist: `docker compose build`, or `bash cluster/images.sh` without registry
# access. Other settings: WRITERS (4) concurrent writers, ROUND_SECS (12) load per kill round,
# STATESTORE_CLI (the release build's statestore-cli), STATESTORE_LOG (warn,statestore=debug: the
# nodes log every request by its correlation data, which a failed write's line in the load record
# names, so a failure can be followed through the kept container logs). Lines starting with
# "drill:" summarize results for machines, among them "drill: result=pass" or "drill: result=fail
# ..." at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/statestore-target}"
export COMPOSE_PROJECT_NAME="${COMPOSE_PROJECT_NAME:-statestore-drill}"
export STATESTORE_MQTT_PORT="${STATESTORE_MQTT_PORT:-21883}"
export STATESTORE_HTTP_PORT_1="${STATESTORE_HTTP_PORT_1:-27401}"
export STATESTORE_HTTP_PORT_2="${STATESTORE_HTTP_PORT_2:-27402}"
export STATESTORE_HTTP_PORT_3="${STATESTORE_HTTP_PORT_3:-27403}"
export STATESTORE_LOG="${STATESTORE_LOG:-warn,statestore=debug}"
kills="${KILLS:-10}"
stops="${STOPS:-2}"
max_gap_ms="${MAX_GAP_MS:-5000}"
catch_up_secs="${CATCH_UP_SECS:-60}"
partition_secs="${PARTITION_SECS:-5}"
writers="${WRITERS:-4}"
round_secs="${ROUND_SECS:-12}"
cli="${STATESTORE_CLI:-$CARGO_TARGET_DIR/release/statestore-cli}"
project="$COMPOSE_PROJECT_NAME"
# The CLI inside the node image; it reaches a node even while the node is cut off the network.
image_cli=/usr/local/bin/statestore-cli

failures=()
started=0
network=""
gap=0 failed=0 total=0
load_pid=""
partitioned=""
cut_id=""
work="$(mktemp -d "${TMPDIR:-/tmp}/statestore-drill.XXXXXX")"

die() { echo "failover.sh: $*" >&2; exit 1; }
now_ms() { date +%s%3N; }
fail() { failures+=("$1"); echo "FAIL: $1"; }
seconds() { awk -v ms="$1" 'BEGIN { printf "%.1f", ms / 1000 }'; }

# shellcheck source=cluster/compose.sh
source cluster/compose.sh

# The container of a compose service of this project (also when it is stopped).
container() {
  docker ps -aq --filter "label=com.docker.compose.project=$project" \
    --filter "label=com.docker.compose.service=$1" | head -n 1
}

# The host port a container port is published on.
host_port() {
  local mapping
  mapping="$(docker port "$1" "$2" 2>/dev/null | head -n 1)" || return 1
  [[ -n "$mapping" ]] || return 1
  echo "${mapping##*:}"
}

cleanup() {
  local status=$?
  [[ -z "$load_pid" ]] || kill "$load_pid" 2>/dev/null || true
  if [[ -n "$partitioned" ]]; then
    docker network connect --alias "${partitioned#* }" "$network" "${partitioned%% *}" 2>/dev/null || true
  fi
  if ((status != 0)) && [[ -n "${node_cid[1]:-}" ]]; then
    for id in 1 2 3; do
      docker logs -t "${node_cid[$id]}" >"$work/node$id.log" 2>&1 || true
    done
    docker logs -t "$(container mosquitto)" >"$work/mosquitto.log" 2>&1 || true
    echo "--- the nodes' own warnings and MQTT client notices (openraft's are in the logs)"
    grep -hE "(WARN|ERROR) statestore|rumqttc" "$work"/node?.log | sort | tail -n 20 || true
    echo "--- failed writes in the load records (at most 5), each with what the nodes logged about it"
    { grep -H " err " "$work"/*.load 2>/dev/null | head -n 5 | while IFS= read -r line; do
        echo "$line"
        correlation="$(sed -n 's/.*correlation data \([0-9A-F]*\).*/\1/p' <<<"$line")"
        [[ -z "$correlation" ]] || grep -H "correlation=$correlation" "$work"/node?.log | head -n 20 || true
      done; } || true
    echo "failover.sh: the load records and container logs are kept in $work"
  fi
  if ((started)) && [[ "${KEEP:-0}" != 1 ]]; then
    echo "== removing the drill cluster (compose project $project)"
    compose down -v --remove-orphans >/dev/null 2>&1 || true
  fi
  ((status != 0)) || rm -rf "$work"
}
trap cleanup EXIT

# --- what a node says about itself ------------------------------------------------------------

# GET /cluster from the host; when the node is unreachable from here (cut off the network), the
# CLI in its container asks it over loopback. Whitespace removed, so sed can pick fields.
node_status() {
  local id="$1" port
  [[ "$id" != "$cut_id" ]] && port="$(host_port "${node_cid[$id]}" 7400)" &&
    curl -sf --max-time 1 "http://127.0.0.1:$port/cluster" 2>/dev/null | tr -d ' \n\t' && return 0
  timeout 3 docker exec "${node_cid[$id]}" "$image_cli" --endpoint http://127.0.0.1:7400 cluster status --json \
    2>/dev/null | tr -d ' \n\t'
}

# 0 when /ready answers 200, on the same two paths.
node_ready() {
  local id="$1" port code
  if [[ "$id" != "$cut_id" ]] && port="$(host_port "${node_cid[$id]}" 7400)"; then
    code="$(curl -s -o /dev/null --max-time 1 -w '%{http_code}' "http://127.0.0.1:$port/ready" 2>/dev/null || true)"
    [[ "$code" == 200 ]] && return 0
    [[ "$code" == 503 ]] && return 1
  fi
  timeout 3 docker exec "${node_cid[$id]}" "$image_cli" --endpoint http://127.0.0.1:7400 cluster ready >/dev/null 2>&1
}

# A top-level scalar of GET /cluster, and the leader's id (the CLI may print keys sorted).
field() { sed -n "s/.*\"$1\":\"\{0,1\}\([a-z0-9_]*\).*/\1/p" <<<"$2" | head -n 1; }
leader_field() { sed -n 's/.*"leader":{[^}]*"id":\([0-9]*\).*/\1/p' <<<"$1" | head -n 1; }

# "role=... term=... leader=... applied=... ready=yes|no", or "unreachable".
describe() {
  local id="$1" status ready=no leader
  status="$(node_status "$id")" || { echo "unreachable"; return 0; }
  [[ -n "$status" ]] || { echo "unreachable"; return 0; }
  node_ready "$id" && ready=yes
  leader="$(leader_field "$status")"
  echo "role=$(field role "$status") term=$(field term "$status") leader=${leader:--}" \
    "applied=$(field applied_index "$status") ready=$ready"
}

# The node that leads in the highest term among those asked (by default all three), if any.
find_leader() {
  local id status best="" best_term=-1 term ids=("$@")
  ((${#ids[@]})) || ids=(1 2 3)
  for id in "${ids[@]}"; do
    status="$(node_status "$id")" || continue
    [[ "$(field role "$status")" == leader ]] || continue
    term="$(field term "$status")"
    if ((term > best_term)); then best="$id"; best_term="$term"; fi
  done
  [[ -n "$best" ]] && echo "$best"
}

# Waits up to 10 s for a leader (an election may be under way).
wait_leader() {
  local deadline=$(($(now_ms) + 10000))
  while (($(now_ms) < deadline)); do
    find_leader && return 0
    sleep 0.1
  done
  return 1
}

# Waits until one of the given nodes leads and a write through the broker succeeds.
wait_serving() {
  local deadline=$(($(now_ms) + 30000)) leader
  while (($(now_ms) < deadline)); do
    leader="$(find_leader "$@")" &&
      timeout 5 "$cli" -h 127.0.0.1 -p "$mqtt_port" --timeout 2 set drill-probe "$(now_ms)" >/dev/null 2>&1 &&
      { echo "$leader"; return 0; }
    sleep 0.1
  done
  return 1
}

# Waits until the node is ready and has applied what the leader had committed when it became
# ready; prints the milliseconds since `since`.
wait_caught_up() {
  local id="$1" since="$2" deadline=$(($2 + catch_up_secs * 1000)) target="" leader status applied
  while (($(now_ms) < deadline)); do
    if node_ready "$id"; then
      if [[ -z "$target" ]]; then
        leader="$(find_leader)" || { sleep 0.2; continue; }
        target="$(field committed_index "$(node_status "$leader")")"
        [[ -n "$target" ]] || { sleep 0.2; continue; }
      fi
      status="$(node_status "$id")" || { sleep 0.2; continue; }
      applied="$(field applied_index "$status")"
      if [[ -n "$applied" ]] && ((applied >= target)); then
        echo $(($(now_ms) - since))
        return 0
      fi
    fi
    sleep 0.2
  done
  return 1
}

wait_all_ready() {
  local deadline=$(($(now_ms) + ${1:-120} * 1000)) id pending
  while (($(now_ms) < deadline)); do
    pending=0
    for id in 1 2 3; do node_ready "$id" || pending=1; done
    ((pending)) || return 0
    sleep 0.5
  done
  return 1
}

# Each round starts from a cluster that serves: every node ready and a write succeeding.
ensure_serving() {
  wait_all_ready 60 || fail "$1: not every node was ready 60 s after the previous step"
  wait_serving >/dev/null || fail "$1: no write succeeded for 30 s before it began"
}

# --- the write load ----------------------------------------------------------------------------

start_load() {
  "$cli" -h 127.0.0.1 -p "$mqtt_port" load --writers "$writers" --duration "$2" --out "$1" \
    >"$1.stdout" 2>&1 &
  load_pid=$!
}

finish_load() {
  local file="$1"
  if ! wait "$load_pid"; then
    load_pid=""
    fail "the load generator failed: $(tail -n 3 "$file.stdout" | tr '\n' ' ')"
    return 0
  fi
  load_pid=""
  [[ -s "$file" ]] || fail "the load generator wrote nothing to $file"
}

# "<gap_ms> <failed_writes> <writes> <last_result>" for a disruption from $2 to $3 (ms: before
# the command that caused it and once it returned): the longest time without a successful write
# from the last one completed at or before $2 to the first one completed after $3.
gap_around() {
  sort -n -k2,2 "$1" | awk -v from="$2" -v to="$3" '
    $3 != "ok" { failed++ }
    { if ($2 >= last_done) { last_done = $2; last = $3 } }
    $3 == "ok" && $2 <= from { before = $2; next }
    $3 == "ok" && before != "" && !done {
      if ($2 - before > gap) gap = $2 - before
      before = $2
      if ($2 > to) { done = 1 }
    }
    END {
      if (!done) gap = -1
      printf "%d %d %d %s\n", gap, failed, NR, (NR ? last : "none")
    }'
}

# The longest time between two consecutive successful writes in a load file.
longest_gap() {
  awk '$3 == "ok" { print $2 }' "$1" | sort -n |
    awk 'NR > 1 && $1 - prev > longest { longest = $1 - prev } { prev = $1 } END { print longest + 0 }'
}

# Sets gap, failed and total for one load file's disruption from $2 to $3, and checks them.
measure_gap() {
  local file="$1" from="$2" to="$3" what="$4" last
  read -r gap failed total last < <(gap_around "$file" "$from" "$to")
  if ((gap < 0)); then
    fail "$what: no write succeeded on one side of the disruption ($failed of $total writes failed)"
  elif ((gap > max_gap_ms)); then
    fail "$what: write gap ${gap} ms exceeds ${max_gap_ms} ms"
  fi
  [[ "$last" == ok ]] || fail "$what: the load ended with a failed write ($failed of $total failed)"
}

# --- bring the cluster up ----------------------------------------------------------------------

[[ -x "$cli" ]] || die "$cli is missing; build it with: cargo build --release --workspace --bins --locked"
command -v curl >/dev/null || die "curl is missing (apt-get install -y curl)"
docker info >/dev/null 2>&1 || die "cannot reach the Docker daemon"
# Read whole before awk looks at it: awk stops at the first match, and a pipe from compose would
# then end it by SIGPIPE (exit 141 under pipefail) whenever it had more to write.
config="$(compose config)" || die "docker-compose.yml does not parse (see above)"
for service in mosquitto node1; do
  image="$(awk -v s="  $service:" '$0 == s { found = 1; next } found && /^  [^ ]/ { exit }
                                   found && /^    image:/ { print $2; exit }' <<<"$config")"
  docker image inspect "$image" >/dev/null 2>&1 ||
    die "image $image is missing: build it with 'docker compose build' or, without registry access, 'bash cluster/images.sh'"
done

if [[ -z "$(container node1)" ]]; then
  started=1
  echo "== starting compose project $project (MQTT 127.0.0.1:$STATESTORE_MQTT_PORT, nodes 127.0.0.1:$STATESTORE_HTTP_PORT_1..3)"
else
  echo "== using the running compose project $project"
fi
compose up -d mosquitto node1 node2 node3 >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; die "compose up failed"; }

declare -a node_cid
for id in 1 2 3; do node_cid[id]="$(container "node$id")"; done
mqtt_port="$(host_port "$(container mosquitto)" 1883)" || die "the broker's port is not published"
network="$(docker inspect -f '{{range $name, $_ := .NetworkSettings.Networks}}{{$name}} {{end}}' "${node_cid[1]}" | awk '{ print $1 }')"
[[ -n "$network" ]] || die "node1 is on no network"

start_ms="$(now_ms)"
wait_all_ready || die "the nodes did not all become ready within 120 s"
echo "   all three nodes ready after $(seconds $(($(now_ms) - start_ms))) s; network $network, broker port $mqtt_port"

# --- kill rounds -------------------------------------------------------------------------------

# One round: under load, takes the leader down with `docker $2` (kill: SIGKILL; stop: SIGTERM,
# after which a leader hands its leadership over), waits until another node serves writes,
# starts the node again and waits until it has caught up. $3 of $4 rounds; sets gap.
leader_round() {
  local verb="$1" round="$2" name="$1 round $2/$3" file="$work/$1-$2.load" leader down_ms gone_ms new_leader serving_ms restart_ms catch_up_ms
  gap=-1
  ensure_serving "$name"
  start_load "$file" "$round_secs"
  sleep 2
  leader="$(wait_leader)" || { fail "$name: no leader for 10 s before the $verb"; finish_load "$file"; return 0; }
  down_ms="$(now_ms)"
  docker "$verb" "${node_cid[$leader]}" >/dev/null
  gone_ms="$(now_ms)"
  mapfile -t survivors < <(printf '%s\n' 1 2 3 | grep -vx "$leader")
  if new_leader="$(wait_serving "${survivors[@]}")"; then
    serving_ms=$(($(now_ms) - down_ms))
  else
    fail "$name: no new leader serving writes within 30 s of the $verb of node$leader"
    new_leader="-"
    serving_ms=-1
  fi
  docker start "${node_cid[$leader]}" >/dev/null
  restart_ms="$(now_ms)"
  if ! catch_up_ms="$(wait_caught_up "$leader" "$restart_ms")"; then
    fail "$name: node$leader did not catch up within $catch_up_secs s of its restart"
    catch_up_ms=-1
  fi
  finish_load "$file"
  measure_gap "$file" "$down_ms" "$gone_ms" "$name"
  echo "$name: docker $verb of leader node$leader; node$new_leader serving after ${serving_ms} ms;" \
    "node$leader caught up ${catch_up_ms} ms after its restart; write gap ${gap} ms ($failed of $total writes failed)"
  echo "drill: $verb round=$round node=$leader at_ms=$down_ms gone_ms=$gone_ms new_leader=$new_leader serving_ms=$serving_ms" \
    "catch_up_ms=$catch_up_ms gap_ms=$gap failed_writes=$failed writes=$total"
}

gaps=()
for round in $(seq 1 "$kills"); do
  leader_round kill "$round" "$kills"
  ((gap < 0)) || gaps+=("$gap")
done

if ((${#gaps[@]})); then
  read -r median worst < <(printf '%s\n' "${gaps[@]}" | sort -n |
    awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : int((v[NR / 2] + v[NR / 2 + 1]) / 2); print m, v[NR] }')
  echo "kill rounds: write gaps (ms) ${gaps[*]}; median $median, worst $worst"
  echo "drill: kills=${#gaps[@]} gap_median_ms=$median gap_worst_ms=$worst"
fi

# --- a graceful stop of the leader ------------------------------------------------------------

# SIGTERM (`docker stop`): the leader hands its leadership over before it stops, so the gap is a
# round trip or two rather than the lease and election timeout of a kill.
for round in $(seq 1 "$stops"); do
  leader_round stop "$round" "$stops"
done

# --- partitions --------------------------------------------------------------------------------

# Cuts one node off the network for partition_secs under load, samples every node's view, and
# connects it again. $1 is "follower" or "leader".
partition() {
  local kind="$1" file="$work/partition-$1.load" leader target cut_ms t majority view led=0 \
    last_view="" new_leader="" elected_ms=-1 rejoin_ms catch_up_ms longest stepped_down=-1 \
    term_before term_after leader_after ready_while_cut=0
  ensure_serving "$kind partition"
  start_load "$file" $((partition_secs + 20))
  sleep 2
  leader="$(wait_leader)" || { fail "$kind partition: no leader for 10 s"; finish_load "$file"; return 0; }
  term_before="$(field term "$(node_status "$leader")")"
  if [[ "$kind" == leader ]]; then
    target="$leader"
  else
    target="$(printf '%s\n' 1 2 3 | grep -vx "$leader" | head -n 1)"
  fi
  local others
  others="$(printf '%s\n' 1 2 3 | grep -vx "$target" | tr '\n' ' ')"
  echo "$kind partition: node$target cut off for ${partition_secs} s (leader node$leader, term $term_before)"
  local disconnect_ms
  disconnect_ms="$(now_ms)"
  docker network disconnect "$network" "${node_cid[$target]}"
  cut_ms="$(now_ms)"
  partitioned="${node_cid[$target]} node$target"
  cut_id="$target"
  while (($(now_ms) - cut_ms < partition_secs * 1000)); do
    t="$(seconds $(($(now_ms) - cut_ms)))"
    view="$(describe "$target")"
    # shellcheck disable=SC2086 # $others is a list of ids
    majority="$(find_leader $others)" && majority="node$majority" || majority=none
    if [[ "$majority" != none && "$majority" != "node$leader" && -z "$new_leader" ]]; then
      new_leader="${majority#node}"
      elected_ms=$(($(now_ms) - cut_ms))
    fi
    [[ "$view" == role=leader* ]] && led=1
    [[ "$view" == *ready=yes* ]] && ready_while_cut=1
    echo "  +${t}s node$target (cut off): $view | the others' leader: $majority"
    last_view="$view"
    sleep 0.2
  done
  docker network connect --alias "node$target" "$network" "${node_cid[$target]}"
  rejoin_ms="$(now_ms)"
  partitioned=""
  cut_id=""
  # After it is back: who leads, and when the cut-off node stops claiming to.
  while (($(now_ms) - rejoin_ms < 3000)); do
    t="$(seconds $(($(now_ms) - rejoin_ms)))"
    view="$(describe "$target")"
    if ((stepped_down < 0)) && [[ "$view" != role=leader* && "$view" != unreachable ]]; then
      stepped_down=$(($(now_ms) - rejoin_ms))
    fi
    majority="$(find_leader)" && majority="node$majority" || majority=none
    echo "  +${t}s after reconnecting: node$target $view | leader: $majority"
    sleep 0.5
  done
  if ! catch_up_ms="$(wait_caught_up "$target" "$rejoin_ms")"; then
    fail "$kind partition: node$target did not catch up within $catch_up_secs s of reconnecting"
    catch_up_ms=-1
  fi
  echo "  node$target ready and caught up ${catch_up_ms} ms after reconnecting: $(describe "$target")"
  leader_after="$(find_leader)" || leader_after=""
  term_after="$( [[ -z "$leader_after" ]] || field term "$(node_status "$leader_after")")"
  finish_load "$file"
  longest="$(longest_gap "$file")"
  measure_gap "$file" "$disconnect_ms" "$cut_ms" "$kind partition"
  ((longest <= max_gap_ms)) || fail "$kind partition: ${longest} ms without a successful write"
  [[ -n "$leader_after" ]] || fail "$kind partition: no leader after reconnecting"
  if [[ "$kind" == follower ]]; then
    ((led == 0)) || fail "follower partition: the cut-off node claimed leadership"
    [[ "$last_view" != *ready=yes* ]] || fail "follower partition: the cut-off node still reported ready after ${partition_secs} s"
    echo "  writes: gap at the cut ${gap} ms, longest gap ${longest} ms, $failed of $total failed;" \
      "leader node$leader term $term_before before, node${leader_after:--} term ${term_after:--} after"
  else
    [[ -n "$new_leader" ]] || fail "leader partition: the others elected no new leader in ${partition_secs} s"
    ((stepped_down >= 0)) || fail "leader partition: the old leader still claimed leadership 3 s after reconnecting"
    ((led == 0)) || echo "  note: cut off, node$target went on reporting itself leader (ready: $( ((ready_while_cut)) && echo yes || echo no)) until it was reconnected"
    echo "  writes: gap at the cut ${gap} ms, longest gap ${longest} ms, $failed of $total failed;" \
      "node${new_leader:--} elected ${elected_ms} ms after the cut; old leader stepped down ${stepped_down} ms after reconnecting;" \
      "leader node${leader_after:--} term ${term_after:--} after"
  fi
  echo "drill: partition kind=$kind node=$target leader_before=$leader term_before=$term_before" \
    "new_leader=${new_leader:--} elected_ms=$elected_ms claimed_leadership_while_cut=$led" \
    "ready_while_cut=$ready_while_cut last_view_while_cut=\"$last_view\" stepped_down_ms=$stepped_down" \
    "leader_after=${leader_after:--} term_after=${term_after:--} catch_up_ms=$catch_up_ms gap_ms=$gap" \
    "longest_gap_ms=$longest failed_writes=$failed writes=$total"
}

partition follower
partition leader
echo "drill: seconds=$(( ($(now_ms) - start_ms) / 1000 ))"

if ((${#failures[@]})); then
  echo "drill: result=fail failures=${#failures[@]}"
  printf '  %s\n' "${failures[@]}"
  exit 1
fi
echo "drill: result=pass"
