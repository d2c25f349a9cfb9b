//! Wait times per RPC type, recorded only when a call actually waited.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::policy::stats::WaitHistogram;

/// A wait histogram per RPC type. Recording takes a lock, but only a call that waited records,
/// and such a call has just slept.
#[derive(Debug, Default)]
pub struct WaitsByRpc {
    histograms: Mutex<BTreeMap<String, Arc<WaitHistogram>>>,
}

impl WaitsByRpc {
    /// Records that a call of `rpc` waited `waited` (nothing if it did not wait).
    pub fn record(&self, rpc: &str, waited: Duration) {
        if waited.is_zero() {
            return;
        }
        let histogram = {
            let mut histograms = self.histograms.lock().unwrap_or_else(|p| p.into_inner());
            match histograms.get(rpc) {
                Some(h) => Arc::clone(h),
                None => Arc::clone(histograms.entry(rpc.to_owned()).or_default()),
            }
        };
        histogram.record(waited);
    }

    /// Per RPC type: total wait and the waits per bucket.
    pub fn snapshot(&self) -> BTreeMap<String, (Duration, Vec<u64>)> {
        let histograms = self.histograms.lock().unwrap_or_else(|p| p.into_inner());
        histograms
            .iter()
            .map(|(rpc, h)| (rpc.clone(), h.snapshot()))
            .collect()
    }
}
