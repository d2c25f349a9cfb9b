//! What Envoy's rate limit service decides: every descriptor of a request through its rule's
//! policy, never waiting, each bucket wherever it lives (`crate::decide`).
//!
//! | file | job |
//! |---|---|
//! | `answer.rs` | a request's descriptors and its answer: statuses, header fields; why a request is refused whole |
//! | `decision.rs` | `Rls`: a request checked whole, matched, counted, answered |
//! | `counts.rs` | the reference server's own counters of each rule |
//! | `sent.rs` | limits sent with requests: where their hits count, and their answer |
//!
//! The wire, the rules and their config are [`crate::front_door::rls`]'s.

mod answer;
mod counts;
mod decision;
mod sent;

pub use answer::{Answer, Code, CurrentLimit, Descriptor, RequestError};
use decision::Counted;
pub use decision::Rls;

use super::App;
use crate::decide::Ask;

impl App {
    /// Answers `ShouldRateLimit`: `descriptors` in `domain`, each for its own hits or else
    /// `hits_addend` (0 = 1). Each rule's bucket is decided wherever it lives, as every
    /// protocol's are (`crate::decide`).
    ///
    /// `None`: this node has no RLS rules.
    pub async fn should_rate_limit(
        &self,
        domain: &str,
        descriptors: &[Descriptor<'_>],
        hits_addend: u32,
    ) -> Option<Result<Answer, RequestError>> {
        let rls = self.rls.as_ref()?.load();
        let prepared = match rls.prepare(domain, descriptors, hits_addend) {
            Ok(prepared) => prepared,
            Err(error) => return Some(Err(error)),
        };
        let mut decided = Vec::new();
        for (step, policy, key, hits) in rls.rule_decisions(&prepared) {
            let counted = match self.decider.decide(policy, Ask::now(None, key, hits)).await {
                Ok(decision) => Counted {
                    over: decision.is_over(),
                    quota: decision.quota(),
                },
                // Not decided (a Redis policy on a node without one): over, nothing counted.
                Err(_) => Counted {
                    over: true,
                    quota: None,
                },
            };
            decided.push((step, counted));
        }
        Some(Ok(rls.finish(prepared, decided)))
    }
}
