//! A small client of the HTTP API, for the `weir top` and `weir config` commands, over plain
//! HTTP or TLS (a server with `[server.tls]`: the CA to trust, and a client certificate under
//! mutual TLS).

use std::path::PathBuf;

use anyhow::{Context, bail};
use serde_json::Value;

/// How the client reaches an `https://` server: no CA is trusted unless given.
#[derive(Debug, Clone, Default)]
pub struct ClientTls {
    /// The CA certificate(s) to trust (PEM).
    pub ca: Option<PathBuf>,
    /// A client certificate chain to present (PEM), for mutual TLS.
    pub cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub key: Option<PathBuf>,
}

impl ClientTls {
    /// The HTTP client these settings make.
    fn client(&self) -> anyhow::Result<reqwest::Client> {
        let read = |path: &PathBuf| {
            std::fs::read(path).with_context(|| format!("reading {}", path.display()))
        };
        let mut builder = reqwest::Client::builder().use_rustls_tls();
        if let Some(ca) = &self.ca {
            let certs = reqwest::Certificate::from_pem_bundle(&read(ca)?)
                .with_context(|| format!("{}: not PEM certificates", ca.display()))?;
            if certs.is_empty() {
                bail!(
                    "{} holds no certificate (no `BEGIN CERTIFICATE` section)",
                    ca.display()
                );
            }
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let mut pem = read(cert)?;
                pem.push(b'\n');
                pem.extend(read(key)?);
                let identity = reqwest::Identity::from_pem(&pem).with_context(|| {
                    format!(
                        "{} and {}: not a certificate and its key",
                        cert.display(),
                        key.display()
                    )
                })?;
                builder = builder.identity(identity);
            }
            (None, None) => {}
            _ => bail!("a client certificate needs its key: give --cert and --key together"),
        }
        builder.build().context("making the HTTP client")
    }
}

/// Talks to one server.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl Client {
    /// A client of the server at `base` (e.g. `http://127.0.0.1:8080`), sending `token` on
    /// admin calls.
    pub fn new(base: &str, token: Option<String>) -> Self {
        Client {
            base: base.trim_end_matches('/').to_owned(),
            token,
            http: reqwest::Client::new(),
        }
    }

    /// Like [`new`](Self::new), reaching an `https://` server with `tls` (which a plain
    /// `http://` one ignores).
    pub fn with_tls(base: &str, token: Option<String>, tls: &ClientTls) -> anyhow::Result<Self> {
        if !base.starts_with("https://") {
            return Ok(Client::new(base, token));
        }
        Ok(Client {
            http: tls.client()?,
            ..Client::new(base, token)
        })
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> anyhow::Result<Value> {
        let request = match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let response = request
            .send()
            .await
            .with_context(|| format!("reaching the server at {}", self.base))?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            let detail = body["detail"].as_str().unwrap_or("no detail");
            // The server speaks of headers; this CLI's users give a flag or a variable.
            let hint = match (status.as_u16(), self.token.is_some()) {
                (401, _) => " (give the admin token with --token or WEIR_ADMIN_TOKEN)",
                (403, true) => {
                    " (the token given with --token or WEIR_ADMIN_TOKEN is not the server's admin token)"
                }
                _ => "",
            };
            bail!("the server answered {status}: {detail}{hint}");
        }
        Ok(body)
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    /// `PUT path` with a JSON body.
    pub async fn put(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.send(self.http.put(format!("{}{path}", self.base)).json(body))
            .await
    }

    /// `DELETE path`.
    pub async fn delete(&self, path: &str) -> anyhow::Result<Value> {
        self.send(self.http.delete(format!("{}{path}", self.base)))
            .await
    }
}
