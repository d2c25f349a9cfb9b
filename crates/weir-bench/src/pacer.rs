//! Wakes each open-loop client when its next request is due.
//!
//! Tokio's timer has a millisecond wheel and wakes up to a millisecond late; measured from the
//! due time, that lateness would swamp an in-process acquire that takes microseconds. The
//! precise pacer is one OS thread that sleeps with `std::thread::sleep` (tens of microseconds
//! late) and hands every client the index of each request as it falls due. Under a paused
//! tokio clock (the tests) the timer pacer is exact and the thread would not be.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::schedule::Schedule;

/// How a client waits for a due time.
#[derive(Debug)]
pub enum Pacer {
    /// Tokio's timer.
    Timer,
    /// The indexes the pacer thread sends as they fall due.
    Thread(mpsc::UnboundedReceiver<u64>),
}

impl Pacer {
    /// Returns at `due`, the due time of request `k` (the next the client may send).
    pub async fn wait(&mut self, k: u64, due: Instant) {
        match self {
            Pacer::Timer => tokio::time::sleep_until(due).await,
            Pacer::Thread(due_indexes) => {
                // Indexes below k were missed; the client has already counted them.
                while let Some(j) = due_indexes.recv().await {
                    if j >= k {
                        return;
                    }
                }
            }
        }
    }
}

/// One client's schedule on the pacer thread.
pub struct Paced {
    /// When the client's first request is due.
    pub start: Instant,
    /// Its schedule.
    pub schedule: Schedule,
    /// How many requests it sends.
    pub total: u64,
}

/// Starts the pacer thread for `clients`; returns each one's [`Pacer`] in order.
pub fn spawn_thread(clients: Vec<Paced>) -> Vec<Pacer> {
    let mut pacers = Vec::with_capacity(clients.len());
    let mut senders = Vec::with_capacity(clients.len());
    for _ in &clients {
        let (tx, rx) = mpsc::unbounded_channel();
        senders.push(tx);
        pacers.push(Pacer::Thread(rx));
    }
    std::thread::spawn(move || {
        let due = |c: usize, k: u64| clients[c].start.into_std() + clients[c].schedule.due(k);
        let mut next: BinaryHeap<Reverse<(std::time::Instant, usize, u64)>> = (0..clients.len())
            .filter(|&c| clients[c].total > 0)
            .map(|c| Reverse((due(c, 0), c, 0)))
            .collect();
        while let Some(Reverse((at, c, k))) = next.pop() {
            let now = std::time::Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            // A client that has gone away needs no more wake-ups.
            if senders[c].send(k).is_ok() && k + 1 < clients[c].total {
                next.push(Reverse((due(c, k + 1), c, k + 1)));
            }
        }
    });
    pacers
}
