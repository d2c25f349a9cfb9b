//! A server's HTTP API, with the same typed bodies the server reads and writes.

use anyhow::Context;
use weir_api::http::{AcquireBody, Admission, ReleaseBody};

use super::{Answer, Target};
use crate::report::RequestOutcome;

/// `POST /v1/acquire` and `/v1/release` on one server.
#[derive(Clone)]
pub struct Http {
    client: reqwest::Client,
    acquire: String,
    release: String,
}

impl Http {
    /// A client of the server at `base` (`http://host:port`).
    pub fn connect(base: &str) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .build()
            .context("building the HTTP client")?;
        let base = base.trim_end_matches('/');
        Ok(Http {
            client,
            acquire: format!("{base}/v1/acquire"),
            release: format!("{base}/v1/release"),
        })
    }
}

impl Target for Http {
    async fn acquire(&mut self, request: AcquireBody) -> Answer {
        // The key also rides in a header, so a proxy that cannot read the body (the nginx
        // baseline's `limit_req`) can key on it.
        let answer = self
            .client
            .post(&self.acquire)
            .header("x-weir-key", &request.key)
            .json(&request)
            .send()
            .await
            .map_err(|error| format!("{error:#}"))?;
        let status = answer.status();
        match status.as_u16() {
            200..=299 => {
                let body: Admission<'static> = answer.json().await.map_err(|error| {
                    format!("HTTP {status}, an admission that does not parse: {error}")
                })?;
                Ok((
                    RequestOutcome::Admitted,
                    body.lease.map(|lease| lease.into_owned()),
                ))
            }
            429 => Ok((RequestOutcome::Refused, None)),
            _ => Err(format!(
                "HTTP {status}: {}",
                answer.text().await.unwrap_or_default()
            )),
        }
    }

    async fn release(&mut self, lease: String) {
        let _ = self
            .client
            .post(&self.release)
            .json(&ReleaseBody { lease })
            .send()
            .await;
    }
}
