//! The library in this process: an [`App`] on a config's policies, asked directly.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use weir_api::http::AcquireBody;
use weir_server::ConfigFile;
use weir_server::{AcquireInput, AcquireOutcome, App, AppSettings};

use super::{Answer, Target};
use crate::report::RequestOutcome;

/// The application core in this process: what a decision costs without any network.
#[derive(Clone)]
pub struct InProcess(Arc<App>);

impl InProcess {
    /// An app on `config`'s policies.
    pub fn start(config: &ConfigFile) -> anyhow::Result<Self> {
        // The app reads a data dir's overlay when it starts and writes only on API changes,
        // which a bench makes none of: an empty dir of its own, removed at once.
        static RUNS: AtomicU64 = AtomicU64::new(0);
        let run = RUNS.fetch_add(1, Ordering::Relaxed);
        let data_dir =
            std::env::temp_dir().join(format!("weir-bench-{}-{run}", std::process::id()));
        let app = App::new(AppSettings {
            node_id: "bench".to_owned(),
            grpc: config.server.grpc,
            policies: config.policy.clone(),
            data_dir: data_dir.clone(),
            access: Default::default(),
            max_cost: config.server.max_cost,
            body_timeout: config.server.body_timeout,
            cluster: None,
            cell_max_keys: config.resp.max_keys,
            durable_after: None,
            redis: None,
        })?;
        let _ = std::fs::remove_dir_all(&data_dir);
        Ok(InProcess(app))
    }
}

impl Target for InProcess {
    async fn acquire(&mut self, request: AcquireBody) -> Answer {
        let input = AcquireInput {
            policy: request.policy,
            key: request.key,
            kind: (!request.kind.is_empty()).then_some(request.kind),
            cost: request.cost,
            max_wait_ms: request.max_wait_ms,
        };
        match self.0.acquire(&input).await {
            Ok(AcquireOutcome::Admitted { lease, .. }) => {
                Ok((RequestOutcome::Admitted, lease.map(|(id, _)| id)))
            }
            Ok(AcquireOutcome::Refused { .. }) => Ok((RequestOutcome::Refused, None)),
            Err(error) => Err(error.to_string()),
        }
    }

    async fn release(&mut self, lease: String) {
        let _ = self.0.release(&lease);
    }
}
