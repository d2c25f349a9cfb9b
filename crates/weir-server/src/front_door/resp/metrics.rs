//! `CL.THROTTLE`'s counters on `/metrics`: decisions by outcome, those made in the sketch,
//! keys held.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::app::cells::Cells;
use crate::metrics::{family, single};

/// `{outcome}`
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
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
            "CL.THROTTLE decisions on keys past `[server] resp_max_keys`, made in the sketch",
            MetricType::Counter,
            ConstCounter::new(sketched),
        )?;
        single(
            &mut encoder,
            "weir_cl_throttle_keys",
            "Keys CL.THROTTLE holds now (at most `[server] resp_max_keys`)",
            MetricType::Gauge,
            ConstGauge::new(self.cells.len() as i64),
        )
    }
}
