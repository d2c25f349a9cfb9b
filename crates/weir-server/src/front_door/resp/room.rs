//! Room for connections on the Redis listener: at its cap, the connection that has been silent
//! longest is closed to let a newcomer in.
//!
//! Timeouts alone do not keep the port open to well-behaved clients: `max_connections` sockets
//! that connect and say nothing (or start a command and never finish it) hold every slot until
//! their timeouts end, and then simply connect again. So each connection records when it last
//! completed a request and whether it has a reply still being decided; when a newcomer finds no
//! free slot, the connection that has waited longest for its client — idle, or holding half a
//! command — and has done so for at least [`MIN_SILENCE`] is told to close. A connection being
//! answered is never closed to make room, so a client that is working keeps its connection;
//! one that sits idle in a pool may lose it, as it would to Redis's `timeout`, and reconnects.
//!
//! Pure bookkeeping: time comes in as an argument.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// How long a connection must have been silent before it may be closed to make room: a
/// client between two requests of a burst is not cut off.
pub const MIN_SILENCE: Duration = Duration::from_secs(1);

/// Nothing asked of the connection is being decided or written: it may be evicted.
const IDLE: u8 = 0;
/// The connection is running what its client asked: it is not evicted.
const WORKING: u8 = 1;
/// Told to close: it runs nothing more.
const EVICTED: u8 = 2;

/// One connection's state, as the room sees it. Eviction and the start of work are one
/// compare-and-swap each on `state`, so a connection that has begun running a request is never
/// closed under it, and one chosen for eviction runs nothing it read after.
#[derive(Debug, Default)]
pub struct Occupant {
    /// When (nanoseconds on the listener's clock) the client last completed a request, or
    /// connected.
    last_request: AtomicU64,
    state: AtomicU8,
    /// Has given the password (or none is asked for): such connections are evicted last.
    authenticated: AtomicBool,
    /// Told to close.
    evicted: Notify,
}

impl Occupant {
    /// The client completed a request at `now`.
    pub fn requested(&self, now: u64) {
        self.last_request.store(now, Ordering::Relaxed);
    }

    /// Whether the client has given the password (or none is asked for).
    pub fn set_authenticated(&self, authenticated: bool) {
        self.authenticated.store(authenticated, Ordering::Relaxed);
    }

    /// Before running what the client asked: true if the connection may (it is not evicted).
    pub fn work(&self) -> bool {
        match self
            .state
            .compare_exchange(IDLE, WORKING, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(state) => state == WORKING,
        }
    }

    /// Nothing is being decided or written any more: the connection may be evicted again.
    pub fn rest(&self) {
        let _ = self
            .state
            .compare_exchange(WORKING, IDLE, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Resolves when the room closes this connection to make room.
    pub async fn evicted(&self) {
        self.evicted.notified().await;
    }

    /// Evicts it if it is idle; true if it was.
    fn evict(&self) -> bool {
        let evicted = self
            .state
            .compare_exchange(IDLE, EVICTED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if evicted {
            // A permit is stored if the connection is not waiting right now: it sees it at its
            // next wait.
            self.evicted.notify_one();
        }
        evicted
    }
}

/// The listener's connections, by id.
#[derive(Debug, Default)]
pub struct Room {
    occupants: Mutex<HashMap<i64, Arc<Occupant>>>,
}

impl Room {
    /// Records connection `id`, opened at `now`. Dropping the returned guard forgets it.
    pub fn enter(self: &Arc<Self>, id: i64, now: u64) -> Seat {
        let occupant = Arc::new(Occupant::default());
        occupant.requested(now);
        self.lock().insert(id, Arc::clone(&occupant));
        Seat {
            room: Arc::clone(self),
            id,
            occupant,
        }
    }

    /// Evicts the connection silent longest (at least [`MIN_SILENCE`] at `now`, and idle) —
    /// one that has not given the password before any that has — and returns its id; `None`
    /// if every connection is working or spoke recently.
    pub fn make_room(&self, now: u64) -> Option<i64> {
        let min_silence = u64::try_from(MIN_SILENCE.as_nanos()).unwrap_or(u64::MAX);
        let occupants = self.lock();
        let mut candidates: Vec<(bool, u64, i64, &Arc<Occupant>)> = occupants
            .iter()
            .filter(|(_, o)| o.state.load(Ordering::Acquire) == IDLE)
            .map(|(id, o)| {
                let last = o.last_request.load(Ordering::Relaxed);
                (o.authenticated.load(Ordering::Relaxed), last, *id, o)
            })
            .filter(|(_, last, _, _)| now.saturating_sub(*last) >= min_silence)
            .collect();
        candidates.sort_by_key(|(authenticated, last, id, _)| (*authenticated, *last, *id));
        // The first that is still idle when asked: one that began work since is passed over.
        candidates
            .into_iter()
            .find(|(_, _, _, occupant)| occupant.evict())
            .map(|(_, _, id, _)| id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Arc<Occupant>>> {
        self.occupants.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A connection's place in the [`Room`]; leaving it (dropping) forgets the connection.
#[derive(Debug)]
pub struct Seat {
    room: Arc<Room>,
    id: i64,
    occupant: Arc<Occupant>,
}

impl Seat {
    /// This connection's state.
    pub fn occupant(&self) -> &Occupant {
        &self.occupant
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.room.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn the_longest_silent_connection_makes_room_and_a_working_one_never_does() {
        let room = Arc::new(Room::default());
        let idle = room.enter(1, 0);
        let working = room.enter(2, 0);
        assert!(working.occupant().work());
        let chatty = room.enter(3, 0);
        chatty.occupant().requested(5 * SECOND);
        // At 5.5 s: the chatty one spoke half a second ago, the working one is answering.
        assert_eq!(room.make_room(5 * SECOND + SECOND / 2), Some(1));
        // Told once: the evicted one is not chosen again, nor may it start work.
        assert!(!idle.occupant().work());
        assert_eq!(room.make_room(5 * SECOND + SECOND / 2), None);
        drop(idle);
        // Once the chatty one has been silent a whole second it may go; the working one not.
        assert_eq!(room.make_room(6 * SECOND), Some(3));
        // The working one, at rest again, may go too.
        working.occupant().rest();
        assert_eq!(room.make_room(6 * SECOND), Some(2));
    }

    #[test]
    fn a_connection_without_the_password_goes_before_one_with_it() {
        let room = Arc::new(Room::default());
        let member = room.enter(1, 0);
        member.occupant().set_authenticated(true);
        let _stranger = room.enter(2, SECOND);
        // The member has been silent longer, but the stranger has not given the password.
        assert_eq!(room.make_room(3 * SECOND), Some(2));
        assert_eq!(room.make_room(3 * SECOND), Some(1));
    }

    #[tokio::test]
    async fn an_evicted_connection_is_told_even_if_it_was_not_waiting_yet() {
        let room = Arc::new(Room::default());
        let seat = room.enter(7, 0);
        assert_eq!(room.make_room(2 * SECOND), Some(7));
        // The notice was given before the connection waited for it: it is kept.
        seat.occupant().evicted().await;
    }
}
