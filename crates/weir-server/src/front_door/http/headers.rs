//! The RateLimit header fields of an answer: the limit, what remains, when it resets, and a
//! policy's own quota, remembered per policy.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, header};

use super::POLICY_HEADERS;

/// `RateLimit-Policy` (and, when refused, `RateLimit`) per the IETF draft: the quota is the
/// bucket's limit per one-second window; on a refusal the remaining quota is 0 and the reset is
/// the retry-after. Remaining quota on admission is not reported: reading it would cost every
/// decision a second lookup.
///
/// Every admission carries `RateLimit-Policy`, so its value is made once per policy and limit
/// and remembered (see [`policy_header`]), and the headers' names are constants rather than
/// parsed per response.
pub(super) fn rate_limit_headers(
    headers: &mut HeaderMap,
    policy: &str,
    limit: Option<f64>,
    retry: Option<Duration>,
) {
    const RATELIMIT_POLICY: header::HeaderName =
        header::HeaderName::from_static("ratelimit-policy");
    const RATELIMIT: header::HeaderName = header::HeaderName::from_static("ratelimit");
    let Some(limit) = limit else {
        return;
    };
    if let Some(value) = policy_header(policy, limit.floor()) {
        headers.insert(RATELIMIT_POLICY, value);
    }
    if let Some(retry) = retry {
        let seconds = retry.as_secs() + u64::from(retry.subsec_nanos() > 0);
        let mut value = Vec::with_capacity(policy.len() + 32);
        value.push(b'"');
        value.extend_from_slice(policy.as_bytes());
        value.extend_from_slice(b"\";r=0;t=");
        value.extend_from_slice(itoa::Buffer::new().format(seconds).as_bytes());
        if let Ok(value) = HeaderValue::from_maybe_shared(bytes::Bytes::from(value)) {
            headers.insert(RATELIMIT, value);
        }
    }
}

/// The most `RateLimit-Policy` values a thread remembers.
pub(super) const MAX_POLICY_HEADERS: usize = 64;

/// `"policy";q=QUOTA;w=1`, made once per policy and quota per thread (a `HeaderValue`'s clone
/// shares its bytes).
pub(super) fn policy_header(policy: &str, quota: f64) -> Option<HeaderValue> {
    let bits = quota.to_bits();
    let remembered = POLICY_HEADERS.with_borrow_mut(|values| {
        let at = values
            .iter()
            .position(|(name, q, _)| *q == bits && **name == *policy)?;
        values[..=at].rotate_right(1);
        Some(values[0].2.clone())
    });
    if remembered.is_some() {
        return remembered;
    }
    let mut value = Vec::with_capacity(policy.len() + 32);
    value.push(b'"');
    value.extend_from_slice(policy.as_bytes());
    value.extend_from_slice(b"\";q=");
    write_quota(&mut value, quota);
    value.extend_from_slice(b";w=1");
    let value = HeaderValue::from_maybe_shared(bytes::Bytes::from(value)).ok()?;
    POLICY_HEADERS.with_borrow_mut(|values| {
        values.truncate(MAX_POLICY_HEADERS - 1);
        values.insert(0, (policy.into(), bits, value.clone()));
    });
    Some(value)
}

/// A whole quota as `f64`'s `Display` writes it: the integer's digits up to 2^53, where every
/// integer is exact and the two agree; past it, `Display` itself.
pub(super) fn write_quota(out: &mut Vec<u8>, quota: f64) {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    if quota.is_sign_positive() && quota <= EXACT {
        out.extend_from_slice(itoa::Buffer::new().format(quota as u64).as_bytes());
    } else {
        out.extend_from_slice(quota.to_string().as_bytes());
    }
}

/// A header's value as text, if it is there and is text.
pub(super) fn header_str(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}
