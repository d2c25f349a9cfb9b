//! `COMMAND`: what a client asks before it sends.

use bytes::Bytes;

use super::Session;
use crate::front_door::resp::reply::Reply;

/// `COMMAND [COUNT | DOCS | INFO …]`: enough for clients that look before they send; Weir
/// describes no commands, so a client falls back to sending them as typed.
pub(super) fn run(session: &Session, args: &[Bytes]) -> Reply {
    match args.first().map(|a| a.to_ascii_uppercase()).as_deref() {
        None => Reply::Array(Vec::new()),
        Some(b"COUNT") => Reply::Integer(0),
        Some(b"DOCS") if session.resp3 => Reply::Map(Vec::new()),
        Some(b"DOCS") => Reply::Array(Vec::new()),
        Some(b"INFO") => Reply::Array(args[1..].iter().map(|_| Reply::Null).collect()),
        Some(other) => Reply::err(format!(
            "unknown subcommand '{}'. Try COMMAND HELP.",
            String::from_utf8_lossy(other)
        )),
    }
}
