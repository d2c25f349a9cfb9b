//! The lease sweeper, the adaptive ticker and the periodic report, on one task.

use std::sync::Arc;
use std::time::Duration;

use super::App;

impl App {
    /// Starts the background task: expired leases reclaimed every `lease_sweep`, adaptive
    /// policies ticked every second, the throttling report every `report_interval`.
    pub fn spawn_background(
        self: &Arc<Self>,
        lease_sweep: Duration,
        report_interval: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let app = Arc::clone(self);
        tokio::spawn(async move {
            let mut sweep = tokio::time::interval(lease_sweep);
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let mut report = tokio::time::interval(report_interval);
            report.tick().await;
            loop {
                tokio::select! {
                    _ = sweep.tick() => {
                        let reclaimed = app.sweep_leases();
                        if reclaimed > 0 {
                            tracing::info!(reclaimed, "leases expired without a release");
                        }
                    }
                    _ = tick.tick() => app.tick(1000),
                    _ = report.tick() => app.report(),
                }
            }
        })
    }
}
