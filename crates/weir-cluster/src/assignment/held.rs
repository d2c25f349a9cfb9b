//! A holder's side of rate assignments: the shares it holds, decided on with no call, and the
//! demand it reports.

use std::collections::HashMap;
use std::time::Duration;

use weir::Nanos;

use super::{ASSIGN_ABOVE, ASSIGNMENT_TTL, Assignment, RateReport, SHARES, Whole, per_second};

/// One bucket's assignment on its holder: a token bucket of its share, decided here.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    owner: String,
    shares: u64,
    /// Nanoseconds per token at this share.
    interval: u64,
    /// Tokens it holds full.
    capacity: u64,
    /// When it is empty again as a GCRA counts it: theoretical arrival time.
    tat: Nanos,
    expires_at: Nanos,
    /// Cost asked since the last report.
    demand: u64,
}

impl Held {
    fn tolerance(&self) -> u64 {
        self.interval.saturating_mul(self.capacity)
    }
}

/// What a holder decided on a request of a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Local {
    /// Admitted within its assignment.
    Admitted,
    /// Refused: its assignment has no token for it until `retry_after`.
    Refused {
        /// When asking again could succeed.
        retry_after: Duration,
    },
    /// It holds no live assignment of the bucket from its owner now: forward.
    Forward,
}

/// A holder's side: the assignments it holds and the demand it reports. See the
/// [module docs](super).
#[derive(Debug, Default)]
pub struct HeldRates {
    /// By policy, then key: a decision looks them up without building a name.
    held: HashMap<String, HashMap<String, Held>>,
    /// Cost forwarded since the last report, by (policy, key), with the owner.
    forwarded: HashMap<(String, String), (String, u64)>,
    last_report: Nanos,
}

impl HeldRates {
    /// An empty book.
    pub fn new() -> Self {
        HeldRates::default()
    }

    /// Decides a request of `cost` on `policy`'s bucket `key`, whose owner is `owner` now,
    /// within this node's assignment if it holds a live one from that owner.
    pub fn take(&mut self, policy: &str, key: &str, owner: &str, cost: u64, now: Nanos) -> Local {
        let Some(held) = self.held.get_mut(policy).and_then(|keys| keys.get_mut(key)) else {
            return Local::Forward;
        };
        if held.owner != owner || now >= held.expires_at || cost > held.capacity {
            // Forwarded, and counted as such by the caller.
            return Local::Forward;
        }
        held.demand = held.demand.saturating_add(cost);
        let tat = held
            .tat
            .max(now)
            .saturating_add(cost.saturating_mul(held.interval));
        let ahead = tat - now;
        if ahead <= held.tolerance() {
            held.tat = tat;
            Local::Admitted
        } else {
            Local::Refused {
                retry_after: Duration::from_nanos(ahead - held.tolerance()),
            }
        }
    }

    /// Counts `cost` forwarded to `owner` for `policy`'s bucket `key`: its demand, which the
    /// next report carries if it is high enough.
    pub fn forwarded(&mut self, policy: &str, key: &str, owner: &str, cost: u64) {
        if let Some(held) = self.held.get_mut(policy).and_then(|keys| keys.get_mut(key)) {
            held.demand = held.demand.saturating_add(cost);
            return;
        }
        let entry = self
            .forwarded
            .entry((policy.to_owned(), key.to_owned()))
            .or_insert_with(|| (owner.to_owned(), 0));
        entry.0 = owner.to_owned();
        entry.1 = entry.1.saturating_add(cost);
    }

    /// The reports owed now, each with the owner to send it to: one for every assignment
    /// held (its demand may have fallen: it may have to give shares back), and one for every
    /// bucket forwarded at [`ASSIGN_ABOVE`] or more since the last. Starts counting anew.
    pub fn reports(&mut self, now: Nanos) -> Vec<(String, RateReport)> {
        let elapsed = now.saturating_sub(self.last_report);
        self.last_report = now;
        let mut reports = Vec::new();
        for (policy, keys) in &mut self.held {
            keys.retain(|_, held| held.expires_at > now);
            for (key, held) in keys.iter_mut() {
                let demand = per_second(std::mem::take(&mut held.demand), elapsed);
                if demand < ASSIGN_ABOVE {
                    // Too little to keep: run none from now on, and say so at once.
                    held.shares = 0;
                    held.capacity = 0;
                }
                reports.push((
                    held.owner.clone(),
                    RateReport {
                        policy: policy.clone(),
                        key: key.clone(),
                        demand,
                        running: held.shares,
                        ttl: ASSIGNMENT_TTL,
                        decides_all: false,
                    },
                ));
            }
        }
        self.held.retain(|_, keys| !keys.is_empty());
        for ((policy, key), (owner, cost)) in self.forwarded.drain() {
            let demand = per_second(cost, elapsed);
            if demand >= ASSIGN_ABOVE {
                reports.push((
                    owner,
                    RateReport {
                        policy,
                        key,
                        demand,
                        running: 0,
                        ttl: ASSIGNMENT_TTL,
                        decides_all: false,
                    },
                ));
            }
        }
        reports
    }

    /// Takes on `owner`'s answer to a report on `policy`'s bucket `key` sent at `asked_at`:
    /// `shares` of `whole`, kept until `asked_at + ttl`, with the tokens the owner moved to it
    /// added. A new assignment starts with those only; a changed one keeps what it had, up to
    /// its new capacity. None: an assignment held runs
    /// nothing from now on, and the next report says so (the owner counts its shares until
    /// then), then it is forgotten.
    pub fn assigned(
        &mut self,
        (owner, policy, key): (&str, &str, &str),
        assignment: Assignment,
        whole: Whole,
        (asked_at, now): (Nanos, Nanos),
    ) {
        let keys = self.held.entry(policy.to_owned()).or_default();
        let before = keys.remove(key).filter(|held| held.owner == owner);
        let capacity = whole.capacity_of(assignment.shares);
        let shares = if capacity == 0 { 0 } else { assignment.shares };
        if shares == 0 && before.as_ref().is_none_or(|held| held.shares == 0) {
            // Nothing held, or the cut to none already reported: nothing to say any more.
            return;
        }
        let expires_at = weir::clock::after(asked_at, assignment.ttl);
        let interval = match shares {
            // Runs nothing, kept until its next report tells the owner so.
            0 => whole.interval.max(1),
            shares => (u128::from(whole.interval.max(1)) * u128::from(SHARES) / u128::from(shares))
                .min(u128::from(u64::MAX / capacity.max(1))) as u64,
        };
        let mut held = Held {
            owner: owner.to_owned(),
            shares,
            interval,
            capacity,
            tat: now.saturating_add(interval.saturating_mul(capacity)),
            expires_at,
            demand: 0,
        };
        // What it has left, in time at its rate.
        let mut left = 0;
        if let Some(before) = before {
            held.demand = before.demand;
            left = match before.shares == shares {
                true => held
                    .tolerance()
                    .saturating_sub(before.tat.saturating_sub(now)),
                // Scaled from the old rate to the new one: a part of a token is not lost at
                // every report.
                false => {
                    let left = before
                        .tolerance()
                        .saturating_sub(before.tat.saturating_sub(now));
                    (u128::from(left) * u128::from(interval) / u128::from(before.interval.max(1)))
                        as u64
                }
            };
        }
        let moved = assignment.tokens.saturating_mul(interval);
        let left = left.saturating_add(moved).min(held.tolerance());
        held.tat = now + (held.tolerance() - left);
        keys.insert(key.to_owned(), held);
    }

    /// Assignments held now.
    pub fn held(&self) -> usize {
        self.held.values().map(HashMap::len).sum()
    }
}
