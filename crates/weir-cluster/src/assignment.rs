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
//! What is lent is counted as a *loan* in a [`SharedPool`] — the mechanism that lends units of
//! a concurrency policy's shared pool — so the same rules hold: the shares lent never add up
//! to more than [`SHARES`]; a loan lives until its TTL unless the next report renews it; a
//! holder that stops reporting loses it at expiry; a cut is counted until the holder says it
//! made it (its next report's `running`), so at no instant are more shares in use than lent.
//! The owner sets aside what it lent out of its own bucket: the lent share of its refill, and
//! the lent share of its capacity (its bucket holds no more than `B` minus what the holders
//! may hold). So over any window of length `W`, what the owner and every holder admit
//! together is at most what one bucket admits, `B + r·W` (see `docs/guarantees.md`).
//!
//! This module is the logic only, over times given to it: the owner's book
//! ([`AssignmentBook`]) and a holder's ([`HeldRates`]); the server carries reports and applies
//! what is set aside to its policy's bucket.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use weir::Nanos;

use crate::pool::SharedPool;
use crate::rates::Lent;

/// How many shares a bucket's rate is cut into: an assignment is a count of them.
pub const SHARES: u64 = 1000;

/// How often a node reports its demand for the buckets it holds or would hold.
pub const REPORT_EVERY: Duration = Duration::from_millis(250);

/// How long an assignment lives after the report that asked for it: three reports may be lost
/// before a holder stops deciding on it; a crashed holder's shares come back after this.
pub const ASSIGNMENT_TTL: Duration = Duration::from_secs(1);

/// The demand (cost a second, at one node) from which a bucket is worth an assignment: below
/// it, a report every [`REPORT_EVERY`] would cost about what forwarding does.
pub const ASSIGN_ABOVE: u64 = 20;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// A holder's shares are cut only when its due is more than one part in this below what it
/// runs.
const CUT_BEYOND: u64 = 20;

/// The name of a bucket's assignments on its owner (a rate bucket's ring name).
pub fn assigned_bucket_of(policy: &str, key: &str) -> String {
    crate::rates::bucket_of(policy, key)
}

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

/// A holder's last report, as its bucket's owner keeps it.
#[derive(Debug, Clone, Copy)]
struct Reported {
    demand: u64,
    at: Nanos,
    /// The shares it was answered last.
    answered: u64,
    /// It forwarded its requests since its report before (it held no share): they are in the
    /// owner's own demand already.
    forwarded: bool,
}

/// One bucket's demand on its owner.
#[derive(Debug, Default)]
struct Demands {
    /// Each holder's last report.
    holders: HashMap<String, Reported>,
    /// What the owner decided itself (its own requests and the forwarded ones).
    own: Meter,
    /// When what was lent was last set aside.
    set_aside_at: Nanos,
    /// When the owner started keeping it: its own demand is known one report later.
    since: Nanos,
}

impl Demands {
    fn new(now: Nanos) -> Self {
        Demands {
            own: Meter {
                since: now,
                ..Meter::default()
            },
            set_aside_at: now,
            since: now,
            ..Demands::default()
        }
    }
}

/// The owner's side: every bucket it lends shares of. See the [module docs](self).
#[derive(Debug)]
pub struct AssignmentBook {
    lent: SharedPool,
    demands: Mutex<HashMap<String, Demands>>,
    /// Buckets in `demands`: a decision on an owner with none does not take the lock.
    count: AtomicUsize,
}

impl AssignmentBook {
    /// An empty book lending shares of at most `max_buckets` buckets.
    pub fn new(max_buckets: usize) -> Self {
        AssignmentBook {
            lent: SharedPool::new(max_buckets),
            demands: Mutex::new(HashMap::new()),
            count: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Demands>> {
        self.demands.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn share(&self, bucket: &str, now: Nanos) -> f64 {
        self.lent.in_use(bucket, now) as f64 / SHARES as f64
    }

    /// Answers `holder`'s report on `bucket`, whose whole shape is `whole`: the shares it may
    /// run, and what the owner must set aside of its own bucket, first at the share lent so
    /// far, then at the share lent from now on (apply it before answering, and send the
    /// holder the tokens it took out of the capacity: [`Assignment::tokens`]).
    pub fn report(
        &self,
        holder: &str,
        bucket: &str,
        report: &RateReport,
        whole: Whole,
        now: Nanos,
    ) -> (Assignment, SetAside) {
        let mut demands = self.lock();
        let fresh = !demands.contains_key(bucket);
        if fresh && report.demand < ASSIGN_ABOVE && report.running == 0 {
            let nothing = SetAside {
                before: 0.0,
                elapsed: Duration::ZERO,
                after: 0.0,
            };
            return (Assignment::none(), nothing);
        }
        let entry = demands
            .entry(bucket.to_owned())
            .or_insert_with(|| Demands::new(now));
        if fresh {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        let before = self.share(bucket, now);
        let elapsed = Duration::from_nanos(now.saturating_sub(entry.set_aside_at));
        entry.set_aside_at = now;
        let answered = entry.holders.get(holder).map_or(0, |h| h.answered);
        entry.holders.insert(
            holder.to_owned(),
            Reported {
                demand: report.demand,
                at: now,
                answered,
                forwarded: report.running == 0 || answered == 0,
            },
        );
        entry.own.roll(now);
        let live = |h: &&Reported| now.saturating_sub(h.at) < ASSIGNMENT_TTL.as_nanos() as u64;
        let reported: u64 = entry.holders.values().filter(live).map(|h| h.demand).sum();
        // What the owner decided of a holder's forwarded requests is that holder's demand,
        // not the owner's: counted once.
        let forwarded: u64 = entry
            .holders
            .values()
            .filter(live)
            .filter(|h| h.forwarded)
            .map(|h| h.demand)
            .sum();
        let own = entry.own.rate.saturating_sub(forwarded);
        let total = reported + own;
        let mut target = match total {
            0 => 0,
            total => (u128::from(SHARES) * u128::from(report.demand) / u128::from(total)) as u64,
        };
        if report.demand < ASSIGN_ABOVE || !whole.worth_sharing() || whole.capacity_of(target) == 0
        {
            // Too little to be worth it, or a burst share that holds no whole token.
            target = 0;
        }
        // An owner with demand of its own keeps a whole token of the burst: with less, its
        // share of the rate could never be spent.
        let lendable = match own {
            0 => SHARES,
            _ => SHARES - SHARES.div_ceil(whole.capacity.max(1)),
        };
        target = target.min(lendable);
        if target < report.running && report.running - target <= report.running / CUT_BEYOND {
            // Demand measured over a quarter of a second wobbles: a cut it does not need costs
            // the shares cut until the holder's next report says it made it, when they are
            // lent to no one (see `docs/guarantees.md`).
            target = report.running;
        }
        // Until a report's time has passed, the owner has not measured what the nodes that
        // do not report yet forward to it: a share grows by half of what is free, not all.
        let cautious = now.saturating_sub(entry.since) < REPORT_EVERY.as_nanos() as u64;
        let (lent, _) = self.lent.assign(
            bucket,
            (lendable, cautious),
            holder,
            (report.running, target),
            ASSIGNMENT_TTL,
            now,
        );
        let after = self.share(bucket, now).max(before);
        let assignment = Assignment {
            shares: lent.min(target),
            ..Assignment::none()
        };
        if let Some(reported) = entry.holders.get_mut(holder) {
            reported.answered = assignment.shares;
        }
        (
            assignment,
            SetAside {
                before,
                elapsed,
                after,
            },
        )
    }

    /// Counts `cost` decided here on `bucket` and says what to set aside of it first, if any
    /// of it is lent (`None` otherwise, and without a lock when nothing is lent at all).
    pub fn decided_here(&self, bucket: &str, cost: u64, now: Nanos) -> Option<SetAside> {
        if self.count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut demands = self.lock();
        let entry = demands.get_mut(bucket)?;
        entry.own.add(cost, now);
        let share = self.share(bucket, now);
        let elapsed = Duration::from_nanos(now.saturating_sub(entry.set_aside_at));
        entry.set_aside_at = now;
        Some(SetAside {
            before: share,
            elapsed,
            after: share,
        })
    }

    /// The shares of `bucket` lent now, by holder: what a handover carries to its next owner.
    pub fn lent_in(&self, bucket: &str, now: Nanos) -> Vec<Lent> {
        self.lent
            .leases_of(bucket, now)
            .into_iter()
            .map(|lease| Lent {
                holder: lease.holder,
                shares: lease.units,
                remaining: Duration::from_nanos(lease.expires_at - now),
            })
            .collect()
    }

    /// Takes on the shares of `bucket` its previous owner lent (a handover), but those lent to
    /// `me`, this node: counted here as lent until they run out or their holders report they
    /// run fewer, and set aside of this node's bucket from now on. Returns what to set aside
    /// at once (the capacity they hold).
    pub fn take_on(&self, bucket: &str, lent: &[Lent], me: &str, now: Nanos) -> Option<SetAside> {
        // A share this node held of the bucket is not run any more: it owns the whole now.
        let lent: Vec<&Lent> = lent
            .iter()
            .filter(|l| l.shares > 0 && l.holder != me)
            .collect();
        if lent.is_empty() {
            return None;
        }
        let mut demands = self.lock();
        if !demands.contains_key(bucket) {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        let entry = demands
            .entry(bucket.to_owned())
            .or_insert_with(|| Demands::new(now));
        let before = self.share(bucket, now);
        let elapsed = Duration::from_nanos(now.saturating_sub(entry.set_aside_at));
        entry.set_aside_at = now;
        for lent in lent {
            // One loan per holder: what it had here (a bucket that came back) is ended first.
            self.lent.assign(
                bucket,
                (SHARES, false),
                &lent.holder,
                (0, 0),
                ASSIGNMENT_TTL,
                now,
            );
            self.lent.adopt(
                bucket,
                &lent.holder,
                weir::clock::after(now, lent.remaining),
                lent.shares,
                true,
            );
            entry.holders.insert(
                lent.holder.clone(),
                Reported {
                    demand: 0,
                    at: now,
                    answered: lent.shares,
                    forwarded: false,
                },
            );
        }
        Some(SetAside {
            before,
            elapsed,
            after: self.share(bucket, now).min(1.0),
        })
    }

    /// Forgets buckets with nothing lent and no report for a TTL; returns how many are left.
    pub fn sweep(&self, now: Nanos) -> usize {
        self.lent.sweep(now);
        let mut demands = self.lock();
        let ttl = ASSIGNMENT_TTL.as_nanos() as u64;
        demands.retain(|bucket, entry| {
            entry
                .holders
                .retain(|_, reported| now.saturating_sub(reported.at) < ttl);
            !entry.holders.is_empty() || self.lent.in_use(bucket, now) > 0
        });
        self.count.store(demands.len(), Ordering::Relaxed);
        demands.len()
    }

    /// Shares lent now, by holding node, over every bucket.
    pub fn lent(&self, now: Nanos) -> std::collections::BTreeMap<String, u64> {
        self.lent.lent(now)
    }
}

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
/// [module docs](self).
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

#[cfg(test)]
mod tests;
