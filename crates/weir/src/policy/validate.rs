//! A policy config checked whole: every problem named with the policy and the field's path.

use super::config::{KeyedSpec, Limiter, OnExhausted, Override, PolicyConfig, Scope};
use super::error::PolicyError;

impl PolicyConfig {
    /// Checks the whole policy; the error names the policy and the field.
    pub fn validate(&self) -> Result<(), PolicyError> {
        self.validate_all().map_or(Ok(()), |errors| {
            Err(errors.into_iter().next().expect("non-empty"))
        })
    }

    /// Every problem with the policy (empty: none).
    pub fn problems(&self) -> Vec<PolicyError> {
        self.validate_all().unwrap_or_default()
    }

    fn validate_all(&self) -> Option<Vec<PolicyError>> {
        let name = self.name.as_str();
        let mut errors = Vec::new();
        if name.trim().is_empty() {
            errors.push(PolicyError::new(name, "name", "must not be empty"));
        }
        // Names and kinds are printed in logs, tables and metrics: no terminal control codes,
        // and no bidirectional overrides that would show a name as another (`…\u{202e}gnp.exe`
        // read as `…exe.png`).
        if name.chars().any(char::is_control) {
            errors.push(PolicyError::new(
                name,
                "name",
                "must not contain control characters",
            ));
        }
        if name.chars().any(is_bidi_control) {
            errors.push(PolicyError::new(
                name,
                "name",
                "must not contain bidirectional formatting characters (U+061C, U+200E, U+200F, U+202A to U+202E, U+2066 to U+2069)",
            ));
        }
        if self.kinds.iter().any(|k| k.chars().any(char::is_control)) {
            errors.push(PolicyError::new(
                name,
                "kinds",
                "must not contain control characters",
            ));
        }
        if self.kinds.iter().any(|k| k.trim().is_empty()) {
            errors.push(PolicyError::new(
                name,
                "kinds",
                "must not contain an empty kind",
            ));
        }
        if self.max_keys == 0 {
            errors.push(PolicyError::new(name, "max_keys", "must be at least 1"));
        }
        if self.max_cost == Some(0) {
            errors.push(PolicyError::new(name, "max_cost", "must be at least 1"));
        }
        if !self.learning_period.is_zero() && self.scope != Scope::Cluster {
            errors.push(PolicyError::new(
                name,
                "learning_period",
                "is for cluster-scoped rate policies (scope = \"cluster\"); a concurrency policy's shared pool has `concurrency.learning_period`",
            ));
        }
        if !self.assignments && self.scope != Scope::Cluster {
            errors.push(PolicyError::new(
                name,
                "assignments",
                "is for cluster-scoped rate policies (scope = \"cluster\")",
            ));
        }
        if self.scope == Scope::Redis {
            let redis_decides = match &self.limiter {
                Limiter::Keyed(KeyedSpec::TokenBucket(_) | KeyedSpec::Strict(_)) => None,
                Limiter::Keyed(KeyedSpec::LeakyBucket(spec)) if !spec.fair => None,
                Limiter::Keyed(KeyedSpec::LeakyBucket(_)) => Some(
                    "a fair leaky bucket's line of waiters lives in one process; use `fair = false`",
                ),
                Limiter::Keyed(KeyedSpec::Window(count, _)) if count.name() == "fixed_window" => {
                    None
                }
                Limiter::Keyed(KeyedSpec::Window(..)) => {
                    Some("Redis keeps fixed windows (`fixed_window`) and buckets")
                }
                Limiter::Keyed(KeyedSpec::Concurrency(_)) => {
                    Some("a concurrency limit is cluster-wide through its `shared_limit`")
                }
                Limiter::Adaptive(_) => {
                    Some("adaptive backpressure follows each node's own downstream")
                }
            };
            let per_core = match &self.limiter {
                Limiter::Keyed(spec) => spec.per_core(),
                Limiter::Adaptive(_) => false,
            };
            if per_core {
                errors.push(PolicyError::new(
                    name,
                    "scope",
                    "`redis` shares one bucket between every node, so `per_core` (which scales a node's own buckets by its cores) cannot apply",
                ));
            }
            if let Some(why) = redis_decides {
                errors.push(PolicyError::new(
                    name,
                    "scope",
                    format!(
                        "`redis` is for token and leaky buckets, strict limiters and fixed windows, not `{}`: {why}",
                        self.limiter.table()
                    ),
                ));
            }
        }
        if self.scope == Scope::Cluster
            && matches!(
                self.limiter,
                Limiter::Adaptive(_) | Limiter::Keyed(KeyedSpec::Concurrency(_))
            )
        {
            errors.push(PolicyError::new(
                name,
                "scope",
                format!(
                    "`cluster` is for rate limiters (buckets, strict and windows), not `{}`: {}",
                    self.limiter.table(),
                    match self.limiter {
                        Limiter::Adaptive(_) =>
                            "adaptive backpressure follows each node's own downstream",
                        _ => "a concurrency limit is cluster-wide through its `shared_limit`",
                    }
                ),
            ));
        }
        if let Limiter::Keyed(KeyedSpec::Window(count, _)) = &self.limiter
            && self.on_exhausted == OnExhausted::Wait
        {
            errors.push(PolicyError::new(
                name,
                "on_exhausted",
                format!(
                    "must be `reject` with a {}: a window has no place to queue (a token_bucket or leaky_bucket can wait)",
                    count.name()
                ),
            ));
        }
        match &self.limiter {
            Limiter::Adaptive(adaptive) => {
                if let Err(e) = adaptive.validate() {
                    errors.push(PolicyError::from_adaptive(name, e));
                }
                // The controller's own switches mean nothing in a policy: refused by name
                // rather than accepted and ignored.
                if adaptive.enabled {
                    errors.push(PolicyError::new(
                        name,
                        "adaptive.enabled",
                        "is not a policy field: an adaptive policy's controller is always on (delete the policy to turn it off)",
                    ));
                }
                if adaptive.dry_run {
                    errors.push(PolicyError::new(
                        name,
                        "adaptive.dry_run",
                        "is not a policy field: set the policy's mode = \"monitor\" for a dry run",
                    ));
                }
            }
            Limiter::Keyed(spec) => {
                if let Err(e) = self.shape_for(spec, 1.0) {
                    errors.push(e);
                }
                let table = spec.table();
                for (kind, value) in spec.overrides() {
                    let Override::Value(value) = value else {
                        if kind.trim().is_empty() {
                            errors.push(PolicyError::new(
                                name,
                                format!("{table}.overrides"),
                                "must not name an empty kind",
                            ));
                        }
                        continue;
                    };
                    if kind.trim().is_empty() {
                        errors.push(PolicyError::new(
                            name,
                            format!("{table}.overrides"),
                            "must not name an empty kind",
                        ));
                    } else if !value.is_finite() || value < 0.0 {
                        errors.push(PolicyError::new(
                            name,
                            format!("{table}.overrides.{kind}"),
                            format!("must be -1 (default), 0 (unlimited) or > 0, got {value}"),
                        ));
                    } else if value > 0.0
                        && let Err(e) = self.shape_with_value(spec, value, 1.0)
                    {
                        errors.push(PolicyError::new(
                            name,
                            format!("{table}.overrides.{kind}"),
                            e.problem,
                        ));
                    }
                }
            }
        }
        (!errors.is_empty()).then_some(errors)
    }
}

/// Whether `c` changes the direction text is shown in (Unicode's bidirectional formatting
/// characters).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}
