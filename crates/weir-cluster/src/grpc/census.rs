//! The `Census` call on the wire: a new owner asks a member what it holds for its buckets (see
//! [`census`](crate::census)).

use super::{duration_to_nanos, proto};
use crate::census::{Answer, Held, Quiet};
use std::time::Duration;

/// An answer as it travels.
pub(super) fn wire_answer(answer: Option<Answer>) -> proto::CensusReply {
    let Some(answer) = answer else {
        return proto::CensusReply::default();
    };
    proto::CensusReply {
        ready: true,
        fingerprint: answer.fingerprint,
        awake_ns: duration_to_nanos(answer.quiet.awake),
        unclean_departure_ns: answer.quiet.unclean_departure.map(duration_to_nanos),
        first_run: answer.quiet.first_run,
        held: answer
            .held
            .into_iter()
            .map(|held| proto::CensusHeld {
                bucket: held.bucket,
                owner: held.owner,
                id: held.id,
                units: held.units,
                remaining_ns: duration_to_nanos(held.remaining),
            })
            .collect(),
    }
}

/// The answer a reply carries; `None` if the member was not ready.
pub(super) fn answer_of(reply: proto::CensusReply) -> Option<Answer> {
    reply.ready.then(|| Answer {
        fingerprint: reply.fingerprint,
        quiet: Quiet {
            awake: Duration::from_nanos(reply.awake_ns),
            unclean_departure: reply.unclean_departure_ns.map(Duration::from_nanos),
            first_run: reply.first_run,
        },
        held: reply
            .held
            .into_iter()
            .map(|held| Held {
                bucket: held.bucket,
                owner: held.owner,
                id: held.id,
                units: held.units,
                remaining: Duration::from_nanos(held.remaining_ns),
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_comes_back_as_it_was_sent() {
        let answer = Answer {
            fingerprint: 42,
            quiet: Quiet {
                awake: Duration::from_secs(90),
                unclean_departure: Some(Duration::from_millis(2_500)),
                first_run: false,
            },
            held: vec![Held {
                bucket: "tables/orders".to_owned(),
                owner: "n2".to_owned(),
                id: 7,
                units: 3,
                remaining: Duration::from_millis(1_200),
            }],
        };
        assert_eq!(answer_of(wire_answer(Some(answer.clone()))), Some(answer));
        assert_eq!(answer_of(wire_answer(None)), None);
        let never = Answer {
            held: vec![],
            quiet: Quiet {
                awake: Duration::from_secs(1),
                unclean_departure: None,
                first_run: true,
            },
            fingerprint: 1,
        };
        assert_eq!(answer_of(wire_answer(Some(never.clone()))), Some(never));
    }
}
