//! Who is throttled: this node's rows, and in cluster mode every peer's, filtered and sorted.

use std::time::Duration;

use serde::Serialize;
use weir::policy::ThrottledRow;

use super::App;
use crate::error::ApiError;
use crate::reserved::CELLS_POLICY;

/// How many throttled keys a listing returns by default.
pub const DEFAULT_THROTTLE_ROWS: usize = 100;

/// One "who is throttled" row: a policy's row, and the node that holds the key back.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ThrottleRow {
    /// The node that holds the key back.
    pub node_id: String,
    /// The key, its policy, limit and rates.
    #[serde(flatten)]
    pub row: ThrottledRow,
}

/// Filters and order of a throttle listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThrottleQuery {
    /// Only this policy.
    pub policy: Option<String>,
    /// Only this node.
    pub node: Option<String>,
    /// Sort column: `current_qps` (default), `throttled_qps`, `qps_limit`, `in_flight`,
    /// `waiters`, `key`, `policy`, `kind`.
    pub sort: Option<String>,
    /// `desc` (default for numbers) or `asc` (default for names).
    pub order: Option<String>,
    /// At most this many rows (default 100).
    pub limit: Option<usize>,
}

/// Sorts throttle rows by a column; an unknown column is an error that lists the known ones.
fn sort_rows(
    rows: &mut [ThrottleRow],
    sort: Option<&str>,
    order: Option<&str>,
) -> Result<(), ApiError> {
    let column = sort.unwrap_or("current_qps");
    let numeric = matches!(
        column,
        "current_qps" | "throttled_qps" | "qps_limit" | "in_flight" | "waiters"
    );
    let descending = match order {
        None => numeric,
        Some("desc") => true,
        Some("asc") => false,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "`order` must be `asc` or `desc`, got `{other}`"
            )));
        }
    };
    let by: fn(&ThrottleRow, &ThrottleRow) -> std::cmp::Ordering = match column {
        "current_qps" => |a, b| a.row.current_qps.total_cmp(&b.row.current_qps),
        "throttled_qps" => |a, b| {
            let held = |r: &ThrottleRow| r.row.throttled_qps.unwrap_or(0.0);
            held(a).total_cmp(&held(b))
        },
        "qps_limit" => |a, b| {
            let limit = |r: &ThrottleRow| r.row.qps_limit.unwrap_or(f64::INFINITY);
            limit(a).total_cmp(&limit(b))
        },
        "in_flight" => |a, b| a.row.in_flight.cmp(&b.row.in_flight),
        "waiters" => |a, b| a.row.waiters.cmp(&b.row.waiters),
        "key" => |a, b| a.row.key.cmp(&b.row.key),
        "policy" => |a, b| a.row.policy.cmp(&b.row.policy),
        "kind" => |a, b| a.row.kind.cmp(&b.row.kind),
        other => {
            return Err(ApiError::invalid(format!(
                "`sort` must be one of current_qps, throttled_qps, qps_limit, in_flight, waiters, key, policy, kind; got `{other}`"
            )));
        }
    };
    rows.sort_by(|a, b| {
        let ordering =
            by(a, b).then_with(|| (&a.row.policy, &a.row.key).cmp(&(&b.row.policy, &b.row.key)));
        if descending {
            ordering.reverse()
        } else {
            ordering
        }
    });
    Ok(())
}

impl App {
    /// The keys held back, filtered and sorted.
    pub fn throttles(&self, query: &ThrottleQuery) -> Result<Vec<ThrottleRow>, ApiError> {
        // The order is checked whatever the filters leave, so a bad one is never let through.
        sort_rows(&mut [], query.sort.as_deref(), query.order.as_deref())?;
        if let Some(node) = &query.node
            && *node != self.node_id
        {
            return Ok(Vec::new());
        }
        let limit = query.limit.unwrap_or(DEFAULT_THROTTLE_ROWS);
        // `CL.THROTTLE`'s keys show as a policy of that name.
        let cells = query
            .policy
            .as_deref()
            .is_none_or(|name| name == CELLS_POLICY);
        let policies = match query.policy.as_deref() {
            Some(CELLS_POLICY) => Vec::new(),
            Some(name) => vec![
                self.policies
                    .get(name)
                    .ok_or_else(|| ApiError::unknown_policy(name))?,
            ],
            None => self.policies.policies(),
        };
        let cell_rows = match cells {
            true => self.cells.throttled_rows(self.cell_now(), limit),
            false => Vec::new(),
        };
        let mut rows: Vec<ThrottleRow> = policies
            .iter()
            .flat_map(|p| p.throttled_keys(limit))
            .chain(cell_rows)
            .map(|row| ThrottleRow {
                node_id: self.node_id.clone(),
                row,
            })
            .collect();
        sort_rows(&mut rows, query.sort.as_deref(), query.order.as_deref())?;
        rows.truncate(limit);
        Ok(rows)
    }

    /// The keys held back on every live node (this one, and each peer over gRPC, all asked at
    /// once over channels kept between calls), filtered and sorted. A peer that does not answer
    /// within a second is left out.
    pub async fn cluster_throttles(
        &self,
        query: &ThrottleQuery,
    ) -> Result<Vec<ThrottleRow>, ApiError> {
        let Some(cluster) = &self.cluster else {
            return self.throttles(query);
        };
        let local_query = ThrottleQuery {
            node: None,
            sort: None,
            order: None,
            ..query.clone()
        };
        let mut rows = self.throttles(&local_query)?;
        let limit = query.limit.unwrap_or(DEFAULT_THROTTLE_ROWS);
        let request = crate::proto::ThrottlesRequest {
            policy: query.policy.clone().unwrap_or_default(),
            limit: u32::try_from(limit).unwrap_or(u32::MAX),
        };
        let mut asking = tokio::task::JoinSet::new();
        for (peer, channel) in cluster.peers() {
            let request = request.clone();
            asking.spawn(async move {
                let mut client = crate::proto::weir_client::WeirClient::new(channel);
                let asked = tokio::time::timeout(Duration::from_secs(1), client.throttles(request));
                (peer, asked.await)
            });
        }
        while let Some(answered) = asking.join_next().await {
            let Ok((peer, asked)) = answered else {
                continue;
            };
            let Ok(Ok(answer)) = asked else {
                tracing::warn!(%peer, "no throttle rows from a peer within 1 s");
                continue;
            };
            rows.extend(answer.into_inner().rows.into_iter().map(|r| ThrottleRow {
                node_id: r.node_id,
                row: ThrottledRow {
                    policy: r.policy,
                    key: r.key,
                    kind: r.kind,
                    qps_limit: r.qps_limit,
                    current_qps: r.current_qps,
                    throttled_qps: r.throttled_qps,
                    in_flight: r.in_flight,
                    waiters: r.waiters,
                },
            }));
        }
        if let Some(node) = &query.node {
            rows.retain(|r| r.node_id == *node);
        }
        sort_rows(&mut rows, query.sort.as_deref(), query.order.as_deref())?;
        rows.truncate(limit);
        Ok(rows)
    }
}
