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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// How long a connection must have been silent before it may be closed to make room: a
/// client between two requests of a burst is not cut off.
pub const MIN_SILENCE: Duration = Duration::from_secs(1);

/// One connection's state, as the room sees it.
#[derive(Debug, Default)]
pub struct Occupant {
    /// When (nanoseconds on the listener's clock) the client last completed a request, or
    /// connected.
    last_request: AtomicU64,
    /// A reply is still being decided or written: the connection is working, not silent.
    busy: AtomicBool,
    /// Told to close.
    evicted: Notify,
}

impl Occupant {
    /// The client completed a request at `now`.
    pub fn requested(&self, now: u64) {
        self.last_request.store(now, Ordering::Relaxed);
    }

    /// Whether a reply is being decided for it.
    pub fn set_busy(&self, busy: bool) {
        self.busy.store(busy, Ordering::Relaxed);
    }

    /// Resolves when the room closes this connection to make room.
    pub async fn evicted(&self) {
        self.evicted.notified().await;
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

    /// Tells the connection silent longest (at least [`MIN_SILENCE`] at `now`, and with no
    /// reply being decided) to close; returns its id, or `None` if every connection is working
    /// or spoke recently.
    pub fn make_room(&self, now: u64) -> Option<i64> {
        let min_silence = u64::try_from(MIN_SILENCE.as_nanos()).unwrap_or(u64::MAX);
        let occupants = self.lock();
        let (id, occupant) = occupants
            .iter()
            .filter(|(_, o)| !o.busy.load(Ordering::Relaxed))
            .map(|(id, o)| (id, o, o.last_request.load(Ordering::Relaxed)))
            .filter(|(_, _, last)| now.saturating_sub(*last) >= min_silence)
            .min_by_key(|(_, _, last)| *last)
            .map(|(id, o, _)| (*id, o))?;
        // A permit is stored if the connection is not waiting right now: it sees it at its
        // next wait.
        occupant.evicted.notify_one();
        Some(id)
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
        working.occupant().set_busy(true);
        let chatty = room.enter(3, 0);
        chatty.occupant().requested(5 * SECOND);
        // At 5.5 s: the chatty one spoke half a second ago, the working one is answering.
        assert_eq!(room.make_room(5 * SECOND + SECOND / 2), Some(1));
        drop(idle);
        assert_eq!(room.make_room(5 * SECOND + SECOND / 2), None);
        // Once the chatty one has been silent a whole second it may go; the working one not.
        assert_eq!(room.make_room(6 * SECOND), Some(3));
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
