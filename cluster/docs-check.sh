#!/usr/bin/env bash
# Runs the commands that README.md, cluster/README.md and docs/*.md show, verbatim, as a newcomer
# would type them: every fenced shell block is extracted from the docs and either run or skipped
# for a reason written in the plan below; a block the plan does not know, or a plan line that
# matches no block, fails the check, so a new or changed command in the docs cannot go unrun.
#
#   bash cluster/docs-check.sh
#
# Scenes, in this order:
#   host     commands that need no cluster (certificates)
#   compose  `docker compose up` (images built offline first), then the CLI, the examples,
#            /v1/command and the day-one commands, ending with `docker compose down -v`
#   local    `./cluster/local.sh up`, then a backup restored into a new cluster and the
#            membership change that grows it to four voters and retires node 2
#   options  the benchmark commands: every option they use is one their mode accepts (the runs
#            take minutes; .ci/run runs a short sweep)
#
# The commands run in a copy of this checkout (files they write stay there) with
# CARGO_INSTALL_ROOT in that copy, so `cargo install` does not touch ~/.cargo; the node binary
# `statestore` is taken from the build in $CARGO_TARGET_DIR/release, as the docs say. Compose runs
# as project COMPOSE_PROJECT_NAME (statestore-docs) on the documented host ports, which must be
# free: MQTT 1883, nodes 7401-7403, Prometheus 9090, node 4 7404. Where `docker compose` (v2) is
# missing, `docker-compose` (v1) stands in, as README.md says. Commands that run until stopped
# (`docker compose up`, `logs -f`, `watch`) are stopped after a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/statestore-target}"
export COMPOSE_PROJECT_NAME="${COMPOSE_PROJECT_NAME:-statestore-docs}"
scratch="$(mktemp -d)"
work="$scratch/repo"
export CARGO_INSTALL_ROOT="$scratch/cargo-root"

die() { echo "docs-check: $*" >&2; echo "docs: result=fail"; exit 1; }

# ---- the plan: FILE | first line of the block, as a prefix | scene [| why it is skipped] -------
plan="$(cat <<'EOF'
README.md|docker compose up |skip|the same `up` as the next block, which builds the images first
README.md|bash cluster/images.sh && docker compose up|compose-up
README.md|cargo install --locked --path crates/client|compose
README.md|cargo run --release -p statestore-node --example sdk_quickstart|compose
README.md|bash .ci/run|skip|CI itself, which runs this script
docs/benchmarks.md|bash benches/compare.sh |options
docs/operations.md|statestore --id 4 |local-members
docs/operations.md|statestore-cli set greeting hello |compose
docs/operations.md|docker cp "$(docker compose ps -q node1)"|compose
docs/operations.md|docker compose ps|compose-last
docs/operations.md|openssl req -x509|host
docs/operations.md|printf '*3\r\n$3\r\nSET|compose
docs/operations.md|statestore-cli snapshot save backup.ssbk|local-backup
docs/testing.md|cargo test --release --workspace --locked|skip|the test command .ci/run runs before this script
docs/testing.md|cargo install cargo-fuzz --locked|skip|ten minutes of fuzzing by design (two targets, 300 s each)
EOF
)"

# ---- every file the docs link to exists ------------------------------------------------------------
for doc in README.md cluster/README.md docs/*.md; do
  while read -r target; do
    path="$(dirname "$doc")/${target%%#*}"
    [[ -z "${target%%#*}" || -e "$path" ]] || die "$doc links to $target, which does not exist"
  done < <(grep -oE '\]\([^)[:space:]]+\)' "$doc" | sed -E 's/^\]\((.*)\)$/\1/' | grep -vE '^(https?|mailto):' || true)
done
# Files named in the text (a path from the repository root with an extension) exist too.
while read -r cited; do
  [[ -e "$cited" ]] || die "the docs name $cited, which does not exist"
done < <(cat README.md cluster/README.md docs/*.md \
  | grep -oE '(crates|cluster|docs|benches)/[A-Za-z0-9_./-]+\.(rs|sh|md|yml|yaml|toml|py|json|conf|txt)' | sort -u)
echo "== every file README.md, cluster/README.md and docs/ link to or name exists"

# ---- extract every fenced shell block ---------------------------------------------------------
mkdir -p "$scratch/blocks"
docs=(README.md cluster/README.md docs/*.md)
for i in "${!docs[@]}"; do
  awk -v doc="${docs[$i]}" -v dir="$scratch/blocks" -v index_="$i" '
    /^```/ {
      if (inside) { inside = 0; close(out); next }
      if ($0 ~ /^```(sh|bash|shell|console)[ \t]*$/) {
        inside = 1; n++
        out = sprintf("%s/%03d-%03d", dir, index_, n)
        printf "%s:%d\n", doc, NR + 1 > (out ".where")
        close(out ".where")
        printf "" > out
      }
      next
    }
    inside { print > out }
  ' "${docs[$i]}"
done

block_scene=()   # "scene<TAB>block file", in plan order
declare -A matched=()
for block in "$scratch"/blocks/*; do
  [[ "$block" == *.where ]] && continue
  where="$(cat "$block.where")"
  doc="${where%%:*}"
  first="$(head -n 1 "$block")"
  found=""
  while IFS='|' read -r p_doc p_first p_scene p_why; do
    [[ "$p_doc" == "$doc" && "$first" == "$p_first"* ]] || continue
    found="$p_scene"
    matched["$p_doc|$p_first"]=1
    [[ "$p_scene" == skip ]] && echo "== skip $where: $p_why"
    break
  done <<<"$plan"
  [[ -n "$found" ]] || die "$where is a command block the plan in cluster/docs-check.sh does not know; add it there: $first"
  block_scene+=("$found"$'\t'"$block")
done
while IFS='|' read -r p_doc p_first _; do
  [[ -n "${matched["$p_doc|$p_first"]:-}" ]] || die "the plan names a block that $p_doc no longer has: $p_first"
done <<<"$plan"

blocks_of() { # blocks of one scene
  local entry
  for entry in "${block_scene[@]}"; do
    [[ "${entry%%$'\t'*}" == "$1" ]] && echo "${entry#*$'\t'}"
  done
}

# ---- a copy of the checkout to run in; PATH as the docs leave it --------------------------------
mkdir -p "$work" "$scratch/bin"
git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -C "$work" -xf -
real_docker="$(command -v docker || true)"
if [[ -n "$real_docker" ]] && ! "$real_docker" compose version >/dev/null 2>&1; then
  # Compose v1 only: `docker compose ...` as `docker-compose ...` (README.md: "or: docker-compose up").
  cat >"$scratch/bin/docker" <<EOF
#!/usr/bin/env bash
if [[ "\${1:-}" == compose ]]; then shift; exec docker-compose "\$@"; fi
exec "$real_docker" "\$@"
EOF
  chmod +x "$scratch/bin/docker"
fi
# README.md installs paho-mqtt with apt-get: where another python3 comes first on PATH (pyenv,
# a virtualenv) and lacks it, the system's python3 runs the example.
if ! python3 -c 'import paho.mqtt.client' 2>/dev/null && /usr/bin/python3 -c 'import paho.mqtt.client' 2>/dev/null; then
  echo "== python3 on PATH lacks paho-mqtt; /usr/bin/python3, where apt-get installed it, stands in"
  ln -s /usr/bin/python3 "$scratch/bin/python3"
fi
export PATH="$scratch/bin:$CARGO_INSTALL_ROOT/bin:$PATH:$CARGO_TARGET_DIR/release"

background=()
cleanup() {
  local status=$? pid
  for pid in "${background[@]}"; do kill "$pid" 2>/dev/null || true; done
  (cd "$work" && bash cluster/local.sh down >/dev/null 2>&1) || true
  if [[ -n "$real_docker" && -f "$work/docker-compose.yml" ]]; then
    (cd "$work" && docker compose down -v --remove-orphans >/dev/null 2>&1) || true
  fi
  for pid in "${background[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$scratch"
  exit "$status"
}
trap cleanup EXIT

# One command (continuation lines joined) at a time, in the copy, each bounded in time. A command
# that runs until stopped passes when it is still running after a few seconds.
follows='(compose up( |$)|logs -f|statestore-cli watch )'
run_command() {
  local command="$1" where="$2" status=0 output
  echo "\$ $command"
  if [[ "$command" =~ $follows ]]; then
    (cd "$work" && timeout -s INT 5 bash -c "$command") || status=$?
    ((status == 0 || status == 124 || status == 130)) || die "$where: exit $status: $command"
    return 0
  fi
  if [[ "$command" =~ \&[[:space:]]*(#.*)?$ ]]; then
    command="${command%&*}"
    (cd "$work" && exec bash -c "exec $command") &
    background+=("$!")
    return 0
  fi
  output="$(cd "$work" && timeout 900 bash -c "$command" 2>&1)" || status=$?
  [[ -z "$output" ]] || printf '%s\n' "$output"
  ((status == 0)) || die "$where: exit $status: $command"
  # The HTTP API answers errors as JSON with a code; curl -s exits 0 on them.
  if [[ "$command" == curl* ]] && grep -q '"code":' <<<"$output"; then
    die "$where: the node refused it: $command"
  fi
}

run_block() {
  local block="$1" where line command="" n=0
  where="$(cat "$block.where")"
  echo "== $where"
  while IFS= read -r line || [[ -n "$line" ]]; do
    n=$((n + 1))
    if [[ "$line" == *\\ ]]; then command+="${line%\\} "; continue; fi
    command+="$line"
    [[ -n "${command//[[:space:]]/}" ]] && run_command "$command" "${where%:*}:$(( ${where##*:} + n - 1 ))"
    command=""
  done <"$block"
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
require_free_ports() {
  local port
  for port in "$@"; do port_free "$port" || die "port $port is taken; the documented commands need it"; done
}

wait_ready() { # every node of the default endpoints ready within $1 seconds, while $2 lives (log $3)
  local deadline=$((SECONDS + $1))
  until statestore-cli cluster ready >/dev/null 2>&1; do
    if [[ -n "${2:-}" ]] && ! kill -0 "$2" 2>/dev/null; then
      tail -n 40 "$3" >&2
      die "the cluster's process ended before every node was ready"
    fi
    if ((SECONDS >= deadline)); then
      [[ -z "${3:-}" ]] || tail -n 40 "$3" >&2
      die "the nodes were not all ready within $1 s"
    fi
    sleep 1
  done
}

# ---- host ----------------------------------------------------------------------------------------
while read -r block; do run_block "$block"; done < <(blocks_of host)

# ---- compose ---------------------------------------------------------------------------------------
if [[ -z "$real_docker" ]]; then
  die "docker is missing; the Compose commands of README.md need it"
fi
require_free_ports 1883 7401 7402 7403 9090
printf '{"retries": 3}\n' >"$work/config.json" # what `set --file config.json` writes
while read -r block; do
  command="$(tr '\n' ' ' <"$block")"
  echo "== $(cat "$block.where") (in the background until every node is ready)"
  echo "\$ $command"
  (cd "$work" && exec bash -c "$command") >"$scratch/compose-up.log" 2>&1 &
  up_pid=$!
  background+=("$up_pid")
  # Building the images may compile the workspace first.
  wait_ready 2400 "$up_pid" "$scratch/compose-up.log"
  echo "every node ready"
done < <(blocks_of compose-up)
while read -r block; do run_block "$block"; done < <(blocks_of compose)
[[ "$(statestore-cli get greeting)" == hello ]] || die "greeting did not read back as hello"
while read -r block; do run_block "$block"; done < <(blocks_of compose-last)
# `docker compose down` ended the foreground `up`.
for _ in $(seq 1 60); do kill -0 "$up_pid" 2>/dev/null || break; sleep 1; done
! kill -0 "$up_pid" 2>/dev/null || die "docker compose up still runs after docker compose down"
[[ -z "$(docker volume ls -q --filter "name=${COMPOSE_PROJECT_NAME}_")" ]] \
  || die "docker compose down -v left volumes behind"

# ---- local -------------------------------------------------------------------------------------------
require_free_ports 1883 7401 7402 7403 7404
echo "\$ ./cluster/local.sh up"
(cd "$work" && ./cluster/local.sh up)
wait_ready 60
statestore-cli set docs-check/backup kept >/dev/null
while read -r block; do run_block "$block"; done < <(blocks_of local-backup)
[[ "$(statestore-cli get docs-check/backup)" == kept ]] || die "the restored cluster does not hold the key saved before"
while read -r block; do run_block "$block"; done < <(blocks_of local-members)
members="$(statestore-cli --endpoint http://127.0.0.1:7401 --json cluster members)"
voters="$(python3 -c 'import json, sys; print(*sorted(v["id"] for v in json.load(sys.stdin)["voters"]))' <<<"$members")"
[[ "$voters" == "1 3 4" ]] || die "after the membership example the voters are not 1, 3, 4: $members"
statestore-cli --timeout 10 set docs-check/after-membership served >/dev/null \
  || die "the cluster of voters 1, 3, 4 did not serve a write within 10 s"
echo "\$ ./cluster/local.sh down"
(cd "$work" && ./cluster/local.sh down)

# ---- options -----------------------------------------------------------------------------------------
while read -r block; do
  echo "== $(cat "$block.where")"
  while read -r line; do
    line="${line%%#*}"
    [[ "$line" == "bash benches/compare.sh"* ]] || continue
    read -r -a words <<<"${line#bash benches/compare.sh}"
    mode=sweep
    [[ "${words[0]:-}" =~ ^[a-z]+$ ]] && mode="${words[0]}"
    help="$(cd "$work" && COMPARE_SKIP_BUILD=1 bash benches/compare.sh "$mode" --help 2>&1)" \
      || die "bash benches/compare.sh $mode --help failed: $help"
    for word in "${words[@]}"; do
      [[ "$word" == --* && "$word" != --help ]] || continue
      grep -q -- "$word" <<<"$help" || die "benches/compare.sh $mode does not accept $word (docs: $line)"
    done
    echo "ok: $line"
  done <"$block"
done < <(blocks_of options)

echo "docs: result=pass"
