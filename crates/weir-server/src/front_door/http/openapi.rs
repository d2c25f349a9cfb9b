//! The HTTP API as an OpenAPI 3.1 document, derived from the handlers' own types and their
//! `#[utoipa::path]` descriptions, served at `GET /v1/openapi.json` and checked into
//! `docs/openapi.json` (a test holds the two equal). Clients are generated from it, and
//! schemathesis fuzzes a live server against it in CI.

use std::sync::LazyLock;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use utoipa::OpenApi;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};

use super::cluster_members;
use super::handlers;
use super::policy_override;
use super::ui;

/// The document's description: what every operation shares.
const DESCRIPTION: &str = "Weir's HTTP API: admission under named policies (the data plane), \
policies changed live (the admin token), and what the node and the cluster are doing. Every \
error answers `{error, detail}`: `error` a stable word, `detail` a sentence naming what is \
wrong. A server with an admin token needs it (`Authorization: Bearer <token>`) on policy \
changes; one with a data token needs either token on the data plane. A server without an \
admin token answers state-changing calls only for loopback or listed hosts.";

#[derive(OpenApi)]
#[openapi(
    info(title = "Weir", description = DESCRIPTION, license(name = "Apache-2.0")),
    paths(
        handlers::acquire,
        handlers::release,
        handlers::renew,
        handlers::busy,
        handlers::list_policies,
        handlers::get_policy,
        handlers::put_policy,
        handlers::delete_policy,
        handlers::throttles,
        handlers::cluster,
        cluster_members::forget,
        policy_override::revert,
        handlers::stats,
        openapi,
        ui::page,
        ui::asset,
        handlers::metrics,
        handlers::healthz,
        handlers::readyz,
    ),
    modifiers(&BearerToken),
    tags(
        (name = "data plane", description = "Admission, leases and busy signals."),
        (name = "policies", description = "Policies, read by anyone and changed with the admin token."),
        (name = "observing", description = "What the node and the cluster are doing."),
    )
)]
struct ApiDoc;

/// The `bearer` security scheme: the admin token, or the data token on the data plane.
struct BearerToken;

impl utoipa::Modify for BearerToken {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let components = api.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                Http::builder()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The admin token (`admin_token`, WEIR_ADMIN_TOKEN) for policy changes; \
                         on the data plane, the data token (`data_token`, WEIR_DATA_TOKEN) or \
                         the admin token.",
                    ))
                    .build(),
            ),
        );
    }
}

/// The document as JSON, with the running version: made once.
static DOCUMENT: LazyLock<(String, HeaderValue)> = LazyLock::new(|| {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    let mut doc = serde_json::to_value(doc).unwrap_or_default();
    // A policy names exactly one limiter table: serde reads the tables as optional fields (null
    // as absent) and refuses none or two, which JSON Schema says as one of "this table is
    // given, as an object".
    doc["components"]["schemas"]["PolicyConfig"]["oneOf"] = weir::policy::config::limiter_tables()
        .map(|table| {
            serde_json::json!({ "required": [table], "properties": { table: { "type": "object" } } })
        })
        .collect();
    let mut json = serde_json::to_string_pretty(&doc).unwrap_or_default();
    json.push('\n');
    let etag = format!("\"{:016x}\"", xxhash_rust::xxh3::xxh3_64(json.as_bytes()));
    let etag = HeaderValue::from_str(&etag).unwrap_or(HeaderValue::from_static("\"0\""));
    (json, etag)
});

/// The OpenAPI document, as `GET /v1/openapi.json` serves it.
#[cfg(test)]
fn openapi_json() -> &'static str {
    &DOCUMENT.0
}

/// This document.
#[utoipa::path(
    get,
    path = super::route::OPENAPI,
    tag = "observing",
    params(("If-None-Match" = Option<String>, Header, description = "An `ETag` the client holds.")),
    responses(
        (status = 200, description = "The OpenAPI 3.1 document of this API.", content_type = "application/json",
            headers(("ETag" = String))),
        (status = 304, description = "The client's copy is current."),
    )
)]
pub(super) async fn openapi(headers: HeaderMap) -> Response {
    let (json, etag) = &*DOCUMENT;
    if headers.get(header::IF_NONE_MATCH) == Some(etag) {
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag.clone())]).into_response();
    }
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (header::ETAG, etag.clone()),
        ],
        json.as_str(),
    )
        .into_response()
}

#[cfg(test)]
mod tests;
