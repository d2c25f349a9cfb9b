//! A policy whose engine is adaptive backpressure: its decisions, busy signals and ticks.

use std::sync::Arc;
use std::time::Duration;

use super::admission::Admission;
#[cfg(feature = "tokio")]
use super::admission::StillWaiting;
use super::config;
use super::state::PolicyState;
use super::stats::Outcome;
use super::{Policy, RejectReason, Rejection, Request};
use crate::backpressure::{Backpressure, BackpressureStats};
use crate::clock::Clock;

/// The RPC type the controller counts a request under: its kind, or one shared by every request
/// of no kind.
fn rpc_type<'a>(request: &Request<'a>) -> &'a str {
    request.kind.unwrap_or_default()
}

impl<C: Clock + Clone> Policy<C> {
    /// An adaptive policy decides without waiting: the key's next slot, if it is limited.
    pub(super) fn try_adaptive(
        &self,
        state: &Arc<PolicyState<C>>,
        adaptive: &Backpressure<C>,
        request: &Request<'_>,
    ) -> Result<Admission<C>, Rejection> {
        match adaptive.try_call(rpc_type(request), request.key) {
            Ok(()) => {
                adaptive.after_call(rpc_type(request), request.key);
                Ok(self.admit(state, None, Duration::ZERO, Outcome::Admitted))
            }
            Err(wait) => self.adaptive_refused(state, adaptive, request, wait),
        }
    }

    /// An adaptive policy that waits: takes the key's slot if it comes within `max_wait`.
    #[cfg(feature = "tokio")]
    pub(super) async fn wait_adaptive(
        &self,
        state: &Arc<PolicyState<C>>,
        adaptive: &Backpressure<C>,
        request: &Request<'_>,
        max_wait: Duration,
    ) -> Result<Admission<C>, Rejection> {
        let reserved = adaptive.reserve_within(rpc_type(request), request.key, max_wait);
        match reserved {
            Err(wait) => self.adaptive_refused(state, adaptive, request, wait),
            Ok(None) => {
                adaptive.after_call(rpc_type(request), request.key);
                Ok(self.admit(state, None, Duration::ZERO, Outcome::Admitted))
            }
            Ok(Some(at)) => {
                let wait = Duration::from_nanos(at.saturating_sub(self.clock.now()));
                if !wait.is_zero() {
                    state.stats.waiting(1);
                    let waiting = StillWaiting(&state.stats);
                    tokio::time::sleep(wait).await;
                    drop(waiting);
                }
                adaptive.record_wait(rpc_type(request), wait);
                adaptive.after_call(rpc_type(request), request.key);
                let outcome = if wait.is_zero() {
                    Outcome::Admitted
                } else {
                    Outcome::Throttled
                };
                Ok(self.admit(state, None, wait, outcome))
            }
        }
    }

    pub(super) fn adaptive_refused(
        &self,
        state: &Arc<PolicyState<C>>,
        adaptive: &Backpressure<C>,
        request: &Request<'_>,
        wait: Duration,
    ) -> Result<Admission<C>, Rejection> {
        // "Who is throttled" for an adaptive policy comes from its controller's limits.
        if state.config.mode == config::Mode::Monitor {
            adaptive.after_call(rpc_type(request), request.key);
            return Ok(self.admit(state, None, Duration::ZERO, Outcome::WouldThrottle));
        }
        state.stats.decided(Outcome::Rejected, Duration::ZERO);
        Err(self.rejection(RejectReason::Limited { retry_after: wait }))
    }

    /// A downstream said "busy": an adaptive policy tightens its hottest keys. Returns whether
    /// limits were tightened, or `None` if the policy is not adaptive.
    pub fn busy(&self) -> Option<bool> {
        self.state.load().adaptive().map(|a| a.on_busy())
    }

    /// `ms` milliseconds have passed: an adaptive policy may relax a level. Call it every second
    /// (a server runs one task for all its policies).
    pub fn tick(&self, ms: u64) {
        if let Some(adaptive) = self.state.load().adaptive() {
            adaptive.tick(ms);
        }
    }

    /// The adaptive controller's counters, for an adaptive policy.
    pub fn backpressure_stats(&self) -> Option<BackpressureStats> {
        self.state.load().adaptive().map(|a| a.stats())
    }
}
