//! How long a request decided away from this node's own line may wait, and whether its policy
//! only monitors: read once from the policy's config for the owner's and Redis's asks.
//!
//! A bucket of this node's waits in the policy's own line (`weir::policy`), which reads the
//! same two fields the same way.

use std::time::Duration;

use weir::SystemClock;
use weir::policy::{Mode, OnExhausted, Policy};

/// What a policy allows a request that may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Waiting {
    /// The longest the request waits for room: zero unless the policy waits and enforces,
    /// and never longer than its `max_wait`.
    pub(super) max_wait: Duration,
    /// The policy monitors: what it would refuse is admitted, marked.
    pub(super) monitors: bool,
}

impl Waiting {
    /// What `policy` allows a request that asks to wait up to `asked` (`None`: as long as the
    /// policy does).
    pub(super) fn of(policy: &Policy<SystemClock>, asked: Option<Duration>) -> Waiting {
        policy.with_config(|config| {
            let waits = config.on_exhausted == OnExhausted::Wait && config.mode == Mode::Enforce;
            let max_wait = match (waits, asked) {
                (false, _) => Duration::ZERO,
                (true, Some(asked)) => asked.min(config.max_wait),
                (true, None) => config.max_wait,
            };
            Waiting {
                max_wait,
                monitors: config.mode == Mode::Monitor,
            }
        })
    }
}
