//! What the scenarios of one hot bucket on three local nodes share (`owner-throughput`,
//! `rate-assignments`): which node owns the bucket, a run whose clients ask the two others,
//! the nodes' CPU and `/v1/cluster` counters around it, and a figure's spread over the runs.

use std::time::Duration;

use serde::Serialize;
use weir_cluster::ring::{DEFAULT_VNODES, Member, Ring};
use weir_server::CLUSTER_PROTOCOL as PROTOCOL;

use super::{ScenarioSettings, median, one_run};
use crate::nodes::LocalNode;
use crate::report::Report;
use crate::run::{self, TargetSpec};

/// A figure over the runs: the median and the range.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// The median.
    pub median: f64,
    /// The smallest.
    pub min: f64,
    /// The largest.
    pub max: f64,
}

impl Spread {
    /// The median and range of `values`.
    pub fn of(values: &[f64]) -> Spread {
        Spread {
            median: median(values.to_vec()),
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }

    /// `median [min–max]`, each with `digits` decimals.
    pub fn show(&self, digits: usize) -> String {
        format!(
            "{:.*} [{:.*}–{:.*}]",
            digits, self.median, digits, self.min, digits, self.max
        )
    }
}

/// The index of the node among `n1`, `n2`, `n3` that owns the ring's `bucket`, as every node's
/// ring names it once they see each other.
pub fn owner_among_three(bucket: &str) -> usize {
    let ids = ["n1", "n2", "n3"];
    let ring = Ring::new(
        ids.iter().map(|id| Member::owner(*id, PROTOCOL)),
        DEFAULT_VNODES,
        PROTOCOL,
    );
    let owner = ring.owner_of(bucket).expect("a ring of three");
    ids.iter().position(|id| *id == owner).expect("a member")
}

/// What a run through the nodes other than the owner saw.
pub(super) struct AroundOwner {
    /// The clients' report.
    pub report: Report,
    /// Each node's CPU time over the run, the warm-up included.
    pub cpu: Vec<Duration>,
    /// How much each of the two counters asked for moved, summed over the nodes asked.
    pub counted: [u64; 2],
}

/// Runs `policy` once with `clients` closed-loop clients on the nodes other than `owner`,
/// reading each node's CPU and the asked nodes' `/v1/cluster` `counters` before and after.
pub(super) async fn run_around_owner(
    policy: &str,
    (owner, nodes): (usize, &[LocalNode]),
    clients: usize,
    counters: [&str; 2],
    settings: &ScenarioSettings,
) -> anyhow::Result<AroundOwner> {
    let asked: Vec<&LocalNode> = (0..nodes.len())
        .filter(|i| *i != owner)
        .map(|i| &nodes[i])
        .collect();
    let target = TargetSpec::Grpc(asked.iter().map(|node| node.grpc.clone()).collect());
    let mut one = one_run(target, policy, 0.0, settings);
    one.clients = clients;
    let mut before = Vec::new();
    for node in &asked {
        before.push(cluster_counters(node, counters).await?);
    }
    let cpu_before = nodes
        .iter()
        .map(LocalNode::cpu_time)
        .collect::<anyhow::Result<Vec<_>>>()?;
    // The warm-up is counted in the CPU time too: it is measured from before the run.
    let report = run::run(&one).await?;
    let cpu = nodes
        .iter()
        .zip(&cpu_before)
        .map(|(node, before)| Ok(node.cpu_time()?.saturating_sub(*before)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if let Some(error) = &report.first_error {
        anyhow::bail!("{policy}: {error}");
    }
    let mut counted = [0, 0];
    for (node, before) in asked.iter().zip(before) {
        let now = cluster_counters(node, counters).await?;
        for i in 0..2 {
            counted[i] += now[i].saturating_sub(before[i]);
        }
    }
    Ok(AroundOwner {
        report,
        cpu,
        counted,
    })
}

/// Two of a node's `/v1/cluster` counters.
async fn cluster_counters(node: &LocalNode, names: [&str; 2]) -> anyhow::Result<[u64; 2]> {
    let view: serde_json::Value = reqwest::get(format!("{}/v1/cluster", node.http))
        .await?
        .json()
        .await?;
    Ok(names.map(|name| view["counters"][name].as_u64().unwrap_or(0)))
}
