//! Requests as Redis clients send them, cut out of a connection's read buffer.
//!
//! A client sends each command as an array of bulk strings (`*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n`),
//! or — telnet, and `redis-benchmark`'s inline tests — as one line of words (`PING hi\r\n`).
//! Nothing else is a request: replies are encoded with the `redis-protocol` crate, but a
//! request is only ever this flat shape, and framing it here is what bounds it. The crate's
//! decoder takes any frame, so it would accept arrays nested in arrays and recurse once per
//! level with no limit (a request of a few tens of kilobytes overflows the stack and aborts the
//! process), it starts again from the first byte on every read of a request that arrives in
//! pieces, and it does not check a bulk string's terminator. Here a request is walked once per
//! read by its headers (jumping over each argument's bytes), its size and its argument count
//! are capped before anything is buffered for it, and a malformed one is an error that names
//! what is wrong — after which the connection is closed, as Redis does, since the stream can no
//! longer be split into requests.
//!
//! Pure: bytes in, arguments out.

use bytes::{Bytes, BytesMut};

/// What one request may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of one request, headers included.
    pub max_request: usize,
    /// Arguments of one request, the command's name included.
    pub max_args: usize,
}

/// Why the bytes at the head of a buffer are not a request. The texts are Redis's own, so
/// clients and people recognise them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// `*N` with N not a number, negative, or over the argument cap.
    #[error("Protocol error: invalid multibulk length")]
    MultibulkLength,
    /// An argument that is not a bulk string.
    #[error("Protocol error: expected '$', got '{0}'")]
    ExpectedBulk(char),
    /// `$N` with N not a number, negative, or past the request cap.
    #[error("Protocol error: invalid bulk length")]
    BulkLength,
    /// A bulk string not followed by `\r\n`.
    #[error("Protocol error: a bulk string's data is not followed by CRLF")]
    BulkTerminator,
    /// A request larger than the cap.
    #[error("Protocol error: a request larger than {0} bytes")]
    TooLarge(usize),
    /// An inline request with an unbalanced quote.
    #[error("Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
}

/// Takes the first whole request off `buf`: its arguments, or `None` if the buffer holds only
/// part of one (or nothing but blank lines, which are dropped).
pub fn next_request(buf: &mut BytesMut, limits: Limits) -> Result<Option<Vec<Bytes>>, FrameError> {
    loop {
        match buf.first() {
            None => return Ok(None),
            Some(b'*') => return multibulk(buf, limits),
            Some(_) => match inline(buf, limits)? {
                // A blank line is no request; look past it.
                Some(args) if args.is_empty() => continue,
                found => return Ok(found),
            },
        }
    }
}

/// The position of the first `\r\n` at or after `from`, within the request cap.
fn line_end(buf: &[u8], from: usize, limits: Limits) -> Result<Option<usize>, FrameError> {
    let until = buf.len().min(limits.max_request);
    if from >= until {
        // Nothing to look at: either the cap is reached, or the bytes are yet to come.
        return match buf.len() >= limits.max_request {
            true => Err(FrameError::TooLarge(limits.max_request)),
            false => Ok(None),
        };
    }
    let window = &buf[from..until];
    match window.windows(2).position(|pair| pair == b"\r\n") {
        Some(at) => Ok(Some(from + at)),
        None if buf.len() >= limits.max_request => Err(FrameError::TooLarge(limits.max_request)),
        None => Ok(None),
    }
}

/// A decimal header's number (`*N` or `$N` without its sign byte), if it is one.
fn number(digits: &[u8]) -> Option<usize> {
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

fn multibulk(buf: &mut BytesMut, limits: Limits) -> Result<Option<Vec<Bytes>>, FrameError> {
    let Some(end) = line_end(buf, 1, limits)? else {
        return Ok(None);
    };
    let count = number(&buf[1..end])
        .filter(|n| *n <= limits.max_args)
        .ok_or(FrameError::MultibulkLength)?;
    let mut at = end + 2;
    let mut spans = Vec::with_capacity(count);
    for _ in 0..count {
        match buf.get(at) {
            None => return Ok(None),
            Some(b'$') => {}
            Some(other) => return Err(FrameError::ExpectedBulk(char::from(*other))),
        }
        let Some(end) = line_end(buf, at + 1, limits)? else {
            return Ok(None);
        };
        let len = number(&buf[at + 1..end]).ok_or(FrameError::BulkLength)?;
        let start = end + 2;
        let stop = start.checked_add(len).ok_or(FrameError::BulkLength)?;
        if stop + 2 > limits.max_request {
            return Err(if len > limits.max_request {
                FrameError::BulkLength
            } else {
                FrameError::TooLarge(limits.max_request)
            });
        }
        if buf.len() < stop + 2 {
            return Ok(None);
        }
        if &buf[stop..stop + 2] != b"\r\n" {
            return Err(FrameError::BulkTerminator);
        }
        spans.push(start..stop);
        at = stop + 2;
    }
    let request = buf.split_to(at).freeze();
    Ok(Some(
        spans.into_iter().map(|span| request.slice(span)).collect(),
    ))
}

/// An inline request: words split on blanks, `"..."` and `'...'` quoting a word (with `\"`
/// inside double quotes), as `redis-cli` and telnet users write them.
fn inline(buf: &mut BytesMut, limits: Limits) -> Result<Option<Vec<Bytes>>, FrameError> {
    let window = &buf[..buf.len().min(limits.max_request)];
    let Some(newline) = window.iter().position(|b| *b == b'\n') else {
        return if buf.len() >= limits.max_request {
            Err(FrameError::TooLarge(limits.max_request))
        } else {
            Ok(None)
        };
    };
    let line = buf.split_to(newline + 1);
    let line = line.strip_suffix(b"\n").unwrap_or(&line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let words = split_words(line)?;
    if words.len() > limits.max_args {
        return Err(FrameError::MultibulkLength);
    }
    Ok(Some(words.into_iter().map(Bytes::from).collect()))
}

fn split_words(line: &[u8]) -> Result<Vec<Vec<u8>>, FrameError> {
    let mut words = Vec::new();
    let mut bytes = line.iter().copied().peekable();
    loop {
        while bytes.next_if(u8::is_ascii_whitespace).is_some() {}
        let Some(first) = bytes.next() else {
            return Ok(words);
        };
        let mut word = Vec::new();
        match first {
            b'"' | b'\'' => loop {
                match bytes.next() {
                    None => return Err(FrameError::UnbalancedQuotes),
                    Some(b'\\') if first == b'"' => match bytes.next() {
                        Some(b'n') => word.push(b'\n'),
                        Some(b'r') => word.push(b'\r'),
                        Some(b't') => word.push(b'\t'),
                        Some(other) => word.push(other),
                        None => return Err(FrameError::UnbalancedQuotes),
                    },
                    Some(quote) if quote == first => {
                        // A closing quote must end the word.
                        if bytes.peek().is_some_and(|b| !b.is_ascii_whitespace()) {
                            return Err(FrameError::UnbalancedQuotes);
                        }
                        break;
                    }
                    Some(other) => word.push(other),
                }
            },
            other => {
                word.push(other);
                while let Some(b) = bytes.next_if(|b| !b.is_ascii_whitespace()) {
                    word.push(b);
                }
            }
        }
        words.push(word);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_request: 1024,
        max_args: 8,
    };

    fn args(request: &[&str]) -> Vec<Bytes> {
        request
            .iter()
            .map(|a| Bytes::copy_from_slice(a.as_bytes()))
            .collect()
    }

    fn take(buf: &mut BytesMut) -> Result<Option<Vec<Bytes>>, FrameError> {
        next_request(buf, LIMITS)
    }

    #[test]
    fn pipelined_requests_come_off_one_at_a_time() {
        let mut buf = BytesMut::from(
            &b"*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nECHO\r\n$5\r\nhe\r\no\r\n*1\r\n$4"[..],
        );
        assert_eq!(take(&mut buf), Ok(Some(args(&["PING"]))));
        // A bulk string holds any bytes, CRLF included.
        assert_eq!(take(&mut buf), Ok(Some(args(&["ECHO", "he\r\no"]))));
        assert_eq!(take(&mut buf), Ok(None));
        buf.extend_from_slice(b"\r\nQUIT\r\n");
        assert_eq!(take(&mut buf), Ok(Some(args(&["QUIT"]))));
        assert!(buf.is_empty());
    }

    #[test]
    fn a_request_in_pieces_is_whole_only_at_its_last_byte() {
        let request = b"*3\r\n$11\r\nCL.THROTTLE\r\n$1\r\nk\r\n$2\r\n15\r\n";
        let mut buf = BytesMut::new();
        for (i, byte) in request.iter().enumerate() {
            buf.extend_from_slice(&[*byte]);
            let taken = take(&mut buf).unwrap();
            assert_eq!(taken.is_some(), i == request.len() - 1, "at byte {i}");
        }
    }

    #[test]
    fn inline_requests_split_on_blanks_and_quotes() {
        let mut buf = BytesMut::from(&b"\r\nPING\r\nSET  \"a b\" 'c d' \"e\\\"f\"\n"[..]);
        assert_eq!(take(&mut buf), Ok(Some(args(&["PING"]))));
        assert_eq!(
            take(&mut buf),
            Ok(Some(args(&["SET", "a b", "c d", "e\"f"])))
        );
        assert_eq!(take(&mut buf), Ok(None));
        let mut open = BytesMut::from(&b"ECHO \"never closed\r\n"[..]);
        assert_eq!(take(&mut open), Err(FrameError::UnbalancedQuotes));
    }

    #[test]
    fn announced_sizes_past_the_caps_are_refused_before_anything_is_buffered() {
        for (bytes, error) in [
            (&b"*1000000000\r\n"[..], FrameError::MultibulkLength),
            (b"*-1\r\n", FrameError::MultibulkLength),
            (b"*x\r\n", FrameError::MultibulkLength),
            (b"*1\r\n$1000000000\r\n", FrameError::BulkLength),
            (b"*1\r\n$-5\r\n", FrameError::BulkLength),
            (b"*1\r\n$2000\r\n", FrameError::BulkLength),
            (b"*2\r\n$3\r\nabc\r\n$1010\r\n", FrameError::TooLarge(1024)),
        ] {
            assert_eq!(take(&mut BytesMut::from(bytes)), Err(error), "{bytes:?}");
        }
    }

    #[test]
    fn nesting_and_bad_terminators_are_refused_by_name() {
        let mut nested = BytesMut::from(&b"*1\r\n*1\r\n*1\r\n:1\r\n"[..]);
        assert_eq!(take(&mut nested), Err(FrameError::ExpectedBulk('*')));
        let mut unterminated = BytesMut::from(&b"*1\r\n$3\r\nabcXY"[..]);
        assert_eq!(take(&mut unterminated), Err(FrameError::BulkTerminator));
        let mut endless = BytesMut::from(&[b'a'; 2000][..]);
        assert_eq!(take(&mut endless), Err(FrameError::TooLarge(1024)));
    }

    #[test]
    fn an_argument_ending_at_the_cap_is_too_large_not_a_panic() {
        // The first argument's CRLF ends exactly at byte 1024; the second header is past it.
        let header = b"*2\r\n$1011\r\n";
        let mut bytes = header.to_vec();
        bytes.extend(std::iter::repeat_n(b'x', 1024 - header.len() - 2));
        bytes.extend(b"\r\n$1\r\nx\r\n");
        assert_eq!(bytes[1022..1024], *b"\r\n");
        // Read up to the cap, the request is not whole yet; with the next bytes it is too
        // large.
        assert_eq!(take(&mut BytesMut::from(&bytes[..1024])), Ok(None));
        assert_eq!(
            take(&mut BytesMut::from(&bytes[..])),
            Err(FrameError::TooLarge(1024))
        );
    }
}
