//! The stop signals a server listens for (ctrl-c, SIGTERM), installed before anything is served.

use anyhow::Context as _;

use crate::cluster::ClusterMode;

/// The stop signals (ctrl-c, SIGTERM), listened for from the moment this is made.
///
/// A signal's handler must be in place before anything is served or announced: until it is,
/// SIGTERM takes its default action and kills the process mid-request. Making the listeners
/// here, rather than on the first poll of a future (as `tokio::signal::ctrl_c` does), means a
/// signal that arrives at any later point is kept until [`Termination::recv`] looks for it.
pub(crate) struct Termination {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Termination {
    /// Installs the handlers for SIGINT and SIGTERM.
    pub(crate) fn install() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Termination {
            interrupt: signal(SignalKind::interrupt()).context("listening for SIGINT")?,
            terminate: signal(SignalKind::terminate()).context("listening for SIGTERM")?,
        })
    }

    /// Resolves at the first stop signal received since [`install`](Self::install).
    pub(crate) async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

impl Termination {
    /// Resolves at the first stop signal (`None`), or with why once `cluster` finds this
    /// member must not run in it (see `ClusterMode::refused`).
    pub(crate) async fn recv_or_refused(
        &mut self,
        cluster: Option<&ClusterMode>,
    ) -> Option<String> {
        let refused = async {
            match cluster {
                Some(cluster) => cluster.refused().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = self.recv() => None,
            why = refused => Some(why),
        }
    }
}
