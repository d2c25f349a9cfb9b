//! The cluster's policy log in cluster mode: started with the node, followed with gossip's
//! members, and caught up with before the node says it is ready.
//!
//! A node that joins, or comes back after being down or cut off, first asks the leader how far
//! the log is committed and applies that much: only then does it report ready, so a load
//! balancer never sends it traffic while it still runs an old policy set. A log that cannot
//! be reached (no majority anywhere) does not keep the node out for ever: after
//! [`CATCH_UP_WITHIN`] it serves with the policies it has, and says so in the log — deciding
//! with a possibly older set beats refusing everything.

use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_cluster::membership::Advertised;

use super::{ClusterMode, SPEAKS};
use crate::durable::Overlay;
use crate::policy_log::PolicyLog;
use crate::policy_log::identity;
use crate::policy_log::service::GuardedPolicyLog;

/// How long a node waits to catch up with the policy log before it serves without.
pub const CATCH_UP_WITHIN: Duration = Duration::from_secs(10);

impl ClusterMode {
    /// The cluster's policy log.
    pub fn policy_log(&self) -> &Arc<PolicyLog> {
        &self.policy_log
    }

    /// The policy log's service, to add to the gRPC server.
    pub fn policy_log_service(&self) -> GuardedPolicyLog {
        self.policy_log.service(
            self.secret
                .as_ref()
                .map(weir_cluster::secret::ClusterSecret::require)
                .unwrap_or_default(),
        )
    }

    /// Advertises which cluster's policy log this member holds, and stops this member (see
    /// [`refused`](Self::refused)) if others advertise one and none advertises its own: its
    /// data dir was copied or restored from another cluster (see `policy_log::identity`).
    pub async fn share_log_identity(&self) {
        let Some(ours) = self.policy_log.identity() else {
            return;
        };
        let others = match self.gossip.lock().await.as_ref() {
            Some(gossip) => {
                gossip.advertise(Advertised::PolicyLog, &ours).await;
                gossip.advertised(Advertised::PolicyLog).await
            }
            None => return,
        };
        let others = others
            .iter()
            .filter(|(id, _)| *id != self.node_id)
            .map(|(_, log)| log.as_str());
        if let Some(theirs) = identity::foreign_among(&ours, others) {
            self.refused.send_replace(Some(format!(
                "the data dir {} holds the policy log of another cluster (its log is {ours}; the members of this one run {theirs}): it was copied or restored from elsewhere, and joining would keep that cluster's policies here for good. Start this node on an empty data dir (or move {} aside) to join this cluster as a new member, or start it with the cluster it belongs to",
                self.data_dir.display(),
                crate::policy_log::store::FILE,
            )));
        }
    }

    /// Resolves, with why, once this member must not run in this cluster (its data dir holds
    /// another cluster's log); never otherwise.
    pub async fn refused(&self) -> String {
        let mut refused = self.refused.subscribe();
        match refused.wait_for(Option::is_some).await {
            Ok(why) => why.clone().unwrap_or_default(),
            Err(_) => std::future::pending().await,
        }
    }

    /// Whether this node has caught up with the policy log (or given up waiting).
    pub(super) fn has_caught_up(&self) -> bool {
        *self.caught_up.borrow()
    }

    /// Resolves once this node has caught up (or given up waiting).
    pub(super) async fn caught_up(&self) {
        let mut caught_up = self.caught_up.subscribe();
        if caught_up.wait_for(|done| *done).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Follows the members with the policy log, `seed` being this node's own overlay (what it
    /// brings to a log it starts), and catches up once joined.
    pub(super) async fn follow_policies(self: Arc<Self>, seed: Overlay) {
        tokio::spawn(Arc::clone(&self.policy_log).follow_members(
            self.members.clone(),
            SPEAKS,
            self.seeded,
            seed,
        ));
        self.gossip_joined().await;
        let since = Instant::now();
        loop {
            let others: Vec<String> = self
                .members
                .borrow()
                .iter()
                .map(|member| member.grpc.clone())
                .collect();
            let answer = self.policy_log.read_index(&others).await;
            let caught_up = match answer {
                Ok(index) => {
                    self.policy_log
                        .applied_through(index, Duration::from_secs(2))
                        .await
                }
                Err(_) => false,
            };
            if caught_up {
                tracing::info!("caught up with the cluster's policy log");
                break;
            }
            if since.elapsed() >= CATCH_UP_WITHIN {
                let why = match answer {
                    Ok(index) => {
                        format!("the log is committed through {index}, not yet applied here")
                    }
                    Err(refusal) => refusal.to_string(),
                };
                tracing::warn!(
                    %why,
                    "serving without having caught up with the cluster's policy log within {} s: this node decides with the policies it has, and a change made here waits for a majority",
                    CATCH_UP_WITHIN.as_secs()
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.caught_up.send_replace(true);
    }
}
