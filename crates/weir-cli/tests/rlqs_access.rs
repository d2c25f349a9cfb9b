//! Envoy's rate limit quota service (RLQS) behind the data token, on a real `weir serve`: a
//! stream that claims a tenant's share must carry the token as every other data-plane call
//! does, or anyone could take a victim's whole rate by reporting demand for it.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use support::{Server, counter};
use tonic::Code;
use weir_api::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use weir_api::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use weir_api::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use weir_api::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};

const CONFIG: &str = r#"
[[policy]]
name = "tb"
on_exhausted = "reject"
token_bucket = { rate = 200, burst = 20 }
"#;

const TOKEN: &str = "a-data-token-of-some-length";

/// One report of huge demand for `{policy: tb, key: victim}`.
fn greedy_report() -> RateLimitQuotaUsageReports {
    let bucket: HashMap<String, String> = [("policy", "tb"), ("key", "victim")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    RateLimitQuotaUsageReports {
        domain: "edge".to_owned(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(BucketId { bucket }),
            time_elapsed: Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
            num_requests_allowed: 1_000_000,
            num_requests_denied: 0,
        }],
    }
}

/// Opens a stream with `authorization` (if any), sends one greedy report, and returns the
/// stream's refusal or its first push.
async fn open(
    server: &Server,
    authorization: Option<&str>,
) -> Result<Option<Action>, tonic::Status> {
    let mut client = RateLimitQuotaServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    let mut request = tonic::Request::new(tokio_stream::iter(vec![greedy_report()]).chain(
        // Kept open: a stream that ends is closed by the service.
        tokio_stream::pending(),
    ));
    if let Some(authorization) = authorization {
        request
            .metadata_mut()
            .insert("authorization", authorization.parse().unwrap());
    }
    let mut pushes = client.stream_rate_limit_quotas(request).await?.into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), pushes.message())
        .await
        .expect("an answer within 10 s")?;
    Ok(first.and_then(|r| r.bucket_action.into_iter().next()?.bucket_action))
}

use tokio_stream::StreamExt as _;

#[tokio::test]
async fn an_rlqs_stream_needs_the_data_token() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        CONFIG,
        &dir.path().join("data"),
        &[("WEIR_DATA_TOKEN", TOKEN)],
    );

    let refused = open(&server, None).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    let wrong = open(&server, Some("Bearer not-the-token-at-all-really"))
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), Code::PermissionDenied, "{wrong:?}");
    let wrong_case = open(&server, Some(&format!("Bearer {}", TOKEN.to_uppercase())))
        .await
        .unwrap_err();
    assert_eq!(wrong_case.code(), Code::PermissionDenied, "{wrong_case:?}");
    // None of them was lent anything.
    assert_eq!(
        counter(&server, "weir_rlqs_asks_total{outcome=\"assigned\"}").await,
        0
    );
    // Each refusal counted, as RLS's are.
    let refusals = |code: &'static str| {
        let server = &server;
        async move {
            counter(
                server,
                &format!(
                    "weir_api_requests_total{{api=\"grpc\",endpoint=\"StreamRateLimitQuotas\",code=\"{code}\"}}"
                ),
            )
            .await
        }
    };
    assert_eq!(refusals("16").await, 1);
    assert_eq!(refusals("7").await, 2);

    // With the token, the same report is answered with a share.
    let answered = open(&server, Some(&format!("Bearer {TOKEN}")))
        .await
        .unwrap();
    assert!(
        matches!(answered, Some(Action::QuotaAssignmentAction(_))),
        "{answered:?}"
    );
    assert_eq!(
        counter(&server, "weir_rlqs_asks_total{outcome=\"assigned\"}").await,
        1
    );
    assert_eq!(refusals("0").await, 1);
}

/// A stream can name any number of bucket ids no rule maps: each is counted, and one line a
/// minute is logged, however many come and however large they are (here 500 ids of 2 KB).
#[tokio::test]
async fn unmapped_buckets_are_counted_and_logged_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(CONFIG, &dir.path().join("data"));
    let unmapped = |i: usize| BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: [(format!("tenant-{i}"), "x".repeat(2_000))]
                .into_iter()
                .collect(),
        }),
        time_elapsed: None,
        num_requests_allowed: 1,
        num_requests_denied: 0,
    };
    let report = RateLimitQuotaUsageReports {
        domain: "edge".to_owned(),
        bucket_quota_usages: (0..500).map(unmapped).collect(),
    };
    let mut client = RateLimitQuotaServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    let request = tokio_stream::iter(vec![report]).chain(tokio_stream::pending());
    let pushes = client.stream_rate_limit_quotas(request).await.unwrap();
    support::eventually(
        Duration::from_secs(10),
        "every unmapped id counted",
        || async { counter(&server, "weir_rlqs_unmapped_buckets_total").await == 500 },
    )
    .await;
    // Killed: a graceful stop would wait for the open stream's connection to close.
    drop((pushes, client));
    server.signal("KILL");
    let (_, stderr) = server.wait();
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("matches no [[rlqs.bucket]] rule"))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].len() < 1_000,
        "the id cut short: {}",
        lines[0].len()
    );
}
