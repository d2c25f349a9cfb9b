//! The changes the members agree on, and what applying one does to the API's overlay.
//!
//! Applying is deterministic: every member applies the same changes in the same order to the
//! same overlay and reaches the same outcome, so a conditional write is decided once for the
//! whole cluster. What a change is checked against travels with it: the policy as the
//! proposing member's config file defines it (the base every member shares when the config
//! file is one ConfigMap), for a name the overlay has not touched.

use serde::{Deserialize, Serialize};
use weir::policy::PolicyConfig;

use crate::durable::Overlay;
use crate::etag::etag_of;

/// A change to the cluster's policies.
// One per admin change, in a log: their size does not matter, and boxing would only cost.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Change {
    /// Creates or replaces a policy.
    Put {
        /// The policy, validated by the member it was made on.
        config: PolicyConfig,
        /// What the write expects to replace.
        expect: Expect,
    },
    /// Deletes a policy.
    Delete {
        /// The policy's name.
        name: String,
        /// What the write expects to delete.
        expect: Expect,
    },
    /// Drops every change made over the API to a policy: the config file's version (or none)
    /// applies again. Written only once every live member advertises it can apply it.
    Revert {
        /// The policy's name.
        name: String,
    },
    /// Makes `overlay` the cluster's: what the member that started the log had changed over
    /// the API while it ran alone.
    Seed {
        /// The overlay.
        overlay: Overlay,
    },
}

/// What a conditional write expects, with what it is checked against outside the overlay.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Expect {
    /// The `If-Match` as given: a tag, `*` (it exists), or none (unconditional).
    pub if_match: Option<String>,
    /// The policy of that name in the proposing member's config file, if any.
    pub base: Option<PolicyConfig>,
}

/// What applying a change did.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    /// The policy was written; `created` if it did not exist.
    Written {
        /// Whether it was created.
        created: bool,
    },
    /// The policy was deleted; this is what it was.
    Deleted {
        /// The policy as it was.
        previous: PolicyConfig,
    },
    /// The changes made over the API to a policy were dropped.
    Reverted,
    /// The overlay was replaced.
    Seeded,
    /// `If-Match` did not match: nothing changed. `current` is the policy's tag, if it exists.
    PreconditionFailed {
        /// The policy's tag, if it exists.
        current: Option<String>,
    },
    /// A delete of a policy that does not exist, or a revert of one no change over the API
    /// holds: nothing changed.
    NotFound,
    /// An entry that changes no policy: a new leader's first, a change of the members.
    Nothing,
}

/// The policy `name` as `overlay` over `base` makes it.
fn current<'a>(
    overlay: &'a Overlay,
    name: &str,
    base: Option<&'a PolicyConfig>,
) -> Option<&'a PolicyConfig> {
    if overlay.deletes.contains(name) {
        return None;
    }
    overlay.upserts.get(name).or(base)
}

/// Whether `if_match` holds for `current`.
fn matches(if_match: Option<&str>, current: Option<&PolicyConfig>) -> bool {
    match (if_match.map(str::trim), current) {
        (None, _) => true,
        (Some("*"), current) => current.is_some(),
        (Some(tag), Some(current)) => etag_of(current) == tag,
        (Some(_), None) => false,
    }
}

/// Applies `change` to `overlay`, deciding its `If-Match` (see the [module docs](self)).
pub fn apply(overlay: &mut Overlay, change: Change) -> Outcome {
    match change {
        Change::Put { config, expect } => {
            let existing = current(overlay, &config.name, expect.base.as_ref());
            if !matches(expect.if_match.as_deref(), existing) {
                return Outcome::PreconditionFailed {
                    current: existing.map(etag_of),
                };
            }
            let created = existing.is_none();
            *overlay = overlay.with_upsert(config);
            Outcome::Written { created }
        }
        Change::Delete { name, expect } => {
            let Some(existing) = current(overlay, &name, expect.base.as_ref()).cloned() else {
                return match expect.if_match {
                    Some(_) => Outcome::PreconditionFailed { current: None },
                    None => Outcome::NotFound,
                };
            };
            if !matches(expect.if_match.as_deref(), Some(&existing)) {
                return Outcome::PreconditionFailed {
                    current: Some(etag_of(&existing)),
                };
            }
            *overlay = overlay.with_delete(&name);
            Outcome::Deleted { previous: existing }
        }
        Change::Revert { name } => {
            if !overlay.touches(&name) {
                return Outcome::NotFound;
            }
            *overlay = overlay.without(&name);
            Outcome::Reverted
        }
        Change::Seed { overlay: seed } => {
            *overlay = seed;
            Outcome::Seeded
        }
    }
}

#[cfg(test)]
mod tests;
