//! hyper's header-read timer, one per connection, moved only when it fires.
//!
//! hyper times every request head it reads (`server.header_timeout`, the slow-client
//! protection) and drops the timer once the head is in. On tokio's timer that is an entry put
//! into the timer wheel and taken out again for every request, and a timer allocated and freed
//! with it. A connection reads its heads one after the other, so one tokio [`Sleep`] a
//! connection serves them all: the sleep hyper gets for a head holds only its deadline, and the
//! connection's sleep stays armed at the deadline it was first given. When that passes while a
//! later head (with a later deadline) is being read, the connection's sleep moves to the later
//! deadline then. Every head still times out at its own deadline; the wheel is touched about
//! once a timeout per connection rather than once a request.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// A connection's armed sleep: `None` until its first head is timed.
type Armed = Arc<Mutex<Option<Pin<Box<Sleep>>>>>;

/// The header-read timer of one HTTP/1 connection (give each connection its own; it is not
/// `Clone`, since a copy would share the connection's armed sleep).
#[derive(Debug, Default)]
pub(crate) struct HeaderTimer {
    armed: Armed,
}

impl hyper::rt::Timer for HeaderTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep_until((Instant::now() + duration).into_std())
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(HeadDeadline {
            deadline: Instant::from_std(deadline),
            armed: Arc::clone(&self.armed),
        })
    }
}

/// One head's deadline, kept by its connection's sleep.
struct HeadDeadline {
    deadline: Instant,
    armed: Armed,
}

impl Future for HeadDeadline {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = self.deadline;
        let mut armed = self.armed.lock().unwrap_or_else(PoisonError::into_inner);
        let sleep = armed.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        // Only a shorter timeout than the last (none today) makes a deadline earlier.
        if sleep.deadline() > deadline {
            sleep.as_mut().reset(deadline);
        }
        loop {
            match sleep.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(()) if sleep.deadline() >= deadline => return Poll::Ready(()),
                // An earlier head's deadline: this head's is later.
                Poll::Ready(()) => sleep.as_mut().reset(deadline),
            }
        }
    }
}

impl hyper::rt::Sleep for HeadDeadline {}

#[cfg(test)]
mod tests;
