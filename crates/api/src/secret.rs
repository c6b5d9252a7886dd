//! The cluster secret: a shared token that nodes send each other with every Raft RPC, and that
//! membership changes and `POST /v1/command` must carry (`Authorization: Bearer <secret>`). It is
//! read from a file or an environment variable, never from the command line, where any local
//! user could read it in the process list.

use std::fmt;
use std::path::Path;

/// The secret itself, in the environment.
pub const SECRET_ENV: &str = "STATESTORE_CLUSTER_SECRET";
/// A file holding the secret, in the environment (the same as `--cluster-secret-file`).
pub const SECRET_FILE_ENV: &str = "STATESTORE_CLUSTER_SECRET_FILE";
/// The shortest secret accepted, in bytes.
pub const MIN_SECRET_BYTES: usize = 16;
/// The longest secret accepted, in bytes.
pub const MAX_SECRET_BYTES: usize = 1024;

/// A checked cluster secret. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSecret(String);

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

impl ClusterSecret {
    /// Checks `text` (surrounding whitespace, such as a file's last newline, is dropped): 16 to
    /// 1024 visible ASCII characters, so that it travels unchanged in an HTTP header.
    pub fn new(text: &str) -> Result<ClusterSecret, String> {
        let secret = text.trim();
        if secret.len() < MIN_SECRET_BYTES || secret.len() > MAX_SECRET_BYTES {
            return Err(format!(
                "the cluster secret must be {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes long, not {}",
                secret.len()
            ));
        }
        if !secret.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the cluster secret must be visible ASCII characters (no spaces or control characters)".into());
        }
        Ok(ClusterSecret(secret.to_string()))
    }

    /// Reads and checks the secret in the file at `path`.
    pub fn from_file(path: &Path) -> Result<ClusterSecret, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading the cluster secret file {}: {e}", path.display()))?;
        ClusterSecret::new(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Reads the secret in the file at `path`; where no file is, first creates one with a new
    /// random secret (32 bytes of the system's random source, in hex) readable by its owner only.
    /// Processes that create it at once (nodes sharing a volume) all end with the same secret:
    /// each writes its own temporary file beside `path` and links it there, which fails for all
    /// but the first.
    pub fn read_or_create(path: &Path) -> Result<ClusterSecret, String> {
        use std::io::{Read, Write};
        use std::os::unix::fs::OpenOptionsExt;
        if !path.exists() {
            let failed = |what: &str, e: std::io::Error| {
                format!("creating the cluster secret file {}: {what}: {e}", path.display())
            };
            let mut random = [0u8; 32];
            std::fs::File::open("/dev/urandom")
                .and_then(|mut source| source.read_exact(&mut random))
                .map_err(|e| failed("reading /dev/urandom", e))?;
            let secret: String = random.iter().map(|byte| format!("{byte:02x}")).collect();
            let name = path.file_name().map_or("cluster-secret".into(), |name| name.to_string_lossy());
            let unique = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let temporary = path.with_file_name(format!(".{name}.{}.{}", std::process::id(), unique.as_nanos()));
            let written =
                std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&temporary).and_then(
                    |mut file| {
                        file.write_all(format!("{secret}\n").as_bytes())?;
                        file.sync_all()
                    },
                );
            let linked = written.and_then(|()| match std::fs::hard_link(&temporary, path) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
                _ => Ok(()),
            });
            let _ = std::fs::remove_file(&temporary);
            linked.map_err(|e| failed(&format!("writing {}", temporary.display()), e))?;
        }
        ClusterSecret::from_file(path)
    }

    /// The secret named by the environment: `STATESTORE_CLUSTER_SECRET`, else the file named by
    /// `STATESTORE_CLUSTER_SECRET_FILE`; `None` when neither is set (or both are empty).
    pub fn from_env() -> Result<Option<ClusterSecret>, String> {
        if let Some(text) = std::env::var(SECRET_ENV).ok().filter(|text| !text.is_empty()) {
            return ClusterSecret::new(&text).map(Some).map_err(|e| format!("{SECRET_ENV}: {e}"));
        }
        match std::env::var(SECRET_FILE_ENV).ok().filter(|path| !path.is_empty()) {
            Some(path) => ClusterSecret::from_file(Path::new(&path)).map(Some),
            None => Ok(None),
        }
    }

    /// The value of the `Authorization` header that carries it.
    pub fn authorization(&self) -> String {
        format!("Bearer {}", self.0)
    }

    /// Whether an `Authorization` header value carries this secret, compared in time that does
    /// not depend on where the first difference is.
    pub fn authorizes(&self, header: &[u8]) -> bool {
        let expected = self.authorization();
        let expected = expected.as_bytes();
        let mut difference = u8::from(header.len() != expected.len());
        for (i, byte) in expected.iter().enumerate() {
            difference |= byte ^ header.get(i).copied().unwrap_or(0);
        }
        difference == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_checked_trimmed_compared_and_never_printed() {
        assert!(ClusterSecret::new("short").unwrap_err().contains("16 to 1024 bytes"));
        assert!(ClusterSecret::new("sixteen bytes ok").unwrap_err().contains("visible ASCII"));
        let secret = ClusterSecret::new("0123456789abcdef\n").unwrap();
        assert_eq!(secret.authorization(), "Bearer 0123456789abcdef");
        assert!(secret.authorizes(b"Bearer 0123456789abcdef"));
        assert!(!secret.authorizes(b"Bearer 0123456789abcdeg"));
        assert!(!secret.authorizes(b"Bearer 0123456789abcdef0"));
        assert!(!secret.authorizes(b"Bearer 0123456789abcde"));
        assert!(!secret.authorizes(b""));
        assert_eq!(format!("{secret:?}"), "ClusterSecret(..)");
    }
}
