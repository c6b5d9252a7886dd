//! Key notification payloads (PROTOCOL.md §9.2).

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::resp::{encode_bulk_array, Cursor};

/// What happened to an observed key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Notification {
    /// `*4 NOTIFY SET VALUE <value>`: the key was set.
    Set {
        /// Shared, not copied, by the notifications of every watcher of the key.
        value: Bytes,
    },
    /// `*2 NOTIFY DELETE`: the key was deleted by DEL, VDEL or expiry.
    Delete,
}

impl Notification {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Notification::Set { value } => encode_bulk_array(&[&b"NOTIFY"[..], b"SET", b"VALUE", value]),
            Notification::Delete => encode_bulk_array(&[&b"NOTIFY"[..], b"DELETE"]),
        }
    }

    /// Parses a notification payload; `None` for anything but the two exact forms.
    pub fn decode(payload: &[u8]) -> Option<Notification> {
        let mut cursor = Cursor::new(payload);
        let items = cursor.bulk_array()?;
        if !cursor.is_at_end() {
            return None;
        }
        match items.as_slice() {
            [b"NOTIFY", b"SET", b"VALUE", value] => Some(Notification::Set { value: Bytes::copy_from_slice(value) }),
            [b"NOTIFY", b"DELETE"] => Some(Notification::Delete),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_byte_exact() {
        assert_eq!(
            Notification::Set { value: Bytes::from_static(b"value1") }.encode(),
            b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$6\r\nvalue1\r\n"
        );
        assert_eq!(
            Notification::Set { value: Bytes::new() }.encode(),
            b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$0\r\n\r\n"
        );
        assert_eq!(Notification::Delete.encode(), b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n");
    }

    #[test]
    fn decode_accepts_only_the_two_forms() {
        for n in [Notification::Delete, Notification::Set { value: Bytes::from_static(b"\r\n\0") }] {
            assert_eq!(Notification::decode(&n.encode()), Some(n));
        }
        assert_eq!(Notification::decode(b"*2\r\n$6\r\nNOTIFY\r\n$3\r\nDEL\r\n"), None);
        assert_eq!(Notification::decode(b"*3\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$1\r\nv\r\n"), None);
        assert_eq!(Notification::decode(b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n!"), None);
    }
}
