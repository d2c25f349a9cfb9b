//! The shape every bucket of a keyed limiter shares, made from each limiter's config, and
//! sorted by the map it needs: rate cells (GCRA, strict), windows, in-flight permits.

use super::{
    ConcurrencyConfig, ConfigError, Count, Duration, LeakyBucketConfig, Nanos, Params, Quota,
    StrictConfig, TokenBucketConfig, Window, WindowConfig, gcra,
};

/// The shape every bucket of a keyed limiter shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// A token or leaky bucket.
    Gcra {
        /// Nanoseconds per token.
        interval: u64,
        /// The most tokens a bucket holds.
        capacity: u64,
        /// Tokens a new bucket starts with.
        initial: u64,
        /// Waiters are served strictly in arrival order.
        fair: bool,
    },
    /// Requests exactly `interval` nanoseconds apart.
    Strict {
        /// Nanoseconds between two requests.
        interval: u64,
    },
    /// At most `limit` in flight.
    Concurrency {
        /// Permits per key.
        limit: u64,
    },
    /// At most `limit` hits per calendar-aligned window, counted as `count` counts
    /// ([`window`](crate::limiter::window)). A window has no place to queue: a waiting acquire
    /// decides at once.
    Window {
        /// How the window counts.
        count: Count,
        /// A window's length in nanoseconds.
        window: u64,
        /// Hits per window.
        limit: u64,
    },
}

impl Shape {
    /// How long a bucket of this shape takes to become whole again from empty — a token
    /// bucket's burst at its rate, a window's length (two for a sliding window, whose hits
    /// weigh into the next), a strict limiter's spacing: what a restart that forgot the
    /// bucket would give away at most. `None` for a concurrency limit, which is never whole
    /// again by time alone.
    pub fn refill_time(&self) -> Option<Duration> {
        match *self {
            Shape::Gcra {
                interval, capacity, ..
            } => Some(Duration::from_nanos(interval.saturating_mul(capacity))),
            Shape::Strict { interval } => Some(Duration::from_nanos(interval)),
            Shape::Window { count, window, .. } => Some(Duration::from_nanos(
                window.saturating_mul(count.windows_a_hit_counts_in()),
            )),
            Shape::Concurrency { .. } => None,
        }
    }

    /// The shape as one of the two kinds of map: rate cells or in-flight permits. Calendar
    /// windows start at `unix_offset` before the clock's instant 0.
    pub(super) fn kind(self, unix_offset: Nanos) -> Kind {
        match self {
            Shape::Gcra {
                interval,
                capacity,
                initial,
                fair,
            } => Kind::Rate(RateShape::Gcra {
                interval,
                capacity,
                initial,
                fair,
            }),
            Shape::Strict { interval } => Kind::Rate(RateShape::Strict { interval }),
            Shape::Concurrency { limit } => Kind::Concurrency(Limit(limit)),
            Shape::Window {
                count,
                window,
                limit,
            } => Kind::Window(Window {
                count,
                length: window.max(1),
                limit,
                unix_offset,
            }),
        }
    }
}

/// A window limiter per key.
impl TryFrom<WindowConfig> for Shape {
    type Error = ConfigError;

    fn try_from(config: WindowConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let window = Window::from(config);
        Ok(Shape::Window {
            count: window.count,
            window: window.length,
            limit: window.limit,
        })
    }
}

/// A token bucket per key: full at first, refilling at `rate` up to `burst`.
impl TryFrom<TokenBucketConfig> for Shape {
    type Error = ConfigError;

    fn try_from(config: TokenBucketConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Shape::Gcra {
            interval: config.params().interval,
            capacity: config.burst,
            initial: config.burst,
            fair: false,
        })
    }
}

/// A leaky bucket per key, starting with `initial`.
impl TryFrom<LeakyBucketConfig> for Shape {
    type Error = ConfigError;

    fn try_from(config: LeakyBucketConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Shape::Gcra {
            interval: config.params().interval,
            capacity: config.max,
            initial: config.initial,
            fair: config.fair,
        })
    }
}

/// A strict limiter per key.
impl TryFrom<StrictConfig> for Shape {
    type Error = ConfigError;

    fn try_from(config: StrictConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Shape::Strict {
            interval: config.interval(),
        })
    }
}

/// A concurrency limit per key (every limit is valid).
impl From<ConcurrencyConfig> for Shape {
    fn from(config: ConcurrencyConfig) -> Self {
        Shape::Concurrency {
            limit: config.limit,
        }
    }
}

/// A [`Shape`] sorted by the map it needs.
pub(super) enum Kind {
    Rate(RateShape),
    Concurrency(Limit),
    /// Windows have a map of their own, although their cells are rate cells: a third rate
    /// shape slowed every bucket's decision, however its arm was written (the figures:
    /// `docs/benchmarks.md`, "Figures behind the code's choices").
    Window(Window),
}

/// The shape of a rate key's cell: the shapes whose whole state is one word.
///
/// It repeats `Shape`'s fields rather than holding a precomputed `Params`: keeping `Params`
/// here measured slower at 1 000 keys (`docs/benchmarks.md`), although it saves a
/// multiplication per decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RateShape {
    Gcra {
        interval: u64,
        capacity: u64,
        initial: u64,
        fair: bool,
    },
    Strict {
        interval: u64,
    },
}

impl RateShape {
    pub(super) fn params(&self) -> Params {
        match *self {
            RateShape::Gcra {
                interval, capacity, ..
            } => Params::new(interval, capacity),
            RateShape::Strict { interval } => Params::new(interval, 1),
        }
    }

    /// What a key whose cell holds `value` has left at `now`.
    pub(super) fn quota(&self, value: u64, now: Nanos) -> Quota {
        let params = self.params();
        let remaining = gcra::available(value, params, now);
        Quota {
            used: params.capacity() - remaining,
            remaining,
            reset_after: Duration::from_nanos(value.saturating_sub(now)),
        }
    }
}

impl From<RateShape> for Shape {
    fn from(shape: RateShape) -> Shape {
        match shape {
            RateShape::Gcra {
                interval,
                capacity,
                initial,
                fair,
            } => Shape::Gcra {
                interval,
                capacity,
                initial,
                fair,
            },
            RateShape::Strict { interval } => Shape::Strict { interval },
        }
    }
}

impl From<Window> for Shape {
    fn from(window: Window) -> Shape {
        Shape::Window {
            count: window.count,
            window: window.length,
            limit: window.limit,
        }
    }
}

/// The shape of a concurrency key's cell: permits per key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Limit(pub(super) u64);

impl From<Limit> for Shape {
    fn from(Limit(limit): Limit) -> Shape {
        Shape::Concurrency { limit }
    }
}
