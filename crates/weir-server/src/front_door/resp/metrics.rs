//! The Redis protocol's counters on `/metrics`, registered when its listener starts:
//! `CL.THROTTLE`'s decisions by outcome, those made in the sketch, keys held; connections the
//! server closed, by why.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::app::App;
use crate::app::cells::Cells;
use crate::metrics::{family, single};

/// `{outcome}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// `{reason}` a connection was closed by the server.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    /// `auth_timeout`, `command_timeout`, `idle_timeout` or `evicted`.
    reason: &'static str,
}

/// Connections the server closed, by why: `weir_resp_connections_closed_total{reason}`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Closed(Family<ReasonLabel, Counter>);

impl Closed {
    /// Why a connection may be closed, each exported from the start at zero.
    const REASONS: [&str; 4] = ["auth_timeout", "command_timeout", "idle_timeout", "evicted"];

    /// The counters, registered on `app`'s `/metrics`, with `CL.THROTTLE`'s beside them.
    pub(crate) fn registered(app: &App) -> Self {
        let closed = Closed::default();
        for reason in Self::REASONS {
            let _ = closed.0.get_or_create(&ReasonLabel { reason });
        }
        app.metrics().register(
            "weir_resp_connections_closed",
            "Redis-protocol connections the server closed, by reason: auth_timeout, command_timeout (a request begun and not finished in time), idle_timeout, evicted (silent longest when a newcomer found the port full)",
            closed.0.clone(),
        );
        app.metrics()
            .register_collector(Box::new(CellsCollector::new(Arc::clone(app.cells()))));
        closed
    }

    /// Counts a connection closed for `reason` (one of [`Self::REASONS`]).
    pub(crate) fn count(&self, reason: &'static str) {
        debug_assert!(Self::REASONS.contains(&reason), "{reason}");
        self.0.get_or_create(&ReasonLabel { reason }).inc();
    }
}

/// `CL.THROTTLE`'s counters, read at scrape time.
#[derive(Debug)]
pub(crate) struct CellsCollector {
    cells: Arc<Cells>,
}

impl CellsCollector {
    /// The collector of `cells`' counters.
    pub(crate) fn new(cells: Arc<Cells>) -> Self {
        CellsCollector { cells }
    }
}

impl Collector for CellsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let (admitted, limited) = self.cells.counts();
        family(
            &mut encoder,
            "weir_cl_throttle_decisions",
            "CL.THROTTLE decisions over the Redis protocol: admitted, limited",
            MetricType::Counter,
            [("admitted", admitted), ("limited", limited)]
                .map(|(outcome, v)| (OutcomeLabel { outcome }, ConstCounter::new(v))),
        )?;
        let (sketched, _) = self.cells.sketch_counts();
        single(
            &mut encoder,
            "weir_cl_throttle_sketched",
            "CL.THROTTLE decisions on keys past `[resp] max_keys`, made in the sketch",
            MetricType::Counter,
            ConstCounter::new(sketched),
        )?;
        single(
            &mut encoder,
            "weir_cl_throttle_keys",
            "Keys CL.THROTTLE holds now (at most `[resp] max_keys`)",
            MetricType::Gauge,
            ConstGauge::new(self.cells.len() as i64),
        )
    }
}
