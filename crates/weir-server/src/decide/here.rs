//! A bucket of this node's, decided in the policy's own line: what is lent out of it to data
//! planes set aside first, the request waiting its turn if the policy waits — unless shutdown
//! begins.

use std::task::Poll;

use weir::SystemClock;
use weir::limiter::Quota;
use weir::policy::{Admission, Policy, Rejection, Request};

use super::{AdmissionTier, Ask, Decider, Decision};
use crate::error::ApiError;

impl Decider {
    /// Decides `ask` on this node's own bucket of `policy`.
    pub(super) async fn decide_here(
        &self,
        policy: &Policy<SystemClock>,
        ask: Ask<'_>,
    ) -> Result<Decision, ApiError> {
        self.lent
            .set_aside(policy, ask.kind, ask.key, ask.cost, self.cluster.is_some());
        let mut request = Request::new(ask.key).cost(ask.cost);
        request.kind = ask.kind;
        if ask.decides_now() {
            // What the bucket has left is read with the decision itself.
            let (decided, quota) = policy.try_acquire_with_quota(&request);
            return Ok(decision_of(decided, quota));
        }
        if let Some(max_wait) = ask.max_wait {
            request = request.max_wait(max_wait);
        }
        Ok(decision_of(
            self.acquire_here(policy, &request).await?,
            None,
        ))
    }

    /// `request` of `policy` in its line on this node: most are decided on their first poll,
    /// and only one that waits listens for a shutdown (listening costs a subscription).
    pub(crate) async fn acquire_here(
        &self,
        policy: &Policy<SystemClock>,
        request: &Request<'_>,
    ) -> Result<Result<Admission<SystemClock>, Rejection>, ApiError> {
        let acquire = policy.acquire(request);
        let mut acquire = std::pin::pin!(acquire);
        match std::future::poll_fn(|cx| Poll::Ready(acquire.as_mut().poll(cx))).await {
            Poll::Ready(decided) => Ok(decided),
            Poll::Pending => tokio::select! {
                decided = acquire => Ok(decided),
                () = self.shutting_down() => Err(ApiError::shutting_down()),
            },
        }
    }
}

/// A decision of this node's line as a [`Decision`]. A rate's admission is done as soon as it
/// is answered: nothing is held.
fn decision_of(
    decided: Result<Admission<SystemClock>, Rejection>,
    quota: Option<Quota>,
) -> Decision {
    match decided {
        Ok(admission) => Decision::Admitted {
            waited: admission.waited(),
            would_throttle: admission.would_throttle(),
            quota,
            tier: AdmissionTier::Node,
        },
        Err(rejection) => Decision::Refused {
            retry_after: rejection.retry_after(),
            reason: rejection.to_string(),
            quota,
        },
    }
}
