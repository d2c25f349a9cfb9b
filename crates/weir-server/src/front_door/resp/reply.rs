//! Replies, written once and encoded for the protocol each connection speaks.
//!
//! Commands answer with a [`Reply`]; the connection encodes it as RESP2 or RESP3 (whichever
//! `HELLO` chose) with the `redis-protocol` crate. Where RESP2 has no type of RESP3's, the
//! reply falls back the way Redis's own do: a map is a flat array of keys and values, a
//! boolean an integer 1 or 0, a null the null bulk string.

use bytes::{Bytes, BytesMut};
use redis_protocol::resp2::types::BytesFrame as Resp2;
use redis_protocol::resp3::types::{BytesFrame as Resp3, FrameMap};

/// One reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `+OK`, `+PONG`: a short status.
    Status(&'static str),
    /// An error; its text starts with its code (`ERR`, `NOAUTH`, `WRONGPASS`, …).
    Error(String),
    /// An integer.
    Integer(i64),
    /// A string of bytes.
    Bulk(Bytes),
    /// Nothing (a missing value).
    Null,
    /// True or false.
    Boolean(bool),
    /// A list.
    Array(Vec<Reply>),
    /// Named fields, in order.
    Map(Vec<(&'static str, Reply)>),
}

impl Reply {
    /// `-ERR {text}`.
    pub fn err(text: impl std::fmt::Display) -> Reply {
        Reply::Error(format!("ERR {text}"))
    }

    /// A bulk string of `text`.
    pub fn text(text: impl Into<String>) -> Reply {
        Reply::Bulk(Bytes::from(text.into()))
    }

    /// Appends the reply to `out` in RESP3 (`resp3`) or RESP2.
    pub fn encode(self, out: &mut BytesMut, resp3: bool) {
        if self.encode_integers(out) {
            return;
        }
        // An error's text may quote a client's words; a CR or LF in it would end the line
        // early and the rest would read as replies of their own (Redis replaces them too).
        let this = match self {
            Reply::Error(text) if text.contains(['\r', '\n']) => {
                Reply::Error(text.replace(['\r', '\n'], " "))
            }
            other => other,
        };
        // The crate refuses nothing this module builds: every frame is well formed.
        let encoded = match resp3 {
            true => {
                redis_protocol::resp3::encode::complete::extend_encode(out, &this.resp3(), false)
            }
            false => redis_protocol::resp2::encode::extend_encode(out, &this.resp2(), false),
        };
        debug_assert!(encoded.is_ok(), "{encoded:?}");
    }

    /// Writes an integer, or an array of integers (every `CL.THROTTLE` reply), straight into
    /// `out`, the same in RESP2 and RESP3; false for any other reply. Through the crate, a
    /// vector of frames is built and each number sized with a floating-point logarithm, a share
    /// of a pipelined `CL.THROTTLE`'s time worth saving (`docs/benchmarks.md`, "`CL.THROTTLE`
    /// at under half of Redis's CPU, pipelined"). A test holds the two encodings equal.
    fn encode_integers(&self, out: &mut BytesMut) -> bool {
        fn line(out: &mut BytesMut, kind: u8, n: i64) {
            out.extend_from_slice(&[kind]);
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        match self {
            Reply::Integer(n) => line(out, b':', *n),
            Reply::Array(items) if items.iter().all(|item| matches!(item, Reply::Integer(_))) => {
                line(out, b'*', items.len() as i64);
                for item in items {
                    if let Reply::Integer(n) = item {
                        line(out, b':', *n);
                    }
                }
            }
            _ => return false,
        }
        true
    }

    fn resp2(self) -> Resp2 {
        match self {
            Reply::Status(text) => Resp2::SimpleString(Bytes::from_static(text.as_bytes())),
            Reply::Error(text) => Resp2::Error(text.into()),
            Reply::Integer(n) => Resp2::Integer(n),
            Reply::Bulk(bytes) => Resp2::BulkString(bytes),
            Reply::Null => Resp2::Null,
            Reply::Boolean(b) => Resp2::Integer(i64::from(b)),
            Reply::Array(items) => Resp2::Array(items.into_iter().map(Reply::resp2).collect()),
            Reply::Map(fields) => Resp2::Array(
                fields
                    .into_iter()
                    .flat_map(|(name, value)| {
                        [
                            Resp2::BulkString(Bytes::from_static(name.as_bytes())),
                            value.resp2(),
                        ]
                    })
                    .collect(),
            ),
        }
    }

    fn resp3(self) -> Resp3 {
        match self {
            Reply::Status(text) => Resp3::SimpleString {
                data: Bytes::from_static(text.as_bytes()),
                attributes: None,
            },
            Reply::Error(text) => Resp3::SimpleError {
                data: text.into(),
                attributes: None,
            },
            Reply::Integer(n) => Resp3::Number {
                data: n,
                attributes: None,
            },
            Reply::Bulk(bytes) => Resp3::BlobString {
                data: bytes,
                attributes: None,
            },
            Reply::Null => Resp3::Null,
            Reply::Boolean(b) => Resp3::Boolean {
                data: b,
                attributes: None,
            },
            Reply::Array(items) => Resp3::Array {
                data: items.into_iter().map(Reply::resp3).collect(),
                attributes: None,
            },
            Reply::Map(fields) => {
                let mut map = FrameMap::default();
                for (name, value) in fields {
                    map.insert(
                        Resp3::BlobString {
                            data: Bytes::from_static(name.as_bytes()),
                            attributes: None,
                        },
                        value.resp3(),
                    );
                }
                Resp3::Map {
                    data: map,
                    attributes: None,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(reply: Reply, resp3: bool) -> String {
        let mut out = BytesMut::new();
        reply.encode(&mut out, resp3);
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn each_reply_is_written_in_both_protocols() {
        let cases = [
            (Reply::Status("OK"), "+OK\r\n", "+OK\r\n"),
            (
                Reply::err("unknown"),
                "-ERR unknown\r\n",
                "-ERR unknown\r\n",
            ),
            (Reply::Integer(-1), ":-1\r\n", ":-1\r\n"),
            (Reply::text("hi"), "$2\r\nhi\r\n", "$2\r\nhi\r\n"),
            (Reply::Null, "$-1\r\n", "_\r\n"),
            (Reply::Boolean(true), ":1\r\n", "#t\r\n"),
            (
                Reply::Array(vec![Reply::Integer(0), Reply::Integer(16)]),
                "*2\r\n:0\r\n:16\r\n",
                "*2\r\n:0\r\n:16\r\n",
            ),
            (
                Reply::Map(vec![("proto", Reply::Integer(3))]),
                "*2\r\n$5\r\nproto\r\n:3\r\n",
                "%1\r\n$5\r\nproto\r\n:3\r\n",
            ),
        ];
        for (reply, resp2, resp3) in cases {
            assert_eq!(wire(reply.clone(), false), resp2, "{reply:?}");
            assert_eq!(wire(reply.clone(), true), resp3, "{reply:?}");
        }
    }

    #[test]
    fn integers_are_written_as_the_crate_writes_them() {
        let numbers = [0, 1, -1, 9, 10, 99, 100, 1_000_001, i64::MAX, i64::MIN];
        let mut replies: Vec<Reply> = numbers.iter().map(|&n| Reply::Integer(n)).collect();
        replies.push(Reply::Array(Vec::new()));
        replies.push(Reply::Array(
            numbers.iter().map(|&n| Reply::Integer(n)).collect(),
        ));
        for reply in replies {
            let mut crate2 = BytesMut::new();
            redis_protocol::resp2::encode::extend_encode(
                &mut crate2,
                &reply.clone().resp2(),
                false,
            )
            .unwrap();
            let mut crate3 = BytesMut::new();
            redis_protocol::resp3::encode::complete::extend_encode(
                &mut crate3,
                &reply.clone().resp3(),
                false,
            )
            .unwrap();
            assert_eq!(
                wire(reply.clone(), false).as_bytes(),
                &crate2[..],
                "{reply:?}"
            );
            assert_eq!(
                wire(reply.clone(), true).as_bytes(),
                &crate3[..],
                "{reply:?}"
            );
        }
    }

    #[test]
    fn an_error_quoting_a_line_break_stays_one_line() {
        let injected = Reply::err("no policy named `x\r\n*2\r\n:1\r\n:1`");
        assert_eq!(
            wire(injected, false),
            "-ERR no policy named `x  *2  :1  :1`\r\n"
        );
    }

    #[test]
    fn a_map_keeps_its_fields_in_order() {
        let map = Reply::Map(vec![
            ("server", Reply::text("weir")),
            ("version", Reply::text("1")),
            ("proto", Reply::Integer(3)),
        ]);
        let text = wire(map, true);
        let (server, version, proto) = (
            text.find("server").unwrap(),
            text.find("version").unwrap(),
            text.find("proto").unwrap(),
        );
        assert!(server < version && version < proto, "{text}");
    }
}
