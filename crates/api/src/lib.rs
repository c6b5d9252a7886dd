//! The nodes' HTTP API as both its server (the node) and its clients (`statestore-cli`, tools)
//! see it: the routes, the JSON bodies of requests and answers, the error body, the cluster
//! secret that guards the routes and the TLS settings of HTTPS between them. Nothing here does
//! I/O but reading the PEM and secret files it is given.
//!
//! - [`routes`]: every path and the request headers of `/v1/command`.
//! - [`body`]: request and response bodies, and [`body::ErrorBody`], every error's body.
//! - [`secret`]: the cluster secret.
//! - [`tls`]: rustls client configurations (CA file or system roots, optional client identity).

pub mod body;
pub mod routes;
pub mod secret;
pub mod tls;

pub use secret::ClusterSecret;
pub use tls::TlsConfig;

/// A node's id in the cluster: a positive integer, never reused.
pub type NodeId = u64;
