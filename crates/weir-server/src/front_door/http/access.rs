//! Who may call what: the admin token for policy changes, the data token for the data plane,
//! and the `Host` check of a server without an admin token.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header;

use crate::app::App;
use crate::error::ApiError;

use super::headers::header_str;

/// Proof that an admin call carries the admin token (or that none is configured).
///
/// An extractor from the request's head, so it runs before the body is read or parsed: a caller
/// without the token learns nothing from how the server reads its body.
pub(super) struct Admin;

impl FromRequestParts<Arc<App>> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        app: &Arc<App>,
    ) -> Result<Self, Self::Rejection> {
        app.access().check_admin(
            header_str(&parts.headers, header::AUTHORIZATION),
            host_of(parts)?,
        )?;
        Ok(Admin)
    }
}

/// Proof that a data-plane call (acquire, release, renew, busy) may be served: it carries the
/// data token if one is configured, and, on a server without an admin token, was sent to a
/// loopback or listed host.
pub(super) struct DataPlane;

impl FromRequestParts<Arc<App>> for DataPlane {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        app: &Arc<App>,
    ) -> Result<Self, Self::Rejection> {
        app.access().check_data(
            header_str(&parts.headers, header::AUTHORIZATION),
            host_of(parts)?,
        )?;
        Ok(DataPlane)
    }
}

/// The host a request was sent to: HTTP/2's authority, or HTTP/1's `Host` header — refused
/// (400) as HTTP's own servers refuse it when it is given twice, is not a host and port, or
/// is missing from an HTTP/1.1 request (RFC 9112, 3.2): the host check must see the one host
/// the client named, not the first of several or a prefix of a longer value.
pub(super) fn host_of(parts: &axum::http::request::Parts) -> Result<Option<&str>, ApiError> {
    if let Some(authority) = parts.uri.authority() {
        return Ok(Some(authority.as_str()));
    }
    let mut hosts = parts.headers.get_all(header::HOST).iter();
    let Some(host) = hosts.next() else {
        return match parts.version >= axum::http::Version::HTTP_11 {
            true => Err(ApiError::invalid(
                "an HTTP/1.1 request must have a `Host` header",
            )),
            false => Ok(None),
        };
    };
    if hosts.next().is_some() {
        return Err(ApiError::invalid(
            "the request has more than one `Host` header",
        ));
    }
    let host = host
        .to_str()
        .ok()
        .filter(|host| is_host_and_port(host))
        .ok_or_else(|| ApiError::invalid("the `Host` header is not a host and port"))?;
    Ok(Some(host))
}

/// Whether `host` is a URI's host with an optional port (RFC 3986: a name of unreserved,
/// percent-encoded and sub-delimiter characters, or an IP literal in brackets): no user, no
/// path, no spaces. Checked in one pass without allocating: it runs on every data-plane
/// request.
fn is_host_and_port(host: &str) -> bool {
    let (name, port) = match host.strip_prefix('[') {
        Some(literal) => match literal.split_once(']') {
            Some((address, after)) => {
                let address_ok = !address.is_empty()
                    && address
                        .bytes()
                        .all(|b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'));
                if !address_ok {
                    return false;
                }
                (
                    "",
                    after.strip_prefix(':').or((after.is_empty()).then_some("")),
                )
            }
            None => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, Some("")),
        },
    };
    let Some(port) = port else {
        return false;
    };
    let name_ok = (name.is_empty() && host.starts_with('['))
        || (!name.is_empty()
            && name.bytes().all(|b| {
                b.is_ascii_alphanumeric()
                    || matches!(
                        b,
                        b'-' | b'.'
                            | b'_'
                            | b'~'
                            | b'%'
                            | b'!'
                            | b'$'
                            | b'&'
                            | b'\''
                            | b'('
                            | b')'
                            | b'*'
                            | b'+'
                            | b','
                            | b';'
                            | b'='
                    )
            }));
    name_ok && port.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(version: axum::http::Version, hosts: &[&str]) -> axum::http::request::Parts {
        let mut request = axum::http::Request::builder()
            .uri("/v1/acquire")
            .version(version);
        for host in hosts {
            request = request.header(header::HOST, *host);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn one_well_formed_host_is_taken_and_anything_else_is_a_400() {
        use axum::http::Version;
        let host = |version, hosts: &[&str]| {
            host_of(&parts(version, hosts))
                .map(|h| h.map(str::to_owned))
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            host(Version::HTTP_11, &["localhost:8080"]),
            Ok(Some("localhost:8080".into()))
        );
        assert_eq!(
            host(Version::HTTP_11, &["[::1]:80"]),
            Ok(Some("[::1]:80".into()))
        );
        assert_eq!(
            host(Version::HTTP_10, &[]),
            Ok(None),
            "HTTP/1.0 may send none"
        );
        for (version, hosts) in [
            (Version::HTTP_11, &[][..]),
            (Version::HTTP_11, &["localhost", "evil.example"][..]),
            (Version::HTTP_11, &["localhost:21580 evil"][..]),
            (Version::HTTP_11, &["user@localhost"][..]),
            (Version::HTTP_11, &["localhost/path"][..]),
            (Version::HTTP_11, &[""][..]),
            (Version::HTTP_11, &["[::1"][..]),
            (Version::HTTP_11, &["[::1]x"][..]),
            (Version::HTTP_11, &["host:80x"][..]),
            (Version::HTTP_11, &[":80"][..]),
        ] {
            assert!(host(version, hosts).is_err(), "{hosts:?} is refused");
        }
    }
}
