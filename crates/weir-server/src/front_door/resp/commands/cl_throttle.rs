//! `CL.THROTTLE`: redis-cell's command, decided by the core's cells and answered as
//! redis-cell answers.

use bytes::Bytes;

use super::{arity, integer};
use crate::app::cells::Throttle;
use crate::app::{App, MAX_KEY_BYTES};
use crate::front_door::resp::reply::Reply;

/// `CL.THROTTLE key max_burst count period [quantity]`.
pub(super) fn run(app: &App, args: &[Bytes]) -> Reply {
    let (key, numbers) = match args {
        [key, numbers @ ..] if (3..=4).contains(&numbers.len()) => (key, numbers),
        _ => return arity("cl.throttle"),
    };
    let mut parsed = [0i64; 4];
    parsed[3] = 1;
    for (slot, arg) in parsed.iter_mut().zip(numbers) {
        match integer(arg) {
            Ok(n) => *slot = n,
            Err(reply) => return reply,
        }
    }
    let [max_burst, count, period, quantity] = parsed;
    let throttle = Throttle {
        max_burst,
        count,
        period,
        quantity,
    };
    if key.len() > MAX_KEY_BYTES {
        return Reply::err(format!(
            "key is {} bytes long; the most is {MAX_KEY_BYTES}",
            key.len()
        ));
    }
    match app.throttle_cell(key, &throttle) {
        Ok(verdict) => Reply::Array(
            [
                i64::from(verdict.limited),
                verdict.limit,
                verdict.remaining,
                verdict.retry_after,
                verdict.reset_after,
            ]
            .map(Reply::Integer)
            .to_vec(),
        ),
        Err(error) => Reply::err(error),
    }
}
