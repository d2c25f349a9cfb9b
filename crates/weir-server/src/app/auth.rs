//! Who may change things: the admin token check.

use super::App;
use crate::error::ApiError;

impl App {
    /// Checks an admin call's `Authorization` header value.
    pub fn check_admin(&self, authorization: Option<&str>) -> Result<(), ApiError> {
        let Some(token) = &self.admin_token else {
            return Ok(());
        };
        // RFC 9110: the scheme is case-insensitive, and spaces may separate it from the token.
        let given = authorization
            .and_then(|h| h.trim().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim_start())
            .ok_or_else(ApiError::unauthenticated)?;
        if same(given, token) {
            Ok(())
        } else {
            Err(ApiError::forbidden())
        }
    }

    /// Whether callers must prove they know the admin token: the Redis-protocol listener then
    /// asks for it as its password.
    pub fn requires_password(&self) -> bool {
        self.admin_token.is_some()
    }

    /// Whether `given` is the admin token (true when there is none), as a Redis `AUTH`
    /// password.
    pub fn check_password(&self, given: &str) -> bool {
        self.admin_token
            .as_deref()
            .is_none_or(|token| same(given, token))
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
