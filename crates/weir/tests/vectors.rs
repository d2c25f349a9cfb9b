//! The acceptance vectors for the four limiters, exact to the nanosecond.
//!
//! Synchronous vectors run on a [`ManualClock`]; the ones that wait run on a paused tokio runtime
//! with a [`TokioClock`], so every wait is exact and nothing sleeps for real.

use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use weir::{
    Concurrency, ConcurrencyConfig, LeakyBucket, LeakyBucketConfig, ManualClock, Refused, Strict,
    StrictConfig, TokenBucket, TokenBucketConfig, TokioClock,
};

const MS: u64 = 1_000_000;

fn retry_after(d: Duration) -> Result<(), Refused> {
    Err(Refused::RetryAfter { retry_after: d })
}

/// `rate` tokens per second in refill-interval terms: `rate / 10` every 100 ms.
fn leaky(rate: u64, max: u64, initial: u64) -> LeakyBucketConfig {
    LeakyBucketConfig {
        initial,
        refill_interval: Duration::from_millis(100),
        refill_amount: rate / 10,
        max,
        fair: true,
    }
}

fn admit_all<E: std::fmt::Debug>(n: usize, mut acquire: impl FnMut() -> Result<(), E>) {
    for i in 0..n {
        if let Err(e) = acquire() {
            panic!("request #{i} of {n} was refused: {e:?}");
        }
    }
}

#[test]
fn leaky_100_rps_max_100_full() {
    let clock = ManualClock::new(0);
    let bucket = LeakyBucket::with_clock(leaky(100, 100, 100), clock.clone()).unwrap();
    admit_all(100, || bucket.try_acquire(1));
    assert_eq!(
        bucket.try_acquire(1),
        retry_after(Duration::from_millis(10))
    );

    // Two idle seconds refill only up to `max`: no overfill.
    clock.advance(Duration::from_secs(2));
    admit_all(100, || bucket.try_acquire(1));
    assert!(bucket.try_acquire(1).is_err());

    // At exactly the refill rate, every request goes through.
    for i in 0..2000 {
        clock.advance(Duration::from_millis(10));
        assert_eq!(bucket.try_acquire(1), Ok(()), "paced request #{i}");
    }
    assert!(bucket.try_acquire(1).is_err());
}

#[tokio::test(start_paused = true)]
async fn leaky_100_rps_a_request_above_max_waits_for_the_rest() {
    let bucket = LeakyBucket::with_clock(leaky(100, 100, 100), TokioClock::new()).unwrap();
    // A non-blocking acquire can never admit it...
    assert_eq!(
        bucket.try_acquire(200),
        Err(Refused::ExceedsCapacity {
            cost: 200,
            capacity: 100
        })
    );
    // ...a waiting one drains the full bucket and waits exactly for the other 100 tokens.
    tokio::time::advance(Duration::from_secs(3600)).await;
    let start = tokio::time::Instant::now();
    let admitted = bucket.acquire(200).await;
    assert_eq!(admitted.waited(), Duration::from_secs(1));
    assert!(admitted.throttled());
    assert_eq!(start.elapsed(), Duration::from_secs(1));
}

#[test]
fn leaky_500_rps_max_2000_full() {
    let clock = ManualClock::new(0);
    let bucket = LeakyBucket::with_clock(leaky(500, 2000, 2000), clock.clone()).unwrap();
    admit_all(2000, || bucket.try_acquire(1));
    assert_eq!(bucket.try_acquire(1), retry_after(Duration::from_millis(2)));
    clock.advance(Duration::from_millis(1));
    assert_eq!(
        bucket.try_acquire(1),
        retry_after(Duration::from_millis(1)),
        "not after 1 ms"
    );
    clock.advance(Duration::from_millis(1));
    assert_eq!(bucket.try_acquire(1), Ok(()), "after 2 ms");
    clock.advance(Duration::from_millis(10));
    admit_all(5, || bucket.try_acquire(1));
    assert_eq!(bucket.try_acquire(1), retry_after(Duration::from_millis(2)));
}

#[test]
fn leaky_initial_zero_waits_one_cost_and_initial_max_bursts() {
    let clock = ManualClock::new(0);
    let empty = LeakyBucket::with_clock(leaky(500, 2000, 0), clock.clone()).unwrap();
    assert_eq!(empty.try_acquire(1), retry_after(Duration::from_millis(2)));
    assert_eq!(empty.try_acquire(3), retry_after(Duration::from_millis(6)));

    let full = LeakyBucket::with_clock(leaky(500, 2000, 2000), clock).unwrap();
    admit_all(2000, || full.try_acquire(1));
    assert!(full.try_acquire(1).is_err());
}

#[test]
fn token_bucket_rate_50_burst_50() {
    let clock = ManualClock::new(0);
    let bucket = TokenBucket::with_clock(
        TokenBucketConfig {
            rate: 50.0,
            burst: 50,
        },
        clock.clone(),
    )
    .unwrap();
    admit_all(50, || bucket.try_acquire(1));
    assert_eq!(
        bucket.try_acquire(1),
        retry_after(Duration::from_millis(20))
    );
    clock.advance(Duration::from_secs(1));
    admit_all(50, || bucket.try_acquire(1));
    assert!(bucket.try_acquire(1).is_err());
}

#[test]
fn strict_10_qps_spaces_reservations_exactly() {
    let clock = ManualClock::new(7);
    let strict = Strict::with_clock(StrictConfig { qps: 10.0 }, clock.clone()).unwrap();
    let first = strict.reserve(1);
    assert_eq!(first, 7);
    for k in 1..=20 {
        assert_eq!(strict.reserve(1), first + k * 100 * MS);
    }
    // Long idle: nothing is banked, the spacing is the same right after.
    clock.advance(Duration::from_secs(5) + Duration::from_secs(2));
    let now = 7 + 7_000 * MS;
    assert_eq!(strict.reserve(1), now);
    assert_eq!(strict.reserve(1), now + 100 * MS);
    assert_eq!(strict.reserve(1), now + 200 * MS);
}

#[test]
fn concurrency_limit_2() {
    let limiter = Concurrency::new(ConcurrencyConfig { limit: 2 });
    let a = limiter.try_acquire(1).unwrap();
    let _b = limiter.try_acquire(1).unwrap();
    assert_eq!(limiter.try_acquire(1).unwrap_err(), Refused::NoPermit);
    drop(a);
    let _c = limiter
        .try_acquire(1)
        .expect("a release lets exactly one in");
    assert!(limiter.try_acquire(1).is_err());
}

#[test]
fn concurrency_64_threads_racing_on_limit_10_get_exactly_10() {
    for _round in 0..20 {
        let limiter = Arc::new(Concurrency::new(ConcurrencyConfig { limit: 10 }));
        let start = Arc::new(Barrier::new(64));
        let held = Arc::new(Barrier::new(64));
        let threads: Vec<_> = (0..64)
            .map(|_| {
                let (limiter, start, held) =
                    (Arc::clone(&limiter), Arc::clone(&start), Arc::clone(&held));
                std::thread::spawn(move || {
                    start.wait();
                    let permit = limiter.try_acquire(1);
                    let granted = permit.is_ok();
                    // Keep permits until every thread has tried.
                    held.wait();
                    drop(permit);
                    granted
                })
            })
            .collect();
        let grants = threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|&g| g)
            .count();
        assert_eq!(grants, 10);
        assert_eq!(limiter.in_flight(), 0);
    }
}

/// Spawns `acquire(cost)` on a fair bucket for each waiter, in order, and returns the order and
/// times (ms since start) at which they were admitted.
async fn admission_order(
    bucket: Arc<LeakyBucket<TokioClock>>,
    waiters: &[(&'static str, u64)],
) -> Vec<(&'static str, u64)> {
    let start = tokio::time::Instant::now();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for &(name, cost) in waiters {
        let (bucket, log) = (Arc::clone(&bucket), Arc::clone(&log));
        tasks.push(tokio::spawn(async move {
            bucket.acquire(cost).await;
            let at = start.elapsed().as_millis() as u64;
            log.lock().unwrap().push((name, at));
        }));
        // Let it reach the line before the next one arrives.
        tokio::task::yield_now().await;
    }
    for task in tasks {
        task.await.unwrap();
    }
    Arc::try_unwrap(log).unwrap().into_inner().unwrap()
}

#[tokio::test(start_paused = true)]
async fn fair_waiters_are_admitted_in_arrival_order() {
    // 100 tokens/s, empty: `a` needs 500 ms of refill, `b` and `c` would fit much sooner.
    let bucket = Arc::new(LeakyBucket::with_clock(leaky(100, 100, 0), TokioClock::new()).unwrap());
    let order = admission_order(bucket, &[("a", 50), ("b", 1), ("c", 1)]).await;
    assert_eq!(order, vec![("a", 500), ("b", 510), ("c", 520)]);
}

#[tokio::test(start_paused = true)]
async fn unfair_waiters_are_served_in_reservation_order_too() {
    let config = LeakyBucketConfig {
        fair: false,
        ..leaky(100, 100, 0)
    };
    let bucket = Arc::new(LeakyBucket::with_clock(config, TokioClock::new()).unwrap());
    let order = admission_order(bucket, &[("a", 50), ("b", 1), ("c", 1)]).await;
    assert_eq!(order, vec![("a", 500), ("b", 510), ("c", 520)]);
}

#[tokio::test(start_paused = true)]
async fn fair_try_acquire_does_not_overtake_waiters() {
    let bucket = Arc::new(LeakyBucket::with_clock(leaky(100, 100, 0), TokioClock::new()).unwrap());
    let waiter = {
        let bucket = Arc::clone(&bucket);
        tokio::spawn(async move { bucket.acquire(50).await })
    };
    tokio::task::yield_now().await;
    assert_eq!(bucket.waiters(), 1);
    tokio::time::advance(Duration::from_millis(100)).await;
    // Ten tokens have accrued, but they belong to the waiter ahead. The refusal says when this
    // request would be due behind it: 510 ms from the start.
    assert_eq!(
        bucket.try_acquire(1),
        retry_after(Duration::from_millis(410))
    );
    let admitted = waiter.await.unwrap();
    assert_eq!(admitted.waited(), Duration::from_millis(500));
    assert_eq!(bucket.waiters(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_passes_its_turn_on_and_gives_back_only_what_it_took() {
    let bucket = Arc::new(LeakyBucket::with_clock(leaky(100, 100, 0), TokioClock::new()).unwrap());
    let start = tokio::time::Instant::now();
    let a = {
        let bucket = Arc::clone(&bucket);
        tokio::spawn(async move {
            tokio::time::timeout(Duration::from_millis(200), bucket.acquire(50)).await
        })
    };
    tokio::task::yield_now().await;
    let b = {
        let bucket = Arc::clone(&bucket);
        tokio::spawn(async move { bucket.acquire(1).await })
    };
    tokio::task::yield_now().await;
    assert!(a.await.unwrap().is_err(), "a gives up at 200 ms");
    // The 20 tokens that accrued while `a` waited are still there: `b` goes at once — and
    // reports the 200 ms it spent in line.
    let admitted = b.await.unwrap();
    assert!(admitted.throttled());
    assert_eq!(admitted.waited(), Duration::from_millis(200));
    assert_eq!(start.elapsed(), Duration::from_millis(200));
    assert_eq!(bucket.available(), 19);
    assert_eq!(bucket.waiters(), 0);
}

#[tokio::test(start_paused = true)]
async fn reconfiguring_keeps_waiters_and_serves_the_head_at_the_new_rate() {
    // 10 tokens/s, max 10, empty: a request for 5 is due at 500 ms.
    let config = LeakyBucketConfig {
        initial: 0,
        refill_interval: Duration::from_millis(100),
        refill_amount: 1,
        max: 10,
        fair: true,
    };
    let bucket = Arc::new(LeakyBucket::with_clock(config, TokioClock::new()).unwrap());
    let start = tokio::time::Instant::now();
    let head = {
        let bucket = Arc::clone(&bucket);
        tokio::spawn(async move { bucket.acquire(5).await })
    };
    tokio::task::yield_now().await;
    let behind = {
        let bucket = Arc::clone(&bucket);
        tokio::spawn(async move { bucket.acquire(1).await })
    };
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_millis(100)).await;
    assert_eq!(bucket.waiters(), 2);
    // At 100 ms one token has accrued. Ten times the rate: the other 4 take 40 ms more.
    bucket
        .reconfigure(LeakyBucketConfig {
            refill_amount: 10,
            ..config
        })
        .unwrap();
    assert_eq!(head.await.unwrap().waited(), Duration::from_millis(140));
    assert_eq!(behind.await.unwrap().waited(), Duration::from_millis(150));
    assert_eq!(start.elapsed(), Duration::from_millis(150));
}

#[tokio::test(start_paused = true)]
async fn concurrency_waiters_are_served_first_come_first_served() {
    let limiter = Arc::new(Concurrency::new(ConcurrencyConfig { limit: 1 }));
    let held = limiter.try_acquire(1).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for name in ["a", "b", "c"] {
        let (limiter, log) = (Arc::clone(&limiter), Arc::clone(&log));
        tasks.push(tokio::spawn(async move {
            let _permit = limiter.acquire(1).await;
            log.lock().unwrap().push(name);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }));
        tokio::task::yield_now().await;
    }
    assert_eq!(limiter.waiters(), 3);
    drop(held);
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*log.lock().unwrap(), vec!["a", "b", "c"]);
    assert_eq!(limiter.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_reservation_given_back_after_a_rate_change_is_converted_too() {
    // 1 token/s, holding 10, emptied: a request for 5 more reserves 5 s of debt.
    let bucket = Arc::new(
        TokenBucket::with_clock(
            TokenBucketConfig {
                rate: 1.0,
                burst: 10,
            },
            TokioClock::new(),
        )
        .unwrap(),
    );
    bucket.try_acquire(10).unwrap();
    let waiter = {
        let bucket = Arc::clone(&bucket);
        tokio::spawn(async move {
            tokio::time::timeout(Duration::from_millis(1), bucket.acquire(5)).await
        })
    };
    tokio::task::yield_now().await;
    // A thousand times the rate while the reservation is out; then it is cancelled at 1 ms.
    bucket
        .reconfigure(TokenBucketConfig {
            rate: 1000.0,
            burst: 10,
        })
        .unwrap();
    assert!(waiter.await.unwrap().is_err());
    // It gives back 5 tokens of the new shape: the bucket holds what 1 ms at 1000/s refilled,
    // not a full burst.
    assert_eq!(bucket.available(), 1);
}
