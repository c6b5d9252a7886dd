//! TLS clients with rustls (ring), to the broker or to the nodes' HTTPS port: the CA file's
//! certificates or the system roots, and an optional client certificate for mutual TLS. Used
//! by the node and the CLI.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

/// Which CA to trust (the system roots when `None`) and an optional client identity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsConfig {
    pub ca: Option<PathBuf>,
    /// A PEM certificate chain and its PEM private key.
    pub client_auth: Option<(PathBuf, PathBuf)>,
}

/// Builds the rustls client configuration, reading every file now so that a wrong path or a
/// key that does not match its certificate fails before any connection is tried.
pub fn client_config(tls: &TlsConfig) -> anyhow::Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    match &tls.ca {
        Some(ca) => {
            for cert in read_certs(ca)? {
                roots.add(cert).with_context(|| format!("adding a CA certificate from {}", ca.display()))?;
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(native.certs);
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots);
    Ok(match &tls.client_auth {
        Some((cert, key)) => builder
            .with_client_auth_cert(read_certs(cert)?, read_private_key(key)?)
            .context("the client certificate and key do not match")?,
        None => builder.with_no_client_auth(),
    })
}

/// The PEM certificates in the file at `path`; none is an error.
pub fn read_certs(path: &Path) -> anyhow::Result<Vec<rustls::pki_types::CertificateDer<'static>>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let certs = rustls_pemfile::certs(&mut BufReader::new(file))
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("reading certificates from {}", path.display()))?;
    anyhow::ensure!(!certs.is_empty(), "no certificate in {}", path.display());
    Ok(certs)
}

/// The first PEM private key in the file at `path`.
pub fn read_private_key(path: &Path) -> anyhow::Result<rustls::pki_types::PrivateKeyDer<'static>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    rustls_pemfile::private_key(&mut BufReader::new(file))
        .with_context(|| format!("reading {}", path.display()))?
        .with_context(|| format!("no private key in {}", path.display()))
}
