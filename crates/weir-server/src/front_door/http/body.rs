//! Request bodies read within their limit and timeout, as JSON only, and errors written as
//! `{error, detail}`.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use axum::Json;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;

use crate::app::{App, MAX_BODY_BYTES};
use crate::error::{ApiError, ErrorKind};

/// Every error's body: `{error, detail}`.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorBody<'a> {
    /// The stable word clients match on: `invalid_request`, `unauthenticated`, `forbidden`,
    /// `host_not_allowed`, `not_found`, `unknown_policy`, `unknown_lease`,
    /// `method_not_allowed`, `body_timeout`, `conflict`, `precondition_failed`, `too_large`,
    /// `internal`, `not_ready`, `shutting_down`, `no_quorum` or `outcome_unknown`.
    error: &'a str,
    /// What is wrong, in a sentence that names the field or the thing at fault.
    detail: &'a str,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (
            status,
            Json(ErrorBody {
                error: self.code(),
                detail: self.detail(),
            }),
        )
            .into_response();
        // A majority is usually back within an election or two.
        if self.kind() == ErrorKind::NoQuorum {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// A JSON body whose rejections are `{error, detail}` with a fitting status, read within the
/// body timeout and at most [`MAX_BODY_BYTES`] of it, and refused from its `Content-Length`
/// when too large.
///
/// The timeout costs nothing in the common case: the read is polled once first, and a small
/// body that came with its headers is read at once, without a timer (a tower body-timeout
/// layer armed one per request, which measured in the throughput).
/// The size limit is enforced here too, where the body is read, rather than by axum's
/// `DefaultBodyLimit` layer: a layer on the router wraps every route in one more boxed
/// service, cloned and called per request (measured: `docs/benchmarks.md`).
pub(super) struct ApiJson<T>(pub(super) T);

impl<T> FromRequest<Arc<App>> for ApiJson<T>
where
    T: serde::de::DeserializeOwned,
{
    type Rejection = Response;

    async fn from_request(request: Request, app: &Arc<App>) -> Result<Self, Self::Rejection> {
        if let Some(refusal) = refuse_oversized(&request) {
            return Err(drain_then(request, refusal, app.body_timeout()).await);
        }
        if !is_json(request.headers()) {
            let error =
                ApiError::invalid("send the body as JSON with `Content-Type: application/json`");
            return Err(error.into_response());
        }
        let mut read = std::pin::pin!(read_body(request.into_body()));
        // A small body that came with its headers is whole at the first poll: no timer (whose
        // deadline alone costs a clock read and a look-up of the runtime) until it is not.
        let read = match std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await {
            Poll::Ready(read) => Ok(read),
            Poll::Pending => tokio::time::timeout(app.body_timeout(), read).await,
        };
        let error = match read {
            // Parsed straight first; a body that does not parse is read again by axum's
            // extractor, whose path tracking names the field at fault but costs on every body
            // (some 1 800 of an acquire's 29 000 instructions: `docs/benchmarks.md`).
            Ok(Ok(bytes)) => match serde_json::from_slice::<T>(&bytes) {
                Ok(value) => return Ok(ApiJson(value)),
                Err(_) => match Json::<T>::from_bytes(&bytes) {
                    Ok(Json(value)) => return Ok(ApiJson(value)),
                    Err(rejection) => ApiError::invalid(rejection.body_text()),
                },
            },
            Err(_) => ApiError::new(
                ErrorKind::BodyTimeout,
                "the request body did not arrive in full within `server.body_timeout`",
            ),
            Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => too_large(),
            Ok(Err(_)) => ApiError::invalid("the request body could not be read in full"),
        };
        Err(error.into_response())
    }
}

/// The whole of a body of at most [`MAX_BODY_BYTES`]: the one chunk most bodies arrive in,
/// as it arrived, or the chunks joined.
pub(super) async fn read_body(body: axum::body::Body) -> Result<bytes::Bytes, axum::BoxError> {
    use http_body::Body as _;
    let mut body = http_body_util::Limited::new(body, MAX_BODY_BYTES);
    let first = loop {
        match body.frame().await {
            None => return Ok(bytes::Bytes::new()),
            // Trailers are not part of the body.
            Some(frame) => match frame?.into_data() {
                Ok(data) => break data,
                Err(_) => continue,
            },
        }
    };
    if body.is_end_stream() {
        return Ok(first);
    }
    let mut joined = bytes::BytesMut::from(&first[..]);
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            joined.extend_from_slice(&data);
        }
    }
    Ok(joined.freeze())
}

/// Whether the request says its body is JSON: `application/json`, or any `application/…+json`,
/// with or without parameters — what axum's `Json` accepts.
pub(super) fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return false;
    };
    // What nearly every client sends, without splitting and trimming.
    if value.as_bytes().eq_ignore_ascii_case(b"application/json") {
        return true;
    }
    let Ok(value) = value.to_str() else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    let subtype = subtype.as_bytes();
    let ends_with_json =
        subtype.len() >= 5 && subtype[subtype.len() - 5..].eq_ignore_ascii_case(b"+json");
    kind.eq_ignore_ascii_case("application")
        && (subtype.eq_ignore_ascii_case(b"json") || ends_with_json)
}

pub(super) fn too_large() -> ApiError {
    ApiError::new(
        ErrorKind::TooLarge,
        format!("the body is larger than {MAX_BODY_BYTES} bytes"),
    )
}

/// How much of an over-limit body is read and thrown away before the 413 is sent.
pub(super) const DRAIN_BYTES: usize = 1 << 20;

/// How to answer a body whose `Content-Length` is over the limit, decided before it is read:
/// `Some(true)` to read it away first, `Some(false)` to answer at once, `None` if it fits.
///
/// A client that asked `Expect: 100-continue` gets the 413 instead of the 100, and sends
/// nothing. One that sent its body straight away would, if the server answered and closed
/// with the body unread, see its connection reset and often never read the 413 (a broken
/// pipe); so, as nginx's lingering close does, up to [`DRAIN_BYTES`] of it are read and
/// dropped first (within the body timeout), and the connection closed after.
pub(super) fn refuse_oversized(request: &Request) -> Option<bool> {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())?;
    if declared <= MAX_BODY_BYTES as u64 {
        return None;
    }
    let expects_continue = request
        .headers()
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    Some(!expects_continue)
}

/// The 413 for an oversized body, after reading it away if `drain` (see [`refuse_oversized`]).
pub(super) async fn drain_then(request: Request, drain: bool, within: Duration) -> Response {
    if drain {
        let body = request.into_body();
        let _ = tokio::time::timeout(within, axum::body::to_bytes(body, DRAIN_BYTES)).await;
    }
    let mut response = too_large().into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}
