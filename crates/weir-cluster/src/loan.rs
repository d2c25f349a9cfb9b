//! The holder's side of lent capacity: units of a bucket's shared pool that its owner lent this
//! node, handed out here with no call.
//!
//! Asking the owner for every shared admission costs a network round trip. So a node asks for
//! more than one unit when it is busy — as many more as it has in use, up to `max_loan` — and
//! the owner lends it a *loan*: one lease of several units, each counted as used on the owner.
//! A request then takes a unit from the loan under a lock, and gives it back to the loan when it
//! ends; the owner hears nothing. The ceiling holds because the node never hands out more units
//! than it was lent, and never one that could outlive its loan: a unit is taken only while the
//! loan has `hold` (one lease TTL) left to live, and the loan is renewed well before that.
//!
//! What a loan can cost is capacity lent here and idle while another node is refused. So:
//! - the owner lends a quarter of what is free at most, one unit a call when the pool is nearly
//!   full, and says how many idle units the node may *keep* (see [`pool`](crate::pool));
//! - a unit put back beyond that is given back to the owner at once;
//! - [`LoanBook::upkeep`], every [`UPKEEP_EVERY`], renews each loan that has less than a lease
//!   TTL and half its margin left — about once a second — hearing the owner's new `keep` (zero
//!   after a refusal elsewhere: a recall), gives back what is beyond `keep`, and gives the
//!   whole loan back once no unit was taken for [`IDLE_AFTER`].
//!
//! This module is the book only: what is lent, in use, owed. It does no I/O and reads no clock;
//! [`TwoTier`](crate::admission::TwoTier) makes the calls it says are owed.

use std::collections::HashMap;
use std::time::Duration;

use weir::Nanos;

use crate::messages::Ask;

/// How often a holder renews its loans and gives back what it may not keep.
pub const UPKEEP_EVERY: Duration = Duration::from_millis(250);

/// A loan with no unit taken for this long goes back to its owner whole.
pub const IDLE_AFTER: Duration = Duration::from_secs(1);

/// How much longer than a lease a loan lives on its owner. A loan is renewed once half of it is
/// spent, so it always has a lease TTL left when a unit is taken from it, and a renewal or two
/// may fail before units stop being taken. Longer means fewer renewals (one a second per loan
/// in use), and a longer wait for a `closed` policy's new owner and for a crashed holder's
/// units.
pub const LOAN_MARGIN: Duration = Duration::from_secs(2);

/// One bucket's loan.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Loan {
    /// The owner that lent it.
    owner: String,
    /// Its lease id on that owner.
    id: u64,
    /// Units lent.
    units: u64,
    /// Units handed out and not yet put back.
    in_use: u64,
    /// When the owner drops it unless renewed (on this node's clock).
    expires_at: Nanos,
    /// Idle units the owner lets this node keep.
    keep: u64,
    /// Which loan this is, on this node: units taken from an earlier loan of the same bucket
    /// do not count against this one.
    serial: u64,
    /// When a unit was last taken.
    last_taken: Nanos,
}

impl Loan {
    fn idle(&self) -> u64 {
        self.units.saturating_sub(self.in_use)
    }
}

/// A unit taken from a loan, to put back when its request ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    /// The bucket.
    pub bucket: String,
    serial: u64,
}

/// A call this node owes an owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owed {
    /// Give `units` idle units of loan `id` back (all it has: the loan ends). Always a count,
    /// never "the whole lease": a loan that ends here may be growing again on the owner for a
    /// request racing it, and a count leaves those units alone.
    GiveBack {
        /// The bucket.
        bucket: String,
        /// Its owner.
        owner: String,
        /// The loan's lease id there.
        id: u64,
        /// How many.
        units: u64,
    },
    /// Renew loan `id`.
    Renew {
        /// The bucket.
        bucket: String,
        /// Its owner.
        owner: String,
        /// The loan's lease id there.
        id: u64,
    },
}

/// A loan whose bucket has another owner now, to hand over (see [`LoanBook::moved`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    /// The bucket.
    pub bucket: String,
    /// Its owner when the loan was lent, and the loan's id there.
    pub from: (String, u64),
    /// Its owner now.
    pub to: String,
    /// Units in use: what the new owner must count.
    pub in_use: u64,
    /// Units lent: what the old owner is owed back.
    pub units: u64,
    /// When the loan expires.
    pub expires_at: Nanos,
    serial: u64,
}

/// Units in use and lent, over every loan, for a node's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Loans held.
    pub loans: u64,
    /// Units lent to this node.
    pub units: u64,
    /// Of them, in use.
    pub in_use: u64,
}

/// Every loan this node holds for one policy; see the [module docs](self).
#[derive(Debug)]
pub struct LoanBook {
    loans: HashMap<String, Loan>,
    next_serial: u64,
    max_loan: u64,
}

impl LoanBook {
    /// An empty book whose loans grow, by asking, to at most `max_loan` units each.
    pub fn new(max_loan: u64) -> Self {
        LoanBook {
            loans: HashMap::new(),
            next_serial: 0,
            max_loan,
        }
    }

    /// Takes a unit of `bucket`'s loan, if it was lent by `owner` (the bucket's owner now), has
    /// a unit free, and lives until at least `hold_until`.
    pub fn take(
        &mut self,
        bucket: &str,
        owner: &str,
        hold_until: Nanos,
        now: Nanos,
    ) -> Option<Unit> {
        let loan = self.loans.get_mut(bucket)?;
        if loan.owner != owner || loan.expires_at < hold_until || loan.in_use >= loan.units {
            return None;
        }
        loan.in_use += 1;
        loan.last_taken = now;
        Some(Unit {
            bucket: bucket.to_owned(),
            serial: loan.serial,
        })
    }

    /// What to ask `owner` for, no unit of `bucket` being free here: a renewal if the loan has
    /// idle units but not `hold_until` left (a late upkeep); else as many more units as are in
    /// use (the loan doubles), within `max_loan`, and at least one.
    pub fn ask(&self, bucket: &str, owner: &str, hold_until: Nanos) -> Ask {
        let units = match self.loans.get(bucket).filter(|loan| loan.owner == owner) {
            Some(loan) if loan.idle() > 0 && loan.expires_at < hold_until => return Ask::RenewLoan,
            Some(loan) => (loan.in_use + 1)
                .min(self.max_loan.saturating_sub(loan.units))
                .max(1),
            None => 1,
        };
        Ask::borrow(units)
    }

    /// Whether `bucket`'s loan was lent by another owner than `owner` (the ring moved it) and
    /// has units in use: until the handoff moves them, a request takes a plain lease rather than
    /// start a loan with the new owner that would lose track of them.
    pub fn moving(&self, bucket: &str, owner: &str) -> bool {
        self.loans
            .get(bucket)
            .is_some_and(|loan| loan.owner != owner && loan.in_use > 0)
    }

    /// The loan `unit` was taken from, if it is still this node's loan of its bucket: its owner
    /// and its lease id there.
    pub fn loan_of(&self, unit: &Unit) -> Option<(String, u64)> {
        self.loans
            .get(&unit.bucket)
            .filter(|loan| loan.serial == unit.serial)
            .map(|loan| (loan.owner.clone(), loan.id))
    }

    /// This node's loan of `bucket` from `owner`, if it has one: its lease id there.
    pub fn loan_id(&self, bucket: &str, owner: &str) -> Option<u64> {
        self.loans
            .get(bucket)
            .filter(|loan| loan.owner == owner)
            .map(|loan| loan.id)
    }

    /// Records a grant of `units` units on lease `id` of `owner`. The same loan grows. A new
    /// id from the same owner means the owner had dropped the loan (it expired) and started
    /// another: the loan goes on under the new id with the units just granted, its units in use
    /// still counted here (none is taken until enough are put back). Another owner's grant
    /// starts a new loan; the old loan's units are owed back to its owner if none is in use
    /// (else it expires there).
    pub fn granted(
        &mut self,
        bucket: &str,
        owner: &str,
        id: u64,
        units: u64,
        keep: u64,
        expires_at: Nanos,
    ) -> Option<Owed> {
        if let Some(loan) = self
            .loans
            .get_mut(bucket)
            .filter(|loan| loan.owner == owner)
        {
            if loan.id == id {
                loan.units += units;
            } else {
                loan.id = id;
                loan.units = units;
            }
            loan.keep = keep;
            loan.expires_at = expires_at;
            return None;
        }
        let serial = self.next_serial;
        self.next_serial += 1;
        let old = self.loans.insert(
            bucket.to_owned(),
            Loan {
                owner: owner.to_owned(),
                id,
                units,
                in_use: 0,
                expires_at,
                keep,
                serial,
                last_taken: 0,
            },
        );
        let old = old?;
        (old.in_use == 0 && old.units > 0).then(|| Owed::GiveBack {
            bucket: bucket.to_owned(),
            owner: old.owner,
            id: old.id,
            units: old.units,
        })
    }

    /// Puts a unit back when its request ends. Units beyond what the owner lets this node keep
    /// are owed back to it at once.
    pub fn put_back(&mut self, unit: &Unit) -> Option<Owed> {
        let loan = self
            .loans
            .get_mut(&unit.bucket)
            .filter(|loan| loan.serial == unit.serial)?;
        loan.in_use = loan.in_use.saturating_sub(1);
        self.surplus(&unit.bucket)
    }

    /// Takes the idle units beyond `keep` (and `max_loan`) out of `bucket`'s loan: owed back.
    /// A loan left with no unit is forgotten (its owner drops it with its last unit).
    fn surplus(&mut self, bucket: &str) -> Option<Owed> {
        let max_loan = self.max_loan;
        let loan = self.loans.get_mut(bucket)?;
        let surplus = loan.idle().saturating_sub(loan.keep.min(max_loan));
        if surplus == 0 {
            return None;
        }
        loan.units -= surplus;
        let owed = Owed::GiveBack {
            bucket: bucket.to_owned(),
            owner: loan.owner.clone(),
            id: loan.id,
            units: surplus,
        };
        if loan.units == 0 && loan.in_use == 0 {
            self.loans.remove(bucket);
        }
        Some(owed)
    }

    /// The loan of `bucket` from `owner` with lease id `id`, if it is still this node's.
    fn loan_mut(&mut self, bucket: &str, owner: &str, id: u64) -> Option<&mut Loan> {
        self.loans
            .get_mut(bucket)
            .filter(|loan| loan.owner == owner && loan.id == id)
    }

    /// A renewal answered: the loan lives until `expires_at` and may keep `keep` idle units
    /// (beyond them, owed back). `owner` and `id` guard against a loan replaced meanwhile (ids
    /// are each owner's own).
    pub fn renewed(
        &mut self,
        bucket: &str,
        owner: &str,
        id: u64,
        keep: u64,
        expires_at: Nanos,
    ) -> Option<Owed> {
        let loan = self.loan_mut(bucket, owner, id)?;
        loan.keep = keep;
        loan.expires_at = expires_at;
        self.surplus(bucket)
    }

    /// The owner no longer has loan `id`: no unit is taken from it again, and it is forgotten
    /// once its units in use are put back.
    pub fn gone(&mut self, bucket: &str, owner: &str, id: u64) {
        if let Some(loan) = self.loan_mut(bucket, owner, id) {
            loan.expires_at = 0;
            loan.units = loan.in_use;
        }
    }

    /// What upkeep owes at `now`: a loan with nothing in use and nothing taken for
    /// `idle_after` goes back (all its units); every other live loan gives back what it may not keep,
    /// and is renewed if it expires by `renew_by`. A loan past its expiry with nothing in use is
    /// forgotten (its owner has dropped it).
    pub fn upkeep(&mut self, now: Nanos, idle_after: Duration, renew_by: Nanos) -> Vec<Owed> {
        let mut owed = Vec::new();
        let buckets: Vec<String> = self.loans.keys().cloned().collect();
        for bucket in buckets {
            let loan = &self.loans[&bucket];
            if loan.in_use == 0 && loan.expires_at <= now {
                self.loans.remove(&bucket);
                continue;
            }
            if loan.in_use == 0 && weir::clock::after(loan.last_taken, idle_after) <= now {
                let loan = self.loans.remove(&bucket).expect("present");
                if loan.units > 0 {
                    owed.push(Owed::GiveBack {
                        bucket,
                        owner: loan.owner,
                        id: loan.id,
                        units: loan.units,
                    });
                }
                continue;
            }
            if loan.expires_at <= now {
                continue;
            }
            owed.extend(self.surplus(&bucket));
            let loan = &self.loans[&bucket];
            if loan.expires_at <= renew_by {
                owed.push(Owed::Renew {
                    owner: loan.owner.clone(),
                    id: loan.id,
                    bucket,
                });
            }
        }
        owed
    }

    /// Loans whose bucket `owner_of` names another owner now.
    pub fn moved(&self, owner_of: impl Fn(&str) -> Option<String>) -> Vec<Moved> {
        self.loans
            .iter()
            .filter_map(|(bucket, loan)| {
                let to = owner_of(bucket).filter(|to| *to != loan.owner)?;
                Some(Moved {
                    bucket: bucket.clone(),
                    from: (loan.owner.clone(), loan.id),
                    to,
                    in_use: loan.in_use,
                    units: loan.units,
                    expires_at: loan.expires_at,
                    serial: loan.serial,
                })
            })
            .collect()
    }

    /// A moved loan was handed over: it is lease `id` of `moved.to` now, of the units that were
    /// in use when it moved (those put back since are idle, and go back at the next upkeep).
    /// False if the loan was replaced meanwhile.
    pub fn rehomed(&mut self, moved: &Moved, id: u64) -> bool {
        let Some(loan) = self
            .loans
            .get_mut(&moved.bucket)
            .filter(|loan| loan.serial == moved.serial)
        else {
            return false;
        };
        loan.owner.clone_from(&moved.to);
        loan.id = id;
        loan.units = moved.in_use;
        loan.keep = 0;
        true
    }

    /// Forgets a moved loan with nothing in use (its old owner is owed its units back).
    pub fn forget(&mut self, moved: &Moved) {
        if self
            .loans
            .get(&moved.bucket)
            .is_some_and(|loan| loan.serial == moved.serial && loan.in_use == 0)
        {
            self.loans.remove(&moved.bucket);
        }
    }

    /// The loans of the buckets `mine` picks, live at `now`, for a census answer: each counts
    /// for every unit lent (any of them may be taken without a call).
    pub fn held(&self, mine: impl Fn(&str) -> bool, now: Nanos) -> Vec<crate::census::Held> {
        self.loans
            .iter()
            .filter(|(bucket, loan)| loan.expires_at > now && mine(bucket))
            .map(|(bucket, loan)| crate::census::Held {
                bucket: bucket.clone(),
                owner: loan.owner.clone(),
                id: loan.id,
                units: loan.units,
                remaining: Duration::from_nanos(loan.expires_at - now),
            })
            .collect()
    }

    /// Loans, units lent and units in use, over every bucket.
    pub fn totals(&self) -> Totals {
        self.loans
            .values()
            .fold(Totals::default(), |t, loan| Totals {
                loans: t.loans + 1,
                units: t.units + loan.units,
                in_use: t.in_use + loan.in_use,
            })
    }
}

#[cfg(test)]
mod tests;
