//! The unit tests of `http.rs`.

use axum::body::Body;
use axum::extract::MatchedPath;
use tower::ServiceExt;

use super::body::is_json;
use super::headers::{rate_limit_headers, write_quota};
use super::*;
use crate::app::AppSettings;
use axum::http::{HeaderMap, HeaderValue, header};
use std::time::Duration;

/// The label [`endpoint_of`] gives a path is the route the router matches it to.
#[tokio::test]
async fn the_endpoint_label_is_the_route_the_router_matches() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::new(AppSettings::for_test(dir.path())).unwrap();
    // Another front door's routes on the port are labelled by path too.
    let others = OtherRoutes::none().merge(OtherRoutes {
        router: Router::new()
            .route("/v1/GetRateLimits", post(|| async {}))
            .route("/v1/HealthCheck", get(|| async {}))
            .route("/v1/LiveCheck", get(|| async {})),
        paths: vec!["/v1/GetRateLimits", "/v1/HealthCheck", "/v1/LiveCheck"],
    });
    let other_paths = others.paths;
    let routes = routes(app, others.router).layer(axum::middleware::from_fn(
        |request: Request, next: axum::middleware::Next| async {
            let matched = request
                .extensions()
                .get::<MatchedPath>()
                .map_or(route::UNMATCHED.to_owned(), |p| p.as_str().to_owned());
            let mut response = next.run(request).await;
            response
                .headers_mut()
                .insert("x-matched", HeaderValue::from_str(&matched).unwrap());
            response
        },
    ));
    let paths = [
        "/v1/acquire",
        "/v1/release",
        "/v1/renew",
        "/v1/busy",
        "/v1/policies",
        "/v1/policies/x",
        "/v1/policies/a%2Fb",
        "/v1/policies/",
        "/v1/policies/x/y",
        "/v1/throttles",
        "/v1/cluster",
        "/v1/stats",
        "/ui",
        "/ui/",
        "/ui/app.js",
        "/ui/nope.js",
        "/ui/a/b",
        "/ui/app.js/",
        "/metrics",
        "/healthz",
        "/readyz",
        "/v1/GetRateLimits",
        "/v1/HealthCheck",
        "/v1/LiveCheck",
        "/v1/getratelimits",
        "/v1/acquire/",
        "//v1/acquire",
        "/V1/ACQUIRE",
        "/",
        "/nope",
    ];
    for path in paths {
        for method in [axum::http::Method::GET, axum::http::Method::POST] {
            let request = Request::builder()
                .method(method.clone())
                .uri(path)
                .body(Body::empty())
                .unwrap();
            let response = routes.clone().oneshot(request).await.unwrap();
            assert_eq!(
                response.headers()["x-matched"],
                endpoint_of(path, &other_paths),
                "{method} {path}"
            );
        }
    }
}

#[test]
fn json_is_what_axum_takes_for_json() {
    let json = |value: &str| {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_str(value).unwrap());
        is_json(&headers)
    };
    for yes in [
        "application/json",
        "Application/JSON",
        "application/json; charset=utf-8",
        "application/problem+json",
        " application/vnd.api+JSON ;x=y",
    ] {
        assert!(json(yes), "{yes}");
    }
    for no in [
        "text/json",
        "application/jsonx",
        "application",
        "text/plain",
        "+json",
        "",
    ] {
        assert!(!json(no), "{no}");
    }
    assert!(!is_json(&HeaderMap::new()));
}

#[test]
fn a_quota_is_written_as_display_writes_it() {
    let mut quotas = vec![0.0, -0.0, 1.0, 7.0, 1e9, 2f64.powi(53), 2f64.powi(53) + 2.0];
    quotas.extend([1e20, 3.5e300, f64::INFINITY, f64::MAX]);
    quotas.extend((0..64).map(|bits| 2f64.powi(bits) - 1.0));
    for quota in quotas {
        let mut written = Vec::new();
        write_quota(&mut written, quota);
        assert_eq!(
            String::from_utf8(written).unwrap(),
            quota.to_string(),
            "{quota:e}"
        );
    }
}

#[test]
fn rate_limit_headers_name_the_policy_quota_and_reset() {
    let mut headers = HeaderMap::new();
    rate_limit_headers(&mut headers, "p", Some(100.7), None);
    assert_eq!(headers["ratelimit-policy"], "\"p\";q=100;w=1");
    assert!(headers.get("ratelimit").is_none());
    rate_limit_headers(
        &mut headers,
        "p",
        Some(5.0),
        Some(Duration::from_millis(1500)),
    );
    assert_eq!(headers["ratelimit-policy"], "\"p\";q=5;w=1");
    assert_eq!(headers["ratelimit"], "\"p\";r=0;t=2");
    let mut none = HeaderMap::new();
    rate_limit_headers(&mut none, "p", None, Some(Duration::ZERO));
    assert!(none.is_empty());
}
