//! Admitting a request under a policy: the decision, waiting, rollback, and the
//! [`Admission`] that marks the request finished when dropped.

use std::sync::Arc;
use std::time::Duration;

use super::config;
#[cfg(feature = "tokio")]
use super::config::OnExhausted;
use super::state::PolicyState;
use super::stats::Outcome;
#[cfg(feature = "tokio")]
use super::stats::PolicyStats;
use super::{Policy, RejectReason, Rejection, Request};
use crate::clock::Clock;
use crate::keyed::KeyedLimiter;
use crate::keyed::{KeyedAdmission, KeyedRefusal, Taken};
use crate::limiter::Quota;

/// An admitted request. Dropping it marks the request finished (and releases concurrency
/// permits); [`Policy::rollback`] gives back what it took instead.
#[derive(Debug)]
#[must_use = "dropping an admission finishes the request and releases its permits"]
pub struct Admission<C: Clock + Clone = crate::clock::SystemClock> {
    state: Option<Arc<PolicyState<C>>>,
    taken: Option<Taken>,
    waited: Duration,
    outcome: Option<Outcome>,
}

impl<C: Clock + Clone> Admission<C> {
    /// An admission by a policy that does not apply to the request: nothing counted.
    pub(super) fn untouched() -> Self {
        Admission {
            state: None,
            taken: None,
            waited: Duration::ZERO,
            outcome: None,
        }
    }

    /// How long the request waited.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// Whether the request had to wait.
    pub fn throttled(&self) -> bool {
        self.outcome == Some(Outcome::Throttled)
    }

    /// Whether the limiter refused but the policy admitted because it only monitors.
    pub fn would_throttle(&self) -> bool {
        self.outcome == Some(Outcome::WouldThrottle)
    }

    /// Whether the policy applied to the request at all.
    pub fn applied(&self) -> bool {
        self.state.is_some()
    }
}

impl<C: Clock + Clone> Drop for Admission<C> {
    fn drop(&mut self) {
        if let Some(state) = &self.state {
            state.stats.finish();
        }
    }
}

/// Decrements the waiter gauge however the wait ends.
#[cfg(feature = "tokio")]
pub(super) struct StillWaiting<'a>(pub(super) &'a PolicyStats);

#[cfg(feature = "tokio")]
impl Drop for StillWaiting<'_> {
    fn drop(&mut self) {
        self.0.waiting(-1);
    }
}

impl<C: Clock + Clone> Policy<C> {
    /// Decides now, without waiting (whatever `on_exhausted` says).
    #[inline]
    pub fn try_acquire(&self, request: &Request<'_>) -> Result<Admission<C>, Rejection> {
        let state = self.state.load();
        let Some(buckets) = state.buckets(request.kind) else {
            return Ok(Admission::untouched());
        };
        state.stats.start();
        self.check_cost(&state, request)?;
        if let Some(adaptive) = state.adaptive() {
            return self.try_adaptive(&state, adaptive, request);
        }
        let Some(limiter) = buckets else {
            return Ok(self.admit(&state, None, Duration::ZERO, Outcome::Admitted));
        };
        match limiter.try_acquire(request.key, request.cost) {
            Ok(grant) => Ok(self.granted(&state, limiter, request, grant)),
            // Deciding now never times out: no wait to report.
            Err(refusal) => self.refused(&state, limiter, request, refusal, Duration::ZERO),
        }
    }

    /// [`try_acquire`](Self::try_acquire), and what the request's key has left just after,
    /// read under the same lock as the decision ([`KeyedLimiter::try_acquire_with_quota`]):
    /// `None` where the policy does not apply, leaves the kind unlimited, is adaptive, or limits
    /// concurrency.
    pub fn try_acquire_with_quota(
        &self,
        request: &Request<'_>,
    ) -> (Result<Admission<C>, Rejection>, Option<Quota>) {
        let state = self.state.load();
        let Some(Some(limiter)) = state.buckets(request.kind) else {
            return (self.try_acquire(request), None);
        };
        if state.adaptive().is_some() {
            return (self.try_acquire(request), None);
        }
        state.stats.start();
        if let Err(rejection) = self.check_cost(&state, request) {
            return (Err(rejection), None);
        }
        let (decided, quota) = limiter.try_acquire_with_quota(request.key, request.cost);
        let answer = match decided {
            Ok(grant) => Ok(self.granted(&state, limiter, request, grant)),
            Err(refusal) => self.refused(&state, limiter, request, refusal, Duration::ZERO),
        };
        (answer, quota)
    }

    /// Decides, waiting up to `max_wait` (the policy's, or the request's if shorter) if the
    /// policy says `wait`.
    #[cfg(feature = "tokio")]
    pub async fn acquire(&self, request: &Request<'_>) -> Result<Admission<C>, Rejection> {
        let state = self.state.load_full();
        let max_wait = request
            .max_wait
            .map_or(state.config.max_wait, |w| w.min(state.config.max_wait));
        let waits = state.config.on_exhausted == OnExhausted::Wait
            && state.config.mode == config::Mode::Enforce
            && !max_wait.is_zero();
        if !waits {
            drop(state);
            return self.try_acquire(request);
        }
        let Some(buckets) = state.buckets(request.kind) else {
            return Ok(Admission::untouched());
        };
        state.stats.start();
        self.check_cost(&state, request)?;
        if let Some(adaptive) = state.adaptive() {
            return self
                .wait_adaptive(&state, adaptive, request, max_wait)
                .await;
        }
        let Some(limiter) = buckets else {
            return Ok(self.admit(&state, None, Duration::ZERO, Outcome::Admitted));
        };
        let limiter = Arc::clone(limiter);
        state.stats.waiting(1);
        let waiting = StillWaiting(&state.stats);
        let decided = limiter.acquire(request.key, request.cost, max_wait).await;
        drop(waiting);
        match decided {
            Ok(grant) => Ok(self.granted(&state, &limiter, request, grant)),
            Err(refusal) => self.refused(&state, &limiter, request, refusal, max_wait),
        }
    }

    /// Counts a decision on `request` that this policy's own buckets did not make — within a
    /// share of a cluster-wide bucket assigned to this node, or by the Redis its buckets live
    /// in — as one of its own: in its counters (`refused`: the bucket said no; admitted anyway
    /// if the policy only monitors) and in who it holds back. So a policy's numbers count every
    /// decision made for it on this node, wherever its bucket is.
    ///
    /// `place` (< [`stats::PLACES`](super::stats::PLACES)) names where, for the counters to
    /// keep apart.
    pub fn count_decided_elsewhere(&self, request: &Request<'_>, refused: bool, place: usize) {
        let state = self.state.load();
        if !state.config.applies_to(request.kind) {
            return;
        }
        state.stats.start();
        let outcome = match (refused, state.config.mode == config::Mode::Monitor) {
            (false, _) => Outcome::Admitted,
            (true, true) => Outcome::WouldThrottle,
            (true, false) => Outcome::Rejected,
        };
        // Its refusals go into who is held back, and its admissions into the rates of a key
        // already there (the table's lock is taken only while it follows some key: a policy
        // holding nobody back pays an atomic load).
        if refused && let Some(Some(limiter)) = state.buckets(request.kind) {
            self.record_throttled(&state, limiter, request);
        } else if !refused {
            state.throttled.admitted(request.key, self.clock.now());
        }
        state.stats.decided(outcome, Duration::ZERO);
        state.stats.placed(place, outcome);
        if outcome != Outcome::Rejected {
            state.stats.finish();
        }
    }

    /// Counts decisions on requests of `kind` made elsewhere in bulk, as a data plane reports
    /// what it decided within a share of this policy's bucket: `admitted` admitted, `refused`
    /// refused, at `place`.
    pub fn count_reported(&self, kind: Option<&str>, admitted: u64, refused: u64, place: usize) {
        let state = self.state.load();
        if state.config.applies_to(kind) {
            state.stats.decided_many(admitted, refused, place);
        }
    }

    /// Tells apart a decision on a request of `kind` that this policy's own buckets made and
    /// counted, on behalf of `place` (a node: the bucket's owner deciding another node's
    /// request).
    pub fn count_place(&self, kind: Option<&str>, place: usize, outcome: Outcome) {
        let state = self.state.load();
        if state.config.applies_to(kind) {
            state.stats.placed(place, outcome);
        }
    }

    /// Lets through a request that has no bucket key (its principal has no value for the
    /// policy's dimension), counting it as such if the policy applies to its kind.
    pub fn pass_unkeyed(&self, kind: Option<&str>) {
        let state = self.state.load();
        if state.config.applies_to(kind) {
            state.stats.unkeyed();
        }
    }

    /// Gives back what `admission` took (a request that another policy refused).
    pub fn rollback(&self, request: &Request<'_>, mut admission: Admission<C>) {
        let (Some(state), Some(taken)) = (&admission.state, admission.taken.take()) else {
            return;
        };
        if let Some(Some(limiter)) = state.buckets(request.kind) {
            limiter.give_back(request.key, taken);
        }
    }

    pub(super) fn check_cost(
        &self,
        state: &PolicyState<C>,
        request: &Request<'_>,
    ) -> Result<(), Rejection> {
        match state.config.max_cost {
            Some(max) if request.cost > max => {
                state.stats.decided(Outcome::Rejected, Duration::ZERO);
                Err(self.rejection(RejectReason::CostTooLarge {
                    cost: request.cost,
                    max,
                }))
            }
            _ => Ok(()),
        }
    }

    pub(super) fn admit(
        &self,
        state: &Arc<PolicyState<C>>,
        taken: Option<Taken>,
        waited: Duration,
        outcome: Outcome,
    ) -> Admission<C> {
        state.stats.decided(outcome, waited);
        Admission {
            state: Some(Arc::clone(state)),
            taken,
            waited,
            outcome: Some(outcome),
        }
    }

    pub(super) fn granted(
        &self,
        state: &Arc<PolicyState<C>>,
        limiter: &KeyedLimiter<C>,
        request: &Request<'_>,
        grant: KeyedAdmission,
    ) -> Admission<C> {
        let outcome = if grant.waited.is_zero() {
            if grant.tracked {
                state.throttled.admitted(request.key, self.clock.now());
            }
            Outcome::Admitted
        } else {
            self.record_throttled(state, limiter, request);
            Outcome::Throttled
        };
        self.admit(state, Some(grant.taken), grant.waited, outcome)
    }

    /// Counts a refusal and says why; `max_wait` is how long a request that timed out waited.
    pub(super) fn refused(
        &self,
        state: &Arc<PolicyState<C>>,
        limiter: &KeyedLimiter<C>,
        request: &Request<'_>,
        refusal: KeyedRefusal,
        max_wait: Duration,
    ) -> Result<Admission<C>, Rejection> {
        self.record_throttled(state, limiter, request);
        if state.config.mode == config::Mode::Monitor {
            return Ok(self.admit(state, None, Duration::ZERO, Outcome::WouldThrottle));
        }
        // Only a request that waited its whole `max_wait` has waited at all.
        let (reason, waited) = match refusal {
            KeyedRefusal::Limited(crate::Refused::ExceedsCapacity { cost, capacity }) => (
                RejectReason::ExceedsCapacity { cost, capacity },
                Duration::ZERO,
            ),
            KeyedRefusal::Limited(crate::Refused::RetryAfter { retry_after }) => {
                (RejectReason::Limited { retry_after }, Duration::ZERO)
            }
            KeyedRefusal::Limited(crate::Refused::NoPermit) => {
                (RejectReason::InFlightFull, Duration::ZERO)
            }
            KeyedRefusal::KeysExhausted => (
                RejectReason::KeysExhausted {
                    max_keys: state.config.max_keys,
                },
                Duration::ZERO,
            ),
            KeyedRefusal::TimedOut => (RejectReason::WaitedTooLong { max_wait }, max_wait),
        };
        state.stats.decided(Outcome::Rejected, waited);
        Err(self.rejection(reason))
    }

    pub(super) fn rejection(&self, reason: RejectReason) -> Rejection {
        Rejection {
            policy: self.name.clone(),
            reason,
        }
    }
}
