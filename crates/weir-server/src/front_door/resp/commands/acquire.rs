//! `WEIR.ACQUIRE`: an admission, as the HTTP API's `POST /v1/acquire` asks it.

use std::sync::Arc;

use bytes::Bytes;

use super::{Answer, api_error, arity, millis, non_negative, now_or_later};
use crate::app::{AcquireInput, AcquireOutcome, App};
use crate::error::ApiError;
use crate::front_door::resp::reply::Reply;

/// `WEIR.ACQUIRE policy key [KIND k] [COST n] [WAIT ms]`.
pub(super) fn run(app: &Arc<App>, args: &[Bytes]) -> Answer {
    let input = match acquire_input(args) {
        Ok(input) => input,
        Err(reply) => return Answer::Now(reply),
    };
    let app = Arc::clone(app);
    now_or_later(async move { acquire_reply(app.acquire(&input).await) })
}

fn acquire_input(args: &[Bytes]) -> Result<AcquireInput, Reply> {
    let [policy, key, options @ ..] = args else {
        return Err(arity("weir.acquire"));
    };
    let text = |arg: &Bytes| String::from_utf8_lossy(arg).into_owned();
    let mut input = AcquireInput {
        policy: text(policy),
        key: text(key),
        kind: None,
        cost: None,
        max_wait_ms: None,
    };
    let mut rest = options;
    while let [option, tail @ ..] = rest {
        let [value, more @ ..] = tail else {
            return Err(Reply::err(format!(
                "syntax error: {} needs a value",
                String::from_utf8_lossy(option)
            )));
        };
        match option.to_ascii_uppercase().as_slice() {
            b"KIND" => input.kind = Some(text(value)),
            b"COST" => input.cost = Some(non_negative(value, "COST")?),
            b"WAIT" => input.max_wait_ms = Some(non_negative(value, "WAIT")?),
            _ => {
                return Err(Reply::err(format!(
                    "syntax error: unknown option '{}' (KIND, COST, WAIT)",
                    String::from_utf8_lossy(option)
                )));
            }
        }
        rest = more;
    }
    Ok(input)
}

/// An acquisition's outcome as fields, the HTTP API's names: `admitted`, then when admitted
/// `waited_ms`, `lease` and `ttl_ms` (nil and −1 for a rate policy), `tier` and
/// `would_throttle`; when refused `retry_after_ms` (−1 if unknown) and `reason`.
fn acquire_reply(outcome: Result<AcquireOutcome, ApiError>) -> Reply {
    match outcome {
        Ok(AcquireOutcome::Admitted {
            waited,
            lease,
            would_throttle,
            tier,
            ..
        }) => Reply::Map(vec![
            ("admitted", Reply::Boolean(true)),
            ("waited_ms", Reply::Integer(millis(waited))),
            (
                "lease",
                lease
                    .as_ref()
                    .map_or(Reply::Null, |(id, _)| Reply::text(id.clone())),
            ),
            (
                "ttl_ms",
                Reply::Integer(lease.map_or(-1, |(_, ttl)| millis(ttl))),
            ),
            ("tier", Reply::text(tier.name())),
            ("would_throttle", Reply::Boolean(would_throttle)),
        ]),
        Ok(AcquireOutcome::Refused {
            retry_after,
            reason,
            ..
        }) => Reply::Map(vec![
            ("admitted", Reply::Boolean(false)),
            (
                "retry_after_ms",
                Reply::Integer(retry_after.map_or(-1, millis)),
            ),
            ("reason", Reply::text(reason)),
        ]),
        Err(error) => api_error(&error),
    }
}
