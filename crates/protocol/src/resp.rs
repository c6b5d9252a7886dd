//! RESP3 framing, binary-safe and strict: exact lengths, no trailing bytes, no negative or
//! signed lengths. Requests are arrays of bulk strings; replies use the few forms of
//! PROTOCOL.md §7.1.

/// A position in a RESP3 buffer. Every read is bounds-checked and returns `None` on short or
/// malformed input, so no input can make the parser panic.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    pub(crate) fn byte(&mut self) -> Option<u8> {
        let b = *self.buf.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    /// The bytes up to the next `\r\n`, which is consumed.
    pub(crate) fn line(&mut self) -> Option<&'a [u8]> {
        let rest = &self.buf[self.pos..];
        let end = rest.windows(2).position(|w| w == b"\r\n")?;
        self.pos += end + 2;
        Some(&rest[..end])
    }

    pub(crate) fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(len)?;
        let data = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(data)
    }

    pub(crate) fn crlf(&mut self) -> Option<()> {
        (self.take(2)? == b"\r\n").then_some(())
    }

    pub(crate) fn is_at_end(&self) -> bool {
        self.pos == self.buf.len()
    }

    /// `<len>\r\n<bytes>\r\n` after a `$` that was already read.
    pub(crate) fn bulk_body(&mut self) -> Option<&'a [u8]> {
        let len = parse_length(self.line()?)?;
        let data = self.take(len)?;
        self.crlf()?;
        Some(data)
    }

    /// `$<len>\r\n<bytes>\r\n`.
    pub(crate) fn bulk(&mut self) -> Option<&'a [u8]> {
        (self.byte()? == b'$').then_some(())?;
        self.bulk_body()
    }

    /// `*<n>\r\n` followed by `n` bulk strings.
    pub(crate) fn bulk_array(&mut self) -> Option<Vec<&'a [u8]>> {
        (self.byte()? == b'*').then_some(())?;
        let count = parse_length(self.line()?)?;
        // The count comes from the peer: never trust it for an allocation.
        let mut items = Vec::with_capacity(count.min(16));
        for _ in 0..count {
            items.push(self.bulk()?);
        }
        Some(items)
    }
}

/// A non-negative decimal length: ASCII digits only (no sign, no spaces), without overflow.
pub(crate) fn parse_length(digits: &[u8]) -> Option<usize> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    digits.iter().try_fold(0usize, |acc, d| acc.checked_mul(10)?.checked_add(usize::from(d - b'0')))
}

/// A decimal `u64`: ASCII digits only (leading zeros allowed), without overflow.
pub(crate) fn parse_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    digits.iter().try_fold(0u64, |acc, d| acc.checked_mul(10)?.checked_add(u64::from(d - b'0')))
}

/// Parses a whole request payload: exactly one non-empty array of bulk strings, nothing after it.
pub(crate) fn parse_request_frame(payload: &[u8]) -> Option<Vec<&[u8]>> {
    let mut cursor = Cursor::new(payload);
    let items = cursor.bulk_array()?;
    (cursor.is_at_end() && !items.is_empty()).then_some(items)
}

pub(crate) fn push_bulk(out: &mut Vec<u8>, data: &[u8]) {
    out.push(b'$');
    out.extend_from_slice(data.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

pub(crate) fn push_array_header(out: &mut Vec<u8>, count: usize) {
    out.push(b'*');
    out.extend_from_slice(count.to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Encodes an array of bulk strings, the form of every request and notification.
pub fn encode_bulk_array<T: AsRef<[u8]>>(items: &[T]) -> Vec<u8> {
    let size: usize = items.iter().map(|i| i.as_ref().len() + 16).sum();
    let mut out = Vec::with_capacity(size + 16);
    push_array_header(&mut out, items.len());
    for item in items {
        push_bulk(&mut out, item.as_ref());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_reject_signs_spaces_and_overflow() {
        assert_eq!(parse_length(b"0"), Some(0));
        assert_eq!(parse_length(b"007"), Some(7));
        assert_eq!(parse_length(b""), None);
        assert_eq!(parse_length(b"-1"), None);
        assert_eq!(parse_length(b"+1"), None);
        assert_eq!(parse_length(b" 1"), None);
        assert_eq!(parse_length(b"99999999999999999999999"), None);
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"18446744073709551616"), None);
    }

    #[test]
    fn request_frame_is_exact() {
        let items = parse_request_frame(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n").unwrap();
        assert_eq!(items, vec![&b"GET"[..], &b"k"[..]]);
        // Binary-safe: CRLF and NUL inside a bulk string.
        let items = parse_request_frame(b"*2\r\n$3\r\nGET\r\n$4\r\n\r\n\0x\r\n").unwrap();
        assert_eq!(items[1], b"\r\n\0x");
        for bad in [
            &b""[..],
            b"*0\r\n",
            b"*-1\r\n",
            b"*1\r\n$-1\r\n",
            b"*1\r\n+GET\r\n",
            b"*1\r\n$3\r\nGET\r\nX",
            b"*1\r\n$4\r\nGET\r\n",
            b"*1\r\n$2\r\nGET\r\n",
            b"*2\r\n$3\r\nGET\r\n",
            b"*1\r\n$3\r\nGET\n\n",
            b"*1\n$3\nGET\n",
            b"*1\r\n$3\r\nGET",
        ] {
            assert_eq!(parse_request_frame(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn encode_matches_the_sdk_bytes() {
        assert_eq!(encode_bulk_array(&[&b"GET"[..], b"testkey"]), b"*2\r\n$3\r\nGET\r\n$7\r\ntestkey\r\n");
        assert_eq!(encode_bulk_array(&[&b""[..]]), b"*1\r\n$0\r\n\r\n");
    }
}
