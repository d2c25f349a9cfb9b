//! `WEIR.RENEW`: a lease's time to live extended.

use std::sync::Arc;

use bytes::Bytes;

use super::{Answer, api_error, arity, millis, non_negative, now_or_later};
use crate::app::App;
use crate::front_door::resp::reply::Reply;

/// `WEIR.RENEW lease [TTL ms]`: the lease's time left, in milliseconds.
pub(super) fn run(app: &Arc<App>, args: &[Bytes]) -> Answer {
    let (lease, ttl_ms) = match args {
        [lease] => (lease, None),
        [lease, option, value] if option.eq_ignore_ascii_case(b"TTL") => {
            match non_negative(value, "TTL") {
                Ok(ms) => (lease, Some(ms)),
                Err(reply) => return Answer::Now(reply),
            }
        }
        _ => return Answer::Now(arity("weir.renew")),
    };
    let lease = String::from_utf8_lossy(lease).into_owned();
    let app = Arc::clone(app);
    now_or_later(async move {
        match app.renew(&lease, ttl_ms).await {
            Ok(left) => Reply::Integer(millis(left)),
            Err(error) => api_error(&error),
        }
    })
}
