//! Byte layouts of the records and index keys in [`crate::storage::Table`]. Hand-written so the
//! on-disk format is explicit and stable; every record starts with a format byte.

use statestore_protocol::Hlc;

use crate::storage::{StorageError, Table};

const FORMAT: u8 = 1;

pub(crate) struct Writer(Vec<u8>);

impl Writer {
    pub(crate) fn new() -> Self {
        Writer(vec![FORMAT])
    }

    pub(crate) fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }

    pub(crate) fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub(crate) fn bytes(mut self, v: &[u8]) -> Self {
        let len = u32::try_from(v.len()).expect("records are far below 4 GiB");
        self.0.extend_from_slice(&len.to_be_bytes());
        self.0.extend_from_slice(v);
        self
    }

    /// The HLC's text form, length-prefixed like [`Writer::bytes`].
    pub(crate) fn hlc(mut self, v: &Hlc) -> Self {
        let at = self.0.len();
        self.0.extend_from_slice(&[0; 4]);
        v.write_text(&mut self.0);
        let len = u32::try_from(self.0.len() - at - 4).expect("an HLC is far below 4 GiB");
        self.0[at..at + 4].copy_from_slice(&len.to_be_bytes());
        self
    }

    pub(crate) fn opt_hlc(self, v: Option<&Hlc>) -> Self {
        match v {
            Some(v) => self.u8(1).hlc(v),
            None => self.u8(0),
        }
    }

    pub(crate) fn opt_u64(self, v: Option<u64>) -> Self {
        match v {
            Some(v) => self.u8(1).u64(v),
            None => self.u8(0),
        }
    }

    pub(crate) fn finish(self) -> Vec<u8> {
        self.0
    }
}

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    table: Table,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(table: Table, buf: &'a [u8]) -> Result<Self, StorageError> {
        let mut reader = Reader { buf, table };
        match reader.u8()? {
            FORMAT => Ok(reader),
            _ => Err(reader.corrupt("unknown record format")),
        }
    }

    fn corrupt(&self, detail: &'static str) -> StorageError {
        StorageError::Corrupt { table: self.table, detail }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], StorageError> {
        if self.buf.len() < n {
            return Err(self.corrupt("record too short"));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, StorageError> {
        Ok(self.take(1)?[0])
    }

    /// The next byte, left unread.
    pub(crate) fn peek_u8(&self) -> Result<u8, StorageError> {
        self.buf.first().copied().ok_or_else(|| self.corrupt("record too short"))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, StorageError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], StorageError> {
        let len = u32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes"));
        self.take(len as usize)
    }

    pub(crate) fn hlc(&mut self) -> Result<Hlc, StorageError> {
        let text = std::str::from_utf8(self.bytes()?).map_err(|_| self.corrupt("HLC is not UTF-8"))?;
        text.parse().map_err(|_| self.corrupt("malformed HLC"))
    }

    pub(crate) fn opt_hlc(&mut self) -> Result<Option<Hlc>, StorageError> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.hlc().map(Some),
            _ => Err(self.corrupt("bad option tag")),
        }
    }

    pub(crate) fn opt_u64(&mut self) -> Result<Option<u64>, StorageError> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.u64().map(Some),
            _ => Err(self.corrupt("bad option tag")),
        }
    }

    pub(crate) fn finish(self) -> Result<(), StorageError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(self.corrupt("trailing bytes"))
        }
    }
}

/// `len (u32 BE) ++ head ++ tail`: index keys whose prefix scan by `head` is exact.
pub(crate) fn pair_key(head: &[u8], tail: &[u8]) -> Vec<u8> {
    let mut out = length_prefix(head);
    out.extend_from_slice(tail);
    out
}

/// `len (u32 BE) ++ head`: the scan prefix of [`pair_key`]s with this head.
pub(crate) fn length_prefix(head: &[u8]) -> Vec<u8> {
    let len = u32::try_from(head.len()).expect("keys are far below 4 GiB");
    let mut out = Vec::with_capacity(4 + head.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(head);
    out
}

/// Splits a [`pair_key`] back into head and tail.
pub(crate) fn split_pair_key(table: Table, key: &[u8]) -> Result<(&[u8], &[u8]), StorageError> {
    let corrupt = StorageError::Corrupt { table, detail: "bad index key" };
    let (len, rest) = key.split_first_chunk::<4>().ok_or(corrupt.clone())?;
    let len = u32::from_be_bytes(*len) as usize;
    if rest.len() < len {
        return Err(corrupt);
    }
    Ok(rest.split_at(len))
}

/// `deadline (u64 BE) ++ rest`: index keys ordered by time.
pub(crate) fn timed_key(at: u64, rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + rest.len());
    out.extend_from_slice(&at.to_be_bytes());
    out.extend_from_slice(rest);
    out
}

/// Splits a [`timed_key`] back into its time and the rest.
pub(crate) fn split_timed_key(table: Table, key: &[u8]) -> Result<(u64, &[u8]), StorageError> {
    let (at, rest) = key.split_first_chunk::<8>().ok_or(StorageError::Corrupt { table, detail: "bad timed key" })?;
    Ok((u64::from_be_bytes(*at), rest))
}

pub(crate) fn decode_u64(table: Table, value: &[u8]) -> Result<u64, StorageError> {
    let mut reader = Reader::new(table, value)?;
    let v = reader.u64()?;
    reader.finish()?;
    Ok(v)
}

pub(crate) fn encode_u64(v: u64) -> Vec<u8> {
    Writer::new().u64(v).finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pair_keys_do_not_collide_across_heads() {
        // Without the length prefix, ("ab", "c") and ("a", "bc") would share a key.
        assert_ne!(pair_key(b"ab", b"c"), pair_key(b"a", b"bc"));
        let key = pair_key(b"ab", b"c");
        assert!(key.starts_with(&length_prefix(b"ab")));
        assert!(!key.starts_with(&length_prefix(b"a")));
        assert_eq!(split_pair_key(Table::Watchers, &key).unwrap(), (&b"ab"[..], &b"c"[..]));
        assert!(split_pair_key(Table::Watchers, &[0, 0, 0, 9, 1]).is_err());
    }

    #[test]
    fn timed_keys_sort_by_time() {
        assert!(timed_key(2, b"a") < timed_key(256, b"a"));
        assert_eq!(split_timed_key(Table::Expiry, &timed_key(7, b"k")).unwrap(), (7, &b"k"[..]));
        assert!(split_timed_key(Table::Expiry, b"short").is_err());
    }

    #[test]
    fn records_round_trip_and_corruption_is_detected() {
        let hlc = Hlc::new(5, 1, "statestore");
        let bytes = Writer::new().bytes(b"v").hlc(&hlc).opt_hlc(None).opt_u64(Some(9)).finish();
        let mut r = Reader::new(Table::Keys, &bytes).unwrap();
        assert_eq!(r.bytes().unwrap(), b"v");
        assert_eq!(r.hlc().unwrap(), hlc);
        assert_eq!(r.opt_hlc().unwrap(), None);
        assert_eq!(r.opt_u64().unwrap(), Some(9));
        r.finish().unwrap();
        assert!(Reader::new(Table::Keys, &[9]).is_err());
        assert!(Reader::new(Table::Keys, &[]).is_err());
        let mut short = Reader::new(Table::Keys, &bytes[..4]).unwrap();
        assert!(short.bytes().is_err());
        assert!(decode_u64(Table::Meta, &[FORMAT, 0, 0]).is_err());
    }
}
