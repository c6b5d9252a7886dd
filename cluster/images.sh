#!/usr/bin/env bash
# Builds the images docker-compose.yml names, with the same tags, without pulling anything: each
# image starts FROM scratch and holds binaries from this machine with the shared libraries `ldd`
# lists for them. For machines without registry access; with access, `docker compose build`
# builds them from cluster/docker/ instead.
#
#   bash cluster/images.sh [--no-build] [--keep-debuginfo] [node] [mosquitto] [prometheus]
#
# No image names: all three. Then `docker compose up -d` (or `docker-compose up -d`) uses these
# images as they are. The sources of each image:
#   node        $CARGO_TARGET_DIR/release/statestore and statestore-cli (CARGO_TARGET_DIR defaults
#               to ~/.cache/statestore-target), built first with `cargo build --release --workspace
#               --bins --locked` unless --no-build; runs as uid 10001 with /data owned by it.
#               Debug info is stripped (500 MB of the node's 525 MB) unless --keep-debuginfo.
#   mosquitto   the Debian package's /usr/sbin/mosquitto and cluster/docker/mosquitto.conf
#   prometheus  the Debian package's /usr/bin/prometheus and its web assets, cluster/prometheus.yml
#               and cluster/alerts.yml
# Missing Debian packages are named with the command that installs them; nothing is installed.
# The tags follow docker-compose.yml, including STATESTORE_IMAGE_REPOSITORY/STATESTORE_IMAGE_TAG.
# Builds use the classic builder unless DOCKER_BUILDKIT says otherwise.
set -euo pipefail
umask 022
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/statestore-target}"
export DOCKER_BUILDKIT="${DOCKER_BUILDKIT:-0}"
release="$CARGO_TARGET_DIR/release"

die() { echo "images.sh: $*" >&2; exit 1; }

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

# shellcheck source=cluster/compose.sh
source cluster/compose.sh

build=1
strip_debug=1
kinds=()
while (($#)); do
  case "$1" in
    --no-build) build=0 ;;
    --keep-debuginfo) strip_debug=0 ;;
    node | mosquitto | prometheus) kinds+=("$1") ;;
    -h | --help) usage ;;
    *) echo "images.sh: unknown argument $1" >&2; usage ;;
  esac
  shift
done
((${#kinds[@]})) || kinds=(node mosquitto prometheus)

wanted() { [[ " ${kinds[*]} " == *" $1 "* ]]; }

command -v docker >/dev/null || die "docker is missing (apt-get install -y docker.io)"
docker info >/dev/null 2>&1 || die "cannot reach the Docker daemon (is it running, may this user use it?)"
docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null \
  || die "neither 'docker compose' nor docker-compose is installed (apt-get install -y docker-compose)"

# The image names of docker-compose.yml, as "<kind> <image>" lines; the kind follows from the
# service's Dockerfile.
image_names() {
  compose config | awk '
    /^[^ ]/ { in_services = ($0 == "services:"); next }
    !in_services { next }
    /^  [^ ]/ { if (image != "") print kind, image; image = ""; kind = ""; next }
    /^    image:/ { image = $2 }
    /^      dockerfile:/ {
      n = split($2, parts, "/"); file = parts[n]
      kind = (file == "Dockerfile") ? "node" : file
      sub(/\.Dockerfile$/, "", kind)
    }
    END { if (image != "") print kind, image }' | sort -u
}

names="$(image_names)" || die "docker-compose.yml does not parse (see above)"
tags_of() { awk -v kind="$1" '$1 == kind { print $2 }' <<<"$names"; }
for kind in "${kinds[@]}"; do
  [[ -n "$(tags_of "$kind")" ]] || die "docker-compose.yml names no image built from cluster/docker/ for $kind"
done

# Debian packages the chosen images take binaries from.
missing=()
need_package() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed" || missing+=("$1"); }
need_package libc-bin
wanted node && ((strip_debug)) && need_package binutils
wanted mosquitto && need_package mosquitto
wanted prometheus && need_package prometheus
if ((${#missing[@]})); then
  sudo=""
  [[ "$(id -u)" -eq 0 ]] || sudo="sudo "
  die "missing Debian packages: ${missing[*]}
install them with:  ${sudo}apt-get update && ${sudo}apt-get install -y ${missing[*]}"
fi

if wanted node; then
  if ((build)); then
    command -v cargo >/dev/null || die "cargo is missing: install Rust with rustup (https://rustup.rs), or pass --no-build"
    echo "== cargo build --release --workspace --bins --locked (waits while another build holds the target dir)"
    # Always the whole workspace: one package alone resolves other features and rebuilds RocksDB.
    cargo build --release --workspace --bins --locked
  fi
  for binary in statestore statestore-cli; do
    [[ -x "$release/$binary" ]] || die "$release/$binary is missing; build it with: cargo build --release --workspace --bins --locked"
  done
fi

stage="$(mktemp -d "${TMPDIR:-/tmp}/statestore-images.XXXXXX")"
trap 'rm -rf "$stage"' EXIT

# Copies a dynamically linked program into a root file system with every library it loads
# (and the dynamic loader) at the paths ldd reports, symbolic links resolved.
add_program() {
  local rootfs="$1" source="$2" target="$3" libraries
  install -D -m 0755 "$source" "$rootfs$target"
  libraries="$(ldd "$source" 2>&1)" || { [[ "$libraries" == *"not a dynamic executable"* ]] && return 0; die "ldd $source: $libraries"; }
  if grep -q "not found" <<<"$libraries"; then
    die "$source needs libraries this machine lacks:
$(grep "not found" <<<"$libraries")"
  fi
  awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$libraries" | sort -u |
    while read -r library; do
      cp -L --parents "$library" "$rootfs"
    done
}

# What every image holds besides its programs: users, name resolution through files and DNS,
# a world-writable /tmp, and the CA bundle when this machine has one.
add_base() {
  local rootfs="$1"
  mkdir -p "$rootfs/etc" "$rootfs/tmp"
  chmod 1777 "$rootfs/tmp"
  cat >"$rootfs/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/usr/sbin/nologin
mosquitto:x:1883:1883:mosquitto:/mosquitto:/usr/sbin/nologin
statestore:x:10001:10001:statestore:/data:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
PASSWD
  cat >"$rootfs/etc/group" <<'GROUP'
root:x:0:
mosquitto:x:1883:
statestore:x:10001:
nogroup:x:65534:
GROUP
  printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
  if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
    install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
  fi
}

# Builds one image from a staged context (rootfs/ and data/ next to its Dockerfile), under every
# tag docker-compose.yml gives that kind of image.
build_image() {
  local kind="$1" context="$stage/$1" tag args=() replaced=()
  while read -r tag; do
    args+=(-t "$tag")
    replaced+=("$(docker image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)")
  done < <(tags_of "$kind")
  echo "== docker build ${args[*]} (FROM scratch, $(du -sh "$context" | cut -f1) staged)"
  docker build --pull=false "${args[@]}" "$context" >"$stage/$kind.log" 2>&1 || {
    cat "$stage/$kind.log" >&2
    die "docker build of the $kind image failed"
  }
  # Remove the images these tags named before, when they changed and no container uses them.
  local built old
  built="$(docker image inspect -f '{{.Id}}' "$(tags_of "$kind" | head -n 1)")"
  for old in "${replaced[@]}"; do
    [[ -z "$old" || "$old" == "$built" ]] || docker image rm "$old" >/dev/null 2>&1 || true
  done
}

stage_node() {
  local context="$stage/node" rootfs="$stage/node/rootfs"
  add_base "$rootfs"
  add_program "$rootfs" "$release/statestore" /usr/local/bin/statestore
  add_program "$rootfs" "$release/statestore-cli" /usr/local/bin/statestore-cli
  if ((strip_debug)); then
    # Symbols stay, so backtraces still name functions.
    objcopy --strip-debug "$rootfs/usr/local/bin/statestore"
    objcopy --strip-debug "$rootfs/usr/local/bin/statestore-cli"
  fi
  mkdir -p "$context/data" "$context/secret"
  chmod 0700 "$context/secret"
  cat >"$context/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY rootfs/ /
# A fresh named volume mounted at /data or /secret (the cluster secret the first node creates)
# takes this directory's owner, so the node can write it.
COPY --chown=10001:10001 data/ /data/
COPY --chown=10001:10001 secret/ /secret/
USER 10001:10001
ENV STATESTORE_LISTEN=0.0.0.0:7400 \
    STATESTORE_DATA_DIR=/data
EXPOSE 7400
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/statestore"]
DOCKERFILE
}

stage_mosquitto() {
  local context="$stage/mosquitto" rootfs="$stage/mosquitto/rootfs"
  add_base "$rootfs"
  add_program "$rootfs" /usr/sbin/mosquitto /usr/sbin/mosquitto
  install -D -m 0644 cluster/docker/mosquitto.conf "$rootfs/mosquitto/config/mosquitto.conf"
  mkdir -p "$context/data"
  # As in eclipse-mosquitto: started as root, Mosquitto drops privileges to user mosquitto (1883),
  # which owns the data directory.
  cat >"$context/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY rootfs/ /
COPY --chown=1883:1883 data/ /mosquitto/data/
EXPOSE 1883
ENTRYPOINT ["/usr/sbin/mosquitto"]
CMD ["-c", "/mosquitto/config/mosquitto.conf"]
DOCKERFILE
}

stage_prometheus() {
  local context="$stage/prometheus" rootfs="$stage/prometheus/rootfs"
  add_base "$rootfs"
  # The path of the official image, whose entrypoint docker-compose.yml relies on.
  add_program "$rootfs" /usr/bin/prometheus /bin/prometheus
  install -D -m 0644 cluster/prometheus.yml "$rootfs/etc/prometheus/prometheus.yml"
  install -D -m 0644 cluster/alerts.yml "$rootfs/etc/prometheus/alerts.yml"
  # Debian's build serves its web UI from here (links into /usr/share/javascript); the time zone
  # database beside moment-timezone's bundled scripts is 200 MB the UI never loads.
  if [[ -d /usr/share/prometheus/web ]]; then
    mkdir -p "$rootfs/usr/share/prometheus"
    tar -C /usr/share/prometheus -chf - --exclude='web/static/moment-timezone/data' web |
      tar -C "$rootfs/usr/share/prometheus" -xf -
  fi
  mkdir -p "$context/data"
  cat >"$context/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY rootfs/ /
COPY --chown=65534:65534 data/ /prometheus/
USER 65534:65534
EXPOSE 9090
WORKDIR /prometheus
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
DOCKERFILE
}

# The programs start in their image: every library they need is there.
smoke_test() {
  local kind="$1" tag output
  tag="$(tags_of "$kind" | head -n 1)"
  case "$kind" in
    node)
      output="$(docker run --rm --pull never --entrypoint /usr/local/bin/statestore "$tag" --version 2>&1)" &&
        docker run --rm --pull never --entrypoint /usr/local/bin/statestore-cli "$tag" --help >/dev/null 2>&1 ;;
    mosquitto)
      # `mosquitto -h` prints its usage and exits 3.
      output="$(docker run --rm --pull never "$tag" -h 2>&1 | head -n 1)"
      [[ "$output" == mosquitto* ]] ;;
    # The whole output first: `| head -n 1` could end the client by SIGPIPE (exit 141).
    prometheus) output="$(docker run --rm --pull never "$tag" --version 2>&1)" && output="${output%%$'\n'*}" ;;
  esac || die "the $kind image does not start: $output"
  echo "   $tag: $output"
}

for kind in "${kinds[@]}"; do
  "stage_$kind"
  build_image "$kind"
  smoke_test "$kind"
done

echo "built: $(for kind in "${kinds[@]}"; do tags_of "$kind"; done | tr '\n' ' ')"
if docker compose version >/dev/null 2>&1; then up="docker compose up -d"; else up="docker-compose up -d"; fi
echo "start the cluster with:  $up"
