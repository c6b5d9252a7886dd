# Mosquitto 2 with the state store's broker settings (cluster/docker/mosquitto.conf). The build
# context is the repository root. cluster/images.sh builds the same tag from the Debian package
# when no registry is reachable.
FROM eclipse-mosquitto:2
COPY cluster/docker/mosquitto.conf /mosquitto/config/mosquitto.conf
EXPOSE 1883
