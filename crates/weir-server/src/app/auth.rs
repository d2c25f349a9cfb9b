//! Who may do what: the admin token (policy changes), the data token (acquire, release, renew,
//! busy; the Redis protocol's password), and the `Host` check that keeps a web page from using
//! a visitor's browser against a loopback server without a token.
//!
//! Two credentials, because they are held by different people: every service that throttles
//! holds the data token, and only operators the admin token. The admin token is accepted
//! wherever the data token is over HTTP and gRPC (whoever may rewrite the policies may also
//! spend them); the Redis port takes the data token only.
//!
//! A server with no admin token listens on loopback only (`weir serve` refuses otherwise), and
//! its state-changing requests need no credential. A page on `evil.example` that a visitor
//! opens can still reach it: it rebinds its own name to 127.0.0.1 and sends same-origin
//! requests, which carry `Host: evil.example`. So such a server accepts a state-changing
//! request only for a loopback host name or address, or one the operator lists in
//! `server.allowed_hosts`.

use std::net::IpAddr;

use crate::error::{ApiError, ErrorKind};

/// The credentials and host names a server checks.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// The admin token, if any.
    pub admin_token: Option<String>,
    /// The data token, if any.
    pub data_token: Option<String>,
    /// Host names (or `host:port`) accepted besides loopback's when there is no admin token.
    pub allowed_hosts: Vec<String>,
}

impl Access {
    /// Checks an admin call's `Authorization` header value, and, without an admin token, the
    /// host it was sent to (`host`: the request's authority or `Host` header).
    pub fn check_admin(
        &self,
        authorization: Option<&str>,
        host: Option<&str>,
    ) -> Result<(), ApiError> {
        let Some(token) = &self.admin_token else {
            return self.check_host(host);
        };
        let given = bearer(authorization).ok_or_else(ApiError::unauthenticated)?;
        if same(given, token) {
            Ok(())
        } else {
            Err(ApiError::forbidden())
        }
    }

    /// Checks a data-plane call (acquire, release, renew, busy): the data token (or the admin
    /// token) when one is configured, and the host as for an admin call when there is no
    /// admin token.
    pub fn check_data(
        &self,
        authorization: Option<&str>,
        host: Option<&str>,
    ) -> Result<(), ApiError> {
        if self.admin_token.is_none() {
            self.check_host(host)?;
        }
        let Some(data) = &self.data_token else {
            return Ok(());
        };
        let given = bearer(authorization).ok_or_else(|| ApiError::new(
            ErrorKind::Unauthenticated,
            "this call needs the data token: send `Authorization: Bearer <token>` (the server's `data_token`, WEIR_DATA_TOKEN)",
        ))?;
        let admin = self.admin_token.as_deref();
        if same(given, data) || admin.is_some_and(|admin| same(given, admin)) {
            Ok(())
        } else {
            Err(ApiError::new(
                ErrorKind::Forbidden,
                "the bearer token is neither the data token nor the admin token",
            ))
        }
    }

    /// Whether a state-changing request sent to `host` may be served: always with an admin
    /// token (the request is then checked by it), else only for loopback or a listed host.
    fn check_host(&self, host: Option<&str>) -> Result<(), ApiError> {
        // HTTP/1.0 clients may send no Host; browsers always do.
        let Some(host) = host else {
            return Ok(());
        };
        if is_loopback_host(host) || self.allowed_hosts.iter().any(|a| host_matches(a, host)) {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorKind::HostNotAllowed,
            format!(
                "a server without an admin token changes state only for requests sent to a loopback host (localhost, 127.0.0.1, [::1]), not `{host}`; list the name in `server.allowed_hosts` or set an admin token"
            ),
        ))
    }

    /// Whether data-plane calls must carry the data token (and Redis-protocol clients give it
    /// as their password).
    pub fn needs_data_token(&self) -> bool {
        self.data_token.is_some()
    }

    /// Whether the live page's editor needs the admin token.
    pub fn writes_need_token(&self) -> bool {
        self.admin_token.is_some()
    }

    /// Whether `given` is the data token (true when there is none), as a Redis `AUTH`
    /// password.
    pub fn check_password(&self, given: &str) -> bool {
        self.data_token
            .as_deref()
            .is_none_or(|token| same(given, token))
    }
}

/// The token of an `Authorization: Bearer <token>` value. RFC 9110: the scheme is
/// case-insensitive, and spaces may separate it from the token.
fn bearer(authorization: Option<&str>) -> Option<&str> {
    authorization
        .and_then(|h| h.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim_start())
}

/// Whether `host` names this machine's loopback: `localhost` (and names under it, RFC 6761),
/// or a loopback address.
fn is_loopback_host(host: &str) -> bool {
    // On every state-changing request of a server without a token, so nothing is allocated,
    // and the two forms local clients send are recognised before anything is parsed.
    let bytes = host.as_bytes();
    for common in [&b"127.0.0.1"[..], b"localhost"] {
        if bytes.starts_with(common) && bytes.get(common.len()).is_none_or(|after| *after == b':') {
            return true;
        }
    }
    let name = split_port(host).0.trim_end_matches('.').as_bytes();
    const SUFFIX: &[u8] = b".localhost";
    name.eq_ignore_ascii_case(b"localhost")
        || (name.len() > SUFFIX.len()
            && name[name.len() - SUFFIX.len()..].eq_ignore_ascii_case(SUFFIX))
        || std::str::from_utf8(name)
            .ok()
            .and_then(|name| name.parse::<IpAddr>().ok())
            .is_some_and(|ip| ip.is_loopback())
}

/// Whether `host` is the operator's `allowed` entry: the same `host:port`, or, for an entry
/// without a port, the same name on any port (names compared without case).
fn host_matches(allowed: &str, host: &str) -> bool {
    let (allowed_name, allowed_port) = split_port(allowed);
    let (name, port) = split_port(host);
    // A name with a trailing dot (fully qualified) is the same name, as for `localhost.`.
    (allowed_port.is_none() || allowed_port == port)
        && without_root(allowed_name).eq_ignore_ascii_case(without_root(name))
}

/// A name without the trailing dot of its fully qualified form.
fn without_root(name: &str) -> &str {
    name.strip_suffix('.').unwrap_or(name)
}

/// A `Host` value's name and port, if it has one: `name`, `name:port`, `[v6]` or `[v6]:port`.
fn split_port(host: &str) -> (&str, Option<&str>) {
    if let Some(rest) = host.strip_prefix('[') {
        let (name, after) = rest.split_once(']').unwrap_or((rest, ""));
        return (name, after.strip_prefix(':'));
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => (name, Some(port)),
        _ => (host, None),
    }
}

/// Compares without an early exit, so the time taken says nothing about the token.
fn same(given: &str, token: &str) -> bool {
    given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_are_recognised_and_others_are_not() {
        for host in [
            "localhost",
            "localhost:8080",
            "LOCALHOST.:80",
            "api.localhost:1",
            "127.0.0.1:18081",
            "127.9.9.9",
            "[::1]:8080",
            "[::1]",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example:18081",
            "localhost.evil.example",
            "127.0.0.1.evil.example:80",
            "10.0.0.1:8080",
            "[::2]:80",
            "",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn an_allowed_host_matches_by_name_or_by_name_and_port() {
        assert!(host_matches("weir.internal", "weir.internal:8080"));
        assert!(host_matches("weir.internal", "WEIR.internal"));
        assert!(host_matches("weir.internal:8080", "weir.internal:8080"));
        assert!(!host_matches("weir.internal:8080", "weir.internal:9090"));
        assert!(!host_matches("weir.internal", "weir.internal.evil.example"));
        // The fully qualified form (a trailing dot) is the same name, either way round.
        assert!(host_matches("svc", "svc."));
        assert!(host_matches("svc.", "svc:8080"));
        assert!(host_matches("[::2]", "[::2]:80"));
        assert!(!host_matches("[::2]:81", "[::2]:80"));
    }

    #[test]
    fn a_bearer_token_is_read_with_any_case_and_spacing() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("  bearer    abc")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(None), None);
    }
}
