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
    let request = RateRequest::Report {
        holder: "n1/rlqs/0".into(),
        report: report.clone(),
    };
    let RateRequest::Report {
        holder,
        report: across,
    } = request_of(wire_decide(request))
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
    let RateRequest::Report { report, .. } = request_of(old) else {
        panic!("a report");
    };
    assert_eq!((report.ttl(), report.decides_all), (ASSIGNMENT_TTL, false));
}
