//! What crosses the wire and back: lease requests and grants, rate decisions and handovers.
//! Times cross as durations, never instants.

use super::{
    Ask, Assignment, Decided, Duration, Fence, Grant, Handover, LeaseRequest, Lent, Nanos, Outcome,
    Quota, RateAsk, RateDecision, RateReport, RateRequest, TransportError, duration_to_nanos,
    proto,
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

/// The wire form of a forwarded request. A handover travels as a request of cost 0 with its
/// `handed` fields set, as it always has on the wire; a report with its `report` ones.
pub(super) fn wire_decide(request: RateRequest) -> proto::DecideRequest {
    match request {
        RateRequest::Decide(ask) => proto::DecideRequest {
            policy: ask.policy,
            key: ask.key,
            // The wire's empty string is no kind.
            kind: ask.kind.unwrap_or_default(),
            cost: ask.cost,
            max_wait_ns: duration_to_nanos(ask.max_wait),
            relayed: ask.relayed,
            ..Default::default()
        },
        RateRequest::HandOver(handover) => proto::DecideRequest {
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
        },
        RateRequest::Report { holder, report } => proto::DecideRequest {
            policy: report.policy,
            key: report.key,
            report: true,
            holder,
            demand: report.demand,
            running: report.running,
            report_ttl_ns: duration_to_nanos(report.ttl),
            report_decides_all: report.decides_all,
            ..Default::default()
        },
    }
}

/// A forwarded request as it came off the wire: one with `handed` set is a handover, one
/// with `report` set a report.
pub(super) fn request_of(request: proto::DecideRequest) -> RateRequest {
    if request.report {
        return RateRequest::Report {
            holder: request.holder,
            report: RateReport {
                policy: request.policy,
                key: request.key,
                demand: request.demand,
                running: request.running,
                ttl: Duration::from_nanos(request.report_ttl_ns),
                decides_all: request.report_decides_all,
            },
        };
    }
    if request.handed {
        return RateRequest::HandOver(Handover {
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
    RateRequest::Decide(RateAsk {
        policy: request.policy,
        key: request.key,
        kind: (!request.kind.is_empty()).then_some(request.kind),
        cost: request.cost,
        max_wait: Duration::from_nanos(request.max_wait_ns),
        relayed: request.relayed,
    })
}

/// An owner's reply as a decision.
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
        Ok(Wire::Assigned) => RateDecision::Assigned(Assignment {
            shares: reply.shares,
            ttl: Duration::from_nanos(reply.ttl_ns),
            tokens: reply.tokens,
        }),
        Ok(Wire::NotOwner) => RateDecision::NotOwner,
        Ok(Wire::UnknownPolicy) | Err(_) => RateDecision::UnknownPolicy,
    }
}

#[cfg(test)]
mod tests;
