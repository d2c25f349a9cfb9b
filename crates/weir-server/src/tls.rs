//! TLS for the listeners and for node-to-node calls: rustls, from PEM files, swapped live when
//! the files change.
//!
//! One certificate and key serve every listener (HTTP, gRPC, the Redis protocol); they differ
//! only in the protocols offered by ALPN: HTTP offers `h2` and `http/1.1`, gRPC `h2` alone
//! (gRPC clients insist on it), the Redis protocol none. With `client_ca`, every listener
//! requires a client certificate that CA signed (mutual TLS). In cluster mode the same
//! certificate is this node's client certificate in its calls to other nodes, which it
//! verifies against `peer_ca` (or `client_ca`); the certificates of nodes calling in are
//! verified against `peer_ca` as well as `client_ca`.
//!
//! Everything is built again from the files on each reload and swapped in whole, so a
//! connection is accepted or made with one consistent set: a reload that fails (a key that does
//! not match its certificate, a half-written file) keeps the set in use and says why.
//! Connections already open keep the certificate they were made with.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::TcpStream;
use tokio::signal::unix::Signal;
use tokio_rustls::client::TlsStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::config::TlsSettings;
use crate::watch::Changes;

/// Why a certificate, key or CA could not be used; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file could not be read.
    #[error("reading {file}: {reason}")]
    Read {
        /// The file.
        file: PathBuf,
        /// Why.
        reason: io::Error,
    },
    /// The file is not PEM, or holds nothing of the kind asked for.
    #[error("{file}: {problem}")]
    Pem {
        /// The file.
        file: PathBuf,
        /// What is wrong, in words.
        problem: String,
    },
    /// The key is not the certificate's.
    #[error("the key in {key} does not match the certificate in {cert}")]
    Mismatch {
        /// The key's file.
        key: PathBuf,
        /// The certificate's file.
        cert: PathBuf,
    },
    /// rustls refused the certificate, key or CA (an unsupported key type, a CA that is not a
    /// certificate authority).
    #[error("{file}: {reason}")]
    Refused {
        /// The file.
        file: PathBuf,
        /// rustls's reason.
        reason: rustls::Error,
    },
    /// `peer_name` is no name a certificate can carry.
    #[error("`peer_name` {name:?} is not a DNS name or an IP address: {problem}")]
    PeerName {
        /// The name.
        name: String,
        /// Why.
        problem: String,
    },
    /// Cluster mode over TLS needs a CA to verify the other nodes by.
    #[error(
        "cluster mode with TLS needs `peer_ca` (or `client_ca`) in [server.tls]: the CA that signed the other nodes' certificates"
    )]
    NoPeerCa,
}

/// Which listener a connection came to: they differ in the protocols they offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// The HTTP API: HTTP/2 or HTTP/1.1.
    Http,
    /// The gRPC API: HTTP/2 only.
    Grpc,
    /// The Redis protocol: no ALPN.
    Resp,
}

/// One consistent set, built from the files at one moment.
struct Loaded {
    http: Arc<ServerConfig>,
    grpc: Arc<ServerConfig>,
    resp: Arc<ServerConfig>,
    /// For node-to-node calls; `None` without a CA to verify peers by.
    peers: Option<Arc<ClientConfig>>,
}

/// The certificates in force, reloadable.
pub struct Tls {
    settings: TlsSettings,
    loaded: ArcSwap<Loaded>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// Reads the files `settings` names; every problem is an error naming its file.
    pub fn load(settings: TlsSettings) -> Result<Self, TlsError> {
        let loaded = build(&settings)?;
        Ok(Tls {
            settings,
            loaded: ArcSwap::from_pointee(loaded),
        })
    }

    /// Reads the files again and, if they make a valid set, serves it to new connections; if
    /// not, the set in force stays and the error says why.
    pub fn reload(&self) -> Result<(), TlsError> {
        self.loaded.store(Arc::new(build(&self.settings)?));
        Ok(())
    }

    /// The files the set is read from, to be watched.
    pub fn files(&self) -> Vec<&Path> {
        let s = &self.settings;
        [
            Some(&s.cert),
            Some(&s.key),
            s.client_ca.as_ref(),
            s.peer_ca.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(PathBuf::as_path)
        .collect()
    }

    /// An acceptor for one connection to `listener`, with the set in force now.
    pub fn acceptor(&self, listener: Listener) -> TlsAcceptor {
        let loaded = self.loaded.load();
        TlsAcceptor::from(Arc::clone(match listener {
            Listener::Http => &loaded.http,
            Listener::Grpc => &loaded.grpc,
            Listener::Resp => &loaded.resp,
        }))
    }

    /// A connector for calls to other nodes, or [`TlsError::NoPeerCa`] without a CA to verify
    /// them by.
    pub fn peer_connector(self: &Arc<Self>) -> Result<PeerConnector, TlsError> {
        if self.loaded.load().peers.is_none() {
            return Err(TlsError::NoPeerCa);
        }
        Ok(PeerConnector {
            tls: Arc::clone(self),
        })
    }
}

/// Reloads `tls` when one of its files changes (a mounted Secret's `..data` swap included), or
/// on `hangups` (SIGHUP), until the process ends, telling `counted` whether each reload was
/// `applied` or `failed`. A watcher that cannot be made is logged, and SIGHUP still reloads.
pub fn watch(tls: Arc<Tls>, hangups: Signal, counted: impl Fn(&'static str) + Send + 'static) {
    let files = tls.files();
    let mut changes = Changes::new(&files, hangups, "certificate changes");
    tokio::spawn(async move {
        while changes.next().await.is_some() {
            match tls.reload() {
                Ok(()) => {
                    tracing::info!("TLS certificates reloaded");
                    counted("applied");
                }
                Err(error) => {
                    tracing::warn!("TLS certificates not reloaded; the ones in use stay: {error}");
                    counted("failed");
                }
            }
        }
    });
}

/// Builds the whole set from the files.
fn build(settings: &TlsSettings) -> Result<Loaded, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = certificates(&settings.cert)?;
    let key = private_key(&settings.key)?;
    let refused = |file: &Path| {
        let file = file.to_owned();
        let cert = settings.cert.clone();
        move |reason| match reason {
            rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
                TlsError::Mismatch { key: file, cert }
            }
            reason => TlsError::Refused { file, reason },
        }
    };
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(refused(&settings.cert))?;
    // Clients are verified against `client_ca` (required) and other nodes, which present
    // their own certificates when they call, against `peer_ca` too. With `peer_ca` alone a
    // certificate is asked for but not required: applications connect without one, and a node's
    // is verified if it comes (its calls are still guarded by the cluster secret).
    let mut trusted = RootCertStore::empty();
    for ca in [&settings.client_ca, &settings.peer_ca]
        .into_iter()
        .flatten()
    {
        trusted.roots.extend(roots(ca)?.roots);
    }
    let server = match (&settings.client_ca, &settings.peer_ca) {
        (None, None) => builder.with_no_client_auth(),
        (client_ca, _) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(trusted),
                Arc::clone(&provider),
            );
            let verifier = match client_ca {
                Some(_) => verifier,
                None => verifier.allow_unauthenticated(),
            };
            let ca = client_ca.as_ref().or(settings.peer_ca.as_ref());
            let verifier = verifier.build().map_err(|e| TlsError::Pem {
                file: ca.cloned().unwrap_or_default(),
                problem: format!("not usable to verify clients: {e}"),
            })?;
            builder.with_client_cert_verifier(verifier)
        }
    }
    .with_single_cert(certs.clone(), key.clone_key())
    .map_err(refused(&settings.key))?;
    let with_alpn = |protocols: &[&[u8]]| {
        let mut config = server.clone();
        config.alpn_protocols = protocols.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    };
    if let Some(name) = &settings.peer_name {
        ServerName::try_from(name.as_str()).map_err(|e| TlsError::PeerName {
            name: name.clone(),
            problem: e.to_string(),
        })?;
    }
    let peer_ca = settings.peer_ca.as_ref().or(settings.client_ca.as_ref());
    let peers = match peer_ca {
        Some(ca) => {
            let mut config = ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(refused(ca))?
                .with_root_certificates(roots(ca)?)
                .with_client_auth_cert(certs, key)
                .map_err(refused(&settings.key))?;
            config.alpn_protocols = vec![b"h2".to_vec()];
            Some(Arc::new(config))
        }
        None => None,
    };
    Ok(Loaded {
        http: with_alpn(&[b"h2", b"http/1.1"]),
        grpc: with_alpn(&[b"h2"]),
        resp: with_alpn(&[]),
        peers,
    })
}

fn read(file: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(file).map_err(|reason| TlsError::Read {
        file: file.to_owned(),
        reason,
    })
}

fn pem_problem(file: &Path, error: &rustls::pki_types::pem::Error) -> TlsError {
    TlsError::Pem {
        file: file.to_owned(),
        problem: format!("not valid PEM: {error:?}"),
    }
}

/// The certificate chain in `file`, the end entity's first.
fn certificates(file: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(file)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_problem(file, &e))?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            file: file.to_owned(),
            problem: "holds no certificate (no `BEGIN CERTIFICATE` section)".to_owned(),
        });
    }
    Ok(certs)
}

/// The private key in `file` (PKCS#8, PKCS#1 or SEC1).
fn private_key(file: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(file)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::Pem {
            file: file.to_owned(),
            problem: "holds no private key (no `BEGIN PRIVATE KEY` section)".to_owned(),
        },
        e => pem_problem(file, &e),
    })
}

/// The CA certificates in `file`, as roots of trust.
fn roots(file: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(file)? {
        roots.add(cert).map_err(|reason| TlsError::Refused {
            file: file.to_owned(),
            reason,
        })?;
    }
    Ok(roots)
}

/// Opens TLS connections to other nodes for tonic's channels, verifying them against the peer
/// CA and presenting this node's certificate; a reload applies to the next connection.
///
/// The name verified is `peer_name` when set (one name every node's certificate carries, for
/// nodes known by addresses no certificate can list in advance), else the host of the address.
#[derive(Clone)]
pub struct PeerConnector {
    tls: Arc<Tls>,
}

impl std::fmt::Debug for PeerConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerConnector").finish_non_exhaustive()
    }
}

impl tower::Service<Uri> for PeerConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tls = Arc::clone(&self.tls);
        Box::pin(async move {
            let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_owned());
            let host = uri
                .host()
                .ok_or_else(|| invalid("a peer address without a host"))?;
            let port = uri
                .port_u16()
                .ok_or_else(|| invalid("a peer address without a port"))?;
            // An IPv6 host comes bracketed in a URI.
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let name = tls
                .settings
                .peer_name
                .clone()
                .unwrap_or_else(|| host.clone());
            let name = ServerName::try_from(name)
                .map_err(|e| invalid(&format!("a peer name no certificate can carry: {e}")))?;
            let config = tls
                .loaded
                .load()
                .peers
                .clone()
                .ok_or_else(|| invalid("no CA to verify peers by"))?;
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            // See `connections::accept_grpc`.
            let _ = tcp.set_nodelay(true);
            let stream = TlsConnector::from(config).connect(name, tcp).await?;
            Ok(TokioIo::new(stream))
        })
    }
}

/// Peer addresses are advertised as `https://…` when TLS is on; tonic's channel is given the
/// `http://` form, since the TLS is this connector's, not tonic's.
pub fn plain_uri(address: &str) -> String {
    match address.strip_prefix("https://") {
        Some(rest) => format!("http://{rest}"),
        None => address.to_owned(),
    }
}
