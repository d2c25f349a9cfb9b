//! Rate assignments: a share of a cluster-scoped rate bucket lent to a node that asks for it
//! often, so that it decides those requests itself instead of forwarding each to the owner.
//!
//! A bucket's rate `r` and burst `B` are cut into [`SHARES`] shares. A node that forwards more
//! than [`ASSIGN_ABOVE`] a second of a bucket *reports* its demand to the owner every
//! [`REPORT_EVERY`]; the owner answers with the shares the node may run — a local token bucket
//! of rate `r·s/SHARES` and burst `B·s/SHARES` that starts empty — for [`ASSIGNMENT_TTL`] from
//! when the node asked. The owner gives each asker shares in proportion to its demand among
//! every node's, its own included (what it decides for itself and for the nodes that still
//! forward): over-asked, a bucket admits from each node about what one bucket would have.
//!
//! What is lent is counted as a *loan* in a [`SharedPool`](crate::pool::SharedPool) — the
//! mechanism that lends units of a concurrency policy's shared pool — so the same rules hold:
//! the shares lent never add up to more than [`SHARES`]; a loan lives until its TTL unless
//! the next report renews it; a holder that stops reporting loses it at expiry; a cut is
//! counted until the holder says it made it (its next report's `running`), so at no instant
//! are more shares in use than lent.
//! The owner sets aside what it lent out of its own bucket: the lent share of its refill, and
//! the lent share of its capacity (its bucket holds no more than `B` minus what the holders
//! may hold). So over any window of length `W`, what the owner and every holder admit
//! together is at most what one bucket admits, `B + r·W` (see `docs/guarantees.md`).
//!
//! This module is the logic only, over times given to it: the owner's book
//! ([`AssignmentBook`]) and a holder's ([`HeldRates`]); the server carries reports and applies
//! what is set aside to its policy's bucket.

use std::time::Duration;

use weir::Nanos;

mod book;
mod held;

pub use book::AssignmentBook;
pub use held::{HeldRates, Local};

/// How many shares a bucket's rate is cut into: an assignment is a count of them.
pub const SHARES: u64 = 1000;

/// How often a node reports its demand for the buckets it holds or would hold.
pub const REPORT_EVERY: Duration = Duration::from_millis(250);

/// How long an assignment lives after the report that asked for it: three reports may be lost
/// before a holder stops deciding on it; a crashed holder's shares come back after this.
pub const ASSIGNMENT_TTL: Duration = Duration::from_secs(1);

/// The longest TTL a holder may ask for: a data plane that reports every few seconds holds
/// its assignment across one lost report. A holder gone silent keeps its shares this long.
pub const LONGEST_TTL: Duration = Duration::from_secs(10);

/// The demand (cost a second, at one node) from which a bucket is worth an assignment: below
/// it, a report every [`REPORT_EVERY`] would cost about what forwarding does.
pub const ASSIGN_ABOVE: u64 = 20;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// A holder's shares are cut only when its due is more than one part in this below what it
/// runs.
const CUT_BEYOND: u64 = 20;

/// A whole bucket's shape, as its policy has it: what a share is a part of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Whole {
    /// Nanoseconds per token (the inverse of the rate), at least 1.
    pub interval: u64,
    /// Tokens the bucket holds full.
    pub capacity: u64,
}

impl Whole {
    /// Whether shares of it are worth lending: it refills at [`ASSIGN_ABOVE`] a second or
    /// more. A slower bucket (a day's quota) is about its burst, not its rate: a share of its
    /// rate would refill a holder's empty bucket too slowly to admit anything.
    pub fn worth_sharing(self) -> bool {
        u128::from(self.interval) * u128::from(ASSIGN_ABOVE) <= NANOS_PER_SEC
    }

    /// How many tokens `shares` of the capacity hold, rounded down.
    pub fn capacity_of(self, shares: u64) -> u64 {
        (u128::from(self.capacity) * u128::from(shares) / u128::from(SHARES)) as u64
    }
}

/// Shares of a bucket lent to a holder, as a handover carries them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lent {
    /// The holder.
    pub holder: String,
    /// The shares.
    pub shares: u64,
    /// How long they still live.
    pub remaining: Duration,
}

/// A holder's report on one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateReport {
    /// The policy.
    pub policy: String,
    /// The bucket's key.
    pub key: String,
    /// What it was asked for here, in cost a second, since its last report.
    pub demand: u64,
    /// The shares it runs now (0: none): a cut it was told of is made by now.
    pub running: u64,
    /// How long it runs an answer after it asked (zero: [`ASSIGNMENT_TTL`]); the owner
    /// holds it within [`ASSIGNMENT_TTL`]..=[`LONGEST_TTL`].
    pub ttl: Duration,
    /// It decides every request itself and cannot forward one (a data plane over RLQS): it
    /// is given at least the share of one token of the burst, whatever its demand.
    pub decides_all: bool,
}

impl RateReport {
    /// The TTL the owner lends for: the one asked for, within bounds.
    pub fn ttl(&self) -> Duration {
        self.ttl.clamp(ASSIGNMENT_TTL, LONGEST_TTL)
    }
}

/// The owner's answer to a [`RateReport`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assignment {
    /// The shares the holder may run (0: none; forward).
    pub shares: u64,
    /// For how long after it asked.
    pub ttl: Duration,
    /// Tokens moved out of the owner's bucket for the holder to add to its own: what the
    /// owner's bucket held beyond its new share of the capacity when the holder's share grew.
    /// Without them a share would start empty, and refuse what one bucket would have admitted.
    pub tokens: u64,
}

impl Assignment {
    /// No share: the holder forwards.
    pub fn none() -> Self {
        Assignment {
            shares: 0,
            ttl: ASSIGNMENT_TTL,
            tokens: 0,
        }
    }
}

/// What the owner sets aside of its own bucket for what it lent: `before` of its refill over
/// `elapsed` (the share lent since it last set aside), and its bucket held to no more than
/// `1 − after` of its capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SetAside {
    /// The share of the rate lent over `elapsed`.
    pub before: f64,
    /// Since the bucket was last set aside for.
    pub elapsed: Duration,
    /// The share of the capacity lent from now on.
    pub after: f64,
}

/// Demand, as a cost a second over the last [`REPORT_EVERY`] or more.
#[derive(Debug, Clone, Copy, Default)]
struct Meter {
    count: u64,
    since: Nanos,
    rate: u64,
}

impl Meter {
    fn add(&mut self, cost: u64, now: Nanos) {
        self.roll(now);
        self.count += cost;
    }

    fn roll(&mut self, now: Nanos) {
        let elapsed = now.saturating_sub(self.since);
        if elapsed >= REPORT_EVERY.as_nanos() as u64 {
            self.rate = per_second(self.count, elapsed);
            (self.count, self.since) = (0, now);
        }
    }
}

/// `count` over `elapsed` nanoseconds, as a count a second (rounded up).
fn per_second(count: u64, elapsed: Nanos) -> u64 {
    (u128::from(count) * NANOS_PER_SEC).div_ceil(u128::from(elapsed.max(1))) as u64
}

#[cfg(test)]
mod tests;
