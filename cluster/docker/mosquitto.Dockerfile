# Mosquitto 2 with the state store's broker settings (cluster/docker/mosquitto.conf). The build
# context is the repository root. cluster/images.sh builds the same tag from the Debian package
# when no registry is reachable.
# No registry here? Then this FROM cannot be pulled: build the images from this machine's own
# binaries and Debian packages instead, with `bash cluster/images.sh`, then `docker compose up`
# again (`docker compose down -v` removes the volumes this attempt created).
ARG NO_REGISTRY="if the pull below fails, no registry is reachable: bash cluster/images.sh && docker compose up (docker compose down -v removes the volumes this attempt created)"
FROM eclipse-mosquitto:2
COPY cluster/docker/mosquitto.conf /mosquitto/config/mosquitto.conf
EXPOSE 1883
