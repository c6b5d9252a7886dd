//! The backup file of a cluster's keys (`statestore-cli snapshot save` / `restore`): every key
//! with its value, version, fencing token and deadline, as one consistent read saw them.
//!
//! Layout: [`MAGIC`], then one frame per key, then an end frame with the number of keys, the log
//! index the read saw applied, and the CRC-32 of every byte before the CRC. All integers
//! big-endian.
//!
//! ```text
//! key frame: 0x01  u32 key-len key  u32 value-len value  u16 len version
//!            u8 has-token [u16 len token]  u8 has-deadline [u64 deadline-ms]
//! end frame: 0x02  u64 keys  u64 applied-index  u32 crc32
//! ```
//!
//! A restore sends key frames, in chunks, to the new cluster's leader.

use std::io::Read;

use serde::{Deserialize, Serialize};

use crate::hlc::Hlc;

/// The first bytes of every backup file.
pub const MAGIC: &[u8] = b"STATESTORE-BACKUP 1\n";
const KEY_FRAME: u8 = 1;
const END_FRAME: u8 = 2;

/// One key as it was backed up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupKey {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    pub version: Hlc,
    pub fencing_token: Option<Hlc>,
    /// When the key expires (ms since the epoch), from `PX`.
    pub expires_at: Option<u64>,
}

/// What the end frame says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackupEnd {
    pub keys: u64,
    pub applied_index: u64,
}

/// Why a backup cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("not a statestore backup (it does not start with {:?})", String::from_utf8_lossy(MAGIC))]
    NotABackup,
    #[error("the backup is truncated: it ends before its end frame")]
    Truncated,
    #[error("the backup is damaged: {0}")]
    Damaged(String),
    #[error("the backup is damaged: its checksum is {found:08x}, its end frame says {expected:08x}")]
    Checksum { expected: u32, found: u32 },
    #[error("reading the backup: {0}")]
    Io(#[from] std::io::Error),
}

/// Appends the key frame of `key` to `out`.
pub fn encode_key(key: &BackupKey, out: &mut Vec<u8>) {
    let hlc = |out: &mut Vec<u8>, hlc: &Hlc| {
        let text = hlc.to_string();
        out.extend_from_slice(&(text.len() as u16).to_be_bytes());
        out.extend_from_slice(text.as_bytes());
    };
    out.push(KEY_FRAME);
    out.extend_from_slice(&(key.key.len() as u32).to_be_bytes());
    out.extend_from_slice(&key.key);
    out.extend_from_slice(&(key.value.len() as u32).to_be_bytes());
    out.extend_from_slice(&key.value);
    hlc(out, &key.version);
    match &key.fencing_token {
        Some(token) => {
            out.push(1);
            hlc(out, token);
        }
        None => out.push(0),
    }
    match key.expires_at {
        Some(deadline) => {
            out.push(1);
            out.extend_from_slice(&deadline.to_be_bytes());
        }
        None => out.push(0),
    }
}

/// Writes a backup: [`MAGIC`], the key frames pushed, the end frame.
pub struct BackupWriter<W: std::io::Write> {
    out: W,
    crc: crc32fast::Hasher,
    keys: u64,
    frame: Vec<u8>,
}

impl<W: std::io::Write> BackupWriter<W> {
    pub fn new(mut out: W) -> std::io::Result<BackupWriter<W>> {
        out.write_all(MAGIC)?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(MAGIC);
        Ok(BackupWriter { out, crc, keys: 0, frame: Vec::new() })
    }

    pub fn push(&mut self, key: &BackupKey) -> std::io::Result<()> {
        self.frame.clear();
        encode_key(key, &mut self.frame);
        self.crc.update(&self.frame);
        self.keys += 1;
        self.out.write_all(&self.frame)
    }

    /// How many keys were pushed.
    pub fn keys(&self) -> u64 {
        self.keys
    }

    /// Writes the end frame and returns the writer.
    pub fn finish(mut self, applied_index: u64) -> std::io::Result<W> {
        let mut end = vec![END_FRAME];
        end.extend_from_slice(&self.keys.to_be_bytes());
        end.extend_from_slice(&applied_index.to_be_bytes());
        self.crc.update(&end);
        let crc = self.crc.finalize();
        end.extend_from_slice(&crc.to_be_bytes());
        self.out.write_all(&end)?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// One frame of a backup as read.
pub enum Frame {
    /// A key, and its frame's bytes as they were in the file.
    Key(BackupKey, Vec<u8>),
    End(BackupEnd),
}

/// Reads a backup frame by frame, checking the checksum and the count at the end frame.
pub struct BackupReader<R: Read> {
    input: R,
    crc: crc32fast::Hasher,
    keys: u64,
    ended: bool,
}

impl<R: Read> BackupReader<R> {
    pub fn new(mut input: R) -> Result<BackupReader<R>, BackupError> {
        let mut magic = vec![0; MAGIC.len()];
        input.read_exact(&mut magic).map_err(|_| BackupError::NotABackup)?;
        if magic != MAGIC {
            return Err(BackupError::NotABackup);
        }
        let mut crc = crc32fast::Hasher::new();
        crc.update(MAGIC);
        Ok(BackupReader { input, crc, keys: 0, ended: false })
    }

    /// The next frame; after the end frame, `None`.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, BackupError> {
        if self.ended {
            return Ok(None);
        }
        let mut tag = [0u8; 1];
        if self.input.read(&mut tag)? == 0 {
            return Err(BackupError::Truncated);
        }
        match tag[0] {
            KEY_FRAME => {
                let mut frame = vec![KEY_FRAME];
                let key = read_key_body(&mut TeeReader { input: &mut self.input, copy: &mut frame })?;
                self.crc.update(&frame);
                self.keys += 1;
                Ok(Some(Frame::Key(key, frame)))
            }
            END_FRAME => {
                let mut end = [0u8; 20];
                self.input.read_exact(&mut end).map_err(|_| BackupError::Truncated)?;
                let keys = u64::from_be_bytes(end[..8].try_into().expect("8 bytes"));
                let applied_index = u64::from_be_bytes(end[8..16].try_into().expect("8 bytes"));
                let expected = u32::from_be_bytes(end[16..].try_into().expect("4 bytes"));
                self.crc.update(&[END_FRAME]);
                self.crc.update(&end[..16]);
                let found = self.crc.clone().finalize();
                if found != expected {
                    return Err(BackupError::Checksum { expected, found });
                }
                if keys != self.keys {
                    return Err(BackupError::Damaged(format!(
                        "it holds {} keys, its end frame says {keys}",
                        self.keys
                    )));
                }
                if self.input.read(&mut [0u8; 1])? != 0 {
                    return Err(BackupError::Damaged("bytes follow its end frame".into()));
                }
                self.ended = true;
                Ok(Some(Frame::End(BackupEnd { keys, applied_index })))
            }
            other => Err(BackupError::Damaged(format!("a frame of unknown kind {other}"))),
        }
    }
}

/// Reads from `input` and keeps a copy of what it read.
struct TeeReader<'a, R: Read> {
    input: &'a mut R,
    copy: &'a mut Vec<u8>,
}

impl<R: Read> Read for TeeReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.input.read(buf)?;
        self.copy.extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

/// Parses a run of key frames (what a restore sends in one chunk).
pub fn decode_keys(mut bytes: &[u8]) -> Result<Vec<BackupKey>, BackupError> {
    let mut keys = Vec::new();
    while let Some((&tag, rest)) = bytes.split_first() {
        if tag != KEY_FRAME {
            return Err(BackupError::Damaged(format!("a frame of kind {tag} among key frames")));
        }
        bytes = rest;
        keys.push(read_key_body(&mut bytes)?);
    }
    Ok(keys)
}

/// The largest key or value a frame may announce: the store's own limits are far below it.
const MAX_FIELD: usize = 512 << 20;

fn read_key_body(input: &mut impl Read) -> Result<BackupKey, BackupError> {
    fn exact<const N: usize>(input: &mut impl Read) -> Result<[u8; N], BackupError> {
        let mut buf = [0u8; N];
        input.read_exact(&mut buf).map_err(|_| BackupError::Truncated)?;
        Ok(buf)
    }
    fn bytes(input: &mut impl Read, len: usize) -> Result<Vec<u8>, BackupError> {
        if len > MAX_FIELD {
            return Err(BackupError::Damaged(format!("a field of {len} bytes")));
        }
        let mut buf = vec![0; len];
        input.read_exact(&mut buf).map_err(|_| BackupError::Truncated)?;
        Ok(buf)
    }
    fn hlc(input: &mut impl Read) -> Result<Hlc, BackupError> {
        let len = usize::from(u16::from_be_bytes(exact::<2>(input)?));
        let text = bytes(input, len)?;
        std::str::from_utf8(&text)
            .ok()
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| BackupError::Damaged(format!("{:?} is not a version", String::from_utf8_lossy(&text))))
    }
    let key_len = u32::from_be_bytes(exact::<4>(input)?) as usize;
    let key = bytes(input, key_len)?;
    if key.is_empty() {
        return Err(BackupError::Damaged("an empty key".into()));
    }
    let value_len = u32::from_be_bytes(exact::<4>(input)?) as usize;
    let value = bytes(input, value_len)?;
    let version = hlc(input)?;
    let fencing_token = match exact::<1>(input)?[0] {
        0 => None,
        1 => Some(hlc(input)?),
        other => return Err(BackupError::Damaged(format!("a token flag {other}"))),
    };
    let expires_at = match exact::<1>(input)?[0] {
        0 => None,
        1 => Some(u64::from_be_bytes(exact::<8>(input)?)),
        other => return Err(BackupError::Damaged(format!("a deadline flag {other}"))),
    };
    Ok(BackupKey { key, value, version, fencing_token, expires_at })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<BackupKey> {
        vec![
            BackupKey {
                key: b"a".to_vec(),
                value: (0..=255u8).collect(),
                version: Hlc::new(1_700_000_000_000, 3, "node-1"),
                fencing_token: None,
                expires_at: None,
            },
            BackupKey {
                key: b"lock".to_vec(),
                value: b"holder".to_vec(),
                version: Hlc::new(1_700_000_000_100, 0, "node-2"),
                fencing_token: Some(Hlc::new(1_700_000_000_050, 1, "node-2")),
                expires_at: Some(1_700_000_060_000),
            },
        ]
    }

    fn written(keys: &[BackupKey]) -> Vec<u8> {
        let mut writer = BackupWriter::new(Vec::new()).unwrap();
        for key in keys {
            writer.push(key).unwrap();
        }
        writer.finish(42).unwrap()
    }

    fn read_all(bytes: &[u8]) -> Result<(Vec<BackupKey>, BackupEnd), BackupError> {
        let mut reader = BackupReader::new(bytes)?;
        let mut keys = Vec::new();
        loop {
            match reader.next_frame()? {
                Some(Frame::Key(key, frame)) => {
                    assert_eq!(decode_keys(&frame).unwrap(), vec![key.clone()]);
                    keys.push(key);
                }
                Some(Frame::End(end)) => return Ok((keys, end)),
                None => unreachable!("the end frame comes first"),
            }
        }
    }

    #[test]
    fn a_backup_reads_back_as_written() {
        let (keys, end) = read_all(&written(&sample())).unwrap();
        assert_eq!(keys, sample());
        assert_eq!(end, BackupEnd { keys: 2, applied_index: 42 });
    }

    #[test]
    fn damage_truncation_and_strangers_are_refused() {
        let good = written(&sample());
        for at in 0..good.len() {
            let mut bad = good.clone();
            bad[at] ^= 0x01;
            assert!(read_all(&bad).is_err(), "a flipped bit at {at} went unnoticed");
        }
        for len in 0..good.len() {
            assert!(read_all(&good[..len]).is_err(), "a backup cut at {len} bytes went unnoticed");
        }
        assert!(matches!(read_all(b"{\"not\": \"a backup\"}"), Err(BackupError::NotABackup)));
        let mut longer = good.clone();
        longer.push(0);
        assert!(read_all(&longer).is_err());
    }
}
