//! The endpoint's places: at most [`super::MAX_CONNECTIONS`] connections at
//! once, kept by closing the connection idle the longest when a new one
//! comes, not by turning the new one away. A connection is idle from its
//! accept until its first request head is read, and between requests; it
//! is busy only while a request is being answered, which no route makes
//! long. So connections that hold a place without asking anything (idle
//! kept-alive ones, ones that send their request a byte at a time) cannot
//! keep a health probe out: its connection is the newest, and it is busy
//! as soon as its request is read. Only when every place is busy is a new
//! connection closed at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio_util::sync::CancellationToken;

/// The connections of one endpoint.
pub struct Places {
    cap: usize,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    open: HashMap<u64, Entry>,
}

struct Entry {
    /// Requests being answered now.
    busy: usize,
    /// Since when it has been idle (its accept, or its last answer).
    idle_since: Instant,
    /// Cancelled to close it.
    close: CancellationToken,
}

/// How a new connection was let in.
pub enum Admission {
    /// In a free place, or in the place of the connection idle the longest,
    /// which is being closed (`made_room`).
    Admitted { place: Place, made_room: bool },
    /// Every place is busy answering a request.
    Refused,
}

impl Places {
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap,
            table: Mutex::new(Table::default()),
        })
    }

    /// A place for a connection accepted `now`.
    pub fn admit(self: &Arc<Self>, now: Instant) -> Admission {
        let mut table = self.table.lock().expect("places poisoned");
        let mut made_room = false;
        if table.open.len() >= self.cap {
            let idle = table
                .open
                .iter()
                .map(|(id, entry)| (*id, entry.busy, entry.idle_since));
            let Some(longest) = longest_idle(idle) else {
                return Admission::Refused;
            };
            if let Some(entry) = table.open.remove(&longest) {
                entry.close.cancel();
            }
            made_room = true;
        }
        let id = table.next_id;
        table.next_id += 1;
        let close = CancellationToken::new();
        table.open.insert(
            id,
            Entry {
                busy: 0,
                idle_since: now,
                close: close.clone(),
            },
        );
        Admission::Admitted {
            place: Place {
                activity: Activity {
                    places: self.clone(),
                    id,
                },
                close,
            },
            made_room,
        }
    }

    fn with_entry(&self, id: u64, change: impl FnOnce(&mut Entry)) {
        if let Some(entry) = self
            .table
            .lock()
            .expect("places poisoned")
            .open
            .get_mut(&id)
        {
            change(entry);
        }
    }

    #[cfg(test)]
    fn open(&self) -> usize {
        self.table.lock().unwrap().open.len()
    }
}

/// Of `(id, busy requests, idle since)`, the connection with no request
/// being answered that has been idle the longest.
fn longest_idle(entries: impl Iterator<Item = (u64, usize, Instant)>) -> Option<u64> {
    entries
        .filter(|(_, busy, _)| *busy == 0)
        .min_by_key(|(id, _, since)| (*since, *id))
        .map(|(id, _, _)| id)
}

/// One connection's place: given back when dropped.
pub struct Place {
    activity: Activity,
    /// Cancelled when another connection takes this one's place.
    pub close: CancellationToken,
}

impl Place {
    /// What the connection's requests report through.
    pub fn activity(&self) -> Activity {
        self.activity.clone()
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let places = &self.activity.places;
        places
            .table
            .lock()
            .expect("places poisoned")
            .open
            .remove(&self.activity.id);
    }
}

/// Reports a connection's requests to its place.
#[derive(Clone)]
pub struct Activity {
    places: Arc<Places>,
    id: u64,
}

impl Activity {
    /// A request is being answered until the returned guard is dropped.
    pub fn busy(&self) -> Busy {
        self.places.with_entry(self.id, |entry| entry.busy += 1);
        Busy(self.clone())
    }
}

/// A request being answered.
pub struct Busy(Activity);

impl Drop for Busy {
    fn drop(&mut self) {
        let now = Instant::now();
        self.0.places.with_entry(self.0.id, |entry| {
            entry.busy -= 1;
            entry.idle_since = now;
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn admitted(admission: Admission) -> (Place, bool) {
        match admission {
            Admission::Admitted { place, made_room } => (place, made_room),
            Admission::Refused => panic!("refused"),
        }
    }

    #[test]
    fn a_full_table_closes_the_connection_idle_the_longest_and_never_a_busy_one() {
        let places = Places::new(3);
        // In the past: an answer finished now is later than all of them.
        let t0 = Instant::now() - Duration::from_secs(60);
        let at = |s| t0 + Duration::from_secs(s);
        let (first, _) = admitted(places.admit(at(0)));
        let (second, _) = admitted(places.admit(at(1)));
        let (third, made_room) = admitted(places.admit(at(2)));
        assert!(!made_room);
        // The first is answering a request: it is not the one to go.
        let busy = first.activity().busy();
        let (_fourth, made_room) = admitted(places.admit(at(3)));
        assert!(made_room);
        assert!(second.close.is_cancelled(), "the longest idle makes room");
        assert!(!first.close.is_cancelled() && !third.close.is_cancelled());
        assert_eq!(places.open(), 3);
        // Once answered, the first is idle from then on: younger than the
        // third, so the third goes next.
        drop(busy);
        let (_fifth, _) = admitted(places.admit(at(4)));
        assert!(third.close.is_cancelled());
        assert!(!first.close.is_cancelled());
    }

    #[test]
    fn when_every_place_is_busy_a_new_connection_is_refused_and_a_closed_one_frees_its_place() {
        let places = Places::new(2);
        let now = Instant::now();
        let (a, _) = admitted(places.admit(now));
        let (b, _) = admitted(places.admit(now));
        let (_busy_a, _busy_b) = (a.activity().busy(), b.activity().busy());
        assert!(matches!(places.admit(now), Admission::Refused));
        drop(a);
        assert_eq!(places.open(), 1);
        let (_c, made_room) = admitted(places.admit(now));
        assert!(!made_room);
    }

    #[test]
    fn the_longest_idle_is_the_earliest_then_the_oldest_id() {
        let t = Instant::now();
        let later = t + Duration::from_secs(1);
        let entries = [(5, 0, later), (7, 0, t), (2, 1, t), (3, 0, t)];
        assert_eq!(longest_idle(entries.into_iter()), Some(3));
        assert_eq!(longest_idle([(1, 2, t)].into_iter()), None);
    }
}
