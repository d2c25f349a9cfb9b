//! `weir cluster forget NODE`: a member gone for good removed from the voters of the cluster's
//! policy log, so it no longer counts in the majority (`DELETE /v1/cluster/members/{id}`).

use clap::Subcommand;
use weir_server::Client;

#[derive(Debug, Subcommand)]
pub(crate) enum ClusterAction {
    /// Forgets a member gone for good as a voter of the policy log (refused while it is alive,
    /// or if the live voters would be left without a majority); prints the voters left.
    Forget {
        /// The member's node id.
        node: String,
    },
}

pub(crate) async fn cluster(action: ClusterAction, client: Client) -> anyhow::Result<()> {
    let body = match action {
        ClusterAction::Forget { node } => {
            client
                .delete(&format!("/v1/cluster/members/{node}"))
                .await?
        }
    };
    println!("{}", serde_json::to_string_pretty(&body)?);
    Ok(())
}
