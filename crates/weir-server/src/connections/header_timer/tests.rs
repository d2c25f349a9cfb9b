//! The unit tests of `header_timer.rs`, on tokio's paused clock.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::rt::Timer;
use tokio::time::Instant;

use super::HeaderTimer;

/// Polls `sleep` once, without waiting.
fn poll_once(sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>) -> Poll<()> {
    let waker = std::task::Waker::noop();
    sleep.as_mut().poll(&mut Context::from_waker(waker))
}

#[tokio::test(start_paused = true)]
async fn a_head_times_out_at_its_own_deadline() {
    let timer = HeaderTimer::default();
    let mut sleep = timer.sleep(Duration::from_secs(10));
    assert!(poll_once(&mut sleep).is_pending());
    tokio::time::advance(Duration::from_millis(9_999)).await;
    assert!(poll_once(&mut sleep).is_pending());
    // Awaited: it wakes its task at the deadline, not only when polled.
    let started = Instant::now();
    sleep.await;
    assert_eq!(started.elapsed(), Duration::from_millis(1));
}

#[tokio::test(start_paused = true)]
async fn a_later_head_outlives_the_deadline_the_sleep_was_armed_at() {
    let timer = HeaderTimer::default();
    let mut first = timer.sleep(Duration::from_secs(10));
    assert!(poll_once(&mut first).is_pending());
    drop(first);
    // The next head begins 4 s later: its deadline is at 14 s, the armed sleep's at 10 s.
    tokio::time::advance(Duration::from_secs(4)).await;
    let mut second = timer.sleep(Duration::from_secs(10));
    assert!(poll_once(&mut second).is_pending());
    tokio::time::advance(Duration::from_secs(6)).await;
    assert!(
        poll_once(&mut second).is_pending(),
        "the first head's deadline passing does not end the second's"
    );
    let started = Instant::now();
    second.await;
    assert_eq!(started.elapsed(), Duration::from_secs(4), "ends at 14 s");
}

#[tokio::test(start_paused = true)]
async fn connections_keep_their_own_timers() {
    let (a, b) = (HeaderTimer::default(), HeaderTimer::default());
    let mut slow = a.sleep(Duration::from_secs(10));
    assert!(poll_once(&mut slow).is_pending());
    tokio::time::advance(Duration::from_secs(5)).await;
    let mut other = b.sleep(Duration::from_secs(10));
    assert!(poll_once(&mut other).is_pending());
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(poll_once(&mut slow).is_ready());
    assert!(poll_once(&mut other).is_pending());
}

#[tokio::test(start_paused = true)]
async fn a_shorter_timeout_moves_the_sleep_earlier() {
    let timer = HeaderTimer::default();
    let mut long = timer.sleep(Duration::from_secs(30));
    assert!(poll_once(&mut long).is_pending());
    drop(long);
    let short = timer.sleep(Duration::from_secs(2));
    let started = Instant::now();
    short.await;
    assert_eq!(started.elapsed(), Duration::from_secs(2));
}
