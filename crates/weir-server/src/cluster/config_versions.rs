//! What the members advertise of what they run. Whether they run the same policies: each advertises the version of its policy set
//! (a digest of every policy's config) in gossip, and each keeps what the others advertise, so
//! that `/v1/cluster` and `/metrics` show a member whose policies differ — a change made through
//! one node's API that the others have not had. And what each can run that not every member
//! may (a `[redis]` store), so that the cluster never commits a policy a member cannot run.
//! And the release each runs, so that `/v1/cluster` shows how far a rolling upgrade has gone.

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
    /// The release each live member runs, by node id; one from before releases were advertised
    /// is missing.
    pub builds: BTreeMap<String, String>,
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
        let (members, builds) = match self.gossip.lock().await.as_ref() {
            Some(gossip) => {
                gossip.advertise(Advertised::ConfigVersion, &mine).await;
                gossip.advertise(Advertised::Build, crate::BUILD).await;
                let members = gossip.advertised(Advertised::ConfigVersion).await;
                let builds = gossip.advertised(Advertised::Build).await;
                (members.into_iter().collect(), builds.into_iter().collect())
            }
            None => return,
        };
        *self
            .config_versions
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = ConfigVersions {
            mine,
            members,
            builds,
        };
    }

    /// Advertises what this node can run that not every member may (see `Advertised::Abilities`).
    pub async fn share_abilities(&self, abilities: &str) {
        if let Some(gossip) = self.gossip.lock().await.as_ref() {
            gossip.advertise(Advertised::Abilities, abilities).await;
        }
    }

    /// The live members that do not advertise `ability` (one from before abilities were
    /// advertised counts as lacking it): a policy that needs it must not be committed.
    pub async fn members_lacking(&self, ability: &str) -> Vec<String> {
        let advertised: BTreeMap<String, String> = match self.gossip.lock().await.as_ref() {
            Some(gossip) => gossip
                .advertised(Advertised::Abilities)
                .await
                .into_iter()
                .collect(),
            None => return Vec::new(),
        };
        let has = |id: &str| {
            advertised
                .get(id)
                .is_some_and(|abilities| abilities.split(',').any(|a| a == ability))
        };
        self.members
            .borrow()
            .iter()
            .filter(|member| !has(&member.id))
            .map(|member| member.id.clone())
            .collect()
    }

    /// The config versions as last shared.
    pub fn config_versions(&self) -> ConfigVersions {
        self.config_versions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
