//! What crosses the wire and back: lease requests and grants, rate decisions, handovers and
//! reports.
//! Times cross as durations, never instants.

use super::{
    Ask, Assignment, Decided, Duration, Fence, Grant, Handover, LeaseRequest, Lent, Nanos, Outcome,
    Quota, RateAsk, RateDecision, RateReport, Report, ReportAnswer, TransportError,
    duration_to_nanos, proto,
};

/// `reply` with `quota` in it.
pub(super) fn with_quota(reply: proto::DecideReply, quota: Option<Quota>) -> proto::DecideReply {
    match quota {
        Some(quota) => proto::DecideReply {
            has_quota: true,
            used: quota.used,
            remaining: quota.remaining,
            reset_after_ns: duration_to_nanos(quota.reset_after),
            ..reply
        },
        None => reply,
    }
}

/// A lease request as it crosses the wire: the caller's `now` stays behind.
pub(super) fn wire_request(request: LeaseRequest) -> proto::LeaseRequest {
    proto::LeaseRequest {
        bucket: request.bucket,
        limit: request.limit,
        holder: request.holder,
        ttl_ns: duration_to_nanos(request.ttl),
        fenced: request.fence == Fence::Closed,
        units: request.ask.units(),
        lend: request.ask.is_loan(),
        learning_ns: match request.fence {
            Fence::Closed => 0,
            Fence::Learning(learning) => duration_to_nanos(learning),
        },
    }
}

/// What a lease request on the wire asks: a plain lease (of one unit, whatever `units` says),
/// or units for the holder's loan (none: a renewal).
pub(super) fn ask_of(request: &proto::LeaseRequest) -> Ask {
    match request.lend {
        true => Ask::borrow(request.units),
        false => Ask::Lease,
    }
}

/// What the owner waits for before granting a lease request on the wire.
pub(super) fn fence_of(request: &proto::LeaseRequest) -> Fence {
    match request.fenced {
        true => Fence::Closed,
        false => Fence::Learning(Duration::from_nanos(request.learning_ns)),
    }
}

/// An owner's reply as a grant on the caller's clock (`now`: when the caller asked).
pub(super) fn grant_of(
    reply: &proto::LeaseReply,
    now: Nanos,
    owner: &str,
) -> Result<Grant, TransportError> {
    match Outcome::try_from(reply.outcome) {
        // On the wire a renewal is a grant of no units.
        Ok(Outcome::Granted) if reply.units == 0 => Ok(Grant::Renewed {
            id: reply.id,
            expires_at: now.saturating_add(reply.expires_in_ns),
            keep: reply.keep,
        }),
        Ok(Outcome::Granted) => Ok(Grant::Granted {
            id: reply.id,
            expires_at: now.saturating_add(reply.expires_in_ns),
            units: reply.units,
            keep: reply.keep,
        }),
        Ok(Outcome::Full) => Ok(Grant::Full),
        Ok(Outcome::TooManyBuckets) => Ok(Grant::TooManyBuckets),
        Ok(Outcome::Settling) => Err(TransportError::Settling {
            owner: owner.to_owned(),
            wait: Duration::from_nanos(reply.settles_in_ns),
        }),
        Ok(Outcome::NoMajority) => Err(TransportError::NoMajority {
            owner: owner.to_owned(),
            heard: usize::try_from(reply.heard).unwrap_or(usize::MAX),
            known: usize::try_from(reply.known).unwrap_or(usize::MAX),
        }),
        Ok(Outcome::NotOwner) | Err(_) => Err(TransportError::NotOwner(owner.to_owned())),
    }
}

/// What one `DecideRequest` on the wire is: a decision, a handover (a request of cost 0 with
/// its `handed` fields set, as it always has been on the wire) or a report (its `report`
/// fields set). The wire keeps one request for the three so that nodes of every version since
/// reports were added still understand each other; above the wire they are three messages.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Forwarded {
    /// A decision.
    Ask(RateAsk),
    /// A bucket handed over.
    HandOver(Handover),
    /// A holder's report.
    Report(Report),
}

/// The wire form of a decision asked.
pub(super) fn wire_ask(ask: RateAsk) -> proto::DecideRequest {
    proto::DecideRequest {
        policy: ask.policy,
        key: ask.key,
        // The wire's empty string is no kind.
        kind: ask.kind.unwrap_or_default(),
        cost: ask.cost,
        max_wait_ns: duration_to_nanos(ask.max_wait),
        relayed: ask.relayed,
        ..Default::default()
    }
}

/// The wire form of a handover.
pub(super) fn wire_handover(handover: Handover) -> proto::DecideRequest {
    proto::DecideRequest {
        policy: handover.policy,
        key: handover.key,
        handed: true,
        handed_own_kind: handover.kind.is_some(),
        kind: handover.kind.unwrap_or_default(),
        handed_used: handover.quota.used,
        handed_remaining: handover.quota.remaining,
        handed_reset_after_ns: duration_to_nanos(handover.quota.reset_after),
        handed_lent: handover
            .lent
            .into_iter()
            .map(|lent| proto::HandedLent {
                holder: lent.holder,
                shares: lent.shares,
                remaining_ns: duration_to_nanos(lent.remaining),
            })
            .collect(),
        ..Default::default()
    }
}

/// The wire form of a report.
pub(super) fn wire_report(Report { holder, report }: Report) -> proto::DecideRequest {
    proto::DecideRequest {
        policy: report.policy,
        key: report.key,
        report: true,
        holder,
        demand: report.demand,
        running: report.running,
        report_ttl_ns: duration_to_nanos(report.ttl),
        report_decides_all: report.decides_all,
        ..Default::default()
    }
}

/// A forwarded request as it came off the wire: one with `handed` set is a handover, one
/// with `report` set a report.
pub(super) fn request_of(request: proto::DecideRequest) -> Forwarded {
    if request.report {
        return Forwarded::Report(Report {
            holder: request.holder,
            report: RateReport {
                policy: request.policy,
                key: request.key,
                demand: request.demand,
                running: request.running,
                ttl: Duration::from_nanos(request.report_ttl_ns),
                decides_all: request.report_decides_all,
            },
        });
    }
    if request.handed {
        return Forwarded::HandOver(Handover {
            policy: request.policy,
            key: request.key,
            kind: request.handed_own_kind.then_some(request.kind),
            quota: Quota {
                used: request.handed_used,
                remaining: request.handed_remaining,
                reset_after: Duration::from_nanos(request.handed_reset_after_ns),
            },
            lent: request
                .handed_lent
                .into_iter()
                .map(|lent| Lent {
                    holder: lent.holder,
                    shares: lent.shares,
                    remaining: Duration::from_nanos(lent.remaining_ns),
                })
                .collect(),
        });
    }
    Forwarded::Ask(RateAsk {
        policy: request.policy,
        key: request.key,
        kind: (!request.kind.is_empty()).then_some(request.kind),
        cost: request.cost,
        max_wait: Duration::from_nanos(request.max_wait_ns),
        relayed: request.relayed,
    })
}

/// An owner's reply to a decision asked. An assignment is no answer to one: read as the
/// owner not knowing the policy, which has the asker decide on its own.
pub(super) fn decision_of(reply: proto::DecideReply) -> RateDecision {
    use proto::decide_reply::Outcome as Wire;
    let quota = reply.has_quota.then(|| Quota {
        used: reply.used,
        remaining: reply.remaining,
        reset_after: Duration::from_nanos(reply.reset_after_ns),
    });
    match Wire::try_from(reply.outcome) {
        Ok(Wire::Admitted) => RateDecision::Decided(Decided::Admitted {
            waited: Duration::from_nanos(reply.waited_ns),
            would_throttle: reply.would_throttle,
            quota,
        }),
        Ok(Wire::Refused) => RateDecision::Decided(Decided::Refused {
            retry_after: (reply.retry_after_ns > 0)
                .then(|| Duration::from_nanos(reply.retry_after_ns)),
            reason: reply.reason,
            quota,
        }),
        Ok(Wire::NotOwner) => RateDecision::NotOwner,
        Ok(Wire::Assigned | Wire::UnknownPolicy) | Err(_) => RateDecision::UnknownPolicy,
    }
}

/// An owner's reply to a report. A decision is no answer to one: read as the owner not
/// knowing the policy (the holder's share, if any, runs out at its TTL).
pub(super) fn report_answer_of(reply: proto::DecideReply) -> ReportAnswer {
    use proto::decide_reply::Outcome as Wire;
    match Wire::try_from(reply.outcome) {
        Ok(Wire::Assigned) => ReportAnswer::Assigned(Assignment {
            shares: reply.shares,
            ttl: Duration::from_nanos(reply.ttl_ns),
            tokens: reply.tokens,
        }),
        Ok(Wire::NotOwner) => ReportAnswer::NotOwner,
        Ok(_) | Err(_) => ReportAnswer::UnknownPolicy,
    }
}

/// A decision's wire reply.
pub(super) fn wire_decision(decision: RateDecision) -> proto::DecideReply {
    use proto::decide_reply::Outcome as Wire;
    match decision {
        RateDecision::Decided(Decided::Admitted {
            waited,
            would_throttle,
            quota,
        }) => with_quota(
            proto::DecideReply {
                outcome: Wire::Admitted as i32,
                waited_ns: duration_to_nanos(waited),
                would_throttle,
                ..Default::default()
            },
            quota,
        ),
        RateDecision::Decided(Decided::Refused {
            retry_after,
            reason,
            quota,
        }) => with_quota(
            proto::DecideReply {
                outcome: Wire::Refused as i32,
                retry_after_ns: retry_after.map_or(0, duration_to_nanos),
                reason,
                ..Default::default()
            },
            quota,
        ),
        RateDecision::NotOwner => outcome_only(Wire::NotOwner),
        RateDecision::UnknownPolicy => outcome_only(Wire::UnknownPolicy),
    }
}

/// A report's wire reply.
pub(super) fn wire_report_answer(answer: ReportAnswer) -> proto::DecideReply {
    use proto::decide_reply::Outcome as Wire;
    match answer {
        ReportAnswer::Assigned(assignment) => proto::DecideReply {
            outcome: Wire::Assigned as i32,
            shares: assignment.shares,
            ttl_ns: duration_to_nanos(assignment.ttl),
            tokens: assignment.tokens,
            ..Default::default()
        },
        ReportAnswer::NotOwner => outcome_only(Wire::NotOwner),
        ReportAnswer::UnknownPolicy => outcome_only(Wire::UnknownPolicy),
    }
}

/// A reply that is only its outcome.
pub(super) fn outcome_only(outcome: proto::decide_reply::Outcome) -> proto::DecideReply {
    proto::DecideReply {
        outcome: outcome as i32,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
