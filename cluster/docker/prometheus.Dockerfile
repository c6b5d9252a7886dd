# Prometheus scraping the three nodes of docker-compose.yml (cluster/prometheus.yml) with the
# alerting rules of cluster/alerts.yml. The build context is the repository root.
# cluster/images.sh builds the same tag from the Debian package when no registry is reachable.
ARG PROMETHEUS_IMAGE=prom/prometheus:v2.53.0
FROM ${PROMETHEUS_IMAGE}
COPY cluster/prometheus.yml cluster/alerts.yml /etc/prometheus/
EXPOSE 9090
