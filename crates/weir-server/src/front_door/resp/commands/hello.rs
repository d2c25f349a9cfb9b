//! `HELLO`: the protocol version (RESP2 or RESP3), with the password and a name on the way.

use bytes::Bytes;

use super::Session;
use crate::app::App;
use crate::front_door::resp::reply::Reply;

/// `HELLO [protover [AUTH user password] [SETNAME name]]`.
pub(super) fn run(app: &App, session: &mut Session, args: &[Bytes]) -> Reply {
    let mut resp3 = session.resp3;
    let mut rest = args;
    if let [version, tail @ ..] = args {
        match version.as_ref() {
            b"2" => resp3 = false,
            b"3" => resp3 = true,
            _ => return Reply::Error("NOPROTO unsupported protocol version".to_owned()),
        }
        rest = tail;
    }
    let mut name = None;
    while let [option, tail @ ..] = rest {
        match (option.to_ascii_uppercase().as_slice(), tail) {
            (b"AUTH", [user, password, more @ ..]) => {
                if let Reply::Error(error) = super::auth::run(app, session, Some(user), password) {
                    return Reply::Error(error);
                }
                rest = more;
            }
            (b"SETNAME", [value, more @ ..]) => {
                name = Some(value.clone());
                rest = more;
            }
            _ => {
                return Reply::err(format!(
                    "syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(option)
                ));
            }
        }
    }
    if !session.authenticated {
        return Reply::Error(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time".to_owned(),
        );
    }
    session.resp3 = resp3;
    if name.is_some() {
        session.name = name;
    }
    Reply::Map(vec![
        ("server", Reply::text("weir")),
        ("version", Reply::text(env!("CARGO_PKG_VERSION"))),
        ("proto", Reply::Integer(if resp3 { 3 } else { 2 })),
        ("id", Reply::Integer(session.id)),
        ("mode", Reply::text("standalone")),
        ("role", Reply::text("master")),
        ("modules", Reply::Array(Vec::new())),
    ])
}
