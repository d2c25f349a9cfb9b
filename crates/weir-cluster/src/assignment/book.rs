//! The owner's side of rate assignments: each bucket's demand, the shares lent as loans, and
//! what to set aside of the owner's own bucket.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use weir::Nanos;

use super::{
    ASSIGN_ABOVE, ASSIGNMENT_TTL, Assignment, CUT_BEYOND, Lent, Meter, REPORT_EVERY, RateReport,
    SHARES, SetAside, Whole,
};
use crate::pool::SharedPool;

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
    /// How long its report holds (what it asked for, within bounds).
    ttl: Nanos,
}

impl Reported {
    fn live(&self, now: Nanos) -> bool {
        now.saturating_sub(self.at) < self.ttl
    }
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

/// The owner's side: every bucket it lends shares of. See the [module docs](super).
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
        if fresh && report.demand < ASSIGN_ABOVE && report.running == 0 && !report.decides_all {
            let nothing = SetAside {
                before: 0.0,
                elapsed: Duration::ZERO,
                after: 0.0,
            };
            return (
                Assignment {
                    ttl: report.ttl(),
                    ..Assignment::none()
                },
                nothing,
            );
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
                ttl: report.ttl().as_nanos() as u64,
            },
        );
        entry.own.roll(now);
        let live = |h: &&Reported| h.live(now);
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
        if report.decides_all && whole.worth_sharing() {
            // It has nowhere to forward to: the least share that admits anything.
            target = target.max(SHARES.div_ceil(whole.capacity.max(1)));
        } else if report.demand < ASSIGN_ABOVE
            || !whole.worth_sharing()
            || whole.capacity_of(target) == 0
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
            report.ttl(),
            now,
        );
        let after = self.share(bucket, now).max(before);
        let assignment = Assignment {
            shares: lent.min(target),
            ttl: report.ttl(),
            tokens: 0,
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

    /// Whether it keeps any bucket at all: one atomic load, so that a decision on an owner
    /// that lends nothing costs nothing more (not even its bucket's name).
    pub fn lends_any(&self) -> bool {
        self.count.load(Ordering::Relaxed) > 0
    }

    /// Counts `cost` decided here on `bucket` and says what to set aside of it first, if any
    /// of it is lent (`None` otherwise, and without a lock when nothing is lent at all).
    pub fn decided_here(&self, bucket: &str, cost: u64, now: Nanos) -> Option<SetAside> {
        if !self.lends_any() {
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
                    ttl: lent.remaining.max(ASSIGNMENT_TTL).as_nanos() as u64,
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
        demands.retain(|bucket, entry| {
            entry.holders.retain(|_, reported| reported.live(now));
            !entry.holders.is_empty() || self.lent.in_use(bucket, now) > 0
        });
        self.count.store(demands.len(), Ordering::Relaxed);
        demands.len()
    }

    /// The buckets with shares lent now.
    pub fn lent_buckets(&self, now: Nanos) -> Vec<String> {
        self.lock()
            .keys()
            .filter(|bucket| self.lent.in_use(bucket, now) > 0)
            .cloned()
            .collect()
    }

    /// Shares lent now, by holding node, over every bucket.
    pub fn lent(&self, now: Nanos) -> std::collections::BTreeMap<String, u64> {
        self.lent.lent(now)
    }
}
