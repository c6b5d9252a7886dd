//! Replies (PROTOCOL.md §7.1, §13): encoded by the server, decoded by clients. The decoder is as
//! strict as the Rust SDK's: exact lengths, no trailing bytes.

use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::resp::{parse_length, parse_u64, push_array_header, push_bulk, Cursor};

/// One reply payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// `+OK\r\n`: SET applied, KEYNOTIFY registered or removed.
    Ok,
    /// `:N\r\n`: DEL/VDEL counts, `:-1` for a SET or VDEL whose condition failed, `:0` for STOP
    /// on nothing.
    Int(i64),
    /// `$-1\r\n`: GET miss.
    Nil,
    /// `$<len>\r\n<value>\r\n`: GET hit.
    Value(#[serde(with = "serde_bytes")] Vec<u8>),
    /// `-ERR <text>\r\n`.
    Error(StoreError),
    /// A SCAN page: `*1\r\n*<k>\r\n<keys>` when final, `*2\r\n*<k>\r\n<keys>$<m>\r\n<token>\r\n`
    /// when more may follow.
    Keys { keys: Vec<serde_bytes::ByteBuf>, token: Option<serde_bytes::ByteBuf> },
}

/// The payload is not one of the reply forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the payload is not a well-formed state store reply")]
pub struct MalformedReply;

impl Response {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Response::Ok => b"+OK\r\n".to_vec(),
            Response::Int(n) => format!(":{n}\r\n").into_bytes(),
            Response::Nil => b"$-1\r\n".to_vec(),
            Response::Value(value) => {
                let mut out = Vec::with_capacity(value.len() + 16);
                push_bulk(&mut out, value);
                out
            }
            Response::Error(error) => error.to_resp(),
            Response::Keys { keys, token } => {
                let size: usize =
                    keys.iter().map(|k| k.len() + 16).sum::<usize>() + token.as_ref().map_or(0, |t| t.len());
                let mut out = Vec::with_capacity(size + 32);
                push_array_header(&mut out, if token.is_some() { 2 } else { 1 });
                push_array_header(&mut out, keys.len());
                for key in keys {
                    push_bulk(&mut out, key);
                }
                if let Some(token) = token {
                    push_bulk(&mut out, token);
                }
                out
            }
        }
    }

    pub fn decode(payload: &[u8]) -> Result<Response, MalformedReply> {
        let mut cursor = Cursor::new(payload);
        let response = decode_one(&mut cursor).ok_or(MalformedReply)?;
        cursor.is_at_end().then_some(response).ok_or(MalformedReply)
    }
}

fn decode_one(cursor: &mut Cursor<'_>) -> Option<Response> {
    match cursor.byte()? {
        b'+' => (cursor.line()? == b"OK").then_some(Response::Ok),
        b':' => {
            let line = cursor.line()?;
            let n = match line.strip_prefix(b"-") {
                Some(digits) => -i64::try_from(parse_u64(digits)?).ok()?,
                None => i64::try_from(parse_u64(line)?).ok()?,
            };
            Some(Response::Int(n))
        }
        b'$' => {
            let line = cursor.line()?;
            if line == b"-1" {
                return Some(Response::Nil);
            }
            let value = cursor.take(parse_length(line)?)?;
            cursor.crlf()?;
            Some(Response::Value(value.to_vec()))
        }
        b'-' => {
            let text = cursor.line()?.strip_prefix(b"ERR ")?;
            Some(Response::Error(StoreError::from_text(std::str::from_utf8(text).ok()?)))
        }
        b'*' => {
            let outer = parse_length(cursor.line()?)?;
            if !(1..=2).contains(&outer) {
                return None;
            }
            let keys = cursor.bulk_array()?.into_iter().map(|k| serde_bytes::ByteBuf::from(k.to_vec())).collect();
            let token = if outer == 2 { Some(serde_bytes::ByteBuf::from(cursor.bulk()?.to_vec())) } else { None };
            Some(Response::Keys { keys, token })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(items: &[&[u8]], token: Option<&[u8]>) -> Response {
        Response::Keys {
            keys: items.iter().map(|k| serde_bytes::ByteBuf::from(k.to_vec())).collect(),
            token: token.map(|t| serde_bytes::ByteBuf::from(t.to_vec())),
        }
    }

    /// Every row of PROTOCOL.md §7.1, byte-for-byte.
    #[test]
    fn canonical_replies_are_byte_exact() {
        let rows: [(Response, &[u8]); 9] = [
            (Response::Ok, b"+OK\r\n"),
            (Response::Int(-1), b":-1\r\n"),
            (Response::Value(b"1234".to_vec()), b"$4\r\n1234\r\n"),
            (Response::Value(Vec::new()), b"$0\r\n\r\n"),
            (Response::Nil, b"$-1\r\n"),
            (Response::Int(1), b":1\r\n"),
            (Response::Int(0), b":0\r\n"),
            (Response::Error(StoreError::SyntaxError), b"-ERR syntax error\r\n"),
            (Response::Value(b"a\r\n\0b".to_vec()), b"$5\r\na\r\n\0b\r\n"),
        ];
        for (response, bytes) in rows {
            assert_eq!(response.encode(), bytes, "{response:?}");
            assert_eq!(Response::decode(bytes), Ok(response));
        }
    }

    /// PROTOCOL.md §13: final and continued SCAN pages.
    #[test]
    fn scan_pages_are_byte_exact() {
        assert_eq!(keys(&[], None).encode(), b"*1\r\n*0\r\n");
        assert_eq!(keys(&[b"a", b"bc"], None).encode(), b"*1\r\n*2\r\n$1\r\na\r\n$2\r\nbc\r\n");
        assert_eq!(keys(&[b"a"], Some(b"1;1;")).encode(), b"*2\r\n*1\r\n$1\r\na\r\n$4\r\n1;1;\r\n");
        assert_eq!(keys(&[], Some(b"t")).encode(), b"*2\r\n*0\r\n$1\r\nt\r\n");
        for page in [keys(&[], None), keys(&[b"a", b""], Some(b"")), keys(&[b"\r\n"], Some(b"\0"))] {
            assert_eq!(Response::decode(&page.encode()), Ok(page));
        }
    }

    #[test]
    fn decode_is_strict() {
        for bad in [
            &b""[..],
            b"+OK",
            b"+OK\r\nx",
            b"+QUEUED\r\n",
            b":\r\n",
            b":+1\r\n",
            b":1.5\r\n",
            b"$5\r\n1234\r\n",
            b"$3\r\n1234\r\n",
            b"$4\r\n1234\r\n\r\n",
            b"-ERR\r\n",
            b"-ERR:x\r\n",
            b"*0\r\n",
            b"*3\r\n*0\r\n$1\r\na\r\n$1\r\nb\r\n",
            b"*1\r\n*-1\r\n",
            b"*1\r\n*1\r\n$-1\r\n",
            b"*2\r\n*0\r\n",
            b"%1\r\n",
        ] {
            assert_eq!(Response::decode(bad), Err(MalformedReply), "{:?}", String::from_utf8_lossy(bad));
        }
        assert_eq!(Response::decode(b":-9223372036854775807\r\n"), Ok(Response::Int(-i64::MAX)));
        assert_eq!(Response::decode(b":9223372036854775808\r\n"), Err(MalformedReply));
    }

    #[test]
    fn unknown_error_texts_survive_decoding() {
        assert_eq!(
            Response::decode(b"-ERR something new\r\n"),
            Ok(Response::Error(StoreError::Unknown("something new".into())))
        );
        assert_eq!(
            Response::decode(b"-ERR the quota has been exceeded\r\n"),
            Ok(Response::Error(StoreError::QuotaExceeded))
        );
    }
}
