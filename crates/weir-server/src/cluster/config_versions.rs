//! Whether the members run the same policies: each advertises the version of its policy set
//! (a digest of every policy's config) in gossip, and each keeps what the others advertise, so
//! that `/v1/cluster` and `/metrics` show a member whose policies differ — a change made through
//! one node's API that the others have not had.

use std::collections::BTreeMap;

use weir_cluster::membership::Advertised;

use super::ClusterMode;

/// This node's config version and the members', as last shared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigVersions {
    /// This node's.
    pub mine: String,
    /// Each live member's (this node's included), by node id; a member that has not
    /// advertised one yet is missing.
    pub members: BTreeMap<String, String>,
}

impl ConfigVersions {
    /// The members whose version is not this node's.
    pub fn differing(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|(_, version)| **version != self.mine)
            .map(|(id, _)| id.clone())
            .collect()
    }
}

impl ClusterMode {
    /// Advertises `mine`, this node's config version, and reads the members' (see the module
    /// docs). Gossip carries it to the others within a few gossip rounds.
    pub async fn share_config_version(&self, mine: String) {
        let members = match self.gossip.lock().await.as_ref() {
            Some(gossip) => {
                gossip.advertise(Advertised::ConfigVersion, &mine).await;
                gossip
                    .advertised(Advertised::ConfigVersion)
                    .await
                    .into_iter()
                    .collect()
            }
            None => return,
        };
        *self
            .config_versions
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = ConfigVersions { mine, members };
    }

    /// The config versions as last shared.
    pub fn config_versions(&self) -> ConfigVersions {
        self.config_versions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
