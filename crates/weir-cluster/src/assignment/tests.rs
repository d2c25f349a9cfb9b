use super::*;

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;

/// 100 a second, 20 at once.
const WHOLE: Whole = Whole {
    interval: 10 * MS,
    capacity: 20,
};

fn report(key: &str, demand: u64, running: u64) -> RateReport {
    RateReport {
        policy: "p".into(),
        key: key.into(),
        demand,
        running,
        ttl: ASSIGNMENT_TTL,
        decides_all: false,
    }
}

/// The owner's own bucket, as the server's policy keeps it: a GCRA that sets aside what is
/// lent.
#[derive(Debug)]
struct OwnerBucket {
    tat: Nanos,
}

impl OwnerBucket {
    fn tolerance() -> u64 {
        WHOLE.interval * WHOLE.capacity
    }

    /// Returns the whole tokens the floor took out.
    fn set_aside(&mut self, aside: SetAside, now: Nanos) -> u64 {
        let debit = (aside.before * aside.elapsed.as_nanos() as f64).ceil() as u64;
        let floor = now + (aside.after * Self::tolerance() as f64).ceil() as u64;
        let debited = self.tat.max(now) + debit;
        self.tat = debited.max(floor);
        floor.saturating_sub(debited) / WHOLE.interval
    }

    fn take(&mut self, now: Nanos) -> bool {
        let tat = self.tat.max(now) + WHOLE.interval;
        if tat - now <= Self::tolerance() {
            self.tat = tat;
            true
        } else {
            false
        }
    }
}

#[test]
fn equal_demand_gets_equal_shares_once_a_cut_is_made() {
    let book = AssignmentBook::new(16);
    let bucket = "p\0k".to_owned();
    // a asks alone: half of what is free at each report, towards all of it.
    let mut a = 0;
    for (at, expected) in [(0, 500), (1, 750), (2, 875)] {
        a = book
            .report("a", &bucket, &report("k", 200, a), WHOLE, at * MS)
            .0
            .shares;
        assert_eq!(a, expected);
    }
    // b asks as much: half is its due, but a runs 875 until it says it cut.
    let (b, _) = book.report("b", &bucket, &report("k", 200, 0), WHOLE, 3 * MS);
    assert_eq!(b.shares, 63, "half of the 125 free");
    let (cut, _) = book.report("a", &bucket, &report("k", 200, a), WHOLE, 4 * MS);
    assert_eq!(cut.shares, SHARES / 2, "a is told to cut to its due");
    let (b, _) = book.report("b", &bucket, &report("k", 200, 63), WHOLE, 5 * MS);
    assert_eq!(
        b.shares, 94,
        "a has not said it cut: b grows into the 62 free only"
    );
    let (mut a, mut b) = (cut.shares, b.shares);
    for round in 0..12 {
        let at = (6 + 2 * round) * MS;
        a = book
            .report("a", &bucket, &report("k", 200, a), WHOLE, at)
            .0
            .shares;
        b = book
            .report("b", &bucket, &report("k", 200, b), WHOLE, at + MS)
            .0
            .shares;
    }
    assert_eq!((a, b), (SHARES / 2, SHARES / 2));
    assert_eq!(book.lent(40 * MS).values().sum::<u64>(), SHARES);
}

#[test]
fn little_demand_or_a_burst_share_under_a_token_gets_nothing() {
    let book = AssignmentBook::new(16);
    let bucket = "p\0k".to_owned();
    let (low, _) = book.report("a", &bucket, &report("k", ASSIGN_ABOVE - 1, 0), WHOLE, 0);
    assert_eq!(low.shares, 0);
    // Beside a hundred times its demand, a's share of a burst of 20 holds no token.
    book.report("b", &bucket, &report("k", 10_000, 0), WHOLE, 0);
    let (small, _) = book.report("a", &bucket, &report("k", 100, 0), WHOLE, MS);
    assert_eq!(small.shares, 0);
    // A bucket refilling 10 a second is about its burst, not its rate.
    let slow = Whole {
        interval: 100 * MS,
        capacity: 1_000,
    };
    assert!(!slow.worth_sharing() && WHOLE.worth_sharing());
    let other = "p\0slow".to_owned();
    let (none, _) = book.report("a", &other, &report("slow", 10_000, 0), slow, MS);
    assert_eq!(none.shares, 0);
}

#[test]
fn a_holder_that_stops_reporting_gives_its_shares_back_at_expiry() {
    let book = AssignmentBook::new(16);
    let bucket = "p\0k".to_owned();
    book.report("a", &bucket, &report("k", 200, 0), WHOLE, 0);
    let ttl = ASSIGNMENT_TTL.as_nanos() as u64;
    let (b, _) = book.report("b", &bucket, &report("k", 200, 0), WHOLE, ttl - 1);
    assert_eq!(
        b.shares, 500,
        "its due, all of it free: a's demand is known by now"
    );
    let (b, _) = book.report("b", &bucket, &report("k", 200, 500), WHOLE, ttl);
    assert_eq!(
        b.shares, SHARES,
        "a's loan has expired, and its demand is stale"
    );
    assert_eq!(book.sweep(3 * ttl), 0, "nothing lent, no report: forgotten");
}

#[test]
fn a_holder_that_asks_for_a_longer_ttl_keeps_its_shares_that_long_and_no_longer() {
    let book = AssignmentBook::new(16);
    let bucket = "p\0k".to_owned();
    let slow = RateReport {
        ttl: Duration::from_secs(3),
        ..report("k", 200, 0)
    };
    let (a, _) = book.report("a", &bucket, &slow, WHOLE, 0);
    assert_eq!((a.shares, a.ttl), (500, Duration::from_secs(3)));
    // Two seconds on, without a word from a: its loan and its demand still count.
    let (b, _) = book.report("b", &bucket, &report("k", 200, 0), WHOLE, 2 * SEC);
    assert_eq!(
        b.shares, 500,
        "half (a's demand still counts; forgotten, b's due would be all)"
    );
    assert_eq!(b.ttl, ASSIGNMENT_TTL);
    let (b, _) = book.report("b", &bucket, &report("k", 200, 500), WHOLE, 3 * SEC);
    assert_eq!(b.shares, SHARES, "a's three seconds are over");
    // A TTL asked beyond the longest is held to it.
    let greedy = RateReport {
        ttl: Duration::from_secs(3600),
        ..report("k", 200, 0)
    };
    let (c, _) = book.report("c", &bucket, &greedy, WHOLE, 4 * SEC);
    assert_eq!(c.ttl, LONGEST_TTL);
}

#[test]
fn a_holder_that_cannot_forward_gets_a_token_s_share_whatever_its_demand() {
    let book = AssignmentBook::new(16);
    let bucket = "p\0k".to_owned();
    let quiet = RateReport {
        decides_all: true,
        ..report("k", 1, 0)
    };
    book.report("busy", &bucket, &report("k", 1_000, 0), WHOLE, 0);
    let (a, _) = book.report("a", &bucket, &quiet, WHOLE, MS);
    assert_eq!(
        a.shares,
        SHARES / WHOLE.capacity,
        "one token of the 20, not its 1/1001 of the demand"
    );
    assert_eq!(WHOLE.capacity_of(a.shares), 1);
    // A node at the same demand forwards instead.
    let (b, _) = book.report("b", &bucket, &report("k", 1, 0), WHOLE, 2 * MS);
    assert_eq!(b.shares, 0);
}

#[test]
fn what_is_lent_is_set_aside_of_the_owner_s_bucket() {
    let book = AssignmentBook::new(16);
    let bucket = "p\0k".to_owned();
    assert_eq!(book.decided_here(&bucket, 1, 0), None, "nothing lent");
    let (_, aside) = book.report("a", &bucket, &report("k", 200, 0), WHOLE, 0);
    assert_eq!((aside.before, aside.after), (0.0, 0.5));
    let aside = book.decided_here(&bucket, 1, 100 * MS).unwrap();
    assert_eq!(aside.before, 0.5);
    assert_eq!(aside.elapsed, Duration::from_millis(100));
}

#[test]
fn a_holder_decides_within_its_share_and_forwards_without_one() {
    let mut held = HeldRates::new();
    assert_eq!(held.take("p", "k", "o", 1, 0), Local::Forward);
    let half = Assignment {
        shares: SHARES / 2,
        ..Assignment::none()
    };
    held.assigned(("o", "p", "k"), half, WHOLE, (0, 0));
    // Half the rate (50/s: 20 ms a token), half the burst (10), starting empty.
    assert_eq!(
        held.take("p", "k", "o", 1, 0),
        Local::Refused {
            retry_after: Duration::from_millis(20)
        }
    );
    let full = 10 * 20 * MS;
    for _ in 0..10 {
        assert_eq!(held.take("p", "k", "o", 1, full), Local::Admitted);
    }
    assert!(matches!(
        held.take("p", "k", "o", 1, full),
        Local::Refused { .. }
    ));
    assert_eq!(
        held.take("p", "k", "o", 11, full),
        Local::Forward,
        "beyond its burst"
    );
    assert_eq!(
        held.take("p", "k", "other", 1, full),
        Local::Forward,
        "not from the owner now"
    );
    assert_eq!(held.take("p", "k", "o", 1, SEC), Local::Forward, "expired");
}

#[test]
fn tokens_the_owner_moved_are_the_holder_s_to_spend_up_to_its_capacity() {
    let mut held = HeldRates::new();
    let moved = |shares, tokens| Assignment {
        shares,
        tokens,
        ..Assignment::none()
    };
    held.assigned(("o", "p", "k"), moved(SHARES / 2, 4), WHOLE, (0, 0));
    for _ in 0..4 {
        assert_eq!(held.take("p", "k", "o", 1, 0), Local::Admitted);
    }
    assert!(matches!(
        held.take("p", "k", "o", 1, 0),
        Local::Refused { .. }
    ));
    // Grown to all of it with 30 more: it holds its capacity of 20, no more.
    held.assigned(("o", "p", "k"), moved(SHARES, 30), WHOLE, (0, 0));
    for _ in 0..20 {
        assert_eq!(held.take("p", "k", "o", 1, 0), Local::Admitted);
    }
    assert!(matches!(
        held.take("p", "k", "o", 1, 0),
        Local::Refused { .. }
    ));
}

#[test]
fn reports_carry_held_buckets_and_hot_forwarded_ones() {
    let mut held = HeldRates::new();
    held.reports(0);
    for _ in 0..10 {
        held.forwarded("p", "hot", "o", 1);
    }
    held.forwarded("p", "cold", "o", 1);
    let reports = held.reports(250 * MS);
    assert_eq!(reports, vec![("o".to_owned(), report("hot", 40, 0))]);
    let quarter = Assignment {
        shares: 250,
        ..Assignment::none()
    };
    held.assigned(("o", "p", "hot"), quarter, WHOLE, (250 * MS, 250 * MS));
    assert_eq!(held.held(), 1);
    for _ in 0..10 {
        assert_ne!(held.take("p", "hot", "o", 1, 300 * MS), Local::Forward);
    }
    let reports = held.reports(500 * MS);
    assert_eq!(reports, vec![("o".to_owned(), report("hot", 40, 250))]);
    // Asked too little since: it runs none from now on, and says so at once.
    let reports = held.reports(750 * MS);
    assert_eq!(reports, vec![("o".to_owned(), report("hot", 0, 0))]);
    assert_eq!(held.take("p", "hot", "o", 1, 800 * MS), Local::Forward);
    held.assigned(
        ("o", "p", "hot"),
        Assignment::none(),
        WHOLE,
        (750 * MS, 750 * MS),
    );
    assert_eq!(held.held(), 0);
}

/// Requests at each node's demand, every millisecond; holders report every 250 ms; returns
/// each admission's time, whoever admitted it.
fn simulate(seconds: u64, demand: impl Fn(Nanos) -> [u64; 3]) -> Vec<Nanos> {
    let book = AssignmentBook::new(16);
    let bucket = "p\0k".to_owned();
    let mut owner = OwnerBucket { tat: 0 };
    let mut holders = [HeldRates::new(), HeldRates::new()];
    let mut admitted = Vec::new();
    let mut owed = [0.0f64; 3];
    let report_every = REPORT_EVERY.as_nanos() as u64;
    for now in (0..seconds * SEC).step_by(MS as usize) {
        if now % report_every == 0 {
            for (i, holder) in holders.iter_mut().enumerate() {
                let name = ["a", "b"][i];
                for (_, report) in holder.reports(now) {
                    let (mut assignment, aside) = book.report(name, &bucket, &report, WHOLE, now);
                    assignment.tokens = owner.set_aside(aside, now);
                    holder.assigned(("o", "p", "k"), assignment, WHOLE, (now, now));
                }
            }
        }
        let demand = demand(now);
        for node in 0..3 {
            owed[node] += demand[node] as f64 / 1000.0;
            while owed[node] >= 1.0 {
                owed[node] -= 1.0;
                let local = match node {
                    0 => Local::Forward,
                    n => holders[n - 1].take("p", "k", "o", 1, now),
                };
                match local {
                    Local::Admitted => admitted.push(now),
                    Local::Refused { .. } => {}
                    Local::Forward => {
                        if node > 0 {
                            holders[node - 1].forwarded("p", "k", "o", 1);
                        }
                        if let Some(aside) = book.decided_here(&bucket, 1, now) {
                            owner.set_aside(aside, now);
                        }
                        if owner.take(now) {
                            admitted.push(now);
                        }
                    }
                }
            }
        }
    }
    admitted
}

/// The most admitted over any window of `window` nanoseconds.
fn busiest(admitted: &[Nanos], window: u64) -> usize {
    let mut most = 0;
    let mut start = 0;
    for end in 0..admitted.len() {
        while admitted[end] - admitted[start] >= window {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

fn bound(window: u64) -> usize {
    (WHOLE.capacity + window.div_ceil(WHOLE.interval)) as usize
}

#[test]
fn the_cluster_admits_no_more_than_one_bucket_over_any_window() {
    // Twice the rate asked: the owner 50/s, a 100/s, b 50/s.
    let admitted = simulate(10, |_| [50, 100, 50]);
    for window in [MS, 10 * MS, 100 * MS, 250 * MS, SEC, 5 * SEC] {
        assert!(
            busiest(&admitted, window) <= bound(window),
            "{} admitted in {window} ns, bound {}",
            busiest(&admitted, window),
            bound(window)
        );
    }
    // And all of it is used once shares are made: 100 a second, within 1 %.
    let steady = admitted.iter().filter(|&&t| t >= SEC).count();
    assert!((891..=909).contains(&steady), "{steady} admitted in 9 s");
}

#[test]
fn demand_that_moves_from_one_holder_to_the_other_keeps_the_bound() {
    let admitted = simulate(10, |now| match now < 5 * SEC {
        true => [10, 300, 0],
        false => [10, 0, 300],
    });
    for window in [MS, 100 * MS, SEC, 3 * SEC] {
        assert!(busiest(&admitted, window) <= bound(window));
    }
    // Within a second of the shift, b admits at the rate again.
    let after = admitted.iter().filter(|&&t| t >= 6 * SEC).count();
    assert!(
        (396..=404).contains(&after),
        "{after} admitted in the last 4 s"
    );
    let shifting = admitted.len() - after - admitted.iter().filter(|&&t| t < 5 * SEC).count();
    assert!(
        shifting >= 50,
        "{shifting} admitted in the second after the shift"
    );
}

#[test]
fn a_bucket_s_book_moves_to_its_next_owner_and_is_counted_there() {
    let (old, new) = (AssignmentBook::new(16), AssignmentBook::new(16));
    let bucket = "p\0k".to_owned();
    old.report("h", &bucket, &report("k", 200, 0), WHOLE, 0);
    // Listed among those lent of, so that it moves even when its bucket is whole; not once
    // the share has run out.
    assert_eq!(old.lent_buckets(100 * MS), std::slice::from_ref(&bucket));
    assert!(old.lent_buckets(2 * SEC).is_empty());
    let lent = old.lent_in(&bucket, 100 * MS);
    assert_eq!(lent.len(), 1);
    assert_eq!((lent[0].holder.as_str(), lent[0].shares), ("h", 500));
    assert_eq!(
        lent[0].remaining,
        ASSIGNMENT_TTL - Duration::from_millis(100)
    );
    assert_eq!(
        new.take_on(&bucket, &lent, "h", 0),
        None,
        "its own share: none"
    );
    let aside = new.take_on(&bucket, &lent, "n", 0).unwrap();
    assert_eq!(aside.after, 0.5, "set aside on the new owner at once");
    // Another node asking the new owner finds those shares taken until they run out.
    let (other, _) = new.report("g", &bucket, &report("k", 200, 0), WHOLE, MS);
    assert_eq!(other.shares, 250);
    // The holder, its ring moved, reports it runs none: they come back, and it grows anew.
    let (h, _) = new.report("h", &bucket, &report("k", 200, 0), WHOLE, 2 * MS);
    assert_eq!(h.shares, 375, "half of the 750 free once its 500 came back");
}

#[test]
fn what_a_reporting_node_forwarded_is_its_demand_not_the_owner_s() {
    let book = AssignmentBook::new(16);
    let bucket = "p\0k".to_owned();
    // a gets a share, then its demand moves to b, which forwards 400 a second meanwhile.
    let (a, _) = book.report("a", &bucket, &report("k", 400, 0), WHOLE, 0);
    for ms in 0..250 {
        if ms % 10 == 0 {
            book.decided_here(&bucket, 4, ms * MS);
        }
    }
    assert_eq!(a.shares, SHARES / 2);
    // Asked too little, a runs none from now on and says so (`HeldRates::reports`).
    let (a, _) = book.report("a", &bucket, &report("k", 0, 0), WHOLE, 250 * MS);
    assert_eq!(a.shares, 0);
    // Counted once, b's 400 a second is all the demand there is: all of it, at once.
    let (b, _) = book.report("b", &bucket, &report("k", 400, 0), WHOLE, 260 * MS);
    assert_eq!(b.shares, SHARES);
}
