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
        // Compare without an early exit, so the time taken says nothing about the token.
        let matches = given.len() == token.len()
            && given
                .bytes()
                .zip(token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if matches {
            Ok(())
        } else {
            Err(ApiError::forbidden())
        }
    }
}
