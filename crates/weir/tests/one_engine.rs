//! A direct limiter is a keyed limiter with one key: the same requests, in the same order, get
//! the same answers from both — admissions, refusals and their retry-after, waits in a fair
//! line, cancellations that hand a claim back, reshapes in the middle of a line.
//!
//! Both run on a paused tokio runtime, so every wait is exact.

use std::sync::Arc;
use std::time::Duration;

use weir::keyed::{KeyedLimiter, Overflow, Shape};
use weir::{LeakyBucket, LeakyBucketConfig, Refused, TokioClock};

const KEY: &str = "tenant-1";

/// 100 tokens a second (one every 10 ms), at most 10, starting with 10.
fn config(refill_amount: u64) -> LeakyBucketConfig {
    LeakyBucketConfig {
        initial: 10,
        refill_interval: Duration::from_millis(100),
        refill_amount,
        max: 10,
        fair: true,
    }
}

fn shape(config: LeakyBucketConfig) -> Shape {
    let per_token = config.refill_interval.as_nanos() as u64 / config.refill_amount;
    Shape::Gcra {
        interval: per_token,
        capacity: config.max,
        initial: config.initial,
        fair: config.fair,
    }
}

/// One fair bucket, seen either way.
#[derive(Clone)]
enum Limiter {
    Direct(Arc<LeakyBucket<TokioClock>>),
    Keyed(Arc<KeyedLimiter<TokioClock>>),
}

impl Limiter {
    fn direct() -> Self {
        Limiter::Direct(Arc::new(
            LeakyBucket::with_clock(config(10), TokioClock::new()).unwrap(),
        ))
    }

    fn keyed() -> Self {
        Limiter::Keyed(Arc::new(KeyedLimiter::new(
            shape(config(10)),
            16,
            Overflow::Reject,
            TokioClock::new(),
        )))
    }

    fn try_acquire(&self, cost: u64) -> Result<(), Refused> {
        match self {
            Limiter::Direct(bucket) => bucket.try_acquire(cost),
            Limiter::Keyed(keyed) => {
                keyed
                    .try_acquire(KEY, cost)
                    .map(|_| ())
                    .map_err(|e| match e {
                        weir::keyed::KeyedRefusal::Limited(refused) => refused,
                        other => panic!("the key is tracked: {other:?}"),
                    })
            }
        }
    }

    /// Waits for `cost`; returns how long the request was held back.
    async fn acquire(&self, cost: u64) -> Duration {
        match self {
            Limiter::Direct(bucket) => bucket.acquire(cost).await.waited(),
            Limiter::Keyed(keyed) => {
                let admitted = keyed.acquire(KEY, cost, Duration::from_secs(3600)).await;
                admitted.expect("waits far less than an hour").waited
            }
        }
    }

    fn reshape(&self, config: LeakyBucketConfig) {
        match self {
            Limiter::Direct(bucket) => bucket.reconfigure(config).unwrap(),
            Limiter::Keyed(keyed) => assert!(keyed.reshape(shape(config))),
        }
    }

    fn spawn_acquire(&self, cost: u64) -> tokio::task::JoinHandle<Duration> {
        let limiter = self.clone();
        tokio::spawn(async move { limiter.acquire(cost).await })
    }
}

/// Everything the scenario saw, in order.
async fn scenario(limiter: Limiter) -> Vec<String> {
    let mut seen = Vec::new();
    let mut note =
        |what: &str, value: &dyn std::fmt::Debug| seen.push(format!("{what}: {value:?}"));

    note("drain 10", &limiter.try_acquire(10));
    note("one more", &limiter.try_acquire(1));
    note("more than the bucket", &limiter.try_acquire(11));
    note("wait for 1 on an empty bucket", &limiter.acquire(1).await);

    // A line of three: a head that will be cancelled, then two behind it.
    let head = limiter.spawn_acquire(5);
    tokio::task::yield_now().await;
    let second = limiter.spawn_acquire(3);
    tokio::task::yield_now().await;
    let third = limiter.spawn_acquire(2);
    tokio::task::yield_now().await;
    note("behind the line of 5 + 3 + 2", &limiter.try_acquire(1));
    tokio::time::sleep(Duration::from_millis(20)).await;
    head.abort();
    note("head cancelled", &head.await.map_err(|e| e.is_cancelled()));
    tokio::time::sleep(Duration::from_millis(5)).await;
    // Ten times the rate while the second claims: it is served under the new shape.
    limiter.reshape(config(100));
    note("second", &second.await.unwrap());
    note("third", &third.await.unwrap());
    note("line empty, bucket empty", &limiter.try_acquire(1));
    tokio::time::sleep(Duration::from_millis(100)).await;
    note("refilled at the new rate", &limiter.try_acquire(10));
    seen
}

#[tokio::test(start_paused = true)]
async fn a_direct_fair_bucket_answers_as_a_keyed_one_with_one_key() {
    let direct = scenario(Limiter::direct()).await;
    let keyed = scenario(Limiter::keyed()).await;
    assert_eq!(direct, keyed);
    // And the answers are the right ones, not merely the same.
    let ms = |n| format!("{:?}", Duration::from_millis(n));
    let expected = [
        "drain 10: Ok(())".to_string(),
        format!("one more: Err(RetryAfter {{ retry_after: {} }})", ms(10)),
        "more than the bucket: Err(ExceedsCapacity { cost: 11, capacity: 10 })".to_string(),
        format!("wait for 1 on an empty bucket: {}", ms(10)),
        // The head has claimed its 5; 3 + 2 are unclaimed ahead: (5 + 3 + 2 + 1) × 10 ms.
        format!(
            "behind the line of 5 + 3 + 2: Err(RetryAfter {{ retry_after: {} }})",
            ms(110)
        ),
        "head cancelled: Err(true)".to_string(),
        // The head gave back its claim at 20 ms; 2.5 tokens had accrued by the reshape at
        // 25 ms and the second's 3 are due 0.5 ms later, at 1 ms a token — tokio's timer wakes
        // it on the next whole millisecond, 26 ms. The third's 2 are then due at 27.5 ms (woken
        // at 28), which leaves half a token: the next one is 0.5 ms away.
        format!("second: {}", ms(26)),
        format!("third: {}", ms(28)),
        format!(
            "line empty, bucket empty: Err(RetryAfter {{ retry_after: {:?} }})",
            Duration::from_micros(500)
        ),
        "refilled at the new rate: Ok(())".to_string(),
    ];
    assert_eq!(direct, expected);
}
