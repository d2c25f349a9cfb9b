//! `CLIENT`: a connection's name and id.

use bytes::Bytes;

use super::{Session, arity};
use crate::front_door::resp::reply::Reply;

/// `CLIENT SETNAME | GETNAME | SETINFO | ID`.
pub(super) fn run(session: &mut Session, args: &[Bytes]) -> Reply {
    let Some(sub) = args.first() else {
        return arity("client");
    };
    match (sub.to_ascii_uppercase().as_slice(), &args[1..]) {
        (b"SETNAME", [name]) => {
            if name.iter().any(|b| *b <= b' ' || *b > b'~') {
                return Reply::err(
                    "Client names cannot contain spaces, newlines or special characters.",
                );
            }
            session.name = (!name.is_empty()).then(|| name.clone());
            Reply::Status("OK")
        }
        (b"GETNAME", []) => session.name.clone().map_or(Reply::Null, Reply::Bulk),
        (b"SETINFO", [_, _]) => Reply::Status("OK"),
        (b"ID", []) => Reply::Integer(session.id),
        _ => Reply::err(format!(
            "unknown subcommand or wrong number of arguments for '{}'. Try CLIENT HELP.",
            String::from_utf8_lossy(sub)
        )),
    }
}
