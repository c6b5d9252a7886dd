# shellcheck shell=bash
# Sourced by the scripts that drive docker-compose.yml: `compose ARGS...` runs `docker compose`
# (v2) when the plugin is there, else docker-compose (v1).
compose() {
  if docker compose version >/dev/null 2>&1; then docker compose "$@"; else docker-compose "$@"; fi
}
