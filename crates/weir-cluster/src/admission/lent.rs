//! The shared tier with loans (`max_loan > 1`): units of a block the owner lent this node,
//! taken and put back with no call, and the upkeep that renews, trims and gives back.

use std::sync::atomic::Ordering;

use weir::Clock;

use super::{
    Ask, AtomicU64, ClusterAdmission, ClusterRefusal, Grant, Holding, LoanBook, Owed, Tier,
    Transport, TwoTier, Unit, loan,
};
use crate::transport::TransportExt;

/// A number for a new loan book, different from every other book's with near certainty (drawn
/// from the standard library's per-process random hash keys, and a counter).
pub(super) fn book_number() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static BOOKS: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(BOOKS.fetch_add(1, Ordering::Relaxed));
    hasher.finish()
}

/// A unit taken for a request that is not yet the caller's: put back if the caller goes away
/// first.
struct Handing<'a, C: Clock + Clone, T: Transport> {
    tier: &'a TwoTier<C, T>,
    unit: Option<Unit>,
}

impl<C: Clock + Clone, T: Transport> Drop for Handing<'_, C, T> {
    fn drop(&mut self) {
        if let Some(unit) = self.unit.take() {
            // What it owes (idle units beyond `keep`) goes back with the next upkeep.
            let _ = self.tier.book().put_back(&unit);
        }
    }
}

impl<C: Clock + Clone, T: Transport> TwoTier<C, T> {
    /// Whether this policy's owners lend blocks of units (`max_loan > 1`).
    pub(super) fn lends(&self) -> bool {
        self.config.max_loan > 1
    }

    /// The shared tier with loans: a unit lent to this node if one is free, else the loan
    /// grown by asking the owner (see [`loan`]).
    pub(super) async fn acquire_lent(
        &self,
        bucket: &str,
    ) -> Result<ClusterAdmission, ClusterRefusal> {
        for _ in 0..2 {
            let ring = self.ring.load();
            let Some(owner) = ring.owner_of(bucket) else {
                return self.unavailable(bucket, ring.members().len());
            };
            let now = self.clock.now();
            // A unit must not outlive its loan: the loan has at least a lease TTL left.
            let hold_until = weir::clock::after(now, self.config.lease_ttl);
            let ask = {
                let mut book = self.book();
                if let Some(unit) = book.take(bucket, owner, hold_until, now) {
                    return Ok(self.lent_unit(unit, true));
                }
                if book.moving(bucket, owner) {
                    None
                } else {
                    Some(book.ask(bucket, owner, hold_until))
                }
            };
            let Some(ask) = ask else {
                // The ring moved this bucket and the handoff has yet to move its loan.
                drop(ring);
                return Box::pin(self.acquire_lease(bucket)).await;
            };
            let answer = self.ask_owner(bucket, owner, ask).await;
            if let Some(lent) = answer.as_ref().ok().and_then(Grant::terms) {
                // As for a lease: checked and recorded under the book's lock, which `rehome`
                // takes after loading the ring.
                let (unit, owed) = {
                    let mut book = self.book();
                    match self.ring.is_owner(bucket, owner) {
                        true => {
                            let owed = book.granted(
                                bucket,
                                owner,
                                lent.id,
                                lent.added,
                                lent.keep,
                                lent.expires_at,
                            );
                            (book.take(bucket, owner, hold_until, now), owed)
                        }
                        false => {
                            self.counters.raced.fetch_add(1, Ordering::Relaxed);
                            // Only what this grant added: the loan, if it was there before,
                            // is the handoff's to move.
                            let owed = (lent.added > 0).then(|| Owed::GiveBack {
                                bucket: bucket.to_owned(),
                                owner: owner.to_owned(),
                                id: lent.id,
                                units: lent.added,
                            });
                            (None, owed)
                        }
                    }
                };
                // Should the caller go away while the owed call is made, the unit goes back to
                // the loan rather than stay in use for ever.
                let mut handing = Handing { tier: self, unit };
                if let Some(owed) = owed {
                    self.pay(owed).await;
                }
                if let Some(unit) = handing.unit.take() {
                    return Ok(self.lent_unit(unit, false));
                }
                // Taken by racing requests, or the ring moved: once more.
                continue;
            }
            match answer {
                Ok(Grant::Full) if ask == Ask::RenewLoan => {
                    // The owner no longer has the loan (its renewals failed for too long): it
                    // lends nothing more, and the next try starts another.
                    let mut book = self.book();
                    if let Some(id) = book.loan_id(bucket, owner) {
                        book.gone(bucket, owner, id);
                    }
                }
                answer => return self.not_granted(bucket, answer, ring.members().len()),
            }
        }
        Err(self.refusal(bucket, self.full()))
    }

    /// A shared admission on a lent unit.
    pub(super) fn lent_unit(&self, unit: Unit, no_call: bool) -> ClusterAdmission {
        self.counters.shared.fetch_add(1, Ordering::Relaxed);
        if no_call {
            self.counters.from_loan.fetch_add(1, Ordering::Relaxed);
        }
        ClusterAdmission {
            tier: Tier::Shared,
            hold: Holding::Unit(unit),
        }
    }

    pub(super) fn book(&self) -> std::sync::MutexGuard<'_, LoanBook> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes a call upkeep, a release or a grant owes an owner (best effort: what is not given
    /// back expires with its loan).
    pub(super) async fn pay(&self, owed: Owed) {
        match owed {
            Owed::GiveBack {
                bucket,
                owner,
                id,
                units,
            } => {
                self.counters.given_back.fetch_add(units, Ordering::Relaxed);
                if owner == self.node_id {
                    self.owner.give_back(&bucket, id, units);
                } else {
                    let _ = self
                        .call(self.transport.give_back(&owner, &bucket, id, units))
                        .await;
                }
            }
            Owed::Renew { bucket, owner, id } => {
                self.renew_loan(&bucket, &owner, id).await;
            }
        }
    }

    /// Renews loan `id` of `bucket` on `owner`; gives back what the answer does not let this
    /// node keep. False if the owner no longer has it (or could not be asked).
    pub(super) async fn renew_loan(&self, bucket: &str, owner: &str, id: u64) -> bool {
        match self.ask_owner(bucket, owner, Ask::RenewLoan).await {
            Ok(Grant::Renewed {
                id: renewed,
                expires_at,
                keep,
            }) if renewed == id => {
                let owed = self.book().renewed(bucket, owner, id, keep, expires_at);
                if let Some(owed) = owed {
                    Box::pin(self.pay(owed)).await;
                }
                true
            }
            Ok(_) => {
                self.book().gone(bucket, owner, id);
                false
            }
            Err(_) => false,
        }
    }

    /// Renews this node's loans that are due and gives back what they may not keep, or what
    /// has been idle for [`loan::IDLE_AFTER`]. Call it every [`loan::UPKEEP_EVERY`] (it does
    /// nothing for a policy that does not lend).
    pub async fn upkeep(&self) {
        if !self.lends() {
            return;
        }
        let now = self.clock.now();
        // Renewed once half the margin is spent: well before a unit could outlive its loan.
        let renew_by = weir::clock::after(
            now,
            self.config.lease_ttl.saturating_add(loan::LOAN_MARGIN / 2),
        );
        let owed = self.book().upkeep(now, loan::IDLE_AFTER, renew_by);
        for owed in owed {
            self.pay(owed).await;
        }
    }

    /// Units lent to this node: loans, units, in use.
    pub fn lent(&self) -> loan::Totals {
        self.book().totals()
    }

    /// Every lease and loan this node holds for the buckets `owner` owns on `ring`, for its
    /// census (see [`census`](crate::census)).
    pub fn held_for(&self, owner: &str, ring: &crate::ring::Ring) -> Vec<crate::census::Held> {
        let now = self.clock.now();
        let mine = |bucket: &str| ring.owner_of(bucket) == Some(owner);
        let mut held = self.book().held(mine, now);
        held.extend(
            self.held_leases()
                .values()
                .filter(|lease| lease.expires_at > now && mine(&lease.bucket))
                .map(|lease| crate::census::Held {
                    bucket: lease.bucket.clone(),
                    owner: lease.owner.clone(),
                    id: lease.id,
                    units: 1,
                    remaining: std::time::Duration::from_nanos(lease.expires_at - now),
                }),
        );
        held
    }
}
