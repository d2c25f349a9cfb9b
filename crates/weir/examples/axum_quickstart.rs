//! Quick start: a Weir policy in front of an axum app, through the tower layer.
//!
//! Run with `cargo run -p weir --example axum_quickstart`, then ask
//! `curl -i -H 'x-tenant: acme' http://127.0.0.1:3000/report` more than five times in a second.

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::routing::get;
use weir::TokioClock;
use weir::layer::{Extracted, PolicyLayer};
use weir::policy::{Policy, PolicyConfig};

/// `GET /report`, at most 5 a second per tenant (the `x-tenant` header), refused beyond with
/// 429 and `Retry-After`. A request without the header passes, counted as unkeyed.
pub fn app() -> Router {
    let config: PolicyConfig = toml::from_str(
        r#"
        name = "reports"
        on_exhausted = "reject"
        token_bucket = { rate = 5 }
        "#,
    )
    .expect("a valid policy");
    let policy = Arc::new(Policy::new(config, TokioClock::new()).expect("a valid policy"));
    let by_tenant = |request: &Request| {
        let tenant = request.headers().get("x-tenant")?.to_str().ok()?;
        Some(Extracted::key(tenant))
    };
    Router::new()
        .route("/report", get(|| async { "here is your report\n" }))
        .layer(PolicyLayer::new(policy, by_tenant))
}

#[tokio::main]
async fn main() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000")
        .await
        .expect("port 3000 is free");
    axum::serve(listener, app()).await.expect("serving");
}
