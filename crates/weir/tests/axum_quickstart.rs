//! The axum quick start (`examples/axum_quickstart.rs`, shown whole in `docs/quickstart.md`)
//! does what the page says: five requests a second per tenant, a 429 with `Retry-After`
//! beyond, tenants apart, and requests without a tenant passing. On tokio's paused clock, so
//! exact.

#[allow(dead_code)]
#[path = "../examples/axum_quickstart.rs"]
mod quickstart;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use tower::ServiceExt;

async fn report(app: &axum::Router, tenant: Option<&str>) -> (StatusCode, Option<String>) {
    let mut request = Request::get("/report");
    if let Some(tenant) = tenant {
        request = request.header("x-tenant", tenant);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let retry = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (response.status(), retry)
}

#[tokio::test(start_paused = true)]
async fn five_a_second_per_tenant_then_429_with_retry_after() {
    let app = quickstart::app();
    for _ in 0..5 {
        assert_eq!(report(&app, Some("acme")).await, (StatusCode::OK, None));
    }
    let (status, retry) = report(&app, Some("acme")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry.as_deref(), Some("1"));
    assert_eq!(report(&app, Some("globex")).await.0, StatusCode::OK);
    assert_eq!(report(&app, None).await.0, StatusCode::OK);
    // One token back every 200 ms.
    tokio::time::advance(std::time::Duration::from_millis(200)).await;
    assert_eq!(report(&app, Some("acme")).await.0, StatusCode::OK);
    assert_eq!(
        report(&app, Some("acme")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// Each `app()` is a policy of its own: a fresh app admits a spent tenant again.
#[tokio::test(start_paused = true)]
async fn each_app_has_its_own_policy() {
    let spent = quickstart::app();
    for _ in 0..5 {
        assert_eq!(report(&spent, Some("acme")).await.0, StatusCode::OK);
    }
    assert_eq!(
        report(&spent, Some("acme")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        report(&quickstart::app(), Some("acme")).await.0,
        StatusCode::OK
    );
}
