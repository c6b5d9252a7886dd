//! The things compared, started and stopped the same way: `echo` (the broker alone),
//! `cluster` (three state store nodes with a cluster secret), `cluster-open` (the same without
//! one, `--insecure-no-auth`), `cluster-tls` (the secret and TLS between the nodes), `etcd`
//! (three etcd members, over gRPC; `etcd-json`: the same through the JSON gateway) and `nats`
//! (three NATS servers with a replicated key-value bucket). Each target gets a fresh
//! broker (MQTT targets), fresh data directories and fresh client connections.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::broker::{self, Broker};
use crate::cluster::{self, StatestoreCluster};
use crate::echo::EchoResponder;
use crate::etcd::{EtcdCluster, EtcdJsonLoad, EtcdLoad};
use crate::load::{Op, RequestError, Requester};
use crate::mqtt_load::{MqttLoad, RequestOptions};
use crate::nats::{NatsCluster, NatsLoad};
use crate::proxy::ProxyMesh;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum TargetKind {
    Echo,
    Cluster,
    /// etcd through its gRPC API, as its users call it.
    Etcd,
    /// etcd through its v3 JSON gateway (grpc-gateway): not how its users call it; an option, to
    /// show what the gateway's translation costs.
    EtcdJson,
    Nats,
    /// The cluster without a cluster secret (`--insecure-no-auth`): only named, never a default.
    ClusterOpen,
    /// The cluster with its secret and TLS between the nodes: only named, never a default.
    ClusterTls,
}

impl TargetKind {
    /// The targets measured unless `--targets` says otherwise.
    pub const ALL: [TargetKind; 4] = [TargetKind::Echo, TargetKind::Cluster, TargetKind::Etcd, TargetKind::Nats];
    /// Every kind, `cluster-open`, `cluster-tls` and `etcd-json` (named only) included, in the
    /// order tables list them.
    pub const EVERY: [TargetKind; 7] = [
        TargetKind::Echo,
        TargetKind::Cluster,
        TargetKind::ClusterOpen,
        TargetKind::ClusterTls,
        TargetKind::Etcd,
        TargetKind::EtcdJson,
        TargetKind::Nats,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TargetKind::Echo => "echo",
            TargetKind::Cluster => "cluster",
            TargetKind::Etcd => "etcd",
            TargetKind::EtcdJson => "etcd-json",
            TargetKind::Nats => "nats",
            TargetKind::ClusterOpen => "cluster-open",
            TargetKind::ClusterTls => "cluster-tls",
        }
    }

    /// Whether the target is an etcd cluster (over either API).
    pub fn is_etcd(self) -> bool {
        matches!(self, TargetKind::Etcd | TargetKind::EtcdJson)
    }

    /// The reads a sweep measures on the target: its default GET, and its local read where a
    /// client can ask for one (etcd's serializable Range). The state store's local read
    /// (`?consistency=local`) is offered over HTTP only, not over MQTT.
    pub fn reads(self) -> &'static [Op] {
        match self {
            TargetKind::Etcd | TargetKind::EtcdJson => &[Op::Get, Op::GetLocal],
            TargetKind::Echo
            | TargetKind::Cluster
            | TargetKind::ClusterOpen
            | TargetKind::ClusterTls
            | TargetKind::Nats => &[Op::Get],
        }
    }
}

impl fmt::Display for TargetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where the programs are and how requests are made: the same for every target of a run.
pub struct Setup {
    pub mosquitto: PathBuf,
    pub nodes_binary: PathBuf,
    pub etcd_binary: PathBuf,
    pub nats_binary: PathBuf,
    pub request: RequestOptions,
    /// Data directories (removed at the end of the run).
    pub scratch: PathBuf,
    /// Process logs (kept in the output directory).
    pub logs: PathBuf,
}

/// The client side of a target.
pub enum Client {
    Mqtt(MqttLoad),
    Etcd(EtcdLoad),
    EtcdJson(EtcdJsonLoad),
    Nats(NatsLoad),
}

impl Requester for Client {
    async fn set(&self, slot: usize, key: Vec<u8>, value: &[u8]) -> Result<(), RequestError> {
        match self {
            Client::Mqtt(load) => load.set(slot, key, value).await,
            Client::Etcd(load) => load.set(slot, key, value).await,
            Client::EtcdJson(load) => load.set(slot, key, value).await,
            Client::Nats(load) => load.set(slot, key, value).await,
        }
    }

    async fn get(&self, slot: usize, key: Vec<u8>, local: bool) -> Result<(), RequestError> {
        match self {
            Client::Mqtt(load) => load.get(slot, key, local).await,
            Client::Etcd(load) => load.get(slot, key, local).await,
            Client::EtcdJson(load) => load.get(slot, key, local).await,
            Client::Nats(load) => load.get(slot, key, local).await,
        }
    }
}

/// A started target. Fields drop in order: clients first, then servers, then the broker.
pub struct Target {
    pub kind: TargetKind,
    pub client: Arc<Client>,
    echo: Option<EchoResponder>,
    pub cluster: Option<StatestoreCluster>,
    pub etcd: Option<EtcdCluster>,
    pub nats: Option<NatsCluster>,
    pub proxies: Option<ProxyMesh>,
    broker: Option<Broker>,
}

impl Target {
    /// Starts `kind` with clients for up to `slots` requests in flight. With `partitionable`
    /// (cluster only), nodes reach each other through a [`ProxyMesh`] that can cut them apart.
    pub async fn start(kind: TargetKind, setup: &Setup, slots: usize, partitionable: bool) -> anyhow::Result<Target> {
        let dir = tempfile::Builder::new().prefix(kind.name()).tempdir_in(&setup.scratch)?.keep();
        match kind {
            TargetKind::Echo => {
                let broker = broker::start(&setup.mosquitto, &dir, &setup.logs).await?;
                let echo = EchoResponder::start(broker.port, &dir, &setup.logs).await?;
                let client = MqttLoad::connect(broker.port, slots, setup.request).await?;
                Ok(Target {
                    kind,
                    client: Arc::new(Client::Mqtt(client)),
                    echo: Some(echo),
                    cluster: None,
                    etcd: None,
                    nats: None,
                    proxies: None,
                    broker: Some(broker),
                })
            }
            TargetKind::Cluster | TargetKind::ClusterOpen | TargetKind::ClusterTls => {
                let auth = match kind {
                    TargetKind::ClusterOpen => cluster::Auth::Open,
                    TargetKind::ClusterTls => cluster::Auth::Tls,
                    _ => cluster::Auth::Secret,
                };
                let broker = broker::start(&setup.mosquitto, &dir, &setup.logs).await?;
                let ports = cluster::free_ports();
                let by_id: BTreeMap<u64, u16> = ports.iter().enumerate().map(|(i, p)| (i as u64 + 1, *p)).collect();
                let proxies = if partitionable { Some(ProxyMesh::start(&by_id).await?) } else { None };
                let routes = by_id.keys().map(|id| proxies.as_ref().map(|mesh| mesh.routes_of(*id))).collect();
                let nodes =
                    StatestoreCluster::start(&setup.nodes_binary, broker.port, &ports, routes, &dir, &setup.logs, auth)
                        .await?;
                let client = MqttLoad::connect(broker.port, slots, setup.request).await?;
                Ok(Target {
                    kind,
                    client: Arc::new(Client::Mqtt(client)),
                    echo: None,
                    cluster: Some(nodes),
                    etcd: None,
                    nats: None,
                    proxies,
                    broker: Some(broker),
                })
            }
            TargetKind::Etcd | TargetKind::EtcdJson => {
                let etcd = EtcdCluster::start(&setup.etcd_binary, &dir, &setup.logs).await?;
                let leader = etcd.leader_url().await?;
                let client = match kind {
                    TargetKind::Etcd => Client::Etcd(EtcdLoad::connect(&leader, slots, setup.request.timeout).await?),
                    _ => Client::EtcdJson(EtcdJsonLoad::new(&leader, slots, setup.request.timeout)?),
                };
                Ok(Target {
                    kind,
                    client: Arc::new(client),
                    echo: None,
                    cluster: None,
                    etcd: Some(etcd),
                    nats: None,
                    proxies: None,
                    broker: None,
                })
            }
            TargetKind::Nats => {
                let nats = NatsCluster::start(&setup.nats_binary, &dir, &setup.logs).await?;
                let client = NatsLoad::connect(&nats.client_ports(), slots, setup.request.timeout).await?;
                Ok(Target {
                    kind,
                    client: Arc::new(Client::Nats(client)),
                    echo: None,
                    cluster: None,
                    etcd: None,
                    nats: Some(nats),
                    proxies: None,
                    broker: None,
                })
            }
        }
    }

    /// The port of the target's broker (MQTT targets).
    pub fn broker_port(&self) -> Option<u16> {
        self.broker.as_ref().map(|broker| broker.port)
    }

    /// The process id of the target's broker (MQTT targets).
    pub fn broker_pid(&self) -> Option<u32> {
        self.broker.as_ref().map(|broker| broker.process.pid())
    }

    /// Every process whose CPU counts for this target, the load generator ("bench") first.
    pub fn processes(&self) -> Vec<(String, u32)> {
        let mut processes = vec![("bench".to_string(), std::process::id())];
        if let Some(broker) = &self.broker {
            processes.push(("broker".to_string(), broker.process.pid()));
        }
        if let Some(echo) = &self.echo {
            processes.push(("echo".to_string(), echo.process.pid()));
        }
        if let Some(cluster) = &self.cluster {
            processes.extend(cluster.processes());
        }
        if let Some(etcd) = &self.etcd {
            processes.extend(etcd.processes());
        }
        if let Some(nats) = &self.nats {
            processes.extend(nats.processes());
        }
        processes
    }

    /// Fails when a process of the target has died: its numbers would mean nothing.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(broker) = &mut self.broker {
            broker.process.check_running()?;
        }
        if let Some(echo) = &mut self.echo {
            echo.process.check_running()?;
        }
        if let Some(cluster) = &mut self.cluster {
            cluster.check_running()?;
        }
        if let Some(etcd) = &mut self.etcd {
            etcd.check_running()?;
        }
        if let Some(nats) = &mut self.nats {
            nats.check_running()?;
        }
        Ok(())
    }

    /// Resident memory of the servers (nodes or members) and of the broker, in MiB.
    pub fn rss_mib(&self) -> Vec<(String, Option<f64>)> {
        let mut rss = Vec::new();
        if let Some(cluster) = &self.cluster {
            rss.extend(cluster.rss_mib());
        }
        if let Some(etcd) = &self.etcd {
            rss.extend(etcd.rss_mib());
        }
        if let Some(nats) = &self.nats {
            rss.extend(nats.rss_mib());
        }
        if let Some(broker) = &self.broker {
            rss.push(("broker".to_string(), crate::processes::rss_mib(broker.process.pid())));
        }
        rss
    }
}
