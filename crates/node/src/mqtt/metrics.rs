//! Metrics of the MQTT front end, registered in the node's registry.

use prometheus::{
    exponential_buckets, Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

#[derive(Clone)]
pub struct FrontEndMetrics {
    /// By command (`SET`, `GET`, ..., `INVALID`) and result (`ok`, `not_applied`, `error`).
    pub requests: IntCounterVec,
    pub request_seconds: HistogramVec,
    pub dropped: IntCounterVec,
    pub dedup_hits: IntCounter,
    pub shadow_size: IntGauge,
    pub shadow_takeovers: IntCounter,
    pub notifications_sent: IntCounter,
    pub notifications_failed: IntCounter,
    pub broker_connected: IntGauge,
    pub broker_reconnects: IntCounter,
    /// The broker's round trip to this node: its last probe, or the one outstanding for longer.
    pub broker_round_trip: Gauge,
}

fn register<T: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: T) -> prometheus::Result<T> {
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

impl FrontEndMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<FrontEndMetrics> {
        let counter = |name: &str, help: &str| register(registry, IntCounter::new(name, help)?);
        let gauge = |name: &str, help: &str| register(registry, IntGauge::new(name, help)?);
        Ok(FrontEndMetrics {
            requests: register(
                registry,
                IntCounterVec::new(
                    Opts::new("statestore_requests_total", "Requests answered by this node, by command and result"),
                    &["command", "result"],
                )?,
            )?,
            request_seconds: register(
                registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        "statestore_request_duration_seconds",
                        "From receiving a request to publishing its response, by command",
                    )
                    .buckets(exponential_buckets(0.0001, 2.0, 18)?),
                    &["command"],
                )?,
            )?,
            dropped: register(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "statestore_requests_dropped_total",
                        "Requests acknowledged without an answer, by reason",
                    ),
                    &["reason"],
                )?,
            )?,
            dedup_hits: counter(
                "statestore_dedup_hits_total",
                "Requests answered from the dedup table (redeliveries and retries)",
            )?,
            shadow_size: gauge("statestore_shadow_requests", "Requests a follower holds until it sees them applied")?,
            shadow_takeovers: counter(
                "statestore_shadow_takeovers_total",
                "Shadowed requests this node executed after becoming leader",
            )?,
            notifications_sent: counter(
                "statestore_notifications_sent_total",
                "Key notifications the broker accepted",
            )?,
            notifications_failed: counter(
                "statestore_notifications_failed_total",
                "Key notifications the broker refused or that were lost with the connection (sent again)",
            )?,
            broker_connected: gauge("statestore_broker_connected", "1 while connected to the MQTT broker")?,
            broker_reconnects: counter("statestore_broker_reconnects_total", "Times the broker connection was lost")?,
            broker_round_trip: register(
                registry,
                Gauge::new(
                    "statestore_broker_round_trip_seconds",
                    "How long the broker took to acknowledge this node's last round-trip probe",
                )?,
            )?,
        })
    }
}
