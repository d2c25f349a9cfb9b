//! `AUTH [user] password`: the data token as the password.

use super::Session;
use crate::app::App;
use crate::front_door::resp::reply::Reply;

/// The password is the data token, given alone or as user `default`'s (Redis's one user
/// without ACLs). The admin token is never a password here: a service that throttles through
/// Redis holds no credential that rewrites policies.
pub(super) fn run(app: &App, session: &mut Session, user: Option<&[u8]>, password: &[u8]) -> Reply {
    let given = String::from_utf8_lossy(password);
    if !app.access().needs_data_token() {
        return Reply::err(
            "AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        );
    }
    if user.is_none_or(|user| user == b"default") && app.access().check_password(&given) {
        session.authenticated = true;
        Reply::Status("OK")
    } else {
        Reply::Error("WRONGPASS invalid username-password pair or user is disabled.".to_owned())
    }
}
