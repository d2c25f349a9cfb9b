use super::*;
use crate::assignment::ASSIGNMENT_TTL;

#[test]
fn a_report_crosses_the_wire_with_its_ttl_and_whether_its_holder_can_forward() {
    let report = RateReport {
        policy: "tenants".into(),
        key: "acme".into(),
        demand: 120,
        running: 333,
        ttl: Duration::from_secs(4),
        decides_all: true,
    };
    let request = Report {
        holder: "n1/rlqs/0".into(),
        report: report.clone(),
    };
    let Forwarded::Report(Report {
        holder,
        report: across,
    }) = request_of(wire_report(request))
    else {
        panic!("a report comes back a report");
    };
    assert_eq!((holder.as_str(), across), ("n1/rlqs/0", report));
    // A node's own report, from a peer that sends neither field, runs the default.
    let old = proto::DecideRequest {
        report: true,
        holder: "n2".into(),
        ..Default::default()
    };
    let Forwarded::Report(Report { report, .. }) = request_of(old) else {
        panic!("a report");
    };
    assert_eq!((report.ttl(), report.decides_all), (ASSIGNMENT_TTL, false));
}

#[test]
fn each_reply_is_read_as_its_own_kind_only() {
    use proto::decide_reply::Outcome as Wire;
    let assignment = Assignment {
        shares: 3,
        ttl: Duration::from_secs(4),
        tokens: 2,
    };
    let assigned = wire_report_answer(ReportAnswer::Assigned(assignment));
    assert_eq!(
        report_answer_of(assigned.clone()),
        ReportAnswer::Assigned(assignment)
    );
    // An assignment answering a decision, or a decision answering a report, is no answer.
    assert_eq!(decision_of(assigned), RateDecision::UnknownPolicy);
    let admitted = wire_decision(RateDecision::Decided(Decided::Admitted {
        waited: Duration::ZERO,
        would_throttle: false,
        quota: None,
    }));
    assert_eq!(report_answer_of(admitted), ReportAnswer::UnknownPolicy);
    assert_eq!(
        report_answer_of(outcome_only(Wire::NotOwner)),
        ReportAnswer::NotOwner
    );
    // A handover and an ask come back as what they were.
    let ask = RateAsk {
        policy: "p".into(),
        key: "k".into(),
        kind: Some("read".into()),
        cost: 2,
        max_wait: Duration::from_millis(5),
        relayed: true,
    };
    assert_eq!(request_of(wire_ask(ask.clone())), Forwarded::Ask(ask));
    let handover = Handover {
        policy: "p".into(),
        key: "k".into(),
        kind: None,
        quota: Quota {
            used: 3,
            remaining: 7,
            reset_after: Duration::from_secs(1),
        },
        lent: Vec::new(),
    };
    assert_eq!(
        request_of(wire_handover(handover.clone())),
        Forwarded::HandOver(handover)
    );
}
