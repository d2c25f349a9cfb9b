//! The live page at `/ui`: a page, its script and style, and the vendored uPlot, all embedded
//! in the binary when it is built, so the server reads no file and fetches nothing to serve it.
//!
//! The page draws from the JSON API (`/v1/policies`, `/v1/stats`, `/v1/throttles`,
//! `/v1/cluster`), polled once a second, and edits a policy through `PUT /v1/policies/{name}`
//! with its `ETag`. It is under the API's own rules: reading is open, as every read endpoint
//! is; a change needs the admin token, which the page keeps in memory and sends only in the
//! `Authorization` header. The assets themselves hold no secret and are served to anyone.

use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// One embedded file and how it is served.
#[derive(Debug)]
pub struct Asset {
    /// Its name under `/ui/` (the page itself is `/ui`).
    pub name: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes, as built into the binary.
    pub bytes: &'static [u8],
    /// Its entity tag: a hash of its bytes, computed when the binary is built.
    pub etag: &'static str,
}

/// FNV-1a over `bytes`: a build-time fingerprint, not a defence against anyone (the bytes are
/// public), only a way for a browser to tell an asset changed.
const fn fingerprint(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}

/// `"` + 16 hex digits + `"`, made in a constant.
const fn quoted_hex(value: u64) -> [u8; 18] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [b'"'; 18];
    let mut i = 0;
    while i < 16 {
        out[1 + i] = DIGITS[((value >> (60 - 4 * i)) & 0xf) as usize];
        i += 1;
    }
    out
}

macro_rules! asset {
    ($name:literal, $path:literal, $content_type:literal) => {{
        const BYTES: &[u8] = include_bytes!($path);
        const TAG: [u8; 18] = quoted_hex(fingerprint(BYTES));
        Asset {
            name: $name,
            content_type: $content_type,
            bytes: BYTES,
            etag: match std::str::from_utf8(&TAG) {
                Ok(tag) => tag,
                Err(_) => panic!("an entity tag is ASCII"),
            },
        }
    }};
}

/// The page, `/ui`.
pub static PAGE: Asset = asset!("", "ui/index.html", "text/html; charset=utf-8");

/// The files under `/ui/`.
pub static ASSETS: [Asset; 5] = [
    asset!("app.js", "ui/app.js", "text/javascript; charset=utf-8"),
    asset!("style.css", "ui/style.css", "text/css; charset=utf-8"),
    asset!(
        "uPlot.iife.min.js",
        "ui/vendor/uplot/uPlot.iife.min.js",
        "text/javascript; charset=utf-8"
    ),
    asset!(
        "uPlot.min.css",
        "ui/vendor/uplot/uPlot.min.css",
        "text/css; charset=utf-8"
    ),
    asset!(
        "uPlot.LICENSE",
        "ui/vendor/uplot/LICENSE",
        "text/plain; charset=utf-8"
    ),
];

/// What the page may load and talk to: its own origin only, no inline script, no framing.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// `GET /ui`.
#[utoipa::path(
    get,
    path = "/ui",
    tag = "observing",
    params(("If-None-Match" = Option<String>, Header, description = "An `ETag` the browser holds.")),
    responses(
        (status = 200, description = "The live page.", body = String, content_type = "text/html; charset=utf-8",
            headers(("ETag" = String), ("Cache-Control" = String))),
        (status = 304, description = "The browser's copy is current."),
    )
)]
pub async fn page(headers: HeaderMap) -> Response {
    serve(&PAGE, &headers)
}

/// `GET /ui/{asset}`.
#[utoipa::path(
    get,
    path = "/ui/{asset}",
    tag = "observing",
    params(
        ("asset" = String, Path, pattern = r"^(app\.js|style\.css|uPlot\.iife\.min\.js|uPlot\.min\.css|uPlot\.LICENSE)$",
            description = "`app.js`, `style.css`, `uPlot.iife.min.js`, `uPlot.min.css` or `uPlot.LICENSE`."),
        ("If-None-Match" = Option<String>, Header, description = "An `ETag` the browser holds."),
    ),
    responses(
        (status = 200, description = "The asset, with its type.",
            content(
                (String = "text/javascript; charset=utf-8"),
                (String = "text/css; charset=utf-8"),
                (String = "text/plain; charset=utf-8"),
            ),
            headers(("ETag" = String), ("Cache-Control" = String))),
        (status = 304, description = "The browser's copy is current."),
        (status = 404, description = "No such asset (`not_found`).", body = super::ErrorBody),
    )
)]
pub async fn asset(Path(name): Path<String>, headers: HeaderMap) -> Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(found) => serve(found, &headers),
        None => crate::error::ApiError::new(
            crate::error::ErrorKind::NotFound,
            format!("no asset `{name}` under /ui/"),
        )
        .into_response(),
    }
}

/// The asset, or 304 when the browser holds it already: every load asks again (`no-cache`),
/// and an unchanged asset costs one small answer.
fn serve(asset: &Asset, headers: &HeaderMap) -> Response {
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|tags| {
            tags.split(',')
                .any(|t| t.trim() == asset.etag || t.trim() == "*")
        });
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, asset.content_type)], asset.bytes).into_response()
    };
    let out = response.headers_mut();
    out.insert(header::ETAG, HeaderValue::from_static(asset.etag));
    out.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    out.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    out.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    out.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_has_a_distinct_tag_and_is_not_empty() {
        let all: Vec<&Asset> = std::iter::once(&PAGE).chain(ASSETS.iter()).collect();
        for a in &all {
            assert!(!a.bytes.is_empty(), "{}", a.name);
            assert_eq!(a.etag.len(), 18);
        }
        let mut tags: Vec<&str> = all.iter().map(|a| a.etag).collect();
        tags.sort();
        tags.dedup();
        assert_eq!(tags.len(), all.len());
    }

    /// The page names only assets that are served.
    #[test]
    fn the_page_loads_only_served_assets() {
        let page = std::str::from_utf8(PAGE.bytes).unwrap();
        for reference in page.split("/ui/").skip(1) {
            let name: String = reference
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '_')
                .collect();
            assert!(
                ASSETS.iter().any(|a| a.name == name),
                "the page loads `/ui/{name}`, which is not served"
            );
        }
    }

    #[tokio::test]
    async fn an_unchanged_asset_is_a_304() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_static(ASSETS[0].etag),
        );
        let response = serve(&ASSETS[0], &headers);
        assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
        let response = serve(&ASSETS[0], &HeaderMap::new());
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[header::ETAG], ASSETS[0].etag);
        assert_eq!(response.headers()[header::CACHE_CONTROL], "no-cache");
    }
}
